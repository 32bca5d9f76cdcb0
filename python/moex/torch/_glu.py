"""moex.torch._glu - the scaled GLU: the GLU's arguments (kind, layout, limit, alpha, offset:
_glu_code, _glu), the operators moex::scaled_glu_forward and _backward with the forward's
autograd, and the function scaled_glu.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import _capi
from ._checks import _check, _row_probs, _rows
from ._operators import _FLOATS, _args, _operator, _run, _zero_tail
from ._splits import Splits, _splits_tensor


_GLU_KINDS = {"swiglu": 0, "clamped_swiglu": 1}
_GLU_LAYOUTS = {"contiguous": 0, "interleaved_32": 1}


def _glu_code(owner: str, glu: str, layout: str, limit: float, alpha: float, offset: float) -> Tuple:
    """The GLU's operator arguments (kind, layout, limit, alpha, offset)."""
    if glu not in _GLU_KINDS or layout not in _GLU_LAYOUTS:
        raise ValueError(f"moex.{owner}: glu must be one of {list(_GLU_KINDS)} and layout one of "
                         f"{list(_GLU_LAYOUTS)}")
    return _GLU_KINDS[glu], _GLU_LAYOUTS[layout], float(limit), float(alpha), float(offset)


def _glu(kind: int, layout: int, limit: float, alpha: float, offset: float) -> _capi.GluParams:
    return _capi.GluParams(kind, layout, limit, alpha, offset)


# ---- the operators and the function ------------------------------------------------------------

@_operator("scaled_glu_forward", mutates_args=())
def _glu_forward(h: Tensor, probs: Optional[Tensor], splits: Optional[Tensor], glu_kind: int, glu_layout: int,
                 glu_limit: float, glu_alpha: float, glu_offset: float) -> Tensor:
    _check_glu("scaled_glu_forward", h, probs, splits)
    z = h.new_empty(h.shape[0], h.shape[1] // 2)
    args = _args(_capi.ScaledGluArgs, glu=_glu(glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset), h=h,
                 probs=probs, splits=splits, z=z)
    _run("scaled_glu_forward", args, h.device)
    return z if splits is None else _zero_tail(z, splits)


def _check_glu(op: str, h: Tensor, probs: Optional[Tensor], splits: Optional[Tensor]) -> None:
    _check(op, "h", h, h.device, _FLOATS, 2)
    _check(op, "probs", probs, h.device, (torch.float32,), 1, optional=True)
    _check(op, "splits", splits, h.device, (torch.int64,), 1, optional=True)


@_glu_forward.register_fake
def _(h, probs, splits, glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset):
    return h.new_empty(h.shape[0], h.shape[1] // 2)


@_operator("scaled_glu_backward", mutates_args=())
def _glu_backward(h: Tensor, probs: Optional[Tensor], splits: Optional[Tensor], dz: Tensor, glu_kind: int,
                  glu_layout: int, glu_limit: float, glu_alpha: float, glu_offset: float,
                  need_dprobs: bool) -> Tuple[Tensor, Tensor]:
    _check_glu("scaled_glu_backward", h, probs, splits)
    _check("scaled_glu_backward", "dz", dz, h.device, (h.dtype,), 2)
    dh, dprobs = torch.empty_like(h), h.new_zeros(h.shape[0] if need_dprobs else 0, dtype=torch.float32)
    args = _args(_capi.ScaledGluGradArgs, glu=_glu(glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset), h=h,
                 probs=probs, splits=splits, dz=dz, dh=dh, dprobs=dprobs if need_dprobs else None)
    _run("scaled_glu_backward", args, h.device)
    return (dh if splits is None else _zero_tail(dh, splits)), dprobs   # dprobs: zeros, += on the groups' rows


@_glu_backward.register_fake
def _(h, probs, splits, dz, glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset, need_dprobs):
    return torch.empty_like(h), h.new_empty(h.shape[0] if need_dprobs else 0, dtype=torch.float32)


def _glu_setup(ctx, inputs, output):
    h, probs, splits, *glu = inputs
    ctx.save_for_backward(h, probs, splits)
    ctx.glu = glu


def _glu_grads(ctx, dz):
    h, probs, splits = ctx.saved_tensors
    need_dprobs = probs is not None and ctx.needs_input_grad[1]
    dh, dprobs = _glu_backward(h, probs, splits, dz.contiguous(), *ctx.glu, need_dprobs)
    return (dh, dprobs if need_dprobs else None) + (None,) * 6


_glu_forward.register_autograd(_glu_grads, setup_context=_glu_setup)


def scaled_glu(h: Tensor, probs: Optional[Tensor] = None, splits: Optional["Splits"] = None, glu: str = "swiglu",
               layout: str = "contiguous", limit: float = 7.0, alpha: float = 1.702, offset: float = 1.0) -> Tensor:
    """z = p * glu(h) (docs/ops.md section 3): h [..., 2F] -> z [..., F] (the leading
    dimensions are the T rows), probs [T] (or h's leading dimensions) f32; with splits, only
    the rows < sum(splits) are computed, the others of z (and of h's gradient) are 0.
    Differentiable in h and probs."""
    glu_code = _glu_code("scaled_glu", glu, layout, limit, alpha, offset)
    h2 = _rows("scaled_glu", "h", h)
    s = None if splits is None else _splits_tensor(splits, h2.device, "scaled_glu", h2.shape[0])
    z = _glu_forward(h2, _row_probs("scaled_glu", probs, h), s, *glu_code)
    return z.view(*h.shape[:-1], z.shape[-1])
