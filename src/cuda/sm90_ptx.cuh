/*
 * sm90_ptx.cuh - private: what every Hopper (sm_90a) PTX wrapper file (sm90_ptx_*.cuh)
 * builds on: the device-pass guard MOEX_SM90_DEVICE and the shared-memory address of a
 * generic pointer.
 *
 * The wrappers exist only in the sm_90a device pass: MOEX_SM90_DEVICE is 1 there and 0 in
 * every other pass (host, sm_80, plain sm_90), so the other passes never see wgmma or
 * setmaxnreg. Kernels that use them put their body under `#if MOEX_SM90_DEVICE`.
 *
 * The wrappers, one topic per file, each instruction a named inline function:
 *   sm90_ptx_mbarrier.cuh   mbarriers: init, arrive (local, expect-tx, on a peer CTA), wait
 *   sm90_ptx_tma.cuh        TMA: tensor loads (multicast too), stores, reduce-adds, bulk groups
 *   sm90_ptx_wgmma.cuh      wgmma: shared-memory descriptors, the mma steps, fence/commit/wait
 *   sm90_ptx_sync.cuh       named barriers, clusters, setmaxnreg, flags between CTAs
 *   sm90_ptx_cp_async.cuh   small cp.async copies global -> shared
 */
#ifndef MOEX_SM90_PTX_CUH
#define MOEX_SM90_PTX_CUH

#include <stdint.h>

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MOEX_SM90_DEVICE 1
#else
#define MOEX_SM90_DEVICE 0
#endif

#if MOEX_SM90_DEVICE
/* The 32-bit shared-memory address of p (a pointer into shared memory). */
static __device__ __forceinline__ uint32_t sm90_smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
#endif /* MOEX_SM90_DEVICE */

#endif /* MOEX_SM90_PTX_CUH */
