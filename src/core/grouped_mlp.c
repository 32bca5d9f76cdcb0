/*
 * grouped_mlp.c - the grouped MLP, forward and backward: validation and its one composition
 * from the backend primitives, in either precision of args->fp8 (the math: docs/ops.md 4; the
 * FP8 recipe 9.11).
 *
 * forward:   h = x W1_g^T (+ b1_g)                  FC1      h [T, 2F]  =
 *            z = p * glu(h)                         GLU      z [T, F]   = (args->z or workspace)
 *            (FC1 and the GLU in one launch where the backend fuses them: fc1_glu, fc1_glu_fp8)
 *            y = z W2_g^T (+ b2_g | + p b2_g)       FC2      y [T, H]   =
 * backward:  z  = p * glu(h)           only when dw2 is asked and the forward did not save z
 *            dW2 = dy^T z
 *            dz = dy W2_g, db2 = sum dy (or sum p dy), dprobs += sum_j dy_ij b2_gj (SCALED)
 *            dh = glu'(h) dz, dprobs += sum_j dz_ij act(a_ij) g(b_ij)
 *            (FC2's dz and the GLU in one launch where the backend fuses them: fc2_glu_grad;
 *            dz then never leaves the chip, and a recomputed z comes from the same launch,
 *            before dW2)
 *            dx = dh W1_g, db1 = sum dh
 *            dW1 = dh^T x
 * Only what the present outputs need is computed. dprobs receives the scaled-bias term first,
 * then the GLU term. The intermediates z, dz and dh live in the workspace in the activation
 * dtype, as the saved h and z do (dz rounded to it also where it is not stored).
 *
 * The precision (grouped_linear.c, op.h): plain (MOEX_FP8_OFF), each GEMM is a linear
 * primitive on those tensors; FP8, each GEMM reads FP8 copies in the workspace, quantized by
 * the plan's copy steps: x, W1, W2 rowwise in the forward, z's rowwise copy written by the
 * scaled GLU op (or, after the fused FP8 FC1 + GLU, quantized from z); in the backward dy
 * rowwise and columnwise (one pass), z columnwise (quantized from the saved z, or recomputed
 * from h by the scaled GLU op straight into its copy), W2 and W1 columnwise, dh rowwise and
 * columnwise (one pass), x columnwise. The bias terms of a backward data (db2 and the
 * scaled-b2 dprobs term, db1) then run apart, by the plain linear_dgrad on dy and dh, before
 * the copies of their GEMM; the FP8 GEMMs and the scaled GLU op prepare their own groups.
 *
 * Plain precision places some intermediates in caller memory that is free at the time: a
 * recomputed z in dx's memory when F <= H (dx is written after dW2; z's rows past the groups'
 * end, like dx's, are not written), dh in h's with MOEX_H_OVERWRITE (z is recomputed before
 * dh is written; the GLU backward reads each pair of h before writing its dh); with dw_mode
 * WRITE, the other z, dz and the earlier steps' scratch in dW1's memory when they fit (dW1 is
 * written last). The groups are prepared once (split values checked before anything is
 * written on the CPU) and every primitive runs on them.
 *
 * Workspace: the prepared handle, the FP8 copies (FP8), the intermediates the call needs,
 * and one region shared by the steps (they run one after the other). Its size depends on
 * shapes, dtypes, the recipe and which optional tensors are present, never on split values.
 *
 * The MoE layer (moe_layer.c) runs this composition on its permuted rows.
 */
#include "op.h"

#include <string.h>

/* The tensors forward and backward share: x [T,H], w1 [G,2F,H], w2 [G,H,F], probs, glu,
 * splits, b2 per b2_mode. Sets the dims. */
static moex_status validate_mlp_common(moex_context *ctx, const char *op, const moex_tensor *x,
                                       const moex_weight *w1, const moex_weight *w2, const moex_tensor *probs,
                                       const moex_glu_params *glu, const moex_tensor *splits, moex_mlp_dims *d) {
    MOEX_TRY(moex_check_grouped_rows(ctx, op, splits, "x", x, &d->G, &d->T, &d->H, &d->dt));
    int64_t twoF = w1->t.ndim == 3 ? w1->t.shape[1] : -1;
    MOEX_TRY(moex_check_weight(ctx, op, "w1", w1, d->G, twoF, d->H, MOEX_DT(d->dt)));
    if (twoF % 2 != 0)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: w1 must be [G, 2F, H] with an even 2F, got %lld", op,
                         (long long)twoF);
    d->F = twoF / 2;
    MOEX_TRY(moex_check_features(ctx, op, d->H, d->F));
    MOEX_TRY(moex_check_weight(ctx, op, "w2", w2, d->G, d->H, d->F, MOEX_DT(d->dt)));
    const int64_t pshape[1] = {d->T};
    MOEX_TRY(moex_check_optional(ctx, op, "probs", probs, 1, pshape, MOEX_DT_F32));
    return moex_check_glu(ctx, op, glu, d->F);
}

moex_status moex_fp8_check_mlp_weight_copies(moex_context *ctx, const char *op, const moex_fp8_recipe *r, int64_t G,
                                             int64_t H, int64_t F) {
    MOEX_TRY(moex_fp8_check_weight_copies(ctx, op, r, 0, "w1", G, 2 * F, H));
    return moex_fp8_check_weight_copies(ctx, op, r, 1, "w2", G, H, F);
}

moex_status moex_op_grouped_mlp_forward_validate(moex_context *ctx, const char *op, const moex_grouped_mlp_args *a,
                                                 moex_purpose p, moex_mlp_dims *d) {
    MOEX_TRY(validate_mlp_common(ctx, op, &a->x, &a->w1, &a->w2, &a->probs, &a->glu, &a->splits, d));
    const int64_t b1shape[2] = {d->G, 2 * d->F}, hshape[2] = {d->T, 2 * d->F}, zshape[2] = {d->T, d->F},
                  yshape[2] = {d->T, d->H};
    MOEX_TRY(moex_check_optional(ctx, op, "b1", &a->b1, 2, b1shape, MOEX_DT_BIAS(d->dt)));
    MOEX_TRY(moex_check_bias(ctx, op, a->b2_mode, &a->b2, "b2", &a->probs, d->G, d->T, d->H, d->dt, true));
    MOEX_TRY(moex_check_output(ctx, op, "h", &a->h, 2, hshape, MOEX_DT(d->dt)));
    MOEX_TRY(moex_check_optional_output(ctx, op, "z", &a->z, 2, zshape, MOEX_DT(d->dt)));
    MOEX_TRY(moex_check_output(ctx, op, "y", &a->y, 2, yshape, MOEX_DT(d->dt)));
    MOEX_TRY(moex_check_fp8_recipe(ctx, op, "fp8", &a->fp8));
    MOEX_TRY(moex_fp8_check_mlp_weight_copies(ctx, op, &a->fp8, d->G, d->H, d->F));
    MOEX_TRY(moex_fp8_check_out(ctx, op, &a->fp8, p, "h", a->h.data));
    MOEX_TRY(moex_fp8_check_out(ctx, op, &a->fp8, p, "z", a->z.data));
    return moex_fp8_check_out(ctx, op, &a->fp8, p, "y", a->y.data);
}

moex_status moex_op_grouped_mlp_backward_validate(moex_context *ctx, const char *op,
                                                  const moex_grouped_mlp_grad_args *a, moex_purpose p,
                                                  moex_mlp_dims *d) {
    MOEX_TRY(validate_mlp_common(ctx, op, &a->x, &a->w1, &a->w2, &a->probs, &a->glu, &a->splits, d));
    const int64_t hshape[2] = {d->T, 2 * d->F}, zshape[2] = {d->T, d->F}, yshape[2] = {d->T, d->H},
                  db1shape[2] = {d->G, 2 * d->F}, db2shape[2] = {d->G, d->H}, dpshape[1] = {d->T};
    if (a->h_mode != MOEX_H_KEEP && a->h_mode != MOEX_H_OVERWRITE)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: unknown h_mode %d", op, (int)a->h_mode);
    /* an h the call overwrites may overlap nothing, as an output */
    if (a->h_mode == MOEX_H_OVERWRITE) MOEX_TRY(moex_check_output(ctx, op, "h", &a->h, 2, hshape, MOEX_DT(d->dt)));
    else MOEX_TRY(moex_check_tensor(ctx, op, "h", &a->h, 2, hshape, MOEX_DT(d->dt)));
    MOEX_TRY(moex_check_optional(ctx, op, "z", &a->z, 2, zshape, MOEX_DT(d->dt)));
    MOEX_TRY(moex_check_tensor(ctx, op, "dy", &a->dy, 2, yshape, MOEX_DT(d->dt)));
    MOEX_TRY(moex_check_optional_output(ctx, op, "dx", &a->dx, 2, yshape, MOEX_DT(d->dt)));
    if (moex_weight_present(&a->dw1))
        MOEX_TRY(moex_check_dw(ctx, op, "dw1", a->dw_mode, &a->dw1, d->G, 2 * d->F, d->H, d->dt));
    if (moex_weight_present(&a->dw2))
        MOEX_TRY(moex_check_dw(ctx, op, "dw2", a->dw_mode, &a->dw2, d->G, d->H, d->F, d->dt));
    MOEX_TRY(moex_check_optional_output(ctx, op, "db1", &a->db1, 2, db1shape, MOEX_DT_BIAS(d->dt)));
    MOEX_TRY(moex_check_optional_output(ctx, op, "db2", &a->db2, 2, db2shape, MOEX_DT_BIAS(d->dt)));
    MOEX_TRY(moex_check_optional_output(ctx, op, "dprobs", &a->dprobs, 1, dpshape, MOEX_DT_F32));
    if (a->b2_mode == MOEX_BIAS_NONE && moex_present(&a->db2))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: db2 is requested but b2_mode is MOEX_BIAS_NONE", op);
    if (moex_present(&a->dprobs) && !moex_present(&a->probs))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: dprobs is requested but probs is absent", op);
    bool b2_needed = a->b2_mode == MOEX_BIAS_SCALED && moex_present(&a->dprobs);
    MOEX_TRY(moex_check_bias(ctx, op, a->b2_mode, &a->b2, "b2", &a->probs, d->G, d->T, d->H, d->dt, b2_needed));
    MOEX_TRY(moex_check_fp8_recipe(ctx, op, "fp8", &a->fp8));
    MOEX_TRY(moex_fp8_check_mlp_weight_copies(ctx, op, &a->fp8, d->G, d->H, d->F));
    MOEX_TRY(moex_fp8_check_out(ctx, op, &a->fp8, p, "dx", a->dx.data));
    MOEX_TRY(moex_fp8_check_out(ctx, op, &a->fp8, p, "dw1", a->dw1.t.data));
    return moex_fp8_check_out(ctx, op, &a->fp8, p, "dw2", a->dw2.t.data);
}

/* ---- the composition's pieces -------------------------------------------------------- */

/* A [T, cols] tensor of the activation dtype (data NULL when only its shape matters). */
static moex_tensor act_2d(void *data, const moex_mlp_dims *d, int64_t cols) {
    return moex_tensor_2d(data, d->dt, d->T, cols);
}

static size_t act_bytes(const moex_mlp_dims *d, int64_t cols) {
    return moex_sz_bytes(d->T, cols, moex_dtype_size(d->dt));
}

static moex_gl_dims fc1_dims(const moex_mlp_dims *d) {
    moex_gl_dims g = {d->G, d->T, d->H, 2 * d->F, d->dt};
    return g;
}

static moex_gl_dims fc2_dims(const moex_mlp_dims *d) {
    moex_gl_dims g = {d->G, d->T, d->F, d->H, d->dt};
    return g;
}

static moex_glu_dims glu_dims(const moex_mlp_dims *d) {
    moex_glu_dims g;
    memset(&g, 0, sizeof g);   /* no quantized z */
    g.T = d->T, g.F = d->F, g.G = d->G, g.dt = d->dt;
    return g;
}

static const moex_tensor absent_tensor;

/* z = p glu(h) over the groups (the args a, dims dg): plain, glu_fwd into a's z; FP8, the
 * scaled GLU op (its own handle) into a's zq copies, and into a's z where given. glu_of sets
 * a and dg (zq: z's FP8 copies; NULL: plain). */
static void glu_of(const moex_glu_params *glu, const moex_tensor *h, const moex_tensor *probs,
                   const moex_tensor *splits, const moex_tensor *z, const moex_fp8_operand *zq, const moex_mlp_dims *d,
                   moex_scaled_glu_args *a, moex_glu_dims *dg) {
    *a = (moex_scaled_glu_args){.glu = *glu, .h = *h, .probs = *probs, .splits = *splits, .z = *z};
    *dg = glu_dims(d);
    if (!zq) return;
    a->zq_params = zq->p, a->zq_rowwise = zq->row, a->zq_columnwise = zq->col;
    dg->zq = true;
    dg->q = zq->d;
}

static size_t glu_fwd_ws(moex_context *ctx, const moex_scaled_glu_args *a, const moex_glu_dims *dg) {
    if (dg->zq) return moex_op_scaled_glu_forward_ws(ctx, a, dg);
    return moex_ops(ctx)->glu_fwd_ws(ctx, a, dg);
}

static moex_status glu_fwd_run(moex_context *ctx, const moex_call *c, const moex_groups *g,
                               const moex_scaled_glu_args *a, const moex_glu_dims *dg, void *sub) {
    if (dg->zq) return moex_op_scaled_glu_forward_run(ctx, c, a, dg, sub);
    return moex_ops(ctx)->glu_fwd(ctx, c, g, a, dg, sub);
}

/* ---- forward ------------------------------------------------------------------------- */

/* The forward's plan: its workspace (the handle, the FP8 rowwise copies of x, W1, z and W2,
 * z [T, F] where a step writes a z the caller does not keep: plain, the GLU, for FC2; FP8, the
 * fused FC1 + GLU, for z's quantize; then the steps' shared region) and its steps. */
typedef struct fwd_plan {
    void *groups, *sub;
    moex_fp8_operand x, w1, zq, w2;
    bool fp8;
    bool x_given;                      /* FP8: x's rowwise copy is the caller's (not quantized here) */
    bool fused_fp8;                    /* FP8: fc1_glu_fp8 runs FC1 and the GLU (its ws query says) */
    moex_gl_fwd fc1, fc2;
    moex_scaled_glu_args glu;
    moex_glu_dims glu_dims;
    moex_fc1_glu_args fc1_glu;         /* plain: FC1 and the GLU fused, where the backend runs it */
    moex_fc1_glu_fp8_args fc1_glu_fp8;
    size_t total;
} fwd_plan;

static fwd_plan fwd_plan_of(moex_context *ctx, const moex_grouped_mlp_args *a, const moex_quant_tensor *xq,
                            const moex_mlp_dims *d, void *ws) {
    const moex_backend_ops *ops = moex_ops(ctx);
    const moex_fp8_recipe *r = &a->fp8;
    const moex_gl_dims d1 = fc1_dims(d), d2 = fc2_dims(d);
    moex_carver c = {(char *)ws, 0};
    fwd_plan l;
    memset(&l, 0, sizeof l);
    l.fp8 = r->mode != MOEX_FP8_OFF;
    l.groups = moex_take(&c, ops->groups_ws(ctx, d->G, d->T, NULL));
    l.x_given = l.fp8 && xq != NULL;
    /* FC1's copies (x, W1) are dead before FC2's (z, W2) are written (z's copy comes from z,
     * after FC1): one region holds either set */
    moex_carver c1 = c, c2 = c;
    moex_fp8_take_rows(&c1, r, false, d->G, d->T, d->H, d->dt, !l.x_given, false, &l.x);
    if (l.x_given) l.x.row = *xq;
    moex_fp8_take_weight(&c1, r, 0, d->G, 2 * d->F, d->H, d->dt, true, false, &l.w1);
    moex_fp8_take_rows(&c2, r, false, d->G, d->T, d->F, d->dt, true, false, &l.zq);
    moex_fp8_take_weight(&c2, r, 1, d->G, d->H, d->F, d->dt, true, false, &l.w2);
    c.used = moex_sz_max(c1.used, c2.used);

    const moex_grouped_linear_args fc1 = {
        .x = a->x, .w = a->w1, .bias_mode = moex_present(&a->b1) ? MOEX_BIAS_ADD : MOEX_BIAS_NONE, .bias = a->b1,
        .splits = a->splits, .y = a->h};
    l.fc1 = moex_gl_fwd_of(&fc1, &d1, l.fp8 ? &l.x : NULL, l.fp8 ? &l.w1 : NULL);
    moex_tensor z = moex_present(&a->z) ? a->z : act_2d(NULL, d, d->F);
    l.fc1_glu_fp8 = (moex_fc1_glu_fp8_args){.fc1 = l.fc1.f, .glu = a->glu, .probs = a->probs, .z = z};
    const size_t fused = l.fp8 && ops->fc1_glu_fp8_ws ? ops->fc1_glu_fp8_ws(ctx, &l.fc1_glu_fp8, &l.fc1.fd)
                                                      : SIZE_MAX;
    l.fused_fp8 = fused != SIZE_MAX;
    if (!moex_present(&a->z) && (!l.fp8 || l.fused_fp8)) z.data = moex_take(&c, act_bytes(d, d->F));
    l.fc1_glu_fp8.z = z;
    l.fc1_glu = (moex_fc1_glu_args){.fc1 = fc1, .glu = a->glu, .probs = a->probs, .z = z};
    glu_of(&a->glu, &a->h, &a->probs, &a->splits, l.fp8 ? &a->z : &z, l.fp8 ? &l.zq : NULL, d, &l.glu, &l.glu_dims);
    const moex_grouped_linear_args fc2 = {
        .x = z, .w = a->w2, .bias_mode = a->b2_mode, .bias = a->b2,
        .probs = a->b2_mode == MOEX_BIAS_SCALED ? a->probs : absent_tensor, .splits = a->splits, .y = a->y};
    l.fc2 = moex_gl_fwd_of(&fc2, &d2, l.fp8 ? &l.zq : NULL, l.fp8 ? &l.w2 : NULL);

    size_t sub = l.x_given ? 0 : moex_fp8_rows_ws(ctx, &a->x, &a->splits, &l.x);
    sub = moex_sz_max(sub, moex_fp8_weight_ws(ctx, &a->w1, &l.w1));
    if (l.fused_fp8) {
        sub = moex_sz_max(sub, fused);
        sub = moex_sz_max(sub, moex_fp8_rows_ws(ctx, &z, &a->splits, &l.zq));
    } else {
        sub = moex_sz_max(sub, moex_gl_fwd_ws(ctx, &l.fc1));
        sub = moex_sz_max(sub, glu_fwd_ws(ctx, &l.glu, &l.glu_dims));
    }
    sub = moex_sz_max(sub, moex_fp8_weight_ws(ctx, &a->w2, &l.w2));
    sub = moex_sz_max(sub, moex_gl_fwd_ws(ctx, &l.fc2));
    l.sub = moex_take(&c, sub);
    l.total = c.used;
    return l;
}

/* ws and run: the plan without and with the workspace, as every op's (op.h): same shape by design. */
size_t moex_op_grouped_mlp_forward_ws(moex_context *ctx, const moex_grouped_mlp_args *a, const moex_mlp_dims *d) {
    return moex_mlp_fwd_ws(ctx, a, NULL, d);
}

moex_status moex_op_grouped_mlp_forward_run(moex_context *ctx, const moex_call *c, const moex_grouped_mlp_args *a,
                                            const moex_mlp_dims *d, void *ws) {
    return moex_mlp_fwd_run(ctx, c, a, NULL, d, ws);
}

size_t moex_mlp_fwd_ws(moex_context *ctx, const moex_grouped_mlp_args *a, const moex_quant_tensor *xq,
                       const moex_mlp_dims *d) {
    return fwd_plan_of(ctx, a, xq, d, NULL).total;
}

moex_status moex_mlp_fwd_run(moex_context *ctx, const moex_call *c, const moex_grouped_mlp_args *a,
                             const moex_quant_tensor *xq, const moex_mlp_dims *d, void *ws) {
    const moex_backend_ops *ops = moex_ops(ctx);
    const fwd_plan l = fwd_plan_of(ctx, a, xq, d, ws);
    moex_groups g;
    MOEX_TRY(moex_begin_groups(ctx, c, &a->splits, d->T, NULL, l.groups, &g));
    const moex_gl_dims d1 = fc1_dims(d);
    /* FC1 and the GLU: x's and W1's copies; h and z (FP8: z's copy) by one fused launch where
     * the backend has one, else FC1, then the GLU */
    if (!l.x_given) MOEX_TRY(moex_fp8_rows_quantize(ctx, c, &g, &a->x, &a->splits, &l.x, l.sub));
    MOEX_TRY(moex_fp8_weight_quantize(ctx, c, &a->w1, &l.w1, l.sub));
    bool fused = false;
    if (l.fused_fp8) {
        MOEX_TRY(ops->fc1_glu_fp8(ctx, c, &g, &l.fc1_glu_fp8, &l.fc1.fd, l.sub));
        MOEX_TRY(moex_fp8_rows_quantize(ctx, c, &g, &l.fc1_glu_fp8.z, &a->splits, &l.zq, l.sub));
        fused = true;
    } else if (!l.fp8 && ops->fc1_glu) {
        MOEX_TRY(ops->fc1_glu(ctx, c, &g, &l.fc1_glu, &d1, &fused));
    }
    if (!fused) {
        MOEX_TRY(moex_gl_fwd_run(ctx, c, &g, &l.fc1, l.sub));
        MOEX_TRY(glu_fwd_run(ctx, c, &g, &l.glu, &l.glu_dims, l.sub));
    }
    /* FC2: W2's copy, y */
    MOEX_TRY(moex_fp8_weight_quantize(ctx, c, &a->w2, &l.w2, l.sub));
    return moex_gl_fwd_run(ctx, c, &g, &l.fc2, l.sub);
}

/* ---- backward ------------------------------------------------------------------------ */

/* Which steps the present outputs need. */
typedef struct bwd_plan {
    bool fp8;                   /* the precision (args->fp8.mode not OFF) */
    bool dprobs_bias;           /* dprobs gets the scaled-b2 term (FC2 dgrad) */
    bool need_dh;               /* dx, dw1 or db1 asked */
    bool need_dz;               /* dh or the GLU's dprobs term asked */
    bool fc2_dgrad;             /* dz, db2 or the scaled-b2 dprobs term */
    bool fc1_dgrad;             /* dx or db1 asked */
    bool recompute_z;           /* dw2 asked and z not saved (FP8: straight into z's copy) */
    bool z_in_dx;               /* plain: the recomputed z lives in dx's memory (dx asked, F <= H:
                                   z's rows < S fill bytes of dx's rows < S only) */
    bool dh_in_h;               /* plain: dh is written over h (MOEX_H_OVERWRITE) */
    bool fused;                 /* plain: fc2_glu_grad runs FC2's dgrad and the GLU (dh needed;
                                   dz not in memory) */
} bwd_plan;

/* The FP8 copies the backward's GEMMs read (FP8 precision; else all zero): dy rowwise (dz) and
 * columnwise (dW2), z columnwise (dW2), W2 columnwise (dz), dh rowwise (dx) and columnwise
 * (dW1), W1 columnwise (dx), x columnwise (dW1). */
typedef struct bwd_copies {
    moex_fp8_operand dy, z, w2, dh, w1, x;
} bwd_copies;

/* The steps' arguments, given where z, dz and dh are. */
typedef struct bwd_calls {
    moex_scaled_glu_args glu_fwd;            /* recomputes z (FP8: into z's copy) */
    moex_glu_dims glu_fwd_dims;
    moex_fc2_glu_grad_args fc2_glu;          /* FC2's dgrad and the GLU, fused */
    moex_gl_dgrad fc2_dgrad;
    moex_gl_wgrad fc2_wgrad;
    moex_scaled_glu_grad_args glu_bwd;
    moex_tensor dh;
    moex_gl_dgrad fc1_dgrad;
    moex_gl_wgrad fc1_wgrad;
} bwd_calls;

static void bwd_calls_of(const moex_grouped_mlp_grad_args *a, const moex_mlp_dims *d, const bwd_plan *p,
                         const bwd_copies *q, void *z, void *dz, void *dh, bwd_calls *c) {
    const moex_tensor zt = moex_present(&a->z) ? a->z : act_2d(z, d, d->F);
    const moex_tensor dzt = p->need_dz ? act_2d(dz, d, d->F) : absent_tensor;
    const moex_tensor dht = p->need_dh ? act_2d(dh, d, 2 * d->F) : absent_tensor;
    const bool scaled = a->b2_mode == MOEX_BIAS_SCALED;
    const moex_gl_dims d1 = fc1_dims(d), d2 = fc2_dims(d);
    const bwd_copies *fp8 = p->fp8 ? q : NULL;

    glu_of(&a->glu, &a->h, &a->probs, &a->splits, fp8 ? &absent_tensor : &zt, fp8 ? &q->z : NULL, d, &c->glu_fwd,
           &c->glu_fwd_dims);
    const moex_grouped_linear_dgrad_args fc2_dgrad = {
        .dy = a->dy, .w = a->w2, .bias_mode = a->b2_mode, .bias = p->dprobs_bias ? a->b2 : absent_tensor,
        .probs = scaled ? a->probs : absent_tensor, .splits = a->splits, .dx = dzt,
        .dbias = a->b2_mode != MOEX_BIAS_NONE ? a->db2 : absent_tensor,
        .dprobs = p->dprobs_bias ? a->dprobs : absent_tensor};
    c->fc2_dgrad = moex_gl_dgrad_of(&fc2_dgrad, &d2, fp8 ? &q->dy : NULL, fp8 ? &q->w2 : NULL);
    const moex_grouped_linear_wgrad_args fc2_wgrad = {
        .x = zt, .dy = a->dy, .splits = a->splits, .dw_mode = a->dw_mode, .dw = a->dw2};
    c->fc2_wgrad = moex_gl_wgrad_of(&fc2_wgrad, &d2, fp8 ? &q->dy : NULL, fp8 ? &q->z : NULL);
    c->glu_bwd = (moex_scaled_glu_grad_args){.glu = a->glu, .h = a->h, .probs = a->probs, .splits = a->splits,
                                             .dz = dzt, .dh = dht, .dprobs = a->dprobs};
    c->fc2_glu = (moex_fc2_glu_grad_args){.fc2 = fc2_dgrad, .glu = a->glu, .h = a->h, .probs = a->probs,
                                          .dh = act_2d(dh, d, 2 * d->F), .dprobs = a->dprobs,
                                          .z = p->recompute_z ? zt : absent_tensor};
    c->fc2_glu.fc2.dx = c->fc2_glu.fc2.dprobs = absent_tensor;
    c->dh = dht;
    const moex_grouped_linear_dgrad_args fc1_dgrad = {
        .dy = dht, .w = a->w1, .bias_mode = moex_present(&a->db1) ? MOEX_BIAS_ADD : MOEX_BIAS_NONE,
        .splits = a->splits, .dx = a->dx, .dbias = a->db1};
    c->fc1_dgrad = moex_gl_dgrad_of(&fc1_dgrad, &d1, fp8 ? &q->dh : NULL, fp8 ? &q->w1 : NULL);
    const moex_grouped_linear_wgrad_args fc1_wgrad = {
        .x = a->x, .dy = dht, .splits = a->splits, .dw_mode = a->dw_mode, .dw = a->dw1};
    c->fc1_wgrad = moex_gl_wgrad_of(&fc1_wgrad, &d1, fp8 ? &q->dh : NULL, fp8 ? &q->x : NULL);
}

static bwd_plan bwd_plan_of(moex_context *ctx, const moex_grouped_mlp_grad_args *a, const moex_mlp_dims *d) {
    bwd_plan p;
    const bool dprobs = moex_present(&a->dprobs);
    const bool db2 = moex_present(&a->db2) && a->b2_mode != MOEX_BIAS_NONE;
    p.fp8 = a->fp8.mode != MOEX_FP8_OFF;
    p.dprobs_bias = dprobs && a->b2_mode == MOEX_BIAS_SCALED;
    p.fc1_dgrad = moex_present(&a->dx) || moex_present(&a->db1);
    p.need_dh = p.fc1_dgrad || moex_weight_present(&a->dw1);
    p.need_dz = p.need_dh || dprobs;
    p.fc2_dgrad = p.need_dz || db2 || p.dprobs_bias;
    p.recompute_z = moex_weight_present(&a->dw2) && !moex_present(&a->z);
    p.z_in_dx = !p.fp8 && p.recompute_z && moex_present(&a->dx) && d->F <= d->H;
    p.dh_in_h = !p.fp8 && p.need_dh && a->h_mode == MOEX_H_OVERWRITE;
    p.fused = false;
    const moex_backend_ops *ops = moex_ops(ctx);
    if (!p.fp8 && p.need_dh && ops->fc2_glu_grad) {
        bwd_calls c;
        bwd_calls_of(a, d, &p, NULL, NULL, NULL, NULL, &c);
        const moex_gl_dims d2 = fc2_dims(d);
        p.fused = ops->fc2_glu_grad_ws(ctx, &c.fc2_glu, &d2) != SIZE_MAX;
    }
    return p;
}

/* The backward's workspace: the handle, the FP8 copies (FP8), z, dz and dh where they are
 * needed and not elsewhere (bytes 0: not taken, NULL), the steps' shared region (sub; the dW1
 * step has its own, sub_dw1, which is sub unless the others live in dW1's memory:
 * bwd_layout_of). */
typedef struct bwd_layout {
    void *groups;
    bwd_copies q;
    void *buf[3];               /* z, dz, dh */
    void *sub, *sub_dw1;
    size_t total;
} bwd_layout;

/* Plain precision: z and dz, and every step's region but dW1's, are dead before dW1 is written
 * (its step runs last). With dw_mode WRITE and a packed dW1 of enough bytes, they live in dW1's
 * memory (from its first MOEX_WS_ALIGN-aligned byte): the workspace keeps the handle, dh and
 * dW1's region. Decided from sizes, modes and presence only, as the workspace size must be.
 * It opens as fwd_plan_of does (the handle, then two sets of copies in one region): alike in
 * shape only, each carving its own pass's operands. */
static bwd_layout bwd_layout_of(moex_context *ctx, const moex_grouped_mlp_grad_args *a, const moex_mlp_dims *d,
                                const bwd_plan *plan, void *ws) {
    const moex_backend_ops *ops = moex_ops(ctx);
    const moex_fp8_recipe *r = &a->fp8;
    const bwd_plan p = *plan;
    const int64_t G = d->G, T = d->T, H = d->H, F = d->F;
    const bool dx = moex_present(&a->dx), dw1 = moex_weight_present(&a->dw1), dw2 = moex_weight_present(&a->dw2);
    const moex_gl_dims d2 = fc2_dims(d);
    moex_carver c = {(char *)ws, 0};
    bwd_layout l;
    memset(&l, 0, sizeof l);
    l.groups = moex_take(&c, ops->groups_ws(ctx, G, T, NULL));
    /* the copies FC2's steps read (dy, z, W2) are dead before FC1's (dh, W1, x) are written
     * (the GLU's backward runs between them): one region holds either set */
    moex_carver c2 = c, c1 = c;
    moex_fp8_take_rows(&c2, r, true, G, T, H, d->dt, p.need_dz, dw2, &l.q.dy);
    moex_fp8_take_rows(&c2, r, false, G, T, F, d->dt, false, dw2, &l.q.z);
    moex_fp8_take_weight(&c2, r, 1, G, H, F, d->dt, false, p.need_dz, &l.q.w2);
    moex_fp8_take_rows(&c1, r, true, G, T, 2 * F, d->dt, dx, dw1, &l.q.dh);
    moex_fp8_take_weight(&c1, r, 0, G, 2 * F, H, d->dt, false, dx, &l.q.w1);
    moex_fp8_take_rows(&c1, r, false, G, T, H, d->dt, false, dw1, &l.q.x);
    c.used = moex_sz_max(c2.used, c1.used);

    bwd_calls k;
    bwd_calls_of(a, d, &p, &l.q, NULL, NULL, NULL, &k);
    const moex_glu_dims dg = glu_dims(d);
    size_t sub = moex_fp8_rows_ws(ctx, &a->dy, &a->splits, &l.q.dy), sub_dw1 = 0;
    if (p.recompute_z) sub = moex_sz_max(sub, glu_fwd_ws(ctx, &k.glu_fwd, &k.glu_fwd_dims));
    else sub = moex_sz_max(sub, moex_fp8_rows_ws(ctx, &a->z, &a->splits, &l.q.z));
    if (dw2) sub = moex_sz_max(sub, moex_gl_wgrad_ws(ctx, &k.fc2_wgrad));
    if (p.fused) sub = moex_sz_max(sub, ops->fc2_glu_grad_ws(ctx, &k.fc2_glu, &d2));
    if (p.fc2_dgrad && !p.fused) {
        sub = moex_sz_max(sub, moex_fp8_weight_ws(ctx, &a->w2, &l.q.w2));
        sub = moex_sz_max(sub, moex_gl_dgrad_ws(ctx, &k.fc2_dgrad));
    }
    if (p.need_dz && !p.fused) sub = moex_sz_max(sub, ops->glu_bwd_ws(ctx, &k.glu_bwd, &dg));
    sub = moex_sz_max(sub, moex_fp8_rows_ws(ctx, &k.dh, &a->splits, &l.q.dh));
    if (p.fc1_dgrad) {
        sub = moex_sz_max(sub, moex_fp8_weight_ws(ctx, &a->w1, &l.q.w1));
        sub = moex_sz_max(sub, moex_gl_dgrad_ws(ctx, &k.fc1_dgrad));
    }
    if (dw1) {
        sub_dw1 = moex_fp8_rows_ws(ctx, &a->x, &a->splits, &l.q.x);
        sub_dw1 = moex_sz_max(sub_dw1, moex_gl_wgrad_ws(ctx, &k.fc1_wgrad));
    }
    const size_t bytes[3] = {p.recompute_z && !p.z_in_dx && !p.fp8 ? act_bytes(d, F) : 0,
                             p.need_dz && !p.fused ? act_bytes(d, F) : 0,
                             p.need_dh && !p.dh_in_h ? act_bytes(d, 2 * F) : 0};
    size_t early = 0;
    moex_sz_take(&early, bytes[0]);
    moex_sz_take(&early, bytes[1]);
    moex_sz_take(&early, sub);
    const moex_weight *w = &a->dw1;
    const bool in_dw1 = !p.fp8 && early > 0 && dw1 && w->ptrs == NULL && a->dw_mode == MOEX_GRAD_WRITE &&
                        moex_sz_add(early, MOEX_WS_ALIGN) <=
                            moex_sz_mul(moex_sz_bytes(G, 2 * F, moex_dtype_size(w->t.dtype)), (size_t)H);
    if (!in_dw1) {
        for (int i = 0; i < 3; i++) l.buf[i] = bytes[i] ? moex_take(&c, bytes[i]) : NULL;
        l.sub = l.sub_dw1 = moex_take(&c, moex_sz_max(sub, sub_dw1));
        l.total = c.used;
        return l;
    }
    l.buf[2] = bytes[2] ? moex_take(&c, bytes[2]) : NULL;
    l.sub_dw1 = moex_take(&c, sub_dw1);
    l.total = c.used;
    const uintptr_t at = (uintptr_t)w->t.data;
    moex_carver e = {at ? (char *)(at + (MOEX_WS_ALIGN - at % MOEX_WS_ALIGN) % MOEX_WS_ALIGN) : NULL, 0};
    for (int i = 0; i < 2; i++) l.buf[i] = bytes[i] ? moex_take(&e, bytes[i]) : NULL;
    l.sub = moex_take(&e, sub);
    return l;
}

size_t moex_op_grouped_mlp_backward_ws(moex_context *ctx, const moex_grouped_mlp_grad_args *a,
                                       const moex_mlp_dims *d) {
    const bwd_plan p = bwd_plan_of(ctx, a, d);
    return bwd_layout_of(ctx, a, d, &p, NULL).total;
}

/* With z given (or dw2 absent), dx may be dy's own memory: every read of dy (FC2's steps, dy's
 * FP8 copies) precedes FC1's dgrad, the first write of dx. (Without z, the recomputed z may
 * live in dx's memory, z_in_dx.) The public call's overlap rule refuses it; the MoE layer's
 * backward relies on it. */
moex_status moex_op_grouped_mlp_backward_run(moex_context *ctx, const moex_call *c,
                                             const moex_grouped_mlp_grad_args *a, const moex_mlp_dims *d, void *ws) {
    const moex_backend_ops *ops = moex_ops(ctx);
    const bwd_plan p = bwd_plan_of(ctx, a, d);
    const bwd_layout l = bwd_layout_of(ctx, a, d, &p, ws);
    moex_groups g;
    MOEX_TRY(moex_begin_groups(ctx, c, &a->splits, d->T, NULL, l.groups, &g));
    bwd_calls k;
    bwd_calls_of(a, d, &p, &l.q, p.z_in_dx ? a->dx.data : l.buf[0], l.buf[1], p.dh_in_h ? a->h.data : l.buf[2],
                 &k);
    const moex_gl_dims d2 = fc2_dims(d);
    const moex_glu_dims dg = glu_dims(d);

    /* FC2: db2 and the scaled-b2 dprobs term where FP8 runs them apart (first, on dy), dy's
     * copies; fused (plain, where the backend has it): dz, dh, the GLU's dprobs term, db2, the
     * scaled-b2 term and the recomputed z (from h before dh overwrites it) in one launch, then
     * dW2; else dW2 first (z recomputed while h is intact, or z's copy), then W2's copy and dz
     * (plain: with db2 and the scaled-b2 term). */
    if (p.fc2_dgrad) MOEX_TRY(moex_gl_dgrad_bias_run(ctx, c, &g, &k.fc2_dgrad, l.sub));
    MOEX_TRY(moex_fp8_rows_quantize(ctx, c, &g, &a->dy, &a->splits, &l.q.dy, l.sub));
    if (p.fused) {
        MOEX_TRY(ops->fc2_glu_grad(ctx, c, &g, &k.fc2_glu, &d2, l.sub));
        if (moex_weight_present(&a->dw2)) MOEX_TRY(moex_gl_wgrad_run(ctx, c, &g, &k.fc2_wgrad, l.sub));
    } else {
        if (moex_weight_present(&a->dw2)) {
            if (p.recompute_z) MOEX_TRY(glu_fwd_run(ctx, c, &g, &k.glu_fwd, &k.glu_fwd_dims, l.sub));
            else MOEX_TRY(moex_fp8_rows_quantize(ctx, c, &g, &a->z, &a->splits, &l.q.z, l.sub));
            MOEX_TRY(moex_gl_wgrad_run(ctx, c, &g, &k.fc2_wgrad, l.sub));
        }
        if (p.fc2_dgrad) {
            MOEX_TRY(moex_fp8_weight_quantize(ctx, c, &a->w2, &l.q.w2, l.sub));
            MOEX_TRY(moex_gl_dgrad_run(ctx, c, &g, &k.fc2_dgrad, l.sub));
        }
    }
    /* GLU: dh (when needed; over h with dh_in_h) and the GLU dprobs term. */
    if (p.need_dz && !p.fused) MOEX_TRY(ops->glu_bwd(ctx, c, &g, &k.glu_bwd, &dg, l.sub));
    /* FC1: db1 where FP8 runs it apart (first, on dh), dh's copies, W1's copy and dx (plain:
     * with db1), then x's copy and dW1 (last: z, dz and l.sub may be in its memory). */
    if (p.fc1_dgrad) MOEX_TRY(moex_gl_dgrad_bias_run(ctx, c, &g, &k.fc1_dgrad, l.sub));
    MOEX_TRY(moex_fp8_rows_quantize(ctx, c, &g, &k.dh, &a->splits, &l.q.dh, l.sub));
    if (p.fc1_dgrad) {
        MOEX_TRY(moex_fp8_weight_quantize(ctx, c, &a->w1, &l.q.w1, l.sub));
        MOEX_TRY(moex_gl_dgrad_run(ctx, c, &g, &k.fc1_dgrad, l.sub));
    }
    if (moex_weight_present(&a->dw1)) {
        MOEX_TRY(moex_fp8_rows_quantize(ctx, c, &g, &a->x, &a->splits, &l.q.x, l.sub_dw1));
        MOEX_TRY(moex_gl_wgrad_run(ctx, c, &g, &k.fc1_wgrad, l.sub_dw1));
    }
    return MOEX_OK;
}
