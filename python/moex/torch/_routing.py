"""moex.torch._routing - routing: the operators moex::router_forward / _backward (top-k of
softmax or sigmoid scores), permute_forward / _backward (the rows sorted by expert) and
unpermute_forward / _backward (the rows summed back per token), their autograd, and the
functions router, permute and unpermute.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import _capi
from ._checks import _check, _contiguous, _int_arg
from ._operators import _FLOATS, _args, _operator, _run


_SCORES = {"softmax": 0, "sigmoid": 1}


# ---- the operators -----------------------------------------------------------------------------

@_operator("router_forward", mutates_args=())
def _router_forward(logits: Tensor, topk: int, score: int, norm: int) -> Tuple[Tensor, Tensor]:
    _check_router("router_forward", logits, topk, score, norm)
    probs, ids = _router_outputs(logits, topk)
    args = _args(_capi.RouterArgs, logits=logits, topk=topk, score=score, norm=norm, probs=probs, ids=ids)
    _run("router_forward", args, logits.device)
    return probs, ids


def _check_router(op: str, logits: Tensor, topk: int, score: int, norm: int) -> None:
    _check(op, "logits", logits, logits.device, (torch.float32, torch.bfloat16), 2)
    if not 1 <= topk <= logits.shape[1]:
        raise ValueError(f"moex.{op}: topk = {topk}, must be 1..{logits.shape[1]} (the experts, logits' columns)")
    if score not in _SCORES.values() or norm not in (0, 1):
        raise ValueError(f"moex.{op}: score {score} must be one of {list(_SCORES.values())}, norm {norm} 0 or 1")


def _check_k(op: str, k: int, rows: int, rows_name: str) -> None:
    """ValueError unless k >= 1 divides the rows (T*k permuted rows)."""
    if k < 1 or rows % k:
        raise ValueError(f"moex.{op}: k = {k} must be >= 1 and divide the {rows} rows of {rows_name}")


def _router_outputs(logits, topk):
    T = logits.shape[0]
    return logits.new_empty(T, topk, dtype=torch.float32), logits.new_empty(T, topk, dtype=torch.int32)


@_router_forward.register_fake
def _(logits, topk, score, norm):
    return _router_outputs(logits, topk)


@_operator("router_backward", mutates_args=())
def _router_backward(logits: Tensor, ids: Tensor, dprobs: Tensor, topk: int, score: int, norm: int) -> Tensor:
    _check_router("router_backward", logits, topk, score, norm)
    _check("router_backward", "ids", ids, logits.device, (torch.int32,), 2)
    _check("router_backward", "dprobs", dprobs, logits.device, (torch.float32,), 2)
    dlogits = torch.empty_like(logits)
    args = _args(_capi.RouterGradArgs, logits=logits, topk=topk, score=score, norm=norm, ids=ids, dprobs=dprobs,
                 dlogits=dlogits)
    _run("router_backward", args, logits.device)
    return dlogits


@_router_backward.register_fake
def _(logits, ids, dprobs, topk, score, norm):
    return torch.empty_like(logits)


def _router_setup(ctx, inputs, output):
    logits, topk, score, norm = inputs
    ctx.save_for_backward(logits, output[1])
    ctx.options = (topk, score, norm)


def _router_grads(ctx, dprobs, dids_unused):
    logits, ids = ctx.saved_tensors
    return _router_backward(logits, ids, dprobs.contiguous(), *ctx.options), None, None, None


_router_forward.register_autograd(_router_grads, setup_context=_router_setup)


@_operator("permute_forward", mutates_args=())
def _permute_forward(x: Tensor, ids: Tensor, probs: Tensor,
                     num_experts: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    _check("permute_forward", "x", x, x.device, _FLOATS, 2)
    _check("permute_forward", "ids", ids, x.device, (torch.int32,), 2)
    _check("permute_forward", "probs", probs, x.device, (torch.float32,), 2)
    if num_experts < 1:
        raise ValueError(f"moex.permute_forward: num_experts = {num_experts}, must be >= 1")
    if ids.shape[0] != x.shape[0] or probs.shape != ids.shape:
        raise ValueError(f"moex.permute_forward: x {tuple(x.shape)}, ids {tuple(ids.shape)} and probs "
                         f"{tuple(probs.shape)} must be [T, H], [T, k], [T, k]")
    xp, probs_p, splits, row_map = _permute_outputs(x, ids, num_experts)
    args = _args(_capi.PermuteArgs, x=x, ids=ids, probs=probs, num_experts=num_experts, xp=xp, probs_p=probs_p,
                 splits=splits, row_map=row_map)
    _run("permute_forward", args, x.device)
    return xp, probs_p, splits, row_map


def _permute_outputs(x, ids, num_experts):
    rows = ids.shape[0] * ids.shape[1]
    return (x.new_empty(rows, x.shape[1]), x.new_empty(rows, dtype=torch.float32),
            x.new_empty(num_experts, dtype=torch.int64), x.new_empty(rows, dtype=torch.int32))


@_permute_forward.register_fake
def _(x, ids, probs, num_experts):
    return _permute_outputs(x, ids, num_experts)


@_operator("permute_backward", mutates_args=())
def _permute_backward(row_map: Tensor, dxp: Tensor, dprobs_p: Tensor, k: int) -> Tuple[Tensor, Tensor]:
    op = "permute_backward"
    _check(op, "dxp", dxp, dxp.device, _FLOATS, 2)
    _check(op, "row_map", row_map, dxp.device, (torch.int32,), 1)
    _check(op, "dprobs_p", dprobs_p, dxp.device, (torch.float32,), 1)
    _check_k(op, k, dxp.shape[0], "dxp")
    dx, dprobs = _permute_grads_outputs(dxp, k)
    args = _args(_capi.PermuteGradArgs, row_map=row_map, dxp=dxp, dprobs_p=dprobs_p, dx=dx, dprobs=dprobs)
    _run("permute_backward", args, dxp.device)
    return dx, dprobs


def _permute_grads_outputs(dxp, k):
    T = dxp.shape[0] // k
    return dxp.new_empty(T, dxp.shape[1]), dxp.new_empty(T, k, dtype=torch.float32)


@_permute_backward.register_fake
def _(row_map, dxp, dprobs_p, k):
    return _permute_grads_outputs(dxp, k)


def _permute_setup(ctx, inputs, output):
    ctx.save_for_backward(output[3])
    ctx.k = inputs[1].shape[1]


def _permute_grads(ctx, dxp, dprobs_p, dsplits_unused, drow_map_unused):
    (row_map,) = ctx.saved_tensors
    dx, dprobs = _permute_backward(row_map, dxp.contiguous(), dprobs_p.contiguous(), ctx.k)
    return dx, None, dprobs, None


_permute_forward.register_autograd(_permute_grads, setup_context=_permute_setup)


@_operator("unpermute_forward", mutates_args=())
def _unpermute_forward(yp: Tensor, row_map: Tensor, k: int) -> Tensor:
    _check("unpermute_forward", "yp", yp, yp.device, _FLOATS, 2)
    _check("unpermute_forward", "row_map", row_map, yp.device, (torch.int32,), 1)
    _check_k("unpermute_forward", k, yp.shape[0], "yp")
    y = yp.new_empty(yp.shape[0] // k, yp.shape[1])
    _run("unpermute_forward", _args(_capi.UnpermuteArgs, row_map=row_map, yp=yp, y=y), yp.device)
    return y


@_unpermute_forward.register_fake
def _(yp, row_map, k):
    return yp.new_empty(yp.shape[0] // k, yp.shape[1])


@_operator("unpermute_backward", mutates_args=())
def _unpermute_backward(dy: Tensor, row_map: Tensor) -> Tensor:
    _check("unpermute_backward", "dy", dy, dy.device, _FLOATS, 2)
    _check("unpermute_backward", "row_map", row_map, dy.device, (torch.int32,), 1)
    dyp = dy.new_empty(row_map.shape[0], dy.shape[1])
    _run("unpermute_backward", _args(_capi.UnpermuteGradArgs, row_map=row_map, dy=dy, dyp=dyp),
         dy.device)
    return dyp


@_unpermute_backward.register_fake
def _(dy, row_map):
    return dy.new_empty(row_map.shape[0], dy.shape[1])


def _unpermute_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[1])


def _unpermute_grads(ctx, dy):
    (row_map,) = ctx.saved_tensors
    return _unpermute_backward(dy.contiguous(), row_map), None, None


_unpermute_forward.register_autograd(_unpermute_grads, setup_context=_unpermute_setup)


# ---- the functions -----------------------------------------------------------------------------

def router(logits: Tensor, topk: int, score: str = "softmax", renorm: bool = True) -> Tuple[Tensor, Tensor]:
    """probs [T, k] f32 and ids [T, k] int32 of the k best experts per token (docs/ops.md 5.1),
    logits [T, E] f32 or bf16, 1 <= topk <= E; differentiable in logits."""
    if score not in _SCORES:
        raise ValueError(f"moex.router: score must be one of {list(_SCORES)}")
    return _router_forward(_contiguous("router", "logits", logits), _int_arg("router", "topk", topk), _SCORES[score],
                           int(renorm))


def permute(x: Tensor, ids: Tensor, probs: Tensor, num_experts: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The T*k (token, expert) rows sorted by expert (docs/ops.md 6.1): x [T, H], ids [T, k]
    int32, probs [T, k] f32 (required) -> xp [T*k, H], probs_p [T*k], splits [E] int64 and
    row_map [T, k] int32 (row_map[t, j]: the row of token t's j-th expert); differentiable in x
    and probs."""
    if probs is None:
        raise ValueError("moex.permute: probs is required ([T, k] f32, e.g. router's)")
    xp, probs_p, splits, row_map = _permute_forward(
        _contiguous("permute", "x", x), _contiguous("permute", "ids", ids), _contiguous("permute", "probs", probs),
        _int_arg("permute", "num_experts", num_experts))
    return xp, probs_p, splits, row_map.view(ids.shape)


def unpermute(yp: Tensor, row_map: Tensor, k: Optional[int] = None) -> Tensor:
    """y[t] = sum_j yp[row_map[t, j]] (docs/ops.md 7.1): yp [T*k, H] -> y [T, H]; row_map [T, k]
    as permute gives it (k, when given, must be its second dimension) or flat [T*k] (then k is
    required and must divide T*k); differentiable in yp."""
    _contiguous("unpermute", "row_map", row_map)
    if row_map.dim() == 2:
        if k is not None and _int_arg("unpermute", "k", k) != row_map.shape[1]:
            raise ValueError(f"moex.unpermute: k = {k}, but row_map is [T, k] = {list(row_map.shape)}: "
                             "k must be permute's")
        k = row_map.shape[1]
    elif k is None:
        raise ValueError("moex.unpermute: k is required with a flat row_map [T*k]")
    return _unpermute_forward(_contiguous("unpermute", "yp", yp), row_map.contiguous().view(-1),
                              _int_arg("unpermute", "k", k))
