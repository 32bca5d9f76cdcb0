/*
 * moe_layer.c - the MoE layer, forward and backward: validation and its one composition
 * from the backend primitives, with the grouped MLP's composition (grouped_mlp.c) on the
 * permuted rows (the math: docs/ops.md).
 *
 * forward:   logits = x Wr^T                           [T, E]    f32     (saved)
 *            probs, ids = router(logits)               [T, k]            (saved)
 *            xp, probs_p, splits, row_map = permute(x, ids, probs)       (saved)
 *            yp = grouped_mlp(xp, probs_p, splits)     [T*k, H]  (h, z saved; yp in the workspace)
 *            y = unpermute(yp)                         [T, H]    =
 * backward:  dyp = unpermute_backward(dy)
 *            dxp, dprobs_p, dW1, dW2, db1, db2 = grouped_mlp_backward(dyp)
 *            dx_perm, dprobs = permute_backward(dxp, dprobs_p)      (dx_perm in f32)
 *            dlogits = router_backward(dprobs)         [T, E]    f32
 *            dRw = dlogits^T x                         [E, H]    = or +=
 *            dx = dx_perm + dlogits Wr                 [T, H]    =, rounded once
 * The router path (dprobs, dlogits) runs only when dx or drouter_w is asked for. The
 * router's GEMMs are the backend's `dense_gemm` primitive, on a handle of one group of T rows.
 * An FP8 recipe (args->fp8) goes to the grouped MLP, forward and backward (its FC1 and FC2
 * GEMMs on FP8 operands); the router's GEMMs stay in the activation dtype.
 *
 * The saved buffer (aligned by the core) starts with a header naming the forward's shapes
 * and routing options. Where the backend's memory is host memory (the CPU), the forward
 * writes the header and the backward checks it, and the routing ids, row_map and splits
 * saved, before it writes anything, so that a saved buffer from another layer (or none)
 * fails cleanly. Device memory cannot be read without a synchronisation: there the backward
 * trusts `saved`, and the kernels skip and flag corrupt routing in it.
 */
#include "op.h"

#include <string.h>

#define SAVED_MAGIC 0x314c454f4d78656dULL   /* "mexMOEL1" */

/* What the forward stored, so that the backward can check it was given the same layer. */
typedef struct saved_header {
    uint64_t magic;
    int64_t T, H, E, F, k;
    int32_t dt, score, norm, pad;
} saved_header;

static const moex_tensor absent_tensor;

/* ---- the saved buffer ---------------------------------------------------------------- */

/* The saved tensors as views (data NULL when base is NULL: shapes only); returns the size. */
typedef struct saved_views {
    void *header;
    moex_moe_router_io io;          /* logits, probs, ids */
    moex_tensor row_map;
    moex_moe_rows p;                /* the permuted rows: splits, probs_p, xp, h, z */
} saved_views;

static size_t saved_layout(const moex_moe_dims *d, void *base, saved_views *v) {
    const int64_t rows = d->T * d->k;   /* validated: fits an int32 */
    moex_carver c = {(char *)base, 0};
    v->header = moex_take(&c, sizeof(saved_header));
    v->io = moex_moe_router_io_take(&c, d);
    v->row_map = moex_tensor_1d(moex_take(&c, moex_sz_bytes(rows, 1, sizeof(int32_t))), MOEX_DTYPE_I32, rows);
    v->p = moex_moe_rows_take(&c, d, rows);
    return c.used;
}

static size_t saved_bytes(const moex_moe_dims *d) {
    saved_views v;
    return saved_layout(d, NULL, &v);
}

/* The saved buffer: its size plus alignment slack (as for the workspace), aligned into
 * d->saved. The forward and backward must be given the same pointer (or one with the same
 * address modulo MOEX_WS_ALIGN). The forward writes it (MOEX_SPAN_OUT), the backward reads
 * it. */
static moex_status saved_prepare(moex_context *ctx, const char *op, const moex_moe_layer_args *a,
                                 moex_span_role role, moex_moe_dims *d) {
    return moex_buffer_prepare(ctx, op, "saved", saved_bytes(d), a->saved, a->saved_bytes, role, &d->saved);
}

static saved_header header_of(const moex_moe_layer_args *a, const moex_moe_dims *d) {
    saved_header h;
    memset(&h, 0, sizeof h);
    h.magic = SAVED_MAGIC;
    h.T = d->T, h.H = d->H, h.E = d->E, h.F = d->F, h.k = d->k;
    h.dt = (int32_t)d->dt, h.score = (int32_t)a->score, h.norm = (int32_t)a->norm;
    return h;
}

/* Checks (host memory only) that `saved` holds a forward of this layer: the header, then
 * the routing it stored (ids, row_map and splits), so that no primitive can fail after a
 * write. The header's two steps are alike in shape with ep.c's check_handle by design: each
 * on its own record, with its own messages. */
static moex_status check_saved(moex_context *ctx, const char *op, const moex_moe_layer_args *f,
                               const moex_moe_dims *d, const saved_views *v) {
    saved_header want = header_of(f, d), got;
    memcpy(&got, v->header, sizeof got);
    if (got.magic != SAVED_MAGIC)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: saved does not hold a forward (run moex_moe_layer_forward first, and pass the "
                         "same saved pointer to both calls)", op);
    if (memcmp(&got, &want, sizeof got) != 0)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: saved holds a forward of another layer (T %lld H %lld E %lld F %lld k %lld, "
                         "dtype %d, score %d, norm %d); fwd must be the forward's arguments", op,
                         (long long)got.T, (long long)got.H, (long long)got.E, (long long)got.F, (long long)got.k,
                         (int)got.dt, (int)got.score, (int)got.norm);
    const int64_t rows = d->T * d->k;
    const int32_t *ids = (const int32_t *)v->io.ids.data, *rm = (const int32_t *)v->row_map.data;
    const int64_t *splits = (const int64_t *)v->p.splits.data;
    int64_t sum = 0;
    for (int64_t i = 0; i < rows; i++)
        if (ids[i] < 0 || ids[i] >= d->E || rm[i] < 0 || rm[i] >= rows)
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: saved routing is corrupt at (t %lld, j %lld)", op,
                             (long long)(i / d->k), (long long)(i % d->k));
    for (int64_t e = 0; e < d->E; e++) {
        if (splits[e] < 0 || splits[e] > rows - sum)
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: saved splits are corrupt at expert %lld", op,
                             (long long)e);
        sum += splits[e];
    }
    if (sum != rows)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: saved splits sum to %lld, not T*k = %lld", op,
                         (long long)sum, (long long)rows);
    return MOEX_OK;
}

/* ---- validation ---------------------------------------------------------------------- */

/* dW of the layer: WRITE into f32 or the activation dtype, ACCUMULATE into f32 only. */
static unsigned dw_dtypes(moex_grad_mode mode, moex_dtype dt) {
    return mode == MOEX_GRAD_ACCUMULATE ? MOEX_DT_F32 : (MOEX_DT(dt) | MOEX_DT_F32);
}

moex_status moex_moe_layer_check(moex_context *ctx, const char *op, const moex_moe_layer_args *a, bool need_y,
                                 int64_t G, moex_moe_dims *d) {
    MOEX_TRY(moex_check_tokens(ctx, op, "x", &a->x, MOEX_SPAN_IN, &d->T, &d->H, &d->dt));
    const int64_t rwshape[2] = {-1, d->H};
    MOEX_TRY(moex_check_tensor(ctx, op, "router_w", &a->router_w, 2, rwshape, MOEX_DT(d->dt)));
    d->E = a->router_w.shape[0];
    if (d->E < 1 || d->E > INT32_MAX)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: router_w must be [E, H] with 1 <= E <= INT32_MAX, got E = %lld",
                         op, (long long)d->E);
    MOEX_TRY(moex_check_router_options(ctx, op, a->topk, d->E, a->score, a->norm));
    d->k = a->topk;
    d->G = G ? G : d->E;
    MOEX_TRY(moex_check_rows_fit_i32(ctx, op, d->T, d->k));

    int64_t twoF = a->w1.t.ndim == 3 ? a->w1.t.shape[1] : -1;
    MOEX_TRY(moex_check_weight(ctx, op, "w1", &a->w1, d->G, twoF, d->H, MOEX_DT(d->dt)));
    if (twoF < 2 || twoF % 2 != 0)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: w1 must be [G, 2F, H] with an even 2F >= 2, got %lld", op,
                         (long long)twoF);
    d->F = twoF / 2;
    MOEX_TRY(moex_check_weight(ctx, op, "w2", &a->w2, d->G, d->H, d->F, MOEX_DT(d->dt)));
    /* The layer's own intermediates are bounded like the caller's tensors. */
    const int64_t rows = d->T * d->k;
    MOEX_TRY(moex_check_internal(ctx, op, "logits", d->T, d->E));
    MOEX_TRY(moex_check_internal(ctx, op, "xp", rows, d->H));
    MOEX_TRY(moex_check_internal(ctx, op, "h", rows, 2 * d->F));
    const int64_t b1shape[2] = {d->G, 2 * d->F}, b2shape[2] = {d->G, d->H}, yshape[2] = {d->T, d->H};
    const unsigned dt_bias = MOEX_DT(d->dt) | MOEX_DT_F32;
    MOEX_TRY(moex_check_optional(ctx, op, "b1", &a->b1, 2, b1shape, dt_bias));
    MOEX_TRY(moex_check_bias_mode(ctx, op, a->b2_mode));
    if (a->b2_mode == MOEX_BIAS_NONE) {
        if (moex_present(&a->b2))
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: b2 is given but b2_mode is MOEX_BIAS_NONE", op);
    } else {
        MOEX_TRY(moex_check_tensor(ctx, op, "b2", &a->b2, 2, b2shape, dt_bias));
    }
    MOEX_TRY(moex_check_glu(ctx, op, &a->glu, d->F));
    if (need_y) MOEX_TRY(moex_check_output(ctx, op, "y", &a->y, 2, yshape, MOEX_DT(d->dt)));
    MOEX_TRY(moex_check_fp8_recipe(ctx, op, "fp8", &a->fp8));
    return moex_fp8_check_mlp_weight_copies(ctx, op, &a->fp8, d->G, d->H, d->F);
}

moex_status moex_moe_layer_saved_size(moex_context *ctx, const moex_moe_layer_args *args, size_t *bytes) {
    static const char op[] = "moex_moe_layer_saved_size";
    MOEX_TRY(moex_enter(ctx, op, args));
    if (!bytes) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: bytes is NULL", op);
    moex_moe_dims d;
    MOEX_TRY(moex_moe_layer_check(ctx, op, args, false, 0, &d));
    return moex_buffer_public_size(ctx, op, "saved", saved_bytes(&d), bytes);
}

moex_status moex_op_moe_layer_forward_validate(moex_context *ctx, const char *op, const moex_moe_layer_args *a,
                                               moex_purpose p, moex_moe_dims *d) {
    MOEX_TRY(moex_moe_layer_check(ctx, op, a, true, 0, d));
    return p == MOEX_FOR_RUN ? saved_prepare(ctx, op, a, MOEX_SPAN_OUT, d) : MOEX_OK;
}

moex_status moex_op_moe_layer_backward_validate(moex_context *ctx, const char *op, const moex_moe_layer_grad_args *a,
                                              moex_purpose p, moex_moe_dims *d) {
    MOEX_TRY(moex_moe_layer_check(ctx, op, &a->fwd, false, 0, d));
    MOEX_TRY(moex_moe_layer_check_grads(ctx, op, a, p, d));
    return p == MOEX_FOR_RUN ? saved_prepare(ctx, op, &a->fwd, MOEX_SPAN_IN, d) : MOEX_OK;
}

moex_status moex_moe_layer_check_grads(moex_context *ctx, const char *op, const moex_moe_layer_grad_args *a,
                                       moex_purpose p, const moex_moe_dims *d) {
    const int64_t th[2] = {d->T, d->H}, eh[2] = {d->E, d->H}, gh[2] = {d->G, d->H}, db1shape[2] = {d->G, 2 * d->F};
    MOEX_TRY(moex_check_tensor(ctx, op, "dy", &a->dy, 2, th, MOEX_DT(d->dt)));
    MOEX_TRY(moex_check_optional_output(ctx, op, "dx", &a->dx, 2, th, MOEX_DT(d->dt)));
    MOEX_TRY(moex_check_grad_mode(ctx, op, a->dw_mode));
    const unsigned dts = dw_dtypes(a->dw_mode, d->dt);
    MOEX_TRY(moex_check_optional_output(ctx, op, "drouter_w", &a->drouter_w, 2, eh, dts));
    if (moex_weight_present(&a->dw1))
        MOEX_TRY(moex_check_weight_output(ctx, op, "dw1", &a->dw1, d->G, 2 * d->F, d->H, dts));
    if (moex_weight_present(&a->dw2))
        MOEX_TRY(moex_check_weight_output(ctx, op, "dw2", &a->dw2, d->G, d->H, d->F, dts));
    MOEX_TRY(moex_check_optional_output(ctx, op, "db1", &a->db1, 2, db1shape, MOEX_DT_BIAS(d->dt)));
    MOEX_TRY(moex_check_optional_output(ctx, op, "db2", &a->db2, 2, gh, MOEX_DT_BIAS(d->dt)));
    if (a->fwd.b2_mode == MOEX_BIAS_NONE && moex_present(&a->db2))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: db2 is requested but b2_mode is MOEX_BIAS_NONE", op);
    MOEX_TRY(moex_fp8_check_out(ctx, op, &a->fwd.fp8, p, "dw1", a->dw1.t.data));
    return moex_fp8_check_out(ctx, op, &a->fwd.fp8, p, "dw2", a->dw2.t.data);
}

/* ---- the grouped MLP on the expert rows (op.h; shared with ep_layer.c) ----------------- */

moex_moe_rows moex_moe_rows_take(moex_carver *c, const moex_moe_dims *d, int64_t R) {
    const size_t es = moex_dtype_size(d->dt);
    moex_moe_rows r;
    r.splits = moex_tensor_1d(moex_take(c, moex_sz_bytes(d->G, 1, sizeof(int64_t))), MOEX_DTYPE_I64, d->G);
    r.probs = moex_tensor_1d(moex_take(c, moex_sz_bytes(R, 1, sizeof(float))), MOEX_DTYPE_F32, R);
    r.x = moex_tensor_2d(moex_take(c, moex_sz_bytes(R, d->H, es)), d->dt, R, d->H);
    r.h = moex_tensor_2d(moex_take(c, moex_sz_bytes(R, 2 * d->F, es)), d->dt, R, 2 * d->F);
    r.z = moex_tensor_2d(moex_take(c, moex_sz_bytes(R, d->F, es)), d->dt, R, d->F);
    return r;
}

moex_grouped_mlp_args moex_moe_mlp_args(const moex_moe_layer_args *a, const moex_moe_rows *r, moex_tensor y) {
    return (moex_grouped_mlp_args){.x = r->x, .w1 = a->w1, .b1 = a->b1, .w2 = a->w2, .b2_mode = a->b2_mode,
                                   .b2 = a->b2, .probs = r->probs, .glu = a->glu, .splits = r->splits, .h = r->h,
                                   .z = r->z, .y = y, .fp8 = a->fp8};
}

moex_grouped_mlp_grad_args moex_moe_mlp_grad_args(const moex_moe_layer_grad_args *a, const moex_moe_rows *r,
                                                  moex_tensor dy, moex_tensor dx, moex_tensor dprobs) {
    const moex_moe_layer_args *f = &a->fwd;
    return (moex_grouped_mlp_grad_args){
        .x = r->x, .w1 = f->w1, .w2 = f->w2, .b2_mode = f->b2_mode, .b2 = f->b2, .probs = r->probs,
        .glu = f->glu, .splits = r->splits, .h = r->h, .z = r->z, .dy = dy, .dx = dx, .dw_mode = a->dw_mode,
        .dw1 = a->dw1, .dw2 = a->dw2, .db1 = a->db1, .db2 = f->b2_mode != MOEX_BIAS_NONE ? a->db2 : absent_tensor,
        .dprobs = dprobs, .fp8 = f->fp8};
}

/* ---- the primitives' dims -------------------------------------------------------------- */

static moex_perm_dims perm_dims(const moex_moe_dims *d, int64_t E) {
    moex_perm_dims p = {d->T, d->H, d->k, E, d->dt};
    return p;
}

static moex_mlp_dims mlp_dims(const moex_moe_dims *d) {
    moex_mlp_dims m = {d->E, d->T * d->k, d->H, d->F, d->dt};
    return m;
}

/* ---- forward ------------------------------------------------------------------------- */

typedef struct fwd_calls {
    moex_permute_args permute;
    moex_grouped_mlp_args mlp;
    moex_unpermute_args unpermute;
} fwd_calls;

/* The primitives' arguments, given the saved views and yp (NULL data: shapes only). */
static void fwd_calls_of(const moex_moe_layer_args *a, const moex_moe_dims *d, const saved_views *v, void *yp,
                         fwd_calls *c) {
    const moex_tensor ypt = moex_tensor_2d(yp, d->dt, d->T * d->k, d->H);
    c->permute = (moex_permute_args){.x = a->x, .ids = v->io.ids, .probs = v->io.probs, .num_experts = (int32_t)d->E,
                                     .xp = v->p.x, .probs_p = v->p.probs, .splits = v->p.splits,
                                     .row_map = v->row_map};
    c->mlp = moex_moe_mlp_args(a, &v->p, ypt);
    c->unpermute = (moex_unpermute_args){.row_map = v->row_map, .yp = ypt, .y = a->y};
}

/* The workspace: yp, and one region shared by the router, the primitives and the grouped MLP
 * (they run one after the other). */
typedef struct fwd_layout {
    void *yp, *sub;
    size_t total;
} fwd_layout;

static fwd_layout fwd_layout_of(moex_context *ctx, const moex_moe_layer_args *a, const moex_moe_dims *d, void *ws) {
    const moex_backend_ops *ops = moex_ops(ctx);
    saved_views v;
    saved_layout(d, NULL, &v);
    fwd_calls c;
    fwd_calls_of(a, d, &v, NULL, &c);
    const moex_perm_dims pd = perm_dims(d, d->E), ud = perm_dims(d, 0);
    const moex_mlp_dims md = mlp_dims(d);
    size_t sub = moex_moe_router_forward_ws(ctx, a, d);
    sub = moex_sz_max(sub, ops->permute_fwd_ws(ctx, &c.permute, &pd));
    sub = moex_sz_max(sub, moex_op_grouped_mlp_forward_ws(ctx, &c.mlp, &md));
    sub = moex_sz_max(sub, ops->unpermute_fwd_ws(ctx, &c.unpermute, &ud));
    moex_carver k = {(char *)ws, 0};
    fwd_layout l;
    l.yp = moex_take(&k, moex_sz_bytes(d->T * d->k, d->H, moex_dtype_size(d->dt)));
    l.sub = moex_take(&k, sub);
    l.total = k.used;
    return l;
}

moex_status moex_op_moe_layer_forward_run(moex_context *ctx, const moex_call *c, const moex_moe_layer_args *a,
                                          const moex_moe_dims *d, void *ws) {
    const moex_backend_ops *ops = moex_ops(ctx);
    MOEX_TRY(moex_check_limits(ctx, c, d->T * d->k, d->E, d->E));   /* before any launch */
    const fwd_layout l = fwd_layout_of(ctx, a, d, ws);
    saved_views v;
    saved_layout(d, d->saved, &v);
    fwd_calls k;
    fwd_calls_of(a, d, &v, l.yp, &k);
    const moex_perm_dims pd = perm_dims(d, d->E), ud = perm_dims(d, 0);
    const moex_mlp_dims md = mlp_dims(d);

    /* Mark the buffer as not holding a forward until this one has finished. */
    if (ops->host_memory) memset(v.header, 0, sizeof(saved_header));
    MOEX_TRY(moex_moe_router_forward(ctx, c, a, d, &v.io, l.sub));
    MOEX_TRY(ops->permute_fwd(ctx, c, &k.permute, &pd, l.sub));
    MOEX_TRY(moex_op_grouped_mlp_forward_run(ctx, c, &k.mlp, &md, l.sub));
    MOEX_TRY(ops->unpermute_fwd(ctx, c, &k.unpermute, &ud, l.sub));
    if (ops->host_memory) {
        const saved_header h = header_of(a, d);
        memcpy(v.header, &h, sizeof h);
    }
    return MOEX_OK;
}

/* ws and run: the layout without and with the workspace, as every op's (op.h): same shape by design. */
size_t moex_op_moe_layer_forward_ws(moex_context *ctx, const moex_moe_layer_args *a, const moex_moe_dims *d) {
    return fwd_layout_of(ctx, a, d, NULL).total;
}

/* ---- backward ------------------------------------------------------------------------ */

/* Which parts of the backward run. */
typedef struct bwd_plan {
    bool dx;        /* dx asked */
    bool router;    /* the router path: dprobs, dlogits (dx or drouter_w asked) */
} bwd_plan;

static bwd_plan bwd_plan_of(const moex_moe_layer_grad_args *a) {
    bwd_plan p;
    p.dx = moex_present(&a->dx);
    p.router = p.dx || moex_present(&a->drouter_w);
    return p;
}

/* The workspace: dyp, dprobs_p, dprobs, dx_perm (f32), and one region shared by the
 * primitives, the grouped MLP and the router. dxp is written over dyp: given z (the layer
 * saves it), the grouped MLP's backward reads every row of dy before it writes dx
 * (grouped_mlp.c). */
typedef struct bwd_layout {
    void *dyp, *dprobs_p, *dprobs, *dxf, *sub;
    size_t total;
} bwd_layout;

typedef struct bwd_calls {
    moex_unpermute_grad_args unpermute;
    moex_grouped_mlp_grad_args mlp;
    moex_permute_grad_args permute;
    moex_tensor dprobs;             /* [T, k] f32, the router's input */
} bwd_calls;

/* The primitives' arguments, given the saved views and the workspace (NULL: shapes only). */
static void bwd_calls_of(const moex_moe_layer_grad_args *a, const moex_moe_dims *d, const bwd_plan *p,
                         const saved_views *v, const bwd_layout *l, bwd_calls *c) {
    const int64_t rows = d->T * d->k;
    const moex_tensor dyp = moex_tensor_2d(l->dyp, d->dt, rows, d->H);
    const moex_tensor dxp = p->dx ? moex_tensor_2d(l->dyp, d->dt, rows, d->H) : absent_tensor;
    const moex_tensor dprobs_p = p->router ? moex_tensor_1d(l->dprobs_p, MOEX_DTYPE_F32, rows) : absent_tensor;
    const moex_tensor dxf = p->dx ? moex_tensor_2d(l->dxf, MOEX_DTYPE_F32, d->T, d->H) : absent_tensor;
    c->dprobs = moex_tensor_2d(l->dprobs, MOEX_DTYPE_F32, d->T, d->k);
    c->unpermute = (moex_unpermute_grad_args){.row_map = v->row_map, .dy = a->dy, .dyp = dyp};
    c->mlp = moex_moe_mlp_grad_args(a, &v->p, dyp, dxp, dprobs_p);
    c->permute = (moex_permute_grad_args){.row_map = v->row_map, .dxp = dxp, .dprobs_p = dprobs_p, .dx = dxf,
                                          .dprobs = c->dprobs};
}

static bwd_layout bwd_layout_of(moex_context *ctx, const moex_moe_layer_grad_args *a, const moex_moe_dims *d,
                                void *ws) {
    const moex_backend_ops *ops = moex_ops(ctx);
    const bwd_plan p = bwd_plan_of(a);
    const int64_t rows = d->T * d->k;
    const size_t es = moex_dtype_size(d->dt);
    moex_carver k = {(char *)ws, 0};
    bwd_layout l;
    l.dyp = moex_take(&k, moex_sz_bytes(rows, d->H, es));
    l.dprobs_p = p.router ? moex_take(&k, moex_sz_bytes(rows, 1, sizeof(float))) : NULL;
    l.dprobs = p.router ? moex_take(&k, moex_sz_bytes(rows, 1, sizeof(float))) : NULL;
    l.dxf = p.dx ? moex_take(&k, moex_sz_bytes(d->T, d->H, sizeof(float))) : NULL;

    saved_views v;
    saved_layout(d, NULL, &v);
    bwd_calls c;
    bwd_calls_of(a, d, &p, &v, &l, &c);
    const moex_perm_dims pd = perm_dims(d, 0);
    const moex_mlp_dims md = mlp_dims(d);
    size_t sub = ops->unpermute_bwd_ws(ctx, &c.unpermute, &pd);
    sub = moex_sz_max(sub, moex_op_grouped_mlp_backward_ws(ctx, &c.mlp, &md));
    if (p.router) {
        sub = moex_sz_max(sub, ops->permute_bwd_ws(ctx, &c.permute, &pd));
        sub = moex_sz_max(sub, moex_moe_router_backward_ws(ctx, a, d));
    }
    l.sub = moex_take(&k, sub);
    l.total = k.used;
    return l;
}

size_t moex_op_moe_layer_backward_ws(moex_context *ctx, const moex_moe_layer_grad_args *a, const moex_moe_dims *d) {
    return bwd_layout_of(ctx, a, d, NULL).total;
}

moex_status moex_op_moe_layer_backward_run(moex_context *ctx, const moex_call *c, const moex_moe_layer_grad_args *a,
                                           const moex_moe_dims *d, void *ws) {
    const moex_backend_ops *ops = moex_ops(ctx);
    const moex_moe_layer_args *f = &a->fwd;
    const bwd_plan p = bwd_plan_of(a);
    saved_views v;
    saved_layout(d, d->saved, &v);
    if (ops->host_memory) MOEX_TRY(check_saved(ctx, c->op, f, d, &v));
    MOEX_TRY(moex_check_limits(ctx, c, d->T * d->k, d->E, d->E));   /* before any launch */
    const bwd_layout l = bwd_layout_of(ctx, a, d, ws);
    bwd_calls k;
    bwd_calls_of(a, d, &p, &v, &l, &k);
    const moex_perm_dims pd = perm_dims(d, 0);
    const moex_mlp_dims md = mlp_dims(d);

    MOEX_TRY(ops->unpermute_bwd(ctx, c, &k.unpermute, &pd, l.sub));
    if (p.router) MOEX_TRY(ops->zero_f32(ctx, c, (float *)l.dprobs_p, d->T * d->k));   /* the MLP does += */
    MOEX_TRY(moex_op_grouped_mlp_backward_run(ctx, c, &k.mlp, &md, l.sub));
    if (!p.router) return MOEX_OK;

    MOEX_TRY(ops->permute_bwd(ctx, c, &k.permute, &pd, l.sub));
    return moex_moe_router_backward(ctx, c, a, d, &v.io, &k.dprobs, (float *)l.dxf, l.sub);
}
