/*
 * cpu_ops.h - private: the CPU backend's operations (one file per operation family) and
 * the shared CPU helpers they use. Arguments arrive validated by src/core (shapes, dtypes,
 * pointers, options); each operation still checks split values (moex_cpu_read_offsets)
 * before it writes anything.
 */
#ifndef MOEX_CPU_OPS_H
#define MOEX_CPU_OPS_H

#include "moex_impl.h"

#define MOEX_CPU_OP(name, args_t, dims_t)                                                     \
    size_t moex_cpu_##name##_ws(moex_context *ctx, const args_t *a, const dims_t *d);         \
    moex_status moex_cpu_##name(moex_context *ctx, const args_t *a, const dims_t *d, void *ws, \
                                size_t ws_bytes, moex_stream stream)

MOEX_CPU_OP(splits_to_offsets, moex_splits_to_offsets_args, moex_splits_dims);      /* cpu_splits.c         */
MOEX_CPU_OP(grouped_linear_forward, moex_grouped_linear_args, moex_gl_dims);        /* cpu_grouped_linear.c */
MOEX_CPU_OP(grouped_linear_backward_data, moex_grouped_linear_dgrad_args, moex_gl_dims);
MOEX_CPU_OP(grouped_linear_backward_weight, moex_grouped_linear_wgrad_args, moex_gl_dims);
MOEX_CPU_OP(scaled_glu_forward, moex_scaled_glu_args, moex_glu_dims);               /* cpu_glu.c            */
MOEX_CPU_OP(scaled_glu_backward, moex_scaled_glu_grad_args, moex_glu_dims);
MOEX_CPU_OP(grouped_mlp_forward, moex_grouped_mlp_args, moex_mlp_dims);             /* cpu_grouped_mlp.c    */
MOEX_CPU_OP(grouped_mlp_backward, moex_grouped_mlp_grad_args, moex_mlp_dims);
MOEX_CPU_OP(router_forward, moex_router_args, moex_router_dims);                    /* cpu_router.c         */
MOEX_CPU_OP(router_backward, moex_router_grad_args, moex_router_dims);
MOEX_CPU_OP(permute_forward, moex_permute_args, moex_perm_dims);                    /* cpu_permute.c        */
MOEX_CPU_OP(permute_backward, moex_permute_grad_args, moex_perm_dims);
MOEX_CPU_OP(unpermute_forward, moex_unpermute_args, moex_perm_dims);
MOEX_CPU_OP(unpermute_backward, moex_unpermute_grad_args, moex_perm_dims);
MOEX_CPU_OP(moe_layer_forward, moex_moe_layer_args, moex_moe_dims);                 /* cpu_moe_layer.c      */
MOEX_CPU_OP(moe_layer_backward, moex_moe_layer_grad_args, moex_moe_dims);
size_t moex_cpu_moe_layer_saved(moex_context *ctx, const moex_moe_layer_args *a, const moex_moe_dims *d);

#undef MOEX_CPU_OP

/* ---- shared CPU helpers (cpu_common.c) ---------------------------------------------- */

/* Reads host splits [G] into off[0..G] (off[0] = 0). Fails with MOEX_ERR_BAD_SPLITS and a
 * message naming `op` and the group when a split is negative or the sum passes T. */
moex_status moex_cpu_read_offsets(moex_context *ctx, const char *op, const moex_tensor *splits,
                                  int64_t T, int64_t *off);

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
