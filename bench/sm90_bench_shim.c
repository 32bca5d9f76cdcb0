/*
 * sm90_bench_shim.c - libmoex_sm90_bench.so: the Hopper GEMMs' tuned entry points
 * (src/cuda/sm90_tuning.h) for bench/torch_grouped_mm.py, which calls them through ctypes.
 * libmoex.so exports only include/moex.h; this library links libmoex.a and exports the
 * explicit wrappers below, nothing else of it. Benchmarks only: not installed, no stability
 * promise. Each call returns a moex_status; why (may be NULL) gets a static message.
 */
#include <stddef.h>

#include "sm90_tuning.h"

#define SHIM __attribute__((visibility("default")))

/* The Hopper state of `device` (sm90_grouped_gemm.h): *out = NULL and a nonzero status where
 * the kernels cannot run there. Free it with moex_sm90_bench_context_destroy. */
SHIM int moex_sm90_bench_context_create(int device, void **out, const char **why) {
    moex_sm90_context *c = NULL;
    const moex_status st = moex_sm90_context_create(device, &c, why);
    *out = c;
    return (int)st;
}

SHIM void moex_sm90_bench_context_destroy(void *ctx) { moex_sm90_context_destroy((moex_sm90_context *)ctx); }

/* The sizes of the three argument structs the wrappers below read, for the caller's mirrors
 * (bench/torch_grouped_mm.py checks its ctypes structs against them before any call). */
SHIM void moex_sm90_bench_struct_sizes(size_t *args, size_t *wgrad_args, size_t *tuning) {
    *args = sizeof(moex_sm90_gemm_args);
    *wgrad_args = sizeof(moex_sm90_wgrad_args);
    *tuning = sizeof(moex_sm90_tuning);
}

/* The workspace a forced stream-K may use (the most of any launch on the device). */
SHIM size_t moex_sm90_bench_workspace_bytes(void *ctx) {
    return moex_sm90_gemm_workspace_bytes((const moex_sm90_context *)ctx, NULL, NULL);
}

/* The forward y = x W_g^T (no epilogue), the dgrad and the wgrad with the knobs t (NULL:
 * none) on `stream` (a cudaStream_t; NULL: the legacy stream). */
SHIM int moex_sm90_bench_fwd(void *ctx, const moex_sm90_gemm_args *a, moex_sm90_tuning *t, void *stream,
                             const char **why) {
    return (int)moex_sm90_grouped_gemm_fwd_tuned((const moex_sm90_context *)ctx, a, NULL, t, (moex_stream)stream,
                                                 why);
}

SHIM int moex_sm90_bench_dgrad(void *ctx, const moex_sm90_gemm_args *a, moex_sm90_tuning *t, void *stream,
                               const char **why) {
    return (int)moex_sm90_grouped_gemm_dgrad_tuned((const moex_sm90_context *)ctx, a, t, (moex_stream)stream, why);
}

SHIM int moex_sm90_bench_wgrad(void *ctx, const moex_sm90_wgrad_args *a, moex_sm90_tuning *t, void *stream,
                               const char **why) {
    return (int)moex_sm90_grouped_gemm_wgrad_tuned((const moex_sm90_context *)ctx, a, t, (moex_stream)stream, why);
}
