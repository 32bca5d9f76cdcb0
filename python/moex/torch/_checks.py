"""moex.torch._checks - the argument checks of the operators (ValueError naming the argument
before anything runs: device, dtype, dimensions, contiguity, a bias or probs its mode would
ignore) and the conversions of the functions' and modules' arguments (rows of [..., C] inputs,
per-row probs, ints, contiguous tensors, module sizes). Splits have theirs in _splits.
"""
import math
import numbers
from typing import Optional

import torch
from torch import Tensor

from .._capi import BIAS_ADD, BIAS_NONE, BIAS_SCALED
from ._operators import _FLOATS


# ---- the operators' checks ---------------------------------------------------------------------

def _check(op: str, name: str, t: Optional[Tensor], device: torch.device, dtypes, ndim: int,
           optional: bool = False) -> None:
    """ValueError unless t is a contiguous tensor of `ndim` dims, one of `dtypes`, on `device`
    (or None where optional)."""
    if t is None:
        if optional:
            return
        raise ValueError(f"moex.{op}: {name} is required")
    if not isinstance(t, Tensor):
        raise ValueError(f"moex.{op}: {name} must be a tensor, got {type(t).__name__}")
    if t.device != device:
        raise ValueError(f"moex.{op}: {name} is on {t.device}, the other tensors on {device}")
    if t.dtype not in dtypes:
        raise ValueError(f"moex.{op}: {name} is {t.dtype}, must be one of {', '.join(map(str, dtypes))}")
    if t.dim() != ndim:
        raise ValueError(f"moex.{op}: {name} must have {ndim} dimensions, has shape {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"moex.{op}: {name} must be contiguous (call .contiguous())")


def _check_group_inputs(op: str, rows: Tensor, rows_name: str, w: Tensor, splits: Tensor, w_name: str = "w") -> None:
    _check(op, rows_name, rows, rows.device, _FLOATS, 2)
    _check(op, w_name, w, rows.device, (rows.dtype,), 3)
    _check(op, "splits", splits, rows.device, (torch.int64,), 1)
    if splits.shape[0] != w.shape[0]:
        raise ValueError(f"moex.{op}: splits has {splits.shape[0]} groups, {w_name} {w.shape[0]}")


_BIAS_MODE_NAMES = {BIAS_NONE: "NONE", BIAS_ADD: "ADD", BIAS_SCALED: "SCALED"}


def _check_bias_mode(op: str, name: str, mode: int, bias: Optional[Tensor], bias_name: str) -> None:
    """ValueError for an unknown mode, or a bias given with mode NONE (it would be ignored)."""
    if mode not in _BIAS_MODE_NAMES:
        raise ValueError(f"moex.{op}: unknown {name} {mode}")
    if mode == BIAS_NONE and bias is not None:
        raise ValueError(f"moex.{op}: {bias_name} is given but {name} is NONE (pass None, or ADD / SCALED)")


def _check_bias(op: str, bias_mode: int, bias: Optional[Tensor], probs: Optional[Tensor], rows: Tensor,
                w: Tensor) -> None:
    """bias [G, N] (dt or f32) with ADD / SCALED, probs [T] f32 with SCALED only: a bias or probs
    that the mode would ignore is refused (docs/conventions.md)."""
    _check_bias_mode(op, "bias_mode", bias_mode, bias, "bias")
    if probs is not None and bias_mode != BIAS_SCALED:
        raise ValueError(f"moex.{op}: probs is given but bias_mode is {_BIAS_MODE_NAMES[bias_mode]} "
                         "(probs scales the bias: SCALED only)")
    _check(op, "bias", bias, rows.device, (rows.dtype, torch.float32), 2, optional=bias_mode == BIAS_NONE)
    _check(op, "probs", probs, rows.device, (torch.float32,), 1, optional=bias_mode != BIAS_SCALED)


# ---- the functions' arguments ------------------------------------------------------------------

def _contiguous(owner: str, name: str, t: Optional[Tensor]) -> Optional[Tensor]:
    """t made contiguous (itself when it is); None stays None; ValueError for a non-tensor."""
    if t is None:
        return None
    if not isinstance(t, Tensor):
        raise ValueError(f"moex.{owner}: {name} must be a tensor, got {type(t).__name__}")
    return t.contiguous()


def _int_arg(owner: str, name: str, v) -> int:
    """v as an int; ValueError for anything else (floats and bools included)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ValueError(f"moex.{owner}: {name} must be an int, got {v!r}")
    return int(v)


def _rows(owner: str, name: str, t: Tensor) -> Tensor:
    """t [..., C] as the contiguous [T, C] of its rows (T: the product of the leading
    dimensions, as Transformer Engine flattens them); ValueError for a 0-D tensor."""
    if type(t) is Tensor and t.dim() == 2 and t.is_contiguous():   # already rows: no call's host time spent
        return t
    t = _contiguous(owner, name, t)
    if t is None or t.dim() == 0:
        raise ValueError(f"moex.{owner}: {name} must be a tensor [..., features], got "
                         f"{'None' if t is None else 'a 0-D tensor'}")
    return t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


def _check_sizes(owner: str, **sizes) -> None:
    """ValueError unless every size is an int >= 1 (a module's constructor arguments)."""
    for name, v in sizes.items():
        if _int_arg(owner, name, v) < 1:
            raise ValueError(f"moex.{owner}: {name} = {v}, must be >= 1")


def _row_probs(owner: str, probs: Optional[Tensor], inp: Tensor) -> Optional[Tensor]:
    """probs of the rows of inp [..., C]: shaped as inp's leading dimensions or flat [T];
    returned flat and contiguous."""
    if probs is None:
        return None
    probs = _contiguous(owner, "probs", probs)
    lead = inp.shape[:-1]
    if probs.dim() != 1 and probs.shape != lead:
        raise ValueError(f"moex.{owner}: probs is {tuple(probs.shape)}, must be [T] or the input's leading "
                         f"dimensions {tuple(lead)}")
    return probs.reshape(-1)
