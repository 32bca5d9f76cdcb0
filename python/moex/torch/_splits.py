"""moex.torch._splits - splits, the rows per group: the type the functions and modules take
(Splits: a sequence of ints or an int64 / int32 tensor), its conversion to the operators'
int64 [G] tensor (_splits_tensor), and the operator moex::splits_to_offsets with its function
splits_to_offsets.
"""
import numbers
from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from .. import _capi
from ._checks import _check, _int_arg
from ._operators import _DTYPES, _TORCH_DTYPES, _operator, _run, _view


Splits = Union[Sequence[int], Tensor]


def _splits_tensor(splits: Splits, device: torch.device, owner: str = "torch", rows: Optional[int] = None) -> Tensor:
    """The operators' splits, a contiguous int64 [G] tensor on `device`, from a 1-D int64 or
    int32 tensor (torch._grouped_mm's offs are int32) or a sequence of ints. An int64 tensor on
    the device is used as it is, an int32 one is converted there (a kernel, no host sync:
    graph-safe), one on another device is copied. A sequence is checked on the host: ints only
    (no floats, no bools), none negative, the sum at most `rows` when given; a tensor's values
    are checked by moex (MoexError on the CPU, the device flag on CUDA)."""
    if isinstance(splits, Tensor):
        if splits.dtype == torch.int64 and splits.dim() == 1 and splits.device == device and splits.is_contiguous():
            return splits   # the common case, without .to()'s host time
        if splits.dtype not in (torch.int64, torch.int32) or splits.dim() != 1:
            raise ValueError(f"moex.{owner}: splits must be a 1-D int64 or int32 tensor, got {splits.dtype} "
                             f"{tuple(splits.shape)}")
        return splits.to(device=device, dtype=torch.int64).contiguous()
    try:
        values = list(splits)
    except TypeError:
        raise ValueError(f"moex.{owner}: splits must be a tensor or a sequence of ints, got "
                         f"{type(splits).__name__}") from None
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise ValueError(f"moex.{owner}: splits must be ints, got {v!r} in {values}")
        if v < 0:
            raise ValueError(f"moex.{owner}: splits must be >= 0, got {values}")
    if rows is not None and sum(values) > rows:
        raise ValueError(f"moex.{owner}: splits {values} sum to {sum(values)}, more than the {rows} rows")
    return torch.tensor(values, dtype=torch.int64, device=device)


# ---- splits_to_offsets -------------------------------------------------------------------------

@_operator("splits_to_offsets", mutates_args=())
def _splits_to_offsets(splits: Tensor, stride: int, leading_zero: bool, dtype_code: int) -> Tensor:
    _check("splits_to_offsets", "splits", splits, splits.device, (torch.int64,), 1)
    if _TORCH_DTYPES.get(dtype_code) not in (torch.int64, torch.int32):
        raise ValueError(f"moex.splits_to_offsets: dtype_code {dtype_code} is not int64's or int32's")
    out = splits.new_empty(splits.shape[0] + int(leading_zero), dtype=_TORCH_DTYPES[dtype_code])
    args = _capi.SplitsToOffsetsArgs(splits=_view(splits), num_outputs=1)
    args.outputs[0] = _capi.OffsetsOutput(_view(out), stride,
                                          _capi.OFFSETS_LEADING_ZERO if leading_zero else _capi.OFFSETS_INCLUSIVE)
    _run("splits_to_offsets", args, splits.device)
    return out


@_splits_to_offsets.register_fake
def _(splits, stride, leading_zero, dtype_code):
    return splits.new_empty(splits.shape[0] + int(leading_zero), dtype=_TORCH_DTYPES[dtype_code])


def splits_to_offsets(splits: Tensor, stride: int = 1, leading_zero: bool = True,
                      dtype: torch.dtype = torch.int64) -> Tensor:
    """stride * the running sums of splits [G] (docs/ops.md section 1): [0, s0, s0+s1, ...] (G+1
    values) or, without leading_zero, the G inclusive sums; int64 or int32."""
    if dtype not in (torch.int64, torch.int32):
        raise ValueError(f"moex.splits_to_offsets: dtype must be torch.int64 or torch.int32, got {dtype}")
    if not isinstance(splits, Tensor):
        raise ValueError(f"moex.splits_to_offsets: splits must be a tensor, got {type(splits).__name__}")
    return _splits_to_offsets(_splits_tensor(splits, splits.device, "splits_to_offsets"),
                              _int_arg("splits_to_offsets", "stride", stride), bool(leading_zero), _DTYPES[dtype])
