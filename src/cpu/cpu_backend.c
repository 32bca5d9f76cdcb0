/*
 * cpu_backend.c - the CPU backend's table of primitives (src/core/backend.h) and its
 * construction.
 */
#include "cpu_ops.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static moex_status zero_f32(moex_context *ctx, const moex_call *c, float *p, int64_t n) {
    if (n > 0) memset(p, 0, (size_t)n * sizeof(float));
    return MOEX_OK;
}

#define PRIMITIVE(field, fn) .field##_ws = moex_cpu_##fn##_ws, .field = moex_cpu_##fn

static const moex_backend_ops cpu_ops = {
    .name = "cpu",
    .host_memory = true,
    .groups_ws = moex_cpu_groups_ws,
    .groups_prepare = moex_cpu_groups_prepare,
    PRIMITIVE(linear_fwd, grouped_linear_forward),
    PRIMITIVE(linear_dgrad, grouped_linear_backward_data),
    PRIMITIVE(linear_wgrad, grouped_linear_backward_weight),
    PRIMITIVE(glu_fwd, scaled_glu_forward),
    PRIMITIVE(glu_bwd, scaled_glu_backward),
    PRIMITIVE(splits_to_offsets, splits_to_offsets),
    PRIMITIVE(router_fwd, router_forward),
    PRIMITIVE(router_bwd, router_backward),
    PRIMITIVE(permute_fwd, permute_forward),
    PRIMITIVE(permute_bwd, permute_backward),
    PRIMITIVE(unpermute_fwd, unpermute_forward),
    PRIMITIVE(unpermute_bwd, unpermute_backward),
    PRIMITIVE(gemm, dense_gemm),
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
