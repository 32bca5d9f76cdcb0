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

static const moex_backend_ops cpu_ops = {
    .name = "cpu",
    .host_memory = true,
    MOEX_PRIMITIVE_FIELDS(moex_cpu),
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
