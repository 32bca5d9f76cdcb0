"""moex.torch - moex for PyTorch: the grouped linear layer as torch.library custom operators
(CPU and CUDA implementations, fake kernels for shape inference, registered autograd), so that
torch.compile(fullgraph=True) traces them and a CUDA graph captures them; the functions gmm
and grouped_linear, and the module GroupedLinear.

Operators (namespace moex; the math: docs/ops.md section 2):
  grouped_linear_forward(x, w, splits, bias, probs, bias_mode) -> y
      y[r] = x[r] W_g^T (+ b_g | + p_r b_g)          x [T, K], w [G, N, K], y [T, N]
  grouped_linear_backward_data(dy, w, splits, bias, probs, bias_mode, need_dx, need_dbias,
                               need_dprobs) -> (dx [T, K], dbias [G, N] f32, dprobs [T] f32)
      (an output not needed comes back empty)
  grouped_linear_backward_weight(x, dy, splits, dw_dtype) -> dw [G, N, K]
  grouped_linear_backward_weight_accumulate(x, dy, splits, main_grad) -> None
      main_grad [G, N, K] f32 += dy_g^T x_g
splits is an int64 [G] tensor on the data's device (rows of group g follow those of g - 1);
rows at or past sum(splits) of y and dx are not written. CPU tensors run on moex's CPU backend,
CUDA tensors on its CUDA backend for the tensor's device, on torch's current stream, with
workspaces from torch's allocator; one moex context per device, created on first use. A moex
failure raises moex.MoexError carrying moex_last_error; a wrong device, dtype, layout or shape
raises ValueError before anything runs.
"""
from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from . import _capi
from ._capi import BIAS_ADD, BIAS_NONE, BIAS_SCALED, GRAD_ACCUMULATE, GRAD_WRITE, MoexError

__all__ = ["GroupedLinear", "gmm", "grouped_linear", "MoexError"]

_DTYPES = {torch.float32: _capi.DTYPE_F32, torch.bfloat16: _capi.DTYPE_BF16, torch.float16: _capi.DTYPE_F16,
           torch.int32: _capi.DTYPE_I32, torch.int64: _capi.DTYPE_I64}
_TORCH_DTYPES = {v: k for k, v in _DTYPES.items()}
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


# ---- calling the C library -------------------------------------------------------------------

def _view(t: Optional[Tensor]) -> _capi.Tensor:
    """The moex_tensor of a contiguous tensor (absent for None or an empty placeholder)."""
    if t is None:
        return _capi.Tensor()
    return _capi.tensor(t.data_ptr(), _DTYPES[t.dtype], tuple(t.shape))


def _run(stem: str, args, device: torch.device) -> None:
    """Runs moex_<stem> on the backend of `device`, on torch's current stream."""
    if device.type == "cpu":
        ctx, stream = _capi.context(_capi.BACKEND_CPU, 0), None
    elif device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        ctx, stream = _capi.context(_capi.BACKEND_CUDA, index), torch.cuda.current_stream(index).cuda_stream
    else:
        raise ValueError(f"moex: tensors on {device.type} are not supported (CPU or CUDA)")

    def alloc(nbytes):
        buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return buf.data_ptr(), buf

    _capi.run(ctx, stem, args, alloc, stream)


def _check(op: str, name: str, t: Optional[Tensor], device: torch.device, dtypes, ndim: int,
           optional: bool = False) -> None:
    """ValueError unless t is a contiguous tensor of `ndim` dims, one of `dtypes`, on `device`."""
    if t is None:
        if optional:
            return
        raise ValueError(f"moex.{op}: {name} is required")
    if t.device != device:
        raise ValueError(f"moex.{op}: {name} is on {t.device}, the other tensors on {device}")
    if t.dtype not in dtypes:
        raise ValueError(f"moex.{op}: {name} is {t.dtype}, must be one of {', '.join(map(str, dtypes))}")
    if t.dim() != ndim:
        raise ValueError(f"moex.{op}: {name} must have {ndim} dimensions, has shape {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"moex.{op}: {name} must be contiguous (call .contiguous())")


def _check_group_inputs(op: str, rows: Tensor, rows_name: str, w: Tensor, splits: Tensor) -> None:
    _check(op, rows_name, rows, rows.device, _FLOATS, 2)
    _check(op, "w", w, rows.device, (rows.dtype,), 3)
    _check(op, "splits", splits, rows.device, (torch.int64,), 1)
    if splits.shape[0] != w.shape[0]:
        raise ValueError(f"moex.{op}: splits has {splits.shape[0]} groups, w {w.shape[0]}")


def _check_bias(op: str, bias_mode: int, bias: Optional[Tensor], probs: Optional[Tensor], rows: Tensor,
                w: Tensor) -> None:
    if bias_mode not in (BIAS_NONE, BIAS_ADD, BIAS_SCALED):
        raise ValueError(f"moex.{op}: unknown bias_mode {bias_mode}")
    _check(op, "bias", bias, rows.device, (rows.dtype, torch.float32), 2, optional=bias_mode == BIAS_NONE)
    _check(op, "probs", probs, rows.device, (torch.float32,), 1, optional=bias_mode != BIAS_SCALED)


# ---- the operators ----------------------------------------------------------------------------

@torch.library.custom_op("moex::grouped_linear_forward", mutates_args=())
def _forward(x: Tensor, w: Tensor, splits: Tensor, bias: Optional[Tensor], probs: Optional[Tensor],
             bias_mode: int) -> Tensor:
    _check_group_inputs("grouped_linear_forward", x, "x", w, splits)
    _check_bias("grouped_linear_forward", bias_mode, bias, probs, x, w)
    y = x.new_empty(x.shape[0], w.shape[1])
    args = _capi.GroupedLinearArgs(x=_view(x), w=_capi.Weight(_view(w), None), bias_mode=bias_mode,
                                   bias=_view(bias if bias_mode != BIAS_NONE else None),
                                   probs=_view(probs if bias_mode == BIAS_SCALED else None), splits=_view(splits),
                                   y=_view(y))
    _run("grouped_linear_forward", args, x.device)
    return y


@_forward.register_fake
def _(x, w, splits, bias, probs, bias_mode):
    return x.new_empty(x.shape[0], w.shape[1])


@torch.library.custom_op("moex::grouped_linear_backward_data", mutates_args=())
def _backward_data(dy: Tensor, w: Tensor, splits: Tensor, bias: Optional[Tensor], probs: Optional[Tensor],
                   bias_mode: int, need_dx: bool, need_dbias: bool, need_dprobs: bool) -> Tuple[Tensor, Tensor, Tensor]:
    op = "grouped_linear_backward_data"
    _check_group_inputs(op, dy, "dy", w, splits)
    _check_bias(op, bias_mode, bias, probs, dy, w)
    dx, dbias, dprobs = _backward_data_outputs(dy, w, need_dx, need_dbias, need_dprobs)
    if need_dprobs:
        dprobs.zero_()   # moex accumulates the bias term into dprobs (+=)
    scaled = bias_mode == BIAS_SCALED
    args = _capi.GroupedLinearDgradArgs(
        dy=_view(dy), w=_capi.Weight(_view(w), None), bias_mode=bias_mode,
        bias=_view(bias if scaled and need_dprobs else None), probs=_view(probs if scaled else None),
        splits=_view(splits), dx=_view(dx if need_dx else None), dbias=_view(dbias if need_dbias else None),
        dprobs=_view(dprobs if need_dprobs else None))
    _run("grouped_linear_backward_data", args, dy.device)
    return dx, dbias, dprobs


def _backward_data_outputs(dy, w, need_dx, need_dbias, need_dprobs):
    """dx [T, K], dbias [G, N] f32, dprobs [T] f32, each with 0 rows when not needed."""
    T, N = dy.shape
    G, _, K = w.shape
    f32 = torch.float32
    return (dy.new_empty(T if need_dx else 0, K), dy.new_empty(G if need_dbias else 0, N, dtype=f32),
            dy.new_empty(T if need_dprobs else 0, dtype=f32))


@_backward_data.register_fake
def _(dy, w, splits, bias, probs, bias_mode, need_dx, need_dbias, need_dprobs):
    return _backward_data_outputs(dy, w, need_dx, need_dbias, need_dprobs)


def _check_wgrad(op: str, x: Tensor, dy: Tensor, splits: Tensor) -> None:
    _check(op, "x", x, x.device, _FLOATS, 2)
    _check(op, "dy", dy, x.device, (x.dtype,), 2)
    _check(op, "splits", splits, x.device, (torch.int64,), 1)
    if dy.shape[0] != x.shape[0]:
        raise ValueError(f"moex.{op}: x has {x.shape[0]} rows, dy {dy.shape[0]}")


def _wgrad_args(x, dy, splits, mode, dw):
    return _capi.GroupedLinearWgradArgs(x=_view(x), dy=_view(dy), splits=_view(splits), dw_mode=mode,
                                        dw=_capi.Weight(_view(dw), None))


@torch.library.custom_op("moex::grouped_linear_backward_weight", mutates_args=())
def _backward_weight(x: Tensor, dy: Tensor, splits: Tensor, dw_dtype: int) -> Tensor:
    _check_wgrad("grouped_linear_backward_weight", x, dy, splits)
    dw = x.new_empty(splits.shape[0], dy.shape[1], x.shape[1], dtype=_TORCH_DTYPES[dw_dtype])
    _run("grouped_linear_backward_weight", _wgrad_args(x, dy, splits, GRAD_WRITE, dw), x.device)
    return dw


@_backward_weight.register_fake
def _(x, dy, splits, dw_dtype):
    return x.new_empty(splits.shape[0], dy.shape[1], x.shape[1], dtype=_TORCH_DTYPES[dw_dtype])


@torch.library.custom_op("moex::grouped_linear_backward_weight_accumulate", mutates_args=("main_grad",))
def _backward_weight_accumulate(x: Tensor, dy: Tensor, splits: Tensor, main_grad: Tensor) -> None:
    op = "grouped_linear_backward_weight_accumulate"
    _check_wgrad(op, x, dy, splits)
    _check(op, "main_grad", main_grad, x.device, (torch.float32,), 3)
    _run("grouped_linear_backward_weight", _wgrad_args(x, dy, splits, GRAD_ACCUMULATE, main_grad), x.device)


@_backward_weight_accumulate.register_fake
def _(x, dy, splits, main_grad):
    return None


def _forward_setup(ctx, inputs, output):
    x, w, splits, bias, probs, bias_mode = inputs
    ctx.save_for_backward(x, w, splits, bias, probs)
    ctx.bias_mode = bias_mode


def _forward_backward(ctx, dy):
    x, w, splits, bias, probs = ctx.saved_tensors
    need_x, need_w, _, need_bias, need_probs, _ = ctx.needs_input_grad
    dy = dy.contiguous()
    dx = dw = dbias = dprobs = None
    need_dbias = need_bias and ctx.bias_mode != BIAS_NONE
    need_dprobs = need_probs and ctx.bias_mode == BIAS_SCALED
    if need_x or need_dbias or need_dprobs:
        dx, dbias, dprobs = _backward_data(dy, w, splits, bias, probs, ctx.bias_mode, need_x, need_dbias,
                                           need_dprobs)
        dx = dx if need_x else None
        dbias = dbias.to(bias.dtype) if need_dbias else None
        dprobs = dprobs if need_dprobs else None
    if need_w:
        dw = _backward_weight(x, dy, splits, _DTYPES[w.dtype])
    return dx, dw, None, dbias, dprobs, None


_forward.register_autograd(_forward_backward, setup_context=_forward_setup)


# ---- functions --------------------------------------------------------------------------------

Splits = Union[Sequence[int], Tensor]


def _splits_tensor(splits: Splits, device: torch.device) -> Tensor:
    """int64 [G] on `device`: a list is copied there; a tensor on the device is used as it is
    (graph-safe), one elsewhere is copied."""
    if isinstance(splits, Tensor):
        if splits.dtype != torch.int64:
            raise ValueError(f"moex: splits must be int64, got {splits.dtype}")
        return splits if splits.device == device else splits.to(device)
    return torch.tensor(list(splits), dtype=torch.int64, device=device)


def grouped_linear(x: Tensor, w: Tensor, splits: Splits, bias: Optional[Tensor] = None,
                   probs: Optional[Tensor] = None) -> Tensor:
    """y[r] = x[r] W_g^T (+ b_g, or + p_r b_g when probs is given) for the rows r of group g.

    x [T, K], w [G, N, K], splits [G] (list or int64 tensor), bias [G, N], probs [T] f32.
    Differentiable in x, w, bias and probs."""
    if probs is not None and bias is None:
        raise ValueError("moex.grouped_linear: probs scales the bias, but bias is None")
    mode = BIAS_NONE if bias is None else (BIAS_SCALED if probs is not None else BIAS_ADD)
    return _forward(x.contiguous(), w.contiguous(), _splits_tensor(splits, x.device), bias, probs, mode)


def gmm(a: Tensor, b: Tensor, batch_sizes: Splits, trans_b: bool = False) -> Tensor:
    """grouped_gemm.ops.gmm: for the rows of group g, a_g [m_g, K] @ b_g, where b is [G, K, N]
    (or [G, N, K] with trans_b) and batch_sizes [G] the rows per group, on the host or the
    device. Differentiable in a and b."""
    w = b if trans_b else b.transpose(1, 2)
    return grouped_linear(a, w, batch_sizes)


# ---- modules ----------------------------------------------------------------------------------

class GroupedLinear(torch.nn.Module):
    """G linear layers over the rows of G groups, a drop-in for
    transformer_engine.pytorch.GroupedLinear: the same constructor arguments where they apply,
    parameters weight0..weight{G-1} ([out_features, in_features]) and bias0.. ([out_features]),
    and forward(inp, m_splits) with m_splits a list of ints or an int64 tensor on the input's
    device (then graph-safe).

    moex additions: packed=True keeps one parameter `weight` [G, out, in] (and `bias` [G, out])
    instead of G of each; forward(inp, m_splits, probs=p) scales the bias by the per-row p
    (scale_bias, differentiable in p)."""

    def __init__(self, num_gemms: int, in_features: int, out_features: int, bias: bool = True,
                 params_dtype: Optional[torch.dtype] = None, device: Union[torch.device, str, None] = None,
                 init_method=None, fuse_wgrad_accumulation: bool = False, delay_wgrad_compute: bool = False,
                 packed: bool = False):
        super().__init__()
        if fuse_wgrad_accumulation or delay_wgrad_compute:
            raise NotImplementedError("moex.torch.GroupedLinear: fuse_wgrad_accumulation and delay_wgrad_compute "
                                      "are not implemented yet")
        if num_gemms < 1 or in_features < 1 or out_features < 1:
            raise ValueError("moex.torch.GroupedLinear: num_gemms, in_features and out_features must be >= 1")
        self.num_gemms, self.in_features, self.out_features = num_gemms, in_features, out_features
        self.use_bias, self.packed = bias, packed
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
            for g in range(num_gemms):
                w = torch.nn.Parameter(torch.empty(*shape, dtype=dtype, device=device))
                init(w.data)
                setattr(self, f"weight{g}", w)
                if bias:
                    setattr(self, f"bias{g}", torch.nn.Parameter(torch.zeros(out_features, dtype=dtype,
                                                                             device=device)))

    def _weights(self) -> Tuple[Tensor, Optional[Tensor]]:
        """The [G, out, in] weight and the [G, out] bias (None without bias)."""
        if self.packed:
            return self.weight, self.bias if self.use_bias else None
        G = self.num_gemms
        w = torch.stack([getattr(self, f"weight{g}") for g in range(G)])
        b = torch.stack([getattr(self, f"bias{g}") for g in range(G)]) if self.use_bias else None
        return w, b

    def forward(self, inp: Tensor, m_splits: Splits, probs: Optional[Tensor] = None) -> Tensor:
        w, b = self._weights()
        if probs is not None and b is None:
            raise ValueError("moex.torch.GroupedLinear: probs scales the bias, but the layer has none")
        return grouped_linear(inp, w, m_splits, b, probs)

    def extra_repr(self) -> str:
        return (f"num_gemms={self.num_gemms}, in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.use_bias}, packed={self.packed}")
