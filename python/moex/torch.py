"""moex.torch - moex for PyTorch: the grouped linear layer as torch.library custom operators
(CPU and CUDA implementations, fake kernels for shape inference, registered autograd), so that
torch.compile(fullgraph=True) traces them and a CUDA graph captures them; the grouped MLP
and the MoE layer likewise; the functions gmm, grouped_linear and grouped_mlp, and the modules
GroupedLinear, GroupedMLP and MoELayer.

Operators (namespace moex; the math: docs/ops.md section 2):
  grouped_linear_forward(x, w, splits, bias, probs, bias_mode, fp8...) -> y
      y[r] = x[r] W_g^T (+ b_g | + p_r b_g)          x [T, K], w [G, N, K], y [T, N]
  grouped_linear_backward_data(dy, w, splits, bias, probs, bias_mode, need_dx, need_dbias,
                               need_dprobs, fp8...) -> (dx [T, K], dbias [G, N] (bias's dtype), dprobs [T] f32)
      (an output not needed comes back empty)
  grouped_linear_backward_weight(x, dy, splits, dw_dtype, fp8...) -> dw [G, N, K]
  grouped_linear_backward_weight_accumulate(x, dy, splits, main_grad, fp8...) -> None
      main_grad [G, N, K] f32 += dy_g^T x_g
  grouped_mlp_forward(x, w1, b1, w2, b2, probs, splits, b2_mode, glu..., save_z, fp8...) -> (y, h, z)
  grouped_mlp_backward(x, w1, b1, w2, b2, probs, splits, h, z, dy, b2_mode, glu..., needs, fp8...)
      -> [dx, dw1, dw2, db1, db2, dprobs] (docs/ops.md section 4; db1, db2 in b1's, b2's dtype;
      h is overwritten)
  moe_layer_forward(x, router_w, w1, b1, w2, b2, topk, score, norm, b2_mode, glu..., fp8...) -> (y, saved)
  moe_layer_backward(x, router_w, w1, b1, w2, b2, saved, dy, topk, ..., needs, fp8...) -> [dx, drouter_w, ...]
fp8... are the FP8 training recipe (experimental; docs/ops.md 9.11), the fields of
moex_fp8_recipe: fp8_mode: int = 0 (0 off, 1 BLOCK, 2 CURRENT, 3 MXFP8), fp8_dtypes: int = 0
(0 E4M3, 1 HYBRID: E5M2 gradients), fp8_pow2_scales: bool = False, fp8_amax_epsilon: float =
0.0; the defaults are off, the plain path. With a recipe, every GEMM of the call runs on FP8
operands, quantized inside the call; inputs, outputs and their dtypes are the plain call's.
The modules and functions take it as fp8_recipe="block" | "current" | "mxfp8" and
fp8_format="e4m3" | "hybrid".
splits is an int64 [G] tensor on the data's device (rows of group g follow those of g - 1);
the rows at or past sum(splits) of every row-indexed output (y, dx, dh, z with splits, dprobs)
are zero (moex_zero_tail, graph-safe). CPU tensors run on moex's CPU backend,
CUDA tensors on its CUDA backend for the tensor's device, on torch's current stream, with
workspaces from torch's allocator; one moex context per device, created on first use. A moex
failure raises moex.MoexError carrying moex_last_error; a wrong device, dtype, layout or shape,
a non-contiguous tensor, or an argument its mode would ignore (a bias with bias_mode NONE,
probs without SCALED) raises ValueError naming it before anything runs. The operators are
differentiable once: a gradient of their gradients (create_graph=True) raises.
moex::module_weight_grads(xs, dys, splits, module, ...) -> None is the modules' weight
gradients with fuse_wgrad_accumulation / delay_wgrad_compute (an opaque side effect).
Where `pip install ./python` built the compiled extension (moex._torch_ext, python/csrc), the
operators it defines (all but module_weight_grads, plus grouped_linear_discrete_forward /
_backward_data for GroupedLinear's separate weights) are its C++ ones, kernels and autograd
alike (_CppOperator), and the Python implementations below are not registered.

The functions and modules take what the operators take and more: inputs [..., features] (the
leading dimensions are the rows, as Transformer Engine flattens them; outputs [..., out]),
non-contiguous tensors (made contiguous), splits as a list of ints (checked on the host: no
floats or bools, none negative, the sum at most the rows) or an int64 or int32 tensor (an int32
one converted on its device, without a host sync).
"""
import functools
import itertools
import math
import numbers
import weakref
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.fx.node
import torch.nn.functional as F
from torch import Tensor

from . import _capi, _torch_ext
from ._capi import BIAS_ADD, BIAS_NONE, BIAS_SCALED, GRAD_ACCUMULATE, GRAD_WRITE, MoexError

__all__ = ["GroupedLinear", "GroupedMLP", "MoELayer", "gmm", "grouped_linear", "grouped_mlp", "router", "permute",
           "unpermute", "scaled_glu", "splits_to_offsets", "MoexError"]

_DTYPES = {torch.float32: _capi.DTYPE_F32, torch.bfloat16: _capi.DTYPE_BF16, torch.float16: _capi.DTYPE_F16,
           torch.int32: _capi.DTYPE_I32, torch.int64: _capi.DTYPE_I64}
_DTYPES.update({getattr(torch, name): code for name, code in (("float8_e4m3fn", _capi.DTYPE_E4M3),
                                                             ("float8_e5m2", _capi.DTYPE_E5M2),
                                                             ("float8_e8m0fnu", _capi.DTYPE_E8M0))
                if hasattr(torch, name)})
_TORCH_DTYPES = {v: k for k, v in _DTYPES.items()}
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)

# ---- the FP8 training recipe (experimental; docs/ops.md 9.11) ---------------------------------

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


# ---- calling the C library -------------------------------------------------------------------

def _fill(dst: _capi.Tensor, t: Tensor, data: Optional[int] = None) -> None:
    """Makes dst a view of the contiguous tensor t (at address `data` when given)."""
    shape = t.shape
    dst.data = t.data_ptr() if data is None else data
    dst.dtype = _DTYPES[t.dtype]
    dst.ndim = len(shape)
    dst.shape[:len(shape)] = shape


def _view(t: Optional[Tensor]) -> _capi.Tensor:
    """The moex_tensor of a contiguous tensor (absent for None)."""
    v = _capi.Tensor()
    if t is not None:
        _fill(v, t)
    return v


def _args(struct_t, **fields):
    """An argument struct of type struct_t: a tensor field views the tensor given (a weight
    field, its packed tensor), None leaves a field absent, other values are set as they are.
    (Filling the fields in place costs less host time than building nested ctypes values.)"""
    a = struct_t()
    for name, value in fields.items():
        if value is None:
            continue
        if isinstance(value, Tensor):
            dst = getattr(a, name)
            _fill(dst.t if type(dst) is _capi.Weight else dst, value)
        else:
            setattr(a, name, value)
    return a


def _current_stream(index: int) -> int:
    """The handle of torch's current CUDA stream on device `index` (the raw query: it skips
    building a torch.cuda.Stream, which costs more host time than a moex call's launch)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream


def _run(stem: str, args, device: torch.device) -> None:
    """Runs moex_<stem> on the backend of `device`, on torch's current stream."""
    if device.type == "cpu":
        ctx, stream = _capi.context(_capi.BACKEND_CPU, 0), None
    elif device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        ctx, stream = _capi.context(_capi.BACKEND_CUDA, index), _current_stream(index)
    else:
        raise ValueError(f"moex: tensors on {device.type} are not supported (CPU or CUDA)")

    def alloc(nbytes):
        buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return buf.data_ptr(), buf

    _capi.run(ctx, stem, args, alloc, stream)


def _zero_tail(t: Tensor, splits: Tensor) -> Tensor:
    """t (rows [T, ...], contiguous) with its rows at and past sum(splits) set to zero, in place
    (moex_zero_tail: on the device, graph-safe, at the cost of those rows only); returns t. Every
    row-indexed output of an operator with splits goes through it, so no uninitialised row
    reaches autograd (a layer before moex would get it in its gradient)."""
    if t.numel():
        _run("zero_tail", _args(_capi.ZeroTailArgs, x=t, splits=splits), t.device)
    return t


_DOUBLE_BACKWARD = (b"moex: trying to differentiate twice: moex's backward is not differentiable "
                    b"(double backward, create_graph=True, is not supported)")


def _once_differentiable(backward):
    """backward(ctx, *grads), made to refuse double backward as torch's once_differentiable does,
    and also where the incoming gradients do not require grad (moex's gradients are not
    differentiable in the saved inputs either: a gradient penalty through them would miss its
    terms silently). Under create_graph=True every floating-point tensor it returns is marked so
    that differentiating it raises; otherwise the gradients are returned as they are."""

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        with torch.no_grad():
            out = backward(ctx, *grads)
        if not torch.is_grad_enabled():
            return out
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        idx = [i for i, t in enumerate(outs) if isinstance(t, Tensor) and t.is_floating_point()]
        if not idx:
            return out
        marked = torch._C._functions.DelayedError(_DOUBLE_BACKWARD, len(idx))(
            *[outs[i].detach().requires_grad_() for i in idx])
        for i, t in zip(idx, marked if isinstance(marked, tuple) else (marked,)):
            outs[i] = t
        return tuple(outs) if isinstance(out, (tuple, list)) else outs[0]

    return wrapper


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


# ---- operators ----------------------------------------------------------------------------------

_PLAIN = frozenset((Tensor, torch.nn.Parameter))


def _eager(args) -> bool:
    """True when a call can run the implementation directly: eager code (not torch.compile's
    tracing, no dispatch or function mode such as FakeTensor, no functorch transform) on plain
    tensors."""
    if (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() or
            torch._C._is_torch_function_mode_enabled() or torch._C._are_functorch_transforms_active()):
        return False
    for a in args:   # (a loop: a generator costs a microsecond here)
        if type(a) not in _PLAIN and isinstance(a, Tensor):
            return False
    return True


class _Operator:
    """A moex operator: `impl`, a plain function that calls the C library, registered with
    torch.library as moex::<name> (the schema from its annotations, a fake kernel, autograd).

    Eager calls on plain tensors run impl directly, through a torch.autograd.Function when
    autograd records: the dispatcher's Python path costs several times the C call's host time
    (bench/torch_host_time.py). Under torch.compile, a dispatch or function mode, a functorch
    transform or with tensor subclasses the call goes through the registered operator, which
    is what tracing sees. Both paths run the same impl, setup_context and backward."""

    def __init__(self, name: str, impl, mutates_args):
        self.impl = impl
        self.op = torch.library.custom_op(f"moex::{name}", impl, mutates_args=mutates_args)
        self.function = None
        # the trailing defaults (the fp8 recipe): the eager path passes them explicitly, so that
        # setup_context and backward see every input, as the operator's autograd does
        self.num_params = impl.__code__.co_argcount
        self.defaults = impl.__defaults__ or ()

    def register_fake(self, fake):
        return self.op.register_fake(fake)

    def register_autograd(self, backward, setup_context) -> None:
        backward = _once_differentiable(backward)   # both paths: no silent double backward
        self.op.register_autograd(backward, setup_context=setup_context)
        impl = self.impl

        class Function(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *args):
                output = impl(*args)
                setup_context(ctx, args, output)
                return output

            @staticmethod
            def backward(ctx, *grads):
                return backward(ctx, *grads)

        self.function = Function

    def __call__(self, *args):
        if not _eager(args):
            return self.op(*args)
        if len(args) < self.num_params:
            args = args + self.defaults[len(self.defaults) - (self.num_params - len(args)):]
        if self.function is not None and torch.is_grad_enabled() and any(
                isinstance(a, Tensor) and a.requires_grad for a in args):
            return self.function.apply(*args)
        return self.impl(*args)


class _CppOperator:
    """A moex operator of the compiled extension (moex._torch_ext, python/csrc): schema, CPU and
    CUDA kernels and autograd in C++; only the fake kernel is Python. A call goes straight to
    the C++ operator (torch.ops.moex.<name>.default), which is also what tracing sees; `impl`
    is the Python implementation the operator replaces (the path without the extension)."""

    def __init__(self, name: str, impl):
        self.name, self.impl = name, impl
        self.op = getattr(torch.ops.moex, name).default

    def register_fake(self, fake):
        return torch.library.register_fake(f"moex::{self.name}")(fake)

    def register_autograd(self, backward, setup_context) -> None:
        """Nothing to do: the operator's autograd is C++ (python/csrc/autograd.cpp)."""

    def __call__(self, *args):
        return self.op(*args)


def _operator(name: str, mutates_args):
    """The operator moex::<name> of the Python implementation `impl`: the compiled extension's
    when it defines it (_CppOperator), else impl registered with torch.library (_Operator)."""
    if name in _torch_ext.OPS:
        return lambda impl: _CppOperator(name, impl)
    return lambda impl: _Operator(name, impl, mutates_args)


# ---- the grouped linear operators ----------------------------------------------------------------

@_operator("grouped_linear_forward", mutates_args=())
def _forward(x: Tensor, w: Tensor, splits: Tensor, bias: Optional[Tensor], probs: Optional[Tensor],
             bias_mode: int, fp8_mode: int = 0, fp8_dtypes: int = 0, fp8_pow2_scales: bool = False, fp8_amax_epsilon: float = 0.0) -> Tensor:
    _check_group_inputs("grouped_linear_forward", x, "x", w, splits)
    _check_bias("grouped_linear_forward", bias_mode, bias, probs, x, w)
    y = x.new_empty(x.shape[0], w.shape[1])
    args = _args(_capi.GroupedLinearArgs, x=x, w=w, bias_mode=bias_mode, bias=bias if bias_mode != BIAS_NONE else None,
                 probs=probs if bias_mode == BIAS_SCALED else None, splits=splits, y=y,
                 fp8=_fp8_recipe(fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon))
    _run("grouped_linear_forward", args, x.device)
    return _zero_tail(y, splits)


@_forward.register_fake
def _(x, w, splits, bias, probs, bias_mode, *fp8):
    return x.new_empty(x.shape[0], w.shape[1])


@_operator("grouped_linear_backward_data", mutates_args=())
def _backward_data(dy: Tensor, w: Tensor, splits: Tensor, bias: Optional[Tensor], probs: Optional[Tensor],
                   bias_mode: int, need_dx: bool, need_dbias: bool, need_dprobs: bool,
                   fp8_mode: int = 0, fp8_dtypes: int = 0, fp8_pow2_scales: bool = False, fp8_amax_epsilon: float = 0.0) -> Tuple[Tensor, Tensor, Tensor]:
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
                 fp8=_fp8_recipe(fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon))
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
def _backward_weight(x: Tensor, dy: Tensor, splits: Tensor, dw_dtype: int, fp8_mode: int = 0, fp8_dtypes: int = 0, fp8_pow2_scales: bool = False, fp8_amax_epsilon: float = 0.0) -> Tensor:
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
                                fp8_mode: int = 0, fp8_dtypes: int = 0, fp8_pow2_scales: bool = False, fp8_amax_epsilon: float = 0.0) -> None:
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
    return (dx, dw, None, dbias, dprobs, None) + (None,) * len(_FP8_OFF)


_forward.register_autograd(_forward_backward, setup_context=_forward_setup)


# ---- the grouped MLP --------------------------------------------------------------------------

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
                 save_z: bool, fp8_mode: int = 0, fp8_dtypes: int = 0, fp8_pow2_scales: bool = False, fp8_amax_epsilon: float = 0.0) -> Tuple[Tensor, Tensor, Tensor]:
    _check_mlp("grouped_mlp_forward", x, w1, w2, splits, probs, b1, b2, b2_mode)
    y, h, z = _mlp_forward_outputs(x, w1, save_z)
    args = _args(_capi.GroupedMlpArgs, x=x, w1=w1, b1=b1, w2=w2, b2_mode=b2_mode,
                 b2=b2 if b2_mode != BIAS_NONE else None, probs=probs,
                 glu=_glu(glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset), splits=splits, h=h,
                 z=z if save_z else None, y=y,
                 fp8=_fp8_recipe(fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon))
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
                  fp8_mode: int = 0, fp8_dtypes: int = 0, fp8_pow2_scales: bool = False, fp8_amax_epsilon: float = 0.0) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
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
                 fp8=_fp8_recipe(fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon))
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
        return (None,) * (14 + len(_FP8_OFF))
    x, w1, b1, w2, b2, probs, splits, h, z = ctx.saved_tensors
    n = ctx.needs_input_grad
    needs = [n[0], n[1], n[3], n[2] and b1 is not None, n[4] and ctx.b2_mode != BIAS_NONE, n[5] and probs is not None]
    outs = _mlp_backward(x, w1, b1, w2, b2, probs, splits, h, z, dy.contiguous(), ctx.b2_mode, *ctx.glu, needs,
                         *ctx.fp8)
    dx, dw1, dw2, db1, db2, dprobs = (o if k else None for o, k in zip(outs, needs))
    return (dx, dw1, db1, dw2, db2, dprobs) + (None,) * (8 + len(_FP8_OFF))


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


# ---- the scaled GLU and splits_to_offsets --------------------------------------------------------

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


_SCORES = {"softmax": 0, "sigmoid": 1}


# ---- routing ------------------------------------------------------------------------------------

@_operator("router_forward", mutates_args=())
def _router_forward(logits: Tensor, topk: int, score: int, norm: int) -> Tuple[Tensor, Tensor]:
    _check_router("router_forward", logits, topk, score, norm)
    probs, ids = _router_outputs(logits, topk)
    args = _args(_capi.RouterArgs, logits=logits, topk=topk, score=score, norm=norm, probs=probs, ids=ids)
    _run("router_forward", args, logits.device)
    return probs, ids


def _check_router(op: str, logits: Tensor, topk: int, score: int, norm: int) -> None:
    _check(op, "logits", logits, logits.device, (torch.float32, torch.bfloat16), 2)
    if not 1 <= topk <= logits.shape[1]:
        raise ValueError(f"moex.{op}: topk = {topk}, must be 1..{logits.shape[1]} (the experts, logits' columns)")
    if score not in _SCORES.values() or norm not in (0, 1):
        raise ValueError(f"moex.{op}: score {score} must be one of {list(_SCORES.values())}, norm {norm} 0 or 1")


def _check_k(op: str, k: int, rows: int, rows_name: str) -> None:
    """ValueError unless k >= 1 divides the rows (T*k permuted rows)."""
    if k < 1 or rows % k:
        raise ValueError(f"moex.{op}: k = {k} must be >= 1 and divide the {rows} rows of {rows_name}")


def _router_outputs(logits, topk):
    T = logits.shape[0]
    return logits.new_empty(T, topk, dtype=torch.float32), logits.new_empty(T, topk, dtype=torch.int32)


@_router_forward.register_fake
def _(logits, topk, score, norm):
    return _router_outputs(logits, topk)


@_operator("router_backward", mutates_args=())
def _router_backward(logits: Tensor, ids: Tensor, dprobs: Tensor, topk: int, score: int, norm: int) -> Tensor:
    _check_router("router_backward", logits, topk, score, norm)
    _check("router_backward", "ids", ids, logits.device, (torch.int32,), 2)
    _check("router_backward", "dprobs", dprobs, logits.device, (torch.float32,), 2)
    dlogits = torch.empty_like(logits)
    args = _args(_capi.RouterGradArgs, logits=logits, topk=topk, score=score, norm=norm, ids=ids, dprobs=dprobs,
                 dlogits=dlogits)
    _run("router_backward", args, logits.device)
    return dlogits


@_router_backward.register_fake
def _(logits, ids, dprobs, topk, score, norm):
    return torch.empty_like(logits)


def _router_setup(ctx, inputs, output):
    logits, topk, score, norm = inputs
    ctx.save_for_backward(logits, output[1])
    ctx.options = (topk, score, norm)


def _router_grads(ctx, dprobs, dids_unused):
    logits, ids = ctx.saved_tensors
    return _router_backward(logits, ids, dprobs.contiguous(), *ctx.options), None, None, None


_router_forward.register_autograd(_router_grads, setup_context=_router_setup)


@_operator("permute_forward", mutates_args=())
def _permute_forward(x: Tensor, ids: Tensor, probs: Tensor,
                     num_experts: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    _check("permute_forward", "x", x, x.device, _FLOATS, 2)
    _check("permute_forward", "ids", ids, x.device, (torch.int32,), 2)
    _check("permute_forward", "probs", probs, x.device, (torch.float32,), 2)
    if num_experts < 1:
        raise ValueError(f"moex.permute_forward: num_experts = {num_experts}, must be >= 1")
    if ids.shape[0] != x.shape[0] or probs.shape != ids.shape:
        raise ValueError(f"moex.permute_forward: x {tuple(x.shape)}, ids {tuple(ids.shape)} and probs "
                         f"{tuple(probs.shape)} must be [T, H], [T, k], [T, k]")
    xp, probs_p, splits, row_map = _permute_outputs(x, ids, num_experts)
    args = _args(_capi.PermuteArgs, x=x, ids=ids, probs=probs, num_experts=num_experts, xp=xp, probs_p=probs_p,
                 splits=splits, row_map=row_map)
    _run("permute_forward", args, x.device)
    return xp, probs_p, splits, row_map


def _permute_outputs(x, ids, num_experts):
    rows = ids.shape[0] * ids.shape[1]
    return (x.new_empty(rows, x.shape[1]), x.new_empty(rows, dtype=torch.float32),
            x.new_empty(num_experts, dtype=torch.int64), x.new_empty(rows, dtype=torch.int32))


@_permute_forward.register_fake
def _(x, ids, probs, num_experts):
    return _permute_outputs(x, ids, num_experts)


@_operator("permute_backward", mutates_args=())
def _permute_backward(row_map: Tensor, dxp: Tensor, dprobs_p: Tensor, k: int) -> Tuple[Tensor, Tensor]:
    op = "permute_backward"
    _check(op, "dxp", dxp, dxp.device, _FLOATS, 2)
    _check(op, "row_map", row_map, dxp.device, (torch.int32,), 1)
    _check(op, "dprobs_p", dprobs_p, dxp.device, (torch.float32,), 1)
    _check_k(op, k, dxp.shape[0], "dxp")
    dx, dprobs = _permute_grads_outputs(dxp, k)
    args = _args(_capi.PermuteGradArgs, row_map=row_map, dxp=dxp, dprobs_p=dprobs_p, dx=dx, dprobs=dprobs)
    _run("permute_backward", args, dxp.device)
    return dx, dprobs


def _permute_grads_outputs(dxp, k):
    T = dxp.shape[0] // k
    return dxp.new_empty(T, dxp.shape[1]), dxp.new_empty(T, k, dtype=torch.float32)


@_permute_backward.register_fake
def _(row_map, dxp, dprobs_p, k):
    return _permute_grads_outputs(dxp, k)


def _permute_setup(ctx, inputs, output):
    ctx.save_for_backward(output[3])
    ctx.k = inputs[1].shape[1]


def _permute_grads(ctx, dxp, dprobs_p, dsplits_unused, drow_map_unused):
    (row_map,) = ctx.saved_tensors
    dx, dprobs = _permute_backward(row_map, dxp.contiguous(), dprobs_p.contiguous(), ctx.k)
    return dx, None, dprobs, None


_permute_forward.register_autograd(_permute_grads, setup_context=_permute_setup)


@_operator("unpermute_forward", mutates_args=())
def _unpermute_forward(yp: Tensor, row_map: Tensor, k: int) -> Tensor:
    _check("unpermute_forward", "yp", yp, yp.device, _FLOATS, 2)
    _check("unpermute_forward", "row_map", row_map, yp.device, (torch.int32,), 1)
    _check_k("unpermute_forward", k, yp.shape[0], "yp")
    y = yp.new_empty(yp.shape[0] // k, yp.shape[1])
    _run("unpermute_forward", _args(_capi.UnpermuteArgs, row_map=row_map, yp=yp, y=y), yp.device)
    return y


@_unpermute_forward.register_fake
def _(yp, row_map, k):
    return yp.new_empty(yp.shape[0] // k, yp.shape[1])


@_operator("unpermute_backward", mutates_args=())
def _unpermute_backward(dy: Tensor, row_map: Tensor) -> Tensor:
    _check("unpermute_backward", "dy", dy, dy.device, _FLOATS, 2)
    _check("unpermute_backward", "row_map", row_map, dy.device, (torch.int32,), 1)
    dyp = dy.new_empty(row_map.shape[0], dy.shape[1])
    _run("unpermute_backward", _args(_capi.UnpermuteGradArgs, row_map=row_map, dy=dy, dyp=dyp),
         dy.device)
    return dyp


@_unpermute_backward.register_fake
def _(dy, row_map):
    return dy.new_empty(row_map.shape[0], dy.shape[1])


def _unpermute_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[1])


def _unpermute_grads(ctx, dy):
    (row_map,) = ctx.saved_tensors
    return _unpermute_backward(dy.contiguous(), row_map), None, None


_unpermute_forward.register_autograd(_unpermute_grads, setup_context=_unpermute_setup)


def router(logits: Tensor, topk: int, score: str = "softmax", renorm: bool = True) -> Tuple[Tensor, Tensor]:
    """probs [T, k] f32 and ids [T, k] int32 of the k best experts per token (docs/ops.md 5.1),
    logits [T, E] f32 or bf16, 1 <= topk <= E; differentiable in logits."""
    if score not in _SCORES:
        raise ValueError(f"moex.router: score must be one of {list(_SCORES)}")
    return _router_forward(_contiguous("router", "logits", logits), _int_arg("router", "topk", topk), _SCORES[score],
                           int(renorm))


def permute(x: Tensor, ids: Tensor, probs: Tensor, num_experts: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The T*k (token, expert) rows sorted by expert (docs/ops.md 6.1): x [T, H], ids [T, k]
    int32, probs [T, k] f32 (required) -> xp [T*k, H], probs_p [T*k], splits [E] int64 and
    row_map [T, k] int32 (row_map[t, j]: the row of token t's j-th expert); differentiable in x
    and probs."""
    if probs is None:
        raise ValueError("moex.permute: probs is required ([T, k] f32, e.g. router's)")
    xp, probs_p, splits, row_map = _permute_forward(
        _contiguous("permute", "x", x), _contiguous("permute", "ids", ids), _contiguous("permute", "probs", probs),
        _int_arg("permute", "num_experts", num_experts))
    return xp, probs_p, splits, row_map.view(ids.shape)


def unpermute(yp: Tensor, row_map: Tensor, k: Optional[int] = None) -> Tensor:
    """y[t] = sum_j yp[row_map[t, j]] (docs/ops.md 7.1): yp [T*k, H] -> y [T, H]; row_map [T, k]
    as permute gives it (k, when given, must be its second dimension) or flat [T*k] (then k is
    required and must divide T*k); differentiable in yp."""
    _contiguous("unpermute", "row_map", row_map)
    if row_map.dim() == 2:
        if k is not None and _int_arg("unpermute", "k", k) != row_map.shape[1]:
            raise ValueError(f"moex.unpermute: k = {k}, but row_map is [T, k] = {list(row_map.shape)}: "
                             "k must be permute's")
        k = row_map.shape[1]
    elif k is None:
        raise ValueError("moex.unpermute: k is required with a flat row_map [T*k]")
    return _unpermute_forward(_contiguous("unpermute", "yp", yp), row_map.contiguous().view(-1),
                              _int_arg("unpermute", "k", k))


# ---- the MoE layer ------------------------------------------------------------------------------

def _moe_args(x, router_w, w1, b1, w2, b2, topk, score, norm, b2_mode, glu, saved, y, fp8: Fp8, view=_view):
    return _capi.MoeLayerArgs(
        x=view(x), router_w=view(router_w), topk=topk, score=score, norm=norm, w1=_capi.Weight(view(w1), None),
        b1=view(b1), w2=_capi.Weight(view(w2), None), b2_mode=b2_mode,
        b2=view(b2 if b2_mode != BIAS_NONE else None), glu=_glu(*glu),
        saved=None if saved is None else saved.data_ptr(), saved_bytes=0 if saved is None else saved.numel(),
        y=view(y), fp8=_fp8_recipe(*fp8) or _capi.Fp8Recipe())


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
    args = _moe_args(x, router_w, w1, b1, w2, b2, topk, score, norm, b2_mode, glu, None, None, fp8,
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
                 glu_alpha: float, glu_offset: float, fp8_mode: int = 0, fp8_dtypes: int = 0, fp8_pow2_scales: bool = False, fp8_amax_epsilon: float = 0.0) -> Tuple[Tensor, Tensor]:
    _check_moe("moe_layer_forward", x, router_w, w1, b1, w2, b2, topk, b2_mode)
    glu = (glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset)
    fp8 = (fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon)
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
                  fp8_mode: int = 0, fp8_dtypes: int = 0, fp8_pow2_scales: bool = False, fp8_amax_epsilon: float = 0.0) -> List[Tensor]:
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
                               (fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon)), dy=dy,
                 dx=dx, dw_mode=GRAD_WRITE, drouter_w=drw, dw1=dw1, dw2=dw2, db1=db1, db2=db2)
    _run("moe_layer_backward", args, x.device)
    return outs


def _moe_backward_outputs(x, router_w, w1, b1, w2, b2, needs):
    E, F2, H = w1.shape
    shapes = [(tuple(x.shape), x.dtype), ((E, H), router_w.dtype), ((E, F2, H), w1.dtype),
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


def _moe_grads(ctx, dy, dsaved_unused):
    x, router_w, w1, b1, w2, b2, saved = ctx.saved_tensors
    n = ctx.needs_input_grad
    b2_mode = ctx.options[3]
    needs = [n[0], n[1], n[2], n[4], n[3] and b1 is not None, n[5] and b2 is not None and b2_mode != BIAS_NONE]
    outs = _moe_backward(x, router_w, w1, b1, w2, b2, saved, dy.contiguous(), *ctx.options, needs, *ctx.fp8)
    dx, drw, dw1, dw2, db1, db2 = (o if k else None for o, k in zip(outs, needs))
    return (dx, drw, dw1, db1, dw2, db2) + (None,) * (9 + len(_FP8_OFF))


_moe_forward.register_autograd(_moe_grads, setup_context=_moe_setup)


# ---- functions --------------------------------------------------------------------------------

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


# ---- modules ----------------------------------------------------------------------------------

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


_WGRAD_MODULES = weakref.WeakValueDictionary()   # key -> module with _WeightGradOptions
_WGRAD_KEYS = itertools.count()


@_operator("module_weight_grads", mutates_args=())
def _module_weight_grads(xs: List[Tensor], dys: List[Tensor], splits: Tensor, module: int, first_microbatch: bool,
                         keep_copies: bool, fp8_mode: int = 0, fp8_dtypes: int = 0, fp8_pow2_scales: bool = False,
                         fp8_amax_epsilon: float = 0.0) -> None:
    """The weight gradients of a module with the weight-gradient options (_WeightGradOptions;
    `module` its key): dW = dys[i]^T xs[i] for its i-th weight group, into .grad or main_grad, now
    or queued for backward_dw(). A side effect on the module, opaque to torch.compile, which
    keeps the call (it is registered as side-effecting) and runs it where the backward does."""
    target = _WGRAD_MODULES.get(module)
    if target is None:
        raise RuntimeError("moex.torch: the module of this backward's weight gradients no longer exists")
    target._weight_grads(xs, dys, splits, first_microbatch, keep_copies,
                         (fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon))


@_module_weight_grads.register_fake
def _(xs, dys, splits, module, first_microbatch, keep_copies, *fp8):
    return None


if hasattr(torch.fx.node, "has_side_effect"):   # torch >= 2.6; older ones keep custom ops in the graph anyway
    torch.fx.node.has_side_effect(torch.ops.moex.module_weight_grads.default)


class _WeightGradOptions:
    """Transformer Engine's weight-gradient options for a module's grouped weights:

    fuse_wgrad_accumulation: the weight gradients go into each weight's .main_grad (f32, which
    the caller allocates), "+=" (or "=" with is_first_microbatch=True or a weight's
    overwrite_main_grad); a weight with the attribute grad_added_to_main_grad gets it set and a
    zero .grad (Megatron's DDP convention).
    delay_wgrad_compute: the backward queues the weight gradients for backward_dw(), one call
    per backward, in order (for overlapping them with other work). Other gradients (inputs,
    biases, probabilities) come from the backward either way."""

    def _init_weight_grads(self, fuse_wgrad_accumulation: bool, delay_wgrad_compute: bool) -> None:
        self.fuse_wgrad_accumulation, self.delay_wgrad_compute = fuse_wgrad_accumulation, delay_wgrad_compute
        self._wgrad_queue = []   # delay_wgrad_compute: one weight-gradient step per backward, FIFO
        self._register_weight_grads()

    def _register_weight_grads(self) -> None:
        """The key by which moex::module_weight_grads finds this module (a copy gets its own)."""
        self._wgrad_key = next(_WGRAD_KEYS)
        _WGRAD_MODULES[self._wgrad_key] = self

    def __setstate__(self, state):   # copy.deepcopy and unpickling: the copy's own key
        super().__setstate__(state)
        self._register_weight_grads()

    def backward_dw(self) -> None:
        """delay_wgrad_compute: runs the oldest queued weight-gradient step (one per backward)."""
        if self._wgrad_queue:
            self._wgrad_queue.pop(0)()

    def _weight_groups(self) -> List[List[Tensor]]:
        """The weights whose gradients the options handle, one list per (x, dy) pair of the
        backward: [[weight]] or [[weight0, ..]] (GroupedLinear), [[w1], [w2]] (the MLPs)."""
        return [[self.w1], [self.w2]]

    def _wgrad_args(self, first_microbatch: bool) -> Tuple:
        """The weight-gradient arguments of a forward, for its backward: (module key,
        first_microbatch, keep_copies, dummy per weight group, fp8). keep_copies: under
        torch.compile a delayed step keeps copies of its inputs (a compiled graph may reuse
        their memory once the backward is done with them); dummy: the group's autograd gradient
        is the zero tensor of Megatron's DDP convention (fuse_wgrad_accumulation and weights
        with grad_added_to_main_grad) instead of None."""
        dummy = tuple(self.fuse_wgrad_accumulation and any(hasattr(p, "grad_added_to_main_grad") for p in ps)
                      for ps in self._weight_groups())
        keep = self.delay_wgrad_compute and torch.compiler.is_compiling()
        return self._wgrad_key, bool(first_microbatch), keep, dummy, self._fp8

    def _weight_grads(self, xs: List[Tensor], dys: List[Tensor], splits: Tensor, first_microbatch: bool,
                      keep_copies: bool, fp8: Fp8) -> None:
        """dW = dys[i]^T xs[i] for the i-th weight group, now or queued for backward_dw()
        (delay_wgrad_compute; copies of the inputs kept with keep_copies); marks the weights'
        grad_added_to_main_grad with fuse_wgrad_accumulation."""
        groups = self._weight_groups()
        if keep_copies and self.delay_wgrad_compute:
            xs, dys, splits = [x.clone() for x in xs], [dy.clone() for dy in dys], splits.clone()

        def step():
            for params, x, dy in zip(groups, xs, dys):
                self._weight_grad(params, x, dy, splits, first_microbatch, fp8)

        if self.delay_wgrad_compute:
            self._wgrad_queue.append(step)
        else:
            step()
        for p in (p for ps in groups for p in ps):
            if self.fuse_wgrad_accumulation and hasattr(p, "grad_added_to_main_grad"):
                p.grad_added_to_main_grad = True

    def _weight_grad(self, params: List[Tensor], x: Tensor, dy: Tensor, splits: Tensor,
                     first_microbatch: bool, fp8: Fp8 = _FP8_OFF) -> None:
        """dW_g = dy_g^T x_g for the weights `params` (one packed [G, N, K] parameter, or G [N, K]
        ones): into main_grad with fuse_wgrad_accumulation, else into .grad (= or +=); with the
        FP8 recipe `fp8` (the operators' arguments)."""
        packed = len(params) == 1 and params[0].dim() == 3
        if self.fuse_wgrad_accumulation:
            overwrite = first_microbatch or any(getattr(p, "overwrite_main_grad", False) for p in params)
            if packed and not overwrite:
                _backward_weight_accumulate(x, dy, splits, params[0].main_grad, *fp8)
            else:
                dw = _backward_weight(x, dy, splits, _capi.DTYPE_F32, *fp8)
                for p, d in zip(params, [dw] if packed else dw):
                    p.main_grad.copy_(d) if overwrite else p.main_grad.add_(d)
            return
        dw = _backward_weight(x, dy, splits, _DTYPES[params[0].dtype], *fp8)
        for p, d in zip(params, [dw] if packed else dw):
            p.grad = d.clone() if p.grad is None else p.grad.add_(d)


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
    stacking a copy. Built on first use and rebuilt only when a weight's storage changes
    (data_ptr): building it copies G pointers to the device, so do it outside CUDA graph
    capture (one eager forward before capturing does); calls with the same weights, captured
    or replayed, use the array as it is (graph-safe)."""

    def __init__(self):
        self._key, self._ptrs = None, None

    def pointers(self, params: List[Tensor]) -> Tensor:
        """The pointer array of `params` alone, for the compiled extension's operator, which checks
        the weights itself (python/csrc: ValueError naming weights[g])."""
        key = tuple(map(Tensor.data_ptr, params))   # (unique across devices: unified addressing)
        if key != self._key:
            self._ptrs = torch.tensor(key, dtype=torch.int64).to(params[0].device)
            self._key = key
        return self._ptrs

    def weight(self, owner: str, params: List[Tensor]) -> Tuple[_capi.Weight, Tensor]:
        """The moex_weight of `params` and the pointer array it points to (keep it alive as long
        as the weight is used)."""
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
        w.ptrs = self.pointers(params).data_ptr()
        return w, self._ptrs


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
    def _(x, weights, ptrs, splits, bias, probs, bias_mode, *fp8):
        return x.new_empty(x.shape[0], weights[0].shape[0])

    @torch.library.register_fake("moex::grouped_linear_discrete_backward_data")
    def _(dy, weights, ptrs, splits, bias, probs, bias_mode, need_dx, need_dbias, need_dprobs, *fp8):
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
                if wgrad is None and _DISCRETE_FORWARD is not None:
                    y = _DISCRETE_FORWARD(x, params, self._pointers.pointers(params), splits, b, p, mode, *self._fp8)
                else:
                    w, ptrs = self._pointers.weight(owner, params)
                    y = _GroupedLinearDiscrete.apply(x, splits, b, p, w, ptrs, self._fp8, wgrad, *params)
                return y if inp.dim() == 2 else y.view(*inp.shape[:-1], self.out_features)
            w = torch.stack(params)
        y = _GroupedLinearTE.apply(x, w, splits, b, p, wgrad) if te else _forward(x, w, splits, b, p, mode, *self._fp8)
        return y if inp.dim() == 2 else y.view(*inp.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"num_gemms={self.num_gemms}, in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.use_bias}, packed={self.packed}{self._fp8_repr()}")


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
                     bool(is_first_microbatch))
        return y if x.dim() == 2 else y.view(x.shape)


def _experts(module, x: Tensor, splits: Tensor, probs: Optional[Tensor], b2_mode: int, glu: Tuple, save_z: bool,
             first_microbatch: bool) -> Tensor:
    """The grouped MLP of module's w1, b1, w2, b2 (GroupedMLP, MoELayer): moex's fused forward
    and backward, or _GroupedMLPTE with the weight-gradient options."""
    if module.fuse_wgrad_accumulation or module.delay_wgrad_compute:
        return _GroupedMLPTE.apply(x, module.w1, module.b1, module.w2, module.b2, probs, splits, b2_mode, glu,
                                   module._wgrad_args(first_microbatch))
    y, _, _ = _mlp_forward(x, module.w1, module.b1, module.w2, module.b2, probs, splits, b2_mode, *glu, save_z,
                           *module._fp8)
    return y


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
    MLP); the router GEMM stays in f32."""

    def __init__(self, num_experts: int, hidden_size: int, ffn_size: int, topk: int, score: str = "softmax",
                 renorm: bool = True, glu: str = "swiglu", layout: str = "contiguous", bias1: bool = False,
                 bias2: bool = False, scale_b2: bool = True, params_dtype: Optional[torch.dtype] = None,
                 device: Union[torch.device, str, None] = None, init_method=None, limit: float = 7.0,
                 alpha: float = 1.702, offset: float = 1.0, fuse_wgrad_accumulation: bool = False,
                 delay_wgrad_compute: bool = False, fp8_recipe: Optional[str] = None, fp8_format: str = "e4m3", fp8_pow2_scales: bool = False,
                 fp8_amax_epsilon: float = 0.0):
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
        init = init_method or (lambda t: torch.nn.init.normal_(t, std=0.02))
        self.router_w = torch.nn.Parameter(torch.empty(E, H, dtype=dtype, device=device))
        self.w1 = torch.nn.Parameter(torch.empty(E, 2 * F, H, dtype=dtype, device=device))
        self.w2 = torch.nn.Parameter(torch.empty(E, H, F, dtype=dtype, device=device))
        for t in (self.router_w, self.w1, self.w2):
            init(t.data)
        self.b1 = torch.nn.Parameter(torch.zeros(E, 2 * F, dtype=dtype, device=device)) if bias1 else None
        self.b2 = torch.nn.Parameter(torch.zeros(E, H, dtype=dtype, device=device)) if bias2 else None
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
        if self.fuse_wgrad_accumulation or self.delay_wgrad_compute:
            y = self._forward_parts(x, bool(is_first_microbatch))
        else:
            y, _ = _moe_forward(x, self.router_w, self.w1, self.b1, self.w2, self.b2, *self.options, *self._fp8)
        return y if len(shape) == 2 else y.reshape(shape)

    def _forward_parts(self, x: Tensor, first_microbatch: bool) -> Tensor:
        """docs/ops.md 8.1 step by step, the experts through _experts."""
        topk, score, norm, b2_mode, *glu = self.options
        logits = F.linear(x.float(), self.router_w.float())   # f32 logits of the rounded inputs, as moex's
        probs, ids = _router_forward(logits, topk, score, norm)
        xp, probs_p, splits, row_map = _permute_forward(x, ids, probs, self.w1.shape[0])
        yp = _experts(self, xp, splits, probs_p, b2_mode, tuple(glu), True, first_microbatch)
        return _unpermute_forward(yp, row_map, topk)
