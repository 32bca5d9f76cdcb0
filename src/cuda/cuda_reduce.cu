/*
 * cuda_reduce.cu - deterministic reductions over group rows, with no floating-point
 * atomics:
 *   row_grads:     the bias gradients of dy over group rows in one pass: per row tile of
 *                  128 rows, the column sums (p_r *) dy[r, n] as one partial per (tile,
 *                  column), and each row's dprobs terms (dy_r . bias_g, then the sum of a
 *                  row of partials: the grouped MLP's GLU term from FC2's fused dgrad);
 *                  then colsum_reduce (also after the quantize kernels' partials) sums a
 *                  group's partials in tile order;
 *   zero_f32:      a plain kernel that zeroes f32 scratch.
 */
#include <limits.h>

#include "cuda_common.cuh"
#include "cuda_ops.h"

#define COLS_PER_CTA 256

size_t moex_cuda_colsum_partial_bytes(int64_t T, int64_t G, int64_t N) {
    return moex_sz_bytes(moex_cuda_max_tiles(T, G), N, sizeof(float));
}

/* dbias[g, n] = sum of the partials of group g's tiles, in tile order (0 when empty).
 * Block y: groups, grid-stride. */
static __global__ void colsum_reduce_kernel(const int32_t *tiles, int G, const float *partial, int64_t N,
                                            float *dbias) {
    const int64_t n = (int64_t)blockIdx.x * COLS_PER_CTA + threadIdx.x;
    if (n >= N) return;
    for (int g = blockIdx.y; g < G; g += gridDim.y) {
        float s = 0.0f;
        for (int64_t t = tiles[g]; t < tiles[g + 1]; t++) s += partial[t * N + n];
        dbias[(int64_t)g * N + n] = s;
    }
}

moex_status moex_cuda_colsum_reduce(moex_context *ctx, const char *op, const int32_t *tiles, int64_t G,
                                    const float *partial, int64_t N, float *dbias, cudaStream_t stream) {
    if (N == 0 || G == 0) return MOEX_OK;
    const int64_t nx = (N + COLS_PER_CTA - 1) / COLS_PER_CTA;
    if (nx > INT_MAX || G > INT_MAX)
        return moex_fail(ctx, MOEX_ERR_UNSUPPORTED, "%s: bias-gradient grid too large", op);
    const dim3 grid((unsigned)nx, (unsigned)(G < 65535 ? G : 65535));
    colsum_reduce_kernel<<<grid, COLS_PER_CTA, 0, stream>>>(tiles, (int)G, partial, N, dbias);
    CUDA_TRY_LAUNCH(ctx, op);
    return MOEX_OK;
}

/* ---- row_grads: the bias gradients of dy in one pass ---------------------------------- */

#define RG_THREADS 512
#define RG_WARPS (RG_THREADS / 32)
#define RG_UNROLL 4             /* rows loaded before any is summed */

typedef struct row_grads_params {
    const void *src;
    int64_t N;
    const float *probs, *part;
    float *partial, *dprobs;
    const void *bias;
    int bias_f32, bias_bf16;
    int64_t part_ld;
} row_grads_params;

/* Elements n0 .. n0 + V - 1 of a row (0 past N; V = 8: one 16-byte load, N % 8 == 0). */
template <typename T, int V>
static __device__ __forceinline__ void load_cols(const T *row, int64_t n0, int64_t N, float *v) {
    if (V == 8 && sizeof(T) == 2 && n0 < N) {
        const uint4 u = *(const uint4 *)(row + n0);
        const T *e = (const T *)&u;
#pragma unroll
        for (int j = 0; j < V; j++) v[j] = to_f32(e[j]);
        return;
    }
#pragma unroll
    for (int j = 0; j < V; j++) v[j] = n0 + j < N ? to_f32(row[n0 + j]) : 0.0f;
}

/* One CTA per row tile t of the schedule (rows [r0, r1) of group g), threads over columns
 * (V each, RG_THREADS * V per chunk), rows in order within each chunk:
 *   partial[t, n] = sum_r (p_r *) src[r, n]                    (partial != NULL)
 *   dprobs[r] = (dprobs[r] + sum_n src[r, n] bias_g[n]) + sum_s part[r, s]   (dprobs != NULL;
 *               each term when its pointer is set). The dot's pieces: per warp and chunk a
 *               fixed-order warp sum, accumulated per warp over the chunks, the warps' sums
 *               added in warp order. */
template <typename T, int V>
static __global__ void __launch_bounds__(RG_THREADS)
row_grads_kernel(const int64_t *off, const int32_t *tiles, int G, row_grads_params p) {
    __shared__ float dot[MOEX_CUDA_BM][RG_WARPS];
    const int64_t tile = blockIdx.x;
    if (tile >= tiles[G]) return;
    const int g = find_group_i32(tiles, G, tile);
    const int64_t r0 = off[g] + (tile - tiles[g]) * MOEX_CUDA_BM;
    const int rows = (int)(min(r0 + MOEX_CUDA_BM, off[g + 1]) - r0);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bool dots = p.dprobs != NULL && p.bias != NULL;
    const T *src = (const T *)p.src + r0 * p.N;
    for (int i = threadIdx.x; i < MOEX_CUDA_BM * RG_WARPS; i += RG_THREADS) dot[i / RG_WARPS][i % RG_WARPS] = 0.0f;
    __syncthreads();
    for (int64_t base = 0; base < p.N; base += (int64_t)RG_THREADS * V) {   /* uniform over the CTA */
        const int64_t n0 = base + (int64_t)threadIdx.x * V;
        float b[V], cs[V];
#pragma unroll
        for (int j = 0; j < V; j++) {
            b[j] = dots && n0 + j < p.N ? load_any(p.bias, p.bias_f32, p.bias_bf16, (int64_t)g * p.N + n0 + j) : 0.0f;
            cs[j] = 0.0f;
        }
        for (int i0 = 0; i0 < rows; i0 += RG_UNROLL) {
            float v[RG_UNROLL][V];
#pragma unroll
            for (int u = 0; u < RG_UNROLL; u++) {
                if (i0 + u < rows) load_cols<T, V>(src + (int64_t)(i0 + u) * p.N, n0, p.N, v[u]);
            }
#pragma unroll
            for (int u = 0; u < RG_UNROLL; u++) {
                if (i0 + u >= rows) break;   /* uniform */
                if (p.partial) {
                    const float pr = p.probs ? p.probs[r0 + i0 + u] : 1.0f;
#pragma unroll
                    for (int j = 0; j < V; j++) cs[j] += p.probs ? pr * v[u][j] : v[u][j];
                }
                if (dots) {
                    float d = 0.0f;
#pragma unroll
                    for (int j = 0; j < V; j++) d += v[u][j] * b[j];
                    d = warp_sum(d);
                    if (lane == 0) dot[i0 + u][warp] += d;
                }
            }
        }
        if (p.partial)
#pragma unroll
            for (int j = 0; j < V; j++)
                if (n0 + j < p.N) p.partial[tile * p.N + n0 + j] = cs[j];
    }
    if (p.dprobs == NULL) return;
    __syncthreads();
    for (int i = threadIdx.x; i < rows; i += RG_THREADS) {
        float d = p.dprobs[r0 + i];
        if (dots) {
            float s = 0.0f;
            for (int w = 0; w < RG_WARPS; w++) s += dot[i][w];
            d += s;
        }
        if (p.part != NULL) {
            float s = 0.0f;
            for (int64_t k = 0; k < p.part_ld; k++) s += p.part[(r0 + i) * p.part_ld + k];
            d += s;
        }
        p.dprobs[r0 + i] = d;
    }
}

template <typename T>
static void row_grads_launch(const moex_cuda_sched *s, const row_grads_params &p, bool vec, unsigned grid,
                             cudaStream_t stream) {
    if (vec)
        row_grads_kernel<T, 8><<<grid, RG_THREADS, 0, stream>>>(s->off, s->tiles, (int)s->G, p);
    else
        row_grads_kernel<T, 1><<<grid, RG_THREADS, 0, stream>>>(s->off, s->tiles, (int)s->G, p);
}

moex_status moex_cuda_row_grads_run(moex_context *ctx, const char *op, const moex_cuda_sched *s,
                                    const moex_cuda_row_grads *a, cudaStream_t stream) {
    const bool dprobs = a->dprobs != NULL && (a->bias != NULL || a->part != NULL);
    if (a->dbias == NULL && !dprobs) return MOEX_OK;
    const int64_t mt = moex_cuda_max_tiles(s->T, s->G);
    if (mt > 65535 || s->G > 65535)
        return moex_fail(ctx, MOEX_ERR_UNSUPPORTED, "%s: bias-gradient grid too large", op);
    MOEX_TRY(moex_cuda_sched_ready(ctx, op, s));
    if (s->T > 0) {
        row_grads_params p;
        p.src = a->src;
        p.N = a->N;
        p.probs = a->probs;
        p.partial = a->dbias != NULL ? a->partial : NULL;
        p.dprobs = dprobs ? a->dprobs : NULL;
        p.bias = a->bias;
        p.bias_f32 = a->bias_dt == MOEX_DTYPE_F32;
        p.bias_bf16 = a->bias_dt == MOEX_DTYPE_BF16;
        p.part = a->part;
        p.part_ld = a->part_ld;
        const bool vec = a->dt != MOEX_DTYPE_F32 && a->N % 8 == 0 && (uintptr_t)a->src % 16 == 0;
        if (a->dt == MOEX_DTYPE_F32) row_grads_launch<float>(s, p, false, (unsigned)mt, stream);
        else if (a->dt == MOEX_DTYPE_BF16) row_grads_launch<bf16>(s, p, vec, (unsigned)mt, stream);
        else row_grads_launch<f16>(s, p, vec, (unsigned)mt, stream);
        CUDA_TRY_LAUNCH(ctx, op);
    }
    if (a->dbias == NULL) return MOEX_OK;
    return moex_cuda_colsum_reduce(ctx, op, s->tiles, s->G, a->partial, a->N, a->dbias, stream);
}

static __global__ void zero_f32_kernel(float *p, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = 0.0f;
}

moex_status moex_cuda_zero_f32(moex_context *ctx, const moex_call *c, float *p, int64_t n) {
    if (n <= 0) return MOEX_OK;
    int64_t blocks = (n + 255) / 256;
    zero_f32_kernel<<<(unsigned)(blocks > 4096 ? 4096 : blocks), 256, 0, (cudaStream_t)c->stream>>>(p, n);
    CUDA_TRY_LAUNCH(ctx, c->op);
    return MOEX_OK;
}
