/*
 * grouped_mlp.c - the grouped MLP, forward and backward: validation and its one composition
 * from the backend primitives (the math: docs/ops.md).
 *
 * forward:   h = x W1_g^T (+ b1_g)                  FC1      h [T, 2F]  =
 *            z = p * glu(h)                         GLU      z [T, F]   = (args->z or workspace)
 *            (FC1 and the GLU in one launch where the backend fuses them: fc1_glu)
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
 * dtype, as the saved h and z do (dz rounded to it also where it is not stored); a
 * recomputed z in dx's memory instead when F <= H (dx is written after dW2; z's rows past the
 * groups' end, like dx's, are not written), dh in h's with MOEX_H_OVERWRITE (z is recomputed
 * before dh is written; the GLU backward reads each pair of h before writing its dh); with
 * dw_mode WRITE, the other z, dz and the earlier steps' scratch in dW1's memory when they fit
 * (dW1 is written last). The groups are prepared once (split values checked before anything
 * is written on the CPU) and every primitive runs on them.
 *
 * Workspace: the prepared handle, the intermediates the call needs, and one region shared by
 * the primitives (they run one after the other). Its size depends on shapes, dtypes and
 * which optional tensors are present, never on split values.
 *
 * With an FP8 recipe (args->fp8.mode not OFF) forward and backward run fp8_layers.c's
 * composition instead (FC1 and FC2 on FP8 operands); this one is then not used.
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

/* The workspace: the handle, up to three intermediates (bytes 0: not taken, NULL), the
 * primitives' shared region (sub; the backward's dW1 step has its own, sub_dw1, which is sub
 * unless the others live in dW1's memory: bwd_layout). */
typedef struct mlp_layout {
    void *groups;
    void *buf[3];
    void *sub, *sub_dw1;
    size_t total;
} mlp_layout;

static mlp_layout layout_of(moex_context *ctx, const moex_mlp_dims *d, const size_t bytes[3], size_t sub, void *ws) {
    moex_carver c = {(char *)ws, 0};
    mlp_layout l;
    l.groups = moex_take(&c, moex_ops(ctx)->groups_ws(ctx, d->G, d->T, NULL));
    for (int k = 0; k < 3; k++) l.buf[k] = bytes[k] ? moex_take(&c, bytes[k]) : NULL;
    l.sub = l.sub_dw1 = moex_take(&c, sub);
    l.total = c.used;
    return l;
}

/* Checks the backend's limits and prepares the groups. */
static moex_status begin(moex_context *ctx, const moex_call *c, const moex_tensor *splits, const moex_mlp_dims *d,
                         const mlp_layout *l, moex_groups *g) {
    MOEX_TRY(moex_check_limits(ctx, c, d->T, d->G, 0));
    return moex_prepare_groups(ctx, c, splits, d->T, NULL, l->groups, g);
}

/* ---- forward ------------------------------------------------------------------------- */

/* The primitives' arguments; z is where the GLU output goes. */
typedef struct fwd_calls {
    moex_grouped_linear_args fc1;
    moex_scaled_glu_args glu;
    moex_fc1_glu_args fc1_glu;
    moex_grouped_linear_args fc2;
} fwd_calls;

static void fwd_calls_of(const moex_grouped_mlp_args *a, const moex_mlp_dims *d, void *z, fwd_calls *c) {
    const moex_tensor zt = act_2d(z, d, d->F);
    c->fc1 = (moex_grouped_linear_args){
        .x = a->x, .w = a->w1, .bias_mode = moex_present(&a->b1) ? MOEX_BIAS_ADD : MOEX_BIAS_NONE,
        .bias = a->b1, .splits = a->splits, .y = a->h};
    c->glu = (moex_scaled_glu_args){.glu = a->glu, .h = a->h, .probs = a->probs, .splits = a->splits, .z = zt};
    c->fc1_glu = (moex_fc1_glu_args){.fc1 = c->fc1, .glu = a->glu, .probs = a->probs, .z = zt};
    c->fc2 = (moex_grouped_linear_args){
        .x = zt, .w = a->w2, .bias_mode = a->b2_mode, .bias = a->b2,
        .probs = a->b2_mode == MOEX_BIAS_SCALED ? a->probs : absent_tensor, .splits = a->splits, .y = a->y};
}

static mlp_layout fwd_layout(moex_context *ctx, const moex_grouped_mlp_args *a, const moex_mlp_dims *d, void *ws) {
    const moex_backend_ops *ops = moex_ops(ctx);
    fwd_calls c;
    fwd_calls_of(a, d, NULL, &c);
    const moex_gl_dims d1 = fc1_dims(d), d2 = fc2_dims(d);
    const moex_glu_dims dg = glu_dims(d);
    size_t sub = ops->linear_fwd_ws(ctx, &c.fc1, &d1);
    sub = moex_sz_max(sub, ops->glu_fwd_ws(ctx, &c.glu, &dg));
    sub = moex_sz_max(sub, ops->linear_fwd_ws(ctx, &c.fc2, &d2));
    const size_t bytes[3] = {moex_present(&a->z) ? 0 : act_bytes(d, d->F), 0, 0};
    return layout_of(ctx, d, bytes, sub, ws);
}

size_t moex_op_grouped_mlp_forward_ws(moex_context *ctx, const moex_grouped_mlp_args *a, const moex_mlp_dims *d) {
    if (a->fp8.mode != MOEX_FP8_OFF) return moex_fp8_mlp_forward_ws(ctx, a, d);
    return fwd_layout(ctx, a, d, NULL).total;
}

moex_status moex_op_grouped_mlp_forward_run(moex_context *ctx, const moex_call *c, const moex_grouped_mlp_args *a,
                                            const moex_mlp_dims *d, void *ws) {
    if (a->fp8.mode != MOEX_FP8_OFF) return moex_fp8_mlp_forward_run(ctx, c, a, d, ws);
    const moex_backend_ops *ops = moex_ops(ctx);
    const mlp_layout l = fwd_layout(ctx, a, d, ws);
    moex_groups g;
    MOEX_TRY(begin(ctx, c, &a->splits, d, &l, &g));
    fwd_calls k;
    fwd_calls_of(a, d, moex_present(&a->z) ? a->z.data : l.buf[0], &k);
    const moex_gl_dims d1 = fc1_dims(d), d2 = fc2_dims(d);
    const moex_glu_dims dg = glu_dims(d);
    bool fused = false;
    if (ops->fc1_glu) MOEX_TRY(ops->fc1_glu(ctx, c, &g, &k.fc1_glu, &d1, &fused));
    if (!fused) {
        MOEX_TRY(ops->linear_fwd(ctx, c, &g, &k.fc1, &d1, l.sub));
        MOEX_TRY(ops->glu_fwd(ctx, c, &g, &k.glu, &dg, l.sub));
    }
    return ops->linear_fwd(ctx, c, &g, &k.fc2, &d2, l.sub);
}

/* ---- backward ------------------------------------------------------------------------ */

/* Which steps the present outputs need. */
typedef struct bwd_plan {
    bool dprobs_bias;           /* dprobs gets the scaled-b2 term (FC2 dgrad) */
    bool need_dh;               /* dx, dw1 or db1 asked */
    bool need_dz;               /* dh or the GLU's dprobs term asked */
    bool fc2_dgrad;             /* dz, db2 or the scaled-b2 dprobs term */
    bool fc1_dgrad;             /* dx or db1 asked */
    bool recompute_z;           /* dw2 asked and z not saved */
    bool z_in_dx;               /* the recomputed z lives in dx's memory (dx asked, F <= H: z's
                                   rows < S fill bytes of dx's rows < S only) */
    bool dh_in_h;               /* dh is written over h (MOEX_H_OVERWRITE) */
    bool fused;                 /* fc2_glu_grad runs FC2's dgrad and the GLU (dh needed; dz
                                   not in memory) */
} bwd_plan;

/* The primitives' arguments, given where z, dz and dh are. */
typedef struct bwd_calls {
    moex_scaled_glu_args glu_fwd;            /* recomputes z */
    moex_fc2_glu_grad_args fc2_glu;          /* FC2's dgrad and the GLU, fused */
    moex_grouped_linear_dgrad_args fc2_dgrad;
    moex_grouped_linear_wgrad_args fc2_wgrad;
    moex_scaled_glu_grad_args glu_bwd;
    moex_grouped_linear_dgrad_args fc1_dgrad;
    moex_grouped_linear_wgrad_args fc1_wgrad;
} bwd_calls;

static void bwd_calls_of(const moex_grouped_mlp_grad_args *a, const moex_mlp_dims *d, const bwd_plan *p, void *z,
                         void *dz, void *dh, bwd_calls *c) {
    const moex_tensor zt = moex_present(&a->z) ? a->z : act_2d(z, d, d->F);
    const moex_tensor dzt = p->need_dz ? act_2d(dz, d, d->F) : absent_tensor;
    const moex_tensor dht = p->need_dh ? act_2d(dh, d, 2 * d->F) : absent_tensor;
    const bool scaled = a->b2_mode == MOEX_BIAS_SCALED;

    c->glu_fwd = (moex_scaled_glu_args){.glu = a->glu, .h = a->h, .probs = a->probs, .splits = a->splits, .z = zt};
    c->fc2_dgrad = (moex_grouped_linear_dgrad_args){
        .dy = a->dy, .w = a->w2, .bias_mode = a->b2_mode, .bias = p->dprobs_bias ? a->b2 : absent_tensor,
        .probs = scaled ? a->probs : absent_tensor, .splits = a->splits, .dx = dzt,
        .dbias = a->b2_mode != MOEX_BIAS_NONE ? a->db2 : absent_tensor,
        .dprobs = p->dprobs_bias ? a->dprobs : absent_tensor};
    c->fc2_wgrad = (moex_grouped_linear_wgrad_args){
        .x = zt, .dy = a->dy, .splits = a->splits, .dw_mode = a->dw_mode, .dw = a->dw2};
    c->glu_bwd = (moex_scaled_glu_grad_args){.glu = a->glu, .h = a->h, .probs = a->probs, .splits = a->splits,
                                             .dz = dzt, .dh = dht, .dprobs = a->dprobs};
    c->fc2_glu = (moex_fc2_glu_grad_args){.fc2 = c->fc2_dgrad, .glu = a->glu, .h = a->h, .probs = a->probs,
                                          .dh = act_2d(dh, d, 2 * d->F), .dprobs = a->dprobs,
                                          .z = p->recompute_z ? zt : absent_tensor};
    c->fc2_glu.fc2.dx = c->fc2_glu.fc2.dprobs = absent_tensor;
    c->fc1_dgrad = (moex_grouped_linear_dgrad_args){
        .dy = dht, .w = a->w1, .bias_mode = moex_present(&a->db1) ? MOEX_BIAS_ADD : MOEX_BIAS_NONE,
        .splits = a->splits, .dx = a->dx, .dbias = a->db1};
    c->fc1_wgrad = (moex_grouped_linear_wgrad_args){
        .x = a->x, .dy = dht, .splits = a->splits, .dw_mode = a->dw_mode, .dw = a->dw1};
}

static bwd_plan bwd_plan_of(moex_context *ctx, const moex_grouped_mlp_grad_args *a, const moex_mlp_dims *d) {
    bwd_plan p;
    const bool dprobs = moex_present(&a->dprobs);
    const bool db2 = moex_present(&a->db2) && a->b2_mode != MOEX_BIAS_NONE;
    p.dprobs_bias = dprobs && a->b2_mode == MOEX_BIAS_SCALED;
    p.fc1_dgrad = moex_present(&a->dx) || moex_present(&a->db1);
    p.need_dh = p.fc1_dgrad || moex_weight_present(&a->dw1);
    p.need_dz = p.need_dh || dprobs;
    p.fc2_dgrad = p.need_dz || db2 || p.dprobs_bias;
    p.recompute_z = moex_weight_present(&a->dw2) && !moex_present(&a->z);
    p.z_in_dx = p.recompute_z && moex_present(&a->dx) && d->F <= d->H;
    p.dh_in_h = p.need_dh && a->h_mode == MOEX_H_OVERWRITE;
    p.fused = false;
    const moex_backend_ops *ops = moex_ops(ctx);
    if (p.need_dh && ops->fc2_glu_grad) {
        bwd_calls c;
        bwd_calls_of(a, d, &p, NULL, NULL, NULL, &c);
        const moex_gl_dims d2 = fc2_dims(d);
        p.fused = ops->fc2_glu_grad_ws(ctx, &c.fc2_glu, &d2) != SIZE_MAX;
    }
    return p;
}

/* z and dz, and every step's region but dW1's, are dead before dW1 is written (its step runs
 * last). With dw_mode WRITE and a packed dW1 of enough bytes, they live in dW1's memory (from
 * its first MOEX_WS_ALIGN-aligned byte): the workspace keeps the handle, dh and dW1's region.
 * Decided from sizes, modes and presence only, as the workspace size must be. */
static mlp_layout bwd_layout(moex_context *ctx, const moex_grouped_mlp_grad_args *a, const moex_mlp_dims *d,
                             const bwd_plan *plan, void *ws) {
    const moex_backend_ops *ops = moex_ops(ctx);
    const bwd_plan p = *plan;
    bwd_calls c;
    bwd_calls_of(a, d, &p, NULL, NULL, NULL, &c);
    const moex_gl_dims d1 = fc1_dims(d), d2 = fc2_dims(d);
    const moex_glu_dims dg = glu_dims(d);
    size_t sub = 0, sub_dw1 = 0;
    if (p.recompute_z) sub = moex_sz_max(sub, ops->glu_fwd_ws(ctx, &c.glu_fwd, &dg));
    if (moex_weight_present(&a->dw2)) sub = moex_sz_max(sub, ops->linear_wgrad_ws(ctx, &c.fc2_wgrad, &d2));
    if (p.fused) sub = moex_sz_max(sub, ops->fc2_glu_grad_ws(ctx, &c.fc2_glu, &d2));
    if (p.fc2_dgrad && !p.fused) sub = moex_sz_max(sub, ops->linear_dgrad_ws(ctx, &c.fc2_dgrad, &d2));
    if (p.need_dz && !p.fused) sub = moex_sz_max(sub, ops->glu_bwd_ws(ctx, &c.glu_bwd, &dg));
    if (p.fc1_dgrad) sub = moex_sz_max(sub, ops->linear_dgrad_ws(ctx, &c.fc1_dgrad, &d1));
    if (moex_weight_present(&a->dw1)) sub_dw1 = ops->linear_wgrad_ws(ctx, &c.fc1_wgrad, &d1);
    const size_t bytes[3] = {p.recompute_z && !p.z_in_dx ? act_bytes(d, d->F) : 0,
                             p.need_dz && !p.fused ? act_bytes(d, d->F) : 0,
                             p.need_dh && !p.dh_in_h ? act_bytes(d, 2 * d->F) : 0};
    size_t early = 0;
    moex_sz_take(&early, bytes[0]);
    moex_sz_take(&early, bytes[1]);
    moex_sz_take(&early, sub);
    const moex_weight *w = &a->dw1;
    const bool in_dw1 = early > 0 && moex_weight_present(w) && w->ptrs == NULL && a->dw_mode == MOEX_GRAD_WRITE &&
                        moex_sz_add(early, MOEX_WS_ALIGN) <=
                            moex_sz_mul(moex_sz_bytes(d->G, 2 * d->F, moex_dtype_size(w->t.dtype)), (size_t)d->H);
    if (!in_dw1) return layout_of(ctx, d, bytes, moex_sz_max(sub, sub_dw1), ws);

    const size_t ws_bytes[3] = {0, 0, bytes[2]};
    mlp_layout l = layout_of(ctx, d, ws_bytes, sub_dw1, ws);
    const uintptr_t at = (uintptr_t)w->t.data;
    moex_carver e = {at ? (char *)(at + (MOEX_WS_ALIGN - at % MOEX_WS_ALIGN) % MOEX_WS_ALIGN) : NULL, 0};
    for (int k = 0; k < 2; k++) l.buf[k] = bytes[k] ? moex_take(&e, bytes[k]) : NULL;
    l.sub = moex_take(&e, sub);
    return l;
}

size_t moex_op_grouped_mlp_backward_ws(moex_context *ctx, const moex_grouped_mlp_grad_args *a,
                                       const moex_mlp_dims *d) {
    if (a->fp8.mode != MOEX_FP8_OFF) return moex_fp8_mlp_backward_ws(ctx, a, d);
    const bwd_plan p = bwd_plan_of(ctx, a, d);
    return bwd_layout(ctx, a, d, &p, NULL).total;
}

moex_status moex_op_grouped_mlp_backward_run(moex_context *ctx, const moex_call *c,
                                             const moex_grouped_mlp_grad_args *a, const moex_mlp_dims *d, void *ws) {
    if (a->fp8.mode != MOEX_FP8_OFF) return moex_fp8_mlp_backward_run(ctx, c, a, d, ws);
    const moex_backend_ops *ops = moex_ops(ctx);
    const bwd_plan p = bwd_plan_of(ctx, a, d);
    const mlp_layout l = bwd_layout(ctx, a, d, &p, ws);
    moex_groups g;
    MOEX_TRY(begin(ctx, c, &a->splits, d, &l, &g));
    bwd_calls k;
    bwd_calls_of(a, d, &p, p.z_in_dx ? a->dx.data : l.buf[0], l.buf[1], p.dh_in_h ? a->h.data : l.buf[2], &k);
    const moex_gl_dims d1 = fc1_dims(d), d2 = fc2_dims(d);
    const moex_glu_dims dg = glu_dims(d);

    /* FC2: fused, dh and the GLU's dprobs term (and the recomputed z, from h before dh
     * overwrites it), db2 and the scaled-b2 dprobs term, then dW2; else dW2 first (z
     * recomputed while h is intact), then dz, db2 and the scaled-b2 dprobs term. */
    if (p.fused) {
        MOEX_TRY(ops->fc2_glu_grad(ctx, c, &g, &k.fc2_glu, &d2, l.sub));
        if (moex_weight_present(&a->dw2)) MOEX_TRY(ops->linear_wgrad(ctx, c, &g, &k.fc2_wgrad, &d2, l.sub));
    } else {
        if (moex_weight_present(&a->dw2)) {
            if (p.recompute_z) MOEX_TRY(ops->glu_fwd(ctx, c, &g, &k.glu_fwd, &dg, l.sub));
            MOEX_TRY(ops->linear_wgrad(ctx, c, &g, &k.fc2_wgrad, &d2, l.sub));
        }
        if (p.fc2_dgrad) MOEX_TRY(ops->linear_dgrad(ctx, c, &g, &k.fc2_dgrad, &d2, l.sub));
    }
    /* GLU: dh (when needed; over h with dh_in_h) and the GLU dprobs term. */
    if (p.need_dz && !p.fused) MOEX_TRY(ops->glu_bwd(ctx, c, &g, &k.glu_bwd, &dg, l.sub));
    /* FC1: dx and db1, then dW1 (last: z, dz and l.sub may be in its memory). */
    if (p.fc1_dgrad) MOEX_TRY(ops->linear_dgrad(ctx, c, &g, &k.fc1_dgrad, &d1, l.sub));
    if (moex_weight_present(&a->dw1)) MOEX_TRY(ops->linear_wgrad(ctx, c, &g, &k.fc1_wgrad, &d1, l.sub_dw1));
    return MOEX_OK;
}

/* ---- the public entry points (moex.h) -------------------------------------------------
 * Plain definitions, so that grep finds them; each is one call into op.c (op.h), so their
 * shapes repeat by design. */

moex_status moex_grouped_mlp_forward_workspace_size(moex_context *ctx, const moex_grouped_mlp_args *args,
                                                    size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_GROUPED_MLP_FORWARD, args, bytes);
}

moex_status moex_grouped_mlp_forward(moex_context *ctx, const moex_grouped_mlp_args *args, void *workspace,
                                     size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_GROUPED_MLP_FORWARD, args, workspace, workspace_bytes, stream);
}

moex_status moex_grouped_mlp_backward_workspace_size(moex_context *ctx, const moex_grouped_mlp_grad_args *args,
                                                     size_t *bytes) {
    return moex_op_workspace_size(ctx, MOEX_OP_GROUPED_MLP_BACKWARD, args, bytes);
}

moex_status moex_grouped_mlp_backward(moex_context *ctx, const moex_grouped_mlp_grad_args *args, void *workspace,
                                      size_t workspace_bytes, moex_stream stream) {
    return moex_op_run(ctx, MOEX_OP_GROUPED_MLP_BACKWARD, args, workspace, workspace_bytes, stream);
}
