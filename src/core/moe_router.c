/*
 * moe_router.c - the router steps of the MoE layers, written once for the MoE layer
 * (moe_layer.c) and the EP MoE layer (ep_layer.c); the math: docs/ops.md.
 *   forward:   logits = x Wr^T [T, E] f32 (the backend's dense GEMM), probs, ids = router(logits)
 *   backward:  dlogits = router_backward(dprobs) [T, E] f32, in the workspace;
 *              drouter_w = dlogits^T x (= or +=) when asked;
 *              dx = round(dxf + dlogits Wr) when asked (dxf: the f32 dx of the expert path)
 * Workspace (each query's bytes): the one-group handle of the GEMMs' T rows and one region
 * the steps share; the backward's starts with dlogits.
 */
#include "op.h"

static moex_router_dims router_dims(const moex_moe_dims *d) {
    moex_router_dims r = {d->T, d->E, d->k, MOEX_DTYPE_F32};
    return r;
}

moex_moe_router_io moex_moe_router_io_take(moex_carver *c, const moex_moe_dims *d) {
    moex_moe_router_io io;
    io.logits = moex_tensor_2d(moex_take(c, moex_sz_bytes(d->T, d->E, sizeof(float))), MOEX_DTYPE_F32, d->T, d->E);
    io.probs = moex_tensor_2d(moex_take(c, moex_sz_bytes(d->T, d->k, sizeof(float))), MOEX_DTYPE_F32, d->T, d->k);
    io.ids = moex_tensor_2d(moex_take(c, moex_sz_bytes(d->T, d->k, sizeof(int32_t))), MOEX_DTYPE_I32, d->T, d->k);
    return io;
}

/* ---- forward ------------------------------------------------------------------------- */

static void fwd_calls_of(const moex_moe_layer_args *a, const moex_moe_dims *d, const moex_moe_router_io *io,
                         moex_dense_gemm *logits, moex_router_args *router) {
    *logits = (moex_dense_gemm){.kind = MOEX_GEMM_NT, .M = d->T, .N = d->E, .K = d->H, .a = a->x.data,
                                .ta = d->dt, .b = a->router_w.data, .tb = d->dt, .c = io->logits.data,
                                .tc = MOEX_DTYPE_F32};
    *router = (moex_router_args){.logits = io->logits, .topk = a->topk, .score = a->score, .norm = a->norm,
                                 .probs = io->probs, .ids = io->ids};
}

typedef struct router_layout {
    void *dlogits, *rows, *sub;
    size_t total;
} router_layout;

static router_layout layout_of(moex_context *ctx, const moex_moe_dims *d, bool backward, size_t sub, void *ws) {
    moex_carver k = {(char *)ws, 0};
    router_layout l;
    l.dlogits = backward ? moex_take(&k, moex_sz_bytes(d->T, d->E, sizeof(float))) : NULL;
    l.rows = moex_take(&k, moex_ops(ctx)->groups_ws(ctx, 1, d->T, NULL));
    l.sub = moex_take(&k, sub);
    l.total = k.used;
    return l;
}

static size_t fwd_sub(moex_context *ctx, const moex_moe_layer_args *a, const moex_moe_dims *d) {
    const moex_backend_ops *ops = moex_ops(ctx);
    const moex_moe_router_io io = {0};
    moex_dense_gemm logits;
    moex_router_args router;
    fwd_calls_of(a, d, &io, &logits, &router);
    const moex_router_dims rd = router_dims(d);
    return moex_sz_max(ops->dense_gemm_ws(ctx, &logits), ops->router_fwd_ws(ctx, &router, &rd));
}

size_t moex_moe_router_forward_ws(moex_context *ctx, const moex_moe_layer_args *a, const moex_moe_dims *d) {
    return layout_of(ctx, d, false, fwd_sub(ctx, a, d), NULL).total;
}

moex_status moex_moe_router_forward(moex_context *ctx, const moex_call *c, const moex_moe_layer_args *a,
                                    const moex_moe_dims *d, const moex_moe_router_io *io, void *ws) {
    const moex_backend_ops *ops = moex_ops(ctx);
    const router_layout l = layout_of(ctx, d, false, fwd_sub(ctx, a, d), ws);
    moex_dense_gemm logits;
    moex_router_args router;
    fwd_calls_of(a, d, io, &logits, &router);
    const moex_router_dims rd = router_dims(d);
    moex_groups rows;
    MOEX_TRY(ops->groups_prepare(ctx, c, NULL, 1, d->T, NULL, l.rows, &rows));
    MOEX_TRY(ops->dense_gemm(ctx, c, &rows, &logits, l.sub));
    return ops->router_fwd(ctx, c, &router, &rd, l.sub);
}

/* ---- backward ------------------------------------------------------------------------ */

typedef struct bwd_calls {
    moex_router_grad_args router;
    moex_dense_gemm drouter_w;      /* dRw = dlogits^T x */
    moex_dense_gemm dx;             /* dx = dxf + dlogits Wr */
} bwd_calls;

static void bwd_calls_of(const moex_moe_layer_grad_args *a, const moex_moe_dims *d, const moex_moe_router_io *io,
                         const moex_tensor *dprobs, float *dxf, void *dlogits, bwd_calls *c) {
    const moex_moe_layer_args *f = &a->fwd;
    c->router = (moex_router_grad_args){.logits = io->logits, .topk = f->topk, .score = f->score,
                                        .norm = f->norm, .ids = io->ids, .dprobs = *dprobs,
                                        .dlogits = moex_tensor_2d(dlogits, MOEX_DTYPE_F32, d->T, d->E)};
    c->drouter_w = (moex_dense_gemm){.kind = MOEX_GEMM_TN, .M = d->E, .N = d->H, .K = d->T, .a = dlogits,
                                     .ta = MOEX_DTYPE_F32, .b = f->x.data, .tb = d->dt, .c = a->drouter_w.data,
                                     .tc = moex_present(&a->drouter_w) ? a->drouter_w.dtype : MOEX_DTYPE_F32,
                                     .mode = a->dw_mode};
    c->dx = (moex_dense_gemm){.kind = MOEX_GEMM_NN, .M = d->T, .N = d->H, .K = d->E, .a = dlogits,
                              .ta = MOEX_DTYPE_F32, .b = f->router_w.data, .tb = d->dt, .c = a->dx.data,
                              .tc = d->dt, .r = dxf};
}

static size_t bwd_sub(moex_context *ctx, const moex_moe_layer_grad_args *a, const moex_moe_dims *d) {
    const moex_backend_ops *ops = moex_ops(ctx);
    const moex_moe_router_io io = {0};
    const moex_tensor dprobs = moex_tensor_2d(NULL, MOEX_DTYPE_F32, d->T, d->k);
    bwd_calls c;
    bwd_calls_of(a, d, &io, &dprobs, NULL, NULL, &c);
    const moex_router_dims rd = router_dims(d);
    size_t sub = ops->router_bwd_ws(ctx, &c.router, &rd);
    if (moex_present(&a->drouter_w)) sub = moex_sz_max(sub, ops->dense_gemm_ws(ctx, &c.drouter_w));
    if (moex_present(&a->dx)) sub = moex_sz_max(sub, ops->dense_gemm_ws(ctx, &c.dx));
    return sub;
}

size_t moex_moe_router_backward_ws(moex_context *ctx, const moex_moe_layer_grad_args *a, const moex_moe_dims *d) {
    return layout_of(ctx, d, true, bwd_sub(ctx, a, d), NULL).total;
}

moex_status moex_moe_router_backward(moex_context *ctx, const moex_call *c, const moex_moe_layer_grad_args *a,
                                     const moex_moe_dims *d, const moex_moe_router_io *io,
                                     const moex_tensor *dprobs, float *dxf, void *ws) {
    const moex_backend_ops *ops = moex_ops(ctx);
    const router_layout l = layout_of(ctx, d, true, bwd_sub(ctx, a, d), ws);
    bwd_calls k;
    bwd_calls_of(a, d, io, dprobs, dxf, l.dlogits, &k);
    const moex_router_dims rd = router_dims(d);
    MOEX_TRY(ops->router_bwd(ctx, c, &k.router, &rd, l.sub));
    moex_groups rows;
    MOEX_TRY(ops->groups_prepare(ctx, c, NULL, 1, d->T, NULL, l.rows, &rows));
    if (moex_present(&a->drouter_w)) MOEX_TRY(ops->dense_gemm(ctx, c, &rows, &k.drouter_w, l.sub));
    if (moex_present(&a->dx)) MOEX_TRY(ops->dense_gemm(ctx, c, &rows, &k.dx, l.sub));
    return MOEX_OK;
}
