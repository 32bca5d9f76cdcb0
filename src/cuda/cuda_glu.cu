/*
 * cuda_glu.cu - the scaled GLU on the GPU, forward and backward, and the scaled_glu ops.
 * The element math is src/core/glu_math.h (shared with the CPU, __host__ __device__).
 *   forward:  z[r, j] = p_r act(a_rj) g(b_rj)                               (=)
 *   backward: dh = d z / d(a, b) * dz (=), dprobs[r] += sum_j dz act g      (+=)
 * The rows done are r < off[G] (read on the device) when splits are given, else all T. Two
 * shapes of each kernel:
 *   - vector (16-bit data, F and the segment L multiples of 8, h, z / dz and dh 16-byte
 *     aligned): a warp per row (grid-stride over rows), lane i takes the chunks of 8 z
 *     columns i, i + 32, ..., two chunks' loads before any of their math or stores (dh may be
 *     h: every element is read, then written, by one lane); a row's dprobs is the lanes'
 *     sums (each in chunk order) added by the fixed butterfly of warp_sum;
 *   - scalar (everything else): one block per row, elements strided over its threads; a
 *     row's dprobs a fixed-order block reduction.
 * Either way the dprobs of a row is bitwise reproducible.
 */
#include "glu_math.h"
#include "cuda_common.cuh"
#include "cuda_ops.h"

#define GLU_THREADS 256
#define GLU_MAX_BLOCKS (1 << 20)

/* The h column of the first half of z column j, the segment length L apart from its second
 * (a chunk of 8 columns from a multiple of 8 never straddles a segment when L % 8 == 0). */
static __device__ __forceinline__ int64_t glu_col(int64_t j, int64_t L) { return j + (j / L) * L; }

template <typename T>
static __global__ void __launch_bounds__(GLU_THREADS)
glu_fwd_kernel(moex_glu_consts c, int64_t L, const int64_t *total_rows, int64_t T_rows, int64_t F,
               const T *h, const float *probs, T *z) {
    int64_t rows = total_rows ? min(*total_rows, T_rows) : T_rows;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *hr = h + r * 2 * F;
        T *zr = z + r * F;
        float p = probs ? probs[r] : 1.0f;
        for (int64_t j = threadIdx.x; j < F; j += GLU_THREADS) {
            int64_t ca = glu_col(j, L);
            zr[j] = from_f32<T>(moex_glu_forward(c, to_f32(hr[ca]), to_f32(hr[ca + L]), p));
        }
    }
}

template <typename T>
static __global__ void __launch_bounds__(GLU_THREADS)
glu_bwd_kernel(moex_glu_consts c, int64_t L, const int64_t *total_rows, int64_t T_rows, int64_t F,
               const T *h, const float *probs, const T *dz, T *dh, float *dprobs) {
    __shared__ float red[32];
    int64_t rows = total_rows ? min(*total_rows, T_rows) : T_rows;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *hr = h + r * 2 * F;
        const T *dzr = dz + r * F;
        float p = probs ? probs[r] : 1.0f;
        float dp = 0.0f;
        for (int64_t j = threadIdx.x; j < F; j += GLU_THREADS) {
            int64_t ca = glu_col(j, L);
            float da, db, term;
            moex_glu_backward(c, to_f32(hr[ca]), to_f32(hr[ca + L]), p, to_f32(dzr[j]), &da, &db, &term);
            if (dh) {
                dh[r * 2 * F + ca] = from_f32<T>(da);
                dh[r * 2 * F + ca + L] = from_f32<T>(db);
            }
            dp += term;
        }
        if (dprobs) {
            dp = block_sum(dp, red);
            if (threadIdx.x == 0) dprobs[r] += dp;
        }
    }
}

/* ---- the vector kernels ---------------------------------------------------------------- */

#define GLU_WARPS (GLU_THREADS / 32)
#define GLU_UNROLL 2   /* chunks of a lane loaded before any is used */

/* Eight 16-bit values of T as f32, and back (round to nearest even, as from_f32). */
template <typename T> static __device__ __forceinline__ float glu_get(const uint4 &u, int e) {
    return to_f32(((const T *)&u)[e]);
}
template <typename T> static __device__ __forceinline__ uint32_t glu_pack2(float a, float b);
template <> __device__ __forceinline__ uint32_t glu_pack2<bf16>(float a, float b) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *(const uint32_t *)&v;
}
template <> __device__ __forceinline__ uint32_t glu_pack2<f16>(float a, float b) {
    const __half2 v = __floats2half2_rn(a, b);
    return *(const uint32_t *)&v;
}

template <typename T>
static __global__ void __launch_bounds__(GLU_THREADS)
glu_fwd_vec_kernel(moex_glu_consts c, int64_t L, const int64_t *total_rows, int64_t T_rows, int64_t F,
                   const T *h, const float *probs, T *z) {
    const int64_t rows = total_rows ? min(*total_rows, T_rows) : T_rows, chunks = F / 8;
    const int lane = threadIdx.x & 31;
    for (int64_t r = (int64_t)blockIdx.x * GLU_WARPS + threadIdx.x / 32; r < rows;
         r += (int64_t)gridDim.x * GLU_WARPS) {
        const T *hr = h + r * 2 * F;
        const float p = probs ? probs[r] : 1.0f;
        for (int64_t q0 = lane; q0 < chunks; q0 += 32 * GLU_UNROLL) {
            uint4 va[GLU_UNROLL], vb[GLU_UNROLL];
#pragma unroll
            for (int u = 0; u < GLU_UNROLL; u++) {
                const int64_t q = q0 + 32 * u, ca = glu_col(8 * q, L);
                va[u] = q < chunks ? *(const uint4 *)(hr + ca) : make_uint4(0u, 0u, 0u, 0u);
                vb[u] = q < chunks ? *(const uint4 *)(hr + ca + L) : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
            for (int u = 0; u < GLU_UNROLL; u++) {
                const int64_t q = q0 + 32 * u;
                if (q >= chunks) break;
                uint4 o;
                uint32_t *w = &o.x;
#pragma unroll
                for (int e = 0; e < 4; e++)
                    w[e] = glu_pack2<T>(
                        moex_glu_forward(c, glu_get<T>(va[u], 2 * e), glu_get<T>(vb[u], 2 * e), p),
                        moex_glu_forward(c, glu_get<T>(va[u], 2 * e + 1), glu_get<T>(vb[u], 2 * e + 1), p));
                *(uint4 *)(z + r * F + 8 * q) = o;
            }
        }
    }
}

template <typename T>
static __global__ void __launch_bounds__(GLU_THREADS)
glu_bwd_vec_kernel(moex_glu_consts c, int64_t L, const int64_t *total_rows, int64_t T_rows, int64_t F,
                   const T *h, const float *probs, const T *dz, T *dh, float *dprobs) {
    const int64_t rows = total_rows ? min(*total_rows, T_rows) : T_rows, chunks = F / 8;
    const int lane = threadIdx.x & 31;
    for (int64_t r = (int64_t)blockIdx.x * GLU_WARPS + threadIdx.x / 32; r < rows;
         r += (int64_t)gridDim.x * GLU_WARPS) {
        const T *hr = h + r * 2 * F, *dzr = dz + r * F;
        const float p = probs ? probs[r] : 1.0f;
        float dp = 0.0f;
        for (int64_t q0 = lane; q0 < chunks; q0 += 32 * GLU_UNROLL) {
            uint4 va[GLU_UNROLL], vb[GLU_UNROLL], vd[GLU_UNROLL];
#pragma unroll
            for (int u = 0; u < GLU_UNROLL; u++) {
                const int64_t q = q0 + 32 * u, ca = glu_col(8 * q, L);
                const bool in = q < chunks;
                va[u] = in ? *(const uint4 *)(hr + ca) : make_uint4(0u, 0u, 0u, 0u);
                vb[u] = in ? *(const uint4 *)(hr + ca + L) : make_uint4(0u, 0u, 0u, 0u);
                vd[u] = in ? *(const uint4 *)(dzr + 8 * q) : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
            for (int u = 0; u < GLU_UNROLL; u++) {
                const int64_t q = q0 + 32 * u, ca = glu_col(8 * q, L);
                if (q >= chunks) break;
                uint4 oa, ob;
                uint32_t *wa = &oa.x, *wb = &ob.x;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float da0, db0, t0, da1, db1, t1;
                    moex_glu_backward(c, glu_get<T>(va[u], 2 * e), glu_get<T>(vb[u], 2 * e), p,
                                      glu_get<T>(vd[u], 2 * e), &da0, &db0, &t0);
                    moex_glu_backward(c, glu_get<T>(va[u], 2 * e + 1), glu_get<T>(vb[u], 2 * e + 1), p,
                                      glu_get<T>(vd[u], 2 * e + 1), &da1, &db1, &t1);
                    wa[e] = glu_pack2<T>(da0, da1);
                    wb[e] = glu_pack2<T>(db0, db1);
                    dp += t0;
                    dp += t1;
                }
                if (dh) {
                    *(uint4 *)(dh + r * 2 * F + ca) = oa;
                    *(uint4 *)(dh + r * 2 * F + ca + L) = ob;
                }
            }
        }
        if (dprobs) {
            dp = warp_sum(dp);
            if (lane == 0) dprobs[r] += dp;
        }
    }
}

static unsigned glu_blocks(int64_t T) {
    return (unsigned)(T < GLU_MAX_BLOCKS ? T : GLU_MAX_BLOCKS);
}

/* Whether the vector kernels take these operands (16-bit, F and L multiples of 8, the
 * pointers given 16-byte aligned), and their grid: a warp per row. */
static bool glu_vec(moex_dtype dt, int64_t F, int64_t L, const void *a, const void *b, const void *c) {
    const uintptr_t m = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c;
    return dt != MOEX_DTYPE_F32 && F % 8 == 0 && L % 8 == 0 && m % 16 == 0;
}
static unsigned glu_vec_blocks(int64_t T) { return glu_blocks((T + GLU_WARPS - 1) / GLU_WARPS); }

/* The launches for element type E: the vector kernel when vec (glu_vec's operands: 16-bit E
 * only), else the scalar one. */
template <typename E>
static void glu_fwd_launch(bool vec, const moex_glu_consts &c, int64_t L, const int64_t *total_rows, int64_t T,
                           int64_t F, const void *h, const float *probs, void *z, cudaStream_t stream) {
    if constexpr (sizeof(E) == 2)
        if (vec) {
            glu_fwd_vec_kernel<E><<<glu_vec_blocks(T), GLU_THREADS, 0, stream>>>(c, L, total_rows, T, F,
                                                                                 (const E *)h, probs, (E *)z);
            return;
        }
    glu_fwd_kernel<E><<<glu_blocks(T), GLU_THREADS, 0, stream>>>(c, L, total_rows, T, F, (const E *)h, probs, (E *)z);
}

template <typename E>
static void glu_bwd_launch(bool vec, const moex_glu_consts &c, int64_t L, const int64_t *total_rows, int64_t T,
                           int64_t F, const void *h, const float *probs, const void *dz, void *dh, float *dprobs,
                           cudaStream_t stream) {
    if constexpr (sizeof(E) == 2)
        if (vec) {
            glu_bwd_vec_kernel<E><<<glu_vec_blocks(T), GLU_THREADS, 0, stream>>>(
                c, L, total_rows, T, F, (const E *)h, probs, (const E *)dz, (E *)dh, dprobs);
            return;
        }
    glu_bwd_kernel<E><<<glu_blocks(T), GLU_THREADS, 0, stream>>>(c, L, total_rows, T, F, (const E *)h, probs,
                                                                 (const E *)dz, (E *)dh, dprobs);
}

moex_status moex_cuda_glu_fwd_run(moex_context *ctx, const char *op, const moex_glu_params *glu,
                              const int64_t *total_rows, int64_t T, int64_t F, moex_dtype dt,
                              const void *h, const float *probs, void *z, cudaStream_t stream) {
    if (T == 0 || F == 0) return MOEX_OK;
    moex_glu_consts c = moex_glu_consts_of(glu);
    int64_t L = moex_glu_segment(glu->layout, F);
    const bool vec = glu_vec(dt, F, L, h, z, NULL);
    by_dtype(dt, [&](auto e) {
        glu_fwd_launch<typename decltype(e)::type>(vec, c, L, total_rows, T, F, h, probs, z, stream);
    });
    CUDA_TRY_LAUNCH(ctx, op);
    return MOEX_OK;
}

moex_status moex_cuda_glu_bwd_run(moex_context *ctx, const char *op, const moex_glu_params *glu,
                              const int64_t *total_rows, int64_t T, int64_t F, moex_dtype dt,
                              const void *h, const float *probs, const void *dz, void *dh,
                              float *dprobs, cudaStream_t stream) {
    if (T == 0 || F == 0 || (!dh && !dprobs)) return MOEX_OK;
    moex_glu_consts c = moex_glu_consts_of(glu);
    int64_t L = moex_glu_segment(glu->layout, F);
    const bool vec = glu_vec(dt, F, L, h, dz, dh);
    by_dtype(dt, [&](auto e) {
        glu_bwd_launch<typename decltype(e)::type>(vec, c, L, total_rows, T, F, h, probs, dz, dh, dprobs, stream);
    });
    CUDA_TRY_LAUNCH(ctx, op);
    return MOEX_OK;
}

/* ---- the GLU primitives: the rows [0, off[G]) of the groups, or all T rows ----------- */

size_t moex_cuda_glu_fwd_ws(moex_context *ctx, const moex_scaled_glu_args *a, const moex_glu_dims *d) { return 0; }

moex_status moex_cuda_glu_fwd(moex_context *ctx, const moex_call *c, const moex_groups *g,
                              const moex_scaled_glu_args *a, const moex_glu_dims *d, void *ws) {
    const float *probs = moex_present(&a->probs) ? (const float *)a->probs.data : NULL;
    if (g) MOEX_TRY(moex_cuda_sched_ready(ctx, c->op, g));
    return moex_cuda_glu_fwd_run(ctx, c->op, &a->glu, g ? g->off + g->G : NULL, d->T, d->F, d->dt, a->h.data, probs,
                                 a->z.data, (cudaStream_t)c->stream);
}

size_t moex_cuda_glu_bwd_ws(moex_context *ctx, const moex_scaled_glu_grad_args *a, const moex_glu_dims *d) {
    return 0;
}

moex_status moex_cuda_glu_bwd(moex_context *ctx, const moex_call *c, const moex_groups *g,
                              const moex_scaled_glu_grad_args *a, const moex_glu_dims *d, void *ws) {
    const float *probs = moex_present(&a->probs) ? (const float *)a->probs.data : NULL;
    float *dprobs = moex_present(&a->dprobs) ? (float *)a->dprobs.data : NULL;
    void *dh = moex_present(&a->dh) ? a->dh.data : NULL;
    if (g) MOEX_TRY(moex_cuda_sched_ready(ctx, c->op, g));
    return moex_cuda_glu_bwd_run(ctx, c->op, &a->glu, g ? g->off + g->G : NULL, d->T, d->F, d->dt, a->h.data, probs,
                                 a->dz.data, dh, dprobs, (cudaStream_t)c->stream);
}
