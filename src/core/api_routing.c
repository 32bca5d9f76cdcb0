/*
 * api_routing.c - public entry points of the router, permute, unpermute and the MoE layer:
 * validate the argument struct, fill the dims, check the workspace (and the MoE layer's
 * `saved` buffer), dispatch. (The other operations: api.c.)
 */
#include "validate.h"

#define DT_F32 MOEX_DT(MOEX_DTYPE_F32)
#define DT_I32 MOEX_DT(MOEX_DTYPE_I32)
#define DT_I64 MOEX_DT(MOEX_DTYPE_I64)
#define DT_LOGITS (MOEX_DT(MOEX_DTYPE_F32) | MOEX_DT(MOEX_DTYPE_BF16))

/* ---- router -------------------------------------------------------------------------- */

/* logits [T, E] f32 or bf16, topk 1..E, known score and norm; sets the dims. */
static moex_status validate_router_common(moex_context *ctx, const char *op, const moex_tensor *logits,
                                          int32_t topk, moex_router_score score, moex_router_norm norm,
                                          moex_router_dims *d) {
    const int64_t any2[2] = {-1, -1};
    MOEX_TRY(moex_check_tensor(ctx, op, "logits", logits, 2, any2, DT_LOGITS));
    d->T = logits->shape[0];
    d->E = logits->shape[1];
    d->dt = logits->dtype;
    if (d->E < 1 || d->E > INT32_MAX)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: logits must be [T, E] with 1 <= E <= INT32_MAX, got E = %lld",
                         op, (long long)d->E);
    if (topk < 1 || topk > d->E)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: topk = %d, must be 1..E (E = %lld)", op, (int)topk,
                         (long long)d->E);
    d->k = topk;
    if (score != MOEX_ROUTER_SOFTMAX && score != MOEX_ROUTER_SIGMOID)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: unknown router score %d", op, (int)score);
    if (norm != MOEX_ROUTER_NO_RENORM && norm != MOEX_ROUTER_RENORM)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: unknown router norm %d", op, (int)norm);
    return MOEX_OK;
}

static moex_status validate_router_forward(moex_context *ctx, const char *op, const moex_router_args *a,
                                           moex_router_dims *d) {
    MOEX_TRY(validate_router_common(ctx, op, &a->logits, a->topk, a->score, a->norm, d));
    const int64_t tk[2] = {d->T, d->k};
    MOEX_TRY(moex_check_output(ctx, op, "probs", &a->probs, 2, tk, DT_F32));
    return moex_check_output(ctx, op, "ids", &a->ids, 2, tk, DT_I32);
}

MOEX_DEFINE_OP(router_forward, moex_router_args, moex_router_dims, validate_router_forward)

static moex_status validate_router_backward(moex_context *ctx, const char *op, const moex_router_grad_args *a,
                                            moex_router_dims *d) {
    MOEX_TRY(validate_router_common(ctx, op, &a->logits, a->topk, a->score, a->norm, d));
    const int64_t tk[2] = {d->T, d->k}, te[2] = {d->T, d->E};
    MOEX_TRY(moex_check_tensor(ctx, op, "ids", &a->ids, 2, tk, DT_I32));
    MOEX_TRY(moex_check_tensor(ctx, op, "dprobs", &a->dprobs, 2, tk, DT_F32));
    return moex_check_output(ctx, op, "dlogits", &a->dlogits, 2, te, MOEX_DT(d->dt));
}

MOEX_DEFINE_OP(router_backward, moex_router_grad_args, moex_router_dims, validate_router_backward)

/* ---- permute and unpermute ----------------------------------------------------------- */

/* T*k rows are addressed by I32 row_map values: T*k must fit. */
static moex_status check_rows_fit_i32(moex_context *ctx, const char *op, int64_t T, int64_t k) {
    if (k > 0 && T > INT32_MAX / k)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: T*k = %lld*%lld rows do not fit the I32 row_map", op,
                         (long long)T, (long long)k);
    return MOEX_OK;
}

/* k of a [T*k] row_map given T (from the [T, H] side): rows / T. With T == 0 the map must
 * be empty and k is `k_hint` (>= 1). */
static moex_status row_map_k(moex_context *ctx, const char *op, const moex_tensor *row_map, int64_t T,
                             int64_t k_hint, int64_t *k) {
    const int64_t any1[1] = {-1};
    MOEX_TRY(moex_check_tensor(ctx, op, "row_map", row_map, 1, any1, DT_I32));
    int64_t rows = row_map->shape[0];
    if (T == 0) {
        if (rows != 0)
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: row_map has %lld rows but T = 0", op, (long long)rows);
        *k = k_hint;
        return MOEX_OK;
    }
    if (rows < T || rows % T != 0)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: row_map must be [T*k] with k >= 1, got %lld rows for T = %lld", op, (long long)rows,
                         (long long)T);
    *k = rows / T;
    return check_rows_fit_i32(ctx, op, T, *k);
}

static moex_status check_hidden(moex_context *ctx, const char *op, int64_t H) {
    if (H < 1) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: hidden size H = %lld, must be >= 1", op, (long long)H);
    return MOEX_OK;
}

static moex_status validate_permute_forward(moex_context *ctx, const char *op, const moex_permute_args *a,
                                            moex_perm_dims *d) {
    const int64_t any2[2] = {-1, -1};
    MOEX_TRY(moex_check_tensor(ctx, op, "x", &a->x, 2, any2, MOEX_DT_FLOAT));
    d->T = a->x.shape[0];
    d->H = a->x.shape[1];
    d->dt = a->x.dtype;
    MOEX_TRY(check_hidden(ctx, op, d->H));
    const int64_t idshape[2] = {d->T, -1};
    MOEX_TRY(moex_check_tensor(ctx, op, "ids", &a->ids, 2, idshape, DT_I32));
    d->k = a->ids.shape[1];
    if (d->k < 1) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: ids must be [T, k] with k >= 1", op);
    MOEX_TRY(check_rows_fit_i32(ctx, op, d->T, d->k));
    if (a->num_experts < 1)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: num_experts = %d, must be >= 1", op, (int)a->num_experts);
    d->E = a->num_experts;
    const int64_t tk[2] = {d->T, d->k}, rows[1] = {d->T * d->k}, xpshape[2] = {d->T * d->k, d->H},
                  eshape[1] = {d->E};
    MOEX_TRY(moex_check_optional(ctx, op, "probs", &a->probs, 2, tk, DT_F32));
    MOEX_TRY(moex_check_output(ctx, op, "xp", &a->xp, 2, xpshape, MOEX_DT(d->dt)));
    if (moex_present(&a->probs))
        MOEX_TRY(moex_check_output(ctx, op, "probs_p", &a->probs_p, 1, rows, DT_F32));
    else if (moex_present(&a->probs_p))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: probs_p is given but probs is absent", op);
    MOEX_TRY(moex_check_output(ctx, op, "splits", &a->splits, 1, eshape, DT_I64));
    return moex_check_output(ctx, op, "row_map", &a->row_map, 1, rows, DT_I32);
}

MOEX_DEFINE_OP(permute_forward, moex_permute_args, moex_perm_dims, validate_permute_forward)

static moex_status validate_permute_backward(moex_context *ctx, const char *op, const moex_permute_grad_args *a,
                                             moex_perm_dims *d) {
    const int64_t any2[2] = {-1, -1};
    MOEX_TRY(moex_check_output(ctx, op, "dx", &a->dx, 2, any2, MOEX_DT_FLOAT));
    d->T = a->dx.shape[0];
    d->H = a->dx.shape[1];
    d->dt = a->dx.dtype;
    d->E = 0;
    MOEX_TRY(check_hidden(ctx, op, d->H));
    /* With T == 0, dprobs [0, k] (if any) names k; it is otherwise irrelevant. */
    int64_t k_hint = a->dprobs.ndim == 2 && a->dprobs.shape[1] >= 1 ? a->dprobs.shape[1] : 1;
    MOEX_TRY(row_map_k(ctx, op, &a->row_map, d->T, k_hint, &d->k));
    const int64_t tk[2] = {d->T, d->k}, rows[1] = {d->T * d->k}, dxpshape[2] = {d->T * d->k, d->H};
    MOEX_TRY(moex_check_tensor(ctx, op, "dxp", &a->dxp, 2, dxpshape, MOEX_DT(d->dt)));
    MOEX_TRY(moex_check_optional(ctx, op, "dprobs_p", &a->dprobs_p, 1, rows, DT_F32));
    if (moex_present(&a->dprobs_p))
        MOEX_TRY(moex_check_output(ctx, op, "dprobs", &a->dprobs, 2, tk, DT_F32));
    else if (moex_present(&a->dprobs))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: dprobs is requested but dprobs_p is absent", op);
    return MOEX_OK;
}

MOEX_DEFINE_OP(permute_backward, moex_permute_grad_args, moex_perm_dims, validate_permute_backward)

typedef moex_status (*check_fn)(moex_context *ctx, const char *op, const char *name, const moex_tensor *t,
                                int ndim, const int64_t *shape, unsigned dtypes);

/* The [T, H] side `tok` and the [T*k, H] side `rowsd` of an unpermute, forward (tok is the
 * output) or backward (rowsd is). */
static moex_status validate_unpermute_common(moex_context *ctx, const char *op, const moex_tensor *row_map,
                                             const char *tok_name, const moex_tensor *tok, const char *rows_name,
                                             const moex_tensor *rowsd, moex_span_role tok_role, moex_perm_dims *d) {
    const int64_t any2[2] = {-1, -1};
    const check_fn check_tok = tok_role == MOEX_SPAN_OUT ? moex_check_output : moex_check_tensor;
    const check_fn check_rows = tok_role == MOEX_SPAN_OUT ? moex_check_tensor : moex_check_output;
    MOEX_TRY(check_tok(ctx, op, tok_name, tok, 2, any2, MOEX_DT_FLOAT));
    d->T = tok->shape[0];
    d->H = tok->shape[1];
    d->dt = tok->dtype;
    d->E = 0;
    MOEX_TRY(check_hidden(ctx, op, d->H));
    MOEX_TRY(row_map_k(ctx, op, row_map, d->T, 1, &d->k));
    const int64_t rshape[2] = {d->T * d->k, d->H};
    return check_rows(ctx, op, rows_name, rowsd, 2, rshape, MOEX_DT(d->dt));
}

static moex_status validate_unpermute_forward(moex_context *ctx, const char *op, const moex_unpermute_args *a,
                                              moex_perm_dims *d) {
    return validate_unpermute_common(ctx, op, &a->row_map, "y", &a->y, "yp", &a->yp, MOEX_SPAN_OUT, d);
}

MOEX_DEFINE_OP(unpermute_forward, moex_unpermute_args, moex_perm_dims, validate_unpermute_forward)

static moex_status validate_unpermute_backward(moex_context *ctx, const char *op,
                                               const moex_unpermute_grad_args *a, moex_perm_dims *d) {
    return validate_unpermute_common(ctx, op, &a->row_map, "dy", &a->dy, "dyp", &a->dyp, MOEX_SPAN_IN, d);
}

MOEX_DEFINE_OP(unpermute_backward, moex_unpermute_grad_args, moex_perm_dims, validate_unpermute_backward)

/* ---- MoE layer ----------------------------------------------------------------------- */

/* Which parts of moex_moe_layer_args a call needs besides the layer's inputs. */
enum { NEED_SAVED = 1, NEED_Y = 2 };

/* dW of the layer: WRITE into f32 or the activation dtype, ACCUMULATE into f32 only. */
static unsigned dw_dtypes(moex_grad_mode mode, moex_dtype dt) {
    return mode == MOEX_GRAD_ACCUMULATE ? DT_F32 : (MOEX_DT(dt) | DT_F32);
}

/* The saved buffer: the backend's size plus alignment slack (as for the workspace); the
 * backend gets it aligned to MOEX_WS_ALIGN. The forward and backward must be given the same
 * pointer (or one with the same address modulo MOEX_WS_ALIGN). The forward writes it
 * (MOEX_SPAN_OUT), the backward reads it. */
static moex_status saved_prepare(moex_context *ctx, const char *op, const moex_moe_layer_args *a,
                                 const moex_moe_dims *d, moex_span_role role, void **aligned,
                                 size_t *backend_bytes) {
    MOEX_UNSUPPORTED_IF_MISSING(ctx, op, moe_layer_saved);
    *backend_bytes = ctx->ops->moe_layer_saved(ctx, a, d);
    return moex_buffer_prepare(ctx, op, "saved", *backend_bytes, a->saved, a->saved_bytes, role, aligned);
}

/* The layer's inputs (and y when NEED_Y); sets the dims. */
static moex_status validate_moe_layer(moex_context *ctx, const char *op, const moex_moe_layer_args *a,
                                      unsigned need, moex_moe_dims *d) {
    const int64_t any2[2] = {-1, -1};
    MOEX_TRY(moex_check_tensor(ctx, op, "x", &a->x, 2, any2, MOEX_DT_FLOAT));
    d->T = a->x.shape[0];
    d->H = a->x.shape[1];
    d->dt = a->x.dtype;
    MOEX_TRY(check_hidden(ctx, op, d->H));
    const int64_t rwshape[2] = {-1, d->H};
    MOEX_TRY(moex_check_tensor(ctx, op, "router_w", &a->router_w, 2, rwshape, MOEX_DT(d->dt)));
    d->E = a->router_w.shape[0];
    if (d->E < 1 || d->E > INT32_MAX)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: router_w must be [E, H] with 1 <= E <= INT32_MAX, got E = %lld",
                         op, (long long)d->E);
    if (a->topk < 1 || a->topk > d->E)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: topk = %d, must be 1..E (E = %lld)", op, (int)a->topk,
                         (long long)d->E);
    d->k = a->topk;
    MOEX_TRY(check_rows_fit_i32(ctx, op, d->T, d->k));
    if (a->score != MOEX_ROUTER_SOFTMAX && a->score != MOEX_ROUTER_SIGMOID)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: unknown router score %d", op, (int)a->score);
    if (a->norm != MOEX_ROUTER_NO_RENORM && a->norm != MOEX_ROUTER_RENORM)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: unknown router norm %d", op, (int)a->norm);

    int64_t twoF = a->w1.t.ndim == 3 ? a->w1.t.shape[1] : -1;
    MOEX_TRY(moex_check_weight(ctx, op, "w1", &a->w1, d->E, twoF, d->H, MOEX_DT(d->dt)));
    if (twoF < 2 || twoF % 2 != 0)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: w1 must be [E, 2F, H] with an even 2F >= 2, got %lld", op,
                         (long long)twoF);
    d->F = twoF / 2;
    MOEX_TRY(moex_check_weight(ctx, op, "w2", &a->w2, d->E, d->H, d->F, MOEX_DT(d->dt)));
    /* The layer's own intermediates are bounded like the caller's tensors. */
    const int64_t rows = d->T * d->k;
    MOEX_TRY(moex_check_internal(ctx, op, "logits", d->T, d->E));
    MOEX_TRY(moex_check_internal(ctx, op, "xp", rows, d->H));
    MOEX_TRY(moex_check_internal(ctx, op, "h", rows, 2 * d->F));
    const int64_t b1shape[2] = {d->E, 2 * d->F}, b2shape[2] = {d->E, d->H}, yshape[2] = {d->T, d->H};
    const unsigned dt_bias = MOEX_DT(d->dt) | DT_F32;
    MOEX_TRY(moex_check_optional(ctx, op, "b1", &a->b1, 2, b1shape, dt_bias));
    MOEX_TRY(moex_check_bias_mode(ctx, op, a->b2_mode));
    if (a->b2_mode == MOEX_BIAS_NONE) {
        if (moex_present(&a->b2))
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: b2 is given but b2_mode is MOEX_BIAS_NONE", op);
    } else {
        MOEX_TRY(moex_check_tensor(ctx, op, "b2", &a->b2, 2, b2shape, dt_bias));
    }
    MOEX_TRY(moex_check_glu(ctx, op, &a->glu, d->F));
    if (need & NEED_Y) MOEX_TRY(moex_check_output(ctx, op, "y", &a->y, 2, yshape, MOEX_DT(d->dt)));
    return MOEX_OK;
}

moex_status moex_moe_layer_saved_size(moex_context *ctx, const moex_moe_layer_args *args, size_t *bytes) {
    static const char op[] = "moex_moe_layer_saved_size";
    MOEX_TRY(moex_enter(ctx, op, args));
    if (!bytes) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: bytes is NULL", op);
    moex_moe_dims d;
    MOEX_TRY(validate_moe_layer(ctx, op, args, 0, &d));
    MOEX_UNSUPPORTED_IF_MISSING(ctx, op, moe_layer_saved);
    return moex_buffer_public_size(ctx, op, "saved", ctx->ops->moe_layer_saved(ctx, args, &d), bytes);
}

moex_status moex_moe_layer_forward_workspace_size(moex_context *ctx, const moex_moe_layer_args *args,
                                                  size_t *bytes) {
    static const char op[] = "moex_moe_layer_forward_workspace_size";
    MOEX_TRY(moex_enter(ctx, op, args));
    if (!bytes) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: bytes is NULL", op);
    moex_moe_dims d;
    MOEX_TRY(validate_moe_layer(ctx, op, args, NEED_Y, &d));
    MOEX_WORKSPACE_SIZE(ctx, op, moe_layer_forward, args, d, bytes);
}

moex_status moex_moe_layer_forward(moex_context *ctx, const moex_moe_layer_args *args, void *workspace,
                                   size_t workspace_bytes, moex_stream stream) {
    static const char op[] = "moex_moe_layer_forward";
    MOEX_TRY(moex_enter(ctx, op, args));
    moex_moe_dims d;
    MOEX_TRY(validate_moe_layer(ctx, op, args, NEED_SAVED | NEED_Y, &d));
    moex_moe_layer_args a = *args;   /* the backend sees the aligned saved buffer */
    MOEX_TRY(saved_prepare(ctx, op, args, &d, MOEX_SPAN_OUT, &a.saved, &a.saved_bytes));
    MOEX_DISPATCH(ctx, op, moe_layer_forward, &a, d, workspace, workspace_bytes, stream);
}

static moex_status validate_moe_layer_backward(moex_context *ctx, const char *op,
                                               const moex_moe_layer_grad_args *a, moex_moe_dims *d) {
    MOEX_TRY(validate_moe_layer(ctx, op, &a->fwd, NEED_SAVED, d));
    const int64_t th[2] = {d->T, d->H}, eh[2] = {d->E, d->H}, db1shape[2] = {d->E, 2 * d->F};
    MOEX_TRY(moex_check_tensor(ctx, op, "dy", &a->dy, 2, th, MOEX_DT(d->dt)));
    MOEX_TRY(moex_check_optional_output(ctx, op, "dx", &a->dx, 2, th, MOEX_DT(d->dt)));
    MOEX_TRY(moex_check_grad_mode(ctx, op, a->dw_mode));
    const unsigned dts = dw_dtypes(a->dw_mode, d->dt);
    MOEX_TRY(moex_check_optional_output(ctx, op, "drouter_w", &a->drouter_w, 2, eh, dts));
    if (moex_weight_present(&a->dw1))
        MOEX_TRY(moex_check_weight_output(ctx, op, "dw1", &a->dw1, d->E, 2 * d->F, d->H, dts));
    if (moex_weight_present(&a->dw2))
        MOEX_TRY(moex_check_weight_output(ctx, op, "dw2", &a->dw2, d->E, d->H, d->F, dts));
    MOEX_TRY(moex_check_optional_output(ctx, op, "db1", &a->db1, 2, db1shape, DT_F32));
    MOEX_TRY(moex_check_optional_output(ctx, op, "db2", &a->db2, 2, eh, DT_F32));
    if (a->fwd.b2_mode == MOEX_BIAS_NONE && moex_present(&a->db2))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: db2 is requested but b2_mode is MOEX_BIAS_NONE", op);
    return MOEX_OK;
}

moex_status moex_moe_layer_backward_workspace_size(moex_context *ctx, const moex_moe_layer_grad_args *args,
                                                   size_t *bytes) {
    static const char op[] = "moex_moe_layer_backward_workspace_size";
    MOEX_TRY(moex_enter(ctx, op, args));
    if (!bytes) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: bytes is NULL", op);
    moex_moe_dims d;
    MOEX_TRY(validate_moe_layer_backward(ctx, op, args, &d));
    MOEX_WORKSPACE_SIZE(ctx, op, moe_layer_backward, args, d, bytes);
}

moex_status moex_moe_layer_backward(moex_context *ctx, const moex_moe_layer_grad_args *args, void *workspace,
                                    size_t workspace_bytes, moex_stream stream) {
    static const char op[] = "moex_moe_layer_backward";
    MOEX_TRY(moex_enter(ctx, op, args));
    moex_moe_dims d;
    MOEX_TRY(validate_moe_layer_backward(ctx, op, args, &d));
    moex_moe_layer_grad_args a = *args;   /* the backend sees the aligned saved buffer */
    MOEX_TRY(saved_prepare(ctx, op, &args->fwd, &d, MOEX_SPAN_IN, &a.fwd.saved, &a.fwd.saved_bytes));
    MOEX_DISPATCH(ctx, op, moe_layer_backward, &a, d, workspace, workspace_bytes, stream);
}
