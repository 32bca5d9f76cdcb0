/*
 * test_quantize.c - moex_group_quantize / moex_group_dequantize (docs/ops.md section 9) on the
 * CPU backend against the reference of tools/ref/ref_quant.h, BIT FOR BIT: the FP8 codes of
 * both copies, the f32 scale bits or E8M0 bytes, amax, and the dequantized values (equal
 * values with equal signs of zero; NaN where the reference has NaN).
 *
 * Coverage:
 *   - the reference itself: known codes of both formats, and its encoder against a brute-force
 *     nearest-of-256-codes search on random, tie and extreme values;
 *   - every recipe (TENSOR, GROUP, BLOCK, MXFP8) x E4M3 / E5M2 x EXACT / POW2 x epsilon 0 /
 *     not 0 x x in f32 / bf16 / f16, over shapes with G = 1, G = 64 (mostly empty), empty
 *     groups (first, middle, last, all), groups of 1 row, K and rows not multiples of 32 or
 *     128 (K = 1, 31, 33, 130, 257, 300) and at tile edges (128, 257 rows), T = 0, and
 *     sum(splits) < T with NaN input tail rows; rowwise only, columnwise only and both
 *     (rotating), amax present when the recipe allows it;
 *   - values: random over 2^-30 .. 2^10 (fp8 subnormals and underflow inside a set), ties
 *     (every fp8 value, every midpoint, the midpoints past max, scaled by 2^k so the scale
 *     is exact and the ties survive), NaN / Inf / -0 / all-zero rows and columns / dtype
 *     subnormals, and extreme sets (amax near FLT_MAX; tiny amax where fp8_max / amax
 *     overflows to FLT_MAX; MX exponents clamped to -127);
 *   - single values through every recipe and parameter set (0, -0, NaN, +-Inf, FLT_MAX,
 *     2^-149, values past max, epsilons 0, 1e-30, 1, 1e30, 1e-40 (subnormal)), and a fixed pattern of NaN, +-Inf
 *     and zeros whose blocks, tiles and groups hold them together and apart;
 *   - larger shapes (700 x 300 here; the GPU test adds 1500 x 520, 2100 x 96 with G = 33,
 *     300 x 4100);
 *   - every output tail poisoned and checked untouched: rowwise rows >= S, columnwise columns
 *     >= S, BLOCK/MXFP8 rowwise scale rows >= S, columnwise scale columns >= b_G; y rows >= S;
 *   - dequantize of both orientations from the library's own copies, and from random bytes
 *     (every code, NaN and Inf codes, E8M0 0 and 0xFF, f32 scales subnormal, 0, negative,
 *     FLT_MAX) into f32 / bf16 / f16 (overflow to Inf);
 *   - bad arguments (dtype, shape, presence, epsilon, recipe, rounding, orientation, splits,
 *     overlapping outputs): each refused with MOEX_ERR_INVALID_ARG and a message naming the
 *     culprit, nothing written; bad split values: MOEX_ERR_BAD_SPLITS, nothing written (CPU);
 *     T = 0 with NULL data pointers accepted, nothing written but TENSOR/GROUP scales.
 * tests/cuda/test_gpu_quantize.c runs this file on the GPU (TQ_GPU 1).
 */
#include "ref_quant.h"
#include "test_quant.h"
#include "test_util.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef TQ_GPU
#define TQ_GPU 0
#endif

static moex_context *ctx;
static int n_cases, n_mismatch_reports;

/* ---- the reference checked on its own ------------------------------------------------- */

/* Which of two values is nearer to v: -1 qa, 1 qb, 0 a tie; decided against their midpoint,
 * which is exact in fp64 for fp8 values (a difference |q - v| would round for a large v). */
static int nearer(double v, double qa, double qb) {
    const double mid = 0.5 * (qa + qb);
    if (qa == qb) return 0;
    if (qa < qb) return v < mid ? -1 : v > mid ? 1 : 0;
    return v > mid ? -1 : v < mid ? 1 : 0;
}

/* The nearest code by looking at all 256: same sign bit as v, finite value, nearest, ties to
 * the even code; NaN 0x7F. Independent of the reference's search. */
static uint8_t brute_encode(moex_dtype fmt, double v) {
    if (v != v) return 0x7F;
    int best = -1;
    for (int c = 0; c < 256; c++) {
        double q = ref_fp8_decode(fmt, (uint8_t)c);
        if (!isfinite(q)) continue;
        if (((c & 0x80) != 0) != (signbit(v) != 0)) continue;
        if (best < 0) {
            best = c;
            continue;
        }
        const int n = nearer(v, q, ref_fp8_decode(fmt, (uint8_t)best));
        if (n < 0 || (n == 0 && (c & 1) == 0)) best = c;
    }
    return (uint8_t)best;
}

static void check_reference(tu_rng *r) {
    const moex_dtype E4 = MOEX_DTYPE_E4M3, E5 = MOEX_DTYPE_E5M2;
    /* decoded values */
    CHECK(ref_fp8_decode(E4, 0x7E) == 448.0 && ref_fp8_decode(E4, 0xFE) == -448.0);
    CHECK(isnan(ref_fp8_decode(E4, 0x7F)) && isnan(ref_fp8_decode(E4, 0xFF)));
    CHECK(ref_fp8_decode(E4, 0x01) == ldexp(1, -9) && ref_fp8_decode(E4, 0x08) == ldexp(1, -6));
    CHECK(ref_fp8_decode(E4, 0x78) == 256.0 && ref_fp8_decode(E4, 0x38) == 1.0);
    CHECK(ref_fp8_decode(E5, 0x7B) == 57344.0 && isinf(ref_fp8_decode(E5, 0x7C)));
    CHECK(isnan(ref_fp8_decode(E5, 0x7F)) && isinf(ref_fp8_decode(E5, 0xFC)) && ref_fp8_decode(E5, 0xFC) < 0);
    CHECK(ref_fp8_decode(E5, 0x01) == ldexp(1, -16) && ref_fp8_decode(E5, 0x04) == ldexp(1, -14));
    CHECK(ref_fp8_decode(E5, 0x3C) == 1.0);
    CHECK(ref_fp8_decode(E4, 0x80) == 0.0 && signbit(ref_fp8_decode(E4, 0x80)));
    /* known codes */
    struct { moex_dtype f; double v; uint8_t code; } kc[] = {
        {E4, 448, 0x7E}, {E4, 464, 0x7E}, {E4, 470, 0x7E}, {E4, 480, 0x7E}, {E4, 1e30, 0x7E},
        {E4, INFINITY, 0x7E}, {E4, -INFINITY, 0xFE}, {E4, NAN, 0x7F}, {E4, -NAN, 0x7F}, {E4, 0.0, 0x00},
        {E4, -0.0, 0x80}, {E4, 0x1p-9, 0x01}, {E4, 0x1p-10, 0x00}, {E4, -0x1p-10, 0x80}, {E4, 0x1.0001p-10, 0x01},
        {E4, 3 * 0x1p-10, 0x02}, {E4, 5 * 0x1p-10, 0x02}, {E4, 7 * 0x1p-10, 0x04}, {E4, 1.0625, 0x38},
        {E4, 1.1875, 0x3A}, {E4, -1.1875, 0xBA}, {E4, 432, 0x7E}, {E4, 416, 0x7D}, {E4, 400, 0x7C}, {E4, 1e-30, 0x00},
        {E4, 15 * 0x1p-10, 0x08}, {E4, 0x1.ep-7, 0x08}, {E5, 57344, 0x7B}, {E5, 61440, 0x7B}, {E5, 65536, 0x7B},
        {E5, INFINITY, 0x7B}, {E5, -INFINITY, 0xFB}, {E5, NAN, 0x7F}, {E5, -0.0, 0x80}, {E5, 0x1p-16, 0x01},
        {E5, 0x1p-17, 0x00}, {E5, 3 * 0x1p-17, 0x02}, {E5, 1.125, 0x3C}, {E5, 1.375, 0x3E}, {E5, 53248, 0x7A},
    };
    for (size_t i = 0; i < sizeof kc / sizeof kc[0]; i++) {
        uint8_t got = ref_fp8_encode(kc[i].f, kc[i].v);
        CHECK_MSG(got == kc[i].code, "reference: %s encode(%a) = 0x%02X, want 0x%02X", moex_dtype_name(kc[i].f),
                  kc[i].v, got, kc[i].code);
    }
    /* the reference's search against the brute force */
    for (int f = 0; f < 2; f++) {
        const moex_dtype fmt = f ? E5 : E4;
        int bad = 0;
        for (int i = 0; i < 40000; i++) {
            double v;
            const int kind = (int)tu_randint(r, 5);
            if (kind == 0) {   /* every code and midpoint, scaled by nothing */
                uint8_t c = (uint8_t)tu_randint(r, 256);
                double a = ref_fp8_decode(fmt, c), b = ref_fp8_decode(fmt, (uint8_t)(c + 1));
                v = tu_randint(r, 2) ? a : 0.5 * (a + b);
            } else if (kind == 1) {
                v = (double)(float)(tu_uniform_range(r, -1, 1) * ldexp(1.0, (int)tu_randint(r, 40) - 22));
            } else if (kind == 2) {
                v = tu_uniform_range(r, -2, 2) * ref_fp8_max(fmt);
            } else if (kind == 3) {
                v = ldexp(tu_uniform_range(r, -1, 1), -(int)tu_randint(r, 30));
            } else {
                static const double sp[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, FLT_MAX, -FLT_MAX, 0x1p-149};
                v = sp[tu_randint(r, 8)];
            }
            uint8_t a = ref_fp8_encode(fmt, v), b = brute_encode(fmt, v);
            if (a != b && bad++ < 5) printf("reference: %s encode(%a) = 0x%02X, brute force 0x%02X\n",
                                            moex_dtype_name(fmt), v, a, b);
        }
        CHECK_MSG(bad == 0, "reference encoder %s: %d disagreements with the brute force", moex_dtype_name(fmt), bad);
    }
    /* the scale rule */
    moex_quant_params p = {.recipe = MOEX_QUANT_TENSOR, .fp8 = E4, .amax_epsilon = 0.0f, .rounding = MOEX_SCALE_EXACT,
                           .scale_layout = MOEX_SCALES_PLAIN};
    CHECK(ref_quant_factor(&p, 448.0) == 1.0 && ref_quant_factor(&p, 0.0) == 1.0);
    CHECK(ref_quant_factor(&p, NAN) == 1.0 && ref_quant_factor(&p, INFINITY) == 1.0);
    CHECK(ref_quant_factor(&p, 0x1p-149) == FLT_MAX);
    CHECK(ref_quant_factor(&p, 3.0) == (double)(448.0f / 3.0f));
    p.rounding = MOEX_SCALE_POW2;
    CHECK(ref_quant_factor(&p, 3.0) == 128.0 && ref_quant_factor(&p, 0x1p-149) == 0x1p127);
    p.amax_epsilon = 7.0f;
    CHECK(ref_quant_factor(&p, 3.0) == 64.0 && ref_quant_factor(&p, NAN) == 1.0 && ref_quant_factor(&p, 0) == 64.0);
    CHECK(ref_mx_exponent(E4, 448) == 0 && ref_mx_exponent(E4, 512) == 1 && ref_mx_exponent(E4, 0) == -127);
    CHECK(ref_mx_exponent(E5, 57344) == 0 && ref_mx_exponent(E4, INFINITY) == 127);
    CHECK(ref_mx_exponent(E4, 0x1p-149) == -127 && ref_mx_exponent(E4, 0x1p-119) == -127);
    CHECK(ref_mx_exponent(E4, 0x1p-118) == -126);
    CHECK(ref_e8m0_decode(127) == 1.0 && ref_e8m0_decode(0) == 0x1p-127 && isnan(ref_e8m0_decode(0xFF)));
}

/* ---- one case ----------------------------------------------------------------------- */

typedef struct qcase {
    moex_dtype dt, ydt;         /* x; dequantize's y                                    */
    moex_quant_params p;
    int row, col, amax, dbias;  /* which outputs                                        */
    int64_t G, T, K;
    const int64_t *splits;
    const double *x;            /* [T, K]; rows < S exact in dt                           */
    const char *what;
} qcase;

typedef struct qlayout {
    int64_t S, B;
    int64_t *off;               /* G + 1 */
    int64_t rs_shape[2], cs_shape[2];
    int rs_ndim, cs_ndim;
    int64_t n_rs, n_cs, n_amax; /* elements */
    moex_dtype sdt;             /* scale dtype */
    size_t ses;                 /* its size */
    int64_t bG;                 /* columnwise tile columns written (BLOCK/MXFP8) */
} qlayout;

static qlayout layout_of(const moex_quant_params *p, int64_t G, int64_t T, int64_t K, const int64_t *splits) {
    qlayout L;
    memset(&L, 0, sizeof L);
    L.off = (int64_t *)tu_alloc((size_t)(G + 1) * sizeof(int64_t));
    L.S = ref_offsets(splits, G, L.off);
    L.B = ref_quant_block(p->recipe);
    L.rs_ndim = ref_quant_scales_shape(p->recipe, 0, G, T, K, L.rs_shape);
    L.cs_ndim = ref_quant_scales_shape(p->recipe, 1, G, T, K, L.cs_shape);
    L.n_rs = L.rs_shape[0] * (L.rs_ndim == 2 ? L.rs_shape[1] : 1);
    L.n_cs = L.cs_shape[0] * (L.cs_ndim == 2 ? L.cs_shape[1] : 1);
    L.n_amax = p->recipe == MOEX_QUANT_TENSOR ? 1 : p->recipe == MOEX_QUANT_GROUP ? G : 0;
    L.sdt = p->recipe == MOEX_QUANT_MXFP8 ? MOEX_DTYPE_E8M0 : MOEX_DTYPE_F32;
    L.ses = p->recipe == MOEX_QUANT_MXFP8 ? 1 : 4;
    L.bG = L.B ? ref_quant_tile_base(splits, G, L.B) : 0;
    return L;
}

static moex_tensor scales_tensor(void *buf, moex_dtype sdt, int ndim, const int64_t *shape) {
    return ndim == 1 ? moex_tensor_1d(buf, sdt, shape[0]) : moex_tensor_2d(buf, sdt, shape[0], shape[1]);
}

static int64_t group_of(const qlayout *L, int64_t G, int64_t t) {
    int64_t g = 0;
    while (g + 1 < G && L->off[g + 1] <= t) g++;
    return g;
}

/* Index into the scales of the set of element (t, k) in one orientation. */
static int64_t scale_index(const moex_quant_params *p, const qlayout *L, int col, int64_t G, int64_t t, int64_t k) {
    const int64_t g = group_of(L, G, t);
    if (p->recipe == MOEX_QUANT_TENSOR) return 0;
    if (p->recipe == MOEX_QUANT_GROUP) return g;
    if (!col) return t * L->rs_shape[1] + k / L->B;
    int64_t bg = 0;   /* b_g */
    for (int64_t h = 0; h < g; h++) bg += (L->off[h + 1] - L->off[h] + L->B - 1) / L->B;
    return k * L->cs_shape[1] + bg + (t - L->off[g]) / L->B;
}

/* Compares the codes of one copy ([rows, cols] bytes: rowwise [T, K], columnwise [K, T]) in
 * the written region (rows < S, or columns < S). */
static void compare_codes(const qcase *c, const qlayout *L, const char *label, int col, const uint8_t *got,
                          const uint8_t *want, const void *gs, const void *ws) {
    const int64_t T = c->T, K = c->K;
    int64_t bad = 0;
    for (int64_t t = 0; t < L->S; t++)
        for (int64_t k = 0; k < K; k++) {
            const int64_t i = col ? k * T + t : t * K + k;
            if (got[i] == want[i]) continue;
            if (bad++ < 3 && n_mismatch_reports++ < 200) {
                int64_t si = scale_index(&c->p, L, col, c->G, t, k);
                printf("  MISMATCH %s %s data[%lld, %lld] (x[%lld, %lld] = %a): want 0x%02X (%g), got 0x%02X (%g); "
                       "scale want %a, got %a\n",
                       label, col ? "columnwise" : "rowwise", (long long)(col ? k : t), (long long)(col ? t : k),
                       (long long)t, (long long)k, c->x[t * K + k], want[i], ref_fp8_decode(c->p.fp8, want[i]), got[i],
                       ref_fp8_decode(c->p.fp8, got[i]), scale_value(L->sdt, ws, si), scale_value(L->sdt, gs, si));
            }
        }
    CHECK_MSG(bad == 0, "%s: %s data: %lld codes differ from the reference", label, col ? "columnwise" : "rowwise",
              (long long)bad);
}

/* Compares scales: elements listed by (index) over [n] where `written(i)` (the region). */
static void compare_scales(const qcase *c, const qlayout *L, const char *label, int col, const void *got,
                           const void *want) {
    const int64_t n = col ? L->n_cs : L->n_rs;
    const int64_t *shape = col ? L->cs_shape : L->rs_shape;
    const int ndim = col ? L->cs_ndim : L->rs_ndim;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        int written = 1;
        if (ndim == 2) {
            const int64_t r = i / shape[1], j = i % shape[1];
            written = col ? j < L->bG : r < L->S;
        }
        int same;
        if (!written) {
            /* must still be poison */
            same = memcmp((const char *)got + i * L->ses, (const char *)want + i * L->ses, L->ses) == 0;
        } else if (L->ses == 1) {
            same = ((const uint8_t *)got)[i] == ((const uint8_t *)want)[i];
        } else {
            same = bits_of_f32(((const float *)got)[i]) == bits_of_f32(((const float *)want)[i]);
        }
        if (same) continue;
        if (bad++ < 3 && n_mismatch_reports++ < 200) {
            if (L->ses == 1)
                printf("  MISMATCH %s %s scales[%lld]%s: want 0x%02X, got 0x%02X\n", label,
                       col ? "columnwise" : "rowwise", (long long)i, written ? "" : " (tail)",
                       ((const uint8_t *)want)[i], ((const uint8_t *)got)[i]);
            else
                printf("  MISMATCH %s %s scales[%lld]%s: want %a (0x%08X), got %a (0x%08X)\n", label,
                       col ? "columnwise" : "rowwise", (long long)i, written ? "" : " (tail)",
                       (double)((const float *)want)[i], bits_of_f32(((const float *)want)[i]),
                       (double)((const float *)got)[i], bits_of_f32(((const float *)got)[i]));
        }
    }
    CHECK_MSG(bad == 0, "%s: %s scales: %lld elements differ from the reference", label,
              col ? "columnwise" : "rowwise", (long long)bad);
}

/* Tail checks on the library's buffers alone (docs/ops.md 9.4: what is not written). */
static void check_tails(const qcase *c, const qlayout *L, const char *label, const uint8_t *rd, const void *rs,
                        const uint8_t *cd, const void *cs) {
    const int64_t T = c->T, K = c->K, S = L->S;
    if (rd) {
        CHECK_MSG(tu_first_unpoisoned(rd + S * K, (size_t)((T - S) * K)) < 0, "%s: rowwise data rows >= S written",
                  label);
        if (L->rs_ndim == 2)
            CHECK_MSG(tu_first_unpoisoned((const char *)rs + (size_t)(S * L->rs_shape[1]) * L->ses,
                                          (size_t)((T - S) * L->rs_shape[1]) * L->ses) < 0,
                      "%s: rowwise scales rows >= S written", label);
    }
    if (cd) {
        int bad = 0;
        for (int64_t k = 0; k < K; k++) bad |= tu_first_unpoisoned(cd + k * T + S, (size_t)(T - S)) >= 0;
        CHECK_MSG(!bad, "%s: columnwise data columns >= S written", label);
        if (L->cs_ndim == 2) {
            bad = 0;
            const int64_t nc = L->cs_shape[1];
            for (int64_t k = 0; k < K; k++)
                bad |= tu_first_unpoisoned((const char *)cs + (size_t)(k * nc + L->bG) * L->ses,
                                           (size_t)(nc - L->bG) * L->ses) >= 0;
            CHECK_MSG(!bad, "%s: columnwise scale columns >= b_G (%lld of %lld) written", label, (long long)L->bG,
                      (long long)nc);
        }
    }
}

/* dbias [G, K] against the fp64 column sums of each group's rows, under the tolerance
 * model of an f32 sum of m_g terms (tools/ref/ref.h, bound sum |x|); a non-finite sum must
 * come out the same non-finite value; sums whose f32 partials can overflow (bound past
 * FLT_MAX, the extreme flavour) are not compared. */
static void check_dbias(const qcase *c, const qlayout *L, const char *label, const float *got) {
    int64_t bad = 0;
    for (int64_t g = 0; g < c->G; g++) {
        const ref_tol_model m = ref_tol_for(MOEX_DTYPE_F32, MOEX_DTYPE_F32, 0, L->off[g + 1] - L->off[g]);
        for (int64_t k = 0; k < c->K; k++) {
            double sum = 0.0, bound = 0.0;
            for (int64_t t = L->off[g]; t < L->off[g + 1]; t++) sum += c->x[t * c->K + k], bound += fabs(c->x[t * c->K + k]);
            const double v = (double)got[g * c->K + k];
            if (isfinite(bound) && bound > FLT_MAX) continue;
            const int ok = isfinite(sum) || sum != sum ? (sum != sum ? v != v : fabs(v - sum) <= ref_tol(&m, sum, bound))
                                                       : same_value(v, sum);
            if (!ok && bad++ < 3)
                printf("  MISMATCH %s dbias[%lld, %lld]: want %a, got %a\n", label, (long long)g, (long long)k, sum, v);
        }
    }
    CHECK_MSG(bad == 0, "%s: dbias: %lld values off the reference", label, (long long)bad);
}

/* Dequantizes (data, scales) of one orientation with the library and the reference and
 * compares rows < S exactly; rows >= S of y stay poison. */
/* y (poisoned first, c->ydt [T, K]) = moex_group_dequantize of one copy of case c with params p. */
static moex_status dequant_into(const qcase *c, const moex_quant_params *p, moex_quant_orientation o,
                                const uint8_t *data, moex_tensor scales, void *y) {
    const int64_t T = c->T, K = c->K;
    const int col = o == MOEX_QUANT_COLUMNWISE;
    moex_group_dequantize_args a;
    memset(&a, 0, sizeof a);
    a.params = *p;
    a.orientation = o;
    a.src.data = col ? moex_tensor_2d((void *)data, p->fp8, K, T) : moex_tensor_2d((void *)data, p->fp8, T, K);
    a.src.scales = scales;
    a.splits = moex_tensor_1d((void *)c->splits, MOEX_DTYPE_I64, c->G);
    a.y = moex_tensor_2d(y, c->ydt, T, K);
    size_t bytes = 0;
    moex_status st = moex_group_dequantize_workspace_size(ctx, &a, &bytes);
    CHECK_STATUS(ctx, st, MOEX_OK);
    void *ws = tu_workspace(bytes);
    if (st == MOEX_OK) {
        st = moex_group_dequantize(ctx, &a, ws, bytes, NULL);
        CHECK_STATUS(ctx, st, MOEX_OK);
    }
    free(ws);
    return st;
}

static void check_dequantize(const qcase *c, const qlayout *L, const char *label, moex_quant_orientation o,
                             const uint8_t *data, const void *scales) {
    const int64_t T = c->T, K = c->K, S = L->S;
    const int col = o == MOEX_QUANT_COLUMNWISE;
    void *y = tu_poisoned(c->ydt, T * K);
    const moex_tensor st_scales =
        scales_tensor((void *)scales, L->sdt, col ? L->cs_ndim : L->rs_ndim, col ? L->cs_shape : L->rs_shape);
    if (dequant_into(c, &c->p, o, data, st_scales, y) == MOEX_OK) {
        double *want = tu_doubles(T * K);
        ref_group_dequantize(&c->p, o, c->G, T, K, c->splits, data, scales, c->ydt, want);
        int64_t bad = 0;
        for (int64_t i = 0; i < S * K; i++) {
            const double g = ref_load(c->ydt, y, i);
            if (same_value(g, want[i])) continue;
            if (bad++ < 3 && n_mismatch_reports++ < 200) {
                const int64_t t = i / K, k = i % K;
                const int64_t di = col ? k * T + t : t * K + k, si = scale_index(&c->p, L, col, c->G, t, k);
                printf("  MISMATCH %s dequantize %s -> %s y[%lld, %lld]: code 0x%02X (%g), scale %a: want %a, got %a\n",
                       label, col ? "columnwise" : "rowwise", moex_dtype_name(c->ydt), (long long)t, (long long)k,
                       data[di], ref_fp8_decode(c->p.fp8, data[di]), scale_value(L->sdt, scales, si), want[i], g);
            }
        }
        CHECK_MSG(bad == 0, "%s: dequantize %s -> %s: %lld values differ from the reference", label,
                  col ? "columnwise" : "rowwise", moex_dtype_name(c->ydt), (long long)bad);
        CHECK_MSG(tu_first_unpoisoned((const char *)y + (size_t)(S * K) * moex_dtype_size(c->ydt),
                                      (size_t)((T - S) * K) * moex_dtype_size(c->ydt)) < 0,
                  "%s: dequantize %s: y rows >= S written", label, col ? "columnwise" : "rowwise");
        free(want);
    }
    free(y);
}

/* moex_group_quantize with a workspace of the size it asks for; both statuses checked. */
static moex_status quantize_call(const moex_group_quantize_args *a) {
    size_t bytes = 0;
    moex_status st = moex_group_quantize_workspace_size(ctx, a, &bytes);
    CHECK_STATUS(ctx, st, MOEX_OK);
    void *ws = tu_workspace(bytes);
    if (st == MOEX_OK) {
        st = moex_group_quantize(ctx, a, ws, bytes, NULL);
        CHECK_STATUS(ctx, st, MOEX_OK);
    }
    free(ws);
    return st;
}

/* ---- the swizzled MXFP8 scale layout (docs/ops.md 9.8) ------------------------------- */

/* out (len bytes) = the plain reference scales of one copy placed per group by
 * ref_mx_swizzle: group g's [m_g, ceil(K/32)] rows (rowwise) or [K, ceil(m_g/32)] columns from
 * b_g (columnwise), at q_g 128-row tiles; the rest 0. */
static void swizzle_groups(const qcase *c, const qlayout *L, int col, const uint8_t *plain, uint8_t *out,
                           int64_t len) {
    const int64_t K = c->K, rb = (K + 31) / 32;
    memset(out, 0, (size_t)len);
    int64_t q = 0, b = 0;
    for (int64_t g = 0; g < c->G; g++) {
        const int64_t m = L->off[g + 1] - L->off[g];
        if (!col) ref_mx_swizzle(plain + L->off[g] * rb, rb, m, rb, out + q * 128 * (4 * ((rb + 3) / 4)));
        else ref_mx_swizzle(plain + b, L->cs_shape[1], K, (m + 31) / 32, out + q * 4 * (128 * ((K + 127) / 128)));
        q += (m + 127) / 128, b += (m + 31) / 32;
    }
}

/* An MXFP8 case again with MOEX_SCALES_MX_SWIZZLED: the data bytes are the plain call's (rd,
 * cd), every byte of the scale vectors is the reference's (wrs, wcs) swizzled, and
 * dequantizing from them gives the bytes of dequantizing the plain copies (rs, cs). */
static void check_swizzled(const qcase *c, const qlayout *L, const char *label, const moex_group_quantize_args *plain,
                           const uint8_t *rd, const uint8_t *cd, const void *rs, const void *cs, const uint8_t *wrs,
                           const uint8_t *wcs) {
    const int64_t T = c->T, K = c->K, tiles = (T + 127) / 128 + c->G;
    const int64_t len[2] = {tiles * 128 * 4 * (((K + 31) / 32 + 3) / 4), tiles * 4 * 128 * ((K + 127) / 128)};
    const uint8_t *data[2] = {rd, cd}, *want_plain[2] = {wrs, wcs};
    const void *plain_scales[2] = {rs, cs};
    moex_group_quantize_args a = *plain;
    a.params.scale_layout = MOEX_SCALES_MX_SWIZZLED;
    memset(&a.dbias, 0, sizeof a.dbias);
    moex_quant_tensor *copy[2] = {&a.rowwise, &a.columnwise};
    uint8_t *got[2] = {NULL, NULL}, *sc[2] = {NULL, NULL};
    for (int o = 0; o < 2; o++)
        if (data[o]) {
            got[o] = (uint8_t *)tu_poisoned(c->p.fp8, T * K), sc[o] = (uint8_t *)tu_poisoned(MOEX_DTYPE_E8M0, len[o]);
            copy[o]->data.data = got[o];
            copy[o]->scales = moex_tensor_1d(sc[o], MOEX_DTYPE_E8M0, len[o]);
        }
    const moex_status st = quantize_call(&a);
    for (int o = 0; o < 2 && st == MOEX_OK; o++) {
        if (!data[o]) continue;
        const char *name = o ? "columnwise" : "rowwise";
        CHECK_MSG(memcmp(got[o], data[o], (size_t)(T * K)) == 0, "%s: swizzled: %s data differs from the plain call's",
                  label, name);
        uint8_t *want = (uint8_t *)tu_alloc((size_t)len[o]);
        swizzle_groups(c, L, o, want_plain[o], want, len[o]);
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < len[o]; i++)
            if (sc[o][i] != want[i] && bad++ == 0) first = i;
        if (bad)
            printf("  MISMATCH %s swizzled %s scales[%lld]: want 0x%02X, got 0x%02X\n", label, name, (long long)first,
                   want[first], sc[o][first]);
        CHECK_MSG(bad == 0, "%s: swizzled %s scales: %lld of %lld bytes differ from the reference", label, name,
                  (long long)bad, (long long)len[o]);
        void *y0 = tu_poisoned(c->ydt, T * K), *y1 = tu_poisoned(c->ydt, T * K);
        const qlayout *l = L;
        const moex_tensor plain_t = scales_tensor((void *)plain_scales[o], l->sdt, o ? l->cs_ndim : l->rs_ndim,
                                                  o ? l->cs_shape : l->rs_shape);
        if (dequant_into(c, &c->p, (moex_quant_orientation)o, data[o], plain_t, y0) == MOEX_OK &&
            dequant_into(c, &a.params, (moex_quant_orientation)o, got[o], copy[o]->scales, y1) == MOEX_OK)
            CHECK_MSG(memcmp(y0, y1, (size_t)(T * K) * moex_dtype_size(c->ydt)) == 0,
                      "%s: dequantize from the swizzled %s scales differs from the plain ones'", label, name);
        free(want), free(y0), free(y1);
    }
    for (int o = 0; o < 2; o++) free(got[o]), free(sc[o]);
}

static void run_case(const qcase *c) {
    const int64_t G = c->G, T = c->T, K = c->K;
    qlayout L = layout_of(&c->p, G, T, K, c->splits);
    const int64_t S = L.S;
    char label[320];
    snprintf(label, sizeof label, "[%s %s %s %s eps=%g %s%s%s%s G=%lld T=%lld K=%lld S=%lld %s]", moex_dtype_name(c->dt),
             recipe_name(c->p.recipe), moex_dtype_name(c->p.fp8), c->p.rounding == MOEX_SCALE_POW2 ? "POW2" : "EXACT",
             (double)c->p.amax_epsilon, c->row ? "row" : "", c->col ? "+col" : "", c->amax ? "+amax" : "",
             c->dbias ? "+dbias" : "",
             (long long)G, (long long)T, (long long)K, (long long)S, c->what);
    tu_log("case %s\n", label);
    const int failures_before = tu_failures();
    n_cases++;

    void *xb = tu_buffer_rows(c->dt, c->x, S, T, K);   /* rows >= S: NaN */
    int64_t *splits = (int64_t *)tu_alloc((size_t)G * sizeof(int64_t));
    memcpy(splits, c->splits, (size_t)G * sizeof(int64_t));
    uint8_t *rd = NULL, *cd = NULL, *wrd = NULL, *wcd = NULL;
    void *rs = NULL, *cs = NULL, *wrs = NULL, *wcs = NULL;
    float *am = NULL;
    double *wam = NULL;
    moex_group_quantize_args a;
    memset(&a, 0, sizeof a);
    a.x = moex_tensor_2d(xb, c->dt, T, K);
    a.splits = moex_tensor_1d(splits, MOEX_DTYPE_I64, G);
    a.params = c->p;
    ref_quant_out ro;
    memset(&ro, 0, sizeof ro);
    if (c->row) {
        rd = (uint8_t *)tu_poisoned(c->p.fp8, T * K), rs = tu_poisoned(L.sdt, L.n_rs);
        wrd = (uint8_t *)tu_poisoned(c->p.fp8, T * K), wrs = tu_poisoned(L.sdt, L.n_rs);
        a.rowwise.data = moex_tensor_2d(rd, c->p.fp8, T, K);
        a.rowwise.scales = scales_tensor(rs, L.sdt, L.rs_ndim, L.rs_shape);
        ro.row_data = wrd, ro.row_scales = wrs;
    }
    if (c->col) {
        cd = (uint8_t *)tu_poisoned(c->p.fp8, K * T), cs = tu_poisoned(L.sdt, L.n_cs);
        wcd = (uint8_t *)tu_poisoned(c->p.fp8, K * T), wcs = tu_poisoned(L.sdt, L.n_cs);
        a.columnwise.data = moex_tensor_2d(cd, c->p.fp8, K, T);
        a.columnwise.scales = scales_tensor(cs, L.sdt, L.cs_ndim, L.cs_shape);
        ro.col_data = wcd, ro.col_scales = wcs;
    }
    float *db = NULL;
    if (c->dbias) {
        db = (float *)tu_poisoned(MOEX_DTYPE_F32, G * K);
        a.dbias = moex_tensor_2d(db, MOEX_DTYPE_F32, G, K);
    }
    if (c->amax && L.n_amax) {
        am = (float *)tu_poisoned(MOEX_DTYPE_F32, L.n_amax);
        wam = tu_doubles(L.n_amax);
        a.amax = moex_tensor_1d(am, MOEX_DTYPE_F32, L.n_amax);
        ro.amax = wam;
    }

    const moex_status st = quantize_call(&a);
    if (st == MOEX_OK) {
        ref_group_quantize(&c->p, G, T, K, c->splits, c->x, &ro);
        if (c->row) {
            compare_codes(c, &L, label, 0, rd, wrd, rs, wrs);
            compare_scales(c, &L, label, 0, rs, wrs);
        }
        if (c->col) {
            compare_codes(c, &L, label, 1, cd, wcd, cs, wcs);
            compare_scales(c, &L, label, 1, cs, wcs);
        }
        check_tails(c, &L, label, rd, rs, cd, cs);
        if (am) {
            int64_t bad = 0;
            for (int64_t g = 0; g < L.n_amax; g++) {
                const double got = (double)am[g];
                if (same_value(got, wam[g]) && (got != got || bits_of_f32(am[g]) == bits_of_f32((float)wam[g])))
                    continue;
                if (bad++ < 3)
                    printf("  MISMATCH %s amax[%lld]: want %a, got %a\n", label, (long long)g, wam[g], got);
            }
            CHECK_MSG(bad == 0, "%s: amax: %lld values differ from the reference", label, (long long)bad);
        }
        if (db) check_dbias(c, &L, label, db);
        if (c->row) check_dequantize(c, &L, label, MOEX_QUANT_ROWWISE, rd, rs);
        if (c->col) check_dequantize(c, &L, label, MOEX_QUANT_COLUMNWISE, cd, cs);
        if (c->p.recipe == MOEX_QUANT_MXFP8)
            check_swizzled(c, &L, label, &a, rd, cd, rs, cs, (const uint8_t *)wrs, (const uint8_t *)wcs);
    }
    if (tu_failures() != failures_before) printf("  (failures above: case %s)\n", label);
    free(xb), free(splits), free(rd), free(rs), free(cd), free(cs), free(wrd), free(wrs), free(wcd), free(wcs);
    free(am), free(wam), free(db), free(L.off);
}

/* ---- inputs ----------------------------------------------------------------------- */

typedef enum flavor { FL_NORMAL, FL_TIES, FL_SPECIAL, FL_EXTREME, FL_NUM } flavor;
static const char *flavor_names[FL_NUM] = {"normal", "ties", "special", "extreme"};

/* x [T, K]: rows < S from the flavour (exact in dt), the rest 0 (the buffer poisons them). */
static void make_x(tu_rng *r, flavor fl, moex_dtype dt, moex_dtype fmt, int64_t G, int64_t T, int64_t K,
                   const int64_t *off, double *x, int *kk_out) {
    const int64_t S = off[G];
    memset(x, 0, (size_t)(T * K) * sizeof(double));
    if (fl == FL_NORMAL || fl == FL_SPECIAL) {
        int *er = (int *)tu_alloc((size_t)(T + 1) * sizeof(int)), *ec = (int *)tu_alloc((size_t)(K / 32 + 1) * sizeof(int));
        for (int64_t i = 0; i < T; i++) er[i] = (int)tu_randint(r, 11) - 5;
        for (int64_t j = 0; j <= K / 32; j++) ec[j] = (int)tu_randint(r, 11) - 5;
        for (int64_t i = 0; i < S; i++)
            for (int64_t k = 0; k < K; k++) {
                double v = tu_uniform_range(r, -1, 1) * ldexp(1.0, er[i] + ec[k / 32]);
                if (tu_randint(r, 8) == 0) v = ldexp(v, -(int)tu_randint(r, 21));
                x[i * K + k] = ref_round(dt, v);
            }
        free(er), free(ec);
    }
    if (fl == FL_SPECIAL) {
        for (int64_t i = 0; i < S; i++)
            if (tu_randint(r, 10) == 0)
                for (int64_t k = 0; k < K; k++) x[i * K + k] = tu_randint(r, 2) ? 0.0 : -0.0;
        for (int64_t k = 0; k < K; k++)
            if (tu_randint(r, 10) == 0)
                for (int64_t i = 0; i < S; i++) x[i * K + k] = tu_randint(r, 2) ? 0.0 : -0.0;
        for (int64_t i = 0; i < S; i++)
            for (int64_t k = 0; k < K; k++) {
                double *v = &x[i * K + k];
                const int64_t u = tu_randint(r, 100);
                if (i % 7 == 3 && u == 0) *v = NAN;
                else if (i % 7 == 5 && u == 1) *v = INFINITY;
                else if (i % 7 == 5 && u == 2) *v = -INFINITY;
                else if (u < 5) *v = tu_randint(r, 2) ? 0.0 : -0.0;
                else if (u < 9) *v = (tu_randint(r, 2) ? 1 : -1) * dt_subnormal(r, dt);
            }
    }
    if (fl == FL_TIES) {
        double tv[512];
        const int n = tie_values(fmt, tv);
        int lo = -20, hi = 20;
        if (dt == MOEX_DTYPE_F16) {
            lo = fmt == MOEX_DTYPE_E4M3 ? -8 : -7;
            hi = fmt == MOEX_DTYPE_E4M3 ? 6 : -1;   /* 4 max 2^kk stays finite in f16 */
        }
        const int kk = lo + (int)tu_randint(r, hi - lo + 1);
        *kk_out = kk;
        const double mx = ref_fp8_max(fmt);
        for (int64_t g = 0; g < G; g++)
            for (int64_t i = off[g]; i < off[g + 1]; i++)
                for (int64_t k = 0; k < K; k++) {
                    const double sgn = tu_randint(r, 2) ? 1.0 : -1.0;
                    /* every 1x32 row block and every 32x1 tile of a group holds +-max 2^kk */
                    double v = ((i - off[g]) % 32 == 0 || k % 32 == 0) ? mx : tv[tu_randint(r, n)];
                    x[i * K + k] = ref_round(dt, sgn * ldexp(v, kk));
                }
    }
    if (fl == FL_EXTREME) {
        const int64_t shift = tu_randint(r, 3);
        for (int64_t g = 0; g < G; g++) {
            const int cls = (int)((g + shift) % 3);
            for (int64_t i = off[g]; i < off[g + 1]; i++)
                for (int64_t k = 0; k < K; k++) {
                    double v;
                    const double u = tu_uniform_range(r, -1, 1);
                    if (cls == 0) {   /* tiny: fp8_max / amax overflows f32 (f32, bf16) */
                        v = dt == MOEX_DTYPE_F16 ? ldexp(u, -14 - (int)tu_randint(r, 11))
                                                 : ldexp(u, -120 - (int)tu_randint(r, 30));
                    } else if (cls == 1) {   /* huge: near the dtype's max */
                        v = dt == MOEX_DTYPE_F16 ? ldexp(u, 16 - (int)tu_randint(r, 4))
                                                 : ldexp(u, 128 - (int)tu_randint(r, 30));
                        if (tu_randint(r, 40) == 0) v = (u < 0 ? -1 : 1) * dt_max(dt);
                    } else {
                        v = ldexp(u, (int)tu_randint(r, 20) - 10);
                    }
                    x[i * K + k] = ref_round(dt, v);
                    if (isinf(x[i * K + k])) x[i * K + k] = (v < 0 ? -1 : 1) * dt_max(dt);
                }
        }
    }
}

/* ---- the shapes ------------------------------------------------------------------- */

typedef struct qshape {
    int64_t G, T, K;
    int64_t splits[64];
    int random_splits;      /* 1: tu_make_splits(kind, rows); 2: 64 groups mostly empty */
    tu_splits_kind kind;
    int64_t rows;
} qshape;

static const qshape shapes[] = {
    {.G = 1, .T = 1, .K = 1, .splits = {1}},
    {.G = 1, .T = 77, .K = 130, .splits = {77}},
    {.G = 5, .T = 300, .K = 257, .splits = {0, 1, 130, 4, 128}},  /* empty first, 1 row, tile edges; S = 263 */
    {.G = 64, .T = 200, .K = 40, .random_splits = 2},             /* mostly empty, some 1-row groups, S < T */
    {.G = 3, .T = 129, .K = 128, .splits = {128, 0, 1}},
    {.G = 4, .T = 70, .K = 33, .splits = {0, 0, 0, 0}},           /* all empty */
    {.G = 3, .T = 260, .K = 64, .splits = {257, 2, 0}},           /* empty last */
    {.G = 6, .T = 100, .K = 31, .random_splits = 1, .kind = TU_SPLITS_RANDOM, .rows = 95},
    {.G = 1, .T = 0, .K = 16},                                    /* T = 0 */
    {.G = 8, .T = 45, .K = 300, .random_splits = 1, .kind = TU_SPLITS_EMPTY_MIDDLE, .rows = 45},
};
#define N_SHAPES ((int)(sizeof shapes / sizeof shapes[0]))

static void shape_splits(tu_rng *r, const qshape *s, int64_t *splits) {
    if (s->random_splits == 1) {
        tu_make_splits(r, s->kind, s->G, s->rows, splits);
    } else if (s->random_splits == 2) {
        for (int64_t g = 0; g < s->G; g++) splits[g] = 0;
        const int64_t sizes[12] = {1, 1, 1, 40, 33, 2, 1, 50, 7, 1, 3, 30};   /* 170 rows */
        for (int j = 0; j < 12; j++) {
            int64_t g;
            do g = tu_randint(r, s->G - 1) + 1; while (splits[g]);   /* group 0 stays empty */
            splits[g] = sizes[j];
        }
    } else {
        memcpy(splits, s->splits, (size_t)s->G * sizeof(int64_t));
    }
}

static void main_grid(tu_rng *r) {
    static const moex_dtype dts[3] = {MOEX_DTYPE_F32, MOEX_DTYPE_BF16, MOEX_DTYPE_F16};
    int combo = 0;
    for (int d = 0; d < 3; d++)
        for (int rc = 0; rc < 4; rc++)
            for (int f = 0; f < 2; f++)
                for (int rnd = 0; rnd < 2; rnd++)
                    for (int e = 0; e < 2; e++, combo++)
                        for (int si = 0; si < N_SHAPES; si++) {
                            const qshape *s = &shapes[si];
                            int64_t splits[64];
                            shape_splits(r, s, splits);
                            int64_t off[65];
                            ref_offsets(splits, s->G, off);
                            qcase c;
                            memset(&c, 0, sizeof c);
                            c.dt = dts[d];
                            c.ydt = dts[(d + si) % 3];
                            c.p.recipe = (moex_quant_recipe)rc;
                            c.p.fp8 = f ? MOEX_DTYPE_E5M2 : MOEX_DTYPE_E4M3;
                            c.p.rounding = rnd ? MOEX_SCALE_POW2 : MOEX_SCALE_EXACT;
                            c.p.amax_epsilon = e ? pick_eps(r) : 0.0f;
                            const int orient = (si + combo) % 3;   /* 0 both, 1 rowwise, 2 columnwise */
                            c.row = orient != 2, c.col = orient != 1;
                            c.amax = (si + combo / 3) % 2 == 0;
                            c.dbias = (si + combo) % 2 == 1;
                            c.G = s->G, c.T = s->T, c.K = s->K, c.splits = splits;
                            const flavor fl = (flavor)((si + combo / 3) % FL_NUM);
                            double *x = tu_doubles(c.T * c.K);
                            int kk = 0;
                            make_x(r, fl, c.dt, c.p.fp8, c.G, c.T, c.K, off, x, &kk);
                            char what[64];
                            if (fl == FL_TIES)
                                snprintf(what, sizeof what, "ties k=%d", kk);
                            else
                                snprintf(what, sizeof what, "%s", flavor_names[fl]);
                            c.x = x, c.what = what;
                            run_case(&c);
                            free(x);
                        }
}

/* Single values through every recipe and parameter set. */
static void single_values(void) {
    static const double vals[] = {0.0, -0.0, NAN, INFINITY, -INFINITY, FLT_MAX, -FLT_MAX, 0x1p-149, -0x1p-149,
                                  0x1p-126, 1e-38, 1.0, -3.0, 448.0, 464.0, 500.0, 57344.0, 61440.0, 1e6, 0x1.fffffep-120};
    static const float epss[] = {0.0f, 1e-30f, 1.0f, 1e30f, 1e-40f};
    static const moex_dtype dts[3] = {MOEX_DTYPE_F32, MOEX_DTYPE_BF16, MOEX_DTYPE_F16};
    for (int d = 0; d < 3; d++)
        for (size_t vi = 0; vi < sizeof vals / sizeof vals[0]; vi++) {
            double x = ref_round(dts[d], vals[vi]);
            if (dts[d] != MOEX_DTYPE_F32 && isinf(x) && !isinf(vals[vi])) continue;
            for (int rc = 0; rc < 4; rc++)
                for (int f = 0; f < 2; f++)
                    for (int rnd = 0; rnd < 2; rnd++)
                        for (int e = 0; e < 5; e++) {
                            qcase c;
                            memset(&c, 0, sizeof c);
                            c.dt = dts[d], c.ydt = dts[(d + e) % 3];
                            c.p.recipe = (moex_quant_recipe)rc;
                            c.p.fp8 = f ? MOEX_DTYPE_E5M2 : MOEX_DTYPE_E4M3;
                            c.p.rounding = rnd ? MOEX_SCALE_POW2 : MOEX_SCALE_EXACT;
                            c.p.amax_epsilon = epss[e];
                            c.row = c.col = c.amax = 1;
                            static const int64_t one[1] = {1};
                            c.G = 1, c.T = 1, c.K = 1, c.splits = one, c.x = &x;
                            char what[64];
                            snprintf(what, sizeof what, "single x = %a", x);
                            c.what = what;
                            run_case(&c);
                        }
        }
}

/* A fixed pattern of NaN, +-Inf and zeros among normal values, so that row blocks, column
 * tiles (both groups) and whole groups hold NaN and Inf together, Inf alone, NaN alone, or
 * neither; every recipe and parameter set. */
static void special_pattern(tu_rng *r) {
    static const moex_dtype dts[3] = {MOEX_DTYPE_F32, MOEX_DTYPE_BF16, MOEX_DTYPE_F16};
    enum { PT = 80, PK = 70, PG = 3 };
    static const int64_t splits[PG] = {33, 40, 5};   /* S = 78 */
    double x[PT * PK];
    for (int d = 0; d < 3; d++) {
        memset(x, 0, sizeof x);
        for (int64_t i = 0; i < 78; i++)
            for (int64_t k = 0; k < PK; k++) {
                double v = ref_round(dts[d], tu_uniform_range(r, -6, 6));
                if ((i + k) % 37 == 0) v = NAN;
                else if ((3 * i + k) % 41 == 0) v = INFINITY;
                else if ((i + 2 * k) % 43 == 0) v = -INFINITY;
                else if ((i * k) % 11 == 5) v = (i & 1) ? 0.0 : -0.0;
                x[i * PK + k] = v;
            }
        for (int rc = 0; rc < 4; rc++)
            for (int f = 0; f < 2; f++)
                for (int rnd = 0; rnd < 2; rnd++) {
                    qcase c;
                    memset(&c, 0, sizeof c);
                    c.dt = dts[d], c.ydt = dts[(d + rc) % 3];
                    c.p.recipe = (moex_quant_recipe)rc;
                    c.p.fp8 = f ? MOEX_DTYPE_E5M2 : MOEX_DTYPE_E4M3;
                    c.p.rounding = rnd ? MOEX_SCALE_POW2 : MOEX_SCALE_EXACT;
                    c.p.amax_epsilon = rnd ? 0.5f : 0.0f;
                    c.row = c.col = c.amax = 1;
                    c.G = PG, c.T = PT, c.K = PK, c.splits = splits, c.x = x, c.what = "NaN/Inf pattern";
                    run_case(&c);
                }
    }
}

/* ---- dequantize of arbitrary bytes ------------------------------------------------ */

static void dequantize_random(tu_rng *r) {
    static const moex_dtype dts[3] = {MOEX_DTYPE_F32, MOEX_DTYPE_BF16, MOEX_DTYPE_F16};
    const int64_t G = 4, T = 150, K = 70;
    const int64_t splits[4] = {0, 40, 1, 100};   /* S = 141 */
    for (int rc = 0; rc < 4; rc++)
        for (int f = 0; f < 2; f++)
            for (int o = 0; o < 2; o++)
                for (int d = 0; d < 3; d++) {
                    qcase c;
                    memset(&c, 0, sizeof c);
                    c.dt = MOEX_DTYPE_F32, c.ydt = dts[d];
                    c.p.recipe = (moex_quant_recipe)rc;
                    c.p.fp8 = f ? MOEX_DTYPE_E5M2 : MOEX_DTYPE_E4M3;
                    c.G = G, c.T = T, c.K = K, c.splits = splits;
                    double *x = tu_doubles(T * K);
                    c.x = x, c.what = "random bytes";
                    qlayout L = layout_of(&c.p, G, T, K, splits);
                    char label[200];
                    snprintf(label, sizeof label, "[dequantize random bytes %s %s %s -> %s]", recipe_name(c.p.recipe),
                             moex_dtype_name(c.p.fp8), o ? "columnwise" : "rowwise", moex_dtype_name(c.ydt));
                    /* data: random codes in the region the quantize writes, poison elsewhere */
                    uint8_t *data = (uint8_t *)tu_poisoned(c.p.fp8, T * K);
                    for (int64_t t = 0; t < L.S; t++)
                        for (int64_t k = 0; k < K; k++) data[o ? k * T + t : t * K + k] = (uint8_t)tu_randint(r, 256);
                    const int64_t n = o ? L.n_cs : L.n_rs;
                    void *sc = tu_poisoned(L.sdt, n);
                    const int ndim = o ? L.cs_ndim : L.rs_ndim;
                    const int64_t *shape = o ? L.cs_shape : L.rs_shape;
                    for (int64_t i = 0; i < n; i++) {
                        if (ndim == 2) {
                            const int64_t rr = i / shape[1], j = i % shape[1];
                            if (o ? j >= L.bG : rr >= L.S) continue;   /* unwritten: poison (NaN) */
                        }
                        if (L.ses == 1) {
                            ((uint8_t *)sc)[i] = (uint8_t)tu_randint(r, 256);
                        } else {
                            float v;
                            const int64_t u = tu_randint(r, 20);
                            if (u == 0) v = f32_of_bits((uint32_t)(1 + tu_randint(r, 0x7FFFFF)));   /* subnormal */
                            else if (u == 1) v = FLT_MAX;
                            else if (u == 2) v = 0.0f;
                            else if (u == 3) v = -(float)ldexp(tu_uniform(r) + 0.5, -3);
                            else if (u == 4) v = (float)(1.0 / FLT_MAX);
                            else v = (float)ldexp(tu_uniform(r) + 0.5, (int)tu_randint(r, 60) - 40);
                            ((float *)sc)[i] = v;
                        }
                    }
                    n_cases++;
                    const int failures_before = tu_failures();
                    check_dequantize(&c, &L, label, o ? MOEX_QUANT_COLUMNWISE : MOEX_QUANT_ROWWISE, data, sc);
                    if (tu_failures() != failures_before) printf("  (failures above: case %s)\n", label);
                    free(data), free(sc), free(x), free(L.off);
                }
}

/* ---- bad arguments -------------------------------------------------------------------- */

enum { BT = 10, BK = 20, BG = 3, ARENA = 4096 };

typedef struct bad_fx {
    void *x, *rd, *rs, *cd, *cs, *am, *y;
    int64_t splits[BG];
} bad_fx;

static void bad_poison(bad_fx *f) {
    tu_poison(f->rd, ARENA), tu_poison(f->rs, ARENA), tu_poison(f->cd, ARENA), tu_poison(f->cs, ARENA);
    tu_poison(f->am, ARENA), tu_poison(f->y, ARENA);
}

static int bad_untouched(const bad_fx *f) {
    return tu_first_unpoisoned(f->rd, ARENA) < 0 && tu_first_unpoisoned(f->rs, ARENA) < 0 &&
           tu_first_unpoisoned(f->cd, ARENA) < 0 && tu_first_unpoisoned(f->cs, ARENA) < 0 &&
           tu_first_unpoisoned(f->am, ARENA) < 0 && tu_first_unpoisoned(f->y, ARENA) < 0;
}

/* Valid arguments of a recipe: both copies, amax when allowed. */
static moex_group_quantize_args bad_base(bad_fx *f, moex_quant_recipe rc) {
    moex_group_quantize_args a;
    memset(&a, 0, sizeof a);
    a.x = moex_tensor_2d(f->x, MOEX_DTYPE_F32, BT, BK);
    a.splits = moex_tensor_1d(f->splits, MOEX_DTYPE_I64, BG);
    a.params.recipe = rc, a.params.fp8 = MOEX_DTYPE_E4M3, a.params.rounding = MOEX_SCALE_EXACT;
    moex_quant_params p = a.params;
    int64_t rsh[2], csh[2];
    const int rn = ref_quant_scales_shape(rc, 0, BG, BT, BK, rsh), cn = ref_quant_scales_shape(rc, 1, BG, BT, BK, csh);
    const moex_dtype sdt = rc == MOEX_QUANT_MXFP8 ? MOEX_DTYPE_E8M0 : MOEX_DTYPE_F32;
    a.rowwise.data = moex_tensor_2d(f->rd, p.fp8, BT, BK);
    a.rowwise.scales = scales_tensor(f->rs, sdt, rn, rsh);
    a.columnwise.data = moex_tensor_2d(f->cd, p.fp8, BK, BT);
    a.columnwise.scales = scales_tensor(f->cs, sdt, cn, csh);
    if (rc == MOEX_QUANT_TENSOR) a.amax = moex_tensor_1d(f->am, MOEX_DTYPE_F32, 1);
    if (rc == MOEX_QUANT_GROUP) a.amax = moex_tensor_1d(f->am, MOEX_DTYPE_F32, BG);
    return a;
}

static void expect_q_refused(bad_fx *f, const moex_group_quantize_args *a, const char *name, const char *desc) {
    size_t bytes = 0;
    bad_poison(f);
    moex_status st = moex_group_quantize_workspace_size(ctx, a, &bytes);
    /* the overlap rule is checked by the run, after the workspace (conventions section 7) */
    const int overlap = name && strcmp(name, "overlaps") == 0;
    CHECK_MSG(st == (overlap ? MOEX_OK : MOEX_ERR_INVALID_ARG), "quantize %s: workspace-size query: got %s (\"%s\")",
              desc, moex_status_string(st), moex_last_error(ctx));
    void *ws = tu_alloc(1 << 16);
    st = moex_group_quantize(ctx, a, ws, 1 << 16, NULL);
    free(ws);
    if (!CHECK_REFUSED(ctx, st, "moex_group_quantize", name)) printf("  (case: quantize %s)\n", desc);
    CHECK_MSG(bad_untouched(f), "quantize %s: refused, but an output was written", desc);
}

static void expect_dq_refused(bad_fx *f, const moex_group_dequantize_args *a, const char *name, const char *desc) {
    size_t bytes = 0;
    bad_poison(f);
    moex_status st = moex_group_dequantize_workspace_size(ctx, a, &bytes);
    /* the overlap rule is checked by the run, after the workspace (conventions section 7) */
    const int overlap = name && strcmp(name, "overlaps") == 0;
    CHECK_MSG(st == (overlap ? MOEX_OK : MOEX_ERR_INVALID_ARG), "dequantize %s: workspace-size query: got %s (\"%s\")",
              desc, moex_status_string(st), moex_last_error(ctx));
    void *ws = tu_alloc(1 << 16);
    st = moex_group_dequantize(ctx, a, ws, 1 << 16, NULL);
    free(ws);
    if (!CHECK_REFUSED(ctx, st, "moex_group_dequantize", name)) printf("  (case: dequantize %s)\n", desc);
    CHECK_MSG(bad_untouched(f), "dequantize %s: refused, but y was written", desc);
}

static void bad_arguments(tu_rng *r) {
    bad_fx f;
    f.x = tu_alloc(ARENA), f.rd = tu_alloc(ARENA), f.rs = tu_alloc(ARENA), f.cd = tu_alloc(ARENA);
    f.cs = tu_alloc(ARENA), f.am = tu_alloc(ARENA), f.y = tu_alloc(ARENA);
    double xv[BT * BK];
    tu_fill_uniform(r, xv, BT * BK, -3, 3, MOEX_DTYPE_F32);
    memset(f.x, 0, ARENA);
    ref_fill(MOEX_DTYPE_F32, f.x, xv, BT * BK);
    f.splits[0] = 3, f.splits[1] = 0, f.splits[2] = 5;
    const moex_dtype E4 = MOEX_DTYPE_E4M3;
    moex_group_quantize_args a, b;

    /* the bases are valid */
    for (int rc = 0; rc < 4; rc++) {
        a = bad_base(&f, (moex_quant_recipe)rc);
        size_t bytes = 0;
        CHECK_STATUS(ctx, moex_group_quantize_workspace_size(ctx, &a, &bytes), MOEX_OK);
        void *ws = tu_workspace(bytes);
        CHECK_STATUS(ctx, moex_group_quantize(ctx, &a, ws, bytes, NULL), MOEX_OK);
        free(ws);
    }
#define Q(base_rc, mutation, name, desc)                                                        \
    do {                                                                                        \
        b = bad_base(&f, base_rc);                                                              \
        mutation;                                                                               \
        expect_q_refused(&f, &b, name, desc);                                                   \
    } while (0)
    const moex_quant_recipe TN = MOEX_QUANT_TENSOR, GR = MOEX_QUANT_GROUP, BL = MOEX_QUANT_BLOCK, MX = MOEX_QUANT_MXFP8;
    /* x */
    Q(BL, b.x.dtype = MOEX_DTYPE_I32, "x", "x i32");
    Q(BL, b.x.dtype = E4, "x", "x e4m3");
    Q(BL, b.x = moex_tensor_3d(f.x, MOEX_DTYPE_F32, 1, BT, BK), "x", "x 3-D");
    Q(BL, b.x = moex_tensor_1d(f.x, MOEX_DTYPE_F32, BT * BK), "x", "x 1-D");
    Q(BL, b.x.data = NULL, "x", "x data NULL");
    /* params */
    Q(BL, b.params.fp8 = MOEX_DTYPE_F32, "fp8", "params.fp8 f32");
    Q(BL, b.params.fp8 = MOEX_DTYPE_BF16, "fp8", "params.fp8 bf16");
    Q(MX, b.params.fp8 = MOEX_DTYPE_E8M0, "fp8", "params.fp8 e8m0");
    Q(BL, b.params.fp8 = (moex_dtype)42, "fp8", "params.fp8 42");
    Q(BL, b.params.recipe = (moex_quant_recipe)4, "recipe", "recipe 4");
    Q(TN, b.params.recipe = (moex_quant_recipe)-1, "recipe", "recipe -1");
    Q(BL, b.params.rounding = (moex_scale_rounding)2, "rounding", "rounding 2");
    Q(BL, b.params.amax_epsilon = -1.0f, "epsilon", "amax_epsilon -1");
    Q(GR, b.params.amax_epsilon = -1e-30f, "epsilon", "amax_epsilon -1e-30");
    Q(TN, b.params.amax_epsilon = NAN, "epsilon", "amax_epsilon NaN");
    Q(BL, b.params.amax_epsilon = INFINITY, "epsilon", "amax_epsilon Inf");
    /* presence */
    Q(BL, (memset(&b.rowwise, 0, sizeof b.rowwise), memset(&b.columnwise, 0, sizeof b.columnwise)), NULL,
      "no output copy");
    Q(TN, (memset(&b.rowwise, 0, sizeof b.rowwise), memset(&b.columnwise, 0, sizeof b.columnwise)), NULL,
      "no output copy (amax only)");
    Q(BL, memset(&b.rowwise.scales, 0, sizeof b.rowwise.scales), "rowwise.scales", "rowwise.scales absent");
    Q(GR, memset(&b.columnwise.scales, 0, sizeof b.columnwise.scales), "columnwise.scales",
      "columnwise.scales absent");
    Q(BL, memset(&b.rowwise.data, 0, sizeof b.rowwise.data), "rowwise", "rowwise.data absent, scales present");
    Q(BL, b.amax = moex_tensor_1d(f.am, MOEX_DTYPE_F32, 1), "amax", "amax with BLOCK");
    Q(MX, b.amax = moex_tensor_1d(f.am, MOEX_DTYPE_F32, 1), "amax", "amax with MXFP8");
    Q(BL, b.dbias = moex_tensor_2d(f.am, MOEX_DTYPE_F32, BG, BK + 1), "dbias", "dbias [G, K+1]");
    Q(MX, b.dbias = moex_tensor_2d(f.am, MOEX_DTYPE_BF16, BG, BK), "dbias", "dbias bf16");
    Q(BL, b.dbias = moex_tensor_1d(f.am, MOEX_DTYPE_F32, BG * BK), "dbias", "dbias 1-D");
    /* data */
    Q(BL, b.rowwise.data.dtype = MOEX_DTYPE_E5M2, "rowwise.data", "rowwise.data e5m2 for e4m3");
    Q(BL, b.rowwise.data.dtype = MOEX_DTYPE_F32, "rowwise.data", "rowwise.data f32");
    Q(TN, b.columnwise.data.dtype = MOEX_DTYPE_E8M0, "columnwise.data", "columnwise.data e8m0");
    Q(BL, b.rowwise.data.shape[1] = BK + 1, "rowwise.data", "rowwise.data [T, K+1]");
    Q(GR, b.rowwise.data = moex_tensor_2d(f.rd, E4, BK, BT), "rowwise.data", "rowwise.data [K, T]");
    Q(BL, b.columnwise.data = moex_tensor_2d(f.cd, E4, BT, BK), "columnwise.data", "columnwise.data [T, K]");
    Q(MX, b.columnwise.data = moex_tensor_1d(f.cd, E4, BT * BK), "columnwise.data", "columnwise.data 1-D");
    Q(BL, b.rowwise.data.data = NULL, "rowwise.data", "rowwise.data NULL");
    /* scales */
    Q(BL, b.rowwise.scales.dtype = MOEX_DTYPE_BF16, "rowwise.scales", "BLOCK rowwise.scales bf16");
    Q(BL, b.rowwise.scales.dtype = MOEX_DTYPE_E8M0, "rowwise.scales", "BLOCK rowwise.scales e8m0");
    Q(BL, b.columnwise.scales.dtype = MOEX_DTYPE_E8M0, "columnwise.scales", "BLOCK columnwise.scales e8m0");
    Q(BL, b.rowwise.scales.shape[1] += 1, "rowwise.scales", "BLOCK rowwise.scales [T, ceil(K/128)+1]");
    Q(BL, b.rowwise.scales = moex_tensor_1d(f.rs, MOEX_DTYPE_F32, BT), "rowwise.scales", "BLOCK rowwise.scales [T]");
    Q(BL, b.columnwise.scales.shape[1] = 1, "columnwise.scales", "BLOCK columnwise.scales [K, ceil(T/128)] (no + G)");
    Q(BL, b.columnwise.scales.shape[1] = 1 + BG + 1, "columnwise.scales", "BLOCK columnwise.scales one column more");
    Q(BL, b.columnwise.scales = moex_tensor_2d(f.cs, MOEX_DTYPE_F32, BT, 1 + BG), "columnwise.scales",
      "BLOCK columnwise.scales [T, ...]");
    Q(MX, b.rowwise.scales.dtype = MOEX_DTYPE_F32, "rowwise.scales", "MXFP8 rowwise.scales f32");
    Q(MX, b.columnwise.scales.dtype = MOEX_DTYPE_F32, "columnwise.scales", "MXFP8 columnwise.scales f32");
    Q(MX, b.rowwise.scales.shape[1] = 2, "rowwise.scales", "MXFP8 rowwise.scales [T, ceil(K/32)+1]");
    Q(MX, b.columnwise.scales.shape[1] = 1 + BG - 1, "columnwise.scales", "MXFP8 columnwise.scales one column less");
    /* the swizzled layout (docs/ops.md 9.8): MXFP8 only, one E8M0 vector of the exact length */
    const moex_scale_layout SW = MOEX_SCALES_MX_SWIZZLED;
    const int64_t swr = (1 + BG) * 128 * 4, swc = (1 + BG) * 4 * 128;   /* ceil(T/128) + G tiles */
#define SWZ(rlen, clen)                                                                         \
    (b.params.scale_layout = SW, b.rowwise.scales = moex_tensor_1d(f.rs, MOEX_DTYPE_E8M0, rlen), \
     b.columnwise.scales = moex_tensor_1d(f.cs, MOEX_DTYPE_E8M0, clen))
    {
        b = bad_base(&f, MX);
        SWZ(swr, swc);
        size_t bytes = 0;
        CHECK_STATUS(ctx, moex_group_quantize_workspace_size(ctx, &b, &bytes), MOEX_OK);
        void *ws = tu_workspace(bytes);
        CHECK_STATUS(ctx, moex_group_quantize(ctx, &b, ws, bytes, NULL), MOEX_OK);
        free(ws);
    }
    Q(BL, b.params.scale_layout = SW, "scale_layout", "swizzled BLOCK");
    Q(GR, b.params.scale_layout = SW, "scale_layout", "swizzled GROUP");
    Q(MX, (SWZ(swr, swc), b.params.scale_layout = (moex_scale_layout)2), "scale_layout", "scale_layout 2");
    Q(MX, b.params.scale_layout = SW, "rowwise.scales", "swizzled with the plain [T, ceil(K/32)] scales");
    Q(MX, SWZ(swr - 1, swc), "rowwise.scales", "swizzled rowwise.scales one byte short");
    Q(MX, SWZ(swr, swc + 4), "columnwise.scales", "swizzled columnwise.scales four bytes long");
    Q(MX, (SWZ(swr, swc), b.rowwise.scales.dtype = MOEX_DTYPE_E4M3), "rowwise.scales", "swizzled rowwise.scales e4m3");
    Q(MX, (SWZ(swr, swc), b.columnwise.scales = moex_tensor_2d(f.cs, MOEX_DTYPE_E8M0, 4 * 128, 1 + BG)),
      "columnwise.scales", "swizzled columnwise.scales 2-D");
#undef SWZ
    Q(TN, b.rowwise.scales = moex_tensor_1d(f.rs, MOEX_DTYPE_F32, BG), "rowwise.scales", "TENSOR rowwise.scales [G]");
    Q(TN, b.columnwise.scales.dtype = MOEX_DTYPE_E8M0, "columnwise.scales", "TENSOR columnwise.scales e8m0");
    Q(TN, b.rowwise.scales = moex_tensor_2d(f.rs, MOEX_DTYPE_F32, 1, 1), "rowwise.scales", "TENSOR rowwise.scales [1, 1]");
    Q(GR, b.rowwise.scales = moex_tensor_1d(f.rs, MOEX_DTYPE_F32, 1), "rowwise.scales", "GROUP rowwise.scales [1]");
    Q(GR, b.columnwise.scales = moex_tensor_2d(f.cs, MOEX_DTYPE_F32, BG, 1), "columnwise.scales",
      "GROUP columnwise.scales [G, 1]");
    Q(GR, b.rowwise.scales.dtype = MOEX_DTYPE_F16, "rowwise.scales", "GROUP rowwise.scales f16");
    /* amax */
    Q(TN, b.amax = moex_tensor_1d(f.am, MOEX_DTYPE_F32, BG), "amax", "TENSOR amax [G]");
    Q(TN, b.amax.dtype = MOEX_DTYPE_BF16, "amax", "TENSOR amax bf16");
    Q(GR, b.amax = moex_tensor_1d(f.am, MOEX_DTYPE_F32, 1), "amax", "GROUP amax [1]");
    Q(GR, b.amax = moex_tensor_2d(f.am, MOEX_DTYPE_F32, BG, 1), "amax", "GROUP amax [G, 1]");
    /* splits */
    Q(BL, b.splits.dtype = MOEX_DTYPE_I32, "splits", "splits i32");
    Q(BL, b.splits = moex_tensor_2d(f.splits, MOEX_DTYPE_I64, 1, BG), "splits", "splits 2-D");

    /* dequantize */
    moex_group_dequantize_args d0, d;
    {
        a = bad_base(&f, BL);
        memset(&d0, 0, sizeof d0);
        d0.params = a.params;
        d0.orientation = MOEX_QUANT_ROWWISE;
        d0.src = a.rowwise;
        d0.splits = a.splits;
        d0.y = moex_tensor_2d(f.y, MOEX_DTYPE_BF16, BT, BK);
        size_t bytes = 0;
        CHECK_STATUS(ctx, moex_group_dequantize_workspace_size(ctx, &d0, &bytes), MOEX_OK);
        void *ws = tu_workspace(bytes);
        CHECK_STATUS(ctx, moex_group_dequantize(ctx, &d0, ws, bytes, NULL), MOEX_OK);
        free(ws);
    }
#define DQ(mutation, name, desc)                                                                \
    do {                                                                                        \
        d = d0;                                                                                 \
        mutation;                                                                               \
        expect_dq_refused(&f, &d, name, desc);                                                  \
    } while (0)
    DQ(d.y.dtype = MOEX_DTYPE_I32, "y", "y i32");
    DQ(d.y.dtype = E4, "y", "y e4m3");
    /* y and src disagree: the message may name either */
    DQ(d.y.shape[1] = BK + 1, NULL, "y [T, K+1]");
    DQ(d.y = moex_tensor_2d(f.y, MOEX_DTYPE_BF16, BK, BT), NULL, "y [K, T]");
    DQ(memset(&d.y, 0, sizeof d.y), "y", "y absent");
    DQ(d.orientation = (moex_quant_orientation)2, "orientation", "orientation 2");
    DQ(d.params.fp8 = MOEX_DTYPE_F16, "fp8", "params.fp8 f16");
    DQ(d.params.recipe = (moex_quant_recipe)9, "recipe", "recipe 9");
    DQ(d.src.data.dtype = MOEX_DTYPE_F32, "src.data", "src.data f32");
    DQ(d.src.data.dtype = MOEX_DTYPE_E5M2, "src.data", "src.data e5m2 for e4m3");
    DQ(d.src.data = moex_tensor_2d(f.rd, E4, BK, BT), "src.data", "rowwise src.data [K, T]");
    DQ(memset(&d.src.data, 0, sizeof d.src.data), "src.data", "src.data absent");
    DQ(d.src.scales.dtype = MOEX_DTYPE_E8M0, "src.scales", "BLOCK src.scales e8m0");
    DQ(d.src.scales.shape[1] = 2, "src.scales", "BLOCK rowwise src.scales one column more");
    DQ(memset(&d.src.scales, 0, sizeof d.src.scales), "src.scales", "src.scales absent");
    DQ(d.orientation = MOEX_QUANT_COLUMNWISE, "src", "columnwise with a rowwise src");
    DQ((d.orientation = MOEX_QUANT_COLUMNWISE, d.src = bad_base(&f, BL).columnwise,
        d.src.scales.shape[1] = 1), "src.scales", "columnwise src.scales without + G");
    DQ((d.params.recipe = MX, d.src = bad_base(&f, MX).rowwise, d.src.scales.dtype = MOEX_DTYPE_F32), "src.scales",
       "MXFP8 src.scales f32");
    DQ((d.params.recipe = TN, d.src = bad_base(&f, TN).rowwise, d.src.scales.shape[0] = BG), "src.scales",
       "TENSOR src.scales [G]");
    DQ(d.splits.dtype = MOEX_DTYPE_F32, "splits", "splits f32");

    /* outputs that overlap another tensor: refused, nothing written (not through the GPU
     * mirror, which gives every tensor its own device copy) */
    if (!TQ_GPU) {
        Q(BL, b.columnwise.data.data = f.rd, "overlaps", "columnwise.data on rowwise.data");
        Q(BL, b.rowwise.scales.data = (char *)f.rd + 16, "overlaps", "rowwise.scales inside rowwise.data");
        Q(GR, b.amax.data = f.cs, "overlaps", "amax on columnwise.scales");
        Q(TN, b.rowwise.data.data = f.x, "overlaps", "rowwise.data on x");
        DQ(d.y.data = f.rd, "overlaps", "y on src.data");
    }

    /* T = 0: empty tensors with NULL data are legal; the columnwise BLOCK scales [K, G] are
     * not empty but have no tiles (b_G = 0): nothing is written */
    for (int rc = 0; rc < 4; rc++) {
        int64_t zs[BG] = {0, 0, 0}, rsh[2], csh[2];
        const moex_quant_recipe rcp = (moex_quant_recipe)rc;
        const moex_dtype sdt = rc == MOEX_QUANT_MXFP8 ? MOEX_DTYPE_E8M0 : MOEX_DTYPE_F32;
        const int rn = ref_quant_scales_shape(rcp, 0, BG, 0, BK, rsh), cn = ref_quant_scales_shape(rcp, 1, BG, 0, BK, csh);
        memset(&a, 0, sizeof a);
        a.x = moex_tensor_2d(NULL, MOEX_DTYPE_BF16, 0, BK);
        a.splits = moex_tensor_1d(zs, MOEX_DTYPE_I64, BG);
        a.params.recipe = rcp, a.params.fp8 = MOEX_DTYPE_E5M2;
        a.rowwise.data = moex_tensor_2d(NULL, MOEX_DTYPE_E5M2, 0, BK);
        a.rowwise.scales = scales_tensor(rn == 2 ? NULL : f.rs, sdt, rn, rsh);
        a.columnwise.data = moex_tensor_2d(NULL, MOEX_DTYPE_E5M2, BK, 0);
        a.columnwise.scales = scales_tensor(f.cs, sdt, cn, csh);
        bad_poison(&f);
        size_t bytes = 0;
        CHECK_STATUS(ctx, moex_group_quantize_workspace_size(ctx, &a, &bytes), MOEX_OK);
        void *ws = tu_workspace(bytes);
        CHECK_STATUS(ctx, moex_group_quantize(ctx, &a, ws, bytes, NULL), MOEX_OK);
        free(ws);
        if (rn == 2)
            CHECK_MSG(bad_untouched(&f), "T = 0, %s: an output was written", recipe_name(rcp));
        else   /* TENSOR / GROUP: the scales are written (1: amax 0, no epsilon) */
            CHECK_MSG(((float *)f.rs)[0] == 1.0f && ((float *)f.cs)[rc == MOEX_QUANT_GROUP ? BG - 1 : 0] == 1.0f,
                      "T = 0, %s: scales %g %g, want 1", recipe_name(rcp), (double)((float *)f.rs)[0],
                      (double)((float *)f.cs)[0]);
        moex_group_dequantize_args e;
        memset(&e, 0, sizeof e);
        e.params = a.params, e.orientation = MOEX_QUANT_COLUMNWISE, e.src = a.columnwise, e.splits = a.splits;
        e.y = moex_tensor_2d(NULL, MOEX_DTYPE_F32, 0, BK);
        CHECK_STATUS(ctx, moex_group_dequantize_workspace_size(ctx, &e, &bytes), MOEX_OK);
        ws = tu_workspace(bytes);
        CHECK_STATUS(ctx, moex_group_dequantize(ctx, &e, ws, bytes, NULL), MOEX_OK);
        free(ws);
    }
#undef Q
#undef DQ


    static const int64_t bad_splits[2][BG] = {{3, -1, 5}, {3, 5, 5}};
    for (int i = 0; i < 2; i++)
        for (int rc = 0; rc < 4; rc++) {
            memcpy(f.splits, bad_splits[i], sizeof f.splits);
            a = bad_base(&f, (moex_quant_recipe)rc);
            bad_poison(&f);
            size_t bytes = 0;
            CHECK_STATUS(ctx, moex_group_quantize_workspace_size(ctx, &a, &bytes), MOEX_OK);
            void *ws = tu_workspace(bytes);
            moex_status st = moex_group_quantize(ctx, &a, ws, bytes, NULL);
            free(ws);
            CHECK_MSG(st == MOEX_ERR_BAD_SPLITS, "quantize %s, splits {%lld, %lld, %lld}: got %s (\"%s\")",
                      recipe_name((moex_quant_recipe)rc), (long long)f.splits[0], (long long)f.splits[1],
                      (long long)f.splits[2], moex_status_string(st), moex_last_error(ctx));
            if (!TQ_GPU) CHECK_MSG(bad_untouched(&f), "quantize with bad splits wrote an output");
            d = d0;
            d.params.recipe = (moex_quant_recipe)rc;
            d.src = a.rowwise;
            bad_poison(&f);
            CHECK_STATUS(ctx, moex_group_dequantize_workspace_size(ctx, &d, &bytes), MOEX_OK);
            ws = tu_workspace(bytes);
            st = moex_group_dequantize(ctx, &d, ws, bytes, NULL);
            free(ws);
            CHECK_MSG(st == MOEX_ERR_BAD_SPLITS, "dequantize %s, bad splits: got %s (\"%s\")",
                      recipe_name((moex_quant_recipe)rc), moex_status_string(st), moex_last_error(ctx));
            if (!TQ_GPU) CHECK_MSG(bad_untouched(&f), "dequantize with bad splits wrote y");
        }
    f.splits[0] = 3, f.splits[1] = 0, f.splits[2] = 5;
    free(f.x), free(f.rd), free(f.rs), free(f.cd), free(f.cs), free(f.am), free(f.y);
}

/* Larger shapes (several 128-row tiles per group, long rows): every recipe and format once,
 * both copies, random splits with an empty group and sum < T. */
static void big_cases(tu_rng *r, int64_t G, int64_t T, int64_t K) {
    static const moex_dtype dts[3] = {MOEX_DTYPE_F32, MOEX_DTYPE_BF16, MOEX_DTYPE_F16};
    int i = 0;
    for (int rc = 0; rc < 4; rc++)
        for (int f = 0; f < 2; f++, i++) {
            int64_t *splits = (int64_t *)tu_alloc((size_t)G * sizeof(int64_t));
            int64_t *off = (int64_t *)tu_alloc((size_t)(G + 1) * sizeof(int64_t));
            tu_make_splits(r, i % 2 ? TU_SPLITS_SKEWED : TU_SPLITS_EMPTY_MIDDLE, G, T - 1 - tu_randint(r, 100), splits);
            ref_offsets(splits, G, off);
            qcase c;
            memset(&c, 0, sizeof c);
            c.dt = dts[i % 3], c.ydt = dts[(i + 1) % 3];
            c.p.recipe = (moex_quant_recipe)rc;
            c.p.fp8 = f ? MOEX_DTYPE_E5M2 : MOEX_DTYPE_E4M3;
            c.p.rounding = i % 3 == 1 ? MOEX_SCALE_POW2 : MOEX_SCALE_EXACT;
            c.p.amax_epsilon = i % 4 == 2 ? 0.125f : 0.0f;
            c.row = c.col = c.amax = c.dbias = 1;
            c.G = G, c.T = T, c.K = K, c.splits = splits;
            double *x = tu_doubles(T * K);
            int kk = 0;
            const flavor fl = (flavor)(i % FL_NUM);
            make_x(r, fl, c.dt, c.p.fp8, G, T, K, off, x, &kk);
            char what[64];
            snprintf(what, sizeof what, "big %s", flavor_names[fl]);
            c.x = x, c.what = what;
            run_case(&c);
            free(x), free(splits), free(off);
        }
}

int main(void) {
    const double t0 = now_s();
    ctx = tu_cpu_context();
    tu_rng r = tu_rng_seed(1616);
    check_reference(&r);
    single_values();
    main_grid(&r);
    special_pattern(&r);
    big_cases(&r, 5, 700, 300);
    dequantize_random(&r);
    bad_arguments(&r);
    printf("%d cases, %.2f s\n", n_cases, now_s() - t0);
    moex_context_destroy(ctx);
    return tu_finish();
}
