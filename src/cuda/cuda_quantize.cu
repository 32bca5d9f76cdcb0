/*
 * cuda_quantize.cu - grouped FP8 quantization on the GPU (docs/ops.md section 9): the
 * quantize and dequantize primitives of backend.h. The element math (the FP8 cast, the scale
 * rule, the MX exponent) is src/core/quant_math.h, shared with the CPU, and the cast is the
 * conversion instruction (cuda_quant.cuh), so both compute the same bits. Rows >= S = off[G] are never read or written; split
 * values are read on the device only (the prepared handle's off[] and tiles[]).
 *
 * quantize, current scaling (TENSOR: one set, GROUP: one set per group), four launches:
 *   zero_u32       the amax slots in the workspace (bit patterns of |amax|) = 0
 *   group_amax     one block per (128-row tile of one group (g->tiles), 1024 columns): the
 *                  max of the |x| bit patterns (finite < Inf < NaN: NaN wins, as
 *                  moex_amax_combine), reduced in the block, then one atomicMax (unsigned,
 *                  order-independent, so deterministic)
 *   current_scale  one thread per set: s = moex_quant_scale(amax), the multiplier s into
 *                  the workspace, 1/s into the scales of both copies, amax out
 *   current_cast   one block per 64x64 tile of x: q = fp8(x s) once per element, the
 *                  rowwise copy written directly, the columnwise copy through shared memory
 *                  (the transposed tile written along the rows, so writes are coalesced)
 * quantize, dbias (any recipe): moex_cuda_group_colsum (cuda_reduce.cu) after the cast, the
 *   grouped linear's deterministic column sums;
 * quantize, block scaling (BLOCK 1x128, f32 scales; MXFP8 1x32, E8M0 scales):
 *   block_rowwise  one warp per (row, block of B columns): amax reduced in the warp
 *   colscale_off   one block: b_g = sum over h < g of ceil(m_h / B), into the workspace
 *   block_colwise  one block per (column tile t of one group, 64 columns): the B x 64 tile
 *                  of x read along the rows into shared memory, then one warp per column:
 *                  amax over the tile's rows, the scale (at scale column t = b_g + j), and
 *                  the column's FP8 values written along the rows of data [K, T]
 * dequantize: y = round_dt(decode(q) * scale)
 *   dequant_rowwise  one block per row (grid-stride), threads along the columns
 *   dequant_colwise  one block per 64x64 tile, through shared memory (reads along the rows
 *                    of data [K, T], writes along the rows of y [T, K]); block scaling
 *                    needs b_g (colscale_off first)
 * The FP8 cast is the hardware's cvt.rn.satfinite (fp8_encode, cuda_quant.cuh), which is
 * docs/ops.md 9.1 exactly; tests/cuda/test_gpu_quantize.c checks it bit for bit against the
 * reference (ties, subnormals, NaN, Inf, saturation), as moex_fp8_encode is on the CPU.
 * All grids are grid-stride loops (x capped at 2^20 blocks, y at 65535), so no limit of T,
 * K or G comes from them. No allocation, no synchronisation; everything on c->stream.
 */
#include <limits.h>

#include "cuda_quant.cuh"
#include "cuda_ops.h"

#define Q_THREADS 256           /* every kernel but colscale_off */
#define Q_WARPS (Q_THREADS / 32)
#define Q_TILE 64               /* the 64x64 tiles of current_cast and dequant_colwise */
#define Q_TILE_ROWS (Q_THREADS / Q_TILE)   /* 4: the rows a pass of 256 threads covers */
#define AMAX_COLS 1024          /* the columns of one group_amax block */
#define BLOCK_COLS 64           /* the columns of one block_colwise block */
#define SCAN_THREADS 1024       /* the block of block_scan_i64 (cuda_common.cuh) */


static inline bool is_current(moex_quant_recipe r) { return r == MOEX_QUANT_TENSOR || r == MOEX_QUANT_GROUP; }
static inline int block_of(moex_quant_recipe r) { return r == MOEX_QUANT_BLOCK ? 128 : r == MOEX_QUANT_MXFP8 ? 32 : 0; }

/* ---- device helpers ------------------------------------------------------------------ */

/* The amax of a block: NaN wins (BLOCK, moex_amax_combine) or NaN is skipped (MXFP8,
 * moex_mx_amax_combine); every lane gets it (the lanes' values are amaxes already). */
template <bool MX>
static __device__ __forceinline__ float warp_amax(float m) {
    for (int o = 16; o > 0; o >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, m, o);
        m = MX ? moex_mx_amax_combine(m, other) : moex_amax_combine(m, other);
    }
    return m;
}

template <bool MX>
static __device__ __forceinline__ float amax_step(float m, float v) {
    return MX ? moex_mx_amax_combine(m, v) : moex_amax_combine(m, v);
}

/* ---- the column-tile offsets of block scaling ---------------------------------------- */

/* cso[0] = 0, cso[g+1] = cso[g] + ceil(m_g / B), m_g = off[g+1] - off[g]: b_g of
 * docs/ops.md 9.4. One block of SCAN_THREADS scans the groups in chunks. */
static __global__ void __launch_bounds__(SCAN_THREADS)
colscale_off_kernel(const int64_t *off, int64_t G, int64_t B, int64_t *cso) {
    __shared__ int64_t sh[32];
    int64_t carry = 0;
    if (threadIdx.x == 0) cso[0] = 0;
    for (int64_t base = 0; base < G; base += SCAN_THREADS) {
        const int64_t g = base + threadIdx.x;
        const int64_t n = g < G ? cdiv(off[g + 1] - off[g], B) : 0;
        int64_t total;
        const int64_t incl = block_scan_i64(n, sh, &total) + carry;
        if (g < G) cso[g + 1] = incl;
        carry += total;
        __syncthreads();
    }
}

/* ---- quantize: current scaling (TENSOR, GROUP) ---------------------------------------- */

static __global__ void zero_u32_kernel(uint32_t *p, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = 0u;
}

/* amax_bits[g or 0] = max(..., |x| bits over the rows of group g). Block x: a 128-row tile
 * of one group (the handle's tiles[]); block y: AMAX_COLS columns. */
template <typename TX>
static __global__ void __launch_bounds__(Q_THREADS)
group_amax_kernel(const int64_t *off, const int32_t *tiles, int G, int per_group, const TX *x, int64_t K,
                  uint32_t *amax_bits) {
    __shared__ uint32_t red[32];
    const int64_t ntiles = tiles[G];
    for (int64_t t = blockIdx.x; t < ntiles; t += gridDim.x) {
        const int g = find_group_i32(tiles, G, t);
        const int64_t r0 = off[g] + (t - tiles[g]) * MOEX_CUDA_BM;
        const int64_t r1 = min(r0 + (int64_t)MOEX_CUDA_BM, off[g + 1]);
        for (int64_t k0 = (int64_t)blockIdx.y * AMAX_COLS; k0 < K; k0 += (int64_t)gridDim.y * AMAX_COLS) {
            const int64_t k1 = min(k0 + AMAX_COLS, K);
            uint32_t m = 0u;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t k = k0 + threadIdx.x; k < k1; k += Q_THREADS) m = max(m, abs_bits(to_f32(x[r * K + k])));
            m = block_max_u32(m, red);
            if (threadIdx.x == 0 && m != 0u) atomicMax(&amax_bits[per_group ? g : 0], m);
        }
    }
}

/* q = fp8(x * s_set) for the 64x64 tiles of x [S, K]; row_data [T, K] written directly,
 * col_data [K, T] through shared memory (either may be NULL). Block x: row tiles, y:
 * column tiles; the threads are 64 columns x 4 rows (reads), 64 rows x 4 columns (writes). */
template <typename TX>
static __global__ void __launch_bounds__(Q_THREADS)
current_cast_kernel(const int64_t *off, int G, int per_group, const float *mult, const TX *x, int64_t T,
                    int64_t K, moex_fp8_format f, uint8_t *row_data, uint8_t *col_data) {
    __shared__ float smult[Q_TILE];
    __shared__ uint8_t sq[Q_TILE][Q_TILE + 4];
    const int64_t S = off[G];
    const int64_t nrt = cdiv(S, Q_TILE), nct = cdiv(K, Q_TILE);
    const int tx = threadIdx.x % Q_TILE, ty = threadIdx.x / Q_TILE;
    for (int64_t rt = blockIdx.x; rt < nrt; rt += gridDim.x) {
        const int64_t r0 = rt * Q_TILE;
        const int nr = (int)min((int64_t)Q_TILE, S - r0);
        __syncthreads();   /* the previous tile is done with smult and sq */
        if (threadIdx.x < nr) smult[threadIdx.x] = mult[per_group ? find_group_i64(off, G, r0 + threadIdx.x) : 0];
        for (int64_t ct = blockIdx.y; ct < nct; ct += gridDim.y) {
            const int64_t k0 = ct * Q_TILE;
            const int nk = (int)min((int64_t)Q_TILE, K - k0);
            __syncthreads();   /* smult written; sq free */
            if (tx < nk)
                for (int i = ty; i < nr; i += Q_TILE_ROWS) {
                    const int64_t at = (r0 + i) * K + k0 + tx;
                    const uint8_t q = fp8_encode(to_f32(x[at]) * smult[i], f);
                    if (row_data) row_data[at] = q;
                    sq[i][tx] = q;
                }
            if (col_data) {   /* block-uniform */
                __syncthreads();
                if (tx < nr)
                    for (int j = ty; j < nk; j += Q_TILE_ROWS) col_data[(k0 + j) * T + r0 + tx] = sq[tx][j];
            }
        }
    }
}

/* ---- quantize: block scaling (BLOCK, MXFP8) -------------------------------------------- */

/* The multiplier s of a block with this amax (values: fp8(x * s)), its scale stored at
 * scales[at]: BLOCK s = moex_quant_scale, f32 1/s; MXFP8 s = 2^-E (ldexpf: exact, E in
 * [-127, 127]; the product x * 2^-E is then exact but for the f32 subnormal range, where
 * it is rounded as any f32 product), E8M0 byte E + 127. */
template <bool MX>
static __device__ __forceinline__ float block_multiplier(float amax, moex_fp8_format f, float eps,
                                                         moex_scale_rounding rounding, void *scales, int64_t at,
                                                         bool store) {
    if (MX) {
        const int E = moex_mx_exponent(amax, f);
        if (store) ((uint8_t *)scales)[at] = (uint8_t)(E + 127);
        return ldexpf(1.0f, -E);
    }
    const float s = moex_quant_scale(amax, eps, f.max, rounding);
    if (store) ((float *)scales)[at] = 1.0f / s;
    return s;
}

/* One warp per (row r < S, block j of B columns): amax in the warp, the scale at
 * scales[r, j] (f32 1/s, or the E8M0 byte), the FP8 values at data[r, jB + ...]. */
template <typename TX, int B, bool MX>
static __global__ void __launch_bounds__(Q_THREADS)
block_rowwise_kernel(const int64_t *off, int G, const TX *x, int64_t K, int64_t rb, moex_fp8_format f, float eps,
                     moex_scale_rounding rounding, uint8_t *data, void *scales) {
    constexpr int EPL = B / 32;   /* elements per lane */
    const int lane = threadIdx.x & 31;
    const int64_t npairs = off[G] * rb;
    for (int64_t p = (int64_t)blockIdx.x * Q_WARPS + (threadIdx.x >> 5); p < npairs; p += (int64_t)gridDim.x * Q_WARPS) {
        const int64_t r = p / rb, j = p - r * rb;
        const TX *xr = x + r * K;
        float v[EPL];
        float m = 0.0f;
#pragma unroll
        for (int i = 0; i < EPL; i++) {
            const int64_t k = j * B + i * 32 + lane;
            v[i] = k < K ? to_f32(xr[k]) : 0.0f;
            m = amax_step<MX>(m, v[i]);
        }
        m = warp_amax<MX>(m);
        const float s = block_multiplier<MX>(m, f, eps, rounding, scales, r * rb + j, lane == 0);
#pragma unroll
        for (int i = 0; i < EPL; i++) {
            const int64_t k = j * B + i * 32 + lane;
            if (k < K) data[r * K + k] = fp8_encode(v[i] * s, f);
        }
    }
}

/* Block x: column tile t < b_G (tile j = t - b_g of group g: rows off[g] + [jB, jB + B) cut
 * at off[g+1]); block y: BLOCK_COLS columns. The tile is read along the rows into shared
 * memory (rows past the cut read as 0, which no amax sees), then warp w takes columns w,
 * w + 8, ...: amax over the tile's rows (lane l has rows l + 32i), the scale at
 * scales[k, t], the values along the rows of data_t [K, T]. */
template <typename TX, int B, bool MX>
static __global__ void __launch_bounds__(Q_THREADS)
block_colwise_kernel(const int64_t *off, const int64_t *cso, int G, const TX *x, int64_t T, int64_t K,
                     int64_t col_tiles, moex_fp8_format f, float eps, moex_scale_rounding rounding, uint8_t *data_t,
                     void *scales) {
    constexpr int EPL = B / 32;
    __shared__ float sx[B][BLOCK_COLS + 1];
    const int tx = threadIdx.x % BLOCK_COLS, ty = threadIdx.x / BLOCK_COLS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t ntiles = cso[G], nct = cdiv(K, BLOCK_COLS);
    for (int64_t t = blockIdx.x; t < ntiles; t += gridDim.x) {
        const int g = find_group_i64(cso, G, t);
        const int64_t r0 = off[g] + (t - cso[g]) * B;
        const int nr = (int)min((int64_t)B, off[g + 1] - r0);
        for (int64_t ct = blockIdx.y; ct < nct; ct += gridDim.y) {
            const int64_t k0 = ct * BLOCK_COLS;
            const int nk = (int)min((int64_t)BLOCK_COLS, K - k0);
            __syncthreads();   /* the previous tile is done with sx */
            for (int i = ty; i < B; i += Q_THREADS / BLOCK_COLS)
                sx[i][tx] = (i < nr && tx < nk) ? to_f32(x[(r0 + i) * K + k0 + tx]) : 0.0f;
            __syncthreads();
            for (int c = warp; c < nk; c += Q_WARPS) {
                float v[EPL];
                float m = 0.0f;
#pragma unroll
                for (int i = 0; i < EPL; i++) {
                    v[i] = sx[i * 32 + lane][c];
                    m = amax_step<MX>(m, v[i]);
                }
                m = warp_amax<MX>(m);
                const int64_t k = k0 + c;
                const float s = block_multiplier<MX>(m, f, eps, rounding, scales, k * col_tiles + t, lane == 0);
#pragma unroll
                for (int i = 0; i < EPL; i++) {
                    const int row = i * 32 + lane;
                    if (row < nr) data_t[k * T + r0 + row] = fp8_encode(v[i] * s, f);
                }
            }
        }
    }
}

/* ---- dequantize ------------------------------------------------------------------------ */

/* Where the scale of (t, k) is (docs/ops.md 9.4), for both orientations:
 *   TENSOR  scales[0];  GROUP  scales[g(t)]
 *   BLOCK / MXFP8 rowwise     scales[t * rb + k / B]
 *   BLOCK / MXFP8 columnwise  scales[k * col_tiles + b_g + (t - off[g]) / B], g = g(t)  */
typedef struct dq_scales {
    const void *p;
    int recipe;                 /* moex_quant_recipe */
    int lb;                     /* log2 B (block scaling) */
    int64_t stride;             /* rb (rowwise) or col_tiles (columnwise) */
} dq_scales;

static __device__ __forceinline__ float dq_scale_at(const dq_scales &s, int64_t i) {
    return s.recipe == MOEX_QUANT_MXFP8 ? e8m0_value(((const uint8_t *)s.p)[i]) : ((const float *)s.p)[i];
}

/* y[r, k] = round(decode(q[r, k]) * scale) for r < S: one block per row, threads along k. */
template <typename TY>
static __global__ void __launch_bounds__(Q_THREADS)
dequant_rowwise_kernel(const int64_t *off, int G, dq_scales sc, const uint8_t *q, int64_t K, moex_fp8_format f,
                       TY *y) {
    const int64_t S = off[G];
    const bool blockwise = sc.recipe == MOEX_QUANT_BLOCK || sc.recipe == MOEX_QUANT_MXFP8;
    for (int64_t r = blockIdx.x; r < S; r += gridDim.x) {
        const float row_scale =
            blockwise ? 0.0f : dq_scale_at(sc, sc.recipe == MOEX_QUANT_GROUP ? find_group_i64(off, G, r) : 0);
        for (int64_t k = threadIdx.x; k < K; k += Q_THREADS) {
            const float s = blockwise ? dq_scale_at(sc, r * sc.stride + (k >> sc.lb)) : row_scale;
            y[r * K + k] = from_f32<TY>(moex_fp8_decode(q[r * K + k], f) * s);
        }
    }
}

/* y[r, k] = round(decode(q_t[k, r]) * scale) for r < S, through 64x64 tiles in shared
 * memory: read along r (threads: 64 rows x 4 columns), write along k (64 columns x 4 rows).
 * cso: b_g (block scaling only). */
template <typename TY>
static __global__ void __launch_bounds__(Q_THREADS)
dequant_colwise_kernel(const int64_t *off, const int64_t *cso, int G, dq_scales sc, const uint8_t *q_t, int64_t T,
                       int64_t K, moex_fp8_format f, TY *y) {
    __shared__ float sv[Q_TILE][Q_TILE + 1];
    __shared__ int64_t sidx[Q_TILE];   /* the row's part of its scale index */
    const int64_t S = off[G];
    const int64_t nrt = cdiv(S, Q_TILE), nct = cdiv(K, Q_TILE);
    const bool blockwise = sc.recipe == MOEX_QUANT_BLOCK || sc.recipe == MOEX_QUANT_MXFP8;
    const int tx = threadIdx.x % Q_TILE, ty = threadIdx.x / Q_TILE;
    for (int64_t rt = blockIdx.x; rt < nrt; rt += gridDim.x) {
        const int64_t r0 = rt * Q_TILE;
        const int nr = (int)min((int64_t)Q_TILE, S - r0);
        __syncthreads();   /* the previous tile is done with sidx and sv */
        if (threadIdx.x < nr) {
            const int64_t r = r0 + threadIdx.x;
            int64_t idx = 0;
            if (sc.recipe != MOEX_QUANT_TENSOR) {
                const int g = find_group_i64(off, G, r);
                idx = blockwise ? cso[g] + ((r - off[g]) >> sc.lb) : g;
            }
            sidx[threadIdx.x] = idx;
        }
        for (int64_t ct = blockIdx.y; ct < nct; ct += gridDim.y) {
            const int64_t k0 = ct * Q_TILE;
            const int nk = (int)min((int64_t)Q_TILE, K - k0);
            __syncthreads();   /* sidx written; sv free */
            if (tx < nr)
                for (int j = ty; j < nk; j += Q_TILE_ROWS) {
                    const int64_t k = k0 + j;
                    const float s = dq_scale_at(sc, (blockwise ? k * sc.stride : 0) + sidx[tx]);
                    sv[tx][j] = moex_fp8_decode(q_t[k * T + r0 + tx], f) * s;
                }
            __syncthreads();
            if (tx < nk)
                for (int i = ty; i < nr; i += Q_TILE_ROWS) y[(r0 + i) * K + k0 + tx] = from_f32<TY>(sv[i][tx]);
        }
    }
}

/* ---- workspaces -------------------------------------------------------------------------
 * One layout function gives the size (ws NULL) and the pointers:
 *   quantize TENSOR/GROUP: amax bits [n] and multipliers [n] (n = 1 or G);
 *   quantize BLOCK/MXFP8 with a columnwise copy, and dequantize BLOCK/MXFP8 from the
 *   columnwise copy: the column-tile offsets b_g [G + 1];
 *   quantize with dbias: the column sums' partials (moex_cuda_colsum_partial_bytes).      */

typedef struct quant_ws {
    uint32_t *amax_bits;
    float *mult;
    int64_t *cso;
    float *partial;
    size_t used;
} quant_ws;

static quant_ws quant_layout(moex_quant_recipe recipe, bool columnwise_tiles, int64_t G, size_t partial_bytes,
                             void *ws) {
    moex_carver c = {(char *)ws, 0};
    quant_ws l = {NULL, NULL, NULL, NULL, 0};
    if (is_current(recipe)) {
        const int64_t n = recipe == MOEX_QUANT_TENSOR ? 1 : G;
        l.amax_bits = (uint32_t *)moex_take(&c, moex_sz_bytes(n, 1, sizeof(uint32_t)));
        l.mult = (float *)moex_take(&c, moex_sz_bytes(n, 1, sizeof(float)));
    } else if (columnwise_tiles) {
        l.cso = (int64_t *)moex_take(&c, moex_sz_bytes(G + 1, 1, sizeof(int64_t)));
    }
    if (partial_bytes) l.partial = (float *)moex_take(&c, partial_bytes);
    l.used = c.used;
    return l;
}

static moex_status launch_colscale_off(moex_context *ctx, const moex_call *c, const moex_groups *g, int64_t B,
                                       int64_t *cso) {
    colscale_off_kernel<<<1, SCAN_THREADS, 0, (cudaStream_t)c->stream>>>(g->off, g->G, B, cso);
    CUDA_TRY_LAUNCH(ctx, c->op);
    return MOEX_OK;
}

/* ---- quantize ---------------------------------------------------------------------------- */

/* The dbias partials' bytes (0 without dbias). */
static size_t dbias_bytes(const moex_group_quantize_args *a, const moex_quant_dims *d) {
    return moex_present(&a->dbias) ? moex_cuda_colsum_partial_bytes(d->T, d->G, d->K) : 0;
}

size_t moex_cuda_quantize_ws(moex_context *ctx, const moex_group_quantize_args *a, const moex_quant_dims *d) {
    return quant_layout(a->params.recipe, moex_present(&a->columnwise.data), d->G, dbias_bytes(a, d), NULL).used;
}

template <typename TX>
static moex_status quantize_current(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                    const moex_group_quantize_args *a, int64_t K, const quant_ws &l) {
    cudaStream_t stream = (cudaStream_t)c->stream;
    const int G = (int)g->G;
    const int64_t T = g->T;
    const int per_group = a->params.recipe == MOEX_QUANT_GROUP;
    const int64_t n = per_group ? G : 1;
    const moex_fp8_format f = moex_fp8_format_of(a->params.fp8);
    const TX *x = (const TX *)a->x.data;
    uint8_t *row_data = moex_present(&a->rowwise.data) ? (uint8_t *)a->rowwise.data.data : NULL;
    uint8_t *col_data = moex_present(&a->columnwise.data) ? (uint8_t *)a->columnwise.data.data : NULL;
    /* by presence, not by pointer: with T == 0 the data is empty (maybe NULL), the scales are not */
    float *row_scales = moex_present(&a->rowwise.data) ? (float *)a->rowwise.scales.data : NULL;
    float *col_scales = moex_present(&a->columnwise.data) ? (float *)a->columnwise.scales.data : NULL;
    float *amax_out = moex_present(&a->amax) ? (float *)a->amax.data : NULL;
    const bool has_data = T > 0 && K > 0;   /* else every set is empty: amax 0 */

    zero_u32_kernel<<<quant_grid_x(cdiv(n, Q_THREADS)), Q_THREADS, 0, stream>>>(l.amax_bits, n);
    CUDA_TRY_LAUNCH(ctx, c->op);
    if (has_data) {
        const dim3 grid(quant_grid_x(moex_cuda_max_tiles(T, G)), quant_grid_y(cdiv(K, AMAX_COLS)));
        group_amax_kernel<TX><<<grid, Q_THREADS, 0, stream>>>(g->off, g->tiles, G, per_group, x, K, l.amax_bits);
        CUDA_TRY_LAUNCH(ctx, c->op);
    }
    current_scale_kernel<<<quant_grid_x(cdiv(n, Q_THREADS)), Q_THREADS, 0, stream>>>(
        l.amax_bits, n, a->params.amax_epsilon, f.max, a->params.rounding, l.mult, row_scales, col_scales, amax_out);
    CUDA_TRY_LAUNCH(ctx, c->op);
    if (has_data) {
        const dim3 grid(quant_grid_x(cdiv(T, Q_TILE)), quant_grid_y(cdiv(K, Q_TILE)));
        current_cast_kernel<TX><<<grid, Q_THREADS, 0, stream>>>(g->off, G, per_group, l.mult, x, T, K, f, row_data,
                                                                 col_data);
        CUDA_TRY_LAUNCH(ctx, c->op);
    }
    return MOEX_OK;
}

template <typename TX, int B, bool MX>
static moex_status quantize_blocks(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                   const moex_group_quantize_args *a, int64_t K, const quant_ws &l) {
    cudaStream_t stream = (cudaStream_t)c->stream;
    const int G = (int)g->G;
    const int64_t T = g->T;
    if (T == 0 || K == 0) return MOEX_OK;   /* no rows, or no columns: nothing to write */
    const moex_fp8_format f = moex_fp8_format_of(a->params.fp8);
    const float eps = a->params.amax_epsilon;
    const moex_scale_rounding rounding = a->params.rounding;
    const TX *x = (const TX *)a->x.data;
    if (moex_present(&a->rowwise.data)) {
        const int64_t rb = cdiv(K, B);
        block_rowwise_kernel<TX, B, MX><<<quant_grid_x(cdiv(T * rb, Q_WARPS)), Q_THREADS, 0, stream>>>(
            g->off, G, x, K, rb, f, eps, rounding, (uint8_t *)a->rowwise.data.data, a->rowwise.scales.data);
        CUDA_TRY_LAUNCH(ctx, c->op);
    }
    if (moex_present(&a->columnwise.data)) {
        const int64_t col_tiles = cdiv(T, B) + G;   /* the scales' columns; b_G <= col_tiles */
        MOEX_TRY(launch_colscale_off(ctx, c, g, B, l.cso));
        const dim3 grid(quant_grid_x(col_tiles), quant_grid_y(cdiv(K, BLOCK_COLS)));
        block_colwise_kernel<TX, B, MX><<<grid, Q_THREADS, 0, stream>>>(
            g->off, l.cso, G, x, T, K, col_tiles, f, eps, rounding, (uint8_t *)a->columnwise.data.data,
            a->columnwise.scales.data);
        CUDA_TRY_LAUNCH(ctx, c->op);
    }
    return MOEX_OK;
}

template <typename TX>
static moex_status quantize_run(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                const moex_group_quantize_args *a, const moex_quant_dims *d, const quant_ws &l) {
    switch (a->params.recipe) {
    case MOEX_QUANT_TENSOR:
    case MOEX_QUANT_GROUP: return quantize_current<TX>(ctx, c, g, a, d->K, l);
    case MOEX_QUANT_BLOCK: return quantize_blocks<TX, 128, false>(ctx, c, g, a, d->K, l);
    case MOEX_QUANT_MXFP8: return quantize_blocks<TX, 32, true>(ctx, c, g, a, d->K, l);
    }
    return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: unknown quantization recipe %d", c->op, (int)a->params.recipe);
}

moex_status moex_cuda_quantize(moex_context *ctx, const moex_call *c, const moex_groups *g,
                               const moex_group_quantize_args *a, const moex_quant_dims *d, void *ws) {
    if (g->G > INT_MAX)
        return moex_fail(ctx, MOEX_ERR_UNSUPPORTED, "%s: G = %lld groups exceed the CUDA kernels' limit", c->op,
                         (long long)g->G);
    const bool dbias = moex_present(&a->dbias);
    if (dbias && (moex_cuda_max_tiles(d->T, d->G) > 65535 || d->G > 65535))   /* before any launch */
        return moex_fail(ctx, MOEX_ERR_UNSUPPORTED, "%s: dbias over %lld rows in %lld groups exceeds the CUDA "
                         "column-sum grid (65535 row tiles of 128 and 65535 groups)", c->op, (long long)d->T,
                         (long long)d->G);
    const quant_ws l = quant_layout(a->params.recipe, moex_present(&a->columnwise.data), d->G, dbias_bytes(a, d), ws);
    moex_status st = d->dt == MOEX_DTYPE_F32    ? quantize_run<float>(ctx, c, g, a, d, l)
                     : d->dt == MOEX_DTYPE_BF16 ? quantize_run<bf16>(ctx, c, g, a, d, l)
                                                : quantize_run<f16>(ctx, c, g, a, d, l);
    if (st != MOEX_OK || !dbias) return st;
    return moex_cuda_group_colsum(ctx, c->op, g, a->x.data, d->dt, d->K, NULL, l.partial, (float *)a->dbias.data,
                                  (cudaStream_t)c->stream);
}

/* ---- dequantize -------------------------------------------------------------------------- */

static bool dequant_needs_tiles(const moex_group_dequantize_args *a) {
    return !is_current(a->params.recipe) && a->orientation == MOEX_QUANT_COLUMNWISE;
}

size_t moex_cuda_dequantize_ws(moex_context *ctx, const moex_group_dequantize_args *a, const moex_quant_dims *d) {
    return quant_layout(a->params.recipe, dequant_needs_tiles(a), d->G, 0, NULL).used;
}

template <typename TY>
static moex_status dequantize_run(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                  const moex_group_dequantize_args *a, const moex_quant_dims *d, void *ws) {
    cudaStream_t stream = (cudaStream_t)c->stream;
    const int G = (int)g->G;
    const int64_t T = g->T, K = d->K;
    if (T == 0 || K == 0) return MOEX_OK;
    const moex_fp8_format f = moex_fp8_format_of(a->params.fp8);
    const int64_t B = block_of(a->params.recipe);
    dq_scales sc;
    sc.p = a->src.scales.data;
    sc.recipe = (int)a->params.recipe;
    sc.lb = B == 128 ? 7 : 5;   /* used for block scaling only */
    const uint8_t *q = (const uint8_t *)a->src.data.data;
    TY *y = (TY *)a->y.data;
    if (a->orientation == MOEX_QUANT_ROWWISE) {
        sc.stride = B ? cdiv(K, B) : 0;
        dequant_rowwise_kernel<TY><<<quant_grid_x(T), Q_THREADS, 0, stream>>>(g->off, G, sc, q, K, f, y);
        CUDA_TRY_LAUNCH(ctx, c->op);
        return MOEX_OK;
    }
    const quant_ws l = quant_layout(a->params.recipe, dequant_needs_tiles(a), d->G, 0, ws);
    sc.stride = B ? cdiv(T, B) + G : 0;
    if (B) MOEX_TRY(launch_colscale_off(ctx, c, g, B, l.cso));
    const dim3 grid(quant_grid_x(cdiv(T, Q_TILE)), quant_grid_y(cdiv(K, Q_TILE)));
    dequant_colwise_kernel<TY><<<grid, Q_THREADS, 0, stream>>>(g->off, l.cso, G, sc, q, T, K, f, y);
    CUDA_TRY_LAUNCH(ctx, c->op);
    return MOEX_OK;
}

moex_status moex_cuda_dequantize(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                 const moex_group_dequantize_args *a, const moex_quant_dims *d, void *ws) {
    if (g->G > INT_MAX)
        return moex_fail(ctx, MOEX_ERR_UNSUPPORTED, "%s: G = %lld groups exceed the CUDA kernels' limit", c->op,
                         (long long)g->G);
    if (d->dt == MOEX_DTYPE_F32) return dequantize_run<float>(ctx, c, g, a, d, ws);
    if (d->dt == MOEX_DTYPE_BF16) return dequantize_run<bf16>(ctx, c, g, a, d, ws);
    return dequantize_run<f16>(ctx, c, g, a, d, ws);
}
