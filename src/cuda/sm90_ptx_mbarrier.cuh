/*
 * sm90_ptx_mbarrier.cuh - private: the mbarrier PTX of the Hopper GEMMs (sm_90a device pass
 * only, see sm90_ptx.cuh): initialisation and its fence, arrivals (plain, announcing TMA
 * bytes, and on the barrier of a peer CTA of the cluster) and the parity wait. Barriers live
 * in shared memory, 8 bytes each. One function per instruction form: PTX takes the form only
 * as text, so the functions look alike by construction.
 */
#ifndef MOEX_SM90_PTX_MBARRIER_CUH
#define MOEX_SM90_PTX_MBARRIER_CUH

#include "sm90_ptx.cuh"

#if MOEX_SM90_DEVICE

static __device__ __forceinline__ void sm90_mbar_init(uint64_t *bar, uint32_t arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(sm90_smem_addr(bar)), "r"(arrivals));
}

/* Makes the initialised barriers visible to the async proxy (TMA) before first use. */
static __device__ __forceinline__ void sm90_mbar_init_fence(void) {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

/* One arrival that also announces `bytes` of TMA transactions for the current phase. */
static __device__ __forceinline__ void sm90_mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(sm90_smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
}

static __device__ __forceinline__ void sm90_mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(sm90_smem_addr(bar)) : "memory");
}

/* Spins until the phase with the given parity has completed. A fresh barrier counts its
 * phase "parity 1" as completed, so waiting on parity 1 first returns at once. */
static __device__ __forceinline__ void sm90_mbar_wait(uint64_t *bar, uint32_t parity) {
    uint32_t addr = sm90_smem_addr(bar), done;
    do {
        asm volatile(
            "{\n.reg .pred p;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n"
            "}\n"
            : "=r"(done)
            : "r"(addr), "r"(parity)
            : "memory");
    } while (!done);
}

/* Arrives on the barrier at the same shared-memory offset in CTA `cta` of the cluster. The
 * default (.release at CTA scope) semantics: the callers arrive only after their wgmma reads
 * of the stage completed (wgmma wait), which is all the peer's producer needs before it
 * overwrites the stage. `.release.cluster` would make every arrival a cluster-scope memory
 * fence (a MEMBAR that stalls the warpgroup's next wgmma; docs/hopper.md has its cost). */
static __device__ __forceinline__ void sm90_mbar_arrive_cluster(uint64_t *bar, uint32_t cta) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(sm90_smem_addr(bar)), "r"(cta));
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}

#endif /* MOEX_SM90_DEVICE */

#endif /* MOEX_SM90_PTX_MBARRIER_CUH */
