/*
 * abi_layout.c - the layout of every struct of include/moex.h (with the experimental
 * moex_fp8.h and moex_ep.h it includes) as this compiler lays it out, for
 * tests/abi/test_abi.py, which compares it with the ctypes mirrors of python/moex/_capi.py.
 *
 * Output, one line each (all numbers in bytes):
 *     struct <name> <sizeof> <alignof>
 *     field <struct> <field> <offsetof> <sizeof>
 * The list is written by hand from the headers, header by header in each one's order: a
 * struct or field added to moex.h (or a header it includes) and not here fails test_abi.py
 * (it parses the headers for the names), so the list cannot fall behind silently.
 */
#include <stdalign.h>
#include <stddef.h>
#include <stdio.h>

#include "moex.h"

#define STRUCT(S) printf("struct %s %zu %zu\n", #S, sizeof(S), alignof(S))
#define FIELD(S, f) printf("field %s %s %zu %zu\n", #S, #f, offsetof(S, f), sizeof(((S *)0)->f))

int main(void) {
    /* moex.h */
    STRUCT(moex_tensor);
    FIELD(moex_tensor, data);
    FIELD(moex_tensor, dtype);
    FIELD(moex_tensor, ndim);
    FIELD(moex_tensor, shape);

    STRUCT(moex_weight);
    FIELD(moex_weight, t);
    FIELD(moex_weight, ptrs);
    FIELD(moex_weight, maps);

    STRUCT(moex_offsets_output);
    FIELD(moex_offsets_output, out);
    FIELD(moex_offsets_output, stride);
    FIELD(moex_offsets_output, start);

    STRUCT(moex_splits_to_offsets_args);
    FIELD(moex_splits_to_offsets_args, splits);
    FIELD(moex_splits_to_offsets_args, num_outputs);
    FIELD(moex_splits_to_offsets_args, outputs);

    STRUCT(moex_zero_tail_args);
    FIELD(moex_zero_tail_args, x);
    FIELD(moex_zero_tail_args, splits);
    STRUCT(moex_weight_maps_write_args);
    FIELD(moex_weight_maps_write_args, w);
    FIELD(moex_weight_maps_write_args, maps);
    FIELD(moex_weight_maps_write_args, maps_bytes);

    STRUCT(moex_grouped_linear_args);
    FIELD(moex_grouped_linear_args, x);
    FIELD(moex_grouped_linear_args, w);
    FIELD(moex_grouped_linear_args, bias_mode);
    FIELD(moex_grouped_linear_args, bias);
    FIELD(moex_grouped_linear_args, probs);
    FIELD(moex_grouped_linear_args, splits);
    FIELD(moex_grouped_linear_args, y);
    FIELD(moex_grouped_linear_args, fp8);

    STRUCT(moex_grouped_linear_dgrad_args);
    FIELD(moex_grouped_linear_dgrad_args, dy);
    FIELD(moex_grouped_linear_dgrad_args, w);
    FIELD(moex_grouped_linear_dgrad_args, bias_mode);
    FIELD(moex_grouped_linear_dgrad_args, bias);
    FIELD(moex_grouped_linear_dgrad_args, probs);
    FIELD(moex_grouped_linear_dgrad_args, splits);
    FIELD(moex_grouped_linear_dgrad_args, dx);
    FIELD(moex_grouped_linear_dgrad_args, dbias);
    FIELD(moex_grouped_linear_dgrad_args, dprobs);
    FIELD(moex_grouped_linear_dgrad_args, fp8);

    STRUCT(moex_grouped_linear_wgrad_args);
    FIELD(moex_grouped_linear_wgrad_args, x);
    FIELD(moex_grouped_linear_wgrad_args, dy);
    FIELD(moex_grouped_linear_wgrad_args, splits);
    FIELD(moex_grouped_linear_wgrad_args, dw_mode);
    FIELD(moex_grouped_linear_wgrad_args, dw);
    FIELD(moex_grouped_linear_wgrad_args, fp8);

    STRUCT(moex_glu_params);
    FIELD(moex_glu_params, kind);
    FIELD(moex_glu_params, layout);
    FIELD(moex_glu_params, limit);
    FIELD(moex_glu_params, alpha);
    FIELD(moex_glu_params, offset);

    STRUCT(moex_scaled_glu_args);
    FIELD(moex_scaled_glu_args, glu);
    FIELD(moex_scaled_glu_args, h);
    FIELD(moex_scaled_glu_args, probs);
    FIELD(moex_scaled_glu_args, splits);
    FIELD(moex_scaled_glu_args, z);
    FIELD(moex_scaled_glu_args, zq_params);
    FIELD(moex_scaled_glu_args, zq_rowwise);
    FIELD(moex_scaled_glu_args, zq_columnwise);
    FIELD(moex_scaled_glu_args, zq_amax);

    STRUCT(moex_scaled_glu_grad_args);
    FIELD(moex_scaled_glu_grad_args, glu);
    FIELD(moex_scaled_glu_grad_args, h);
    FIELD(moex_scaled_glu_grad_args, probs);
    FIELD(moex_scaled_glu_grad_args, splits);
    FIELD(moex_scaled_glu_grad_args, dz);
    FIELD(moex_scaled_glu_grad_args, dh);
    FIELD(moex_scaled_glu_grad_args, dprobs);

    STRUCT(moex_grouped_mlp_args);
    FIELD(moex_grouped_mlp_args, x);
    FIELD(moex_grouped_mlp_args, w1);
    FIELD(moex_grouped_mlp_args, b1);
    FIELD(moex_grouped_mlp_args, w2);
    FIELD(moex_grouped_mlp_args, b2_mode);
    FIELD(moex_grouped_mlp_args, b2);
    FIELD(moex_grouped_mlp_args, probs);
    FIELD(moex_grouped_mlp_args, glu);
    FIELD(moex_grouped_mlp_args, splits);
    FIELD(moex_grouped_mlp_args, h);
    FIELD(moex_grouped_mlp_args, z);
    FIELD(moex_grouped_mlp_args, y);
    FIELD(moex_grouped_mlp_args, fp8);

    STRUCT(moex_grouped_mlp_grad_args);
    FIELD(moex_grouped_mlp_grad_args, x);
    FIELD(moex_grouped_mlp_grad_args, w1);
    FIELD(moex_grouped_mlp_grad_args, w2);
    FIELD(moex_grouped_mlp_grad_args, b2_mode);
    FIELD(moex_grouped_mlp_grad_args, b2);
    FIELD(moex_grouped_mlp_grad_args, probs);
    FIELD(moex_grouped_mlp_grad_args, glu);
    FIELD(moex_grouped_mlp_grad_args, splits);
    FIELD(moex_grouped_mlp_grad_args, h);
    FIELD(moex_grouped_mlp_grad_args, z);
    FIELD(moex_grouped_mlp_grad_args, dy);
    FIELD(moex_grouped_mlp_grad_args, dx);
    FIELD(moex_grouped_mlp_grad_args, dw_mode);
    FIELD(moex_grouped_mlp_grad_args, dw1);
    FIELD(moex_grouped_mlp_grad_args, dw2);
    FIELD(moex_grouped_mlp_grad_args, db1);
    FIELD(moex_grouped_mlp_grad_args, db2);
    FIELD(moex_grouped_mlp_grad_args, dprobs);
    FIELD(moex_grouped_mlp_grad_args, h_mode);
    FIELD(moex_grouped_mlp_grad_args, fp8);

    STRUCT(moex_router_args);
    FIELD(moex_router_args, logits);
    FIELD(moex_router_args, topk);
    FIELD(moex_router_args, score);
    FIELD(moex_router_args, norm);
    FIELD(moex_router_args, probs);
    FIELD(moex_router_args, ids);

    STRUCT(moex_router_grad_args);
    FIELD(moex_router_grad_args, logits);
    FIELD(moex_router_grad_args, topk);
    FIELD(moex_router_grad_args, score);
    FIELD(moex_router_grad_args, norm);
    FIELD(moex_router_grad_args, ids);
    FIELD(moex_router_grad_args, dprobs);
    FIELD(moex_router_grad_args, dlogits);

    STRUCT(moex_permute_args);
    FIELD(moex_permute_args, x);
    FIELD(moex_permute_args, ids);
    FIELD(moex_permute_args, probs);
    FIELD(moex_permute_args, num_experts);
    FIELD(moex_permute_args, xp);
    FIELD(moex_permute_args, probs_p);
    FIELD(moex_permute_args, splits);
    FIELD(moex_permute_args, row_map);

    STRUCT(moex_permute_grad_args);
    FIELD(moex_permute_grad_args, row_map);
    FIELD(moex_permute_grad_args, dxp);
    FIELD(moex_permute_grad_args, dprobs_p);
    FIELD(moex_permute_grad_args, dx);
    FIELD(moex_permute_grad_args, dprobs);

    STRUCT(moex_unpermute_args);
    FIELD(moex_unpermute_args, row_map);
    FIELD(moex_unpermute_args, yp);
    FIELD(moex_unpermute_args, y);

    STRUCT(moex_unpermute_grad_args);
    FIELD(moex_unpermute_grad_args, row_map);
    FIELD(moex_unpermute_grad_args, dy);
    FIELD(moex_unpermute_grad_args, dyp);

    STRUCT(moex_moe_layer_args);
    FIELD(moex_moe_layer_args, x);
    FIELD(moex_moe_layer_args, router_w);
    FIELD(moex_moe_layer_args, topk);
    FIELD(moex_moe_layer_args, score);
    FIELD(moex_moe_layer_args, norm);
    FIELD(moex_moe_layer_args, w1);
    FIELD(moex_moe_layer_args, b1);
    FIELD(moex_moe_layer_args, w2);
    FIELD(moex_moe_layer_args, b2_mode);
    FIELD(moex_moe_layer_args, b2);
    FIELD(moex_moe_layer_args, glu);
    FIELD(moex_moe_layer_args, saved);
    FIELD(moex_moe_layer_args, saved_bytes);
    FIELD(moex_moe_layer_args, y);
    FIELD(moex_moe_layer_args, fp8);

    STRUCT(moex_moe_layer_grad_args);
    FIELD(moex_moe_layer_grad_args, fwd);
    FIELD(moex_moe_layer_grad_args, dy);
    FIELD(moex_moe_layer_grad_args, dx);
    FIELD(moex_moe_layer_grad_args, dw_mode);
    FIELD(moex_moe_layer_grad_args, drouter_w);
    FIELD(moex_moe_layer_grad_args, dw1);
    FIELD(moex_moe_layer_grad_args, dw2);
    FIELD(moex_moe_layer_grad_args, db1);
    FIELD(moex_moe_layer_grad_args, db2);

    /* moex_fp8.h (experimental) */
    STRUCT(moex_quant_params);
    FIELD(moex_quant_params, recipe);
    FIELD(moex_quant_params, fp8);
    FIELD(moex_quant_params, amax_epsilon);
    FIELD(moex_quant_params, rounding);
    FIELD(moex_quant_params, scale_layout);

    STRUCT(moex_quant_tensor);
    FIELD(moex_quant_tensor, data);
    FIELD(moex_quant_tensor, scales);

    STRUCT(moex_fp8_weight);
    FIELD(moex_fp8_weight, rowwise);
    FIELD(moex_fp8_weight, columnwise);

    STRUCT(moex_fp8_recipe);
    FIELD(moex_fp8_recipe, mode);
    FIELD(moex_fp8_recipe, dtypes);
    FIELD(moex_fp8_recipe, pow2_scales);
    FIELD(moex_fp8_recipe, amax_epsilon);
    FIELD(moex_fp8_recipe, weights);

    STRUCT(moex_group_quantize_args);
    FIELD(moex_group_quantize_args, x);
    FIELD(moex_group_quantize_args, splits);
    FIELD(moex_group_quantize_args, params);
    FIELD(moex_group_quantize_args, rowwise);
    FIELD(moex_group_quantize_args, columnwise);
    FIELD(moex_group_quantize_args, amax);
    FIELD(moex_group_quantize_args, dbias);

    STRUCT(moex_group_dequantize_args);
    FIELD(moex_group_dequantize_args, params);
    FIELD(moex_group_dequantize_args, orientation);
    FIELD(moex_group_dequantize_args, src);
    FIELD(moex_group_dequantize_args, splits);
    FIELD(moex_group_dequantize_args, y);

    STRUCT(moex_weight_quantize_args);
    FIELD(moex_weight_quantize_args, w);
    FIELD(moex_weight_quantize_args, params);
    FIELD(moex_weight_quantize_args, rowwise);
    FIELD(moex_weight_quantize_args, columnwise);
    FIELD(moex_weight_quantize_args, amax);

    STRUCT(moex_weight_dequantize_args);
    FIELD(moex_weight_dequantize_args, params);
    FIELD(moex_weight_dequantize_args, orientation);
    FIELD(moex_weight_dequantize_args, src);
    FIELD(moex_weight_dequantize_args, w);

    STRUCT(moex_grouped_linear_fp8_args);
    FIELD(moex_grouped_linear_fp8_args, x_params);
    FIELD(moex_grouped_linear_fp8_args, x);
    FIELD(moex_grouped_linear_fp8_args, w_params);
    FIELD(moex_grouped_linear_fp8_args, w);
    FIELD(moex_grouped_linear_fp8_args, splits);
    FIELD(moex_grouped_linear_fp8_args, bias_mode);
    FIELD(moex_grouped_linear_fp8_args, bias);
    FIELD(moex_grouped_linear_fp8_args, probs);
    FIELD(moex_grouped_linear_fp8_args, y);

    STRUCT(moex_grouped_linear_fp8_wgrad_args);
    FIELD(moex_grouped_linear_fp8_wgrad_args, dy_params);
    FIELD(moex_grouped_linear_fp8_wgrad_args, dy);
    FIELD(moex_grouped_linear_fp8_wgrad_args, x_params);
    FIELD(moex_grouped_linear_fp8_wgrad_args, x);
    FIELD(moex_grouped_linear_fp8_wgrad_args, splits);
    FIELD(moex_grouped_linear_fp8_wgrad_args, dw_mode);
    FIELD(moex_grouped_linear_fp8_wgrad_args, dw);

    /* moex_ep.h (experimental) */
    STRUCT(moex_ep_config);
    FIELD(moex_ep_config, comm_kind);
    FIELD(moex_ep_config, comm);
    FIELD(moex_ep_config, num_experts);
    FIELD(moex_ep_config, topk);
    FIELD(moex_ep_config, hidden);
    FIELD(moex_ep_config, dtype);
    FIELD(moex_ep_config, max_tokens);
    FIELD(moex_ep_config, max_recv_rows);
    FIELD(moex_ep_config, transfer);

    STRUCT(moex_ep_info);
    FIELD(moex_ep_info, rank);
    FIELD(moex_ep_info, world);
    FIELD(moex_ep_info, local_experts);
    FIELD(moex_ep_info, transfer);
    FIELD(moex_ep_info, handle_bytes);

    STRUCT(moex_ep_dispatch_args);
    FIELD(moex_ep_dispatch_args, ep);
    FIELD(moex_ep_dispatch_args, x);
    FIELD(moex_ep_dispatch_args, ids);
    FIELD(moex_ep_dispatch_args, probs);
    FIELD(moex_ep_dispatch_args, handle);
    FIELD(moex_ep_dispatch_args, handle_bytes);
    FIELD(moex_ep_dispatch_args, xr);
    FIELD(moex_ep_dispatch_args, probs_r);
    FIELD(moex_ep_dispatch_args, splits);
    FIELD(moex_ep_dispatch_args, dropped);
    FIELD(moex_ep_dispatch_args, x_scales);
    FIELD(moex_ep_dispatch_args, xr_scales);

    STRUCT(moex_ep_dispatch_grad_args);
    FIELD(moex_ep_dispatch_grad_args, ep);
    FIELD(moex_ep_dispatch_grad_args, handle);
    FIELD(moex_ep_dispatch_grad_args, handle_bytes);
    FIELD(moex_ep_dispatch_grad_args, dxr);
    FIELD(moex_ep_dispatch_grad_args, dprobs_r);
    FIELD(moex_ep_dispatch_grad_args, dx);
    FIELD(moex_ep_dispatch_grad_args, dprobs);

    STRUCT(moex_ep_combine_args);
    FIELD(moex_ep_combine_args, ep);
    FIELD(moex_ep_combine_args, handle);
    FIELD(moex_ep_combine_args, handle_bytes);
    FIELD(moex_ep_combine_args, yr);
    FIELD(moex_ep_combine_args, y);

    STRUCT(moex_ep_combine_grad_args);
    FIELD(moex_ep_combine_grad_args, ep);
    FIELD(moex_ep_combine_grad_args, handle);
    FIELD(moex_ep_combine_grad_args, handle_bytes);
    FIELD(moex_ep_combine_grad_args, dy);
    FIELD(moex_ep_combine_grad_args, dyr);

    STRUCT(moex_ep_moe_layer_args);
    FIELD(moex_ep_moe_layer_args, ep);
    FIELD(moex_ep_moe_layer_args, layer);
    FIELD(moex_ep_moe_layer_args, dropped);

    STRUCT(moex_ep_moe_layer_grad_args);
    FIELD(moex_ep_moe_layer_grad_args, ep);
    FIELD(moex_ep_moe_layer_grad_args, layer);
    return 0;
}
