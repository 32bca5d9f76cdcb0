/*
 * cpu_grouped_mlp.c - the CPU grouped MLP, forward and backward, composed from the CPU
 * grouped linear (cpu_grouped_linear.c) and scaled GLU (cpu_glu.c) operations.
 *
 * forward:   h = x W1_g^T (+ b1_g)                  FC1      h [T, 2F]  =
 *            z = p * glu(h)                         GLU      z [T, F]   = (args->z or workspace)
 *            y = z W2_g^T (+ b2_g | + p b2_g)       FC2      y [T, H]   =
 * backward:  z  = p * glu(h)           only when dw2 is asked and the forward did not save z
 *            dz = dy W2_g, db2 = sum dy (or sum p dy), dprobs += sum_j dy_ij b2_gj (SCALED)
 *            dW2 = dy^T z
 *            dh = glu'(h) dz, dprobs += sum_j dz_ij act(a_ij) g(b_ij)
 *            dx = dh W1_g, db1 = sum dh
 *            dW1 = dh^T x
 * Only what the present outputs need is computed. dprobs receives the scaled-bias term first,
 * then the GLU term. The intermediates z, dz and dh live in the workspace in the activation
 * dtype, as the saved h and z do. Split values are checked before anything is written.
 *
 * Workspace: the (G + 1) offsets, the intermediates the call needs, and one region shared by
 * the sub-operations (they run one after the other), each aligned to MOEX_WS_ALIGN. Its size
 * depends on shapes, dtypes and which optional tensors are present, never on split values.
 */
#include "cpu_ops.h"
#include "validate.h"

/* ---- workspace layout ---------------------------------------------------------------- */

typedef struct ws_layout {
    size_t off;                 /* (G + 1) int64 offsets, at byte 0 */
    size_t z, dz, dh;           /* byte offsets of the intermediates; 0 when unused */
    size_t sub;                 /* byte offset of the sub-operations' region */
    size_t sub_bytes;
    size_t total;
} ws_layout;

/* Lays out the offsets, then `n` intermediate buffers of bytes[k] (0: unused, at[k] = 0). */
static void ws_plan(ws_layout *l, const moex_mlp_dims *d, const size_t *bytes, size_t **at, int n,
                    size_t sub_bytes) {
    size_t pos = 0;
    l->off = moex_sz_take(&pos, moex_sz_bytes(d->G + 1, 1, sizeof(int64_t)));
    for (int k = 0; k < n; k++) *at[k] = bytes[k] ? moex_sz_take(&pos, bytes[k]) : 0;
    l->sub = pos;
    l->sub_bytes = sub_bytes;
    l->total = moex_sz_add(pos, sub_bytes);
}

/* A [rows, cols] tensor of the activation dtype (data NULL when only its shape matters). */
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
    moex_glu_dims g = {d->T, d->F, d->G, d->dt};
    return g;
}

static const moex_tensor absent_tensor;

/* ---- forward ------------------------------------------------------------------------- */

/* The three sub-operations of the forward; z is where the GLU output goes. */
typedef struct fwd_calls {
    moex_grouped_linear_args fc1;
    moex_scaled_glu_args glu;
    moex_grouped_linear_args fc2;
} fwd_calls;

static void fwd_calls_of(const moex_grouped_mlp_args *a, const moex_mlp_dims *d, void *z,
                         fwd_calls *c) {
    moex_tensor zt = act_2d(z, d, d->F);
    c->fc1 = (moex_grouped_linear_args){
        .x = a->x, .w = a->w1, .bias_mode = moex_present(&a->b1) ? MOEX_BIAS_ADD : MOEX_BIAS_NONE,
        .bias = a->b1, .splits = a->splits, .y = a->h};
    c->glu = (moex_scaled_glu_args){
        .glu = a->glu, .h = a->h, .probs = a->probs, .splits = a->splits, .z = zt};
    c->fc2 = (moex_grouped_linear_args){
        .x = zt, .w = a->w2, .bias_mode = a->b2_mode, .bias = a->b2,
        .probs = a->b2_mode == MOEX_BIAS_SCALED ? a->probs : absent_tensor, .splits = a->splits,
        .y = a->y};
}

static ws_layout fwd_layout(moex_context *ctx, const moex_grouped_mlp_args *a, const moex_mlp_dims *d) {
    fwd_calls c;
    fwd_calls_of(a, d, NULL, &c);
    moex_gl_dims d1 = fc1_dims(d), d2 = fc2_dims(d);
    moex_glu_dims dg = glu_dims(d);
    size_t sub = moex_cpu_grouped_linear_forward_ws(ctx, &c.fc1, &d1);
    sub = moex_sz_max(sub, moex_cpu_scaled_glu_forward_ws(ctx, &c.glu, &dg));
    sub = moex_sz_max(sub, moex_cpu_grouped_linear_forward_ws(ctx, &c.fc2, &d2));

    ws_layout l = {0};
    size_t bytes[1] = {moex_present(&a->z) ? 0 : act_bytes(d, d->F)};
    size_t *at[1] = {&l.z};
    ws_plan(&l, d, bytes, at, 1, sub);
    return l;
}

size_t moex_cpu_grouped_mlp_forward_ws(moex_context *ctx, const moex_grouped_mlp_args *a,
                                       const moex_mlp_dims *d) {
    return fwd_layout(ctx, a, d).total;
}

moex_status moex_cpu_grouped_mlp_forward(moex_context *ctx, const moex_grouped_mlp_args *a,
                                         const moex_mlp_dims *d, void *ws, size_t ws_bytes,
                                         moex_stream stream) {
    const ws_layout l = fwd_layout(ctx, a, d);
    char *base = (char *)ws;
    MOEX_TRY(moex_cpu_read_offsets(ctx, "moex_grouped_mlp_forward", &a->splits, d->T,
                                   (int64_t *)(base + l.off)));

    fwd_calls c;
    fwd_calls_of(a, d, moex_present(&a->z) ? a->z.data : base + l.z, &c);
    moex_gl_dims d1 = fc1_dims(d), d2 = fc2_dims(d);
    moex_glu_dims dg = glu_dims(d);
    void *sub = base + l.sub;
    MOEX_TRY(moex_cpu_grouped_linear_forward(ctx, &c.fc1, &d1, sub, l.sub_bytes, stream));
    MOEX_TRY(moex_cpu_scaled_glu_forward(ctx, &c.glu, &dg, sub, l.sub_bytes, stream));
    MOEX_TRY(moex_cpu_grouped_linear_forward(ctx, &c.fc2, &d2, sub, l.sub_bytes, stream));
    return MOEX_OK;
}

/* ---- backward ------------------------------------------------------------------------ */

/* Which steps the present outputs need. */
typedef struct bwd_plan {
    bool dprobs_bias;           /* dprobs gets the scaled-b2 term (FC2 dgrad) */
    bool need_dh;               /* dx, dw1 or db1 asked */
    bool need_dz;               /* dh or the GLU's dprobs term asked */
    bool fc2_dgrad;             /* dz, db2 or the scaled-b2 dprobs term */
    bool recompute_z;           /* dw2 asked and z not saved */
} bwd_plan;

static bwd_plan bwd_plan_of(const moex_grouped_mlp_grad_args *a) {
    bwd_plan p;
    const bool dprobs = moex_present(&a->dprobs);
    const bool db2 = moex_present(&a->db2) && a->b2_mode != MOEX_BIAS_NONE;
    p.dprobs_bias = dprobs && a->b2_mode == MOEX_BIAS_SCALED;
    p.need_dh = moex_present(&a->dx) || moex_weight_present(&a->dw1) || moex_present(&a->db1);
    p.need_dz = p.need_dh || dprobs;
    p.fc2_dgrad = p.need_dz || db2 || p.dprobs_bias;
    p.recompute_z = moex_weight_present(&a->dw2) && !moex_present(&a->z);
    return p;
}

/* The sub-operations of the backward, given where z, dz and dh are. */
typedef struct bwd_calls {
    moex_scaled_glu_args glu_fwd;            /* recomputes z */
    moex_grouped_linear_dgrad_args fc2_dgrad;
    moex_grouped_linear_wgrad_args fc2_wgrad;
    moex_scaled_glu_grad_args glu_bwd;
    moex_grouped_linear_dgrad_args fc1_dgrad;
    moex_grouped_linear_wgrad_args fc1_wgrad;
} bwd_calls;

static void bwd_calls_of(const moex_grouped_mlp_grad_args *a, const moex_mlp_dims *d,
                         const bwd_plan *p, void *z, void *dz, void *dh, bwd_calls *c) {
    const moex_tensor zt = moex_present(&a->z) ? a->z : act_2d(z, d, d->F);
    const moex_tensor dzt = p->need_dz ? act_2d(dz, d, d->F) : absent_tensor;
    const moex_tensor dht = p->need_dh ? act_2d(dh, d, 2 * d->F) : absent_tensor;
    const bool scaled = a->b2_mode == MOEX_BIAS_SCALED;

    c->glu_fwd = (moex_scaled_glu_args){
        .glu = a->glu, .h = a->h, .probs = a->probs, .splits = a->splits, .z = zt};
    c->fc2_dgrad = (moex_grouped_linear_dgrad_args){
        .dy = a->dy, .w = a->w2, .bias_mode = a->b2_mode,
        .bias = p->dprobs_bias ? a->b2 : absent_tensor,
        .probs = scaled ? a->probs : absent_tensor, .splits = a->splits, .dx = dzt,
        .dbias = a->b2_mode != MOEX_BIAS_NONE ? a->db2 : absent_tensor,
        .dprobs = p->dprobs_bias ? a->dprobs : absent_tensor};
    c->fc2_wgrad = (moex_grouped_linear_wgrad_args){
        .x = zt, .dy = a->dy, .splits = a->splits, .dw_mode = a->dw_mode, .dw = a->dw2};
    c->glu_bwd = (moex_scaled_glu_grad_args){
        .glu = a->glu, .h = a->h, .probs = a->probs, .splits = a->splits, .dz = dzt, .dh = dht,
        .dprobs = a->dprobs};
    c->fc1_dgrad = (moex_grouped_linear_dgrad_args){
        .dy = dht, .w = a->w1, .bias_mode = moex_present(&a->db1) ? MOEX_BIAS_ADD : MOEX_BIAS_NONE,
        .splits = a->splits, .dx = a->dx, .dbias = a->db1};
    c->fc1_wgrad = (moex_grouped_linear_wgrad_args){
        .x = a->x, .dy = dht, .splits = a->splits, .dw_mode = a->dw_mode, .dw = a->dw1};
}

static ws_layout bwd_layout(moex_context *ctx, const moex_grouped_mlp_grad_args *a,
                            const moex_mlp_dims *d) {
    const bwd_plan p = bwd_plan_of(a);
    bwd_calls c;
    bwd_calls_of(a, d, &p, NULL, NULL, NULL, &c);
    moex_gl_dims d1 = fc1_dims(d), d2 = fc2_dims(d);
    moex_glu_dims dg = glu_dims(d);
    size_t sub = 0;
    if (p.recompute_z) sub = moex_sz_max(sub, moex_cpu_scaled_glu_forward_ws(ctx, &c.glu_fwd, &dg));
    if (p.fc2_dgrad)
        sub = moex_sz_max(sub, moex_cpu_grouped_linear_backward_data_ws(ctx, &c.fc2_dgrad, &d2));
    if (moex_weight_present(&a->dw2))
        sub = moex_sz_max(sub, moex_cpu_grouped_linear_backward_weight_ws(ctx, &c.fc2_wgrad, &d2));
    if (p.need_dz) sub = moex_sz_max(sub, moex_cpu_scaled_glu_backward_ws(ctx, &c.glu_bwd, &dg));
    if (moex_present(&a->dx) || moex_present(&a->db1))
        sub = moex_sz_max(sub, moex_cpu_grouped_linear_backward_data_ws(ctx, &c.fc1_dgrad, &d1));
    if (moex_weight_present(&a->dw1))
        sub = moex_sz_max(sub, moex_cpu_grouped_linear_backward_weight_ws(ctx, &c.fc1_wgrad, &d1));

    ws_layout l = {0};
    size_t bytes[3] = {p.recompute_z ? act_bytes(d, d->F) : 0, p.need_dz ? act_bytes(d, d->F) : 0,
                       p.need_dh ? act_bytes(d, 2 * d->F) : 0};
    size_t *at[3] = {&l.z, &l.dz, &l.dh};
    ws_plan(&l, d, bytes, at, 3, sub);
    return l;
}

size_t moex_cpu_grouped_mlp_backward_ws(moex_context *ctx, const moex_grouped_mlp_grad_args *a,
                                        const moex_mlp_dims *d) {
    return bwd_layout(ctx, a, d).total;
}

moex_status moex_cpu_grouped_mlp_backward(moex_context *ctx, const moex_grouped_mlp_grad_args *a,
                                          const moex_mlp_dims *d, void *ws, size_t ws_bytes,
                                          moex_stream stream) {
    const ws_layout l = bwd_layout(ctx, a, d);
    const bwd_plan p = bwd_plan_of(a);
    char *base = (char *)ws;
    MOEX_TRY(moex_cpu_read_offsets(ctx, "moex_grouped_mlp_backward", &a->splits, d->T,
                                   (int64_t *)(base + l.off)));

    bwd_calls c;
    bwd_calls_of(a, d, &p, l.z ? base + l.z : NULL, l.dz ? base + l.dz : NULL,
                 l.dh ? base + l.dh : NULL, &c);
    moex_gl_dims d1 = fc1_dims(d), d2 = fc2_dims(d);
    moex_glu_dims dg = glu_dims(d);
    void *sub = base + l.sub;
    const size_t sb = l.sub_bytes;

    /* FC2: dz, db2, the scaled-b2 dprobs term, then dW2 (z recomputed when not saved). */
    if (p.fc2_dgrad)
        MOEX_TRY(moex_cpu_grouped_linear_backward_data(ctx, &c.fc2_dgrad, &d2, sub, sb, stream));
    if (moex_weight_present(&a->dw2)) {
        if (p.recompute_z)
            MOEX_TRY(moex_cpu_scaled_glu_forward(ctx, &c.glu_fwd, &dg, sub, sb, stream));
        MOEX_TRY(moex_cpu_grouped_linear_backward_weight(ctx, &c.fc2_wgrad, &d2, sub, sb, stream));
    }
    /* GLU: dh (when needed) and the GLU dprobs term. */
    if (p.need_dz)
        MOEX_TRY(moex_cpu_scaled_glu_backward(ctx, &c.glu_bwd, &dg, sub, sb, stream));
    /* FC1: dx and db1, then dW1. */
    if (moex_present(&a->dx) || moex_present(&a->db1))
        MOEX_TRY(moex_cpu_grouped_linear_backward_data(ctx, &c.fc1_dgrad, &d1, sub, sb, stream));
    if (moex_weight_present(&a->dw1))
        MOEX_TRY(moex_cpu_grouped_linear_backward_weight(ctx, &c.fc1_wgrad, &d1, sub, sb, stream));
    return MOEX_OK;
}
