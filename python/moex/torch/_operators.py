"""moex.torch._operators - what every moex operator shares: the dtype codes, calling the C
library (moex_tensor views of torch tensors, argument structs, torch's current stream and
allocator, the zero tail), the refusal of double backward, and the operator machinery
(_operator: a Python implementation registered with torch.library, or the compiled extension's
C++ operator of the same name). The operators themselves are defined by the files of their
families (_linear, _glu, _mlp, _splits, _routing, _moe, _weight_grads).

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
0.0, then fp8_weights: Optional[Tensor] = None; the defaults are off, the plain path. With a
recipe, every GEMM of the call runs on FP8 operands, quantized inside the call, but for the
weights' copies fp8_weights holds (a uint8 buffer of the layer's weights' copies in their order,
as moex.torch._fp8._kept_quantize makes it: the modules' kept copies; the operators that read
no weight ignore it); inputs, outputs and their dtypes are the plain call's.
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
alike (_CppOperator), and the Python implementations are not registered.
"""
import functools
from typing import Optional

import torch
from torch import Tensor

from .. import _capi, _torch_ext


_DTYPES = {torch.float32: _capi.DTYPE_F32, torch.bfloat16: _capi.DTYPE_BF16, torch.float16: _capi.DTYPE_F16,
           torch.int32: _capi.DTYPE_I32, torch.int64: _capi.DTYPE_I64}
_DTYPES.update({getattr(torch, name): code for name, code in (("float8_e4m3fn", _capi.DTYPE_E4M3),
                                                             ("float8_e5m2", _capi.DTYPE_E5M2),
                                                             ("float8_e8m0fnu", _capi.DTYPE_E8M0))
                if hasattr(torch, name)})
_TORCH_DTYPES = {v: k for k, v in _DTYPES.items()}
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


# ---- calling the C library ---------------------------------------------------------------------

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


# ---- operators ---------------------------------------------------------------------------------

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
