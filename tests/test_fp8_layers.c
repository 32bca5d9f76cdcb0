/*
 * test_fp8_layers.c - the layers' FP8 recipe (moex_fp8_recipe, docs/ops.md 9.11): the grouped
 * linear's forward / backward data / backward weight, the grouped MLP's forward and backward
 * and the MoE layer with fp8.mode BLOCK, CURRENT and MXFP8 (E4M3, and HYBRID: E5M2 gradients),
 * on the CPU backend.
 *
 * How results are judged. Each FP8 GEMM is checked against fp64 math on the dequantized values
 * of the operands it consumed, those quantizations recomputed here by the reference quantizer
 * (tools/ref/ref_quant.h, bitwise the library's rule) from exactly what the library quantized:
 * the caller's x, w, dy, and the MLP's h and z as the library's forward stored them (z from a
 * forward that saves it: a recomputed z is bitwise the saved one, which is checked through y).
 * Such a stage's tolerance is f32 accumulation alone (fp8_tol; on the GPU also the tensor
 * cores' FP8 accumulation).
 *
 * The MLP backward's dz and dh are not exposed. The test computes them with the library's
 * roundings: dz_D in fp64 from the dequantized dy and w2, dzr = round_dt(dz_D), dh_e = the GLU
 * backward (fp64) of the stored h and dzr, dhr = round_dt(dh_e). The library's dz is round_dt
 * of an f32 sum within e_z (the f32 accumulation bound) of dz_D, so it is dzr unless dz_D lies
 * within e_z of a rounding boundary of dt; its dh is round_dt of an f32 GLU backward within
 * 64 u_f32 of dh_e's magnitude bound (plus the effect of those dz ties), so it is dhr unless
 * dh_e lies that close to a boundary. delta (0 for most elements) bounds |dh_lib - dhr|. The
 * test quantizes dhr as the library quantizes its dh. Where the library's dh (anywhere within
 * delta) cannot change the FP8 code or the scale of an element, both dequantize to the same
 * value; elsewhere (an element within delta of an FP8 rounding boundary, or a set whose amax
 * is within delta of a change of scale) the dequantized values may differ by up to
 * allow = max |q / s - deq_ref| over the codes q and factors s reachable from [v - delta,
 * v + delta] and the set's amax range (quant_allowance). dx and dW1 are then checked with the
 * FP8 GEMM tolerance plus c * sum over the reduction of |other operand| * allow; db1 (column
 * sums of dh) with f32 summation plus c * sum of delta; the GLU's dprobs term with f32
 * summation plus the dz ties' effect; db2 and the scaled-b2 term read dy only.
 *
 * Coverage: each mode (BLOCK, CURRENT, MXFP8), HYBRID, pow2 scales, an amax epsilon; groups of
 * 0, 1, 63, 64, 65 and 129 rows, G = 1; K, N, H, F not multiples of 128 (nor of 32 but where
 * the GLU layout wants it); poisoned outputs and rows past sum(splits) untouched (NaN inputs
 * there); dW WRITE (f32 and the activation dtype) and ACCUMULATE; every MLP gradient subset;
 * z saved and recomputed; h kept and MOEX_H_OVERWRITE; discrete weights; bias NONE, ADD,
 * SCALED. mode OFF with the other fields set is bitwise the zero recipe (the plain path). The
 * MoE layer: the recipe reaches its MLP (forward and backward differ from OFF) and stays
 * within the FP8 error of the plain layer.
 * tests/cuda/test_gpu_fp8_layers.c runs this file on the GPU.
 */
#include "ref_quant.h"
#include "ref_routing.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double worst_seen;
static int64_t n_checked;

static void note(double ratio) {
    if (ratio > worst_seen && isfinite(ratio)) worst_seen = ratio;
}

static const char *mode_name(moex_fp8_mode m) {
    return m == MOEX_FP8_BLOCK ? "BLOCK" : m == MOEX_FP8_CURRENT ? "CURRENT" : m == MOEX_FP8_MXFP8 ? "MXFP8" : "OFF";
}

static moex_fp8_recipe recipe(moex_fp8_mode mode, moex_fp8_dtypes dts, int pow2, float eps) {
    moex_fp8_recipe r = {.mode = mode, .dtypes = dts, .pow2_scales = pow2, .amax_epsilon = eps};
    return r;
}

/* docs/ops.md 9.11: which quantization each role gets. */
enum { ROLE_ACT = 0, ROLE_WEIGHT = 1, ROLE_GRAD = 2 };
static moex_quant_params qparams(const moex_fp8_recipe *r, int role) {
    moex_quant_params p;
    memset(&p, 0, sizeof p);
    p.recipe = r->mode == MOEX_FP8_BLOCK ? MOEX_QUANT_BLOCK : r->mode == MOEX_FP8_CURRENT ? MOEX_QUANT_GROUP
                                                                                          : MOEX_QUANT_MXFP8;
    p.fp8 = role == ROLE_GRAD && r->dtypes == MOEX_FP8_HYBRID ? MOEX_DTYPE_E5M2 : MOEX_DTYPE_E4M3;
    p.amax_epsilon = r->mode == MOEX_FP8_MXFP8 ? 0.0f : r->amax_epsilon;
    p.rounding = r->pow2_scales ? MOEX_SCALE_POW2 : MOEX_SCALE_EXACT;
    return p;
}

static int64_t numel(int nd, const int64_t *s) {
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= s[i];
    return n;
}

/* The dequantized values (f32 values, as [T, K]; rows >= S 0) of rows x [T, K] quantized with p,
 * from the copy of orientation `o`. */
static double *deq_rows(const moex_quant_params *p, int o, int64_t G, int64_t T, int64_t K, const int64_t *splits,
                        const double *x) {
    int64_t rs[2], cs[2];
    const int rn = ref_quant_scales_shape(p->recipe, 0, G, T, K, rs), cn = ref_quant_scales_shape(p->recipe, 1, G, T, K, cs);
    uint8_t *data = (uint8_t *)tu_zalloc((size_t)(T * K) + 1);
    void *scales = tu_zalloc((size_t)numel(o ? cn : rn, o ? cs : rs) * 4 + 4);
    ref_quant_out out;
    memset(&out, 0, sizeof out);
    if (o) out.col_data = data, out.col_scales = scales;
    else out.row_data = data, out.row_scales = scales;
    ref_group_quantize(p, G, T, K, splits, x, &out);
    double *v = tu_doubles(T * K);
    ref_group_dequantize(p, o ? MOEX_QUANT_COLUMNWISE : MOEX_QUANT_ROWWISE, G, T, K, splits, data, scales,
                         MOEX_DTYPE_F32, v);
    free(data), free(scales);
    return v;
}

/* The same for weights w [G, N, K] (the values back as [G, N, K]). */
static double *deq_weight(const moex_quant_params *p, int o, int64_t G, int64_t N, int64_t K, const double *w) {
    int64_t ss[3];
    const int sn = ref_weight_scales_shape(p->recipe, o, G, N, K, ss);
    uint8_t *data = (uint8_t *)tu_zalloc((size_t)(G * N * K) + 1);
    void *scales = tu_zalloc((size_t)numel(sn, ss) * 4 + 4);
    ref_quant_out out;
    memset(&out, 0, sizeof out);
    if (o) out.col_data = data, out.col_scales = scales;
    else out.row_data = data, out.row_scales = scales;
    ref_weight_quantize(p, G, N, K, w, &out);
    double *v = tu_doubles(G * N * K);
    ref_weight_dequantize(p, o ? MOEX_QUANT_COLUMNWISE : MOEX_QUANT_ROWWISE, G, N, K, data, scales, MOEX_DTYPE_F32, v);
    free(data), free(scales);
    return v;
}

/* The tolerance of an FP8 GEMM reducing over k: f32 sums; on the GPU also the Hopper tensor
 * cores' FP8 accumulation (about 14 bits within each 128-deep partial sum). */
static ref_tol_model fp8_tol(moex_dtype out, int64_t k) {
    ref_tol_model m = ref_tol_for(out, MOEX_DTYPE_F32, 0, k + 1);
#ifdef TFP8_GPU
    m.u_mid = ldexp(1.0, -13);
#endif
    return m;
}

/* Compares n elements (dtype dt) with ref under m, plus an extra absolute allowance
 * REF_TOL_C * extra[i] (extra may be NULL). One check; returns the worst err / tol. */
static double check_extra(const char *what, moex_dtype dt, const void *got, const double *ref, const double *bound,
                          const double *extra, int64_t n, int64_t cols, const ref_tol_model *m) {
    int64_t bad = 0, worst_i = -1;
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        const double g = ref_load(dt, got, i);
        const double tol = ref_tol(m, ref[i], bound ? bound[i] : fabs(ref[i])) + (extra ? m->c * extra[i] : 0.0);
        const double ratio = isfinite(g) ? fabs(g - ref[i]) / tol : INFINITY;
        if (!(ratio <= 1.0)) bad++;
        if (!(ratio <= worst)) worst = ratio, worst_i = i;
    }
    n_checked += n;
    if (bad)
        CHECK_MSG(0, "%s: %lld of %lld elements out of tolerance; worst [%lld, %lld]: got %.9g ref %.9g (err/tol %.3g)",
                  what, (long long)bad, (long long)n, (long long)(worst_i / cols), (long long)(worst_i % cols),
                  ref_load(dt, got, worst_i), ref[worst_i], worst);
    else
        CHECK_MSG(1, "%s", what);
    note(worst);
    return worst;
}

/* Bitwise equality of two buffers. */
static void check_same(const char *what, const void *a, const void *b, size_t bytes) {
    CHECK_MSG(memcmp(a, b, bytes) == 0, "%s: not bitwise equal", what);
}

/* ---- the allowance of a quantized intermediate (see the top of the file) ------------------- */

/* One set of elements idx[0..n) of v: their allowances. */
static void allow_set(const moex_quant_params *p, const double *v, const double *delta, const double *deq,
                      const int64_t *idx, int64_t n, double *allow) {
    if (n == 0) return;
    double lo = 0, hi = 0;   /* the range of the library's amax */
    for (int64_t i = 0; i < n; i++) {
        const double a = fabs(v[idx[i]]), d = delta[idx[i]];
        if (a - d > lo) lo = a - d;
        if (a + d > hi) hi = a + d;
    }
    double s_lo, s_hi;   /* the range of the quantization factor s (q = fp8(x s), deq = q / s) */
    if (p->recipe == MOEX_QUANT_MXFP8) {
        s_lo = ldexp(1.0, -ref_mx_exponent(p->fp8, hi));
        s_hi = ldexp(1.0, -ref_mx_exponent(p->fp8, lo));
    } else {
        s_lo = ref_quant_factor(p, hi);
        s_hi = lo > 0 ? ref_quant_factor(p, lo) : INFINITY;
    }
    for (int64_t i = 0; i < n; i++) {
        const int64_t e = idx[i];
        if (!isfinite(s_hi)) {   /* the scale is unbounded: anything from 0 to the value's range */
            allow[e] = fabs(v[e]) + delta[e] + fabs(deq[e]);
            continue;
        }
        double qmin = INFINITY, qmax = -INFINITY;
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 2; b++) {
                const double x = (a ? v[e] + delta[e] : v[e] - delta[e]) * (b ? s_hi : s_lo);
                const double q = ref_fp8_decode(p->fp8, ref_fp8_encode(p->fp8, (double)(float)x));
                if (q < qmin) qmin = q;
                if (q > qmax) qmax = q;
            }
        double w = 0;
        const double qs[2] = {qmin, qmax}, ss[2] = {s_lo, s_hi};
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 2; b++) {
                const double d = fabs(qs[a] / ss[b] - deq[e]);
                if (d > w) w = d;
            }
        allow[e] = w + ldexp(fabs(deq[e]), -22);   /* f32 rounding of the scale and the product */
    }
}

/* allow [T, K] (rows < S) for v [T, K] quantized with p in orientation o when the library's
 * value lies within delta of v; deq: the dequantized v of that orientation. */
static double *quant_allowance(const moex_quant_params *p, int o, int64_t G, int64_t T, int64_t K,
                               const int64_t *splits, const double *v, const double *delta, const double *deq) {
    double *allow = tu_doubles(T * K);
    int64_t *off = (int64_t *)tu_alloc((size_t)(G + 1) * sizeof(int64_t));
    ref_offsets(splits, G, off);
    int64_t *idx = (int64_t *)tu_alloc((size_t)(T * K + 1) * sizeof(int64_t));
    const int64_t B = p->recipe == MOEX_QUANT_BLOCK ? 128 : p->recipe == MOEX_QUANT_MXFP8 ? 32 : 0;
    for (int64_t g = 0; g < G; g++) {
        if (B == 0) {   /* GROUP: the group's rows, both orientations */
            int64_t n = 0;
            for (int64_t t = off[g]; t < off[g + 1]; t++)
                for (int64_t k = 0; k < K; k++) idx[n++] = t * K + k;
            allow_set(p, v, delta, deq, idx, n, allow);
        } else if (o == 0) {   /* rowwise: B columns of a row */
            for (int64_t t = off[g]; t < off[g + 1]; t++)
                for (int64_t k0 = 0; k0 < K; k0 += B) {
                    int64_t n = 0;
                    for (int64_t k = k0; k < K && k < k0 + B; k++) idx[n++] = t * K + k;
                    allow_set(p, v, delta, deq, idx, n, allow);
                }
        } else {   /* columnwise: B rows of the group (from its first) in a column */
            for (int64_t k = 0; k < K; k++)
                for (int64_t t0 = off[g]; t0 < off[g + 1]; t0 += B) {
                    int64_t n = 0;
                    for (int64_t t = t0; t < off[g + 1] && t < t0 + B; t++) idx[n++] = t * K + k;
                    allow_set(p, v, delta, deq, idx, n, allow);
                }
        }
    }
    free(off), free(idx);
    return allow;
}

/* ---- the grouped linear ------------------------------------------------------------------------- */

typedef struct lin_case {
    int64_t G, T, K, N;
    const int64_t *splits;      /* NULL: balanced over `rows` */
    int64_t rows;
    moex_fp8_recipe r;
    moex_dtype dt;
    moex_bias_mode mode;
    moex_grad_mode dw_mode;
    int dw_f32;                 /* WRITE: f32 (1) or dt (0) */
    int discrete;
} lin_case;

static void run_linear(moex_context *ctx, tu_rng *rng, const lin_case *c) {
    const int64_t G = c->G, T = c->T, K = c->K, N = c->N;
    const moex_dtype dt = c->dt;
    int64_t *splits = (int64_t *)tu_alloc((size_t)G * sizeof(int64_t));
    if (c->splits) memcpy(splits, c->splits, (size_t)G * sizeof(int64_t));
    else tu_make_splits(rng, TU_SPLITS_BALANCED, G, c->rows, splits);
    int64_t S = 0;
    for (int64_t g = 0; g < G; g++) S += splits[g];
    char label[240], what[320];
    snprintf(label, sizeof label, "linear %s%s%s eps %g G=%lld T=%lld S=%lld K=%lld N=%lld %s bias %d dw %s%s%s",
             mode_name(c->r.mode), c->r.dtypes == MOEX_FP8_HYBRID ? " hybrid" : "", c->r.pow2_scales ? " pow2" : "",
             (double)c->r.amax_epsilon, (long long)G, (long long)T, (long long)S, (long long)K, (long long)N,
             moex_dtype_name(dt), (int)c->mode, c->dw_mode == MOEX_GRAD_ACCUMULATE ? "acc" : "write",
             c->dw_mode == MOEX_GRAD_WRITE && c->dw_f32 ? "(f32)" : "", c->discrete ? " discrete" : "");
    tu_log("case %s\n", label);
    const int failures_before = tu_failures();
    const int acc = c->dw_mode == MOEX_GRAD_ACCUMULATE;

    double *x = tu_doubles(T * K), *w = tu_doubles(G * N * K), *dy = tu_doubles(T * N), *bias = tu_doubles(G * N);
    double *probs = tu_doubles(T), *dp0 = tu_doubles(T), *dw0 = tu_doubles(G * N * K);
    tu_fill_uniform(rng, x, S * K, -2, 2, dt);
    tu_fill_uniform(rng, w, G * N * K, -0.5, 0.5, dt);
    tu_fill_uniform(rng, dy, S * N, -1, 1, dt);
    tu_fill_uniform(rng, bias, G * N, -1, 1, MOEX_DTYPE_F32);
    tu_fill_uniform(rng, probs, S, 0.05, 1, MOEX_DTYPE_F32);
    tu_fill_uniform(rng, dp0, S, -1, 1, MOEX_DTYPE_F32);
    tu_fill_uniform(rng, dw0, G * N * K, -1, 1, MOEX_DTYPE_F32);
    void *xb = tu_buffer_rows(dt, x, S, T, K), *dyb = tu_buffer_rows(dt, dy, S, T, N);
    void *bb = tu_buffer(MOEX_DTYPE_F32, bias, G * N), *pb = tu_buffer_rows(MOEX_DTYPE_F32, probs, S, T, 1);
    tu_weight wt = tu_weight_make(dt, G, N, K, w, c->discrete);
    const moex_tensor splits_t = moex_tensor_1d(splits, MOEX_DTYPE_I64, G);
    const moex_quant_params pa = qparams(&c->r, ROLE_ACT), pw = qparams(&c->r, ROLE_WEIGHT),
                            pg = qparams(&c->r, ROLE_GRAD);
    size_t bytes = 0;
    void *ws;

    /* forward: y = deq(Q_act(x) rowwise) deq(Q_w(w) rowwise)^T (+ bias) */
    void *yb = tu_poisoned(dt, T * N);
    moex_grouped_linear_args fa;
    memset(&fa, 0, sizeof fa);
    fa.x = moex_tensor_2d(xb, dt, T, K), fa.w = wt.w, fa.bias_mode = c->mode, fa.splits = splits_t;
    if (c->mode != MOEX_BIAS_NONE) fa.bias = moex_tensor_2d(bb, MOEX_DTYPE_F32, G, N);
    if (c->mode == MOEX_BIAS_SCALED) fa.probs = moex_tensor_1d(pb, MOEX_DTYPE_F32, T);
    fa.y = moex_tensor_2d(yb, dt, T, N);
    fa.fp8 = c->r;
    CHECK_STATUS(ctx, moex_grouped_linear_forward_workspace_size(ctx, &fa, &bytes), MOEX_OK);
    ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_grouped_linear_forward(ctx, &fa, ws, bytes, NULL), MOEX_OK);
    free(ws);
    double *xr = deq_rows(&pa, 0, G, T, K, splits, x), *wr = deq_weight(&pw, 0, G, N, K, w);
    double *y = tu_doubles(T * N), *ybd = tu_doubles(T * N);
    ref_grouped_linear_forward(G, T, K, N, splits, xr, wr, c->mode, bias, probs, y, ybd);
    ref_tol_model m = fp8_tol(dt, K);
    snprintf(what, sizeof what, "forward y [%s]", label);
    check_extra(what, dt, yb, y, ybd, NULL, S * N, N, &m);
    CHECK_POISONED("forward: y tail rows", dt, yb, S * N, T * N);

    /* backward data: dx = deq(Q_grad(dy) rowwise) deq(Q_w(w) columnwise); dbias, dprobs as plain */
    void *dxb = tu_poisoned(dt, T * K), *dbb = tu_poisoned(dt, G * N), *dpb = tu_buffer_rows(MOEX_DTYPE_F32, dp0, S, T, 1);
    moex_grouped_linear_dgrad_args da;
    memset(&da, 0, sizeof da);
    da.dy = moex_tensor_2d(dyb, dt, T, N), da.w = wt.w, da.bias_mode = c->mode, da.splits = splits_t;
    da.dx = moex_tensor_2d(dxb, dt, T, K);
    if (c->mode != MOEX_BIAS_NONE) da.dbias = moex_tensor_2d(dbb, dt, G, N);
    if (c->mode == MOEX_BIAS_SCALED) {
        da.bias = fa.bias, da.probs = fa.probs;
        da.dprobs = moex_tensor_1d(dpb, MOEX_DTYPE_F32, T);
    }
    da.fp8 = c->r;
    CHECK_STATUS(ctx, moex_grouped_linear_backward_data_workspace_size(ctx, &da, &bytes), MOEX_OK);
    ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_grouped_linear_backward_data(ctx, &da, ws, bytes, NULL), MOEX_OK);
    free(ws);
    double *dyr = deq_rows(&pg, 0, G, T, N, splits, dy), *wc = deq_weight(&pw, 1, G, N, K, w);
    double *dx = tu_doubles(T * K), *dxbd = tu_doubles(T * K);
    ref_grouped_linear_backward_data(G, T, K, N, splits, dyr, wc, MOEX_BIAS_NONE, NULL, NULL, dx, dxbd, NULL, NULL,
                                     NULL, NULL);
    m = fp8_tol(dt, N);
    snprintf(what, sizeof what, "backward data dx [%s]", label);
    check_extra(what, dt, dxb, dx, dxbd, NULL, S * K, K, &m);
    CHECK_POISONED("backward data: dx tail rows", dt, dxb, S * K, T * K);
    if (c->mode != MOEX_BIAS_NONE) {   /* the plain math on dy itself */
        double *db = tu_doubles(G * N), *dbbd = tu_doubles(G * N), *dpr = tu_doubles(T), *dprb = tu_doubles(T);
        ref_grouped_linear_backward_data(G, T, K, N, splits, dy, w, c->mode, bias, probs, NULL, NULL, db, dbbd, dpr,
                                         dprb);
        m = ref_tol_for(dt, MOEX_DTYPE_F32, 0, S + 1);
        snprintf(what, sizeof what, "backward data dbias [%s]", label);
        check_extra(what, dt, dbb, db, dbbd, NULL, G * N, N, &m);
        if (c->mode == MOEX_BIAS_SCALED) {
            for (int64_t i = 0; i < S; i++) dpr[i] += dp0[i], dprb[i] += fabs(dp0[i]);
            m = ref_tol_for(MOEX_DTYPE_F32, MOEX_DTYPE_F32, 0, N + 1);
            snprintf(what, sizeof what, "backward data dprobs (+=) [%s]", label);
            check_extra(what, MOEX_DTYPE_F32, dpb, dpr, dprb, NULL, S, 1, &m);
            CHECK_POISONED("backward data: dprobs tail rows", MOEX_DTYPE_F32, dpb, S, T);
        }
        free(db), free(dbbd), free(dpr), free(dprb);
    }

    /* backward weight: dW = deq(Q_grad(dy) columnwise)^T deq(Q_act(x) columnwise) */
    const moex_dtype dwdt = acc || c->dw_f32 ? MOEX_DTYPE_F32 : dt;
    tu_weight dwt = tu_weight_make(dwdt, G, N, K, acc ? dw0 : NULL, c->discrete);
    moex_grouped_linear_wgrad_args wa;
    memset(&wa, 0, sizeof wa);
    wa.x = fa.x, wa.dy = da.dy, wa.splits = splits_t, wa.dw_mode = c->dw_mode, wa.dw = dwt.w, wa.fp8 = c->r;
    CHECK_STATUS(ctx, moex_grouped_linear_backward_weight_workspace_size(ctx, &wa, &bytes), MOEX_OK);
    ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_grouped_linear_backward_weight(ctx, &wa, ws, bytes, NULL), MOEX_OK);
    free(ws);
    double *xc = deq_rows(&pa, 1, G, T, K, splits, x), *dyc = deq_rows(&pg, 1, G, T, N, splits, dy);
    double *dw = tu_doubles(G * N * K), *dwbd = tu_doubles(G * N * K), *got = tu_doubles(G * N * K);
    ref_grouped_linear_backward_weight(G, T, K, N, splits, xc, dyc, dw, dwbd);
    for (int64_t i = 0; acc && i < G * N * K; i++) dw[i] += dw0[i], dwbd[i] += fabs(dw0[i]);
    tu_weight_read(&dwt, got);
    float *gf = (float *)tu_alloc((size_t)(G * N * K) * sizeof(float) + 4);   /* every dtype is exact in f32 */
    for (int64_t i = 0; i < G * N * K; i++) gf[i] = (float)got[i];
    m = fp8_tol(dwdt, S);
    snprintf(what, sizeof what, "backward weight dW [%s]", label);
    check_extra(what, MOEX_DTYPE_F32, gf, dw, dwbd, NULL, G * N * K, K, &m);
    for (int64_t g = 0, ok = 1; g < G; g++) {   /* empty groups: 0 (WRITE) or unchanged (ACCUMULATE) */
        if (splits[g]) continue;
        for (int64_t i = g * N * K; i < (g + 1) * N * K; i++) ok &= acc ? got[i] == dw0[i] : got[i] == 0.0;
        CHECK_MSG(ok, "backward weight: empty group %lld [%s]", (long long)g, label);
    }
    if (tu_failures() != failures_before) printf("  (failures above: case %s)\n", label);

    free(splits), free(x), free(w), free(dy), free(bias), free(probs), free(dp0), free(dw0), free(xb), free(dyb);
    free(bb), free(pb), free(yb), free(xr), free(wr), free(y), free(ybd), free(dxb), free(dbb), free(dpb);
    free(dyr), free(wc), free(dx), free(dxbd), free(xc), free(dyc), free(dw), free(dwbd), free(got), free(gf);
    tu_weight_free(&wt), tu_weight_free(&dwt);
}

/* ---- the grouped MLP ---------------------------------------------------------------------------- */

enum { G_DX = 1, G_DW1 = 2, G_DW2 = 4, G_DB1 = 8, G_DB2 = 16, G_DP = 32, G_ALL = 63 };

typedef struct mlp_case {
    int64_t G, T, H, F;
    const int64_t *splits;      /* NULL: balanced over `rows` */
    int64_t rows;
    moex_fp8_recipe r;
    moex_dtype dt;
    moex_glu_layout layout;
    int b1, probs, save_z, overwrite_h, discrete;
    moex_bias_mode b2_mode;
    unsigned grads;
    moex_grad_mode dw_mode;
    int dw_f32;
} mlp_case;

static void run_mlp(moex_context *ctx, tu_rng *rng, const mlp_case *c) {
    const int64_t G = c->G, T = c->T, H = c->H, F = c->F;
    const moex_dtype dt = c->dt;
    int64_t *splits = (int64_t *)tu_alloc((size_t)G * sizeof(int64_t));
    if (c->splits) memcpy(splits, c->splits, (size_t)G * sizeof(int64_t));
    else tu_make_splits(rng, TU_SPLITS_BALANCED, G, c->rows, splits);
    int64_t S = 0;
    for (int64_t g = 0; g < G; g++) S += splits[g];
    const int acc = c->dw_mode == MOEX_GRAD_ACCUMULATE;
    const unsigned gr = c->grads;
    char label[300], what[380];
    snprintf(label, sizeof label,
             "mlp %s%s%s G=%lld T=%lld S=%lld H=%lld F=%lld %s %s b1=%d b2=%d probs=%d save_z=%d%s grads=%u dw %s%s%s",
             mode_name(c->r.mode), c->r.dtypes == MOEX_FP8_HYBRID ? " hybrid" : "", c->r.pow2_scales ? " pow2" : "",
             (long long)G, (long long)T, (long long)S, (long long)H, (long long)F, moex_dtype_name(dt),
             c->layout ? "interleaved" : "contiguous", c->b1, (int)c->b2_mode, c->probs, c->save_z,
             c->overwrite_h ? " h_overwrite" : "", gr, acc ? "acc" : "write",
             !acc && c->dw_f32 ? "(f32)" : "", c->discrete ? " discrete" : "");
    tu_log("case %s\n", label);
    const int failures_before = tu_failures();

    moex_glu_params glu = moex_glu_params_default(MOEX_GLU_SWIGLU);
    glu.layout = c->layout;
    const double ws1 = 2.5 * sqrt(3.0 / (double)H);
    double *x = tu_doubles(T * H), *w1 = tu_doubles(G * 2 * F * H), *b1 = tu_doubles(G * 2 * F);
    double *w2 = tu_doubles(G * H * F), *b2 = tu_doubles(G * H), *probs = tu_doubles(T), *dy = tu_doubles(T * H);
    double *dp0 = tu_doubles(T), *dw1_0 = tu_doubles(G * 2 * F * H), *dw2_0 = tu_doubles(G * H * F);
    tu_fill_uniform(rng, x, S * H, -1, 1, dt);
    tu_fill_uniform(rng, w1, G * 2 * F * H, -ws1, ws1, dt);
    tu_fill_uniform(rng, b1, G * 2 * F, -1, 1, MOEX_DTYPE_F32);
    tu_fill_uniform(rng, w2, G * H * F, -0.3, 0.3, dt);
    tu_fill_uniform(rng, b2, G * H, -1, 1, MOEX_DTYPE_F32);
    tu_fill_uniform(rng, probs, S, 0.05, 1, MOEX_DTYPE_F32);
    tu_fill_uniform(rng, dy, S * H, -1, 1, dt);
    tu_fill_uniform(rng, dp0, S, -1, 1, MOEX_DTYPE_F32);
    tu_fill_uniform(rng, dw1_0, G * 2 * F * H, -1, 1, MOEX_DTYPE_F32);
    tu_fill_uniform(rng, dw2_0, G * H * F, -1, 1, MOEX_DTYPE_F32);
    void *xb = tu_buffer_rows(dt, x, S, T, H), *dyb = tu_buffer_rows(dt, dy, S, T, H);
    void *pb = tu_buffer_rows(MOEX_DTYPE_F32, probs, S, T, 1);
    void *b1b = tu_buffer(MOEX_DTYPE_F32, b1, G * 2 * F), *b2b = tu_buffer(MOEX_DTYPE_F32, b2, G * H);
    tu_weight w1t = tu_weight_make(dt, G, 2 * F, H, w1, c->discrete), w2t = tu_weight_make(dt, G, H, F, w2, c->discrete);
    void *hb = tu_poisoned(dt, T * 2 * F), *zb = tu_poisoned(dt, T * F), *yb = tu_poisoned(dt, T * H);
    void *hb2 = tu_poisoned(dt, T * 2 * F), *zb2 = tu_poisoned(dt, T * F), *yb2 = tu_poisoned(dt, T * H);
    const moex_tensor splits_t = moex_tensor_1d(splits, MOEX_DTYPE_I64, G);
    const moex_quant_params pa = qparams(&c->r, ROLE_ACT), pw = qparams(&c->r, ROLE_WEIGHT),
                            pg = qparams(&c->r, ROLE_GRAD);
    const double *pp = c->probs ? probs : NULL;
    size_t bytes = 0;
    void *ws;

    /* ---- forward, with z saved (zb) and without (zb2: untouched; h and y bitwise the same) ---- */
    moex_grouped_mlp_args fa;
    memset(&fa, 0, sizeof fa);
    fa.x = moex_tensor_2d(xb, dt, T, H), fa.w1 = w1t.w, fa.w2 = w2t.w, fa.b2_mode = c->b2_mode, fa.glu = glu;
    if (c->b1) fa.b1 = moex_tensor_2d(b1b, MOEX_DTYPE_F32, G, 2 * F);
    if (c->b2_mode != MOEX_BIAS_NONE) fa.b2 = moex_tensor_2d(b2b, MOEX_DTYPE_F32, G, H);
    if (c->probs) fa.probs = moex_tensor_1d(pb, MOEX_DTYPE_F32, T);
    fa.splits = splits_t, fa.fp8 = c->r;
    fa.h = moex_tensor_2d(hb, dt, T, 2 * F), fa.z = moex_tensor_2d(zb, dt, T, F), fa.y = moex_tensor_2d(yb, dt, T, H);
    CHECK_STATUS(ctx, moex_grouped_mlp_forward_workspace_size(ctx, &fa, &bytes), MOEX_OK);
    ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_grouped_mlp_forward(ctx, &fa, ws, bytes, NULL), MOEX_OK);
    free(ws);
    moex_grouped_mlp_args fa2 = fa;
    memset(&fa2.z, 0, sizeof fa2.z);
    fa2.h = moex_tensor_2d(hb2, dt, T, 2 * F), fa2.y = moex_tensor_2d(yb2, dt, T, H);
    CHECK_STATUS(ctx, moex_grouped_mlp_forward_workspace_size(ctx, &fa2, &bytes), MOEX_OK);
    ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_grouped_mlp_forward(ctx, &fa2, ws, bytes, NULL), MOEX_OK);
    free(ws);
    snprintf(what, sizeof what, "forward without z: h and y as with z saved [%s]", label);
    check_same(what, hb, hb2, (size_t)(T * 2 * F) * moex_dtype_size(dt));
    check_same(what, yb, yb2, (size_t)(T * H) * moex_dtype_size(dt));
    CHECK_POISONED("forward without z: z untouched", dt, zb2, 0, T * F);

    /* h = deq(Q_act(x)) deq(Q_w(w1))^T (+ b1) */
    double *xr = deq_rows(&pa, 0, G, T, H, splits, x), *w1r = deq_weight(&pw, 0, G, 2 * F, H, w1);
    double *h = tu_doubles(T * 2 * F), *hbd = tu_doubles(T * 2 * F);
    ref_grouped_linear_forward(G, T, H, 2 * F, splits, xr, w1r, c->b1 ? MOEX_BIAS_ADD : MOEX_BIAS_NONE, b1, NULL, h, hbd);
    ref_tol_model m = fp8_tol(dt, H);
    snprintf(what, sizeof what, "forward h [%s]", label);
    check_extra(what, dt, hb, h, hbd, NULL, S * 2 * F, 2 * F, &m);
    CHECK_POISONED("forward: h tail rows", dt, hb, S * 2 * F, T * 2 * F);
    /* z = p glu(h as stored) */
    double *hs = tu_read(dt, hb, T * 2 * F), *z = tu_doubles(T * F), *zbd = tu_doubles(T * F);
    ref_scaled_glu_forward(&glu, S, F, hs, NULL, pp, z, zbd);
    m = ref_tol_for(dt, MOEX_DTYPE_F32, 0, 8);
    snprintf(what, sizeof what, "forward z [%s]", label);
    check_extra(what, dt, zb, z, zbd, NULL, S * F, F, &m);
    CHECK_POISONED("forward: z tail rows", dt, zb, S * F, T * F);
    /* y = deq(Q_act(z as stored)) deq(Q_w(w2))^T (+ b2 | + p b2) */
    double *zs = tu_read(dt, zb, T * F);
    double *zr = deq_rows(&pa, 0, G, T, F, splits, zs), *w2r = deq_weight(&pw, 0, G, H, F, w2);
    double *y = tu_doubles(T * H), *ybd = tu_doubles(T * H);
    ref_grouped_linear_forward(G, T, F, H, splits, zr, w2r, c->b2_mode, b2, probs, y, ybd);
    m = fp8_tol(dt, F);
    snprintf(what, sizeof what, "forward y [%s]", label);
    check_extra(what, dt, yb, y, ybd, NULL, S * H, H, &m);
    CHECK_POISONED("forward: y tail rows", dt, yb, S * H, T * H);

    /* ---- backward ---- */
    const int want_db2 = (gr & G_DB2) && c->b2_mode != MOEX_BIAS_NONE, want_dp = (gr & G_DP) && c->probs;
    const moex_dtype dwdt = acc || c->dw_f32 ? MOEX_DTYPE_F32 : dt;
    void *dxb = tu_poisoned(dt, T * H), *db1b = tu_poisoned(MOEX_DTYPE_F32, G * 2 * F), *db2b = tu_poisoned(dt, G * H);
    void *dpb = tu_buffer_rows(MOEX_DTYPE_F32, dp0, S, T, 1);
    tu_weight dw1t = tu_weight_make(dwdt, G, 2 * F, H, acc ? dw1_0 : NULL, c->discrete);
    tu_weight dw2t = tu_weight_make(dwdt, G, H, F, acc ? dw2_0 : NULL, c->discrete);
    void *hcopy = tu_alloc((size_t)(T * 2 * F) * moex_dtype_size(dt));
    memcpy(hcopy, hb, (size_t)(T * 2 * F) * moex_dtype_size(dt));
    moex_grouped_mlp_grad_args ba;
    memset(&ba, 0, sizeof ba);
    ba.x = fa.x, ba.w1 = w1t.w, ba.w2 = w2t.w, ba.b2_mode = c->b2_mode, ba.probs = fa.probs, ba.glu = glu;
    if (c->b2_mode == MOEX_BIAS_SCALED) ba.b2 = fa.b2;
    ba.splits = splits_t, ba.h = fa.h, ba.dy = moex_tensor_2d(dyb, dt, T, H), ba.dw_mode = c->dw_mode;
    if (c->save_z) ba.z = fa.z;
    if (gr & G_DX) ba.dx = moex_tensor_2d(dxb, dt, T, H);
    if (gr & G_DW1) ba.dw1 = dw1t.w;
    if (gr & G_DW2) ba.dw2 = dw2t.w;
    if (gr & G_DB1) ba.db1 = moex_tensor_2d(db1b, MOEX_DTYPE_F32, G, 2 * F);
    if (want_db2) ba.db2 = moex_tensor_2d(db2b, dt, G, H);
    if (want_dp) ba.dprobs = moex_tensor_1d(dpb, MOEX_DTYPE_F32, T);
    ba.h_mode = c->overwrite_h ? MOEX_H_OVERWRITE : MOEX_H_KEEP;
    ba.fp8 = c->r;
    CHECK_STATUS(ctx, moex_grouped_mlp_backward_workspace_size(ctx, &ba, &bytes), MOEX_OK);
    ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_grouped_mlp_backward(ctx, &ba, ws, bytes, NULL), MOEX_OK);
    free(ws);
    if (!c->overwrite_h) check_same("backward: h kept", hb, hcopy, (size_t)(T * 2 * F) * moex_dtype_size(dt));

    /* dW2 = deq(Q_grad(dy) columnwise)^T deq(Q_act(z) columnwise): exact operands */
    double *dyc = deq_rows(&pg, 1, G, T, H, splits, dy), *zc = deq_rows(&pa, 1, G, T, F, splits, zs);
    double *dw2 = tu_doubles(G * H * F), *dw2b = tu_doubles(G * H * F);
    ref_grouped_linear_backward_weight(G, T, F, H, splits, zc, dyc, dw2, dw2b);
    /* dz_D = deq(Q_grad(dy) rowwise) deq(Q_w(w2) columnwise), unrounded */
    double *dyr = deq_rows(&pg, 0, G, T, H, splits, dy), *w2c = deq_weight(&pw, 1, G, H, F, w2);
    double *dz = tu_doubles(T * F), *dzbd = tu_doubles(T * F);
    ref_grouped_linear_backward_data(G, T, F, H, splits, dyr, w2c, MOEX_BIAS_NONE, NULL, NULL, dz, dzbd, NULL, NULL,
                                     NULL, NULL);
    /* The library's dz is round_dt of an f32 sum within e_z of dz_D: it is round_dt(dz_D) unless
     * dz_D lies within e_z of a rounding boundary of dt (ulpz: the spread of the two roundings
     * then, else 0). dh_e: the GLU backward (h as stored) of dzr = round_dt(dz_D); the library's
     * f32 dh lies within e_h = 64 u_f32 dhb (the pointwise functions in f32) + |d dh / d dz| ulpz
     * of it, and its stored dh in [round(dh_e - e_h), round(dh_e + e_h)]: delta around
     * dhr = round(dh_e) (0 for most elements: the two roundings agree). */
    const ref_tol_model mz = fp8_tol(MOEX_DTYPE_F32, H);
    double *dzr = tu_doubles(T * F), *ulpz = tu_doubles(T * F);
    for (int64_t i = 0; i < S * F; i++) {
        const double e = mz.c * (mz.u_mid + mz.k * mz.u_acc) * dzbd[i] + ldexp(1.0, -140);
        dzr[i] = ref_round(dt, dz[i]);
        ulpz[i] = ref_round(dt, dz[i] + e) - ref_round(dt, dz[i] - e);
    }
    double *dh = tu_doubles(T * 2 * F), *dhbd = tu_doubles(T * 2 * F), *dpg = tu_doubles(T), *dpgb = tu_doubles(T);
    double *amb_h = tu_doubles(T * 2 * F), *amb_p = tu_doubles(T), *scratch = tu_doubles(T * 2 * F);
    double *scratch_p = tu_doubles(T);
    ref_scaled_glu_backward(&glu, S, F, hs, NULL, pp, dzr, NULL, dh, dhbd, pp ? dpg : NULL, pp ? dpgb : NULL);
    ref_scaled_glu_backward(&glu, S, F, hs, NULL, pp, ulpz, ulpz, scratch, amb_h, pp ? scratch_p : NULL,
                            pp ? amb_p : NULL);
    double *dhr = tu_doubles(T * 2 * F), *delta = tu_doubles(T * 2 * F);
    int64_t n_delta = 0;
    for (int64_t i = 0; i < S * 2 * F; i++) {
        const double e = 64 * ldexp(dhbd[i], -24) + amb_h[i];
        dhr[i] = ref_round(dt, dh[i]);
        delta[i] = fmax(fabs(ref_round(dt, dh[i] - e) - dhr[i]), fabs(ref_round(dt, dh[i] + e) - dhr[i]));
        n_delta += delta[i] > 0;
    }
    tu_log("  dh: %lld of %lld elements may differ from the test's\n", (long long)n_delta, (long long)(S * 2 * F));
    double *dhq_r = deq_rows(&pg, 0, G, T, 2 * F, splits, dhr), *dhq_c = deq_rows(&pg, 1, G, T, 2 * F, splits, dhr);
    double *al_r = quant_allowance(&pg, 0, G, T, 2 * F, splits, dhr, delta, dhq_r);
    double *al_c = quant_allowance(&pg, 1, G, T, 2 * F, splits, dhr, delta, dhq_c);

    if (gr & G_DX) {   /* dx = deq(Q_grad(dh)) deq(Q_w(w1) columnwise) */
        double *w1c = deq_weight(&pw, 1, G, 2 * F, H, w1), *dx = tu_doubles(T * H), *dxbd = tu_doubles(T * H);
        double *ex = tu_doubles(T * H);
        ref_grouped_linear_backward_data(G, T, H, 2 * F, splits, dhq_r, w1c, MOEX_BIAS_NONE, NULL, NULL, dx, dxbd,
                                         NULL, NULL, NULL, NULL);
        int64_t *off = (int64_t *)tu_alloc((size_t)(G + 1) * sizeof(int64_t));
        ref_offsets(splits, G, off);
        for (int64_t g = 0; g < G; g++)
            for (int64_t t = off[g]; t < off[g + 1]; t++)
                for (int64_t f = 0; f < 2 * F; f++) {
                    const double a = al_r[t * 2 * F + f];
                    if (a == 0) continue;
                    for (int64_t k = 0; k < H; k++) ex[t * H + k] += a * fabs(w1c[(g * 2 * F + f) * H + k]);
                }
        m = fp8_tol(dt, 2 * F);
        snprintf(what, sizeof what, "backward dx [%s]", label);
        check_extra(what, dt, dxb, dx, dxbd, ex, S * H, H, &m);
        CHECK_POISONED("backward: dx tail rows", dt, dxb, S * H, T * H);
        free(w1c), free(dx), free(dxbd), free(ex), free(off);
    } else {
        CHECK_POISONED("backward: absent dx untouched", dt, dxb, 0, T * H);
    }
    double *got = tu_doubles(G * 2 * F * H);
    float *gf = (float *)tu_alloc((size_t)(G * 2 * F * H) * sizeof(float) + 4);
    if (gr & G_DW1) {   /* dW1 = deq(Q_grad(dh) columnwise)^T deq(Q_act(x) columnwise) */
        double *xc = deq_rows(&pa, 1, G, T, H, splits, x), *dw1 = tu_doubles(G * 2 * F * H);
        double *dw1b = tu_doubles(G * 2 * F * H), *ex = tu_doubles(G * 2 * F * H);
        ref_grouped_linear_backward_weight(G, T, H, 2 * F, splits, xc, dhq_c, dw1, dw1b);
        int64_t *off = (int64_t *)tu_alloc((size_t)(G + 1) * sizeof(int64_t));
        ref_offsets(splits, G, off);
        for (int64_t g = 0; g < G; g++)
            for (int64_t t = off[g]; t < off[g + 1]; t++)
                for (int64_t f = 0; f < 2 * F; f++) {
                    const double a = al_c[t * 2 * F + f];
                    if (a == 0) continue;
                    for (int64_t k = 0; k < H; k++) ex[(g * 2 * F + f) * H + k] += a * fabs(xc[t * H + k]);
                }
        for (int64_t i = 0; acc && i < G * 2 * F * H; i++) dw1[i] += dw1_0[i], dw1b[i] += fabs(dw1_0[i]);
        tu_weight_read(&dw1t, got);
        for (int64_t i = 0; i < G * 2 * F * H; i++) gf[i] = (float)got[i];
        m = fp8_tol(dwdt, S);
        snprintf(what, sizeof what, "backward dW1 [%s]", label);
        check_extra(what, MOEX_DTYPE_F32, gf, dw1, dw1b, ex, G * 2 * F * H, H, &m);
        free(xc), free(dw1), free(dw1b), free(ex), free(off);
    } else {
        tu_weight_read(&dw1t, got);
        int ok = 1;
        for (int64_t i = 0; i < G * 2 * F * H; i++) ok &= acc ? got[i] == dw1_0[i] : isnan(got[i]);
        CHECK_MSG(ok, "backward: absent dW1 untouched [%s]", label);
    }
    if (gr & G_DW2) {
        for (int64_t i = 0; acc && i < G * H * F; i++) dw2[i] += dw2_0[i], dw2b[i] += fabs(dw2_0[i]);
        tu_weight_read(&dw2t, got);
        for (int64_t i = 0; i < G * H * F; i++) gf[i] = (float)got[i];
        m = fp8_tol(dwdt, S);
        snprintf(what, sizeof what, "backward dW2 [%s]", label);
        check_extra(what, MOEX_DTYPE_F32, gf, dw2, dw2b, NULL, G * H * F, F, &m);
    } else {
        tu_weight_read(&dw2t, got);
        int ok = 1;
        for (int64_t i = 0; i < G * H * F; i++) ok &= acc ? got[i] == dw2_0[i] : isnan(got[i]);
        CHECK_MSG(ok, "backward: absent dW2 untouched [%s]", label);
    }
    if (gr & G_DB1) {   /* the plain column sums of the library's dh (within delta of dhr) */
        double *db1 = tu_doubles(G * 2 * F), *db1bd = tu_doubles(G * 2 * F), *ex = tu_doubles(G * 2 * F);
        int64_t *off = (int64_t *)tu_alloc((size_t)(G + 1) * sizeof(int64_t));
        ref_offsets(splits, G, off);
        for (int64_t g = 0; g < G; g++)
            for (int64_t t = off[g]; t < off[g + 1]; t++)
                for (int64_t f = 0; f < 2 * F; f++) {
                    const int64_t i = t * 2 * F + f, o = g * 2 * F + f;
                    db1[o] += dhr[i], db1bd[o] += fabs(dhr[i]), ex[o] += delta[i];
                }
        m = ref_tol_for(MOEX_DTYPE_F32, MOEX_DTYPE_F32, 0, S + 1);
        snprintf(what, sizeof what, "backward db1 [%s]", label);
        check_extra(what, MOEX_DTYPE_F32, db1b, db1, db1bd, ex, G * 2 * F, 2 * F, &m);
        free(db1), free(db1bd), free(ex), free(off);
    } else {
        CHECK_POISONED("backward: absent db1 untouched", MOEX_DTYPE_F32, db1b, 0, G * 2 * F);
    }
    double *db2 = tu_doubles(G * H), *db2bd = tu_doubles(G * H), *dpb2 = tu_doubles(T), *dpb2b = tu_doubles(T);
    if (c->b2_mode != MOEX_BIAS_NONE)
        ref_grouped_linear_backward_data(G, T, F, H, splits, dy, w2, c->b2_mode, b2, probs, NULL, NULL, db2, db2bd,
                                         c->b2_mode == MOEX_BIAS_SCALED ? dpb2 : NULL,
                                         c->b2_mode == MOEX_BIAS_SCALED ? dpb2b : NULL);
    if (want_db2) {
        m = ref_tol_for(dt, MOEX_DTYPE_F32, 0, S + 1);
        snprintf(what, sizeof what, "backward db2 [%s]", label);
        check_extra(what, dt, db2b, db2, db2bd, NULL, G * H, H, &m);
    } else {
        CHECK_POISONED("backward: absent db2 untouched", dt, db2b, 0, G * H);
    }
    if (want_dp) {   /* += the scaled-b2 term (dy only) and the GLU term (dz: the chain model) */
        double *dp = tu_doubles(T), *dpbd = tu_doubles(T);
        for (int64_t i = 0; i < S; i++) {
            dp[i] = dp0[i] + dpb2[i] + dpg[i];
            dpbd[i] = fabs(dp0[i]) + dpb2b[i] + dpgb[i];
        }
        m = ref_tol_for(MOEX_DTYPE_F32, MOEX_DTYPE_F32, 0, H + F + 8);
        snprintf(what, sizeof what, "backward dprobs (+=) [%s]", label);
        check_extra(what, MOEX_DTYPE_F32, dpb, dp, dpbd, amb_p, S, 1, &m);
        free(dp), free(dpbd);
    } else {
        double *back = tu_read(MOEX_DTYPE_F32, dpb, S);
        CHECK_MSG(memcmp(back, dp0, (size_t)S * sizeof(double)) == 0, "backward: absent dprobs untouched [%s]", label);
        free(back);
    }
    CHECK_POISONED("backward: dprobs tail rows", MOEX_DTYPE_F32, dpb, S, T);
    if (tu_failures() != failures_before) printf("  (failures above: case %s)\n", label);

    free(splits), free(x), free(w1), free(b1), free(w2), free(b2), free(probs), free(dy), free(dp0), free(dw1_0);
    free(dw2_0), free(xb), free(dyb), free(pb), free(b1b), free(b2b), free(hb), free(zb), free(yb), free(hb2);
    free(zb2), free(yb2), free(xr), free(w1r), free(h), free(hbd), free(hs), free(z), free(zbd), free(zs), free(zr);
    free(w2r), free(y), free(ybd), free(dxb), free(db1b), free(db2b), free(dpb), free(hcopy), free(dyc), free(zc);
    free(dw2), free(dw2b), free(dyr), free(w2c), free(dz), free(dzbd), free(dh), free(dhbd), free(dpg), free(dpgb);
    free(dzr), free(ulpz), free(amb_h), free(amb_p), free(scratch), free(scratch_p);
    free(dhr), free(delta), free(dhq_r), free(dhq_c), free(al_r), free(al_c), free(got), free(gf), free(db2);
    free(db2bd), free(dpb2), free(dpb2b);
    tu_weight_free(&w1t), tu_weight_free(&w2t), tu_weight_free(&dw1t), tu_weight_free(&dw2t);
}

/* ---- mode OFF: the other fields set, bitwise the zero recipe (the plain path) --------------------- */

static void check_off(moex_context *ctx, tu_rng *rng) {
    const int64_t G = 3, T = 90, H = 40, F = 24, splits[3] = {30, 0, 50};
    const moex_dtype dt = MOEX_DTYPE_BF16;
    double *x = tu_doubles(T * H), *w1 = tu_doubles(G * 2 * F * H), *w2 = tu_doubles(G * H * F), *dy = tu_doubles(T * H);
    tu_fill_uniform(rng, x, T * H, -1, 1, dt), tu_fill_uniform(rng, w1, G * 2 * F * H, -0.3, 0.3, dt);
    tu_fill_uniform(rng, w2, G * H * F, -0.3, 0.3, dt), tu_fill_uniform(rng, dy, T * H, -1, 1, dt);
    void *xb = tu_buffer(dt, x, T * H), *w1b = tu_buffer(dt, w1, G * 2 * F * H), *w2b = tu_buffer(dt, w2, G * H * F);
    void *dyb = tu_buffer(dt, dy, T * H);
    const moex_fp8_recipe zero = recipe(MOEX_FP8_OFF, MOEX_FP8_E4M3_ALL, 0, 0.0f),
                          off = recipe(MOEX_FP8_OFF, MOEX_FP8_HYBRID, 1, 0.25f);
    void *out[2][6];
    for (int k = 0; k < 2; k++) {
        const moex_fp8_recipe r = k ? off : zero;
        size_t bytes;
        void *ws;
        out[k][0] = tu_poisoned(dt, T * 2 * F), out[k][1] = tu_poisoned(dt, T * F), out[k][2] = tu_poisoned(dt, T * H);
        out[k][3] = tu_poisoned(dt, T * H), out[k][4] = tu_poisoned(MOEX_DTYPE_F32, G * 2 * F * H);
        out[k][5] = tu_poisoned(MOEX_DTYPE_F32, G * H * F);
        moex_grouped_mlp_args fa;
        memset(&fa, 0, sizeof fa);
        fa.x = moex_tensor_2d(xb, dt, T, H);
        fa.w1 = moex_weight_packed(moex_tensor_3d(w1b, dt, G, 2 * F, H));
        fa.w2 = moex_weight_packed(moex_tensor_3d(w2b, dt, G, H, F));
        fa.glu = moex_glu_params_default(MOEX_GLU_SWIGLU);
        fa.splits = moex_tensor_1d((void *)splits, MOEX_DTYPE_I64, G);
        fa.h = moex_tensor_2d(out[k][0], dt, T, 2 * F), fa.z = moex_tensor_2d(out[k][1], dt, T, F);
        fa.y = moex_tensor_2d(out[k][2], dt, T, H), fa.fp8 = r;
        CHECK_STATUS(ctx, moex_grouped_mlp_forward_workspace_size(ctx, &fa, &bytes), MOEX_OK);
        ws = tu_workspace(bytes);
        CHECK_STATUS(ctx, moex_grouped_mlp_forward(ctx, &fa, ws, bytes, NULL), MOEX_OK);
        free(ws);
        moex_grouped_mlp_grad_args ba;
        memset(&ba, 0, sizeof ba);
        ba.x = fa.x, ba.w1 = fa.w1, ba.w2 = fa.w2, ba.glu = fa.glu, ba.splits = fa.splits, ba.h = fa.h, ba.z = fa.z;
        ba.dy = moex_tensor_2d(dyb, dt, T, H), ba.dx = moex_tensor_2d(out[k][3], dt, T, H);
        ba.dw1 = moex_weight_packed(moex_tensor_3d(out[k][4], MOEX_DTYPE_F32, G, 2 * F, H));
        ba.dw2 = moex_weight_packed(moex_tensor_3d(out[k][5], MOEX_DTYPE_F32, G, H, F));
        ba.fp8 = r;
        CHECK_STATUS(ctx, moex_grouped_mlp_backward_workspace_size(ctx, &ba, &bytes), MOEX_OK);
        ws = tu_workspace(bytes);
        CHECK_STATUS(ctx, moex_grouped_mlp_backward(ctx, &ba, ws, bytes, NULL), MOEX_OK);
        free(ws);
    }
    const size_t sz[6] = {(size_t)(T * 2 * F) * 2, (size_t)(T * F) * 2, (size_t)(T * H) * 2, (size_t)(T * H) * 2,
                          (size_t)(G * 2 * F * H) * 4, (size_t)(G * H * F) * 4};
    static const char *names[6] = {"h", "z", "y", "dx", "dW1", "dW2"};
    for (int i = 0; i < 6; i++) {
        char what[80];
        snprintf(what, sizeof what, "mode OFF with fields set: MLP %s as the zero recipe", names[i]);
        check_same(what, out[0][i], out[1][i], sz[i]);
        free(out[0][i]), free(out[1][i]);
    }
    free(x), free(w1), free(w2), free(dy), free(xb), free(w1b), free(w2b), free(dyb);
}

/* ---- the MoE layer: the recipe reaches its MLP, forward and backward ------------------------------ */

/* ||a - b|| / ||b|| over n elements of dtype dt (a, b buffers). */
static double rel_diff(moex_dtype dt, const void *a, const void *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        const double u = ref_load(dt, a, i), v = ref_load(dt, b, i);
        num += (u - v) * (u - v), den += v * v;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void check_moe(moex_context *ctx, tu_rng *rng, moex_fp8_mode mode) {
    const int64_t T = 70, H = 72, E = 4, F = 40, k = 2;
    const moex_dtype dt = MOEX_DTYPE_BF16;
    double *x = tu_doubles(T * H), *rw = tu_doubles(E * H), *w1 = tu_doubles(E * 2 * F * H), *w2 = tu_doubles(E * H * F);
    double *dy = tu_doubles(T * H);
    tu_fill_uniform(rng, x, T * H, -1, 1, dt), tu_fill_uniform(rng, rw, E * H, -1, 1, dt);
    tu_fill_uniform(rng, w1, E * 2 * F * H, -0.3, 0.3, dt), tu_fill_uniform(rng, w2, E * H * F, -0.3, 0.3, dt);
    tu_fill_uniform(rng, dy, T * H, -1, 1, dt);
    void *xb = tu_buffer(dt, x, T * H), *rwb = tu_buffer(dt, rw, E * H), *w1b = tu_buffer(dt, w1, E * 2 * F * H);
    void *w2b = tu_buffer(dt, w2, E * H * F), *dyb = tu_buffer(dt, dy, T * H);
    void *y[2], *dx[2], *dw1[2], *dw2[2], *drw[2];
    for (int run = 0; run < 2; run++) {   /* 0: OFF, 1: the recipe */
        moex_moe_layer_args a;
        memset(&a, 0, sizeof a);
        a.x = moex_tensor_2d(xb, dt, T, H), a.router_w = moex_tensor_2d(rwb, dt, E, H), a.topk = (int32_t)k;
        a.w1 = moex_weight_packed(moex_tensor_3d(w1b, dt, E, 2 * F, H));
        a.w2 = moex_weight_packed(moex_tensor_3d(w2b, dt, E, H, F));
        a.glu = moex_glu_params_default(MOEX_GLU_SWIGLU);
        y[run] = tu_poisoned(dt, T * H);
        a.y = moex_tensor_2d(y[run], dt, T, H);
        if (run) a.fp8 = recipe(mode, MOEX_FP8_HYBRID, 0, 0.0f);
        size_t sb = 0, bytes = 0;
        CHECK_STATUS(ctx, moex_moe_layer_saved_size(ctx, &a, &sb), MOEX_OK);
        a.saved = tu_alloc(sb), a.saved_bytes = sb;
        CHECK_STATUS(ctx, moex_moe_layer_forward_workspace_size(ctx, &a, &bytes), MOEX_OK);
        void *ws = tu_workspace(bytes);
        CHECK_STATUS(ctx, moex_moe_layer_forward(ctx, &a, ws, bytes, NULL), MOEX_OK);
        free(ws);
        moex_moe_layer_grad_args b;
        memset(&b, 0, sizeof b);
        b.fwd = a, b.dy = moex_tensor_2d(dyb, dt, T, H);
        dx[run] = tu_poisoned(dt, T * H), dw1[run] = tu_poisoned(MOEX_DTYPE_F32, E * 2 * F * H);
        dw2[run] = tu_poisoned(MOEX_DTYPE_F32, E * H * F), drw[run] = tu_poisoned(MOEX_DTYPE_F32, E * H);
        b.dx = moex_tensor_2d(dx[run], dt, T, H), b.drouter_w = moex_tensor_2d(drw[run], MOEX_DTYPE_F32, E, H);
        b.dw1 = moex_weight_packed(moex_tensor_3d(dw1[run], MOEX_DTYPE_F32, E, 2 * F, H));
        b.dw2 = moex_weight_packed(moex_tensor_3d(dw2[run], MOEX_DTYPE_F32, E, H, F));
        CHECK_STATUS(ctx, moex_moe_layer_backward_workspace_size(ctx, &b, &bytes), MOEX_OK);
        ws = tu_workspace(bytes);
        CHECK_STATUS(ctx, moex_moe_layer_backward(ctx, &b, ws, bytes, NULL), MOEX_OK);
        free(ws), free(a.saved);
    }
    /* FP8 model: each operand within 2^-4 (E4M3) or 2^-3 (E5M2 gradients) relative of its value,
     * per element; through two chained GEMMs and the GLU the norm-relative error stays well under
     * 2^-2 (about 2^-5 for these random operands). Different from OFF: the recipe ran. */
    struct { const char *name; moex_dtype dt; void **v; int64_t n; } outs[5] = {
        {.name = "y", .dt = dt, .v = y, .n = T * H},
        {.name = "dx", .dt = dt, .v = dx, .n = T * H},
        {.name = "dW1", .dt = MOEX_DTYPE_F32, .v = dw1, .n = E * 2 * F * H},
        {.name = "dW2", .dt = MOEX_DTYPE_F32, .v = dw2, .n = E * H * F},
        {.name = "drouter_w", .dt = MOEX_DTYPE_F32, .v = drw, .n = E * H}};
    for (int i = 0; i < 5; i++) {
        const double d = rel_diff(outs[i].dt, outs[i].v[1], outs[i].v[0], outs[i].n);
        CHECK_MSG(d > 0 && d < 0.25, "moe layer %s: %s of the FP8 layer is %.3g (norm-relative) from the plain one",
                  mode_name(mode), outs[i].name, d);
        CHECK_FINITE("moe layer FP8 output", outs[i].dt, outs[i].v[1], outs[i].n);
        tu_log("moe %s %s rel diff %.3g\n", mode_name(mode), outs[i].name, d);
        free(outs[i].v[0]), free(outs[i].v[1]);
    }
    free(x), free(rw), free(w1), free(w2), free(dy), free(xb), free(rwb), free(w1b), free(w2b), free(dyb);
}

int main(void) {
    moex_context *ctx = tu_cpu_context();
    tu_rng rng = tu_rng_seed(9011);
    static const int64_t classes[6] = {0, 1, 63, 64, 65, 129};   /* sum 322 */
    static const moex_fp8_mode modes[3] = {MOEX_FP8_BLOCK, MOEX_FP8_CURRENT, MOEX_FP8_MXFP8};
    static const moex_dtype dts[3] = {MOEX_DTYPE_BF16, MOEX_DTYPE_F32, MOEX_DTYPE_F16};
    int n = 0;
    for (int i = 0; i < 3; i++) {
        const moex_fp8_mode md = modes[i];
        const moex_fp8_recipe r = recipe(md, i == 1 ? MOEX_FP8_HYBRID : MOEX_FP8_E4M3_ALL, i == 0,
                                         md == MOEX_FP8_MXFP8 ? 0.0f : 1e-3f);
        const moex_fp8_recipe rh = recipe(md, MOEX_FP8_HYBRID, 0, 0.0f);
        /* the grouped linear: the row classes, K and N past 128 and not multiples of 32 */
        const lin_case a = {.G = 6, .T = 330, .K = 200, .N = 136, .splits = classes, .r = r, .dt = dts[i],
                            .mode = (moex_bias_mode)i, .dw_mode = (moex_grad_mode)(i % 2)};
        const lin_case b = {.G = 1, .T = 77, .K = 33, .N = 40, .rows = 70, .r = rh, .dt = dts[(i + 1) % 3],
                            .mode = (moex_bias_mode)((i + 1) % 3), .dw_mode = MOEX_GRAD_WRITE, .dw_f32 = 1,
                            .discrete = i == 2};
        const lin_case e = {.G = 4, .T = 150, .K = 72, .N = 48, .rows = 140, .r = r, .dt = MOEX_DTYPE_BF16,
                            .mode = MOEX_BIAS_SCALED, .dw_mode = MOEX_GRAD_WRITE, .discrete = i == 0};
        run_linear(ctx, &rng, &a), run_linear(ctx, &rng, &b), run_linear(ctx, &rng, &e);
        n += 3;
        /* the grouped MLP: the row classes; G = 1; gradient subsets, z recomputed, h overwritten,
         * discrete weights, dW in the activation dtype */
        const mlp_case m1 = {.G = 6, .T = 330, .H = 136, .F = 96, .splits = classes, .r = r, .dt = dts[i],
                             .layout = MOEX_GLU_CONTIGUOUS, .b1 = 1, .probs = 1, .save_z = 1,
                             .b2_mode = (moex_bias_mode)((i + 2) % 3), .grads = G_ALL,
                             .dw_mode = (moex_grad_mode)(i % 2), .dw_f32 = 1};
        const mlp_case m2 = {.G = 1, .T = 77, .H = 40, .F = 33, .rows = 70, .r = rh, .dt = MOEX_DTYPE_BF16,
                             .layout = MOEX_GLU_CONTIGUOUS, .probs = 1, .overwrite_h = 1, .b2_mode = MOEX_BIAS_SCALED,
                             .grads = i == 0   ? (unsigned)(G_DX | G_DP)
                                      : i == 1 ? (unsigned)(G_DW1 | G_DB2)
                                               : (unsigned)(G_DW2 | G_DB1),
                             .dw_mode = MOEX_GRAD_WRITE};
        const mlp_case m3 = {.G = 3, .T = 200, .H = 72, .F = 64, .rows = 190, .r = r, .dt = MOEX_DTYPE_BF16,
                             .layout = MOEX_GLU_INTERLEAVED_32, .b1 = 1, .probs = 1, .discrete = 1,
                             .b2_mode = MOEX_BIAS_ADD, .grads = i == 1 ? (unsigned)(G_DW1 | G_DW2) : (unsigned)G_ALL,
                             .dw_mode = MOEX_GRAD_WRITE};
        run_mlp(ctx, &rng, &m1), run_mlp(ctx, &rng, &m2), run_mlp(ctx, &rng, &m3);
        /* H a multiple of 16, F of 64 (contiguous) and of 32 (interleaved): on Hopper FC1 and
         * the GLU in one FP8 kernel (BLOCK, CURRENT), z kept or in the workspace */
        const mlp_case m4 = {.G = 4, .T = 300, .H = 128, .F = 64, .rows = 290, .r = r, .dt = MOEX_DTYPE_BF16,
                             .layout = MOEX_GLU_CONTIGUOUS, .b1 = 1, .probs = 1, .save_z = i == 1,
                             .b2_mode = MOEX_BIAS_SCALED, .grads = G_ALL, .dw_mode = MOEX_GRAD_WRITE};
        const mlp_case m5 = {.G = 3, .T = 200, .H = 64, .F = 96, .rows = 190, .r = r, .dt = MOEX_DTYPE_F16,
                             .layout = MOEX_GLU_INTERLEAVED_32, .b1 = 1, .probs = i != 1, .save_z = i == 0,
                             .b2_mode = MOEX_BIAS_ADD, .grads = G_ALL, .dw_mode = MOEX_GRAD_ACCUMULATE, .dw_f32 = 1};
        run_mlp(ctx, &rng, &m4), run_mlp(ctx, &rng, &m5);
        n += 5;
        check_moe(ctx, &rng, md);
    }
    /* the remaining gradient subsets once (BLOCK, hybrid), including none but dprobs */
    static const unsigned subsets[4] = {G_DP, G_DB1 | G_DB2, G_DX | G_DW2, G_DW1 | G_DP};
    for (int s = 0; s < 4; s++) {
        const mlp_case m = {.G = 2, .T = 100, .H = 48, .F = 32, .rows = 90,
                            .r = recipe(MOEX_FP8_BLOCK, MOEX_FP8_HYBRID, 0, 0.0f), .dt = MOEX_DTYPE_BF16,
                            .layout = MOEX_GLU_CONTIGUOUS, .b1 = s % 2, .probs = 1, .save_z = s % 2,
                            .overwrite_h = s == 3, .discrete = s == 2, .b2_mode = MOEX_BIAS_SCALED,
                            .grads = subsets[s], .dw_mode = (moex_grad_mode)(s % 2), .dw_f32 = 1};
        run_mlp(ctx, &rng, &m);
        n++;
    }
    check_off(ctx, &rng);
    printf("%d cases, %lld elements checked, worst err/tol %.3g\n", n, (long long)n_checked, worst_seen);
    moex_context_destroy(ctx);
    return tu_finish();
}
