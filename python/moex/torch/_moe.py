"""moex.torch._moe - the MoE layer: the operators moex::moe_layer_forward and _backward (router,
top-k, permute, experts, unpermute in one moex call) with the forward's autograd, and the
module MoELayer (which runs as its parts with the weight-gradient options).
"""
from typing import List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _capi
from .._capi import BIAS_ADD, BIAS_NONE, BIAS_SCALED, GRAD_WRITE
from ._checks import _check, _check_bias_mode, _check_sizes, _rows
from ._fp8 import _FP8_ARGS, _FP8_OFF, Fp8, _Fp8Options, _fp8_recipe
from ._glu import _glu, _glu_code
from ._linear import _bias_grad_dtype
from ._mlp import _experts
from ._operators import _FLOATS, _args, _fill, _operator, _run, _view
from ._routing import _SCORES, _permute_forward, _router_forward, _unpermute_forward
from ._weight_grads import _WeightGradOptions


# ---- the operators -----------------------------------------------------------------------------

def _moe_args(x, router_w, w1, b1, w2, b2, topk, score, norm, b2_mode, glu, saved, y, fp8: Fp8, view=_view):
    return _capi.MoeLayerArgs(
        x=view(x), router_w=view(router_w), topk=topk, score=score, norm=norm, w1=_capi.Weight(view(w1), None),
        b1=view(b1), w2=_capi.Weight(view(w2), None), b2_mode=b2_mode,
        b2=view(b2 if b2_mode != BIAS_NONE else None), glu=_glu(*glu),
        saved=None if saved is None else saved.data_ptr(), saved_bytes=0 if saved is None else saved.numel(),
        y=view(y), fp8=_fp8_recipe(*fp8, weights=(w1, w2)) or _capi.Fp8Recipe())


def _shape_view(t: Optional[Tensor]) -> _capi.Tensor:
    """A moex_tensor with t's shape and dtype at a placeholder address: for size queries, which
    read no data (and for fake tensors, which have none)."""
    v = _capi.Tensor()
    if t is not None:
        _fill(v, t, 4096 if t.numel() else 0)
    return v


def _moe_saved_bytes(x, router_w, w1, b1, w2, b2, topk, score, norm, b2_mode, glu, fp8: Fp8) -> int:
    """moex_moe_layer_saved_size from the shapes (its layout is the same on every backend, and
    the same with an FP8 recipe)."""
    args = _moe_args(x, router_w, w1, b1, w2, b2, topk, score, norm, b2_mode, glu, None, None, fp8[:len(_FP8_OFF)],
                     view=_shape_view)
    return _capi.moe_layer_saved_size(_capi.context(_capi.BACKEND_CPU, 0), args)


def _check_moe(op, x, router_w, w1, b1, w2, b2, topk, b2_mode):
    _check(op, "x", x, x.device, _FLOATS, 2)
    for name, t, ndim in (("router_w", router_w, 2), ("w1", w1, 3), ("w2", w2, 3)):
        _check(op, name, t, x.device, (x.dtype,), ndim)
    _check(op, "b1", b1, x.device, (x.dtype, torch.float32), 2, optional=True)
    _check_bias_mode(op, "b2_mode", b2_mode, b2, "b2")
    _check(op, "b2", b2, x.device, (x.dtype, torch.float32), 2, optional=b2_mode == BIAS_NONE)
    if not 1 <= topk <= w1.shape[0]:
        raise ValueError(f"moex.{op}: topk = {topk}, must be 1..{w1.shape[0]} (the experts)")


@_operator("moe_layer_forward", mutates_args=())
def _moe_forward(x: Tensor, router_w: Tensor, w1: Tensor, b1: Optional[Tensor], w2: Tensor, b2: Optional[Tensor],
                 topk: int, score: int, norm: int, b2_mode: int, glu_kind: int, glu_layout: int, glu_limit: float,
                 glu_alpha: float, glu_offset: float, fp8_mode: int = 0, fp8_dtypes: int = 0, fp8_pow2_scales: bool = False, fp8_amax_epsilon: float = 0.0, fp8_weights: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    _check_moe("moe_layer_forward", x, router_w, w1, b1, w2, b2, topk, b2_mode)
    glu = (glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset)
    fp8 = (fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon, fp8_weights)
    saved = x.new_empty(_moe_saved_bytes(x, router_w, w1, b1, w2, b2, topk, score, norm, b2_mode, glu, fp8),
                        dtype=torch.uint8)
    y = x.new_empty(x.shape)
    _run("moe_layer_forward", _moe_args(x, router_w, w1, b1, w2, b2, topk, score, norm, b2_mode, glu, saved, y, fp8),
         x.device)
    return y, saved


@_moe_forward.register_fake
def _(x, router_w, w1, b1, w2, b2, topk, score, norm, b2_mode, glu_kind, glu_layout, glu_limit, glu_alpha,
      glu_offset, *fp8):
    glu = (glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset)
    fp8 = fp8 + _FP8_OFF[len(fp8):]
    n = _moe_saved_bytes(x, router_w, w1, b1, w2, b2, topk, score, norm, b2_mode, glu, fp8)
    return x.new_empty(x.shape), x.new_empty(n, dtype=torch.uint8)


@_operator("moe_layer_backward", mutates_args=())
def _moe_backward(x: Tensor, router_w: Tensor, w1: Tensor, b1: Optional[Tensor], w2: Tensor, b2: Optional[Tensor],
                  saved: Tensor, dy: Tensor, topk: int, score: int, norm: int, b2_mode: int, glu_kind: int,
                  glu_layout: int, glu_limit: float, glu_alpha: float, glu_offset: float, needs: List[bool],
                  fp8_mode: int = 0, fp8_dtypes: int = 0, fp8_pow2_scales: bool = False, fp8_amax_epsilon: float = 0.0, fp8_weights: Optional[Tensor] = None) -> List[Tensor]:
    """needs: (dx, drouter_w, dw1, dw2, db1, db2); the outputs in that order, 0 rows when not needed."""
    _check_moe("moe_layer_backward", x, router_w, w1, b1, w2, b2, topk, b2_mode)
    _check("moe_layer_backward", "dy", dy, x.device, (x.dtype,), 2)
    _check("moe_layer_backward", "saved", saved, x.device, (torch.uint8,), 1)
    if len(needs) != 6:
        raise ValueError(f"moex.moe_layer_backward: needs has {len(needs)} entries, must have 6")
    glu = (glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset)
    outs = _moe_backward_outputs(x, router_w, w1, b1, w2, b2, needs)
    dx, drw, dw1, dw2, db1, db2 = (o if n else None for o, n in zip(outs, needs))
    args = _args(_capi.MoeLayerGradArgs,
                 fwd=_moe_args(x, router_w, w1, b1, w2, b2, topk, score, norm, b2_mode, glu, saved, None,
                               (fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon, fp8_weights)), dy=dy,
                 dx=dx, dw_mode=GRAD_WRITE, drouter_w=drw, dw1=dw1, dw2=dw2, db1=db1, db2=db2)
    _run("moe_layer_backward", args, x.device)
    return outs


def _moe_backward_outputs(x, router_w, w1, b1, w2, b2, needs):
    E, F2, H = w1.shape
    shapes = [(tuple(x.shape), x.dtype), (tuple(router_w.shape), router_w.dtype), ((E, F2, H), w1.dtype),
              ((E, H, F2 // 2), w2.dtype), ((E, F2), _bias_grad_dtype(b1)), ((E, H), _bias_grad_dtype(b2))]
    return [x.new_empty(shape if n else (0,) + shape[1:], dtype=dt) for (shape, dt), n in zip(shapes, needs)]


@_moe_backward.register_fake
def _(x, router_w, w1, b1, w2, b2, saved, dy, topk, score, norm, b2_mode, glu_kind, glu_layout, glu_limit,
      glu_alpha, glu_offset, needs, *fp8):
    return _moe_backward_outputs(x, router_w, w1, b1, w2, b2, needs)


def _moe_setup(ctx, inputs, output):
    x, router_w, w1, b1, w2, b2 = inputs[:6]
    ctx.save_for_backward(x, router_w, w1, b1, w2, b2, output[1])
    ctx.options, ctx.fp8 = inputs[6:15], inputs[15:]
    ctx.set_materialize_grads(False)   # saved is an output for the backward only: no zero gradient of it


def _moe_needs(n, b1, b2, b2_mode) -> List[bool]:
    """The backward's `needs` (dx, drouter_w, dw1, dw2, db1, db2) from needs_input_grad n of the
    inputs (x, router_w, w1, b1, w2, b2, ...)."""
    return [n[0], n[1], n[2], n[4], n[3] and b1 is not None, n[5] and b2 is not None and b2_mode != BIAS_NONE]


def _moe_grads(ctx, dy, dsaved_unused):
    if dy is None:
        return (None,) * (15 + _FP8_ARGS)
    x, router_w, w1, b1, w2, b2, saved = ctx.saved_tensors
    needs = _moe_needs(ctx.needs_input_grad, b1, b2, ctx.options[3])
    outs = _moe_backward(x, router_w, w1, b1, w2, b2, saved, dy.contiguous(), *ctx.options, needs, *ctx.fp8)
    dx, drw, dw1, dw2, db1, db2 = (o if k else None for o, k in zip(outs, needs))
    return (dx, drw, dw1, db1, dw2, db2) + (None,) * (9 + _FP8_ARGS)


_moe_forward.register_autograd(_moe_grads, setup_context=_moe_setup)


# ---- the module --------------------------------------------------------------------------------

class MoELayer(_WeightGradOptions, _Fp8Options, torch.nn.Module):
    """A Mixture-of-Experts layer (docs/ops.md section 8): a linear router [E, H], top-k
    routing (softmax or sigmoid scores, renormalised or not), and E experts FC1 -> p * GLU ->
    FC2 on the tokens routed to them, summed back per token. forward(x) with x [..., H].

    fuse_wgrad_accumulation, delay_wgrad_compute and backward_dw() for the experts' w1 and w2
    (as in Transformer Engine, _WeightGradOptions; router_w gets its .grad as usual): the layer
    then runs as its parts (router GEMM in f32, router, permute, grouped MLP, unpermute)
    instead of moex's one-call MoE layer.

    FP8 training (experimental): fp8_recipe=None | "block" | "current" | "mxfp8", fp8_format=
    "e4m3" | "hybrid", fp8_pow2_scales, fp8_amax_epsilon (_Fp8Options): the experts' GEMMs,
    forward and backward, run on FP8 operands (moex's MoE layer passes the recipe to its grouped
    MLP); the router GEMM stays in f32.

    Expert parallelism (experimental): ep_group, a torch.distributed process group of the NCCL
    backend (CUDA: the layer on device, default the current CUDA device) or an mpi4py MPI.Comm
    (the CPU backend) of W ranks, spreads the experts over them (moex's EP MoE layer, docs/ops.md
    section 10): rank r holds experts [r E/W, (r+1) E/W) (w1, w2, b1, b2 of E/W experts; router_w
    whole), forward(x) takes this rank's tokens (at most ep_max_tokens of them; ep_max_recv_rows,
    the expert rows a rank receives, defaults to what no routing can overflow), and the backward
    gives this rank's share of router_w's gradient (sum the shares over the ranks, as data
    parallelism does); ep_transfer: EPContext's transfer ("auto", "capacity", "peer").
    ep_dropped: after each forward, a [1] int64 tensor on the layer's device, the expert rows this
    rank received past ep_max_recv_rows and dropped (their tokens got nothing from those
    experts; always 0 with the default). With fp8_recipe "block" the tokens travel as their FP8
    rowwise copy, which FC1 reads as it arrives (docs/ops.md 10.4). Every rank constructs the
    layer alike and makes the same calls (collective); eager, under torch.compile or captured in
    a CUDA graph, without the weight-gradient options, for now. close() frees the layer's EP
    context (its NCCL communicator) at once, which a CUDA graph that captured the layer's step
    otherwise keeps until the process ends: call it after the graph is freed."""

    def __init__(self, num_experts: int, hidden_size: int, ffn_size: int, topk: int, score: str = "softmax",
                 renorm: bool = True, glu: str = "swiglu", layout: str = "contiguous", bias1: bool = False,
                 bias2: bool = False, scale_b2: bool = True, params_dtype: Optional[torch.dtype] = None,
                 device: Union[torch.device, str, None] = None, init_method=None, limit: float = 7.0,
                 alpha: float = 1.702, offset: float = 1.0, fuse_wgrad_accumulation: bool = False,
                 delay_wgrad_compute: bool = False, fp8_recipe: Optional[str] = None, fp8_format: str = "e4m3", fp8_pow2_scales: bool = False,
                 fp8_amax_epsilon: float = 0.0, ep_group=None, ep_max_tokens: Optional[int] = None,
                 ep_max_recv_rows: Optional[int] = None, ep_transfer: str = "auto"):
        super().__init__()
        _check_sizes("torch.MoELayer", num_experts=num_experts, hidden_size=hidden_size, ffn_size=ffn_size,
                     topk=topk)
        glu_code = _glu_code("torch.MoELayer", glu, layout, limit, alpha, offset)
        self._init_fp8("torch.MoELayer", fp8_recipe, fp8_format, fp8_pow2_scales, fp8_amax_epsilon)
        if score not in _SCORES:
            raise ValueError(f"moex.torch.MoELayer: score must be one of {list(_SCORES)}")
        if not 1 <= topk <= num_experts:
            raise ValueError(f"moex.torch.MoELayer: topk = {topk}, must be 1..{num_experts}")
        dtype = params_dtype or torch.get_default_dtype()
        E, H, F = num_experts, hidden_size, ffn_size
        self._ep, El = None, E   # El: this rank's experts
        if ep_group is not None:
            if fuse_wgrad_accumulation or delay_wgrad_compute:
                raise ValueError("moex.torch.MoELayer: ep_group does not take the weight-gradient options, for now")
            from ._ep import ep_setup   # (here: _ep builds on this module)
            self._ep, El = ep_setup("torch.MoELayer", ep_group, E, topk, H, dtype, device, ep_max_tokens,
                                    ep_max_recv_rows, ep_transfer)
            device = self._ep.device   # (an NCCL group without a device: the current CUDA device)
            self.ep_dropped = torch.zeros(1, dtype=torch.int64, device=device)   # (each forward's: _ep)
        init = init_method or (lambda t: torch.nn.init.normal_(t, std=0.02))
        self.router_w = torch.nn.Parameter(torch.empty(E, H, dtype=dtype, device=device))
        self.w1 = torch.nn.Parameter(torch.empty(El, 2 * F, H, dtype=dtype, device=device))
        self.w2 = torch.nn.Parameter(torch.empty(El, H, F, dtype=dtype, device=device))
        for t in (self.router_w, self.w1, self.w2):
            init(t.data)
        self.b1 = torch.nn.Parameter(torch.zeros(El, 2 * F, dtype=dtype, device=device)) if bias1 else None
        self.b2 = torch.nn.Parameter(torch.zeros(El, H, dtype=dtype, device=device)) if bias2 else None
        b2_mode = BIAS_NONE if not bias2 else (BIAS_SCALED if scale_b2 else BIAS_ADD)
        self.options = (topk, _SCORES[score], int(renorm), b2_mode) + glu_code
        self._init_weight_grads(fuse_wgrad_accumulation, delay_wgrad_compute)

    def forward(self, x: Tensor, is_first_microbatch: Optional[bool] = None) -> Tensor:
        """y [..., H] for x [..., H] (the leading dimensions are the tokens)."""
        H = self.w1.shape[2]
        if not isinstance(x, Tensor) or x.dim() == 0 or x.shape[-1] != H:
            raise ValueError(f"moex.torch.MoELayer: x must be a tensor [..., {H}], got "
                             f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
        shape = x.shape
        x = _rows("torch.MoELayer", "x", x)
        if self._ep is not None:
            from ._ep import ep_moe_forward
            y = ep_moe_forward(self, x, is_first_microbatch)
        elif self.fuse_wgrad_accumulation or self.delay_wgrad_compute:
            y = self._forward_parts(x, is_first_microbatch)
        else:
            kept = self._fp8_kept((self.w1, self.w2), is_first_microbatch)
            y, _ = _moe_forward(x, self.router_w, self.w1, self.b1, self.w2, self.b2, *self.options, *self._fp8, kept)
        return y if len(shape) == 2 else y.reshape(shape)

    def _apply(self, fn, *args, **kwargs):
        """torch.nn.Module's (.to(), .bfloat16(), ...), then, with ep_group, a new EP context when
        the parameters' dtype changed (the tokens travel in the layer's dtype): collective, as
        the layer's other calls (every rank converts its layer alike). The old context is freed
        with its last reference (kept while a CUDA graph captured its calls: EPContext)."""
        out = super()._apply(fn, *args, **kwargs)
        ep = getattr(self, "_ep", None)
        if ep is not None and self.w1.dtype != ep.dtype:
            from ._ep import ep_setup
            self._ep, _ = ep_setup("torch.MoELayer", ep.group, ep.num_experts, ep.topk, ep.hidden, self.w1.dtype,
                                   ep.device, ep.max_tokens, ep.max_recv_rows, ep.transfer)
        return out

    def close(self) -> None:
        """Frees the EP context and its communicator now (EPContext.close; nothing without
        ep_group). Not collective; a later forward is refused. A second close does nothing."""
        if self._ep is not None:
            self._ep.close()

    def _forward_parts(self, x: Tensor, first_microbatch: Optional[bool]) -> Tensor:
        """docs/ops.md 8.1 step by step, the experts through _experts."""
        topk, score, norm, b2_mode, *glu = self.options
        logits = F.linear(x.float(), self.router_w.float())   # f32 logits of the rounded inputs, as moex's
        probs, ids = _router_forward(logits, topk, score, norm)
        xp, probs_p, splits, row_map = _permute_forward(x, ids, probs, self.w1.shape[0])
        yp = _experts(self, xp, splits, probs_p, b2_mode, tuple(glu), True, first_microbatch)
        return _unpermute_forward(yp, row_map, topk)
