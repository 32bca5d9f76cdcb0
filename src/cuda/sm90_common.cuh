/*
 * sm90_common.cuh - private: what the Hopper (sm_90a) grouped GEMM kernels share: the CTA
 * shape (one TMA producer warpgroup and two wgmma consumer warpgroups, 128x256x64 tiles,
 * a 4-stage ring) and the setup of its barriers, packing of f32 pairs into bf16/f16, and the
 * host helpers (tensor-map encoding, the device check). Used by sm90_grouped_gemm.cu and
 * sm90_grouped_wgrad.cu.
 */
#ifndef MOEX_SM90_COMMON_CUH
#define MOEX_SM90_COMMON_CUH

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "sm90_grouped_gemm.h"
#include "sm90_ptx.cuh"

#define SM90_BM 128                 /* output rows per tile (2 consumers x 64)        */
#define SM90_BN 256                 /* output columns per tile                        */
#define SM90_BK 64                  /* k per stage: one 128-byte swizzle row of bf16   */
#define SM90_STAGES 4
#define SM90_BAND 8                 /* column tiles per band of the tile order         */
#define SM90_BAND_ROWS 2048         /* input rows per block of a band                   */
#define SM90_THREADS 384

#if MOEX_SM90_DEVICE
/* f32 pair -> two packed 16-bit values of the input dtype (round to nearest even) */
template <int IS_F16> struct sm90_io;
template <> struct sm90_io<0> {
    static __device__ __forceinline__ uint32_t pack(float a, float b) {
        __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
        return *(uint32_t *)&v;
    }
};
template <> struct sm90_io<1> {
    static __device__ __forceinline__ uint32_t pack(float a, float b) {
        __half2 v = __floats2half2_rn(a, b);
        return *(uint32_t *)&v;
    }
};

/* This thread's warpgroup (0: producer, 1 and 2: consumers), through a shuffle: the compiler
 * then knows it is warp-uniform and keeps the values derived from it (the consumers' wgmma
 * descriptors) in uniform registers. */
static __device__ __forceinline__ int sm90_warpgroup(void) {
    return __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0);
}

/* Group schedule, by a whole warp (all 32 lanes call it with the same arguments): lane i
 * reads the split value of group g0 + i, clipped to [0, T] (0 for groups past G), into *s,
 * and returns the inclusive prefix sum of those values over lanes 0..i (at most 32 T: no
 * overflow). The consumers seek their next group 32 groups per step this way; one group per
 * step costs a dependent load each (at G = 128 about 9% of the consumers' stall samples). */
static __device__ __forceinline__ int64_t sm90_warp_split_scan(const int64_t *splits, int64_t g0, int64_t G, int64_t T,
                                                               int64_t *s) {
    const int lane = threadIdx.x % 32;
    int64_t v = g0 + lane < G ? __ldg(splits + g0 + lane) : 0;
    v = v < 0 ? 0 : v > T ? T : v;
    *s = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int64_t u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += u;
    }
    return v;
}

/* A consumer warpgroup hands a stage back: with clusters, thread `cta` arrives on CTA cta's
 * empty barrier of that stage (the peer's producer multicasts into this CTA too). */
template <int CM> static __device__ __forceinline__ void sm90_release_stage(uint64_t *bar, int cta) {
    if (CM > 1)
        sm90_mbar_arrive_cluster(bar, (uint32_t)cta);
    else
        sm90_mbar_arrive(bar);
}

/* Sets up the stage ring's mbarriers (full: the producer's arrival plus the TMA bytes; empty:
 * one arrival per consumer warpgroup of each of the CM CTAs of the cluster) and waits until
 * every thread of the CTA, and of the peer CTA with clusters, can use them: the peer's
 * barriers must exist before anything multicasts into them. */
template <int CM> static __device__ __forceinline__ void sm90_ring_init(uint64_t *full, uint64_t *empty) {
    if (threadIdx.x == 0) {
        for (int s = 0; s < SM90_STAGES; s++) {
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
#endif /* MOEX_SM90_DEVICE */

/* ---- host helpers ------------------------------------------------------------------- */

static inline PFN_cuTensorMapEncodeTiled_v12000 sm90_encode_fn(void) {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = NULL;
    if (fn == NULL) {
        void *p = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
    }
    return fn;
}

static inline bool sm90_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Whether `device` is a compute capability 9.0 GPU, `kernel` has its sm_90a image in this
 * binary (a JIT of the sm_80 PTX would compile the guarded PTX out), and the driver gives
 * the tensor-map encoder. Reads no device memory; clears any error it provoked. */
static inline bool sm90_device_ok(int device, const void *kernel) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    if (major != 9 || minor != 0) return false;
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, kernel) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return fa.binaryVersion == 90 && sm90_encode_fn() != NULL;
}
/* The L2 promotion of the tensor maps: tune->l2_promotion (0: 256 bytes; 1: none; 64, 128
 * or 256 bytes). */
static inline CUtensorMapL2promotion sm90_l2_promotion(const moex_sm90_tuning *tune) {
    switch (tune != NULL ? tune->l2_promotion : 0) {
    case 1: return CU_TENSOR_MAP_L2_PROMOTION_NONE;
    case 64: return CU_TENSOR_MAP_L2_PROMOTION_L2_64B;
    case 128: return CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
    default: return CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
    }
}

/* A 2-D or 3-D row-major bf16/f16/f32 tensor map: dims innermost first, box as given (its
 * inner extent at most 128 bytes), 128-byte swizzle, zero fill outside the tensor, L2
 * promotion `promo`. */
static inline bool sm90_make_map(CUtensorMap *m, moex_dtype dt, const void *base, int rank, const cuuint64_t *dims,
                                 const cuuint32_t *box, CUtensorMapL2promotion promo) {
    if (!sm90_aligned16(base)) return false;
    const cuuint64_t es = dt == MOEX_DTYPE_F32 ? 4 : 2;
    cuuint64_t strides[2];
    strides[0] = dims[0] * es;
    if (rank == 3) strides[1] = dims[0] * dims[1] * es;
    const cuuint32_t estr[3] = {1, 1, 1};
    CUresult r = sm90_encode_fn()(m, dt == MOEX_DTYPE_F32   ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                     : dt == MOEX_DTYPE_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                            : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                                  (cuuint32_t)rank, (void *)base, dims, strides, box, estr,
                                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                  promo, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS;
}

#define SM90_FAIL(st, msg)               \
    do {                                 \
        if (why != NULL) *why = (msg);   \
        return (st);                     \
    } while (0)

#endif /* MOEX_SM90_COMMON_CUH */
