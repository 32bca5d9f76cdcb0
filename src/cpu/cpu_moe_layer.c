/*
 * cpu_moe_layer.c - the CPU MoE layer, forward and backward, composed from the CPU router,
 * permute, grouped MLP and unpermute, plus two GEMMs for the router's linear layer.
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
 * The router path (dprobs, dlogits) runs only when dx or drouter_w is asked for.
 *
 * The saved buffer (aligned by the core) starts with a header naming the forward's shapes
 * and routing options; the backward checks it, and the routing ids, row_map and splits it
 * holds, before it writes anything, so that a saved buffer from another layer (or none)
 * fails cleanly. Every region of `saved` and of the workspace is aligned to MOEX_WS_ALIGN.
 */
#include "cpu_convert.h"
#include "cpu_gemm.h"
#include "cpu_ops.h"
#include "validate.h"

#include <string.h>

#define SAVED_MAGIC 0x314c454f4d78656dULL   /* "mexMOEL1" */

/* What the forward stored, so that the backward can check it was given the same layer. */
typedef struct saved_header {
    uint64_t magic;
    int64_t T, H, E, F, k;
    int32_t dt, score, norm, pad;
} saved_header;

static void *at(void *base, size_t off) { return base ? (char *)base + off : NULL; }

static const moex_tensor absent_tensor;

/* ---- the saved buffer ---------------------------------------------------------------- */

typedef struct saved_layout {
    size_t header, logits, probs, ids, splits, row_map, probs_p, xp, h, z, total;
} saved_layout;

static saved_layout saved_layout_of(const moex_moe_dims *d) {
    const int64_t rows = d->T * d->k;   /* validated: fits an int32 */
    const size_t es = moex_dtype_size(d->dt);
    saved_layout l;
    size_t pos = 0;
    l.header = moex_sz_take(&pos, sizeof(saved_header));
    l.logits = moex_sz_take(&pos, moex_sz_bytes(d->T, d->E, sizeof(float)));
    l.probs = moex_sz_take(&pos, moex_sz_bytes(rows, 1, sizeof(float)));
    l.ids = moex_sz_take(&pos, moex_sz_bytes(rows, 1, sizeof(int32_t)));
    l.splits = moex_sz_take(&pos, moex_sz_bytes(d->E, 1, sizeof(int64_t)));
    l.row_map = moex_sz_take(&pos, moex_sz_bytes(rows, 1, sizeof(int32_t)));
    l.probs_p = moex_sz_take(&pos, moex_sz_bytes(rows, 1, sizeof(float)));
    l.xp = moex_sz_take(&pos, moex_sz_bytes(rows, d->H, es));
    l.h = moex_sz_take(&pos, moex_sz_bytes(rows, 2 * d->F, es));
    l.z = moex_sz_take(&pos, moex_sz_bytes(rows, d->F, es));
    l.total = pos;
    return l;
}

size_t moex_cpu_moe_layer_saved(moex_context *ctx, const moex_moe_layer_args *a, const moex_moe_dims *d) {
    return saved_layout_of(d).total;
}

/* The saved tensors as views (data NULL when `saved` is NULL: shapes only). */
typedef struct saved_views {
    moex_tensor logits, probs, ids, splits, row_map, probs_p, xp, h, z;
} saved_views;

static saved_views saved_views_of(void *saved, const moex_moe_dims *d) {
    const saved_layout l = saved_layout_of(d);
    const int64_t rows = d->T * d->k;
    saved_views v;
    v.logits = moex_tensor_2d(at(saved, l.logits), MOEX_DTYPE_F32, d->T, d->E);
    v.probs = moex_tensor_2d(at(saved, l.probs), MOEX_DTYPE_F32, d->T, d->k);
    v.ids = moex_tensor_2d(at(saved, l.ids), MOEX_DTYPE_I32, d->T, d->k);
    v.splits = moex_tensor_1d(at(saved, l.splits), MOEX_DTYPE_I64, d->E);
    v.row_map = moex_tensor_1d(at(saved, l.row_map), MOEX_DTYPE_I32, rows);
    v.probs_p = moex_tensor_1d(at(saved, l.probs_p), MOEX_DTYPE_F32, rows);
    v.xp = moex_tensor_2d(at(saved, l.xp), d->dt, rows, d->H);
    v.h = moex_tensor_2d(at(saved, l.h), d->dt, rows, 2 * d->F);
    v.z = moex_tensor_2d(at(saved, l.z), d->dt, rows, d->F);
    return v;
}

static saved_header header_of(const moex_moe_layer_args *a, const moex_moe_dims *d) {
    saved_header h;
    memset(&h, 0, sizeof h);
    h.magic = SAVED_MAGIC;
    h.T = d->T, h.H = d->H, h.E = d->E, h.F = d->F, h.k = d->k;
    h.dt = (int32_t)d->dt, h.score = (int32_t)a->score, h.norm = (int32_t)a->norm;
    return h;
}

/* ---- dims of the sub-operations -------------------------------------------------------- */

static moex_router_dims router_dims(const moex_moe_dims *d) {
    moex_router_dims r = {d->T, d->E, d->k, MOEX_DTYPE_F32};
    return r;
}

static moex_perm_dims perm_dims(const moex_moe_dims *d, int64_t E) {
    moex_perm_dims p = {d->T, d->H, d->k, E, d->dt};
    return p;
}

static moex_mlp_dims mlp_dims(const moex_moe_dims *d) {
    moex_mlp_dims m = {d->E, d->T * d->k, d->H, d->F, d->dt};
    return m;
}

/* Copies f32 rows into the output dtype, in parallel over rows. */
typedef struct store_job {
    const float *src;
    void *dst;
    moex_dtype dt;
    int64_t cols;
} store_job;

static void store_rows(void *arg, int64_t begin, int64_t end) {
    const store_job *jb = (const store_job *)arg;
    moex_cpu_store_f32(moex_cpu_at(jb->dst, jb->dt, begin * jb->cols), jb->dt, jb->src + begin * jb->cols,
                       (end - begin) * jb->cols);
}

static void store_f32_rows(moex_context *ctx, void *dst, moex_dtype dt, const float *src, int64_t rows,
                           int64_t cols) {
    store_job jb = {src, dst, dt, cols};
    int64_t grain = 16384 / cols;
    moex_cpu_parallel_for(ctx, rows, grain < 1 ? 1 : grain, store_rows, &jb);
}

/* ---- forward ------------------------------------------------------------------------- */

typedef struct fwd_calls {
    moex_router_args router;
    moex_permute_args permute;
    moex_grouped_mlp_args mlp;
    moex_unpermute_args unpermute;
} fwd_calls;

/* The sub-operations' arguments, given the saved views and yp (NULL data: shapes only). */
static void fwd_calls_of(const moex_moe_layer_args *a, const moex_moe_dims *d, const saved_views *v, void *yp,
                         fwd_calls *c) {
    const moex_tensor ypt = moex_tensor_2d(yp, d->dt, d->T * d->k, d->H);
    c->router = (moex_router_args){.logits = v->logits, .topk = a->topk, .score = a->score, .norm = a->norm,
                                   .probs = v->probs, .ids = v->ids};
    c->permute = (moex_permute_args){.x = a->x, .ids = v->ids, .probs = v->probs, .num_experts = (int32_t)d->E,
                                     .xp = v->xp, .probs_p = v->probs_p, .splits = v->splits,
                                     .row_map = v->row_map};
    c->mlp = (moex_grouped_mlp_args){.x = v->xp, .w1 = a->w1, .b1 = a->b1, .w2 = a->w2, .b2_mode = a->b2_mode,
                                     .b2 = a->b2, .probs = v->probs_p, .glu = a->glu, .splits = v->splits,
                                     .h = v->h, .z = v->z, .y = ypt};
    c->unpermute = (moex_unpermute_args){.row_map = v->row_map, .yp = ypt, .y = a->y};
}

typedef struct fwd_ws {
    size_t yp, sub, sub_bytes, total;
} fwd_ws;

static fwd_ws fwd_ws_of(moex_context *ctx, const moex_moe_layer_args *a, const moex_moe_dims *d) {
    const saved_views v = saved_views_of(NULL, d);
    fwd_calls c;
    fwd_calls_of(a, d, &v, NULL, &c);
    const moex_router_dims rd = router_dims(d);
    const moex_perm_dims pd = perm_dims(d, d->E), ud = perm_dims(d, 0);
    const moex_mlp_dims md = mlp_dims(d);
    size_t sub = moex_cpu_gemm_scratch_bytes(d->T, d->E, d->H, d->dt, d->dt);
    sub = moex_sz_max(sub, moex_cpu_router_forward_ws(ctx, &c.router, &rd));
    sub = moex_sz_max(sub, moex_cpu_permute_forward_ws(ctx, &c.permute, &pd));
    sub = moex_sz_max(sub, moex_cpu_grouped_mlp_forward_ws(ctx, &c.mlp, &md));
    sub = moex_sz_max(sub, moex_cpu_unpermute_forward_ws(ctx, &c.unpermute, &ud));
    fwd_ws l;
    size_t pos = 0;
    l.yp = moex_sz_take(&pos, moex_sz_bytes(d->T * d->k, d->H, moex_dtype_size(d->dt)));
    l.sub = moex_sz_take(&pos, sub);
    l.sub_bytes = sub;
    l.total = pos;
    return l;
}

size_t moex_cpu_moe_layer_forward_ws(moex_context *ctx, const moex_moe_layer_args *a, const moex_moe_dims *d) {
    return fwd_ws_of(ctx, a, d).total;
}

moex_status moex_cpu_moe_layer_forward(moex_context *ctx, const moex_moe_layer_args *a, const moex_moe_dims *d,
                                       void *ws, size_t ws_bytes, moex_stream stream) {
    const fwd_ws l = fwd_ws_of(ctx, a, d);
    const saved_views v = saved_views_of(a->saved, d);
    fwd_calls c;
    fwd_calls_of(a, d, &v, at(ws, l.yp), &c);
    const moex_router_dims rd = router_dims(d);
    const moex_perm_dims pd = perm_dims(d, d->E), ud = perm_dims(d, 0);
    const moex_mlp_dims md = mlp_dims(d);
    void *sub = at(ws, l.sub);

    /* Mark the buffer as not holding a forward until this one has finished. */
    memset(a->saved, 0, sizeof(saved_header));

    /* logits = x Wr^T */
    moex_cpu_gemm(ctx, d->T, d->E, d->H, moex_cpu_matrix_of(a->x.data, d->dt, d->H, MOEX_CPU_NOTRANS),
                  moex_cpu_matrix_of(a->router_w.data, d->dt, d->H, MOEX_CPU_TRANS), (float *)v.logits.data, d->E,
                  MOEX_CPU_GEMM_WRITE, sub);
    MOEX_TRY(moex_cpu_router_forward(ctx, &c.router, &rd, sub, l.sub_bytes, stream));
    MOEX_TRY(moex_cpu_permute_forward(ctx, &c.permute, &pd, sub, l.sub_bytes, stream));
    MOEX_TRY(moex_cpu_grouped_mlp_forward(ctx, &c.mlp, &md, sub, l.sub_bytes, stream));
    MOEX_TRY(moex_cpu_unpermute_forward(ctx, &c.unpermute, &ud, sub, l.sub_bytes, stream));

    const saved_header h = header_of(a, d);
    memcpy(a->saved, &h, sizeof h);
    return MOEX_OK;
}

/* ---- backward ------------------------------------------------------------------------ */

/* Which parts of the backward run. */
typedef struct bwd_plan {
    bool dx;        /* dx asked */
    bool router;    /* the router path: dprobs, dlogits (dx or drouter_w asked) */
    bool drw_tmp;   /* drouter_w is not f32: its GEMM goes through an f32 buffer */
} bwd_plan;

static bwd_plan bwd_plan_of(const moex_moe_layer_grad_args *a) {
    bwd_plan p;
    p.dx = moex_present(&a->dx);
    p.router = p.dx || moex_present(&a->drouter_w);
    p.drw_tmp = moex_present(&a->drouter_w) && a->drouter_w.dtype != MOEX_DTYPE_F32;
    return p;
}

typedef struct bwd_calls {
    moex_unpermute_grad_args unpermute;
    moex_grouped_mlp_grad_args mlp;
    moex_permute_grad_args permute;
    moex_router_grad_args router;
} bwd_calls;

typedef struct bwd_ws {
    size_t dyp, dxp, dprobs_p, dprobs, dlogits, dxf, drw, sub, sub_bytes, total;
} bwd_ws;

/* The sub-operations' arguments, given the saved views and the workspace (NULL: shapes only). */
static void bwd_calls_of(const moex_moe_layer_grad_args *a, const moex_moe_dims *d, const bwd_plan *p,
                         const saved_views *v, const bwd_ws *l, void *ws, bwd_calls *c) {
    const moex_moe_layer_args *f = &a->fwd;
    const int64_t rows = d->T * d->k;
    const moex_tensor dyp = moex_tensor_2d(at(ws, l->dyp), d->dt, rows, d->H);
    const moex_tensor dxp = p->dx ? moex_tensor_2d(at(ws, l->dxp), d->dt, rows, d->H) : absent_tensor;
    const moex_tensor dprobs_p = p->router ? moex_tensor_1d(at(ws, l->dprobs_p), MOEX_DTYPE_F32, rows)
                                           : absent_tensor;
    const moex_tensor dprobs = moex_tensor_2d(at(ws, l->dprobs), MOEX_DTYPE_F32, d->T, d->k);
    const moex_tensor dxf = p->dx ? moex_tensor_2d(at(ws, l->dxf), MOEX_DTYPE_F32, d->T, d->H) : absent_tensor;
    c->unpermute = (moex_unpermute_grad_args){.row_map = v->row_map, .dy = a->dy, .dyp = dyp};
    c->mlp = (moex_grouped_mlp_grad_args){
        .x = v->xp, .w1 = f->w1, .w2 = f->w2, .b2_mode = f->b2_mode, .b2 = f->b2, .probs = v->probs_p,
        .glu = f->glu, .splits = v->splits, .h = v->h, .z = v->z, .dy = dyp, .dx = dxp, .dw_mode = a->dw_mode,
        .dw1 = a->dw1, .dw2 = a->dw2, .db1 = a->db1,
        .db2 = f->b2_mode != MOEX_BIAS_NONE ? a->db2 : absent_tensor, .dprobs = dprobs_p};
    c->permute = (moex_permute_grad_args){.row_map = v->row_map, .dxp = dxp, .dprobs_p = dprobs_p, .dx = dxf,
                                          .dprobs = dprobs};
    c->router = (moex_router_grad_args){.logits = v->logits, .topk = f->topk, .score = f->score,
                                        .norm = f->norm, .ids = v->ids, .dprobs = dprobs,
                                        .dlogits = moex_tensor_2d(at(ws, l->dlogits), MOEX_DTYPE_F32, d->T, d->E)};
}

static bwd_ws bwd_ws_of(moex_context *ctx, const moex_moe_layer_grad_args *a, const moex_moe_dims *d) {
    const bwd_plan p = bwd_plan_of(a);
    const int64_t rows = d->T * d->k;
    const size_t es = moex_dtype_size(d->dt);
    bwd_ws l;
    size_t pos = 0;
    l.dyp = moex_sz_take(&pos, moex_sz_bytes(rows, d->H, es));
    l.dxp = moex_sz_take(&pos, p.dx ? moex_sz_bytes(rows, d->H, es) : 0);
    l.dprobs_p = moex_sz_take(&pos, p.router ? moex_sz_bytes(rows, 1, sizeof(float)) : 0);
    l.dprobs = moex_sz_take(&pos, p.router ? moex_sz_bytes(rows, 1, sizeof(float)) : 0);
    l.dlogits = moex_sz_take(&pos, p.router ? moex_sz_bytes(d->T, d->E, sizeof(float)) : 0);
    l.dxf = moex_sz_take(&pos, p.dx ? moex_sz_bytes(d->T, d->H, sizeof(float)) : 0);
    l.drw = moex_sz_take(&pos, p.drw_tmp ? moex_sz_bytes(d->E, d->H, sizeof(float)) : 0);

    const saved_views v = saved_views_of(NULL, d);
    bwd_calls c;
    bwd_calls_of(a, d, &p, &v, &l, NULL, &c);
    const moex_router_dims rd = router_dims(d);
    const moex_perm_dims pd = perm_dims(d, 0);
    const moex_mlp_dims md = mlp_dims(d);
    size_t sub = moex_cpu_unpermute_backward_ws(ctx, &c.unpermute, &pd);
    sub = moex_sz_max(sub, moex_cpu_grouped_mlp_backward_ws(ctx, &c.mlp, &md));
    if (p.router) {
        sub = moex_sz_max(sub, moex_cpu_permute_backward_ws(ctx, &c.permute, &pd));
        sub = moex_sz_max(sub, moex_cpu_router_backward_ws(ctx, &c.router, &rd));
        /* dRw = dlogits^T x and dx += dlogits Wr */
        sub = moex_sz_max(sub, moex_cpu_gemm_scratch_bytes(d->E, d->H, d->T, MOEX_DTYPE_F32, d->dt));
        sub = moex_sz_max(sub, moex_cpu_gemm_scratch_bytes(d->T, d->H, d->E, MOEX_DTYPE_F32, d->dt));
    }
    l.sub = moex_sz_take(&pos, sub);
    l.sub_bytes = sub;
    l.total = pos;
    return l;
}

size_t moex_cpu_moe_layer_backward_ws(moex_context *ctx, const moex_moe_layer_grad_args *a,
                                      const moex_moe_dims *d) {
    return bwd_ws_of(ctx, a, d).total;
}

/* Checks that `saved` holds a forward of this layer: the header, then the routing it
 * stored (ids, row_map and splits), so that no sub-operation can fail after a write. */
static moex_status check_saved(moex_context *ctx, const moex_moe_layer_args *f, const moex_moe_dims *d,
                               const saved_views *v) {
    static const char op[] = "moex_moe_layer_backward";
    saved_header want = header_of(f, d), got;
    memcpy(&got, f->saved, sizeof got);
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
    const int32_t *ids = (const int32_t *)v->ids.data, *rm = (const int32_t *)v->row_map.data;
    const int64_t *splits = (const int64_t *)v->splits.data;
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

moex_status moex_cpu_moe_layer_backward(moex_context *ctx, const moex_moe_layer_grad_args *a,
                                        const moex_moe_dims *d, void *ws, size_t ws_bytes, moex_stream stream) {
    const moex_moe_layer_args *f = &a->fwd;
    const bwd_plan p = bwd_plan_of(a);
    const bwd_ws l = bwd_ws_of(ctx, a, d);
    const saved_views v = saved_views_of(f->saved, d);
    MOEX_TRY(check_saved(ctx, f, d, &v));

    bwd_calls c;
    bwd_calls_of(a, d, &p, &v, &l, ws, &c);
    const moex_router_dims rd = router_dims(d);
    const moex_perm_dims pd = perm_dims(d, 0);
    const moex_mlp_dims md = mlp_dims(d);
    void *sub = at(ws, l.sub);
    const size_t sb = l.sub_bytes;

    MOEX_TRY(moex_cpu_unpermute_backward(ctx, &c.unpermute, &pd, sub, sb, stream));
    if (p.router) memset(c.mlp.dprobs.data, 0, (size_t)(d->T * d->k) * sizeof(float));   /* dprobs_p += */
    MOEX_TRY(moex_cpu_grouped_mlp_backward(ctx, &c.mlp, &md, sub, sb, stream));
    if (!p.router) return MOEX_OK;

    MOEX_TRY(moex_cpu_permute_backward(ctx, &c.permute, &pd, sub, sb, stream));
    MOEX_TRY(moex_cpu_router_backward(ctx, &c.router, &rd, sub, sb, stream));
    const float *dlogits = (const float *)c.router.dlogits.data;

    if (moex_present(&a->drouter_w)) {   /* dRw = dlogits^T x */
        float *drw = p.drw_tmp ? (float *)at(ws, l.drw) : (float *)a->drouter_w.data;
        moex_cpu_gemm(ctx, d->E, d->H, d->T, moex_cpu_matrix_of(dlogits, MOEX_DTYPE_F32, d->E, MOEX_CPU_TRANS),
                      moex_cpu_matrix_of(f->x.data, d->dt, d->H, MOEX_CPU_NOTRANS), drw, d->H,
                      a->dw_mode == MOEX_GRAD_ACCUMULATE ? MOEX_CPU_GEMM_ACCUMULATE : MOEX_CPU_GEMM_WRITE, sub);
        if (p.drw_tmp) store_f32_rows(ctx, a->drouter_w.data, a->drouter_w.dtype, drw, d->E, d->H);
    }
    if (p.dx) {   /* dx = dx_perm + dlogits Wr */
        float *dxf = (float *)c.permute.dx.data;
        moex_cpu_gemm(ctx, d->T, d->H, d->E, moex_cpu_matrix_of(dlogits, MOEX_DTYPE_F32, d->E, MOEX_CPU_NOTRANS),
                      moex_cpu_matrix_of(f->router_w.data, d->dt, d->H, MOEX_CPU_NOTRANS), dxf, d->H,
                      MOEX_CPU_GEMM_ACCUMULATE, sub);
        store_f32_rows(ctx, a->dx.data, d->dt, dxf, d->T, d->H);
    }
    return MOEX_OK;
}
