/*
 * test_grouped_linear.c - moex_grouped_linear_forward / backward_data / backward_weight on
 * the CPU backend against the fp64 reference, under the tolerance model of tools/ref/ref.h.
 *
 * Coverage: f32, bf16, f16; G = 1, 3, 5 and 128 (G = 3 with K, N and rows past the CPU
 * GEMM's block sizes); every splits kind (balanced, skewed, empty
 * group first / middle / last, all in one group) and all groups empty; sum(splits) < T
 * with the input tail rows (x, dy, probs) poisoned with NaN (the outputs must be finite
 * and match, so the library never read them) and the output tail rows poisoned and
 * checked untouched; K and N not powers of two; packed and discrete weights (and dW);
 * bias NONE / ADD / SCALED with the bias in the activation dtype or f32; every subset of
 * the optional dgrad outputs (dx, dbias, dprobs), dprobs accumulating (+=); dW written
 * (f32 or the activation dtype; empty groups -> zeros) and accumulated into an f32 main
 * grad (empty groups unchanged, bitwise).
 */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct gl_cfg {
    moex_dtype dt;
    int64_t G, T, rows, K, N;
    tu_splits_kind kind;
    int all_empty;              /* splits all zero (rows must be 0) */
    int discrete;               /* w and dw as pointer arrays */
    moex_bias_mode mode;
    moex_dtype bias_dt;
    unsigned dgrad_mask;        /* 1: dx, 2: dbias, 4: dprobs, 8: omit bias unless dprobs needs it */
    moex_grad_mode dw_mode;
    moex_dtype dw_dt;
} gl_cfg;

static const char *dt_name(moex_dtype dt) {
    return dt == MOEX_DTYPE_F32 ? "f32" : dt == MOEX_DTYPE_BF16 ? "bf16" : dt == MOEX_DTYPE_F16 ? "f16" : "?";
}

static double worst_seen;

static void note(double ratio) {
    if (ratio > worst_seen && isfinite(ratio)) worst_seen = ratio;
}

static void run_case(moex_context *ctx, tu_rng *r, const gl_cfg *c) {
    const int64_t G = c->G, T = c->T, K = c->K, N = c->N, rows = c->rows;
    const moex_dtype dt = c->dt;
    char label[256];
    snprintf(label, sizeof label, "%s G=%lld T=%lld rows=%lld K=%lld N=%lld %s %s bias=%d(%s) mask=%u dw=%s/%s",
             dt_name(dt), (long long)G, (long long)T, (long long)rows, (long long)K, (long long)N,
             c->all_empty ? "all-empty" : tu_splits_name(c->kind), c->discrete ? "discrete" : "packed", (int)c->mode,
             dt_name(c->bias_dt), c->dgrad_mask, c->dw_mode == MOEX_GRAD_ACCUMULATE ? "acc" : "write",
             dt_name(c->dw_dt));
    tu_log("case %s\n", label);
    int failures_before = tu_failures();

    int64_t *splits = (int64_t *)tu_alloc((size_t)G * sizeof(int64_t));
    if (c->all_empty)
        memset(splits, 0, (size_t)G * sizeof(int64_t));
    else
        tu_make_splits(r, c->kind, G, rows, splits);

    /* fp64 values, rounded to what the library's buffers hold */
    double *x = tu_doubles(T * K), *w = tu_doubles(G * N * K), *bias = tu_doubles(G * N);
    double *probs = tu_doubles(T), *dy = tu_doubles(T * N), *dp0 = tu_doubles(T), *dw0 = tu_doubles(G * N * K);
    tu_fill_uniform(r, x, rows * K, -1, 1, dt);
    tu_fill_uniform(r, w, G * N * K, -1, 1, dt);
    tu_fill_uniform(r, bias, G * N, -1, 1, c->bias_dt);
    tu_fill_uniform(r, probs, rows, 0.05, 1, MOEX_DTYPE_F32);
    tu_fill_uniform(r, dy, rows * N, -1, 1, dt);
    tu_fill_uniform(r, dp0, rows, -1, 1, MOEX_DTYPE_F32);
    tu_fill_uniform(r, dw0, G * N * K, -1, 1, MOEX_DTYPE_F32);

    /* library buffers: input tails NaN, outputs poisoned */
    void *xb = tu_buffer_rows(dt, x, rows, T, K), *dyb = tu_buffer_rows(dt, dy, rows, T, N);
    void *pb = tu_buffer_rows(MOEX_DTYPE_F32, probs, rows, T, 1), *bb = tu_buffer(c->bias_dt, bias, G * N);
    tu_weight wt = tu_weight_make(dt, G, N, K, w, c->discrete);
    void *yb = tu_poisoned(dt, T * N);
    moex_tensor splits_t = moex_tensor_1d(splits, MOEX_DTYPE_I64, G);
    const int scaled = c->mode == MOEX_BIAS_SCALED;

    /* ---- forward ---- */
    moex_grouped_linear_args fa;
    memset(&fa, 0, sizeof fa);
    fa.x = moex_tensor_2d(xb, dt, T, K);
    fa.w = wt.w;
    fa.bias_mode = c->mode;
    if (c->mode != MOEX_BIAS_NONE) fa.bias = moex_tensor_2d(bb, c->bias_dt, G, N);
    if (scaled) fa.probs = moex_tensor_1d(pb, MOEX_DTYPE_F32, T);
    fa.splits = splits_t;
    fa.y = moex_tensor_2d(yb, dt, T, N);
    size_t bytes = 0;
    CHECK_STATUS(ctx, moex_grouped_linear_forward_workspace_size(ctx, &fa, &bytes), MOEX_OK);
    void *ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_grouped_linear_forward(ctx, &fa, ws, bytes, NULL), MOEX_OK);
    free(ws);
    double *y = tu_doubles(T * N), *ybd = tu_doubles(T * N);
    ref_grouped_linear_forward(G, T, K, N, splits, x, w, c->mode, bias, probs, y, ybd);
    ref_tol_model m = ref_tol_for(dt, dt, 0, K);
    char what[320];
    snprintf(what, sizeof what, "forward y [%s]", label);
    note(CHECK_CLOSE(what, dt, yb, y, ybd, rows * N, N, &m));
    CHECK_POISONED("forward: y tail rows", dt, yb, rows * N, T * N);

    /* ---- backward data ---- */
    const int want_dx = c->dgrad_mask & 1, want_db = (c->dgrad_mask & 2) && c->mode != MOEX_BIAS_NONE,
              want_dp = (c->dgrad_mask & 4) && scaled;
    const moex_dtype dbdt = c->bias_dt;   /* dbias in the bias's dtype, as PyTorch gives it */
    void *dxb = tu_poisoned(dt, T * K), *dbb = tu_poisoned(dbdt, G * N);
    void *dpb = tu_buffer_rows(MOEX_DTYPE_F32, dp0, rows, T, 1);
    moex_grouped_linear_dgrad_args da;
    memset(&da, 0, sizeof da);
    da.dy = moex_tensor_2d(dyb, dt, T, N);
    da.w = wt.w;
    da.bias_mode = c->mode;
    if (c->mode != MOEX_BIAS_NONE && (want_dp || (c->dgrad_mask & 8) == 0))
        da.bias = moex_tensor_2d(bb, c->bias_dt, G, N);
    if (scaled) da.probs = moex_tensor_1d(pb, MOEX_DTYPE_F32, T);
    da.splits = splits_t;
    if (want_dx) da.dx = moex_tensor_2d(dxb, dt, T, K);
    if (want_db) da.dbias = moex_tensor_2d(dbb, dbdt, G, N);
    if (want_dp) da.dprobs = moex_tensor_1d(dpb, MOEX_DTYPE_F32, T);
    CHECK_STATUS(ctx, moex_grouped_linear_backward_data_workspace_size(ctx, &da, &bytes), MOEX_OK);
    ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_grouped_linear_backward_data(ctx, &da, ws, bytes, NULL), MOEX_OK);
    free(ws);
    double *dx = tu_doubles(T * K), *dxbd = tu_doubles(T * K), *db = tu_doubles(G * N), *dbbd = tu_doubles(G * N);
    double *dp = tu_doubles(T), *dpbd = tu_doubles(T);
    ref_grouped_linear_backward_data(G, T, K, N, splits, dy, w, c->mode, bias, probs, dx, dxbd, db, dbbd, dp, dpbd);
    if (want_dx) {
        m = ref_tol_for(dt, dt, 0, N);
        snprintf(what, sizeof what, "dgrad dx [%s]", label);
        note(CHECK_CLOSE(what, dt, dxb, dx, dxbd, rows * K, K, &m));
        CHECK_POISONED("dgrad: dx tail rows", dt, dxb, rows * K, T * K);
    } else {
        CHECK_POISONED("dgrad: absent dx untouched", dt, dxb, 0, T * K);
    }
    if (want_db) {
        m = ref_tol_for(dbdt, dt, 0, rows);
        snprintf(what, sizeof what, "dgrad dbias [%s]", label);
        note(CHECK_CLOSE(what, dbdt, dbb, db, dbbd, G * N, N, &m));
    } else {
        CHECK_POISONED("dgrad: absent dbias untouched", dbdt, dbb, 0, G * N);
    }
    if (want_dp) {
        for (int64_t i = 0; i < rows; i++) {
            dp[i] += dp0[i];
            dpbd[i] += fabs(dp0[i]);
        }
        m = ref_tol_for(MOEX_DTYPE_F32, dt, 0, N + 1);
        snprintf(what, sizeof what, "dgrad dprobs (+=) [%s]", label);
        note(CHECK_CLOSE(what, MOEX_DTYPE_F32, dpb, dp, dpbd, rows, 1, &m));
        CHECK_POISONED("dgrad: dprobs tail rows", MOEX_DTYPE_F32, dpb, rows, T);
    } else {
        double *back = tu_read(MOEX_DTYPE_F32, dpb, rows);
        CHECK_MSG(memcmp(back, dp0, (size_t)rows * sizeof(double)) == 0, "dgrad: absent dprobs untouched [%s]", label);
        free(back);
    }

    /* ---- backward weight ---- */
    const int acc = c->dw_mode == MOEX_GRAD_ACCUMULATE;
    tu_weight dwt = acc ? tu_weight_make(MOEX_DTYPE_F32, G, N, K, dw0, c->discrete)
                        : tu_weight_make(c->dw_dt, G, N, K, NULL, c->discrete);
    moex_grouped_linear_wgrad_args wa;
    memset(&wa, 0, sizeof wa);
    wa.x = moex_tensor_2d(xb, dt, T, K);
    wa.dy = moex_tensor_2d(dyb, dt, T, N);
    wa.splits = splits_t;
    wa.dw_mode = c->dw_mode;
    wa.dw = dwt.w;
    CHECK_STATUS(ctx, moex_grouped_linear_backward_weight_workspace_size(ctx, &wa, &bytes), MOEX_OK);
    ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_grouped_linear_backward_weight(ctx, &wa, ws, bytes, NULL), MOEX_OK);
    free(ws);
    double *dw = tu_doubles(G * N * K), *dwbd = tu_doubles(G * N * K), *got = tu_doubles(G * N * K);
    ref_grouped_linear_backward_weight(G, T, K, N, splits, x, dy, dw, dwbd);
    tu_weight_read(&dwt, got);
    if (acc) {
        for (int64_t i = 0; i < G * N * K; i++) {
            dw[i] += dw0[i];
            dwbd[i] += fabs(dw0[i]);
        }
    }
    moex_dtype odt = acc ? MOEX_DTYPE_F32 : c->dw_dt;
    m = ref_tol_for(odt, dt, 0, rows + acc);
    snprintf(what, sizeof what, "wgrad dW [%s]", label);
    {   /* the gathered values (packed or discrete) are exact in f32 */
        float *gf = (float *)tu_alloc((size_t)(G * N * K) * sizeof(float) + 4);
        int exact_f32 = 1;
        for (int64_t i = 0; i < G * N * K; i++) {
            gf[i] = (float)got[i];
            exact_f32 &= (double)gf[i] == got[i] || got[i] != got[i];
        }
        CHECK(exact_f32);
        note(CHECK_CLOSE(what, MOEX_DTYPE_F32, gf, dw, dwbd, G * N * K, K, &m));
        free(gf);
    }
    /* empty groups: zeros (WRITE) or bitwise unchanged (ACCUMULATE) */
    for (int64_t g = 0; g < G; g++) {
        if (splits[g] == 0) {
            int ok = 1;
            for (int64_t i = g * N * K; i < (g + 1) * N * K; i++) ok &= acc ? got[i] == dw0[i] : got[i] == 0.0;
            CHECK_MSG(ok, "wgrad: empty group %lld must be %s [%s]", (long long)g, acc ? "unchanged" : "zero", label);
        }
    }
    if (tu_failures() != failures_before) printf("  (failures above: case %s)\n", label);

    free(splits); free(x); free(w); free(bias); free(probs); free(dy); free(dp0); free(dw0);
    free(xb); free(dyb); free(pb); free(bb); free(yb); free(dxb); free(dbb); free(dpb);
    free(y); free(ybd); free(dx); free(dxbd); free(db); free(dbbd); free(dp); free(dpbd);
    free(dw); free(dwbd); free(got);
    tu_weight_free(&wt);
    tu_weight_free(&dwt);
}

int main(void) {
    moex_context *ctx = tu_cpu_context();
    tu_rng r = tu_rng_seed(12345);
    static const moex_dtype dts[3] = {MOEX_DTYPE_F32, MOEX_DTYPE_BF16, MOEX_DTYPE_F16};
    int n = 0;
    for (int d = 0; d < 3; d++) {
        moex_dtype dt = dts[d];
        /* G = 1 */
        for (int mode = 0; mode < 3; mode++) {
            gl_cfg c = {.dt = dt, .G = 1, .T = 37, .rows = 30, .K = 19, .N = 23, .kind = TU_SPLITS_BALANCED,
                        .discrete = mode == 1, .mode = (moex_bias_mode)mode,
                        .bias_dt = mode == 2 ? MOEX_DTYPE_F32 : dt, .dgrad_mask = 7,
                        .dw_mode = (moex_grad_mode)(mode == 1), .dw_dt = MOEX_DTYPE_F32};
            run_case(ctx, &r, &c), n++;
        }
        /* G = 5, every splits kind, rotating bias modes, weight forms, dgrad subsets, dW modes */
        for (int kind = 0; kind < TU_SPLITS_NUM_KINDS; kind++) {
            for (int mode = 0; mode < 3; mode++) {
                int v = kind * 3 + mode;
                gl_cfg c = {.dt = dt, .G = 5, .T = 70, .rows = 61, .K = 33, .N = 21, .kind = (tu_splits_kind)kind,
                            .discrete = v % 2, .mode = (moex_bias_mode)mode,
                            .bias_dt = v % 3 == 0 ? MOEX_DTYPE_F32 : dt, .dgrad_mask = (unsigned)(1 + v % 15),
                            .dw_mode = (moex_grad_mode)(v % 3 == 2), .dw_dt = v % 2 ? dt : MOEX_DTYPE_F32};
                run_case(ctx, &r, &c), n++;
            }
        }
        /* all groups empty (rows = 0), both dW modes; and T = 0 */
        for (int acc = 0; acc < 2; acc++) {
            gl_cfg c = {.dt = dt, .G = 5, .T = 16, .K = 9, .N = 10, .kind = TU_SPLITS_BALANCED, .all_empty = 1,
                        .discrete = acc, .mode = MOEX_BIAS_SCALED, .bias_dt = dt, .dgrad_mask = 7,
                        .dw_mode = (moex_grad_mode)acc, .dw_dt = dt};
            run_case(ctx, &r, &c), n++;
            c.T = 0;
            run_case(ctx, &r, &c), n++;
        }
        /* large: K, N, rows past the CPU GEMM's blocking (K 256, N 512, M 128), not multiples */
        {
            gl_cfg c = {.dt = dt, .G = 3, .T = 320, .rows = 300, .K = 300, .N = 530, .kind = TU_SPLITS_SKEWED,
                        .discrete = d == 1, .mode = MOEX_BIAS_SCALED, .bias_dt = dt, .dgrad_mask = 7,
                        .dw_mode = (moex_grad_mode)(d != 0), .dw_dt = MOEX_DTYPE_F32};
            run_case(ctx, &r, &c), n++;
        }
        /* G = 128: many empty groups, skewed and one-group */
        for (int k = 0; k < 3; k++) {
            tu_splits_kind kinds[3] = {TU_SPLITS_SKEWED, TU_SPLITS_RANDOM, TU_SPLITS_ONE_GROUP};
            gl_cfg c = {.dt = dt, .G = 128, .T = 300, .rows = 290, .K = 24, .N = 20, .kind = kinds[k],
                        .discrete = k == 1, .mode = (moex_bias_mode)(2 - k % 3), .bias_dt = MOEX_DTYPE_F32,
                        .dgrad_mask = 7, .dw_mode = (moex_grad_mode)(k != 1), .dw_dt = dt};
            run_case(ctx, &r, &c), n++;
        }
        /* packed weights, K and N multiples of 8: on Hopper the bias is fused into the sm90
         * forward (f32 and activation-dtype bias; 128-row tiles, and 64-row ones: T < 128 G) */
        {
            gl_cfg c = {.dt = dt, .G = 6, .T = 520, .rows = 500, .K = 136, .N = 264, .kind = TU_SPLITS_SKEWED,
                        .mode = MOEX_BIAS_ADD, .bias_dt = MOEX_DTYPE_F32, .dgrad_mask = 7, .dw_mode = MOEX_GRAD_WRITE,
                        .dw_dt = dt};
            run_case(ctx, &r, &c), n++;
            gl_cfg e = {.dt = dt, .G = 128, .T = 700, .rows = 690, .K = 64, .N = 136, .kind = TU_SPLITS_RANDOM,
                        .mode = MOEX_BIAS_SCALED, .bias_dt = dt, .dgrad_mask = 7, .dw_mode = MOEX_GRAD_ACCUMULATE,
                        .dw_dt = MOEX_DTYPE_F32};
            run_case(ctx, &r, &e), n++;
        }
    }
    printf("%d cases, worst err/tol %.3g\n", n, worst_seen);
    moex_context_destroy(ctx);
    return tu_finish();
}
