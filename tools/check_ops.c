/*
 * check_ops.c - `moex check` for the foundation ops: splits_to_offsets, grouped linear
 * forward / backward data / backward weight, scaled GLU forward/backward (SwiGLU and
 * clamped SwiGLU, both layouts) and the grouped MLP forward/backward. Each case runs on
 * the checker's backend and is compared with the fp64 reference (tools/ref/ref.h) under
 * its tolerance model; outputs start poisoned and rows past sum(splits) must stay so;
 * "+=" outputs start from random values.
 */
#include "check.h"

#include <math.h>
#include <stdlib.h>

static int64_t max3(int64_t a, int64_t b, int64_t c) {
    int64_t m = a > b ? a : b;
    return m > c ? m : c;
}

/* ---- splits_to_offsets ---------------------------------------------------------------- */

void check_splits_to_offsets(checker *c) {
    static const struct { int64_t G; c_splits_kind sk; } cases[] = {{6, C_SPLITS_SKEWED}, {1, C_SPLITS_BALANCED},
                                                                      {9, C_SPLITS_EMPTY_ENDS}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int64_t G = cases[ci].G;
        crow r = {0};
        int64_t splits[16];
        double sd[16];
        c_make_splits(c, cases[ci].sk, G, 100, splits, sd);
        /* three outputs: I32 leading zero stride 1, I64 inclusive stride 48, I32 inclusive stride 3 */
        const moex_dtype odt[3] = {MOEX_DTYPE_I32, MOEX_DTYPE_I64, MOEX_DTYPE_I32};
        const int64_t stride[3] = {1, 48, 3};
        const int lead[3] = {1, 0, 0};
        cbuf sp = {0}, out[3] = {{0}};
        int ok = cb_in(c, &sp, MOEX_DTYPE_I64, sd, G) == 0;
        moex_splits_to_offsets_args a;
        memset(&a, 0, sizeof a);
        a.splits = cb_1d(&sp, G);
        a.num_outputs = 3;
        for (int o = 0; o < 3; o++) {
            ok &= cb_out(c, &out[o], odt[o], G + lead[o], NULL) == 0;
            a.outputs[o].out = cb_1d(&out[o], G + lead[o]);
            a.outputs[o].stride = stride[o];
            a.outputs[o].start = lead[o] ? MOEX_OFFSETS_LEADING_ZERO : MOEX_OFFSETS_INCLUSIVE;
        }
        int done = 0;
        C_RUN_AS(c, &r, ok, "splits_to_offsets", moex_splits_to_offsets_workspace_size,
                 moex_splits_to_offsets, &a, done);
        if (done) {
            ref_tol_model exact;
            memset(&exact, 0, sizeof exact);   /* integers: exact */
            for (int o = 0; o < 3; o++) {
                int64_t want[17];
                double wd[17];
                ref_splits_to_offsets(splits, G, stride[o], lead[o], want);
                for (int64_t i = 0; i < G + lead[o]; i++) wd[i] = (double)want[i];
                c_compare(c, &r, o == 0 ? "out[0] i32 leading zero" : o == 1 ? "out[1] i64 x48" : "out[2] i32 x3",
                          &out[o], wd, NULL, G + lead[o], &exact);
            }
        }
        char shape[96];
        snprintf(shape, sizeof shape, "G=%lld sum=100 %s, 3 outputs", (long long)G, c_splits_name(cases[ci].sk));
        c_row(c, "splits_to_offsets", MOEX_DTYPE_I64, shape, &r);
        cb_free(c, &sp);
        for (int o = 0; o < 3; o++) cb_free(c, &out[o]);
    }
}

/* ---- grouped linear ------------------------------------------------------------------- */

typedef struct lin_case {
    int64_t G, T, S, K, N;       /* S = sum(splits) <= T */
    c_splits_kind sk;
    moex_dtype dt, bias_dt;
    moex_bias_mode bm;
} lin_case;

static const lin_case lin_cases[] = {
    {4, 67, 61, 40, 36, C_SPLITS_SKEWED, MOEX_DTYPE_F32, MOEX_DTYPE_F32, MOEX_BIAS_SCALED},
    {1, 33, 33, 17, 19, C_SPLITS_BALANCED, MOEX_DTYPE_F32, MOEX_DTYPE_F32, MOEX_BIAS_ADD},
    {6, 70, 64, 72, 40, C_SPLITS_EMPTY_ENDS, MOEX_DTYPE_BF16, MOEX_DTYPE_BF16, MOEX_BIAS_SCALED},
    {5, 50, 45, 24, 56, C_SPLITS_ONE_GROUP, MOEX_DTYPE_BF16, MOEX_DTYPE_F32, MOEX_BIAS_NONE},
    /* large enough for the threaded and blocked paths */
    {8, 1300, 1203, 300, 264, C_SPLITS_SKEWED, MOEX_DTYPE_F32, MOEX_DTYPE_F32, MOEX_BIAS_SCALED},
    {3, 600, 580, 200, 130, C_SPLITS_BALANCED, MOEX_DTYPE_BF16, MOEX_DTYPE_F32, MOEX_BIAS_ADD},
};

static const char *bias_name(moex_bias_mode m) {
    return m == MOEX_BIAS_ADD ? "bias" : m == MOEX_BIAS_SCALED ? "scaled-bias" : "no-bias";
}

static void check_linear_case(checker *c, const lin_case *lc) {   /* the steps of every case: check.h */
    const int64_t G = lc->G, T = lc->T, S = lc->S, K = lc->K, N = lc->N;
    const moex_dtype dt = lc->dt;
    const int has_bias = lc->bm != MOEX_BIAS_NONE, scaled = lc->bm == MOEX_BIAS_SCALED;
    int64_t splits[16];
    double sd[16];
    c_make_splits(c, lc->sk, G, S, splits, sd);
    char shape[96];
    snprintf(shape, sizeof shape, "G=%lld T=%lld S=%lld K=%lld N=%lld %s %s", (long long)G, (long long)T,
             (long long)S, (long long)K, (long long)N, c_splits_name(lc->sk), bias_name(lc->bm));

    double *x = c_doubles(T * K), *w = c_doubles(G * N * K), *bias = c_doubles(G * N), *probs = c_doubles(T);
    double *dy = c_doubles(T * N);
    c_uniform(c, x, T * K, -1, 1);
    c_uniform(c, w, G * N * K, -1, 1);
    c_uniform(c, bias, G * N, -1, 1);
    c_uniform(c, probs, T, 0, 1);
    c_uniform(c, dy, T * N, -1, 1);
    cbuf bx = {0}, bw = {0}, bb = {0}, bp = {0}, bs = {0}, bdy = {0};
    int ok = cb_in(c, &bx, dt, x, T * K) == 0 && cb_in(c, &bw, dt, w, G * N * K) == 0 &&
             cb_in(c, &bb, lc->bias_dt, bias, G * N) == 0 && cb_in(c, &bp, MOEX_DTYPE_F32, probs, T) == 0 &&
             cb_in(c, &bs, MOEX_DTYPE_I64, sd, G) == 0 && cb_in(c, &bdy, dt, dy, T * N) == 0;
    moex_tensor t_bias = has_bias ? cb_2d(&bb, G, N) : (moex_tensor){0};
    moex_tensor t_probs = scaled ? cb_1d(&bp, T) : (moex_tensor){0};
    moex_tensor t_splits = cb_1d(&bs, G);
    moex_weight t_w = moex_weight_packed(cb_3d(&bw, G, N, K));

    /* forward (one block per op, alike by design: check.h) */
    {
        crow r = {0};
        cbuf by = {0};
        ok &= cb_out(c, &by, dt, T * N, NULL) == 0;
        moex_grouped_linear_args a = {.x = cb_2d(&bx, T, K), .w = t_w, .bias_mode = lc->bm, .bias = t_bias,
                                      .probs = t_probs, .splits = t_splits, .y = cb_2d(&by, T, N)};
        int done = 0;
        C_RUN_AS(c, &r, ok, "forward", moex_grouped_linear_forward_workspace_size,
                 moex_grouped_linear_forward, &a, done);
        if (done) {
            double *y = c_doubles(T * N), *yb = c_doubles(T * N);
            ref_grouped_linear_forward(G, T, K, N, splits, x, w, lc->bm, bias, probs, y, yb);
            ref_tol_model m = ref_tol_for(dt, dt, 0, K);
            c_compare(c, &r, "y", &by, y, yb, S * N, &m);
            free(y);
            free(yb);
        }
        c_row(c, "grouped_linear_fwd", dt, shape, &r);
        cb_free(c, &by);
    }

    /* backward data: dx (=), dbias (=), dprobs (+=) */
    {
        crow r = {0};
        cbuf bdx = {0}, bdb = {0}, bdp = {0};
        double *dp0 = c_random(c, T, -1, 1);
        ok &= cb_out(c, &bdx, dt, T * K, NULL) == 0 && cb_out(c, &bdb, MOEX_DTYPE_F32, G * N, NULL) == 0 &&
              cb_out(c, &bdp, MOEX_DTYPE_F32, T, dp0) == 0;
        moex_grouped_linear_dgrad_args a = {.dy = cb_2d(&bdy, T, N), .w = t_w, .bias_mode = lc->bm, .bias = t_bias,
                                            .probs = t_probs, .splits = t_splits, .dx = cb_2d(&bdx, T, K)};
        if (has_bias) a.dbias = cb_2d(&bdb, G, N);
        if (scaled) a.dprobs = cb_1d(&bdp, T);
        int done = 0;
        C_RUN_AS(c, &r, ok, "backward_data", moex_grouped_linear_backward_data_workspace_size,
                 moex_grouped_linear_backward_data, &a, done);
        if (done) {
            double *dx = c_doubles(T * K), *dxb = c_doubles(T * K), *db = c_doubles(G * N), *dbb = c_doubles(G * N);
            double *dpr = c_doubles(T), *dprb = c_doubles(T);
            ref_grouped_linear_backward_data(G, T, K, N, splits, dy, w, lc->bm, bias, probs, dx, dxb,
                                             has_bias ? db : NULL, has_bias ? dbb : NULL, scaled ? dpr : NULL,
                                             scaled ? dprb : NULL);
            ref_tol_model mdx = ref_tol_for(dt, dt, 0, N);
            c_compare(c, &r, "dx", &bdx, dx, dxb, S * K, &mdx);
            if (has_bias) {
                ref_tol_model mdb = ref_tol_for(MOEX_DTYPE_F32, dt, 0, T);
                c_compare(c, &r, "dbias", &bdb, db, dbb, G * N, &mdb);
            }
            if (scaled) {
                ref_tol_model mdp = ref_tol_for(MOEX_DTYPE_F32, dt, 0, N);
                c_compare_from(c, &r, "dprobs", &bdp, dp0, dpr, dprb, S, &mdp);
            }
            free(dx); free(dxb); free(db); free(dbb); free(dpr); free(dprb);
        }
        c_row(c, "grouped_linear_dgrad", dt, shape, &r);
        cb_free(c, &bdx);
        cb_free(c, &bdb);
        cb_free(c, &bdp);
        free(dp0);
    }

    /* backward weight: WRITE into the activation dtype (f32 for f32), then ACCUMULATE into f32 */
    {
        crow r = {0};
        cbuf bw1 = {0}, bw2 = {0};
        double *acc0 = c_random(c, G * N * K, -1, 1);
        ok &= cb_out(c, &bw1, dt, G * N * K, NULL) == 0 && cb_out(c, &bw2, MOEX_DTYPE_F32, G * N * K, acc0) == 0;
        moex_grouped_linear_wgrad_args a = {.x = cb_2d(&bx, T, K), .dy = cb_2d(&bdy, T, N), .splits = t_splits,
                                            .dw_mode = MOEX_GRAD_WRITE,
                                            .dw = moex_weight_packed(cb_3d(&bw1, G, N, K))};
        moex_grouped_linear_wgrad_args a2 = a;
        a2.dw_mode = MOEX_GRAD_ACCUMULATE;
        a2.dw = moex_weight_packed(cb_3d(&bw2, G, N, K));
        int done = 0;
        C_RUN_AS(c, &r, ok, "backward_weight", moex_grouped_linear_backward_weight_workspace_size,
                 moex_grouped_linear_backward_weight, &a, done);
        if (done)
            C_RUN_AS(c, &r, ok, "backward_weight", moex_grouped_linear_backward_weight_workspace_size,
                     moex_grouped_linear_backward_weight, &a2, done);
        if (done) {
            double *dw = c_doubles(G * N * K), *dwb = c_doubles(G * N * K);
            ref_grouped_linear_backward_weight(G, T, K, N, splits, x, dy, dw, dwb);
            ref_tol_model m1 = ref_tol_for(dt, dt, 0, T), m2 = ref_tol_for(MOEX_DTYPE_F32, dt, 0, T);
            c_compare(c, &r, "dw (write)", &bw1, dw, dwb, G * N * K, &m1);
            c_compare_from(c, &r, "dw (accumulate f32)", &bw2, acc0, dw, dwb, G * N * K, &m2);
            free(dw); free(dwb);
        }
        c_row(c, "grouped_linear_wgrad", dt, shape, &r);
        cb_free(c, &bw1);
        cb_free(c, &bw2);
        free(acc0);
    }

    cb_free(c, &bx); cb_free(c, &bw); cb_free(c, &bb); cb_free(c, &bp); cb_free(c, &bs); cb_free(c, &bdy);
    free(x); free(w); free(bias); free(probs); free(dy);
}

void check_grouped_linear(checker *c) {
    for (size_t i = 0; i < sizeof lin_cases / sizeof lin_cases[0]; i++) check_linear_case(c, &lin_cases[i]);
}

/* ---- scaled GLU ------------------------------------------------------------------------ */

typedef struct glu_case {
    moex_glu_kind kind;
    moex_glu_layout layout;
    moex_dtype dt;
    int64_t T, F;
    int64_t G, S;       /* G == 0: no splits (all T rows) */
    int probs;
} glu_case;

static const glu_case glu_cases[] = {
    {MOEX_GLU_SWIGLU, MOEX_GLU_CONTIGUOUS, MOEX_DTYPE_F32, 37, 24, 3, 30, 1},
    {MOEX_GLU_CLAMPED_SWIGLU, MOEX_GLU_INTERLEAVED_32, MOEX_DTYPE_F32, 20, 64, 0, 0, 1},
    {MOEX_GLU_SWIGLU, MOEX_GLU_INTERLEAVED_32, MOEX_DTYPE_BF16, 29, 32, 2, 25, 0},
    {MOEX_GLU_CLAMPED_SWIGLU, MOEX_GLU_CONTIGUOUS, MOEX_DTYPE_BF16, 40, 40, 4, 33, 1},
    {MOEX_GLU_SWIGLU, MOEX_GLU_CONTIGUOUS, MOEX_DTYPE_BF16, 1000, 160, 7, 963, 1},
};

/* Random pre-activations; for the clamped GLU they cross the clamp but keep clear of it
 * (the derivative jumps there, so a value on the edge has no single right answer). */
static void glu_inputs(checker *c, const moex_glu_params *glu, double *h, int64_t n) {
    double span = glu->kind == MOEX_GLU_CLAMPED_SWIGLU ? 10.0 : 4.0;
    c_uniform(c, h, n, -span, span);
    if (glu->kind == MOEX_GLU_CLAMPED_SWIGLU) {
        for (int64_t i = 0; i < n; i++) {
            if (fabs(fabs(h[i]) - glu->limit) < 0.1) h[i] += h[i] > 0 ? 0.3 : -0.3;
        }
    }
}

static void check_glu_case(checker *c, const glu_case *gc) {
    const int64_t T = gc->T, F = gc->F, G = gc->G;
    const moex_dtype dt = gc->dt;
    moex_glu_params glu = c_glu(gc->kind, gc->layout);
    int64_t splits[8];
    double sd[8];
    c_make_splits(c, C_SPLITS_EMPTY_ENDS, G > 0 ? G : 1, gc->S, splits, sd);
    const int64_t rows = G > 0 ? gc->S : T;
    char shape[96];
    snprintf(shape, sizeof shape, "%s %s T=%lld F=%lld %s%s", gc->kind == MOEX_GLU_SWIGLU ? "swiglu" : "clamped",
             gc->layout == MOEX_GLU_CONTIGUOUS ? "contig" : "inter32", (long long)T, (long long)F,
             G > 0 ? "splits" : "all-rows", gc->probs ? " probs" : "");

    double *h = c_doubles(T * 2 * F), *probs = c_doubles(T), *dz = c_doubles(T * F);
    glu_inputs(c, &glu, h, T * 2 * F);
    c_uniform(c, probs, T, 0, 1);
    c_uniform(c, dz, T * F, -1, 1);
    cbuf bh = {0}, bp = {0}, bs = {0}, bdz = {0};
    int ok = cb_in(c, &bh, dt, h, T * 2 * F) == 0 && cb_in(c, &bp, MOEX_DTYPE_F32, probs, T) == 0 &&
             cb_in(c, &bs, MOEX_DTYPE_I64, sd, G > 0 ? G : 1) == 0 && cb_in(c, &bdz, dt, dz, T * F) == 0;
    moex_tensor t_probs = gc->probs ? cb_1d(&bp, T) : (moex_tensor){0};
    moex_tensor t_splits = G > 0 ? cb_1d(&bs, G) : (moex_tensor){0};
    const double *ref_probs = gc->probs ? probs : NULL;

    {   /* forward (one block per op, alike by design: check.h) */
        crow r = {0};
        cbuf bz = {0};
        ok &= cb_out(c, &bz, dt, T * F, NULL) == 0;
        moex_scaled_glu_args a = {.glu = glu, .h = cb_2d(&bh, T, 2 * F), .probs = t_probs, .splits = t_splits,
                                  .z = cb_2d(&bz, T, F)};
        int done = 0;
        C_RUN_AS(c, &r, ok, "scaled_glu_forward", moex_scaled_glu_forward_workspace_size,
                 moex_scaled_glu_forward, &a, done);
        if (done) {
            double *z = c_doubles(T * F), *zb = c_doubles(T * F);
            ref_scaled_glu_forward(&glu, rows, F, h, NULL, ref_probs, z, zb);
            /* k = 8: the f32 evaluation of exp and the products, a few roundings each */
            ref_tol_model m = ref_tol_for(dt, dt, 0, 8);
            c_compare(c, &r, "z", &bz, z, zb, rows * F, &m);
            free(z);
            free(zb);
        }
        c_row(c, "scaled_glu_fwd", dt, shape, &r);
        cb_free(c, &bz);
    }
    {
        crow r = {0};
        cbuf bdh = {0}, bdp = {0};
        double *dp0 = c_random(c, T, -1, 1);
        ok &= cb_out(c, &bdh, dt, T * 2 * F, NULL) == 0 && cb_out(c, &bdp, MOEX_DTYPE_F32, T, dp0) == 0;
        moex_scaled_glu_grad_args a = {.glu = glu, .h = cb_2d(&bh, T, 2 * F), .probs = t_probs, .splits = t_splits,
                                       .dz = cb_2d(&bdz, T, F), .dh = cb_2d(&bdh, T, 2 * F)};
        if (gc->probs) a.dprobs = cb_1d(&bdp, T);
        int done = 0;
        C_RUN_AS(c, &r, ok, "scaled_glu_backward", moex_scaled_glu_backward_workspace_size,
                 moex_scaled_glu_backward, &a, done);
        if (done) {
            double *dh = c_doubles(T * 2 * F), *dhb = c_doubles(T * 2 * F), *dpr = c_doubles(T);
            double *dprb = c_doubles(T);
            ref_scaled_glu_backward(&glu, rows, F, h, NULL, ref_probs, dz, NULL, dh, dhb, gc->probs ? dpr : NULL,
                                    gc->probs ? dprb : NULL);
            ref_tol_model m = ref_tol_for(dt, dt, 0, 8);
            c_compare(c, &r, "dh", &bdh, dh, dhb, rows * 2 * F, &m);
            if (gc->probs) {
                ref_tol_model mp = ref_tol_for(MOEX_DTYPE_F32, dt, 0, F + 8);
                c_compare_from(c, &r, "dprobs", &bdp, dp0, dpr, dprb, rows, &mp);
            }
            free(dh); free(dhb); free(dpr); free(dprb);
        }
        c_row(c, "scaled_glu_bwd", dt, shape, &r);
        cb_free(c, &bdh);
        cb_free(c, &bdp);
        free(dp0);
    }
    cb_free(c, &bh); cb_free(c, &bp); cb_free(c, &bs); cb_free(c, &bdz);
    free(h); free(probs); free(dz);
}

void check_scaled_glu(checker *c) {
    for (size_t i = 0; i < sizeof glu_cases / sizeof glu_cases[0]; i++) check_glu_case(c, &glu_cases[i]);
}

/* ---- grouped MLP ----------------------------------------------------------------------- */

/* moe_case (check_routing.c) has the fields kind .. dw_dt too, and check_moe_case follows
 * check_mlp_case step by step: the MoE layer's experts are a grouped MLP. They stay apart
 * because their shapes, references (ref_mlp_grads, ref_moe_grads) and buffers differ. */
typedef struct mlp_case {
    int64_t G, T, S, H, F;
    c_splits_kind sk;
    moex_dtype dt;
    moex_glu_kind kind;
    moex_glu_layout layout;
    int b1, probs, save_z;
    moex_bias_mode b2_mode;
    moex_grad_mode dw_mode;
    moex_dtype dw_dt;        /* WRITE: f32 or dt; ACCUMULATE: f32 */
} mlp_case;

static const mlp_case mlp_cases[] = {
    {4, 40, 37, 24, 32, C_SPLITS_SKEWED, MOEX_DTYPE_F32, MOEX_GLU_SWIGLU, MOEX_GLU_CONTIGUOUS, 1, 1, 1,
     MOEX_BIAS_SCALED, MOEX_GRAD_WRITE, MOEX_DTYPE_F32},
    {5, 30, 30, 16, 32, C_SPLITS_EMPTY_ENDS, MOEX_DTYPE_BF16, MOEX_GLU_CLAMPED_SWIGLU, MOEX_GLU_INTERLEAVED_32, 0, 1,
     0, MOEX_BIAS_ADD, MOEX_GRAD_ACCUMULATE, MOEX_DTYPE_F32},
    {1, 20, 17, 40, 24, C_SPLITS_BALANCED, MOEX_DTYPE_BF16, MOEX_GLU_SWIGLU, MOEX_GLU_CONTIGUOUS, 1, 0, 1,
     MOEX_BIAS_NONE, MOEX_GRAD_WRITE, MOEX_DTYPE_BF16},
    {8, 700, 651, 136, 96, C_SPLITS_SKEWED, MOEX_DTYPE_F32, MOEX_GLU_SWIGLU, MOEX_GLU_INTERLEAVED_32, 1, 1, 1,
     MOEX_BIAS_SCALED, MOEX_GRAD_ACCUMULATE, MOEX_DTYPE_F32},
};

static void check_mlp_case(checker *c, const mlp_case *mc) {   /* as check_moe_case: see mlp_case */
    const int64_t G = mc->G, T = mc->T, S = mc->S, H = mc->H, F = mc->F;
    const moex_dtype dt = mc->dt;
    const int has_b2 = mc->b2_mode != MOEX_BIAS_NONE, acc = mc->dw_mode == MOEX_GRAD_ACCUMULATE;
    moex_glu_params glu = c_glu(mc->kind, mc->layout);
    int64_t splits[16];
    double sd[16];
    c_make_splits(c, mc->sk, G, S, splits, sd);
    char shape[96];
    snprintf(shape, sizeof shape, "G=%lld T=%lld S=%lld H=%lld F=%lld %s %s", (long long)G, (long long)T,
             (long long)S, (long long)H, (long long)F, c_splits_name(mc->sk), c_glu_name(mc->kind));

    double *x = c_doubles(T * H), *w1 = c_doubles(G * 2 * F * H), *b1 = c_doubles(G * 2 * F);
    double *w2 = c_doubles(G * H * F), *b2 = c_doubles(G * H), *probs = c_doubles(T), *dy = c_doubles(T * H);
    c_uniform(c, x, T * H, -1, 1);
    c_uniform(c, w1, G * 2 * F * H, -2.0 / sqrt((double)H), 2.0 / sqrt((double)H));
    c_uniform(c, b1, G * 2 * F, -0.5, 0.5);
    c_uniform(c, w2, G * H * F, -1.0 / sqrt((double)F), 1.0 / sqrt((double)F));
    c_uniform(c, b2, G * H, -0.5, 0.5);
    c_uniform(c, probs, T, 0, 1);
    c_uniform(c, dy, T * H, -1, 1);
    cbuf bx = {0}, bw1 = {0}, bb1 = {0}, bw2 = {0}, bb2 = {0}, bp = {0}, bs = {0}, bdy = {0};
    cbuf bh = {0}, bz = {0}, by = {0};
    int ok = cb_in(c, &bx, dt, x, T * H) == 0 && cb_in(c, &bw1, dt, w1, G * 2 * F * H) == 0 &&
             cb_in(c, &bb1, MOEX_DTYPE_F32, b1, G * 2 * F) == 0 && cb_in(c, &bw2, dt, w2, G * H * F) == 0 &&
             cb_in(c, &bb2, dt, b2, G * H) == 0 && cb_in(c, &bp, MOEX_DTYPE_F32, probs, T) == 0 &&
             cb_in(c, &bs, MOEX_DTYPE_I64, sd, G) == 0 && cb_in(c, &bdy, dt, dy, T * H) == 0 &&
             cb_out(c, &bh, dt, T * 2 * F, NULL) == 0 && cb_out(c, &bz, dt, T * F, NULL) == 0 &&
             cb_out(c, &by, dt, T * H, NULL) == 0;

    ref_mlp p = {G, T, H, F, splits, x, w1, mc->b1 ? b1 : NULL, w2, b2, mc->probs ? probs : NULL, mc->b2_mode, glu,
                 NULL, NULL};
    /* the h and z the library's forward saved: the reference backward uses them as the
     * library's backward does (a bf16 h rounded across the clamp takes the same branch) */
    double *h_lib = c_doubles(T * 2 * F), *z_lib = c_doubles(T * F);

    moex_grouped_mlp_args a;
    memset(&a, 0, sizeof a);
    a.x = cb_2d(&bx, T, H);
    a.w1 = moex_weight_packed(cb_3d(&bw1, G, 2 * F, H));
    if (mc->b1) a.b1 = cb_2d(&bb1, G, 2 * F);
    a.w2 = moex_weight_packed(cb_3d(&bw2, G, H, F));
    a.b2_mode = mc->b2_mode;
    if (has_b2) a.b2 = cb_2d(&bb2, G, H);
    if (mc->probs) a.probs = cb_1d(&bp, T);
    a.glu = glu;
    a.splits = cb_1d(&bs, G);
    a.h = cb_2d(&bh, T, 2 * F);
    if (mc->save_z) a.z = cb_2d(&bz, T, F);
    a.y = cb_2d(&by, T, H);

    int fwd_ok = 0;
    {
        crow r = {0};
        int done = 0;
        C_RUN_AS(c, &r, ok, "grouped_mlp_forward", moex_grouped_mlp_forward_workspace_size,
                 moex_grouped_mlp_forward, &a, done);
        if (done) {
            double *h = c_doubles(T * 2 * F), *hb = c_doubles(T * 2 * F), *z = c_doubles(T * F);
            double *zb = c_doubles(T * F), *y = c_doubles(T * H), *yb = c_doubles(T * H);
            ref_grouped_mlp_forward(&p, h, hb, z, zb, y, yb);
            ref_tol_model mh = ref_tol_for(dt, dt, 0, H), mz = ref_tol_for(dt, dt, 1, H + 8);
            ref_tol_model my = ref_tol_for(dt, dt, 1, max3(H, F, 8));
            c_compare(c, &r, "h", &bh, h, hb, S * 2 * F, &mh);
            if (mc->save_z) c_compare(c, &r, "z", &bz, z, zb, S * F, &mz);
            c_compare(c, &r, "y", &by, y, yb, S * H, &my);
            fwd_ok = r.bad == 0;
            ref_read(dt, bh.host, h_lib, S * 2 * F);   /* c_compare left the host copies current */
            if (mc->save_z) ref_read(dt, bz.host, z_lib, S * F);
            p.h_saved = h_lib;
            p.z_saved = mc->save_z ? z_lib : NULL;
            free(h); free(hb); free(z); free(zb); free(y); free(yb);
        }
        c_row(c, "grouped_mlp_fwd", dt, shape, &r);
    }
    {
        crow r = {0};
        cbuf bdx = {0}, bdw1 = {0}, bdw2 = {0}, bdb1 = {0}, bdb2 = {0}, bdp = {0};
        double *w10 = c_random(c, G * 2 * F * H, -1, 1), *w20 = c_random(c, G * H * F, -1, 1);
        double *dp0 = c_random(c, T, -1, 1);
        int run_ok = ok && fwd_ok && cb_out(c, &bdx, dt, T * H, NULL) == 0 &&
                     cb_out(c, &bdw1, mc->dw_dt, G * 2 * F * H, acc ? w10 : NULL) == 0 &&
                     cb_out(c, &bdw2, mc->dw_dt, G * H * F, acc ? w20 : NULL) == 0 &&
                     cb_out(c, &bdb1, MOEX_DTYPE_F32, G * 2 * F, NULL) == 0 &&
                     cb_out(c, &bdb2, MOEX_DTYPE_F32, G * H, NULL) == 0 &&
                     cb_out(c, &bdp, MOEX_DTYPE_F32, T, dp0) == 0;
        moex_grouped_mlp_grad_args g;
        memset(&g, 0, sizeof g);
        g.x = a.x;
        g.w1 = a.w1;
        g.w2 = a.w2;
        g.b2_mode = a.b2_mode;
        g.b2 = a.b2;
        g.probs = a.probs;
        g.glu = glu;
        g.splits = a.splits;
        g.h = a.h;
        g.z = a.z;
        g.dy = cb_2d(&bdy, T, H);
        g.dx = cb_2d(&bdx, T, H);
        g.dw_mode = mc->dw_mode;
        g.dw1 = moex_weight_packed(cb_3d(&bdw1, G, 2 * F, H));
        g.dw2 = moex_weight_packed(cb_3d(&bdw2, G, H, F));
        if (mc->b1) g.db1 = cb_2d(&bdb1, G, 2 * F);
        if (has_b2) g.db2 = cb_2d(&bdb2, G, H);
        if (mc->probs) g.dprobs = cb_1d(&bdp, T);
        int done = 0;
        if (ok && !fwd_ok) {
            r.bad++;
            snprintf(r.note, sizeof r.note, "not run: the forward failed");
        } else {
            C_RUN_AS(c, &r, run_ok, "grouped_mlp_backward", moex_grouped_mlp_backward_workspace_size,
                     moex_grouped_mlp_backward, &g, done);
        }
        if (done) {
            ref_mlp_grads o;
            memset(&o, 0, sizeof o);
            o.dx = c_doubles(T * H); o.dxb = c_doubles(T * H);
            o.dw1 = c_doubles(G * 2 * F * H); o.dw1b = c_doubles(G * 2 * F * H);
            o.dw2 = c_doubles(G * H * F); o.dw2b = c_doubles(G * H * F);
            o.db1 = c_doubles(G * 2 * F); o.db1b = c_doubles(G * 2 * F);
            o.db2 = c_doubles(G * H); o.db2b = c_doubles(G * H);
            o.dprobs = c_doubles(T); o.dprobsb = c_doubles(T);
            if (!mc->probs) { free(o.dprobs); free(o.dprobsb); o.dprobs = o.dprobsb = NULL; }
            if (!has_b2) { free(o.db2); free(o.db2b); o.db2 = o.db2b = NULL; }
            ref_grouped_mlp_backward(&p, dy, &o);
            /* the longest reduction on any gradient's path, plus 8 for the GLU's exp */
            const int64_t kb = max3(S, H, 2 * F) + 8;
            ref_tol_model mx = ref_tol_for(dt, dt, 1, kb);
            ref_tol_model mw = ref_tol_for(mc->dw_dt, dt, 1, kb);
            ref_tol_model mb = ref_tol_for(MOEX_DTYPE_F32, dt, 1, kb);
            ref_tol_model mp = ref_tol_for(MOEX_DTYPE_F32, dt, 1, kb);
            c_compare(c, &r, "dx", &bdx, o.dx, o.dxb, S * H, &mx);
            c_compare_from(c, &r, acc ? "dw1 (accumulate)" : "dw1", &bdw1, acc ? w10 : NULL, o.dw1, o.dw1b,
                           G * 2 * F * H, &mw);
            c_compare_from(c, &r, acc ? "dw2 (accumulate)" : "dw2", &bdw2, acc ? w20 : NULL, o.dw2, o.dw2b,
                           G * H * F, &mw);
            if (mc->b1) c_compare(c, &r, "db1", &bdb1, o.db1, o.db1b, G * 2 * F, &mb);
            if (has_b2) c_compare(c, &r, "db2", &bdb2, o.db2, o.db2b, G * H, &mb);
            if (mc->probs) c_compare_from(c, &r, "dprobs", &bdp, dp0, o.dprobs, o.dprobsb, S, &mp);
            free(o.dx); free(o.dxb); free(o.dw1); free(o.dw1b); free(o.dw2); free(o.dw2b);
            free(o.db1); free(o.db1b); free(o.db2); free(o.db2b); free(o.dprobs); free(o.dprobsb);
        }
        c_row(c, "grouped_mlp_bwd", dt, shape, &r);
        cb_free(c, &bdx); cb_free(c, &bdw1); cb_free(c, &bdw2); cb_free(c, &bdb1); cb_free(c, &bdb2);
        cb_free(c, &bdp);
        free(w10); free(w20); free(dp0);
    }
    cb_free(c, &bx); cb_free(c, &bw1); cb_free(c, &bb1); cb_free(c, &bw2); cb_free(c, &bb2); cb_free(c, &bp);
    cb_free(c, &bs); cb_free(c, &bdy); cb_free(c, &bh); cb_free(c, &bz); cb_free(c, &by);
    free(x); free(w1); free(b1); free(w2); free(b2); free(probs); free(dy); free(h_lib); free(z_lib);
}

void check_grouped_mlp(checker *c) {
    for (size_t i = 0; i < sizeof mlp_cases / sizeof mlp_cases[0]; i++) check_mlp_case(c, &mlp_cases[i]);
}
