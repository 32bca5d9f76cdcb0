/*
 * test_scaled_glu.c - moex_scaled_glu_forward / backward on the CPU backend against the
 * fp64 reference, under the tolerance model of tools/ref/ref.h.
 *
 * Coverage: f32, bf16, f16; SwiGLU and clamped SwiGLU (default GPT-OSS constants and a
 * custom set), inputs spanning past the clamp limits but never exactly on a kink;
 * contiguous and interleaved-32 layouts; F not a power of two; probs present and absent;
 * splits present (sum < T: input tail rows NaN, output tail rows poisoned and checked
 * untouched; G = 1, 5 with empty groups, 128) and absent (all T rows); dprobs present
 * (accumulating, +=) and absent.
 */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double worst_seen;

static void note(double ratio) {
    if (ratio > worst_seen && isfinite(ratio)) worst_seen = ratio;
}

static const char *dt_name(moex_dtype dt) {
    return dt == MOEX_DTYPE_F32 ? "f32" : dt == MOEX_DTYPE_BF16 ? "bf16" : "f16";
}

/* Uniform in [-range, range], rounded to dt, at least `gap` away from the kinks +-limit
 * (in the rounded value). */
static double glu_input(tu_rng *r, double range, moex_dtype dt, double limit, int clamped) {
    for (;;) {
        double v = ref_round(dt, tu_uniform_range(r, -range, range));
        if (!clamped || (fabs(v - limit) > 1e-3 * limit && fabs(v + limit) > 1e-3 * limit)) return v;
    }
}

typedef struct glu_cfg {
    moex_dtype dt;
    moex_glu_params glu;
    int64_t T, F;
    int64_t G;              /* 0: no splits (all T rows) */
    tu_splits_kind kind;
    int64_t rows;           /* sum(splits); T when G == 0 */
    int with_probs, with_dprobs;
} glu_cfg;

static void run_case(moex_context *ctx, tu_rng *r, const glu_cfg *c) {
    const moex_dtype dt = c->dt;
    const int64_t T = c->T, F = c->F, rows = c->G ? c->rows : T;
    const int clamped = c->glu.kind == MOEX_GLU_CLAMPED_SWIGLU;
    char label[256], what[320];
    snprintf(label, sizeof label, "%s %s %s limit=%g T=%lld F=%lld G=%lld(%s) rows=%lld probs=%d dprobs=%d",
             dt_name(dt), clamped ? "clamped" : "swiglu",
             c->glu.layout == MOEX_GLU_INTERLEAVED_32 ? "interleaved" : "contiguous", (double)c->glu.limit,
             (long long)T, (long long)F, (long long)c->G, c->G ? tu_splits_name(c->kind) : "none", (long long)rows,
             c->with_probs, c->with_dprobs);
    tu_log("case %s\n", label);
    int failures_before = tu_failures();

    int64_t *splits = NULL;
    moex_tensor splits_t;
    memset(&splits_t, 0, sizeof splits_t);
    if (c->G) {
        splits = (int64_t *)tu_alloc((size_t)c->G * sizeof(int64_t));
        tu_make_splits(r, c->kind, c->G, rows, splits);
        splits_t = moex_tensor_1d(splits, MOEX_DTYPE_I64, c->G);
    }
    double *h = tu_doubles(T * 2 * F), *probs = tu_doubles(T), *dz = tu_doubles(T * F), *dp0 = tu_doubles(T);
    for (int64_t i = 0; i < rows * 2 * F; i++) h[i] = glu_input(r, 1.5 * c->glu.limit, dt, c->glu.limit, clamped);
    if (!clamped)
        for (int64_t i = 0; i < rows * 2 * F; i++) h[i] = ref_round(dt, h[i] * 12.0 / (1.5 * c->glu.limit));
    tu_fill_uniform(r, probs, rows, 0.05, 1, MOEX_DTYPE_F32);
    tu_fill_uniform(r, dz, rows * F, -1, 1, dt);
    tu_fill_uniform(r, dp0, rows, -1, 1, MOEX_DTYPE_F32);

    void *hb = tu_buffer_rows(dt, h, rows, T, 2 * F), *pb = tu_buffer_rows(MOEX_DTYPE_F32, probs, rows, T, 1);
    void *dzb = tu_buffer_rows(dt, dz, rows, T, F), *zb = tu_poisoned(dt, T * F);
    void *dhb = tu_poisoned(dt, T * 2 * F), *dpb = tu_buffer_rows(MOEX_DTYPE_F32, dp0, rows, T, 1);
    const double *pref = c->with_probs ? probs : NULL;

    /* ---- forward ---- */
    moex_scaled_glu_args fa;
    memset(&fa, 0, sizeof fa);
    fa.glu = c->glu;
    fa.h = moex_tensor_2d(hb, dt, T, 2 * F);
    if (c->with_probs) fa.probs = moex_tensor_1d(pb, MOEX_DTYPE_F32, T);
    fa.splits = splits_t;
    fa.z = moex_tensor_2d(zb, dt, T, F);
    size_t bytes = 0;
    CHECK_STATUS(ctx, moex_scaled_glu_forward_workspace_size(ctx, &fa, &bytes), MOEX_OK);
    void *ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_scaled_glu_forward(ctx, &fa, ws, bytes, NULL), MOEX_OK);
    free(ws);
    double *z = tu_doubles(T * F), *zbd = tu_doubles(T * F);
    ref_scaled_glu_forward(&c->glu, rows, F, h, NULL, pref, z, zbd);
    /* k = 8: the f32 evaluation of exp and the products, a few roundings each */
    ref_tol_model m = ref_tol_for(dt, dt, 0, 8);
    snprintf(what, sizeof what, "forward z [%s]", label);
    note(CHECK_CLOSE(what, dt, zb, z, zbd, rows * F, F, &m));
    CHECK_POISONED("forward: z tail rows", dt, zb, rows * F, T * F);

    /* ---- backward ---- */
    moex_scaled_glu_grad_args ba;
    memset(&ba, 0, sizeof ba);
    ba.glu = c->glu;
    ba.h = fa.h;
    ba.probs = fa.probs;
    ba.splits = splits_t;
    ba.dz = moex_tensor_2d(dzb, dt, T, F);
    ba.dh = moex_tensor_2d(dhb, dt, T, 2 * F);
    if (c->with_dprobs) ba.dprobs = moex_tensor_1d(dpb, MOEX_DTYPE_F32, T);
    CHECK_STATUS(ctx, moex_scaled_glu_backward_workspace_size(ctx, &ba, &bytes), MOEX_OK);
    ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_scaled_glu_backward(ctx, &ba, ws, bytes, NULL), MOEX_OK);
    free(ws);
    double *dh = tu_doubles(T * 2 * F), *dhbd = tu_doubles(T * 2 * F), *dp = tu_doubles(T), *dpbd = tu_doubles(T);
    ref_scaled_glu_backward(&c->glu, rows, F, h, NULL, pref, dz, NULL, dh, dhbd, dp, dpbd);
    m = ref_tol_for(dt, dt, 0, 8);
    snprintf(what, sizeof what, "backward dh [%s]", label);
    note(CHECK_CLOSE(what, dt, dhb, dh, dhbd, rows * 2 * F, 2 * F, &m));
    CHECK_POISONED("backward: dh tail rows", dt, dhb, rows * 2 * F, T * 2 * F);
    if (c->with_dprobs) {
        for (int64_t i = 0; i < rows; i++) {
            dp[i] += dp0[i];
            dpbd[i] += fabs(dp0[i]);
        }
        m = ref_tol_for(MOEX_DTYPE_F32, dt, 0, F + 8);
        snprintf(what, sizeof what, "backward dprobs (+=) [%s]", label);
        note(CHECK_CLOSE(what, MOEX_DTYPE_F32, dpb, dp, dpbd, rows, 1, &m));
    } else {
        double *back = tu_read(MOEX_DTYPE_F32, dpb, rows);
        CHECK_MSG(memcmp(back, dp0, (size_t)rows * sizeof(double)) == 0, "absent dprobs untouched [%s]", label);
        free(back);
    }
    CHECK_POISONED("backward: dprobs tail rows", MOEX_DTYPE_F32, dpb, rows, T);
    if (tu_failures() != failures_before) printf("  (failures above: case %s)\n", label);

    free(splits); free(h); free(probs); free(dz); free(dp0);
    free(hb); free(pb); free(dzb); free(zb); free(dhb); free(dpb);
    free(z); free(zbd); free(dh); free(dhbd); free(dp); free(dpbd);
}

int main(void) {
    moex_context *ctx = tu_cpu_context();
    tu_rng r = tu_rng_seed(4242);
    static const moex_dtype dts[3] = {MOEX_DTYPE_F32, MOEX_DTYPE_BF16, MOEX_DTYPE_F16};
    int n = 0;
    for (int d = 0; d < 3; d++) {
        for (int kind = 0; kind < 2; kind++) {
            for (int layout = 0; layout < 2; layout++) {
                for (int v = 0; v < 6; v++) {
                    glu_cfg c;
                    memset(&c, 0, sizeof c);
                    c.dt = dts[d];
                    c.glu = moex_glu_params_default((moex_glu_kind)kind);
                    c.glu.layout = (moex_glu_layout)layout;
                    if (kind == 1 && v == 5) { /* non-default clamp constants */
                        c.glu.limit = 3.5f;
                        c.glu.alpha = 0.9f;
                        c.glu.offset = -0.25f;
                    }
                    c.F = layout ? 96 : 45;
                    c.T = 29;
                    static const int64_t Gs[6] = {0, 1, 5, 5, 128, 5};
                    static const tu_splits_kind kinds[6] = {TU_SPLITS_BALANCED, TU_SPLITS_BALANCED,
                                                            TU_SPLITS_EMPTY_FIRST, TU_SPLITS_EMPTY_LAST,
                                                            TU_SPLITS_SKEWED, TU_SPLITS_EMPTY_MIDDLE};
                    c.G = Gs[v];
                    c.kind = kinds[v];
                    if (c.G == 128) c.T = 150;
                    c.rows = c.G ? c.T - 6 : c.T;
                    c.with_probs = v != 3;
                    c.with_dprobs = c.with_probs && v != 2;
                    run_case(ctx, &r, &c), n++;
                }
            }
        }
        /* splits given but every group empty: nothing written */
        glu_cfg c;
        memset(&c, 0, sizeof c);
        c.dt = dts[d];
        c.glu = moex_glu_params_default(MOEX_GLU_SWIGLU);
        c.T = 9, c.F = 13, c.G = 3, c.rows = 0, c.kind = TU_SPLITS_BALANCED, c.with_probs = 1, c.with_dprobs = 1;
        run_case(ctx, &r, &c), n++;
    }
    printf("%d cases, worst err/tol %.3g\n", n, worst_seen);
    moex_context_destroy(ctx);
    return tu_finish();
}
