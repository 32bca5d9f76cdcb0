"""moex.torch._mlp - the grouped MLP (FC1, probability-scaled GLU, FC2): the operators
moex::grouped_mlp_forward and _backward with the forward's autograd, the function grouped_mlp,
and the module GroupedMLP (with the weight-gradient options, _GroupedMLPTE; _experts, the
experts of GroupedMLP and MoELayer).
"""
import functools
from typing import List, Optional, Tuple, Union

import torch
from torch import Tensor

from .. import _capi
from .._capi import BIAS_ADD, BIAS_NONE, BIAS_SCALED, GRAD_WRITE
from ._checks import _check, _check_bias_mode, _check_group_inputs, _check_sizes, _contiguous, _row_probs, _rows
from ._fp8 import _FP8_ARGS, _FP8_OFF, _Fp8Options, _fp8_code, _fp8_recipe
from ._glu import _glu, _glu_backward, _glu_code
from ._linear import _backward_data, _bias_grad_dtype
from ._operators import _args, _once_differentiable, _operator, _run, _zero_tail
from ._splits import Splits, _splits_tensor
from ._weight_grads import _module_weight_grads, _WeightGradOptions


# ---- the operators and the function ------------------------------------------------------------

def _absent_if_empty(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None or t.shape[0] == 0 else t


def _check_mlp(op: str, x: Tensor, w1: Tensor, w2: Tensor, splits: Tensor, probs: Optional[Tensor],
               b1: Optional[Tensor], b2: Optional[Tensor], b2_mode: int) -> None:
    _check_group_inputs(op, x, "x", w1, splits, "w1")
    _check(op, "w2", w2, x.device, (x.dtype,), 3)
    _check(op, "probs", probs, x.device, (torch.float32,), 1, optional=True)
    _check(op, "b1", b1, x.device, (x.dtype, torch.float32), 2, optional=True)
    _check_bias_mode(op, "b2_mode", b2_mode, b2, "b2")
    _check(op, "b2", b2, x.device, (x.dtype, torch.float32), 2, optional=b2_mode == BIAS_NONE)
    if b2_mode == BIAS_SCALED and probs is None:
        raise ValueError(f"moex.{op}: b2_mode SCALED needs probs")


@_operator("grouped_mlp_forward", mutates_args=())
def _mlp_forward(x: Tensor, w1: Tensor, b1: Optional[Tensor], w2: Tensor, b2: Optional[Tensor],
                 probs: Optional[Tensor], splits: Tensor, b2_mode: int, glu_kind: int, glu_layout: int,
                 glu_limit: float, glu_alpha: float, glu_offset: float,
                 save_z: bool, fp8_mode: int = 0, fp8_dtypes: int = 0, fp8_pow2_scales: bool = False, fp8_amax_epsilon: float = 0.0, fp8_weights: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    _check_mlp("grouped_mlp_forward", x, w1, w2, splits, probs, b1, b2, b2_mode)
    y, h, z = _mlp_forward_outputs(x, w1, save_z)
    args = _args(_capi.GroupedMlpArgs, x=x, w1=w1, b1=b1, w2=w2, b2_mode=b2_mode,
                 b2=b2 if b2_mode != BIAS_NONE else None, probs=probs,
                 glu=_glu(glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset), splits=splits, h=h,
                 z=z if save_z else None, y=y,
                 fp8=_fp8_recipe(fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon, fp8_weights, (w1, w2)))
    _run("grouped_mlp_forward", args, x.device)
    return _zero_tail(y, splits), h, z


def _mlp_forward_outputs(x, w1, save_z):
    """y [T, H], h [T, 2F], z [T, F] (0 rows without save_z)."""
    T, H = x.shape
    F2 = w1.shape[1]
    return x.new_empty(T, H), x.new_empty(T, F2), x.new_empty(T if save_z else 0, F2 // 2)


@_mlp_forward.register_fake
def _(x, w1, b1, w2, b2, probs, splits, b2_mode, glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset, save_z,
      *fp8):
    return _mlp_forward_outputs(x, w1, save_z)


@_operator("grouped_mlp_backward", mutates_args=("h",))
def _mlp_backward(x: Tensor, w1: Tensor, b1: Optional[Tensor], w2: Tensor, b2: Optional[Tensor],
                  probs: Optional[Tensor], splits: Tensor,
                  h: Tensor, z: Tensor, dy: Tensor, b2_mode: int, glu_kind: int, glu_layout: int, glu_limit: float,
                  glu_alpha: float, glu_offset: float, needs: List[bool],
                  fp8_mode: int = 0, fp8_dtypes: int = 0, fp8_pow2_scales: bool = False, fp8_amax_epsilon: float = 0.0, fp8_weights: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """needs: (dx, dw1, dw2, db1, db2, dprobs); the outputs in that order, 0 rows when not needed.
    h is consumed: dh is written over it (MOEX_H_OVERWRITE), and its version counter moves, so
    that a second backward through the same graph (retain_graph) fails in autograd's check
    instead of reading dh as h (with an FP8 recipe moex leaves h as it was, but h is treated as
    consumed all the same)."""
    op = "grouped_mlp_backward"
    _check_mlp(op, x, w1, w2, splits, probs, b1, b2, b2_mode)
    _check(op, "dy", dy, x.device, (x.dtype,), 2)
    _check(op, "h", h, x.device, (x.dtype,), 2)
    _check(op, "z", z, x.device, (x.dtype,), 2)
    if len(needs) != 6:
        raise ValueError(f"moex.{op}: needs has {len(needs)} entries, must have 6 (dx, dw1, dw2, db1, db2, dprobs)")
    outs = _mlp_backward_outputs(x, w1, b1, w2, b2, needs)
    dx, dw1, dw2, db1, db2, dprobs = (o if n else None for o, n in zip(outs, needs))
    if dprobs is not None:
        dprobs.zero_()   # moex accumulates into dprobs (+=)
    args = _args(_capi.GroupedMlpGradArgs, x=x, w1=w1, w2=w2, b2_mode=b2_mode,
                 b2=b2 if b2_mode != BIAS_NONE else None, probs=probs,
                 glu=_glu(glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset), splits=splits, h=h,
                 z=_absent_if_empty(z), dy=dy, dx=dx, dw_mode=GRAD_WRITE, dw1=dw1, dw2=dw2, db1=db1, db2=db2,
                 dprobs=dprobs, h_mode=_capi.H_OVERWRITE,
                 fp8=_fp8_recipe(fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon, fp8_weights, (w1, w2)))
    _run("grouped_mlp_backward", args, x.device)
    torch.autograd.graph.increment_version(h)
    _zero_tail(outs[0], splits)   # dx; dprobs was zeroed before moex's +=
    return outs


def _mlp_backward_outputs(x, w1, b1, w2, b2, needs):
    T, H = x.shape
    G, F2, _ = w1.shape
    shapes = [((T, H), x.dtype), ((G, F2, H), w1.dtype), ((G, H, F2 // 2), w2.dtype), ((G, F2), _bias_grad_dtype(b1)),
              ((G, H), _bias_grad_dtype(b2)), ((T,), torch.float32)]
    return tuple(x.new_empty(shape if n else (0,) + shape[1:], dtype=dt) for (shape, dt), n in zip(shapes, needs))


@_mlp_backward.register_fake
def _(x, w1, b1, w2, b2, probs, splits, h, z, dy, b2_mode, glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset,
      needs, *fp8):
    return _mlp_backward_outputs(x, w1, b1, w2, b2, needs)


def _mlp_setup(ctx, inputs, output):
    x, w1, b1, w2, b2, probs, splits, b2_mode = inputs[:8]
    glu, fp8 = inputs[8:13], inputs[14:]
    _, h, z = output
    ctx.save_for_backward(x, w1, b1, w2, b2, probs, splits, h, z)
    ctx.b2_mode, ctx.glu, ctx.fp8 = b2_mode, glu, fp8
    ctx.set_materialize_grads(False)   # h and z are outputs for the backward only: no zero gradients of them


def _mlp_grads(ctx, dy, dh_unused, dz_unused):
    if dy is None:
        return (None,) * (14 + _FP8_ARGS)
    x, w1, b1, w2, b2, probs, splits, h, z = ctx.saved_tensors
    n = ctx.needs_input_grad
    needs = [n[0], n[1], n[3], n[2] and b1 is not None, n[4] and ctx.b2_mode != BIAS_NONE, n[5] and probs is not None]
    outs = _mlp_backward(x, w1, b1, w2, b2, probs, splits, h, z, dy.contiguous(), ctx.b2_mode, *ctx.glu, needs,
                         *ctx.fp8)
    dx, dw1, dw2, db1, db2, dprobs = (o if k else None for o, k in zip(outs, needs))
    return (dx, dw1, db1, dw2, db2, dprobs) + (None,) * (8 + _FP8_ARGS)


_mlp_forward.register_autograd(_mlp_grads, setup_context=_mlp_setup)


def grouped_mlp(x: Tensor, w1: Tensor, w2: Tensor, splits: "Splits", b1: Optional[Tensor] = None,
                b2: Optional[Tensor] = None, probs: Optional[Tensor] = None, scale_b2: bool = False,
                glu: str = "swiglu", layout: str = "contiguous", limit: float = 7.0, alpha: float = 1.702,
                offset: float = 1.0, save_z: bool = False, fp8_recipe: Optional[str] = None, fp8_format: str = "e4m3",
                fp8_pow2_scales: bool = False, fp8_amax_epsilon: float = 0.0) -> Tensor:
    """The grouped MLP (docs/ops.md section 4): for the rows of group g,
    y = p * glu(x W1_g^T + b1_g) W2_g^T + b2_g (or + p b2_g with scale_b2), p = probs or 1.

    x [..., H] (the leading dimensions are the T rows) -> y [..., H], w1 [G, 2F, H] (the GLU's
    halves as `layout` says), w2 [G, H, F], b1 [G, 2F], b2 [G, H], probs [T] (or x's leading
    dimensions) f32, splits as grouped_linear's (the rows past sum(splits) of y and of the
    gradients are 0); glu "swiglu" or "clamped_swiglu" (limit, alpha, offset);
    save_z keeps z for the backward; by default only h is kept, and the backward recomputes z
    from h (on Hopper in FC2's fused backward step, at almost no cost). Differentiable in x, the
    weights, the biases and probs.

    fp8_recipe (experimental): None (off), "block", "current" or "mxfp8" runs every GEMM of the
    forward and the backward on FP8 operands (docs/ops.md 9.11); fp8_format "e4m3" or "hybrid"
    (E5M2 gradients), fp8_pow2_scales and fp8_amax_epsilon as the modules take them
    (GroupedLinear). Outputs and gradients keep their dtypes."""
    glu_code = _glu_code("grouped_mlp", glu, layout, limit, alpha, offset)
    fp8 = _fp8_code("grouped_mlp", fp8_recipe, fp8_format, fp8_pow2_scales, fp8_amax_epsilon)
    if scale_b2 and (b2 is None or probs is None):
        raise ValueError("moex.grouped_mlp: scale_b2 needs b2 and probs")
    mode = BIAS_NONE if b2 is None else (BIAS_SCALED if scale_b2 else BIAS_ADD)
    x2, c = _rows("grouped_mlp", "x", x), functools.partial(_contiguous, "grouped_mlp")
    y, _, _ = _mlp_forward(x2, c("w1", w1), c("b1", b1), c("w2", w2), c("b2", b2),
                           _row_probs("grouped_mlp", probs, x),
                           _splits_tensor(splits, x2.device, "grouped_mlp", x2.shape[0]), mode, *glu_code, save_z, *fp8)
    return y.view(x.shape)


# ---- the module --------------------------------------------------------------------------------

class _GroupedMLPTE(torch.autograd.Function):
    """The grouped MLP's autograd with the weight-gradient options (_WeightGradOptions). The
    backward is composed of the grouped linear and scaled GLU operators, as docs/ops.md 4.2
    writes it, because FC1's weight gradient needs dh, which the fused moex backward keeps in
    its workspace; dW1 = dh^T x and dW2 = dy^T z then go through moex::module_weight_grads
    (now or at backward_dw()), and w1, w2 get the DDP dummy zeros or None. wgrad: the module's
    _wgrad_args. torch.compile(fullgraph=True) traces it."""

    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, probs, splits, b2_mode, glu, wgrad):
        y, h, z = _mlp_forward(x, w1, b1, w2, b2, probs, splits, b2_mode, *glu, True, *wgrad[4])
        ctx.save_for_backward(x, w1, b1, w2, b2, probs, splits, h, z)
        ctx.b2_mode, ctx.glu, ctx.wgrad = b2_mode, glu, wgrad
        return y

    @staticmethod
    @_once_differentiable
    def backward(ctx, dy):
        x, w1, b1, w2, b2, probs, splits, h, z = ctx.saved_tensors
        key, first_microbatch, keep_copies, dummy, fp8 = ctx.wgrad
        b2_mode = ctx.b2_mode
        need_x, need_b1, need_b2, need_probs = (ctx.needs_input_grad[i] for i in (0, 2, 4, 5))
        need_db1, need_db2 = need_b1 and b1 is not None, need_b2 and b2_mode != BIAS_NONE
        need_dprobs, scaled = need_probs and probs is not None, b2_mode == BIAS_SCALED
        dy = dy.contiguous()
        dz, db2, dprobs_b2 = _backward_data(dy, w2, splits, b2 if b2_mode != BIAS_NONE else None,
                                            probs if scaled else None, b2_mode, True, need_db2,
                                            need_dprobs and scaled, *fp8)
        dh, dprobs = _glu_backward(h, probs, splits, dz, *ctx.glu, need_dprobs)
        dx = db1 = None
        if need_x or need_db1:
            dx, db1, _ = _backward_data(dh, w1, splits, b1 if need_db1 else None, None,
                                        BIAS_ADD if need_db1 else BIAS_NONE, need_x, need_db1, False, *fp8)
        _module_weight_grads([x, z], [dh, dy], splits, key, first_microbatch, keep_copies, *fp8)
        return (dx if need_x else None, torch.zeros_like(w1) if dummy[0] else None, db1 if need_db1 else None,
                torch.zeros_like(w2) if dummy[1] else None, db2 if need_db2 else None,
                (dprobs + dprobs_b2 if scaled else dprobs) if need_dprobs else None, None, None, None, None)


class GroupedMLP(_WeightGradOptions, _Fp8Options, torch.nn.Module):
    """The experts of an MoE layer: num_experts MLPs FC1 -> scaled GLU -> FC2 over the rows of
    their groups (moex.torch.grouped_mlp). Parameters w1 [G, 2F, H], w2 [G, H, F], and b1
    [G, 2F], b2 [G, H] when asked; forward(x, m_splits, probs=None, is_first_microbatch=None)
    with probs [T] f32 scaling the GLU's output (and b2 with scale_b2).

    fuse_wgrad_accumulation, delay_wgrad_compute and backward_dw() for w1 and w2: as in
    Transformer Engine (_WeightGradOptions). With either, z is kept for the backward (save_z)
    and the backward runs as separate operators instead of moex's fused one.

    FP8 training (experimental): fp8_recipe=None | "block" | "current" | "mxfp8", fp8_format=
    "e4m3" | "hybrid", fp8_pow2_scales, fp8_amax_epsilon (_Fp8Options): FC1 and FC2, forward
    and backward (dz, dx, dW1, dW2), run on FP8 operands; h and z stay in the activation dtype."""

    def __init__(self, num_experts: int, hidden_size: int, ffn_size: int, glu: str = "swiglu",
                 layout: str = "contiguous", bias1: bool = False, bias2: bool = False, scale_b2: bool = False,
                 params_dtype: Optional[torch.dtype] = None, device: Union[torch.device, str, None] = None,
                 init_method=None, save_z: bool = False, limit: float = 7.0, alpha: float = 1.702, offset: float = 1.0,
                 fuse_wgrad_accumulation: bool = False, delay_wgrad_compute: bool = False,
                 fp8_recipe: Optional[str] = None, fp8_format: str = "e4m3", fp8_pow2_scales: bool = False,
                 fp8_amax_epsilon: float = 0.0):
        super().__init__()
        _check_sizes("torch.GroupedMLP", num_experts=num_experts, hidden_size=hidden_size, ffn_size=ffn_size)
        self._glu = _glu_code("torch.GroupedMLP", glu, layout, limit, alpha, offset)
        self._init_fp8("torch.GroupedMLP", fp8_recipe, fp8_format, fp8_pow2_scales, fp8_amax_epsilon)
        if scale_b2 and not bias2:
            raise ValueError("moex.torch.GroupedMLP: scale_b2 needs bias2")
        dtype = params_dtype or torch.get_default_dtype()
        G, H, F = num_experts, hidden_size, ffn_size
        init = init_method or (lambda t: torch.nn.init.normal_(t, std=0.02))
        self.w1 = torch.nn.Parameter(torch.empty(G, 2 * F, H, dtype=dtype, device=device))
        self.w2 = torch.nn.Parameter(torch.empty(G, H, F, dtype=dtype, device=device))
        init(self.w1.data)
        init(self.w2.data)
        self.b1 = torch.nn.Parameter(torch.zeros(G, 2 * F, dtype=dtype, device=device)) if bias1 else None
        self.b2 = torch.nn.Parameter(torch.zeros(G, H, dtype=dtype, device=device)) if bias2 else None
        self.b2_mode = BIAS_NONE if not bias2 else (BIAS_SCALED if scale_b2 else BIAS_ADD)
        self.save_z = save_z
        self._init_weight_grads(fuse_wgrad_accumulation, delay_wgrad_compute)

    def forward(self, x: Tensor, m_splits: Splits, probs: Optional[Tensor] = None,
                is_first_microbatch: Optional[bool] = None) -> Tensor:
        """y [..., H] for x [..., H] (the leading dimensions are the rows), probs [T] or x's leading
        dimensions; is_first_microbatch=True makes fused main_grad accumulation
        overwrite instead (as in Transformer Engine)."""
        if self.b2_mode == BIAS_SCALED and probs is None:
            raise ValueError("moex.torch.GroupedMLP: scale_b2 needs probs")
        owner = "torch.GroupedMLP"
        x2 = _rows(owner, "x", x)
        y = _experts(self, x2, _splits_tensor(m_splits, x2.device, owner, x2.shape[0]),
                     _row_probs(owner, probs, x), self.b2_mode, self._glu, self.save_z,
                     is_first_microbatch)
        return y if x.dim() == 2 else y.view(x.shape)


def _experts(module, x: Tensor, splits: Tensor, probs: Optional[Tensor], b2_mode: int, glu: Tuple, save_z: bool,
             first_microbatch: Optional[bool]) -> Tensor:
    """The grouped MLP of module's w1, b1, w2, b2 (GroupedMLP, MoELayer): moex's fused forward
    and backward, or _GroupedMLPTE with the weight-gradient options."""
    if module.fuse_wgrad_accumulation or module.delay_wgrad_compute:
        return _GroupedMLPTE.apply(x, module.w1, module.b1, module.w2, module.b2, probs, splits, b2_mode, glu,
                                   module._wgrad_args(bool(first_microbatch)))
    kept = module._fp8_kept((module.w1, module.w2), first_microbatch)
    y, _, _ = _mlp_forward(x, module.w1, module.b1, module.w2, module.b2, probs, splits, b2_mode, *glu, save_z,
                           *module._fp8, kept)
    return y
