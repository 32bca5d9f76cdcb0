/*
 * cpu_ops.h - private: the CPU backend's primitives (src/core/backend.h; one file per
 * operation family) and the shared CPU helpers they use. Arguments arrive validated by
 * src/core (shapes, dtypes, pointers, options); split values are checked when the groups are
 * prepared (moex_cpu_groups_prepare), before anything is written.
 */
#ifndef MOEX_CPU_OPS_H
#define MOEX_CPU_OPS_H

#include "backend.h"

/* ---- the primitives of src/core/backend.h (cpu_backend.c's table), by file ------------ */
/* One declaration a primitive, by the file that defines it, with its field's type
 * (moex_<field>_fn, backend.h); the definitions are plain, so grep finds each. */

/* cpu_splits.c: the prepared groups (off[G+1] in the workspace, read from host splits and
 * checked: MOEX_ERR_BAD_SPLITS naming the call and the group when a split is negative or the
 * sum passes T), splits_to_offsets and zero_tail. */
moex_groups_ws_fn moex_cpu_groups_ws;
moex_groups_prepare_fn moex_cpu_groups_prepare;
moex_splits_to_offsets_ws_fn moex_cpu_splits_to_offsets_ws;
moex_splits_to_offsets_fn moex_cpu_splits_to_offsets;
moex_zero_tail_ws_fn moex_cpu_zero_tail_ws;
moex_zero_tail_fn moex_cpu_zero_tail;

/* cpu_grouped_linear.c (GEMMs: cpu_gemm.c). */
moex_linear_fwd_ws_fn moex_cpu_linear_fwd_ws;
moex_linear_fwd_fn moex_cpu_linear_fwd;
moex_linear_dgrad_ws_fn moex_cpu_linear_dgrad_ws;
moex_linear_dgrad_fn moex_cpu_linear_dgrad;
moex_linear_wgrad_ws_fn moex_cpu_linear_wgrad_ws;
moex_linear_wgrad_fn moex_cpu_linear_wgrad;

/* cpu_glu.c. */
moex_glu_fwd_ws_fn moex_cpu_glu_fwd_ws;
moex_glu_fwd_fn moex_cpu_glu_fwd;
moex_glu_bwd_ws_fn moex_cpu_glu_bwd_ws;
moex_glu_bwd_fn moex_cpu_glu_bwd;

/* cpu_quantize.c. */
moex_quantize_ws_fn moex_cpu_quantize_ws;
moex_quantize_fn moex_cpu_quantize;
moex_dequantize_ws_fn moex_cpu_dequantize_ws;
moex_dequantize_fn moex_cpu_dequantize;
moex_weight_quantize_ws_fn moex_cpu_weight_quantize_ws;
moex_weight_quantize_fn moex_cpu_weight_quantize;
moex_weight_dequantize_ws_fn moex_cpu_weight_dequantize_ws;
moex_weight_dequantize_fn moex_cpu_weight_dequantize;

/* cpu_common.c. */
moex_cast_rows_ws_fn moex_cpu_cast_rows_ws;
moex_cast_rows_fn moex_cpu_cast_rows;
moex_weight_maps_size_fn moex_cpu_weight_maps_size;
moex_weight_maps_write_fn moex_cpu_weight_maps_write;
moex_weight_copy_ws_fn moex_cpu_weight_copy_ws;
moex_weight_copy_fn moex_cpu_weight_copy;

/* cpu_router.c. */
moex_router_fwd_ws_fn moex_cpu_router_fwd_ws;
moex_router_fwd_fn moex_cpu_router_fwd;
moex_router_bwd_ws_fn moex_cpu_router_bwd_ws;
moex_router_bwd_fn moex_cpu_router_bwd;

/* cpu_permute.c. */
moex_permute_fwd_ws_fn moex_cpu_permute_fwd_ws;
moex_permute_fwd_fn moex_cpu_permute_fwd;
moex_permute_bwd_ws_fn moex_cpu_permute_bwd_ws;
moex_permute_bwd_fn moex_cpu_permute_bwd;
moex_unpermute_fwd_ws_fn moex_cpu_unpermute_fwd_ws;
moex_unpermute_fwd_fn moex_cpu_unpermute_fwd;
moex_unpermute_bwd_ws_fn moex_cpu_unpermute_bwd_ws;
moex_unpermute_bwd_fn moex_cpu_unpermute_bwd;

/* cpu_dense_gemm.c. */
moex_dense_gemm_ws_fn moex_cpu_dense_gemm_ws;
moex_dense_gemm_fn moex_cpu_dense_gemm;

/* Expert parallelism's local kernels (cpu_ep.c; src/core/ep.h). */
extern const struct moex_ep_kernels moex_cpu_ep_kernels;

/* ---- shared CPU helpers (cpu_common.c) ---------------------------------------------- */

/* Runs fn(arg, begin, end) over [0, n) split into contiguous chunks on up to
 * ctx->num_threads threads (the caller's thread included); returns when all are done.
 * `grain` is the smallest chunk worth a thread. Chunks run in any order on any thread, so
 * fn must not depend on which thread runs it; a call made from inside fn runs inline. */
/* The group that owns `row` (< off[G]): the last g with off[g] <= row, never empty. */
static inline int64_t moex_cpu_group_of(const int64_t *off, int64_t G, int64_t row) {
    int64_t lo = 0, hi = G - 1;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo + 1) / 2;
        if (off[mid] <= row) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

typedef void (*moex_cpu_range_fn)(void *arg, int64_t begin, int64_t end);
void moex_cpu_parallel_for(moex_context *ctx, int64_t n, int64_t grain, moex_cpu_range_fn fn, void *arg);

/* dst[r, c] = dt(src[r, c]) for r < rows, c < cols, rounded once (cpu_convert.h): dense f32
 * rows rounded into a dense output of dtype dt, in parallel over the rows (cpu_common.c). */
void moex_cpu_store_f32_rows(moex_context *ctx, void *dst, moex_dtype dt, const float *src, int64_t rows,
                             int64_t cols);

/* dst[g, n] = sum over the rows i of group g (rows [off[g], off[g+1]), in order) of
 * (probs[i] *) src[i, n], in f32 (probs NULL: 1), for n < N, stored in dst_dt (rounded once);
 * an empty group gives 0 (cpu_common.c). The bias gradients of the grouped linear and of the
 * quantize. */
void moex_cpu_group_colsum(moex_context *ctx, const int64_t *off, int64_t G, const void *src, moex_dtype dt,
                           int64_t N, const float *probs, void *dst, moex_dtype dst_dt);

/* The pool behind moex_cpu_parallel_for, kept in ctx->backend_state: created by
 * moex_cpu_backend_init, freed by the backend's destroy (accepts a NULL state). */
moex_status moex_cpu_state_create(moex_context *ctx);
moex_destroy_fn moex_cpu_state_destroy;

#endif /* MOEX_CPU_OPS_H */
