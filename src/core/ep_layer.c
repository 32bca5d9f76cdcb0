/*
 * ep_layer.c - the EP MoE layer (include/moex_ep.h): the MoE layer with its experts
 * spread over the ranks of an EP context, composed once from the router steps (moe_router.c),
 * the EP steps (ep.c) and the grouped MLP (grouped_mlp.c):
 *   forward:   logits, probs, ids = router(x)                       (saved)
 *              xr, probs_r, splits, handle = dispatch(x, ids, probs) (saved)
 *              yr = grouped_mlp(xr, probs_r, splits)  [R, H]        (h, z saved; yr in the workspace)
 *              y = combine(yr)                        [T, H]        =
 *              (dropped: the dispatch's count of rows past max_recv_rows, optional  =)
 *   FP8 BLOCK: x's rowwise copy is dispatched and read by FC1 (fp8_dispatch, below).
 *   backward:  dyr = combine_backward(dy)
 *              dxr, dprobs_r, dW1, dW2, db1, db2 = grouped_mlp_backward(dyr)
 *              dx_e, dprobs = dispatch_backward(dxr, dprobs_r)      (dx_e in f32)
 *              drouter_w, dx = router_backward(dprobs, dx_e)
 * As in the MoE layer, the router path (dxr, dprobs, the router's backward) runs only when dx or
 * drouter_w is asked for; the exchanges are collective, so every rank must ask for the same
 * gradients (dx or drouter_w on all ranks, or on none). The saved buffer's handle is checked by the EP steps on host memory
 * (a saved buffer without a forward fails before anything is written).
 */
#include <string.h>

#include "ep.h"
#include "op.h"

static const moex_tensor absent_tensor;

/* ---- the saved buffer ---------------------------------------------------------------- */

typedef struct saved_views {
    moex_moe_router_io io;          /* logits, probs, ids */
    moex_moe_rows r;                /* the received rows: splits, probs_r, xr, h, z */
    void *handle;
} saved_views;

static size_t saved_layout(const moex_ep_dims *d, void *base, saved_views *v) {
    moex_ep_routing r;
    moex_carver c = {(char *)base, 0};
    v->handle = moex_take(&c, moex_ep_routing_layout(&d->g, NULL, &r));
    v->io = moex_moe_router_io_take(&c, &d->moe);
    v->r = moex_moe_rows_take(&c, &d->moe, d->g.R);
    return c.used;
}

static size_t saved_bytes(const moex_ep_dims *d) {
    saved_views v;
    return saved_layout(d, NULL, &v);
}

/* ---- validation ---------------------------------------------------------------------- */

/* The layer's arguments against its EP context: the router's E and k, H, the dtype, and the
 * local experts of the weights. */
static moex_status validate_layer(moex_context *ctx, const char *op, const moex_ep *ep, const moex_moe_layer_args *a,
                                  bool need_y, moex_ep_dims *d) {
    if (!ep) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: ep is NULL", op);
    MOEX_TRY(moex_moe_layer_check(ctx, op, a, need_y, ep->geom.El, &d->moe));
    const moex_moe_dims *m = &d->moe;
    const moex_ep_geom *g = &ep->geom;
    if (m->E != g->E || m->k != g->k || m->H != g->H || m->dt != g->dt)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: the layer (E %lld, topk %lld, H %lld, %s) does not match its EP context (E %lld, "
                         "topk %lld, H %lld, %s)", op, (long long)m->E, (long long)m->k, (long long)m->H,
                         moex_dtype_name(m->dt), (long long)g->E, (long long)g->k, (long long)g->H,
                         moex_dtype_name(g->dt));
    MOEX_TRY(moex_ep_check(ctx, op, ep, m->T, d));
    return moex_check_internal(ctx, op, "h", g->R, 2 * m->F);
}

static moex_status saved_prepare(moex_context *ctx, const char *op, const moex_moe_layer_args *a,
                                 moex_span_role role, moex_ep_dims *d) {
    return moex_buffer_prepare(ctx, op, "saved", saved_bytes(d), a->saved, a->saved_bytes, role, &d->moe.saved);
}

moex_status moex_ep_moe_layer_saved_size(moex_context *ctx, const moex_ep_moe_layer_args *args, size_t *bytes) {
    static const char op[] = "moex_ep_moe_layer_saved_size";
    MOEX_TRY(moex_enter(ctx, op, args));
    if (!bytes) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: bytes is NULL", op);
    moex_ep_dims d;
    MOEX_TRY(validate_layer(ctx, op, args->ep, &args->layer, false, &d));
    return moex_buffer_public_size(ctx, op, "saved", saved_bytes(&d), bytes);
}

moex_status moex_op_ep_moe_layer_forward_validate(moex_context *ctx, const char *op, const moex_ep_moe_layer_args *a,
                                                  moex_purpose p, moex_ep_dims *d) {
    MOEX_TRY(validate_layer(ctx, op, a->ep, &a->layer, true, d));
    const int64_t one[1] = {1};
    MOEX_TRY(moex_check_optional_output(ctx, op, "dropped", &a->dropped, 1, one, MOEX_DT_I64));
    return p == MOEX_FOR_RUN ? saved_prepare(ctx, op, &a->layer, MOEX_SPAN_OUT, d) : MOEX_OK;
}

moex_status moex_op_ep_moe_layer_backward_validate(moex_context *ctx, const char *op,
                                                   const moex_ep_moe_layer_grad_args *a, moex_purpose p,
                                                   moex_ep_dims *d) {
    MOEX_TRY(validate_layer(ctx, op, a->ep, &a->layer.fwd, false, d));
    MOEX_TRY(moex_moe_layer_check_grads(ctx, op, &a->layer, p, &d->moe));
    return p == MOEX_FOR_RUN ? saved_prepare(ctx, op, &a->layer.fwd, MOEX_SPAN_IN, d) : MOEX_OK;
}

/* The start of a run, before any launch: the backend's limits for the R received rows in the
 * local experts' groups, then the views of the saved buffer (v) and the dims of the EP steps
 * on the handle it holds (e). */
static moex_status run_begin(moex_context *ctx, const moex_call *c, const moex_ep_dims *d, saved_views *v,
                             moex_ep_dims *e) {
    MOEX_TRY(moex_check_limits(ctx, c, d->g.R, d->moe.G, 0));
    saved_layout(d, d->moe.saved, v);
    *e = *d;
    e->handle = v->handle;
    return MOEX_OK;
}

static moex_mlp_dims mlp_dims(const moex_ep_dims *d) {
    moex_mlp_dims m = {d->moe.G, d->g.R, d->moe.H, d->moe.F, d->moe.dt};
    return m;
}

/* ---- forward ------------------------------------------------------------------------- */

static moex_grouped_mlp_args fwd_mlp_of(const moex_moe_layer_args *a, const moex_ep_dims *d, const saved_views *v,
                                        void *yr) {
    return moex_moe_mlp_args(a, &v->r, moex_tensor_2d(yr, d->moe.dt, d->g.R, d->moe.H));
}

/* The FP8 dispatch: with the BLOCK recipe (and H a multiple of 16, as an FP8 dispatch needs),
 * the tokens leave as their rowwise copy (1x128 blocks along each row, which do not depend on
 * the expert a row goes to: the copy FC1 would make of the received rows), and FC1 reads the
 * received copy, so each row is quantized once, on the rank that holds it, and travels in half
 * the bytes of bf16. The received rows are dequantized into the saved xr for the backward
 * (dW1 reads x's columnwise copy, quantized from those values). */
static bool fp8_dispatch(const moex_moe_layer_args *a, const moex_ep_dims *d) {
    return a->fp8.mode == MOEX_FP8_BLOCK && d->moe.H % 16 == 0;
}

/* The workspace: yr; with the FP8 dispatch the handles of the T tokens (one group) and of the
 * R received rows, the tokens' rowwise copy (xq) and the received one (xrq); then one region
 * shared by the router, the quantize, the dequantize and the grouped MLP. */
typedef struct fwd_layout {
    void *yr, *sub;
    bool fp8;
    void *groups_t, *groups_r;
    moex_fp8_operand xq, xrq;
    size_t total;
} fwd_layout;

static moex_group_dequantize_args xr_dequantize_args(const fwd_layout *l, const saved_views *v) {
    moex_group_dequantize_args q;
    memset(&q, 0, sizeof q);
    q.src = l->xrq.row, q.params = l->xrq.p, q.orientation = MOEX_QUANT_ROWWISE, q.splits = v->r.splits;
    q.y = v->r.x;
    return q;
}

static fwd_layout fwd_layout_of(moex_context *ctx, const moex_moe_layer_args *a, const moex_ep_dims *d, void *ws) {
    const moex_backend_ops *ops = moex_ops(ctx);
    const moex_moe_dims *m = &d->moe;
    saved_views v;
    saved_layout(d, NULL, &v);
    moex_carver k = {(char *)ws, 0};
    fwd_layout l;
    memset(&l, 0, sizeof l);
    l.yr = moex_take(&k, moex_sz_bytes(d->g.R, m->H, moex_dtype_size(m->dt)));
    l.fp8 = fp8_dispatch(a, d);
    size_t sub = moex_moe_router_forward_ws(ctx, a, m);
    if (l.fp8) {
        l.groups_t = moex_take(&k, ops->groups_ws(ctx, 1, m->T, NULL));
        l.groups_r = moex_take(&k, ops->groups_ws(ctx, m->G, d->g.R, NULL));
        moex_fp8_take_rows(&k, &a->fp8, false, 1, m->T, m->H, m->dt, true, false, &l.xq);
        moex_fp8_take_rows(&k, &a->fp8, false, m->G, d->g.R, m->H, m->dt, true, false, &l.xrq);
        const moex_group_dequantize_args dq = xr_dequantize_args(&l, &v);
        sub = moex_sz_max(sub, moex_fp8_rows_ws(ctx, &a->x, &absent_tensor, &l.xq));
        sub = moex_sz_max(sub, ops->dequantize_ws(ctx, &dq, &l.xrq.d));
    }
    const moex_grouped_mlp_args mlp = fwd_mlp_of(a, d, &v, NULL);
    const moex_mlp_dims md = mlp_dims(d);
    sub = moex_sz_max(sub, moex_mlp_fwd_ws(ctx, &mlp, l.fp8 ? &l.xrq.row : NULL, &md));
    l.sub = moex_take(&k, sub);
    l.total = k.used;
    return l;
}

size_t moex_op_ep_moe_layer_forward_ws(moex_context *ctx, const moex_ep_moe_layer_args *a, const moex_ep_dims *d) {
    return fwd_layout_of(ctx, &a->layer, d, NULL).total;
}

moex_status moex_op_ep_moe_layer_forward_run(moex_context *ctx, const moex_call *c, const moex_ep_moe_layer_args *a,
                                             const moex_ep_dims *d, void *ws) {
    const moex_moe_layer_args *f = &a->layer;
    saved_views v;
    moex_ep_dims e;
    MOEX_TRY(run_begin(ctx, c, d, &v, &e));
    const fwd_layout l = fwd_layout_of(ctx, f, d, ws);
    moex_ep_dispatch_args dispatch = {.ep = a->ep, .x = f->x, .ids = v.io.ids, .probs = v.io.probs,
                                      .xr = v.r.x, .probs_r = v.r.probs, .splits = v.r.splits, .dropped = a->dropped};
    if (l.fp8) {
        dispatch.x = l.xq.row.data, dispatch.x_scales = l.xq.row.scales;
        dispatch.xr = l.xrq.row.data, dispatch.xr_scales = l.xrq.row.scales;
    }
    const moex_grouped_mlp_args mlp = fwd_mlp_of(f, d, &v, l.yr);
    const moex_mlp_dims md = mlp_dims(d);

    MOEX_TRY(moex_moe_router_forward(ctx, c, f, &d->moe, &v.io, l.sub));
    if (l.fp8) {   /* the tokens' rowwise copy, the rows of one group */
        moex_groups gt;
        MOEX_TRY(moex_ops(ctx)->groups_prepare(ctx, c, NULL, 1, d->moe.T, NULL, l.groups_t, &gt));
        MOEX_TRY(moex_fp8_rows_quantize(ctx, c, &gt, &f->x, &absent_tensor, &l.xq, l.sub));
    }
    MOEX_TRY(moex_ep_dispatch_run(ctx, c, &dispatch, &e));
    if (l.fp8) {   /* the received rows in the activation dtype, for the backward */
        moex_groups gr;
        MOEX_TRY(moex_prepare_groups(ctx, c, &v.r.splits, d->g.R, NULL, l.groups_r, &gr));
        const moex_group_dequantize_args dq = xr_dequantize_args(&l, &v);
        MOEX_TRY(moex_ops(ctx)->dequantize(ctx, c, &gr, &dq, &l.xrq.d, l.sub));
    }
    MOEX_TRY(moex_mlp_fwd_run(ctx, c, &mlp, l.fp8 ? &l.xrq.row : NULL, &md, l.sub));
    return moex_ep_combine_run(ctx, c, a->ep, &e, l.yr, NULL, f->y.data, d->moe.dt, NULL);
}

/* ---- backward ------------------------------------------------------------------------ */

/* The workspace: dyr, and on the router path dxr, dprobs_r, dx_e (f32) and dprobs; then one
 * region shared by the grouped MLP and the router. */
typedef struct bwd_layout {
    void *dyr, *dxr, *dprobs_r, *dxf, *dprobs, *sub;
    size_t total;
} bwd_layout;

static bool router_path(const moex_moe_layer_grad_args *a) {
    return moex_present(&a->dx) || moex_present(&a->drouter_w);
}

static moex_grouped_mlp_grad_args bwd_mlp_of(const moex_moe_layer_grad_args *a, const moex_ep_dims *d,
                                             const saved_views *v, const bwd_layout *l) {
    const bool router = router_path(a);
    const int64_t R = d->g.R;
    return moex_moe_mlp_grad_args(a, &v->r, moex_tensor_2d(l->dyr, d->moe.dt, R, d->moe.H),
                                  router ? moex_tensor_2d(l->dxr, d->moe.dt, R, d->moe.H) : absent_tensor,
                                  router ? moex_tensor_1d(l->dprobs_r, MOEX_DTYPE_F32, R) : absent_tensor);
}

static bwd_layout bwd_layout_of(moex_context *ctx, const moex_moe_layer_grad_args *a, const moex_ep_dims *d,
                                void *ws) {
    const moex_moe_dims *m = &d->moe;
    const bool router = router_path(a);
    const int64_t R = d->g.R;
    const size_t es = moex_dtype_size(m->dt);
    moex_carver k = {(char *)ws, 0};
    bwd_layout l;
    l.dyr = moex_take(&k, moex_sz_bytes(R, m->H, es));
    l.dxr = router ? moex_take(&k, moex_sz_bytes(R, m->H, es)) : NULL;
    l.dprobs_r = router ? moex_take(&k, moex_sz_bytes(R, 1, sizeof(float))) : NULL;
    l.dxf = router ? moex_take(&k, moex_sz_bytes(m->T, m->H, sizeof(float))) : NULL;
    l.dprobs = router ? moex_take(&k, moex_sz_bytes(m->T, m->k, sizeof(float))) : NULL;
    saved_views v;
    saved_layout(d, NULL, &v);
    const moex_grouped_mlp_grad_args mlp = bwd_mlp_of(a, d, &v, &l);
    const moex_mlp_dims md = mlp_dims(d);
    size_t sub = moex_op_grouped_mlp_backward_ws(ctx, &mlp, &md);
    if (router) sub = moex_sz_max(sub, moex_moe_router_backward_ws(ctx, a, m));
    l.sub = moex_take(&k, sub);
    l.total = k.used;
    return l;
}

size_t moex_op_ep_moe_layer_backward_ws(moex_context *ctx, const moex_ep_moe_layer_grad_args *a,
                                        const moex_ep_dims *d) {
    return bwd_layout_of(ctx, &a->layer, d, NULL).total;
}

moex_status moex_op_ep_moe_layer_backward_run(moex_context *ctx, const moex_call *c,
                                              const moex_ep_moe_layer_grad_args *a, const moex_ep_dims *d, void *ws) {
    const moex_moe_layer_grad_args *g = &a->layer;
    saved_views v;
    moex_ep_dims e;
    MOEX_TRY(run_begin(ctx, c, d, &v, &e));
    const bwd_layout l = bwd_layout_of(ctx, g, d, ws);
    const moex_grouped_mlp_grad_args mlp = bwd_mlp_of(g, d, &v, &l);
    const moex_mlp_dims md = mlp_dims(d);
    const bool router = router_path(g);

    MOEX_TRY(moex_ep_scatter_run(ctx, c, a->ep, &e, g->dy.data, l.dyr));
    if (router) MOEX_TRY(moex_ops(ctx)->zero_f32(ctx, c, (float *)l.dprobs_r, d->g.R));   /* the MLP does += */
    MOEX_TRY(moex_op_grouped_mlp_backward_run(ctx, c, &mlp, &md, l.sub));
    if (!router) return MOEX_OK;
    MOEX_TRY(moex_ep_combine_run(ctx, c, a->ep, &e, l.dxr, (const float *)l.dprobs_r, l.dxf, MOEX_DTYPE_F32,
                                 (float *)l.dprobs));
    const moex_tensor dprobs = moex_tensor_2d(l.dprobs, MOEX_DTYPE_F32, d->moe.T, d->moe.k);
    return moex_moe_router_backward(ctx, c, g, &d->moe, &v.io, &dprobs, (float *)l.dxf, l.sub);
}
