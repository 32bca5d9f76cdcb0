"""moex.torch._fp8 - the FP8 training recipe (experimental; docs/ops.md 9.11): the operators'
fp8 arguments (mode, dtypes, pow2_scales, amax_epsilon, then fp8_weights) from a recipe named
as the functions and modules take it (_fp8_code), the moex_fp8_recipe struct of those
arguments (_fp8_recipe), the buffer of a layer's weights' FP8 copies (_kept_layout,
_kept_quantize), and the modules' FP8 options (_Fp8Options: four checked attributes, and the
weights' copies a module keeps between calls).
"""
import ctypes
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

from .. import _capi
from ._operators import _DTYPES, _fill, _run


_FP8_RECIPES = {"block": _capi.FP8_BLOCK, "current": _capi.FP8_CURRENT, "mxfp8": _capi.FP8_MXFP8}
_FP8_FORMATS = {"e4m3": _capi.FP8_E4M3_ALL, "hybrid": _capi.FP8_HYBRID}
_FP8_OFF = (_capi.FP8_OFF, _capi.FP8_E4M3_ALL, False, 0.0)
Fp8 = Tuple[int, int, bool, float]   # the operators' fp8 arguments: mode, dtypes, pow2_scales, amax_epsilon
_FP8_ARGS = len(_FP8_OFF) + 1   # the operators' fp8 arguments: Fp8's four, then fp8_weights (Optional[Tensor])
_KEPT_ALIGN = 256   # moex_fp8_weight_layout's alignment


def _fp8_code(owner: str, fp8_recipe: Optional[str], fp8_format: str = "e4m3", fp8_pow2_scales: bool = False,
              fp8_amax_epsilon: float = 0.0) -> Fp8:
    """The operators' fp8 arguments for a recipe named as the modules take it (None: off).

    fp8_recipe: None (off: the GEMMs run in the activation dtype), "block" (DeepSeek-V3's 1x128
    activations and gradients, 128x128 weight blocks: the recipe for Hopper), "current" (current
    scaling, one scale per group or expert) or "mxfp8" (1x32 blocks, E8M0 scales); fp8_format
    "e4m3" (every operand E4M3) or "hybrid" (gradients E5M2, as Transformer Engine's
    Format.HYBRID); fp8_pow2_scales rounds scales down to powers of 2 (block and current);
    fp8_amax_epsilon >= 0 floors each amax (not mxfp8)."""
    if fp8_recipe is None and fp8_format == "e4m3" and fp8_pow2_scales is False and fp8_amax_epsilon == 0.0:
        return _FP8_OFF   # the defaults, without the checks' host time
    if fp8_recipe is not None and fp8_recipe not in _FP8_RECIPES:
        raise ValueError(f"moex.{owner}: fp8_recipe must be None or one of {list(_FP8_RECIPES)}, "
                         f"got {fp8_recipe!r}")
    if fp8_format not in _FP8_FORMATS:
        raise ValueError(f"moex.{owner}: fp8_format must be one of {list(_FP8_FORMATS)}, got {fp8_format!r}")
    eps = float(fp8_amax_epsilon)
    if not (eps >= 0.0 and eps != float("inf")):
        raise ValueError(f"moex.{owner}: fp8_amax_epsilon must be finite and >= 0, got {fp8_amax_epsilon!r}")
    if fp8_recipe == "mxfp8" and (fp8_pow2_scales or eps != 0.0):
        raise ValueError(f"moex.{owner}: fp8_recipe 'mxfp8' has power-of-2 (E8M0) scales and no amax epsilon: "
                         "fp8_pow2_scales and fp8_amax_epsilon apply to 'block' and 'current' only")
    if fp8_recipe is None:
        return _FP8_OFF
    return _FP8_RECIPES[fp8_recipe], _FP8_FORMATS[fp8_format], bool(fp8_pow2_scales), eps


def _fp8_recipe(mode: int, dtypes: int, pow2_scales: bool, amax_epsilon: float, fp8_weights: Optional[Tensor] = None,
                weights: Sequence[Tensor] = ()) -> Optional[_capi.Fp8Recipe]:
    """The moex_fp8_recipe of an operator's fp8 arguments; None (the zero struct: off) for the
    defaults. With fp8_weights (the buffer of _kept_quantize) and the layer's weights in its
    order, the recipe's `weights` are their copies in that buffer (it keeps their array)."""
    if (mode, dtypes, pow2_scales, amax_epsilon) == _FP8_OFF:
        return None
    r = _capi.Fp8Recipe(mode, dtypes, int(pow2_scales), amax_epsilon)
    if fp8_weights is not None and weights and mode != _capi.FP8_OFF:
        if fp8_weights.dtype != torch.uint8 or fp8_weights.dim() != 1 or not fp8_weights.is_contiguous():
            raise ValueError(f"moex: fp8_weights must be a contiguous 1-D torch.uint8 tensor, got "
                             f"{fp8_weights.dtype} {tuple(fp8_weights.shape)}")
        if fp8_weights.device != weights[0].device:
            raise ValueError(f"moex: fp8_weights is on {fp8_weights.device}, the weights on {weights[0].device}")
        copies, end = _kept_layout(r, weights, fp8_weights.data_ptr())
        if end > fp8_weights.data_ptr() + fp8_weights.numel():
            raise ValueError(f"moex: fp8_weights has {fp8_weights.numel()} bytes, too few for the FP8 copies of the "
                             "layer's weights (moex.torch keeps them)")
        r.weights = ctypes.cast(copies, ctypes.c_void_p)   # (ctypes keeps the array alive with the struct)
    return r


def _kept_layout(r: _capi.Fp8Recipe, weights: Sequence[Tensor], base: int):
    """The copies of the weights (moex_fp8_weight_layout's, one weight's after the other, each
    from a 256-byte boundary, the first from the first one at or after `base`) and the address
    where they end. The same rule as the extension's Fp8Kept (python/csrc)."""
    ctx = _capi.context(_capi.BACKEND_CPU, 0)   # (the layout reads no memory: any context)
    copies = (_capi.Fp8Weight * len(weights))()
    at = -(-base // _KEPT_ALIGN) * _KEPT_ALIGN
    for i, w in enumerate(weights):
        desc = _capi.Weight(_capi.Tensor(), None, None)
        desc.t.dtype, desc.t.ndim = _DTYPES[w.dtype], 3
        for d in range(3):
            desc.t.shape[d] = w.shape[d]
        nbytes = ctypes.c_size_t()   # (the layout writes the views only: the caller checks the end)
        _capi.check(ctx, _capi.LIB.moex_fp8_weight_layout(ctx, ctypes.byref(r), ctypes.byref(desc), at,
                                                          ctypes.byref(copies[i]), ctypes.byref(nbytes)))
        at = -(-(at + nbytes.value) // _KEPT_ALIGN) * _KEPT_ALIGN
    return copies, at


def _kept_quantize(fp8: Fp8, weights: Sequence[Tensor]) -> Tensor:
    """A new buffer (uint8, on the weights' device) holding the FP8 copies of `weights` (the
    layer's, in its order) under the recipe fp8, quantized now on torch's current stream: the
    operators' fp8_weights."""
    r = _fp8_recipe(*fp8)
    _, end = _kept_layout(r, weights, 0)
    buf = torch.empty(end + _KEPT_ALIGN, dtype=torch.uint8, device=weights[0].device)
    copies, _ = _kept_layout(r, weights, buf.data_ptr())
    params = _capi.LIB.moex_fp8_weight_params(ctypes.byref(r))
    for w, c in zip(weights, copies):
        q = _capi.WeightQuantizeArgs()
        _fill(q.w, w.detach())
        q.params, q.rowwise, q.columnwise = params, c.rowwise, c.columnwise
        _run("weight_quantize", q, w.device)
    return buf


# ---- the modules' options ----------------------------------------------------------------------

class _Fp8Options:
    """The FP8 training recipe of a module (experimental; docs/ops.md 9.11), passed to every
    moex call of its forward and backward (the weight gradients, delayed or fused, included):

    fp8_recipe: None (off: the GEMMs run in the activation dtype), "block" (DeepSeek-V3's: 1x128
    blocks of activations and gradients, 128x128 weight blocks; the recipe for Hopper), "current"
    (current scaling: one scale per group of rows, one per expert's weight) or "mxfp8" (1x32
    blocks with E8M0 scales; correct everywhere, fast only where MX GEMMs exist);
    fp8_format: "e4m3" (every operand E4M3) or "hybrid" (gradients E5M2, as Transformer Engine's
    Format.HYBRID);
    fp8_pow2_scales: scales rounded down to powers of 2 ("block" and "current");
    fp8_amax_epsilon: each amax floored to it (>= 0; not "mxfp8").

    Each call quantizes what its GEMMs need from the module's activations and, by default, from
    its weights' master copy. Weights quantized once (docs/ops.md 9.11, "weights quantized
    once"): forward(..., is_first_microbatch=True) quantizes the weights into FP8 copies that the
    module keeps, and is_first_microbatch=False uses them, as Transformer Engine's FP8 weight
    caching does (the copies are made anew when a weight changed since: another tensor, shape,
    dtype or version, as an optimizer step leaves it, or another recipe); None, the default,
    quantizes them in every call. In a CUDA graph capture and under torch.compile, with the
    weight-gradient options and for a GroupedLinear of separate weights, the weights are
    quantized in the call. Outputs, gradients and main_grad keep their dtypes. The router of
    MoELayer, the GLU, the bias gradients and the routing run as without FP8. The four are
    attributes: assigning one checks it (ValueError naming the allowed values) and takes effect
    on the next forward."""

    _FP8_FIELDS = ("fp8_recipe", "fp8_format", "fp8_pow2_scales", "fp8_amax_epsilon")

    def _init_fp8(self, owner: str, fp8_recipe: Optional[str], fp8_format: str, fp8_pow2_scales: bool,
                  fp8_amax_epsilon: float) -> None:
        self._fp8_owner = owner
        self._set_fp8((fp8_recipe, fp8_format, bool(fp8_pow2_scales), float(fp8_amax_epsilon)))

    def _set_fp8(self, values: Tuple) -> None:
        self._fp8 = _fp8_code(self._fp8_owner, *values)   # the operators' fp8 arguments
        self._fp8_values = values

    def _fp8_property(i: int, doc: str):   # noqa: N805 (a helper of the class body)
        def get(self):
            return self._fp8_values[i]

        def set_(self, value):
            values = list(self._fp8_values)
            values[i] = value
            self._set_fp8(tuple(values))

        return property(get, set_, doc=doc)

    fp8_recipe = _fp8_property(0, 'None, "block", "current" or "mxfp8"')
    fp8_format = _fp8_property(1, '"e4m3" or "hybrid"')
    fp8_pow2_scales = _fp8_property(2, "power-of-2 scales (block, current)")
    fp8_amax_epsilon = _fp8_property(3, "the floor of each amax (block, current)")
    del _fp8_property

    def _fp8_kept(self, weights: Sequence[Tensor], first_microbatch: Optional[bool]) -> Optional[Tensor]:
        """The operators' fp8_weights for this call (see above): the copies kept, made anew when
        first_microbatch is True or the weights changed; None: quantized in the call."""
        if first_microbatch is None or self._fp8 == _FP8_OFF or torch.compiler.is_compiling():
            return None
        if weights[0].is_cuda and torch.cuda.is_current_stream_capturing():
            return None
        key = (self._fp8, tuple((w.data_ptr(), w._version, w.dtype, tuple(w.shape), w.device) for w in weights))
        if first_microbatch or getattr(self, "_fp8_kept_key", None) != key:
            with torch.no_grad():
                self._fp8_kept_buffer = _kept_quantize(self._fp8, weights)
            self._fp8_kept_key = key
        return self._fp8_kept_buffer

    def _fp8_repr(self) -> str:
        if self._fp8_values[0] is None:
            return ""
        return ", " + ", ".join(f"{k}={v!r}" for k, v in zip(self._FP8_FIELDS, self._fp8_values))
