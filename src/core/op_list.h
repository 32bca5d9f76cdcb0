/*
 * op_list.h - private: the list of public operations, written once. Each row is
 *   X(ID, name, args type, dims type): an op composed in its file (src/core/<family>.c) of
 *       backend primitives: its three functions moex_op_<name>_validate, _ws and _run there;
 *   P(ID, name, args type, dims type, primitive): an op that is one backend primitive with the
 *       op's own signature (backend.h's <primitive>_ws and <primitive>): moex_op_<name>_validate
 *       in its file, and the primitive is its workspace query and its run;
 * the op id MOEX_OP_<ID>, the public pair moex_<name>_workspace_size / moex_<name>, its
 * argument struct, and the dims its validation fills (src/core/moex_impl.h). The ids, the
 * names and the dispatch's cases (src/core/op.c) and the declarations of the op functions
 * (src/core/op.h) come from this list; the functions are plain definitions in their files.
 * The rows repeat in shape by design: one an operation.
 *
 * Adding an operation: docs/architecture.md, "Adding an operation" (every step, in order: a
 * row here is one of them).
 */
#ifndef MOEX_OP_LIST_H
#define MOEX_OP_LIST_H

#define MOEX_OPS(X, P)                                                                                                \
    P(SPLITS_TO_OFFSETS, splits_to_offsets, moex_splits_to_offsets_args, moex_splits_dims, splits_to_offsets)         \
    X(ZERO_TAIL, zero_tail, moex_zero_tail_args, moex_tail_dims)                                                      \
    X(WEIGHT_MAPS_WRITE, weight_maps_write, moex_weight_maps_write_args, moex_gl_dims)                                \
    X(GROUPED_LINEAR_FORWARD, grouped_linear_forward, moex_grouped_linear_args, moex_gl_dims)                         \
    X(GROUPED_LINEAR_BACKWARD_DATA, grouped_linear_backward_data, moex_grouped_linear_dgrad_args, moex_gl_dims)       \
    X(GROUPED_LINEAR_BACKWARD_WEIGHT, grouped_linear_backward_weight, moex_grouped_linear_wgrad_args, moex_gl_dims)   \
    X(SCALED_GLU_FORWARD, scaled_glu_forward, moex_scaled_glu_args, moex_glu_dims)                                    \
    X(SCALED_GLU_BACKWARD, scaled_glu_backward, moex_scaled_glu_grad_args, moex_glu_dims)                             \
    X(GROUPED_MLP_FORWARD, grouped_mlp_forward, moex_grouped_mlp_args, moex_mlp_dims)                                 \
    X(GROUPED_MLP_BACKWARD, grouped_mlp_backward, moex_grouped_mlp_grad_args, moex_mlp_dims)                          \
    P(ROUTER_FORWARD, router_forward, moex_router_args, moex_router_dims, router_fwd)                                 \
    P(ROUTER_BACKWARD, router_backward, moex_router_grad_args, moex_router_dims, router_bwd)                          \
    P(PERMUTE_FORWARD, permute_forward, moex_permute_args, moex_perm_dims, permute_fwd)                               \
    P(PERMUTE_BACKWARD, permute_backward, moex_permute_grad_args, moex_perm_dims, permute_bwd)                        \
    P(UNPERMUTE_FORWARD, unpermute_forward, moex_unpermute_args, moex_perm_dims, unpermute_fwd)                       \
    P(UNPERMUTE_BACKWARD, unpermute_backward, moex_unpermute_grad_args, moex_perm_dims, unpermute_bwd)                \
    X(MOE_LAYER_FORWARD, moe_layer_forward, moex_moe_layer_args, moex_moe_dims)                                       \
    X(MOE_LAYER_BACKWARD, moe_layer_backward, moex_moe_layer_grad_args, moex_moe_dims)                                \
    X(GROUP_QUANTIZE, group_quantize, moex_group_quantize_args, moex_quant_dims)                                      \
    X(GROUP_DEQUANTIZE, group_dequantize, moex_group_dequantize_args, moex_quant_dims)                                \
    P(WEIGHT_QUANTIZE, weight_quantize, moex_weight_quantize_args, moex_quant_dims, weight_quantize)                  \
    P(WEIGHT_DEQUANTIZE, weight_dequantize, moex_weight_dequantize_args, moex_quant_dims, weight_dequantize)          \
    X(GROUPED_LINEAR_FP8_FORWARD, grouped_linear_fp8_forward, moex_grouped_linear_fp8_args, moex_fp8_dims)            \
    X(GROUPED_LINEAR_FP8_BACKWARD_WEIGHT, grouped_linear_fp8_backward_weight, moex_grouped_linear_fp8_wgrad_args,     \
      moex_fp8_dims)                                                                                                  \
    X(EP_DISPATCH_FORWARD, ep_dispatch_forward, moex_ep_dispatch_args, moex_ep_dims)                                  \
    X(EP_DISPATCH_BACKWARD, ep_dispatch_backward, moex_ep_dispatch_grad_args, moex_ep_dims)                           \
    X(EP_COMBINE_FORWARD, ep_combine_forward, moex_ep_combine_args, moex_ep_dims)                                     \
    X(EP_COMBINE_BACKWARD, ep_combine_backward, moex_ep_combine_grad_args, moex_ep_dims)                              \
    X(EP_MOE_LAYER_FORWARD, ep_moe_layer_forward, moex_ep_moe_layer_args, moex_ep_dims)                               \
    X(EP_MOE_LAYER_BACKWARD, ep_moe_layer_backward, moex_ep_moe_layer_grad_args, moex_ep_dims)

/* MOEX_OP_NONE (0) names no operation: the CUDA bad-input flag's "nothing seen". */
#define MOEX_OP_ENUM_(ID, name, args_t, dims_t) MOEX_OP_##ID,
#define MOEX_OP_ENUM_P_(ID, name, args_t, dims_t, prim) MOEX_OP_##ID,
typedef enum moex_op_id { MOEX_OP_NONE = 0, MOEX_OPS(MOEX_OP_ENUM_, MOEX_OP_ENUM_P_) MOEX_OP_COUNT } moex_op_id;
#undef MOEX_OP_ENUM_
#undef MOEX_OP_ENUM_P_

#ifdef __cplusplus
extern "C" {
#endif

/* "moex_<name>" of an op id ("an unknown operation" outside the list). */
const char *moex_op_name(moex_op_id id);

#ifdef __cplusplus
}
#endif

#endif /* MOEX_OP_LIST_H */
