/*
 * scaled_glu.c - the scaled GLU, forward and backward: validation and composition (the math:
 * docs/ops.md). With splits, the groups are prepared and the GLU runs on the rows
 * [0, sum(splits)); without, on all T rows. Workspace: the prepared handle (with splits),
 * then the primitive's region.
 * The forward's quantized z (docs/ops.md 9.9): the groups are always prepared (no splits: one
 * group of all T rows); then the backend's glu_quantize when z is absent, the recipe is a
 * block one and the backend has one (CUDA: z is never stored), else glu_fwd into z (the
 * caller's, or a [T, F] buffer in the workspace) and the quantize primitive on it.
 * Workspace: the handle, the primitive region (the larger of glu_fwd's and quantize's), then
 * the z buffer when needed.
 * The two runs differ only in their primitive (glu_fwd, glu_bwd), each a plain definition of
 * its op (op.h), so that op.c's dispatch and grep find it: their shapes repeat by design.
 */
#include "op.h"

#include <string.h>

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

/* The workspace of a GLU op whose primitive needs `sub` bytes: the handle's storage when
 * splits are given (d->G > 0), then the primitive's region (moex_groups_layout_of). */
static size_t glu_ws(moex_context *ctx, const moex_glu_dims *d, size_t sub) {
    return moex_groups_layout_of(ctx, d->G, d->T, NULL, sub, NULL).total;
}

/* A GLU run up to its primitive: the groups of splits in ws when given (*gp = g; without
 * splits NULL: all T rows); *sub: the primitive's region. */
static moex_status glu_prepare(moex_context *ctx, const moex_call *c, const moex_tensor *splits,
                               const moex_glu_dims *d, void *ws, moex_groups *g, const moex_groups **gp, void **sub) {
    *gp = d->G > 0 ? g : NULL;
    return moex_groups_layout_prepare(ctx, c, splits, d->G, d->T, NULL, ws, g, sub);
}

/* ---- the forward with z quantized ---------------------------------------------------- */

/* The quantize of z [T, F] that the zq outputs are (x: z's shape and dtype, data = z). */
static moex_group_quantize_args zq_args(const moex_scaled_glu_args *a, const moex_glu_dims *d, void *z) {
    moex_group_quantize_args q;
    memset(&q, 0, sizeof q);
    q.x = moex_tensor_2d(z, d->dt, d->T, d->F);
    q.splits = a->splits;
    q.params = a->zq_params;
    q.rowwise = a->zq_rowwise, q.columnwise = a->zq_columnwise, q.amax = a->zq_amax;
    return q;
}

/* Whether the backend quantizes straight from h: z absent, a glu_quantize, and a block
 * recipe (current scaling needs the amax of all of z before any value is cast, so z is
 * stored once and read back rather than computed twice). */
static bool zq_fused(moex_context *ctx, const moex_scaled_glu_args *a) {
    const moex_quant_recipe r = a->zq_params.recipe;
    return !moex_present(&a->z) && moex_ops(ctx)->glu_quantize != NULL &&
           (r == MOEX_QUANT_BLOCK || r == MOEX_QUANT_MXFP8);
}

typedef struct zq_layout {
    void *groups, *sub, *z;     /* z: the [T, F] buffer when z is absent and not fused */
    size_t total;
} zq_layout;

static zq_layout zq_layout_of(moex_context *ctx, const moex_scaled_glu_args *a, const moex_glu_dims *d, void *ws) {
    const moex_group_quantize_args q = zq_args(a, d, NULL);
    const moex_backend_ops *ops = moex_ops(ctx);
    size_t sub = ops->quantize_ws(ctx, &q, &d->q);
    if (!zq_fused(ctx, a)) sub = moex_sz_max(sub, ops->glu_fwd_ws(ctx, a, d));
    moex_carver c = {(char *)ws, 0};
    zq_layout l;
    l.groups = moex_take(&c, ops->groups_ws(ctx, d->q.G, d->T, NULL));
    l.sub = moex_take(&c, sub);
    l.z = moex_present(&a->z) || zq_fused(ctx, a) ? NULL
                                                   : moex_take(&c, moex_sz_bytes(d->T, d->F, moex_dtype_size(d->dt)));
    l.total = c.used;
    return l;
}

static moex_status glu_forward_zq(moex_context *ctx, const moex_call *c, const moex_scaled_glu_args *a,
                                  const moex_glu_dims *d, void *ws) {
    const zq_layout l = zq_layout_of(ctx, a, d, ws);
    const moex_backend_ops *ops = moex_ops(ctx);
    moex_groups g;
    if (d->G > 0) MOEX_TRY(moex_prepare_groups(ctx, c, &a->splits, d->T, NULL, l.groups, &g));
    else MOEX_TRY(ops->groups_prepare(ctx, c, NULL, 1, d->T, NULL, l.groups, &g));
    if (zq_fused(ctx, a)) {
        const moex_group_quantize_args q = zq_args(a, d, NULL);
        return ops->glu_quantize(ctx, c, &g, a, &q, &d->q, l.sub);
    }
    moex_scaled_glu_args fa = *a;   /* the GLU into z */
    if (!moex_present(&a->z)) fa.z = moex_tensor_2d(l.z, d->dt, d->T, d->F);
    MOEX_TRY(ops->glu_fwd(ctx, c, d->G > 0 ? &g : NULL, &fa, d, l.sub));
    const moex_group_quantize_args q = zq_args(a, d, fa.z.data);
    return ops->quantize(ctx, c, &g, &q, &d->q, l.sub);
}

/* ---- forward ------------------------------------------------------------------------- */

/* Without zq data, the fields that only go with it must be absent (zq_params all zero), as
 * the quantize refuses scales without their data: a given one is refused, not ignored. */
static moex_status check_no_zq(moex_context *ctx, const char *op, const moex_scaled_glu_args *a) {
    const moex_quant_params *q = &a->zq_params;
    const bool params = q->recipe != 0 || q->fp8 != 0 || q->amax_epsilon != 0.0f || q->rounding != 0 ||
                        q->scale_layout != 0;
    const char *name = moex_present(&a->zq_amax)              ? "zq_amax"
                       : moex_present(&a->zq_rowwise.scales)    ? "zq_rowwise.scales"
                       : moex_present(&a->zq_columnwise.scales) ? "zq_columnwise.scales"
                       : params                                 ? "zq_params (not all zero)"
                                                                : NULL;
    if (!name) return MOEX_OK;
    return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                     "%s: %s is given without zq data (neither zq_rowwise.data nor zq_columnwise.data)", op, name);
}

moex_status moex_op_scaled_glu_forward_validate(moex_context *ctx, const char *op, const moex_scaled_glu_args *a,
                                                moex_purpose p, moex_glu_dims *d) {
    MOEX_TRY(validate_glu_common(ctx, op, &a->glu, &a->h, &a->probs, &a->splits, d));
    const int64_t zshape[2] = {d->T, d->F};
    d->zq = moex_present(&a->zq_rowwise.data) || moex_present(&a->zq_columnwise.data);
    if (!d->zq) {
        MOEX_TRY(moex_check_output(ctx, op, "z", &a->z, 2, zshape, MOEX_DT(d->dt)));
        return check_no_zq(ctx, op, a);
    }
    MOEX_TRY(moex_check_optional_output(ctx, op, "z", &a->z, 2, zshape, MOEX_DT(d->dt)));
    memset(&d->q, 0, sizeof d->q);
    d->q.G = d->G > 0 ? d->G : 1, d->q.T = d->T, d->q.K = d->F, d->q.dt = d->dt;
    return moex_quant_check_outputs(ctx, op, "zq_", &a->zq_params, &a->zq_rowwise, &a->zq_columnwise, &a->zq_amax,
                                    &d->q);
}

size_t moex_op_scaled_glu_forward_ws(moex_context *ctx, const moex_scaled_glu_args *a, const moex_glu_dims *d) {
    if (d->zq) return zq_layout_of(ctx, a, d, NULL).total;
    return glu_ws(ctx, d, moex_ops(ctx)->glu_fwd_ws(ctx, a, d));
}

moex_status moex_op_scaled_glu_forward_run(moex_context *ctx, const moex_call *c, const moex_scaled_glu_args *a,
                                           const moex_glu_dims *d, void *ws) {
    if (d->zq) return glu_forward_zq(ctx, c, a, d, ws);
    moex_groups g;
    const moex_groups *gp;
    void *sub;
    MOEX_TRY(glu_prepare(ctx, c, &a->splits, d, ws, &g, &gp, &sub));
    return moex_ops(ctx)->glu_fwd(ctx, c, gp, a, d, sub);
}

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

size_t moex_op_scaled_glu_backward_ws(moex_context *ctx, const moex_scaled_glu_grad_args *a, const moex_glu_dims *d) {
    return glu_ws(ctx, d, moex_ops(ctx)->glu_bwd_ws(ctx, a, d));
}

moex_status moex_op_scaled_glu_backward_run(moex_context *ctx, const moex_call *c, const moex_scaled_glu_grad_args *a,
                                            const moex_glu_dims *d, void *ws) {
    moex_groups g;
    const moex_groups *gp;
    void *sub;
    MOEX_TRY(glu_prepare(ctx, c, &a->splits, d, ws, &g, &gp, &sub));
    return moex_ops(ctx)->glu_bwd(ctx, c, gp, a, d, sub);
}
