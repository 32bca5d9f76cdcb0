/*
 * routing.c - the router, permute and unpermute, forward and backward: validation, and a
 * composition of one backend primitive each (the math: docs/ops.md). The MoE layer
 * (moe_layer.c) runs the same primitives.
 * Each op's ws and run only call its primitive: one plain definition per op function (op.h),
 * so that op.c's dispatch and grep find each; their shapes repeat by design.
 */
#include "op.h"

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
    d->k = topk;
    return moex_check_router_options(ctx, op, topk, d->E, score, norm);
}

moex_status moex_op_router_forward_validate(moex_context *ctx, const char *op, const moex_router_args *a,
                                            moex_purpose p, moex_router_dims *d) {
    MOEX_TRY(validate_router_common(ctx, op, &a->logits, a->topk, a->score, a->norm, d));
    const int64_t tk[2] = {d->T, d->k};
    MOEX_TRY(moex_check_output(ctx, op, "probs", &a->probs, 2, tk, MOEX_DT_F32));
    return moex_check_output(ctx, op, "ids", &a->ids, 2, tk, MOEX_DT_I32);
}

moex_status moex_op_router_backward_validate(moex_context *ctx, const char *op, const moex_router_grad_args *a,
                                             moex_purpose p, moex_router_dims *d) {
    MOEX_TRY(validate_router_common(ctx, op, &a->logits, a->topk, a->score, a->norm, d));
    const int64_t tk[2] = {d->T, d->k}, te[2] = {d->T, d->E};
    MOEX_TRY(moex_check_tensor(ctx, op, "ids", &a->ids, 2, tk, MOEX_DT_I32));
    MOEX_TRY(moex_check_tensor(ctx, op, "dprobs", &a->dprobs, 2, tk, MOEX_DT_F32));
    return moex_check_output(ctx, op, "dlogits", &a->dlogits, 2, te, MOEX_DT(d->dt));
}

/* ---- permute and unpermute ----------------------------------------------------------- */

/* k of a [T*k] row_map given T (from the [T, H] side): rows / T. With T == 0 the map must
 * be empty and k is `k_hint` (>= 1). */
static moex_status row_map_k(moex_context *ctx, const char *op, const moex_tensor *row_map, int64_t T,
                             int64_t k_hint, int64_t *k) {
    const int64_t any1[1] = {-1};
    MOEX_TRY(moex_check_tensor(ctx, op, "row_map", row_map, 1, any1, MOEX_DT_I32));
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
    return moex_check_rows_fit_i32(ctx, op, T, *k);
}

moex_status moex_op_permute_forward_validate(moex_context *ctx, const char *op, const moex_permute_args *a,
                                             moex_purpose p, moex_perm_dims *d) {
    MOEX_TRY(moex_check_tokens(ctx, op, "x", &a->x, MOEX_SPAN_IN, &d->T, &d->H, &d->dt));
    const int64_t idshape[2] = {d->T, -1};
    MOEX_TRY(moex_check_tensor(ctx, op, "ids", &a->ids, 2, idshape, MOEX_DT_I32));
    d->k = a->ids.shape[1];
    if (d->k < 1) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: ids must be [T, k] with k >= 1", op);
    MOEX_TRY(moex_check_rows_fit_i32(ctx, op, d->T, d->k));
    if (a->num_experts < 1)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: num_experts = %d, must be >= 1", op, (int)a->num_experts);
    d->E = a->num_experts;
    const int64_t tk[2] = {d->T, d->k}, rows[1] = {d->T * d->k}, xpshape[2] = {d->T * d->k, d->H},
                  eshape[1] = {d->E};
    MOEX_TRY(moex_check_optional(ctx, op, "probs", &a->probs, 2, tk, MOEX_DT_F32));
    MOEX_TRY(moex_check_output(ctx, op, "xp", &a->xp, 2, xpshape, MOEX_DT(d->dt)));
    if (moex_present(&a->probs))
        MOEX_TRY(moex_check_output(ctx, op, "probs_p", &a->probs_p, 1, rows, MOEX_DT_F32));
    else if (moex_present(&a->probs_p))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: probs_p is given but probs is absent", op);
    MOEX_TRY(moex_check_output(ctx, op, "splits", &a->splits, 1, eshape, MOEX_DT_I64));
    return moex_check_output(ctx, op, "row_map", &a->row_map, 1, rows, MOEX_DT_I32);
}

moex_status moex_op_permute_backward_validate(moex_context *ctx, const char *op, const moex_permute_grad_args *a,
                                              moex_purpose p, moex_perm_dims *d) {
    MOEX_TRY(moex_check_tokens(ctx, op, "dx", &a->dx, MOEX_SPAN_OUT, &d->T, &d->H, &d->dt));
    d->E = 0;
    /* With T == 0, dprobs [0, k] (if any) names k; it is otherwise irrelevant. */
    int64_t k_hint = a->dprobs.ndim == 2 && a->dprobs.shape[1] >= 1 ? a->dprobs.shape[1] : 1;
    MOEX_TRY(row_map_k(ctx, op, &a->row_map, d->T, k_hint, &d->k));
    const int64_t tk[2] = {d->T, d->k}, rows[1] = {d->T * d->k}, dxpshape[2] = {d->T * d->k, d->H};
    MOEX_TRY(moex_check_tensor(ctx, op, "dxp", &a->dxp, 2, dxpshape, MOEX_DT(d->dt)));
    MOEX_TRY(moex_check_optional(ctx, op, "dprobs_p", &a->dprobs_p, 1, rows, MOEX_DT_F32));
    if (moex_present(&a->dprobs_p))
        MOEX_TRY(moex_check_output(ctx, op, "dprobs", &a->dprobs, 2, tk, MOEX_DT_F32));
    else if (moex_present(&a->dprobs))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: dprobs is requested but dprobs_p is absent", op);
    return MOEX_OK;
}

/* The [T, H] side `tok` and the [T*k, H] side `rowsd` of an unpermute, forward (tok is the
 * output) or backward (rowsd is). */
static moex_status validate_unpermute_common(moex_context *ctx, const char *op, const moex_tensor *row_map,
                                             const char *tok_name, const moex_tensor *tok, const char *rows_name,
                                             const moex_tensor *rowsd, moex_span_role tok_role, moex_perm_dims *d) {
    MOEX_TRY(moex_check_tokens(ctx, op, tok_name, tok, tok_role, &d->T, &d->H, &d->dt));
    d->E = 0;
    MOEX_TRY(row_map_k(ctx, op, row_map, d->T, 1, &d->k));
    const int64_t rshape[2] = {d->T * d->k, d->H};
    if (tok_role == MOEX_SPAN_OUT) return moex_check_tensor(ctx, op, rows_name, rowsd, 2, rshape, MOEX_DT(d->dt));
    return moex_check_output(ctx, op, rows_name, rowsd, 2, rshape, MOEX_DT(d->dt));
}

moex_status moex_op_unpermute_forward_validate(moex_context *ctx, const char *op, const moex_unpermute_args *a,
                                               moex_purpose p, moex_perm_dims *d) {
    return validate_unpermute_common(ctx, op, &a->row_map, "y", &a->y, "yp", &a->yp, MOEX_SPAN_OUT, d);
}

moex_status moex_op_unpermute_backward_validate(moex_context *ctx, const char *op, const moex_unpermute_grad_args *a,
                                                moex_purpose p, moex_perm_dims *d) {
    return validate_unpermute_common(ctx, op, &a->row_map, "dy", &a->dy, "dyp", &a->dyp, MOEX_SPAN_IN, d);
}

