/*
 * cuda_reduce.cu - deterministic reductions over group rows, with no floating-point
 * atomics:
 *   row_grads:     the bias gradients of dy over group rows in one pass, per (row tile of
 *                  128 rows, chunk of 2048 columns): the column sums (p_r *) dy[r, n] as
 *                  one partial per (tile, column), and the dot of each row with bias_g as
 *                  one partial per (row, chunk); then one finishing launch sums a group's
 *                  partials in tile order (dbias) and adds each row's dot partials, then
 *                  its GLU partials (the grouped MLP's, from FC2's fused dgrad), to dprobs;
 *   colsum_reduce: the column sums' second pass alone (after the quantize kernels' partials);
 *   zero_f32:      a plain kernel that zeroes f32 scratch.
 */
#include <limits.h>

#include "cuda_common.cuh"
#include "cuda_ops.h"

#define COLS_PER_CTA 256

size_t moex_cuda_colsum_partial_bytes(int64_t T, int64_t G, int64_t N) {
    return moex_sz_bytes(moex_cuda_max_tiles(T, G), N, sizeof(float));
}

/* The sum of partial[t, n] over group g's row tiles t, in tile order (0 when empty). */
static __device__ __forceinline__ float group_colsum(const int32_t *tiles, int64_t g, const float *partial,
                                                     int64_t N, int64_t n) {
    float s = 0.0f;
    for (int64_t t = tiles[g]; t < tiles[g + 1]; t++) s += partial[t * N + n];
    return s;
}

/* dbias[g, n] = group_colsum. Block y: groups, grid-stride. */
static __global__ void colsum_reduce_kernel(const int32_t *tiles, int G, const float *partial, int64_t N,
                                            float *dbias) {
    const int64_t n = (int64_t)blockIdx.x * COLS_PER_CTA + threadIdx.x;
    if (n >= N) return;
    for (int g = blockIdx.y; g < G; g += gridDim.y) dbias[(int64_t)g * N + n] = group_colsum(tiles, g, partial, N, n);
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

#define RG_THREADS 256
#define RG_WARPS (RG_THREADS / 32)
#define RG_COLS (RG_THREADS * 8)   /* the columns of one CTA: 8 per thread */
#define RG_UNROLL 4                /* rows loaded before any is summed */

static int64_t row_grads_chunks(int64_t N) { return (N + RG_COLS - 1) / RG_COLS; }

void moex_cuda_row_grads_take(moex_carver *c, int64_t T, int64_t G, int64_t N, bool dbias, bool dots,
                              moex_cuda_row_grads *a) {
    a->partial = dbias ? (float *)moex_take(c, moex_cuda_colsum_partial_bytes(T, G, N)) : NULL;
    a->dots = dots ? (float *)moex_take(c, moex_sz_bytes(T, row_grads_chunks(N), sizeof(float))) : NULL;
}

typedef struct row_grads_params {
    const void *src;
    int64_t N, T;
    const float *probs, *part;
    float *partial, *dots, *dprobs;
    const void *bias;
    int bias_f32, bias_bf16, dbias_f32, dbias_bf16;
    int64_t part_ld, chunks;
} row_grads_params;

/* Column j (< 8) of this thread in the CTA's chunk from `base`: 8 contiguous ones (VEC: one
 * 16-byte load, N % 8 == 0) or every RG_THREADS-th (coalesced scalar loads). */
template <bool VEC> static __device__ __forceinline__ int64_t rg_col(int64_t base, int j) {
    return VEC ? base + 8 * (int64_t)threadIdx.x + j : base + threadIdx.x + (int64_t)RG_THREADS * j;
}

template <typename T, bool VEC>
static __device__ __forceinline__ void rg_load(const T *row, int64_t base, int64_t N, float *v) {
    if (VEC && sizeof(T) == 2) {
        const int64_t n0 = rg_col<true>(base, 0);
        if (n0 < N) {
            const uint4 u = *(const uint4 *)(row + n0);
            const T *e = (const T *)&u;
#pragma unroll
            for (int j = 0; j < 8; j++) v[j] = to_f32(e[j]);
            return;
        }
    }
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int64_t n = rg_col<VEC>(base, j);
        v[j] = n < N ? to_f32(row[n]) : 0.0f;
    }
}

/* CTA (t, c): row tile t of the schedule (rows [r0, r1) of group g), columns of chunk c
 * (RG_COLS from c * RG_COLS), rows in order:
 *   partial[t, n] = sum_r (p_r *) src[r, n]                              (partial != NULL)
 *   dots[r, c]    = sum over the chunk's columns of src[r, n] bias_g[n]  (dots != NULL): per
 *                   warp a fixed-order warp sum, the warps' sums added in warp order. */
template <typename T, bool VEC>
static __global__ void __launch_bounds__(RG_THREADS)
row_grads_kernel(const int64_t *off, const int32_t *tiles, int G, row_grads_params p) {
    __shared__ float dot[MOEX_CUDA_BM][RG_WARPS];
    __shared__ float prob[MOEX_CUDA_BM];   /* p of the tile's rows, loaded before the rows */
    const int64_t tile = blockIdx.x, base = (int64_t)blockIdx.y * RG_COLS;
    if (tile >= tiles[G]) return;   /* uniform in the CTA */
    const int g = find_group_i32(tiles, G, tile);
    const int64_t r0 = off[g] + (tile - tiles[g]) * MOEX_CUDA_BM;
    const int rows = (int)(min(r0 + MOEX_CUDA_BM, off[g + 1]) - r0);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (p.partial && p.probs) {   /* not a load per row behind the row's own loads */
        for (int i = threadIdx.x; i < rows; i += RG_THREADS) prob[i] = p.probs[r0 + i];
        __syncthreads();
    }
    const T *src = (const T *)p.src + r0 * p.N;
    float b[8], cs[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int64_t n = rg_col<VEC>(base, j);
        b[j] = p.dots && n < p.N ? load_any(p.bias, p.bias_f32, p.bias_bf16, (int64_t)g * p.N + n) : 0.0f;
        cs[j] = 0.0f;
    }
    for (int i0 = 0; i0 < rows; i0 += RG_UNROLL) {
        float v[RG_UNROLL][8];
#pragma unroll
        for (int u = 0; u < RG_UNROLL; u++)
            if (i0 + u < rows) rg_load<T, VEC>(src + (int64_t)(i0 + u) * p.N, base, p.N, v[u]);
#pragma unroll
        for (int u = 0; u < RG_UNROLL; u++) {
            if (i0 + u >= rows) break;   /* uniform */
            if (p.partial) {
                const float pr = p.probs ? prob[i0 + u] : 1.0f;
#pragma unroll
                for (int j = 0; j < 8; j++) cs[j] += p.probs ? pr * v[u][j] : v[u][j];
            }
            if (p.dots) {
                float d = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; j++) d += v[u][j] * b[j];
                d = warp_sum(d);
                if (lane == 0) dot[i0 + u][warp] = d;
            }
        }
    }
    if (p.partial)
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int64_t n = rg_col<VEC>(base, j);
            if (n < p.N) p.partial[tile * p.N + n] = cs[j];
        }
    if (p.dots == NULL) return;
    __syncthreads();
    for (int i = threadIdx.x; i < rows; i += RG_THREADS) {
        float s = 0.0f;
        for (int w = 0; w < RG_WARPS; w++) s += dot[i][w];
        p.dots[(r0 + i) * p.chunks + blockIdx.y] = s;
    }
}

/* Blocks [0, nred): dbias[g, n] = group_colsum, rounded to dbias's dtype (block b: columns
 * b % nx, groups from b / nx, grid-stride by gy); the rest, a row each thread, r < off[G]:
 *   dprobs[r] = (dprobs[r] + sum_c dots[r, c]) + sum_s part[r, s]   (each sum in order). */
static __global__ void row_grads_finish_kernel(const int64_t *off, const int32_t *tiles, int G, int64_t nx,
                                               int64_t gy, row_grads_params p, void *dbias) {
    const int64_t nred = p.partial ? nx * gy : 0;
    if (blockIdx.x < nred) {
        const int64_t n = (blockIdx.x % nx) * COLS_PER_CTA + threadIdx.x;
        if (n >= p.N) return;
        for (int64_t g = blockIdx.x / nx; g < G; g += gy)
            store_any(dbias, p.dbias_f32, p.dbias_bf16, g * p.N + n, group_colsum(tiles, g, p.partial, p.N, n));
        return;
    }
    const int64_t r = (blockIdx.x - nred) * COLS_PER_CTA + threadIdx.x;
    if (p.dprobs == NULL || r >= p.T || r >= off[G]) return;
    float d = p.dprobs[r];
    if (p.dots) {
        float s = 0.0f;
        for (int64_t c = 0; c < p.chunks; c++) s += p.dots[r * p.chunks + c];
        d += s;
    }
    if (p.part) {
        float s = 0.0f;
        for (int64_t k = 0; k < p.part_ld; k++) s += p.part[r * p.part_ld + k];
        d += s;
    }
    p.dprobs[r] = d;
}

template <typename T>
static void row_grads_launch(const moex_cuda_sched *s, const row_grads_params &p, bool vec, dim3 grid,
                             cudaStream_t stream) {
    if (vec)
        row_grads_kernel<T, true><<<grid, RG_THREADS, 0, stream>>>(s->off, s->tiles, (int)s->G, p);
    else
        row_grads_kernel<T, false><<<grid, RG_THREADS, 0, stream>>>(s->off, s->tiles, (int)s->G, p);
}

moex_status moex_cuda_row_grads_run(moex_context *ctx, const char *op, const moex_cuda_sched *s,
                                    const moex_cuda_row_grads *a, cudaStream_t stream) {
    const bool dprobs = a->dprobs != NULL && (a->bias != NULL || a->part != NULL);
    if (a->dbias == NULL && !dprobs) return MOEX_OK;
    const int64_t mt = moex_cuda_max_tiles(s->T, s->G), chunks = row_grads_chunks(a->N);
    const int64_t nx = (a->N + COLS_PER_CTA - 1) / COLS_PER_CTA, gy = s->G < 65535 ? s->G : 65535;
    const int64_t nrows = (s->T + COLS_PER_CTA - 1) / COLS_PER_CTA;
    if (mt > 65535 || s->G > 65535 || chunks > 65535 || nx * gy + nrows > INT_MAX)
        return moex_fail(ctx, MOEX_ERR_UNSUPPORTED, "%s: bias-gradient grid too large", op);
    MOEX_TRY(moex_cuda_sched_ready(ctx, op, s));
    row_grads_params p;
    p.src = a->src;
    p.N = a->N;
    p.T = s->T;
    p.probs = a->probs;
    p.partial = a->dbias != NULL ? a->partial : NULL;
    p.dots = dprobs && a->bias != NULL ? a->dots : NULL;
    p.dprobs = dprobs ? a->dprobs : NULL;
    p.bias = a->bias;
    p.bias_f32 = a->bias_dt == MOEX_DTYPE_F32;
    p.bias_bf16 = a->bias_dt == MOEX_DTYPE_BF16;
    p.dbias_f32 = a->dbias_dt == MOEX_DTYPE_F32;
    p.dbias_bf16 = a->dbias_dt == MOEX_DTYPE_BF16;
    p.part = a->part;
    p.part_ld = a->part_ld;
    p.chunks = chunks;
    if (s->T > 0 && (p.partial || p.dots)) {
        const bool vec = a->dt != MOEX_DTYPE_F32 && a->N % 8 == 0 && (uintptr_t)a->src % 16 == 0;
        const dim3 grid((unsigned)mt, (unsigned)chunks);
        if (a->dt == MOEX_DTYPE_F32) row_grads_launch<float>(s, p, false, grid, stream);
        else if (a->dt == MOEX_DTYPE_BF16) row_grads_launch<bf16>(s, p, vec, grid, stream);
        else row_grads_launch<f16>(s, p, vec, grid, stream);
        CUDA_TRY_LAUNCH(ctx, op);
    }
    /* dbias (zeros for empty groups, also when T == 0) and the dprobs rows */
    const int64_t blocks = (p.partial ? nx * gy : 0) + (p.dprobs ? nrows : 0);
    if (blocks == 0) return MOEX_OK;
    row_grads_finish_kernel<<<(unsigned)blocks, COLS_PER_CTA, 0, stream>>>(s->off, s->tiles, (int)s->G, nx, gy, p,
                                                                          a->dbias);
    CUDA_TRY_LAUNCH(ctx, op);
    return MOEX_OK;
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
