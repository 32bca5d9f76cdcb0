/*
 * sm90_ptx_tma.cuh - private: the Tensor Memory Accelerator PTX of the Hopper GEMMs (sm_90a
 * device pass only, see sm90_ptx.cuh): tensor-map prefetch; 2-D and 3-D tensor loads global
 * -> shared completing on an mbarrier (also multicast into several CTAs of the cluster);
 * tensor stores and reduce-adds shared -> global in bulk groups, their commit and waits, and
 * the proxy fence that orders ordinary shared-memory writes before the copy engine reads them;
 * a tensor map in global memory rewritten on the device (its global address replaced) and the
 * fences that hand it between the generic and the tensor-map proxies.
 * Coordinates are innermost first, in elements; tmap is a CUtensorMap in parameter, constant
 * or global memory. One function per instruction form (dimensions, multicast, store or
 * reduce-add): their asm differs in the coordinate list and the modifiers, which PTX takes
 * only as text, so the functions look alike by construction.
 */
#ifndef MOEX_SM90_PTX_TMA_CUH
#define MOEX_SM90_PTX_TMA_CUH

#include "sm90_ptx.cuh"

#if MOEX_SM90_DEVICE

/* ---- loads: global (tensor map) -> shared, completing on an mbarrier ------------------ */

static __device__ __forceinline__ void sm90_tma_prefetch_map(const void *tmap) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)tmap) : "memory");
}

static __device__ __forceinline__ void sm90_tma_load_2d(void *dst, const void *tmap, uint64_t *bar, int32_t c0,
                                                        int32_t c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(sm90_smem_addr(dst)),
        "l"((uint64_t)tmap), "r"(sm90_smem_addr(bar)), "r"(c0), "r"(c1)
        : "memory");
}

static __device__ __forceinline__ void sm90_tma_load_3d(void *dst, const void *tmap, uint64_t *bar, int32_t c0,
                                                        int32_t c1, int32_t c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(sm90_smem_addr(dst)),
        "l"((uint64_t)tmap), "r"(sm90_smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}

/* A 2-D tensor load written to the same offset in every CTA of `cta_mask`, completing on the
 * barrier at the same offset in each of them. */
static __device__ __forceinline__ void sm90_tma_load_2d_multicast(void *dst, const void *tmap, uint64_t *bar,
                                                                  int32_t c0, int32_t c1, uint16_t cta_mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%4, %5}], [%2], %3;\n" ::"r"(sm90_smem_addr(dst)),
        "l"((uint64_t)tmap), "r"(sm90_smem_addr(bar)), "h"(cta_mask), "r"(c0), "r"(c1)
        : "memory");
}

/* The same in 3-D. */
static __device__ __forceinline__ void sm90_tma_load_3d_multicast(void *dst, const void *tmap, uint64_t *bar,
                                                                  int32_t c0, int32_t c1, int32_t c2,
                                                                  uint16_t cta_mask) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%4, %5, %6}], [%2], %3;\n" ::"r"(sm90_smem_addr(dst)),
        "l"((uint64_t)tmap), "r"(sm90_smem_addr(bar)), "h"(cta_mask), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}

/* ---- stores and reduce-adds: shared -> global (tensor map), in bulk groups ------------ */

/* Orders this thread's ordinary shared-memory writes before later async-proxy (TMA) reads. */
static __device__ __forceinline__ void sm90_fence_proxy_async_smem(void) {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

static __device__ __forceinline__ void sm90_tma_store_2d(const void *tmap, const void *src, int32_t c0, int32_t c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                     (uint64_t)tmap),
                 "r"(sm90_smem_addr(src)), "r"(c0), "r"(c1)
                 : "memory");
}

/* A 3-D tensor store of one box (a bulk group member, as sm90_tma_store_2d). */
static __device__ __forceinline__ void sm90_tma_store_3d(const void *tmap, const void *src, int32_t c0, int32_t c1,
                                                         int32_t c2) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                     (uint64_t)tmap),
                 "r"(sm90_smem_addr(src)), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}

/* global[box] += shared[box], element by element in the tensor map's type (one add per
 * element, done near L2: the old values never travel to the SM). A bulk group member. */
static __device__ __forceinline__ void sm90_tma_reduce_add_3d(const void *tmap, const void *src, int32_t c0,
                                                              int32_t c1, int32_t c2) {
    asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::
                     "l"((uint64_t)tmap),
                 "r"(sm90_smem_addr(src)), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}

static __device__ __forceinline__ void sm90_bulk_commit(void) {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

/* Waits until at most N bulk groups of this thread still read their shared-memory source. */
template <int N> static __device__ __forceinline__ void sm90_bulk_wait_read(void) {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

/* Waits until at most N bulk groups of this thread are still incomplete (writes done). */
template <int N> static __device__ __forceinline__ void sm90_bulk_wait(void) {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

/* ---- tensor maps in global memory, rewritten on the device ------------------------------ */

/* Replaces the global address of the tensor map at gmap (global memory, 128-byte aligned) with
 * p (16-byte aligned); the other fields stay. A generic-proxy write of the whole map. */
static __device__ __forceinline__ void sm90_tensormap_set_address(void *gmap, const void *p) {
    asm volatile("tensormap.replace.tile.global_address.b1024.b64 [%0], %1;\n" ::"l"((uint64_t)gmap),
                 "l"((uint64_t)p)
                 : "memory");
}

/* Releases this thread's earlier writes of tensor maps to the tensor-map proxy (GPU scope). */
static __device__ __forceinline__ void sm90_tensormap_release(void) {
    asm volatile("fence.proxy.tensormap::generic.release.gpu;\n" ::: "memory");
}

/* Acquires the tensor map at gmap (global memory) for this thread's TMA loads: they see its
 * latest released contents, not a copy the TMA unit cached from an earlier use of the address. */
static __device__ __forceinline__ void sm90_tensormap_acquire(const void *gmap) {
    asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"((uint64_t)gmap) : "memory");
}

#endif /* MOEX_SM90_DEVICE */

#endif /* MOEX_SM90_PTX_TMA_CUH */
