/*
 * sm90_weight_maps.cu - the tensor maps through which the Hopper M-grouped kernel reads a
 * discrete weight (G separate matrices behind a device array of pointers): per group, copies
 * of the kernel's weight-map templates with the group's matrix as their global address,
 * written on the device, so that the pointers never reach the host and a launch captured in
 * a CUDA graph reads the pointers of each replay. Either each GEMM launch writes the two it
 * reads into its scratch first (sm90_weight_maps_write), or the caller keeps them: one plane
 * per box height, written once for as long as the pointers hold (moex_sm90_kept_maps_write).
 * The GEMM acquires each map before its loads (sm90_tensormap_acquire), which also drops any
 * copy the TMA unit cached from an earlier call that used the same memory.
 */
#include "sm90_common.cuh"

size_t moex_sm90_weight_maps_bytes(int64_t G) { return G > 0 ? (size_t)G * 2 * sizeof(CUtensorMap) : 0; }

/* One thread per map: i = G * j + g. */
__global__ void sm90_weight_maps_kernel(const __grid_constant__ sm90_weight_templates t, void *const *ptrs, int G,
                                        CUtensorMap *maps, int *bad_flag, int bad_value) {
#if MOEX_SM90_DEVICE
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)G * t.n) return;
    const char *p = (const char *)ptrs[i % G];
    const uintptr_t mis = (uintptr_t)p & 15u;
    if (mis != 0) {
        p -= mis;
        if (bad_flag != NULL) atomicCAS(bad_flag, 0, bad_value);
    }
    const uint4 *src = (const uint4 *)&t.m[i / G];
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
    const int64_t n = (int64_t)G * t->n;
    sm90_weight_maps_kernel<<<(unsigned)((n + threads - 1) / threads), threads, 0, stream>>>(*t, ptrs, G, maps,
                                                                                          bad_flag, bad_value);
    return cudaGetLastError();
}

extern "C" size_t moex_sm90_kept_maps_bytes(const moex_sm90_context *c, moex_dtype dtype, int64_t G, int64_t N,
                                            int64_t K) {
    if (c == NULL || (dtype != MOEX_DTYPE_BF16 && dtype != MOEX_DTYPE_F16)) return 0;
    if (G < 1 || G > INT32_MAX / SM90_KEPT_PLANES || !sm90_features_ok(K, N)) return 0;
    return (size_t)G * SM90_KEPT_PLANES * sizeof(CUtensorMap);
}

extern "C" moex_status moex_sm90_kept_maps_write(const moex_sm90_context *c, moex_dtype dtype, int64_t G, int64_t N,
                                                 int64_t K, void *const *ptrs, void *maps, int *bad_flag,
                                                 int bad_value, moex_stream stream, const char **why) {
    if (moex_sm90_kept_maps_bytes(c, dtype, G, N, K) == 0 || ((uintptr_t)maps & 127u) != 0 ||
        ((uintptr_t)ptrs & 7u) != 0) {
        *why = "sm90 weight maps: unsupported device, dtype, shape or alignment";
        return MOEX_ERR_UNSUPPORTED;
    }
    sm90_weight_templates t;
    memset(&t, 0, sizeof t);
    t.n = SM90_KEPT_PLANES;
    const CUtensorMapL2promotion promo = sm90_l2_promotion(MOEX_SM90_L2_PROMOTION);
    for (int j = 0; j < SM90_KEPT_PLANES; j++)   /* any 16-byte aligned address stands in */
        if (!sm90_make_weight_map(c, &t.m[j], dtype, maps, 1, N, K, SM90_KEPT_ROWS[j], promo, "sm90 weight maps",
                                  why))
            return MOEX_ERR_CUDA;
    if (sm90_weight_maps_write(&t, ptrs, (int)G, (CUtensorMap *)maps, bad_flag, bad_value, (cudaStream_t)stream) !=
        cudaSuccess) {
        cudaGetLastError();
        *why = "sm90 weight maps: the launch failed";
        return MOEX_ERR_CUDA;
    }
    return MOEX_OK;
}
