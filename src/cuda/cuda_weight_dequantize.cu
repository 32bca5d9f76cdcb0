/*
 * cuda_weight_dequantize.cu - grouped WEIGHT dequantization on the GPU (docs/ops.md 9.7):
 * the weight_dequantize primitive of backend.h (a plain primitive: no splits). w [G, N, K]
 * (d->T is N) from the rowwise copy [G, N, K] or the columnwise copy [G, K, N] (each W_g
 * transposed): w[g, n, k] = round_dt(decode(q) * scale), one launch:
 *   dequant   block x: a 64x64 tile of W_g, block y: the expert; from the rowwise copy read
 *             and written along K; from the columnwise copy read along N into shared memory
 *             and written along K. The scale of (g, n, k): GROUP scales[g]; BLOCK
 *             [g, n/128, k/128] (rowwise) or [g, k/128, n/128]; MXFP8 [g, n, k/32] (rowwise)
 *             or [g, k, n/32], E8M0 2^(b - 127), 0xFF NaN; swizzled MXFP8 (9.8) at
 *             moex_mx_swizzled_at within expert g's padded matrix.
 * (Weight quantize runs on the grouped quantize's tile kernels: cuda_quantize.cu.) Tiles are
 * cut at the edges of W_g; G, N or K = 0: nothing is launched. Grids are grid-stride loops
 * (x capped at 2^20 blocks, y at 65535) with int64 offsets; no allocation, no
 * synchronisation; everything on c->stream, every launch checked.
 */
#include "cuda_quant.cuh"
#include "cuda_ops.h"

#define WQ_THREADS 256
#define WQ_TILE 64                                /* the 64x64 tiles of dequant */
#define WQ_TILE_ROWS (WQ_THREADS / WQ_TILE)       /* 4: the rows a pass of 256 threads covers */
#define WQ_BLOCK 128                              /* the BLOCK recipe's block */
#define WQ_MX 32                                  /* the MXFP8 block */

/* ---- dequantize kernels ------------------------------------------------------------------ */

/* Where the scale of (g, n, k) is (docs/ops.md 9.7), for both copies. */
typedef struct wdq_scales {
    const void *p;
    int recipe;                 /* moex_quant_recipe: GROUP, BLOCK or MXFP8 */
    int colsrc;                 /* 1: the columnwise copy's scales */
    int64_t N, K;
    int64_t nbn, nbk;           /* BLOCK: ceil(N/128), ceil(K/128); MXFP8: ceil(N/32), ceil(K/32) */
    int swizzled;               /* MXFP8 scales in the 128x4-tiled layout (docs/ops.md 9.8) */
} wdq_scales;

static __device__ __forceinline__ float wdq_scale_at(const wdq_scales &s, int64_t g, int64_t n, int64_t k) {
    if (s.recipe == MOEX_QUANT_GROUP) return ((const float *)s.p)[g];
    if (s.recipe == MOEX_QUANT_BLOCK) {
        const int64_t i = n / WQ_BLOCK, j = k / WQ_BLOCK;
        return ((const float *)s.p)[s.colsrc ? (g * s.nbk + j) * s.nbn + i : (g * s.nbn + i) * s.nbk + j];
    }
    const int64_t at = s.colsrc ? moex_mx_expert_scale_at(s.K, s.nbn, s.swizzled, g, k, n / WQ_MX)
                                : moex_mx_expert_scale_at(s.N, s.nbk, s.swizzled, g, n, k / WQ_MX);
    return moex_e8m0_value(((const uint8_t *)s.p)[at]);
}

/* w[g, n, k] = round(decode(q) * scale) over the 64x64 tiles of each W_g (block x: tiles,
 * y: experts). COLSRC false: q = src[g, n, k], read and written along K (threads 64
 * columns x 4 rows). COLSRC true: q = src[g, k, n], read along N (64 rows of W_g x 4
 * columns) into shared memory, written along K. */
template <typename TY, bool COLSRC>
static __global__ void __launch_bounds__(WQ_THREADS)
dequant_kernel(wdq_scales sc, const uint8_t *src, int64_t G, int64_t N, int64_t K, moex_fp8_format f, TY *w) {
    __shared__ float sv[WQ_TILE][WQ_TILE + 1];
    const int64_t ntk = cdiv(K, WQ_TILE), ntiles = cdiv(N, WQ_TILE) * ntk;
    const int tx = threadIdx.x % WQ_TILE, ty = threadIdx.x / WQ_TILE;
    for (int64_t g = blockIdx.y; g < G; g += gridDim.y)
        for (int64_t t = blockIdx.x; t < ntiles; t += gridDim.x) {
            const int64_t tn = t / ntk;
            const int64_t n0 = tn * WQ_TILE, k0 = (t - tn * ntk) * WQ_TILE;
            const int nn = (int)min((int64_t)WQ_TILE, N - n0), nk = (int)min((int64_t)WQ_TILE, K - k0);
            const int64_t at0 = (g * N + n0) * K + k0;   /* w[g, n0, k0] */
            if (!COLSRC) {
                if (tx < nk) {
#pragma unroll 4
                    for (int i = ty; i < nn; i += WQ_TILE_ROWS) {
                        const int64_t at = at0 + (int64_t)i * K + tx;
                        w[at] = from_f32<TY>(moex_fp8_decode(src[at], f) * wdq_scale_at(sc, g, n0 + i, k0 + tx));
                    }
                }
                continue;
            }
            const uint8_t *sb = src + (g * K + k0) * N + n0;   /* src[g, k0, n0] */
            __syncthreads();   /* the previous tile is done with sv */
            if (tx < nn) {
#pragma unroll 4
                for (int j = ty; j < nk; j += WQ_TILE_ROWS)
                    sv[tx][j] = moex_fp8_decode(sb[(int64_t)j * N + tx], f) * wdq_scale_at(sc, g, n0 + tx, k0 + j);
            }
            __syncthreads();
            if (tx < nk)
                for (int i = ty; i < nn; i += WQ_TILE_ROWS) w[at0 + (int64_t)i * K + tx] = from_f32<TY>(sv[i][tx]);
        }
}

/* ---- dequantize -------------------------------------------------------------------------- */

size_t moex_cuda_weight_dequantize_ws(moex_context *ctx, const moex_weight_dequantize_args *a,
                                      const moex_quant_dims *d) {
    return 0;
}

template <typename TY>
static moex_status dequantize_run(moex_context *ctx, const moex_call *c, const moex_weight_dequantize_args *a,
                                  const moex_quant_dims *d) {
    const int64_t G = d->G, N = d->T, K = d->K;
    if (G == 0 || N == 0 || K == 0) return MOEX_OK;   /* nothing to write */
    const moex_quant_recipe recipe = a->params.recipe;
    if (recipe != MOEX_QUANT_GROUP && recipe != MOEX_QUANT_BLOCK && recipe != MOEX_QUANT_MXFP8)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: recipe %d is not a weight recipe", c->op, (int)recipe);
    const int64_t B = recipe == MOEX_QUANT_BLOCK ? WQ_BLOCK : WQ_MX;   /* GROUP: unused */
    wdq_scales sc;
    sc.p = a->src.scales.data;
    sc.recipe = (int)recipe;
    sc.colsrc = a->orientation == MOEX_QUANT_COLUMNWISE;
    sc.N = N, sc.K = K;
    sc.nbn = cdiv(N, B), sc.nbk = cdiv(K, B);
    sc.swizzled = a->params.scale_layout == MOEX_SCALES_MX_SWIZZLED;
    const moex_fp8_format f = moex_fp8_format_of(a->params.fp8);
    const uint8_t *q = (const uint8_t *)a->src.data.data;
    TY *w = (TY *)a->w.data;
    const dim3 grid(quant_grid_x(cdiv(N, WQ_TILE) * cdiv(K, WQ_TILE)), quant_grid_y(G));
    cudaStream_t stream = (cudaStream_t)c->stream;
    if (sc.colsrc)
        dequant_kernel<TY, true><<<grid, WQ_THREADS, 0, stream>>>(sc, q, G, N, K, f, w);
    else
        dequant_kernel<TY, false><<<grid, WQ_THREADS, 0, stream>>>(sc, q, G, N, K, f, w);
    CUDA_TRY_LAUNCH(ctx, c->op);
    return MOEX_OK;
}

moex_status moex_cuda_weight_dequantize(moex_context *ctx, const moex_call *c, const moex_weight_dequantize_args *a,
                                        const moex_quant_dims *d, void *ws) {
    if (d->dt == MOEX_DTYPE_F32) return dequantize_run<float>(ctx, c, a, d);
    if (d->dt == MOEX_DTYPE_BF16) return dequantize_run<bf16>(ctx, c, a, d);
    return dequantize_run<f16>(ctx, c, a, d);
}
