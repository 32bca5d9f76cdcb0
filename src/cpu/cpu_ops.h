/*
 * cpu_ops.h - private: the CPU backend's primitives (src/core/backend.h; one file per
 * operation family) and the shared CPU helpers they use. Arguments arrive validated by
 * src/core (shapes, dtypes, pointers, options); split values are checked when the groups are
 * prepared (moex_cpu_groups_prepare), before anything is written.
 */
#ifndef MOEX_CPU_OPS_H
#define MOEX_CPU_OPS_H

#include "backend.h"

/* The primitives of src/core/backend.h, by file. */
#define MOEX_CPU_PRIMITIVE(name, args_t, dims_t)                                                    \
    size_t moex_cpu_##name##_ws(moex_context *ctx, const args_t *a, const dims_t *d);               \
    moex_status moex_cpu_##name(moex_context *ctx, const moex_call *c, const args_t *a, const dims_t *d, void *ws)
#define MOEX_CPU_GROUPED(name, args_t, dims_t)                                                      \
    size_t moex_cpu_##name##_ws(moex_context *ctx, const args_t *a, const dims_t *d);               \
    moex_status moex_cpu_##name(moex_context *ctx, const moex_call *c, const moex_groups *grp, const args_t *a, \
                                const dims_t *d, void *ws)

MOEX_CPU_GROUPED(grouped_linear_forward, moex_grouped_linear_args, moex_gl_dims);        /* cpu_grouped_linear.c */
MOEX_CPU_GROUPED(grouped_linear_backward_data, moex_grouped_linear_dgrad_args, moex_gl_dims);
MOEX_CPU_GROUPED(grouped_linear_backward_weight, moex_grouped_linear_wgrad_args, moex_gl_dims);
MOEX_CPU_GROUPED(scaled_glu_forward, moex_scaled_glu_args, moex_glu_dims);               /* cpu_glu.c            */
MOEX_CPU_GROUPED(scaled_glu_backward, moex_scaled_glu_grad_args, moex_glu_dims);
MOEX_CPU_PRIMITIVE(splits_to_offsets, moex_splits_to_offsets_args, moex_splits_dims);    /* cpu_splits.c         */
MOEX_CPU_PRIMITIVE(router_forward, moex_router_args, moex_router_dims);                  /* cpu_router.c         */
MOEX_CPU_PRIMITIVE(router_backward, moex_router_grad_args, moex_router_dims);
MOEX_CPU_PRIMITIVE(permute_forward, moex_permute_args, moex_perm_dims);                  /* cpu_permute.c        */
MOEX_CPU_PRIMITIVE(permute_backward, moex_permute_grad_args, moex_perm_dims);
MOEX_CPU_PRIMITIVE(unpermute_forward, moex_unpermute_args, moex_perm_dims);
MOEX_CPU_PRIMITIVE(unpermute_backward, moex_unpermute_grad_args, moex_perm_dims);

#undef MOEX_CPU_PRIMITIVE
#undef MOEX_CPU_GROUPED

/* The prepared groups (cpu_splits.c): off[G+1] in the workspace, read from host splits and
 * checked (MOEX_ERR_BAD_SPLITS naming the call and the group when a split is negative or
 * the sum passes T). */
size_t moex_cpu_groups_ws(moex_context *ctx, int64_t G, int64_t T, moex_groups_use use);
moex_status moex_cpu_groups_prepare(moex_context *ctx, const moex_call *c, const int64_t *splits, int64_t G,
                                    int64_t T, moex_groups_use use, void *ws, moex_groups *g);

/* The router's dense GEMMs (cpu_gemm.c). */
size_t moex_cpu_dense_gemm_ws(moex_context *ctx, const moex_dense_gemm *p);
moex_status moex_cpu_dense_gemm(moex_context *ctx, const moex_call *c, const moex_groups *rows,
                                const moex_dense_gemm *p, void *ws);

/* ---- shared CPU helpers (cpu_common.c) ---------------------------------------------- */

/* Runs fn(arg, begin, end) over [0, n) split into contiguous chunks on up to
 * ctx->num_threads threads (the caller's thread included); returns when all are done.
 * `grain` is the smallest chunk worth a thread. Chunks run in any order on any thread, so
 * fn must not depend on which thread runs it; a call made from inside fn runs inline. */
typedef void (*moex_cpu_range_fn)(void *arg, int64_t begin, int64_t end);
void moex_cpu_parallel_for(moex_context *ctx, int64_t n, int64_t grain, moex_cpu_range_fn fn, void *arg);

/* The pool behind moex_cpu_parallel_for, kept in ctx->backend_state: created by
 * moex_cpu_backend_init, freed by the backend's destroy (accepts a NULL state). */
moex_status moex_cpu_state_create(moex_context *ctx);
void moex_cpu_state_destroy(moex_context *ctx);

#endif /* MOEX_CPU_OPS_H */
