// kernels.cpp - the CPU and CUDA kernels of the moex:: operators: each checks its arguments as
// the Python operator of moex/torch/ does (ValueError naming the argument), allocates its
// outputs with torch, fills the moex argument struct with views of them and calls the C API on
// the tensors' backend (moex_torch.h's run: the device's context, torch's current stream, a
// workspace from torch's allocator). One function serves both dispatch keys: the tensors'
// device picks the backend.
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "moex_torch.h"

namespace moex_torch {
namespace {

// t (rows [T, ...]) with its rows at and past sum(splits) set to zero in place (moex_zero_tail,
// graph-safe, at the cost of those rows only), in the call that wrote it: every row-indexed
// output of an operator with splits goes through it, so no uninitialised row reaches autograd
// (as moex/torch/_operators.py's _zero_tail).
void zero_tail(Call& call, const at::Tensor& t, const at::Tensor& splits) {
    if (t.numel() == 0) return;
    moex_zero_tail_args a{};
    a.x = view(t);
    a.splits = view(splits);
    call.run(moex_zero_tail_workspace_size, moex_zero_tail, a);
}

// ---- grouped linear (docs/ops.md section 2) -------------------------------------------------

// y [T, N] (rows past sum(splits) zero) with the weight w [G, N, K] (packed or discrete), for
// checked arguments: the packed and the discrete forward operators share it.
at::Tensor run_linear_forward(const char* op, const at::Tensor& x, const moex_weight& w, const at::Tensor& splits,
                              const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& probs,
                              int64_t bias_mode, int64_t fp8_mode, int64_t fp8_dtypes, bool fp8_pow2_scales,
                              double fp8_amax_epsilon, const std::optional<at::Tensor>& fp8_weights) {
    at::Tensor y = at::empty({x.size(0), w.t.shape[1]}, x.options());
    moex_grouped_linear_args a{};
    a.x = view(x);
    a.w = w;
    a.bias_mode = static_cast<moex_bias_mode>(bias_mode);
    if (bias_mode != MOEX_BIAS_NONE) a.bias = view(bias);
    if (bias_mode == MOEX_BIAS_SCALED) a.probs = view(probs);
    a.splits = view(splits);
    a.y = view(y);
    a.fp8 = fp8_recipe(op, fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon);
    Call call(x.device());
    Fp8Kept kept;
    kept.attach(call, op, fp8_weights, {&a.w}, &a.fp8);
    call.run(moex_grouped_linear_forward_workspace_size, moex_grouped_linear_forward, a);
    zero_tail(call, y, splits);
    return y;
}

at::Tensor grouped_linear_forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& splits,
                                  const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& probs,
                                  int64_t bias_mode, int64_t fp8_mode, int64_t fp8_dtypes, bool fp8_pow2_scales,
                                  double fp8_amax_epsilon, const std::optional<at::Tensor>& fp8_weights) {
    const char* op = "grouped_linear_forward";
    check_group_inputs(op, x, "x", w, splits, "w");
    check_bias(op, bias_mode, bias, probs, x);
    return run_linear_forward(op, x, weight(w), splits, bias, probs, bias_mode, fp8_mode, fp8_dtypes, fp8_pow2_scales,
                              fp8_amax_epsilon, fp8_weights);
}

// dx [T, K] (rows past sum(splits) zero), dbias [G, N] (bias's dtype, f32 without one), dprobs
// [T] f32 (zeroed: moex adds to it); each with 0 rows when not needed.
// For checked arguments, w [G, N, K] packed or discrete: the packed and the discrete backward-data
// operators share it.
std::tuple<at::Tensor, at::Tensor, at::Tensor> run_linear_backward_data(
        const char* op, const at::Tensor& dy, const moex_weight& w, const at::Tensor& splits,
        const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& probs, int64_t bias_mode,
        bool need_dx, bool need_dbias, bool need_dprobs, int64_t fp8_mode, int64_t fp8_dtypes, bool fp8_pow2_scales,
        double fp8_amax_epsilon, const std::optional<at::Tensor>& fp8_weights) {
    const int64_t T = dy.size(0), G = w.t.shape[0], N = w.t.shape[1], K = w.t.shape[2];
    at::Tensor dx = at::empty({need_dx ? T : 0, K}, dy.options());
    at::Tensor dbias = at::empty({need_dbias ? G : 0, N}, dy.options().dtype(bias ? bias->scalar_type() : at::kFloat));
    at::Tensor dprobs = need_dprobs ? at::zeros({T}, dy.options().dtype(at::kFloat))
                                    : at::empty({0}, dy.options().dtype(at::kFloat));
    const bool scaled = bias_mode == MOEX_BIAS_SCALED;
    moex_grouped_linear_dgrad_args a{};
    a.dy = view(dy);
    a.w = w;
    a.bias_mode = static_cast<moex_bias_mode>(bias_mode);
    if (scaled && need_dprobs) a.bias = view(bias);
    if (scaled) a.probs = view(probs);
    a.splits = view(splits);
    if (need_dx) a.dx = view(dx);
    if (need_dbias) a.dbias = view(dbias);
    if (need_dprobs) a.dprobs = view(dprobs);
    a.fp8 = fp8_recipe(op, fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon);
    Call call(dy.device());
    Fp8Kept kept;
    kept.attach(call, op, fp8_weights, {&a.w}, &a.fp8);
    call.run(moex_grouped_linear_backward_data_workspace_size, moex_grouped_linear_backward_data, a);
    zero_tail(call, dx, splits);   // dprobs: zeros, += on the groups' rows only
    return {dx, dbias, dprobs};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> grouped_linear_backward_data(
        const at::Tensor& dy, const at::Tensor& w, const at::Tensor& splits, const std::optional<at::Tensor>& bias,
        const std::optional<at::Tensor>& probs, int64_t bias_mode, bool need_dx, bool need_dbias, bool need_dprobs,
        int64_t fp8_mode, int64_t fp8_dtypes, bool fp8_pow2_scales, double fp8_amax_epsilon,
        const std::optional<at::Tensor>& fp8_weights) {
    const char* op = "grouped_linear_backward_data";
    check_group_inputs(op, dy, "dy", w, splits, "w");
    check_bias(op, bias_mode, bias, probs, dy);
    return run_linear_backward_data(op, dy, weight(w), splits, bias, probs, bias_mode, need_dx, need_dbias,
                                    need_dprobs, fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon, fp8_weights);
}

// _linear.py's _check_wgrad: x [T, K] (a float dtype), dy [T, N] of x's dtype, splits int64 [G].
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

// dw [G, N, K] of the moex dtype code dw_dtype, written (fp8_weights: not read, the weight
// gradient reads no weight; here and in the accumulating form for the operators' one schema).
at::Tensor grouped_linear_backward_weight(const at::Tensor& x, const at::Tensor& dy, const at::Tensor& splits,
                                          int64_t dw_dtype, int64_t fp8_mode, int64_t fp8_dtypes, bool fp8_pow2_scales,
                                          double fp8_amax_epsilon, const std::optional<at::Tensor>& fp8_weights) {
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
                                               bool fp8_pow2_scales, double fp8_amax_epsilon, const std::optional<at::Tensor>& fp8_weights) {
    const char* op = "grouped_linear_backward_weight_accumulate";
    check_wgrad(op, x, dy, splits);
    static const at::ScalarType kF32 = at::kFloat;
    check(op, "main_grad", main_grad, x.device(), only(kF32), 3);
    run(x.device(), moex_grouped_linear_backward_weight_workspace_size, moex_grouped_linear_backward_weight,
        wgrad_args(op, x, dy, splits, MOEX_GRAD_ACCUMULATE, main_grad, fp8_mode, fp8_dtypes, fp8_pow2_scales,
                   fp8_amax_epsilon));
}

// ---- grouped linear on separate weights (GroupedLinear's weight0..: moex's discrete weights) ----
// The forward and backward-data kernels below open alike by design (check the rows, the discrete
// weight, the bias); the work after it is run_linear_forward's and run_linear_backward_data's.

// A moex_weight over G separate [N, K] weights, and what it needs kept alive during the call.
struct DiscreteWeight {
    moex_weight w{};
    at::Tensor stacked;   // the weights stacked (CUDA weights not all 16-byte aligned), else undefined
};

// ptrs_host's entries past the G addresses: the key of the kept maps (the weights' dtype code,
// N, K) and the bytes written (0: none).
constexpr int64_t kMapsKey = 4;

// Where the kept maps start in `ptrs` (int64 [G + ...] on the device): the first 128-byte
// boundary past the G addresses.
char* maps_start(const at::Tensor& ptrs, int64_t G) {
    const uintptr_t end = reinterpret_cast<uintptr_t>(ptrs.data_ptr()) + static_cast<uintptr_t>(G) * 8u;
    return reinterpret_cast<char*>((end + 127u) / 128u * 128u);
}

// Writes w's kept maps (moex_weight_maps_write) into ptrs past the addresses on torch's current
// stream; the bytes written: 0 where the device's GEMMs read none or ptrs has no room for them
// (the calls then write them into their workspace).
int64_t write_maps(const at::Tensor& ptrs, moex_weight w) {
    const int64_t G = w.t.shape[0];
    Call call(ptrs.device());
    size_t bytes = 0;
    call.check_status(moex_weight_maps_size(call.context(), &w, &bytes));
    char* start = maps_start(ptrs, G);
    const uintptr_t end = reinterpret_cast<uintptr_t>(ptrs.data_ptr()) + static_cast<uintptr_t>(ptrs.numel()) * 8u;
    if (bytes == 0 || reinterpret_cast<uintptr_t>(start) + bytes > end) return 0;
    const moex_weight_maps_write_args a{w, start, bytes};
    call.run(moex_weight_maps_write_workspace_size, moex_weight_maps_write, a);
    return static_cast<int64_t>(bytes);
}

// The moex_weight of G separate [N, K] weights through `ptrs`, int64 on their device: the
// weights' G addresses, then room for their kept maps (moex_weight_maps_write: weight_maps_size
// bytes from the first 128-byte boundary past the addresses); `ptrs_host`, int64 [G + kMapsKey]
// on the CPU, is the copy the host reads (on the CPU ptrs is ptrs_host). The caller keeps both
// (moex/torch/_linear_layer.py's _WeightPointers) and this function keeps them current, a
// cache: when the weights' addresses, dtype or shape differ from ptrs_host's (the first call,
// or a weight changed storage), the addresses are copied to the device and the maps written
// again, so not during CUDA graph capture (ValueError); calls with the same weights, captured
// or replayed, use the cache as it is. On CUDA, weights not all 16-byte aligned (TMA's need)
// are stacked and passed packed. Checks that the weights are G contiguous tensors of rows'
// dtype, one shape, on rows' device (ValueError naming weights[g]).
DiscreteWeight discrete_weight(const char* op, const at::Tensor& rows, const at::TensorList& weights,
                               const at::Tensor& ptrs, const at::Tensor& ptrs_host, const at::Tensor& splits) {
    TORCH_CHECK_VALUE(!weights.empty(), "moex.", op, ": weights is empty");
    const int64_t G = static_cast<int64_t>(weights.size());
    static const at::ScalarType kLong = at::kLong;
    check(op, "ptrs", ptrs, rows.device(), only(kLong), 1);
    check(op, "ptrs_host", ptrs_host, at::Device(at::kCPU), only(kLong), 1);
    check(op, "splits", splits, rows.device(), only(kLong), 1);
    TORCH_CHECK_VALUE(ptrs.size(0) >= G && ptrs_host.size(0) == G + kMapsKey && splits.size(0) == G, "moex.", op,
                      ": ", G, " weights, ptrs has ", ptrs.size(0), " entries (at least G), ptrs_host ",
                      ptrs_host.size(0), " (G + ", kMapsKey, ") and splits ", splits.size(0), " groups");
    const at::ScalarType rows_type = rows.scalar_type();
    const at::Tensor& w0 = weights[0];
    int64_t* host = ptrs_host.data_ptr<int64_t>();
    bool aligned = true;
    const int64_t key[3] = {dtype_code(rows_type), w0.dim() == 2 ? w0.size(0) : -1, w0.dim() == 2 ? w0.size(1) : -1};
    bool stale = host[G] != key[0] || host[G + 1] != key[1] || host[G + 2] != key[2];
    for (int64_t g = 0; g < G; ++g) {
        const at::Tensor& w = weights[g];
        if (!(w.device() == rows.device() && w.scalar_type() == rows_type && w.dim() == 2 && w.is_contiguous() &&
              w.sizes() == w0.sizes())) {   // (the common case passes without building the name)
            const std::string name = "weights[" + std::to_string(g) + "]";
            check(op, name.c_str(), w, rows.device(), only(rows_type), 2);
            TORCH_CHECK_VALUE(w.sizes() == w0.sizes(), "moex.", op, ": ", name, " is ", w.sizes(), ", weights[0] ",
                              w0.sizes(), " (the weights must have one shape)");
        }
        const int64_t address = reinterpret_cast<int64_t>(w.data_ptr());
        stale = stale || host[g] != address;
        aligned = aligned && address % 16 == 0;
    }
    DiscreteWeight d;
    d.w.t.dtype = dtype_code(rows_type);
    d.w.t.ndim = 3;
    d.w.t.shape[0] = G;
    d.w.t.shape[1] = w0.size(0);
    d.w.t.shape[2] = w0.size(1);
    if (rows.is_cuda() && !aligned) {
        d.stacked = at::stack(weights);
        d.w.t.data = d.stacked.data_ptr();
        return d;
    }
    d.w.ptrs = reinterpret_cast<void* const*>(ptrs.data_ptr());
    if (stale) {
        TORCH_CHECK_VALUE(!capturing(rows), "moex.", op, ": the weights' addresses changed during CUDA graph "
                          "capture; run the layer once outside capture after its weights change storage");
        for (int64_t g = 0; g < G; ++g) host[g] = reinterpret_cast<int64_t>(weights[g].data_ptr());
        host[G] = key[0], host[G + 1] = key[1], host[G + 2] = key[2], host[G + 3] = 0;
        if (!ptrs.is_same(ptrs_host)) {   // (a cache: autograd's version of ptrs stays)
            ptrs.variable_data().narrow(0, 0, G).copy_(ptrs_host.narrow(0, 0, G));
            host[G + 3] = write_maps(ptrs, d.w);
        }
    }
    if (host[G + 3] > 0) d.w.maps = maps_start(ptrs, G);
    return d;
}

// The bytes of the kept maps of G matrices like `weight` on its device (moex_weight_maps_size;
// 0 where its GEMMs read none): _WeightPointers sizes ptrs with it.
int64_t weight_maps_size(const at::Tensor& weight, int64_t groups) {
    const char* op = "weight_maps_size";
    check(op, "weight", weight, weight.device(), kFloats, 2);
    TORCH_CHECK_VALUE(groups >= 1, "moex.", op, ": groups is ", groups, ", must be >= 1");
    moex_weight w{};
    w.t.dtype = dtype_code(weight.scalar_type());
    w.t.ndim = 3;
    w.t.shape[0] = groups;
    w.t.shape[1] = weight.size(0);
    w.t.shape[2] = weight.size(1);
    Call call(weight.device());
    size_t bytes = 0;
    call.check_status(moex_weight_maps_size(call.context(), &w, &bytes));
    return static_cast<int64_t>(bytes);
}

// y [T, N] = grouped_linear_forward with the weights `weights` (ptrs, ptrs_host: discrete_weight).
at::Tensor grouped_linear_discrete_forward(const at::Tensor& x, at::TensorList weights, const at::Tensor& ptrs,
                                           const at::Tensor& ptrs_host, const at::Tensor& splits,
                                           const std::optional<at::Tensor>& bias,
                                           const std::optional<at::Tensor>& probs, int64_t bias_mode,
                                           int64_t fp8_mode, int64_t fp8_dtypes, bool fp8_pow2_scales,
                                           double fp8_amax_epsilon, const std::optional<at::Tensor>& fp8_weights) {
    const char* op = "grouped_linear_discrete_forward";
    check(op, "x", x, x.device(), kFloats, 2);
    const DiscreteWeight d = discrete_weight(op, x, weights, ptrs, ptrs_host, splits);
    check_bias(op, bias_mode, bias, probs, x);
    return run_linear_forward(op, x, d.w, splits, bias, probs, bias_mode, fp8_mode, fp8_dtypes, fp8_pow2_scales,
                              fp8_amax_epsilon, fp8_weights);
}

// (dx, dbias, dprobs) = grouped_linear_backward_data with the weights `weights`.
std::tuple<at::Tensor, at::Tensor, at::Tensor> grouped_linear_discrete_backward_data(
        const at::Tensor& dy, at::TensorList weights, const at::Tensor& ptrs, const at::Tensor& ptrs_host,
        const at::Tensor& splits, const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& probs,
        int64_t bias_mode, bool need_dx, bool need_dbias, bool need_dprobs, int64_t fp8_mode, int64_t fp8_dtypes,
        bool fp8_pow2_scales, double fp8_amax_epsilon, const std::optional<at::Tensor>& fp8_weights) {
    const char* op = "grouped_linear_discrete_backward_data";
    check(op, "dy", dy, dy.device(), kFloats, 2);
    const DiscreteWeight d = discrete_weight(op, dy, weights, ptrs, ptrs_host, splits);
    check_bias(op, bias_mode, bias, probs, dy);
    return run_linear_backward_data(op, dy, d.w, splits, bias, probs, bias_mode, need_dx, need_dbias, need_dprobs,
                                    fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon, fp8_weights);
}

// ---- grouped MLP (docs/ops.md section 4) ------------------------------------------------------

// _mlp.py's _check_mlp: x [T, H], w1 [G, 2F, H], w2 [G, H, F] of x's dtype, splits int64 [G],
// probs [T] f32 (optional; needed by SCALED), b1 [G, 2F] and b2 [G, H] of x's dtype or f32 (b1
// optional, b2 with ADD / SCALED only).
void check_mlp(const char* op, const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2,
               const at::Tensor& splits, const std::optional<at::Tensor>& probs, const std::optional<at::Tensor>& b1,
               const std::optional<at::Tensor>& b2, int64_t b2_mode) {
    check_group_inputs(op, x, "x", w1, splits, "w1");
    const at::ScalarType x_type = x.scalar_type();
    check(op, "w2", w2, x.device(), only(x_type), 3);
    static const at::ScalarType kF32 = at::kFloat;
    check(op, "probs", probs, x.device(), only(kF32), 1, true);
    const at::ScalarType bias_types[] = {x_type, at::kFloat};
    check(op, "b1", b1, x.device(), Dtypes{bias_types, 2}, 2, true);
    check_bias_mode(op, "b2_mode", b2_mode, b2, "b2");
    check(op, "b2", b2, x.device(), Dtypes{bias_types, 2}, 2, b2_mode == MOEX_BIAS_NONE);
    TORCH_CHECK_VALUE(!(b2_mode == MOEX_BIAS_SCALED && !probs.has_value()), "moex.", op,
                      ": b2_mode SCALED needs probs");
}

// The inputs the grouped MLP's forward and backward args share (A: moex_grouped_mlp_args or
// moex_grouped_mlp_grad_args): x, the weights, b2 and its mode, probs, splits and h.
template <class A>
void mlp_inputs(A& a, const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2,
                const std::optional<at::Tensor>& b2, int64_t b2_mode, const std::optional<at::Tensor>& probs,
                const at::Tensor& splits, const at::Tensor& h) {
    a.x = view(x);
    a.w1 = weight(w1);
    a.w2 = weight(w2);
    a.b2_mode = static_cast<moex_bias_mode>(b2_mode);
    if (b2_mode != MOEX_BIAS_NONE) a.b2 = view(b2);
    a.probs = view(probs);
    a.splits = view(splits);
    a.h = view(h);
}

// y [T, H] (rows past sum(splits) zero), h [T, 2F] (kept for the backward), z [T, F] (0 rows
// without save_z: the backward recomputes it from h).
std::tuple<at::Tensor, at::Tensor, at::Tensor> grouped_mlp_forward(
        const at::Tensor& x, const at::Tensor& w1, const std::optional<at::Tensor>& b1, const at::Tensor& w2,
        const std::optional<at::Tensor>& b2, const std::optional<at::Tensor>& probs, const at::Tensor& splits,
        int64_t b2_mode, int64_t glu_kind, int64_t glu_layout, double glu_limit, double glu_alpha, double glu_offset,
        bool save_z, int64_t fp8_mode, int64_t fp8_dtypes, bool fp8_pow2_scales, double fp8_amax_epsilon,
        const std::optional<at::Tensor>& fp8_weights) {
    const char* op = "grouped_mlp_forward";
    check_mlp(op, x, w1, w2, splits, probs, b1, b2, b2_mode);
    const int64_t T = x.size(0), H = x.size(1), F2 = w1.size(1);
    at::Tensor y = at::empty({T, H}, x.options());
    at::Tensor h = at::empty({T, F2}, x.options());
    at::Tensor z = at::empty({save_z ? T : 0, F2 / 2}, x.options());
    moex_grouped_mlp_args a{};
    mlp_inputs(a, x, w1, w2, b2, b2_mode, probs, splits, h);
    a.b1 = view(b1);
    a.glu = glu_params(op, glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset);
    if (save_z) a.z = view(z);
    a.y = view(y);
    a.fp8 = fp8_recipe(op, fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon);
    Call call(x.device());
    Fp8Kept kept;
    kept.attach(call, op, fp8_weights, {&a.w1, &a.w2}, &a.fp8);
    call.run(moex_grouped_mlp_forward_workspace_size, moex_grouped_mlp_forward, a);
    zero_tail(call, y, splits);
    return {y, h, z};
}

// needs: (dx, dw1, dw2, db1, db2, dprobs); the outputs in that order, 0 rows when not needed (db1,
// db2 in b1's, b2's dtype, f32 without; dprobs f32). h is consumed: dh is written over it
// (MOEX_H_OVERWRITE) and its version counter moves, so that a second backward through the same
// graph fails in autograd's check instead of reading dh as h.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> grouped_mlp_backward(
        const at::Tensor& x, const at::Tensor& w1, const std::optional<at::Tensor>& b1, const at::Tensor& w2,
        const std::optional<at::Tensor>& b2, const std::optional<at::Tensor>& probs, const at::Tensor& splits,
        const at::Tensor& h, const at::Tensor& z, const at::Tensor& dy, int64_t b2_mode, int64_t glu_kind,
        int64_t glu_layout, double glu_limit, double glu_alpha, double glu_offset, const c10::List<bool>& needs,
        int64_t fp8_mode, int64_t fp8_dtypes, bool fp8_pow2_scales, double fp8_amax_epsilon,
        const std::optional<at::Tensor>& fp8_weights) {
    const char* op = "grouped_mlp_backward";
    check_mlp(op, x, w1, w2, splits, probs, b1, b2, b2_mode);
    const at::ScalarType x_type = x.scalar_type();
    check(op, "dy", dy, x.device(), only(x_type), 2);
    check(op, "h", h, x.device(), only(x_type), 2);
    check(op, "z", z, x.device(), only(x_type), 2);
    TORCH_CHECK_VALUE(needs.size() == 6, "moex.", op, ": needs has ", needs.size(),
                      " entries, must have 6 (dx, dw1, dw2, db1, db2, dprobs)");
    const int64_t T = x.size(0), H = x.size(1), G = w1.size(0), F2 = w1.size(1);
    const auto out = [&](bool need, std::initializer_list<int64_t> shape, at::ScalarType type) {
        std::vector<int64_t> s(shape);
        if (!need) s[0] = 0;
        return at::empty(s, x.options().dtype(type));
    };
    bool need[6];
    for (int i = 0; i < 6; ++i) need[i] = needs.get(i);
    at::Tensor dx = out(need[0], {T, H}, x_type);
    at::Tensor dw1 = out(need[1], {G, F2, H}, w1.scalar_type());
    at::Tensor dw2 = out(need[2], {G, H, F2 / 2}, w2.scalar_type());
    at::Tensor db1 = out(need[3], {G, F2}, b1 ? b1->scalar_type() : at::kFloat);
    at::Tensor db2 = out(need[4], {G, H}, b2 ? b2->scalar_type() : at::kFloat);
    at::Tensor dprobs = need[5] ? at::zeros({T}, x.options().dtype(at::kFloat))   // moex adds to it
                                 : at::empty({0}, x.options().dtype(at::kFloat));
    moex_grouped_mlp_grad_args a{};
    mlp_inputs(a, x, w1, w2, b2, b2_mode, probs, splits, h);
    a.glu = glu_params(op, glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset);
    if (z.size(0) != 0) a.z = view(z);   // else recomputed from h
    a.dy = view(dy);
    a.dw_mode = MOEX_GRAD_WRITE;
    if (need[0]) a.dx = view(dx);
    if (need[1]) a.dw1 = weight(dw1);
    if (need[2]) a.dw2 = weight(dw2);
    if (need[3]) a.db1 = view(db1);
    if (need[4]) a.db2 = view(db2);
    if (need[5]) a.dprobs = view(dprobs);
    a.h_mode = MOEX_H_OVERWRITE;
    a.fp8 = fp8_recipe(op, fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon);
    Call call(x.device());
    Fp8Kept kept;
    kept.attach(call, op, fp8_weights, {&a.w1, &a.w2}, &a.fp8);
    call.run(moex_grouped_mlp_backward_workspace_size, moex_grouped_mlp_backward, a);
    if (!h.is_inference()) h.unsafeGetTensorImpl()->bump_version();
    zero_tail(call, dx, splits);   // dprobs: zeros, += on the groups' rows only
    return {dx, dw1, dw2, db1, db2, dprobs};
}

// ---- MoE layer (docs/ops.md section 8) ----------------------------------------------------------

// _moe.py's _check_moe: x [T, H] (a float dtype), router_w [E, H], w1 [E, 2F, H], w2 [E, H, F] of
// x's dtype, b1 [E, 2F] (optional) and b2 [E, H] (ADD / SCALED) of x's dtype or f32, 1 <= topk <= E.
void check_moe(const char* op, const at::Tensor& x, const at::Tensor& router_w, const at::Tensor& w1,
               const std::optional<at::Tensor>& b1, const at::Tensor& w2, const std::optional<at::Tensor>& b2,
               int64_t topk, int64_t b2_mode) {
    check(op, "x", x, x.device(), kFloats, 2);
    const at::ScalarType x_type = x.scalar_type();
    check(op, "router_w", router_w, x.device(), only(x_type), 2);
    check(op, "w1", w1, x.device(), only(x_type), 3);
    check(op, "w2", w2, x.device(), only(x_type), 3);
    const at::ScalarType bias_types[] = {x_type, at::kFloat};
    check(op, "b1", b1, x.device(), Dtypes{bias_types, 2}, 2, true);
    check_bias_mode(op, "b2_mode", b2_mode, b2, "b2");
    check(op, "b2", b2, x.device(), Dtypes{bias_types, 2}, 2, b2_mode == MOEX_BIAS_NONE);
    TORCH_CHECK_VALUE(topk >= 1 && topk <= w1.size(0), "moex.", op, ": topk = ", topk, ", must be 1..", w1.size(0),
                      " (the experts)");
}

// The forward's arguments (saved and y left absent).
moex_moe_layer_args moe_args(const char* op, const at::Tensor& x, const at::Tensor& router_w, const at::Tensor& w1,
                             const std::optional<at::Tensor>& b1, const at::Tensor& w2,
                             const std::optional<at::Tensor>& b2, int64_t topk, int64_t score, int64_t norm,
                             int64_t b2_mode, int64_t glu_kind, int64_t glu_layout, double glu_limit, double glu_alpha,
                             double glu_offset, int64_t fp8_mode, int64_t fp8_dtypes, bool fp8_pow2_scales,
                             double fp8_amax_epsilon) {
    moex_moe_layer_args a{};
    a.x = view(x);
    a.router_w = view(router_w);
    a.topk = int_arg(op, "topk", topk);
    a.score = static_cast<moex_router_score>(int_arg(op, "score", score));
    a.norm = static_cast<moex_router_norm>(int_arg(op, "norm", norm));
    a.w1 = weight(w1);
    a.b1 = view(b1);
    a.w2 = weight(w2);
    a.b2_mode = static_cast<moex_bias_mode>(b2_mode);
    if (b2_mode != MOEX_BIAS_NONE) a.b2 = view(b2);
    a.glu = glu_params(op, glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset);
    a.fp8 = fp8_recipe(op, fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon);
    return a;
}

// (y [T, H], saved: uint8 [moex_moe_layer_saved_size], what the backward needs).
std::tuple<at::Tensor, at::Tensor> moe_layer_forward(
        const at::Tensor& x, const at::Tensor& router_w, const at::Tensor& w1, const std::optional<at::Tensor>& b1,
        const at::Tensor& w2, const std::optional<at::Tensor>& b2, int64_t topk, int64_t score, int64_t norm,
        int64_t b2_mode, int64_t glu_kind, int64_t glu_layout, double glu_limit, double glu_alpha, double glu_offset,
        int64_t fp8_mode, int64_t fp8_dtypes, bool fp8_pow2_scales, double fp8_amax_epsilon,
        const std::optional<at::Tensor>& fp8_weights) {
    const char* op = "moe_layer_forward";
    check_moe(op, x, router_w, w1, b1, w2, b2, topk, b2_mode);
    moex_moe_layer_args a = moe_args(op, x, router_w, w1, b1, w2, b2, topk, score, norm, b2_mode, glu_kind, glu_layout,
                                     glu_limit, glu_alpha, glu_offset, fp8_mode, fp8_dtypes, fp8_pow2_scales,
                                     fp8_amax_epsilon);
    at::Tensor y = at::empty(x.sizes(), x.options());
    a.y = view(y);
    Call call(x.device());
    Fp8Kept kept;
    kept.attach(call, op, fp8_weights, {&a.w1, &a.w2}, &a.fp8);
    size_t saved_bytes = 0;
    call.check_status(moex_moe_layer_saved_size(call.context(), &a, &saved_bytes));
    at::Tensor saved = at::empty({static_cast<int64_t>(saved_bytes)}, x.options().dtype(at::kByte));
    a.saved = saved_bytes ? saved.data_ptr() : nullptr;
    a.saved_bytes = saved_bytes;
    call.run(moex_moe_layer_forward_workspace_size, moex_moe_layer_forward, a);
    return {y, saved};
}

// needs: (dx, drouter_w, dw1, dw2, db1, db2); the outputs in that order, 0 rows when not needed
// (db1, db2 in b1's, b2's dtype, f32 without).
std::vector<at::Tensor> moe_layer_backward(
        const at::Tensor& x, const at::Tensor& router_w, const at::Tensor& w1, const std::optional<at::Tensor>& b1,
        const at::Tensor& w2, const std::optional<at::Tensor>& b2, const at::Tensor& saved, const at::Tensor& dy,
        int64_t topk, int64_t score, int64_t norm, int64_t b2_mode, int64_t glu_kind, int64_t glu_layout,
        double glu_limit, double glu_alpha, double glu_offset, const c10::List<bool>& needs, int64_t fp8_mode,
        int64_t fp8_dtypes, bool fp8_pow2_scales, double fp8_amax_epsilon, const std::optional<at::Tensor>& fp8_weights) {
    const char* op = "moe_layer_backward";
    check_moe(op, x, router_w, w1, b1, w2, b2, topk, b2_mode);
    const at::ScalarType x_type = x.scalar_type();
    check(op, "dy", dy, x.device(), only(x_type), 2);
    static const at::ScalarType kByte = at::kByte;
    check(op, "saved", saved, x.device(), only(kByte), 1);
    TORCH_CHECK_VALUE(needs.size() == 6, "moex.", op, ": needs has ", needs.size(), " entries, must have 6");
    bool need[6];
    for (int i = 0; i < 6; ++i) need[i] = needs.get(i);
    const int64_t T = x.size(0), H = x.size(1), E = w1.size(0), F2 = w1.size(1);
    const auto out = [&](bool n, std::initializer_list<int64_t> shape, at::ScalarType type) {
        std::vector<int64_t> s(shape);
        if (!n) s[0] = 0;
        return at::empty(s, x.options().dtype(type));
    };
    std::vector<at::Tensor> outs = {out(need[0], {T, H}, x_type), out(need[1], {E, H}, router_w.scalar_type()),
                                    out(need[2], {E, F2, H}, w1.scalar_type()),
                                    out(need[3], {E, H, F2 / 2}, w2.scalar_type()),
                                    out(need[4], {E, F2}, b1 ? b1->scalar_type() : at::kFloat),
                                    out(need[5], {E, H}, b2 ? b2->scalar_type() : at::kFloat)};
    moex_moe_layer_grad_args a{};
    a.fwd = moe_args(op, x, router_w, w1, b1, w2, b2, topk, score, norm, b2_mode, glu_kind, glu_layout, glu_limit,
                     glu_alpha, glu_offset, fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon);
    a.fwd.saved = saved.numel() ? saved.data_ptr() : nullptr;
    a.fwd.saved_bytes = static_cast<size_t>(saved.numel());
    a.dy = view(dy);
    a.dw_mode = MOEX_GRAD_WRITE;
    if (need[0]) a.dx = view(outs[0]);
    if (need[1]) a.drouter_w = view(outs[1]);
    if (need[2]) a.dw1 = weight(outs[2]);
    if (need[3]) a.dw2 = weight(outs[3]);
    if (need[4]) a.db1 = view(outs[4]);
    if (need[5]) a.db2 = view(outs[5]);
    Call call(x.device());
    Fp8Kept kept;
    kept.attach(call, op, fp8_weights, {&a.fwd.w1, &a.fwd.w2}, &a.fwd.fp8);
    call.run(moex_moe_layer_backward_workspace_size, moex_moe_layer_backward, a);
    return outs;
}

// ---- scaled GLU (docs/ops.md section 3) ----------------------------------------------------------

// _glu.py's _check_glu: h [T, 2F] (a float dtype), probs [T] f32 and splits int64 [G], both optional.
void check_glu(const char* op, const at::Tensor& h, const std::optional<at::Tensor>& probs,
               const std::optional<at::Tensor>& splits) {
    check(op, "h", h, h.device(), kFloats, 2);
    static const at::ScalarType kF32 = at::kFloat, kLong = at::kLong;
    check(op, "probs", probs, h.device(), only(kF32), 1, true);
    check(op, "splits", splits, h.device(), only(kLong), 1, true);
}

// The fields the scaled GLU's forward and backward args share (A: moex_scaled_glu_args or
// moex_scaled_glu_grad_args): the GLU's parameters, h, probs and splits.
template <class A>
void glu_inputs(A& a, const char* op, const at::Tensor& h, const std::optional<at::Tensor>& probs,
                const std::optional<at::Tensor>& splits, int64_t glu_kind, int64_t glu_layout, double glu_limit,
                double glu_alpha, double glu_offset) {
    a.glu = glu_params(op, glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset);
    a.h = view(h);
    a.probs = view(probs);
    a.splits = view(splits);
}

// z [T, F] = p * glu(h); with splits, rows past sum(splits) zero.
at::Tensor scaled_glu_forward(const at::Tensor& h, const std::optional<at::Tensor>& probs,
                              const std::optional<at::Tensor>& splits, int64_t glu_kind, int64_t glu_layout,
                              double glu_limit, double glu_alpha, double glu_offset) {
    const char* op = "scaled_glu_forward";
    check_glu(op, h, probs, splits);
    at::Tensor z = at::empty({h.size(0), h.size(1) / 2}, h.options());
    moex_scaled_glu_args a{};
    glu_inputs(a, op, h, probs, splits, glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset);
    a.z = view(z);
    Call call(h.device());
    call.run(moex_scaled_glu_forward_workspace_size, moex_scaled_glu_forward, a);
    if (splits) zero_tail(call, z, *splits);
    return z;
}

// (dh [T, 2F] (with splits, rows past sum(splits) zero), dprobs [T] f32, 0 rows unless need_dprobs).
std::tuple<at::Tensor, at::Tensor> scaled_glu_backward(const at::Tensor& h, const std::optional<at::Tensor>& probs,
                                                       const std::optional<at::Tensor>& splits, const at::Tensor& dz,
                                                       int64_t glu_kind, int64_t glu_layout, double glu_limit,
                                                       double glu_alpha, double glu_offset, bool need_dprobs) {
    const char* op = "scaled_glu_backward";
    check_glu(op, h, probs, splits);
    const at::ScalarType h_type = h.scalar_type();
    check(op, "dz", dz, h.device(), only(h_type), 2);
    at::Tensor dh = at::empty(h.sizes(), h.options());
    at::Tensor dprobs = at::zeros({need_dprobs ? h.size(0) : 0}, h.options().dtype(at::kFloat));   // moex adds to it
    moex_scaled_glu_grad_args a{};
    glu_inputs(a, op, h, probs, splits, glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset);
    a.dz = view(dz);
    a.dh = view(dh);
    if (need_dprobs) a.dprobs = view(dprobs);
    Call call(h.device());
    call.run(moex_scaled_glu_backward_workspace_size, moex_scaled_glu_backward, a);
    if (splits) zero_tail(call, dh, *splits);
    return {dh, dprobs};
}

// ---- splits_to_offsets (docs/ops.md section 1) ------------------------------------------------------

// stride * the running sums of splits: [G+1] with a leading zero, else the G inclusive sums, of
// the moex dtype code dtype_code (int64 or int32).
at::Tensor splits_to_offsets(const at::Tensor& splits, int64_t stride, bool leading_zero, int64_t dtype_code) {
    const char* op = "splits_to_offsets";
    static const at::ScalarType kLong = at::kLong;
    check(op, "splits", splits, splits.device(), only(kLong), 1);
    TORCH_CHECK_VALUE(dtype_code == MOEX_DTYPE_I64 || dtype_code == MOEX_DTYPE_I32, "moex.", op, ": dtype_code ",
                      dtype_code, " is not int64's or int32's");
    at::Tensor out = at::empty({splits.size(0) + (leading_zero ? 1 : 0)},
                               splits.options().dtype(scalar_type(op, "dtype_code", dtype_code)));
    moex_splits_to_offsets_args a{};
    a.splits = view(splits);
    a.num_outputs = 1;
    a.outputs[0].out = view(out);
    a.outputs[0].stride = stride;
    a.outputs[0].start = leading_zero ? MOEX_OFFSETS_LEADING_ZERO : MOEX_OFFSETS_INCLUSIVE;
    run(splits.device(), moex_splits_to_offsets_workspace_size, moex_splits_to_offsets, a);
    return out;
}

// ---- routing (docs/ops.md sections 5-7) --------------------------------------------------------------

// _routing.py's _check_router: logits [T, E] f32 or bf16, 1 <= topk <= E, score 0 or 1, norm 0 or 1.
void check_router(const char* op, const at::Tensor& logits, int64_t topk, int64_t score, int64_t norm) {
    static const at::ScalarType kLogits[] = {at::kFloat, at::kBFloat16};
    check(op, "logits", logits, logits.device(), Dtypes{kLogits, 2}, 2);
    TORCH_CHECK_VALUE(topk >= 1 && topk <= logits.size(1), "moex.", op, ": topk = ", topk, ", must be 1..",
                      logits.size(1), " (the experts, logits' columns)");
    TORCH_CHECK_VALUE((score == 0 || score == 1) && (norm == 0 || norm == 1), "moex.", op, ": score ", score,
                      " must be one of [0, 1], norm ", norm, " 0 or 1");
}

// _routing.py's _check_k: k >= 1 divides the rows (T*k permuted rows).
void check_k(const char* op, int64_t k, int64_t rows, const char* rows_name) {
    TORCH_CHECK_VALUE(k >= 1 && rows % k == 0, "moex.", op, ": k = ", k, " must be >= 1 and divide the ", rows,
                      " rows of ", rows_name);
}

// The permutation's row_map: int32, one-dimensional, on the operator's device.
void check_row_map(const char* op, const at::Tensor& row_map, const c10::Device& device) {
    static const at::ScalarType kInt = at::kInt;
    check(op, "row_map", row_map, device, only(kInt), 1);
}

// The fields the router's forward and backward args share (A: moex_router_args or
// moex_router_grad_args): the logits and the options.
template <class A>
void router_options(A& a, const char* op, const at::Tensor& logits, int64_t topk, int64_t score, int64_t norm) {
    a.logits = view(logits);
    a.topk = int_arg(op, "topk", topk);
    a.score = static_cast<moex_router_score>(score);
    a.norm = static_cast<moex_router_norm>(norm);
}

// (probs [T, k] f32, ids [T, k] int32) of the k best experts per token.
std::tuple<at::Tensor, at::Tensor> router_forward(const at::Tensor& logits, int64_t topk, int64_t score, int64_t norm) {
    const char* op = "router_forward";
    check_router(op, logits, topk, score, norm);
    at::Tensor probs = at::empty({logits.size(0), topk}, logits.options().dtype(at::kFloat));
    at::Tensor ids = at::empty({logits.size(0), topk}, logits.options().dtype(at::kInt));
    moex_router_args a{};
    router_options(a, op, logits, topk, score, norm);
    a.probs = view(probs);
    a.ids = view(ids);
    run(logits.device(), moex_router_forward_workspace_size, moex_router_forward, a);
    return {probs, ids};
}

// dlogits [T, E] (logits' dtype) of dprobs [T, k].
at::Tensor router_backward(const at::Tensor& logits, const at::Tensor& ids, const at::Tensor& dprobs, int64_t topk,
                           int64_t score, int64_t norm) {
    const char* op = "router_backward";
    check_router(op, logits, topk, score, norm);
    static const at::ScalarType kInt = at::kInt, kF32 = at::kFloat;
    check(op, "ids", ids, logits.device(), only(kInt), 2);
    check(op, "dprobs", dprobs, logits.device(), only(kF32), 2);
    at::Tensor dlogits = at::empty(logits.sizes(), logits.options());
    moex_router_grad_args a{};
    router_options(a, op, logits, topk, score, norm);
    a.ids = view(ids);
    a.dprobs = view(dprobs);
    a.dlogits = view(dlogits);
    run(logits.device(), moex_router_backward_workspace_size, moex_router_backward, a);
    return dlogits;
}

// (xp [T*k, H], probs_p [T*k] f32, splits [E] int64, row_map [T*k] int32): the (token, expert)
// rows sorted by expert.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> permute_forward(const at::Tensor& x, const at::Tensor& ids,
                                                                           const at::Tensor& probs,
                                                                           int64_t num_experts) {
    const char* op = "permute_forward";
    check(op, "x", x, x.device(), kFloats, 2);
    static const at::ScalarType kInt = at::kInt, kF32 = at::kFloat;
    check(op, "ids", ids, x.device(), only(kInt), 2);
    check(op, "probs", probs, x.device(), only(kF32), 2);
    TORCH_CHECK_VALUE(num_experts >= 1, "moex.", op, ": num_experts = ", num_experts, ", must be >= 1");
    TORCH_CHECK_VALUE(ids.size(0) == x.size(0) && probs.sizes() == ids.sizes(), "moex.", op, ": x ", shape_tuple(x),
                      ", ids ", shape_tuple(ids), " and probs ", shape_tuple(probs), " must be [T, H], [T, k], [T, k]");
    const int64_t rows = ids.size(0) * ids.size(1);
    at::Tensor xp = at::empty({rows, x.size(1)}, x.options());
    at::Tensor probs_p = at::empty({rows}, x.options().dtype(at::kFloat));
    at::Tensor splits = at::empty({num_experts}, x.options().dtype(at::kLong));
    at::Tensor row_map = at::empty({rows}, x.options().dtype(at::kInt));
    moex_permute_args a{};
    a.x = view(x);
    a.ids = view(ids);
    a.probs = view(probs);
    a.num_experts = int_arg(op, "num_experts", num_experts);
    a.xp = view(xp);
    a.probs_p = view(probs_p);
    a.splits = view(splits);
    a.row_map = view(row_map);
    run(x.device(), moex_permute_forward_workspace_size, moex_permute_forward, a);
    return {xp, probs_p, splits, row_map};
}

// (dx [T, H], dprobs [T, k] f32) of dxp [T*k, H] and dprobs_p [T*k].
std::tuple<at::Tensor, at::Tensor> permute_backward(const at::Tensor& row_map, const at::Tensor& dxp,
                                                    const at::Tensor& dprobs_p, int64_t k) {
    const char* op = "permute_backward";
    check(op, "dxp", dxp, dxp.device(), kFloats, 2);
    static const at::ScalarType kF32 = at::kFloat;
    check_row_map(op, row_map, dxp.device());
    check(op, "dprobs_p", dprobs_p, dxp.device(), only(kF32), 1);
    check_k(op, k, dxp.size(0), "dxp");
    const int64_t T = dxp.size(0) / k;
    at::Tensor dx = at::empty({T, dxp.size(1)}, dxp.options());
    at::Tensor dprobs = at::empty({T, k}, dxp.options().dtype(at::kFloat));
    moex_permute_grad_args a{};
    a.row_map = view(row_map);
    a.dxp = view(dxp);
    a.dprobs_p = view(dprobs_p);
    a.dx = view(dx);
    a.dprobs = view(dprobs);
    run(dxp.device(), moex_permute_backward_workspace_size, moex_permute_backward, a);
    return {dx, dprobs};
}

// y [T, H]: y[t] = sum_j yp[row_map[t*k + j]]. Alike in shape with unpermute_backward below by
// design: one kernel per operator, each filling its own argument struct (no field in common but row_map).
at::Tensor unpermute_forward(const at::Tensor& yp, const at::Tensor& row_map, int64_t k) {
    const char* op = "unpermute_forward";
    check(op, "yp", yp, yp.device(), kFloats, 2);
    check_row_map(op, row_map, yp.device());
    check_k(op, k, yp.size(0), "yp");
    at::Tensor y = at::empty({yp.size(0) / k, yp.size(1)}, yp.options());
    moex_unpermute_args a{};
    a.row_map = view(row_map);
    a.yp = view(yp);
    a.y = view(y);
    run(yp.device(), moex_unpermute_forward_workspace_size, moex_unpermute_forward, a);
    return y;
}

// dyp [T*k, H] of dy [T, H].
at::Tensor unpermute_backward(const at::Tensor& dy, const at::Tensor& row_map) {
    const char* op = "unpermute_backward";
    check(op, "dy", dy, dy.device(), kFloats, 2);
    check_row_map(op, row_map, dy.device());
    at::Tensor dyp = at::empty({row_map.size(0), dy.size(1)}, dy.options());
    moex_unpermute_grad_args a{};
    a.row_map = view(row_map);
    a.dy = view(dy);
    a.dyp = view(dyp);
    run(dy.device(), moex_unpermute_backward_workspace_size, moex_unpermute_backward, a);
    return dyp;
}

// The same kernels for both keys: the tensors' device picks moex's backend (a CUDA tensor with
// a libmoex built without CUDA fails in moex_context_create, as MoexError).
void register_kernels(torch::Library& m) {
    m.impl("grouped_linear_forward", TORCH_FN(grouped_linear_forward));
    m.impl("grouped_linear_backward_data", TORCH_FN(grouped_linear_backward_data));
    m.impl("grouped_linear_backward_weight", TORCH_FN(grouped_linear_backward_weight));
    m.impl("grouped_linear_backward_weight_accumulate", TORCH_FN(grouped_linear_backward_weight_accumulate));
    m.impl("grouped_linear_discrete_forward", TORCH_FN(grouped_linear_discrete_forward));
    m.impl("grouped_linear_discrete_backward_data", TORCH_FN(grouped_linear_discrete_backward_data));
    m.impl("weight_maps_size", TORCH_FN(weight_maps_size));
    m.impl("grouped_mlp_forward", TORCH_FN(grouped_mlp_forward));
    m.impl("grouped_mlp_backward", TORCH_FN(grouped_mlp_backward));
    m.impl("moe_layer_forward", TORCH_FN(moe_layer_forward));
    m.impl("moe_layer_backward", TORCH_FN(moe_layer_backward));
    m.impl("scaled_glu_forward", TORCH_FN(scaled_glu_forward));
    m.impl("scaled_glu_backward", TORCH_FN(scaled_glu_backward));
    m.impl("splits_to_offsets", TORCH_FN(splits_to_offsets));
    m.impl("router_forward", TORCH_FN(router_forward));
    m.impl("router_backward", TORCH_FN(router_backward));
    m.impl("permute_forward", TORCH_FN(permute_forward));
    m.impl("permute_backward", TORCH_FN(permute_backward));
    m.impl("unpermute_forward", TORCH_FN(unpermute_forward));
    m.impl("unpermute_backward", TORCH_FN(unpermute_backward));
}

}  // namespace

TORCH_LIBRARY_IMPL(moex, CPU, m) { register_kernels(m); }
TORCH_LIBRARY_IMPL(moex, CUDA, m) { register_kernels(m); }

}  // namespace moex_torch
