/*
 * cuda_quant.cuh - private: what the CUDA quantization kernels share (cuda_quantize.cu for
 * grouped rows and weights, cuda_weight_dequantize.cu for weights back): grid sizes, the
 * FP8 cast by the conversion instruction (single and paired), 16-bit unpacking, L2 prefetch
 * and cp.async wrappers, amax reductions on |x| bit patterns, and the
 * kernel that turns amaxes into current-scaling scales.
 */
#ifndef MOEX_CUDA_QUANT_CUH
#define MOEX_CUDA_QUANT_CUH

#include <cuda_fp8.h>

#include "quant_math.h"
#include "cuda_common.cuh"

/* Grid-stride kernels cap their grids here, so no limit of a size comes from the grid. */
#define QUANT_MAX_GRID_X (1 << 20)
#define QUANT_MAX_GRID_Y 65535

static inline unsigned quant_grid_x(int64_t n) { return (unsigned)(n < QUANT_MAX_GRID_X ? n : QUANT_MAX_GRID_X); }
static inline unsigned quant_grid_y(int64_t n) { return (unsigned)(n < QUANT_MAX_GRID_Y ? n : QUANT_MAX_GRID_Y); }
static __host__ __device__ __forceinline__ int64_t cdiv(int64_t a, int64_t b) { return a / b + (a % b != 0); }

/* fp8(v) of docs/ops.md 9.1 (= moex_fp8_encode, bit for bit: the quantization tests check it
 * against the fp64 reference) by the conversion instruction cvt.rn.satfinite. */
static __device__ __forceinline__ uint8_t fp8_encode(float v, moex_fp8_format f) {
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, f.mbits == 3 ? __NV_E4M3 : __NV_E5M2);
}

/* fp8(a) | fp8(b) << 8, by the paired conversion instruction (the same rounding). */
static __device__ __forceinline__ uint32_t fp8x2_encode(float a, float b, moex_fp8_format f) {
    return (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, f.mbits == 3 ? __NV_E4M3 : __NV_E5M2);
}

/* A 16-bit element from its bits (for unpacking vector loads). */
template <typename T> __device__ __forceinline__ T bits_to(uint16_t b);
template <> __device__ __forceinline__ bf16 bits_to<bf16>(uint16_t b) { return __ushort_as_bfloat16(b); }
template <> __device__ __forceinline__ f16 bits_to<f16>(uint16_t b) { return __ushort_as_half(b); }
template <> __device__ __forceinline__ float bits_to<float>(uint16_t b) { return (float)b; }   /* unused */

/* A hint: bring the 128-byte line of p into L2. */
static __device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

/* 16 bytes global -> shared without holding registers (cp.async, sm_80 and up), zero-filled
 * when !valid (src is then not read); complete for the issuing thread after
 * cp_async_wait_all. */
static __device__ __forceinline__ void cp_async_16(void *dst, const void *src, bool valid) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
static __device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
static __device__ __forceinline__ void cp_async_wait_all(void) {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

/* The bit pattern of |v|: as unsigned, ordered as the magnitudes, with Inf above every
 * finite value and NaN above Inf (so a max of patterns is moex_amax_combine's NaN-wins max,
 * in any order: deterministic with atomicMax). */
static __device__ __forceinline__ uint32_t abs_bits(float v) { return __float_as_uint(v) & 0x7FFFFFFFu; }

static __device__ __forceinline__ uint32_t warp_max_u32(uint32_t v) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Block max of one value per thread (blockDim.x a multiple of 32); all threads get it.
 * `red` is shared scratch of 32 words. Starts with a barrier, so the caller's shared memory
 * of the previous iteration is free once it returns. */
static __device__ __forceinline__ uint32_t block_max_u32(uint32_t v, uint32_t *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max_u32(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    return warp_max_u32(lane < nw ? red[lane] : 0u);
}

/* Current scaling, per set i < n: s = moex_quant_scale(amax) from the amax bit patterns,
 * mult[i] = s, 1/s into the scales of the copies present (NULL: absent), amax out. */
static __global__ void current_scale_kernel(const uint32_t *amax_bits, int64_t n, float eps, float fp8_max,
                                            moex_scale_rounding rounding, float *mult, float *row_scales,
                                            float *col_scales, float *amax_out) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float amax = __uint_as_float(amax_bits[i]);
        const float s = moex_quant_scale(amax, eps, fp8_max, rounding);
        const float inv = 1.0f / s;
        mult[i] = s;
        if (row_scales) row_scales[i] = inv;
        if (col_scales) col_scales[i] = inv;
        if (amax_out) amax_out[i] = amax;
    }
}

#endif /* MOEX_CUDA_QUANT_CUH */
