/*
 * ref_quant.c - the reference of grouped FP8 quantization (see ref_quant.h and
 * docs/ops.md section 9). Plain loops over the sets, written for clarity.
 */
#include "ref_quant.h"
#include "ref.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

/* ---- formats ------------------------------------------------------------------------ */

double ref_fp8_max(moex_dtype fmt) {
    if (fmt == MOEX_DTYPE_E4M3) return 448.0;      /* 1.75 * 2^8  (S.1111.110) */
    if (fmt == MOEX_DTYPE_E5M2) return 57344.0;    /* 1.75 * 2^15 (S.11110.11) */
    return 0.0;
}

int ref_fp8_emax(moex_dtype fmt) { return fmt == MOEX_DTYPE_E4M3 ? 8 : 15; }

double ref_fp8_decode(moex_dtype fmt, uint8_t code) {
    const double sign = (code & 0x80) ? -1.0 : 1.0;
    int ebits, mbits, bias;
    if (fmt == MOEX_DTYPE_E4M3) {
        ebits = 4, mbits = 3, bias = 7;
    } else {
        ebits = 5, mbits = 2, bias = 15;
    }
    const int field_e = (code & 0x7F) >> mbits;
    const int field_m = code & ((1 << mbits) - 1);
    const int e_all_ones = (1 << ebits) - 1;
    if (fmt == MOEX_DTYPE_E4M3) {
        /* E4M3 (OCP "fn"): no Inf; only S.1111.111 is NaN, S.1111.000-110 are normal values */
        if (field_e == e_all_ones && field_m == (1 << mbits) - 1) return NAN;
    } else if (field_e == e_all_ones) {
        /* E5M2: IEEE-like, S.11111.00 is Inf, S.11111.xx NaN */
        return field_m == 0 ? sign * INFINITY : NAN;
    }
    const double frac = (double)field_m / (double)(1 << mbits);
    if (field_e == 0) return sign * ldexp(frac, 1 - bias);          /* subnormal: 0.m 2^(1-bias) */
    return sign * ldexp(1.0 + frac, field_e - bias);                 /* normal: 1.m 2^(e-bias)    */
}

double ref_e8m0_decode(uint8_t b) {
    if (b == 0xFF) return NAN;
    return ldexp(1.0, (int)b - 127);
}

/* The non-negative finite codes of a format, 0 .. maxcode, and their values (increasing). */
typedef struct fp8_grid {
    int maxcode;
    double val[128];
} fp8_grid;

static void grid_init(fp8_grid *g, moex_dtype fmt) {
    g->maxcode = -1;
    for (int c = 0; c < 128; c++) {
        double v = ref_fp8_decode(fmt, (uint8_t)c);
        if (!isfinite(v)) break;   /* the first non-finite code ends the finite range */
        g->val[c] = v;
        g->maxcode = c;
    }
    if (g->maxcode < 1 || g->val[g->maxcode] != ref_fp8_max(fmt)) abort();
    for (int c = 1; c <= g->maxcode; c++)
        if (!(g->val[c] > g->val[c - 1])) abort();   /* the search needs increasing values */
}

/* Nearest finite code of v's sign; ties to the even code; NaN 0x7F. */
static uint8_t grid_encode(const fp8_grid *g, double v) {
    if (v != v) return 0x7F;
    const int neg = signbit(v) != 0;
    const double a = fabs(v);
    int code;
    if (a >= g->val[g->maxcode]) {
        code = g->maxcode;          /* the nearest finite value of anything past max */
    } else {
        int lo = 0, hi = g->maxcode; /* val[lo] <= a < val[hi] */
        while (hi - lo > 1) {
            int mid = (lo + hi) / 2;
            if (g->val[mid] <= a)
                lo = mid;
            else
                hi = mid;
        }
        /* the midpoint of two neighbouring fp8 values is exact in fp64 */
        const double half = 0.5 * (g->val[lo] + g->val[hi]);
        if (a < half)
            code = lo;
        else if (a > half)
            code = hi;
        else
            code = (lo % 2 == 0) ? lo : hi;
    }
    return (uint8_t)((neg ? 0x80 : 0x00) | code);
}

uint8_t ref_fp8_encode(moex_dtype fmt, double v) {
    fp8_grid g;
    grid_init(&g, fmt);
    return grid_encode(&g, v);
}

/* ---- the scale rules ------------------------------------------------------------------ */

static double to_f32(double v) { return (double)(float)v; }

double ref_quant_factor(const moex_quant_params *p, double amax) {
    double a = amax;
    if (!isnan(a) && (double)p->amax_epsilon > a) a = (double)p->amax_epsilon;   /* max(amax, eps) */
    if (isnan(a) || isinf(a) || a == 0.0) return 1.0;
    double s = to_f32(ref_fp8_max(p->fp8) / a);   /* one f32 division */
    if (isinf(s)) s = FLT_MAX;
    if (p->rounding == MOEX_SCALE_POW2) {
        int e;
        frexp(s, &e);               /* s = m 2^e, m in [0.5, 1): floor(log2 s) = e - 1 */
        s = ldexp(1.0, e - 1);
    }
    return s;
}

double ref_quant_dequant_scale(double s) { return to_f32(1.0 / s); }

int ref_mx_exponent(moex_dtype fmt, double amax) {
    if (amax == 0.0 || isnan(amax)) return -127;
    if (isinf(amax)) return 127;
    int e;
    frexp(amax, &e);                /* floor(log2 amax) = e - 1 */
    int E = (e - 1) - ref_fp8_emax(fmt);
    if (E < -127) E = -127;
    if (E > 127) E = 127;
    return E;
}

/* ---- layouts -------------------------------------------------------------------------- */

int64_t ref_quant_block(moex_quant_recipe recipe) {
    if (recipe == MOEX_QUANT_BLOCK) return 128;
    if (recipe == MOEX_QUANT_MXFP8) return 32;
    return 0;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int ref_quant_scales_shape(moex_quant_recipe recipe, int columnwise, int64_t G, int64_t T, int64_t K,
                           int64_t shape[2]) {
    if (recipe == MOEX_QUANT_TENSOR) {
        shape[0] = 1;
        return 1;
    }
    if (recipe == MOEX_QUANT_GROUP) {
        shape[0] = G;
        return 1;
    }
    const int64_t B = ref_quant_block(recipe);
    if (!columnwise) {
        shape[0] = T;
        shape[1] = ceil_div(K, B);
    } else {
        shape[0] = K;
        shape[1] = ceil_div(T, B) + G;
    }
    return 2;
}

int64_t ref_quant_tile_base(const int64_t *splits, int64_t g, int64_t B) {
    int64_t b = 0;
    for (int64_t h = 0; h < g; h++) b += ceil_div(splits[h], B);
    return b;
}

/* ---- quantize ----------------------------------------------------------------------- */

typedef struct qrun {
    const moex_quant_params *p;
    fp8_grid grid;
    int64_t T, K;
    const double *x;
    ref_quant_out *out;
} qrun;

/* max |x| over rows [r0, r1) x columns [c0, c1): NaN when one is NaN (skip_nan: NaNs are
 * left out, MX); 0 when the rectangle is empty or all NaN with skip_nan. */
static double rect_amax(const qrun *q, int64_t r0, int64_t r1, int64_t c0, int64_t c1, int skip_nan) {
    double m = 0.0;
    int saw_nan = 0;
    for (int64_t i = r0; i < r1; i++)
        for (int64_t k = c0; k < c1; k++) {
            const double v = q->x[i * q->K + k];
            if (v != v) {
                saw_nan = 1;
                continue;
            }
            if (fabs(v) > m) m = fabs(v);
        }
    return (saw_nan && !skip_nan) ? NAN : m;
}

/* The codes of the rectangle for factor f: fp8(float(x * f)), into the rowwise copy
 * (row != NULL) and/or the columnwise one (col != NULL). */
static void rect_codes(const qrun *q, int64_t r0, int64_t r1, int64_t c0, int64_t c1, double f, uint8_t *row,
                       uint8_t *col) {
    for (int64_t i = r0; i < r1; i++)
        for (int64_t k = c0; k < c1; k++) {
            const double v = to_f32(q->x[i * q->K + k] * f);   /* the f32 product (exact in fp64) */
            const uint8_t c = grid_encode(&q->grid, v);
            if (row) row[i * q->K + k] = c;
            if (col) col[k * q->T + i] = c;
        }
}

/* One set of the current / block scaling rule (9.2): returns the stored scale; writes the
 * codes; the set's amax in *amax_out (NULL: not wanted). */
static float scaled_set(const qrun *q, int64_t r0, int64_t r1, int64_t c0, int64_t c1, uint8_t *row, uint8_t *col,
                        double *amax_out) {
    const double amax = rect_amax(q, r0, r1, c0, c1, 0);
    if (amax_out) *amax_out = amax;
    const double s = ref_quant_factor(q->p, amax);
    rect_codes(q, r0, r1, c0, c1, s, row, col);
    return (float)ref_quant_dequant_scale(s);
}

/* One MX block (9.3): returns the E8M0 byte; writes the codes. */
static uint8_t mx_set(const qrun *q, int64_t r0, int64_t r1, int64_t c0, int64_t c1, uint8_t *row, uint8_t *col) {
    const int E = ref_mx_exponent(q->p->fp8, rect_amax(q, r0, r1, c0, c1, 1));
    rect_codes(q, r0, r1, c0, c1, ldexp(1.0, -E), row, col);
    return (uint8_t)(E + 127);
}

void ref_group_quantize(const moex_quant_params *p, int64_t G, int64_t T, int64_t K, const int64_t *splits,
                        const double *x, ref_quant_out *out) {
    qrun q;
    q.p = p;
    grid_init(&q.grid, p->fp8);
    q.T = T, q.K = K, q.x = x, q.out = out;
    int64_t *off = (int64_t *)malloc((size_t)(G + 1) * sizeof *off);
    if (!off) abort();
    ref_offsets(splits, G, off);
    const int64_t S = off[G];
    uint8_t *rd = out->row_data, *cd = out->col_data;

    if (p->recipe == MOEX_QUANT_TENSOR) {
        double amax;
        const float sc = scaled_set(&q, 0, S, 0, K, rd, cd, &amax);
        if (rd) ((float *)out->row_scales)[0] = sc;
        if (cd) ((float *)out->col_scales)[0] = sc;
        if (out->amax) out->amax[0] = amax;
    } else if (p->recipe == MOEX_QUANT_GROUP) {
        for (int64_t g = 0; g < G; g++) {
            double amax;
            const float sc = scaled_set(&q, off[g], off[g + 1], 0, K, rd, cd, &amax);
            if (rd) ((float *)out->row_scales)[g] = sc;
            if (cd) ((float *)out->col_scales)[g] = sc;
            if (out->amax) out->amax[g] = amax;
        }
    } else {
        const int mx = p->recipe == MOEX_QUANT_MXFP8;
        const int64_t B = ref_quant_block(p->recipe);
        /* rowwise: 1 x B blocks of each row < S */
        if (rd) {
            const int64_t nb = ceil_div(K, B);
            for (int64_t i = 0; i < S; i++)
                for (int64_t j = 0; j < nb; j++) {
                    const int64_t c0 = j * B, c1 = c0 + B < K ? c0 + B : K;
                    if (mx)
                        ((uint8_t *)out->row_scales)[i * nb + j] = mx_set(&q, i, i + 1, c0, c1, rd, NULL);
                    else
                        ((float *)out->row_scales)[i * nb + j] = scaled_set(&q, i, i + 1, c0, c1, rd, NULL, NULL);
                }
        }
        /* columnwise: B x 1 tiles of each group, from its first row; tile j of g is column b_g + j */
        if (cd) {
            const int64_t ncols = ceil_div(T, B) + G;
            int64_t base = 0;
            for (int64_t g = 0; g < G; g++) {
                const int64_t m = off[g + 1] - off[g], tiles = ceil_div(m, B);
                for (int64_t j = 0; j < tiles; j++) {
                    const int64_t r0 = off[g] + j * B, r1 = r0 + B < off[g + 1] ? r0 + B : off[g + 1];
                    for (int64_t k = 0; k < K; k++) {
                        const int64_t at = k * ncols + base + j;
                        if (mx)
                            ((uint8_t *)out->col_scales)[at] = mx_set(&q, r0, r1, k, k + 1, NULL, cd);
                        else
                            ((float *)out->col_scales)[at] = scaled_set(&q, r0, r1, k, k + 1, NULL, cd, NULL);
                    }
                }
                base += tiles;
            }
        }
    }
    free(off);
}

/* ---- dequantize --------------------------------------------------------------------- */

void ref_group_dequantize(const moex_quant_params *p, moex_quant_orientation orientation, int64_t G, int64_t T,
                          int64_t K, const int64_t *splits, const uint8_t *data, const void *scales,
                          moex_dtype ydt, double *y) {
    int64_t *off = (int64_t *)malloc((size_t)(G + 1) * sizeof *off);
    if (!off) abort();
    ref_offsets(splits, G, off);
    const int col = orientation == MOEX_QUANT_COLUMNWISE;
    const int64_t B = ref_quant_block(p->recipe);
    const int64_t nb = B ? ceil_div(K, B) : 0, ncols = B ? ceil_div(T, B) + G : 0;
    int64_t base = 0;   /* b_g of the current group */
    for (int64_t g = 0; g < G; g++) {
        for (int64_t t = off[g]; t < off[g + 1]; t++)
            for (int64_t k = 0; k < K; k++) {
                const uint8_t code = col ? data[k * T + t] : data[t * K + k];
                int64_t at;
                if (p->recipe == MOEX_QUANT_TENSOR)
                    at = 0;
                else if (p->recipe == MOEX_QUANT_GROUP)
                    at = g;
                else if (!col)
                    at = t * nb + k / B;
                else
                    at = k * ncols + base + (t - off[g]) / B;
                const double scale = p->recipe == MOEX_QUANT_MXFP8 ? ref_e8m0_decode(((const uint8_t *)scales)[at])
                                                                   : (double)((const float *)scales)[at];
                /* the f32 product (exact in fp64, then rounded once), then the store's rounding */
                y[t * K + k] = ref_round(ydt, to_f32(ref_fp8_decode(p->fp8, code) * scale));
            }
        if (B) base += ceil_div(off[g + 1] - off[g], B);
    }
    free(off);
}

/* ---- grouped weights (9.7) ------------------------------------------------------------ */

int ref_weight_scales_shape(moex_quant_recipe recipe, int columnwise, int64_t G, int64_t N, int64_t K,
                            int64_t shape[3]) {
    if (recipe == MOEX_QUANT_GROUP) {
        shape[0] = G;
        return 1;
    }
    if (recipe != MOEX_QUANT_BLOCK && recipe != MOEX_QUANT_MXFP8) abort();
    shape[0] = G;
    if (recipe == MOEX_QUANT_BLOCK) {   /* 128x128 blocks: [ceil(N/128), ceil(K/128)], transposed */
        shape[1] = ceil_div(columnwise ? K : N, 128);
        shape[2] = ceil_div(columnwise ? N : K, 128);
    } else {                            /* 1x32 along each copy's own last dimension */
        shape[1] = columnwise ? K : N;
        shape[2] = ceil_div(columnwise ? N : K, 32);
    }
    return 3;
}

int64_t ref_weight_scale_index(moex_quant_recipe recipe, int columnwise, int64_t G, int64_t N, int64_t K, int64_t g,
                               int64_t n, int64_t k) {
    int64_t sh[3];
    if (ref_weight_scales_shape(recipe, columnwise, G, N, K, sh) == 1) return g;
    int64_t r, c;   /* the set's (row, column) in the [sh[1], sh[2]] scale matrix of expert g */
    if (recipe == MOEX_QUANT_BLOCK) {
        r = columnwise ? k / 128 : n / 128;
        c = columnwise ? n / 128 : k / 128;
    } else {
        r = columnwise ? k : n;
        c = columnwise ? n / 32 : k / 32;
    }
    return (g * sh[1] + r) * sh[2] + c;
}

void ref_weight_quantize(const moex_quant_params *p, int64_t G, int64_t N, int64_t K, const double *w,
                         ref_quant_out *out) {
    if (p->recipe != MOEX_QUANT_GROUP && p->recipe != MOEX_QUANT_BLOCK && p->recipe != MOEX_QUANT_MXFP8) abort();
    qrun q;
    q.p = p;
    grid_init(&q.grid, p->fp8);
    q.out = out;
    int64_t rsh[3], csh[3];
    ref_weight_scales_shape(p->recipe, 0, G, N, K, rsh);
    ref_weight_scales_shape(p->recipe, 1, G, N, K, csh);
    for (int64_t g = 0; g < G; g++) {
        /* W_g seen as the [N, K] matrix x of the row helpers: rect_codes writes the rowwise
         * code of (n, k) at row[n K + k] and the columnwise one at col[k N + n] (T = N) */
        q.T = N, q.K = K, q.x = w + g * N * K;
        uint8_t *rd = out->row_data ? out->row_data + g * N * K : NULL;
        uint8_t *cd = out->col_data ? out->col_data + g * K * N : NULL;
        if (p->recipe == MOEX_QUANT_GROUP) {
            double amax;
            const float sc = scaled_set(&q, 0, N, 0, K, rd, cd, &amax);
            if (rd) ((float *)out->row_scales)[g] = sc;
            if (cd) ((float *)out->col_scales)[g] = sc;
            if (out->amax) out->amax[g] = amax;
        } else if (p->recipe == MOEX_QUANT_BLOCK) {
            const int64_t bn = ceil_div(N, 128), bk = ceil_div(K, 128);
            for (int64_t i = 0; i < bn; i++)
                for (int64_t j = 0; j < bk; j++) {
                    const int64_t r0 = 128 * i, r1 = r0 + 128 < N ? r0 + 128 : N;
                    const int64_t c0 = 128 * j, c1 = c0 + 128 < K ? c0 + 128 : K;
                    const float sc = scaled_set(&q, r0, r1, c0, c1, rd, cd, NULL);
                    if (rd) ((float *)out->row_scales)[(g * bn + i) * bk + j] = sc;
                    if (cd) ((float *)out->col_scales)[(g * bk + j) * bn + i] = sc;
                }
        } else {
            const int64_t mk = ceil_div(K, 32), mn = ceil_div(N, 32);
            if (rd)   /* rowwise: 1x32 along K, row n's block j */
                for (int64_t n = 0; n < N; n++)
                    for (int64_t j = 0; j < mk; j++) {
                        const int64_t c0 = 32 * j, c1 = c0 + 32 < K ? c0 + 32 : K;
                        ((uint8_t *)out->row_scales)[(g * N + n) * mk + j] = mx_set(&q, n, n + 1, c0, c1, rd, NULL);
                    }
            if (cd)   /* columnwise: 32x1 along N, column k's block i */
                for (int64_t k = 0; k < K; k++)
                    for (int64_t i = 0; i < mn; i++) {
                        const int64_t r0 = 32 * i, r1 = r0 + 32 < N ? r0 + 32 : N;
                        ((uint8_t *)out->col_scales)[(g * K + k) * mn + i] = mx_set(&q, r0, r1, k, k + 1, NULL, cd);
                    }
        }
    }
}

void ref_weight_dequantize(const moex_quant_params *p, moex_quant_orientation orientation, int64_t G, int64_t N,
                           int64_t K, const uint8_t *data, const void *scales, moex_dtype wdt, double *w) {
    const int col = orientation == MOEX_QUANT_COLUMNWISE;
    double value[256];   /* every code's value, decoded once */
    for (int c = 0; c < 256; c++) value[c] = ref_fp8_decode(p->fp8, (uint8_t)c);
    for (int64_t g = 0; g < G; g++)
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) {
                const uint8_t code = col ? data[(g * K + k) * N + n] : data[(g * N + n) * K + k];
                const int64_t at = ref_weight_scale_index(p->recipe, col, G, N, K, g, n, k);
                const double scale = p->recipe == MOEX_QUANT_MXFP8 ? ref_e8m0_decode(((const uint8_t *)scales)[at])
                                                                   : (double)((const float *)scales)[at];
                w[(g * N + n) * K + k] = ref_round(wdt, to_f32(value[code] * scale));
            }
}

void ref_mx_swizzle(const uint8_t *plain, int64_t ld, int64_t R, int64_t C, uint8_t *out) {
    const int64_t RB = (R + 127) / 128, CB = (C + 3) / 4;
    int64_t at = 0;
    for (int64_t rb = 0; rb < RB; rb++)
        for (int64_t cb = 0; cb < CB; cb++)
            for (int64_t r32 = 0; r32 < 32; r32++)
                for (int64_t r4 = 0; r4 < 4; r4++)
                    for (int64_t c4 = 0; c4 < 4; c4++) {
                        const int64_t r = 128 * rb + 32 * r4 + r32, c = 4 * cb + c4;
                        out[at++] = (r < R && c < C) ? plain[r * ld + c] : 0;
                    }
}
