/*
 * test_scaled_glu.c - moex_scaled_glu_forward / backward on the CPU backend against the
 * fp64 reference, under the tolerance model of tools/ref/ref.h.
 *
 * Coverage: f32, bf16, f16; SwiGLU and clamped SwiGLU (default GPT-OSS constants and a
 * custom set), inputs spanning past the clamp limits but never exactly on a kink;
 * contiguous and interleaved-32 layouts; F not a power of two, a multiple of 8 or not (on
 * the GPU, its 16-byte and scalar kernels; tests/cuda/test_gpu_scaled_glu.c runs this file
 * there), up to 132 chunks of 8 columns a row; probs present and absent;
 * splits present (sum < T: input tail rows NaN, output tail rows poisoned and checked
 * untouched; G = 1, 5 with empty groups, 128) and absent (all T rows); dprobs present
 * (accumulating, +=) and absent.
 */
#include "test_util.h"
#include "ref_quant.h"

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

/* ---- the quantized z (docs/ops.md 9.9) ------------------------------------------------- */

/* One quantize of z's outputs: buffers poisoned, tensors of the recipe's shapes (Gq groups). */
typedef struct zq_out {
    void *rd, *rs, *cd, *cs, *am;
    int64_t n_rs, n_cs, n_am;
} zq_out;

static zq_out zq_make(const moex_quant_params *p, int row, int col, int amax, int64_t Gq, int64_t T, int64_t F,
                      moex_quant_tensor *rowwise, moex_quant_tensor *columnwise, moex_tensor *am) {
    zq_out o;
    memset(&o, 0, sizeof o);
    int64_t rsh[2], csh[2];
    const int rn = ref_quant_scales_shape(p->recipe, 0, Gq, T, F, rsh), cn = ref_quant_scales_shape(p->recipe, 1, Gq, T, F, csh);
    const moex_dtype sdt = p->recipe == MOEX_QUANT_MXFP8 ? MOEX_DTYPE_E8M0 : MOEX_DTYPE_F32;
    o.n_rs = rsh[0] * (rn == 2 ? rsh[1] : 1), o.n_cs = csh[0] * (cn == 2 ? csh[1] : 1);
    memset(rowwise, 0, sizeof *rowwise), memset(columnwise, 0, sizeof *columnwise), memset(am, 0, sizeof *am);
    if (row) {
        o.rd = tu_poisoned(p->fp8, T * F), o.rs = tu_poisoned(sdt, o.n_rs);
        rowwise->data = moex_tensor_2d(o.rd, p->fp8, T, F);
        rowwise->scales = rn == 2 ? moex_tensor_2d(o.rs, sdt, rsh[0], rsh[1]) : moex_tensor_1d(o.rs, sdt, rsh[0]);
    }
    if (col) {
        o.cd = tu_poisoned(p->fp8, T * F), o.cs = tu_poisoned(sdt, o.n_cs);
        columnwise->data = moex_tensor_2d(o.cd, p->fp8, F, T);
        columnwise->scales = cn == 2 ? moex_tensor_2d(o.cs, sdt, csh[0], csh[1]) : moex_tensor_1d(o.cs, sdt, csh[0]);
    }
    if (amax && p->recipe <= MOEX_QUANT_GROUP) {
        o.n_am = p->recipe == MOEX_QUANT_GROUP ? Gq : 1;
        o.am = tu_poisoned(MOEX_DTYPE_F32, o.n_am);
        *am = moex_tensor_1d(o.am, MOEX_DTYPE_F32, o.n_am);
    }
    return o;
}

static void zq_free(zq_out *o) { free(o->rd), free(o->rs), free(o->cd), free(o->cs), free(o->am); }

static int zq_same(const void *a, const void *b, size_t n) { return (a == NULL && b == NULL) || memcmp(a, b, n) == 0; }

/* The GLU with zq outputs (z present or absent) against the plain GLU's z quantized by
 * moex_group_quantize (same splits; without, one split of all T rows): every byte of every
 * poisoned output, z itself unchanged. */
static void zq_case(moex_context *ctx, tu_rng *r, moex_dtype dt, moex_glu_params glu, int64_t T, int64_t F,
                    int64_t G, const moex_quant_params *p, int row, int col, int with_z, int with_probs) {
    char label[256];
    snprintf(label, sizeof label, "zq %s %s %s T=%lld F=%lld G=%lld recipe=%d %s%s%s%s", dt_name(dt),
             glu.kind == MOEX_GLU_CLAMPED_SWIGLU ? "clamped" : "swiglu",
             glu.layout == MOEX_GLU_INTERLEAVED_32 ? "interleaved" : "contiguous", (long long)T, (long long)F,
             (long long)G, (int)p->recipe, moex_dtype_name(p->fp8), row ? " row" : "", col ? " col" : "",
             with_z ? " +z" : "");
    tu_log("case %s\n", label);
    const int failures_before = tu_failures();
    const int64_t rows = G ? T - 3 : T, Gq = G ? G : 1;
    int64_t *splits = (int64_t *)tu_alloc((size_t)Gq * sizeof(int64_t));
    if (G) tu_make_splits(r, G > 2 ? TU_SPLITS_EMPTY_MIDDLE : TU_SPLITS_BALANCED, G, rows, splits);
    else splits[0] = T;
    double *h = tu_doubles(T * 2 * F), *probs = tu_doubles(T);
    for (int64_t i = 0; i < T * 2 * F; i++) h[i] = glu_input(r, 6.0, dt, glu.limit, glu.kind == MOEX_GLU_CLAMPED_SWIGLU);
    tu_fill_uniform(r, probs, T, 0.05, 1, MOEX_DTYPE_F32);
    void *hb = tu_buffer(dt, h, T * 2 * F), *pb = tu_buffer(MOEX_DTYPE_F32, probs, T);

    /* the plain GLU, then its z quantized */
    moex_scaled_glu_args a;
    memset(&a, 0, sizeof a);
    a.glu = glu, a.h = moex_tensor_2d(hb, dt, T, 2 * F);
    if (with_probs) a.probs = moex_tensor_1d(pb, MOEX_DTYPE_F32, T);
    if (G) a.splits = moex_tensor_1d(splits, MOEX_DTYPE_I64, G);
    void *z0 = tu_poisoned(dt, T * F), *z1 = tu_poisoned(dt, T * F);
    a.z = moex_tensor_2d(z0, dt, T, F);
    size_t bytes = 0;
    CHECK_STATUS(ctx, moex_scaled_glu_forward_workspace_size(ctx, &a, &bytes), MOEX_OK);
    void *ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_scaled_glu_forward(ctx, &a, ws, bytes, NULL), MOEX_OK);
    free(ws);
    moex_group_quantize_args q;
    memset(&q, 0, sizeof q);
    q.x = moex_tensor_2d(z0, dt, T, F), q.splits = moex_tensor_1d(splits, MOEX_DTYPE_I64, Gq), q.params = *p;
    zq_out want = zq_make(p, row, col, 1, Gq, T, F, &q.rowwise, &q.columnwise, &q.amax);
    CHECK_STATUS(ctx, moex_group_quantize_workspace_size(ctx, &q, &bytes), MOEX_OK);
    ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_group_quantize(ctx, &q, ws, bytes, NULL), MOEX_OK);
    free(ws);

    /* the GLU with the zq outputs */
    if (with_z) a.z = moex_tensor_2d(z1, dt, T, F);
    else memset(&a.z, 0, sizeof a.z);
    a.zq_params = *p;
    zq_out got = zq_make(p, row, col, 1, Gq, T, F, &a.zq_rowwise, &a.zq_columnwise, &a.zq_amax);
    moex_status st = moex_scaled_glu_forward_workspace_size(ctx, &a, &bytes);
    CHECK_STATUS(ctx, st, MOEX_OK);
    ws = tu_workspace(bytes);
    if (st == MOEX_OK) CHECK_STATUS(ctx, moex_scaled_glu_forward(ctx, &a, ws, bytes, NULL), MOEX_OK);
    free(ws);
    const size_t sz = p->recipe == MOEX_QUANT_MXFP8 ? 1 : 4;
    CHECK_MSG(zq_same(got.rd, want.rd, (size_t)(T * F)), "%s: zq_rowwise.data differs from quantize(z)", label);
    CHECK_MSG(zq_same(got.rs, want.rs, (size_t)want.n_rs * sz), "%s: zq_rowwise.scales differ", label);
    CHECK_MSG(zq_same(got.cd, want.cd, (size_t)(T * F)), "%s: zq_columnwise.data differs from quantize(z)", label);
    CHECK_MSG(zq_same(got.cs, want.cs, (size_t)want.n_cs * sz), "%s: zq_columnwise.scales differ", label);
    CHECK_MSG(zq_same(got.am, want.am, (size_t)want.n_am * 4), "%s: zq_amax differs", label);
    if (with_z) CHECK_MSG(zq_same(z1, z0, (size_t)(T * F) * moex_dtype_size(dt)), "%s: z differs from the plain GLU's", label);
    if (tu_failures() != failures_before) printf("  (failures above: case %s)\n", label);
    zq_free(&want), zq_free(&got);
    free(splits), free(h), free(probs), free(hb), free(pb), free(z0), free(z1);
}

static int zq_cases(moex_context *ctx, tu_rng *r) {
    static const moex_dtype dts[3] = {MOEX_DTYPE_F32, MOEX_DTYPE_BF16, MOEX_DTYPE_F16};
    static const struct { int64_t T, F, G; } shapes[] = {
        {.T = 29, .F = 45, .G = 0},
        {.T = 150, .F = 96, .G = 5},
        {.T = 40, .F = 256, .G = 1},
        {.T = 300, .F = 130, .G = 7},
        {.T = 9, .F = 13, .G = 3},
    };
    int n = 0;
    for (int s = 0; s < 5; s++)
        for (int rc = 0; rc < 4; rc++)
            for (int v = 0; v < 3; v++) {
                const int d = (s + rc + v) % 3;
                moex_glu_params glu = moex_glu_params_default((moex_glu_kind)((s + v) % 2));
                glu.layout = shapes[s].F % 32 == 0 && v == 1 ? MOEX_GLU_INTERLEAVED_32 : MOEX_GLU_CONTIGUOUS;
                const moex_quant_params p = {.recipe = (moex_quant_recipe)rc,
                                             .fp8 = v == 2 ? MOEX_DTYPE_E5M2 : MOEX_DTYPE_E4M3,
                                             .amax_epsilon = rc == 3 ? 0.0f : 1e-4f,
                                             .rounding = v == 1 ? MOEX_SCALE_POW2 : MOEX_SCALE_EXACT,
                                             .scale_layout = MOEX_SCALES_PLAIN};
                zq_case(ctx, r, dts[d], glu, shapes[s].T, shapes[s].F, shapes[s].G, &p, v != 1, v != 0, v == 2, s != 1);
                n++;
            }
    return n;
}

/* Refused with nothing written: no z and no zq copy; zq shapes, dtypes, recipes the quantize refuses. */
static void zq_bad(moex_context *ctx, tu_rng *r) {
    const int64_t T = 10, F = 20;
    double h[T * 2 * F];
    tu_fill_uniform(r, h, T * 2 * F, -2, 2, MOEX_DTYPE_F32);
    void *hb = tu_buffer(MOEX_DTYPE_F32, h, T * 2 * F);
    moex_quant_params p = {.recipe = MOEX_QUANT_BLOCK, .fp8 = MOEX_DTYPE_E4M3, .amax_epsilon = 0.0f,
                           .rounding = MOEX_SCALE_EXACT, .scale_layout = MOEX_SCALES_PLAIN};
    for (int m = 0; m < 6; m++) {
        moex_scaled_glu_args a;
        memset(&a, 0, sizeof a);
        a.glu = moex_glu_params_default(MOEX_GLU_SWIGLU), a.h = moex_tensor_2d(hb, MOEX_DTYPE_F32, T, 2 * F);
        a.zq_params = p;
        zq_out o = zq_make(&p, 1, 1, 0, 1, T, F, &a.zq_rowwise, &a.zq_columnwise, &a.zq_amax);
        const char *name = "zq_rowwise.scales", *desc = "";
        switch (m) {
        case 0: memset(&a.zq_rowwise, 0, sizeof a.zq_rowwise), memset(&a.zq_columnwise, 0, sizeof a.zq_columnwise);
                name = "z", desc = "neither z nor a zq copy"; break;
        case 1: a.zq_rowwise.scales.shape[1] += 1, desc = "zq_rowwise.scales one column more"; break;
        case 2: a.zq_columnwise.data.shape[0] += 1, name = "zq_columnwise.data", desc = "zq_columnwise.data [F+1, T]"; break;
        case 3: a.zq_params.fp8 = MOEX_DTYPE_BF16, name = "fp8", desc = "zq_params.fp8 bf16"; break;
        case 4: a.zq_amax = moex_tensor_1d(o.rs, MOEX_DTYPE_F32, 1), name = "zq_amax", desc = "zq_amax with BLOCK"; break;
        default: a.zq_params.scale_layout = MOEX_SCALES_MX_SWIZZLED, name = "scale_layout", desc = "swizzled BLOCK"; break;
        }
        size_t bytes = 0;
        moex_status st = moex_scaled_glu_forward_workspace_size(ctx, &a, &bytes);
        CHECK_MSG(st == MOEX_ERR_INVALID_ARG, "zq %s: workspace query: got %s", desc, moex_status_string(st));
        void *ws = tu_alloc(1 << 16);
        st = moex_scaled_glu_forward(ctx, &a, ws, 1 << 16, NULL);
        free(ws);
        if (!CHECK_REFUSED(ctx, st, "moex_scaled_glu_forward", name)) printf("  (case: zq %s)\n", desc);
        const int untouched = (!o.rd || tu_first_unpoisoned(o.rd, T * F) < 0) && (!o.cd || tu_first_unpoisoned(o.cd, T * F) < 0) &&
                              (!o.rs || tu_first_unpoisoned(o.rs, (size_t)o.n_rs * 4) < 0) &&
                              (!o.cs || tu_first_unpoisoned(o.cs, (size_t)o.n_cs * 4) < 0);
        CHECK_MSG(untouched, "zq %s: refused, but an output was written", desc);
        zq_free(&o);
    }
    free(hb);
}

/* z given and no zq data: a zq field that only goes with the zq outputs (zq_amax, a copy's
 * scales, zq_params other than all zero) is refused naming it, as moex_group_quantize refuses
 * scales without data, and z is not written. All of them zero is the plain GLU. */
static void zq_companions_without_data(moex_context *ctx, tu_rng *r) {
    const int64_t T = 10, F = 20;
    double h[T * 2 * F];
    tu_fill_uniform(r, h, T * 2 * F, -2, 2, MOEX_DTYPE_F32);
    void *hb = tu_buffer(MOEX_DTYPE_F32, h, T * 2 * F);
    const moex_quant_params block = {.recipe = MOEX_QUANT_BLOCK, .fp8 = MOEX_DTYPE_E4M3, .amax_epsilon = 0.0f,
                                     .rounding = MOEX_SCALE_EXACT, .scale_layout = MOEX_SCALES_PLAIN};
    const moex_quant_params tensor = {.recipe = MOEX_QUANT_TENSOR, .fp8 = MOEX_DTYPE_E4M3, .amax_epsilon = 0.0f,
                                      .rounding = MOEX_SCALE_EXACT, .scale_layout = MOEX_SCALES_PLAIN};
    for (int m = 0; m < 6; m++) {
        moex_scaled_glu_args a;
        memset(&a, 0, sizeof a);
        a.glu = moex_glu_params_default(MOEX_GLU_SWIGLU), a.h = moex_tensor_2d(hb, MOEX_DTYPE_F32, T, 2 * F);
        void *z = tu_poisoned(MOEX_DTYPE_F32, T * F);
        a.z = moex_tensor_2d(z, MOEX_DTYPE_F32, T, F);
        moex_quant_tensor row, col;
        moex_tensor amax;
        zq_out o = zq_make(m == 0 ? &tensor : &block, 1, 1, 1, 1, T, F, &row, &col, &amax);
        const char *name = "";
        switch (m) {
        case 0: a.zq_amax = amax, name = "zq_amax"; break;
        case 1: a.zq_rowwise.scales = row.scales, name = "zq_rowwise.scales"; break;
        case 2: a.zq_columnwise.scales = col.scales, name = "zq_columnwise.scales"; break;
        case 3: a.zq_params = block, name = "zq_params"; break;
        case 4: a.zq_params = block, a.zq_params.fp8 = MOEX_DTYPE_BF16, name = "zq_params"; break;
        default: a.zq_params.amax_epsilon = 1.0f, name = "zq_params"; break;
        }
        size_t bytes = 0;
        moex_status st = moex_scaled_glu_forward_workspace_size(ctx, &a, &bytes);
        if (!CHECK_REFUSED(ctx, st, "moex_scaled_glu_forward_workspace_size", name))
            printf("  (case: %s without zq data, workspace query)\n", name);
        void *ws = tu_alloc(1 << 16);
        st = moex_scaled_glu_forward(ctx, &a, ws, 1 << 16, NULL);
        free(ws);
        if (!CHECK_REFUSED(ctx, st, "moex_scaled_glu_forward", name)) printf("  (case: %s without zq data)\n", name);
        const int untouched = tu_first_unpoisoned(z, (size_t)(T * F) * 4) < 0 &&
                              (!o.rs || tu_first_unpoisoned(o.rs, (size_t)o.n_rs * 4) < 0) &&
                              (!o.cs || tu_first_unpoisoned(o.cs, (size_t)o.n_cs * 4) < 0) &&
                              (!o.am || tu_first_unpoisoned(o.am, (size_t)o.n_am * 4) < 0);
        CHECK_MSG(untouched, "%s without zq data: refused, but an output was written", name);
        zq_free(&o), free(z);
    }
    free(hb);
}

/* The clamped GLU's gradient at exactly the clamp's bounds is 0, as torch.clamp gives it
 * (GPT-OSS's PyTorch definition): a = limit gives da = 0, |b| = limit gives db = 0. In bf16,
 * 7.0 is exact, so h lands on the bound often. Both halves of each column below: a in
 * {limit, limit, 6.5, 8}, b in {limit, -limit, limit, 0}; p = 1, dz = 1 (f32). */
static void test_clamp_bounds(moex_context *ctx) {
    const float L = 7.0f;
    float h[8] = {L, L, 6.5f, 8.0f, L, -L, L, 0.0f}, dz[4] = {1, 1, 1, 1}, dh[8];
    tu_poison(dh, sizeof dh);
    moex_scaled_glu_grad_args ba;
    memset(&ba, 0, sizeof ba);
    ba.glu = moex_glu_params_default(MOEX_GLU_CLAMPED_SWIGLU);
    ba.h = moex_tensor_2d(h, MOEX_DTYPE_F32, 1, 8);
    ba.dz = moex_tensor_2d(dz, MOEX_DTYPE_F32, 1, 4);
    ba.dh = moex_tensor_2d(dh, MOEX_DTYPE_F32, 1, 8);
    size_t bytes = 0;
    CHECK_STATUS(ctx, moex_scaled_glu_backward_workspace_size(ctx, &ba, &bytes), MOEX_OK);
    void *ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_scaled_glu_backward(ctx, &ba, ws, bytes, NULL), MOEX_OK);
    free(ws);
    const double s = 1.0 / (1.0 + exp(-1.702 * 6.5)), act7 = 7.0 / (1.0 + exp(-1.702 * 7.0));
    const double da2 = (L + 1.0) * s * (1.0 + 1.702 * 6.5 * (1.0 - s));   /* g(b) = clamp(7) + 1 */
    CHECK_MSG(dh[0] == 0.0f && dh[1] == 0.0f && fabs(dh[2] - da2) < 1e-5 * da2 && dh[3] == 0.0f,
              "clamped GLU at the bounds: da %g %g %g %g (want 0 0 %g 0)", dh[0], dh[1], dh[2], dh[3], da2);
    CHECK_MSG(dh[4] == 0.0f && dh[5] == 0.0f && dh[6] == 0.0f && fabs(dh[7] - act7) < 1e-5 * act7,
              "clamped GLU at the bounds: db %g %g %g %g (want 0 0 0 %g)", dh[4], dh[5], dh[6], dh[7], act7);
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
                    /* F a multiple of 8 or not (the GPU's 16-byte path or its scalar one), past
                     * 64 chunks of 8 (a lane of the 16-byte path takes several) */
                    c.F = layout ? (v < 3 ? 96 : 1056) : (v % 2 ? 45 : 136);
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
    test_clamp_bounds(ctx);
    n += zq_cases(ctx, &r);
    zq_bad(ctx, &r);
    zq_companions_without_data(ctx, &r);
    printf("%d cases, worst err/tol %.3g\n", n, worst_seen);
    moex_context_destroy(ctx);
    return tu_finish();
}
