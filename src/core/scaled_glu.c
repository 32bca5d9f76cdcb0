/*
 * scaled_glu.c - the scaled GLU, forward and backward: validation and composition (the math:
 * docs/ops.md). With splits, the groups are prepared and the GLU runs on the rows
 * [0, sum(splits)); without, on all T rows. Workspace: the prepared handle (with splits),
 * then the primitive's region.
 */
#include "op.h"

/* h [T, 2F] sets T, F and the dtype; probs [T] f32 optional; splits optional (G = 0). */
static moex_status validate_glu_common(moex_context *ctx, const char *op, const moex_glu_params *glu,
                                       const moex_tensor *h, const moex_tensor *probs, const moex_tensor *splits,
                                       moex_glu_dims *d) {
    const int64_t any2[2] = {-1, -1};
    MOEX_TRY(moex_check_tensor(ctx, op, "h", h, 2, any2, MOEX_DT_FLOAT));
    if (h->shape[1] % 2 != 0)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: h must be [T, 2F] with an even last dimension, got %lld", op,
                         (long long)h->shape[1]);
    d->T = h->shape[0];
    d->F = h->shape[1] / 2;
    if (d->F < 1) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: h has no columns; need F >= 1", op);
    d->dt = h->dtype;
    d->G = 0;
    if (moex_present(splits)) MOEX_TRY(moex_check_splits_arg(ctx, op, splits, &d->G));
    const int64_t pshape[1] = {d->T};
    MOEX_TRY(moex_check_optional(ctx, op, "probs", probs, 1, pshape, MOEX_DT_F32));
    return moex_check_glu(ctx, op, glu, d->F);
}

/* The workspace: the handle's storage when splits are given, then the primitive's region
 * of `sub` bytes. */
typedef struct glu_layout {
    void *groups, *sub;
    size_t total;
} glu_layout;

static glu_layout layout_of(moex_context *ctx, const moex_glu_dims *d, size_t sub, void *ws) {
    moex_carver c = {(char *)ws, 0};
    glu_layout l;
    l.groups = d->G > 0 ? moex_take(&c, moex_ops(ctx)->groups_ws(ctx, d->G, d->T, NULL)) : NULL;
    l.sub = moex_take(&c, sub);
    l.total = c.used;
    return l;
}

/* The workspace query and the run of a GLU op: the groups when splits are given, then the
 * primitive `prim` on them (g NULL: all T rows). */
#define GLU_OP(name, prim, args_t)                                                                       \
    size_t moex_op_##name##_ws(moex_context *ctx, const args_t *a, const moex_glu_dims *d) {             \
        return layout_of(ctx, d, moex_ops(ctx)->prim##_ws(ctx, a, d), NULL).total;                       \
    }                                                                                                    \
    moex_status moex_op_##name##_run(moex_context *ctx, const moex_call *c, const args_t *a,             \
                                     const moex_glu_dims *d, void *ws) {                                 \
        const glu_layout l = layout_of(ctx, d, moex_ops(ctx)->prim##_ws(ctx, a, d), ws);                 \
        moex_groups g;                                                                                   \
        if (d->G > 0) MOEX_TRY(moex_prepare_groups(ctx, c, &a->splits, d->T, NULL, l.groups, &g)); \
        return moex_ops(ctx)->prim(ctx, c, d->G > 0 ? &g : NULL, a, d, l.sub);                           \
    }

/* ---- forward ------------------------------------------------------------------------- */

moex_status moex_op_scaled_glu_forward_validate(moex_context *ctx, const char *op, const moex_scaled_glu_args *a,
                                                moex_purpose p, moex_glu_dims *d) {
    MOEX_TRY(validate_glu_common(ctx, op, &a->glu, &a->h, &a->probs, &a->splits, d));
    const int64_t zshape[2] = {d->T, d->F};
    return moex_check_output(ctx, op, "z", &a->z, 2, zshape, MOEX_DT(d->dt));
}

GLU_OP(scaled_glu_forward, glu_fwd, moex_scaled_glu_args)

/* ---- backward ------------------------------------------------------------------------ */

moex_status moex_op_scaled_glu_backward_validate(moex_context *ctx, const char *op,
                                                 const moex_scaled_glu_grad_args *a, moex_purpose p,
                                                 moex_glu_dims *d) {
    MOEX_TRY(validate_glu_common(ctx, op, &a->glu, &a->h, &a->probs, &a->splits, d));
    const int64_t dzshape[2] = {d->T, d->F}, dhshape[2] = {d->T, 2 * d->F}, dpshape[1] = {d->T};
    MOEX_TRY(moex_check_tensor(ctx, op, "dz", &a->dz, 2, dzshape, MOEX_DT(d->dt)));
    MOEX_TRY(moex_check_output(ctx, op, "dh", &a->dh, 2, dhshape, MOEX_DT(d->dt)));
    MOEX_TRY(moex_check_optional_output(ctx, op, "dprobs", &a->dprobs, 1, dpshape, MOEX_DT_F32));
    if (moex_present(&a->dprobs) && !moex_present(&a->probs))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: dprobs is requested but probs is absent", op);
    return MOEX_OK;
}

GLU_OP(scaled_glu_backward, glu_bwd, moex_scaled_glu_grad_args)

/* ---- the public entry points (moex.h) -------------------------------------------------
 * Plain definitions, so that grep finds them; each is one call into op.c (op.h), so their
 * shapes repeat by design. */

moex_status moex_scaled_glu_forward_workspace_size(moex_context *ctx, const moex_scaled_glu_args *args,
                                                   size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_SCALED_GLU_FORWARD, args, bytes);
}

moex_status moex_scaled_glu_forward(moex_context *ctx, const moex_scaled_glu_args *args, void *workspace,
                                    size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_SCALED_GLU_FORWARD, args, workspace, workspace_bytes, stream);
}

moex_status moex_scaled_glu_backward_workspace_size(moex_context *ctx, const moex_scaled_glu_grad_args *args,
                                                    size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_SCALED_GLU_BACKWARD, args, bytes);
}

moex_status moex_scaled_glu_backward(moex_context *ctx, const moex_scaled_glu_grad_args *args, void *workspace,
                                     size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_SCALED_GLU_BACKWARD, args, workspace, workspace_bytes, stream);
}
