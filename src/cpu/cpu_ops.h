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
/* Plain declarations, one a primitive, by the file that defines it, so grep finds each: a
 * `_ws` and its primitive with backend.h's signatures, so the list looks alike from pair to
 * pair, and like cuda_ops.h's, by design (docs/architecture.md). */

/* cpu_splits.c: the prepared groups (off[G+1] in the workspace, read from host splits and
 * checked: MOEX_ERR_BAD_SPLITS naming the call and the group when a split is negative or the
 * sum passes T), splits_to_offsets and zero_tail. */
size_t moex_cpu_groups_ws(moex_context *ctx, int64_t G, int64_t T, const moex_grouped_linear_args *fwd);
moex_status moex_cpu_groups_prepare(moex_context *ctx, const moex_call *c, const int64_t *splits, int64_t G,
                                    int64_t T, const moex_grouped_linear_args *fwd, void *ws, moex_groups *g);
size_t moex_cpu_splits_to_offsets_ws(moex_context *ctx, const moex_splits_to_offsets_args *a,
                                     const moex_splits_dims *d);
moex_status moex_cpu_splits_to_offsets(moex_context *ctx, const moex_call *c, const moex_splits_to_offsets_args *a,
                                       const moex_splits_dims *d, void *ws);
size_t moex_cpu_zero_tail_ws(moex_context *ctx, const moex_zero_tail_args *a, const moex_tail_dims *d);
moex_status moex_cpu_zero_tail(moex_context *ctx, const moex_call *c, const moex_groups *g,
                               const moex_zero_tail_args *a, const moex_tail_dims *d, void *ws);

/* cpu_grouped_linear.c (GEMMs: cpu_gemm.c). */
size_t moex_cpu_linear_fwd_ws(moex_context *ctx, const moex_grouped_linear_args *a, const moex_gl_dims *d);
moex_status moex_cpu_linear_fwd(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                const moex_grouped_linear_args *a, const moex_gl_dims *d, void *ws);
size_t moex_cpu_linear_dgrad_ws(moex_context *ctx, const moex_grouped_linear_dgrad_args *a, const moex_gl_dims *d);
moex_status moex_cpu_linear_dgrad(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                  const moex_grouped_linear_dgrad_args *a, const moex_gl_dims *d, void *ws);
size_t moex_cpu_linear_wgrad_ws(moex_context *ctx, const moex_grouped_linear_wgrad_args *a, const moex_gl_dims *d);
moex_status moex_cpu_linear_wgrad(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                  const moex_grouped_linear_wgrad_args *a, const moex_gl_dims *d, void *ws);

/* cpu_glu.c. */
size_t moex_cpu_glu_fwd_ws(moex_context *ctx, const moex_scaled_glu_args *a, const moex_glu_dims *d);
moex_status moex_cpu_glu_fwd(moex_context *ctx, const moex_call *c, const moex_groups *g,
                             const moex_scaled_glu_args *a, const moex_glu_dims *d, void *ws);
size_t moex_cpu_glu_bwd_ws(moex_context *ctx, const moex_scaled_glu_grad_args *a, const moex_glu_dims *d);
moex_status moex_cpu_glu_bwd(moex_context *ctx, const moex_call *c, const moex_groups *g,
                             const moex_scaled_glu_grad_args *a, const moex_glu_dims *d, void *ws);

/* cpu_quantize.c. */
size_t moex_cpu_quantize_ws(moex_context *ctx, const moex_group_quantize_args *a, const moex_quant_dims *d);
moex_status moex_cpu_quantize(moex_context *ctx, const moex_call *c, const moex_groups *g,
                              const moex_group_quantize_args *a, const moex_quant_dims *d, void *ws);
size_t moex_cpu_dequantize_ws(moex_context *ctx, const moex_group_dequantize_args *a, const moex_quant_dims *d);
moex_status moex_cpu_dequantize(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                const moex_group_dequantize_args *a, const moex_quant_dims *d, void *ws);
size_t moex_cpu_weight_quantize_ws(moex_context *ctx, const moex_weight_quantize_args *a, const moex_quant_dims *d);
moex_status moex_cpu_weight_quantize(moex_context *ctx, const moex_call *c, const moex_weight_quantize_args *a,
                                     const moex_quant_dims *d, void *ws);
size_t moex_cpu_weight_dequantize_ws(moex_context *ctx, const moex_weight_dequantize_args *a,
                                     const moex_quant_dims *d);
moex_status moex_cpu_weight_dequantize(moex_context *ctx, const moex_call *c, const moex_weight_dequantize_args *a,
                                       const moex_quant_dims *d, void *ws);

/* cpu_common.c. */
size_t moex_cpu_cast_rows_ws(moex_context *ctx, const moex_cast_rows_args *a, const moex_gl_dims *d);
moex_status moex_cpu_cast_rows(moex_context *ctx, const moex_call *c, const moex_groups *g,
                               const moex_cast_rows_args *a, const moex_gl_dims *d, void *ws);
size_t moex_cpu_weight_maps_size(moex_context *ctx, const moex_gl_dims *d);
moex_status moex_cpu_weight_maps_write(moex_context *ctx, const moex_call *c, const moex_weight_maps_write_args *a,
                                       const moex_gl_dims *d);
size_t moex_cpu_weight_copy_ws(moex_context *ctx, const moex_weight_copy_args *a, const moex_gl_dims *d);
moex_status moex_cpu_weight_copy(moex_context *ctx, const moex_call *c, const moex_weight_copy_args *a,
                                 const moex_gl_dims *d, void *ws);

/* cpu_router.c. */
size_t moex_cpu_router_fwd_ws(moex_context *ctx, const moex_router_args *a, const moex_router_dims *d);
moex_status moex_cpu_router_fwd(moex_context *ctx, const moex_call *c, const moex_router_args *a,
                                const moex_router_dims *d, void *ws);
size_t moex_cpu_router_bwd_ws(moex_context *ctx, const moex_router_grad_args *a, const moex_router_dims *d);
moex_status moex_cpu_router_bwd(moex_context *ctx, const moex_call *c, const moex_router_grad_args *a,
                                const moex_router_dims *d, void *ws);

/* cpu_permute.c. */
size_t moex_cpu_permute_fwd_ws(moex_context *ctx, const moex_permute_args *a, const moex_perm_dims *d);
moex_status moex_cpu_permute_fwd(moex_context *ctx, const moex_call *c, const moex_permute_args *a,
                                 const moex_perm_dims *d, void *ws);
size_t moex_cpu_permute_bwd_ws(moex_context *ctx, const moex_permute_grad_args *a, const moex_perm_dims *d);
moex_status moex_cpu_permute_bwd(moex_context *ctx, const moex_call *c, const moex_permute_grad_args *a,
                                 const moex_perm_dims *d, void *ws);
size_t moex_cpu_unpermute_fwd_ws(moex_context *ctx, const moex_unpermute_args *a, const moex_perm_dims *d);
moex_status moex_cpu_unpermute_fwd(moex_context *ctx, const moex_call *c, const moex_unpermute_args *a,
                                   const moex_perm_dims *d, void *ws);
size_t moex_cpu_unpermute_bwd_ws(moex_context *ctx, const moex_unpermute_grad_args *a, const moex_perm_dims *d);
moex_status moex_cpu_unpermute_bwd(moex_context *ctx, const moex_call *c, const moex_unpermute_grad_args *a,
                                   const moex_perm_dims *d, void *ws);

/* cpu_dense_gemm.c. */
size_t moex_cpu_dense_gemm_ws(moex_context *ctx, const moex_dense_gemm *gemm);
moex_status moex_cpu_dense_gemm(moex_context *ctx, const moex_call *c, const moex_groups *rows,
                                const moex_dense_gemm *gemm, void *ws);

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
void moex_cpu_state_destroy(moex_context *ctx);

#endif /* MOEX_CPU_OPS_H */
