/*
 * test_reference.c - proves the fp64 reference (tools/ref) before anything is compared
 * with it:
 *   - dtype helpers: every finite bf16 / f16 bit pattern round-trips, midpoints between
 *     neighbours round to the even one, just above / below go to the nearer one, overflow
 *     goes to inf; the tolerance model's constants;
 *   - splits_to_offsets against a hand-written case;
 *   - every backward of the reference against central finite differences of its forward
 *     (loss = sum(dy * out)): grouped linear dx, dW, dbias (ADD, SCALED), dprobs; scaled
 *     GLU dh and dprobs for SwiGLU and clamped SwiGLU (points kept away from the clamp
 *     kinks, with some past the limits), both layouts; grouped MLP dx, dW1, dW2, db1, db2,
 *     dprobs through the GLU and the scaled b2; the GLU's pointwise derivatives and the
 *     magnitudes used for bounds;
 *   - every bound is >= |value|.
 * Needs nothing from the library but its header.
 */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FD_EPS 1e-6

/* ---- dtype helpers ------------------------------------------------------------------- */

static void test_dtype(int is_f16) {
    const char *nm = is_f16 ? "f16" : "bf16";
    moex_dtype dt = is_f16 ? MOEX_DTYPE_F16 : MOEX_DTYPE_BF16;
    double (*dec)(uint16_t) = is_f16 ? ref_f16_to_double : ref_bf16_to_double;
    uint16_t (*enc)(double) = is_f16 ? ref_double_to_f16 : ref_double_to_bf16;
    uint16_t inf_bits = is_f16 ? 0x7c00 : 0x7f80;
    int64_t roundtrip_bad = 0, mid_bad = 0, near_bad = 0;
    for (uint32_t b = 0; b < inf_bits; b++) { /* positive finite patterns; negatives by symmetry */
        double v = dec((uint16_t)b);
        if (enc(v) != b || enc(-v) != (uint16_t)(b | 0x8000)) roundtrip_bad++;
        if (ref_round(dt, v) != v) roundtrip_bad++;
        if (b + 1 < inf_bits) {
            double w = dec((uint16_t)(b + 1));
            double mid = 0.5 * (v + w);  /* exact in fp64 */
            uint16_t even = (b & 1) ? (uint16_t)(b + 1) : (uint16_t)b;
            if (enc(mid) != even || enc(-mid) != (uint16_t)(even | 0x8000)) mid_bad++;
            double lo = mid - (w - v) * 1e-3, hi = mid + (w - v) * 1e-3;
            if (enc(lo) != b || enc(hi) != b + 1) near_bad++;
        }
    }
    CHECK_MSG(roundtrip_bad == 0, "%s: %lld patterns do not round-trip", nm, (long long)roundtrip_bad);
    CHECK_MSG(mid_bad == 0, "%s: %lld midpoints do not round to even", nm, (long long)mid_bad);
    CHECK_MSG(near_bad == 0, "%s: %lld near-midpoints round the wrong way", nm, (long long)near_bad);
    double maxv = dec((uint16_t)(inf_bits - 1)), ulp = maxv - dec((uint16_t)(inf_bits - 2));
    CHECK_MSG(enc(maxv + 0.49 * ulp) == inf_bits - 1, "%s: just below the overflow threshold", nm);
    CHECK_MSG(enc(maxv + 0.5 * ulp) == inf_bits, "%s: max + half ulp must round to inf", nm);
    CHECK_MSG(isinf(ref_round(dt, -2 * maxv)) && ref_round(dt, -2 * maxv) < 0, "%s: -inf", nm);
    CHECK_MSG(isnan(dec(enc(NAN))), "%s: NaN stays NaN", nm);
    /* a few literal values */
    if (!is_f16) {
        CHECK_EQ_I64(ref_double_to_bf16(1.0), 0x3f80);
        CHECK_EQ_I64(ref_double_to_bf16(-2.0), 0xc000);
        CHECK_EQ_I64(ref_double_to_bf16(1.0 + 1.0 / 256), 0x3f80);       /* tie to even   */
        CHECK_EQ_I64(ref_double_to_bf16(1.0 + 3.0 / 256), 0x3f82);       /* tie to even up */
        CHECK_EQ_I64(ref_double_to_bf16(ldexp(1.0, -133)), 0x0001);      /* smallest subnormal */
    } else {
        CHECK_EQ_I64(ref_double_to_f16(1.0), 0x3c00);
        CHECK_EQ_I64(ref_double_to_f16(65504.0), 0x7bff);
        CHECK_EQ_I64(ref_double_to_f16(-0.5), 0xb800);
        CHECK_EQ_I64(ref_double_to_f16(ldexp(1.0, -24)), 0x0001);
        CHECK_EQ_I64(ref_double_to_f16(ldexp(1.0, -25)), 0x0000);        /* tie to even (0) */
        CHECK_EQ_I64(ref_double_to_f16(ldexp(3.0, -25)), 0x0002);
    }
    /* fill / read back */
    double src[5] = {1.0, -3.25, 1e-3, 1000.5, 0.1}, back[5];
    uint16_t buf[5];
    ref_fill(dt, buf, src, 5);
    ref_read(dt, buf, back, 5);
    int ok = 1;
    for (int i = 0; i < 5; i++) ok &= back[i] == ref_round(dt, src[i]) && fabs(back[i] - src[i]) <= ref_unit_roundoff(dt) * fabs(src[i]);
    CHECK_MSG(ok, "%s: fill/read", nm);
}

static void test_tolerance_model(void) {
    CHECK(ref_unit_roundoff(MOEX_DTYPE_F32) == ldexp(1.0, -24));
    CHECK(ref_unit_roundoff(MOEX_DTYPE_BF16) == ldexp(1.0, -8));
    CHECK(ref_unit_roundoff(MOEX_DTYPE_F16) == ldexp(1.0, -11));
    ref_tol_model m = ref_tol_for(MOEX_DTYPE_BF16, MOEX_DTYPE_BF16, 1, 100);
    double t = ref_tol(&m, 2.0, 10.0);
    double want = REF_TOL_C * (ldexp(1.0, -8) * 2.0 + (ldexp(1.0, -8) + 100 * ldexp(1.0, -24)) * 10.0);
    CHECK_MSG(fabs(t - want) <= 1e-12 * want + ldexp(1.0, -133) * 2, "tol %g, want %g", t, want);
    ref_tol_model f = ref_tol_for(MOEX_DTYPE_F32, MOEX_DTYPE_F32, 0, 1);
    CHECK(f.u_mid == 0.0 && f.u_out == ldexp(1.0, -24));
}

static void test_offsets(void) {
    int64_t s[5] = {3, 0, 4, 0, 2}, off[6], a[6], b[5], c[6];
    CHECK_EQ_I64(ref_offsets(s, 5, off), 9);
    int64_t want_off[6] = {0, 3, 3, 7, 7, 9};
    CHECK(memcmp(off, want_off, sizeof off) == 0);
    ref_splits_to_offsets(s, 5, 1, 1, a);
    ref_splits_to_offsets(s, 5, 7, 0, b);
    ref_splits_to_offsets(s, 5, 3, 1, c);
    int64_t wb[5] = {21, 21, 49, 49, 63}, wc[6] = {0, 9, 9, 21, 21, 27};
    CHECK(memcmp(a, want_off, sizeof a) == 0);
    CHECK(memcmp(b, wb, sizeof b) == 0);
    CHECK(memcmp(c, wc, sizeof c) == 0);
}

/* ---- finite differences -------------------------------------------------------------- */

/* A loss of the inputs (closure). */
typedef double (*loss_fn)(void *ctx);

/* Central difference of loss with respect to v[i] (v is one of ctx's inputs). */
static double fd(loss_fn f, void *ctx, double *v, int64_t i) {
    double save = v[i];
    double e = FD_EPS * (1.0 + fabs(save));
    v[i] = save + e;
    double lp = f(ctx);
    v[i] = save - e;
    double lm = f(ctx);
    v[i] = save;
    return (lp - lm) / (2 * e);
}

/* Compares analytic grad[i] with the finite difference for every (or every `step`-th)
 * element of v. scale: the magnitude the loss's terms have (for the tolerance). */
static void check_fd(const char *what, loss_fn f, void *ctx, double *v, const double *grad, int64_t n,
                     int64_t step) {
    int64_t bad = 0, worst = -1, checked = 0;
    double worst_err = 0;
    for (int64_t i = 0; i < n; i += step) {
        double num = fd(f, ctx, v, i);
        double err = fabs(num - grad[i]) / (1e-6 * (1.0 + fabs(grad[i])));
        checked++;
        if (!(err <= 1.0)) bad++;
        if (worst < 0 || err > worst_err) {
            worst_err = err;
            worst = i;
        }
    }
    if (bad) {
        double num = fd(f, ctx, v, worst);
        CHECK_MSG(0, "FD %s: %lld of %lld elements differ; worst [%lld]: analytic %.12g, numeric %.12g",
                  what, (long long)bad, (long long)checked, (long long)worst, grad[worst], num);
    } else {
        CHECK_MSG(checked > 0, "FD %s: nothing checked", what);
        tu_log("  FD %s: %lld elements, worst err/tol %.3g\n", what, (long long)checked, worst_err);
    }
}

/* sum_i a[i] b[i] over n. */
static double dot(const double *a, const double *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* bound >= |value| for every element. */
static void check_bound(const char *what, const double *v, const double *b, int64_t n) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (!(b[i] >= fabs(v[i]) * (1 - 1e-12))) bad++;
    CHECK_MSG(bad == 0, "%s: %lld bounds below |value|", what, (long long)bad);
}

/* ---- grouped linear ------------------------------------------------------------------ */

typedef struct gl_case {
    int64_t G, T, K, N;
    int64_t *splits;
    double *x, *w, *bias, *probs, *dy, *y;
    moex_bias_mode mode;
} gl_case;

static double gl_loss(void *p) {
    gl_case *c = (gl_case *)p;
    int64_t off[16];
    int64_t rows = ref_offsets(c->splits, c->G, off);
    ref_grouped_linear_forward(c->G, c->T, c->K, c->N, c->splits, c->x, c->w, c->mode, c->bias, c->probs,
                               c->y, NULL);
    return dot(c->dy, c->y, rows * c->N);
}

static void test_fd_grouped_linear(tu_rng *r, moex_bias_mode mode) {
    char nm[64];
    gl_case c = {.G = 4, .T = 11, .K = 5, .N = 3, .mode = mode};
    int64_t splits[4] = {3, 0, 4, 2}; /* sum 9 < T: empty group in the middle */
    c.splits = splits;
    c.x = tu_doubles(c.T * c.K), c.w = tu_doubles(c.G * c.N * c.K);
    c.bias = tu_doubles(c.G * c.N), c.probs = tu_doubles(c.T), c.dy = tu_doubles(c.T * c.N);
    c.y = tu_doubles(c.T * c.N);
    tu_fill_uniform(r, c.x, c.T * c.K, -1, 1, MOEX_DTYPE_F32);
    tu_fill_uniform(r, c.w, c.G * c.N * c.K, -1, 1, MOEX_DTYPE_F32);
    tu_fill_uniform(r, c.bias, c.G * c.N, -1, 1, MOEX_DTYPE_F32);
    tu_fill_uniform(r, c.probs, c.T, 0.1, 1, MOEX_DTYPE_F32);
    tu_fill_uniform(r, c.dy, c.T * c.N, -1, 1, MOEX_DTYPE_F32);
    double *dx = tu_doubles(c.T * c.K), *dxb = tu_doubles(c.T * c.K);
    double *db = tu_doubles(c.G * c.N), *dbb = tu_doubles(c.G * c.N);
    double *dp = tu_doubles(c.T), *dpb = tu_doubles(c.T);
    double *dw = tu_doubles(c.G * c.N * c.K), *dwb = tu_doubles(c.G * c.N * c.K);
    double *yb = tu_doubles(c.T * c.N);
    ref_grouped_linear_forward(c.G, c.T, c.K, c.N, splits, c.x, c.w, mode, c.bias, c.probs, c.y, yb);
    ref_grouped_linear_backward_data(c.G, c.T, c.K, c.N, splits, c.dy, c.w, mode, c.bias, c.probs, dx, dxb,
                                     db, dbb, dp, dpb);
    ref_grouped_linear_backward_weight(c.G, c.T, c.K, c.N, splits, c.x, c.dy, dw, dwb);
    const int64_t rows = 9;
    snprintf(nm, sizeof nm, "grouped linear (bias %d) dx", (int)mode);
    check_fd(nm, gl_loss, &c, c.x, dx, rows * c.K, 1);
    snprintf(nm, sizeof nm, "grouped linear (bias %d) dW", (int)mode);
    check_fd(nm, gl_loss, &c, c.w, dw, c.G * c.N * c.K, 1);
    check_bound("gl y bound", c.y, yb, rows * c.N);
    check_bound("gl dx bound", dx, dxb, rows * c.K);
    check_bound("gl dw bound", dw, dwb, c.G * c.N * c.K);
    /* the empty group's dW is exactly 0 */
    int zero = 1;
    for (int64_t i = 0; i < c.N * c.K; i++) zero &= dw[1 * c.N * c.K + i] == 0.0;
    CHECK_MSG(zero, "reference dW of the empty group is 0");
    if (mode != MOEX_BIAS_NONE) {
        snprintf(nm, sizeof nm, "grouped linear (bias %d) dbias", (int)mode);
        check_fd(nm, gl_loss, &c, c.bias, db, c.G * c.N, 1);
        check_bound("gl dbias bound", db, dbb, c.G * c.N);
    }
    if (mode == MOEX_BIAS_SCALED) {
        check_fd("grouped linear dprobs (scaled bias)", gl_loss, &c, c.probs, dp, rows, 1);
        check_bound("gl dprobs bound", dp, dpb, rows);
    }
    free(c.x); free(c.w); free(c.bias); free(c.probs); free(c.dy); free(c.y);
    free(dx); free(dxb); free(db); free(dbb); free(dp); free(dpb); free(dw); free(dwb); free(yb);
}

/* ---- scaled GLU ---------------------------------------------------------------------- */

/* Values within `gap` of the clamp kinks (a = limit, b = +-limit) are moved off them. */
static double off_kink(double v, double L, double gap) {
    if (fabs(v - L) < gap) v = v < L ? L - gap : L + gap;
    if (fabs(v + L) < gap) v = v < -L ? -L - gap : -L + gap;
    return v;
}

typedef struct glu_case {
    moex_glu_params glu;
    int64_t rows, F;
    double *h, *probs, *dz, *z;
} glu_case;

static double glu_loss(void *p) {
    glu_case *c = (glu_case *)p;
    ref_scaled_glu_forward(&c->glu, c->rows, c->F, c->h, NULL, c->probs, c->z, NULL);
    return dot(c->dz, c->z, c->rows * c->F);
}

static void test_fd_glu(tu_rng *r, moex_glu_kind kind, moex_glu_layout layout) {
    char nm[96];
    glu_case c = {.glu = moex_glu_params_default(kind), .rows = 5, .F = layout == MOEX_GLU_INTERLEAVED_32 ? 64 : 13};
    c.glu.layout = layout;
    const int64_t n2 = c.rows * 2 * c.F, n1 = c.rows * c.F;
    c.h = tu_doubles(n2), c.probs = tu_doubles(c.rows), c.dz = tu_doubles(n1), c.z = tu_doubles(n1);
    double L = c.glu.limit;
    for (int64_t i = 0; i < n2; i++) c.h[i] = off_kink(tu_uniform_range(r, -10, 10), L, 1e-3);
    tu_fill_uniform(r, c.probs, c.rows, 0.1, 1, MOEX_DTYPE_F32);
    tu_fill_uniform(r, c.dz, n1, -1, 1, MOEX_DTYPE_F32);
    double *dh = tu_doubles(n2), *dhb = tu_doubles(n2), *dp = tu_doubles(c.rows), *dpb = tu_doubles(c.rows);
    double *zb = tu_doubles(n1);
    ref_scaled_glu_forward(&c.glu, c.rows, c.F, c.h, NULL, c.probs, c.z, zb);
    ref_scaled_glu_backward(&c.glu, c.rows, c.F, c.h, NULL, c.probs, c.dz, NULL, dh, dhb, dp, dpb);
    snprintf(nm, sizeof nm, "scaled GLU kind %d layout %d dh", (int)kind, (int)layout);
    check_fd(nm, glu_loss, &c, c.h, dh, n2, 1);
    snprintf(nm, sizeof nm, "scaled GLU kind %d layout %d dprobs", (int)kind, (int)layout);
    check_fd(nm, glu_loss, &c, c.probs, dp, c.rows, 1);
    check_bound("glu z bound", c.z, zb, n1);
    check_bound("glu dh bound", dh, dhb, n2);
    check_bound("glu dprobs bound", dp, dpb, c.rows);
    /* both layouts use every column exactly once */
    int *seen = (int *)tu_zalloc((size_t)(2 * c.F) * sizeof(int));
    for (int64_t j = 0; j < c.F; j++) {
        int64_t ja, jb;
        ref_glu_columns(layout, c.F, j, &ja, &jb);
        seen[ja]++, seen[jb]++;
    }
    int once = 1;
    for (int64_t j = 0; j < 2 * c.F; j++) once &= seen[j] == 1;
    CHECK_MSG(once, "layout %d covers each column once", (int)layout);
    free(seen);
    free(c.h); free(c.probs); free(c.dz); free(c.z); free(dh); free(dhb); free(dp); free(dpb); free(zb);
}

/* The pointwise derivatives against differences, and the magnitudes bound them. */
static void test_glu_point(moex_glu_kind kind) {
    moex_glu_params glu = moex_glu_params_default(kind);
    double L = glu.limit;
    int64_t bad1 = 0, bad2 = 0, badb = 0, badm = 0, n = 0;
    for (double a = -12.0; a <= 12.0; a += 0.0137) {
        double av = kind == MOEX_GLU_CLAMPED_SWIGLU ? off_kink(a, L, 1e-3) : a;
        for (double b = -9.0; b <= 9.0; b += 2.37) {
            double bv = kind == MOEX_GLU_CLAMPED_SWIGLU ? off_kink(b, L, 1e-3) : b;
            ref_glu_point q = ref_glu_eval(&glu, av, bv), qp, qm;
            double e = 1e-5;
            qp = ref_glu_eval(&glu, av + e, bv), qm = ref_glu_eval(&glu, av - e, bv);
            if (fabs((qp.act - qm.act) / (2 * e) - q.dact) > 1e-7 * (1 + fabs(q.dact))) bad1++;
            if (fabs((qp.dact - qm.dact) / (2 * e) - q.act2) > 1e-6 * (1 + fabs(q.act2))) bad2++;
            qp = ref_glu_eval(&glu, av, bv + e), qm = ref_glu_eval(&glu, av, bv - e);
            if (fabs((qp.g - qm.g) / (2 * e) - q.dg) > 1e-7) badb++;
            if (fabs(q.dact) > q.slope_mag * (1 + 1e-12) || fabs(q.act2) > q.act2_mag * (1 + 1e-12)) badm++;
            n++;
        }
    }
    CHECK_MSG(bad1 == 0, "glu kind %d: d act/da wrong at %lld of %lld points", (int)kind, (long long)bad1, (long long)n);
    CHECK_MSG(bad2 == 0, "glu kind %d: d2 act/da2 wrong at %lld points", (int)kind, (long long)bad2);
    CHECK_MSG(badb == 0, "glu kind %d: d g/db wrong at %lld points", (int)kind, (long long)badb);
    CHECK_MSG(badm == 0, "glu kind %d: magnitudes below |derivative| at %lld points", (int)kind, (long long)badm);
    /* spot values */
    ref_glu_point q = ref_glu_eval(&glu, 1.0, 2.0);
    if (kind == MOEX_GLU_SWIGLU) {
        CHECK(fabs(q.act - 1.0 / (1.0 + exp(-1.0))) < 1e-15 && q.g == 2.0);
    } else {
        double al = glu.alpha;
        CHECK(fabs(q.act - 1.0 / (1.0 + exp(-al))) < 1e-15 && fabs(q.g - 3.0) < 1e-15);
        q = ref_glu_eval(&glu, 9.0, -8.0); /* both clamped */
        CHECK(fabs(q.act - L / (1.0 + exp(-al * L))) < 1e-15 && q.dact == 0.0);
        CHECK(fabs(q.g - (-L + glu.offset)) < 1e-6 && q.dg == 0.0);
    }
}

/* ---- grouped MLP --------------------------------------------------------------------- */

typedef struct mlp_case {
    ref_mlp p;
    double *x, *w1, *b1, *w2, *b2, *probs, *dy;
    double *h, *z, *y;
    int64_t rows;
} mlp_case;

static double mlp_loss(void *v) {
    mlp_case *c = (mlp_case *)v;
    ref_grouped_mlp_forward(&c->p, c->h, NULL, c->z, NULL, c->y, NULL);
    return dot(c->dy, c->y, c->rows * c->p.H);
}

/* Minimum distance of any GLU input in h to a clamp kink. */
static double kink_distance(const mlp_case *c) {
    double L = c->p.glu.limit, d = INFINITY;
    for (int64_t i = 0; i < c->rows * 2 * c->p.F; i++) {
        d = fmin(d, fabs(c->h[i] - L));
        d = fmin(d, fabs(c->h[i] + L));
    }
    return d;
}

static void test_fd_mlp(tu_rng *r, moex_glu_kind kind, moex_glu_layout layout, moex_bias_mode b2_mode,
                        int with_b1, int with_probs) {
    char nm[128];
    const int64_t G = 3, T = 8, H = 6, F = layout == MOEX_GLU_INTERLEAVED_32 ? 32 : 5;
    int64_t splits[3] = {2, 0, 4}; /* sum 6 < T */
    mlp_case c;
    memset(&c, 0, sizeof c);
    c.rows = 6;
    c.x = tu_doubles(T * H), c.w1 = tu_doubles(G * 2 * F * H), c.b1 = tu_doubles(G * 2 * F);
    c.w2 = tu_doubles(G * H * F), c.b2 = tu_doubles(G * H), c.probs = tu_doubles(T), c.dy = tu_doubles(T * H);
    c.h = tu_doubles(T * 2 * F), c.z = tu_doubles(T * F), c.y = tu_doubles(T * H);
    moex_glu_params glu = moex_glu_params_default(kind);
    glu.layout = layout;
    c.p = (ref_mlp){.G = G, .T = T, .H = H, .F = F, .splits = splits, .x = c.x, .w1 = c.w1,
                    .b1 = with_b1 ? c.b1 : NULL, .w2 = c.w2, .b2 = c.b2,
                    .probs = with_probs ? c.probs : NULL, .b2_mode = b2_mode, .glu = glu};
    /* Scale W1 so that h spans past the clamp limits; redraw until no h is near a kink. */
    for (int attempt = 0; attempt < 100; attempt++) {
        tu_fill_uniform(r, c.x, T * H, -1, 1, MOEX_DTYPE_F32);
        tu_fill_uniform(r, c.w1, G * 2 * F * H, -6, 6, MOEX_DTYPE_F32);
        tu_fill_uniform(r, c.b1, G * 2 * F, -1, 1, MOEX_DTYPE_F32);
        ref_grouped_mlp_forward(&c.p, c.h, NULL, c.z, NULL, c.y, NULL);
        if (kind != MOEX_GLU_CLAMPED_SWIGLU || kink_distance(&c) > 1e-3) break;
    }
    tu_fill_uniform(r, c.w2, G * H * F, -1, 1, MOEX_DTYPE_F32);
    tu_fill_uniform(r, c.b2, G * H, -1, 1, MOEX_DTYPE_F32);
    tu_fill_uniform(r, c.probs, T, 0.1, 1, MOEX_DTYPE_F32);
    tu_fill_uniform(r, c.dy, T * H, -1, 1, MOEX_DTYPE_F32);
    ref_grouped_mlp_forward(&c.p, c.h, NULL, c.z, NULL, c.y, NULL);
    if (kind == MOEX_GLU_CLAMPED_SWIGLU) {
        int past = 0;
        for (int64_t i = 0; i < c.rows * 2 * F; i++) past += fabs(c.h[i]) > glu.limit;
        CHECK_MSG(kink_distance(&c) > 1e-3, "MLP FD case keeps h away from the clamp kinks");
        CHECK_MSG(past > 0, "MLP FD case has h past the clamp limits (%d)", past);
    }
    ref_mlp_grads g = {0};
    g.dx = tu_doubles(T * H), g.dxb = tu_doubles(T * H);
    g.dw1 = tu_doubles(G * 2 * F * H), g.dw1b = tu_doubles(G * 2 * F * H);
    g.dw2 = tu_doubles(G * H * F), g.dw2b = tu_doubles(G * H * F);
    g.db1 = tu_doubles(G * 2 * F), g.db1b = tu_doubles(G * 2 * F);
    g.db2 = tu_doubles(G * H), g.db2b = tu_doubles(G * H);
    g.dprobs = tu_doubles(T), g.dprobsb = tu_doubles(T);
    ref_grouped_mlp_backward(&c.p, c.dy, &g);
    const char *tag = kind == MOEX_GLU_SWIGLU ? "swiglu" : "clamped";
    snprintf(nm, sizeof nm, "MLP %s L%d b2 %d b1 %d p %d", tag, (int)layout, (int)b2_mode, with_b1, with_probs);
    char what[160];
#define FD_MLP(field, arr, n)                                                                \
    do {                                                                                     \
        snprintf(what, sizeof what, "%s %s", nm, #field);                                     \
        check_fd(what, mlp_loss, &c, arr, g.field, n, 1);                                     \
        check_bound(what, g.field, g.field##b, n);                                           \
    } while (0)
    FD_MLP(dx, c.x, c.rows * H);
    FD_MLP(dw1, c.w1, G * 2 * F * H);
    FD_MLP(dw2, c.w2, G * H * F);
    if (with_b1) FD_MLP(db1, c.b1, G * 2 * F);
    if (b2_mode != MOEX_BIAS_NONE) FD_MLP(db2, c.b2, G * H);
    if (with_probs) FD_MLP(dprobs, c.probs, c.rows);
#undef FD_MLP
    /* the saved-tensor path: h_saved / z_saved equal to the exact h and z change nothing */
    {
        ref_mlp_grads g2 = g;
        g2.dx = tu_doubles(T * H), g2.dw1 = tu_doubles(G * 2 * F * H), g2.dw2 = tu_doubles(G * H * F);
        g2.dxb = g2.dw1b = g2.dw2b = g2.db1 = g2.db1b = g2.db2 = g2.db2b = g2.dprobs = g2.dprobsb = NULL;
        ref_grouped_mlp_forward(&c.p, c.h, NULL, c.z, NULL, c.y, NULL);
        c.p.h_saved = c.h, c.p.z_saved = c.z;
        ref_grouped_mlp_backward(&c.p, c.dy, &g2);
        c.p.h_saved = c.p.z_saved = NULL;
        double dmax = 0;
        for (int64_t i = 0; i < c.rows * H; i++) dmax = fmax(dmax, fabs(g2.dx[i] - g.dx[i]));
        for (int64_t i = 0; i < G * 2 * F * H; i++) dmax = fmax(dmax, fabs(g2.dw1[i] - g.dw1[i]));
        for (int64_t i = 0; i < G * H * F; i++) dmax = fmax(dmax, fabs(g2.dw2[i] - g.dw2[i]));
        CHECK_MSG(dmax == 0.0, "%s: saved h and z path differs by %g", nm, dmax);
        free(g2.dx); free(g2.dw1); free(g2.dw2);
    }
    /* forward bounds */
    double *hb = tu_doubles(T * 2 * F), *zb = tu_doubles(T * F), *yb = tu_doubles(T * H);
    ref_grouped_mlp_forward(&c.p, c.h, hb, c.z, zb, c.y, yb);
    check_bound("mlp h bound", c.h, hb, c.rows * 2 * F);
    check_bound("mlp z bound", c.z, zb, c.rows * F);
    check_bound("mlp y bound", c.y, yb, c.rows * H);
    free(hb); free(zb); free(yb);
    free(c.x); free(c.w1); free(c.b1); free(c.w2); free(c.b2); free(c.probs); free(c.dy);
    free(c.h); free(c.z); free(c.y);
    free(g.dx); free(g.dxb); free(g.dw1); free(g.dw1b); free(g.dw2); free(g.dw2b);
    free(g.db1); free(g.db1b); free(g.db2); free(g.db2b); free(g.dprobs); free(g.dprobsb);
}

int main(void) {
    tu_rng r = tu_rng_seed(20240601);
    test_dtype(0);
    test_dtype(1);
    test_tolerance_model();
    test_offsets();
    test_fd_grouped_linear(&r, MOEX_BIAS_NONE);
    test_fd_grouped_linear(&r, MOEX_BIAS_ADD);
    test_fd_grouped_linear(&r, MOEX_BIAS_SCALED);
    for (int kind = 0; kind < 2; kind++) {
        test_glu_point((moex_glu_kind)kind);
        for (int layout = 0; layout < 2; layout++) test_fd_glu(&r, (moex_glu_kind)kind, (moex_glu_layout)layout);
    }
    for (int kind = 0; kind < 2; kind++) {
        test_fd_mlp(&r, (moex_glu_kind)kind, MOEX_GLU_CONTIGUOUS, MOEX_BIAS_SCALED, 1, 1);
        test_fd_mlp(&r, (moex_glu_kind)kind, MOEX_GLU_INTERLEAVED_32, MOEX_BIAS_ADD, 0, 1);
        test_fd_mlp(&r, (moex_glu_kind)kind, MOEX_GLU_CONTIGUOUS, MOEX_BIAS_NONE, 1, 0);
    }
    return tu_finish();
}
