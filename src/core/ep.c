/*
 * ep.c - expert parallelism (include/moex_ep.h; the private contract: ep.h): the
 * EP context, the dispatch handle, and the four operations composed once from a backend's
 * local kernels (ctx->ops->ep) and a transport's exchange:
 * (each exchange opened before the kernel that writes the outgoing rows, ep.h)
 *   dispatch forward:   route, pack (rows + meta), exchange (learning the counts),
 *                       expand_plan (recv_map, splits, drops), expand_rows (xr, probs_r)
 *   dispatch backward:  gather_local (dxr + dprobs_r meta), exchange back, reduce (dx, dprobs)
 *   combine forward:    gather_local (yr), exchange back, reduce (y)
 *   combine backward:   pack (dy), exchange, expand_rows (dyr)
 * "Back" exchanges send what was received: region s carries recv_counts[s] rows to rank s,
 * and rank r's rows land where its dispatch's rows were sent from (send_counts, known).
 *
 * The handle (ep.h, "Routing") starts with a header naming the dispatch's shapes. On host
 * memory (the CPU) the dispatch writes it and the other calls check it before anything is
 * written, and over MPI the ranks agree on every check before any exchange ("the ranks
 * agree", below); device memory cannot be read without a synchronisation, so there the
 * kernels clamp every index they read from it.
 */
#include "ep.h"
#include "op.h"

#include <stdlib.h>
#include <string.h>

#define HANDLE_MAGIC 0x3148504578656d6dULL   /* "mmexEPH1" */

typedef struct handle_header {
    uint64_t magic;
    int64_t world, rank, Tm, k, E, T;
} handle_header;

/* ---- the handle's layout ------------------------------------------------------------- */

size_t moex_ep_routing_layout(const moex_ep_geom *g, void *base, moex_ep_routing *r) {
    moex_carver c = {(char *)base, 0};
    (void)moex_take(&c, sizeof(handle_header));   /* at base: the header */
    r->slot_row = (int32_t *)moex_take(&c, moex_sz_bytes(g->Tm, g->k, sizeof(int32_t)));
    r->send_counts = (int64_t *)moex_take(&c, moex_sz_bytes(g->world, 1, sizeof(int64_t)));
    r->recv_counts = (int64_t *)moex_take(&c, moex_sz_bytes(g->world, 1, sizeof(int64_t)));
    r->recv_map = (int32_t *)moex_take(&c, moex_sz_bytes((int64_t)g->world * g->Tm, g->k, sizeof(int32_t)));
    return c.used;
}

static handle_header header_of(const moex_ep_geom *g) {
    handle_header h;
    memset(&h, 0, sizeof h);
    h.magic = HANDLE_MAGIC;
    h.world = g->world, h.rank = g->rank, h.Tm = g->Tm, h.k = g->k, h.E = g->E, h.T = g->T;
    return h;
}

/* Host memory: the handle holds a dispatch of this EP context with g->T tokens. The same two
 * steps as the MoE layer's check of its saved header (moe_layer.c), each on its own record with
 * its own messages: alike in shape only. */
static moex_status check_handle(moex_context *ctx, const char *op, const moex_ep_geom *g, const void *handle) {
    handle_header got, want = header_of(g);
    memcpy(&got, handle, sizeof got);
    if (got.magic != HANDLE_MAGIC)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: handle does not hold a dispatch (run moex_ep_dispatch_forward first, and pass "
                         "the same handle pointer to the later calls)", op);
    if (memcmp(&got, &want, sizeof got) != 0)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: handle holds a dispatch of %lld tokens (world %lld, rank %lld, k %lld, E %lld), "
                         "not of this call's %lld tokens on this EP context", op, (long long)got.T,
                         (long long)got.world, (long long)got.rank, (long long)got.k, (long long)got.E,
                         (long long)g->T);
    return MOEX_OK;
}

/* ---- the EP context ------------------------------------------------------------------ */

/* A transport this build was compiled without: its init refuses the EP context, naming what to
 * install (`missing`: the transport, then how to get it); its alloc is never reached. */
#if !defined(MOEX_HAVE_MPI) || !defined(MOEX_HAVE_NCCL)
static moex_status transport_not_built(moex_ep *ep, const char *missing) {
    return moex_fail(ep->ctx, MOEX_ERR_UNSUPPORTED, "moex_ep_create: this build of moex has no %s", missing);
}
#endif
#ifndef MOEX_HAVE_MPI
moex_status moex_ep_mpi_init(moex_ep *ep) {
    return transport_not_built(ep, "MPI (install an MPI, e.g. Debian's libopenmpi-dev, and rebuild)");
}
moex_status moex_ep_mpi_alloc(moex_ep *ep, size_t bytes) { return MOEX_ERR_INTERNAL; }
moex_status moex_ep_mpi_allgather(moex_ep *ep, const char *op, const void *mine, void *all, size_t bytes) {
    return MOEX_ERR_INTERNAL;
}
#endif
#ifndef MOEX_HAVE_NCCL
moex_status moex_ep_nccl_init(moex_ep *ep) {
    return transport_not_built(ep, "NCCL (install NCCL, e.g. pip's nvidia-nccl-cu13, and rebuild with the CUDA "
                                   "backend)");
}
moex_status moex_ep_nccl_alloc(moex_ep *ep, size_t bytes) { return MOEX_ERR_INTERNAL; }
#endif

/* What the ranks need to talk at all: the communicator's kind for this backend, and the
 * communicator. (A rank refused here cannot tell the others: they wait in moex_ep_create.) */
static moex_status check_comm(moex_context *ctx, const char *op, const moex_ep_config *cfg) {
    if (cfg->comm_kind != MOEX_EP_COMM_MPI && cfg->comm_kind != MOEX_EP_COMM_NCCL)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: comm_kind %d is not a moex_ep_comm_kind", op,
                         (int)cfg->comm_kind);
    const moex_ep_comm_kind want = ctx->backend == MOEX_BACKEND_CPU ? MOEX_EP_COMM_MPI : MOEX_EP_COMM_NCCL;
    if (cfg->comm_kind != want)
        return moex_fail(ctx, MOEX_ERR_UNSUPPORTED, "%s: the %s backend runs EP over %s, not %s", op,
                         ctx->ops->name, want == MOEX_EP_COMM_MPI ? "MPI" : "NCCL",
                         want == MOEX_EP_COMM_MPI ? "NCCL" : "MPI");
    if (!cfg->comm) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: comm is NULL (pass &your_comm)", op);
    if (!ctx->ops->ep)
        return moex_fail(ctx, MOEX_ERR_UNSUPPORTED, "%s: the %s backend has no EP kernels", op, ctx->ops->name);
    return MOEX_OK;
}

/* The rest of the config, this rank's alone (the ranks then agree: agree_config). */
static moex_status check_config(moex_context *ctx, const char *op, const moex_ep_config *cfg) {
    if (cfg->num_experts < 1 || cfg->topk < 1 || cfg->topk > cfg->num_experts)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: need 1 <= topk <= num_experts, got topk %d, num_experts %d",
                         op, (int)cfg->topk, (int)cfg->num_experts);
    if (cfg->hidden < 1 || cfg->max_tokens < 1 || cfg->max_recv_rows < 1)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: hidden, max_tokens and max_recv_rows must be >= 1, got %lld, %lld, %lld", op,
                         (long long)cfg->hidden, (long long)cfg->max_tokens, (long long)cfg->max_recv_rows);
    if (cfg->dtype != MOEX_DTYPE_F32 && cfg->dtype != MOEX_DTYPE_BF16 && cfg->dtype != MOEX_DTYPE_F16)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: dtype must be f32, bf16 or f16, got %s", op,
                         moex_dtype_name(cfg->dtype));
    if (cfg->transfer != MOEX_EP_TRANSFER_AUTO && cfg->transfer != MOEX_EP_TRANSFER_CAPACITY &&
        cfg->transfer != MOEX_EP_TRANSFER_PEER)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: transfer %d is not a moex_ep_transfer", op,
                         (int)cfg->transfer);
    if (cfg->transfer == MOEX_EP_TRANSFER_PEER && cfg->comm_kind != MOEX_EP_COMM_NCCL)
        return moex_fail(ctx, MOEX_ERR_UNSUPPORTED, "%s: the PEER transfer needs NCCL ranks (CUDA backend)", op);
    return MOEX_OK;
}

/* The geometry once rank and world are known: the index bounds every kernel relies on. */
static moex_status geom_of(moex_context *ctx, const char *op, const moex_ep_config *cfg, moex_ep_geom *g) {
    if (cfg->num_experts % g->world != 0)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: num_experts %d is not a multiple of the world size %d", op,
                         (int)cfg->num_experts, (int)g->world);
    g->El = cfg->num_experts / g->world;
    g->E = cfg->num_experts, g->k = cfg->topk, g->H = cfg->hidden;
    g->Tm = cfg->max_tokens, g->R = cfg->max_recv_rows, g->T = cfg->max_tokens;
    g->dt = cfg->dtype;
    /* slot_row values (< W Tm), recv_map values (< R) and the entries of recv_map (W Tm k) are
     * i32 indices; rows and bytes must not wrap. */
    int64_t rows = 0, entries = 0;
    if (!moex_i64_mul(g->world, g->Tm, &rows) || !moex_i64_mul(rows, g->k, &entries) || entries > INT32_MAX ||
        g->R > INT32_MAX)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: world * max_tokens * topk (%d * %lld * %d) and max_recv_rows (%lld) must fit an "
                         "int32", op, (int)g->world, (long long)g->Tm, (int)g->k, (long long)g->R);
    MOEX_TRY(moex_check_internal(ctx, op, "the received rows", rows, g->H));
    MOEX_TRY(moex_check_internal(ctx, op, "xr", g->R, g->H));
    g->meta = moex_sz_align(moex_sz_bytes(g->H, 1, moex_dtype_size(g->dt)), 16);
    g->wire = moex_sz_align(moex_sz_add(g->meta, 8 * (size_t)g->k), 16);
    return MOEX_OK;
}

/* ---- the ranks agree ---------------------------------------------------------------------
 * Over MPI (the CPU backend, whose checks read host memory) the ranks agree before moex_ep_create
 * returns and before each step's exchange: every rank's verdict on its config, or on the ids or
 * handle the step reads (and what must match across ranks), is allgathered, and what one rank
 * refuses there is refused on every rank, so that none waits in an exchange the others never
 * reach. (The argument checks before a call runs stay each rank's own.) Over NCCL the handles
 * are device memory, which the host does not read: each rank's checks stand alone. */

/* moex_ep_create's agreement after this rank's own checks (local: their status, its message
 * set): every rank's verdict and config (the terms below); MOEX_ERR_INVALID_ARG on every rank
 * when a rank refused its config or the configs differ. */
static moex_status agree_config(moex_ep *ep, const char *op, moex_status local) {
    if (ep->cfg.comm_kind != MOEX_EP_COMM_MPI) return local;
    enum { N = 8 };
    static const char *const names[N] = {"status", "num_experts", "topk", "hidden", "dtype", "max_tokens",
                                         "max_recv_rows", "transfer"};
    const moex_ep_config *c = &ep->cfg;
    const int64_t mine[N] = {local, c->num_experts, c->topk, c->hidden, c->dtype, c->max_tokens, c->max_recv_rows,
                             c->transfer};
    const int W = ep->geom.world;
    int64_t *all = (int64_t *)calloc((size_t)W * N, sizeof *all);
    if (!all) return moex_fail(ep->ctx, MOEX_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    moex_status st = moex_ep_mpi_allgather(ep, op, mine, all, sizeof mine);
    for (int q = 0; st == MOEX_OK && local == MOEX_OK && q < W; q++)
        if (all[(size_t)q * N] != MOEX_OK)
            st = moex_fail(ep->ctx, MOEX_ERR_INVALID_ARG,
                           "%s: rank %d refused its configuration (%s); moex_ep_create is collective and fails on "
                           "every rank", op, q, moex_status_string((moex_status)all[(size_t)q * N]));
    for (int q = 1; st == MOEX_OK && local == MOEX_OK && q < W; q++)
        for (int f = 1; f < N && st == MOEX_OK; f++)
            if (all[(size_t)q * N + f] != all[f])
                st = moex_fail(ep->ctx, MOEX_ERR_INVALID_ARG,
                               "%s: the ranks passed different configurations: %s is %lld on rank 0 and %lld on rank "
                               "%d (moex_ep_create is collective: every rank passes the same config, comm aside)",
                               op, names[f], (long long)all[f], (long long)all[(size_t)q * N + f], q);
    free(all);
    return st != MOEX_OK ? st : local;
}

/* A step's agreement before its exchange (local: this rank's status so far, its message set;
 * r: the handle it reads, or NULL): every rank's status and, with r, the handle's counts, which
 * must lie in [0, max_tokens] and pair across ranks (what rank q sends to p is what p expects
 * from q). MOEX_ERR_INVALID_ARG on every rank otherwise. */
static moex_status agree_step(moex_context *ctx, const moex_call *c, const moex_ep *ep, moex_status local,
                              const moex_ep_routing *r) {
    if (ep->cfg.comm_kind != MOEX_EP_COMM_MPI) return local;
    const int W = ep->geom.world;
    const size_t n = 1 + 2 * (size_t)W;   /* status, send_counts[W], recv_counts[W] */
    int64_t *all = (int64_t *)calloc((size_t)(W + 1) * n, sizeof *all), *mine = all + (size_t)W * n;
    if (!all) return moex_fail(ctx, MOEX_ERR_OUT_OF_MEMORY, "%s: out of host memory", c->op);
    mine[0] = local;
    if (r && local == MOEX_OK) {
        memcpy(mine + 1, r->send_counts, (size_t)W * sizeof *mine);
        memcpy(mine + 1 + W, r->recv_counts, (size_t)W * sizeof *mine);
    }
    moex_status st = moex_ep_mpi_allgather((moex_ep *)ep, c->op, mine, all, n * sizeof *mine);
    const int64_t Tm = ep->geom.Tm;
    for (int q = 0; st == MOEX_OK && local == MOEX_OK && q < W; q++)
        if (all[(size_t)q * n] != MOEX_OK)
            st = moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: rank %d refused the call (%s); refused on every rank",
                           c->op, q, moex_status_string((moex_status)all[(size_t)q * n]));
    for (int q = 0; st == MOEX_OK && local == MOEX_OK && r && q < W; q++) {
        const int64_t *t = all + (size_t)q * n;
        for (int p = 0; p < W && st == MOEX_OK; p++) {
            const int64_t send = t[1 + p], recv = t[1 + W + p], paired = all[(size_t)p * n + 1 + W + q];
            if (send < 0 || send > Tm || recv < 0 || recv > Tm)
                st = moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                               "%s: the handle of rank %d counts %lld rows to and %lld from rank %d, outside [0, "
                               "max_tokens %lld] (changed since its dispatch?); refused on every rank",
                               c->op, q, (long long)send, (long long)recv, p, (long long)Tm);
            else if (send != paired)
                st = moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                               "%s: the handles do not pair: rank %d's says %lld rows to rank %d, rank %d's %lld from "
                               "rank %d (handles of different dispatches?); refused on every rank",
                               c->op, q, (long long)send, p, p, (long long)paired, q);
        }
    }
    free(all);
    return st != MOEX_OK ? st : local;
}

moex_status moex_ep_create(moex_ep **out, moex_context *ctx, const moex_ep_config *cfg) {
    const char *op = "moex_ep_create";
    if (out) *out = NULL;
    MOEX_TRY(moex_enter(ctx, op, cfg));
    if (!out) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: out is NULL", op);
    MOEX_TRY(check_comm(ctx, op, cfg));
    moex_ep *ep = (moex_ep *)calloc(1, sizeof *ep);
    if (!ep) return moex_fail(ctx, MOEX_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    ep->ctx = ctx;
    ep->cfg = *cfg;
    const bool mpi = cfg->comm_kind == MOEX_EP_COMM_MPI;
    moex_status st = mpi ? moex_ep_mpi_init(ep) : moex_ep_nccl_init(ep);
    if (st == MOEX_OK) {
        moex_status local = check_config(ctx, op, cfg);
        if (local == MOEX_OK) local = geom_of(ctx, op, cfg, &ep->geom);
        st = agree_config(ep, op, local);
    }
    if (st == MOEX_OK) {
        const size_t bytes = moex_sz_mul(moex_sz_mul((size_t)ep->geom.world, (size_t)ep->geom.Tm), ep->geom.wire);
        if (bytes > (size_t)PTRDIFF_MAX)
            st = moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: the transfer buffers would pass PTRDIFF_MAX bytes", op);
        else
            st = mpi ? moex_ep_mpi_alloc(ep, bytes) : moex_ep_nccl_alloc(ep, bytes);
    }
    if (st != MOEX_OK) {
        moex_ep_destroy(ep);
        return st;
    }
    *out = ep;
    return MOEX_OK;
}

void moex_ep_destroy(moex_ep *ep) {
    if (!ep) return;
    if (ep->transport && ep->transport->destroy) ep->transport->destroy(ep);
    free(ep);
}

moex_status moex_ep_get_info(const moex_ep *ep, moex_ep_info *info) {
    if (!ep) return moex_fail(NULL, MOEX_ERR_INVALID_ARG, "moex_ep_get_info: ep is NULL");
    if (!info) return moex_fail(ep->ctx, MOEX_ERR_INVALID_ARG, "moex_ep_get_info: info is NULL");
    moex_ep_routing r;
    info->rank = ep->geom.rank, info->world = ep->geom.world, info->local_experts = ep->geom.El;
    info->transfer = ep->transport->transfer;
    return moex_buffer_public_size(ep->ctx, "moex_ep_get_info", "handle",
                                   moex_ep_routing_layout(&ep->geom, NULL, &r), &info->handle_bytes);
}

/* ---- validation ---------------------------------------------------------------------- */

moex_status moex_ep_check(moex_context *ctx, const char *op, const moex_ep *ep, int64_t T, moex_ep_dims *d) {
    if (!ep) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: ep is NULL", op);
    if (ep->ctx != ctx)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: ep was created on another moex_context", op);
    d->g = ep->geom;
    if (T > ep->geom.Tm)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: T = %lld tokens, past the EP context's max_tokens %lld", op,
                         (long long)T, (long long)ep->geom.Tm);
    d->g.T = T;
    d->handle = NULL;
    return MOEX_OK;
}

/* The [T, H] rows of the call (`name`, an input or, with out, an output) set T. */
static moex_status check_token_rows(moex_context *ctx, const char *op, const moex_ep *ep, const char *name,
                                    const moex_tensor *t, bool out, moex_ep_dims *d) {
    if (!ep) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: ep is NULL", op);
    const int64_t shape[2] = {-1, ep->geom.H};
    MOEX_TRY(out ? moex_check_output(ctx, op, name, t, 2, shape, MOEX_DT(ep->geom.dt))
                 : moex_check_tensor(ctx, op, name, t, 2, shape, MOEX_DT(ep->geom.dt)));
    return moex_ep_check(ctx, op, ep, t->shape[0], d);
}

static moex_status prepare_handle(moex_context *ctx, const char *op, moex_purpose p, const void *handle,
                                  size_t bytes, moex_span_role role, moex_ep_dims *d) {
    if (p != MOEX_FOR_RUN) return MOEX_OK;
    moex_ep_routing r;
    return moex_buffer_prepare(ctx, op, "handle", moex_ep_routing_layout(&d->g, NULL, &r), (void *)handle, bytes,
                               role, &d->handle);
}

static moex_status check_expert_rows(moex_context *ctx, const char *op, const char *name, const moex_tensor *t,
                                     bool out, const moex_ep_dims *d) {
    const int64_t shape[2] = {d->g.R, d->g.H};
    return out ? moex_check_output(ctx, op, name, t, 2, shape, MOEX_DT(d->g.dt))
               : moex_check_tensor(ctx, op, name, t, 2, shape, MOEX_DT(d->g.dt));
}

/* The dispatch's x and xr: the EP dtype, or FP8 with their 1x128 scales (x_scales present). */
static moex_status check_dispatch_rows(moex_context *ctx, const char *op, const moex_ep_dispatch_args *a,
                                       moex_ep_dims *d) {
    if (!moex_present(&a->x_scales)) {
        MOEX_TRY(check_token_rows(ctx, op, a->ep, "x", &a->x, false, d));
        return check_expert_rows(ctx, op, "xr", &a->xr, true, d);
    }
    if (!a->ep) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: ep is NULL", op);
    const int64_t H = a->ep->geom.H, nb = moex_i64_cdiv(H, 128);
    const unsigned fp8 = MOEX_DT(MOEX_DTYPE_E4M3) | MOEX_DT(MOEX_DTYPE_E5M2);
    const int64_t xs[2] = {-1, H};
    MOEX_TRY(moex_check_tensor(ctx, op, "x", &a->x, 2, xs, fp8));
    MOEX_TRY(moex_ep_check(ctx, op, a->ep, a->x.shape[0], d));
    if (H % 16 != 0)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: an FP8 dispatch needs H a multiple of 16, got %lld", op,
                         (long long)H);
    const int64_t ts[2] = {d->g.T, nb}, rs[2] = {d->g.R, nb}, xrs[2] = {d->g.R, H};
    MOEX_TRY(moex_check_tensor(ctx, op, "x_scales", &a->x_scales, 2, ts, MOEX_DT_F32));
    MOEX_TRY(moex_check_output(ctx, op, "xr", &a->xr, 2, xrs, MOEX_DT(a->x.dtype)));
    return moex_check_output(ctx, op, "xr_scales", &a->xr_scales, 2, rs, MOEX_DT_F32);
}

moex_status moex_op_ep_dispatch_forward_validate(moex_context *ctx, const char *op, const moex_ep_dispatch_args *a,
                                                 moex_purpose p, moex_ep_dims *d) {
    MOEX_TRY(check_dispatch_rows(ctx, op, a, d));
    const int64_t tk[2] = {d->g.T, d->g.k}, r1[1] = {d->g.R}, el[1] = {d->g.El}, one[1] = {1};
    MOEX_TRY(moex_check_tensor(ctx, op, "ids", &a->ids, 2, tk, MOEX_DT_I32));
    MOEX_TRY(moex_check_tensor(ctx, op, "probs", &a->probs, 2, tk, MOEX_DT_F32));
    if (!moex_present(&a->x_scales) && moex_present(&a->xr_scales))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: xr_scales is given but x_scales is not (an FP8 dispatch "
                         "takes both)", op);
    MOEX_TRY(moex_check_optional_output(ctx, op, "probs_r", &a->probs_r, 1, r1, MOEX_DT_F32));
    MOEX_TRY(moex_check_output(ctx, op, "splits", &a->splits, 1, el, MOEX_DT_I64));
    MOEX_TRY(moex_check_optional_output(ctx, op, "dropped", &a->dropped, 1, one, MOEX_DT_I64));
    return prepare_handle(ctx, op, p, a->handle, a->handle_bytes, MOEX_SPAN_OUT, d);
}

moex_status moex_op_ep_dispatch_backward_validate(moex_context *ctx, const char *op,
                                                  const moex_ep_dispatch_grad_args *a, moex_purpose p,
                                                  moex_ep_dims *d) {
    MOEX_TRY(check_token_rows(ctx, op, a->ep, "dx", &a->dx, true, d));
    const int64_t tk[2] = {d->g.T, d->g.k}, r1[1] = {d->g.R};
    MOEX_TRY(check_expert_rows(ctx, op, "dxr", &a->dxr, false, d));
    MOEX_TRY(moex_check_optional(ctx, op, "dprobs_r", &a->dprobs_r, 1, r1, MOEX_DT_F32));
    MOEX_TRY(moex_check_optional_output(ctx, op, "dprobs", &a->dprobs, 2, tk, MOEX_DT_F32));
    if (moex_present(&a->dprobs_r) != moex_present(&a->dprobs))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: dprobs_r and dprobs come together (both or neither)", op);
    return prepare_handle(ctx, op, p, a->handle, a->handle_bytes, MOEX_SPAN_IN, d);
}

moex_status moex_op_ep_combine_forward_validate(moex_context *ctx, const char *op, const moex_ep_combine_args *a,
                                                moex_purpose p, moex_ep_dims *d) {
    MOEX_TRY(check_token_rows(ctx, op, a->ep, "y", &a->y, true, d));
    MOEX_TRY(check_expert_rows(ctx, op, "yr", &a->yr, false, d));
    return prepare_handle(ctx, op, p, a->handle, a->handle_bytes, MOEX_SPAN_IN, d);
}

moex_status moex_op_ep_combine_backward_validate(moex_context *ctx, const char *op,
                                                 const moex_ep_combine_grad_args *a, moex_purpose p,
                                                 moex_ep_dims *d) {
    MOEX_TRY(check_token_rows(ctx, op, a->ep, "dy", &a->dy, false, d));
    MOEX_TRY(check_expert_rows(ctx, op, "dyr", &a->dyr, true, d));
    return prepare_handle(ctx, op, p, a->handle, a->handle_bytes, MOEX_SPAN_IN, d);
}

/* ---- the compositions ------------------------------------------------------------------ */

/* The EP steps need no workspace: the transfer buffers are the EP context's. */
size_t moex_op_ep_dispatch_forward_ws(moex_context *ctx, const moex_ep_dispatch_args *a, const moex_ep_dims *d) {
    return 0;
}
size_t moex_op_ep_dispatch_backward_ws(moex_context *ctx, const moex_ep_dispatch_grad_args *a,
                                       const moex_ep_dims *d) {
    return 0;
}
size_t moex_op_ep_combine_forward_ws(moex_context *ctx, const moex_ep_combine_args *a, const moex_ep_dims *d) {
    return 0;
}
size_t moex_op_ep_combine_backward_ws(moex_context *ctx, const moex_ep_combine_grad_args *a,
                                      const moex_ep_dims *d) {
    return 0;
}

/* The exchange's two steps (ep.h): open before the outgoing rows are written; then the
 * exchange toward the experts (the dispatch's direction) or back. */
static moex_status exchange_open(const moex_ep *ep, const moex_call *c) {
    return ep->transport->open ? ep->transport->open((moex_ep *)ep, c) : MOEX_OK;
}
static moex_status exchange_out(const moex_ep *ep, const moex_call *c, const moex_ep_routing *r, bool learn) {
    const moex_ep_exchange x = {r->send_counts, r->recv_counts, learn};
    return ep->transport->exchange((moex_ep *)ep, c, &x);
}
static moex_status exchange_back(const moex_ep *ep, const moex_call *c, const moex_ep_routing *r) {
    const moex_ep_exchange x = {r->recv_counts, r->send_counts, false};
    return ep->transport->exchange((moex_ep *)ep, c, &x);
}

/* The handle's arrays, checked (host memory) to hold a dispatch of this call's shapes (the
 * ranks then agree on the verdict and the counts: agree_step). */
static moex_status routing_of(moex_context *ctx, const moex_call *c, const moex_ep_dims *d, moex_ep_routing *r) {
    moex_ep_routing_layout(&d->g, d->handle, r);
    return ctx->ops->host_memory ? check_handle(ctx, c->op, &d->g, d->handle) : MOEX_OK;
}

moex_status moex_ep_combine_run(moex_context *ctx, const moex_call *c, const moex_ep *ep, const moex_ep_dims *d,
                                const void *src, const float *dsrc, void *dst, moex_dtype dst_dt, float *dprobs) {
    const moex_ep_kernels *k = ctx->ops->ep;
    moex_ep_routing r;
    MOEX_TRY(agree_step(ctx, c, ep, routing_of(ctx, c, d, &r), &r));
    MOEX_TRY(exchange_open(ep, c));
    MOEX_TRY(k->gather_local(ctx, c, &d->g, &r, src, dsrc, ep->out));
    MOEX_TRY(exchange_back(ep, c, &r));
    return k->reduce(ctx, c, &d->g, &r, ep->rcv, dst, dst_dt, dprobs);
}

/* Rows of H elements of the EP dtype, as wire payloads. */
static moex_ep_rows plain_rows(const moex_ep_geom *g, const void *rows) {
    const moex_ep_rows r = {(void *)rows, (size_t)g->H * moex_dtype_size(g->dt), NULL, 0};
    return r;
}

/* A dispatch's x or xr: plain rows, or FP8 data (H bytes a row) followed by its scales. */
static moex_ep_rows dispatch_rows(const moex_ep_geom *g, const moex_tensor *t, const moex_tensor *scales) {
    if (!moex_present(scales)) return plain_rows(g, t->data);
    const moex_ep_rows r = {t->data, (size_t)g->H, scales->data, (size_t)scales->shape[1] * sizeof(float)};
    return r;
}

moex_status moex_ep_scatter_run(moex_context *ctx, const moex_call *c, const moex_ep *ep, const moex_ep_dims *d,
                                const void *src, void *dst) {
    const moex_ep_kernels *k = ctx->ops->ep;
    moex_ep_routing r;
    MOEX_TRY(agree_step(ctx, c, ep, routing_of(ctx, c, d, &r), &r));
    const moex_ep_rows from = plain_rows(&d->g, src), to = plain_rows(&d->g, dst);
    MOEX_TRY(exchange_open(ep, c));
    MOEX_TRY(k->pack(ctx, c, &d->g, &r, &from, NULL, NULL, ep->out));
    MOEX_TRY(exchange_out(ep, c, &r, false));
    return k->expand_rows(ctx, c, &d->g, &r, ep->rcv, &to, NULL);
}

moex_status moex_ep_dispatch_run(moex_context *ctx, const moex_call *c, const moex_ep_dispatch_args *a,
                                 const moex_ep_dims *d) {
    const moex_ep_kernels *k = ctx->ops->ep;
    const moex_ep *ep = a->ep;
    moex_ep_routing r;
    moex_ep_routing_layout(&d->g, d->handle, &r);
    const bool host = ctx->ops->host_memory;
    int64_t dropped = 0;
    int64_t *pdropped = moex_present(&a->dropped) ? (int64_t *)a->dropped.data : host ? &dropped : NULL;
    /* route checks the ids before writing; the ranks agree before the exchange */
    MOEX_TRY(agree_step(ctx, c, ep, k->route(ctx, c, &d->g, (const int32_t *)a->ids.data, &r), NULL));
    if (host) memset(d->handle, 0, sizeof(handle_header));   /* no dispatch until this one ends */
    const moex_ep_rows x = dispatch_rows(&d->g, &a->x, &a->x_scales), xr = dispatch_rows(&d->g, &a->xr, &a->xr_scales);
    MOEX_TRY(exchange_open(ep, c));
    MOEX_TRY(k->pack(ctx, c, &d->g, &r, &x, (const int32_t *)a->ids.data, (const float *)a->probs.data, ep->out));
    MOEX_TRY(exchange_out(ep, c, &r, true));
    MOEX_TRY(k->expand_plan(ctx, c, &d->g, &r, ep->rcv, (int64_t *)a->splits.data, pdropped));
    MOEX_TRY(k->expand_rows(ctx, c, &d->g, &r, ep->rcv, &xr, (float *)a->probs_r.data));
    if (host) {
        if (*pdropped > 0 && ctx->ep_dropped == 0) ctx->ep_dropped_op = c->id;
        ctx->ep_dropped += *pdropped;
        const handle_header h = header_of(&d->g);
        memcpy(d->handle, &h, sizeof h);
    }
    return MOEX_OK;
}

moex_status moex_op_ep_dispatch_forward_run(moex_context *ctx, const moex_call *c, const moex_ep_dispatch_args *a,
                                            const moex_ep_dims *d, void *ws) {
    return moex_ep_dispatch_run(ctx, c, a, d);
}

moex_status moex_op_ep_dispatch_backward_run(moex_context *ctx, const moex_call *c,
                                             const moex_ep_dispatch_grad_args *a, const moex_ep_dims *d, void *ws) {
    return moex_ep_combine_run(ctx, c, a->ep, d, a->dxr.data, (const float *)a->dprobs_r.data, a->dx.data, d->g.dt,
                               (float *)a->dprobs.data);
}

moex_status moex_op_ep_combine_forward_run(moex_context *ctx, const moex_call *c, const moex_ep_combine_args *a,
                                           const moex_ep_dims *d, void *ws) {
    return moex_ep_combine_run(ctx, c, a->ep, d, a->yr.data, NULL, a->y.data, d->g.dt, NULL);
}

moex_status moex_op_ep_combine_backward_run(moex_context *ctx, const moex_call *c,
                                            const moex_ep_combine_grad_args *a, const moex_ep_dims *d, void *ws) {
    return moex_ep_scatter_run(ctx, c, a->ep, d, a->dy.data, a->dyr.data);
}
