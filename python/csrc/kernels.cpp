// kernels.cpp - the CPU and CUDA kernels of the moex:: operators: each checks its arguments as
// the Python operator of moex/torch.py does (ValueError naming the argument), allocates its
// outputs with torch, fills the moex argument struct with views of them and calls the C API on
// the tensors' backend (moex_torch.h's run: the device's context, torch's current stream, a
// workspace from torch's allocator). One function serves both dispatch keys: the tensors'
// device picks the backend.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <tuple>

#include "moex_torch.h"

namespace moex_torch {
namespace {

// t (rows [T, ...]) with its rows at and past sum(splits) set to zero in place (moex_zero_tail,
// graph-safe, at the cost of those rows only), in the call that wrote it: every row-indexed
// output of an operator with splits goes through it, so no uninitialised row reaches autograd
// (as moex/torch.py's _zero_tail).
void zero_tail(Call& call, const at::Tensor& t, const at::Tensor& splits) {
    if (t.numel() == 0) return;
    moex_zero_tail_args a{};
    a.x = view(t);
    a.splits = view(splits);
    call.run(moex_zero_tail_workspace_size, moex_zero_tail, a);
}

// ---- grouped linear (docs/ops.md section 2) -------------------------------------------------

// y [T, N] (rows past sum(splits) zero).
at::Tensor grouped_linear_forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& splits,
                                  const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& probs,
                                  int64_t bias_mode, int64_t fp8_mode, int64_t fp8_dtypes, bool fp8_pow2_scales,
                                  double fp8_amax_epsilon) {
    const char* op = "grouped_linear_forward";
    check_group_inputs(op, x, "x", w, splits, "w");
    check_bias(op, bias_mode, bias, probs, x);
    at::Tensor y = at::empty({x.size(0), w.size(1)}, x.options());
    moex_grouped_linear_args a{};
    a.x = view(x);
    a.w = weight(w);
    a.bias_mode = static_cast<moex_bias_mode>(bias_mode);
    if (bias_mode != MOEX_BIAS_NONE) a.bias = view(bias);
    if (bias_mode == MOEX_BIAS_SCALED) a.probs = view(probs);
    a.splits = view(splits);
    a.y = view(y);
    a.fp8 = fp8_recipe(op, fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon);
    Call call(x.device());
    call.run(moex_grouped_linear_forward_workspace_size, moex_grouped_linear_forward, a);
    zero_tail(call, y, splits);
    return y;
}

// dx [T, K] (rows past sum(splits) zero), dbias [G, N] (bias's dtype, f32 without one), dprobs
// [T] f32 (zeroed: moex adds to it); each with 0 rows when not needed.
std::tuple<at::Tensor, at::Tensor, at::Tensor> grouped_linear_backward_data(
        const at::Tensor& dy, const at::Tensor& w, const at::Tensor& splits, const std::optional<at::Tensor>& bias,
        const std::optional<at::Tensor>& probs, int64_t bias_mode, bool need_dx, bool need_dbias, bool need_dprobs,
        int64_t fp8_mode, int64_t fp8_dtypes, bool fp8_pow2_scales, double fp8_amax_epsilon) {
    const char* op = "grouped_linear_backward_data";
    check_group_inputs(op, dy, "dy", w, splits, "w");
    check_bias(op, bias_mode, bias, probs, dy);
    const int64_t T = dy.size(0), N = dy.size(1), G = w.size(0), K = w.size(2);
    at::Tensor dx = at::empty({need_dx ? T : 0, K}, dy.options());
    at::Tensor dbias = at::empty({need_dbias ? G : 0, N}, dy.options().dtype(bias ? bias->scalar_type() : at::kFloat));
    at::Tensor dprobs = need_dprobs ? at::zeros({T}, dy.options().dtype(at::kFloat))
                                    : at::empty({0}, dy.options().dtype(at::kFloat));
    const bool scaled = bias_mode == MOEX_BIAS_SCALED;
    moex_grouped_linear_dgrad_args a{};
    a.dy = view(dy);
    a.w = weight(w);
    a.bias_mode = static_cast<moex_bias_mode>(bias_mode);
    if (scaled && need_dprobs) a.bias = view(bias);
    if (scaled) a.probs = view(probs);
    a.splits = view(splits);
    if (need_dx) a.dx = view(dx);
    if (need_dbias) a.dbias = view(dbias);
    if (need_dprobs) a.dprobs = view(dprobs);
    a.fp8 = fp8_recipe(op, fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon);
    Call call(dy.device());
    call.run(moex_grouped_linear_backward_data_workspace_size, moex_grouped_linear_backward_data, a);
    zero_tail(call, dx, splits);   // dprobs: zeros, += on the groups' rows only
    return {dx, dbias, dprobs};
}

// torch.py's _check_wgrad: x [T, K] (a float dtype), dy [T, N] of x's dtype, splits int64 [G].
void check_wgrad(const char* op, const at::Tensor& x, const at::Tensor& dy, const at::Tensor& splits) {
    check(op, "x", x, x.device(), kFloats, 2);
    const at::ScalarType x_type = x.scalar_type();
    check(op, "dy", dy, x.device(), only(x_type), 2);
    static const at::ScalarType kLong = at::kLong;
    check(op, "splits", splits, x.device(), only(kLong), 1);
    TORCH_CHECK_VALUE(dy.size(0) == x.size(0), "moex.", op, ": x has ", x.size(0), " rows, dy ", dy.size(0));
}

moex_grouped_linear_wgrad_args wgrad_args(const char* op, const at::Tensor& x, const at::Tensor& dy,
                                          const at::Tensor& splits, moex_grad_mode mode, const at::Tensor& dw,
                                          int64_t fp8_mode, int64_t fp8_dtypes, bool fp8_pow2_scales,
                                          double fp8_amax_epsilon) {
    moex_grouped_linear_wgrad_args a{};
    a.x = view(x);
    a.dy = view(dy);
    a.splits = view(splits);
    a.dw_mode = mode;
    a.dw = weight(dw);
    a.fp8 = fp8_recipe(op, fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon);
    return a;
}

// dw [G, N, K] of the moex dtype code dw_dtype, written.
at::Tensor grouped_linear_backward_weight(const at::Tensor& x, const at::Tensor& dy, const at::Tensor& splits,
                                          int64_t dw_dtype, int64_t fp8_mode, int64_t fp8_dtypes, bool fp8_pow2_scales,
                                          double fp8_amax_epsilon) {
    const char* op = "grouped_linear_backward_weight";
    check_wgrad(op, x, dy, splits);
    TORCH_CHECK_VALUE(dw_dtype == MOEX_DTYPE_F32 || dw_dtype == MOEX_DTYPE_BF16 || dw_dtype == MOEX_DTYPE_F16,
                      "moex.", op, ": dw_dtype ", dw_dtype, " is not a float dtype code");
    at::Tensor dw = at::empty({splits.size(0), dy.size(1), x.size(1)},
                              x.options().dtype(scalar_type(op, "dw_dtype", dw_dtype)));
    run(x.device(), moex_grouped_linear_backward_weight_workspace_size, moex_grouped_linear_backward_weight,
        wgrad_args(op, x, dy, splits, MOEX_GRAD_WRITE, dw, fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon));
    return dw;
}

// main_grad [G, N, K] f32 += dy_g^T x_g.
void grouped_linear_backward_weight_accumulate(const at::Tensor& x, const at::Tensor& dy, const at::Tensor& splits,
                                               const at::Tensor& main_grad, int64_t fp8_mode, int64_t fp8_dtypes,
                                               bool fp8_pow2_scales, double fp8_amax_epsilon) {
    const char* op = "grouped_linear_backward_weight_accumulate";
    check_wgrad(op, x, dy, splits);
    static const at::ScalarType kF32 = at::kFloat;
    check(op, "main_grad", main_grad, x.device(), only(kF32), 3);
    run(x.device(), moex_grouped_linear_backward_weight_workspace_size, moex_grouped_linear_backward_weight,
        wgrad_args(op, x, dy, splits, MOEX_GRAD_ACCUMULATE, main_grad, fp8_mode, fp8_dtypes, fp8_pow2_scales,
                   fp8_amax_epsilon));
}

// The same kernels for both keys: the tensors' device picks moex's backend (a CUDA tensor with
// a libmoex built without CUDA fails in moex_context_create, as MoexError).
void register_kernels(torch::Library& m) {
    m.impl("grouped_linear_forward", TORCH_FN(grouped_linear_forward));
    m.impl("grouped_linear_backward_data", TORCH_FN(grouped_linear_backward_data));
    m.impl("grouped_linear_backward_weight", TORCH_FN(grouped_linear_backward_weight));
    m.impl("grouped_linear_backward_weight_accumulate", TORCH_FN(grouped_linear_backward_weight_accumulate));
}

}  // namespace

TORCH_LIBRARY_IMPL(moex, CPU, m) { register_kernels(m); }
TORCH_LIBRARY_IMPL(moex, CUDA, m) { register_kernels(m); }

}  // namespace moex_torch
