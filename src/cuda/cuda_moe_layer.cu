/*
 * cuda_moe_layer.cu - the MoE layer on the GPU, composed from the router, permute, grouped
 * MLP and unpermute operations plus two GEMMs for the router's linear layer (the grouped
 * GEMM with one group of all T rows). Same math as src/cpu/cpu_moe_layer.c:
 *
 * forward:   logits = x Wr^T                    [T, E] f32   (saved)
 *            probs, ids = router(logits)        [T, k]       (saved)
 *            xp, probs_p, splits, row_map = permute(x, ids, probs)   (saved; splits on the device)
 *            yp = grouped_mlp(xp, probs_p, splits)   (h, z saved; yp in the workspace)
 *            y = unpermute(yp)                  [T, H]       =
 * backward:  dyp = unpermute_backward(dy)
 *            dxp, dprobs_p, dW1, dW2, db1, db2 = grouped_mlp_backward(dyp)
 *            dx_perm (f32), dprobs = permute_backward(dxp, dprobs_p)
 *            dlogits = router_backward(dprobs)  [T, E] f32
 *            dRw = dlogits^T x (= or +=),  dx = dx_perm + dlogits Wr (rounded once)
 * The router GEMMs run in the activation dtype's tensor-core path (dlogits is rounded to
 * it on the way into the GEMM) and in exact f32 for f32 layers.
 *
 * `saved` lives in device memory and is laid out below; unlike the CPU backend, the GPU
 * backward cannot check a header there without a synchronisation, so it trusts `saved` to
 * hold this layer's forward; corrupt routing in it is skipped and flagged by the kernels.
 */
#include "cuda_ops.h"

static const moex_tensor absent_tensor = {};

typedef struct saved_views {
    float *logits, *probs, *probs_p;
    int32_t *ids, *row_map;
    int64_t *splits;
    void *xp, *h, *z;
} saved_views;

static size_t saved_layout(const moex_moe_dims *d, char *base, saved_views *v) {
    moex_cuda_carver c = {base, 0};
    const int64_t rows = d->T * d->k;   /* validated: fits an int32 */
    const size_t es = moex_dtype_size(d->dt);
    v->logits = (float *)moex_cuda_take(&c, moex_sz_bytes(d->T, d->E, sizeof(float)));
    v->probs = (float *)moex_cuda_take(&c, rows * sizeof(float));
    v->ids = (int32_t *)moex_cuda_take(&c, rows * sizeof(int32_t));
    v->splits = (int64_t *)moex_cuda_take(&c, moex_sz_bytes(d->E, 1, sizeof(int64_t)));
    v->row_map = (int32_t *)moex_cuda_take(&c, rows * sizeof(int32_t));
    v->probs_p = (float *)moex_cuda_take(&c, rows * sizeof(float));
    v->xp = moex_cuda_take(&c, moex_sz_bytes(rows, d->H, es));
    v->h = moex_cuda_take(&c, moex_sz_bytes(rows, 2 * d->F, es));
    v->z = moex_cuda_take(&c, moex_sz_bytes(rows, d->F, es));
    return c.used;
}

extern "C" size_t moex_cuda_moe_layer_saved(moex_context *ctx, const moex_moe_layer_args *a, const moex_moe_dims *d) {
    saved_views v;
    return saved_layout(d, NULL, &v);
}

static moex_mlp_dims mlp_dims(const moex_moe_dims *d) {
    moex_mlp_dims m = {d->E, d->T * d->k, d->H, d->F, d->dt};
    return m;
}

static moex_tensor t2(void *p, moex_dtype dt, int64_t a, int64_t b) { return moex_tensor_2d(p, dt, a, b); }
static moex_tensor t1(void *p, moex_dtype dt, int64_t a) { return moex_tensor_1d(p, dt, a); }

/* The grouped MLP's arguments over the saved tensors (yp: its output, NULL for sizes). */
static moex_grouped_mlp_args mlp_args(const moex_moe_layer_args *a, const moex_moe_dims *d, const saved_views *v,
                                      void *yp) {
    const int64_t rows = d->T * d->k;
    moex_grouped_mlp_args m = {};
    m.x = t2(v->xp, d->dt, rows, d->H);
    m.w1 = a->w1;
    m.b1 = a->b1;
    m.w2 = a->w2;
    m.b2_mode = a->b2_mode;
    m.b2 = a->b2;
    m.probs = t1(v->probs_p, MOEX_DTYPE_F32, rows);
    m.glu = a->glu;
    m.splits = t1(v->splits, MOEX_DTYPE_I64, d->E);
    m.h = t2(v->h, d->dt, rows, 2 * d->F);
    m.z = t2(v->z, d->dt, rows, d->F);
    m.y = t2(yp, d->dt, rows, d->H);
    return m;
}

/* The router's GEMMs over one group of all T rows. */
static moex_cuda_gemm router_gemm(const moex_cuda_sched *s, moex_dtype dt) {
    moex_cuda_gemm g = {};
    g.sched = s;
    g.tc = dt;
    g.tb = dt;
    return g;
}

/* ---- forward ------------------------------------------------------------------------ */

typedef struct fwd_bufs {
    moex_cuda_sched s1;         /* one group of T rows */
    void *yp;
    void *sub;
    size_t sub_bytes;
} fwd_bufs;

static size_t fwd_layout(moex_context *ctx, const moex_moe_layer_args *a, const moex_moe_dims *d, char *base,
                         fwd_bufs *b) {
    moex_cuda_carver c = {base, 0};
    moex_cuda_sched_take(&c, &b->s1, 1, d->T);
    b->yp = moex_cuda_take(&c, moex_sz_bytes(d->T * d->k, d->H, moex_dtype_size(d->dt)));
    saved_views v = {};
    moex_grouped_mlp_args m = mlp_args(a, d, &v, NULL);
    moex_mlp_dims md = mlp_dims(d);
    size_t sub = moex_cuda_grouped_mlp_forward_ws(ctx, &m, &md);
    size_t perm = moex_cuda_permute_ws(d->T, d->k, d->E);
    if (perm > sub) sub = perm;
    b->sub_bytes = sub;
    b->sub = moex_cuda_take(&c, sub);
    return c.used;
}

extern "C" size_t moex_cuda_moe_layer_forward_ws(moex_context *ctx, const moex_moe_layer_args *a,
                                                 const moex_moe_dims *d) {
    fwd_bufs b;
    return fwd_layout(ctx, a, d, NULL, &b);
}

static moex_status fwd_run(moex_context *ctx, const moex_moe_layer_args *a, const moex_moe_dims *d, void *ws,
                           cudaStream_t stream) {
    const char *op = "moex_moe_layer_forward";
    MOEX_TRY(moex_cuda_check_moe(ctx, op, d->T, d->k, d->E));
    fwd_bufs b;
    fwd_layout(ctx, a, d, (char *)ws, &b);
    saved_views v;
    saved_layout(d, (char *)a->saved, &v);

    /* logits = x Wr^T (f32) */
    MOEX_TRY(moex_cuda_sched_build(ctx, op, MOEX_CUDA_OP_MOE_FORWARD, &b.s1, NULL, stream));
    moex_cuda_gemm g = router_gemm(&b.s1, d->dt);
    g.kind = MOEX_CUDA_GEMM_ROWS;
    g.ta = d->dt;
    g.to = MOEX_DTYPE_F32;
    g.n_dim = d->E;
    g.k_dim = d->H;
    g.a = a->x.data;
    g.lda = d->H;
    g.b = a->router_w.data;
    g.ldb = d->H;
    g.b_kc = 1;
    g.c = v.logits;
    g.ldc = d->E;
    MOEX_TRY(moex_cuda_gemm_run(ctx, op, &g, stream));

    MOEX_TRY(moex_cuda_router_fwd_run(ctx, op, v.logits, MOEX_DTYPE_F32, d->T, d->E, d->k, a->score, a->norm,
                                      v.probs, v.ids, stream));
    MOEX_TRY(moex_cuda_permute_run(ctx, op, MOEX_CUDA_OP_MOE_FORWARD, a->x.data, d->dt, v.ids, v.probs, d->T, d->H,
                                   d->k, d->E, v.xp, v.probs_p, v.splits, v.row_map, b.sub, stream));
    moex_grouped_mlp_args m = mlp_args(a, d, &v, b.yp);
    moex_mlp_dims md = mlp_dims(d);
    MOEX_TRY(moex_cuda_grouped_mlp_forward(ctx, &m, &md, b.sub, b.sub_bytes, stream));
    return moex_cuda_unpermute_run(ctx, op, v.row_map, b.yp, d->dt, d->T, d->H, d->k, a->y.data, stream);
}

extern "C" moex_status moex_cuda_moe_layer_forward(moex_context *ctx, const moex_moe_layer_args *a,
                                                   const moex_moe_dims *d, void *ws, size_t ws_bytes,
                                                   moex_stream stream) {
    MOEX_CUDA_GUARDED(ctx, "moex_moe_layer_forward", fwd_run(ctx, a, d, ws, (cudaStream_t)stream));
}

/* ---- backward ----------------------------------------------------------------------- */

typedef struct bwd_bufs {
    moex_cuda_sched s1;
    void *dyp, *dxp;
    float *dprobs_p, *dprobs, *dlogits, *dxf;
    void *sub;
    size_t sub_bytes;
} bwd_bufs;

static moex_grouped_mlp_grad_args mlp_grad_args(const moex_moe_layer_grad_args *a, const moex_moe_dims *d,
                                                const saved_views *v, const bwd_bufs *b) {
    const moex_moe_layer_args *f = &a->fwd;
    const int64_t rows = d->T * d->k;
    const bool dx = moex_present(&a->dx), router = dx || moex_present(&a->drouter_w);
    moex_grouped_mlp_grad_args m = {};
    m.x = t2(v->xp, d->dt, rows, d->H);
    m.w1 = f->w1;
    m.w2 = f->w2;
    m.b2_mode = f->b2_mode;
    m.b2 = f->b2;
    m.probs = t1(v->probs_p, MOEX_DTYPE_F32, rows);
    m.glu = f->glu;
    m.splits = t1(v->splits, MOEX_DTYPE_I64, d->E);
    m.h = t2(v->h, d->dt, rows, 2 * d->F);
    m.z = t2(v->z, d->dt, rows, d->F);
    m.dy = t2(b->dyp, d->dt, rows, d->H);
    m.dx = dx ? t2(b->dxp, d->dt, rows, d->H) : absent_tensor;
    m.dw_mode = a->dw_mode;
    m.dw1 = a->dw1;
    m.dw2 = a->dw2;
    m.db1 = a->db1;
    m.db2 = f->b2_mode != MOEX_BIAS_NONE ? a->db2 : absent_tensor;
    m.dprobs = router ? t1(b->dprobs_p, MOEX_DTYPE_F32, rows) : absent_tensor;
    return m;
}

static size_t bwd_layout(moex_context *ctx, const moex_moe_layer_grad_args *a, const moex_moe_dims *d, char *base,
                         bwd_bufs *b) {
    moex_cuda_carver c = {base, 0};
    const int64_t rows = d->T * d->k;
    const size_t es = moex_dtype_size(d->dt);
    const bool dx = moex_present(&a->dx), router = dx || moex_present(&a->drouter_w);
    moex_cuda_sched_take(&c, &b->s1, 1, d->T);
    b->dyp = moex_cuda_take(&c, moex_sz_bytes(rows, d->H, es));
    b->dxp = dx ? moex_cuda_take(&c, moex_sz_bytes(rows, d->H, es)) : NULL;
    b->dprobs_p = router ? (float *)moex_cuda_take(&c, rows * sizeof(float)) : NULL;
    b->dprobs = router ? (float *)moex_cuda_take(&c, rows * sizeof(float)) : NULL;
    b->dlogits = router ? (float *)moex_cuda_take(&c, moex_sz_bytes(d->T, d->E, sizeof(float))) : NULL;
    b->dxf = dx ? (float *)moex_cuda_take(&c, moex_sz_bytes(d->T, d->H, sizeof(float))) : NULL;
    saved_views v = {};
    moex_grouped_mlp_grad_args m = mlp_grad_args(a, d, &v, b);
    moex_mlp_dims md = mlp_dims(d);
    b->sub_bytes = moex_cuda_grouped_mlp_backward_ws(ctx, &m, &md);
    b->sub = moex_cuda_take(&c, b->sub_bytes);
    return c.used;
}

extern "C" size_t moex_cuda_moe_layer_backward_ws(moex_context *ctx, const moex_moe_layer_grad_args *a,
                                                  const moex_moe_dims *d) {
    bwd_bufs b;
    return bwd_layout(ctx, a, d, NULL, &b);
}

static moex_status bwd_run(moex_context *ctx, const moex_moe_layer_grad_args *a, const moex_moe_dims *d, void *ws,
                           cudaStream_t stream) {
    const char *op = "moex_moe_layer_backward";
    MOEX_TRY(moex_cuda_check_moe(ctx, op, d->T, d->k, d->E));
    const moex_moe_layer_args *f = &a->fwd;
    const bool dx = moex_present(&a->dx), router = dx || moex_present(&a->drouter_w);
    const int64_t rows = d->T * d->k;
    bwd_bufs b;
    bwd_layout(ctx, a, d, (char *)ws, &b);
    saved_views v;
    saved_layout(d, (char *)f->saved, &v);

    MOEX_TRY(moex_cuda_unpermute_bwd_run(ctx, op, v.row_map, a->dy.data, d->dt, d->T, d->H, d->k, b.dyp, rows,
                                         stream));
    if (router) MOEX_TRY(moex_cuda_zero_f32(ctx, op, b.dprobs_p, rows, stream));   /* the MLP does += */
    moex_grouped_mlp_grad_args m = mlp_grad_args(a, d, &v, &b);
    moex_mlp_dims md = mlp_dims(d);
    MOEX_TRY(moex_cuda_grouped_mlp_backward(ctx, &m, &md, b.sub, b.sub_bytes, stream));
    if (!router) return MOEX_OK;

    MOEX_TRY(moex_cuda_permute_bwd_run(ctx, op, v.row_map, b.dxp, d->dt, b.dprobs_p, d->T, d->H, d->k, b.dxf,
                                       MOEX_DTYPE_F32, b.dprobs, stream));
    MOEX_TRY(moex_cuda_router_bwd_run(ctx, op, v.logits, MOEX_DTYPE_F32, d->T, d->E, d->k, f->score, f->norm, v.ids,
                                      b.dprobs, b.dlogits, stream));
    MOEX_TRY(moex_cuda_sched_build(ctx, op, MOEX_CUDA_OP_MOE_BACKWARD, &b.s1, NULL, stream));
    if (moex_present(&a->drouter_w)) {   /* dRw[e, h] = sum_t dlogits[t, e] x[t, h] */
        moex_cuda_gemm g = router_gemm(&b.s1, d->dt);
        g.kind = MOEX_CUDA_GEMM_WGRAD;
        g.ta = MOEX_DTYPE_F32;
        g.to = a->drouter_w.dtype;
        g.m_dim = d->E;
        g.n_dim = d->H;
        g.a = b.dlogits;
        g.lda = d->E;
        g.b = f->x.data;
        g.ldb = d->H;
        g.c = a->drouter_w.data;
        g.ldc = d->H;
        g.accumulate = a->dw_mode == MOEX_GRAD_ACCUMULATE;
        MOEX_TRY(moex_cuda_gemm_run(ctx, op, &g, stream));
    }
    if (dx) {   /* dx[t, h] = dx_perm[t, h] + sum_e dlogits[t, e] Wr[e, h] */
        moex_cuda_gemm g = router_gemm(&b.s1, d->dt);
        g.kind = MOEX_CUDA_GEMM_ROWS;
        g.ta = MOEX_DTYPE_F32;
        g.to = d->dt;
        g.n_dim = d->H;
        g.k_dim = d->E;
        g.a = b.dlogits;
        g.lda = d->E;
        g.b = f->router_w.data;
        g.ldb = d->H;
        g.b_kc = 0;
        g.c = a->dx.data;
        g.ldc = d->H;
        g.residual = b.dxf;
        g.ldr = d->H;
        MOEX_TRY(moex_cuda_gemm_run(ctx, op, &g, stream));
    }
    return MOEX_OK;
}

extern "C" moex_status moex_cuda_moe_layer_backward(moex_context *ctx, const moex_moe_layer_grad_args *a,
                                                    const moex_moe_dims *d, void *ws, size_t ws_bytes,
                                                    moex_stream stream) {
    MOEX_CUDA_GUARDED(ctx, "moex_moe_layer_backward", bwd_run(ctx, a, d, ws, (cudaStream_t)stream));
}
