/*
 * cpu_quantize.c - grouped FP8 quantization and dequantization on the CPU (the rules:
 * docs/ops.md section 9; the element math: src/core/quant_math.h).
 *
 *   TENSOR, GROUP  the amax of each row (in parallel), reduced per set in row order, one
 *                  scale per set, then the cast of the rows (rowwise [T, K] and/or the
 *                  transposed columnwise [K, T] copy: the same bytes)
 *   BLOCK, MXFP8   rowwise: each row's blocks of B columns; columnwise: tiles of B rows of
 *                  one group by 64 columns at a time (scale column b_g + j of the tile)
 *   dbias          the column sums of each group's rows (moex_cpu_group_colsum)
 *   dequantize     y = round_dt(decode(q) * scale), per group
 *   weights        the same rules per expert of w [G, N, K] (docs/ops.md 9.7), at the end
 * Rows >= off[G] are neither read nor written. Results do not depend on the thread count
 * (every amax is a max, every element is computed on its own).
 *
 * Workspace: quantize, the row amaxes [T] f32 (TENSOR, GROUP) or the tile offsets b [G+1]
 * i64 (BLOCK, MXFP8); dequantize, b [G+1]; the weights' below.
 */
#include "quant_math.h"
#include "cpu_ops.h"
#include "cpu_convert.h"

#include <string.h>

#define QUANT_GRAIN_ELEMS 16384
#define QUANT_COLS 64           /* columns of a columnwise tile done at once */

/* What the row and tile functions need. */
typedef struct quant_job {
    const moex_quant_params *q;
    moex_fp8_format f;
    int64_t T, K, B;            /* B: the block (0: TENSOR, GROUP) */
    moex_dtype dt;
    const void *x;              /* quantize: [T, K] */
    uint8_t *row_data, *col_data;   /* [T, K], [K, T] or NULL */
    void *row_scales, *col_scales;  /* f32 or E8M0, or NULL */
    float *row_amax;            /* TENSOR, GROUP: [T] */
    const float *s;             /* TENSOR, GROUP: the current set's multiplier (one float) */
    int64_t row0;               /* TENSOR, GROUP: the current set's first row */
    const int64_t *off, *b;     /* [G+1] row offsets, [G+1] tile offsets */
    const int64_t *qt;          /* swizzled MXFP8: [G+1] 128-row tile offsets (q_g of docs/ops.md 9.8) */
    int64_t G, ntiles;
    /* dequantize */
    moex_quant_orientation orient;
    const uint8_t *src;
    const void *src_scales;
    void *y;
    int64_t g;                  /* the group of the rows being dequantized */
} quant_job;

/* A job of params q over d's grouped rows (groups at off[G+1]): what quantize and dequantize
 * share; the operands, the orientation and the tile offsets (tiles_layout) are the caller's
 * to fill, every other field is zero. */
static quant_job quant_job_of(const moex_quant_params *q, const moex_quant_dims *d, const int64_t *off) {
    quant_job jb;
    memset(&jb, 0, sizeof jb);
    jb.q = q, jb.f = moex_fp8_format_of(q->fp8);
    jb.T = d->T, jb.K = d->K, jb.B = d->block, jb.dt = d->dt, jb.G = d->G, jb.ntiles = d->col_tiles;
    jb.off = off;
    return jb;
}

static int64_t grain_rows(int64_t K) {
    return K >= QUANT_GRAIN_ELEMS ? 1 : QUANT_GRAIN_ELEMS / (K > 0 ? K : 1);
}

/* Where the scale of rowwise block kb of row i (of group g) is, and of column k's columnwise
 * tile `tile` (of group g, numbered as b): plain (docs/ops.md 9.4) or swizzled (9.8). */
static int64_t row_scale_at(const quant_job *jb, int64_t i, int64_t g, int64_t kb) {
    const int64_t nb = moex_i64_cdiv(jb->K, jb->B);
    if (jb->qt == NULL) return i * nb + kb;
    const int64_t cols4 = 4 * moex_i64_cdiv(nb, 4);
    return jb->qt[g] * 128 * cols4 + moex_mx_swizzled_at(i - jb->off[g], kb, cols4);
}

static int64_t col_scale_at(const quant_job *jb, int64_t k, int64_t g, int64_t tile) {
    if (jb->qt == NULL) return k * jb->ntiles + tile;
    return jb->qt[g] * 4 * 128 * moex_i64_cdiv(jb->K, 128) +
           moex_mx_swizzled_at(k, tile - jb->b[g], 4 * (jb->qt[g + 1] - jb->qt[g]));
}

/* One block's multiplier and its stored scale (f32 1/s, or the E8M0 byte). */
static float block_multiplier(const quant_job *jb, float amax, float mx_amax, void *scales, int64_t at) {
    if (jb->q->recipe == MOEX_QUANT_MXFP8) {
        const int E = moex_mx_exponent(mx_amax, jb->f);
        ((uint8_t *)scales)[at] = (uint8_t)(E + 127);
        return moex_pow2f(-E);
    }
    const float s = moex_quant_scale(amax, jb->q->amax_epsilon, jb->f.max, jb->q->rounding);
    ((float *)scales)[at] = 1.0f / s;
    return s;
}

/* ---- TENSOR and GROUP -------------------------------------------------------------------- */

/* out[i] = max |src[i, k]| over k < K (NaN wins), for the rows of a dense [rows, K]
 * matrix: the row amaxes of current scaling, for the activations and for the weights. */
typedef struct row_amax_job {
    const void *src;
    moex_dtype dt;
    int64_t K;
    float *out;
} row_amax_job;

static void row_amax_rows(void *arg, int64_t begin, int64_t end) {
    const row_amax_job *jb = (const row_amax_job *)arg;
    float v[256];
    for (int64_t i = begin; i < end; i++) {
        float m = 0.0f;
        for (int64_t k0 = 0; k0 < jb->K; k0 += 256) {
            const int64_t n = jb->K - k0 < 256 ? jb->K - k0 : 256;
            moex_cpu_load_f32(v, moex_cpu_cat(jb->src, jb->dt, i * jb->K + k0), jb->dt, n);
            for (int64_t k = 0; k < n; k++) m = moex_amax_combine(m, v[k]);
        }
        jb->out[i] = m;
    }
}

static void row_amaxes(moex_context *ctx, const void *src, moex_dtype dt, int64_t rows, int64_t K, float *out) {
    row_amax_job j = {src, dt, K, out};
    if (rows > 0 && K > 0) moex_cpu_parallel_for(ctx, rows, grain_rows(K), row_amax_rows, &j);
}

static void cast_rows(void *arg, int64_t begin, int64_t end) {
    const quant_job *jb = (const quant_job *)arg;
    const float s = *jb->s;
    float v[256];
    for (int64_t i = jb->row0 + begin; i < jb->row0 + end; i++) {
        for (int64_t k0 = 0; k0 < jb->K; k0 += 256) {
            const int64_t n = jb->K - k0 < 256 ? jb->K - k0 : 256;
            moex_cpu_load_f32(v, moex_cpu_cat(jb->x, jb->dt, i * jb->K + k0), jb->dt, n);
            for (int64_t k = 0; k < n; k++) {
                const uint8_t q = moex_fp8_encode(v[k] * s, jb->f);
                if (jb->row_data) jb->row_data[i * jb->K + k0 + k] = q;
                if (jb->col_data) jb->col_data[(k0 + k) * jb->T + i] = q;
            }
        }
    }
}

/* One amax and scale per set (all rows < off[G], or each group), then the cast. */
static moex_status quantize_current(moex_context *ctx, quant_job *jb, const moex_group_quantize_args *a) {
    const int64_t S = jb->off[jb->G];
    row_amaxes(ctx, jb->x, jb->dt, S, jb->K, jb->row_amax);
    const bool per_group = jb->q->recipe == MOEX_QUANT_GROUP;
    const int64_t sets = per_group ? jb->G : 1;
    float *amax_out = moex_present(&a->amax) ? (float *)a->amax.data : NULL;
    for (int64_t g = 0; g < sets; g++) {
        const int64_t r0 = per_group ? jb->off[g] : 0, r1 = per_group ? jb->off[g + 1] : S;
        float m = 0.0f;
        for (int64_t i = r0; i < r1 && jb->K > 0; i++) m = moex_amax_combine(m, jb->row_amax[i]);
        const float s = moex_quant_scale(m, jb->q->amax_epsilon, jb->f.max, jb->q->rounding);
        if (amax_out) amax_out[g] = m;
        if (jb->row_scales) ((float *)jb->row_scales)[g] = 1.0f / s;
        if (jb->col_scales) ((float *)jb->col_scales)[g] = 1.0f / s;
        jb->s = &s, jb->row0 = r0;
        if (r1 > r0 && jb->K > 0) moex_cpu_parallel_for(ctx, r1 - r0, grain_rows(jb->K), cast_rows, jb);
    }
    return MOEX_OK;
}

/* ---- BLOCK and MXFP8 ---------------------------------------------------------------------- */

/* Rowwise: the blocks of B columns of each row. */
static void block_rows(void *arg, int64_t begin, int64_t end) {
    const quant_job *jb = (const quant_job *)arg;
    const int64_t B = jb->B, nb = moex_i64_cdiv(jb->K, B);
    float v[128];
    int64_t g = jb->qt ? moex_cpu_group_of(jb->off, jb->G, begin) : 0;   /* swizzled: the row's group */
    for (int64_t i = begin; i < end; i++) {
        while (jb->qt && jb->off[g + 1] <= i) g++;
        for (int64_t j = 0; j < nb; j++) {
            const int64_t k0 = j * B, n = jb->K - k0 < B ? jb->K - k0 : B;
            moex_cpu_load_f32(v, moex_cpu_cat(jb->x, jb->dt, i * jb->K + k0), jb->dt, n);
            float m = 0.0f, mx = 0.0f;
            for (int64_t k = 0; k < n; k++) m = moex_amax_combine(m, v[k]), mx = moex_mx_amax_combine(mx, v[k]);
            const float s = block_multiplier(jb, m, mx, jb->row_scales, row_scale_at(jb, i, g, j));
            for (int64_t k = 0; k < n; k++) jb->row_data[i * jb->K + k0 + k] = moex_fp8_encode(v[k] * s, jb->f);
        }
    }
}

/* Columnwise: work item t covers tile t / nchunks (of group g, rows [r0, r1)) and the
 * QUANT_COLS columns of chunk t % nchunks. */
static void block_tiles(void *arg, int64_t begin, int64_t end) {
    const quant_job *jb = (const quant_job *)arg;
    const int64_t B = jb->B, nchunks = moex_i64_cdiv(jb->K, QUANT_COLS);
    float v[128 * QUANT_COLS];
    int64_t g = 0;
    for (int64_t t = begin; t < end; t++) {
        const int64_t tile = t / nchunks, c0 = (t % nchunks) * QUANT_COLS;
        while (jb->b[g + 1] <= tile) g++;   /* items come in increasing order */
        const int64_t r0 = jb->off[g] + (tile - jb->b[g]) * B;
        const int64_t rows = jb->off[g + 1] - r0 < B ? jb->off[g + 1] - r0 : B;
        const int64_t cols = jb->K - c0 < QUANT_COLS ? jb->K - c0 : QUANT_COLS;
        moex_cpu_load_tile_f32(v, QUANT_COLS, moex_cpu_cat(jb->x, jb->dt, r0 * jb->K + c0), jb->dt, jb->K, rows,
                               cols);
        for (int64_t c = 0; c < cols; c++) {
            float m = 0.0f, mx = 0.0f;
            for (int64_t r = 0; r < rows; r++)
                m = moex_amax_combine(m, v[r * QUANT_COLS + c]), mx = moex_mx_amax_combine(mx, v[r * QUANT_COLS + c]);
            const float s = block_multiplier(jb, m, mx, jb->col_scales, col_scale_at(jb, c0 + c, g, tile));
            for (int64_t r = 0; r < rows; r++)
                jb->col_data[(c0 + c) * jb->T + r0 + r] = moex_fp8_encode(v[r * QUANT_COLS + c] * s, jb->f);
        }
    }
}

/* b[g] = sum over h < g of ceil(m_h / B): the first scale column of group g's tiles. */
static void tile_offsets(const int64_t *off, int64_t G, int64_t B, int64_t *b) {
    b[0] = 0;
    for (int64_t g = 0; g < G; g++) b[g + 1] = b[g] + moex_i64_cdiv(off[g + 1] - off[g], B);
}

static moex_status quantize_blocks(moex_context *ctx, quant_job *jb) {
    const int64_t S = jb->off[jb->G];
    if (jb->row_data && S > 0 && jb->K > 0) moex_cpu_parallel_for(ctx, S, grain_rows(jb->K), block_rows, jb);
    if (jb->col_data && jb->K > 0) {
        const int64_t items = jb->b[jb->G] * moex_i64_cdiv(jb->K, QUANT_COLS);
        if (items > 0) moex_cpu_parallel_for(ctx, items, 1, block_tiles, jb);
    }
    return MOEX_OK;
}

/* Block recipes' workspace: b [G+1], then q [G+1] when swizzled (ws NULL: the size). */
static size_t tiles_layout(const moex_quant_params *p, const moex_quant_dims *d, const int64_t *off, void *ws,
                           quant_job *jb) {
    moex_carver c = {(char *)ws, 0};
    int64_t *b = (int64_t *)moex_take(&c, moex_sz_bytes(d->G + 1, 1, sizeof(int64_t)));
    int64_t *q = p->scale_layout == MOEX_SCALES_MX_SWIZZLED
                     ? (int64_t *)moex_take(&c, moex_sz_bytes(d->G + 1, 1, sizeof(int64_t)))
                     : NULL;
    if (ws) {
        tile_offsets(off, d->G, d->block, b);
        if (q) tile_offsets(off, d->G, 128, q);
        jb->b = b, jb->qt = q;
    }
    return c.used;
}

/* Swizzled scales: every byte of the vectors (the padding is 0, docs/ops.md 9.8). */
static void zero_swizzled(const moex_quant_params *p, const moex_quant_tensor *row, const moex_quant_tensor *col) {
    if (p->scale_layout != MOEX_SCALES_MX_SWIZZLED) return;
    if (moex_present(&row->data)) memset(row->scales.data, 0, (size_t)moex_numel(&row->scales));
    if (moex_present(&col->data)) memset(col->scales.data, 0, (size_t)moex_numel(&col->scales));
}

size_t moex_cpu_quantize_ws(moex_context *ctx, const moex_group_quantize_args *a, const moex_quant_dims *d) {
    return d->block ? tiles_layout(&a->params, d, NULL, NULL, NULL) : moex_sz_bytes(d->T, 1, sizeof(float));
}

moex_status moex_cpu_quantize(moex_context *ctx, const moex_call *c, const moex_groups *grp,
                              const moex_group_quantize_args *a, const moex_quant_dims *d, void *ws) {
    quant_job jb = quant_job_of(&a->params, d, grp->off);
    jb.x = a->x.data;
    if (moex_present(&a->rowwise.data))
        jb.row_data = (uint8_t *)a->rowwise.data.data, jb.row_scales = a->rowwise.scales.data;
    if (moex_present(&a->columnwise.data))
        jb.col_data = (uint8_t *)a->columnwise.data.data, jb.col_scales = a->columnwise.scales.data;
    if (moex_present(&a->dbias))
        moex_cpu_group_colsum(ctx, grp->off, d->G, a->x.data, d->dt, d->K, NULL, a->dbias.data, MOEX_DTYPE_F32);
    if (!d->block) {
        jb.row_amax = (float *)ws;
        return quantize_current(ctx, &jb, a);
    }
    tiles_layout(&a->params, d, grp->off, ws, &jb);
    zero_swizzled(&a->params, &a->rowwise, &a->columnwise);
    return quantize_blocks(ctx, &jb);
}

/* ---- dequantize ---------------------------------------------------------------------------- */

/* The scale of element (i, k) of group jb->g as a multiplier. */
static float dequant_scale(const quant_job *jb, int64_t i, int64_t k) {
    const void *sc = jb->src_scales;
    if (!jb->B) return ((const float *)sc)[jb->q->recipe == MOEX_QUANT_GROUP ? jb->g : 0];
    const int64_t at = jb->orient == MOEX_QUANT_ROWWISE
                           ? row_scale_at(jb, i, jb->g, k / jb->B)
                           : col_scale_at(jb, k, jb->g, jb->b[jb->g] + (i - jb->off[jb->g]) / jb->B);
    if (jb->q->recipe != MOEX_QUANT_MXFP8) return ((const float *)sc)[at];
    return moex_e8m0_value(((const uint8_t *)sc)[at]);
}

static void dequant_rows(void *arg, int64_t begin, int64_t end) {
    const quant_job *jb = (const quant_job *)arg;
    float v[256];
    for (int64_t i = jb->off[jb->g] + begin; i < jb->off[jb->g] + end; i++) {
        for (int64_t k0 = 0; k0 < jb->K; k0 += 256) {
            const int64_t n = jb->K - k0 < 256 ? jb->K - k0 : 256;
            for (int64_t k = 0; k < n; k++) {
                const uint8_t q = jb->orient == MOEX_QUANT_ROWWISE ? jb->src[i * jb->K + k0 + k]
                                                                   : jb->src[(k0 + k) * jb->T + i];
                v[k] = moex_fp8_decode(q, jb->f) * dequant_scale(jb, i, k0 + k);
            }
            moex_cpu_store_f32(moex_cpu_at(jb->y, jb->dt, i * jb->K + k0), jb->dt, v, n);
        }
    }
}

size_t moex_cpu_dequantize_ws(moex_context *ctx, const moex_group_dequantize_args *a, const moex_quant_dims *d) {
    return d->block ? tiles_layout(&a->params, d, NULL, NULL, NULL) : 0;
}

moex_status moex_cpu_dequantize(moex_context *ctx, const moex_call *c, const moex_groups *grp,
                                const moex_group_dequantize_args *a, const moex_quant_dims *d, void *ws) {
    quant_job jb = quant_job_of(&a->params, d, grp->off);
    jb.orient = a->orientation;
    jb.src = (const uint8_t *)a->src.data.data, jb.src_scales = a->src.scales.data, jb.y = a->y.data;
    if (d->block) tiles_layout(&a->params, d, grp->off, ws, &jb);
    if (d->K == 0) return MOEX_OK;
    for (int64_t g = 0; g < d->G; g++) {
        jb.g = g;
        const int64_t rows = grp->off[g + 1] - grp->off[g];
        if (rows > 0) moex_cpu_parallel_for(ctx, rows, grain_rows(d->K), dequant_rows, &jb);
    }
    return MOEX_OK;
}

/* ---- weights (docs/ops.md 9.7) --------------------------------------------------------------
 * w [G, N, K]: rows are the G*N rows of the experts' [N, K] matrices. GROUP: the amax of each
 * row (in parallel), reduced per expert, then the cast of the rows; BLOCK: each 128x128 block
 * of one expert, two passes over its rows (amax, then the cast); MXFP8: rowwise as the blocks
 * of the activations, columnwise by tiles of 32 rows x QUANT_COLS columns of one expert.
 * Workspace: GROUP, the row amaxes [G*N] f32 and the multipliers [G]; else none. */

typedef struct wq_job {
    const moex_quant_params *q;
    moex_fp8_format f;
    int64_t G, N, K;
    moex_dtype dt;
    const void *w;
    uint8_t *row_data, *col_data;
    void *row_scales, *col_scales;
    float *row_amax;            /* GROUP: [G*N] */
    const float *mult;          /* GROUP: [G] */
    bool swizzled;              /* MXFP8 scales in the 128x4-tiled layout */
} wq_job;

/* The f32 values of w[g, n, k0 .. k0+len). */
static void wq_load(const wq_job *jb, float *v, int64_t row, int64_t k0, int64_t len) {
    moex_cpu_load_f32(v, moex_cpu_cat(jb->w, jb->dt, row * jb->K + k0), jb->dt, len);
}

/* Stores q of w[row, k] (row = g N + n) into the copies that are present. */
static void wq_store(const wq_job *jb, int64_t row, int64_t k, uint8_t q) {
    if (jb->row_data) jb->row_data[row * jb->K + k] = q;
    if (jb->col_data) {
        const int64_t g = row / jb->N, n = row % jb->N;
        jb->col_data[(g * jb->K + k) * jb->N + n] = q;
    }
}

static void wq_cast_rows(void *arg, int64_t begin, int64_t end) {
    const wq_job *jb = (const wq_job *)arg;
    float v[256];
    for (int64_t r = begin; r < end; r++) {
        const float s = jb->mult[r / jb->N];
        for (int64_t k0 = 0; k0 < jb->K; k0 += 256) {
            const int64_t n = jb->K - k0 < 256 ? jb->K - k0 : 256;
            wq_load(jb, v, r, k0, n);
            for (int64_t k = 0; k < n; k++) wq_store(jb, r, k0 + k, moex_fp8_encode(v[k] * s, jb->f));
        }
    }
}

/* BLOCK: item t is block (i, j) of expert g, t = (g nbi + i) nbj + j. */
static void wq_blocks(void *arg, int64_t begin, int64_t end) {
    const wq_job *jb = (const wq_job *)arg;
    const int64_t nbi = moex_i64_cdiv(jb->N, 128), nbj = moex_i64_cdiv(jb->K, 128);
    float v[128];
    for (int64_t t = begin; t < end; t++) {
        const int64_t g = t / (nbi * nbj), i = t / nbj % nbi, j = t % nbj;
        const int64_t n0 = i * 128, n1 = n0 + 128 < jb->N ? n0 + 128 : jb->N;
        const int64_t k0 = j * 128, len = jb->K - k0 < 128 ? jb->K - k0 : 128;
        float m = 0.0f;
        for (int64_t n = n0; n < n1; n++) {
            wq_load(jb, v, g * jb->N + n, k0, len);
            for (int64_t k = 0; k < len; k++) m = moex_amax_combine(m, v[k]);
        }
        const float s = moex_quant_scale(m, jb->q->amax_epsilon, jb->f.max, jb->q->rounding);
        if (jb->row_scales) ((float *)jb->row_scales)[(g * nbi + i) * nbj + j] = 1.0f / s;
        if (jb->col_scales) ((float *)jb->col_scales)[(g * nbj + j) * nbi + i] = 1.0f / s;
        for (int64_t n = n0; n < n1; n++) {
            wq_load(jb, v, g * jb->N + n, k0, len);
            for (int64_t k = 0; k < len; k++) wq_store(jb, g * jb->N + n, k0 + k, moex_fp8_encode(v[k] * s, jb->f));
        }
    }
}

/* MXFP8 rowwise: the 32-blocks along K of each row, scales [G*N, ceil(K/32)]. */
static void wq_mx_rows(void *arg, int64_t begin, int64_t end) {
    const wq_job *jb = (const wq_job *)arg;
    const int64_t nb = moex_i64_cdiv(jb->K, 32);
    float v[32];
    for (int64_t r = begin; r < end; r++)
        for (int64_t j = 0; j < nb; j++) {
            const int64_t k0 = j * 32, len = jb->K - k0 < 32 ? jb->K - k0 : 32;
            wq_load(jb, v, r, k0, len);
            float m = 0.0f;
            for (int64_t k = 0; k < len; k++) m = moex_mx_amax_combine(m, v[k]);
            const int E = moex_mx_exponent(m, jb->f);
            const int64_t g = r / jb->N;
            ((uint8_t *)jb->row_scales)[moex_mx_expert_scale_at(jb->N, nb, jb->swizzled, g, r - g * jb->N, j)] =
                (uint8_t)(E + 127);
            const float s = moex_pow2f(-E);
            for (int64_t k = 0; k < len; k++) jb->row_data[r * jb->K + k0 + k] = moex_fp8_encode(v[k] * s, jb->f);
        }
}

/* MXFP8 columnwise: item t is rows [32 i, 32 i + 32) of expert g by the QUANT_COLS columns
 * of chunk c, t = (g nbi + i) nchunks + c; scales [G*K, ceil(N/32)]. */
static void wq_mx_cols(void *arg, int64_t begin, int64_t end) {
    const wq_job *jb = (const wq_job *)arg;
    const int64_t nbi = moex_i64_cdiv(jb->N, 32), nchunks = moex_i64_cdiv(jb->K, QUANT_COLS);
    float v[32 * QUANT_COLS];
    for (int64_t t = begin; t < end; t++) {
        const int64_t g = t / (nbi * nchunks), i = t / nchunks % nbi, c0 = t % nchunks * QUANT_COLS;
        const int64_t n0 = i * 32, rows = jb->N - n0 < 32 ? jb->N - n0 : 32;
        const int64_t cols = jb->K - c0 < QUANT_COLS ? jb->K - c0 : QUANT_COLS;
        moex_cpu_load_tile_f32(v, QUANT_COLS, moex_cpu_cat(jb->w, jb->dt, (g * jb->N + n0) * jb->K + c0), jb->dt,
                               jb->K, rows, cols);
        for (int64_t c = 0; c < cols; c++) {
            float m = 0.0f;
            for (int64_t r = 0; r < rows; r++) m = moex_mx_amax_combine(m, v[r * QUANT_COLS + c]);
            const int E = moex_mx_exponent(m, jb->f);
            const int64_t kk = g * jb->K + c0 + c;   /* the row of the [G*K, N] copy */
            ((uint8_t *)jb->col_scales)[moex_mx_expert_scale_at(jb->K, nbi, jb->swizzled, g, c0 + c, i)] =
                (uint8_t)(E + 127);
            const float s = moex_pow2f(-E);
            for (int64_t r = 0; r < rows; r++)
                jb->col_data[kk * jb->N + n0 + r] = moex_fp8_encode(v[r * QUANT_COLS + c] * s, jb->f);
        }
    }
}

/* GROUP's workspace: the row amaxes [G*N] and the multipliers [G] (ws NULL: the size). */
static size_t wq_group_layout(int64_t G, int64_t N, void *ws, float **row_amax, float **mult) {
    moex_carver c = {(char *)ws, 0};
    *row_amax = (float *)moex_take(&c, moex_sz_bytes(G, N, sizeof(float)));
    *mult = (float *)moex_take(&c, moex_sz_bytes(G, 1, sizeof(float)));
    return c.used;
}

size_t moex_cpu_weight_quantize_ws(moex_context *ctx, const moex_weight_quantize_args *a, const moex_quant_dims *d) {
    float *row_amax, *mult;
    return a->params.recipe == MOEX_QUANT_GROUP ? wq_group_layout(d->G, d->T, NULL, &row_amax, &mult) : 0;
}

moex_status moex_cpu_weight_quantize(moex_context *ctx, const moex_call *c, const moex_weight_quantize_args *a,
                                     const moex_quant_dims *d, void *ws) {
    wq_job jb;
    memset(&jb, 0, sizeof jb);
    jb.q = &a->params, jb.f = moex_fp8_format_of(a->params.fp8);
    jb.G = d->G, jb.N = d->T, jb.K = d->K, jb.dt = d->dt, jb.w = a->w.data;
    jb.swizzled = a->params.scale_layout == MOEX_SCALES_MX_SWIZZLED;
    zero_swizzled(&a->params, &a->rowwise, &a->columnwise);
    if (moex_present(&a->rowwise.data))
        jb.row_data = (uint8_t *)a->rowwise.data.data, jb.row_scales = a->rowwise.scales.data;
    if (moex_present(&a->columnwise.data))
        jb.col_data = (uint8_t *)a->columnwise.data.data, jb.col_scales = a->columnwise.scales.data;
    const int64_t rows = jb.K > 0 ? jb.G * jb.N : 0;   /* validated: G N K < 2^60 */
    switch (a->params.recipe) {
    case MOEX_QUANT_GROUP: {
        float *mult;
        wq_group_layout(jb.G, jb.N, ws, &jb.row_amax, &mult);
        row_amaxes(ctx, jb.w, jb.dt, rows, jb.K, jb.row_amax);
        for (int64_t g = 0; g < jb.G; g++) {
            float m = 0.0f;
            for (int64_t r = g * jb.N; r < (g + 1) * jb.N && rows > 0; r++) m = moex_amax_combine(m, jb.row_amax[r]);
            mult[g] = moex_quant_scale(m, a->params.amax_epsilon, jb.f.max, a->params.rounding);
            if (moex_present(&a->amax)) ((float *)a->amax.data)[g] = m;
            if (jb.row_scales) ((float *)jb.row_scales)[g] = 1.0f / mult[g];
            if (jb.col_scales) ((float *)jb.col_scales)[g] = 1.0f / mult[g];
        }
        jb.mult = mult;
        if (rows > 0) moex_cpu_parallel_for(ctx, rows, grain_rows(jb.K), wq_cast_rows, &jb);
        return MOEX_OK;
    }
    case MOEX_QUANT_BLOCK: {
        const int64_t items = rows > 0 ? jb.G * moex_i64_cdiv(jb.N, 128) * moex_i64_cdiv(jb.K, 128) : 0;
        if (items > 0) moex_cpu_parallel_for(ctx, items, 1, wq_blocks, &jb);
        return MOEX_OK;
    }
    default: {   /* MXFP8 */
        if (jb.row_data && rows > 0) moex_cpu_parallel_for(ctx, rows, grain_rows(jb.K), wq_mx_rows, &jb);
        const int64_t items = rows > 0 ? jb.G * moex_i64_cdiv(jb.N, 32) * moex_i64_cdiv(jb.K, QUANT_COLS) : 0;
        if (jb.col_data && items > 0) moex_cpu_parallel_for(ctx, items, 1, wq_mx_cols, &jb);
        return MOEX_OK;
    }
    }
}

typedef struct wdq_job {
    const moex_quant_params *q;
    moex_fp8_format f;
    int64_t N, K;
    moex_dtype dt;
    moex_quant_orientation orient;
    const uint8_t *src;
    const void *scales;
    void *w;
} wdq_job;

/* The multiplier of element (g, n, k) (9.7's sets). */
static float wdq_scale(const wdq_job *jb, int64_t g, int64_t n, int64_t k) {
    const bool row = jb->orient == MOEX_QUANT_ROWWISE;
    int64_t at;
    switch (jb->q->recipe) {
    case MOEX_QUANT_GROUP: return ((const float *)jb->scales)[g];
    case MOEX_QUANT_BLOCK: {
        const int64_t nbi = moex_i64_cdiv(jb->N, 128), nbj = moex_i64_cdiv(jb->K, 128);
        at = row ? (g * nbi + n / 128) * nbj + k / 128 : (g * nbj + k / 128) * nbi + n / 128;
        return ((const float *)jb->scales)[at];
    }
    default: {
        const bool swz = jb->q->scale_layout == MOEX_SCALES_MX_SWIZZLED;
        at = row ? moex_mx_expert_scale_at(jb->N, moex_i64_cdiv(jb->K, 32), swz, g, n, k / 32)
                 : moex_mx_expert_scale_at(jb->K, moex_i64_cdiv(jb->N, 32), swz, g, k, n / 32);
        return moex_e8m0_value(((const uint8_t *)jb->scales)[at]);
    }
    }
}

static void wdq_rows(void *arg, int64_t begin, int64_t end) {
    const wdq_job *jb = (const wdq_job *)arg;
    float v[256];
    for (int64_t r = begin; r < end; r++) {
        const int64_t g = r / jb->N, n = r % jb->N;
        for (int64_t k0 = 0; k0 < jb->K; k0 += 256) {
            const int64_t len = jb->K - k0 < 256 ? jb->K - k0 : 256;
            for (int64_t k = 0; k < len; k++) {
                const int64_t kk = k0 + k;
                const uint8_t q = jb->orient == MOEX_QUANT_ROWWISE ? jb->src[r * jb->K + kk]
                                                                   : jb->src[(g * jb->K + kk) * jb->N + n];
                v[k] = moex_fp8_decode(q, jb->f) * wdq_scale(jb, g, n, kk);
            }
            moex_cpu_store_f32(moex_cpu_at(jb->w, jb->dt, r * jb->K + k0), jb->dt, v, len);
        }
    }
}

size_t moex_cpu_weight_dequantize_ws(moex_context *ctx, const moex_weight_dequantize_args *a,
                                     const moex_quant_dims *d) {
    return 0;
}

moex_status moex_cpu_weight_dequantize(moex_context *ctx, const moex_call *c, const moex_weight_dequantize_args *a,
                                       const moex_quant_dims *d, void *ws) {
    wdq_job jb = {&a->params, moex_fp8_format_of(a->params.fp8), d->T, d->K, d->dt, a->orientation,
                  (const uint8_t *)a->src.data.data, a->src.scales.data, a->w.data};
    const int64_t rows = d->K > 0 ? d->G * d->T : 0;   /* validated: G N K < 2^60 */
    if (rows > 0) moex_cpu_parallel_for(ctx, rows, grain_rows(d->K), wdq_rows, &jb);
    return MOEX_OK;
}
