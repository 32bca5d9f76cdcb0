"""_capi.py - libmoex through ctypes: the structs of include/moex.h, the library's functions,
one context per (backend, device), and errors as MoexError.

Every struct of include/moex.h has its mirror here, field for field (enums are C ints): the
mirror of moex_<name> is the class <Name> in CamelCase (moex_grouped_linear_args:
GroupedLinearArgs). tests/abi/test_abi.py checks each against the compiler's layout; this is
the tree's one copy of them (scripts import it). The public C API is the only thing used.
"""
import ctypes
import os
import threading

MAX_DIMS = 4

# moex_backend, moex_dtype, moex_bias_mode, moex_grad_mode
BACKEND_CPU, BACKEND_CUDA = 0, 1
DTYPE_F32, DTYPE_BF16, DTYPE_F16, DTYPE_I32, DTYPE_I64, DTYPE_E4M3, DTYPE_E5M2, DTYPE_E8M0 = range(8)
BIAS_NONE, BIAS_ADD, BIAS_SCALED = 0, 1, 2
GRAD_WRITE, GRAD_ACCUMULATE = 0, 1
H_KEEP, H_OVERWRITE = 0, 1


class Tensor(ctypes.Structure):
    """moex_tensor: a dense row-major view (ndim 0: absent)."""
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * MAX_DIMS)]


class Weight(ctypes.Structure):
    """moex_weight: packed [G, R, C] in t, or G matrices through ptrs (and their kept maps)."""
    _fields_ = [("t", Tensor), ("ptrs", ctypes.c_void_p), ("maps", ctypes.c_void_p)]


FP8_OFF, FP8_BLOCK, FP8_CURRENT, FP8_MXFP8 = 0, 1, 2, 3
FP8_E4M3_ALL, FP8_HYBRID = 0, 1


class Fp8Recipe(ctypes.Structure):
    """moex_fp8_recipe (experimental): mode (FP8_*), dtypes (FP8_E4M3_ALL, FP8_HYBRID),
    pow2_scales, amax_epsilon, weights (the address of the layer's Fp8Weight array, or None:
    quantized in the call); zero: off."""
    _fields_ = [("mode", ctypes.c_int), ("dtypes", ctypes.c_int), ("pow2_scales", ctypes.c_int32),
                ("amax_epsilon", ctypes.c_float), ("weights", ctypes.c_void_p)]


class ZeroTailArgs(ctypes.Structure):
    """moex_zero_tail_args: x [T, ...] whose rows at and past sum(splits) become zero bytes."""
    _fields_ = [("x", Tensor), ("splits", Tensor)]


class WeightMapsWriteArgs(ctypes.Structure):
    """moex_weight_maps_write_args: a discrete weight's kept maps written into maps."""
    _fields_ = [("w", Weight), ("maps", ctypes.c_void_p), ("maps_bytes", ctypes.c_size_t)]


class GroupedLinearArgs(ctypes.Structure):
    _fields_ = [("x", Tensor), ("w", Weight), ("bias_mode", ctypes.c_int), ("bias", Tensor), ("probs", Tensor),
                ("splits", Tensor), ("y", Tensor), ("fp8", Fp8Recipe)]


class GroupedLinearDgradArgs(ctypes.Structure):
    _fields_ = [("dy", Tensor), ("w", Weight), ("bias_mode", ctypes.c_int), ("bias", Tensor), ("probs", Tensor),
                ("splits", Tensor), ("dx", Tensor), ("dbias", Tensor), ("dprobs", Tensor),
                ("fp8", Fp8Recipe)]


class GroupedLinearWgradArgs(ctypes.Structure):
    _fields_ = [("x", Tensor), ("dy", Tensor), ("splits", Tensor), ("dw_mode", ctypes.c_int), ("dw", Weight),
                ("fp8", Fp8Recipe)]


class GluParams(ctypes.Structure):
    """moex_glu_params: kind (0 SWIGLU, 1 CLAMPED_SWIGLU), layout (0 CONTIGUOUS, 1 INTERLEAVED_32),
    and the clamped SwiGLU's limit, alpha and offset."""
    _fields_ = [("kind", ctypes.c_int), ("layout", ctypes.c_int), ("limit", ctypes.c_float),
                ("alpha", ctypes.c_float), ("offset", ctypes.c_float)]


class GroupedMlpArgs(ctypes.Structure):
    _fields_ = [("x", Tensor), ("w1", Weight), ("b1", Tensor), ("w2", Weight), ("b2_mode", ctypes.c_int),
                ("b2", Tensor), ("probs", Tensor), ("glu", GluParams), ("splits", Tensor), ("h", Tensor),
                ("z", Tensor), ("y", Tensor), ("fp8", Fp8Recipe)]


class GroupedMlpGradArgs(ctypes.Structure):
    _fields_ = [("x", Tensor), ("w1", Weight), ("w2", Weight), ("b2_mode", ctypes.c_int), ("b2", Tensor),
                ("probs", Tensor), ("glu", GluParams), ("splits", Tensor), ("h", Tensor), ("z", Tensor),
                ("dy", Tensor), ("dx", Tensor), ("dw_mode", ctypes.c_int), ("dw1", Weight), ("dw2", Weight),
                ("db1", Tensor), ("db2", Tensor), ("dprobs", Tensor), ("h_mode", ctypes.c_int),
                ("fp8", Fp8Recipe)]


class MoeLayerArgs(ctypes.Structure):
    _fields_ = [("x", Tensor), ("router_w", Tensor), ("topk", ctypes.c_int32), ("score", ctypes.c_int),
                ("norm", ctypes.c_int), ("w1", Weight), ("b1", Tensor), ("w2", Weight), ("b2_mode", ctypes.c_int),
                ("b2", Tensor), ("glu", GluParams), ("saved", ctypes.c_void_p), ("saved_bytes", ctypes.c_size_t),
                ("y", Tensor), ("fp8", Fp8Recipe)]


class MoeLayerGradArgs(ctypes.Structure):
    _fields_ = [("fwd", MoeLayerArgs), ("dy", Tensor), ("dx", Tensor), ("dw_mode", ctypes.c_int),
                ("drouter_w", Tensor), ("dw1", Weight), ("dw2", Weight), ("db1", Tensor), ("db2", Tensor)]


class RouterArgs(ctypes.Structure):
    _fields_ = [("logits", Tensor), ("topk", ctypes.c_int32), ("score", ctypes.c_int), ("norm", ctypes.c_int),
                ("probs", Tensor), ("ids", Tensor)]


class RouterGradArgs(ctypes.Structure):
    _fields_ = [("logits", Tensor), ("topk", ctypes.c_int32), ("score", ctypes.c_int), ("norm", ctypes.c_int),
                ("ids", Tensor), ("dprobs", Tensor), ("dlogits", Tensor)]


class PermuteArgs(ctypes.Structure):
    _fields_ = [("x", Tensor), ("ids", Tensor), ("probs", Tensor), ("num_experts", ctypes.c_int32),
                ("xp", Tensor), ("probs_p", Tensor), ("splits", Tensor), ("row_map", Tensor)]


class PermuteGradArgs(ctypes.Structure):
    _fields_ = [("row_map", Tensor), ("dxp", Tensor), ("dprobs_p", Tensor), ("dx", Tensor), ("dprobs", Tensor)]


class UnpermuteArgs(ctypes.Structure):
    _fields_ = [("row_map", Tensor), ("yp", Tensor), ("y", Tensor)]


class UnpermuteGradArgs(ctypes.Structure):
    _fields_ = [("row_map", Tensor), ("dy", Tensor), ("dyp", Tensor)]




class ScaledGluGradArgs(ctypes.Structure):
    _fields_ = [("glu", GluParams), ("h", Tensor), ("probs", Tensor), ("splits", Tensor), ("dz", Tensor),
                ("dh", Tensor), ("dprobs", Tensor)]


MAX_OFFSETS = 8
OFFSETS_LEADING_ZERO, OFFSETS_INCLUSIVE = 0, 1


class OffsetsOutput(ctypes.Structure):
    _fields_ = [("out", Tensor), ("stride", ctypes.c_int64), ("start", ctypes.c_int)]


class SplitsToOffsetsArgs(ctypes.Structure):
    _fields_ = [("splits", Tensor), ("num_outputs", ctypes.c_int32), ("outputs", OffsetsOutput * MAX_OFFSETS)]


class QuantParams(ctypes.Structure):
    """moex_quant_params: recipe (0 TENSOR, 1 GROUP, 2 BLOCK, 3 MXFP8), fp8 dtype, amax
    epsilon, rounding (0 EXACT, 1 POW2), scale layout (0 PLAIN, 1 MX_SWIZZLED)."""
    _fields_ = [("recipe", ctypes.c_int), ("fp8", ctypes.c_int), ("amax_epsilon", ctypes.c_float),
                ("rounding", ctypes.c_int), ("scale_layout", ctypes.c_int)]


class QuantTensor(ctypes.Structure):
    _fields_ = [("data", Tensor), ("scales", Tensor)]


class Fp8Weight(ctypes.Structure):
    """moex_fp8_weight (experimental): a weight's FP8 copies a caller keeps (rowwise, columnwise)."""
    _fields_ = [("rowwise", QuantTensor), ("columnwise", QuantTensor)]


class ScaledGluArgs(ctypes.Structure):
    _fields_ = [("glu", GluParams), ("h", Tensor), ("probs", Tensor), ("splits", Tensor), ("z", Tensor),
                ("zq_params", QuantParams), ("zq_rowwise", QuantTensor), ("zq_columnwise", QuantTensor),
                ("zq_amax", Tensor)]


class GroupQuantizeArgs(ctypes.Structure):
    _fields_ = [("x", Tensor), ("splits", Tensor), ("params", QuantParams), ("rowwise", QuantTensor),
                ("columnwise", QuantTensor), ("amax", Tensor), ("dbias", Tensor)]


class GroupDequantizeArgs(ctypes.Structure):
    _fields_ = [("params", QuantParams), ("orientation", ctypes.c_int), ("src", QuantTensor), ("splits", Tensor),
                ("y", Tensor)]


class WeightQuantizeArgs(ctypes.Structure):
    _fields_ = [("w", Tensor), ("params", QuantParams), ("rowwise", QuantTensor), ("columnwise", QuantTensor),
                ("amax", Tensor)]


class WeightDequantizeArgs(ctypes.Structure):
    _fields_ = [("params", QuantParams), ("orientation", ctypes.c_int), ("src", QuantTensor), ("w", Tensor)]


class GroupedLinearFp8Args(ctypes.Structure):
    _fields_ = [("x_params", QuantParams), ("x", QuantTensor), ("w_params", QuantParams), ("w", QuantTensor),
                ("splits", Tensor), ("bias_mode", ctypes.c_int), ("bias", Tensor), ("probs", Tensor), ("y", Tensor)]


class GroupedLinearFp8WgradArgs(ctypes.Structure):
    _fields_ = [("dy_params", QuantParams), ("dy", QuantTensor), ("x_params", QuantParams), ("x", QuantTensor),
                ("splits", Tensor), ("dw_mode", ctypes.c_int), ("dw", Weight)]


# Expert parallelism (moex_ep_*): the structs; bound below are the EP context's functions and the EP
# MoE layer (ep_create, ep_destroy, ep_get_info, ep_moe_layer_saved_size, OPS' ep_*).
EP_COMM_MPI, EP_COMM_NCCL = 0, 1
EP_TRANSFER_AUTO, EP_TRANSFER_CAPACITY, EP_TRANSFER_PEER = 0, 1, 2


class EpConfig(ctypes.Structure):
    _fields_ = [("comm_kind", ctypes.c_int), ("comm", ctypes.c_void_p), ("num_experts", ctypes.c_int32),
                ("topk", ctypes.c_int32), ("hidden", ctypes.c_int64), ("dtype", ctypes.c_int),
                ("max_tokens", ctypes.c_int64), ("max_recv_rows", ctypes.c_int64), ("transfer", ctypes.c_int)]


class EpInfo(ctypes.Structure):
    _fields_ = [("rank", ctypes.c_int32), ("world", ctypes.c_int32), ("local_experts", ctypes.c_int32),
                ("transfer", ctypes.c_int), ("handle_bytes", ctypes.c_size_t)]


class EpDispatchArgs(ctypes.Structure):
    _fields_ = [("ep", ctypes.c_void_p), ("x", Tensor), ("ids", Tensor), ("probs", Tensor), ("handle", ctypes.c_void_p),
                ("handle_bytes", ctypes.c_size_t), ("xr", Tensor), ("probs_r", Tensor), ("splits", Tensor),
                ("dropped", Tensor), ("x_scales", Tensor), ("xr_scales", Tensor)]


class EpDispatchGradArgs(ctypes.Structure):
    _fields_ = [("ep", ctypes.c_void_p), ("handle", ctypes.c_void_p), ("handle_bytes", ctypes.c_size_t),
                ("dxr", Tensor), ("dprobs_r", Tensor), ("dx", Tensor), ("dprobs", Tensor)]


class EpCombineArgs(ctypes.Structure):
    _fields_ = [("ep", ctypes.c_void_p), ("handle", ctypes.c_void_p), ("handle_bytes", ctypes.c_size_t),
                ("yr", Tensor), ("y", Tensor)]


class EpCombineGradArgs(ctypes.Structure):
    _fields_ = [("ep", ctypes.c_void_p), ("handle", ctypes.c_void_p), ("handle_bytes", ctypes.c_size_t),
                ("dy", Tensor), ("dyr", Tensor)]


class EpMoeLayerArgs(ctypes.Structure):
    _fields_ = [("ep", ctypes.c_void_p), ("layer", MoeLayerArgs), ("dropped", Tensor)]


class EpMoeLayerGradArgs(ctypes.Structure):
    _fields_ = [("ep", ctypes.c_void_p), ("layer", MoeLayerGradArgs)]


class MoexError(RuntimeError):
    """A moex call failed: .status is the moex_status name, the message is moex_last_error."""

    def __init__(self, status, message):
        super().__init__(f"{status}: {message}")
        self.status = status


# the operations: moex_<stem>_workspace_size and moex_<stem>, and their argument structs
OPS = {"grouped_linear_forward": GroupedLinearArgs, "grouped_linear_backward_data": GroupedLinearDgradArgs,
       "grouped_linear_backward_weight": GroupedLinearWgradArgs, "grouped_mlp_forward": GroupedMlpArgs,
       "grouped_mlp_backward": GroupedMlpGradArgs, "moe_layer_forward": MoeLayerArgs,
       "moe_layer_backward": MoeLayerGradArgs, "router_forward": RouterArgs, "router_backward": RouterGradArgs,
       "permute_forward": PermuteArgs, "permute_backward": PermuteGradArgs, "unpermute_forward": UnpermuteArgs,
       "unpermute_backward": UnpermuteGradArgs, "scaled_glu_forward": ScaledGluArgs,
       "scaled_glu_backward": ScaledGluGradArgs, "splits_to_offsets": SplitsToOffsetsArgs,
       "group_quantize": GroupQuantizeArgs, "group_dequantize": GroupDequantizeArgs,
       "weight_quantize": WeightQuantizeArgs, "weight_dequantize": WeightDequantizeArgs,
       "grouped_linear_fp8_forward": GroupedLinearFp8Args,
       "grouped_linear_fp8_backward_weight": GroupedLinearFp8WgradArgs, "zero_tail": ZeroTailArgs,
       "weight_maps_write": WeightMapsWriteArgs,
       "ep_dispatch_forward": EpDispatchArgs, "ep_dispatch_backward": EpDispatchGradArgs,
       "ep_combine_forward": EpCombineArgs, "ep_combine_backward": EpCombineGradArgs,
       "ep_moe_layer_forward": EpMoeLayerArgs, "ep_moe_layer_backward": EpMoeLayerGradArgs}


def _library_path():
    """$MOEX_LIBRARY, else the libmoex.so installed inside this package."""
    env = os.environ.get("MOEX_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for sub in ("lib", "lib64"):
        p = os.path.join(here, sub, "libmoex.so")
        if os.path.exists(p):
            return p
    raise ImportError(f"moex: libmoex.so is not in {here}/lib (pip install ./python builds it) and "
                      "MOEX_LIBRARY is not set")


def _load():
    lib = ctypes.CDLL(_library_path())
    p, i, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    sigs = {
        "moex_version_string": (ctypes.c_char_p, []),
        "moex_status_string": (ctypes.c_char_p, [i]),
        "moex_last_error": (ctypes.c_char_p, [p]),
        "moex_context_create": (i, [ctypes.POINTER(p), i, i]),
        "moex_context_destroy": (None, [p]),
        "moex_moe_layer_saved_size": (i, [p, ctypes.POINTER(MoeLayerArgs), ctypes.POINTER(sz)]),
        "moex_ep_create": (i, [ctypes.POINTER(p), p, ctypes.POINTER(EpConfig)]),
        "moex_ep_destroy": (None, [p]),
        "moex_ep_get_info": (i, [p, ctypes.POINTER(EpInfo)]),
        "moex_ep_moe_layer_saved_size": (i, [p, ctypes.POINTER(EpMoeLayerArgs), ctypes.POINTER(sz)]),
        "moex_fp8_weight_params": (QuantParams, [ctypes.POINTER(Fp8Recipe)]),
        "moex_fp8_weight_layout": (i, [p, ctypes.POINTER(Fp8Recipe), ctypes.POINTER(Weight), p,
                                       ctypes.POINTER(Fp8Weight), ctypes.POINTER(sz)]),
    }
    for stem, args_t in OPS.items():
        sigs[f"moex_{stem}_workspace_size"] = (i, [p, ctypes.POINTER(args_t), ctypes.POINTER(sz)])
        sigs[f"moex_{stem}"] = (i, [p, ctypes.POINTER(args_t), p, sz, p])
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


LIB = _load()
_FUNCTIONS = {stem: (getattr(LIB, f"moex_{stem}_workspace_size"), getattr(LIB, f"moex_{stem}")) for stem in OPS}
_contexts = {}
_contexts_lock = threading.Lock()


def version():
    """The loaded library's version, "0.1.0"."""
    return LIB.moex_version_string().decode()


def context(backend, device):
    """The process's moex context for (backend, device), created on first use."""
    key = (backend, device)
    ctx = _contexts.get(key)
    if ctx is not None:
        return ctx
    with _contexts_lock:
        ctx = _contexts.get(key)
        if ctx is None:
            handle = ctypes.c_void_p()
            st = LIB.moex_context_create(ctypes.byref(handle), backend, device)
            if st != 0:
                raise MoexError(LIB.moex_status_string(st).decode(), LIB.moex_last_error(None).decode())
            ctx = _contexts[key] = handle
        return ctx


def check(ctx, status):
    """Raises MoexError with the context's last error when status is not MOEX_OK."""
    if status != 0:
        raise MoexError(LIB.moex_status_string(status).decode(), LIB.moex_last_error(ctx).decode())


def run(ctx, stem, args, alloc, stream):
    """moex_<stem>_workspace_size then moex_<stem>(ctx, &args, ws, bytes, stream); alloc(bytes)
    returns (address, keep-alive object) of a workspace of at least `bytes` bytes."""
    query, call = _FUNCTIONS[stem]
    nbytes = ctypes.c_size_t()
    ref = ctypes.byref(args)
    check(ctx, query(ctx, ref, ctypes.byref(nbytes)))
    ws, keep = alloc(nbytes.value) if nbytes.value else (None, None)
    check(ctx, call(ctx, ref, ws, nbytes.value, stream))
    del keep


def moe_layer_saved_size(ctx, args):
    """moex_moe_layer_saved_size: the bytes of the MoE layer's `saved` buffer."""
    nbytes = ctypes.c_size_t()
    check(ctx, LIB.moex_moe_layer_saved_size(ctx, ctypes.byref(args), ctypes.byref(nbytes)))
    return nbytes.value


def ep_moe_layer_saved_size(ctx, args):
    """moex_ep_moe_layer_saved_size: the bytes of the EP MoE layer's `saved` buffer."""
    nbytes = ctypes.c_size_t()
    check(ctx, LIB.moex_ep_moe_layer_saved_size(ctx, ctypes.byref(args), ctypes.byref(nbytes)))
    return nbytes.value


def ep_create(ctx, config):
    """moex_ep_create (collective over config.comm): the EP context's handle (ep_destroy frees it)."""
    handle = ctypes.c_void_p()
    check(ctx, LIB.moex_ep_create(ctypes.byref(handle), ctx, ctypes.byref(config)))
    return handle


def ep_info(ctx, ep):
    """moex_ep_get_info of the EP context ep."""
    info = EpInfo()
    check(ctx, LIB.moex_ep_get_info(ep, ctypes.byref(info)))
    return info


def ep_destroy(ep):
    """moex_ep_destroy (not collective; accepts None)."""
    LIB.moex_ep_destroy(ep)
