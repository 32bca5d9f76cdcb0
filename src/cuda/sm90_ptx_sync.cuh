/*
 * sm90_ptx_sync.cuh - private: the synchronisation and register-budget PTX of the Hopper
 * GEMMs (sm_90a device pass only, see sm90_ptx.cuh): named barriers (one warpgroup, or both
 * consumers), the cluster rank and the cluster-wide barrier, setmaxnreg (which moves
 * registers from the producer warpgroup to the consumers), and release/acquire flags between
 * CTAs of one grid (stream-K's hand-over).
 * One function per instruction form (scope, direction, register budget): PTX takes the form
 * only as text, so the functions look alike by construction (ep_peer.cu's system-scope flags
 * too).
 */
#ifndef MOEX_SM90_PTX_SYNC_CUH
#define MOEX_SM90_PTX_SYNC_CUH

#include "sm90_ptx.cuh"

#if MOEX_SM90_DEVICE

/* Barrier `id` (1..15) over `threads` threads (a multiple of 32), e.g. one warpgroup. */
static __device__ __forceinline__ void sm90_named_barrier(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/* ---- clusters (CTAs sharing tiles through TMA multicast) ------------------------------ */

static __device__ __forceinline__ uint32_t sm90_cluster_rank(void) {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}

/* Every thread of every CTA in the cluster arrives, then waits (release / acquire). */
static __device__ __forceinline__ void sm90_cluster_sync(void) {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

/* ---- register budget per warpgroup ------------------------------------------------- */

template <int R> static __device__ __forceinline__ void sm90_setmaxnreg_dec(void) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R> static __device__ __forceinline__ void sm90_setmaxnreg_inc(void) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}

/* ---- flags between CTAs of one grid -------------------------------------------------
 * The release store orders the writes the storing thread has seen (its CTA's, after a
 * barrier) before it; the acquire load orders the reads after it (its CTA's, after a
 * barrier). GPU scope. */
static __device__ __forceinline__ void sm90_flag_release(int *flag, int v) {
    asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(flag), "r"(v) : "memory");
}
static __device__ __forceinline__ int sm90_flag_acquire(const int *flag) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
    return v;
}

#endif /* MOEX_SM90_DEVICE */

#endif /* MOEX_SM90_PTX_SYNC_CUH */
