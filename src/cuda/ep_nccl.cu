/*
 * ep_nccl.cu - the NCCL transport of expert parallelism on the CUDA backend (src/core/ep.h):
 * the caller's ncclComm_t (cfg.comm points to it), device transfer buffers on ctx->device, and
 * each exchange as one NCCL group of capacity-sized point-to-point messages (CAPACITY): to
 * every rank r, self included, region r of the send buffer (Tm wire rows, padding included)
 * and, when the counts are learnt, send_counts[r]; from every rank r, region r of the
 * receive buffer and recv_counts[r]. Message sizes depend on the EP context only, so the
 * exchange is enqueued on the call's stream with no host synchronisation and can be captured
 * in a CUDA graph. Compiled only when the build found NCCL (MOEX_HAVE_NCCL).
 *
 * PEER (ep_peer.cu's exchange): at creation every rank exports its receive memory (the
 * receive buffer, a counts inbox and barrier flags: one allocation) with CUDA IPC, the handles
 * go round with ncclAllGather, and every rank maps every peer's; the ranks agree (ncclAllReduce)
 * that all of them could, else AUTO falls back to CAPACITY and PEER is MOEX_ERR_UNSUPPORTED.
 *
 * Errors: every NCCL failure is MOEX_ERR_CUDA (the CUDA stack's communication layer failed:
 * a CUDA error inside NCCL, a system or remote peer error, or a communicator NCCL refuses),
 * its message naming the call, NCCL's error string and ncclGetLastError's detail.
 *
 * NCCL is reached only through the table of ep_nccl_lib.h, resolved when moex_ep_create first
 * runs over NCCL (the process's NCCL: PyTorch's or the caller's, who made the communicator):
 * libmoex has no link dependency on libnccl, and this file calls no NCCL function directly
 * (`api->Send` for ncclSend ...; the types and enum constants are nccl.h's).
 */
#include <stdlib.h>

#include "cuda_check.h"
#include "cuda_ops.h"
#include "ep_nccl_lib.h"
#include "ep_peer.h"

/* ep->transport_state. The communicator is copied from *cfg.comm at init: the caller's
 * variable may go out of scope, the communicator itself must outlive the EP context (moex.h). */
typedef struct nccl_state {
    const moex_nccl_api *api;   /* NCCL's functions (ep_nccl_lib.h) */
    ncclComm_t comm;
    void *snd;                  /* CAPACITY: the send buffer, [W Tm] wire rows */
    void **out;                 /* [W] device: the outgoing regions (ep->out) */
    /* PEER: this rank's exported receive memory, the peers' as mapped here ([W], NULL for
     * this rank and for peers not mapped), and the kernels' view of them */
    void *shared;
    void **mapped;
    moex_ep_peer *peers;
    moex_ep_peer_state dev;
} nccl_state;

static moex_status nccl_fail(moex_ep *ep, const moex_nccl_api *api, ncclComm_t comm, const char *op,
                             const char *call, ncclResult_t res) {
    const char *detail = comm ? api->GetLastError(comm) : NULL;
    const char *text = api->GetErrorString(res);
    return moex_fail(ep->ctx, MOEX_ERR_CUDA, "%s: %s failed: NCCL error %d (%s)%s%s", op, call, (int)res,
                     text ? text : "?", detail && detail[0] ? ": " : "", detail ? detail : "");
}

/* call: an expression of the table `api` in scope, e.g. api->CommCount(comm, &world) */
#define NCCL_TRY(ep, comm, op, call)                                                   \
    do {                                                                               \
        const ncclResult_t r_ = (call);                                                \
        if (r_ != ncclSuccess) return nccl_fail((ep), api, (comm), (op), #call, r_);   \
    } while (0)

/* A non-blocking communicator (ncclConfig_t blocking = 0) may answer ncclInProgress: the
 * operation completes in the background; wait for it so that a return means enqueued. */
static ncclResult_t wait_async(const moex_nccl_api *api, ncclComm_t comm, ncclResult_t res) {
    while (res == ncclInProgress) {
        if (api->CommGetAsyncError(comm, &res) != ncclSuccess) return ncclInternalError;
    }
    return res;
}

/* ---- the exchange -------------------------------------------------------------------- */

/* Runs inside a call (the core's enter made ctx->device, the communicator's, current). On a
 * failure inside the group the group is still closed, so NCCL is left usable. */
static moex_status nccl_exchange(moex_ep *ep, const moex_call *c, const moex_ep_exchange *x) {
    const nccl_state *st = (const nccl_state *)ep->transport_state;
    const moex_nccl_api *api = st->api;
    const ncclComm_t comm = st->comm;
    const moex_ep_geom *g = &ep->geom;
    const cudaStream_t stream = (cudaStream_t)c->stream;
    const size_t region = (size_t)g->Tm * g->wire;   /* W Tm wire rows fit PTRDIFF_MAX (ep.c) */
    const char *snd = (const char *)st->snd;
    char *rcv = (char *)ep->rcv;

    NCCL_TRY(ep, comm, c->op, api->GroupStart());
    ncclResult_t res = ncclSuccess;
    const char *what = "";
    /* Per peer, the same order on every rank (rows, then the count): NCCL matches the sends
     * to a peer with that peer's receives in order. */
    for (int r = 0; r < g->world; r++) {
        if ((res = api->Send(snd + (size_t)r * region, region, ncclInt8, r, comm, stream)) != ncclSuccess) {
            what = "ncclSend(rows)";
            break;
        }
        if ((res = api->Recv(rcv + (size_t)r * region, region, ncclInt8, r, comm, stream)) != ncclSuccess) {
            what = "ncclRecv(rows)";
            break;
        }
        if (!x->learn_counts) continue;
        if ((res = api->Send(x->send_counts + r, 1, ncclInt64, r, comm, stream)) != ncclSuccess) {
            what = "ncclSend(count)";
            break;
        }
        if ((res = api->Recv(x->recv_counts + r, 1, ncclInt64, r, comm, stream)) != ncclSuccess) {
            what = "ncclRecv(count)";
            break;
        }
    }
    const ncclResult_t end = wait_async(api, comm, api->GroupEnd());
    if (res != ncclSuccess) return nccl_fail(ep, api, comm, c->op, what, res);
    if (end != ncclSuccess) return nccl_fail(ep, api, comm, c->op, "ncclGroupEnd()", end);
    return MOEX_OK;
}

static moex_status peer_open(moex_ep *ep, const moex_call *c) {
    const nccl_state *st = (const nccl_state *)ep->transport_state;
    return moex_ep_peer_open(ep->ctx, c, &st->dev, &ep->geom);
}

static moex_status peer_exchange(moex_ep *ep, const moex_call *c, const moex_ep_exchange *x) {
    const nccl_state *st = (const nccl_state *)ep->transport_state;
    return moex_ep_peer_exchange(ep->ctx, c, &st->dev, &ep->geom, x);
}

/* ---- the EP context ------------------------------------------------------------------ */

/* Unmaps the peers' memory and frees this rank's (on ctx->device). */
static void peer_release(nccl_state *st, int world) {
    for (int r = 0; st->mapped && r < world; r++)
        if (st->mapped[r]) cudaIpcCloseMemHandle(st->mapped[r]);
    free(st->mapped);
    if (st->shared) cudaFree(st->shared);
    if (st->peers) cudaFree(st->peers);
    if (st->dev.epoch) cudaFree(st->dev.epoch);
    st->mapped = NULL, st->shared = NULL, st->peers = NULL, st->dev.epoch = NULL;
}

/* Frees the transfer buffers on ctx->device, the caller's device restored. Not collective. */
static void nccl_destroy(moex_ep *ep) {
    nccl_state *st = (nccl_state *)ep->transport_state;
    int prev = -1;
    const bool entered = moex_cuda_device_enter(ep->ctx, "moex_ep_destroy", &prev) == MOEX_OK;
    if (st && st->snd) cudaFree(st->snd);
    if (st && st->out) cudaFree(st->out);
    if (st && st->shared) peer_release(st, ep->geom.world);   /* ep->rcv lies in st->shared */
    else if (ep->rcv) cudaFree(ep->rcv);
    if (entered) moex_cuda_device_leave(ep->ctx, prev);
    free(st);
    ep->rcv = NULL;
    ep->out = NULL;
    ep->transport_state = NULL;
}

static const moex_ep_transport nccl_transport = {"nccl", MOEX_EP_TRANSFER_CAPACITY, NULL, nccl_exchange,
                                                 nccl_destroy};
static const moex_ep_transport peer_transport = {"nccl-peer", MOEX_EP_TRANSFER_PEER, peer_open, peer_exchange,
                                                 nccl_destroy};

moex_status moex_ep_nccl_init(moex_ep *ep) {
    const char *op = "moex_ep_create";
    char why[1536];
    const moex_nccl_api *api = moex_nccl_api_load(why, sizeof why);
    if (!api)
        return moex_fail(ep->ctx, MOEX_ERR_UNSUPPORTED,
                         "%s: EP over NCCL needs NCCL 2, opened when the first NCCL EP context is made: %s "
                         "(load NCCL first, e.g. by making the communicator with torch's or your own, put "
                         "libnccl.so.2 on the loader's path, or name it in $MOEX_EP_NCCL_LIBRARY)", op, why);
    const ncclComm_t comm = *(const ncclComm_t *)ep->cfg.comm;
    if (!comm) return moex_fail(ep->ctx, MOEX_ERR_INVALID_ARG, "%s: *comm is a NULL ncclComm_t", op);
    int rank = -1, world = 0, dev = -1;
    NCCL_TRY(ep, comm, op, api->CommUserRank(comm, &rank));
    NCCL_TRY(ep, comm, op, api->CommCount(comm, &world));
    NCCL_TRY(ep, comm, op, api->CommCuDevice(comm, &dev));
    if (dev != ep->ctx->device)
        return moex_fail(ep->ctx, MOEX_ERR_INVALID_ARG,
                         "%s: the NCCL communicator is on CUDA device %d, the moex context on device %d "
                         "(create both on the same device)", op, dev, ep->ctx->device);
    if (world < 1 || rank < 0 || rank >= world)
        return moex_fail(ep->ctx, MOEX_ERR_INVALID_ARG, "%s: the NCCL communicator has rank %d of %d", op, rank,
                         world);
    nccl_state *st = (nccl_state *)calloc(1, sizeof *st);
    if (!st) return moex_fail(ep->ctx, MOEX_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    st->api = api;
    st->comm = comm;
    ep->geom.rank = rank, ep->geom.world = world;
    ep->transport_state = st;
    return MOEX_OK;
}

/* cudaMalloc of one transfer buffer; an allocation failure is MOEX_ERR_OUT_OF_MEMORY (its
 * error cleared, so that no later launch check sees it), anything else MOEX_ERR_CUDA. */
static moex_status alloc_buffer(moex_ep *ep, const char *op, const char *name, size_t bytes, void **out) {
    const cudaError_t err = cudaMalloc(out, bytes);
    if (err == cudaSuccess) return MOEX_OK;
    *out = NULL;
    (void)cudaGetLastError();
    if (err == cudaErrorMemoryAllocation)
        return moex_fail(ep->ctx, MOEX_ERR_OUT_OF_MEMORY, "%s: out of device memory for the %s buffer (%zu bytes)",
                         op, name, bytes);
    return moex_fail(ep->ctx, MOEX_ERR_CUDA, "%s: cudaMalloc of the %s buffer (%zu bytes) failed: %s (%s)", op, name,
                     bytes, cudaGetErrorString(err), cudaGetErrorName(err));
}

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* The handles h[W] (h[rank] this rank's) all-gathered through dh (device, W handles and an
 * int), every other rank's memory mapped into st->mapped, and *ok reduced to the ranks'
 * minimum (collective). */
static moex_status map_peers(moex_ep *ep, nccl_state *st, cudaStream_t s, cudaIpcMemHandle_t *h, void *dh, int *ok) {
    const char *op = "moex_ep_create";
    const moex_nccl_api *api = st->api;
    const int W = ep->geom.world, me = ep->geom.rank;
    const size_t hb = sizeof *h;
    int *dok = (int *)((char *)dh + (size_t)W * hb);
    CUDA_TRY(ep->ctx, op, cudaMemcpyAsync((char *)dh + (size_t)me * hb, &h[me], hb, cudaMemcpyHostToDevice, s));
    NCCL_TRY(ep, st->comm, op, api->AllGather((char *)dh + (size_t)me * hb, dh, hb, ncclInt8, st->comm, s));
    CUDA_TRY(ep->ctx, op, cudaMemcpyAsync(h, dh, (size_t)W * hb, cudaMemcpyDeviceToHost, s));
    CUDA_TRY(ep->ctx, op, cudaStreamSynchronize(s));
    for (int r = 0; r < W && *ok; r++) {
        if (r == me) continue;
        if (cudaIpcOpenMemHandle(&st->mapped[r], h[r], cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
            st->mapped[r] = NULL;
            (void)cudaGetLastError();
            *ok = 0;
        }
    }
    CUDA_TRY(ep->ctx, op, cudaMemcpyAsync(dok, ok, sizeof *ok, cudaMemcpyHostToDevice, s));
    NCCL_TRY(ep, st->comm, op, api->AllReduce(dok, dok, 1, ncclInt32, ncclMin, st->comm, s));
    CUDA_TRY(ep->ctx, op, cudaMemcpyAsync(ok, dok, sizeof *ok, cudaMemcpyDeviceToHost, s));
    return MOEX_OK;
}

/* The PEER setup (collective): this rank's receive memory (receive buffer of `bytes`, inbox,
 * flags; zeroed) exported, the peers' mapped, and the ranks' agreement. *ok = false (and
 * nothing kept) when some rank could not map some peer. */
static moex_status peer_setup(moex_ep *ep, nccl_state *st, size_t bytes, cudaStream_t s, bool *ok) {
    const char *op = "moex_ep_create";
    const int W = ep->geom.world, me = ep->geom.rank;
    const size_t inbox_at = align256(bytes), flags_at = inbox_at + align256((size_t)W * 8);
    const size_t total = flags_at + align256((size_t)W * 8);
    *ok = false;
    MOEX_TRY(alloc_buffer(ep, op, "receive", total, &st->shared));
    CUDA_TRY(ep->ctx, op, cudaMemsetAsync(st->shared, 0, total, s));
    st->mapped = (void **)calloc((size_t)W, sizeof(void *));
    if (!st->mapped) return moex_fail(ep->ctx, MOEX_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);

    /* the handles round the ranks; each maps the others' */
    cudaIpcMemHandle_t *h = (cudaIpcMemHandle_t *)calloc((size_t)W, sizeof *h);
    void *dh = NULL;
    moex_status res = h ? MOEX_OK : moex_fail(ep->ctx, MOEX_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    /* (the barrier kernels run one block of a thread per rank) */
    int mine = res == MOEX_OK && W <= 1024 && (W == 1 || cudaIpcGetMemHandle(&h[me], st->shared) == cudaSuccess);
    (void)cudaGetLastError();
    if (res == MOEX_OK && W > 1) res = alloc_buffer(ep, op, "handle", (size_t)W * sizeof *h + sizeof(int), &dh);
    if (res == MOEX_OK && W > 1) res = map_peers(ep, st, s, h, dh, &mine);
    if (res == MOEX_OK && cudaStreamSynchronize(s) != cudaSuccess)
        res = moex_fail(ep->ctx, MOEX_ERR_CUDA, "%s: the PEER setup failed on the device", op);
    free(h);
    if (dh) cudaFree(dh);
    if (res != MOEX_OK || !mine) {
        peer_release(st, W);
        return res;
    }
    /* the kernels' view: each rank's receive buffer, inbox and flags as mapped here */
    moex_ep_peer *view = (moex_ep_peer *)calloc((size_t)W, sizeof *view);
    if (!view) return moex_fail(ep->ctx, MOEX_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    for (int r = 0; r < W; r++) {
        char *base = r == me ? (char *)st->shared : (char *)st->mapped[r];
        view[r].rcv = base, view[r].inbox = (int64_t *)(base + inbox_at), view[r].flags = (uint64_t *)(base + flags_at);
    }
    void *peers = NULL, *epoch = NULL;
    res = alloc_buffer(ep, op, "peer table", (size_t)W * sizeof *view, &peers);
    if (res == MOEX_OK) res = alloc_buffer(ep, op, "epoch", sizeof(uint64_t), &epoch);
    st->peers = (moex_ep_peer *)peers, st->dev.peers = st->peers, st->dev.epoch = (uint64_t *)epoch;
    if (res == MOEX_OK) {
        CUDA_TRY(ep->ctx, op, cudaMemcpyAsync(peers, view, (size_t)W * sizeof *view, cudaMemcpyHostToDevice, s));
        CUDA_TRY(ep->ctx, op, cudaMemsetAsync(epoch, 0, sizeof(uint64_t), s));
        CUDA_TRY(ep->ctx, op, cudaStreamSynchronize(s));
    }
    free(view);
    if (res != MOEX_OK) return res;
    ep->rcv = st->shared;
    *ok = true;
    return MOEX_OK;
}

/* ep->out: the W outgoing regions (device table): region r of the send buffer (CAPACITY), or
 * region `rank` of rank r's receive buffer as mapped here (PEER). */
static moex_status set_out(moex_ep *ep, nccl_state *st, bool peer, cudaStream_t s) {
    const char *op = "moex_ep_create";
    const int W = ep->geom.world;
    const size_t region = (size_t)ep->geom.Tm * ep->geom.wire;
    void **table = (void **)calloc((size_t)W, sizeof(void *));
    if (!table) return moex_fail(ep->ctx, MOEX_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    for (int r = 0; r < W; r++) {
        char *base = !peer ? (char *)st->snd : r == ep->geom.rank ? (char *)st->shared : (char *)st->mapped[r];
        table[r] = base + (size_t)(peer ? ep->geom.rank : r) * region;
    }
    moex_status res = alloc_buffer(ep, op, "region table", (size_t)W * sizeof(void *), (void **)&st->out);
    if (res == MOEX_OK && (cudaMemcpyAsync(st->out, table, (size_t)W * sizeof(void *), cudaMemcpyHostToDevice, s) !=
                               cudaSuccess ||
                           cudaStreamSynchronize(s) != cudaSuccess))
        res = moex_fail(ep->ctx, MOEX_ERR_CUDA, "%s: copying the region table failed", op);
    free(table);
    ep->out = st->out;
    return res;
}

moex_status moex_ep_nccl_alloc(moex_ep *ep, size_t bytes) {
    const char *op = "moex_ep_create";
    nccl_state *st = (nccl_state *)ep->transport_state;
    ep->transport = &nccl_transport;   /* from here its destroy frees what was allocated */
    int prev = -1;
    MOEX_TRY(moex_cuda_device_enter(ep->ctx, op, &prev));
    cudaStream_t s = NULL;
    moex_status res = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess
                          ? MOEX_OK
                          : moex_fail(ep->ctx, MOEX_ERR_CUDA, "%s: cudaStreamCreate failed", op);
    bool peer = false;
    if (res == MOEX_OK && ep->cfg.transfer != MOEX_EP_TRANSFER_CAPACITY) {
        res = peer_setup(ep, st, bytes, s, &peer);
        if (res == MOEX_OK && !peer && ep->cfg.transfer == MOEX_EP_TRANSFER_PEER)
            res = moex_fail(ep->ctx, MOEX_ERR_UNSUPPORTED,
                            "%s: the PEER transfer needs every rank to map every other's memory (one node, "
                            "one process per GPU, peer access); use AUTO or CAPACITY", op);
    }
    if (res == MOEX_OK && peer) ep->transport = &peer_transport;
    if (res == MOEX_OK && !peer) res = alloc_buffer(ep, op, "send", bytes, &st->snd);
    if (res == MOEX_OK && !peer) res = alloc_buffer(ep, op, "receive", bytes, &ep->rcv);
    if (res == MOEX_OK) res = set_out(ep, st, peer, s);
    if (s) cudaStreamDestroy(s);
    moex_cuda_device_leave(ep->ctx, prev);
    return res;   /* on failure moex_ep_create destroys ep, freeing the buffers */
}
