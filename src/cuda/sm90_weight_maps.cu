/*
 * sm90_weight_maps.cu - the tensor maps through which the Hopper M-grouped kernel reads a
 * discrete weight (G separate matrices behind a device array of pointers): per group, copies
 * of the kernel's weight-map templates with the group's matrix as their global address,
 * written on the device, so that the pointers never reach the host and a launch captured in
 * a CUDA graph reads the pointers of each replay. The GEMM acquires each map before its
 * loads (sm90_tensormap_acquire), which also drops any copy the TMA unit cached from an
 * earlier call that used the same scratch.
 */
#include "sm90_common.cuh"

size_t moex_sm90_weight_maps_bytes(int64_t G) {
    return G > 0 ? (size_t)G * SM90_WEIGHT_MAPS * sizeof(CUtensorMap) : 0;
}

/* One thread per map: i = SM90_WEIGHT_MAPS * g + j. */
__global__ void sm90_weight_maps_kernel(const __grid_constant__ sm90_weight_templates t, void *const *ptrs, int G,
                                        CUtensorMap *maps, int *bad_flag, int bad_value) {
#if MOEX_SM90_DEVICE
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)G * SM90_WEIGHT_MAPS) return;
    const char *p = (const char *)ptrs[i / SM90_WEIGHT_MAPS];
    const uintptr_t mis = (uintptr_t)p & 15u;
    if (mis != 0) {
        p -= mis;
        if (bad_flag != NULL) atomicCAS(bad_flag, 0, bad_value);
    }
    const uint4 *src = (const uint4 *)&t.m[i % SM90_WEIGHT_MAPS];
    uint4 *dst = (uint4 *)&maps[i];
#pragma unroll
    for (int k = 0; k < (int)(sizeof(CUtensorMap) / sizeof(uint4)); k++) dst[k] = src[k];
    sm90_tensormap_set_address(&maps[i], p);
    sm90_tensormap_release();
#endif
}

cudaError_t sm90_weight_maps_write(const sm90_weight_templates *t, void *const *ptrs, int G, CUtensorMap *maps,
                                   int *bad_flag, int bad_value, cudaStream_t stream) {
    const int threads = 128;
    const int64_t n = (int64_t)G * SM90_WEIGHT_MAPS;
    sm90_weight_maps_kernel<<<(unsigned)((n + threads - 1) / threads), threads, 0, stream>>>(*t, ptrs, G, maps,
                                                                                          bad_flag, bad_value);
    return cudaGetLastError();
}
