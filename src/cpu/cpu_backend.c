/*
 * cpu_backend.c - the CPU backend's function table and its construction.
 */
#include "cpu_ops.h"

#include <stdlib.h>
#include <unistd.h>

#define OP(name) .name##_ws = moex_cpu_##name##_ws, .name = moex_cpu_##name

static const moex_backend_ops cpu_ops = {
    .name = "cpu",
    OP(splits_to_offsets),
    OP(grouped_linear_forward),
    OP(grouped_linear_backward_data),
    OP(grouped_linear_backward_weight),
    OP(scaled_glu_forward),
    OP(scaled_glu_backward),
    OP(grouped_mlp_forward),
    OP(grouped_mlp_backward),
    OP(router_forward),
    OP(router_backward),
    OP(permute_forward),
    OP(permute_backward),
    OP(unpermute_forward),
    OP(unpermute_backward),
    OP(moe_layer_forward),
    OP(moe_layer_backward),
    .moe_layer_saved = moex_cpu_moe_layer_saved,
    .check_splits = NULL,
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
