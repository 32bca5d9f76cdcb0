/*
 * cpu_quantize.c - grouped FP8 quantization and dequantization on the CPU (the rules:
 * docs/ops.md section 9; the element math: src/core/quant_math.h).
 *
 *   TENSOR, GROUP  the amax of each row (in parallel), reduced per set in row order, one
 *                  scale per set, then the cast of the rows (rowwise [T, K] and/or the
 *                  transposed columnwise [K, T] copy: the same bytes)
 *   BLOCK, MXFP8   rowwise: each row's blocks of B columns; columnwise: tiles of B rows of
 *                  one group by 64 columns at a time (scale column b_g + j of the tile)
 *   dequantize     y = round_dt(decode(q) * scale), per group
 * Rows >= off[G] are neither read nor written. Results do not depend on the thread count
 * (every amax is a max, every element is computed on its own).
 *
 * Workspace: quantize, the row amaxes [T] f32 (TENSOR, GROUP) or the tile offsets b [G+1]
 * i64 (BLOCK, MXFP8); dequantize, b [G+1].
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
    int64_t G, ntiles;
    /* dequantize */
    moex_quant_orientation orient;
    const uint8_t *src;
    const void *src_scales;
    void *y;
    int64_t g;                  /* the group of the rows being dequantized */
} quant_job;

static int64_t grain_rows(int64_t K) {
    return K >= QUANT_GRAIN_ELEMS ? 1 : QUANT_GRAIN_ELEMS / (K > 0 ? K : 1);
}

/* One block's multiplier and its stored scale (f32 1/s, or the E8M0 byte). */
static float block_multiplier(const quant_job *jb, float amax, float mx_amax, void *scales, int64_t at) {
    if (jb->q->recipe == MOEX_QUANT_MXFP8) {
        const int E = moex_mx_exponent(mx_amax, jb->f);
        ((uint8_t *)scales)[at] = (uint8_t)(E + 127);
        return ldexpf(1.0f, -E);
    }
    const float s = moex_quant_scale(amax, jb->q->amax_epsilon, jb->f.max, jb->q->rounding);
    ((float *)scales)[at] = 1.0f / s;
    return s;
}

/* ---- TENSOR and GROUP -------------------------------------------------------------------- */

static void row_amax_rows(void *arg, int64_t begin, int64_t end) {
    const quant_job *jb = (const quant_job *)arg;
    float v[256];
    for (int64_t i = begin; i < end; i++) {
        float m = 0.0f;
        for (int64_t k0 = 0; k0 < jb->K; k0 += 256) {
            const int64_t n = jb->K - k0 < 256 ? jb->K - k0 : 256;
            moex_cpu_load_f32(v, moex_cpu_cat(jb->x, jb->dt, i * jb->K + k0), jb->dt, n);
            for (int64_t k = 0; k < n; k++) m = moex_amax_combine(m, v[k]);
        }
        jb->row_amax[i] = m;
    }
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
    if (S > 0 && jb->K > 0) moex_cpu_parallel_for(ctx, S, grain_rows(jb->K), row_amax_rows, jb);
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
    const int64_t B = jb->B, nb = (jb->K + B - 1) / B;
    float v[128];
    for (int64_t i = begin; i < end; i++) {
        for (int64_t j = 0; j < nb; j++) {
            const int64_t k0 = j * B, n = jb->K - k0 < B ? jb->K - k0 : B;
            moex_cpu_load_f32(v, moex_cpu_cat(jb->x, jb->dt, i * jb->K + k0), jb->dt, n);
            float m = 0.0f, mx = 0.0f;
            for (int64_t k = 0; k < n; k++) m = moex_amax_combine(m, v[k]), mx = moex_mx_amax_combine(mx, v[k]);
            const float s = block_multiplier(jb, m, mx, jb->row_scales, i * nb + j);
            for (int64_t k = 0; k < n; k++) jb->row_data[i * jb->K + k0 + k] = moex_fp8_encode(v[k] * s, jb->f);
        }
    }
}

/* Columnwise: work item t covers tile t / nchunks (of group g, rows [r0, r1)) and the
 * QUANT_COLS columns of chunk t % nchunks. */
static void block_tiles(void *arg, int64_t begin, int64_t end) {
    const quant_job *jb = (const quant_job *)arg;
    const int64_t B = jb->B, nchunks = (jb->K + QUANT_COLS - 1) / QUANT_COLS;
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
            const float s = block_multiplier(jb, m, mx, jb->col_scales, (c0 + c) * jb->ntiles + tile);
            for (int64_t r = 0; r < rows; r++)
                jb->col_data[(c0 + c) * jb->T + r0 + r] = moex_fp8_encode(v[r * QUANT_COLS + c] * s, jb->f);
        }
    }
}

/* b[g] = sum over h < g of ceil(m_h / B): the first scale column of group g's tiles. */
static void tile_offsets(const int64_t *off, int64_t G, int64_t B, int64_t *b) {
    b[0] = 0;
    for (int64_t g = 0; g < G; g++) b[g + 1] = b[g] + (off[g + 1] - off[g] + B - 1) / B;
}

static moex_status quantize_blocks(moex_context *ctx, quant_job *jb) {
    const int64_t S = jb->off[jb->G];
    if (jb->row_data && S > 0 && jb->K > 0) moex_cpu_parallel_for(ctx, S, grain_rows(jb->K), block_rows, jb);
    if (jb->col_data && jb->K > 0) {
        const int64_t items = jb->b[jb->G] * ((jb->K + QUANT_COLS - 1) / QUANT_COLS);
        if (items > 0) moex_cpu_parallel_for(ctx, items, 1, block_tiles, jb);
    }
    return MOEX_OK;
}

size_t moex_cpu_quantize_ws(moex_context *ctx, const moex_group_quantize_args *a, const moex_quant_dims *d) {
    return d->block ? (size_t)(d->G + 1) * sizeof(int64_t) : (size_t)d->T * sizeof(float);
}

moex_status moex_cpu_quantize(moex_context *ctx, const moex_call *c, const moex_groups *grp,
                              const moex_group_quantize_args *a, const moex_quant_dims *d, void *ws) {
    quant_job jb;
    memset(&jb, 0, sizeof jb);
    jb.q = &a->params, jb.f = moex_fp8_format_of(a->params.fp8);
    jb.T = d->T, jb.K = d->K, jb.B = d->block, jb.dt = d->dt, jb.G = d->G, jb.ntiles = d->col_tiles;
    jb.x = a->x.data, jb.off = grp->off;
    if (moex_present(&a->rowwise.data)) jb.row_data = (uint8_t *)a->rowwise.data.data, jb.row_scales = a->rowwise.scales.data;
    if (moex_present(&a->columnwise.data))
        jb.col_data = (uint8_t *)a->columnwise.data.data, jb.col_scales = a->columnwise.scales.data;
    if (!d->block) {
        jb.row_amax = (float *)ws;
        return quantize_current(ctx, &jb, a);
    }
    tile_offsets(grp->off, d->G, d->block, (int64_t *)ws);
    jb.b = (const int64_t *)ws;
    return quantize_blocks(ctx, &jb);
}

/* ---- dequantize ---------------------------------------------------------------------------- */

/* The scale of element (i, k) of group jb->g as a multiplier. */
static float dequant_scale(const quant_job *jb, int64_t i, int64_t k) {
    const void *sc = jb->src_scales;
    if (!jb->B) return ((const float *)sc)[jb->q->recipe == MOEX_QUANT_GROUP ? jb->g : 0];
    const int64_t at = jb->orient == MOEX_QUANT_ROWWISE
                           ? i * ((jb->K + jb->B - 1) / jb->B) + k / jb->B
                           : k * jb->ntiles + jb->b[jb->g] + (i - jb->off[jb->g]) / jb->B;
    if (jb->q->recipe != MOEX_QUANT_MXFP8) return ((const float *)sc)[at];
    const uint8_t e = ((const uint8_t *)sc)[at];
    return e == 0xFF ? NAN : ldexpf(1.0f, (int)e - 127);
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
    return (size_t)(d->G + 1) * sizeof(int64_t);
}

moex_status moex_cpu_dequantize(moex_context *ctx, const moex_call *c, const moex_groups *grp,
                                const moex_group_dequantize_args *a, const moex_quant_dims *d, void *ws) {
    quant_job jb;
    memset(&jb, 0, sizeof jb);
    jb.q = &a->params, jb.f = moex_fp8_format_of(a->params.fp8);
    jb.T = d->T, jb.K = d->K, jb.B = d->block, jb.dt = d->dt, jb.G = d->G, jb.ntiles = d->col_tiles;
    jb.off = grp->off, jb.orient = a->orientation;
    jb.src = (const uint8_t *)a->src.data.data, jb.src_scales = a->src.scales.data, jb.y = a->y.data;
    if (d->block) tile_offsets(grp->off, d->G, d->block, (int64_t *)ws);
    jb.b = (const int64_t *)ws;
    if (d->K == 0) return MOEX_OK;
    for (int64_t g = 0; g < d->G; g++) {
        jb.g = g;
        const int64_t rows = grp->off[g + 1] - grp->off[g];
        if (rows > 0) moex_cpu_parallel_for(ctx, rows, grain_rows(d->K), dequant_rows, &jb);
    }
    return MOEX_OK;
}
