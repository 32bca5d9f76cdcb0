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
 * Errors: every NCCL failure is MOEX_ERR_CUDA (the CUDA stack's communication layer failed:
 * a CUDA error inside NCCL, a system or remote peer error, or a communicator NCCL refuses),
 * its message naming the call, NCCL's error string and ncclGetLastError's detail.
 */
#include <nccl.h>

#include "cuda_check.h"
#include "ep.h"

/* The communicator, copied from *cfg.comm at init: the caller's variable may go out of scope,
 * the communicator itself must outlive the EP context (moex.h). */
static ncclComm_t comm_of(const moex_ep *ep) { return (ncclComm_t)ep->transport_state; }

static moex_status nccl_fail(moex_ep *ep, ncclComm_t comm, const char *op, const char *call, ncclResult_t res) {
    const char *detail = comm ? ncclGetLastError(comm) : NULL;
    return moex_fail(ep->ctx, MOEX_ERR_CUDA, "%s: %s failed: NCCL error %d (%s)%s%s", op, call, (int)res,
                     ncclGetErrorString(res), detail && detail[0] ? ": " : "", detail ? detail : "");
}

#define NCCL_TRY(ep, comm, op, call)                                              \
    do {                                                                          \
        const ncclResult_t r_ = (call);                                           \
        if (r_ != ncclSuccess) return nccl_fail((ep), (comm), (op), #call, r_);   \
    } while (0)

/* A non-blocking communicator (ncclConfig_t blocking = 0) may answer ncclInProgress: the
 * operation completes in the background; wait for it so that a return means enqueued. */
static ncclResult_t wait_async(ncclComm_t comm, ncclResult_t res) {
    while (res == ncclInProgress) {
        if (ncclCommGetAsyncError(comm, &res) != ncclSuccess) return ncclInternalError;
    }
    return res;
}

/* ---- the exchange -------------------------------------------------------------------- */

/* Runs inside a call (the core's enter made ctx->device, the communicator's, current). On a
 * failure inside the group the group is still closed, so NCCL is left usable. */
static moex_status nccl_exchange(moex_ep *ep, const moex_call *c, const moex_ep_exchange *x) {
    const ncclComm_t comm = comm_of(ep);
    const moex_ep_geom *g = &ep->geom;
    const cudaStream_t stream = (cudaStream_t)c->stream;
    const size_t region = (size_t)g->Tm * g->wire;   /* W Tm wire rows fit PTRDIFF_MAX (ep.c) */
    const char *snd = (const char *)x->snd;
    char *rcv = (char *)x->rcv;

    NCCL_TRY(ep, comm, c->op, ncclGroupStart());
    ncclResult_t res = ncclSuccess;
    const char *what = "";
    /* Per peer, the same order on every rank (rows, then the count): NCCL matches the sends
     * to a peer with that peer's receives in order. */
    for (int r = 0; r < g->world; r++) {
        if ((res = ncclSend(snd + (size_t)r * region, region, ncclInt8, r, comm, stream)) != ncclSuccess) {
            what = "ncclSend(rows)";
            break;
        }
        if ((res = ncclRecv(rcv + (size_t)r * region, region, ncclInt8, r, comm, stream)) != ncclSuccess) {
            what = "ncclRecv(rows)";
            break;
        }
        if (!x->learn_counts) continue;
        if ((res = ncclSend(x->send_counts + r, 1, ncclInt64, r, comm, stream)) != ncclSuccess) {
            what = "ncclSend(count)";
            break;
        }
        if ((res = ncclRecv(x->recv_counts + r, 1, ncclInt64, r, comm, stream)) != ncclSuccess) {
            what = "ncclRecv(count)";
            break;
        }
    }
    const ncclResult_t end = wait_async(comm, ncclGroupEnd());
    if (res != ncclSuccess) return nccl_fail(ep, comm, c->op, what, res);
    if (end != ncclSuccess) return nccl_fail(ep, comm, c->op, "ncclGroupEnd()", end);
    return MOEX_OK;
}

/* ---- the EP context ------------------------------------------------------------------ */

/* Frees the transfer buffers on ctx->device, the caller's device restored. Not collective. */
static void nccl_destroy(moex_ep *ep) {
    int prev = -1;
    const bool switched = cudaGetDevice(&prev) == cudaSuccess && prev != ep->ctx->device &&
                          cudaSetDevice(ep->ctx->device) == cudaSuccess;
    if (ep->snd) cudaFree(ep->snd);
    if (ep->rcv) cudaFree(ep->rcv);
    if (switched) cudaSetDevice(prev);
    ep->snd = ep->rcv = NULL;
    ep->transport_state = NULL;
}

static const moex_ep_transport nccl_transport = {"nccl", MOEX_EP_TRANSFER_CAPACITY, nccl_exchange, nccl_destroy};

moex_status moex_ep_nccl_init(moex_ep *ep) {
    const char *op = "moex_ep_create";
    const ncclComm_t comm = *(const ncclComm_t *)ep->cfg.comm;
    if (!comm) return moex_fail(ep->ctx, MOEX_ERR_INVALID_ARG, "%s: *comm is a NULL ncclComm_t", op);
    int rank = -1, world = 0, dev = -1;
    NCCL_TRY(ep, comm, op, ncclCommUserRank(comm, &rank));
    NCCL_TRY(ep, comm, op, ncclCommCount(comm, &world));
    NCCL_TRY(ep, comm, op, ncclCommCuDevice(comm, &dev));
    if (dev != ep->ctx->device)
        return moex_fail(ep->ctx, MOEX_ERR_INVALID_ARG,
                         "%s: the NCCL communicator is on CUDA device %d, the moex context on device %d "
                         "(create both on the same device)", op, dev, ep->ctx->device);
    if (world < 1 || rank < 0 || rank >= world)
        return moex_fail(ep->ctx, MOEX_ERR_INVALID_ARG, "%s: the NCCL communicator has rank %d of %d", op, rank,
                         world);
    ep->geom.rank = rank, ep->geom.world = world;
    ep->transport_state = (void *)comm;
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

moex_status moex_ep_nccl_alloc(moex_ep *ep, size_t bytes) {
    const char *op = "moex_ep_create";
    ep->transport = &nccl_transport;   /* from here its destroy frees what was allocated */
    int prev = -1;
    CUDA_TRY(ep->ctx, op, cudaGetDevice(&prev));
    if (prev != ep->ctx->device) CUDA_TRY(ep->ctx, op, cudaSetDevice(ep->ctx->device));
    moex_status st = alloc_buffer(ep, op, "send", bytes, &ep->snd);
    if (st == MOEX_OK) st = alloc_buffer(ep, op, "receive", bytes, &ep->rcv);
    if (prev != ep->ctx->device) cudaSetDevice(prev);
    return st;   /* on failure moex_ep_create destroys ep, freeing the buffers */
}
