/*
 * test_weight_quantize.c - moex_weight_quantize / moex_weight_dequantize (docs/ops.md 9.7)
 * on the CPU backend against the reference of tools/ref/ref_quant.h, BIT FOR BIT: the FP8
 * codes of both copies (rowwise [G, N, K], columnwise [G, K, N]), the f32 scale bits or
 * E8M0 bytes, amax, and the dequantized weights (equal values with equal signs of zero; NaN
 * where the reference has NaN).
 *
 * Coverage:
 *   - the weight reference itself: against the (already validated) grouped-row reference
 *     (GROUP with G = 1 is TENSOR over N rows; GROUP per expert is GROUP over G groups of N
 *     rows; MXFP8 rowwise is the row recipe's, MXFP8 columnwise the row recipe's 32x1 tiles
 *     of groups of N rows), and against a second formulation that finds every element's set
 *     by its index (one amax pass over all elements), for every recipe;
 *   - GROUP / BLOCK / MXFP8 x E4M3 / E5M2 x EXACT / POW2 x epsilon 0 / not 0 x w in f32 /
 *     bf16 / f16, rowwise only, columnwise only and both (rotating), amax with GROUP (present
 *     or not), over G = 1 and G = 5 and shapes whose N and K are not multiples of 32 or 128
 *     (N = 1, 31, 33, 128, 130, 257; K = 1, 31, 33, 129, 130, 300), and the empty cases
 *     G = 0, N = 0, K = 0 (also with NULL data pointers);
 *   - values: random over 2^-30 .. 2^10 (fp8 subnormals and underflow inside a set), ties
 *     (every fp8 value, every midpoint, the midpoints past max, scaled by 2^k with every
 *     1x32 / 32x1 block and every expert holding +-max 2^k so the scales are exact), NaN /
 *     Inf / -0 / zero rows and columns / dtype subnormals, extreme sets (amax near the
 *     dtype's max; tiny amax where fp8_max / amax overflows to FLT_MAX; MX exponents clamped
 *     to -127), single values through every recipe and parameter set, and a fixed NaN / Inf
 *     / zero pattern whose blocks hold them together and apart;
 *   - every output poisoned first: all of each present output must be written (no splits);
 *   - dequantize of both copies from the library's own outputs, and from random bytes (every
 *     code, NaN and Inf codes, E8M0 0 and 0xFF, f32 scales subnormal, 0, negative,
 *     FLT_MAX) into f32 / bf16 / f16;
 *   - bad arguments (TENSOR recipe, w / data / scales / amax shapes and dtypes, amax with
 *     BLOCK / MXFP8, no copy, scales without data, epsilon, rounding, fp8, orientation,
 *     overlapping outputs): each refused with MOEX_ERR_INVALID_ARG and a message naming the
 *     culprit, nothing written.
 * tests/cuda/test_gpu_weight_quantize.c runs this file on the GPU (TWQ_GPU 1).
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

#ifndef TWQ_GPU
#define TWQ_GPU 0
#endif

static moex_context *ctx;
static int n_cases, n_mismatch_reports;

static const moex_dtype wdts[3] = {MOEX_DTYPE_F32, MOEX_DTYPE_BF16, MOEX_DTYPE_F16};
static const moex_quant_recipe wrecipes[3] = {MOEX_QUANT_GROUP, MOEX_QUANT_BLOCK, MOEX_QUANT_MXFP8};

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* ---- layouts ------------------------------------------------------------------------- */

typedef struct wlayout {
    int64_t rs_shape[3], cs_shape[3];
    int rs_ndim, cs_ndim;
    int64_t n_rs, n_cs, n_amax;
    moex_dtype sdt;
    size_t ses;
} wlayout;

static int64_t numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

static wlayout wlayout_of(moex_quant_recipe rc, int64_t G, int64_t N, int64_t K) {
    wlayout L;
    memset(&L, 0, sizeof L);
    L.rs_ndim = ref_weight_scales_shape(rc, 0, G, N, K, L.rs_shape);
    L.cs_ndim = ref_weight_scales_shape(rc, 1, G, N, K, L.cs_shape);
    L.n_rs = numel(L.rs_ndim, L.rs_shape);
    L.n_cs = numel(L.cs_ndim, L.cs_shape);
    L.n_amax = rc == MOEX_QUANT_GROUP ? G : 0;
    L.sdt = rc == MOEX_QUANT_MXFP8 ? MOEX_DTYPE_E8M0 : MOEX_DTYPE_F32;
    L.ses = rc == MOEX_QUANT_MXFP8 ? 1 : 4;
    return L;
}

static moex_tensor scales_tensor(void *buf, moex_dtype sdt, int ndim, const int64_t *shape) {
    return ndim == 1 ? moex_tensor_1d(buf, sdt, shape[0]) : moex_tensor_3d(buf, sdt, shape[0], shape[1], shape[2]);
}

/* The test's own set index of w[g, n, k] in one copy's scales, written from the doc's table
 * (not the reference's function). */
static int64_t set_index(moex_quant_recipe rc, int col, int64_t G, int64_t N, int64_t K, int64_t g, int64_t n,
                         int64_t k) {
    (void)G;
    if (rc == MOEX_QUANT_GROUP) return g;
    if (rc == MOEX_QUANT_BLOCK) {
        const int64_t bn = cdiv(N, 128), bk = cdiv(K, 128);
        /* rowwise [G, bn, bk] at (g, n/128, k/128); columnwise [G, bk, bn] at (g, k/128, n/128) */
        return col ? g * bk * bn + (k / 128) * bn + n / 128 : g * bn * bk + (n / 128) * bk + k / 128;
    }
    /* MXFP8: rowwise [G, N, ceil(K/32)] at (g, n, k/32); columnwise [G, K, ceil(N/32)] at (g, k, n/32) */
    return col ? g * K * cdiv(N, 32) + k * cdiv(N, 32) + n / 32 : g * N * cdiv(K, 32) + n * cdiv(K, 32) + k / 32;
}

/* ---- the reference checked on its own ------------------------------------------------- */

/* The second formulation: every element's set by set_index, the amax of all sets in one pass
 * over the elements, then each element's code from its set's factor. Writes codes, scales
 * (storage form) and amax like ref_weight_quantize. */
static void alt_weight_quantize(const moex_quant_params *p, int64_t G, int64_t N, int64_t K, const double *w,
                                ref_quant_out *out) {
    const int mx = p->recipe == MOEX_QUANT_MXFP8;
    for (int col = 0; col < 2; col++) {
        uint8_t *data = col ? out->col_data : out->row_data;
        void *scales = col ? out->col_scales : out->row_scales;
        if (!data) continue;
        const wlayout L = wlayout_of(p->recipe, G, N, K);
        const int64_t ns = col ? L.n_cs : L.n_rs;
        double *amax = tu_doubles(ns);
        int *nan = (int *)tu_zalloc((size_t)(ns + 1) * sizeof(int));
        for (int64_t g = 0; g < G; g++)
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < K; k++) {
                    const int64_t s = set_index(p->recipe, col, G, N, K, g, n, k);
                    const double v = w[(g * N + n) * K + k];
                    if (isnan(v))
                        nan[s] = 1;
                    else if (fabs(v) > amax[s])
                        amax[s] = fabs(v);
                }
        for (int64_t s = 0; s < ns; s++) {
            if (mx) {
                ((uint8_t *)scales)[s] = (uint8_t)(ref_mx_exponent(p->fp8, amax[s]) + 127);   /* NaNs left out */
            } else {
                const double a = nan[s] ? NAN : amax[s];
                ((float *)scales)[s] = (float)ref_quant_dequant_scale(ref_quant_factor(p, a));
                if (out->amax && p->recipe == MOEX_QUANT_GROUP) out->amax[s] = a;
            }
        }
        for (int64_t g = 0; g < G; g++)
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < K; k++) {
                    const int64_t s = set_index(p->recipe, col, G, N, K, g, n, k);
                    double f;
                    if (mx)
                        f = ldexp(1.0, 127 - ((uint8_t *)scales)[s]);
                    else
                        f = ref_quant_factor(p, nan[s] ? NAN : amax[s]);
                    const uint8_t c = ref_fp8_encode(p->fp8, (double)(float)(w[(g * N + n) * K + k] * f));
                    if (col)
                        data[(g * K + k) * N + n] = c;
                    else
                        data[(g * N + n) * K + k] = c;
                }
        free(amax), free(nan);
    }
}

static int same_bytes(const void *a, const void *b, size_t n) { return n == 0 || memcmp(a, b, n) == 0; }

/* amax values: NaN-ness, else the same f32 bits. */
static int same_amax(const double *a, const double *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!same_value(a[i], b[i])) return 0;
    return 1;
}

static void check_reference_case(const moex_quant_params *p, int64_t G, int64_t N, int64_t K, const double *w,
                                 const char *what) {
    const wlayout L = wlayout_of(p->recipe, G, N, K);
    const size_t nd = (size_t)(G * N * K);
    ref_quant_out a, b;
    memset(&a, 0, sizeof a), memset(&b, 0, sizeof b);
    a.row_data = (uint8_t *)tu_alloc(nd), a.col_data = (uint8_t *)tu_alloc(nd);
    b.row_data = (uint8_t *)tu_alloc(nd), b.col_data = (uint8_t *)tu_alloc(nd);
    a.row_scales = tu_alloc((size_t)L.n_rs * L.ses), a.col_scales = tu_alloc((size_t)L.n_cs * L.ses);
    b.row_scales = tu_alloc((size_t)L.n_rs * L.ses), b.col_scales = tu_alloc((size_t)L.n_cs * L.ses);
    a.amax = tu_doubles(G), b.amax = tu_doubles(G);
    ref_weight_quantize(p, G, N, K, w, &a);
    alt_weight_quantize(p, G, N, K, w, &b);
    CHECK_MSG(same_bytes(a.row_data, b.row_data, nd) && same_bytes(a.col_data, b.col_data, nd),
              "reference %s %s %s: codes differ from the set-index formulation", what, recipe_name(p->recipe),
              moex_dtype_name(p->fp8));
    CHECK_MSG(same_bytes(a.row_scales, b.row_scales, (size_t)L.n_rs * L.ses) &&
                  same_bytes(a.col_scales, b.col_scales, (size_t)L.n_cs * L.ses),
              "reference %s %s %s: scales differ from the set-index formulation", what, recipe_name(p->recipe),
              moex_dtype_name(p->fp8));
    if (p->recipe == MOEX_QUANT_GROUP)
        CHECK_MSG(same_amax(a.amax, b.amax, G), "reference %s: GROUP amax differs from the set-index formulation",
                  what);

    /* against the grouped-row reference: rows [G N, K], G groups of N rows */
    int64_t *splits = (int64_t *)tu_alloc((size_t)(G ? G : 1) * sizeof(int64_t));
    for (int64_t g = 0; g < G; g++) splits[g] = N;
    const int64_t T = G * N;
    if (p->recipe == MOEX_QUANT_GROUP || p->recipe == MOEX_QUANT_MXFP8) {
        int64_t rsh[2], csh[2];
        ref_quant_scales_shape(p->recipe, 0, G, T, K, rsh);
        ref_quant_scales_shape(p->recipe, 1, G, T, K, csh);
        const int64_t nrs = rsh[0] * (p->recipe == MOEX_QUANT_GROUP ? 1 : rsh[1]);
        const int64_t ncs = csh[0] * (p->recipe == MOEX_QUANT_GROUP ? 1 : csh[1]);
        ref_quant_out c;
        memset(&c, 0, sizeof c);
        c.row_data = (uint8_t *)tu_alloc(nd), c.col_data = (uint8_t *)tu_alloc(nd);
        c.row_scales = tu_alloc((size_t)nrs * L.ses), c.col_scales = tu_alloc((size_t)ncs * L.ses);
        c.amax = tu_doubles(G);
        ref_group_quantize(p, G, T, K, splits, w, &c);
        int bad = !same_bytes(a.row_data, c.row_data, nd) || !same_bytes(a.row_scales, c.row_scales, (size_t)L.n_rs * L.ses);
        for (int64_t g = 0; g < G; g++)
            for (int64_t k = 0; k < K; k++)
                for (int64_t n = 0; n < N; n++) {
                    bad |= a.col_data[(g * K + k) * N + n] != c.col_data[k * T + g * N + n];
                    if (p->recipe == MOEX_QUANT_MXFP8 && n % 32 == 0)   /* tile n/32 of group g: column g ceil(N/32) + n/32 */
                        bad |= ((uint8_t *)a.col_scales)[(g * K + k) * cdiv(N, 32) + n / 32] !=
                               ((uint8_t *)c.col_scales)[k * csh[1] + g * cdiv(N, 32) + n / 32];
                }
        if (p->recipe == MOEX_QUANT_GROUP)
            bad |= !same_bytes(a.col_scales, c.col_scales, (size_t)G * 4) || !same_amax(a.amax, c.amax, G);
        CHECK_MSG(!bad, "reference %s %s %s: differs from the grouped-row reference", what, recipe_name(p->recipe),
                  moex_dtype_name(p->fp8));
        if (p->recipe == MOEX_QUANT_GROUP && G == 1) {   /* GROUP with G = 1 is TENSOR */
            moex_quant_params pt = *p;
            pt.recipe = MOEX_QUANT_TENSOR;
            ref_group_quantize(&pt, G, T, K, splits, w, &c);
            CHECK_MSG(same_bytes(a.row_data, c.row_data, nd) && same_bytes(a.row_scales, c.row_scales, 4) &&
                          same_amax(a.amax, c.amax, 1),
                      "reference %s: GROUP with G = 1 differs from TENSOR", what);
        }
        free(c.row_data), free(c.col_data), free(c.row_scales), free(c.col_scales), free(c.amax);
    }
    if (p->recipe != MOEX_QUANT_MXFP8) {   /* GROUP and BLOCK: the columnwise copy is the transpose */
        int bad = 0;
        for (int64_t g = 0; g < G; g++)
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < K; k++) bad |= a.row_data[(g * N + n) * K + k] != a.col_data[(g * K + k) * N + n];
        CHECK_MSG(!bad, "reference %s %s: columnwise data is not the transpose", what, recipe_name(p->recipe));
    }
    free(splits);
    free(a.row_data), free(a.col_data), free(a.row_scales), free(a.col_scales), free(a.amax);
    free(b.row_data), free(b.col_data), free(b.row_scales), free(b.col_scales), free(b.amax);
}

static void check_reference(tu_rng *r) {
    const moex_dtype E4 = MOEX_DTYPE_E4M3;
    /* layouts */
    int64_t sh[3];
    CHECK(ref_weight_scales_shape(MOEX_QUANT_GROUP, 1, 5, 7, 9, sh) == 1 && sh[0] == 5);
    CHECK(ref_weight_scales_shape(MOEX_QUANT_BLOCK, 0, 5, 257, 129, sh) == 3 && sh[0] == 5 && sh[1] == 3 && sh[2] == 2);
    CHECK(ref_weight_scales_shape(MOEX_QUANT_BLOCK, 1, 5, 257, 129, sh) == 3 && sh[1] == 2 && sh[2] == 3);
    CHECK(ref_weight_scales_shape(MOEX_QUANT_MXFP8, 0, 5, 33, 300, sh) == 3 && sh[1] == 33 && sh[2] == 10);
    CHECK(ref_weight_scales_shape(MOEX_QUANT_MXFP8, 1, 5, 33, 300, sh) == 3 && sh[1] == 300 && sh[2] == 2);
    for (int rc = 0; rc < 3; rc++)
        for (int col = 0; col < 2; col++) {
            int bad = 0;
            for (int64_t g = 0; g < 2; g++)
                for (int64_t n = 0; n < 259; n += 3)
                    for (int64_t k = 0; k < 301; k += 7)
                        bad |= ref_weight_scale_index(wrecipes[rc], col, 2, 259, 301, g, n, k) !=
                               set_index(wrecipes[rc], col, 2, 259, 301, g, n, k);
            CHECK_MSG(!bad, "reference: ref_weight_scale_index %s %s differs from the test's", recipe_name(wrecipes[rc]),
                      col ? "columnwise" : "rowwise");
        }
    /* a hand-made case: BLOCK, two blocks along K with different amax */
    {
        double w[1 * 2 * 130];
        for (int i = 0; i < 260; i++) w[i] = 1.0;
        w[5] = 448.0 * 4;    /* block (0, 0): amax 1792 -> s = 0.25 */
        w[130 + 129] = -7.0; /* block (0, 1): amax 7 -> s = 64 */
        moex_quant_params p = {.recipe = MOEX_QUANT_BLOCK, .fp8 = E4, .amax_epsilon = 0.0f,
                               .rounding = MOEX_SCALE_EXACT, .scale_layout = MOEX_SCALES_PLAIN};
        uint8_t rd[260], cd[260];
        float rs[2], cs[2];
        ref_quant_out o = {.row_data = rd, .row_scales = rs, .col_data = cd, .col_scales = cs};
        ref_weight_quantize(&p, 1, 2, 130, w, &o);
        CHECK(rs[0] == 4.0f && rs[1] == 1.0f / 64.0f && cs[0] == rs[0] && cs[1] == rs[1]);
        CHECK(rd[5] == 0x7E && ref_fp8_decode(E4, rd[0]) == 0.25 && ref_fp8_decode(E4, rd[128]) == 64.0);
        CHECK(rd[130 + 129] == 0xFE && cd[129 * 2 + 1] == 0xFE && cd[5 * 2 + 0] == 0x7E);
        p.recipe = MOEX_QUANT_MXFP8;
        uint8_t mrs[2 * 5], mcs[130 * 1];
        ref_quant_out m = {.row_data = rd, .row_scales = mrs, .col_data = cd, .col_scales = mcs};
        ref_weight_quantize(&p, 1, 2, 130, w, &m);
        /* row 0: block 0 amax 1792 = 1.75 2^10 -> E = 2; other blocks amax 1 -> E = -8 */
        CHECK(mrs[0] == 129 && mrs[1] == 119 && mrs[5 + 4] == 119 + 2);   /* row 1 block 4: amax 7 -> E = 2 - 8 */
        CHECK(mcs[5] == 129 && mcs[0] == 119 && mcs[129] == 121);
    }
    /* the two formulations and the row reference on random and special weights */
    static const int64_t shp[][3] = {{1, 33, 31}, {2, 130, 33}, {1, 35, 257}, {5, 1, 33}, {2, 257, 3}, {1, 0, 5}, {2, 3, 0}};
    for (size_t si = 0; si < sizeof shp / sizeof shp[0]; si++)
        for (int rc = 0; rc < 3; rc++)
            for (int f = 0; f < 2; f++) {
                const int64_t G = shp[si][0], N = shp[si][1], K = shp[si][2];
                double *w = tu_doubles(G * N * K);
                for (int64_t i = 0; i < G * N * K; i++) {
                    double v = ref_round(MOEX_DTYPE_BF16,
                                         tu_uniform_range(r, -1, 1) * ldexp(1.0, (int)tu_randint(r, 30) - 20));
                    const int64_t u = tu_randint(r, 60);
                    if (u == 0) v = NAN;
                    else if (u == 1) v = INFINITY;
                    else if (u == 2) v = -0.0;
                    w[i] = v;
                }
                moex_quant_params p = {.recipe = wrecipes[rc], .fp8 = f ? MOEX_DTYPE_E5M2 : E4,
                                       .amax_epsilon = (si % 3 == 1) ? 0.5f : 0.0f,
                                       .rounding = (si + f) % 2 ? MOEX_SCALE_POW2 : MOEX_SCALE_EXACT,
                                       .scale_layout = MOEX_SCALES_PLAIN};
                char what[64];
                snprintf(what, sizeof what, "G=%lld N=%lld K=%lld", (long long)G, (long long)N, (long long)K);
                check_reference_case(&p, G, N, K, w, what);
                free(w);
            }
}

/* ---- one case ----------------------------------------------------------------------- */

typedef struct wcase {
    moex_dtype dt, ydt;         /* w; dequantize's w                                    */
    moex_quant_params p;
    int row, col, amax;         /* which outputs                                        */
    int null_empty;             /* empty tensors passed with NULL data                  */
    int64_t G, N, K;
    const double *w;            /* [G, N, K], exact in dt                               */
    const char *what;
} wcase;

/* Compares the codes of one copy (rowwise [G, N, K], columnwise [G, K, N]). */
static void compare_codes(const wcase *c, const wlayout *L, const char *label, int col, const uint8_t *got,
                          const uint8_t *want, const void *gs, const void *ws) {
    const int64_t G = c->G, N = c->N, K = c->K;
    int64_t bad = 0;
    for (int64_t g = 0; g < G; g++)
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) {
                const int64_t i = col ? (g * K + k) * N + n : (g * N + n) * K + k;
                if (got[i] == want[i]) continue;
                if (bad++ < 3 && n_mismatch_reports++ < 200) {
                    const int64_t si = set_index(c->p.recipe, col, G, N, K, g, n, k);
                    printf("  MISMATCH %s %s data[%lld, %lld, %lld] (w[%lld, %lld, %lld] = %a): want 0x%02X (%g), "
                           "got 0x%02X (%g); scale[%lld] want %a, got %a\n",
                           label, col ? "columnwise" : "rowwise", (long long)g, (long long)(col ? k : n),
                           (long long)(col ? n : k), (long long)g, (long long)n, (long long)k,
                           c->w[(g * N + n) * K + k], want[i], ref_fp8_decode(c->p.fp8, want[i]), got[i],
                           ref_fp8_decode(c->p.fp8, got[i]), (long long)si, scale_value(L->sdt, ws, si),
                           scale_value(L->sdt, gs, si));
                }
            }
    CHECK_MSG(bad == 0, "%s: %s data: %lld codes differ from the reference", label, col ? "columnwise" : "rowwise",
              (long long)bad);
}

/* Compares every scale (all are written: poison left behind differs from the reference). */
static void compare_scales(const wcase *c, const wlayout *L, const char *label, int col, const void *got,
                           const void *want) {
    const int64_t n = col ? L->n_cs : L->n_rs;
    const int64_t *shape = col ? L->cs_shape : L->rs_shape;
    const int ndim = col ? L->cs_ndim : L->rs_ndim;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const int same = L->ses == 1 ? ((const uint8_t *)got)[i] == ((const uint8_t *)want)[i]
                                     : bits_of_f32(((const float *)got)[i]) == bits_of_f32(((const float *)want)[i]);
        if (same) continue;
        if (bad++ < 3 && n_mismatch_reports++ < 200) {
            char at[96];
            if (ndim == 3)
                snprintf(at, sizeof at, "[%lld, %lld, %lld]", (long long)(i / (shape[1] * shape[2])),
                         (long long)(i / shape[2] % shape[1]), (long long)(i % shape[2]));
            else
                snprintf(at, sizeof at, "[%lld]", (long long)i);
            if (L->ses == 1)
                printf("  MISMATCH %s %s scales%s: want 0x%02X, got 0x%02X\n", label, col ? "columnwise" : "rowwise", at,
                       ((const uint8_t *)want)[i], ((const uint8_t *)got)[i]);
            else
                printf("  MISMATCH %s %s scales%s: want %a (0x%08X), got %a (0x%08X)\n", label,
                       col ? "columnwise" : "rowwise", at, (double)((const float *)want)[i],
                       bits_of_f32(((const float *)want)[i]), (double)((const float *)got)[i],
                       bits_of_f32(((const float *)got)[i]));
        }
    }
    CHECK_MSG(bad == 0, "%s: %s scales: %lld elements differ from the reference", label,
              col ? "columnwise" : "rowwise", (long long)bad);
}

static moex_tensor data_tensor(const wcase *c, void *buf, int col) {
    return col ? moex_tensor_3d(buf, c->p.fp8, c->G, c->K, c->N) : moex_tensor_3d(buf, c->p.fp8, c->G, c->N, c->K);
}

/* y (c->ydt [G, N, K]) = moex_weight_dequantize of one copy of case c with params p. */
static moex_status wdequant_into(const wcase *c, const moex_quant_params *p, moex_quant_orientation o,
                                 const uint8_t *data, moex_tensor scales, void *y) {
    const int64_t G = c->G, N = c->N, K = c->K, n = G * N * K;
    moex_weight_dequantize_args a;
    memset(&a, 0, sizeof a);
    a.params = *p;
    a.orientation = o;
    const int nul = c->null_empty;
    a.src.data = data_tensor(c, nul && n == 0 ? NULL : (void *)data, o == MOEX_QUANT_COLUMNWISE);
    a.src.scales = scales;
    a.w = moex_tensor_3d(nul && n == 0 ? NULL : y, c->ydt, G, N, K);
    size_t bytes = 0;
    moex_status st = moex_weight_dequantize_workspace_size(ctx, &a, &bytes);
    CHECK_STATUS(ctx, st, MOEX_OK);
    void *ws = tu_workspace(bytes);
    if (st == MOEX_OK) {
        st = moex_weight_dequantize(ctx, &a, ws, bytes, NULL);
        CHECK_STATUS(ctx, st, MOEX_OK);
    }
    free(ws);
    return st;
}

/* Dequantizes (data, scales) of one copy with the library and the reference; compares all. */
static void check_dequantize(const wcase *c, const wlayout *L, const char *label, moex_quant_orientation o,
                             const uint8_t *data, const void *scales) {
    const int64_t G = c->G, N = c->N, K = c->K, n = G * N * K;
    const int col = o == MOEX_QUANT_COLUMNWISE;
    void *y = tu_poisoned(c->ydt, n);
    const int64_t ns = col ? L->n_cs : L->n_rs;
    const moex_tensor st_scales = scales_tensor(c->null_empty && ns == 0 ? NULL : (void *)scales, L->sdt,
                                                col ? L->cs_ndim : L->rs_ndim, col ? L->cs_shape : L->rs_shape);
    if (wdequant_into(c, &c->p, o, data, st_scales, y) == MOEX_OK) {
        double *want = tu_doubles(n);
        ref_weight_dequantize(&c->p, o, G, N, K, data, scales, c->ydt, want);
        int64_t bad = 0;
        for (int64_t i = 0; i < n; i++) {
            const double gv = ref_load(c->ydt, y, i);
            if (same_value(gv, want[i])) continue;
            if (bad++ < 3 && n_mismatch_reports++ < 200) {
                const int64_t g = i / (N * K), nn = i / K % N, k = i % K;
                const int64_t di = col ? (g * K + k) * N + nn : i, si = set_index(c->p.recipe, col, G, N, K, g, nn, k);
                printf("  MISMATCH %s dequantize %s -> %s w[%lld, %lld, %lld]: code 0x%02X (%g), scale %a: want %a, "
                       "got %a\n",
                       label, col ? "columnwise" : "rowwise", moex_dtype_name(c->ydt), (long long)g, (long long)nn,
                       (long long)k, data[di], ref_fp8_decode(c->p.fp8, data[di]), scale_value(L->sdt, scales, si),
                       want[i], gv);
            }
        }
        CHECK_MSG(bad == 0, "%s: dequantize %s -> %s: %lld values differ from the reference", label,
                  col ? "columnwise" : "rowwise", moex_dtype_name(c->ydt), (long long)bad);
        free(want);
    }
    free(y);
}

/* moex_weight_quantize with a workspace of the size it asks for; both statuses checked. */
static moex_status quantize_call(const moex_weight_quantize_args *a) {
    size_t bytes = 0;
    moex_status st = moex_weight_quantize_workspace_size(ctx, a, &bytes);
    CHECK_STATUS(ctx, st, MOEX_OK);
    void *ws = tu_workspace(bytes);
    if (st == MOEX_OK) {
        st = moex_weight_quantize(ctx, a, ws, bytes, NULL);
        CHECK_STATUS(ctx, st, MOEX_OK);
    }
    free(ws);
    return st;
}

/* An MXFP8 case again with MOEX_SCALES_MX_SWIZZLED (docs/ops.md 9.8): the same data bytes
 * as the plain call (rd, cd), every byte of the scale vectors the reference's plain scales
 * (wrs, wcs) placed per expert by ref_mx_swizzle (padding 0), and dequantizing from them gives
 * the bytes of dequantizing the plain copies (rs, cs). */
static void check_swizzled(const wcase *c, const wlayout *L, const char *label, const moex_weight_quantize_args *plain,
                           const uint8_t *rd, const uint8_t *cd, const void *rs, const void *cs, const uint8_t *wrs,
                           const uint8_t *wcs) {
    const int64_t G = c->G, N = c->N, K = c->K, n = G * N * K;
    const int64_t R[2] = {N, K}, C[2] = {cdiv(K, 32), cdiv(N, 32)};   /* each expert's plain [R, C] */
    const uint8_t *data[2] = {rd, cd}, *want_plain[2] = {wrs, wcs};
    const void *plain_scales[2] = {rs, cs};
    moex_weight_quantize_args a = *plain;
    a.params.scale_layout = MOEX_SCALES_MX_SWIZZLED;
    moex_quant_tensor *copy[2] = {&a.rowwise, &a.columnwise};
    uint8_t *got[2] = {NULL, NULL}, *sc[2] = {NULL, NULL};
    int64_t len[2], mat[2];
    for (int o = 0; o < 2; o++) {
        mat[o] = 128 * cdiv(R[o], 128) * 4 * cdiv(C[o], 4), len[o] = G * mat[o];
        if (!data[o]) continue;
        got[o] = (uint8_t *)tu_poisoned(c->p.fp8, n), sc[o] = (uint8_t *)tu_poisoned(MOEX_DTYPE_E8M0, len[o]);
        copy[o]->data.data = got[o];
        copy[o]->scales = moex_tensor_1d(sc[o], MOEX_DTYPE_E8M0, len[o]);
    }
    const moex_status st = quantize_call(&a);
    for (int o = 0; o < 2 && st == MOEX_OK; o++) {
        if (!data[o]) continue;
        const char *name = o ? "columnwise" : "rowwise";
        CHECK_MSG(same_bytes(got[o], data[o], (size_t)n), "%s: swizzled: %s data differs from the plain call's", label,
                  name);
        uint8_t *want = (uint8_t *)tu_alloc((size_t)(len[o] > 0 ? len[o] : 1));
        for (int64_t g = 0; g < G; g++)
            ref_mx_swizzle(want_plain[o] + g * R[o] * C[o], C[o], R[o], C[o], want + g * mat[o]);
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < len[o]; i++)
            if (sc[o][i] != want[i] && bad++ == 0) first = i;
        if (bad)
            printf("  MISMATCH %s swizzled %s scales[%lld]: want 0x%02X, got 0x%02X\n", label, name, (long long)first,
                   want[first], sc[o][first]);
        CHECK_MSG(bad == 0, "%s: swizzled %s scales: %lld of %lld bytes differ from the reference", label, name,
                  (long long)bad, (long long)len[o]);
        void *y0 = tu_poisoned(c->ydt, n), *y1 = tu_poisoned(c->ydt, n);
        const moex_tensor plain_t = scales_tensor((void *)plain_scales[o], L->sdt, o ? L->cs_ndim : L->rs_ndim,
                                                  o ? L->cs_shape : L->rs_shape);
        if (wdequant_into(c, &c->p, (moex_quant_orientation)o, data[o], plain_t, y0) == MOEX_OK &&
            wdequant_into(c, &a.params, (moex_quant_orientation)o, got[o], copy[o]->scales, y1) == MOEX_OK)
            CHECK_MSG(same_bytes(y0, y1, (size_t)n * moex_dtype_size(c->ydt)),
                      "%s: dequantize from the swizzled %s scales differs from the plain ones'", label, name);
        free(want), free(y0), free(y1);
    }
    for (int o = 0; o < 2; o++) free(got[o]), free(sc[o]);
}

static void run_case(const wcase *c) {
    const int64_t G = c->G, N = c->N, K = c->K, n = G * N * K;
    const wlayout L = wlayout_of(c->p.recipe, G, N, K);
    char label[320];
    snprintf(label, sizeof label, "[%s %s %s %s eps=%g %s%s%s%s G=%lld N=%lld K=%lld %s]", moex_dtype_name(c->dt),
             recipe_name(c->p.recipe), moex_dtype_name(c->p.fp8), c->p.rounding == MOEX_SCALE_POW2 ? "POW2" : "EXACT",
             (double)c->p.amax_epsilon, c->row ? "row" : "", c->col ? "+col" : "", c->amax ? "+amax" : "",
             c->null_empty ? " NULL-empty" : "", (long long)G, (long long)N, (long long)K, c->what);
    tu_log("case %s\n", label);
    const int failures_before = tu_failures();
    n_cases++;

    const int nul = c->null_empty;
    void *wb = tu_buffer(c->dt, c->w, n);
    uint8_t *rd = NULL, *cd = NULL, *wrd = NULL, *wcd = NULL;
    void *rs = NULL, *cs = NULL, *wrs = NULL, *wcs = NULL;
    float *am = NULL;
    double *wam = NULL;
    moex_weight_quantize_args a;
    memset(&a, 0, sizeof a);
    a.w = moex_tensor_3d(nul && n == 0 ? NULL : wb, c->dt, G, N, K);
    a.params = c->p;
    ref_quant_out ro;
    memset(&ro, 0, sizeof ro);
    if (c->row) {
        rd = (uint8_t *)tu_poisoned(c->p.fp8, n), rs = tu_poisoned(L.sdt, L.n_rs);
        wrd = (uint8_t *)tu_poisoned(c->p.fp8, n), wrs = tu_poisoned(L.sdt, L.n_rs);
        a.rowwise.data = data_tensor(c, nul && n == 0 ? NULL : rd, 0);
        a.rowwise.scales = scales_tensor(nul && L.n_rs == 0 ? NULL : rs, L.sdt, L.rs_ndim, L.rs_shape);
        ro.row_data = wrd, ro.row_scales = wrs;
    }
    if (c->col) {
        cd = (uint8_t *)tu_poisoned(c->p.fp8, n), cs = tu_poisoned(L.sdt, L.n_cs);
        wcd = (uint8_t *)tu_poisoned(c->p.fp8, n), wcs = tu_poisoned(L.sdt, L.n_cs);
        a.columnwise.data = data_tensor(c, nul && n == 0 ? NULL : cd, 1);
        a.columnwise.scales = scales_tensor(nul && L.n_cs == 0 ? NULL : cs, L.sdt, L.cs_ndim, L.cs_shape);
        ro.col_data = wcd, ro.col_scales = wcs;
    }
    if (c->amax && L.n_amax >= 0 && c->p.recipe == MOEX_QUANT_GROUP) {
        am = (float *)tu_poisoned(MOEX_DTYPE_F32, L.n_amax);
        wam = tu_doubles(L.n_amax);
        a.amax = moex_tensor_1d(nul && G == 0 ? NULL : am, MOEX_DTYPE_F32, L.n_amax);
        ro.amax = wam;
    }

    const moex_status st = quantize_call(&a);
    if (st == MOEX_OK) {
        ref_weight_quantize(&c->p, G, N, K, c->w, &ro);
        if (c->row) {
            compare_codes(c, &L, label, 0, rd, wrd, rs, wrs);
            compare_scales(c, &L, label, 0, rs, wrs);
        }
        if (c->col) {
            compare_codes(c, &L, label, 1, cd, wcd, cs, wcs);
            compare_scales(c, &L, label, 1, cs, wcs);
        }
        /* the input is not written */
        void *wb2 = tu_buffer(c->dt, c->w, n);
        CHECK_MSG(same_bytes(wb, wb2, (size_t)n * moex_dtype_size(c->dt)), "%s: w was modified", label);
        free(wb2);
        if (am) {
            int64_t bad = 0;
            for (int64_t g = 0; g < L.n_amax; g++) {
                const double got = (double)am[g];
                if (same_value(got, wam[g]) && (got != got || bits_of_f32(am[g]) == bits_of_f32((float)wam[g])))
                    continue;
                if (bad++ < 3) printf("  MISMATCH %s amax[%lld]: want %a, got %a\n", label, (long long)g, wam[g], got);
            }
            CHECK_MSG(bad == 0, "%s: amax: %lld values differ from the reference", label, (long long)bad);
        }
        if (c->row) check_dequantize(c, &L, label, MOEX_QUANT_ROWWISE, rd, rs);
        if (c->col) check_dequantize(c, &L, label, MOEX_QUANT_COLUMNWISE, cd, cs);
        if (c->p.recipe == MOEX_QUANT_MXFP8 && !nul)
            check_swizzled(c, &L, label, &a, rd, cd, rs, cs, (const uint8_t *)wrs, (const uint8_t *)wcs);
    }
    if (tu_failures() != failures_before) printf("  (failures above: case %s)\n", label);
    free(wb), free(rd), free(rs), free(cd), free(cs), free(wrd), free(wrs), free(wcd), free(wcs), free(am), free(wam);
}

/* ---- inputs ----------------------------------------------------------------------- */

typedef enum flavor { FL_NORMAL, FL_TIES, FL_SPECIAL, FL_EXTREME, FL_NUM } flavor;
static const char *flavor_names[FL_NUM] = {"normal", "ties", "special", "extreme"};

/* w [G, N, K] of a flavour, exact in dt. */
static void make_w(tu_rng *r, flavor fl, moex_dtype dt, moex_dtype fmt, int64_t G, int64_t N, int64_t K, double *w,
                   int *kk_out) {
    const int64_t R = G * N;   /* all rows of all experts */
    memset(w, 0, (size_t)(R * K) * sizeof(double));
    if (fl == FL_NORMAL || fl == FL_SPECIAL) {
        int *er = (int *)tu_alloc((size_t)(R + 1) * sizeof(int)), *ec = (int *)tu_alloc((size_t)(K / 32 + 1) * sizeof(int));
        for (int64_t i = 0; i < R; i++) er[i] = (int)tu_randint(r, 11) - 5;
        for (int64_t j = 0; j <= K / 32; j++) ec[j] = (int)tu_randint(r, 11) - 5;
        for (int64_t i = 0; i < R; i++)
            for (int64_t k = 0; k < K; k++) {
                double v = tu_uniform_range(r, -1, 1) * ldexp(1.0, er[i] + ec[k / 32]);
                if (tu_randint(r, 8) == 0) v = ldexp(v, -(int)tu_randint(r, 21));
                w[i * K + k] = ref_round(dt, v);
            }
        free(er), free(ec);
    }
    if (fl == FL_SPECIAL) {
        for (int64_t i = 0; i < R; i++)   /* zero rows */
            if (tu_randint(r, 10) == 0)
                for (int64_t k = 0; k < K; k++) w[i * K + k] = tu_randint(r, 2) ? 0.0 : -0.0;
        for (int64_t g = 0; g < G; g++)   /* zero columns of an expert */
            for (int64_t k = 0; k < K; k++)
                if (tu_randint(r, 10) == 0)
                    for (int64_t n = 0; n < N; n++) w[(g * N + n) * K + k] = tu_randint(r, 2) ? 0.0 : -0.0;
        for (int64_t i = 0; i < R; i++)
            for (int64_t k = 0; k < K; k++) {
                double *v = &w[i * K + k];
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
        const int nt = tie_values(fmt, tv);
        int lo = -20, hi = 20;
        if (dt == MOEX_DTYPE_F16) {
            lo = fmt == MOEX_DTYPE_E4M3 ? -8 : -7;
            hi = fmt == MOEX_DTYPE_E4M3 ? 6 : -1;   /* 4 max 2^kk stays finite in f16 */
        }
        const int kk = lo + (int)tu_randint(r, hi - lo + 1);
        *kk_out = kk;
        const double mx = ref_fp8_max(fmt);
        for (int64_t g = 0; g < G; g++)
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < K; k++) {
                    const double sgn = tu_randint(r, 2) ? 1.0 : -1.0;
                    /* every 1x32 row block, 32x1 column block, 128x128 block and expert holds +-max 2^kk */
                    const double v = (n % 32 == 0 || k % 32 == 0) ? mx : tv[tu_randint(r, nt)];
                    w[(g * N + n) * K + k] = ref_round(dt, sgn * ldexp(v, kk));
                }
    }
    if (fl == FL_EXTREME) {
        const int64_t shift = tu_randint(r, 3);
        const int per_block = (int)tu_randint(r, 2);   /* classes per expert, or per 128x128 block */
        for (int64_t g = 0; g < G; g++)
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < K; k++) {
                    const int cls = (int)((g + shift + (per_block ? n / 128 + k / 128 : 0)) % 3);
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
                    double x = ref_round(dt, v);
                    if (isinf(x)) x = (v < 0 ? -1 : 1) * dt_max(dt);
                    w[(g * N + n) * K + k] = x;
                }
    }
}

/* ---- the grid --------------------------------------------------------------------- */

typedef struct wshape {
    int64_t G, N, K;
} wshape;

/* Every combination runs the small shapes and one of the large ones (in turn). */
static const wshape shapes[] = {
    {.G = 1, .N = 1, .K = 1},
    {.G = 1, .N = 33, .K = 31},
    {.G = 5, .N = 1, .K = 300},
    {.G = 5, .N = 257, .K = 1},
    {.G = 2, .N = 31, .K = 130},
    {.G = 5, .N = 33, .K = 33},
    {.G = 0, .N = 33, .K = 31},
    {.G = 3, .N = 0, .K = 31},
    {.G = 3, .N = 33, .K = 0},
};
static const wshape big_shapes[] = {
    {.G = 5, .N = 130, .K = 129},
    {.G = 1, .N = 257, .K = 300},
    {.G = 2, .N = 129, .K = 257},
    {.G = 1, .N = 128, .K = 128},
};
#define N_SHAPES ((int)(sizeof shapes / sizeof shapes[0]))
#define N_BIG ((int)(sizeof big_shapes / sizeof big_shapes[0]))

static void main_grid(tu_rng *r) {
    int combo = 0;
    for (int d = 0; d < 3; d++)
        for (int rc = 0; rc < 3; rc++)
            for (int f = 0; f < 2; f++)
                for (int rnd = 0; rnd < 2; rnd++)
                    for (int e = 0; e < 2; e++, combo++)
                        for (int si = 0; si <= N_SHAPES; si++) {
                            const wshape *s = si < N_SHAPES ? &shapes[si] : &big_shapes[(combo + combo / 5) % N_BIG];
                            wcase c;
                            memset(&c, 0, sizeof c);
                            c.dt = wdts[d];
                            c.ydt = wdts[(d + si) % 3];
                            c.p.recipe = wrecipes[rc];
                            c.p.fp8 = f ? MOEX_DTYPE_E5M2 : MOEX_DTYPE_E4M3;
                            c.p.rounding = rnd ? MOEX_SCALE_POW2 : MOEX_SCALE_EXACT;
                            c.p.amax_epsilon = e ? pick_eps(r) : 0.0f;
                            const int orient = (si + combo) % 3;   /* 0 both, 1 rowwise, 2 columnwise */
                            c.row = orient != 2, c.col = orient != 1;
                            c.amax = c.p.recipe == MOEX_QUANT_GROUP && (si + combo / 3) % 2 == 0;
                            c.null_empty = (si + combo) % 2;
                            c.G = s->G, c.N = s->N, c.K = s->K;
                            const flavor fl = (flavor)((si + combo / 3) % FL_NUM);
                            double *w = tu_doubles(c.G * c.N * c.K);
                            int kk = 0;
                            make_w(r, fl, c.dt, c.p.fp8, c.G, c.N, c.K, w, &kk);
                            char what[64];
                            if (fl == FL_TIES)
                                snprintf(what, sizeof what, "ties k=%d", kk);
                            else
                                snprintf(what, sizeof what, "%s", flavor_names[fl]);
                            c.w = w, c.what = what;
                            run_case(&c);
                            free(w);
                        }
}

/* Single values through every recipe and parameter set (G = 1, N = K = 1), and the same
 * value as the largest of a 2 x 2 x 3 weight (GROUP 1 set, BLOCK 1 block, MXFP8 rows of 3,
 * columns of 2). */
static void single_values(void) {
    static const double vals[] = {0.0, -0.0, NAN, INFINITY, -INFINITY, FLT_MAX, -FLT_MAX, 0x1p-149, -0x1p-149,
                                  0x1p-126, 1e-38, 1.0, -3.0, 448.0, 464.0, 500.0, 57344.0, 61440.0, 1e6, 0x1.fffffep-120};
    static const float epss[] = {0.0f, 1e-30f, 1.0f, 1e30f, 1e-40f};
    for (int d = 0; d < 3; d++)
        for (size_t vi = 0; vi < sizeof vals / sizeof vals[0]; vi++) {
            double x = ref_round(wdts[d], vals[vi]);
            if (wdts[d] != MOEX_DTYPE_F32 && isinf(x) && !isinf(vals[vi])) continue;
            double w12[12];
            for (int i = 0; i < 12; i++) w12[i] = ref_round(wdts[d], (i % 2 ? -0.375 : 0.8125) * (i + 1) * 1e-3);
            w12[7] = x;
            for (int rc = 0; rc < 3; rc++)
                for (int f = 0; f < 2; f++)
                    for (int rnd = 0; rnd < 2; rnd++)
                        for (int e = 0; e < 5; e++) {
                            wcase c;
                            memset(&c, 0, sizeof c);
                            c.dt = wdts[d], c.ydt = wdts[(d + e) % 3];
                            c.p.recipe = wrecipes[rc];
                            c.p.fp8 = f ? MOEX_DTYPE_E5M2 : MOEX_DTYPE_E4M3;
                            c.p.rounding = rnd ? MOEX_SCALE_POW2 : MOEX_SCALE_EXACT;
                            c.p.amax_epsilon = epss[e];
                            c.row = c.col = 1;
                            c.amax = c.p.recipe == MOEX_QUANT_GROUP;
                            char what[64];
                            snprintf(what, sizeof what, "single w = %a", x);
                            c.G = 1, c.N = 1, c.K = 1, c.w = &x, c.what = what;
                            run_case(&c);
                            if (e % 2 == 0) {
                                snprintf(what, sizeof what, "w[0, 1, 1] = %a among small", x);
                                c.G = 2, c.N = 2, c.K = 3, c.w = w12;
                                run_case(&c);
                            }
                        }
        }
}

/* A fixed pattern of NaN, +-Inf and zeros among normal values, so that experts, 128x128
 * blocks and 32-blocks of both copies hold NaN and Inf together, Inf alone, NaN alone, or
 * neither; every recipe and format, EXACT or POW2 in turn. */
static void special_pattern(tu_rng *r) {
    enum { PG = 3, PN = 140, PK = 135 };
    double *w = tu_doubles(PG * PN * PK);
    for (int d = 0; d < 3; d++) {
        for (int64_t g = 0; g < PG; g++)
            for (int64_t n = 0; n < PN; n++)
                for (int64_t k = 0; k < PK; k++) {
                    double v = ref_round(wdts[d], tu_uniform_range(r, -6, 6));
                    const int64_t i = g * 7 + n, j = k;
                    if (g == 2) {   /* expert 2: no NaN, no Inf */
                    } else if ((i + j) % 37 == 0 && (g == 0 || n < 128)) v = NAN;
                    else if ((3 * i + j) % 41 == 0 && (g == 0 || k < 128)) v = INFINITY;
                    else if ((i + 2 * j) % 43 == 0 && g == 0) v = -INFINITY;
                    if ((i * j) % 11 == 5) v = (n & 1) ? 0.0 : -0.0;
                    w[(g * PN + n) * PK + k] = v;
                }
        for (int rc = 0; rc < 3; rc++)
            for (int f = 0; f < 2; f++)
                for (int rnd = (d + rc + f) % 2; rnd < 2; rnd += 2) {   /* one rounding in turn */
                    wcase c;
                    memset(&c, 0, sizeof c);
                    c.dt = wdts[d], c.ydt = wdts[(d + rc) % 3];
                    c.p.recipe = wrecipes[rc];
                    c.p.fp8 = f ? MOEX_DTYPE_E5M2 : MOEX_DTYPE_E4M3;
                    c.p.rounding = rnd ? MOEX_SCALE_POW2 : MOEX_SCALE_EXACT;
                    c.p.amax_epsilon = rnd ? 0.5f : 0.0f;
                    c.row = c.col = 1;
                    c.amax = c.p.recipe == MOEX_QUANT_GROUP;
                    c.G = PG, c.N = PN, c.K = PK, c.w = w, c.what = "NaN/Inf pattern";
                    run_case(&c);
                }
    }
    free(w);
}

/* ---- dequantize of arbitrary bytes ------------------------------------------------ */

static void dequantize_random(tu_rng *r) {
    const int64_t G = 3, N = 150, K = 70;
    for (int rc = 0; rc < 3; rc++)
        for (int f = 0; f < 2; f++)
            for (int o = 0; o < 2; o++)
                for (int d = 0; d < 3; d++) {
                    wcase c;
                    memset(&c, 0, sizeof c);
                    c.dt = MOEX_DTYPE_F32, c.ydt = wdts[d];
                    c.p.recipe = wrecipes[rc];
                    c.p.fp8 = f ? MOEX_DTYPE_E5M2 : MOEX_DTYPE_E4M3;
                    c.G = G, c.N = N, c.K = K;
                    double *w = tu_doubles(G * N * K);
                    c.w = w, c.what = "random bytes";
                    const wlayout L = wlayout_of(c.p.recipe, G, N, K);
                    char label[200];
                    snprintf(label, sizeof label, "[dequantize random bytes %s %s %s -> %s]", recipe_name(c.p.recipe),
                             moex_dtype_name(c.p.fp8), o ? "columnwise" : "rowwise", moex_dtype_name(c.ydt));
                    uint8_t *data = (uint8_t *)tu_alloc((size_t)(G * N * K));
                    for (int64_t i = 0; i < G * N * K; i++) data[i] = (uint8_t)tu_randint(r, 256);
                    const int64_t n = o ? L.n_cs : L.n_rs;
                    void *sc = tu_poisoned(L.sdt, n);
                    for (int64_t i = 0; i < n; i++) {
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
                            else if (u == 5) v = -0.0f;
                            else v = (float)ldexp(tu_uniform(r) + 0.5, (int)tu_randint(r, 60) - 40);
                            ((float *)sc)[i] = v;
                        }
                    }
                    n_cases++;
                    const int failures_before = tu_failures();
                    check_dequantize(&c, &L, label, o ? MOEX_QUANT_COLUMNWISE : MOEX_QUANT_ROWWISE, data, sc);
                    if (tu_failures() != failures_before) printf("  (failures above: case %s)\n", label);
                    free(data), free(sc), free(w);
                }
}

/* ---- bad arguments -------------------------------------------------------------------- */

/* N and K chosen so every transposed shape differs: ceil(N/128) = 1, ceil(K/128) = 2,
 * ceil(N/32) = 2, ceil(K/32) = 7. */
enum { BG = 3, BN = 40, BK = 200, ARENA = 1 << 17 };

typedef struct bad_fx {
    void *w, *rd, *rs, *cd, *cs, *am, *y;
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

/* Valid arguments of a recipe: both copies, amax with GROUP. */
static moex_weight_quantize_args bad_base(bad_fx *f, moex_quant_recipe rc) {
    moex_weight_quantize_args a;
    memset(&a, 0, sizeof a);
    a.w = moex_tensor_3d(f->w, MOEX_DTYPE_F32, BG, BN, BK);
    a.params.recipe = rc, a.params.fp8 = MOEX_DTYPE_E4M3, a.params.rounding = MOEX_SCALE_EXACT;
    const wlayout L = wlayout_of(rc, BG, BN, BK);
    a.rowwise.data = moex_tensor_3d(f->rd, MOEX_DTYPE_E4M3, BG, BN, BK);
    a.rowwise.scales = scales_tensor(f->rs, L.sdt, L.rs_ndim, L.rs_shape);
    a.columnwise.data = moex_tensor_3d(f->cd, MOEX_DTYPE_E4M3, BG, BK, BN);
    a.columnwise.scales = scales_tensor(f->cs, L.sdt, L.cs_ndim, L.cs_shape);
    if (rc == MOEX_QUANT_GROUP) a.amax = moex_tensor_1d(f->am, MOEX_DTYPE_F32, BG);
    return a;
}

static void expect_q_refused(bad_fx *f, const moex_weight_quantize_args *a, const char *name, const char *desc) {
    size_t bytes = 0;
    bad_poison(f);
    moex_status st = moex_weight_quantize_workspace_size(ctx, a, &bytes);
    /* the overlap rule is checked by the run, after the workspace (conventions section 7) */
    const int overlap = name && strcmp(name, "overlaps") == 0;
    CHECK_MSG(st == (overlap ? MOEX_OK : MOEX_ERR_INVALID_ARG), "weight quantize %s: workspace-size query: got %s (\"%s\")",
              desc, moex_status_string(st), moex_last_error(ctx));
    void *ws = tu_alloc(1 << 16);
    st = moex_weight_quantize(ctx, a, ws, 1 << 16, NULL);
    free(ws);
    if (!CHECK_REFUSED(ctx, st, "moex_weight_quantize", name)) printf("  (case: weight quantize %s)\n", desc);
    CHECK_MSG(bad_untouched(f), "weight quantize %s: refused, but an output was written", desc);
}

static void expect_dq_refused(bad_fx *f, const moex_weight_dequantize_args *a, const char *name, const char *desc) {
    size_t bytes = 0;
    bad_poison(f);
    moex_status st = moex_weight_dequantize_workspace_size(ctx, a, &bytes);
    const int overlap = name && strcmp(name, "overlaps") == 0;
    CHECK_MSG(st == (overlap ? MOEX_OK : MOEX_ERR_INVALID_ARG),
              "weight dequantize %s: workspace-size query: got %s (\"%s\")", desc, moex_status_string(st),
              moex_last_error(ctx));
    void *ws = tu_alloc(1 << 16);
    st = moex_weight_dequantize(ctx, a, ws, 1 << 16, NULL);
    free(ws);
    if (!CHECK_REFUSED(ctx, st, "moex_weight_dequantize", name)) printf("  (case: weight dequantize %s)\n", desc);
    CHECK_MSG(bad_untouched(f), "weight dequantize %s: refused, but w was written", desc);
}

static void bad_arguments(tu_rng *r) {
    bad_fx f;
    f.w = tu_alloc(ARENA), f.rd = tu_alloc(ARENA), f.rs = tu_alloc(ARENA), f.cd = tu_alloc(ARENA);
    f.cs = tu_alloc(ARENA), f.am = tu_alloc(ARENA), f.y = tu_alloc(ARENA);
    double *wv = tu_doubles(BG * BN * BK);
    tu_fill_uniform(r, wv, BG * BN * BK, -3, 3, MOEX_DTYPE_F32);
    memset(f.w, 0, ARENA);
    ref_fill(MOEX_DTYPE_F32, f.w, wv, BG * BN * BK);
    free(wv);
    const moex_dtype E4 = MOEX_DTYPE_E4M3;
    const moex_quant_recipe TN = MOEX_QUANT_TENSOR, GR = MOEX_QUANT_GROUP, BL = MOEX_QUANT_BLOCK, MX = MOEX_QUANT_MXFP8;
    moex_weight_quantize_args a, b;

    /* the bases are valid (each run also checks that the arena sizes hold them) */
    for (int rc = 0; rc < 3; rc++) {
        a = bad_base(&f, wrecipes[rc]);
        size_t bytes = 0;
        CHECK_STATUS(ctx, moex_weight_quantize_workspace_size(ctx, &a, &bytes), MOEX_OK);
        void *ws = tu_workspace(bytes);
        CHECK_STATUS(ctx, moex_weight_quantize(ctx, &a, ws, bytes, NULL), MOEX_OK);
        free(ws);
    }
#define Q(base_rc, mutation, name, desc)                                                        \
    do {                                                                                        \
        b = bad_base(&f, base_rc);                                                              \
        mutation;                                                                               \
        expect_q_refused(&f, &b, name, desc);                                                   \
    } while (0)
    /* the recipe */
    Q(GR, b.params.recipe = TN, "TENSOR", "recipe TENSOR (scales [1], amax [1])");
    Q(GR, (b.params.recipe = TN, b.rowwise.scales = moex_tensor_1d(f.rs, MOEX_DTYPE_F32, 1),
           b.columnwise.scales = moex_tensor_1d(f.cs, MOEX_DTYPE_F32, 1), b.amax = moex_tensor_1d(f.am, MOEX_DTYPE_F32, 1)),
      "TENSOR", "recipe TENSOR (scales [1], amax [1])");
    Q(GR, (b.params.recipe = TN, memset(&b.amax, 0, sizeof b.amax)), "TENSOR", "recipe TENSOR, no amax");
    Q(BL, b.params.recipe = (moex_quant_recipe)4, "recipe", "recipe 4");
    Q(GR, b.params.recipe = (moex_quant_recipe)-1, "recipe", "recipe -1");
    /* w */
    Q(BL, b.w.dtype = MOEX_DTYPE_I32, "w", "w i32");
    Q(BL, b.w.dtype = E4, "w", "w e4m3");
    Q(GR, b.w.dtype = MOEX_DTYPE_E8M0, "w", "w e8m0");
    Q(BL, b.w = moex_tensor_2d(f.w, MOEX_DTYPE_F32, BG * BN, BK), "w", "w 2-D [G N, K]");
    Q(MX, b.w = moex_tensor_1d(f.w, MOEX_DTYPE_F32, BG * BN * BK), "w", "w 1-D");
    Q(GR, (b.w.ndim = 4, b.w.shape[3] = 1), "w", "w 4-D");
    Q(BL, b.w.data = NULL, "w", "w data NULL");
    /* w of another shape than the copies (the message may name either) */
    Q(BL, b.w = moex_tensor_3d(f.w, MOEX_DTYPE_F32, BG, BK, BN), NULL, "w [G, K, N]");
    Q(MX, b.w.shape[2] = BK - 1, NULL, "w [G, N, K-1]");
    Q(GR, b.w.shape[0] = BG + 1, NULL, "w [G+1, N, K]");
    /* params */
    Q(BL, b.params.fp8 = MOEX_DTYPE_F32, "fp8", "params.fp8 f32");
    Q(BL, b.params.fp8 = MOEX_DTYPE_BF16, "fp8", "params.fp8 bf16");
    Q(MX, b.params.fp8 = MOEX_DTYPE_E8M0, "fp8", "params.fp8 e8m0");
    Q(GR, b.params.fp8 = (moex_dtype)42, "fp8", "params.fp8 42");
    Q(BL, b.params.rounding = (moex_scale_rounding)2, "rounding", "rounding 2");
    Q(BL, b.params.amax_epsilon = -1.0f, "epsilon", "amax_epsilon -1");
    Q(GR, b.params.amax_epsilon = -1e-30f, "epsilon", "amax_epsilon -1e-30");
    Q(GR, b.params.amax_epsilon = NAN, "epsilon", "amax_epsilon NaN");
    Q(MX, b.params.amax_epsilon = INFINITY, "epsilon", "amax_epsilon Inf");
    /* presence */
    Q(BL, (memset(&b.rowwise, 0, sizeof b.rowwise), memset(&b.columnwise, 0, sizeof b.columnwise)), NULL,
      "no output copy");
    Q(GR, (memset(&b.rowwise, 0, sizeof b.rowwise), memset(&b.columnwise, 0, sizeof b.columnwise)), NULL,
      "no output copy (amax only)");
    Q(BL, memset(&b.rowwise.scales, 0, sizeof b.rowwise.scales), "rowwise.scales", "rowwise.scales absent");
    Q(GR, memset(&b.columnwise.scales, 0, sizeof b.columnwise.scales), "columnwise.scales", "columnwise.scales absent");
    Q(MX, memset(&b.rowwise.data, 0, sizeof b.rowwise.data), "rowwise", "rowwise.data absent, scales present");
    Q(BL, memset(&b.columnwise.data, 0, sizeof b.columnwise.data), "columnwise", "columnwise.data absent, scales present");
    Q(BL, b.amax = moex_tensor_1d(f.am, MOEX_DTYPE_F32, BG), "amax", "amax [G] with BLOCK");
    Q(MX, b.amax = moex_tensor_1d(f.am, MOEX_DTYPE_F32, BG), "amax", "amax [G] with MXFP8");
    Q(MX, b.amax = moex_tensor_1d(f.am, MOEX_DTYPE_F32, 1), "amax", "amax [1] with MXFP8");
    /* data */
    Q(BL, b.rowwise.data.dtype = MOEX_DTYPE_E5M2, "rowwise.data", "rowwise.data e5m2 for e4m3");
    Q(GR, b.rowwise.data.dtype = MOEX_DTYPE_F32, "rowwise.data", "rowwise.data f32");
    Q(MX, b.columnwise.data.dtype = MOEX_DTYPE_E8M0, "columnwise.data", "columnwise.data e8m0");
    Q(GR, b.columnwise.data.dtype = MOEX_DTYPE_E5M2, "columnwise.data", "columnwise.data e5m2 for e4m3");
    Q(BL, b.rowwise.data.shape[2] = BK + 1, "rowwise.data", "rowwise.data [G, N, K+1]");
    Q(GR, b.rowwise.data = moex_tensor_3d(f.rd, E4, BG, BK, BN), "rowwise.data", "rowwise.data [G, K, N]");
    Q(BL, b.columnwise.data = moex_tensor_3d(f.cd, E4, BG, BN, BK), "columnwise.data", "columnwise.data [G, N, K]");
    Q(MX, b.columnwise.data = moex_tensor_2d(f.cd, E4, BG * BK, BN), "columnwise.data", "columnwise.data 2-D");
    Q(MX, b.rowwise.data = moex_tensor_2d(f.rd, E4, BN, BK), "rowwise.data", "rowwise.data [N, K]");
    Q(GR, b.columnwise.data.shape[0] = BG - 1, "columnwise.data", "columnwise.data [G-1, K, N]");
    Q(BL, b.rowwise.data.data = NULL, "rowwise.data", "rowwise.data NULL");
    /* scales: GROUP */
    Q(GR, b.rowwise.scales = moex_tensor_1d(f.rs, MOEX_DTYPE_F32, 1), "rowwise.scales", "GROUP rowwise.scales [1]");
    Q(GR, b.columnwise.scales = moex_tensor_2d(f.cs, MOEX_DTYPE_F32, BG, 1), "columnwise.scales",
      "GROUP columnwise.scales [G, 1]");
    Q(GR, b.rowwise.scales.dtype = MOEX_DTYPE_F16, "rowwise.scales", "GROUP rowwise.scales f16");
    Q(GR, b.columnwise.scales.dtype = MOEX_DTYPE_E8M0, "columnwise.scales", "GROUP columnwise.scales e8m0");
    Q(GR, b.rowwise.scales = moex_tensor_3d(f.rs, MOEX_DTYPE_F32, BG, 1, 1), "rowwise.scales",
      "GROUP rowwise.scales [G, 1, 1]");
    /* scales: BLOCK */
    Q(BL, b.rowwise.scales.dtype = MOEX_DTYPE_BF16, "rowwise.scales", "BLOCK rowwise.scales bf16");
    Q(BL, b.rowwise.scales.dtype = MOEX_DTYPE_E8M0, "rowwise.scales", "BLOCK rowwise.scales e8m0");
    Q(BL, b.columnwise.scales.dtype = MOEX_DTYPE_E8M0, "columnwise.scales", "BLOCK columnwise.scales e8m0");
    Q(BL, b.rowwise.scales = moex_tensor_3d(f.rs, MOEX_DTYPE_F32, BG, 2, 1), "rowwise.scales",
      "BLOCK rowwise.scales [G, ceil(K/128), ceil(N/128)] (the columnwise shape)");
    Q(BL, b.columnwise.scales = moex_tensor_3d(f.cs, MOEX_DTYPE_F32, BG, 1, 2), "columnwise.scales",
      "BLOCK columnwise.scales [G, ceil(N/128), ceil(K/128)] (the rowwise shape)");
    Q(BL, b.rowwise.scales.shape[2] += 1, "rowwise.scales", "BLOCK rowwise.scales one column more");
    Q(BL, b.rowwise.scales = moex_tensor_2d(f.rs, MOEX_DTYPE_F32, 1, 2), "rowwise.scales",
      "BLOCK rowwise.scales 2-D [ceil(N/128), ceil(K/128)]");
    Q(BL, b.rowwise.scales = moex_tensor_1d(f.rs, MOEX_DTYPE_F32, BG), "rowwise.scales", "BLOCK rowwise.scales [G]");
    Q(BL, b.columnwise.scales.shape[0] = BG + 1, "columnwise.scales", "BLOCK columnwise.scales [G+1, ...]");
    Q(BL, b.columnwise.scales = moex_tensor_3d(f.cs, MOEX_DTYPE_F32, BG, BK, 2), "columnwise.scales",
      "BLOCK columnwise.scales the MXFP8 shape");
    /* scales: MXFP8 */
    Q(MX, b.rowwise.scales.dtype = MOEX_DTYPE_F32, "rowwise.scales", "MXFP8 rowwise.scales f32");
    Q(MX, b.columnwise.scales.dtype = MOEX_DTYPE_F32, "columnwise.scales", "MXFP8 columnwise.scales f32");
    Q(MX, b.columnwise.scales.dtype = E4, "columnwise.scales", "MXFP8 columnwise.scales e4m3");
    Q(MX, b.rowwise.scales.shape[2] += 1, "rowwise.scales", "MXFP8 rowwise.scales [G, N, ceil(K/32)+1]");
    Q(MX, b.rowwise.scales = moex_tensor_3d(f.rs, MOEX_DTYPE_E8M0, BG, BK, 2), "rowwise.scales",
      "MXFP8 rowwise.scales [G, K, ceil(N/32)] (the columnwise shape)");
    Q(MX, b.columnwise.scales = moex_tensor_3d(f.cs, MOEX_DTYPE_E8M0, BG, BN, 7), "columnwise.scales",
      "MXFP8 columnwise.scales [G, N, ceil(K/32)] (the rowwise shape)");
    Q(MX, b.columnwise.scales.shape[2] = 1, "columnwise.scales", "MXFP8 columnwise.scales one column less");
    Q(MX, b.columnwise.scales = moex_tensor_2d(f.cs, MOEX_DTYPE_E8M0, BG * BK, 2), "columnwise.scales",
      "MXFP8 columnwise.scales 2-D");
    Q(MX, b.rowwise.scales = moex_tensor_3d(f.rs, MOEX_DTYPE_E8M0, BG, BN, 2), "rowwise.scales",
      "MXFP8 rowwise.scales [G, N, ceil(K/128)] (BLOCK-like)");
    /* the swizzled layout (docs/ops.md 9.8): MXFP8 only, per expert a padded matrix */
    const int64_t swr = BG * 128 * 4 * cdiv(cdiv(BK, 32), 4), swc = BG * 256 * 4 * cdiv(cdiv(BN, 32), 4);
#define SWZ(rlen, clen)                                                                                 \
    (b.params.scale_layout = MOEX_SCALES_MX_SWIZZLED,                                                   \
     b.rowwise.scales = moex_tensor_1d(f.rs, MOEX_DTYPE_E8M0, rlen),                                    \
     b.columnwise.scales = moex_tensor_1d(f.cs, MOEX_DTYPE_E8M0, clen))
    {
        b = bad_base(&f, MX);
        SWZ(swr, swc);
        size_t bytes = 0;
        CHECK_STATUS(ctx, moex_weight_quantize_workspace_size(ctx, &b, &bytes), MOEX_OK);
        void *ws = tu_workspace(bytes);
        CHECK_STATUS(ctx, moex_weight_quantize(ctx, &b, ws, bytes, NULL), MOEX_OK);
        free(ws);
    }
    Q(BL, b.params.scale_layout = MOEX_SCALES_MX_SWIZZLED, "scale_layout", "swizzled BLOCK");
    Q(MX, b.params.scale_layout = MOEX_SCALES_MX_SWIZZLED, "rowwise.scales", "swizzled with the plain scales");
    Q(MX, SWZ(swr + 1, swc), "rowwise.scales", "swizzled rowwise.scales one byte long");
    Q(MX, SWZ(swr, swc - 512), "columnwise.scales", "swizzled columnwise.scales one tile short");
#ifndef CM_RUN   /* not through the CUDA mirror (cuda_mirror.h), which would first copy 2^54 bytes to the
                  * device; the check is the core's, the same for every backend */
    {   /* 2^54 experts of [1, 1]: 2^54 elements each, but each expert's scales pad to 128 x 4 */
        const int64_t G = (int64_t)1 << 54;
        Q(MX,
          (SWZ(1, 1), b.w = moex_tensor_3d(f.w, MOEX_DTYPE_F32, G, 1, 1),
           b.rowwise.data = moex_tensor_3d(f.rd, MOEX_DTYPE_E4M3, G, 1, 1),
           b.columnwise.data = moex_tensor_3d(f.cd, MOEX_DTYPE_E4M3, G, 1, 1)),
          "rowwise.scales", "swizzled scales of 2^63 bytes");
        CHECK_MSG(strstr(moex_last_error(ctx), "2^63") != NULL, "swizzled scales of 2^63 bytes: refused as \"%s\"",
                  moex_last_error(ctx));
    }
#endif
#undef SWZ
    /* amax */
    Q(GR, b.amax = moex_tensor_1d(f.am, MOEX_DTYPE_F32, 1), "amax", "GROUP amax [1]");
    Q(GR, b.amax = moex_tensor_1d(f.am, MOEX_DTYPE_F32, BG + 1), "amax", "GROUP amax [G+1]");
    Q(GR, b.amax = moex_tensor_2d(f.am, MOEX_DTYPE_F32, BG, 1), "amax", "GROUP amax [G, 1]");
    Q(GR, b.amax.dtype = MOEX_DTYPE_BF16, "amax", "GROUP amax bf16");
    Q(GR, b.amax.data = NULL, "amax", "GROUP amax data NULL");

    /* dequantize */
    moex_weight_dequantize_args d0, d;
    {
        a = bad_base(&f, BL);
        memset(&d0, 0, sizeof d0);
        d0.params = a.params;
        d0.orientation = MOEX_QUANT_ROWWISE;
        d0.src = a.rowwise;
        d0.w = moex_tensor_3d(f.y, MOEX_DTYPE_BF16, BG, BN, BK);
        size_t bytes = 0;
        CHECK_STATUS(ctx, moex_weight_dequantize_workspace_size(ctx, &d0, &bytes), MOEX_OK);
        void *ws = tu_workspace(bytes);
        CHECK_STATUS(ctx, moex_weight_dequantize(ctx, &d0, ws, bytes, NULL), MOEX_OK);
        free(ws);
        for (int rc = 0; rc < 3; rc++)   /* every recipe and orientation of the base is valid */
            for (int o = 0; o < 2; o++) {
                a = bad_base(&f, wrecipes[rc]);
                d = d0;
                d.params = a.params, d.orientation = o ? MOEX_QUANT_COLUMNWISE : MOEX_QUANT_ROWWISE;
                d.src = o ? a.columnwise : a.rowwise;
                CHECK_STATUS(ctx, moex_weight_dequantize_workspace_size(ctx, &d, &bytes), MOEX_OK);
                ws = tu_workspace(bytes);
                CHECK_STATUS(ctx, moex_weight_dequantize(ctx, &d, ws, bytes, NULL), MOEX_OK);
                free(ws);
            }
    }
#define DQ(mutation, name, desc)                                                                \
    do {                                                                                        \
        d = d0;                                                                                 \
        mutation;                                                                               \
        expect_dq_refused(&f, &d, name, desc);                                                  \
    } while (0)
    DQ(d.w.dtype = MOEX_DTYPE_I32, "w", "w i32");
    DQ(d.w.dtype = E4, "w", "w e4m3");
    DQ(d.w = moex_tensor_2d(f.y, MOEX_DTYPE_BF16, BG * BN, BK), "w", "w 2-D");
    DQ(memset(&d.w, 0, sizeof d.w), "w", "w absent");
    DQ(d.w.data = NULL, "w", "w data NULL");
    /* w and src disagree: the message may name either */
    DQ(d.w.shape[2] = BK + 1, NULL, "w [G, N, K+1]");
    DQ(d.w = moex_tensor_3d(f.y, MOEX_DTYPE_BF16, BG, BK, BN), NULL, "w [G, K, N]");
    DQ(d.w.shape[0] = BG - 1, NULL, "w [G-1, N, K]");
    DQ(d.orientation = (moex_quant_orientation)2, "orientation", "orientation 2");
    DQ(d.orientation = (moex_quant_orientation)-1, "orientation", "orientation -1");
    DQ(d.params.fp8 = MOEX_DTYPE_F16, "fp8", "params.fp8 f16");
    DQ(d.params.recipe = (moex_quant_recipe)9, "recipe", "recipe 9");
    DQ((d.params.recipe = TN, d.src.scales = moex_tensor_1d(f.rs, MOEX_DTYPE_F32, 1)), "TENSOR", "recipe TENSOR");
    DQ(d.params.rounding = (moex_scale_rounding)7, "rounding", "rounding 7");
    DQ(d.params.amax_epsilon = -2.0f, "epsilon", "amax_epsilon -2");
    DQ(d.src.data.dtype = MOEX_DTYPE_F32, "src.data", "src.data f32");
    DQ(d.src.data.dtype = MOEX_DTYPE_E5M2, "src.data", "src.data e5m2 for e4m3");
    DQ(d.src.data = moex_tensor_3d(f.rd, E4, BG, BK, BN), "src.data", "rowwise src.data [G, K, N]");
    DQ(memset(&d.src.data, 0, sizeof d.src.data), "src.data", "src.data absent");
    DQ(d.src.data.data = NULL, "src.data", "src.data NULL");
    DQ(d.src.scales.dtype = MOEX_DTYPE_E8M0, "src.scales", "BLOCK src.scales e8m0");
    DQ(d.src.scales.shape[2] = 3, "src.scales", "BLOCK rowwise src.scales one column more");
    DQ(d.src.scales = moex_tensor_3d(f.rs, MOEX_DTYPE_F32, BG, 2, 1), "src.scales",
       "BLOCK rowwise src.scales the columnwise shape");
    DQ(memset(&d.src.scales, 0, sizeof d.src.scales), "src.scales", "src.scales absent");
    DQ(d.orientation = MOEX_QUANT_COLUMNWISE, "src", "columnwise with a rowwise src");
    DQ((d.orientation = MOEX_QUANT_COLUMNWISE, d.src = bad_base(&f, BL).columnwise,
        d.src.scales = moex_tensor_3d(f.cs, MOEX_DTYPE_F32, BG, 1, 2)), "src.scales",
       "columnwise src.scales the rowwise shape");
    DQ((d.params.recipe = MX, d.src = bad_base(&f, MX).rowwise, d.src.scales.dtype = MOEX_DTYPE_F32), "src.scales",
       "MXFP8 src.scales f32");
    DQ((d.params.recipe = MX, d.orientation = MOEX_QUANT_COLUMNWISE, d.src = bad_base(&f, MX).columnwise,
        d.src.scales.shape[2] = 7), "src.scales", "MXFP8 columnwise src.scales [G, K, ceil(K/32)]");
    DQ((d.params.recipe = GR, d.src = bad_base(&f, GR).rowwise, d.src.scales.shape[0] = 1), "src.scales",
       "GROUP src.scales [1]");
    DQ((d.params.recipe = GR, d.src = bad_base(&f, BL).rowwise), "src.scales", "GROUP with BLOCK scales");

    /* outputs that overlap another tensor: refused, nothing written (not through the GPU
     * mirror, which gives every tensor its own device copy) */
    if (!TWQ_GPU) {
        Q(BL, b.columnwise.data.data = f.rd, "overlaps", "columnwise.data on rowwise.data");
        Q(BL, b.rowwise.scales.data = (char *)f.rd + 16, "overlaps", "rowwise.scales inside rowwise.data");
        Q(MX, b.columnwise.scales.data = (char *)f.rs + 3, "overlaps", "columnwise.scales inside rowwise.scales");
        Q(GR, b.amax.data = f.cs, "overlaps", "amax on columnwise.scales");
        Q(GR, b.rowwise.data.data = f.w, "overlaps", "rowwise.data on w");
        Q(MX, b.columnwise.scales.data = (char *)f.w + 100, "overlaps", "columnwise.scales inside w");
        DQ(d.w.data = f.rd, "overlaps", "w on src.data");
        DQ(d.src.scales.data = (char *)f.y + 1000, "overlaps", "src.scales inside w");
    }

    /* G = 0, N = 0, K = 0 with NULL data: accepted; only GROUP scales and amax (G of them)
     * are written (for G > 0), nothing else */
    static const int64_t empties[3][3] = {{0, BN, BK}, {BG, 0, BK}, {BG, BN, 0}};
    for (int e = 0; e < 3; e++)
        for (int rc = 0; rc < 3; rc++) {
            const int64_t G = empties[e][0], N = empties[e][1], K = empties[e][2];
            const wlayout L = wlayout_of(wrecipes[rc], G, N, K);
            memset(&a, 0, sizeof a);
            a.w = moex_tensor_3d(NULL, MOEX_DTYPE_BF16, G, N, K);
            a.params.recipe = wrecipes[rc], a.params.fp8 = MOEX_DTYPE_E5M2, a.params.amax_epsilon = 2.0f;
            a.rowwise.data = moex_tensor_3d(NULL, MOEX_DTYPE_E5M2, G, N, K);
            a.rowwise.scales = scales_tensor(L.n_rs ? f.rs : NULL, L.sdt, L.rs_ndim, L.rs_shape);
            a.columnwise.data = moex_tensor_3d(NULL, MOEX_DTYPE_E5M2, G, K, N);
            a.columnwise.scales = scales_tensor(L.n_cs ? f.cs : NULL, L.sdt, L.cs_ndim, L.cs_shape);
            if (wrecipes[rc] == GR) a.amax = moex_tensor_1d(G ? f.am : NULL, MOEX_DTYPE_F32, G);
            bad_poison(&f);
            size_t bytes = 0;
            CHECK_STATUS(ctx, moex_weight_quantize_workspace_size(ctx, &a, &bytes), MOEX_OK);
            void *ws = tu_workspace(bytes);
            CHECK_STATUS(ctx, moex_weight_quantize(ctx, &a, ws, bytes, NULL), MOEX_OK);
            free(ws);
            if (wrecipes[rc] == GR && G > 0) {
                /* the empty set: amax 0, a = max(0, 2) = 2, s = 57344 / 2, scale 2 / 57344 */
                const float want = (float)(1.0 / (double)(float)(57344.0 / 2.0));
                int ok = 1;
                for (int64_t g = 0; g < G; g++)
                    ok &= ((float *)f.rs)[g] == want && ((float *)f.cs)[g] == want && ((float *)f.am)[g] == 0.0f &&
                          !signbit(((float *)f.am)[g]);
                CHECK_MSG(ok, "empty weight G=%lld N=%lld K=%lld GROUP: scales %a %a amax %a, want %a %a 0",
                          (long long)G, (long long)N, (long long)K, (double)((float *)f.rs)[0],
                          (double)((float *)f.cs)[0], (double)((float *)f.am)[0], (double)want, (double)want);
                CHECK_MSG(tu_first_unpoisoned((char *)f.rs + G * 4, ARENA - (size_t)G * 4) < 0 &&
                              tu_first_unpoisoned((char *)f.cs + G * 4, ARENA - (size_t)G * 4) < 0 &&
                              tu_first_unpoisoned((char *)f.am + G * 4, ARENA - (size_t)G * 4) < 0,
                          "empty weight G=%lld N=%lld K=%lld GROUP: written past the G scales", (long long)G,
                          (long long)N, (long long)K);
            } else {
                CHECK_MSG(bad_untouched(&f), "empty weight G=%lld N=%lld K=%lld %s: an output was written",
                          (long long)G, (long long)N, (long long)K, recipe_name(wrecipes[rc]));
            }
            for (int o = 0; o < 2; o++) {
                moex_weight_dequantize_args e2;
                memset(&e2, 0, sizeof e2);
                e2.params = a.params, e2.orientation = o ? MOEX_QUANT_COLUMNWISE : MOEX_QUANT_ROWWISE;
                e2.src = o ? a.columnwise : a.rowwise;
                e2.w = moex_tensor_3d(NULL, MOEX_DTYPE_F32, G, N, K);
                bad_poison(&f);
                CHECK_STATUS(ctx, moex_weight_dequantize_workspace_size(ctx, &e2, &bytes), MOEX_OK);
                ws = tu_workspace(bytes);
                CHECK_STATUS(ctx, moex_weight_dequantize(ctx, &e2, ws, bytes, NULL), MOEX_OK);
                free(ws);
                CHECK_MSG(bad_untouched(&f), "empty weight dequantize: something was written");
            }
        }
#undef Q
#undef DQ
    free(f.w), free(f.rd), free(f.rs), free(f.cd), free(f.cs), free(f.am), free(f.y);
}

/* Larger weights (many 128x128 blocks, long rows): every recipe and format once, both copies. */
static void big_cases(tu_rng *r, int64_t G, int64_t N, int64_t K) {
    int i = 0;
    for (int rc = 0; rc < 3; rc++)
        for (int f = 0; f < 2; f++, i++) {
            wcase c;
            memset(&c, 0, sizeof c);
            c.dt = wdts[i % 3], c.ydt = wdts[(i + 1) % 3];
            c.p.recipe = wrecipes[rc];
            c.p.fp8 = f ? MOEX_DTYPE_E5M2 : MOEX_DTYPE_E4M3;
            c.p.rounding = i % 3 == 1 ? MOEX_SCALE_POW2 : MOEX_SCALE_EXACT;
            c.p.amax_epsilon = i % 4 == 2 ? 0.125f : 0.0f;
            c.row = c.col = 1;
            c.amax = c.p.recipe == MOEX_QUANT_GROUP;
            c.G = G, c.N = N, c.K = K;
            double *w = tu_doubles(G * N * K);
            int kk = 0;
            const flavor fl = (flavor)(i % FL_NUM);
            make_w(r, fl, c.dt, c.p.fp8, G, N, K, w, &kk);
            char what[64];
            snprintf(what, sizeof what, "big %s", flavor_names[fl]);
            c.w = w, c.what = what;
            run_case(&c);
            free(w);
        }
}

int main(void) {
    const double t0 = now_s();
    ctx = tu_cpu_context();
    tu_rng r = tu_rng_seed(1617);
    check_reference(&r);
    single_values();
    main_grid(&r);
    special_pattern(&r);
    big_cases(&r, 2, 260, 300);
    dequantize_random(&r);
    bad_arguments(&r);
    printf("%d cases, %.2f s\n", n_cases, now_s() - t0);
    moex_context_destroy(ctx);
    return tu_finish();
}
