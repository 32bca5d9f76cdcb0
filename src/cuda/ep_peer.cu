/*
 * ep_peer.cu - the PEER exchange of expert parallelism (src/core/ep.h): kernels that write
 * only the real rows into the peers' receive buffers, which every rank maps (CUDA IPC over
 * NVLink; set up by ep_nccl.cu), and the barriers that order those writes across the ranks'
 * GPUs. One exchange is three launches on the call's stream:
 *   enter  every rank signals every peer "ready to receive" (its stream's earlier work, which
 *          read its receive buffer, is done) and waits for all of them;
 *   copy   rows [0, send_counts[r]) of send region r go to region `rank` of rank r's receive
 *          buffer, and (learning the counts) send_counts[r] to rank r's inbox[rank];
 *   leave  every rank signals every peer "written" and waits for all of them, then (learning
 *          the counts) copies its inbox into recv_counts.
 * Signals are monotonic flags, one per (receiver, sender), in the receiver's mapped memory:
 * the n-th exchange signals 2n - 1 on entry and 2n on leaving (n: a device counter, so a graph
 * replay takes the next values), stored with release and read with acquire semantics at
 * system scope. Nothing is read on the host; every launch is capturable.
 */
#include "cuda_ops.h"
#include "ep_peer.h"

#define PEER_COPY_THREADS 256
#define PEER_COPY_BLOCKS_PER_SM 8

/* ---- system-scope flags -------------------------------------------------------------- */

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

/* ---- the three launches ---------------------------------------------------------------- */

static __global__ void ep_peer_enter_kernel(const moex_ep_peer *peers, int rank, int world, uint64_t *epoch) {
    __shared__ uint64_t n;
    if (threadIdx.x == 0) n = *epoch + 1;
    __syncthreads();
    if (threadIdx.x == 0) *epoch = n;
    signal_and_wait(peers, rank, world, 2 * n - 1);
}

static __global__ void ep_peer_leave_kernel(const moex_ep_peer *peers, int rank, int world, const uint64_t *epoch,
                                            int64_t *recv_counts) {
    __threadfence_system();   /* the copy kernel's writes before the signal */
    signal_and_wait(peers, rank, world, 2 * *epoch);
    const int r = threadIdx.x;
    if (recv_counts && r < world) recv_counts[r] = *(volatile int64_t *)(peers[rank].inbox + r);
}

/* The rows of the send buffer with i below region r's count go to row i of region `rank` of
 * rank r's receive buffer; one block per row, the rows taken in the order (i, r) so that the
 * blocks in flight write to every peer at once; 16-byte words (wire rows are multiples of 16
 * bytes, 16-aligned), COPY_UNROLL loads in flight per thread. */
#define COPY_UNROLL 4
static __global__ void ep_peer_copy_kernel(const uint4 *snd, const int64_t *send_counts, const moex_ep_peer *peers,
                                           int rank, int world, int64_t Tm, int64_t words, int learn) {
    if (learn && blockIdx.x == 0 && (int)threadIdx.x < world)
        peers[threadIdx.x].inbox[rank] = send_counts[threadIdx.x];
    const int64_t rows = (int64_t)world * Tm;
    for (int64_t q = blockIdx.x; q < rows; q += gridDim.x) {
        const int64_t r = q % world, i = q / world;
        const int64_t n = send_counts[r];
        if (i >= (n < Tm ? n : Tm)) continue;   /* a negative count sends nothing */
        const uint4 *src = snd + (r * Tm + i) * words;
        uint4 *dst = (uint4 *)peers[r].rcv + ((int64_t)rank * Tm + i) * words;
        const int64_t step = (int64_t)blockDim.x * COPY_UNROLL;
        for (int64_t w0 = threadIdx.x; w0 < words; w0 += step) {
            uint4 v[COPY_UNROLL];
#pragma unroll
            for (int u = 0; u < COPY_UNROLL; u++) {
                const int64_t w = w0 + (int64_t)u * blockDim.x;
                if (w < words) v[u] = src[w];
            }
#pragma unroll
            for (int u = 0; u < COPY_UNROLL; u++) {
                const int64_t w = w0 + (int64_t)u * blockDim.x;
                if (w < words) dst[w] = v[u];
            }
        }
    }
}

moex_status moex_ep_peer_exchange(moex_context *ctx, const moex_call *c, const moex_ep_peer_state *p,
                                  const moex_ep_geom *g, const moex_ep_exchange *x) {
    const cudaStream_t s = (cudaStream_t)c->stream;
    const int sms = moex_cuda_st(ctx)->num_sms;
    const int64_t rows = (int64_t)g->world * g->Tm, cap = (int64_t)(sms > 0 ? sms : 132) * PEER_COPY_BLOCKS_PER_SM;
    ep_peer_enter_kernel<<<1, 32 * ((g->world + 31) / 32), 0, s>>>(p->peers, g->rank, g->world, p->epoch);
    CUDA_TRY_LAUNCH(ctx, c->op);
    ep_peer_copy_kernel<<<(unsigned)(rows < cap ? rows : cap), PEER_COPY_THREADS, 0, s>>>(
        (const uint4 *)x->snd, x->send_counts, p->peers, g->rank, g->world, g->Tm, (int64_t)(g->wire / 16),
        x->learn_counts);
    CUDA_TRY_LAUNCH(ctx, c->op);
    ep_peer_leave_kernel<<<1, 32 * ((g->world + 31) / 32), 0, s>>>(p->peers, g->rank, g->world, p->epoch,
                                                                  x->learn_counts ? x->recv_counts : NULL);
    CUDA_TRY_LAUNCH(ctx, c->op);
    return MOEX_OK;
}
