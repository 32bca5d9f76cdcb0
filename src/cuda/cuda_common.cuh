/*
 * cuda_common.cuh - private device helpers shared by the CUDA kernels: f32 <-> storage
 * conversions for f32/bf16/f16, fixed-order warp and block reductions, the int64 block
 * scan, the split values' clamping and the groups' end, the bad-input flag, and the group
 * lookup in the schedule.
 */
#ifndef MOEX_CUDA_COMMON_CUH
#define MOEX_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "moex.h"
#include "splits_rule.h"

typedef __nv_bfloat16 bf16;
typedef __half f16;

static __device__ __forceinline__ float to_f32(float v) { return v; }
static __device__ __forceinline__ float to_f32(bf16 v) { return __bfloat162float(v); }
static __device__ __forceinline__ float to_f32(f16 v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ f16 from_f32<f16>(float v) { return __float2half_rn(v); }

/* Host: launch(tag) with tag a moex_elem<T> of the element type T of dt (f32, bf16, or else
 * f16), for a launch templated on T: by_dtype(dt, [&](auto e) { run<typename decltype(e)::type>(); }). */
template <typename T> struct moex_elem {
    typedef T type;
};
template <typename Launch> static void by_dtype(moex_dtype dt, Launch launch) {
    if (dt == MOEX_DTYPE_F32) launch(moex_elem<float>());
    else if (dt == MOEX_DTYPE_BF16) launch(moex_elem<bf16>());
    else launch(moex_elem<f16>());
}

/* Reads element i of a tensor whose dtype is only known at run time (f32, bf16 or f16). */
static __device__ __forceinline__ float load_any(const void *p, int is_f32, int is_bf16, int64_t i) {
    if (is_f32) return ((const float *)p)[i];
    if (is_bf16) return __bfloat162float(((const bf16 *)p)[i]);
    return __half2float(((const f16 *)p)[i]);
}

/* Writes v, rounded to the tensor's dtype (f32, bf16 or f16, known at run time), to element i. */
static __device__ __forceinline__ void store_any(void *p, int is_f32, int is_bf16, int64_t i, float v) {
    if (is_f32) ((float *)p)[i] = v;
    else if (is_bf16) ((bf16 *)p)[i] = from_f32<bf16>(v);
    else ((f16 *)p)[i] = from_f32<f16>(v);
}

/* Sum over the 32 lanes in a fixed butterfly order: every lane gets the same bits. */
static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Block sum (blockDim.x a multiple of 32, at most 1024) in a fixed order; all threads get
 * the result. `red` is shared scratch of 32 floats. */
static __device__ __forceinline__ float block_sum(float v, float *red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = lane < nw ? red[lane] : 0.0f;
    return warp_sum(t);
}

/* Inclusive block scan of one int64 per thread (blockDim.x == 1024). `sh` holds 32
 * int64. Returns the thread's inclusive prefix; *total gets the chunk's sum. */
static __device__ __forceinline__ int64_t block_scan_i64(int64_t v, int64_t *sh, int64_t *total) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        int64_t u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += u;
    }
    __syncthreads();
    if (lane == 31) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        int64_t w = sh[lane];
        for (int o = 1; o < 32; o <<= 1) {
            int64_t u = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += u;
        }
        sh[lane] = w;
    }
    __syncthreads();
    if (warp > 0) v += sh[warp - 1];
    *total = sh[31];
    return v;
}

/* E = min(S, T), S the sum of the counted splits (splits_rule.h): the end of the groups' rows,
 * as the schedule computes it, by one block (every thread gets it; `sh` holds 32 int64);
 * *bad (every thread's) when a split is negative or S > T. */
static __device__ __forceinline__ int64_t block_groups_end(const int64_t *splits, int64_t G, int64_t T, int64_t *sh,
                                                           int *bad) {
    int64_t rows = 0;
    int b = 0;
    for (int64_t g = threadIdx.x; g < G; g += blockDim.x)
        rows = moex_split_add(rows, moex_split_count(splits[g], T, &b), T);
    for (int o = 16; o > 0; o >>= 1) rows = moex_split_add(rows, __shfl_xor_sync(0xffffffffu, rows, o), T);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[warp] = rows;
    __syncthreads();
    rows = lane < nw ? sh[lane] : 0;
    for (int o = 16; o > 0; o >>= 1) rows = moex_split_add(rows, __shfl_xor_sync(0xffffffffu, rows, o), T);
    *bad = __syncthreads_or(b) || rows > T;
    return rows > T ? T : rows;
}

/* Records bad device input (first op wins; see moex_cuda_flag_kind). */
static __device__ __forceinline__ void flag_bad(int *flag, int op_id, int kind) {
    atomicCAS(flag, 0, (op_id << 4) | kind);
}

/* The group g with tiles[g] <= t < tiles[g+1] (tiles nondecreasing, t < tiles[G]). */
static __device__ __forceinline__ int find_group_i32(const int32_t *tiles, int G, int64_t t) {
    int lo = 0, hi = G - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if ((int64_t)tiles[mid] <= t) lo = mid; else hi = mid - 1;
    }
    return lo;
}

/* The group g with off[g] <= r < off[g+1] (r < off[G]); empty groups are skipped. */
static __device__ __forceinline__ int find_group_i64(const int64_t *off, int G, int64_t r) {
    int lo = 0, hi = G - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (off[mid] <= r) lo = mid; else hi = mid - 1;
    }
    return lo;
}

#endif /* MOEX_CUDA_COMMON_CUH */
