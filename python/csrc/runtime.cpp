// runtime.cpp - the extension's plumbing (moex_torch.h): dtype codes, the argument checks that
// raise ValueError as moex/torch/_checks.py's _check does, one moex context per backend and device,
// and Call: the device guard, torch's current CUDA stream, the context's lock and the workspace
// from torch's caching allocator.
#include "moex_torch.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <limits>
#include <sstream>

#ifdef MOEX_TORCH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace moex_torch {

// ---- dtypes ----------------------------------------------------------------------------------

moex_dtype dtype_code(at::ScalarType type) {
    switch (type) {
    case at::kFloat: return MOEX_DTYPE_F32;
    case at::kBFloat16: return MOEX_DTYPE_BF16;
    case at::kHalf: return MOEX_DTYPE_F16;
    case at::kInt: return MOEX_DTYPE_I32;
    case at::kLong: return MOEX_DTYPE_I64;
    case at::kFloat8_e4m3fn: return MOEX_DTYPE_E4M3;
    case at::kFloat8_e5m2: return MOEX_DTYPE_E5M2;
    case at::kFloat8_e8m0fnu: return MOEX_DTYPE_E8M0;
    default: TORCH_CHECK_VALUE(false, "moex: tensors of ", dtype_name(type), " are not supported");
    }
}

at::ScalarType scalar_type(const char* op, const char* name, int64_t code) {
    switch (code) {
    case MOEX_DTYPE_F32: return at::kFloat;
    case MOEX_DTYPE_BF16: return at::kBFloat16;
    case MOEX_DTYPE_F16: return at::kHalf;
    case MOEX_DTYPE_I32: return at::kInt;
    case MOEX_DTYPE_I64: return at::kLong;
    case MOEX_DTYPE_E4M3: return at::kFloat8_e4m3fn;
    case MOEX_DTYPE_E5M2: return at::kFloat8_e5m2;
    case MOEX_DTYPE_E8M0: return at::kFloat8_e8m0fnu;
    default: TORCH_CHECK_VALUE(false, "moex.", op, ": ", name, " ", code, " is not a moex dtype code");
    }
}

std::string dtype_name(at::ScalarType type) {
    switch (type) {   // Python's names (str(torch.float32) is "torch.float32")
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kHalf: return "torch.float16";
    case at::kLong: return "torch.int64";
    case at::kInt: return "torch.int32";
    case at::kShort: return "torch.int16";
    case at::kChar: return "torch.int8";
    case at::kByte: return "torch.uint8";
    case at::kBool: return "torch.bool";
    case at::kFloat8_e4m3fn: return "torch.float8_e4m3fn";
    case at::kFloat8_e5m2: return "torch.float8_e5m2";
    case at::kFloat8_e8m0fnu: return "torch.float8_e8m0fnu";
    default: return std::string("torch.") + c10::toString(type);
    }
}

moex_fp8_recipe fp8_recipe(const char* op, int64_t mode, int64_t dtypes, bool pow2_scales, double amax_epsilon) {
    moex_fp8_recipe r{};
    r.mode = static_cast<moex_fp8_mode>(int_arg(op, "fp8_mode", mode));
    r.dtypes = static_cast<moex_fp8_dtypes>(int_arg(op, "fp8_dtypes", dtypes));
    r.pow2_scales = pow2_scales ? 1 : 0;
    r.amax_epsilon = static_cast<float>(amax_epsilon);
    return r;
}

int32_t int_arg(const char* op, const char* name, int64_t value) {
    TORCH_CHECK_VALUE(value >= std::numeric_limits<int32_t>::min() && value <= std::numeric_limits<int32_t>::max(),
                      "moex.", op, ": ", name, " = ", value, " is out of range");
    return static_cast<int32_t>(value);
}

moex_glu_params glu_params(const char* op, int64_t kind, int64_t layout, double limit, double alpha, double offset) {
    moex_glu_params g{};
    g.kind = static_cast<moex_glu_kind>(int_arg(op, "glu_kind", kind));
    g.layout = static_cast<moex_glu_layout>(int_arg(op, "glu_layout", layout));
    g.limit = static_cast<float>(limit);
    g.alpha = static_cast<float>(alpha);
    g.offset = static_cast<float>(offset);
    return g;
}

// ---- argument checks -------------------------------------------------------------------------

static const at::ScalarType kFloatTypes[] = {at::kFloat, at::kBFloat16, at::kHalf};
const Dtypes kFloats{kFloatTypes, 3};

Dtypes only(const at::ScalarType& type) { return Dtypes{&type, 1}; }

std::string shape_tuple(const at::Tensor& t) {
    std::ostringstream s;
    s << "(";
    for (int64_t d = 0; d < t.dim(); ++d) s << (d ? ", " : "") << t.size(d);
    s << (t.dim() == 1 ? ",)" : ")");
    return s.str();
}

void check(const char* op, const char* name, const at::Tensor& t, const c10::Device& device, Dtypes dtypes,
           int64_t ndim) {
    TORCH_CHECK_VALUE(t.device() == device, "moex.", op, ": ", name, " is on ", t.device().str(),
                      ", the other tensors on ", device.str());
    bool dtype_ok = false;
    for (int i = 0; i < dtypes.count; ++i) dtype_ok = dtype_ok || t.scalar_type() == dtypes.types[i];
    if (!dtype_ok) {
        std::string allowed;
        for (int i = 0; i < dtypes.count; ++i) allowed += (i ? ", " : "") + dtype_name(dtypes.types[i]);
        TORCH_CHECK_VALUE(false, "moex.", op, ": ", name, " is ", dtype_name(t.scalar_type()), ", must be one of ",
                          allowed);
    }
    TORCH_CHECK_VALUE(t.dim() == ndim, "moex.", op, ": ", name, " must have ", ndim, " dimensions, has shape ",
                      shape_tuple(t));
    TORCH_CHECK_VALUE(t.is_contiguous(), "moex.", op, ": ", name, " must be contiguous (call .contiguous())");
}

void check(const char* op, const char* name, const std::optional<at::Tensor>& t, const c10::Device& device,
           Dtypes dtypes, int64_t ndim, bool optional) {
    if (!t.has_value()) {
        TORCH_CHECK_VALUE(optional, "moex.", op, ": ", name, " is required");
        return;
    }
    check(op, name, *t, device, dtypes, ndim);
}

void check_group_inputs(const char* op, const at::Tensor& rows, const char* rows_name, const at::Tensor& w,
                        const at::Tensor& splits, const char* w_name) {
    const c10::Device device = rows.device();
    check(op, rows_name, rows, device, kFloats, 2);
    const at::ScalarType rows_type = rows.scalar_type();
    check(op, w_name, w, device, only(rows_type), 3);
    static const at::ScalarType kLong = at::kLong;
    check(op, "splits", splits, device, only(kLong), 1);
    TORCH_CHECK_VALUE(splits.size(0) == w.size(0), "moex.", op, ": splits has ", splits.size(0), " groups, ",
                      w_name, " ", w.size(0));
}

static const char* bias_mode_name(int64_t mode) {
    return mode == MOEX_BIAS_NONE ? "NONE" : mode == MOEX_BIAS_ADD ? "ADD" : "SCALED";
}

void check_bias_mode(const char* op, const char* name, int64_t mode, const std::optional<at::Tensor>& bias,
                     const char* bias_name) {
    TORCH_CHECK_VALUE(mode == MOEX_BIAS_NONE || mode == MOEX_BIAS_ADD || mode == MOEX_BIAS_SCALED, "moex.", op,
                      ": unknown ", name, " ", mode);
    // a bias that the mode would ignore is refused (docs/conventions.md)
    TORCH_CHECK_VALUE(!(mode == MOEX_BIAS_NONE && bias.has_value()), "moex.", op, ": ", bias_name,
                      " is given but ", name, " is NONE (pass None, or ADD / SCALED)");
}

void check_bias(const char* op, int64_t bias_mode, const std::optional<at::Tensor>& bias,
                const std::optional<at::Tensor>& probs, const at::Tensor& rows) {
    check_bias_mode(op, "bias_mode", bias_mode, bias, "bias");
    TORCH_CHECK_VALUE(!(bias_mode != MOEX_BIAS_SCALED && probs.has_value()), "moex.", op,
                      ": probs is given but bias_mode is ", bias_mode_name(bias_mode),
                      " (probs scales the bias: SCALED only)");
    const at::ScalarType bias_types[] = {rows.scalar_type(), at::kFloat};
    check(op, "bias", bias, rows.device(), Dtypes{bias_types, 2}, 2, bias_mode == MOEX_BIAS_NONE);
    static const at::ScalarType kF32 = at::kFloat;
    check(op, "probs", probs, rows.device(), only(kF32), 1, bias_mode != MOEX_BIAS_SCALED);
}

// ---- contexts ----------------------------------------------------------------------------------

// The CPU's backend and one per CUDA device index (c10::DeviceIndex is 8 bits), each made once
// under a lock, then read without one.
static std::mutex g_create_lock;
static std::atomic<Backend*> g_cpu{nullptr};
static std::array<std::atomic<Backend*>, 128> g_cuda{};

static Backend* create(moex_backend kind, int device) {
    moex_context* ctx = nullptr;
    const moex_status st = moex_context_create(&ctx, kind, device);
    if (st != MOEX_OK) throw_moex_error(st, moex_last_error(nullptr));
    Backend* b = new Backend();   // kept for the process, as the Python binding keeps its contexts
    b->ctx = ctx;
    return b;
}

Backend& backend(const c10::Device& device) {
    std::atomic<Backend*>* slot = nullptr;
    moex_backend kind = MOEX_BACKEND_CPU;
    int index = 0;
    if (device.is_cpu()) {
        slot = &g_cpu;
    } else if (device.is_cuda()) {
        TORCH_CHECK_VALUE(device.has_index(), "moex: a CUDA tensor without a device index");
        index = device.index();
        TORCH_CHECK_VALUE(index >= 0 && index < static_cast<int>(g_cuda.size()), "moex: CUDA device ", index,
                          " is out of range");
        slot = &g_cuda[index];
        kind = MOEX_BACKEND_CUDA;
    } else {
        TORCH_CHECK_VALUE(false, "moex: tensors on ", c10::DeviceTypeName(device.type(), true),
                          " are not supported (CPU or CUDA)");
    }
    Backend* b = slot->load(std::memory_order_acquire);
    if (b == nullptr) {
        std::lock_guard<std::mutex> lock(g_create_lock);
        b = slot->load(std::memory_order_relaxed);
        if (b == nullptr) {
            b = create(kind, index);
            slot->store(b, std::memory_order_release);
        }
    }
    return *b;
}

// ---- one call ------------------------------------------------------------------------------------

static moex_stream current_stream(const c10::Device& device) {
    if (!device.is_cuda()) return nullptr;
#ifdef MOEX_TORCH_CUDA
    return reinterpret_cast<moex_stream>(c10::cuda::getCurrentCUDAStream(device.index()).stream());
#else
    return nullptr;   // libmoex has no CUDA backend here: creating its CUDA context has failed already
#endif
}

bool capturing(const at::Tensor& t) {
#ifdef MOEX_TORCH_CUDA
    if (t.is_cuda()) {
        const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(t.device().index());
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        C10_CUDA_CHECK(cudaStreamIsCapturing(stream.stream(), &status));
        return status != cudaStreamCaptureStatusNone;
    }
#endif
    (void)t;
    return false;
}

Call::Call(const c10::Device& device)
    : device_(device),
      guard_(device.is_cuda() ? std::optional<c10::Device>(device) : std::nullopt),
      stream_(nullptr),
      backend_(backend(device)),
      ctx_(backend_.ctx),
      lock_(backend_.mutex) {
    stream_ = current_stream(device);
}

void Call::check_status(moex_status status) const {
    if (status != MOEX_OK) throw_moex_error(status, moex_last_error(ctx_));
}

void Fp8Kept::attach(Call& call, const char* op, const std::optional<at::Tensor>& buffer,
                     std::initializer_list<const moex_weight*> weights, moex_fp8_recipe* r) {
    if (!buffer.has_value() || r->mode == MOEX_FP8_OFF) return;
    const at::Tensor& b = *buffer;
    TORCH_CHECK_VALUE(b.scalar_type() == at::kByte && b.dim() == 1 && b.is_contiguous(), "moex.", op,
                      ": fp8_weights must be a contiguous 1-D torch.uint8 tensor, got ", dtype_name(b.scalar_type()),
                      " ", shape_tuple(b));
    TORCH_CHECK_VALUE(b.device() == call.device(), "moex.", op, ": fp8_weights is on ", b.device().str(),
                      ", the weights on ", call.device().str());
    const uintptr_t base = reinterpret_cast<uintptr_t>(b.data_ptr());
    const uintptr_t end = base + static_cast<uintptr_t>(b.numel());
    uintptr_t at = (base + 255) / 256 * 256;
    size_t i = 0;
    for (const moex_weight* w : weights) {
        size_t bytes = 0;   // (the layout writes the views only: checked against the buffer after)
        call.check_status(moex_fp8_weight_layout(call.context(), r, w, reinterpret_cast<void*>(at), &copies_[i],
                                                 &bytes));
        TORCH_CHECK_VALUE(at + bytes <= end, "moex.", op, ": fp8_weights has ", b.numel(),
                          " bytes, too few for the FP8 copies of the layer's weights (moex.torch keeps them)");
        at = (at + bytes + 255) / 256 * 256;
        ++i;
    }
    r->weights = copies_;
}

// The calls of one Call run one after the other on one stream (the CPU backend's synchronously),
// so a later call may reuse an earlier call's workspace: it starts after that call has finished.
void* Call::workspace(size_t bytes) {
    if (bytes == 0) return nullptr;
    if (!workspace_.defined() || static_cast<size_t>(workspace_.numel()) < bytes)
        workspace_ = at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte).device(device_));
    return workspace_.data_ptr();
}

}  // namespace moex_torch
