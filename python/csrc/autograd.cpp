// autograd.cpp - the autograd of the moex:: forward operators, registered on their Autograd
// dispatch key: a torch::autograd::Function whose forward runs the operator below autograd and
// saves what the backward needs, and whose backward calls the backward operators through the
// dispatcher (so that torch.compile's AOTAutograd traces them, and tensor subclasses and modes
// see them). The gradients are those of moex/torch.py's Python autograd (_forward_backward ...),
// computed only where autograd asks for them. Double backward is not supported: as torch's
// once_differentiable (and moex/torch.py's _once_differentiable), under create_graph=True the
// gradients come back marked so that differentiating them raises, instead of silently missing
// the second-order terms.
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

// The index of each tensor argument among the edges that autograd gives a Function (its
// defined tensor arguments, in order), -1 for an absent one; needs(ctx, edge) then says
// whether this backward must compute that argument's gradient.
struct Edges {
    int next = 0;
    int64_t add(const at::Tensor& t) { return t.defined() ? next++ : -1; }
    int64_t add(const OptTensor& t) { return t.has_value() && t->defined() ? next++ : -1; }
};
bool needs(AutogradContext* ctx, int64_t edge) { return edge >= 0 && ctx->needs_input_grad(edge); }

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
                              const OptTensor&, int64_t, int64_t, int64_t, bool, double);
using DataSig = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                               const OptTensor&, const OptTensor&, int64_t, bool, bool,
                                                               bool, int64_t, int64_t, bool, double);
using WeightSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, int64_t, int64_t, bool,
                             double);

// y = grouped_linear_forward(x, w, splits, bias, probs, bias_mode, fp8...); differentiable in x,
// w, bias (ADD, SCALED) and probs (SCALED).
struct GroupedLinearFunction : public torch::autograd::Function<GroupedLinearFunction> {
    static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& splits,
                              const OptTensor& bias, const OptTensor& probs, int64_t bias_mode, int64_t fp8_mode,
                              int64_t fp8_dtypes, bool fp8_pow2_scales, double fp8_amax_epsilon) {
        static const auto op = op_handle<ForwardSig>("moex::grouped_linear_forward");
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        at::Tensor y = op.call(x, w, splits, bias, probs, bias_mode, fp8_mode, fp8_dtypes, fp8_pow2_scales,
                               fp8_amax_epsilon);
        ctx->save_for_backward({x, w, splits, bias.value_or(at::Tensor()), probs.value_or(at::Tensor())});
        Edges e;
        ctx->saved_data["edge_x"] = e.add(x);
        ctx->saved_data["edge_w"] = e.add(w);
        e.add(splits);
        ctx->saved_data["edge_bias"] = e.add(bias);
        ctx->saved_data["edge_probs"] = e.add(probs);
        ctx->saved_data["bias_mode"] = bias_mode;
        ctx->saved_data["fp8_mode"] = fp8_mode;
        ctx->saved_data["fp8_dtypes"] = fp8_dtypes;
        ctx->saved_data["fp8_pow2_scales"] = fp8_pow2_scales;
        ctx->saved_data["fp8_amax_epsilon"] = fp8_amax_epsilon;
        return y;
    }

    static variable_list backward(AutogradContext* ctx, variable_list grads) {
        static const auto data_op = op_handle<DataSig>("moex::grouped_linear_backward_data");
        static const auto weight_op = op_handle<WeightSig>("moex::grouped_linear_backward_weight");
        const variable_list saved = ctx->get_saved_variables();
        const at::Tensor &x = saved[0], &w = saved[1], &splits = saved[2];
        const OptTensor bias = optional(saved[3]), probs = optional(saved[4]);
        auto& d = ctx->saved_data;
        const int64_t bias_mode = d["bias_mode"].toInt();
        const int64_t fp8_mode = d["fp8_mode"].toInt(), fp8_dtypes = d["fp8_dtypes"].toInt();
        const bool fp8_pow2 = d["fp8_pow2_scales"].toBool();
        const double fp8_eps = d["fp8_amax_epsilon"].toDouble();
        const bool need_x = needs(ctx, d["edge_x"].toInt()), need_w = needs(ctx, d["edge_w"].toInt());
        const bool need_dbias = needs(ctx, d["edge_bias"].toInt()) && bias_mode != MOEX_BIAS_NONE;
        const bool need_dprobs = needs(ctx, d["edge_probs"].toInt()) && bias_mode == MOEX_BIAS_SCALED;
        const at::Tensor dy = grads[0].contiguous();
        const bool create_graph = at::GradMode::is_enabled();
        at::NoGradGuard no_grad;

        variable_list out(10);   // one per forward argument: x, w, splits, bias, probs, then non-tensors
        if (need_x || need_dbias || need_dprobs) {
            auto [dx, dbias, dprobs] = data_op.call(dy, w, splits, bias, probs, bias_mode, need_x, need_dbias,
                                                    need_dprobs, fp8_mode, fp8_dtypes, fp8_pow2, fp8_eps);
            if (need_x) out[0] = dx;
            if (need_dbias) out[3] = dbias;
            if (need_dprobs) out[4] = dprobs;
        }
        if (need_w)
            out[1] = weight_op.call(x, dy, splits, dtype_code(w.scalar_type()), fp8_mode, fp8_dtypes, fp8_pow2,
                                    fp8_eps);
        at::AutoGradMode restore(create_graph);
        return once_differentiable(std::move(out));
    }
};

at::Tensor grouped_linear_forward_autograd(const at::Tensor& x, const at::Tensor& w, const at::Tensor& splits,
                                           const OptTensor& bias, const OptTensor& probs, int64_t bias_mode,
                                           int64_t fp8_mode, int64_t fp8_dtypes, bool fp8_pow2_scales,
                                           double fp8_amax_epsilon) {
    return GroupedLinearFunction::apply(x, w, splits, bias, probs, bias_mode, fp8_mode, fp8_dtypes, fp8_pow2_scales,
                                        fp8_amax_epsilon);
}

}  // namespace

TORCH_LIBRARY_IMPL(moex, Autograd, m) {
    m.impl("grouped_linear_forward", TORCH_FN(grouped_linear_forward_autograd));
}

}  // namespace moex_torch
