// autograd.cpp - the autograd of the moex:: forward operators, registered on their Autograd
// dispatch key: a torch::autograd::Function whose forward runs the operator below autograd and
// saves what the backward needs, and whose backward calls the backward operators through the
// dispatcher (so that torch.compile's AOTAutograd traces them, and tensor subclasses and modes see
// them). The gradients are those of the Python autograd of moex/torch/ (_forward_backward ...),
// computed only where autograd asks for them. Double backward is not supported: as torch's
// once_differentiable (and moex/torch/_operators.py's _once_differentiable), under
// create_graph=True the gradients come back marked so that differentiating them raises, instead of
// silently missing the second-order terms.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/library.h>

#include <tuple>

#include "moex_torch.h"

namespace moex_torch {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptTensor = std::optional<at::Tensor>;

// The dispatcher's handle of moex::<name> with C++ signature Sig (found once).
template <class Sig>
c10::TypedOperatorHandle<Sig> op_handle(const char* name) {
    return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

OptTensor optional(const at::Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

// Whether a call would record nothing for autograd: grad mode off, or no tensor argument that
// requires grad. Such a call runs its operator below autograd directly, as torch's own kernels
// do, without a Function's node and saved tensors (the host time of an eval or no_grad call).
bool records_nothing(std::initializer_list<const at::Tensor*> ts, at::TensorList more = {},
                     std::initializer_list<const OptTensor*> opts = {}) {
    if (!at::GradMode::is_enabled()) return true;
    for (const at::Tensor* t : ts)
        if (t->requires_grad()) return false;
    for (const at::Tensor& t : more)
        if (t.requires_grad()) return false;
    for (const OptTensor* t : opts)
        if (t->has_value() && (*t)->requires_grad()) return false;
    return true;
}

// The index of each tensor argument among the edges that autograd gives a Function (its
// defined tensor arguments, in order), -1 for an absent one; needs_grad(ctx, edge) then says
// whether this backward must compute that argument's gradient.
struct Edges {
    int next = 0;
    int64_t add(const at::Tensor& t) { return t.defined() ? next++ : -1; }
    int64_t add(const OptTensor& t) { return t.has_value() && t->defined() ? next++ : -1; }
};
bool needs_grad(AutogradContext* ctx, int64_t edge) { return edge >= 0 && ctx->needs_input_grad(edge); }

// A forward keeps the edges of its leading tensor arguments, in order, in saved_data["edges"]
// (save_edges(ctx, x, w, ...): every tensor argument up to the last differentiable one); its
// backward's needs_grads(ctx)[i] then says whether it must compute the i-th one's gradient.
template <class... Ts>
void save_edges(AutogradContext* ctx, const Ts&... args) {
    Edges e;
    ctx->saved_data["edges"] = std::vector<int64_t>{e.add(args)...};   // in order: list-initialization
}
std::vector<bool> needs_grads(AutogradContext* ctx) {
    std::vector<bool> needs;
    for (const int64_t edge : ctx->saved_data["edges"].toIntVector()) needs.push_back(needs_grad(ctx, edge));
    return needs;
}

// The fp8... and glu_... arguments of a forward operator, kept in saved_data for its backward.
struct Fp8Args {
    int64_t mode, dtypes;
    bool pow2_scales;
    double amax_epsilon;
    OptTensor weights;   // the kept FP8 copies of the weights (fp8_weights), not differentiated
    void save(AutogradContext* ctx) const {
        auto& d = ctx->saved_data;
        d["fp8_mode"] = mode, d["fp8_dtypes"] = dtypes, d["fp8_pow2_scales"] = pow2_scales;
        d["fp8_amax_epsilon"] = amax_epsilon;
        d["fp8_weights"] = weights;
    }
    static Fp8Args load(AutogradContext* ctx) {
        auto& d = ctx->saved_data;
        return {d["fp8_mode"].toInt(), d["fp8_dtypes"].toInt(), d["fp8_pow2_scales"].toBool(),
                d["fp8_amax_epsilon"].toDouble(), d["fp8_weights"].toOptional<at::Tensor>()};
    }
};
struct GluArgs {
    int64_t kind, layout;
    double limit, alpha, offset;
    void save(AutogradContext* ctx) const {
        auto& d = ctx->saved_data;
        d["glu_kind"] = kind, d["glu_layout"] = layout, d["glu_limit"] = limit, d["glu_alpha"] = alpha;
        d["glu_offset"] = offset;
    }
    static GluArgs load(AutogradContext* ctx) {
        auto& d = ctx->saved_data;
        return {d["glu_kind"].toInt(), d["glu_layout"].toInt(), d["glu_limit"].toDouble(), d["glu_alpha"].toDouble(),
                d["glu_offset"].toDouble()};
    }
};

// The options the grouped MLP's and the MoE layer's forwards keep for their backwards: b2_mode,
// the glu... and the fp8... arguments.
struct MlpArgs {
    int64_t b2_mode;
    GluArgs glu;
    Fp8Args fp8;
    void save(AutogradContext* ctx) const {
        ctx->saved_data["b2_mode"] = b2_mode;
        glu.save(ctx);
        fp8.save(ctx);
    }
    static MlpArgs load(AutogradContext* ctx) {
        return {ctx->saved_data["b2_mode"].toInt(), GluArgs::load(ctx), Fp8Args::load(ctx)};
    }
};

// The gradients a backward returns: as they are, or under create_graph=True (grad mode on in the
// backward) each floating-point one marked by a DelayedError node, so that differentiating it
// raises (moex's backward is not differentiable); the backward operators themselves run without
// recording (at::NoGradGuard in the backward).
constexpr const char* kDoubleBackward =
    "moex: trying to differentiate twice: moex's backward is not differentiable (double backward, "
    "create_graph=True, is not supported)";

variable_list once_differentiable(variable_list grads) {
    if (!at::GradMode::is_enabled()) return grads;
    std::vector<size_t> marked;
    variable_list inputs;
    for (size_t i = 0; i < grads.size(); ++i) {
        if (grads[i].defined() && grads[i].is_floating_point()) {
            marked.push_back(i);
            inputs.push_back(grads[i].detach().requires_grad_());
        }
    }
    if (marked.empty()) return grads;
    auto error = std::make_shared<torch::autograd::DelayedError>(kDoubleBackward, static_cast<int64_t>(marked.size()));
    variable_list outputs = error->apply(std::move(inputs));
    for (size_t j = 0; j < marked.size(); ++j) grads[marked[j]] = outputs[j];
    return grads;
}

// ---- grouped linear ----------------------------------------------------------------------------

using ForwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptTensor&,
                              const OptTensor&, int64_t, int64_t, int64_t, bool, double, const OptTensor&);
using DataSig = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                               const OptTensor&, const OptTensor&, int64_t, bool, bool,
                                                               bool, int64_t, int64_t, bool, double, const OptTensor&);
using WeightSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, int64_t, int64_t, bool,
                             double, const OptTensor&);

// dW [G, N, K] of dtype w_type by moex::grouped_linear_backward_weight: the weight gradient of
// both grouped linears below (the discrete one splits it into its G weights' gradients).
at::Tensor weight_grad(const at::Tensor& x, const at::Tensor& dy, const at::Tensor& splits, at::ScalarType w_type,
                       const Fp8Args& f) {
    static const auto op = op_handle<WeightSig>("moex::grouped_linear_backward_weight");
    return op.call(x, dy, splits, dtype_code(w_type), f.mode, f.dtypes, f.pow2_scales, f.amax_epsilon, f.weights);
}

// y = grouped_linear_forward(x, w, splits, bias, probs, bias_mode, fp8...); differentiable in x,
// w, bias (ADD, SCALED) and probs (SCALED).
struct GroupedLinearFunction : public torch::autograd::Function<GroupedLinearFunction> {
    static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& splits,
                              const OptTensor& bias, const OptTensor& probs, int64_t bias_mode, int64_t fp8_mode,
                              int64_t fp8_dtypes, bool fp8_pow2_scales, double fp8_amax_epsilon, const OptTensor& fp8_weights) {
        static const auto op = op_handle<ForwardSig>("moex::grouped_linear_forward");
        const at::AutoDispatchBelowADInplaceOrView below_autograd;
        at::Tensor y = op.call(x, w, splits, bias, probs, bias_mode, fp8_mode, fp8_dtypes, fp8_pow2_scales,
                               fp8_amax_epsilon, fp8_weights);
        ctx->save_for_backward({x, w, splits, bias.value_or(at::Tensor()), probs.value_or(at::Tensor())});
        save_edges(ctx, x, w, splits, bias, probs);
        ctx->saved_data["bias_mode"] = bias_mode;
        Fp8Args{fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon, fp8_weights}.save(ctx);
        return y;
    }

    static variable_list backward(AutogradContext* ctx, variable_list grads) {
        static const auto data_op = op_handle<DataSig>("moex::grouped_linear_backward_data");
        const variable_list saved = ctx->get_saved_variables();
        const at::Tensor &x = saved[0], &w = saved[1], &splits = saved[2];
        const OptTensor bias = optional(saved[3]), probs = optional(saved[4]);
        auto& d = ctx->saved_data;
        const int64_t bias_mode = d["bias_mode"].toInt();
        const Fp8Args f = Fp8Args::load(ctx);
        const std::vector<bool> needs = needs_grads(ctx);   // x, w, splits, bias, probs
        const bool need_x = needs[0], need_w = needs[1];
        const bool need_dbias = needs[3] && bias_mode != MOEX_BIAS_NONE;
        const bool need_dprobs = needs[4] && bias_mode == MOEX_BIAS_SCALED;
        const at::Tensor dy = grads[0].contiguous();
        const bool create_graph = at::GradMode::is_enabled();
        at::NoGradGuard no_grad;

        variable_list out(11);   // one per forward argument: x, w, splits, bias, probs, then the rest
        if (need_x || need_dbias || need_dprobs) {
            auto [dx, dbias, dprobs] = data_op.call(dy, w, splits, bias, probs, bias_mode, need_x, need_dbias,
                                                    need_dprobs, f.mode, f.dtypes, f.pow2_scales, f.amax_epsilon, f.weights);
            if (need_x) out[0] = dx;
            if (need_dbias) out[3] = dbias;
            if (need_dprobs) out[4] = dprobs;
        }
        if (need_w) out[1] = weight_grad(x, dy, splits, w.scalar_type(), f);
        at::AutoGradMode restore(create_graph);
        return once_differentiable(std::move(out));
    }
};

at::Tensor grouped_linear_forward_autograd(const at::Tensor& x, const at::Tensor& w, const at::Tensor& splits,
                                           const OptTensor& bias, const OptTensor& probs, int64_t bias_mode,
                                           int64_t fp8_mode, int64_t fp8_dtypes, bool fp8_pow2_scales,
                                           double fp8_amax_epsilon, const OptTensor& fp8_weights) {
    if (records_nothing({&x, &w}, {}, {&bias, &probs})) {
        static const auto op = op_handle<ForwardSig>("moex::grouped_linear_forward");
        const at::AutoDispatchBelowADInplaceOrView below_autograd;
        return op.call(x, w, splits, bias, probs, bias_mode, fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon, fp8_weights);
    }
    return GroupedLinearFunction::apply(x, w, splits, bias, probs, bias_mode, fp8_mode, fp8_dtypes, fp8_pow2_scales,
                                        fp8_amax_epsilon, fp8_weights);
}

// ---- grouped linear on separate weights --------------------------------------------------------

using DiscreteForwardSig = at::Tensor(const at::Tensor&, at::TensorList, const at::Tensor&, const at::Tensor&,
                                      const at::Tensor&, const OptTensor&, const OptTensor&, int64_t, int64_t, int64_t,
                                      bool, double, const OptTensor&);
using DiscreteDataSig = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
        const at::Tensor&, at::TensorList, const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptTensor&,
        const OptTensor&, int64_t, bool, bool, bool, int64_t, int64_t, bool, double, const OptTensor&);

// y = grouped_linear_discrete_forward(x, weights, ptrs, ptrs_host, splits, bias, probs, bias_mode, fp8...);
// Alike in shape with GroupedLinearFunction above by design: the same steps over G weight
// tensors instead of one (their edges, kept here by hand: the G weights' are a range, which
// save_edges does not keep; their saved copies; dW split into G gradients).
// differentiable in x, each weight (its slice of one [G, N, K] dW), bias and probs.
struct GroupedLinearDiscreteFunction : public torch::autograd::Function<GroupedLinearDiscreteFunction> {
    static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList weights, const at::Tensor& ptrs,
                              const at::Tensor& ptrs_host, const at::Tensor& splits, const OptTensor& bias,
                              const OptTensor& probs, int64_t bias_mode, int64_t fp8_mode, int64_t fp8_dtypes,
                              bool fp8_pow2_scales, double fp8_amax_epsilon, const OptTensor& fp8_weights) {
        static const auto op = op_handle<DiscreteForwardSig>("moex::grouped_linear_discrete_forward");
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        at::Tensor y = op.call(x, weights, ptrs, ptrs_host, splits, bias, probs, bias_mode, fp8_mode, fp8_dtypes,
                               fp8_pow2_scales, fp8_amax_epsilon, fp8_weights);
        variable_list saved = {x, ptrs, ptrs_host, splits, bias.value_or(at::Tensor()), probs.value_or(at::Tensor())};
        saved.insert(saved.end(), weights.begin(), weights.end());
        ctx->save_for_backward(saved);
        Edges e;
        auto& d = ctx->saved_data;
        d["edge_x"] = e.add(x);
        d["edge_w0"] = e.next;   // the weights' edges: edge_w0 .. edge_w0 + G - 1
        for (const at::Tensor& w : weights) e.add(w);
        e.add(ptrs);
        e.add(ptrs_host);
        e.add(splits);
        d["edge_bias"] = e.add(bias);
        d["edge_probs"] = e.add(probs);
        d["bias_mode"] = bias_mode;
        Fp8Args{fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon, fp8_weights}.save(ctx);
        return y;
    }

    static variable_list backward(AutogradContext* ctx, variable_list grads) {
        static const auto data_op = op_handle<DiscreteDataSig>("moex::grouped_linear_discrete_backward_data");
        const variable_list saved = ctx->get_saved_variables();
        const at::Tensor &x = saved[0], &ptrs = saved[1], &ptrs_host = saved[2], &splits = saved[3];
        const OptTensor bias = optional(saved[4]), probs = optional(saved[5]);
        const std::vector<at::Tensor> weights(saved.begin() + 6, saved.end());
        const int64_t G = static_cast<int64_t>(weights.size());
        auto& d = ctx->saved_data;
        const int64_t bias_mode = d["bias_mode"].toInt();
        const Fp8Args f = Fp8Args::load(ctx);
        const bool need_x = needs_grad(ctx, d["edge_x"].toInt());
        bool need_w = false;
        for (int64_t g = 0; g < G; ++g) need_w = need_w || needs_grad(ctx, d["edge_w0"].toInt() + g);
        const bool need_dbias = needs_grad(ctx, d["edge_bias"].toInt()) && bias_mode != MOEX_BIAS_NONE;
        const bool need_dprobs = needs_grad(ctx, d["edge_probs"].toInt()) && bias_mode == MOEX_BIAS_SCALED;
        const at::Tensor dy = grads[0].contiguous();
        const bool create_graph = at::GradMode::is_enabled();
        at::NoGradGuard no_grad;

        // one per forward argument: x, weights[0..G), ptrs, ptrs_host, splits, bias, probs, then non-tensors
        variable_list out(G + 12);
        if (need_x || need_dbias || need_dprobs) {
            auto [dx, dbias, dprobs] = data_op.call(dy, weights, ptrs, ptrs_host, splits, bias, probs, bias_mode, need_x,
                                                    need_dbias, need_dprobs, f.mode, f.dtypes, f.pow2_scales, f.amax_epsilon, f.weights);
            if (need_x) out[0] = dx;
            if (need_dbias) out[G + 4] = dbias;
            if (need_dprobs) out[G + 5] = dprobs;
        }
        if (need_w) {
            const at::Tensor dw = weight_grad(x, dy, splits, weights[0].scalar_type(), f);
            for (int64_t g = 0; g < G; ++g) out[1 + g] = dw[g];
        }
        at::AutoGradMode restore(create_graph);
        return once_differentiable(std::move(out));
    }
};

at::Tensor grouped_linear_discrete_forward_autograd(const at::Tensor& x, at::TensorList weights,
                                                    const at::Tensor& ptrs, const at::Tensor& ptrs_host,
                                                    const at::Tensor& splits, const OptTensor& bias,
                                                    const OptTensor& probs, int64_t bias_mode, int64_t fp8_mode,
                                                    int64_t fp8_dtypes, bool fp8_pow2_scales, double fp8_amax_epsilon, const OptTensor& fp8_weights) {
    if (records_nothing({&x}, weights, {&bias, &probs})) {
        static const auto op = op_handle<DiscreteForwardSig>("moex::grouped_linear_discrete_forward");
        const at::AutoDispatchBelowADInplaceOrView below_autograd;
        return op.call(x, weights, ptrs, ptrs_host, splits, bias, probs, bias_mode, fp8_mode, fp8_dtypes,
                       fp8_pow2_scales, fp8_amax_epsilon, fp8_weights);
    }
    return GroupedLinearDiscreteFunction::apply(x, weights, ptrs, ptrs_host, splits, bias, probs, bias_mode, fp8_mode,
                                                fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon, fp8_weights);
}

// ---- grouped MLP -----------------------------------------------------------------------------

using MlpForwardSig = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
        const at::Tensor&, const at::Tensor&, const OptTensor&, const at::Tensor&, const OptTensor&, const OptTensor&,
        const at::Tensor&, int64_t, int64_t, int64_t, double, double, double, bool, int64_t, int64_t, bool, double,
        const OptTensor&);
using MlpBackwardSig = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
        const at::Tensor&, const at::Tensor&, const OptTensor&, const at::Tensor&, const OptTensor&, const OptTensor&,
        const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, int64_t, int64_t, double,
        double, double, const c10::List<bool>&, int64_t, int64_t, bool, double, const OptTensor&);

// (y, h, z) = grouped_mlp_forward(x, w1, b1, w2, b2, probs, splits, b2_mode, glu..., save_z, fp8...);
// differentiable in x, the weights, the biases and probs through y. h and z are outputs for
// the backward only: their gradients are ignored (not materialised).
struct GroupedMlpFunction : public torch::autograd::Function<GroupedMlpFunction> {
    static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w1, const OptTensor& b1,
                                 const at::Tensor& w2, const OptTensor& b2, const OptTensor& probs,
                                 const at::Tensor& splits, int64_t b2_mode, int64_t glu_kind, int64_t glu_layout,
                                 double glu_limit, double glu_alpha, double glu_offset, bool save_z, int64_t fp8_mode,
                                 int64_t fp8_dtypes, bool fp8_pow2_scales, double fp8_amax_epsilon, const OptTensor& fp8_weights) {
        static const auto op = op_handle<MlpForwardSig>("moex::grouped_mlp_forward");
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        auto [y, h, z] = op.call(x, w1, b1, w2, b2, probs, splits, b2_mode, glu_kind, glu_layout, glu_limit,
                                 glu_alpha, glu_offset, save_z, fp8_mode, fp8_dtypes, fp8_pow2_scales,
                                 fp8_amax_epsilon, fp8_weights);
        ctx->save_for_backward({x, w1, b1.value_or(at::Tensor()), w2, b2.value_or(at::Tensor()),
                                probs.value_or(at::Tensor()), splits, h, z});
        ctx->set_materialize_grads(false);
        save_edges(ctx, x, w1, b1, w2, b2, probs);
        MlpArgs{b2_mode, {glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset},
                {fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon, fp8_weights}}.save(ctx);
        return {y, h, z};
    }

    static variable_list backward(AutogradContext* ctx, variable_list grads) {
        static const auto op = op_handle<MlpBackwardSig>("moex::grouped_mlp_backward");
        variable_list out(19);   // one per forward argument: x, w1, b1, w2, b2, probs, then the rest
        if (!grads[0].defined()) return out;   // y does not reach the loss
        const variable_list saved = ctx->get_saved_variables();
        const at::Tensor &x = saved[0], &w1 = saved[1], &w2 = saved[3], &splits = saved[6], &h = saved[7],
                         &z = saved[8];
        const OptTensor b1 = optional(saved[2]), b2 = optional(saved[4]), probs = optional(saved[5]);
        const MlpArgs m = MlpArgs::load(ctx);
        std::vector<bool> by_arg = needs_grads(ctx);   // x, w1, b1, w2, b2, probs
        by_arg[4] = by_arg[4] && m.b2_mode != MOEX_BIAS_NONE;
        // the operator's order: x, w1, w2, b1, b2, probs
        const bool needs[6] = {by_arg[0], by_arg[1], by_arg[3], by_arg[2], by_arg[4], by_arg[5]};
        const at::Tensor dy = grads[0].contiguous();
        const bool create_graph = at::GradMode::is_enabled();
        at::NoGradGuard no_grad;
        auto [dx, dw1, dw2, db1, db2, dprobs] =
                op.call(x, w1, b1, w2, b2, probs, splits, h, z, dy, m.b2_mode, m.glu.kind, m.glu.layout,
                        m.glu.limit, m.glu.alpha, m.glu.offset, c10::List<bool>(c10::ArrayRef<bool>(needs, 6)),
                        m.fp8.mode, m.fp8.dtypes, m.fp8.pow2_scales, m.fp8.amax_epsilon, m.fp8.weights);
        const at::Tensor grads_by_arg[6] = {dx, dw1, db1, dw2, db2, dprobs};   // x, w1, b1, w2, b2, probs
        for (int i = 0; i < 6; ++i)
            if (by_arg[i]) out[i] = grads_by_arg[i];
        at::AutoGradMode restore(create_graph);
        return once_differentiable(std::move(out));
    }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor> grouped_mlp_forward_autograd(
        const at::Tensor& x, const at::Tensor& w1, const OptTensor& b1, const at::Tensor& w2, const OptTensor& b2,
        const OptTensor& probs, const at::Tensor& splits, int64_t b2_mode, int64_t glu_kind, int64_t glu_layout,
        double glu_limit, double glu_alpha, double glu_offset, bool save_z, int64_t fp8_mode, int64_t fp8_dtypes,
        bool fp8_pow2_scales, double fp8_amax_epsilon, const OptTensor& fp8_weights) {
    variable_list out = GroupedMlpFunction::apply(x, w1, b1, w2, b2, probs, splits, b2_mode, glu_kind, glu_layout,
                                                  glu_limit, glu_alpha, glu_offset, save_z, fp8_mode, fp8_dtypes,
                                                  fp8_pow2_scales, fp8_amax_epsilon, fp8_weights);
    return {out[0], out[1], out[2]};
}

// ---- MoE layer ---------------------------------------------------------------------------------

using MoeForwardSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                         const OptTensor&, const at::Tensor&, const OptTensor&, int64_t,
                                                         int64_t, int64_t, int64_t, int64_t, int64_t, double, double,
                                                         double, int64_t, int64_t, bool, double, const OptTensor&);
using MoeBackwardSig = std::vector<at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                               const OptTensor&, const at::Tensor&, const OptTensor&, const at::Tensor&,
                                               const at::Tensor&, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                                               double, double, double, const c10::List<bool>&, int64_t, int64_t, bool,
                                               double, const OptTensor&);

// (y, saved) = moe_layer_forward(x, router_w, w1, b1, w2, b2, topk, score, norm, b2_mode, glu...,
// fp8...); differentiable in x, router_w, the weights and the biases through y (saved, bytes for
// the backward, is not differentiable).
struct MoeLayerFunction : public torch::autograd::Function<MoeLayerFunction> {
    static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& router_w,
                                 const at::Tensor& w1, const OptTensor& b1, const at::Tensor& w2, const OptTensor& b2,
                                 int64_t topk, int64_t score, int64_t norm, int64_t b2_mode, int64_t glu_kind,
                                 int64_t glu_layout, double glu_limit, double glu_alpha, double glu_offset,
                                 int64_t fp8_mode, int64_t fp8_dtypes, bool fp8_pow2_scales, double fp8_amax_epsilon, const OptTensor& fp8_weights) {
        static const auto op = op_handle<MoeForwardSig>("moex::moe_layer_forward");
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        auto [y, saved] = op.call(x, router_w, w1, b1, w2, b2, topk, score, norm, b2_mode, glu_kind, glu_layout,
                                  glu_limit, glu_alpha, glu_offset, fp8_mode, fp8_dtypes, fp8_pow2_scales,
                                  fp8_amax_epsilon, fp8_weights);
        ctx->save_for_backward({x, router_w, w1, b1.value_or(at::Tensor()), w2, b2.value_or(at::Tensor()), saved});
        ctx->mark_non_differentiable({saved});
        ctx->set_materialize_grads(false);   // saved is for the backward only: no zero gradient of it
        save_edges(ctx, x, router_w, w1, b1, w2, b2);
        auto& d = ctx->saved_data;
        d["topk"] = topk;
        d["score"] = score;
        d["norm"] = norm;
        MlpArgs{b2_mode, {glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset},
                {fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon, fp8_weights}}.save(ctx);
        return {y, saved};
    }

    static variable_list backward(AutogradContext* ctx, variable_list grads) {
        static const auto op = op_handle<MoeBackwardSig>("moex::moe_layer_backward");
        if (!grads[0].defined()) return variable_list(20);   // y does not reach the loss
        const variable_list saved = ctx->get_saved_variables();
        const OptTensor b1 = optional(saved[3]), b2 = optional(saved[5]);
        auto& d = ctx->saved_data;
        const MlpArgs m = MlpArgs::load(ctx);
        std::vector<bool> by_arg = needs_grads(ctx);   // x, router_w, w1, b1, w2, b2
        by_arg[5] = by_arg[5] && m.b2_mode != MOEX_BIAS_NONE;
        // the operator's order (x, router_w, w1, w2, b1, b2, as its gradients g come back): each one's argument
        const int arg_of[6] = {0, 1, 2, 4, 3, 5};
        bool needs[6];
        for (int i = 0; i < 6; ++i) needs[i] = by_arg[arg_of[i]];
        const at::Tensor dy = grads[0].contiguous();
        const bool create_graph = at::GradMode::is_enabled();
        at::NoGradGuard no_grad;
        std::vector<at::Tensor> g =
                op.call(saved[0], saved[1], saved[2], b1, saved[4], b2, saved[6], dy, d["topk"].toInt(),
                        d["score"].toInt(), d["norm"].toInt(), m.b2_mode, m.glu.kind, m.glu.layout, m.glu.limit,
                        m.glu.alpha, m.glu.offset, c10::List<bool>(c10::ArrayRef<bool>(needs, 6)), m.fp8.mode,
                        m.fp8.dtypes, m.fp8.pow2_scales, m.fp8.amax_epsilon, m.fp8.weights);
        // g: dx, drouter_w, dw1, dw2, db1, db2; out: one per forward argument (x, router_w, w1, b1,
        // w2, b2, then the rest)
        variable_list out(20);
        for (int i = 0; i < 6; ++i)
            if (needs[i]) out[arg_of[i]] = g[i];
        at::AutoGradMode restore(create_graph);
        return once_differentiable(std::move(out));
    }
};

std::tuple<at::Tensor, at::Tensor> moe_layer_forward_autograd(
        const at::Tensor& x, const at::Tensor& router_w, const at::Tensor& w1, const OptTensor& b1,
        const at::Tensor& w2, const OptTensor& b2, int64_t topk, int64_t score, int64_t norm, int64_t b2_mode,
        int64_t glu_kind, int64_t glu_layout, double glu_limit, double glu_alpha, double glu_offset, int64_t fp8_mode,
        int64_t fp8_dtypes, bool fp8_pow2_scales, double fp8_amax_epsilon, const OptTensor& fp8_weights) {
    variable_list out = MoeLayerFunction::apply(x, router_w, w1, b1, w2, b2, topk, score, norm, b2_mode, glu_kind,
                                                glu_layout, glu_limit, glu_alpha, glu_offset, fp8_mode, fp8_dtypes,
                                                fp8_pow2_scales, fp8_amax_epsilon, fp8_weights);
    return {out[0], out[1]};
}

// ---- scaled GLU --------------------------------------------------------------------------------

using GluForwardSig = at::Tensor(const at::Tensor&, const OptTensor&, const OptTensor&, int64_t, int64_t, double,
                                 double, double);
using GluBackwardSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const OptTensor&, const OptTensor&,
                                                          const at::Tensor&, int64_t, int64_t, double, double, double,
                                                          bool);

// z = scaled_glu_forward(h, probs, splits, glu...); differentiable in h and probs.
struct ScaledGluFunction : public torch::autograd::Function<ScaledGluFunction> {
    static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const OptTensor& probs, const OptTensor& splits,
                              int64_t glu_kind, int64_t glu_layout, double glu_limit, double glu_alpha,
                              double glu_offset) {
        static const auto op = op_handle<GluForwardSig>("moex::scaled_glu_forward");
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        at::Tensor z = op.call(h, probs, splits, glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset);
        ctx->save_for_backward({h, probs.value_or(at::Tensor()), splits.value_or(at::Tensor())});
        save_edges(ctx, h, probs);
        GluArgs{glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset}.save(ctx);
        return z;
    }

    static variable_list backward(AutogradContext* ctx, variable_list grads) {
        static const auto op = op_handle<GluBackwardSig>("moex::scaled_glu_backward");
        const variable_list saved = ctx->get_saved_variables();
        const OptTensor probs = optional(saved[1]), splits = optional(saved[2]);
        const bool need_dprobs = needs_grads(ctx)[1];   // h, probs
        const at::Tensor dz = grads[0].contiguous();
        const bool create_graph = at::GradMode::is_enabled();
        at::NoGradGuard no_grad;
        const GluArgs glu = GluArgs::load(ctx);
        auto [dh, dprobs] = op.call(saved[0], probs, splits, dz, glu.kind, glu.layout, glu.limit, glu.alpha,
                                    glu.offset, need_dprobs);
        variable_list out(8);   // h, probs, splits, then non-tensors
        out[0] = dh;
        if (need_dprobs) out[1] = dprobs;
        at::AutoGradMode restore(create_graph);
        return once_differentiable(std::move(out));
    }
};

at::Tensor scaled_glu_forward_autograd(const at::Tensor& h, const OptTensor& probs, const OptTensor& splits,
                                       int64_t glu_kind, int64_t glu_layout, double glu_limit, double glu_alpha,
                                       double glu_offset) {
    return ScaledGluFunction::apply(h, probs, splits, glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset);
}

// ---- routing ------------------------------------------------------------------------------------

using RouterForwardSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, int64_t, int64_t, int64_t);
using RouterBackwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, int64_t,
                                     int64_t);

// (probs, ids) = router_forward(logits, topk, score, norm); probs differentiable in logits, ids not.
struct RouterFunction : public torch::autograd::Function<RouterFunction> {
    static variable_list forward(AutogradContext* ctx, const at::Tensor& logits, int64_t topk, int64_t score,
                                 int64_t norm) {
        static const auto op = op_handle<RouterForwardSig>("moex::router_forward");
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        auto [probs, ids] = op.call(logits, topk, score, norm);
        ctx->save_for_backward({logits, ids});
        ctx->mark_non_differentiable({ids});
        ctx->saved_data["topk"] = topk;
        ctx->saved_data["score"] = score;
        ctx->saved_data["norm"] = norm;
        return {probs, ids};
    }

    static variable_list backward(AutogradContext* ctx, variable_list grads) {
        static const auto op = op_handle<RouterBackwardSig>("moex::router_backward");
        const variable_list saved = ctx->get_saved_variables();
        auto& d = ctx->saved_data;
        const bool create_graph = at::GradMode::is_enabled();
        at::NoGradGuard no_grad;
        variable_list out(4);   // logits, then non-tensors
        out[0] = op.call(saved[0], saved[1], grads[0].contiguous(), d["topk"].toInt(), d["score"].toInt(),
                         d["norm"].toInt());
        at::AutoGradMode restore(create_graph);
        return once_differentiable(std::move(out));
    }
};

std::tuple<at::Tensor, at::Tensor> router_forward_autograd(const at::Tensor& logits, int64_t topk, int64_t score,
                                                           int64_t norm) {
    variable_list out = RouterFunction::apply(logits, topk, score, norm);
    return {out[0], out[1]};
}

using PermuteForwardSig = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&,
                                                                                     const at::Tensor&,
                                                                                     const at::Tensor&, int64_t);
using PermuteBackwardSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                              int64_t);

// (xp, probs_p, splits, row_map) = permute_forward(x, ids, probs, E); xp differentiable in x,
// probs_p in probs; splits and row_map not.
struct PermuteFunction : public torch::autograd::Function<PermuteFunction> {
    static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& ids,
                                 const at::Tensor& probs, int64_t num_experts) {
        static const auto op = op_handle<PermuteForwardSig>("moex::permute_forward");
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        auto [xp, probs_p, splits, row_map] = op.call(x, ids, probs, num_experts);
        ctx->save_for_backward({row_map});
        ctx->mark_non_differentiable({splits, row_map});
        ctx->saved_data["k"] = ids.size(1);
        return {xp, probs_p, splits, row_map};
    }

    static variable_list backward(AutogradContext* ctx, variable_list grads) {
        static const auto op = op_handle<PermuteBackwardSig>("moex::permute_backward");
        const variable_list saved = ctx->get_saved_variables();
        const bool create_graph = at::GradMode::is_enabled();
        at::NoGradGuard no_grad;
        auto [dx, dprobs] = op.call(saved[0], grads[0].contiguous(), grads[1].contiguous(),
                                    ctx->saved_data["k"].toInt());
        variable_list out(4);   // x, ids, probs, num_experts
        out[0] = dx;
        out[2] = dprobs;
        at::AutoGradMode restore(create_graph);
        return once_differentiable(std::move(out));
    }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> permute_forward_autograd(const at::Tensor& x,
                                                                                    const at::Tensor& ids,
                                                                                    const at::Tensor& probs,
                                                                                    int64_t num_experts) {
    variable_list out = PermuteFunction::apply(x, ids, probs, num_experts);
    return {out[0], out[1], out[2], out[3]};
}

using UnpermuteForwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, int64_t);
using UnpermuteBackwardSig = at::Tensor(const at::Tensor&, const at::Tensor&);

// y = unpermute_forward(yp, row_map, k); differentiable in yp.
struct UnpermuteFunction : public torch::autograd::Function<UnpermuteFunction> {
    static at::Tensor forward(AutogradContext* ctx, const at::Tensor& yp, const at::Tensor& row_map, int64_t k) {
        static const auto op = op_handle<UnpermuteForwardSig>("moex::unpermute_forward");
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        at::Tensor y = op.call(yp, row_map, k);
        ctx->save_for_backward({row_map});
        return y;
    }

    static variable_list backward(AutogradContext* ctx, variable_list grads) {
        static const auto op = op_handle<UnpermuteBackwardSig>("moex::unpermute_backward");
        const variable_list saved = ctx->get_saved_variables();
        const bool create_graph = at::GradMode::is_enabled();
        at::NoGradGuard no_grad;
        variable_list out(3);   // yp, row_map, k
        out[0] = op.call(grads[0].contiguous(), saved[0]);
        at::AutoGradMode restore(create_graph);
        return once_differentiable(std::move(out));
    }
};

at::Tensor unpermute_forward_autograd(const at::Tensor& yp, const at::Tensor& row_map, int64_t k) {
    return UnpermuteFunction::apply(yp, row_map, k);
}

}  // namespace

TORCH_LIBRARY_IMPL(moex, Autograd, m) {
    m.impl("scaled_glu_forward", TORCH_FN(scaled_glu_forward_autograd));
    m.impl("router_forward", TORCH_FN(router_forward_autograd));
    m.impl("permute_forward", TORCH_FN(permute_forward_autograd));
    m.impl("unpermute_forward", TORCH_FN(unpermute_forward_autograd));
    m.impl("moe_layer_forward", TORCH_FN(moe_layer_forward_autograd));
    m.impl("grouped_linear_forward", TORCH_FN(grouped_linear_forward_autograd));
    m.impl("grouped_linear_discrete_forward", TORCH_FN(grouped_linear_discrete_forward_autograd));
    m.impl("grouped_mlp_forward", TORCH_FN(grouped_mlp_forward_autograd));
}

}  // namespace moex_torch
