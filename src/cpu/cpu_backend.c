/*
 * cpu_backend.c - the CPU backend's table of primitives (src/core/backend.h) and its
 * construction.
 */
#include "cpu_ops.h"
#include "ep.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static moex_status zero_f32(moex_context *ctx, const moex_call *c, float *p, int64_t n) {
    if (n > 0) memset(p, 0, (size_t)n * sizeof(float));
    return MOEX_OK;
}

/* One named entry a primitive (backend.h's field = its definition), so grep finds each: alike
 * line for line with cuda_backend.cu's table by design. */
static const moex_backend_ops cpu_ops = {
    .name = "cpu",
    .host_memory = true,
    .groups_ws = moex_cpu_groups_ws,
    .groups_prepare = moex_cpu_groups_prepare,
    .linear_fwd_ws = moex_cpu_linear_fwd_ws,
    .linear_fwd = moex_cpu_linear_fwd,
    .linear_dgrad_ws = moex_cpu_linear_dgrad_ws,
    .linear_dgrad = moex_cpu_linear_dgrad,
    .linear_wgrad_ws = moex_cpu_linear_wgrad_ws,
    .linear_wgrad = moex_cpu_linear_wgrad,
    .glu_fwd_ws = moex_cpu_glu_fwd_ws,
    .glu_fwd = moex_cpu_glu_fwd,
    .glu_bwd_ws = moex_cpu_glu_bwd_ws,
    .glu_bwd = moex_cpu_glu_bwd,
    .quantize_ws = moex_cpu_quantize_ws,
    .quantize = moex_cpu_quantize,
    .dequantize_ws = moex_cpu_dequantize_ws,
    .dequantize = moex_cpu_dequantize,
    .cast_rows_ws = moex_cpu_cast_rows_ws,
    .cast_rows = moex_cpu_cast_rows,
    .zero_tail_ws = moex_cpu_zero_tail_ws,
    .zero_tail = moex_cpu_zero_tail,
    .splits_to_offsets_ws = moex_cpu_splits_to_offsets_ws,
    .splits_to_offsets = moex_cpu_splits_to_offsets,
    .router_fwd_ws = moex_cpu_router_fwd_ws,
    .router_fwd = moex_cpu_router_fwd,
    .router_bwd_ws = moex_cpu_router_bwd_ws,
    .router_bwd = moex_cpu_router_bwd,
    .permute_fwd_ws = moex_cpu_permute_fwd_ws,
    .permute_fwd = moex_cpu_permute_fwd,
    .permute_bwd_ws = moex_cpu_permute_bwd_ws,
    .permute_bwd = moex_cpu_permute_bwd,
    .unpermute_fwd_ws = moex_cpu_unpermute_fwd_ws,
    .unpermute_fwd = moex_cpu_unpermute_fwd,
    .unpermute_bwd_ws = moex_cpu_unpermute_bwd_ws,
    .unpermute_bwd = moex_cpu_unpermute_bwd,
    .weight_quantize_ws = moex_cpu_weight_quantize_ws,
    .weight_quantize = moex_cpu_weight_quantize,
    .weight_dequantize_ws = moex_cpu_weight_dequantize_ws,
    .weight_dequantize = moex_cpu_weight_dequantize,
    .weight_maps_size = moex_cpu_weight_maps_size,
    .weight_maps_write = moex_cpu_weight_maps_write,
    .weight_copy_ws = moex_cpu_weight_copy_ws,
    .weight_copy = moex_cpu_weight_copy,
    .dense_gemm_ws = moex_cpu_dense_gemm_ws,
    .dense_gemm = moex_cpu_dense_gemm,
    .ep = &moex_cpu_ep_kernels,
    .zero_f32 = zero_f32,
    .destroy = moex_cpu_state_destroy,
};

moex_status moex_cpu_backend_init(moex_context *ctx) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    const char *env = getenv("MOEX_NUM_THREADS");
    if (env && atoi(env) > 0) n = atoi(env);
    ctx->num_threads = n > 0 ? (int)(n > 256 ? 256 : n) : 1;
    ctx->ops = &cpu_ops;
    return moex_cpu_state_create(ctx);
}
