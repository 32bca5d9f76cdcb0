/*
 * api.c - the public pair of every operation of op_list.h, in its order (that of moex.h,
 * moex_fp8.h and moex_ep.h): moex_<name>_workspace_size and moex_<name>, each one call into
 * op.c (op.h), which validates, checks the workspace and runs the op's composition (its
 * file: src/core/<family>.c). Plain definitions, so that grep finds each; their shapes
 * repeat by design.
 */
#include "op.h"

/* ---- splits and weights (moex.h) ----------------------------------------------------- */

moex_status moex_splits_to_offsets_workspace_size(moex_context *ctx, const moex_splits_to_offsets_args *args,
                                                  size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_SPLITS_TO_OFFSETS, args, bytes);
}

moex_status moex_splits_to_offsets(moex_context *ctx, const moex_splits_to_offsets_args *args, void *workspace,
                                   size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_SPLITS_TO_OFFSETS, args, workspace, workspace_bytes, stream);
}

moex_status moex_zero_tail_workspace_size(moex_context *ctx, const moex_zero_tail_args *args, size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_ZERO_TAIL, args, bytes);
}

moex_status moex_zero_tail(moex_context *ctx, const moex_zero_tail_args *args, void *workspace, size_t workspace_bytes,
                           moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_ZERO_TAIL, args, workspace, workspace_bytes, stream);
}

moex_status moex_weight_maps_write_workspace_size(moex_context *ctx, const moex_weight_maps_write_args *args,
                                                  size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_WEIGHT_MAPS_WRITE, args, bytes);
}

moex_status moex_weight_maps_write(moex_context *ctx, const moex_weight_maps_write_args *args, void *workspace,
                                   size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_WEIGHT_MAPS_WRITE, args, workspace, workspace_bytes, stream);
}

/* ---- grouped linear (moex.h) --------------------------------------------------------- */

moex_status moex_grouped_linear_forward_workspace_size(moex_context *ctx, const moex_grouped_linear_args *args,
                                                       size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_GROUPED_LINEAR_FORWARD, args, bytes);
}

moex_status moex_grouped_linear_forward(moex_context *ctx, const moex_grouped_linear_args *args, void *workspace,
                                        size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_GROUPED_LINEAR_FORWARD, args, workspace, workspace_bytes, stream);
}

moex_status moex_grouped_linear_backward_data_workspace_size(moex_context *ctx,
                                                             const moex_grouped_linear_dgrad_args *args,
                                                             size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_GROUPED_LINEAR_BACKWARD_DATA, args, bytes);
}

moex_status moex_grouped_linear_backward_data(moex_context *ctx, const moex_grouped_linear_dgrad_args *args,
                                              void *workspace, size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_GROUPED_LINEAR_BACKWARD_DATA, args, workspace, workspace_bytes, stream);
}

moex_status moex_grouped_linear_backward_weight_workspace_size(moex_context *ctx,
                                                               const moex_grouped_linear_wgrad_args *args,
                                                               size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_GROUPED_LINEAR_BACKWARD_WEIGHT, args, bytes);
}

moex_status moex_grouped_linear_backward_weight(moex_context *ctx, const moex_grouped_linear_wgrad_args *args,
                                                void *workspace, size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_GROUPED_LINEAR_BACKWARD_WEIGHT, args, workspace, workspace_bytes, stream);
}

/* ---- scaled GLU (moex.h) ------------------------------------------------------------- */

moex_status moex_scaled_glu_forward_workspace_size(moex_context *ctx, const moex_scaled_glu_args *args, size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_SCALED_GLU_FORWARD, args, bytes);
}

moex_status moex_scaled_glu_forward(moex_context *ctx, const moex_scaled_glu_args *args, void *workspace,
                                    size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_SCALED_GLU_FORWARD, args, workspace, workspace_bytes, stream);
}

moex_status moex_scaled_glu_backward_workspace_size(moex_context *ctx, const moex_scaled_glu_grad_args *args,
                                                    size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_SCALED_GLU_BACKWARD, args, bytes);
}

moex_status moex_scaled_glu_backward(moex_context *ctx, const moex_scaled_glu_grad_args *args, void *workspace,
                                     size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_SCALED_GLU_BACKWARD, args, workspace, workspace_bytes, stream);
}

/* ---- grouped MLP (moex.h) ------------------------------------------------------------ */

moex_status moex_grouped_mlp_forward_workspace_size(moex_context *ctx, const moex_grouped_mlp_args *args,
                                                    size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_GROUPED_MLP_FORWARD, args, bytes);
}

moex_status moex_grouped_mlp_forward(moex_context *ctx, const moex_grouped_mlp_args *args, void *workspace,
                                     size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_GROUPED_MLP_FORWARD, args, workspace, workspace_bytes, stream);
}

moex_status moex_grouped_mlp_backward_workspace_size(moex_context *ctx, const moex_grouped_mlp_grad_args *args,
                                                     size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_GROUPED_MLP_BACKWARD, args, bytes);
}

moex_status moex_grouped_mlp_backward(moex_context *ctx, const moex_grouped_mlp_grad_args *args, void *workspace,
                                      size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_GROUPED_MLP_BACKWARD, args, workspace, workspace_bytes, stream);
}

/* ---- routing (moex.h) ---------------------------------------------------------------- */

moex_status moex_router_forward_workspace_size(moex_context *ctx, const moex_router_args *args, size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_ROUTER_FORWARD, args, bytes);
}

moex_status moex_router_forward(moex_context *ctx, const moex_router_args *args, void *workspace,
                                size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_ROUTER_FORWARD, args, workspace, workspace_bytes, stream);
}

moex_status moex_router_backward_workspace_size(moex_context *ctx, const moex_router_grad_args *args, size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_ROUTER_BACKWARD, args, bytes);
}

moex_status moex_router_backward(moex_context *ctx, const moex_router_grad_args *args, void *workspace,
                                 size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_ROUTER_BACKWARD, args, workspace, workspace_bytes, stream);
}

moex_status moex_permute_forward_workspace_size(moex_context *ctx, const moex_permute_args *args, size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_PERMUTE_FORWARD, args, bytes);
}

moex_status moex_permute_forward(moex_context *ctx, const moex_permute_args *args, void *workspace,
                                 size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_PERMUTE_FORWARD, args, workspace, workspace_bytes, stream);
}

moex_status moex_permute_backward_workspace_size(moex_context *ctx, const moex_permute_grad_args *args, size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_PERMUTE_BACKWARD, args, bytes);
}

moex_status moex_permute_backward(moex_context *ctx, const moex_permute_grad_args *args, void *workspace,
                                  size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_PERMUTE_BACKWARD, args, workspace, workspace_bytes, stream);
}

moex_status moex_unpermute_forward_workspace_size(moex_context *ctx, const moex_unpermute_args *args, size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_UNPERMUTE_FORWARD, args, bytes);
}

moex_status moex_unpermute_forward(moex_context *ctx, const moex_unpermute_args *args, void *workspace,
                                   size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_UNPERMUTE_FORWARD, args, workspace, workspace_bytes, stream);
}

moex_status moex_unpermute_backward_workspace_size(moex_context *ctx, const moex_unpermute_grad_args *args,
                                                   size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_UNPERMUTE_BACKWARD, args, bytes);
}

moex_status moex_unpermute_backward(moex_context *ctx, const moex_unpermute_grad_args *args, void *workspace,
                                    size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_UNPERMUTE_BACKWARD, args, workspace, workspace_bytes, stream);
}

/* ---- MoE layer (moex.h) -------------------------------------------------------------- */

moex_status moex_moe_layer_forward_workspace_size(moex_context *ctx, const moex_moe_layer_args *args, size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_MOE_LAYER_FORWARD, args, bytes);
}

moex_status moex_moe_layer_forward(moex_context *ctx, const moex_moe_layer_args *args, void *workspace,
                                   size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_MOE_LAYER_FORWARD, args, workspace, workspace_bytes, stream);
}

moex_status moex_moe_layer_backward_workspace_size(moex_context *ctx, const moex_moe_layer_grad_args *args,
                                                   size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_MOE_LAYER_BACKWARD, args, bytes);
}

moex_status moex_moe_layer_backward(moex_context *ctx, const moex_moe_layer_grad_args *args, void *workspace,
                                    size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_MOE_LAYER_BACKWARD, args, workspace, workspace_bytes, stream);
}

/* ---- FP8 quantization (moex_fp8.h) --------------------------------------------------- */

moex_status moex_group_quantize_workspace_size(moex_context *ctx, const moex_group_quantize_args *args, size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_GROUP_QUANTIZE, args, bytes);
}

moex_status moex_group_quantize(moex_context *ctx, const moex_group_quantize_args *args, void *workspace,
                                size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_GROUP_QUANTIZE, args, workspace, workspace_bytes, stream);
}

moex_status moex_group_dequantize_workspace_size(moex_context *ctx, const moex_group_dequantize_args *args,
                                                 size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_GROUP_DEQUANTIZE, args, bytes);
}

moex_status moex_group_dequantize(moex_context *ctx, const moex_group_dequantize_args *args, void *workspace,
                                  size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_GROUP_DEQUANTIZE, args, workspace, workspace_bytes, stream);
}

moex_status moex_weight_quantize_workspace_size(moex_context *ctx, const moex_weight_quantize_args *args,
                                                size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_WEIGHT_QUANTIZE, args, bytes);
}

moex_status moex_weight_quantize(moex_context *ctx, const moex_weight_quantize_args *args, void *workspace,
                                 size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_WEIGHT_QUANTIZE, args, workspace, workspace_bytes, stream);
}

moex_status moex_weight_dequantize_workspace_size(moex_context *ctx, const moex_weight_dequantize_args *args,
                                                  size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_WEIGHT_DEQUANTIZE, args, bytes);
}

moex_status moex_weight_dequantize(moex_context *ctx, const moex_weight_dequantize_args *args, void *workspace,
                                   size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_WEIGHT_DEQUANTIZE, args, workspace, workspace_bytes, stream);
}

/* ---- FP8 grouped linear (moex_fp8.h) ------------------------------------------------- */

moex_status moex_grouped_linear_fp8_forward_workspace_size(moex_context *ctx, const moex_grouped_linear_fp8_args *args,
                                                           size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_GROUPED_LINEAR_FP8_FORWARD, args, bytes);
}

moex_status moex_grouped_linear_fp8_forward(moex_context *ctx, const moex_grouped_linear_fp8_args *args,
                                            void *workspace, size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_GROUPED_LINEAR_FP8_FORWARD, args, workspace, workspace_bytes, stream);
}

moex_status moex_grouped_linear_fp8_backward_weight_workspace_size(moex_context *ctx,
                                                                   const moex_grouped_linear_fp8_wgrad_args *args,
                                                                   size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_GROUPED_LINEAR_FP8_BACKWARD_WEIGHT, args, bytes);
}

moex_status moex_grouped_linear_fp8_backward_weight(moex_context *ctx, const moex_grouped_linear_fp8_wgrad_args *args,
                                                    void *workspace, size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_GROUPED_LINEAR_FP8_BACKWARD_WEIGHT, args, workspace, workspace_bytes, stream);
}

/* ---- expert parallelism (moex_ep.h) -------------------------------------------------- */

moex_status moex_ep_dispatch_forward_workspace_size(moex_context *ctx, const moex_ep_dispatch_args *args,
                                                    size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_EP_DISPATCH_FORWARD, args, bytes);
}

moex_status moex_ep_dispatch_forward(moex_context *ctx, const moex_ep_dispatch_args *args, void *workspace,
                                     size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_EP_DISPATCH_FORWARD, args, workspace, workspace_bytes, stream);
}

moex_status moex_ep_dispatch_backward_workspace_size(moex_context *ctx, const moex_ep_dispatch_grad_args *args,
                                                     size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_EP_DISPATCH_BACKWARD, args, bytes);
}

moex_status moex_ep_dispatch_backward(moex_context *ctx, const moex_ep_dispatch_grad_args *args, void *workspace,
                                      size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_EP_DISPATCH_BACKWARD, args, workspace, workspace_bytes, stream);
}

moex_status moex_ep_combine_forward_workspace_size(moex_context *ctx, const moex_ep_combine_args *args, size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_EP_COMBINE_FORWARD, args, bytes);
}

moex_status moex_ep_combine_forward(moex_context *ctx, const moex_ep_combine_args *args, void *workspace,
                                    size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_EP_COMBINE_FORWARD, args, workspace, workspace_bytes, stream);
}

moex_status moex_ep_combine_backward_workspace_size(moex_context *ctx, const moex_ep_combine_grad_args *args,
                                                    size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_EP_COMBINE_BACKWARD, args, bytes);
}

moex_status moex_ep_combine_backward(moex_context *ctx, const moex_ep_combine_grad_args *args, void *workspace,
                                     size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_EP_COMBINE_BACKWARD, args, workspace, workspace_bytes, stream);
}

moex_status moex_ep_moe_layer_forward_workspace_size(moex_context *ctx, const moex_ep_moe_layer_args *args,
                                                     size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_EP_MOE_LAYER_FORWARD, args, bytes);
}

moex_status moex_ep_moe_layer_forward(moex_context *ctx, const moex_ep_moe_layer_args *args, void *workspace,
                                      size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_EP_MOE_LAYER_FORWARD, args, workspace, workspace_bytes, stream);
}

moex_status moex_ep_moe_layer_backward_workspace_size(moex_context *ctx, const moex_ep_moe_layer_grad_args *args,
                                                      size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_EP_MOE_LAYER_BACKWARD, args, bytes);
}

moex_status moex_ep_moe_layer_backward(moex_context *ctx, const moex_ep_moe_layer_grad_args *args, void *workspace,
                                       size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_EP_MOE_LAYER_BACKWARD, args, workspace, workspace_bytes, stream);
}
