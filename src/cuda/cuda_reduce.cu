/*
 * cuda_reduce.cu - deterministic reductions over group rows, with no floating-point
 * atomics:
 *   row_grads:     the bias gradients of dy over group rows in one pass, per (row tile of
 *                  128 rows, chunk of 512 columns) CTA: the column sums (p_r *) dy[r, n] as
 *                  one partial per (tile, column), and the dot of each row with bias_g as
 *                  one partial per (row, chunk); the CTA's four row groups of 32 rows each
 *                  sum their rows in order, then their column sums are added in group order
 *                  and the two warps' halves of each row's dot in warp order; then one
 *                  finishing launch sums a group's partials in tile order (dbias) and adds
 *                  each row's dot partials in chunk order, then its GLU partials (the
 *                  grouped MLP's, from FC2's fused dgrad), to dprobs;
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

/* A CTA of row_grads_kernel: RG_GROUPS row groups of RG_GROUP threads (two warps each);
 * group q takes rows [RG_GROUP_ROWS q, RG_GROUP_ROWS (q + 1)) of the 128-row tile and every
 * thread of it 8 of the chunk's RG_COLS columns. */
#define RG_THREADS 256
#define RG_GROUP 64                                    /* threads of a row group */
#define RG_GROUPS (RG_THREADS / RG_GROUP)              /* 4 */
#define RG_GROUP_ROWS (MOEX_CUDA_BM / RG_GROUPS)       /* 32: one a lane (p by shuffle) */
#define RG_COLS (RG_GROUP * 8)                         /* 512, the columns of one CTA */
#define RG_UNROLL 4   /* rows loaded before any is summed (VEC; 2 on the scalar path) */
static_assert(RG_GROUP_ROWS == 32 && RG_GROUP == 64, "row_grads: a group is 2 warps, 32 rows");

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

/* Column j (< 8) of thread t (< RG_GROUP) of a row group, in the chunk from `base`: 8
 * contiguous ones (VEC: one 16-byte load, N % 8 == 0) or every RG_GROUP-th (coalesced
 * scalar loads). */
template <bool VEC> static __device__ __forceinline__ int rg_col(int t, int j) {
    return VEC ? 8 * t + j : t + RG_GROUP * j;
}

/* One row's 8 columns of a thread, loaded before they are summed: as floats (the scalar
 * path), or as the 16 raw bytes (VEC, 2-byte T: half the registers), converted when read.
 * row: the row's element at the thread's column 0; lim: N less that column, at most
 * RG_COLS (the columns past N read as 0). */
template <typename T, bool VEC> struct rg_row {
    float v[8];
    __device__ __forceinline__ void load(const T *row, int lim) {
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = RG_GROUP * j < lim ? to_f32(row[RG_GROUP * j]) : 0.0f;
    }
    __device__ __forceinline__ float get(int j) const { return v[j]; }
};
template <typename T> struct rg_row<T, true> {
    static_assert(sizeof(T) == 2, "row_grads: the VEC path is for bf16 and f16");
    uint4 u;
    __device__ __forceinline__ void load(const T *row, int lim) {   /* N % 8 == 0: all 8 or none */
        u = lim > 0 ? *(const uint4 *)row : make_uint4(0u, 0u, 0u, 0u);
    }
    __device__ __forceinline__ float get(int j) const { return to_f32(((const T *)&u)[j]); }
};

/* CTA (x, y) = (chunk c, row tile t of the schedule): rows [r0, r0 + rows) of group g
 * (1 <= rows <= 128), the columns n of [c RG_COLS, (c + 1) RG_COLS) below N. Row group q
 * takes the tile's rows [32q, min(32q + 32, rows)) (none when 32q >= rows) in row order, U
 * rows loaded before any is summed (RG_UNROLL, or 2 on the scalar path):
 *   partial[t, n] = ((s_0[n] + s_1[n]) + s_2[n]) + s_3[n], s_q[n] = the sum, from 0 in row
 *                   order, of (p_r *) src[r, n] over group q's rows (0 with none); each n
 *                   written by one thread                                  (partial != NULL)
 *   dots[r, c]    = w_0 + w_1, w_h = the warp sum (warp_sum's butterfly order) over warp h
 *                   of r's group of each lane's sum of src[r, n] bias_g[n] over its 8
 *                   columns in j order; for each of the tile's rows r      (dots != NULL).
 * A lane's p_r (row i0q + lane of its group) is loaded with the first rows and shuffled. */
template <typename T, bool VEC>
static __global__ void __launch_bounds__(RG_THREADS, 4)
row_grads_kernel(const int64_t *off, const int32_t *tiles, int G, row_grads_params p) {
    __shared__ __align__(16) float colsum[RG_GROUPS][RG_COLS];   /* s_q */
    __shared__ float dot[MOEX_CUDA_BM][2];                       /* w_0, w_1 of each row */
    const int64_t tile = blockIdx.y, base = (int64_t)blockIdx.x * RG_COLS;
    if (tile >= tiles[G]) return;   /* uniform in the CTA */
    const int g = find_group_i32(tiles, G, tile);
    const int64_t r0 = off[g] + (tile - tiles[g]) * MOEX_CUDA_BM;
    const int rows = (int)(min(r0 + MOEX_CUDA_BM, off[g + 1]) - r0);
    const int q = threadIdx.x / RG_GROUP, t = threadIdx.x % RG_GROUP;
    const int half = t >> 5, lane = threadIdx.x & 31;
    const int i0q = q * RG_GROUP_ROWS;                          /* the group's first row */
    const int nq = max(0, min(rows - i0q, RG_GROUP_ROWS));      /* and its rows; uniform in it */
    const bool weighted = p.partial && p.probs;
    const float pl = weighted && lane < nq ? p.probs[r0 + i0q + lane] : 1.0f;   /* p of row lane */
    float b[8], cs[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int64_t n = base + rg_col<VEC>(t, j);
        b[j] = p.dots && n < p.N ? load_any(p.bias, p.bias_f32, p.bias_bf16, (int64_t)g * p.N + n) : 0.0f;
        cs[j] = 0.0f;
    }
    const int64_t c0 = base + rg_col<VEC>(t, 0);   /* the thread's column 0 */
    const int lim = (int)min(p.N - c0, (int64_t)RG_COLS);
    const T *src = (const T *)p.src + (r0 + i0q) * p.N + c0;
    constexpr int U = VEC ? RG_UNROLL : RG_UNROLL / 2;   /* scalar: 8 floats a row, in 64 regs */
    for (int i0 = 0; i0 < nq; i0 += U) {   /* uniform in the group's two warps */
        /* Rows past the group's end (i0 + u >= nq, at most U - 1 of them: 32 % U == 0) read
         * as 0 and add +0 to cs, which is never -0 (+0 plus anything is not -0): no change;
         * their dots land in rows >= rows of dot[], never read. No branch between rows. */
        rg_row<T, VEC> v[U];
#pragma unroll
        for (int u = 0; u < U; u++) v[u].load(src + (int64_t)(i0 + u) * p.N, i0 + u < nq ? lim : 0);
        if (p.partial)
#pragma unroll
            for (int u = 0; u < U; u++) {
                const float pr = weighted ? __shfl_sync(0xffffffffu, pl, i0 + u) : 1.0f;
#pragma unroll
                for (int j = 0; j < 8; j++) cs[j] += weighted ? pr * v[u].get(j) : v[u].get(j);
            }
        if (p.dots) {   /* warp_sum of each row, the U rows' shuffles interleaved */
            float d[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                d[u] = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; j++) d[u] += v[u].get(j) * b[j];
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
#pragma unroll
                for (int u = 0; u < U; u++) d[u] += __shfl_xor_sync(0xffffffffu, d[u], o);
            if (lane == 0)
#pragma unroll
                for (int u = 0; u < U; u++) dot[i0q + i0 + u][half] = d[u];
        }
    }
    if (p.partial) {
        if (VEC) {
            *(float4 *)&colsum[q][8 * t] = make_float4(cs[0], cs[1], cs[2], cs[3]);
            *(float4 *)&colsum[q][8 * t + 4] = make_float4(cs[4], cs[5], cs[6], cs[7]);
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++) colsum[q][rg_col<false>(t, j)] = cs[j];
        }
    }
    __syncthreads();   /* every thread: the only return is uniform and before */
    if (p.partial)
        for (int k = threadIdx.x; k < RG_COLS; k += RG_THREADS) {
            const int64_t n = base + k;
            if (n < p.N) p.partial[tile * p.N + n] = ((colsum[0][k] + colsum[1][k]) + colsum[2][k]) + colsum[3][k];
        }
    if (p.dots)
        for (int i = threadIdx.x; i < rows; i += RG_THREADS)
            p.dots[(r0 + i) * p.chunks + blockIdx.x] = dot[i][0] + dot[i][1];
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
    if constexpr (sizeof(T) == 2)   /* (f32 has the scalar path only) */
        if (vec) {
            row_grads_kernel<T, true><<<grid, RG_THREADS, 0, stream>>>(s->off, s->tiles, (int)s->G, p);
            return;
        }
    row_grads_kernel<T, false><<<grid, RG_THREADS, 0, stream>>>(s->off, s->tiles, (int)s->G, p);
}

moex_status moex_cuda_row_grads_run(moex_context *ctx, const char *op, const moex_cuda_sched *s,
                                    const moex_cuda_row_grads *a, cudaStream_t stream) {
    const bool dprobs = a->dprobs != NULL && (a->bias != NULL || a->part != NULL);
    if (a->dbias == NULL && !dprobs) return MOEX_OK;
    const int64_t mt = moex_cuda_max_tiles(s->T, s->G), chunks = row_grads_chunks(a->N);
    const int64_t nx = (a->N + COLS_PER_CTA - 1) / COLS_PER_CTA, gy = s->G < 65535 ? s->G : 65535;
    const int64_t nrows = (s->T + COLS_PER_CTA - 1) / COLS_PER_CTA;
    if (mt > 65535 || s->G > 65535 || chunks > INT_MAX || nx * gy + nrows > INT_MAX)
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
    if (s->T > 0 && a->N > 0 && (p.partial || p.dots)) {   /* (N == 0: no columns, no chunks) */
        const bool vec = a->dt != MOEX_DTYPE_F32 && a->N % 8 == 0 && (uintptr_t)a->src % 16 == 0;
        const dim3 grid((unsigned)chunks, (unsigned)mt);   /* a tile's chunks launched together */
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
