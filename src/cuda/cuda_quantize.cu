/*
 * cuda_quantize.cu - grouped FP8 quantization on the GPU (docs/ops.md section 9): the
 * quantize, dequantize and glu_quantize primitives of backend.h. The element math (the scale rule, the MX
 * exponent, the swizzled scale offsets) is src/core/quant_math.h, shared with the CPU, and
 * the cast is the conversion instruction (cuda_quant.cuh), which is docs/ops.md 9.1 exactly,
 * so both backends compute the same bits. Rows >= S = off[G] are never read or written;
 * split values are read on the device only (the prepared handle's off[] and tiles[]).
 *
 * quantize (and glu_quantize): every recipe runs over the handle's row tiles (128 rows of
 * one group, from its first row: tiles[]) by 128 columns, 256 threads per tile, each an 8x8
 * piece (tile_kernel): read once with 16-byte loads, both copies written from registers
 * (rowwise 8 bytes per row, columnwise 8 bytes per column: the transpose needs no shared
 * memory), and, with dbias, one column-sum partial per (tile, column).
 *   TENSOR, GROUP  zero_u32 (amax slots), tile_amax (max of |x| bit patterns per tile, one
 *                  atomicMax: unsigned and order-free, so deterministic), current_scale
 *                  (s per set), then tile_kernel<CURRENT> casts with s
 *   BLOCK          tile_kernel<BLOCK128>: a row's 1x128 block is the tile's width and a
 *                  column's 128x1 block its height (column tile t = the handle's tile t)
 *   MXFP8          tile_kernel<MX32>: 1x32 and 32x1 blocks inside the tile (four 32-row
 *                  column tiles per row tile, at b_g + ..., colscale_off first)
 *   dbias          moex_cuda_colsum_reduce (cuda_reduce.cu) over the partials
 * The kernels read through a source (x_source: x; glu_source: the scaled GLU's z computed
 * from h, for glu_quantize, so z leaves the GLU in FP8 without being stored). A block takes
 * TILE_COLS_PER_BLOCK column tiles in turn, the next one on its way (cp.async into shared
 * memory for 16-bit x, else an L2 prefetch) while it works on this one.
 * Swizzled MXFP8 scales (9.8): the scales vector is zeroed first, then the scales written
 * at moex_mx_swizzled_at; group g's matrix starts at tiles[g] (= q_g) tiles.
 * dequantize: y = round_dt(decode(q) * scale)
 *   dequant_rowwise  one block per row (grid-stride), threads along the columns
 *   dequant_colwise  one block per 64x64 tile, through shared memory (reads along the rows
 *                    of data [K, T], writes along the rows of y [T, K])
 * All grids are grid-stride loops (x capped at 2^20 blocks, y at 65535), so no limit of T,
 * K or G comes from them. No allocation, no synchronisation; everything on c->stream.
 */
#include <limits.h>
#include <string.h>

#include "cuda_quant.cuh"
#include "glu_math.h"
#include "cuda_ops.h"

#define Q_THREADS 256           /* every kernel but colscale_off */
#define Q_WARPS (Q_THREADS / 32)
#define TILE MOEX_CUDA_BM        /* 128: the quantize tiles are the handle's row tiles by 128 columns */
#define TILE_COLS_PER_BLOCK 8   /* the column tiles of one tile_kernel block, in turn */
#define Q_TILE 64               /* the 64x64 tiles of dequant_colwise */
#define Q_TILE_ROWS (Q_THREADS / Q_TILE)   /* 4: the rows a pass of 256 threads covers */
#define SCAN_THREADS 1024       /* the block of block_scan_i64 (cuda_common.cuh) */


static inline bool is_current(moex_quant_recipe r) { return r == MOEX_QUANT_TENSOR || r == MOEX_QUANT_GROUP; }
static inline int block_of(moex_quant_recipe r) { return r == MOEX_QUANT_BLOCK ? 128 : r == MOEX_QUANT_MXFP8 ? 32 : 0; }

/* ---- the column-tile offsets of plain MXFP8 columnwise scales ------------------------- */

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

/* ---- the tile: 128 rows of one group x 128 columns, 256 threads of 8x8 ---------------- *
 * (Grouped weights [G, N, K] are the same with G groups of N rows: their tiles start at each
 * expert's first row, their columnwise copy is [G, K, N], and BLOCK2D scales 128x128 blocks.)
 * Thread (i, j) holds rows 8i..8i+7 and columns 8j..8j+7 of the tile (i, j < 16):
 *   lane bits 0-1: j & 3, bits 2-3: i & 3, bit 4: (j >> 2) & 1; warp bit 0: j >> 3,
 *   warp bits 1-2: i >> 2,
 * so an MX 1x32 block (4 j's) and 32x1 block (4 i's) are in one warp (xor 1, 2 and 4, 8),
 * and the 1x128 and 128x1 blocks of BLOCK finish across warps in shared memory.           */

enum tile_mode { CURRENT, BLOCK128, MX32, BLOCK2D };

static __device__ __forceinline__ int tile_i() { return ((threadIdx.x >> 2) & 3) | ((threadIdx.x >> 6) << 2); }
static __device__ __forceinline__ int tile_j() {
    return (threadIdx.x & 3) | (((threadIdx.x >> 4) & 1) << 2) | (((threadIdx.x >> 5) & 1) << 3);
}

/* One row tile: group (or expert) g's tile t, rows [r0, r0 + nr). */
typedef struct tile_rows {
    int g;
    int64_t t;                  /* the tile's index (grouped: the handle's; weights: g * tpe + local) */
    int64_t r0;                 /* its first row */
    int nr;                     /* its rows (1..128) */
    int64_t g0;                 /* the group's first row */
    int64_t q, nq;              /* the group's first tile and its tiles */
} tile_rows;

/* Eight 16-bit elements packed in u as f32. */
template <typename TX>
static __device__ __forceinline__ void unpack8(uint4 u, float (&v)[8]) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int c = 0; c < 4; c++) {
        v[2 * c] = to_f32(bits_to<TX>((uint16_t)(w[c] & 0xFFFFu)));
        v[2 * c + 1] = to_f32(bits_to<TX>((uint16_t)(w[c] >> 16)));
    }
}

/* Eight 16- or 32-bit elements at p (16-byte aligned) as f32. */
template <typename TX>
static __device__ __forceinline__ void load_vec8(const TX *p, float (&v)[8]) {
    if (sizeof(TX) == 4) {
        const float4 a = __ldg((const float4 *)p), b = __ldg((const float4 *)p + 1);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
        unpack8<TX>(__ldg((const uint4 *)p), v);
    }
}

/* What the tile kernels quantize, read 8x8 at a time: load gives v[r][e] = the element
 * (row + r, col + e) for r < nr and col + e < K, else 0 (nr may be <= 0 or > 8); fetch
 * starts bringing in the piece that the next load asks for (into the block's staging
 * buffer `stage`, which only the calling thread's slots of are used, so no barrier).
 *   x_source    x [T, K] itself. vec (K % 8 == 0, x 16-byte aligned): 16-byte loads; with
 *               16-bit elements the next piece is copied into `stage` by cp.async while
 *               this one is worked on (fetch), otherwise prefetched into L2.
 *   glu_source  z = p glu(h) of the scaled GLU (K = F), rounded to h's dtype as
 *               moex_scaled_glu_forward stores it (glu_math.h, the formulas of the GLU
 *               kernels); h [T, 2F] is read, z never stored. vec: F % 8 == 0 and h
 *               16-byte aligned (the 8 columns are then contiguous in both halves). */
typedef uint4 tile_stage[8][Q_THREADS];   /* a thread's 8 rows of 16 bytes, in slots [r][thread] */

template <typename TX>
struct x_source {
    const TX *x;
    int64_t K;
    bool vec;
    static constexpr bool staged = sizeof(TX) == 2;
    __device__ __forceinline__ void fetch(tile_stage &stage, int64_t row, int nr, int64_t col) const {
#pragma unroll
        for (int r = 0; r < 8; r++) {
            const bool valid = r < nr && col < K;
            const TX *p = valid ? x + (row + r) * K + col : x;
            if (staged && vec) cp_async_16(&stage[r][threadIdx.x], p, valid);
            else if (valid) prefetch_l2(p);
        }
        if (staged && vec) cp_async_commit();
    }
    __device__ __forceinline__ void load(tile_stage &stage, int64_t row, int nr, int64_t col,
                                         float (&v)[8][8]) const {
        if (staged && vec) {
            cp_async_wait_all();
#pragma unroll
            for (int r = 0; r < 8; r++) unpack8<TX>(stage[r][threadIdx.x], v[r]);
            return;
        }
#pragma unroll
        for (int r = 0; r < 8; r++) {
            const TX *p = x + (row + r) * K + col;
            if (r < nr && col < K && vec) {
                load_vec8<TX>(p, v[r]);
            } else {
#pragma unroll
                for (int e = 0; e < 8; e++) v[r][e] = (r < nr && col + e < K) ? to_f32(p[e]) : 0.0f;
            }
        }
    }
};

template <typename TX>
struct glu_source {
    const TX *h;
    const float *probs;         /* [T] or NULL (p = 1) */
    moex_glu_consts c;
    int64_t K, L;               /* K = F; L: the GLU's half-segment (moex_glu_segment) */
    bool vec;
    static constexpr bool staged = false;
    __device__ __forceinline__ void load(tile_stage &, int64_t row, int nr, int64_t col, float (&v)[8][8]) const {
        const int64_t ca = col + (col / L) * L;   /* the a column of z column col */
#pragma unroll
        for (int r = 0; r < 8; r++) {
            const TX *hr = h + (row + r) * 2 * K;
            const float p = r < nr && probs ? probs[row + r] : 1.0f;
            if (r < nr && col < K && vec) {
                float va[8], vb[8];
                load_vec8<TX>(hr + ca, va);
                load_vec8<TX>(hr + ca + L, vb);
#pragma unroll
                for (int e = 0; e < 8; e++) v[r][e] = to_f32(from_f32<TX>(moex_glu_forward(c, va[e], vb[e], p)));
            } else {
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const int64_t j = col + e, cj = j + (j / L) * L;
                    v[r][e] = (r < nr && j < K)
                                  ? to_f32(from_f32<TX>(moex_glu_forward(c, to_f32(hr[cj]), to_f32(hr[cj + L]), p)))
                                  : 0.0f;
                }
            }
        }
    }
    __device__ __forceinline__ void fetch(tile_stage &, int64_t row, int nr, int64_t col) const {
        const int64_t ca = col + (col / L) * L;
#pragma unroll
        for (int r = 0; r < 8; r++)
            if (r < nr && col < K) {
                prefetch_l2(h + (row + r) * 2 * K + ca);
                prefetch_l2(h + (row + r) * 2 * K + ca + L);
            }
    }
};

/* The MX amax of v as its exponent field: 0 for 0, subnormals and NaN (NaN is skipped),
 * 255 for Inf; a block's max of these is the field of its amax. */
static __device__ __forceinline__ uint32_t mx_field(float v) {
    const uint32_t a = abs_bits(v);
    return a > 0x7F800000u ? 0u : a >> 23;
}

/* moex_mx_exponent of an amax from its exponent field b (equal for every amax: an amax with
 * b = 0 is 0 or subnormal, below 2^-126, so its E clamps to -127 as 0's does). */
static __device__ __forceinline__ int mx_exponent_of_field(uint32_t b, moex_fp8_format f) {
    if (b == 0u) return -127;
    if (b == 255u) return 127;
    const int E = (int)b - 127 - f.emax;
    return E < -127 ? -127 : E;
}

/* MX32's block amaxes of this thread's 8x8 piece v, as exponent fields (mx_field): of its 8
 * rows (COLS false; each row's block of 32 spans the 4 j's of lanes lane ^ 1, lane ^ 2) or of
 * its 8 columns (COLS true; the 4 i's of lanes lane ^ 4, lane ^ 8). Line e's field, the max
 * over the thread's 8 values and then over those lanes, is byte e & 3 of m[e >> 2]
 * (mx_line_exponent): the 8 lines travel as two words, 4 shuffles rather than 16. Every lane of
 * the warp calls it. */
template <bool COLS>
static __device__ __forceinline__ void mx_block_fields(const float (&v)[8][8], uint32_t (&m)[2]) {
    m[0] = m[1] = 0u;
#pragma unroll
    for (int e = 0; e < 8; e++) {
        uint32_t b = 0u;
#pragma unroll
        for (int o = 0; o < 8; o++) b = max(b, mx_field(COLS ? v[o][e] : v[e][o]));
        m[e >> 2] |= b << (8 * (e & 3));
    }
    const int l1 = COLS ? 4 : 1, l2 = COLS ? 8 : 2;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        m[h] = __vmaxu4(m[h], __shfl_xor_sync(0xffffffffu, m[h], l1));
        m[h] = __vmaxu4(m[h], __shfl_xor_sync(0xffffffffu, m[h], l2));
    }
}

/* Line e's MX exponent (moex_mx_exponent of its block's amax) from mx_block_fields' m. */
static __device__ __forceinline__ int mx_line_exponent(const uint32_t (&m)[2], int e, moex_fp8_format f) {
    return mx_exponent_of_field((m[e >> 2] >> (8 * (e & 3))) & 0xFFu, f);
}

/* The amax key (NaN wins) of the block's 128x128 tile, every thread's 8x8 piece v; all
 * threads get it (red: 32 words of shared scratch, block_max_u32). */
static __device__ __forceinline__ uint32_t tile_amax(const float (&v)[8][8], uint32_t *red) {
    uint32_t m = 0u;
#pragma unroll
    for (int r = 0; r < 8; r++)
#pragma unroll
        for (int c = 0; c < 8; c++) m = max(m, abs_bits(v[r][c]));
    return block_max_u32(m, red);
}

/* fp8(v[e] * s) for e < 8, packed little-end first. */
static __device__ __forceinline__ uint2 cast_8(const float (&v)[8], float s, moex_fp8_format f) {
    uint32_t w[2];
#pragma unroll
    for (int h = 0; h < 2; h++)
        w[h] = fp8x2_encode(v[4 * h] * s, v[4 * h + 1] * s, f) |
               (fp8x2_encode(v[4 * h + 2] * s, v[4 * h + 3] * s, f) << 16);
    return make_uint2(w[0], w[1]);
}

/* p[0..min(n, 8)) = the first bytes of b (none for n <= 0): one 8-byte store when whole and
 * aligned. (n is not clamped first: nvcc 13.0 mis-derived `n == 8` from the predicate of a
 * clamping min/max, so whole is tested as n >= 8.) */
static __device__ __forceinline__ void store_8(uint8_t *p, uint2 b, int n) {
    if (n >= 8 && ((uintptr_t)p & 7) == 0) {
        *(uint2 *)p = b;
        return;
    }
#pragma unroll
    for (int e = 0; e < 4; e++) {
        if (e < n) p[e] = (uint8_t)(b.x >> (8 * e));
        if (e + 4 < n) p[e + 4] = (uint8_t)(b.y >> (8 * e));
    }
}

/* Everything a tile kernel reads and writes; a copy is absent when its data is NULL. */
typedef struct tile_args {
    bool weights;               /* grouped weights [G, N, K] (N = T): off and tiles unused */
    const int64_t *off;
    const int32_t *tiles;       /* the handle's 128-row tiles: tiles[g] = q_g */
    const int64_t *cso;         /* MX32 plain columnwise scales: b_g of 32-row tiles */
    int G;
    int64_t T, K;               /* weights: T = N, the rows of one expert */
    int64_t rows;               /* the rows there are: T, or G N for weights */
    int64_t max_tiles;          /* a bound of the row tiles (the grid's x) */
    moex_fp8_format f;
    float eps;
    moex_scale_rounding rounding;
    bool swizzled;              /* MX32: scales at moex_mx_swizzled_at (docs/ops.md 9.8) */
    int64_t row_cols;           /* rowwise scale columns: ceil(K / B), or roundup of it to 4 when swizzled */
    int64_t col_cols;           /* columnwise scale columns: ceil(T / B) + G (weights: ceil(N / B));
                                 * swizzled: roundup(K, 128) */
    const float *mult;          /* CURRENT: s per set */
    int per_group;              /* CURRENT: one set per group (else one) */
    uint8_t *row_data, *col_data;
    void *row_scales, *col_scales;
    size_t row_scale_bytes, col_scale_bytes;   /* swizzled: the scale vectors' bytes (zeroed first) */
    float *amax_out;            /* current scaling's amax, or NULL */
    float *partial;             /* dbias partials [tiles, K], or NULL */
} tile_args;

/* Row tile t: grouped, the handle's tile t of group g = the last with tiles[g] <= t;
 * weights, tile t % tpe of expert t / tpe (tpe = ceil(N / 128)). */
static __device__ __forceinline__ int64_t tile_count(const tile_args &a) {
    return a.weights ? a.G * cdiv(a.T, TILE) : (int64_t)a.tiles[a.G];
}

static __device__ __forceinline__ tile_rows tile_at(const tile_args &a, int64_t t) {
    tile_rows w;
    w.t = t;
    if (a.weights) {
        w.nq = cdiv(a.T, TILE);
        w.g = (int)(t / w.nq);
        w.q = w.g * w.nq;
        w.g0 = w.g * a.T;
        w.r0 = w.g0 + (t - w.q) * TILE;
        w.nr = (int)min((int64_t)TILE, w.g0 + a.T - w.r0);
        return w;
    }
    w.g = find_group_i32(a.tiles, a.G, t);
    w.q = a.tiles[w.g], w.nq = a.tiles[w.g + 1] - w.q;
    w.g0 = a.off[w.g];
    w.r0 = w.g0 + (t - w.q) * TILE;
    w.nr = (int)min((int64_t)TILE, a.off[w.g + 1] - w.r0);
    return w;
}

/* Where the columnwise copy's element (row, k) is: [K, T] grouped, [G, K, N] weights. */
static __device__ __forceinline__ int64_t col_data_at(const tile_args &a, const tile_rows &w, int64_t row, int64_t k) {
    return a.weights ? (w.g * a.K + k) * a.T + (row - w.g0) : k * a.T + row;
}

/* The scale of row `row` (of group w.g), rowwise block kb. */
static __device__ __forceinline__ int64_t row_scale_at(const tile_args &a, const tile_rows &w, int64_t row,
                                                       int64_t kb) {
    if (!a.swizzled) return row * a.row_cols + kb;
    return w.q * TILE * a.row_cols + moex_mx_swizzled_at(row - w.g0, kb, a.row_cols);
}

/* The scale of column k, columnwise block jl of the tile (BLOCK128: 0; MX32: 0..3). */
template <int MODE>
static __device__ __forceinline__ int64_t col_scale_at(const tile_args &a, const tile_rows &w, int64_t k, int jl) {
    if (MODE == BLOCK128) return k * a.col_cols + w.t;
    const int64_t j = (w.t - w.q) * 4 + jl;   /* the group's 32-row tile */
    if (a.swizzled) return w.q * 4 * a.col_cols + moex_mx_swizzled_at(k, j, 4 * w.nq);
    return a.weights ? (w.g * a.K + k) * a.col_cols + j : k * a.col_cols + a.cso[w.g] + j;
}

/* Quantize one row tile of x by 128 columns per block (see the top of the file). */
template <typename SRC, int MODE>
static __global__ void __launch_bounds__(Q_THREADS, 2)
tile_kernel(tile_args a, SRC src) {
    __shared__ uint32_t red_row[2 * TILE], red_col[4 * TILE];   /* BLOCK128, BLOCK2D: amax partials */
    __shared__ float mult[2][TILE];                             /* BLOCK128: the rows' and columns' s */
    __shared__ float csum[TILE / 8][TILE];                      /* dbias */
    __shared__ __align__(16) unsigned char stage_bytes[SRC::staged ? sizeof(tile_stage) : 16];
    tile_stage &stage = *reinterpret_cast<tile_stage *>(stage_bytes);
    const int i = tile_i(), j = tile_j(), lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t ntiles = tile_count(a), nct = cdiv(a.K, TILE);
    for (int64_t t = blockIdx.x; t < ntiles; t += gridDim.x) {
        const tile_rows w = tile_at(a, t);
        const int64_t row = w.r0 + 8 * i;
        const int nr = w.nr - 8 * i;   /* this thread's valid rows: min(nr, 8) (none when <= 0) */
        for (int64_t ct = blockIdx.y; ct < nct; ct += gridDim.y) {
            const int64_t k0 = ct * TILE, col = k0 + 8 * j;
            const int nc = (int)min((int64_t)8, a.K - col);   /* valid columns (none when <= 0) */
            float v[8][8];
            if (SRC::staged && ct == blockIdx.y) src.fetch(stage, row, nr, col);   /* the first piece */
            src.load(stage, row, nr, col, v);
            if (ct + gridDim.y < nct) src.fetch(stage, row, nr, col + (int64_t)gridDim.y * TILE);   /* the next */
            float rs[8], cs[8];   /* the rows' and the columns' multipliers (but MX32's) */
            if (MODE == CURRENT) {
                const float s = a.mult[a.per_group ? w.g : 0];
#pragma unroll
                for (int e = 0; e < 8; e++) rs[e] = cs[e] = s;
            } else if (MODE == BLOCK2D) {   /* one scale for the tile: [g, i, j] rowwise, [g, j, i] columnwise */
                const uint32_t m = tile_amax(v, red_row);
                const float s = moex_quant_scale(__uint_as_float(m), a.eps, a.f.max, a.rounding);
                if (threadIdx.x == 0) {
                    const int64_t bi = w.t - w.q;
                    if (a.row_data) ((float *)a.row_scales)[(w.g * w.nq + bi) * nct + ct] = 1.0f / s;
                    if (a.col_data) ((float *)a.col_scales)[(w.g * nct + ct) * w.nq + bi] = 1.0f / s;
                }
#pragma unroll
                for (int e = 0; e < 8; e++) rs[e] = cs[e] = s;
            } else if (MODE == BLOCK128) {
                /* the tile's 128 row and 128 column amaxes: max in the thread, the warp (rows:
                 * lanes 1, 2, 16; columns: lanes 4, 8), then across warps in shared memory, where
                 * thread u < 128 makes row u's scale and thread 128 + u column u's */
                uint32_t ru[8], cu[8];
#pragma unroll
                for (int e = 0; e < 8; e++) ru[e] = cu[e] = 0u;
#pragma unroll
                for (int r = 0; r < 8; r++)
#pragma unroll
                    for (int c = 0; c < 8; c++) {
                        const uint32_t u = abs_bits(v[r][c]);
                        ru[r] = max(ru[r], u);
                        cu[c] = max(cu[c], u);
                    }
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    ru[e] = max(ru[e], __shfl_xor_sync(0xffffffffu, ru[e], 1));
                    ru[e] = max(ru[e], __shfl_xor_sync(0xffffffffu, ru[e], 2));
                    ru[e] = max(ru[e], __shfl_xor_sync(0xffffffffu, ru[e], 16));
                    cu[e] = max(cu[e], __shfl_xor_sync(0xffffffffu, cu[e], 4));
                    cu[e] = max(cu[e], __shfl_xor_sync(0xffffffffu, cu[e], 8));
                }
                __syncthreads();   /* red_* and mult of the previous tile are read */
                if ((lane & 0x13) == 0)
#pragma unroll
                    for (int e = 0; e < 8; e++) red_row[(warp & 1) * TILE + 8 * i + e] = ru[e];
                if ((lane & 0x0C) == 0)
#pragma unroll
                    for (int e = 0; e < 8; e++) red_col[(warp >> 1) * TILE + 8 * j + e] = cu[e];
                __syncthreads();
                const int u = threadIdx.x & (TILE - 1);
                if (threadIdx.x < TILE) {   /* row u of the tile, block k0 / 128 */
                    const float sc = moex_quant_scale(__uint_as_float(max(red_row[u], red_row[TILE + u])), a.eps,
                                                      a.f.max, a.rounding);
                    mult[0][u] = sc;
                    if (a.row_data && u < w.nr)
                        ((float *)a.row_scales)[row_scale_at(a, w, w.r0 + u, k0 >> 7)] = 1.0f / sc;
                } else {                    /* column k0 + u, this tile */
                    const uint32_t m =
                        max(max(red_col[u], red_col[TILE + u]), max(red_col[2 * TILE + u], red_col[3 * TILE + u]));
                    const float sc = moex_quant_scale(__uint_as_float(m), a.eps, a.f.max, a.rounding);
                    mult[1][u] = sc;
                    if (a.col_data && k0 + u < a.K)
                        ((float *)a.col_scales)[col_scale_at<MODE>(a, w, k0 + u, 0)] = 1.0f / sc;
                }
                __syncthreads();
#pragma unroll
                for (int e = 0; e < 8; e++) rs[e] = mult[0][8 * i + e], cs[e] = mult[1][8 * j + e];
            } else {   /* MX32: 1x32 and 32x1 blocks, each in one warp; the rows done before the columns.
                        * A block's exponent needs only the exponent field of its amax
                        * (mx_block_fields). The two halves differ in their stores (a column
                        * is first gathered from the piece), so they stay written out. */
                const int64_t kb = (k0 >> 5) + (j >> 2);
                if (a.row_data) {
                    uint32_t m[2];
                    mx_block_fields<false>(v, m);
#pragma unroll
                    for (int r = 0; r < 8; r++) {
                        const int E = mx_line_exponent(m, r, a.f);
                        if ((lane & 3) == 0 && r < nr && (kb << 5) < a.K)
                            ((uint8_t *)a.row_scales)[row_scale_at(a, w, row + r, kb)] = (uint8_t)(E + 127);
                        if (r < nr) store_8(a.row_data + (row + r) * a.K + col, cast_8(v[r], moex_pow2f(-E), a.f), nc);
                    }
                }
                if (a.col_data) {
                    uint32_t m[2];
                    mx_block_fields<true>(v, m);
#pragma unroll
                    for (int c = 0; c < 8; c++) {
                        const int E = mx_line_exponent(m, c, a.f);
                        if ((lane & 0x0C) == 0 && c < nc && 32 * (i >> 2) < w.nr)
                            ((uint8_t *)a.col_scales)[col_scale_at<MODE>(a, w, col + c, i >> 2)] = (uint8_t)(E + 127);
                        float vc[8];
#pragma unroll
                        for (int r = 0; r < 8; r++) vc[r] = v[r][c];
                        if (c < nc)
                            store_8(a.col_data + col_data_at(a, w, row, col + c), cast_8(vc, moex_pow2f(-E), a.f), nr);
                    }
                }
            }
            if (MODE != MX32) {
                if (a.row_data)
#pragma unroll
                    for (int r = 0; r < 8; r++)
                        if (r < nr) store_8(a.row_data + (row + r) * a.K + col, cast_8(v[r], rs[r], a.f), nc);
                if (a.col_data)
#pragma unroll
                    for (int c = 0; c < 8; c++) {
                        float vc[8];
#pragma unroll
                        for (int r = 0; r < 8; r++) vc[r] = v[r][c];
                        if (c < nc) store_8(a.col_data + col_data_at(a, w, row, col + c), cast_8(vc, cs[c], a.f), nr);
                    }
            }
            if (a.partial) {   /* block-uniform: column sums, 8 rows in order, then the 16 pieces in order */
#pragma unroll
                for (int c = 0; c < 8; c++) {
                    float sum = 0.0f;
#pragma unroll
                    for (int r = 0; r < 8; r++) sum += v[r][c];
                    csum[i][8 * j + c] = sum;
                }
                __syncthreads();
                if (threadIdx.x < TILE && k0 + threadIdx.x < a.K) {
                    float sum = 0.0f;
                    for (int p = 0; p < TILE / 8; p++) sum += csum[p][threadIdx.x];
                    a.partial[t * a.K + k0 + threadIdx.x] = sum;
                }
                __syncthreads();
            }
        }
    }
}

/* ---- quantize: current scaling (TENSOR, GROUP) ---------------------------------------- */

static __global__ void zero_u32_kernel(uint32_t *p, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = 0u;
}

/* amax_bits[g or 0] = max(..., |x| bits over the tile), per tile of tile_kernel's shape. */
template <typename SRC>
static __global__ void __launch_bounds__(Q_THREADS)
tile_amax_kernel(tile_args a, SRC src, uint32_t *amax) {
    __shared__ uint32_t red[32];
    __shared__ __align__(16) unsigned char stage_bytes[SRC::staged ? sizeof(tile_stage) : 16];
    tile_stage &stage = *reinterpret_cast<tile_stage *>(stage_bytes);
    const int i = tile_i(), j = tile_j();
    const int64_t ntiles = tile_count(a), nct = cdiv(a.K, TILE);
    for (int64_t t = blockIdx.x; t < ntiles; t += gridDim.x) {
        const tile_rows w = tile_at(a, t);
        const int64_t row = w.r0 + 8 * i;
        const int nr = w.nr - 8 * i;
        for (int64_t ct = blockIdx.y; ct < nct; ct += gridDim.y) {
            const int64_t col = ct * TILE + 8 * j;
            float v[8][8];
            if (SRC::staged && ct == blockIdx.y) src.fetch(stage, row, nr, col);
            src.load(stage, row, nr, col, v);
            if (ct + gridDim.y < nct) src.fetch(stage, row, nr, col + (int64_t)gridDim.y * TILE);
            const uint32_t m = tile_amax(v, red);
            if (threadIdx.x == 0 && m != 0u) atomicMax(&amax[a.per_group ? w.g : 0], m);
        }
    }
}

/* ---- workspaces -------------------------------------------------------------------------
 * One layout function gives the size (ws NULL) and the pointers:
 *   quantize TENSOR/GROUP: amax bits [n] and multipliers [n] (n = 1 or G);
 *   plain MXFP8 with a columnwise copy (quantize, and dequantize from it): the 32-row
 *   column-tile offsets b_g [G + 1];
 *   quantize with dbias: the column sums' partials [tiles, K] (moex_cuda_colsum_partial_bytes). */

typedef struct quant_ws {
    uint32_t *amax_bits;
    float *mult;
    int64_t *cso;
    float *partial;
    size_t used;
} quant_ws;

static bool needs_cso(const moex_quant_params *p, bool columnwise) {
    return columnwise && p->recipe == MOEX_QUANT_MXFP8 && p->scale_layout == MOEX_SCALES_PLAIN;
}

static quant_ws quant_layout(const moex_quant_params *p, bool columnwise, int64_t G, size_t partial_bytes, void *ws) {
    moex_carver c = {(char *)ws, 0};
    quant_ws l = {NULL, NULL, NULL, NULL, 0};
    if (is_current(p->recipe)) {
        const int64_t n = p->recipe == MOEX_QUANT_TENSOR ? 1 : G;
        l.amax_bits = (uint32_t *)moex_take(&c, moex_sz_bytes(n, 1, sizeof(uint32_t)));
        l.mult = (float *)moex_take(&c, moex_sz_bytes(n, 1, sizeof(float)));
    } else if (needs_cso(p, columnwise)) {
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
    return quant_layout(&a->params, moex_present(&a->columnwise.data), d->G, dbias_bytes(a, d), NULL).used;
}

/* The tile kernels' arguments common to grouped rows and weights: the recipe's constants and
 * the copies, by presence (with no rows the data may be NULL; the scales of current scaling
 * are still written). */
static tile_args tile_args_common(const moex_quant_params &p, const moex_quant_tensor &row,
                                  const moex_quant_tensor &col, const moex_tensor &amax, const quant_ws &l) {
    tile_args t;
    memset(&t, 0, sizeof t);
    t.f = moex_fp8_format_of(p.fp8);
    t.eps = p.amax_epsilon, t.rounding = p.rounding;
    t.swizzled = p.scale_layout == MOEX_SCALES_MX_SWIZZLED;
    t.mult = l.mult, t.per_group = p.recipe == MOEX_QUANT_GROUP;
    if (moex_present(&row.data)) t.row_data = (uint8_t *)row.data.data, t.row_scales = row.scales.data;
    if (moex_present(&col.data)) t.col_data = (uint8_t *)col.data.data, t.col_scales = col.scales.data;
    if (t.swizzled) {   /* E8M0: a byte each */
        t.row_scale_bytes = moex_present(&row.data) ? (size_t)moex_numel(&row.scales) : 0;
        t.col_scale_bytes = moex_present(&col.data) ? (size_t)moex_numel(&col.scales) : 0;
    }
    t.amax_out = moex_present(&amax) ? (float *)amax.data : NULL;
    t.cso = l.cso, t.partial = l.partial;
    return t;
}

/* Scale columns of a row of B-blocks over n elements: ceil(n / B), rounded up to 4 when swizzled. */
static int64_t scale_cols(int64_t n, int64_t B, bool swizzled) {
    return swizzled ? 4 * cdiv(cdiv(n, B), 4) : cdiv(n, B);
}

static tile_args tile_args_grouped(const moex_groups *g, const moex_group_quantize_args *a, const moex_quant_dims *d,
                                   const quant_ws &l) {
    tile_args t = tile_args_common(a->params, a->rowwise, a->columnwise, a->amax, l);
    const int64_t B = block_of(a->params.recipe);
    t.off = g->off, t.tiles = g->tiles, t.G = (int)g->G, t.T = g->T, t.K = d->K;
    t.rows = g->T, t.max_tiles = moex_cuda_max_tiles(g->T, g->G);
    t.row_cols = B ? scale_cols(d->K, B, t.swizzled) : 0;
    t.col_cols = B ? (t.swizzled ? TILE * cdiv(d->K, TILE) : cdiv(g->T, B) + g->G) : 0;
    return t;
}

static tile_args tile_args_weights(const moex_weight_quantize_args *a, const moex_quant_dims *d, const quant_ws &l) {
    tile_args t = tile_args_common(a->params, a->rowwise, a->columnwise, a->amax, l);
    const int64_t N = d->T, B = block_of(a->params.recipe);
    t.weights = true;
    t.G = (int)d->G, t.T = N, t.K = d->K;
    t.rows = d->G * N, t.max_tiles = d->G * cdiv(N, TILE);
    t.row_cols = a->params.recipe == MOEX_QUANT_MXFP8 ? scale_cols(d->K, B, t.swizzled) : 0;
    t.col_cols = a->params.recipe != MOEX_QUANT_MXFP8 ? 0 : t.swizzled ? TILE * cdiv(d->K, TILE) : cdiv(N, B);
    return t;
}

/* Row tiles by column tiles; a block takes TILE_COLS_PER_BLOCK column tiles in turn. */
static dim3 tile_grid(const tile_args &t) {
    return dim3(quant_grid_x(t.max_tiles), quant_grid_y(cdiv(t.K, TILE * TILE_COLS_PER_BLOCK)));
}

template <typename SRC>
static moex_status quantize_current(moex_context *ctx, const moex_call *c, const tile_args &t, const quant_ws &l,
                                    const SRC &src) {
    cudaStream_t stream = (cudaStream_t)c->stream;
    const int64_t n = t.per_group ? t.G : 1;
    const bool has_data = t.rows > 0 && t.K > 0;   /* else every set is empty: amax 0 */
    if (n == 0) return MOEX_OK;   /* no groups: no sets, nothing to write */
    zero_u32_kernel<<<quant_grid_x(cdiv(n, Q_THREADS)), Q_THREADS, 0, stream>>>(l.amax_bits, n);
    CUDA_TRY_LAUNCH(ctx, c->op);
    if (has_data) {
        tile_amax_kernel<SRC><<<tile_grid(t), Q_THREADS, 0, stream>>>(t, src, l.amax_bits);
        CUDA_TRY_LAUNCH(ctx, c->op);
    }
    current_scale_kernel<<<quant_grid_x(cdiv(n, Q_THREADS)), Q_THREADS, 0, stream>>>(
        l.amax_bits, n, t.eps, t.f.max, t.rounding, l.mult, (float *)t.row_scales, (float *)t.col_scales, t.amax_out);
    CUDA_TRY_LAUNCH(ctx, c->op);
    if (has_data) {
        tile_kernel<SRC, CURRENT><<<tile_grid(t), Q_THREADS, 0, stream>>>(t, src);
        CUDA_TRY_LAUNCH(ctx, c->op);
    }
    return MOEX_OK;
}

template <typename SRC, int MODE>
static moex_status quantize_blocks(moex_context *ctx, const moex_call *c, const moex_groups *g, const tile_args &t,
                                   const SRC &src) {
    cudaStream_t stream = (cudaStream_t)c->stream;
    if (t.swizzled) {   /* every byte of the vectors: padding 0 (docs/ops.md 9.8) */
        if (t.row_scale_bytes) CUDA_TRY(ctx, c->op, cudaMemsetAsync(t.row_scales, 0, t.row_scale_bytes, stream));
        if (t.col_scale_bytes) CUDA_TRY(ctx, c->op, cudaMemsetAsync(t.col_scales, 0, t.col_scale_bytes, stream));
    }
    if (t.rows == 0 || t.K == 0) return MOEX_OK;   /* no rows, or no columns: nothing else to write */
    if (t.cso) MOEX_TRY(launch_colscale_off(ctx, c, g, 32, (int64_t *)t.cso));
    tile_kernel<SRC, MODE><<<tile_grid(t), Q_THREADS, 0, stream>>>(t, src);
    CUDA_TRY_LAUNCH(ctx, c->op);
    return MOEX_OK;
}

/* Every launch of one quantize, reading through src (g: the grouped rows' handle; NULL for
 * weights, whose BLOCK is 128x128). */
template <typename SRC>
static moex_status quantize_run(moex_context *ctx, const moex_call *c, const moex_groups *g, moex_quant_recipe recipe,
                                const tile_args &t, const quant_ws &l, const SRC &src) {
    switch (recipe) {
    case MOEX_QUANT_TENSOR:
    case MOEX_QUANT_GROUP: return quantize_current<SRC>(ctx, c, t, l, src);
    case MOEX_QUANT_BLOCK:
        return t.weights ? quantize_blocks<SRC, BLOCK2D>(ctx, c, g, t, src)
                         : quantize_blocks<SRC, BLOCK128>(ctx, c, g, t, src);
    case MOEX_QUANT_MXFP8: return quantize_blocks<SRC, MX32>(ctx, c, g, t, src);
    }
    return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: unknown quantization recipe %d", c->op, (int)recipe);
}

static moex_status check_groups(moex_context *ctx, const moex_call *c, int64_t G) {
    if (G > INT_MAX)
        return moex_fail(ctx, MOEX_ERR_UNSUPPORTED, "%s: G = %lld groups exceed the CUDA kernels' limit", c->op,
                         (long long)G);
    return MOEX_OK;
}

template <typename TX>
static x_source<TX> x_source_of(const void *x, int64_t K) {
    x_source<TX> src;
    src.x = (const TX *)x, src.K = K;
    src.vec = K % 8 == 0 && ((uintptr_t)x & 15) == 0;
    return src;
}

/* quantize_run of x in its dtype. */
static moex_status quantize_x(moex_context *ctx, const moex_call *c, const moex_groups *g, moex_quant_recipe recipe,
                              moex_dtype dt, const void *x, const tile_args &t, const quant_ws &l) {
    if (dt == MOEX_DTYPE_F32) return quantize_run(ctx, c, g, recipe, t, l, x_source_of<float>(x, t.K));
    if (dt == MOEX_DTYPE_BF16) return quantize_run(ctx, c, g, recipe, t, l, x_source_of<bf16>(x, t.K));
    return quantize_run(ctx, c, g, recipe, t, l, x_source_of<f16>(x, t.K));
}

moex_status moex_cuda_quantize(moex_context *ctx, const moex_call *c, const moex_groups *g,
                               const moex_group_quantize_args *a, const moex_quant_dims *d, void *ws) {
    MOEX_TRY(check_groups(ctx, c, g->G));
    MOEX_TRY(moex_cuda_sched_ready(ctx, c->op, g));
    const quant_ws l = quant_layout(&a->params, moex_present(&a->columnwise.data), d->G, dbias_bytes(a, d), ws);
    const tile_args t = tile_args_grouped(g, a, d, l);
    MOEX_TRY(quantize_x(ctx, c, g, a->params.recipe, d->dt, a->x.data, t, l));
    if (!moex_present(&a->dbias)) return MOEX_OK;
    /* the partials of every tile were written unless there are no rows or columns */
    return moex_cuda_colsum_reduce(ctx, c->op, g->tiles, g->G, l.partial, d->K, (float *)a->dbias.data,
                                   (cudaStream_t)c->stream);
}

/* ---- grouped weights ------------------------------------------------------------------------ */

size_t moex_cuda_weight_quantize_ws(moex_context *ctx, const moex_weight_quantize_args *a, const moex_quant_dims *d) {
    return quant_layout(&a->params, false, d->G, 0, NULL).used;   /* no b_g: the experts' tiles are regular */
}

moex_status moex_cuda_weight_quantize(moex_context *ctx, const moex_call *c, const moex_weight_quantize_args *a,
                                      const moex_quant_dims *d, void *ws) {
    MOEX_TRY(check_groups(ctx, c, d->G));
    if (a->params.recipe == MOEX_QUANT_TENSOR)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: TENSOR is not a weight recipe", c->op);
    const quant_ws l = quant_layout(&a->params, false, d->G, 0, ws);
    return quantize_x(ctx, c, NULL, a->params.recipe, d->dt, a->w.data, tile_args_weights(a, d, l), l);
}

/* ---- the scaled GLU's quantized output ------------------------------------------------------ */

template <typename TX>
static moex_status quantize_glu(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                const moex_scaled_glu_args *glu, moex_quant_recipe recipe, const tile_args &t,
                                const quant_ws &l) {
    glu_source<TX> src;
    src.h = (const TX *)glu->h.data;
    src.probs = moex_present(&glu->probs) ? (const float *)glu->probs.data : NULL;
    src.c = moex_glu_consts_of(&glu->glu);
    src.K = t.K, src.L = moex_glu_segment(glu->glu.layout, t.K);
    src.vec = t.K % 8 == 0 && ((uintptr_t)glu->h.data & 15) == 0;
    return quantize_run(ctx, c, g, recipe, t, l, src);
}

moex_status moex_cuda_glu_quantize(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                   const moex_scaled_glu_args *glu, const moex_group_quantize_args *q,
                                   const moex_quant_dims *d, void *ws) {
    MOEX_TRY(check_groups(ctx, c, g->G));
    MOEX_TRY(moex_cuda_sched_ready(ctx, c->op, g));
    const quant_ws l = quant_layout(&q->params, moex_present(&q->columnwise.data), d->G, 0, ws);
    const tile_args t = tile_args_grouped(g, q, d, l);
    const moex_quant_recipe r = q->params.recipe;
    return d->dt == MOEX_DTYPE_F32    ? quantize_glu<float>(ctx, c, g, glu, r, t, l)
           : d->dt == MOEX_DTYPE_BF16 ? quantize_glu<bf16>(ctx, c, g, glu, r, t, l)
                                      : quantize_glu<f16>(ctx, c, g, glu, r, t, l);
}

/* ---- dequantize kernels ------------------------------------------------------------------ */

/* Where the scale of (t, k) is, t a row of group g (docs/ops.md 9.4 and 9.8):
 *   TENSOR  0;  GROUP  g
 *   BLOCK / MXFP8 rowwise      t * stride + k / B;  swizzled: q_g * 128 * stride + swz(t - off[g], k / 32)
 *   BLOCK / MXFP8 columnwise   k * stride + b_g + (t - off[g]) / B (b_g: tiles[g] for BLOCK, cso[g]
 *                              for MXFP8);  swizzled: q_g * 4 * stride + swz(k, (t - off[g]) / 32)
 * with q_g = tiles[g] and stride the scale columns (swizzled: the rowwise cols4, the
 * columnwise roundup(K, 128)). */
typedef struct dq_scales {
    const void *p;
    int recipe;                 /* moex_quant_recipe */
    bool columnwise, swizzled;
    int lb;                     /* log2 B (block scaling) */
    int64_t stride;
    const int64_t *off, *cso;
    const int32_t *tiles;
} dq_scales;

static __device__ __forceinline__ float dq_scale(const dq_scales &s, int64_t t, int g, int64_t k) {
    if (s.recipe == MOEX_QUANT_TENSOR) return ((const float *)s.p)[0];
    if (s.recipe == MOEX_QUANT_GROUP) return ((const float *)s.p)[g];
    const int64_t local = t - s.off[g];
    int64_t i;
    if (s.swizzled && !s.columnwise)
        i = (int64_t)s.tiles[g] * TILE * s.stride + moex_mx_swizzled_at(local, k >> 5, s.stride);
    else if (s.swizzled)
        i = (int64_t)s.tiles[g] * 4 * s.stride + moex_mx_swizzled_at(k, local >> 5, 4 * (s.tiles[g + 1] - s.tiles[g]));
    else if (!s.columnwise)
        i = t * s.stride + (k >> s.lb);
    else
        i = k * s.stride + (s.recipe == MOEX_QUANT_BLOCK ? (int64_t)s.tiles[g] : s.cso[g]) + (local >> s.lb);
    return s.recipe == MOEX_QUANT_MXFP8 ? moex_e8m0_value(((const uint8_t *)s.p)[i]) : ((const float *)s.p)[i];
}

/* y[r, k] = round(decode(q[r, k]) * scale) for r < S: one block per row, threads along k. */
template <typename TY>
static __global__ void __launch_bounds__(Q_THREADS)
dequant_rowwise_kernel(int G, dq_scales sc, const uint8_t *q, int64_t K, moex_fp8_format f, TY *y) {
    const int64_t S = sc.off[G];
    for (int64_t r = blockIdx.x; r < S; r += gridDim.x) {
        const int g = sc.recipe == MOEX_QUANT_TENSOR ? 0 : find_group_i64(sc.off, G, r);
        for (int64_t k = threadIdx.x; k < K; k += Q_THREADS)
            y[r * K + k] = from_f32<TY>(moex_fp8_decode(q[r * K + k], f) * dq_scale(sc, r, g, k));
    }
}

/* y[r, k] = round(decode(q_t[k, r]) * scale) for r < S, through 64x64 tiles in shared
 * memory: read along r (threads: 64 rows x 4 columns), write along k (64 columns x 4 rows). */
template <typename TY>
static __global__ void __launch_bounds__(Q_THREADS)
dequant_colwise_kernel(int G, dq_scales sc, const uint8_t *q_t, int64_t T, int64_t K, moex_fp8_format f, TY *y) {
    __shared__ float sv[Q_TILE][Q_TILE + 1];
    __shared__ int sg[Q_TILE];   /* the rows' groups */
    const int64_t S = sc.off[G];
    const int64_t nrt = cdiv(S, Q_TILE), nct = cdiv(K, Q_TILE);
    const int tx = threadIdx.x % Q_TILE, ty = threadIdx.x / Q_TILE;
    for (int64_t rt = blockIdx.x; rt < nrt; rt += gridDim.x) {
        const int64_t r0 = rt * Q_TILE;
        const int nr = (int)min((int64_t)Q_TILE, S - r0);
        __syncthreads();   /* the previous tile is done with sg and sv */
        if (threadIdx.x < nr)
            sg[threadIdx.x] = sc.recipe == MOEX_QUANT_TENSOR ? 0 : find_group_i64(sc.off, G, r0 + threadIdx.x);
        for (int64_t ct = blockIdx.y; ct < nct; ct += gridDim.y) {
            const int64_t k0 = ct * Q_TILE;
            const int nk = (int)min((int64_t)Q_TILE, K - k0);
            __syncthreads();   /* sg written; sv free */
            if (tx < nr)
                for (int j = ty; j < nk; j += Q_TILE_ROWS) {
                    const int64_t k = k0 + j;
                    sv[tx][j] = moex_fp8_decode(q_t[k * T + r0 + tx], f) * dq_scale(sc, r0 + tx, sg[tx], k);
                }
            __syncthreads();
            if (tx < nk)
                for (int i = ty; i < nr; i += Q_TILE_ROWS) y[(r0 + i) * K + k0 + tx] = from_f32<TY>(sv[i][tx]);
        }
    }
}

/* ---- dequantize -------------------------------------------------------------------------- */

size_t moex_cuda_dequantize_ws(moex_context *ctx, const moex_group_dequantize_args *a, const moex_quant_dims *d) {
    return quant_layout(&a->params, a->orientation == MOEX_QUANT_COLUMNWISE, d->G, 0, NULL).used;
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
    const bool columnwise = a->orientation == MOEX_QUANT_COLUMNWISE;
    const quant_ws l = quant_layout(&a->params, columnwise, d->G, 0, ws);
    dq_scales sc;
    sc.p = a->src.scales.data;
    sc.recipe = (int)a->params.recipe;
    sc.columnwise = columnwise;
    sc.swizzled = a->params.scale_layout == MOEX_SCALES_MX_SWIZZLED;
    sc.lb = B == 128 ? 7 : 5;   /* used for block scaling only */
    sc.stride = !B ? 0 : sc.swizzled ? (columnwise ? TILE * cdiv(K, TILE) : 4 * cdiv(cdiv(K, B), 4))
                                     : (columnwise ? cdiv(T, B) + G : cdiv(K, B));
    sc.off = g->off, sc.cso = l.cso, sc.tiles = g->tiles;
    const uint8_t *q = (const uint8_t *)a->src.data.data;
    TY *y = (TY *)a->y.data;
    if (!columnwise) {
        dequant_rowwise_kernel<TY><<<quant_grid_x(T), Q_THREADS, 0, stream>>>(G, sc, q, K, f, y);
        CUDA_TRY_LAUNCH(ctx, c->op);
        return MOEX_OK;
    }
    if (l.cso) MOEX_TRY(launch_colscale_off(ctx, c, g, B, l.cso));
    const dim3 grid(quant_grid_x(cdiv(T, Q_TILE)), quant_grid_y(cdiv(K, Q_TILE)));
    dequant_colwise_kernel<TY><<<grid, Q_THREADS, 0, stream>>>(G, sc, q, T, K, f, y);
    CUDA_TRY_LAUNCH(ctx, c->op);
    return MOEX_OK;
}

moex_status moex_cuda_dequantize(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                 const moex_group_dequantize_args *a, const moex_quant_dims *d, void *ws) {
    MOEX_TRY(check_groups(ctx, c, g->G));
    MOEX_TRY(moex_cuda_sched_ready(ctx, c->op, g));
    if (d->dt == MOEX_DTYPE_F32) return dequantize_run<float>(ctx, c, g, a, d, ws);
    if (d->dt == MOEX_DTYPE_BF16) return dequantize_run<bf16>(ctx, c, g, a, d, ws);
    return dequantize_run<f16>(ctx, c, g, a, d, ws);
}
