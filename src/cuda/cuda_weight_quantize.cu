/*
 * cuda_weight_quantize.cu - grouped WEIGHT quantization on the GPU (docs/ops.md 9.7): the
 * weight_quantize and weight_dequantize primitives of backend.h (plain primitives: no
 * splits, no groups handle). w [G, N, K] (d->T is N), the rowwise copy [G, N, K], the
 * columnwise copy [G, K, N] (each W_g transposed). The element math (the FP8 cast, the
 * scale rule, the MX exponent) is src/core/quant_math.h, shared with the CPU, so both
 * compute the same bits; the cast is cuda_quant.cuh's fp8_encode (the conversion
 * instruction, bit for bit moex_fp8_encode).
 *
 * quantize GROUP (one current scale per expert), four launches:
 *   moex_cuda_zero_f32  the amax slots in the workspace (bit patterns of |amax|) = 0
 *   group_amax     block x: chunks of AMAX_CHUNK elements of W_g (flat, coalesced), block y:
 *                  the expert g; the max of the |w| bit patterns (finite < Inf < NaN: NaN
 *                  wins, as moex_amax_combine), reduced in the block, then one atomicMax
 *                  (unsigned, order-independent, so deterministic)
 *   current_scale  (cuda_quant.cuh) one thread per expert: s = moex_quant_scale(amax), the multiplier s into
 *                  the workspace, 1/s into the scales of both copies, amax out (an empty W_g,
 *                  N*K == 0, has amax 0)
 *   group_cast     block x: a 64x64 tile of W_g, block y: the expert; q = fp8(w s) once per
 *                  element, the rowwise copy written along K, the columnwise copy through
 *                  shared memory (the transposed tile written along N)
 * quantize BLOCK (128x128 blocks of each W_g, f32 scales), one launch:
 *   block          block x: a 128x128 block (i, j) of W_g, block y: the expert; the block's
 *                  values held in registers (64 per thread), amax reduced in the block,
 *                  s = moex_quant_scale, 1/s at rowwise scales [g, i, j] and columnwise
 *                  scales [g, j, i], the rowwise copy written along K, the columnwise copy
 *                  through shared memory (written along N)
 * quantize MXFP8 (E8M0 scales), one launch:
 *   mx             block x: a 64x64 tile of W_g, block y: the expert; the tile read along K
 *                  into shared memory, then one warp per 32-element block: rowwise, 32
 *                  columns of one row (scale [g, n, k/32], data along K); columnwise, 32 rows
 *                  of one column (scale [g, k, n/32], data along N, so the writes of the
 *                  [G, K, N] copy are coalesced). MX blocks start at multiples of 32, so no
 *                  block crosses a tile.
 * dequantize: w[g, n, k] = round_dt(decode(q) * scale), one launch:
 *   dequant        block x: a 64x64 tile of W_g, block y: the expert; from the rowwise copy
 *                  read and written along K; from the columnwise copy read along N into
 *                  shared memory and written along K. The scale of (g, n, k): GROUP
 *                  scales[g]; BLOCK [g, n/128, k/128] (rowwise) or [g, k/128, n/128]; MXFP8
 *                  [g, n, k/32] (rowwise) or [g, k, n/32], E8M0 2^(b - 127), 0xFF NaN.
 * Tiles and blocks are cut at the edges of W_g (N, K need not be multiples of 32 or 128):
 * outside values read as 0 (which no amax sees) and are never written. G, N or K = 0:
 * nothing is launched, but for GROUP with G > 0 and N*K == 0 (scale and amax per expert).
 * Workspace: GROUP quantize, amax bits [G] u32 and multipliers [G] f32; else none.
 * All grids are grid-stride loops (x capped at 2^20 blocks, y at 65535) with int64
 * offsets, so no limit of G, N or K comes from them. No allocation, no synchronisation;
 * everything on c->stream, every launch checked.
 */
#include "cuda_quant.cuh"
#include "cuda_ops.h"

#define WQ_THREADS 256          /* every kernel */
#define WQ_WARPS (WQ_THREADS / 32)
#define WQ_TILE 64              /* the 64x64 tiles of group_cast, mx and dequant */
#define WQ_TILE_ROWS (WQ_THREADS / WQ_TILE)       /* 4: the rows a pass of 256 threads covers */
#define WQ_TILE_EPT (WQ_TILE / WQ_TILE_ROWS)      /* 16: a thread's elements of a tile */
#define WQ_BLOCK 128            /* the BLOCK recipe's block */
#define WQ_BLOCK_ROWS (WQ_THREADS / WQ_BLOCK)     /* 2 */
#define WQ_BLOCK_EPT (WQ_BLOCK / WQ_BLOCK_ROWS)   /* 64: a thread's elements of a block */
#define WQ_MX 32                /* the MXFP8 block */
#define WQ_MX_PER_TILE (WQ_TILE / WQ_MX)          /* 2 MX blocks along a tile's side */
#define AMAX_UNROLL 4           /* group_amax: loads in flight per thread */
#define AMAX_CHUNK (WQ_THREADS * AMAX_UNROLL)     /* the elements of one pass of a block */
#define AMAX_PASSES 8           /* the passes one block is sized for */


/* ---- device helpers ------------------------------------------------------------------ */

/* The MX amax of a warp's 32 values (NaN skipped, moex_mx_amax_combine); every lane gets it. */
static __device__ __forceinline__ float warp_mx_amax(float v) {
    float m = moex_mx_amax_combine(0.0f, v);
    for (int o = 16; o > 0; o >>= 1) m = moex_mx_amax_combine(m, __shfl_xor_sync(0xffffffffu, m, o));
    return m;
}

/* ---- quantize: GROUP ------------------------------------------------------------------- */

/* amax_bits[g] = max(..., |w| bits over W_g), M = N K elements per expert. Block x: every
 * gridDim.x-th chunk of AMAX_CHUNK elements of W_g; block y: experts. */
template <typename TX>
static __global__ void __launch_bounds__(WQ_THREADS)
group_amax_kernel(const TX *w, int64_t G, int64_t M, uint32_t *amax_bits) {
    __shared__ uint32_t red[32];
    for (int64_t g = blockIdx.y; g < G; g += gridDim.y) {
        const TX *wg = w + g * M;
        uint32_t m = 0u;
        for (int64_t base = (int64_t)blockIdx.x * AMAX_CHUNK; base < M; base += (int64_t)gridDim.x * AMAX_CHUNK) {
            float v[AMAX_UNROLL];
#pragma unroll
            for (int u = 0; u < AMAX_UNROLL; u++) {
                const int64_t i = base + u * WQ_THREADS + threadIdx.x;
                v[u] = i < M ? to_f32(wg[i]) : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < AMAX_UNROLL; u++) m = max(m, abs_bits(v[u]));
        }
        m = block_max_u32(m, red);
        if (threadIdx.x == 0 && m != 0u) atomicMax(&amax_bits[g], m);
    }
}

/* q = fp8(w s_g) for the 64x64 tiles of each W_g [N, K]; row_data [G, N, K] written
 * directly, col_data [G, K, N] through shared memory (either may be NULL). Block x: tiles
 * of W_g, y: experts; threads 64 columns x 4 rows (reads), 64 rows x 4 columns (writes). */
template <typename TX>
static __global__ void __launch_bounds__(WQ_THREADS)
group_cast_kernel(const TX *w, int64_t G, int64_t N, int64_t K, const float *mult, moex_fp8_format f,
                  uint8_t *row_data, uint8_t *col_data) {
    __shared__ uint8_t sq[WQ_TILE][WQ_TILE + 4];
    const int64_t ntk = cdiv(K, WQ_TILE), ntiles = cdiv(N, WQ_TILE) * ntk;
    const int tx = threadIdx.x % WQ_TILE, ty = threadIdx.x / WQ_TILE;
    for (int64_t g = blockIdx.y; g < G; g += gridDim.y) {
        const float s = mult[g];
        for (int64_t t = blockIdx.x; t < ntiles; t += gridDim.x) {
            const int64_t tn = t / ntk;
            const int64_t n0 = tn * WQ_TILE, k0 = (t - tn * ntk) * WQ_TILE;
            const int nn = (int)min((int64_t)WQ_TILE, N - n0), nk = (int)min((int64_t)WQ_TILE, K - k0);
            const int64_t at0 = (g * N + n0) * K + k0;   /* w[g, n0, k0], row_data[g, n0, k0] */
            float v[WQ_TILE_EPT];
#pragma unroll
            for (int r = 0; r < WQ_TILE_EPT; r++) {
                const int i = ty + r * WQ_TILE_ROWS;
                v[r] = (i < nn && tx < nk) ? to_f32(w[at0 + (int64_t)i * K + tx]) : 0.0f;
            }
            __syncthreads();   /* the previous tile is done with sq */
#pragma unroll
            for (int r = 0; r < WQ_TILE_EPT; r++) {
                const int i = ty + r * WQ_TILE_ROWS;
                if (i < nn && tx < nk) {
                    const uint8_t q = fp8_encode(v[r] * s, f);
                    if (row_data) row_data[at0 + (int64_t)i * K + tx] = q;
                    sq[i][tx] = q;
                }
            }
            if (col_data) {   /* block-uniform */
                __syncthreads();
                uint8_t *cb = col_data + (g * K + k0) * N + n0;   /* col_data[g, k0, n0] */
                if (tx < nn)
                    for (int j = ty; j < nk; j += WQ_TILE_ROWS) cb[(int64_t)j * N + tx] = sq[tx][j];
            }
        }
    }
}

/* ---- quantize: BLOCK --------------------------------------------------------------------- */

/* One CUDA block per 128x128 block (i, j) of W_g (block x: the blocks of W_g, row-major
 * over (i, j); y: experts). Threads: 128 columns x 2 rows; thread (tx, ty) holds rows
 * ty + 2r, r < 64, of column tx. Scales 1/s at row_scales [g, i, j] and col_scales
 * [g, j, i]; the columnwise values through shared memory, written along N (threads: 128
 * rows of W_g x 2 columns). */
template <typename TX>
static __global__ void __launch_bounds__(WQ_THREADS)
block_kernel(const TX *w, int64_t G, int64_t N, int64_t K, moex_fp8_format f, float eps, moex_scale_rounding rounding,
             uint8_t *row_data, float *row_scales, uint8_t *col_data, float *col_scales) {
    __shared__ uint32_t red[32];
    __shared__ uint8_t sq[WQ_BLOCK][WQ_BLOCK + 4];
    const int64_t nbn = cdiv(N, WQ_BLOCK), nbk = cdiv(K, WQ_BLOCK), nblocks = nbn * nbk;
    const int tx = threadIdx.x % WQ_BLOCK, ty = threadIdx.x / WQ_BLOCK;
    for (int64_t g = blockIdx.y; g < G; g += gridDim.y)
        for (int64_t b = blockIdx.x; b < nblocks; b += gridDim.x) {
            const int64_t bi = b / nbk, bj = b - bi * nbk;
            const int64_t n0 = bi * WQ_BLOCK, k0 = bj * WQ_BLOCK;
            const int nn = (int)min((int64_t)WQ_BLOCK, N - n0), nk = (int)min((int64_t)WQ_BLOCK, K - k0);
            const int64_t at0 = (g * N + n0) * K + k0;   /* w[g, n0, k0], row_data[g, n0, k0] */
            float v[WQ_BLOCK_EPT];
            uint32_t m = 0u;
#pragma unroll
            for (int r = 0; r < WQ_BLOCK_EPT; r++) {
                const int i = ty + r * WQ_BLOCK_ROWS;
                v[r] = (i < nn && tx < nk) ? to_f32(w[at0 + (int64_t)i * K + tx]) : 0.0f;
            }
#pragma unroll
            for (int r = 0; r < WQ_BLOCK_EPT; r++) m = max(m, abs_bits(v[r]));
            m = block_max_u32(m, red);   /* its first barrier: the previous block is done with sq */
            const float s = moex_quant_scale(__uint_as_float(m), eps, f.max, rounding);
            if (threadIdx.x == 0) {
                const float inv = 1.0f / s;
                if (row_scales) row_scales[(g * nbn + bi) * nbk + bj] = inv;
                if (col_scales) col_scales[(g * nbk + bj) * nbn + bi] = inv;
            }
#pragma unroll
            for (int r = 0; r < WQ_BLOCK_EPT; r++) {
                const int i = ty + r * WQ_BLOCK_ROWS;
                if (i < nn && tx < nk) {
                    const uint8_t q = fp8_encode(v[r] * s, f);
                    if (row_data) row_data[at0 + (int64_t)i * K + tx] = q;
                    sq[i][tx] = q;
                }
            }
            if (col_data) {   /* block-uniform */
                __syncthreads();
                uint8_t *cb = col_data + (g * K + k0) * N + n0;   /* col_data[g, k0, n0] */
                if (tx < nn)
                    for (int j = ty; j < nk; j += WQ_BLOCK_ROWS) cb[(int64_t)j * N + tx] = sq[tx][j];
            }
        }
}

/* ---- quantize: MXFP8 --------------------------------------------------------------------- */

/* The 64x64 tiles of each W_g (block x: tiles of W_g, y: experts), read along K into shared
 * memory (threads 64 columns x 4 rows; outside W_g: 0, which no MX amax sees). Then one warp
 * per 32-element block, lane l its element l:
 *   rowwise     row i of the tile, columns 32b + [0, 32): scale row_scales [g, n, k/32]
 *               (rbk = ceil(K/32) per row), data row_data [g, n, k] along K;
 *   columnwise  column c of the tile, rows 32b + [0, 32): scale col_scales [g, k, n/32]
 *               (cbn = ceil(N/32) per row of W_g^T), data col_data [g, k, n] along N.
 * s = 2^-E (ldexpf, exactly as the CPU), the E8M0 byte E + 127. */
template <typename TX>
static __global__ void __launch_bounds__(WQ_THREADS)
mx_kernel(const TX *w, int64_t G, int64_t N, int64_t K, moex_fp8_format f, uint8_t *row_data, uint8_t *row_scales,
          uint8_t *col_data, uint8_t *col_scales) {
    __shared__ float sx[WQ_TILE][WQ_TILE + 1];
    const int64_t ntk = cdiv(K, WQ_TILE), ntiles = cdiv(N, WQ_TILE) * ntk;
    const int64_t rbk = cdiv(K, WQ_MX), cbn = cdiv(N, WQ_MX);
    const int tx = threadIdx.x % WQ_TILE, ty = threadIdx.x / WQ_TILE;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t g = blockIdx.y; g < G; g += gridDim.y)
        for (int64_t t = blockIdx.x; t < ntiles; t += gridDim.x) {
            const int64_t tn = t / ntk;
            const int64_t n0 = tn * WQ_TILE, k0 = (t - tn * ntk) * WQ_TILE;
            const int nn = (int)min((int64_t)WQ_TILE, N - n0), nk = (int)min((int64_t)WQ_TILE, K - k0);
            const int64_t at0 = (g * N + n0) * K + k0;   /* w[g, n0, k0], row_data[g, n0, k0] */
            float v[WQ_TILE_EPT];
#pragma unroll
            for (int r = 0; r < WQ_TILE_EPT; r++) {
                const int i = ty + r * WQ_TILE_ROWS;
                v[r] = (i < nn && tx < nk) ? to_f32(w[at0 + (int64_t)i * K + tx]) : 0.0f;
            }
            __syncthreads();   /* the previous tile is done with sx */
#pragma unroll
            for (int r = 0; r < WQ_TILE_EPT; r++) sx[ty + r * WQ_TILE_ROWS][tx] = v[r];
            __syncthreads();
            if (row_data)   /* block-uniform; the pairs' conditions below are warp-uniform */
                for (int p = warp; p < WQ_TILE * WQ_MX_PER_TILE; p += WQ_WARPS) {
                    const int i = p / WQ_MX_PER_TILE, c0 = (p % WQ_MX_PER_TILE) * WQ_MX;
                    if (i >= nn || c0 >= nk) continue;
                    const float x = sx[i][c0 + lane];
                    const int E = moex_mx_exponent(warp_mx_amax(x), f);
                    const int64_t row = g * N + n0 + i;
                    if (lane == 0) row_scales[row * rbk + (k0 + c0) / WQ_MX] = (uint8_t)(E + 127);
                    if (c0 + lane < nk) row_data[row * K + k0 + c0 + lane] = fp8_encode(x * ldexpf(1.0f, -E), f);
                }
            if (col_data)
                for (int p = warp; p < WQ_TILE * WQ_MX_PER_TILE; p += WQ_WARPS) {
                    const int c = p / WQ_MX_PER_TILE, r0 = (p % WQ_MX_PER_TILE) * WQ_MX;
                    if (c >= nk || r0 >= nn) continue;
                    const float x = sx[r0 + lane][c];
                    const int E = moex_mx_exponent(warp_mx_amax(x), f);
                    const int64_t col = g * K + k0 + c;   /* the row of the [G*K, N] copy */
                    if (lane == 0) col_scales[col * cbn + (n0 + r0) / WQ_MX] = (uint8_t)(E + 127);
                    if (r0 + lane < nn) col_data[col * N + n0 + r0 + lane] = fp8_encode(x * ldexpf(1.0f, -E), f);
                }
        }
}

/* ---- dequantize ------------------------------------------------------------------------ */

/* Where the scale of (g, n, k) is (docs/ops.md 9.7), for both copies. */
typedef struct wdq_scales {
    const void *p;
    int recipe;                 /* moex_quant_recipe: GROUP, BLOCK or MXFP8 */
    int colsrc;                 /* 1: the columnwise copy's scales */
    int64_t N, K;
    int64_t nbn, nbk;           /* BLOCK: ceil(N/128), ceil(K/128); MXFP8: ceil(N/32), ceil(K/32) */
} wdq_scales;

static __device__ __forceinline__ float wdq_scale_at(const wdq_scales &s, int64_t g, int64_t n, int64_t k) {
    if (s.recipe == MOEX_QUANT_GROUP) return ((const float *)s.p)[g];
    if (s.recipe == MOEX_QUANT_BLOCK) {
        const int64_t i = n / WQ_BLOCK, j = k / WQ_BLOCK;
        return ((const float *)s.p)[s.colsrc ? (g * s.nbk + j) * s.nbn + i : (g * s.nbn + i) * s.nbk + j];
    }
    const int64_t at = s.colsrc ? (g * s.K + k) * s.nbn + n / WQ_MX : (g * s.N + n) * s.nbk + k / WQ_MX;
    return e8m0_value(((const uint8_t *)s.p)[at]);
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

/* ---- workspaces ---------------------------------------------------------------------------
 * One layout function gives the size (ws NULL) and the pointers: GROUP quantize, the amax
 * bits [G] and the multipliers [G]; nothing else needs any.                               */

typedef struct wq_ws {
    uint32_t *amax_bits;
    float *mult;
    size_t used;
} wq_ws;

static wq_ws wq_layout(moex_quant_recipe recipe, int64_t G, void *ws) {
    moex_carver c = {(char *)ws, 0};
    wq_ws l = {NULL, NULL, 0};
    if (recipe == MOEX_QUANT_GROUP) {
        l.amax_bits = (uint32_t *)moex_take(&c, moex_sz_bytes(G, 1, sizeof(uint32_t)));
        l.mult = (float *)moex_take(&c, moex_sz_bytes(G, 1, sizeof(float)));
    }
    l.used = c.used;
    return l;
}

/* ---- quantize ---------------------------------------------------------------------------- */

size_t moex_cuda_weight_quantize_ws(moex_context *ctx, const moex_weight_quantize_args *a, const moex_quant_dims *d) {
    return wq_layout(a->params.recipe, d->G, NULL).used;
}

/* The outputs, by presence (with N*K == 0 the data is empty and may be NULL, GROUP's
 * scales are not). */
typedef struct wq_out {
    uint8_t *row_data, *col_data;
    void *row_scales, *col_scales;
} wq_out;

static wq_out wq_outputs(const moex_weight_quantize_args *a) {
    wq_out o = {NULL, NULL, NULL, NULL};
    if (moex_present(&a->rowwise.data))
        o.row_data = (uint8_t *)a->rowwise.data.data, o.row_scales = a->rowwise.scales.data;
    if (moex_present(&a->columnwise.data))
        o.col_data = (uint8_t *)a->columnwise.data.data, o.col_scales = a->columnwise.scales.data;
    return o;
}

template <typename TX>
static moex_status quantize_group(moex_context *ctx, const moex_call *c, const moex_weight_quantize_args *a,
                                  const moex_quant_dims *d, const wq_ws &l) {
    cudaStream_t stream = (cudaStream_t)c->stream;
    const int64_t G = d->G, N = d->T, K = d->K;
    if (G == 0) return MOEX_OK;
    const moex_fp8_format f = moex_fp8_format_of(a->params.fp8);
    const wq_out o = wq_outputs(a);
    const TX *w = (const TX *)a->w.data;
    const bool has_data = N > 0 && K > 0;   /* else every W_g is empty: amax 0 */

    MOEX_TRY(moex_cuda_zero_f32(ctx, c, (float *)l.amax_bits, G));   /* 0.0f: bit pattern 0 */
    if (has_data) {
        const int64_t M = N * K;   /* validated: G N K < 2^60 */
        const dim3 grid(quant_grid_x(cdiv(M, (int64_t)AMAX_CHUNK * AMAX_PASSES)), quant_grid_y(G));
        group_amax_kernel<TX><<<grid, WQ_THREADS, 0, stream>>>(w, G, M, l.amax_bits);
        CUDA_TRY_LAUNCH(ctx, c->op);
    }
    current_scale_kernel<<<quant_grid_x(cdiv(G, WQ_THREADS)), WQ_THREADS, 0, stream>>>(
        l.amax_bits, G, a->params.amax_epsilon, f.max, a->params.rounding, l.mult, (float *)o.row_scales,
        (float *)o.col_scales, moex_present(&a->amax) ? (float *)a->amax.data : NULL);
    CUDA_TRY_LAUNCH(ctx, c->op);
    if (has_data) {
        const dim3 grid(quant_grid_x(cdiv(N, WQ_TILE) * cdiv(K, WQ_TILE)), quant_grid_y(G));
        group_cast_kernel<TX><<<grid, WQ_THREADS, 0, stream>>>(w, G, N, K, l.mult, f, o.row_data, o.col_data);
        CUDA_TRY_LAUNCH(ctx, c->op);
    }
    return MOEX_OK;
}

template <typename TX>
static moex_status quantize_block(moex_context *ctx, const moex_call *c, const moex_weight_quantize_args *a,
                                  const moex_quant_dims *d) {
    const int64_t G = d->G, N = d->T, K = d->K;
    if (G == 0 || N == 0 || K == 0) return MOEX_OK;   /* no blocks: nothing to write */
    const wq_out o = wq_outputs(a);
    const dim3 grid(quant_grid_x(cdiv(N, WQ_BLOCK) * cdiv(K, WQ_BLOCK)), quant_grid_y(G));
    block_kernel<TX><<<grid, WQ_THREADS, 0, (cudaStream_t)c->stream>>>(
        (const TX *)a->w.data, G, N, K, moex_fp8_format_of(a->params.fp8), a->params.amax_epsilon, a->params.rounding,
        o.row_data, (float *)o.row_scales, o.col_data, (float *)o.col_scales);
    CUDA_TRY_LAUNCH(ctx, c->op);
    return MOEX_OK;
}

template <typename TX>
static moex_status quantize_mx(moex_context *ctx, const moex_call *c, const moex_weight_quantize_args *a,
                               const moex_quant_dims *d) {
    const int64_t G = d->G, N = d->T, K = d->K;
    if (G == 0 || N == 0 || K == 0) return MOEX_OK;   /* no blocks: nothing to write */
    const wq_out o = wq_outputs(a);
    const dim3 grid(quant_grid_x(cdiv(N, WQ_TILE) * cdiv(K, WQ_TILE)), quant_grid_y(G));
    mx_kernel<TX><<<grid, WQ_THREADS, 0, (cudaStream_t)c->stream>>>(
        (const TX *)a->w.data, G, N, K, moex_fp8_format_of(a->params.fp8), o.row_data, (uint8_t *)o.row_scales,
        o.col_data, (uint8_t *)o.col_scales);
    CUDA_TRY_LAUNCH(ctx, c->op);
    return MOEX_OK;
}

template <typename TX>
static moex_status quantize_run(moex_context *ctx, const moex_call *c, const moex_weight_quantize_args *a,
                                const moex_quant_dims *d, const wq_ws &l) {
    switch (a->params.recipe) {
    case MOEX_QUANT_GROUP: return quantize_group<TX>(ctx, c, a, d, l);
    case MOEX_QUANT_BLOCK: return quantize_block<TX>(ctx, c, a, d);
    case MOEX_QUANT_MXFP8: return quantize_mx<TX>(ctx, c, a, d);
    default: break;
    }
    return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: recipe %d is not a weight recipe", c->op, (int)a->params.recipe);
}

moex_status moex_cuda_weight_quantize(moex_context *ctx, const moex_call *c, const moex_weight_quantize_args *a,
                                      const moex_quant_dims *d, void *ws) {
    const wq_ws l = wq_layout(a->params.recipe, d->G, ws);
    if (d->dt == MOEX_DTYPE_F32) return quantize_run<float>(ctx, c, a, d, l);
    if (d->dt == MOEX_DTYPE_BF16) return quantize_run<bf16>(ctx, c, a, d, l);
    return quantize_run<f16>(ctx, c, a, d, l);
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
