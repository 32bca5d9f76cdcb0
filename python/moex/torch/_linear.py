"""moex.torch._linear - the grouped linear: its operators moex::grouped_linear_forward,
_backward_data, _backward_weight and _backward_weight_accumulate (checks, implementations over
the C library, fake kernels), the forward's autograd, and the functions grouped_linear and gmm.
The module GroupedLinear is in _linear_layer.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import _capi
from .._capi import BIAS_ADD, BIAS_NONE, BIAS_SCALED, GRAD_ACCUMULATE, GRAD_WRITE
from ._checks import _check, _check_bias, _check_group_inputs, _contiguous, _row_probs, _rows
from ._fp8 import _FP8_ARGS, _FP8_OFF, Fp8, _fp8_code, _fp8_recipe
from ._operators import _DTYPES, _FLOATS, _TORCH_DTYPES, _args, _operator, _run, _zero_tail
from ._splits import Splits, _splits_tensor


# ---- the operators -----------------------------------------------------------------------------

@_operator("grouped_linear_forward", mutates_args=())
def _forward(x: Tensor, w: Tensor, splits: Tensor, bias: Optional[Tensor], probs: Optional[Tensor],
             bias_mode: int, fp8_mode: int = 0, fp8_dtypes: int = 0, fp8_pow2_scales: bool = False, fp8_amax_epsilon: float = 0.0, fp8_weights: Optional[Tensor] = None) -> Tensor:
    _check_group_inputs("grouped_linear_forward", x, "x", w, splits)
    _check_bias("grouped_linear_forward", bias_mode, bias, probs, x, w)
    y = x.new_empty(x.shape[0], w.shape[1])
    args = _args(_capi.GroupedLinearArgs, x=x, w=w, bias_mode=bias_mode, bias=bias if bias_mode != BIAS_NONE else None,
                 probs=probs if bias_mode == BIAS_SCALED else None, splits=splits, y=y,
                 fp8=_fp8_recipe(fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon, fp8_weights, (w,)))
    _run("grouped_linear_forward", args, x.device)
    return _zero_tail(y, splits)


@_forward.register_fake
def _(x, w, splits, bias, probs, bias_mode, *fp8):
    return x.new_empty(x.shape[0], w.shape[1])


@_operator("grouped_linear_backward_data", mutates_args=())
def _backward_data(dy: Tensor, w: Tensor, splits: Tensor, bias: Optional[Tensor], probs: Optional[Tensor],
                   bias_mode: int, need_dx: bool, need_dbias: bool, need_dprobs: bool,
                   fp8_mode: int = 0, fp8_dtypes: int = 0, fp8_pow2_scales: bool = False, fp8_amax_epsilon: float = 0.0, fp8_weights: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    op = "grouped_linear_backward_data"
    _check_group_inputs(op, dy, "dy", w, splits)
    _check_bias(op, bias_mode, bias, probs, dy, w)
    dx, dbias, dprobs = _backward_data_outputs(dy, w, bias, need_dx, need_dbias, need_dprobs)
    if need_dprobs:
        dprobs.zero_()   # moex accumulates the bias term into dprobs (+=)
    scaled = bias_mode == BIAS_SCALED
    args = _args(_capi.GroupedLinearDgradArgs, dy=dy, w=w, bias_mode=bias_mode,
                 bias=bias if scaled and need_dprobs else None, probs=probs if scaled else None, splits=splits,
                 dx=dx if need_dx else None, dbias=dbias if need_dbias else None,
                 dprobs=dprobs if need_dprobs else None,
                 fp8=_fp8_recipe(fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon, fp8_weights, (w,)))
    _run("grouped_linear_backward_data", args, dy.device)
    return _zero_tail(dx, splits), dbias, dprobs   # dprobs: zeroed above, += on the groups' rows only


def _bias_grad_dtype(bias: Optional[Tensor]) -> torch.dtype:
    """A bias gradient's dtype: the bias's (moex sums in f32 and rounds once), f32 without one."""
    return bias.dtype if bias is not None else torch.float32


def _backward_data_outputs(dy, w, bias, need_dx, need_dbias, need_dprobs):
    """dx [T, K], dbias [G, N] in bias's dtype, dprobs [T] f32, each with 0 rows when not needed."""
    T, N = dy.shape
    G, _, K = w.shape
    return (dy.new_empty(T if need_dx else 0, K), dy.new_empty(G if need_dbias else 0, N, dtype=_bias_grad_dtype(bias)),
            dy.new_empty(T if need_dprobs else 0, dtype=torch.float32))


@_backward_data.register_fake
def _(dy, w, splits, bias, probs, bias_mode, need_dx, need_dbias, need_dprobs, *fp8):
    return _backward_data_outputs(dy, w, bias, need_dx, need_dbias, need_dprobs)


def _check_wgrad(op: str, x: Tensor, dy: Tensor, splits: Tensor) -> None:
    _check(op, "x", x, x.device, _FLOATS, 2)
    _check(op, "dy", dy, x.device, (x.dtype,), 2)
    _check(op, "splits", splits, x.device, (torch.int64,), 1)
    if dy.shape[0] != x.shape[0]:
        raise ValueError(f"moex.{op}: x has {x.shape[0]} rows, dy {dy.shape[0]}")


def _wgrad_args(x, dy, splits, mode, dw, fp8: Fp8):
    return _args(_capi.GroupedLinearWgradArgs, x=x, dy=dy, splits=splits, dw_mode=mode, dw=dw, fp8=_fp8_recipe(*fp8))


@_operator("grouped_linear_backward_weight", mutates_args=())
def _backward_weight(x: Tensor, dy: Tensor, splits: Tensor, dw_dtype: int, fp8_mode: int = 0, fp8_dtypes: int = 0, fp8_pow2_scales: bool = False, fp8_amax_epsilon: float = 0.0, fp8_weights: Optional[Tensor] = None) -> Tensor:
    _check_wgrad("grouped_linear_backward_weight", x, dy, splits)
    if _TORCH_DTYPES.get(dw_dtype) not in _FLOATS:
        raise ValueError(f"moex.grouped_linear_backward_weight: dw_dtype {dw_dtype} is not a float dtype code")
    dw = x.new_empty(splits.shape[0], dy.shape[1], x.shape[1], dtype=_TORCH_DTYPES[dw_dtype])
    fp8 = (fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon)
    _run("grouped_linear_backward_weight", _wgrad_args(x, dy, splits, GRAD_WRITE, dw, fp8), x.device)
    return dw


@_backward_weight.register_fake
def _(x, dy, splits, dw_dtype, *fp8):
    return x.new_empty(splits.shape[0], dy.shape[1], x.shape[1], dtype=_TORCH_DTYPES[dw_dtype])


@_operator("grouped_linear_backward_weight_accumulate", mutates_args=("main_grad",))
def _backward_weight_accumulate(x: Tensor, dy: Tensor, splits: Tensor, main_grad: Tensor,
                                fp8_mode: int = 0, fp8_dtypes: int = 0, fp8_pow2_scales: bool = False, fp8_amax_epsilon: float = 0.0, fp8_weights: Optional[Tensor] = None) -> None:
    op = "grouped_linear_backward_weight_accumulate"
    _check_wgrad(op, x, dy, splits)
    _check(op, "main_grad", main_grad, x.device, (torch.float32,), 3)
    fp8 = (fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon)
    _run("grouped_linear_backward_weight", _wgrad_args(x, dy, splits, GRAD_ACCUMULATE, main_grad, fp8), x.device)


@_backward_weight_accumulate.register_fake
def _(x, dy, splits, main_grad, *fp8):
    return None


def _forward_setup(ctx, inputs, output):
    x, w, splits, bias, probs, bias_mode, *fp8 = inputs
    ctx.save_for_backward(x, w, splits, bias, probs)
    ctx.bias_mode, ctx.fp8 = bias_mode, fp8


def _forward_backward(ctx, dy):
    x, w, splits, bias, probs = ctx.saved_tensors
    need_x, need_w, _, need_bias, need_probs = ctx.needs_input_grad[:5]
    dy = dy.contiguous()
    dx = dw = dbias = dprobs = None
    need_dbias = need_bias and ctx.bias_mode != BIAS_NONE
    need_dprobs = need_probs and ctx.bias_mode == BIAS_SCALED
    if need_x or need_dbias or need_dprobs:
        dx, dbias, dprobs = _backward_data(dy, w, splits, bias, probs, ctx.bias_mode, need_x, need_dbias,
                                           need_dprobs, *ctx.fp8)
        dx = dx if need_x else None
        dbias = dbias if need_dbias else None
        dprobs = dprobs if need_dprobs else None
    if need_w:
        dw = _backward_weight(x, dy, splits, _DTYPES[w.dtype], *ctx.fp8)
    return (dx, dw, None, dbias, dprobs, None) + (None,) * _FP8_ARGS


_forward.register_autograd(_forward_backward, setup_context=_forward_setup)


# ---- the functions -----------------------------------------------------------------------------

def grouped_linear(x: Tensor, w: Tensor, splits: Splits, bias: Optional[Tensor] = None,
                   probs: Optional[Tensor] = None, fp8_recipe: Optional[str] = None, fp8_format: str = "e4m3",
                   fp8_pow2_scales: bool = False, fp8_amax_epsilon: float = 0.0) -> Tensor:
    """y[r] = x[r] W_g^T (+ b_g, or + p_r b_g when probs is given) for the rows r of group g.

    x [..., K] (the leading dimensions are the rows, T of them), w [G, N, K], splits [G] (a
    list of ints, or an int64 or int32 tensor), bias [G, N] (x's dtype or f32), probs [T] (or
    x's leading dimensions) f32 -> y [..., N]; the rows past sum(splits) are 0. Differentiable in
    x, w, bias and probs.

    fp8_recipe (experimental): None (off), "block", "current" or "mxfp8" runs every GEMM of the
    forward and the backward on FP8 operands (docs/ops.md 9.11); fp8_format "e4m3" or "hybrid"
    (E5M2 gradients), fp8_pow2_scales and fp8_amax_epsilon as the modules take them
    (GroupedLinear). Outputs and gradients keep their dtypes."""
    fp8 = _fp8_code("grouped_linear", fp8_recipe, fp8_format, fp8_pow2_scales, fp8_amax_epsilon)
    return _grouped_linear("grouped_linear", x, w, splits, bias, probs, fp8)


def _grouped_linear(owner: str, x: Tensor, w: Tensor, splits: Splits, bias: Optional[Tensor], probs: Optional[Tensor],
                    fp8: Fp8) -> Tensor:
    if probs is not None and bias is None:
        raise ValueError(f"moex.{owner}: probs scales the bias, but bias is None")
    mode = BIAS_NONE if bias is None else (BIAS_SCALED if probs is not None else BIAS_ADD)
    x2 = _rows(owner, "x", x)
    y = _forward(x2, _contiguous(owner, "w", w), _splits_tensor(splits, x2.device, owner, x2.shape[0]),
                 _contiguous(owner, "bias", bias), _row_probs(owner, probs, x), mode, *fp8)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], y.shape[-1])


def gmm(a: Tensor, b: Tensor, batch_sizes: Splits, trans_b: bool = False) -> Tensor:
    """grouped_gemm.ops.gmm: for the rows of group g, a_g [m_g, K] @ b_g, where b is [G, K, N]
    (or [G, N, K] with trans_b) and batch_sizes [G] the rows per group, on the host or the
    device (int64 or int32). a may have leading dimensions ([..., K] -> [..., N]).
    Differentiable in a and b."""
    if not isinstance(b, Tensor) or b.dim() != 3:
        raise ValueError(f"moex.gmm: b must be a tensor [G, K, N] (or [G, N, K] with trans_b), got "
                         f"{tuple(b.shape) if isinstance(b, Tensor) else type(b).__name__}")
    w = b if trans_b else b.transpose(1, 2)
    return grouped_linear(a, w, batch_sizes)
