/*
 * cuda_reduce.cu - deterministic reductions over group rows, with no floating-point
 * atomics:
 *   group_colsum:  dbias[g, n] = sum over the rows of group g of (p_r *) src[r, n]:
 *                  pass 1 writes one partial per (row tile of 128 rows, column) into the
 *                  workspace, pass 2 (colsum_reduce, also after the quantize kernels'
 *                  partials) sums a group's partials in tile order;
 *   row_dot_bias:  dprobs[r] += sum_n src[r, n] * bias_g[n], then the sum of a row of
 *                  partials (the grouped MLP's GLU term, from FC2's fused dgrad), one warp
 *                  per row;
 *   zero_f32:      a plain kernel that zeroes f32 scratch.
 */
#include <limits.h>

#include "cuda_common.cuh"
#include "cuda_ops.h"

#define COLS_PER_CTA 256

size_t moex_cuda_colsum_partial_bytes(int64_t T, int64_t G, int64_t N) {
    return moex_sz_bytes(moex_cuda_max_tiles(T, G), N, sizeof(float));
}

/* partial[t, n] = sum over the rows of row tile t (in order) of (p_r *) src[r, n]. */
template <typename T>
static __global__ void colsum_partial_kernel(const int64_t *off, const int32_t *tiles, int G,
                                             const T *src, int64_t N, const float *probs,
                                             float *partial) {
    int64_t tile = blockIdx.y;
    if (tile >= tiles[G]) return;
    int64_t n = (int64_t)blockIdx.x * COLS_PER_CTA + threadIdx.x;
    if (n >= N) return;
    int g = find_group_i32(tiles, G, tile);
    int64_t r0 = off[g] + (tile - tiles[g]) * MOEX_CUDA_BM;
    int64_t r1 = min(r0 + MOEX_CUDA_BM, off[g + 1]);
    float s = 0.0f;
    for (int64_t r = r0; r < r1; r++) {
        float v = to_f32(src[r * N + n]);
        s += probs ? probs[r] * v : v;
    }
    partial[tile * N + n] = s;
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

moex_status moex_cuda_group_colsum(moex_context *ctx, const char *op, const moex_cuda_sched *s,
                                   const void *src, moex_dtype dt, int64_t N, const float *probs,
                                   float *partial, float *dbias, cudaStream_t stream) {
    if (N == 0) return MOEX_OK;
    MOEX_TRY(moex_cuda_sched_ready(ctx, op, s));
    int64_t nx = (N + COLS_PER_CTA - 1) / COLS_PER_CTA;
    int64_t mt = moex_cuda_max_tiles(s->T, s->G);
    if (mt > 65535 || s->G > 65535)
        return moex_fail(ctx, MOEX_ERR_UNSUPPORTED, "%s: bias-gradient grid too large", op);
    if (s->T > 0) {
        dim3 grid((unsigned)nx, (unsigned)mt);
        if (dt == MOEX_DTYPE_F32)
            colsum_partial_kernel<float><<<grid, COLS_PER_CTA, 0, stream>>>(s->off, s->tiles, (int)s->G,
                                                                             (const float *)src, N, probs, partial);
        else if (dt == MOEX_DTYPE_BF16)
            colsum_partial_kernel<bf16><<<grid, COLS_PER_CTA, 0, stream>>>(s->off, s->tiles, (int)s->G,
                                                                            (const bf16 *)src, N, probs, partial);
        else
            colsum_partial_kernel<f16><<<grid, COLS_PER_CTA, 0, stream>>>(s->off, s->tiles, (int)s->G,
                                                                           (const f16 *)src, N, probs, partial);
        CUDA_TRY_LAUNCH(ctx, op);
    }
    return moex_cuda_colsum_reduce(ctx, op, s->tiles, s->G, partial, N, dbias, stream);
}

#define ROWDOT_WARPS 8

/* One warp per row r < off[G]: dprobs[r] += sum_n src[r, n] * bias_g[n] (bias != NULL), then
 * dprobs[r] += sum_s part[r, s] (part != NULL, s < part_ld in order). */
template <typename T>
static __global__ void row_dot_bias_kernel(const int64_t *off, int G, int64_t T_rows, const T *src, int64_t N,
                                           const void *bias, int bias_f32, int bias_bf16, const float *part,
                                           int64_t part_ld, float *dprobs) {
    int64_t r = (int64_t)blockIdx.x * ROWDOT_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (r >= T_rows || r >= off[G]) return;
    float d = dprobs[r];
    if (bias != NULL) {
        int g = find_group_i64(off, G, r);
        float s = 0.0f;
        for (int64_t n = lane; n < N; n += 32)
            s += to_f32(src[r * N + n]) * load_any(bias, bias_f32, bias_bf16, (int64_t)g * N + n);
        d += warp_sum(s);
    }
    if (part != NULL) {
        float s = 0.0f;
        for (int64_t i = 0; i < part_ld; i++) s += part[r * part_ld + i];
        d += s;
    }
    if (lane == 0) dprobs[r] = d;
}

moex_status moex_cuda_row_dot_bias(moex_context *ctx, const char *op, const moex_cuda_sched *s,
                                   const void *src, moex_dtype dt, int64_t N, const void *bias,
                                   moex_dtype bias_dt, const float *part, int64_t part_ld, float *dprobs,
                                   cudaStream_t stream) {
    if (s->T == 0) return MOEX_OK;
    MOEX_TRY(moex_cuda_sched_ready(ctx, op, s));
    unsigned blocks = (unsigned)((s->T + ROWDOT_WARPS - 1) / ROWDOT_WARPS);
    int bf = bias_dt == MOEX_DTYPE_F32, bb = bias_dt == MOEX_DTYPE_BF16;
    const int64_t *off = s->off;
    const int G = (int)s->G;
    if (dt == MOEX_DTYPE_F32)
        row_dot_bias_kernel<float><<<blocks, ROWDOT_WARPS * 32, 0, stream>>>(off, G, s->T, (const float *)src, N, bias,
                                                                             bf, bb, part, part_ld, dprobs);
    else if (dt == MOEX_DTYPE_BF16)
        row_dot_bias_kernel<bf16><<<blocks, ROWDOT_WARPS * 32, 0, stream>>>(off, G, s->T, (const bf16 *)src, N, bias,
                                                                            bf, bb, part, part_ld, dprobs);
    else
        row_dot_bias_kernel<f16><<<blocks, ROWDOT_WARPS * 32, 0, stream>>>(off, G, s->T, (const f16 *)src, N, bias,
                                                                           bf, bb, part, part_ld, dprobs);
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
