"""moex.torch._linear_layer - the module GroupedLinear (Transformer Engine's drop-in) and what
only it uses: its autograd with the weight-gradient options (_GroupedLinearTE), its separate
weights as moex's discrete weights (_WeightPointers, _GroupedLinearDiscrete, or the compiled
extension's moex::grouped_linear_discrete_forward: _DISCRETE_FORWARD).
"""
from typing import List, Optional, Tuple, Union

import torch
from torch import Tensor

from .. import _capi, _torch_ext
from .._capi import BIAS_ADD, BIAS_NONE, BIAS_SCALED
from ._checks import _check, _check_bias, _row_probs, _rows
from ._fp8 import Fp8, _Fp8Options, _fp8_recipe
from ._linear import _backward_data, _backward_weight, _bias_grad_dtype, _forward
from ._operators import _DTYPES, _FLOATS, _args, _eager, _once_differentiable, _run, _zero_tail
from ._splits import Splits, _splits_tensor
from ._weight_grads import _module_weight_grads, _WeightGradOptions


class _GroupedLinearTE(torch.autograd.Function):
    """GroupedLinear's autograd with the weight-gradient options (_WeightGradOptions): x, bias
    and probs get their gradients as usual; the weights theirs through moex::module_weight_grads
    (into .grad or main_grad, now or at backward_dw()), and w (the packed weight, or the stack
    of the separate ones under torch.compile) the DDP dummy zero gradient or None. wgrad: the
    layer's _wgrad_args. torch.compile(fullgraph=True) traces it: the backward's only side
    effect is that opaque operator."""

    @staticmethod
    def forward(ctx, x, w, splits, b, probs, wgrad):
        mode = BIAS_NONE if b is None else (BIAS_SCALED if probs is not None else BIAS_ADD)
        ctx.save_for_backward(x, w, splits, b, probs)
        ctx.mode, ctx.wgrad = mode, wgrad
        return _forward(x, w, splits, b, probs, mode, *wgrad[4])

    @staticmethod
    @_once_differentiable
    def backward(ctx, dy):
        x, w, splits, b, probs = ctx.saved_tensors
        key, first_microbatch, keep_copies, dummy, fp8 = ctx.wgrad
        mode, needs = ctx.mode, ctx.needs_input_grad
        dy = dy.contiguous()
        need_dbias, need_dprobs = b is not None and needs[3], mode == BIAS_SCALED and needs[4]
        dx = dbias = dprobs = None
        if needs[0] or need_dbias or need_dprobs:
            dx, dbias, dprobs = _backward_data(dy, w, splits, b, probs, mode, needs[0], need_dbias, need_dprobs, *fp8)
        _module_weight_grads([x], [dy], splits, key, first_microbatch, keep_copies, *fp8)
        return (dx if needs[0] else None, torch.zeros_like(w) if dummy[0] else None, None,
                dbias if need_dbias else None, dprobs if need_dprobs else None, None)


class _WeightPointers:
    """The array of pointers to G separate [N, K] weights, in their memory (moex_weight's
    discrete form, include/moex.h), so that GroupedLinear passes weight0.. to moex without
    stacking a copy. A cache of the weights' addresses, rewritten only when a weight's storage
    changes (data_ptr), so do that outside CUDA graph capture (one eager forward before
    capturing does); calls with the same weights, captured or replayed, use it as it is
    (graph-safe). Two forms: arrays() for the compiled extension's operators, which keep it
    current themselves (python/csrc/kernels.cpp's discrete_weight) and, on Hopper, keep the
    weights' tensor maps beside it (moex_weight_maps_write: no launch per call to write them);
    pointers() for the ctypes path, kept current here. On CUDA the Hopper kernels read each
    weight by TMA, which needs it 16-byte aligned, and the library cannot see the pointers
    (they are on the device): weights that are not are stacked (by the operator, or the layer
    when pointers() gives None)."""

    # ptrs_host's entries past the addresses: the operators' key of the kept maps (kernels.cpp)
    _MAPS_KEY = 4

    def __init__(self):
        self.dev, self._key, self._aligned = None, None, False   # (of pointers())
        self._arrays = (None, None, None)   # (device, dev, host) of arrays()

    def arrays(self, params: List[Tensor]) -> Tuple[Tensor, Tensor]:
        """(ptrs, ptrs_host), the compiled extension's operators' cache, which they keep
        current: ptrs on the weights' device, G addresses and room for the maps
        (torch.ops.moex.weight_maps_size bytes past the first 128-byte boundary after them),
        ptrs_host [G + 4] on the CPU (on the CPU ptrs itself). Made anew when the weights moved
        to another device (zeros: no weight's address, so the operator's first call fills
        them)."""
        device = params[0].get_device()   # (an int: -1 on the CPU)
        if device != self._arrays[0]:
            G = len(params)
            host = torch.zeros(G + self._MAPS_KEY, dtype=torch.int64)
            if device < 0:
                dev = host
            else:
                maps = torch.ops.moex.weight_maps_size(params[0], G)
                dev = torch.zeros(G + (128 + maps) // 8 if maps else G, dtype=torch.int64, device=params[0].device)
            self._arrays = (device, dev, host)
        return self._arrays[1], self._arrays[2]

    def pointers(self, params: List[Tensor]) -> Optional[Tensor]:
        """`dev` made current here (the ctypes path: new arrays when an address changed, so that
        a pending backward keeps the old ones); None for CUDA weights that are not all 16-byte
        aligned."""
        key = list(map(Tensor.data_ptr, params))
        if key != self._key:
            self.dev = torch.tensor(key, dtype=torch.int64).to(params[0].device)
            self._key = key
            self._aligned = params[0].device.type != "cuda" or all(p % 16 == 0 for p in key)
        return self.dev if self._aligned else None

    def weight(self, owner: str, params: List[Tensor]) -> Tuple[_capi.Weight, Tensor]:
        """The moex_weight of `params` and the pointer array it points to (keep it alive as long
        as the weight is used); `pointers(params)` must not be None."""
        p0 = params[0]
        for g, p in enumerate(params):
            if p.dtype not in _FLOATS or p.dtype != p0.dtype or p.device != p0.device or p.shape != p0.shape \
                    or not p.is_contiguous():
                raise ValueError(f"moex.{owner}: weight{g} is a {'' if p.is_contiguous() else 'non-contiguous '}"
                                 f"{p.dtype} {tuple(p.shape)} on {p.device}; the weights must be contiguous, of "
                                 f"one float dtype, shape and device (weight0: {p0.dtype} {tuple(p0.shape)} on "
                                 f"{p0.device})")
        w = _capi.Weight()
        w.t.dtype, w.t.ndim = _DTYPES[p0.dtype], 3
        w.t.shape[:3] = (len(params), *p0.shape)
        w.ptrs = self.dev.data_ptr()
        return w, self.dev


def _discrete_forward(x: Tensor, w: _capi.Weight, splits: Tensor, b: Optional[Tensor], probs: Optional[Tensor],
                      mode: int, fp8: Fp8) -> Tensor:
    """grouped_linear_forward's implementation with discrete weights w (_WeightPointers)."""
    op = "grouped_linear_forward"
    _check(op, "x", x, x.device, _FLOATS, 2)
    _check(op, "splits", splits, x.device, (torch.int64,), 1)
    _check_bias(op, mode, b, probs, x, None)
    y = x.new_empty(x.shape[0], w.t.shape[1])
    args = _args(_capi.GroupedLinearArgs, x=x, w=w, bias_mode=mode, bias=b, probs=probs, splits=splits, y=y,
                 fp8=_fp8_recipe(*fp8))
    _run(op, args, x.device)
    return _zero_tail(y, splits)


def _discrete_backward_data(dy: Tensor, w: _capi.Weight, splits: Tensor, b: Optional[Tensor],
                            probs: Optional[Tensor], mode: int, need_dx: bool, need_dbias: bool, need_dprobs: bool,
                            fp8: Fp8) -> Tuple[Tensor, Tensor, Tensor]:
    """grouped_linear_backward_data's implementation with discrete weights w (_WeightPointers)."""
    op = "grouped_linear_backward_data"
    _check(op, "dy", dy, dy.device, _FLOATS, 2)
    T, (G, N, K) = dy.shape[0], tuple(w.t.shape[:3])
    dx, dbias = dy.new_empty(T if need_dx else 0, K), dy.new_empty(G if need_dbias else 0, N, dtype=_bias_grad_dtype(b))
    dprobs = dy.new_zeros(T if need_dprobs else 0, dtype=torch.float32)   # moex adds into it (+=)
    scaled = mode == BIAS_SCALED
    args = _args(_capi.GroupedLinearDgradArgs, dy=dy, w=w, bias_mode=mode, bias=b if scaled and need_dprobs else None,
                 probs=probs if scaled else None, splits=splits, dx=dx if need_dx else None,
                 dbias=dbias if need_dbias else None, dprobs=dprobs if need_dprobs else None, fp8=_fp8_recipe(*fp8))
    _run(op, args, dy.device)
    return _zero_tail(dx, splits), dbias, dprobs


class _GroupedLinearDiscrete(torch.autograd.Function):
    """GroupedLinear's eager forward and backward on its separate weights as moex's discrete
    weights (_WeightPointers: no stacked copy). weights: the layer's weight0.., each getting
    its view of one [G, N, K] dW; or, with the weight-gradient options (wgrad: the layer's
    _wgrad_args, else None), their gradients through moex::module_weight_grads and autograd
    the DDP dummy zeros or None."""

    @staticmethod
    def forward(ctx, x, splits, b, probs, w, ptrs, fp8, wgrad, *weights):
        mode = BIAS_NONE if b is None else (BIAS_SCALED if probs is not None else BIAS_ADD)
        ctx.save_for_backward(x, splits, b, probs, ptrs, *weights)
        ctx.w, ctx.mode, ctx.fp8, ctx.wgrad = w, mode, fp8, wgrad
        return _discrete_forward(x, w, splits, b, probs, mode, fp8)

    @staticmethod
    @_once_differentiable
    def backward(ctx, dy):
        x, splits, b, probs, _, *weights = ctx.saved_tensors   # the pointer array kept alive for ctx.w
        needs, mode, fp8 = ctx.needs_input_grad, ctx.mode, ctx.fp8
        dy = dy.contiguous()
        need_dbias, need_dprobs = b is not None and needs[2], mode == BIAS_SCALED and needs[3]
        dx = dbias = dprobs = None
        if needs[0] or need_dbias or need_dprobs:
            dx, dbias, dprobs = _discrete_backward_data(dy, ctx.w, splits, b, probs, mode, needs[0], need_dbias,
                                                        need_dprobs, fp8)
        if ctx.wgrad is not None:
            key, first_microbatch, keep_copies, dummy, _ = ctx.wgrad
            _module_weight_grads([x], [dy], splits, key, first_microbatch, keep_copies, *fp8)
            wgrads = [torch.zeros_like(p) if dummy[0] else None for p in weights]
        elif any(needs[8:]):
            wgrads = list(_backward_weight(x, dy, splits, _DTYPES[weights[0].dtype], *fp8).unbind(0))
        else:
            wgrads = [None] * len(weights)
        return (dx if needs[0] else None, None, dbias if need_dbias else None, dprobs if need_dprobs else None,
                None, None, None, None, *wgrads)


# The compiled extension's operator on separate weights (python/csrc: forward, backward and autograd in
# C++; _GroupedLinearDiscrete's math without the weight-gradient options), None without it.
_DISCRETE_FORWARD = None
if "grouped_linear_discrete_forward" in _torch_ext.OPS:
    _DISCRETE_FORWARD = torch.ops.moex.grouped_linear_discrete_forward.default

    @torch.library.register_fake("moex::grouped_linear_discrete_forward")
    def _(x, weights, ptrs, ptrs_host, splits, bias, probs, bias_mode, *fp8):
        return x.new_empty(x.shape[0], weights[0].shape[0])

    @torch.library.register_fake("moex::grouped_linear_discrete_backward_data")
    def _(dy, weights, ptrs, ptrs_host, splits, bias, probs, bias_mode, need_dx, need_dbias, need_dprobs, *fp8):
        T, (N, K), G = dy.shape[0], weights[0].shape, len(weights)
        return (dy.new_empty(T if need_dx else 0, K), dy.new_empty(G if need_dbias else 0, N, dtype=_bias_grad_dtype(bias)),
                dy.new_empty(T if need_dprobs else 0, dtype=torch.float32))


class GroupedLinear(_WeightGradOptions, _Fp8Options, torch.nn.Module):
    """G linear layers over the rows of G groups, a drop-in for
    transformer_engine.pytorch.GroupedLinear: the same constructor arguments where they apply,
    parameters weight0..weight{G-1} ([out_features, in_features]) and bias0.. ([out_features]),
    and forward(inp, m_splits) with inp [..., in_features] (the leading dimensions are the rows;
    the output is [..., out_features], rows past sum(m_splits) 0) and m_splits a list of ints or
    an int64 or int32 tensor on the input's device (then graph-safe). The separate weights reach
    moex as an array of pointers to them (_WeightPointers), not a stacked copy; under
    torch.compile, a dispatch mode or a functorch transform they are stacked.

    fuse_wgrad_accumulation, delay_wgrad_compute and backward_dw(): as in Transformer Engine
    (_WeightGradOptions); the bias gradient comes from the backward either way.

    moex additions: packed=True keeps one parameter `weight` [G, out, in] (and `bias` [G, out])
    instead of G of each; forward(inp, m_splits, probs=p) scales the bias by the per-row p
    (scale_bias, differentiable in p).

    FP8 training (experimental): fp8_recipe=None | "block" | "current" | "mxfp8", fp8_format=
    "e4m3" | "hybrid", fp8_pow2_scales, fp8_amax_epsilon (_Fp8Options): the forward, backward
    data and weight gradient (into .grad or main_grad, now or in backward_dw()) run their GEMMs
    on FP8 operands. Transformer Engine picks its recipe with fp8_autocast instead; here it is
    the module's own."""

    def __init__(self, num_gemms: int, in_features: int, out_features: int, bias: bool = True,
                 params_dtype: Optional[torch.dtype] = None, device: Union[torch.device, str, None] = None,
                 init_method=None, fuse_wgrad_accumulation: bool = False, delay_wgrad_compute: bool = False,
                 packed: bool = False, fp8_recipe: Optional[str] = None, fp8_format: str = "e4m3", fp8_pow2_scales: bool = False,
                 fp8_amax_epsilon: float = 0.0):
        super().__init__()
        if num_gemms < 1 or in_features < 1 or out_features < 1:
            raise ValueError("moex.torch.GroupedLinear: num_gemms, in_features and out_features must be >= 1")
        self._init_fp8("torch.GroupedLinear", fp8_recipe, fp8_format, fp8_pow2_scales, fp8_amax_epsilon)
        self.num_gemms, self.in_features, self.out_features = num_gemms, in_features, out_features
        self.use_bias, self.packed = bias, packed
        self._init_weight_grads(fuse_wgrad_accumulation, delay_wgrad_compute)
        self._pointers = _WeightPointers()   # the separate weights as moex's discrete weights
        dtype = params_dtype or torch.get_default_dtype()
        init = init_method or (lambda t: torch.nn.init.kaiming_uniform_(t, a=5 ** 0.5))
        shape = (out_features, in_features)
        if packed:
            self.weight = torch.nn.Parameter(torch.empty(num_gemms, *shape, dtype=dtype, device=device))
            for g in range(num_gemms):
                init(self.weight.data[g])
            if bias:
                self.bias = torch.nn.Parameter(torch.zeros(num_gemms, out_features, dtype=dtype, device=device))
        else:
            self._weight_names = [f"weight{g}" for g in range(num_gemms)]
            for g in range(num_gemms):
                w = torch.nn.Parameter(torch.empty(*shape, dtype=dtype, device=device))
                init(w.data)
                setattr(self, f"weight{g}", w)
                if bias:
                    setattr(self, f"bias{g}", torch.nn.Parameter(torch.zeros(out_features, dtype=dtype,
                                                                             device=device)))

    def _bias(self) -> Optional[Tensor]:
        """The [G, out] bias (the separate ones stacked: a small copy), None without bias."""
        if not self.use_bias:
            return None
        return self.bias if self.packed else torch.stack([getattr(self, f"bias{g}") for g in range(self.num_gemms)])

    def _weight_params(self) -> List[Tensor]:
        if self.packed:
            return [self.weight]
        params = self._parameters   # (what getattr finds them in, without nn.Module.__getattr__'s host time)
        return [params[name] for name in self._weight_names]

    def _weight_groups(self) -> List[List[Tensor]]:
        return [self._weight_params()]

    def forward(self, inp: Tensor, m_splits: Splits, probs: Optional[Tensor] = None,
                is_first_microbatch: Optional[bool] = None) -> Tensor:
        """y = inp W_g^T + b_g per group (probs [T] or inp's leading dimensions: + p_r b_g).
        is_first_microbatch=True makes the fused main_grad accumulation overwrite instead (as in
        Transformer Engine)."""
        owner = "torch.GroupedLinear"
        x = _rows(owner, "inp", inp)
        splits = _splits_tensor(m_splits, x.device, owner, x.shape[0])
        p, b = _row_probs(owner, probs, inp), self._bias()
        if p is not None and b is None:
            raise ValueError("moex.torch.GroupedLinear: probs scales the bias, but the layer has none")
        te = self.fuse_wgrad_accumulation or self.delay_wgrad_compute
        wgrad = self._wgrad_args(bool(is_first_microbatch)) if te else None
        mode = BIAS_NONE if b is None else (BIAS_SCALED if p is not None else BIAS_ADD)
        if self.packed:
            w = self._parameters["weight"]   # (without nn.Module.__getattr__'s host time)
        else:
            params = self._weight_params()
            if _eager([x, p, b] + params):
                y = None
                if wgrad is None and _DISCRETE_FORWARD is not None:
                    y = _DISCRETE_FORWARD(x, params, *self._pointers.arrays(params), splits, b, p, mode, *self._fp8)
                elif self._pointers.pointers(params) is not None:
                    w, ptrs = self._pointers.weight(owner, params)
                    y = _GroupedLinearDiscrete.apply(x, splits, b, p, w, ptrs, self._fp8, wgrad, *params)
                if y is not None:
                    return y if inp.dim() == 2 else y.view(*inp.shape[:-1], self.out_features)
            w = torch.stack(params)
        if te:
            y = _GroupedLinearTE.apply(x, w, splits, b, p, wgrad)
        else:
            kept = self._fp8_kept((w,), is_first_microbatch) if self.packed else None
            y = _forward(x, w, splits, b, p, mode, *self._fp8, kept)
        return y if inp.dim() == 2 else y.view(*inp.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"num_gemms={self.num_gemms}, in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.use_bias}, packed={self.packed}{self._fp8_repr()}")
