"""moex.torch._fp8 - the FP8 training recipe (experimental; docs/ops.md 9.11): the operators'
fp8 arguments (mode, dtypes, pow2_scales, amax_epsilon) from a recipe named as the functions
and modules take it (_fp8_code), the moex_fp8_recipe struct of those arguments (_fp8_recipe),
and the modules' FP8 options (_Fp8Options: four checked attributes).
"""
from typing import Optional, Tuple

from .. import _capi


_FP8_RECIPES = {"block": _capi.FP8_BLOCK, "current": _capi.FP8_CURRENT, "mxfp8": _capi.FP8_MXFP8}
_FP8_FORMATS = {"e4m3": _capi.FP8_E4M3_ALL, "hybrid": _capi.FP8_HYBRID}
_FP8_OFF = (_capi.FP8_OFF, _capi.FP8_E4M3_ALL, False, 0.0)
Fp8 = Tuple[int, int, bool, float]   # the operators' fp8 arguments: mode, dtypes, pow2_scales, amax_epsilon


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


def _fp8_recipe(mode: int, dtypes: int, pow2_scales: bool, amax_epsilon: float) -> Optional[_capi.Fp8Recipe]:
    """The moex_fp8_recipe of an operator's fp8 arguments; None (the zero struct: off) for the
    defaults."""
    if (mode, dtypes, pow2_scales, amax_epsilon) == _FP8_OFF:
        return None
    return _capi.Fp8Recipe(mode, dtypes, int(pow2_scales), amax_epsilon)


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

    Each call quantizes what its GEMMs need from the module's weights (their master copy, every
    call) and activations; outputs, gradients and main_grad keep their dtypes. The router of
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

    def _fp8_repr(self) -> str:
        if self._fp8_values[0] is None:
            return ""
        return ", " + ", ".join(f"{k}={v!r}" for k, v in zip(self._FP8_FIELDS, self._fp8_values))
