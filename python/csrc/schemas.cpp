// schemas.cpp - the moex:: operators' schemas. They are exactly those of the Python operators of
// moex/torch/ (torch.library.custom_op infers SymInt for int), so that the two paths are
// interchangeable: the same names, arguments, defaults and aliasing annotations. The kernels are
// in kernels.cpp, the autograd in autograd.cpp, the fake kernels in moex/torch/.
#include <torch/library.h>

#define MOEX_GLU_ARGS "SymInt glu_kind, SymInt glu_layout, float glu_limit, float glu_alpha, float glu_offset"
#define MOEX_FP8_ARGS                                                                                       \
    "SymInt fp8_mode=0, SymInt fp8_dtypes=0, bool fp8_pow2_scales=False, float fp8_amax_epsilon=0., "        \
    "Tensor? fp8_weights=None"

TORCH_LIBRARY(moex, m) {
    // ---- grouped linear (docs/ops.md section 2)
    m.def("grouped_linear_forward(Tensor x, Tensor w, Tensor splits, Tensor? bias, Tensor? probs, SymInt bias_mode, "
          MOEX_FP8_ARGS ") -> Tensor");
    m.def("grouped_linear_backward_data(Tensor dy, Tensor w, Tensor splits, Tensor? bias, Tensor? probs, "
          "SymInt bias_mode, bool need_dx, bool need_dbias, bool need_dprobs, " MOEX_FP8_ARGS
          ") -> (Tensor, Tensor, Tensor)");
    m.def("grouped_linear_backward_weight(Tensor x, Tensor dy, Tensor splits, SymInt dw_dtype, " MOEX_FP8_ARGS
          ") -> Tensor");
    m.def("grouped_linear_backward_weight_accumulate(Tensor x, Tensor dy, Tensor splits, Tensor(a3!) main_grad, "
          MOEX_FP8_ARGS ") -> ()");
    // ---- grouped linear on G separate [N, K] weights (GroupedLinear's weight0..), through ptrs, an
    // int64 tensor of their addresses on their device (moex's discrete weights) followed by room
    // for their kept maps (weight_maps_size bytes), and ptrs_host, the copy the host reads: a cache
    // that the operators keep current (kernels.cpp's discrete_weight); C++ only, eager only
    m.def("grouped_linear_discrete_forward(Tensor x, Tensor[] weights, Tensor ptrs, Tensor ptrs_host, Tensor splits, "
          "Tensor? bias, Tensor? probs, SymInt bias_mode, " MOEX_FP8_ARGS ") -> Tensor");
    m.def("grouped_linear_discrete_backward_data(Tensor dy, Tensor[] weights, Tensor ptrs, Tensor ptrs_host, Tensor splits, "
          "Tensor? bias, Tensor? probs, SymInt bias_mode, bool need_dx, bool need_dbias, bool need_dprobs, "
          MOEX_FP8_ARGS ") -> (Tensor, Tensor, Tensor)");
    m.def("weight_maps_size(Tensor weight, int groups) -> int");
    // ---- grouped MLP (docs/ops.md section 4)
    m.def("grouped_mlp_forward(Tensor x, Tensor w1, Tensor? b1, Tensor w2, Tensor? b2, Tensor? probs, Tensor splits, "
          "SymInt b2_mode, " MOEX_GLU_ARGS ", bool save_z, " MOEX_FP8_ARGS ") -> (Tensor, Tensor, Tensor)");
    m.def("grouped_mlp_backward(Tensor x, Tensor w1, Tensor? b1, Tensor w2, Tensor? b2, Tensor? probs, Tensor splits, "
          "Tensor(a7!) h, Tensor z, Tensor dy, SymInt b2_mode, " MOEX_GLU_ARGS ", bool[] needs, " MOEX_FP8_ARGS
          ") -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
    // ---- MoE layer (docs/ops.md section 8)
    m.def("moe_layer_forward(Tensor x, Tensor router_w, Tensor w1, Tensor? b1, Tensor w2, Tensor? b2, SymInt topk, "
          "SymInt score, SymInt norm, SymInt b2_mode, " MOEX_GLU_ARGS ", " MOEX_FP8_ARGS ") -> (Tensor, Tensor)");
    m.def("moe_layer_backward(Tensor x, Tensor router_w, Tensor w1, Tensor? b1, Tensor w2, Tensor? b2, Tensor saved, "
          "Tensor dy, SymInt topk, SymInt score, SymInt norm, SymInt b2_mode, " MOEX_GLU_ARGS ", bool[] needs, "
          MOEX_FP8_ARGS ") -> Tensor[]");
    // ---- scaled GLU (docs/ops.md section 3), splits_to_offsets (section 1)
    m.def("scaled_glu_forward(Tensor h, Tensor? probs, Tensor? splits, " MOEX_GLU_ARGS ") -> Tensor");
    m.def("scaled_glu_backward(Tensor h, Tensor? probs, Tensor? splits, Tensor dz, " MOEX_GLU_ARGS
          ", bool need_dprobs) -> (Tensor, Tensor)");
    m.def("splits_to_offsets(Tensor splits, SymInt stride, bool leading_zero, SymInt dtype_code) -> Tensor");
    // ---- routing (docs/ops.md sections 5-7)
    m.def("router_forward(Tensor logits, SymInt topk, SymInt score, SymInt norm) -> (Tensor, Tensor)");
    m.def("router_backward(Tensor logits, Tensor ids, Tensor dprobs, SymInt topk, SymInt score, SymInt norm) -> Tensor");
    m.def("permute_forward(Tensor x, Tensor ids, Tensor probs, SymInt num_experts) -> (Tensor, Tensor, Tensor, Tensor)");
    m.def("permute_backward(Tensor row_map, Tensor dxp, Tensor dprobs_p, SymInt k) -> (Tensor, Tensor)");
    m.def("unpermute_forward(Tensor yp, Tensor row_map, SymInt k) -> Tensor");
    m.def("unpermute_backward(Tensor dy, Tensor row_map) -> Tensor");
}
