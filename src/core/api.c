/*
 * api.c - public entry points of splits_to_offsets, grouped linear, scaled GLU and the
 * grouped MLP: validate the argument struct, fill the dims, check the workspace, dispatch.
 * (Routing and the MoE layer: api_routing.c.)
 */
#include "validate.h"

#include <stdio.h>

/* Weight dtypes must equal the activation dtype; bias may also be f32. */
#define DT_ACT(dt) MOEX_DT(dt)
#define DT_BIAS(dt) (MOEX_DT(dt) | MOEX_DT(MOEX_DTYPE_F32))
#define DT_F32 MOEX_DT(MOEX_DTYPE_F32)

/* ---- splits_to_offsets --------------------------------------------------------------- */

static moex_status validate_splits_to_offsets(moex_context *ctx, const char *op,
                                              const moex_splits_to_offsets_args *a, moex_splits_dims *d) {
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

MOEX_DEFINE_OP(splits_to_offsets, moex_splits_to_offsets_args, moex_splits_dims, validate_splits_to_offsets)

/* ---- grouped linear ------------------------------------------------------------------ */

/* Feature dimensions must be >= 1 (row counts T may be 0). */
static moex_status check_features(moex_context *ctx, const char *op, int64_t in, int64_t out) {
    if (in < 1 || out < 1)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: feature dimensions must be >= 1, got in %lld, out %lld",
                         op, (long long)in, (long long)out);
    return MOEX_OK;
}

/* The bias and probs a bias mode needs: ADD/SCALED need bias [G,N]; SCALED needs probs [T]. */
static moex_status check_bias(moex_context *ctx, const char *op, moex_bias_mode mode, const moex_tensor *bias,
                              const char *bias_name, const moex_tensor *probs, int64_t G, int64_t T, int64_t N,
                              moex_dtype dt, bool bias_needed) {
    MOEX_TRY(moex_check_bias_mode(ctx, op, mode));
    const int64_t bshape[2] = {G, N}, pshape[1] = {T};
    if (mode == MOEX_BIAS_NONE) {
        if (moex_present(bias))
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s is given but the bias mode is MOEX_BIAS_NONE", op,
                             bias_name);
    } else if (bias_needed) {
        MOEX_TRY(moex_check_tensor(ctx, op, bias_name, bias, 2, bshape, DT_BIAS(dt)));
    } else {
        MOEX_TRY(moex_check_optional(ctx, op, bias_name, bias, 2, bshape, DT_BIAS(dt)));
    }
    if (mode == MOEX_BIAS_SCALED) {
        if (!moex_present(probs))
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: MOEX_BIAS_SCALED needs probs [%lld] f32", op,
                             (long long)T);
        MOEX_TRY(moex_check_tensor(ctx, op, "probs", probs, 1, pshape, DT_F32));
    }
    return MOEX_OK;
}

static moex_status validate_gl_forward(moex_context *ctx, const char *op, const moex_grouped_linear_args *a,
                                       moex_gl_dims *d) {
    const int64_t any2[2] = {-1, -1};
    MOEX_TRY(moex_check_splits_arg(ctx, op, &a->splits, &d->G));
    MOEX_TRY(moex_check_tensor(ctx, op, "x", &a->x, 2, any2, MOEX_DT_FLOAT));
    d->T = a->x.shape[0];
    d->K = a->x.shape[1];
    d->dt = a->x.dtype;
    d->N = a->w.t.ndim == 3 ? a->w.t.shape[1] : -1;
    MOEX_TRY(moex_check_weight(ctx, op, "w", &a->w, d->G, -1, d->K, DT_ACT(d->dt)));
    const int64_t yshape[2] = {d->T, d->N};
    MOEX_TRY(moex_check_output(ctx, op, "y", &a->y, 2, yshape, DT_ACT(d->dt)));
    MOEX_TRY(check_features(ctx, op, d->K, d->N));
    if (a->bias_mode != MOEX_BIAS_SCALED && moex_present(&a->probs))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: probs is given but the bias mode is not MOEX_BIAS_SCALED",
                         op);
    return check_bias(ctx, op, a->bias_mode, &a->bias, "bias", &a->probs, d->G, d->T, d->N, d->dt, true);
}

MOEX_DEFINE_OP(grouped_linear_forward, moex_grouped_linear_args, moex_gl_dims, validate_gl_forward)

static moex_status validate_gl_dgrad(moex_context *ctx, const char *op, const moex_grouped_linear_dgrad_args *a,
                                     moex_gl_dims *d) {
    const int64_t any2[2] = {-1, -1};
    MOEX_TRY(moex_check_splits_arg(ctx, op, &a->splits, &d->G));
    MOEX_TRY(moex_check_tensor(ctx, op, "dy", &a->dy, 2, any2, MOEX_DT_FLOAT));
    d->T = a->dy.shape[0];
    d->N = a->dy.shape[1];
    d->dt = a->dy.dtype;
    d->K = a->w.t.ndim == 3 ? a->w.t.shape[2] : -1;
    MOEX_TRY(moex_check_weight(ctx, op, "w", &a->w, d->G, d->N, -1, DT_ACT(d->dt)));
    MOEX_TRY(check_features(ctx, op, d->K, d->N));
    const int64_t dxshape[2] = {d->T, d->K}, dbshape[2] = {d->G, d->N}, dpshape[1] = {d->T};
    MOEX_TRY(moex_check_optional_output(ctx, op, "dx", &a->dx, 2, dxshape, DT_ACT(d->dt)));
    MOEX_TRY(moex_check_optional_output(ctx, op, "dbias", &a->dbias, 2, dbshape, DT_F32));
    MOEX_TRY(moex_check_optional_output(ctx, op, "dprobs", &a->dprobs, 1, dpshape, DT_F32));
    if (a->bias_mode == MOEX_BIAS_NONE && moex_present(&a->dbias))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: dbias is requested but the bias mode is MOEX_BIAS_NONE", op);
    if (a->bias_mode != MOEX_BIAS_SCALED && moex_present(&a->dprobs))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: dprobs is requested but the bias mode is not MOEX_BIAS_SCALED", op);
    if (a->bias_mode != MOEX_BIAS_SCALED && moex_present(&a->probs))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: probs is given but the bias mode is not MOEX_BIAS_SCALED",
                         op);
    /* The bias values are needed only for dprobs. */
    bool bias_needed = a->bias_mode == MOEX_BIAS_SCALED && moex_present(&a->dprobs);
    return check_bias(ctx, op, a->bias_mode, &a->bias, "bias", &a->probs, d->G, d->T, d->N, d->dt, bias_needed);
}

MOEX_DEFINE_OP(grouped_linear_backward_data, moex_grouped_linear_dgrad_args, moex_gl_dims, validate_gl_dgrad)

/* dW: WRITE into f32 or the activation dtype, ACCUMULATE into f32 only. */
static moex_status check_dw(moex_context *ctx, const char *op, const char *name, moex_grad_mode mode,
                            const moex_weight *dw, int64_t G, int64_t R, int64_t C, moex_dtype dt) {
    MOEX_TRY(moex_check_grad_mode(ctx, op, mode));
    unsigned dts = mode == MOEX_GRAD_ACCUMULATE ? DT_F32 : DT_BIAS(dt);
    if (mode == MOEX_GRAD_ACCUMULATE && dw->t.ndim == 3 && dw->t.dtype != MOEX_DTYPE_F32)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: %s is %s, but MOEX_GRAD_ACCUMULATE accumulates into an f32 main grad", op, name,
                         moex_dtype_name(dw->t.dtype));
    return moex_check_weight_output(ctx, op, name, dw, G, R, C, dts);
}

static moex_status validate_gl_wgrad(moex_context *ctx, const char *op, const moex_grouped_linear_wgrad_args *a,
                                     moex_gl_dims *d) {
    const int64_t any2[2] = {-1, -1};
    MOEX_TRY(moex_check_splits_arg(ctx, op, &a->splits, &d->G));
    MOEX_TRY(moex_check_tensor(ctx, op, "x", &a->x, 2, any2, MOEX_DT_FLOAT));
    d->T = a->x.shape[0];
    d->K = a->x.shape[1];
    d->dt = a->x.dtype;
    const int64_t dyshape[2] = {d->T, -1};
    MOEX_TRY(moex_check_tensor(ctx, op, "dy", &a->dy, 2, dyshape, DT_ACT(d->dt)));
    d->N = a->dy.shape[1];
    MOEX_TRY(check_features(ctx, op, d->K, d->N));
    return check_dw(ctx, op, "dw", a->dw_mode, &a->dw, d->G, d->N, d->K, d->dt);
}

MOEX_DEFINE_OP(grouped_linear_backward_weight, moex_grouped_linear_wgrad_args, moex_gl_dims, validate_gl_wgrad)

/* ---- scaled GLU ---------------------------------------------------------------------- */

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
    MOEX_TRY(moex_check_optional(ctx, op, "probs", probs, 1, pshape, DT_F32));
    return moex_check_glu(ctx, op, glu, d->F);
}

static moex_status validate_glu_forward(moex_context *ctx, const char *op, const moex_scaled_glu_args *a,
                                        moex_glu_dims *d) {
    MOEX_TRY(validate_glu_common(ctx, op, &a->glu, &a->h, &a->probs, &a->splits, d));
    const int64_t zshape[2] = {d->T, d->F};
    return moex_check_output(ctx, op, "z", &a->z, 2, zshape, DT_ACT(d->dt));
}

MOEX_DEFINE_OP(scaled_glu_forward, moex_scaled_glu_args, moex_glu_dims, validate_glu_forward)

static moex_status validate_glu_backward(moex_context *ctx, const char *op, const moex_scaled_glu_grad_args *a,
                                         moex_glu_dims *d) {
    MOEX_TRY(validate_glu_common(ctx, op, &a->glu, &a->h, &a->probs, &a->splits, d));
    const int64_t dzshape[2] = {d->T, d->F}, dhshape[2] = {d->T, 2 * d->F}, dpshape[1] = {d->T};
    MOEX_TRY(moex_check_tensor(ctx, op, "dz", &a->dz, 2, dzshape, DT_ACT(d->dt)));
    MOEX_TRY(moex_check_output(ctx, op, "dh", &a->dh, 2, dhshape, DT_ACT(d->dt)));
    MOEX_TRY(moex_check_optional_output(ctx, op, "dprobs", &a->dprobs, 1, dpshape, DT_F32));
    if (moex_present(&a->dprobs) && !moex_present(&a->probs))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: dprobs is requested but probs is absent", op);
    return MOEX_OK;
}

MOEX_DEFINE_OP(scaled_glu_backward, moex_scaled_glu_grad_args, moex_glu_dims, validate_glu_backward)

/* ---- grouped MLP --------------------------------------------------------------------- */

/* The tensors forward and backward share: x [T,H], w1 [G,2F,H], w2 [G,H,F], probs, glu,
 * splits, b2 per b2_mode. Sets the dims. */
static moex_status validate_mlp_common(moex_context *ctx, const char *op, const moex_tensor *x,
                                       const moex_weight *w1, const moex_weight *w2, const moex_tensor *probs,
                                       const moex_glu_params *glu, const moex_tensor *splits, moex_mlp_dims *d) {
    const int64_t any2[2] = {-1, -1};
    MOEX_TRY(moex_check_splits_arg(ctx, op, splits, &d->G));
    MOEX_TRY(moex_check_tensor(ctx, op, "x", x, 2, any2, MOEX_DT_FLOAT));
    d->T = x->shape[0];
    d->H = x->shape[1];
    d->dt = x->dtype;
    int64_t twoF = w1->t.ndim == 3 ? w1->t.shape[1] : -1;
    MOEX_TRY(moex_check_weight(ctx, op, "w1", w1, d->G, twoF, d->H, DT_ACT(d->dt)));
    if (twoF % 2 != 0)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: w1 must be [G, 2F, H] with an even 2F, got %lld", op,
                         (long long)twoF);
    d->F = twoF / 2;
    MOEX_TRY(check_features(ctx, op, d->H, d->F));
    MOEX_TRY(moex_check_weight(ctx, op, "w2", w2, d->G, d->H, d->F, DT_ACT(d->dt)));
    const int64_t pshape[1] = {d->T};
    MOEX_TRY(moex_check_optional(ctx, op, "probs", probs, 1, pshape, DT_F32));
    return moex_check_glu(ctx, op, glu, d->F);
}

static moex_status validate_mlp_forward(moex_context *ctx, const char *op, const moex_grouped_mlp_args *a,
                                        moex_mlp_dims *d) {
    MOEX_TRY(validate_mlp_common(ctx, op, &a->x, &a->w1, &a->w2, &a->probs, &a->glu, &a->splits, d));
    const int64_t b1shape[2] = {d->G, 2 * d->F}, hshape[2] = {d->T, 2 * d->F}, zshape[2] = {d->T, d->F},
                  yshape[2] = {d->T, d->H};
    MOEX_TRY(moex_check_optional(ctx, op, "b1", &a->b1, 2, b1shape, DT_BIAS(d->dt)));
    MOEX_TRY(check_bias(ctx, op, a->b2_mode, &a->b2, "b2", &a->probs, d->G, d->T, d->H, d->dt, true));
    MOEX_TRY(moex_check_output(ctx, op, "h", &a->h, 2, hshape, DT_ACT(d->dt)));
    MOEX_TRY(moex_check_optional_output(ctx, op, "z", &a->z, 2, zshape, DT_ACT(d->dt)));
    return moex_check_output(ctx, op, "y", &a->y, 2, yshape, DT_ACT(d->dt));
}

MOEX_DEFINE_OP(grouped_mlp_forward, moex_grouped_mlp_args, moex_mlp_dims, validate_mlp_forward)

static moex_status validate_mlp_backward(moex_context *ctx, const char *op, const moex_grouped_mlp_grad_args *a,
                                         moex_mlp_dims *d) {
    MOEX_TRY(validate_mlp_common(ctx, op, &a->x, &a->w1, &a->w2, &a->probs, &a->glu, &a->splits, d));
    const int64_t hshape[2] = {d->T, 2 * d->F}, zshape[2] = {d->T, d->F}, yshape[2] = {d->T, d->H},
                  db1shape[2] = {d->G, 2 * d->F}, db2shape[2] = {d->G, d->H}, dpshape[1] = {d->T};
    MOEX_TRY(moex_check_tensor(ctx, op, "h", &a->h, 2, hshape, DT_ACT(d->dt)));
    MOEX_TRY(moex_check_optional(ctx, op, "z", &a->z, 2, zshape, DT_ACT(d->dt)));
    MOEX_TRY(moex_check_tensor(ctx, op, "dy", &a->dy, 2, yshape, DT_ACT(d->dt)));
    MOEX_TRY(moex_check_optional_output(ctx, op, "dx", &a->dx, 2, yshape, DT_ACT(d->dt)));
    if (moex_weight_present(&a->dw1))
        MOEX_TRY(check_dw(ctx, op, "dw1", a->dw_mode, &a->dw1, d->G, 2 * d->F, d->H, d->dt));
    if (moex_weight_present(&a->dw2))
        MOEX_TRY(check_dw(ctx, op, "dw2", a->dw_mode, &a->dw2, d->G, d->H, d->F, d->dt));
    MOEX_TRY(moex_check_optional_output(ctx, op, "db1", &a->db1, 2, db1shape, DT_F32));
    MOEX_TRY(moex_check_optional_output(ctx, op, "db2", &a->db2, 2, db2shape, DT_F32));
    MOEX_TRY(moex_check_optional_output(ctx, op, "dprobs", &a->dprobs, 1, dpshape, DT_F32));
    if (a->b2_mode == MOEX_BIAS_NONE && moex_present(&a->db2))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: db2 is requested but b2_mode is MOEX_BIAS_NONE", op);
    if (moex_present(&a->dprobs) && !moex_present(&a->probs))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: dprobs is requested but probs is absent", op);
    bool b2_needed = a->b2_mode == MOEX_BIAS_SCALED && moex_present(&a->dprobs);
    return check_bias(ctx, op, a->b2_mode, &a->b2, "b2", &a->probs, d->G, d->T, d->H, d->dt, b2_needed);
}

MOEX_DEFINE_OP(grouped_mlp_backward, moex_grouped_mlp_grad_args, moex_mlp_dims, validate_mlp_backward)
