/*
 * quantize.c - FP8 quantization and dequantization (experimental): validation and
 * composition (the rules: docs/ops.md section 9; the element math: quant_math.h). Grouped
 * rows: the groups are prepared from the splits, then the backend's primitive runs on them
 * (workspace: the prepared handle, then the primitive's region: moex_groups_layout_of).
 * Grouped weights (9.7): one primitive each way.
 * Each op's ws and run only prepare the groups and call its primitive: one plain definition
 * per op function (op.h), so that op.c's dispatch and grep find each; their shapes repeat by
 * design.
 */
#include "op.h"

#include <math.h>
#include <stdio.h>

/* The quantization parameters; sets d->block. */
static moex_status check_params(moex_context *ctx, const char *op, const moex_quant_params *q, moex_quant_dims *d) {
    if (q->recipe != MOEX_QUANT_TENSOR && q->recipe != MOEX_QUANT_GROUP && q->recipe != MOEX_QUANT_BLOCK &&
        q->recipe != MOEX_QUANT_MXFP8)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: unknown params.recipe %d", op, (int)q->recipe);
    if (q->fp8 != MOEX_DTYPE_E4M3 && q->fp8 != MOEX_DTYPE_E5M2)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: params.fp8 must be e4m3 or e5m2, got %s", op,
                         moex_dtype_name(q->fp8));
    if (q->rounding != MOEX_SCALE_EXACT && q->rounding != MOEX_SCALE_POW2)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: unknown params.rounding %d", op, (int)q->rounding);
    if (!isfinite(q->amax_epsilon) || q->amax_epsilon < 0.0f)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: params.amax_epsilon must be finite and >= 0, got %g", op,
                         (double)q->amax_epsilon);
    if (q->scale_layout != MOEX_SCALES_PLAIN && q->scale_layout != MOEX_SCALES_MX_SWIZZLED)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: unknown params.scale_layout %d", op, (int)q->scale_layout);
    if (q->scale_layout == MOEX_SCALES_MX_SWIZZLED && q->recipe != MOEX_QUANT_MXFP8)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: params.scale_layout MX_SWIZZLED is for MXFP8 scales, not those of recipe %d", op,
                         (int)q->recipe);
    d->block = q->recipe == MOEX_QUANT_BLOCK ? 128 : q->recipe == MOEX_QUANT_MXFP8 ? 32 : 0;
    return MOEX_OK;
}

/* The scale columns of a block recipe (T, K < 2^60: no overflow). */
static void block_dims(moex_quant_dims *d) {
    d->row_blocks = d->block ? moex_i64_cdiv(d->K, d->block) : 0;
    d->col_tiles = d->block ? moex_i64_cdiv(d->T, d->block) + d->G : 0;
}

/* *len = the length of a swizzled scale vector (docs/ops.md 9.8): `mats` matrices of [R, C]
 * padded to [roundup(R, 128), roundup(C, 4)] (grouped: R = 128 per tile, mats = the bound of
 * the tiles); refused when it passes INT64_MAX. */
static moex_status swizzled_len(moex_context *ctx, const char *op, const char *name, int64_t mats, int64_t R,
                                int64_t C, int64_t *len) {
    if (!moex_i64_mul(mats, 128 * moex_i64_cdiv(R, 128), len) || !moex_i64_mul(*len, 4 * moex_i64_cdiv(C, 4), len))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s: the swizzled scales would pass 2^63 bytes", op, name);
    return MOEX_OK;
}

/* A check of one tensor as an output or an input. */
static moex_status check_as(moex_context *ctx, const char *op, const char *name, const moex_tensor *t, int ndim,
                            const int64_t *shape, unsigned dts, moex_span_role role) {
    return role == MOEX_SPAN_OUT ? moex_check_output(ctx, op, name, t, ndim, shape, dts)
                                 : moex_check_tensor(ctx, op, name, t, ndim, shape, dts);
}

/* The scales of one orientation: shape (TENSOR [1], GROUP [G], blocks [rows, cols]; swizzled
 * MXFP8: one vector) and dtype. */
static moex_status check_scales(moex_context *ctx, const char *op, const char *name, const moex_tensor *scales,
                                const moex_quant_params *q, const moex_quant_dims *d,
                                moex_quant_orientation orient, moex_span_role role) {
    const unsigned dts = q->recipe == MOEX_QUANT_MXFP8 ? MOEX_DT(MOEX_DTYPE_E8M0) : MOEX_DT_F32;
    if (q->scale_layout == MOEX_SCALES_MX_SWIZZLED) {   /* group g: rows of 128-row tiles, from q_g */
        const int64_t tiles = moex_i64_cdiv(d->T, 128) + d->G;
        int64_t len[1];
        MOEX_TRY(orient == MOEX_QUANT_ROWWISE ? swizzled_len(ctx, op, name, tiles, 128, d->row_blocks, len)
                                              : swizzled_len(ctx, op, name, 1, d->K, 4 * tiles, len));
        return check_as(ctx, op, name, scales, 1, len, dts, role);
    }
    if (!d->block) {
        const int64_t shape[1] = {q->recipe == MOEX_QUANT_GROUP ? d->G : 1};
        return check_as(ctx, op, name, scales, 1, shape, dts, role);
    }
    const int64_t shape[2] = {orient == MOEX_QUANT_ROWWISE ? d->T : d->K,
                              orient == MOEX_QUANT_ROWWISE ? d->row_blocks : d->col_tiles};
    return check_as(ctx, op, name, scales, 2, shape, dts, role);
}

/* One quantized copy: data [T, K] (rowwise) or [K, T] (columnwise) in params.fp8, and scales. */
static moex_status check_copy(moex_context *ctx, const char *op, const char *data_name, const char *scales_name,
                              const moex_quant_tensor *c, const moex_quant_params *q, const moex_quant_dims *d,
                              moex_quant_orientation orient, moex_span_role role) {
    const int64_t shape[2] = {orient == MOEX_QUANT_ROWWISE ? d->T : d->K,
                              orient == MOEX_QUANT_ROWWISE ? d->K : d->T};
    MOEX_TRY(check_as(ctx, op, data_name, &c->data, 2, shape, MOEX_DT(q->fp8), role));
    return check_scales(ctx, op, scales_name, &c->scales, q, d, orient, role);
}

/* Which copies a quantize writes (*row, *col): at least one, and no scales without data. */
static moex_status check_copies_present(moex_context *ctx, const char *op, const moex_quant_tensor *rowwise,
                                        const moex_quant_tensor *columnwise, bool *row, bool *col) {
    *row = moex_present(&rowwise->data), *col = moex_present(&columnwise->data);
    if (!*row && !*col)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: neither rowwise.data nor columnwise.data is given", op);
    if ((!*row && moex_present(&rowwise->scales)) || (!*col && moex_present(&columnwise->scales)))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s.scales is given without its data", op,
                         *row ? "columnwise" : "rowwise");
    return MOEX_OK;
}

/* The workspace of a grouped quantize or dequantize whose primitive needs `sub` bytes: the
 * handle's storage, then the primitive's region (moex_groups_layout_of). The two ops' ws and
 * run are alike in shape by design: each is one grouped primitive on its splits' groups. */
static size_t quant_ws(moex_context *ctx, const moex_quant_dims *d, size_t sub) {
    return moex_groups_layout_of(ctx, d->G, d->T, NULL, sub, NULL).total;
}

/* ---- quantize ------------------------------------------------------------------------- */

moex_status moex_quant_check_outputs(moex_context *ctx, const char *op, const char *prefix,
                                     const moex_quant_params *params, const moex_quant_tensor *rowwise,
                                     const moex_quant_tensor *columnwise, const moex_tensor *amax,
                                     moex_quant_dims *d) {
    char rd[40], rs[40], cd[40], cs[40], am[40];
    snprintf(rd, sizeof rd, "%srowwise.data", prefix), snprintf(rs, sizeof rs, "%srowwise.scales", prefix);
    snprintf(cd, sizeof cd, "%scolumnwise.data", prefix), snprintf(cs, sizeof cs, "%scolumnwise.scales", prefix);
    snprintf(am, sizeof am, "%samax", prefix);
    MOEX_TRY(check_params(ctx, op, params, d));
    block_dims(d);
    bool row, col;
    MOEX_TRY(check_copies_present(ctx, op, rowwise, columnwise, &row, &col));
    if (row) MOEX_TRY(check_copy(ctx, op, rd, rs, rowwise, params, d, MOEX_QUANT_ROWWISE, MOEX_SPAN_OUT));
    if (col) MOEX_TRY(check_copy(ctx, op, cd, cs, columnwise, params, d, MOEX_QUANT_COLUMNWISE, MOEX_SPAN_OUT));
    if (!moex_present(amax)) return MOEX_OK;
    if (d->block) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s is an output of TENSOR and GROUP only", op, am);
    const int64_t shape[1] = {params->recipe == MOEX_QUANT_GROUP ? d->G : 1};
    return moex_check_output(ctx, op, am, amax, 1, shape, MOEX_DT_F32);
}

moex_status moex_op_group_quantize_validate(moex_context *ctx, const char *op, const moex_group_quantize_args *a,
                                            moex_purpose p, moex_quant_dims *d) {
    MOEX_TRY(moex_check_grouped_rows(ctx, op, &a->splits, "x", &a->x, &d->G, &d->T, &d->K, &d->dt));
    MOEX_TRY(moex_quant_check_outputs(ctx, op, "", &a->params, &a->rowwise, &a->columnwise, &a->amax, d));
    const int64_t dbshape[2] = {d->G, d->K};
    return moex_check_optional_output(ctx, op, "dbias", &a->dbias, 2, dbshape, MOEX_DT_F32);
}

size_t moex_op_group_quantize_ws(moex_context *ctx, const moex_group_quantize_args *a, const moex_quant_dims *d) {
    return quant_ws(ctx, d, moex_ops(ctx)->quantize_ws(ctx, a, d));
}

moex_status moex_op_group_quantize_run(moex_context *ctx, const moex_call *c, const moex_group_quantize_args *a,
                                       const moex_quant_dims *d, void *ws) {
    moex_groups g;
    void *sub;
    MOEX_TRY(moex_groups_layout_prepare(ctx, c, &a->splits, d->G, d->T, NULL, ws, &g, &sub));
    return moex_ops(ctx)->quantize(ctx, c, &g, a, d, sub);
}

/* ---- dequantize ----------------------------------------------------------------------- */

moex_status moex_op_group_dequantize_validate(moex_context *ctx, const char *op,
                                              const moex_group_dequantize_args *a, moex_purpose p,
                                              moex_quant_dims *d) {
    const int64_t any2[2] = {-1, -1};
    MOEX_TRY(moex_check_splits_arg(ctx, op, &a->splits, &d->G));
    MOEX_TRY(moex_check_output(ctx, op, "y", &a->y, 2, any2, MOEX_DT_FLOAT));
    d->T = a->y.shape[0];
    d->K = a->y.shape[1];
    d->dt = a->y.dtype;
    MOEX_TRY(check_params(ctx, op, &a->params, d));
    block_dims(d);
    if (a->orientation != MOEX_QUANT_ROWWISE && a->orientation != MOEX_QUANT_COLUMNWISE)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: unknown orientation %d", op, (int)a->orientation);
    return check_copy(ctx, op, "src.data", "src.scales", &a->src, &a->params, d, a->orientation, MOEX_SPAN_IN);
}

size_t moex_op_group_dequantize_ws(moex_context *ctx, const moex_group_dequantize_args *a,
                                   const moex_quant_dims *d) {
    return quant_ws(ctx, d, moex_ops(ctx)->dequantize_ws(ctx, a, d));
}

moex_status moex_op_group_dequantize_run(moex_context *ctx, const moex_call *c, const moex_group_dequantize_args *a,
                                         const moex_quant_dims *d, void *ws) {
    moex_groups g;
    void *sub;
    MOEX_TRY(moex_groups_layout_prepare(ctx, c, &a->splits, d->G, d->T, NULL, ws, &g, &sub));
    return moex_ops(ctx)->dequantize(ctx, c, &g, a, d, sub);
}

/* ---- weights (docs/ops.md 9.7) ---------------------------------------------------------- */

/* One copy of quantized weights: data rowwise [G, N, K] or columnwise [G, K, N] and its
 * scales (GROUP [G]; BLOCK [G, blocks of the rows, blocks of the columns]; MXFP8 [G, rows,
 * ceil(cols/32)]); d->T is N. */
static moex_status check_weight_copy(moex_context *ctx, const char *op, const char *data_name,
                                     const char *scales_name, const moex_quant_tensor *c, const moex_quant_params *q,
                                     const moex_quant_dims *d, moex_quant_orientation orient, moex_span_role role) {
    const int64_t rows = orient == MOEX_QUANT_ROWWISE ? d->T : d->K, cols = orient == MOEX_QUANT_ROWWISE ? d->K : d->T;
    const int64_t dshape[3] = {d->G, rows, cols};
    MOEX_TRY(check_as(ctx, op, data_name, &c->data, 3, dshape, MOEX_DT(q->fp8), role));
    const unsigned dts = q->recipe == MOEX_QUANT_MXFP8 ? MOEX_DT(MOEX_DTYPE_E8M0) : MOEX_DT_F32;
    if (q->scale_layout == MOEX_SCALES_MX_SWIZZLED) {   /* one [rows, ceil(cols/32)] matrix per expert */
        int64_t len[1];
        MOEX_TRY(swizzled_len(ctx, op, scales_name, d->G, rows, moex_i64_cdiv(cols, 32), len));
        return check_as(ctx, op, scales_name, &c->scales, 1, len, dts, role);
    }
    const int64_t gshape[1] = {d->G};
    const int64_t sshape[3] = {d->G, q->recipe == MOEX_QUANT_BLOCK ? moex_i64_cdiv(rows, d->block) : rows,
                               moex_i64_cdiv(cols, d->block ? d->block : 1)};
    const int nd = q->recipe == MOEX_QUANT_GROUP ? 1 : 3;
    return check_as(ctx, op, scales_name, &c->scales, nd, nd == 1 ? gshape : sshape, dts, role);
}

/* The weight's recipe (not TENSOR); sets the block. */
static moex_status check_weight_params(moex_context *ctx, const char *op, const moex_quant_params *q,
                                       moex_quant_dims *d) {
    MOEX_TRY(check_params(ctx, op, q, d));
    if (q->recipe == MOEX_QUANT_TENSOR)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: TENSOR is not a weight recipe (GROUP with G = 1 is one scale for one weight)", op);
    return MOEX_OK;
}

/* w [G, N, K] sets G, T = N, K and the dtype. */
static void weight_dims(const moex_tensor *w, moex_quant_dims *d) {
    d->G = w->shape[0], d->T = w->shape[1], d->K = w->shape[2], d->dt = w->dtype;
    d->row_blocks = d->col_tiles = 0;
}

moex_status moex_op_weight_quantize_validate(moex_context *ctx, const char *op, const moex_weight_quantize_args *a,
                                             moex_purpose p, moex_quant_dims *d) {
    const int64_t any3[3] = {-1, -1, -1};
    MOEX_TRY(moex_check_tensor(ctx, op, "w", &a->w, 3, any3, MOEX_DT_FLOAT));
    weight_dims(&a->w, d);
    MOEX_TRY(check_weight_params(ctx, op, &a->params, d));
    bool row, col;
    MOEX_TRY(check_copies_present(ctx, op, &a->rowwise, &a->columnwise, &row, &col));
    if (row)
        MOEX_TRY(check_weight_copy(ctx, op, "rowwise.data", "rowwise.scales", &a->rowwise, &a->params, d,
                                   MOEX_QUANT_ROWWISE, MOEX_SPAN_OUT));
    if (col)
        MOEX_TRY(check_weight_copy(ctx, op, "columnwise.data", "columnwise.scales", &a->columnwise, &a->params, d,
                                   MOEX_QUANT_COLUMNWISE, MOEX_SPAN_OUT));
    if (moex_present(&a->amax)) {
        if (a->params.recipe != MOEX_QUANT_GROUP)
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: amax is an output of GROUP only", op);
        const int64_t shape[1] = {d->G};
        MOEX_TRY(moex_check_output(ctx, op, "amax", &a->amax, 1, shape, MOEX_DT_F32));
    }
    return MOEX_OK;
}

moex_status moex_op_weight_dequantize_validate(moex_context *ctx, const char *op,
                                               const moex_weight_dequantize_args *a, moex_purpose p,
                                               moex_quant_dims *d) {
    const int64_t any3[3] = {-1, -1, -1};
    MOEX_TRY(moex_check_output(ctx, op, "w", &a->w, 3, any3, MOEX_DT_FLOAT));
    weight_dims(&a->w, d);
    MOEX_TRY(check_weight_params(ctx, op, &a->params, d));
    if (a->orientation != MOEX_QUANT_ROWWISE && a->orientation != MOEX_QUANT_COLUMNWISE)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: unknown orientation %d", op, (int)a->orientation);
    return check_weight_copy(ctx, op, "src.data", "src.scales", &a->src, &a->params, d, a->orientation,
                             MOEX_SPAN_IN);
}

/* ---- FP8 GEMM operands (op.h) ---------------------------------------------------------- */

moex_status moex_quant_check_rows_input(moex_context *ctx, const char *op, const char *data_name,
                                        const char *scales_name, const moex_quant_params *params,
                                        const moex_quant_tensor *copy, moex_quant_orientation orient,
                                        moex_quant_dims *d) {
    MOEX_TRY(check_params(ctx, op, params, d));
    block_dims(d);
    return check_copy(ctx, op, data_name, scales_name, copy, params, d, orient, MOEX_SPAN_IN);
}

moex_status moex_quant_check_weight_input(moex_context *ctx, const char *op, const char *data_name,
                                          const char *scales_name, const moex_quant_params *params,
                                          const moex_quant_tensor *copy, moex_quant_dims *d) {
    d->row_blocks = d->col_tiles = 0;
    MOEX_TRY(check_weight_params(ctx, op, params, d));
    return check_weight_copy(ctx, op, data_name, scales_name, copy, params, d, MOEX_QUANT_ROWWISE, MOEX_SPAN_IN);
}
