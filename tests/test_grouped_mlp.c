/*
 * test_grouped_mlp.c - moex_grouped_mlp_forward / backward on the CPU backend against the
 * fp64 reference, under the tolerance model of tools/ref/ref.h (with bounds propagated
 * through h, z, dz and dh, which the library stores in the activation dtype).
 *
 * Coverage: f32, bf16, f16; G = 1, 3 (H, 2F past the CPU GEMM's blocks), 5 and 128 with
 * every splits kind and all groups empty;
 * sum(splits) < T with NaN input tails (x, dy, probs) and poisoned output tails checked
 * untouched; H and F not powers of two; SwiGLU and clamped SwiGLU (default and custom
 * constants), contiguous and interleaved layouts; b1 absent / activation dtype / f32;
 * b2 NONE / ADD / SCALED; probs present and absent; z saved and recomputed (in dx's memory
 * or the workspace, or dW1's memory: also checked through the workspace sizes); h kept and
 * overwritten by dh (MOEX_H_OVERWRITE); every
 * gradient present and absent; dW written (f32 or activation dtype; empty groups zero)
 * and accumulated (empty groups bitwise unchanged); packed and discrete weights.
 * The backward gets the library's own forward outputs (h, z), as a caller would, and the
 * reference backward uses the same saved tensors (ref_mlp.h_saved / z_saved).
 */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { G_DX = 1, G_DW1 = 2, G_DW2 = 4, G_DB1 = 8, G_DB2 = 16, G_DP = 32, G_ALL = 63 };

typedef struct mlp_cfg {
    moex_dtype dt;
    int64_t G, T, rows, H, F;
    tu_splits_kind kind;
    moex_glu_kind glu_kind;
    moex_glu_layout layout;
    int custom_clamp;
    int b1;                     /* 0 absent, 1 activation dtype, 2 f32 */
    moex_bias_mode b2_mode;
    int b2_f32;
    int probs, save_z;
    unsigned grads;
    moex_grad_mode dw_mode;
    int dw_f32;                 /* WRITE: f32 (1) or activation dtype (0) */
    int discrete;
} mlp_cfg;

static double worst_seen;

static void note(double ratio) {
    if (ratio > worst_seen && isfinite(ratio)) worst_seen = ratio;
}

static const char *dt_name(moex_dtype dt) {
    return dt == MOEX_DTYPE_F32 ? "f32" : dt == MOEX_DTYPE_BF16 ? "bf16" : "f16";
}

static int64_t max3(int64_t a, int64_t b, int64_t c) {
    int64_t m = a > b ? a : b;
    return m > c ? m : c;
}

/* Compares a gradient weight (packed or discrete) with ref (+ init for ACCUMULATE);
 * checks empty groups are zero (WRITE) or unchanged (ACCUMULATE). */
static void check_dw(const char *what, const tu_weight *w, const double *ref, const double *bound,
                     const double *init, int acc, const int64_t *splits, const ref_tol_model *m) {
    const int64_t n = w->G * w->R * w->C, per = w->R * w->C;
    double *got = tu_doubles(n), *want = tu_doubles(n), *wb = tu_doubles(n);
    tu_weight_read(w, got);
    for (int64_t i = 0; i < n; i++) {
        want[i] = ref[i] + (acc ? init[i] : 0.0);
        wb[i] = bound[i] + (acc ? fabs(init[i]) : 0.0);
    }
    float *gf = (float *)tu_alloc((size_t)n * sizeof(float) + 4); /* every dtype is exact in f32 */
    for (int64_t i = 0; i < n; i++) gf[i] = (float)got[i];
    note(tu_check_close(what, MOEX_DTYPE_F32, gf, want, wb, n, w->C, m, __FILE__, __LINE__));
    for (int64_t g = 0; g < w->G; g++) {
        if (splits[g]) continue;
        int ok = 1;
        for (int64_t i = g * per; i < (g + 1) * per; i++) ok &= acc ? got[i] == init[i] : got[i] == 0.0;
        CHECK_MSG(ok, "%s: empty group %lld must be %s", what, (long long)g, acc ? "unchanged" : "zero");
    }
    free(gf);
    free(got);
    free(want);
    free(wb);
}

/* overwrite_h: the backward with MOEX_H_OVERWRITE. */
static void run_case(moex_context *ctx, tu_rng *r, const mlp_cfg *c, int overwrite_h) {
    const moex_dtype dt = c->dt;
    const int64_t G = c->G, T = c->T, H = c->H, F = c->F, rows = c->rows;
    const int acc = c->dw_mode == MOEX_GRAD_ACCUMULATE;
    char label[320], what[400];
    snprintf(label, sizeof label,
             "%s G=%lld T=%lld rows=%lld H=%lld F=%lld %s %s%s %s b1=%d b2=%d%s probs=%d save_z=%d grads=%u dw=%s%s %s%s",
             dt_name(dt), (long long)G, (long long)T, (long long)rows, (long long)H, (long long)F,
             tu_splits_name(c->kind), c->glu_kind ? "clamped" : "swiglu", c->custom_clamp ? "(custom)" : "",
             c->layout ? "interleaved" : "contiguous", c->b1, (int)c->b2_mode, c->b2_f32 ? "(f32)" : "", c->probs,
             c->save_z, c->grads, acc ? "acc" : "write", acc ? "" : (c->dw_f32 ? "(f32)" : "(act)"),
             c->discrete ? "discrete" : "packed", overwrite_h ? " h_overwrite" : "");
    tu_log("case %s\n", label);
    int failures_before = tu_failures();

    moex_glu_params glu = moex_glu_params_default(c->glu_kind);
    glu.layout = c->layout;
    if (c->custom_clamp) glu.limit = 4.5f, glu.alpha = 1.25f, glu.offset = 0.5f;
    const moex_dtype b1dt = c->b1 == 2 ? MOEX_DTYPE_F32 : dt, b2dt = c->b2_f32 ? MOEX_DTYPE_F32 : dt;

    int64_t *splits = (int64_t *)tu_alloc((size_t)G * sizeof(int64_t));
    tu_make_splits(r, c->kind, G, rows, splits);
    /* values: h = x W1^T + b1 spans roughly +-8, past the clamp limit */
    const double ws1 = 2.5 * sqrt(3.0 / (double)H);
    double *x = tu_doubles(T * H), *w1 = tu_doubles(G * 2 * F * H), *b1 = tu_doubles(G * 2 * F);
    double *w2 = tu_doubles(G * H * F), *b2 = tu_doubles(G * H), *probs = tu_doubles(T), *dy = tu_doubles(T * H);
    double *dp0 = tu_doubles(T), *dw1_0 = tu_doubles(G * 2 * F * H), *dw2_0 = tu_doubles(G * H * F);
    tu_fill_uniform(r, x, rows * H, -1, 1, dt);
    tu_fill_uniform(r, w1, G * 2 * F * H, -ws1, ws1, dt);
    tu_fill_uniform(r, b1, G * 2 * F, -1, 1, b1dt);
    tu_fill_uniform(r, w2, G * H * F, -0.3, 0.3, dt);
    tu_fill_uniform(r, b2, G * H, -1, 1, b2dt);
    tu_fill_uniform(r, probs, rows, 0.05, 1, MOEX_DTYPE_F32);
    tu_fill_uniform(r, dy, rows * H, -1, 1, dt);
    tu_fill_uniform(r, dp0, rows, -1, 1, MOEX_DTYPE_F32);
    tu_fill_uniform(r, dw1_0, G * 2 * F * H, -1, 1, MOEX_DTYPE_F32);
    tu_fill_uniform(r, dw2_0, G * H * F, -1, 1, MOEX_DTYPE_F32);

    void *xb = tu_buffer_rows(dt, x, rows, T, H), *dyb = tu_buffer_rows(dt, dy, rows, T, H);
    void *pb = tu_buffer_rows(MOEX_DTYPE_F32, probs, rows, T, 1);
    void *b1b = tu_buffer(b1dt, b1, G * 2 * F), *b2b = tu_buffer(b2dt, b2, G * H);
    tu_weight w1t = tu_weight_make(dt, G, 2 * F, H, w1, c->discrete);
    tu_weight w2t = tu_weight_make(dt, G, H, F, w2, c->discrete);
    void *hb = tu_poisoned(dt, T * 2 * F), *zb = tu_poisoned(dt, T * F), *yb = tu_poisoned(dt, T * H);
    moex_tensor splits_t = moex_tensor_1d(splits, MOEX_DTYPE_I64, G);

    ref_mlp p = {.G = G, .T = T, .H = H, .F = F, .splits = splits, .x = x, .w1 = w1,
                 .b1 = c->b1 ? b1 : NULL, .w2 = w2, .b2 = b2, .probs = c->probs ? probs : NULL,
                 .b2_mode = c->b2_mode, .glu = glu};

    /* ---- forward ---- */
    moex_grouped_mlp_args fa;
    memset(&fa, 0, sizeof fa);
    fa.x = moex_tensor_2d(xb, dt, T, H);
    fa.w1 = w1t.w;
    if (c->b1) fa.b1 = moex_tensor_2d(b1b, b1dt, G, 2 * F);
    fa.w2 = w2t.w;
    fa.b2_mode = c->b2_mode;
    if (c->b2_mode != MOEX_BIAS_NONE) fa.b2 = moex_tensor_2d(b2b, b2dt, G, H);
    if (c->probs) fa.probs = moex_tensor_1d(pb, MOEX_DTYPE_F32, T);
    fa.glu = glu;
    fa.splits = splits_t;
    fa.h = moex_tensor_2d(hb, dt, T, 2 * F);
    if (c->save_z) fa.z = moex_tensor_2d(zb, dt, T, F);
    fa.y = moex_tensor_2d(yb, dt, T, H);
    size_t bytes = 0;
    CHECK_STATUS(ctx, moex_grouped_mlp_forward_workspace_size(ctx, &fa, &bytes), MOEX_OK);
    void *ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_grouped_mlp_forward(ctx, &fa, ws, bytes, NULL), MOEX_OK);
    free(ws);
    double *h = tu_doubles(T * 2 * F), *hbd = tu_doubles(T * 2 * F), *z = tu_doubles(T * F), *zbd = tu_doubles(T * F);
    double *y = tu_doubles(T * H), *ybd = tu_doubles(T * H);
    ref_grouped_mlp_forward(&p, h, hbd, z, zbd, y, ybd);
    ref_tol_model m = ref_tol_for(dt, dt, 0, H);
    snprintf(what, sizeof what, "forward h [%s]", label);
    note(CHECK_CLOSE(what, dt, hb, h, hbd, rows * 2 * F, 2 * F, &m));
    CHECK_POISONED("forward: h tail rows", dt, hb, rows * 2 * F, T * 2 * F);
    m = ref_tol_for(dt, dt, 1, H + 8);
    if (c->save_z) {
        snprintf(what, sizeof what, "forward z [%s]", label);
        note(CHECK_CLOSE(what, dt, zb, z, zbd, rows * F, F, &m));
        CHECK_POISONED("forward: z tail rows", dt, zb, rows * F, T * F);
    } else {
        CHECK_POISONED("forward: absent z untouched", dt, zb, 0, T * F);
    }
    m = ref_tol_for(dt, dt, 1, max3(H, F, 8));
    snprintf(what, sizeof what, "forward y [%s]", label);
    note(CHECK_CLOSE(what, dt, yb, y, ybd, rows * H, H, &m));
    CHECK_POISONED("forward: y tail rows", dt, yb, rows * H, T * H);

    /* ---- backward ---- */
    /* The reference backward uses the saved h and z as the library's does. A saved h that
     * sits exactly on a clamp kink (a == limit, b == +-limit: the slope there is a matter of
     * convention) is moved just past it, in the buffer and for the reference alike. */
    double *hs = tu_read(dt, hb, rows * 2 * F), *zs = tu_read(dt, zb, rows * F);
    if (c->glu_kind == MOEX_GLU_CLAMPED_SWIGLU) {
        const double L = glu.limit, past = ref_round(dt, L * (1 + 8 * ref_unit_roundoff(dt)));
        for (int64_t i = 0; i < rows; i++) {
            for (int64_t j = 0; j < F; j++) {
                int64_t ja, jb;
                ref_glu_columns(glu.layout, F, j, &ja, &jb);
                int64_t ia = i * 2 * F + ja, ib = i * 2 * F + jb;
                if (hs[ia] == L) hs[ia] = past, ref_store(dt, hb, ia, past);
                if (fabs(hs[ib]) == L) hs[ib] = copysign(past, hs[ib]), ref_store(dt, hb, ib, hs[ib]);
            }
        }
    }
    p.h_saved = hs;
    p.z_saved = c->save_z ? zs : NULL;
    const unsigned gr = c->grads;
    const int want_db2 = (gr & G_DB2) && c->b2_mode != MOEX_BIAS_NONE, want_dp = (gr & G_DP) && c->probs;
    const moex_dtype dwdt = acc || c->dw_f32 ? MOEX_DTYPE_F32 : dt;
    /* the bias gradients in their bias's dtype, as PyTorch gives them (db1 in dt with b1 absent) */
    const moex_dtype db1dt = c->b1 == 2 ? MOEX_DTYPE_F32 : dt, db2dt = c->b2_f32 ? MOEX_DTYPE_F32 : dt;
    void *dxb = tu_poisoned(dt, T * H), *db1b = tu_poisoned(db1dt, G * 2 * F);
    void *db2b = tu_poisoned(db2dt, G * H), *dpb = tu_buffer_rows(MOEX_DTYPE_F32, dp0, rows, T, 1);
    tu_weight dw1t = tu_weight_make(dwdt, G, 2 * F, H, acc ? dw1_0 : NULL, c->discrete);
    tu_weight dw2t = tu_weight_make(dwdt, G, H, F, acc ? dw2_0 : NULL, c->discrete);
    moex_grouped_mlp_grad_args ba;
    memset(&ba, 0, sizeof ba);
    ba.x = fa.x;
    ba.w1 = w1t.w;
    ba.w2 = w2t.w;
    ba.b2_mode = c->b2_mode;
    if (c->b2_mode == MOEX_BIAS_SCALED) ba.b2 = fa.b2;
    ba.probs = fa.probs;
    ba.glu = glu;
    ba.splits = splits_t;
    ba.h = fa.h;
    ba.z = fa.z;
    ba.dy = moex_tensor_2d(dyb, dt, T, H);
    if (gr & G_DX) ba.dx = moex_tensor_2d(dxb, dt, T, H);
    ba.dw_mode = c->dw_mode;
    if (gr & G_DW1) ba.dw1 = dw1t.w;
    if (gr & G_DW2) ba.dw2 = dw2t.w;
    if (gr & G_DB1) ba.db1 = moex_tensor_2d(db1b, db1dt, G, 2 * F);
    if (want_db2) ba.db2 = moex_tensor_2d(db2b, db2dt, G, H);
    if (want_dp) ba.dprobs = moex_tensor_1d(dpb, MOEX_DTYPE_F32, T);
    ba.h_mode = overwrite_h ? MOEX_H_OVERWRITE : MOEX_H_KEEP;
    CHECK_STATUS(ctx, moex_grouped_mlp_backward_workspace_size(ctx, &ba, &bytes), MOEX_OK);
    ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_grouped_mlp_backward(ctx, &ba, ws, bytes, NULL), MOEX_OK);
    free(ws);

    ref_mlp_grads g = {0};
    g.dx = tu_doubles(T * H), g.dxb = tu_doubles(T * H);
    g.dw1 = tu_doubles(G * 2 * F * H), g.dw1b = tu_doubles(G * 2 * F * H);
    g.dw2 = tu_doubles(G * H * F), g.dw2b = tu_doubles(G * H * F);
    g.db1 = tu_doubles(G * 2 * F), g.db1b = tu_doubles(G * 2 * F);
    g.db2 = tu_doubles(G * H), g.db2b = tu_doubles(G * H);
    g.dprobs = tu_doubles(T), g.dprobsb = tu_doubles(T);
    ref_grouped_mlp_backward(&p, dy, &g);
    const int64_t kb = max3(rows, H, 2 * F) + 8;
    if (gr & G_DX) {
        m = ref_tol_for(dt, dt, 1, kb);
        snprintf(what, sizeof what, "backward dx [%s]", label);
        note(CHECK_CLOSE(what, dt, dxb, g.dx, g.dxb, rows * H, H, &m));
        CHECK_POISONED("backward: dx tail rows", dt, dxb, rows * H, T * H);
    } else {
        CHECK_POISONED("backward: absent dx untouched", dt, dxb, 0, T * H);
    }
    m = ref_tol_for(dwdt, dt, 1, kb);
    if (gr & G_DW1) {
        snprintf(what, sizeof what, "backward dW1 [%s]", label);
        check_dw(what, &dw1t, g.dw1, g.dw1b, dw1_0, acc, splits, &m);
    }
    if (gr & G_DW2) {
        snprintf(what, sizeof what, "backward dW2 [%s]", label);
        check_dw(what, &dw2t, g.dw2, g.dw2b, dw2_0, acc, splits, &m);
    }
    if (!(gr & G_DW1) || !(gr & G_DW2)) { /* absent: untouched */
        double *v = tu_doubles(G * 2 * F * H);
        int ok = 1;
        if (!(gr & G_DW1)) {
            tu_weight_read(&dw1t, v);
            for (int64_t i = 0; i < G * 2 * F * H; i++) ok &= acc ? v[i] == dw1_0[i] : isnan(v[i]);
        }
        if (!(gr & G_DW2)) {
            tu_weight_read(&dw2t, v);
            for (int64_t i = 0; i < G * H * F; i++) ok &= acc ? v[i] == dw2_0[i] : isnan(v[i]);
        }
        CHECK_MSG(ok, "backward: absent dW1/dW2 untouched [%s]", label);
        free(v);
    }
    if (gr & G_DB1) {
        m = ref_tol_for(db1dt, dt, 1, kb);
        snprintf(what, sizeof what, "backward db1 [%s]", label);
        note(CHECK_CLOSE(what, db1dt, db1b, g.db1, g.db1b, G * 2 * F, 2 * F, &m));
    } else {
        CHECK_POISONED("backward: absent db1 untouched", db1dt, db1b, 0, G * 2 * F);
    }
    m = ref_tol_for(MOEX_DTYPE_F32, dt, 1, kb);
    if (want_db2) { /* db2 = sum p dy reads only exact inputs: nothing rounded on the way */
        ref_tol_model m2 = ref_tol_for(db2dt, dt, 0, rows + 1);
        snprintf(what, sizeof what, "backward db2 [%s]", label);
        note(CHECK_CLOSE(what, db2dt, db2b, g.db2, g.db2b, G * H, H, &m2));
    } else {
        CHECK_POISONED("backward: absent db2 untouched", db2dt, db2b, 0, G * H);
    }
    if (want_dp) {
        for (int64_t i = 0; i < rows; i++) {
            g.dprobs[i] += dp0[i];
            g.dprobsb[i] += fabs(dp0[i]);
        }
        snprintf(what, sizeof what, "backward dprobs (+=) [%s]", label);
        note(CHECK_CLOSE(what, MOEX_DTYPE_F32, dpb, g.dprobs, g.dprobsb, rows, 1, &m));
    } else {
        double *back = tu_read(MOEX_DTYPE_F32, dpb, rows);
        CHECK_MSG(memcmp(back, dp0, (size_t)rows * sizeof(double)) == 0, "backward: absent dprobs untouched [%s]",
                  label);
        free(back);
    }
    CHECK_POISONED("backward: dprobs tail rows", MOEX_DTYPE_F32, dpb, rows, T);
    if (tu_failures() != failures_before) printf("  (failures above: case %s)\n", label);

    free(hs); free(zs);
    free(splits); free(x); free(w1); free(b1); free(w2); free(b2); free(probs); free(dy); free(dp0);
    free(dw1_0); free(dw2_0); free(xb); free(dyb); free(pb); free(b1b); free(b2b); free(hb); free(zb); free(yb);
    free(h); free(hbd); free(z); free(zbd); free(y); free(ybd); free(dxb); free(db1b); free(db2b); free(dpb);
    free(g.dx); free(g.dxb); free(g.dw1); free(g.dw1b); free(g.dw2); free(g.dw2b);
    free(g.db1); free(g.db1b); free(g.db2); free(g.db2b); free(g.dprobs); free(g.dprobsb);
    tu_weight_free(&w1t); tu_weight_free(&w2t); tu_weight_free(&dw1t); tu_weight_free(&dw2t);
}

/* The backward's workspace without z, dz and the steps' scratch when they fit in the memory of
 * a packed dW1 that is written (=): smaller by at least z's bytes than with dW1 accumulated;
 * not when dW1 is too small to hold them. */
static void check_ws_in_dw1(moex_context *ctx) {
    const int64_t G = 2, T = 64, T2 = 4096, H = 256, F = 384;
    void *m[9];   /* memory for every tensor at the larger T (size queries check pointers) */
    const size_t sizes[9] = {T2 * H * 2, G * 2 * F * H * 2, G * H * F * 2, G * 8, T2 * 2 * F * 2, T2 * H * 2,
                             T2 * H * 2, G * 2 * F * H * 4, G * H * F * 4};
    for (int i = 0; i < 9; i++) m[i] = tu_alloc(sizes[i]);
    moex_grouped_mlp_grad_args a;
    memset(&a, 0, sizeof a);
    a.x = moex_tensor_2d(m[0], MOEX_DTYPE_BF16, T, H);
    a.w1 = moex_weight_packed(moex_tensor_3d(m[1], MOEX_DTYPE_BF16, G, 2 * F, H));
    a.w2 = moex_weight_packed(moex_tensor_3d(m[2], MOEX_DTYPE_BF16, G, H, F));
    a.splits = moex_tensor_1d(m[3], MOEX_DTYPE_I64, G);
    a.h = moex_tensor_2d(m[4], MOEX_DTYPE_BF16, T, 2 * F);
    a.dy = moex_tensor_2d(m[5], MOEX_DTYPE_BF16, T, H);
    a.dx = moex_tensor_2d(m[6], MOEX_DTYPE_BF16, T, H);
    a.dw1 = moex_weight_packed(moex_tensor_3d(m[7], MOEX_DTYPE_F32, G, 2 * F, H));
    a.dw2 = moex_weight_packed(moex_tensor_3d(m[8], MOEX_DTYPE_F32, G, H, F));
    size_t in_dw1 = 0, acc = 0, small = 0;
    a.dw_mode = MOEX_GRAD_WRITE;
    CHECK_STATUS(ctx, moex_grouped_mlp_backward_workspace_size(ctx, &a, &in_dw1), MOEX_OK);
    a.dw_mode = MOEX_GRAD_ACCUMULATE;
    CHECK_STATUS(ctx, moex_grouped_mlp_backward_workspace_size(ctx, &a, &acc), MOEX_OK);
    CHECK_MSG(in_dw1 + (size_t)(T * F * 2) <= acc, "backward workspace with dW1 written: %zu bytes, accumulated: %zu",
              in_dw1, acc);
    a.dw_mode = MOEX_GRAD_WRITE;   /* z larger than dW1 (and no dx): z in the workspace */
    a.x.shape[0] = a.h.shape[0] = a.dy.shape[0] = T2;
    memset(&a.dx, 0, sizeof a.dx);
    CHECK_STATUS(ctx, moex_grouped_mlp_backward_workspace_size(ctx, &a, &small), MOEX_OK);
    CHECK_MSG(small >= (size_t)(T2 * F * 2), "backward workspace with a small dW1: %zu bytes", small);
    for (int i = 0; i < 9; i++) free(m[i]);
}

int main(void) {
    moex_context *ctx = tu_cpu_context();
    check_ws_in_dw1(ctx);
    tu_rng r = tu_rng_seed(777);
    static const moex_dtype dts[3] = {MOEX_DTYPE_F32, MOEX_DTYPE_BF16, MOEX_DTYPE_F16};
    const moex_glu_kind SW = MOEX_GLU_SWIGLU, CL = MOEX_GLU_CLAMPED_SWIGLU;
    const moex_glu_layout CO = MOEX_GLU_CONTIGUOUS, IL = MOEX_GLU_INTERLEAVED_32;
    const moex_grad_mode WR = MOEX_GRAD_WRITE, AC = MOEX_GRAD_ACCUMULATE;
    /* (the dtype is set per pass below) */
    const mlp_cfg cases[] = {
        {.G = 1, .T = 37, .rows = 31, .H = 40, .F = 36, .kind = TU_SPLITS_BALANCED, .glu_kind = SW, .layout = CO,
         .b1 = 1, .b2_mode = MOEX_BIAS_SCALED, .probs = 1, .save_z = 1, .grads = G_ALL, .dw_mode = WR, .dw_f32 = 1},
        {.G = 1, .T = 20, .rows = 20, .H = 24, .F = 32, .kind = TU_SPLITS_BALANCED, .glu_kind = CL, .layout = IL,
         .b1 = 2, .b2_mode = MOEX_BIAS_ADD, .b2_f32 = 1, .probs = 1, .grads = G_ALL, .dw_mode = AC, .discrete = 1},
        {.G = 5, .T = 50, .rows = 43, .H = 40, .F = 64, .kind = TU_SPLITS_EMPTY_FIRST, .glu_kind = CL, .layout = IL,
         .b2_mode = MOEX_BIAS_ADD, .b2_f32 = 1, .probs = 1, .grads = G_ALL, .dw_mode = AC, .discrete = 1},
        {.G = 5, .T = 50, .rows = 43, .H = 40, .F = 36, .kind = TU_SPLITS_EMPTY_MIDDLE, .glu_kind = SW, .layout = CO,
         .b1 = 2, .b2_mode = MOEX_BIAS_NONE, .save_z = 1, .grads = G_DX | G_DW1, .dw_mode = WR},
        {.G = 5, .T = 50, .rows = 43, .H = 33, .F = 36, .kind = TU_SPLITS_EMPTY_LAST, .glu_kind = CL, .layout = CO,
         .custom_clamp = 1, .b1 = 1, .b2_mode = MOEX_BIAS_SCALED, .probs = 1, .grads = G_DW2 | G_DB1 | G_DB2 | G_DP,
         .dw_mode = WR, .discrete = 1},
        {.G = 5, .T = 50, .rows = 43, .H = 40, .F = 36, .kind = TU_SPLITS_SKEWED, .glu_kind = SW, .layout = CO,
         .b1 = 1, .b2_mode = MOEX_BIAS_ADD, .probs = 1, .save_z = 1, .grads = G_DP | G_DB2, .dw_mode = WR,
         .dw_f32 = 1},
        {.G = 5, .T = 50, .rows = 43, .H = 40, .F = 36, .kind = TU_SPLITS_ONE_GROUP, .glu_kind = CL, .layout = CO,
         .b1 = 2, .b2_mode = MOEX_BIAS_SCALED, .b2_f32 = 1, .probs = 1, .grads = G_DX | G_DP, .dw_mode = AC},
        {.G = 5, .T = 50, .rows = 43, .H = 40, .F = 32, .kind = TU_SPLITS_RANDOM, .glu_kind = SW, .layout = IL,
         .b2_mode = MOEX_BIAS_SCALED, .probs = 1, .save_z = 1, .grads = G_DW1 | G_DW2 | G_DB1, .dw_mode = AC,
         .discrete = 1},
        {.G = 4, .T = 12, .H = 24, .F = 20, .kind = TU_SPLITS_BALANCED, .glu_kind = CL, .layout = CO, .b1 = 1,
         .b2_mode = MOEX_BIAS_SCALED, .probs = 1, .save_z = 1, .grads = G_ALL, .dw_mode = WR},
        {.G = 4, .T = 12, .H = 24, .F = 20, .kind = TU_SPLITS_BALANCED, .glu_kind = SW, .layout = CO, .b1 = 1,
         .b2_mode = MOEX_BIAS_ADD, .probs = 1, .grads = G_ALL, .dw_mode = AC, .discrete = 1},
        {.G = 2, .H = 24, .F = 32, .kind = TU_SPLITS_BALANCED, .glu_kind = CL, .layout = IL, .b1 = 1,
         .b2_mode = MOEX_BIAS_SCALED, .probs = 1, .grads = G_ALL, .dw_mode = AC},
        /* large: H and 2F past the CPU GEMM's blocking */
        {.G = 3, .T = 300, .rows = 290, .H = 300, .F = 160, .kind = TU_SPLITS_RANDOM, .glu_kind = CL, .layout = IL,
         .b1 = 1, .b2_mode = MOEX_BIAS_SCALED, .probs = 1, .grads = G_ALL, .dw_mode = AC},
        {.G = 128, .T = 300, .rows = 290, .H = 40, .F = 36, .kind = TU_SPLITS_SKEWED, .glu_kind = CL, .layout = CO,
         .b1 = 1, .b2_mode = MOEX_BIAS_SCALED, .probs = 1, .save_z = 1, .grads = G_ALL, .dw_mode = AC},
        {.G = 128, .T = 300, .rows = 290, .H = 24, .F = 32, .kind = TU_SPLITS_RANDOM, .glu_kind = SW, .layout = IL,
         .b1 = 2, .b2_mode = MOEX_BIAS_ADD, .grads = G_ALL, .dw_mode = WR, .dw_f32 = 1, .discrete = 1},
        /* packed weights, H and F multiples of 8: on Hopper FC1 runs with the GLU fused into
         * its epilogue (b1 in the activation dtype / f32 / absent, probs present / absent,
         * z saved / recomputed; the last one with 64-row tiles: T < 128 G) */
        {.G = 5, .T = 333, .rows = 322, .H = 136, .F = 96, .kind = TU_SPLITS_SKEWED, .glu_kind = SW, .layout = CO,
         .b1 = 1, .b2_mode = MOEX_BIAS_SCALED, .probs = 1, .save_z = 1, .grads = G_ALL, .dw_mode = WR},
        {.G = 3, .T = 200, .rows = 190, .H = 64, .F = 64, .kind = TU_SPLITS_EMPTY_MIDDLE, .glu_kind = CL,
         .layout = IL, .b1 = 2, .b2_mode = MOEX_BIAS_ADD, .b2_f32 = 1, .probs = 1, .grads = G_ALL, .dw_mode = AC},
        {.G = 4, .T = 160, .rows = 150, .H = 72, .F = 40, .kind = TU_SPLITS_RANDOM, .glu_kind = SW, .layout = CO,
         .b2_mode = MOEX_BIAS_NONE, .save_z = 1, .grads = G_ALL, .dw_mode = WR, .dw_f32 = 1},
        {.G = 128, .T = 300, .rows = 290, .H = 64, .F = 32, .kind = TU_SPLITS_SKEWED, .glu_kind = CL, .layout = IL,
         .b1 = 1, .b2_mode = MOEX_BIAS_SCALED, .probs = 1, .grads = G_ALL, .dw_mode = AC},
        /* ... and FC2's dgrad with the GLU's backward fused: F past one 256-column tile and not
         * a multiple of 128 (the dprobs partials of a part-filled 128-column slot) */
        {.G = 4, .T = 520, .rows = 500, .H = 200, .F = 264, .kind = TU_SPLITS_SKEWED, .glu_kind = SW, .layout = CO,
         .b2_mode = MOEX_BIAS_SCALED, .probs = 1, .save_z = 1, .grads = G_ALL, .dw_mode = WR},
        {.G = 3, .T = 400, .rows = 390, .H = 96, .F = 320, .kind = TU_SPLITS_EMPTY_MIDDLE, .glu_kind = CL,
         .layout = IL, .b1 = 1, .b2_mode = MOEX_BIAS_NONE, .probs = 1, .grads = G_DX | G_DP, .dw_mode = WR},
        /* z recomputed into dx's memory (F <= H) with few rows: dx's rows past them untouched */
        {.G = 4, .T = 520, .rows = 60, .H = 200, .F = 136, .kind = TU_SPLITS_SKEWED, .glu_kind = SW, .layout = CO,
         .b1 = 1, .b2_mode = MOEX_BIAS_SCALED, .probs = 1, .grads = G_ALL, .dw_mode = WR},
        /* z recomputed with F > H, dW1 written: z and the steps' scratch in dW1's memory */
        {.G = 4, .T = 520, .rows = 300, .H = 96, .F = 264, .kind = TU_SPLITS_RANDOM, .glu_kind = CL, .layout = CO,
         .b1 = 1, .b2_mode = MOEX_BIAS_SCALED, .probs = 1, .grads = G_ALL, .dw_mode = WR, .dw_f32 = 1},
    };
    const int ncases = (int)(sizeof cases / sizeof cases[0]);
    int n = 0;
    for (int d = 0; d < 3; d++) {
        for (int i = 0; i < ncases; i++) {
            mlp_cfg c = cases[i];
            c.dt = dts[d];
            run_case(ctx, &r, &c, (i + d) % 2), n++;   /* each case in both h modes over the dtypes */
        }
    }
    printf("%d cases, worst err/tol %.3g\n", n, worst_seen);
    moex_context_destroy(ctx);
    return tu_finish();
}
