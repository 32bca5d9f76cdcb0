/*
 * sm90_ptx_cp_async.cuh - private: small asynchronous copies global -> shared (cp.async, 4 or
 * 8 bytes a thread) for the Hopper forward's epilogue inputs, the bias row (sm_90a device
 * pass only, see sm90_ptx.cuh). A copy is complete for its own thread after
 * sm90_cp_async_wait_all; the other threads see it after a barrier that follows. One function
 * per instruction form: PTX takes the form only as text, so they look alike by construction.
 */
#ifndef MOEX_SM90_PTX_CP_ASYNC_CUH
#define MOEX_SM90_PTX_CP_ASYNC_CUH

#include "sm90_ptx.cuh"

#if MOEX_SM90_DEVICE

/* Copies BYTES (4 or 8) from global `src` to shared `dst` without holding registers. */
template <int BYTES> static __device__ __forceinline__ void sm90_cp_async(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(sm90_smem_addr(dst)), "l"(src), "n"(BYTES)
                 : "memory");
}
static __device__ __forceinline__ void sm90_cp_async_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
static __device__ __forceinline__ void sm90_cp_async_wait_all(void) {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

#endif /* MOEX_SM90_DEVICE */

#endif /* MOEX_SM90_PTX_CP_ASYNC_CUH */
