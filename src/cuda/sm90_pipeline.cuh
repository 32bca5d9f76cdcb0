/*
 * sm90_pipeline.cuh - private: the stage ring of the Hopper grouped GEMMs, shared by the
 * M-grouped and the K-grouped kernels: S shared-memory stages (SM90_STAGES unless a kernel
 * fits more: the FP8 kernels' stages are smaller), each with a `full`
 * mbarrier (the producer's arrival plus the TMA bytes of the stage) and an `empty` mbarrier
 * (one arrival per consumer warpgroup of each CTA of the cluster). The producer thread and
 * the consumers each count the stages they passed in `it`; stage it % S is in its
 * (it / S)-th use, whose parity the waits below compute. With clusters (CM = 2) the
 * peer CTA's producer multicasts into this CTA's stages, so a consumer releases a stage on
 * the empty barrier of every CTA of the cluster, and a stage is refilled only when the
 * consumers of both CTAs are done with it.
 */
#ifndef MOEX_SM90_PIPELINE_CUH
#define MOEX_SM90_PIPELINE_CUH

#include "sm90_common.cuh"

#if MOEX_SM90_DEVICE

/* The dynamic shared memory, aligned up to 1024 bytes (the 128-byte swizzle's period) by an
 * offset from smem_raw, not through an integer: the compiler then keeps seeing shared memory
 * and emits shared stores (the staging buffers), not generic ones. */
static __device__ __forceinline__ uint8_t *sm90_smem_aligned(uint8_t *smem_raw) {
    return smem_raw + ((1024u - (sm90_smem_addr(smem_raw) & 1023u)) & 1023u);
}

/* Sets up the ring's mbarriers and waits until every thread of the CTA, and of the peer CTA
 * with clusters, can use them: the peer's barriers must exist before anything multicasts
 * into them. */
template <int CM, int S = SM90_STAGES>
static __device__ __forceinline__ void sm90_ring_init(uint64_t *full, uint64_t *empty) {
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) {
            sm90_mbar_init(&full[s], 1);
            sm90_mbar_init(&empty[s], 2 * CM);
        }
        sm90_mbar_init_fence();
    }
    if (CM > 1)
        sm90_cluster_sync();
    else
        __syncthreads();
}

/* Producer: waits until stage it % S is free (released by every consumer of its previous
 * use) and announces the `bytes` its loads will land in full; returns the stage. */
template <int S = SM90_STAGES>
static __device__ __forceinline__ uint32_t sm90_ring_fill(uint64_t *full, uint64_t *empty, uint32_t it,
                                                          uint32_t bytes) {
    const uint32_t s = it % S;
    sm90_mbar_wait(&empty[s], ((it / S) & 1u) ^ 1u);
    sm90_mbar_arrive_expect_tx(&full[s], bytes);
    return s;
}

/* Consumer: waits until stage it % S has landed; returns the stage. */
template <int S = SM90_STAGES> static __device__ __forceinline__ uint32_t sm90_ring_wait(uint64_t *full, uint32_t it) {
    const uint32_t s = it % S;
    sm90_mbar_wait(&full[s], (it / S) & 1u);
    return s;
}

/* Consumer warpgroup: hands stage it % S back once its wgmmas are done (the caller waited
 * for them). Thread tid < CM arrives on CTA tid's empty barrier of that stage. */
template <int CM, int S = SM90_STAGES>
static __device__ __forceinline__ void sm90_ring_release(uint64_t *empty, uint32_t it, int tid) {
    if (tid < CM) {
        uint64_t *bar = &empty[it % S];
        if (CM > 1)
            sm90_mbar_arrive_cluster(bar, (uint32_t)tid);
        else
            sm90_mbar_arrive(bar);
    }
}

#endif /* MOEX_SM90_DEVICE */

#endif /* MOEX_SM90_PIPELINE_CUH */
