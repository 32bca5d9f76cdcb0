// moex_torch.h - what the files of the compiled PyTorch extension share (python/csrc): views of
// at::Tensors as moex_tensors, the argument checks, and `run`, which calls one moex operation
// on the backend of a device (its context, torch's current stream, a workspace from torch's
// allocator) and turns a moex failure into moex.MoexError.
//
// The extension is libmoex_torch.so inside the moex package, loaded by moex/_torch_ext.py with
// torch.ops.load_library. It defines the moex:: operators (schemas.cpp), their CPU and CUDA
// kernels over the C API (kernels.cpp) and their autograd (autograd.cpp); the fake kernels
// stay in Python (moex/torch/). Contracts are the Python operators' (moex/torch/).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <string>

#include "moex.h"

namespace moex_torch {

// ---- moex_tensor views ---------------------------------------------------------------------

// The moex dtype of a torch dtype; ValueError for one moex does not have.
moex_dtype dtype_code(at::ScalarType type);
// The torch dtype of a moex dtype code (an operator's dw_dtype, dtype_code arguments).
at::ScalarType scalar_type(const char* op, const char* name, int64_t code);
// "torch.float32", as Python prints a torch dtype (for messages).
std::string dtype_name(at::ScalarType type);
// "(4, 8)", "(4,)", "()": a tensor's shape as Python prints a tuple (for messages).
std::string shape_tuple(const at::Tensor& t);

// The moex_tensor of a contiguous tensor of at most MOEX_MAX_DIMS dimensions (checked before).
inline moex_tensor view(const at::Tensor& t) {
    moex_tensor v{};
    v.data = t.data_ptr();
    v.dtype = dtype_code(t.scalar_type());
    v.ndim = static_cast<int32_t>(t.dim());
    for (int64_t d = 0; d < t.dim(); ++d) v.shape[d] = t.size(d);
    return v;
}

// The view of an optional tensor: absent (ndim 0) for nullopt.
inline moex_tensor view(const std::optional<at::Tensor>& t) {
    return t.has_value() ? view(*t) : moex_tensor{};
}

// A packed [G, R, C] weight.
inline moex_weight weight(const at::Tensor& t) {
    moex_weight w{};
    w.t = view(t);
    return w;
}

// The FP8 recipe of an operator's fp8 arguments (all zero: off); the C library checks values.
moex_fp8_recipe fp8_recipe(const char* op, int64_t mode, int64_t dtypes, bool pow2_scales, double amax_epsilon);

// An operator's integer argument that the C API takes as an int: ValueError past int32.
int32_t int_arg(const char* op, const char* name, int64_t value);

// The GLU's parameters of an operator's glu_* arguments (the C library checks their values).
moex_glu_params glu_params(const char* op, int64_t kind, int64_t layout, double limit, double alpha, double offset);

// ---- argument checks (ValueError naming the argument, as moex/torch/_checks.py's _check) -----

// The dtypes an argument may have (a short list).
struct Dtypes {
    const at::ScalarType* types;
    int count;
};
extern const Dtypes kFloats;   // f32, bf16, f16
Dtypes only(const at::ScalarType& type);   // one dtype (the reference must outlive the check)

// ValueError unless t is a contiguous tensor with `ndim` dimensions, one of `dtypes`, on
// `device` ("moex.<op>: <name> ..." as moex/torch/_checks.py's _check words it).
void check(const char* op, const char* name, const at::Tensor& t, const c10::Device& device, Dtypes dtypes,
           int64_t ndim);
// The same for an optional tensor: absent is fine when `optional`, else "<name> is required".
void check(const char* op, const char* name, const std::optional<at::Tensor>& t, const c10::Device& device,
           Dtypes dtypes, int64_t ndim, bool optional);

// _checks.py's _check_group_inputs: rows [T, K] (a float dtype), w [G, N, K] of rows' dtype,
// splits int64 [G].
void check_group_inputs(const char* op, const at::Tensor& rows, const char* rows_name, const at::Tensor& w,
                        const at::Tensor& splits, const char* w_name);
// _checks.py's _check_bias_mode: `mode` (named `name`) is NONE, ADD or SCALED, and the bias
// (named `bias_name`) is absent with NONE.
void check_bias_mode(const char* op, const char* name, int64_t mode, const std::optional<at::Tensor>& bias,
                     const char* bias_name);
// _checks.py's _check_bias: a known bias_mode; bias [G, N] (rows' dtype or f32) with ADD and
// SCALED, probs [T] f32 with SCALED, and neither where the mode would ignore it.
void check_bias(const char* op, int64_t bias_mode, const std::optional<at::Tensor>& bias,
                const std::optional<at::Tensor>& probs, const at::Tensor& rows);

// ---- calling moex ----------------------------------------------------------------------------

// Throws the error that Python sees as moex.MoexError (errors.cpp): "<status>: <message>".
[[noreturn]] void throw_moex_error(moex_status status, const char* message);

// A backend of one device: its moex context (made on first use, kept for the process) and the
// lock that lets one thread at a time use it (include/moex.h: "a context may be used by one
// thread at a time").
struct Backend {
    moex_context* ctx;
    std::mutex mutex;
};
// The backend of a CPU or CUDA device (MoexError when moex_context_create fails, ValueError for
// another device type).
Backend& backend(const c10::Device& device);

// Whether torch's current stream of t's device is capturing a CUDA graph (false on the CPU).
bool capturing(const at::Tensor& t);

// One call on a device: the device made current (CUDA), torch's current stream, the backend
// locked from construction to destruction.
class Call {
public:
    explicit Call(const c10::Device& device);
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

    // moex_<op>_workspace_size, a workspace of that many bytes from torch's allocator on the
    // device (none for 0; an earlier call's when it is large enough), then moex_<op>; either
    // failing throws moex.MoexError.
    template <class Args>
    void run(moex_status (*query)(moex_context*, const Args*, size_t*),
             moex_status (*call)(moex_context*, const Args*, void*, size_t, moex_stream), const Args& args) {
        size_t bytes = 0;
        check_status(query(ctx_, &args, &bytes));
        void* ws = workspace(bytes);
        check_status(call(ctx_, &args, ws, bytes, stream_));
    }

    moex_context* context() const { return ctx_; }
    const c10::Device& device() const { return device_; }
    void check_status(moex_status status) const;

private:
    void* workspace(size_t bytes);

    c10::Device device_;
    c10::OptionalDeviceGuard guard_;    // CUDA: the tensors' device is current during the call
    moex_stream stream_;                // torch's current stream of the device (CUDA); NULL on the CPU
    Backend& backend_;
    moex_context* ctx_;
    std::unique_lock<std::mutex> lock_;
    at::Tensor workspace_;              // kept until the call has been enqueued (stream-ordered reuse)
};

// The FP8 copies a module keeps of its layer's weights: an operator's fp8_weights, one uint8
// buffer on the weights' device in which each weight's two copies lie as moex_fp8_weight_layout
// lays them out, the first weight's from the buffer's first 256-byte boundary, each next one's
// from the first 256-byte boundary after the previous one's end (moex/torch/_fp8.py,
// _kept_layout, makes such buffers). attach() points r->weights at them for the weights
// `weights` (in the layer's order); nothing for an absent buffer or a recipe that is off.
// Keep the object alive until the call has run.
class Fp8Kept {
public:
    void attach(Call& call, const char* op, const std::optional<at::Tensor>& buffer,
                std::initializer_list<const moex_weight*> weights, moex_fp8_recipe* r);

private:
    moex_fp8_weight copies_[2]{};
};

// Runs moex_<op> with `args` on the backend of `device` (Call above).
template <class Args>
void run(const c10::Device& device, moex_status (*query)(moex_context*, const Args*, size_t*),
         moex_status (*call)(moex_context*, const Args*, void*, size_t, moex_stream), const Args& args) {
    Call c(device);
    c.run(query, call, args);
}

}  // namespace moex_torch
