/*
 * grouped_linear.c - moex_splits_to_offsets, moex_zero_tail and the grouped linear layer:
 * validation and composition (the math: docs/ops.md).
 *
 *   splits_to_offsets:  the backend's splits_to_offsets primitive
 *   zero_tail:          prepare the groups, zero_tail
 *   forward:            prepare the groups, linear_fwd
 *   backward_data:      prepare the groups, linear_dgrad (dx, dbias, dprobs)
 *   backward_weight:    prepare the groups, linear_wgrad
 * With an FP8 recipe (args->fp8.mode not OFF) the three run fp8_layers.c's compositions.
 */
#include "op.h"

#include <stdio.h>

/* ---- splits_to_offsets --------------------------------------------------------------- */

moex_status moex_op_splits_to_offsets_validate(moex_context *ctx, const char *op,
                                               const moex_splits_to_offsets_args *a, moex_purpose p,
                                               moex_splits_dims *d) {
    MOEX_TRY(moex_check_splits_arg(ctx, op, &a->splits, &d->G));
    if (a->num_outputs < 1 || a->num_outputs > MOEX_MAX_OFFSETS)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: num_outputs = %d, must be 1..%d", op,
                         (int)a->num_outputs, MOEX_MAX_OFFSETS);
    for (int i = 0; i < a->num_outputs; i++) {
        const moex_offsets_output *o = &a->outputs[i];
        char name[32];
        snprintf(name, sizeof name, "outputs[%d].out", i);
        if (o->start != MOEX_OFFSETS_LEADING_ZERO && o->start != MOEX_OFFSETS_INCLUSIVE)
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: outputs[%d].start is unknown (%d)", op, i,
                             (int)o->start);
        if (o->stride < 1)
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: outputs[%d].stride = %lld, must be >= 1", op, i,
                             (long long)o->stride);
        const int64_t len[1] = {d->G + (o->start == MOEX_OFFSETS_LEADING_ZERO)};
        MOEX_TRY(moex_check_output(ctx, op, name, &o->out, 1, len, MOEX_DT_OFFSETS));
    }
    return MOEX_OK;
}

size_t moex_op_splits_to_offsets_ws(moex_context *ctx, const moex_splits_to_offsets_args *a,
                                    const moex_splits_dims *d) {
    return moex_ops(ctx)->splits_to_offsets_ws(ctx, a, d);
}

moex_status moex_op_splits_to_offsets_run(moex_context *ctx, const moex_call *c, const moex_splits_to_offsets_args *a,
                                          const moex_splits_dims *d, void *ws) {
    return moex_ops(ctx)->splits_to_offsets(ctx, c, a, d, ws);
}

/* ---- zero_tail ----------------------------------------------------------------------- */

moex_status moex_op_zero_tail_validate(moex_context *ctx, const char *op, const moex_zero_tail_args *a,
                                       moex_purpose p, moex_tail_dims *d) {
    MOEX_TRY(moex_check_splits_arg(ctx, op, &a->splits, &d->G));
    const moex_tensor *x = &a->x;
    if (x->ndim < 1 || x->ndim > MOEX_MAX_DIMS)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: x must have 1 to %d dimensions, has %d", op, MOEX_MAX_DIMS,
                         (int)x->ndim);
    const int64_t any[MOEX_MAX_DIMS] = {-1, -1, -1, -1};
    MOEX_TRY(moex_check_output(ctx, op, "x", x, x->ndim, any, ~0u));
    d->T = x->shape[0];
    d->row_bytes = 0;   /* T = 0: no rows, whatever the other sizes (their product may not fit) */
    if (d->T == 0) return MOEX_OK;
    d->row_bytes = (int64_t)moex_dtype_size(x->dtype);   /* < 2^63: T >= 1 rows, 2^60 elements at most */
    for (int i = 1; i < x->ndim; i++) d->row_bytes *= x->shape[i];
    return MOEX_OK;
}

size_t moex_op_zero_tail_ws(moex_context *ctx, const moex_zero_tail_args *a, const moex_tail_dims *d) {
    return moex_sz_add(moex_ops(ctx)->groups_ws(ctx, d->G, d->T, NULL), moex_ops(ctx)->zero_tail_ws(ctx, a, d));
}

moex_status moex_op_zero_tail_run(moex_context *ctx, const moex_call *c, const moex_zero_tail_args *a,
                                  const moex_tail_dims *d, void *ws) {
    moex_carver cv = {(char *)ws, 0};
    void *groups = moex_take(&cv, moex_ops(ctx)->groups_ws(ctx, d->G, d->T, NULL));
    void *sub = moex_take(&cv, moex_ops(ctx)->zero_tail_ws(ctx, a, d));
    moex_groups g;
    MOEX_TRY(moex_check_limits(ctx, c, d->T, d->G, 0));
    MOEX_TRY(moex_prepare_groups(ctx, c, &a->splits, d->T, NULL, groups, &g));
    return moex_ops(ctx)->zero_tail(ctx, c, &g, a, d, sub);
}

/* ---- the composition ------------------------------------------------------------------
 * Workspace: the prepared handle, then the primitive's region (moex_groups_layout_of). The
 * forward's handle carries its GEMM's own scratch where the backend wants one (groups_ws).
 * A run: the backend's limits, the groups, then the primitive; with an FP8 recipe (fp8.mode
 * not OFF), fp8_layers.c's composition instead. */

/* The workspace of a grouped linear op whose primitive needs `sub` bytes (fwd: the forward's
 * args, whose GEMM scratch the handle carries, or NULL). */
static size_t gl_ws(moex_context *ctx, const moex_gl_dims *d, const moex_grouped_linear_args *fwd, size_t sub) {
    return moex_groups_layout_of(ctx, d->G, d->T, fwd, sub, NULL).total;
}

/* A grouped linear run up to its primitive: the backend's limits, then the groups of splits
 * in ws (fwd as in gl_ws); *sub: the primitive's region. */
static moex_status gl_prepare(moex_context *ctx, const moex_call *c, const moex_tensor *splits,
                              const moex_gl_dims *d, const moex_grouped_linear_args *fwd, void *ws, moex_groups *g,
                              void **sub) {
    MOEX_TRY(moex_check_limits(ctx, c, d->T, d->G, 0));
    return moex_groups_layout_prepare(ctx, c, splits, d->G, d->T, fwd, ws, g, sub);
}

/* ---- forward ------------------------------------------------------------------------- */

moex_status moex_op_grouped_linear_forward_validate(moex_context *ctx, const char *op,
                                                    const moex_grouped_linear_args *a, moex_purpose p,
                                                    moex_gl_dims *d) {
    MOEX_TRY(moex_check_grouped_rows(ctx, op, &a->splits, "x", &a->x, &d->G, &d->T, &d->K, &d->dt));
    d->N = a->w.t.ndim == 3 ? a->w.t.shape[1] : -1;
    MOEX_TRY(moex_check_weight(ctx, op, "w", &a->w, d->G, -1, d->K, MOEX_DT(d->dt)));
    const int64_t yshape[2] = {d->T, d->N};
    MOEX_TRY(moex_check_output(ctx, op, "y", &a->y, 2, yshape, MOEX_DT(d->dt)));
    MOEX_TRY(moex_check_features(ctx, op, d->K, d->N));
    MOEX_TRY(moex_check_probs_scaled(ctx, op, a->bias_mode, &a->probs));
    MOEX_TRY(moex_check_bias(ctx, op, a->bias_mode, &a->bias, "bias", &a->probs, d->G, d->T, d->N, d->dt, true));
    MOEX_TRY(moex_check_fp8_recipe(ctx, op, "fp8", &a->fp8));
    return moex_fp8_check_out(ctx, op, &a->fp8, p, "y", a->y.data);
}

size_t moex_op_grouped_linear_forward_ws(moex_context *ctx, const moex_grouped_linear_args *a, const moex_gl_dims *d) {
    if (a->fp8.mode != MOEX_FP8_OFF) return moex_fp8_linear_forward_ws(ctx, a, d);
    return gl_ws(ctx, d, a, moex_ops(ctx)->linear_fwd_ws(ctx, a, d));
}

moex_status moex_op_grouped_linear_forward_run(moex_context *ctx, const moex_call *c, const moex_grouped_linear_args *a,
                                               const moex_gl_dims *d, void *ws) {
    if (a->fp8.mode != MOEX_FP8_OFF) return moex_fp8_linear_forward_run(ctx, c, a, d, ws);
    moex_groups g;
    void *sub;
    MOEX_TRY(gl_prepare(ctx, c, &a->splits, d, a, ws, &g, &sub));
    return moex_ops(ctx)->linear_fwd(ctx, c, &g, a, d, sub);
}

/* ---- backward data ------------------------------------------------------------------- */

moex_status moex_op_grouped_linear_backward_data_validate(moex_context *ctx, const char *op,
                                                          const moex_grouped_linear_dgrad_args *a, moex_purpose p,
                                                          moex_gl_dims *d) {
    MOEX_TRY(moex_check_grouped_rows(ctx, op, &a->splits, "dy", &a->dy, &d->G, &d->T, &d->N, &d->dt));
    d->K = a->w.t.ndim == 3 ? a->w.t.shape[2] : -1;
    MOEX_TRY(moex_check_weight(ctx, op, "w", &a->w, d->G, d->N, -1, MOEX_DT(d->dt)));
    MOEX_TRY(moex_check_features(ctx, op, d->K, d->N));
    const int64_t dxshape[2] = {d->T, d->K}, dbshape[2] = {d->G, d->N}, dpshape[1] = {d->T};
    MOEX_TRY(moex_check_optional_output(ctx, op, "dx", &a->dx, 2, dxshape, MOEX_DT(d->dt)));
    MOEX_TRY(moex_check_optional_output(ctx, op, "dbias", &a->dbias, 2, dbshape, MOEX_DT_BIAS(d->dt)));
    MOEX_TRY(moex_check_optional_output(ctx, op, "dprobs", &a->dprobs, 1, dpshape, MOEX_DT_F32));
    if (a->bias_mode == MOEX_BIAS_NONE && moex_present(&a->dbias))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: dbias is requested but the bias mode is MOEX_BIAS_NONE", op);
    if (a->bias_mode != MOEX_BIAS_SCALED && moex_present(&a->dprobs))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: dprobs is requested but the bias mode is not MOEX_BIAS_SCALED", op);
    MOEX_TRY(moex_check_probs_scaled(ctx, op, a->bias_mode, &a->probs));
    /* The bias values are needed only for dprobs. */
    bool bias_needed = a->bias_mode == MOEX_BIAS_SCALED && moex_present(&a->dprobs);
    MOEX_TRY(moex_check_bias(ctx, op, a->bias_mode, &a->bias, "bias", &a->probs, d->G, d->T, d->N, d->dt,
                             bias_needed));
    MOEX_TRY(moex_check_fp8_recipe(ctx, op, "fp8", &a->fp8));
    return moex_fp8_check_out(ctx, op, &a->fp8, p, "dx", a->dx.data);
}

size_t moex_op_grouped_linear_backward_data_ws(moex_context *ctx, const moex_grouped_linear_dgrad_args *a,
                                               const moex_gl_dims *d) {
    if (a->fp8.mode != MOEX_FP8_OFF) return moex_fp8_linear_dgrad_ws(ctx, a, d);
    return gl_ws(ctx, d, NULL, moex_ops(ctx)->linear_dgrad_ws(ctx, a, d));
}

moex_status moex_op_grouped_linear_backward_data_run(moex_context *ctx, const moex_call *c,
                                                     const moex_grouped_linear_dgrad_args *a, const moex_gl_dims *d,
                                                     void *ws) {
    if (a->fp8.mode != MOEX_FP8_OFF) return moex_fp8_linear_dgrad_run(ctx, c, a, d, ws);
    moex_groups g;
    void *sub;
    MOEX_TRY(gl_prepare(ctx, c, &a->splits, d, NULL, ws, &g, &sub));
    return moex_ops(ctx)->linear_dgrad(ctx, c, &g, a, d, sub);
}

/* ---- backward weight ----------------------------------------------------------------- */

moex_status moex_op_grouped_linear_backward_weight_validate(moex_context *ctx, const char *op,
                                                            const moex_grouped_linear_wgrad_args *a, moex_purpose p,
                                                            moex_gl_dims *d) {
    MOEX_TRY(moex_check_grouped_rows(ctx, op, &a->splits, "x", &a->x, &d->G, &d->T, &d->K, &d->dt));
    const int64_t dyshape[2] = {d->T, -1};
    MOEX_TRY(moex_check_tensor(ctx, op, "dy", &a->dy, 2, dyshape, MOEX_DT(d->dt)));
    d->N = a->dy.shape[1];
    MOEX_TRY(moex_check_features(ctx, op, d->K, d->N));
    MOEX_TRY(moex_check_dw(ctx, op, "dw", a->dw_mode, &a->dw, d->G, d->N, d->K, d->dt));
    MOEX_TRY(moex_check_fp8_recipe(ctx, op, "fp8", &a->fp8));
    return moex_fp8_check_out(ctx, op, &a->fp8, p, "dw", a->dw.t.data);
}

size_t moex_op_grouped_linear_backward_weight_ws(moex_context *ctx, const moex_grouped_linear_wgrad_args *a,
                                                 const moex_gl_dims *d) {
    if (a->fp8.mode != MOEX_FP8_OFF) return moex_fp8_linear_wgrad_ws(ctx, a, d);
    return gl_ws(ctx, d, NULL, moex_ops(ctx)->linear_wgrad_ws(ctx, a, d));
}

moex_status moex_op_grouped_linear_backward_weight_run(moex_context *ctx, const moex_call *c,
                                                       const moex_grouped_linear_wgrad_args *a, const moex_gl_dims *d,
                                                       void *ws) {
    if (a->fp8.mode != MOEX_FP8_OFF) return moex_fp8_linear_wgrad_run(ctx, c, a, d, ws);
    moex_groups g;
    void *sub;
    MOEX_TRY(gl_prepare(ctx, c, &a->splits, d, NULL, ws, &g, &sub));
    return moex_ops(ctx)->linear_wgrad(ctx, c, &g, a, d, sub);
}

/* ---- the public entry points (moex.h) -------------------------------------------------
 * Plain definitions, so that grep finds them; each is one call into op.c (op.h), so their
 * shapes repeat by design. */

moex_status moex_splits_to_offsets_workspace_size(moex_context *ctx, const moex_splits_to_offsets_args *args,
                                                  size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_SPLITS_TO_OFFSETS, args, bytes);
}

moex_status moex_splits_to_offsets(moex_context *ctx, const moex_splits_to_offsets_args *args, void *workspace,
                                   size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_SPLITS_TO_OFFSETS, args, workspace, workspace_bytes, stream);
}

moex_status moex_zero_tail_workspace_size(moex_context *ctx, const moex_zero_tail_args *args, size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_ZERO_TAIL, args, bytes);
}

moex_status moex_zero_tail(moex_context *ctx, const moex_zero_tail_args *args, void *workspace,
                           size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_ZERO_TAIL, args, workspace, workspace_bytes, stream);
}

moex_status moex_grouped_linear_forward_workspace_size(moex_context *ctx, const moex_grouped_linear_args *args,
                                                       size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_GROUPED_LINEAR_FORWARD, args, bytes);
}

moex_status moex_grouped_linear_forward(moex_context *ctx, const moex_grouped_linear_args *args, void *workspace,
                                        size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_GROUPED_LINEAR_FORWARD, args, workspace, workspace_bytes, stream);
}

moex_status moex_grouped_linear_backward_data_workspace_size(moex_context *ctx,
                                                             const moex_grouped_linear_dgrad_args *args,
                                                             size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_GROUPED_LINEAR_BACKWARD_DATA, args, bytes);
}

moex_status moex_grouped_linear_backward_data(moex_context *ctx, const moex_grouped_linear_dgrad_args *args,
                                              void *workspace, size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_GROUPED_LINEAR_BACKWARD_DATA, args, workspace, workspace_bytes, stream);
}

moex_status moex_grouped_linear_backward_weight_workspace_size(moex_context *ctx,
                                                               const moex_grouped_linear_wgrad_args *args,
                                                               size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_GROUPED_LINEAR_BACKWARD_WEIGHT, args, bytes);
}

moex_status moex_grouped_linear_backward_weight(moex_context *ctx, const moex_grouped_linear_wgrad_args *args,
                                                void *workspace, size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_GROUPED_LINEAR_BACKWARD_WEIGHT, args, workspace, workspace_bytes, stream);
}
