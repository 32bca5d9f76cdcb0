// kernels.cpp - the CPU and CUDA kernels of the moex:: operators: each checks its arguments as
// the Python operator of moex/torch.py does (ValueError naming the argument), allocates its
// outputs with torch, fills the moex argument struct with views of them and calls the C API on
// the tensors' backend (moex_torch.h's run: the device's context, torch's current stream, a
// workspace from torch's allocator). One function serves both dispatch keys: the tensors'
// device picks the backend.
#include <ATen/ops/empty.h>
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

// ---- grouped linear on separate weights (GroupedLinear's weight0..: moex's discrete weights) ----

// The moex_weight of G separate [N, K] weights through `ptrs`, an int64 [G] tensor on their device
// holding weights[g].data_ptr() (the caller builds it once and keeps it: moex/torch.py's
// _WeightPointers). Checks that the weights are G contiguous tensors of rows' dtype, one shape,
// on rows' device (ValueError naming weights[g]); on the CPU also that ptrs holds their addresses
// (on CUDA reading ptrs would cost a synchronisation).
moex_weight discrete_weight(const char* op, const at::Tensor& rows, const at::TensorList& weights,
                            const at::Tensor& ptrs, const at::Tensor& splits) {
    TORCH_CHECK_VALUE(!weights.empty(), "moex.", op, ": weights is empty");
    const at::ScalarType rows_type = rows.scalar_type();
    const at::Tensor& w0 = weights[0];
    for (size_t g = 0; g < weights.size(); ++g) {
        const std::string name = "weights[" + std::to_string(g) + "]";
        check(op, name.c_str(), weights[g], rows.device(), only(rows_type), 2);
        TORCH_CHECK_VALUE(weights[g].sizes() == w0.sizes(), "moex.", op, ": ", name, " is ", weights[g].sizes(),
                          ", weights[0] ", w0.sizes(), " (the weights must have one shape)");
    }
    const int64_t G = static_cast<int64_t>(weights.size());
    static const at::ScalarType kLong = at::kLong;
    check(op, "ptrs", ptrs, rows.device(), only(kLong), 1);
    check(op, "splits", splits, rows.device(), only(kLong), 1);
    TORCH_CHECK_VALUE(ptrs.size(0) == G && splits.size(0) == G, "moex.", op, ": ", G, " weights, ptrs has ",
                      ptrs.size(0), " entries and splits ", splits.size(0), " groups");
    if (ptrs.is_cpu()) {
        const int64_t* p = ptrs.data_ptr<int64_t>();
        for (int64_t g = 0; g < G; ++g)
            TORCH_CHECK_VALUE(p[g] == reinterpret_cast<int64_t>(weights[g].data_ptr()), "moex.", op, ": ptrs[", g,
                              "] is not weights[", g, "].data_ptr()");
    }
    moex_weight w{};
    w.t.data = nullptr;
    w.t.dtype = dtype_code(rows_type);
    w.t.ndim = 3;
    w.t.shape[0] = G;
    w.t.shape[1] = w0.size(0);
    w.t.shape[2] = w0.size(1);
    w.ptrs = reinterpret_cast<void* const*>(ptrs.data_ptr());
    return w;
}

// y [T, N] = grouped_linear_forward with the weights `weights` (ptrs: discrete_weight).
at::Tensor grouped_linear_discrete_forward(const at::Tensor& x, at::TensorList weights, const at::Tensor& ptrs,
                                           const at::Tensor& splits, const std::optional<at::Tensor>& bias,
                                           const std::optional<at::Tensor>& probs, int64_t bias_mode,
                                           int64_t fp8_mode, int64_t fp8_dtypes, bool fp8_pow2_scales,
                                           double fp8_amax_epsilon) {
    const char* op = "grouped_linear_discrete_forward";
    check(op, "x", x, x.device(), kFloats, 2);
    moex_grouped_linear_args a{};
    a.w = discrete_weight(op, x, weights, ptrs, splits);
    check_bias(op, bias_mode, bias, probs, x);
    at::Tensor y = at::empty({x.size(0), a.w.t.shape[1]}, x.options());
    a.x = view(x);
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

// (dx, dbias, dprobs) = grouped_linear_backward_data with the weights `weights`.
std::tuple<at::Tensor, at::Tensor, at::Tensor> grouped_linear_discrete_backward_data(
        const at::Tensor& dy, at::TensorList weights, const at::Tensor& ptrs, const at::Tensor& splits,
        const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& probs, int64_t bias_mode,
        bool need_dx, bool need_dbias, bool need_dprobs, int64_t fp8_mode, int64_t fp8_dtypes, bool fp8_pow2_scales,
        double fp8_amax_epsilon) {
    const char* op = "grouped_linear_discrete_backward_data";
    check(op, "dy", dy, dy.device(), kFloats, 2);
    moex_grouped_linear_dgrad_args a{};
    a.w = discrete_weight(op, dy, weights, ptrs, splits);
    check_bias(op, bias_mode, bias, probs, dy);
    const int64_t T = dy.size(0), G = a.w.t.shape[0], N = a.w.t.shape[1], K = a.w.t.shape[2];
    at::Tensor dx = at::empty({need_dx ? T : 0, K}, dy.options());
    at::Tensor dbias = at::empty({need_dbias ? G : 0, N}, dy.options().dtype(bias ? bias->scalar_type() : at::kFloat));
    at::Tensor dprobs = need_dprobs ? at::zeros({T}, dy.options().dtype(at::kFloat))
                                    : at::empty({0}, dy.options().dtype(at::kFloat));
    const bool scaled = bias_mode == MOEX_BIAS_SCALED;
    a.dy = view(dy);
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
    zero_tail(call, dx, splits);
    return {dx, dbias, dprobs};
}

// ---- grouped MLP (docs/ops.md section 4) ------------------------------------------------------

// torch.py's _check_mlp: x [T, H], w1 [G, 2F, H], w2 [G, H, F] of x's dtype, splits int64 [G],
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

// y [T, H] (rows past sum(splits) zero), h [T, 2F] (kept for the backward), z [T, F] (0 rows
// without save_z: the backward recomputes it from h).
std::tuple<at::Tensor, at::Tensor, at::Tensor> grouped_mlp_forward(
        const at::Tensor& x, const at::Tensor& w1, const std::optional<at::Tensor>& b1, const at::Tensor& w2,
        const std::optional<at::Tensor>& b2, const std::optional<at::Tensor>& probs, const at::Tensor& splits,
        int64_t b2_mode, int64_t glu_kind, int64_t glu_layout, double glu_limit, double glu_alpha, double glu_offset,
        bool save_z, int64_t fp8_mode, int64_t fp8_dtypes, bool fp8_pow2_scales, double fp8_amax_epsilon) {
    const char* op = "grouped_mlp_forward";
    check_mlp(op, x, w1, w2, splits, probs, b1, b2, b2_mode);
    const int64_t T = x.size(0), H = x.size(1), F2 = w1.size(1);
    at::Tensor y = at::empty({T, H}, x.options());
    at::Tensor h = at::empty({T, F2}, x.options());
    at::Tensor z = at::empty({save_z ? T : 0, F2 / 2}, x.options());
    moex_grouped_mlp_args a{};
    a.x = view(x);
    a.w1 = weight(w1);
    a.b1 = view(b1);
    a.w2 = weight(w2);
    a.b2_mode = static_cast<moex_bias_mode>(b2_mode);
    if (b2_mode != MOEX_BIAS_NONE) a.b2 = view(b2);
    a.probs = view(probs);
    a.glu = glu_params(op, glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset);
    a.splits = view(splits);
    a.h = view(h);
    if (save_z) a.z = view(z);
    a.y = view(y);
    a.fp8 = fp8_recipe(op, fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon);
    Call call(x.device());
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
        int64_t fp8_mode, int64_t fp8_dtypes, bool fp8_pow2_scales, double fp8_amax_epsilon) {
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
    a.x = view(x);
    a.w1 = weight(w1);
    a.w2 = weight(w2);
    a.b2_mode = static_cast<moex_bias_mode>(b2_mode);
    if (b2_mode != MOEX_BIAS_NONE) a.b2 = view(b2);
    a.probs = view(probs);
    a.glu = glu_params(op, glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset);
    a.splits = view(splits);
    a.h = view(h);
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
    call.run(moex_grouped_mlp_backward_workspace_size, moex_grouped_mlp_backward, a);
    if (!h.is_inference()) h.unsafeGetTensorImpl()->bump_version();
    zero_tail(call, dx, splits);   // dprobs: zeros, += on the groups' rows only
    return {dx, dw1, dw2, db1, db2, dprobs};
}

// ---- MoE layer (docs/ops.md section 8) ----------------------------------------------------------

// torch.py's _check_moe: x [T, H] (a float dtype), router_w [E, H], w1 [E, 2F, H], w2 [E, H, F] of
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
        int64_t fp8_mode, int64_t fp8_dtypes, bool fp8_pow2_scales, double fp8_amax_epsilon) {
    const char* op = "moe_layer_forward";
    check_moe(op, x, router_w, w1, b1, w2, b2, topk, b2_mode);
    moex_moe_layer_args a = moe_args(op, x, router_w, w1, b1, w2, b2, topk, score, norm, b2_mode, glu_kind, glu_layout,
                                     glu_limit, glu_alpha, glu_offset, fp8_mode, fp8_dtypes, fp8_pow2_scales,
                                     fp8_amax_epsilon);
    at::Tensor y = at::empty(x.sizes(), x.options());
    a.y = view(y);
    Call call(x.device());
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
        int64_t fp8_dtypes, bool fp8_pow2_scales, double fp8_amax_epsilon) {
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
    run(x.device(), moex_moe_layer_backward_workspace_size, moex_moe_layer_backward, a);
    return outs;
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
    m.impl("grouped_mlp_forward", TORCH_FN(grouped_mlp_forward));
    m.impl("grouped_mlp_backward", TORCH_FN(grouped_mlp_backward));
    m.impl("moe_layer_forward", TORCH_FN(moe_layer_forward));
    m.impl("moe_layer_backward", TORCH_FN(moe_layer_backward));
}

}  // namespace

TORCH_LIBRARY_IMPL(moex, CPU, m) { register_kernels(m); }
TORCH_LIBRARY_IMPL(moex, CUDA, m) { register_kernels(m); }

}  // namespace moex_torch
