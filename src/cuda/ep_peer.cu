/*
 * ep_peer.cu - the PEER exchange of expert parallelism (src/core/ep.h): the kernels that
 * produce outgoing rows (pack, gather_local) write them straight into the peers' receive
 * buffers, which every rank maps (CUDA IPC over NVLink; set up by ep_nccl.cu), so only the
 * real rows move and nothing is staged; these barriers order those writes across the ranks'
 * GPUs:
 *   open      every rank signals every peer "ready to receive" (its stream's earlier work,
 *             which read its receive buffer, is done) and waits for all of them;
 *   exchange  (after the writing kernel) learning the counts, send_counts[r] goes to rank r's
 *             inbox[rank]; every rank signals every peer "written" and waits for all of them,
 *             then copies its inbox into recv_counts.
 * Signals are monotonic flags, one per (receiver, sender), in the receiver's mapped memory:
 * the n-th exchange signals 2n - 1 on opening and 2n when written (n: a device counter, so a
 * graph replay takes the next values), stored with release and read with acquire semantics
 * at system scope. Nothing is read on the host; every launch is capturable.
 */
#include "cuda_ops.h"
#include "ep_peer.h"


/* ---- system-scope flags -------------------------------------------------------------- */
/* One function per instruction form, as sm90_ptx_sync.cuh's GPU-scope flags between CTAs:
 * PTX takes the scope and the width only as text, so the two files' flags look alike by
 * construction (those are sm_90a only, of another scope and width). */

static __device__ __forceinline__ void store_release_sys(uint64_t *p, uint64_t v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

static __device__ __forceinline__ uint64_t load_acquire_sys(const uint64_t *p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

/* Thread r < world signals `value` to rank r and waits for rank r's signal to this rank. */
static __device__ __forceinline__ void signal_and_wait(const moex_ep_peer *peers, int rank, int world,
                                                       uint64_t value) {
    const int r = threadIdx.x;
    if (r >= world) return;
    store_release_sys(peers[r].flags + rank, value);
    const uint64_t *mine = peers[rank].flags + r;
    while (load_acquire_sys(mine) < value) {
    }
}

/* ---- the two launches ---------------------------------------------------------------- */

static __global__ void ep_peer_open_kernel(const moex_ep_peer *peers, int rank, int world, uint64_t *epoch) {
    __shared__ uint64_t n;
    if (threadIdx.x == 0) n = *epoch + 1;
    __syncthreads();
    if (threadIdx.x == 0) *epoch = n;
    signal_and_wait(peers, rank, world, 2 * n - 1);
}

static __global__ void ep_peer_close_kernel(const moex_ep_peer *peers, int rank, int world, const uint64_t *epoch,
                                            const int64_t *send_counts, int64_t *recv_counts) {
    const int r = threadIdx.x;
    if (recv_counts && r < world) peers[r].inbox[rank] = send_counts[r];
    __threadfence_system();   /* the writing kernel's rows and the counts before the signal */
    signal_and_wait(peers, rank, world, 2 * *epoch);
    if (recv_counts && r < world) recv_counts[r] = *(volatile int64_t *)(peers[rank].inbox + r);
}

/* One block of a thread per rank (world <= 1024, ep_nccl.cu). */
static unsigned barrier_threads(int world) { return 32u * (unsigned)((world + 31) / 32); }

moex_status moex_ep_peer_open(moex_context *ctx, const moex_call *c, const moex_ep_peer_state *p,
                              const moex_ep_geom *g) {
    ep_peer_open_kernel<<<1, barrier_threads(g->world), 0, (cudaStream_t)c->stream>>>(p->peers, g->rank, g->world,
                                                                                      p->epoch);
    CUDA_TRY_LAUNCH(ctx, c->op);
    return MOEX_OK;
}

moex_status moex_ep_peer_exchange(moex_context *ctx, const moex_call *c, const moex_ep_peer_state *p,
                                  const moex_ep_geom *g, const moex_ep_exchange *x) {
    ep_peer_close_kernel<<<1, barrier_threads(g->world), 0, (cudaStream_t)c->stream>>>(
        p->peers, g->rank, g->world, p->epoch, x->send_counts, x->learn_counts ? x->recv_counts : NULL);
    CUDA_TRY_LAUNCH(ctx, c->op);
    return MOEX_OK;
}
