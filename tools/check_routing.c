/*
 * check_routing.c - `moex check` for routing and the whole layer: the top-k router,
 * permute and unpermute (each forward and backward) and the MoE layer forward/backward,
 * compared with the fp64 reference of tools/ref/ref_routing.h. Index outputs (ids,
 * row_map, splits) and pure copies must match exactly; sums use the tolerance model.
 * Inputs keep the top-k choice clear of ties (a near-tie could flip between f32 and fp64
 * and then no answer is "right").
 */
#include "check.h"
#include "ref_routing.h"

#include <math.h>
#include <stdlib.h>

static const ref_tol_model *exact_model(void) {
    static ref_tol_model m;   /* all zero: |got - ref| must be 0 */
    return &m;
}

static void ints_to_doubles(const int32_t *v, int64_t n, double *d) {
    for (int64_t i = 0; i < n; i++) d[i] = (double)v[i];
}

/* Logits whose values in a row are at least 0.15 apart: a random ranking of E levels
 * 0.25 apart, jittered by +-0.05, shifted per row. */
static void separated_logits(checker *c, int64_t T, int64_t E, double *l) {
    int64_t perm[256];
    for (int64_t t = 0; t < T; t++) {
        for (int64_t e = 0; e < E; e++) perm[e] = e;
        for (int64_t e = E - 1; e > 0; e--) {
            int64_t j = cli_rng_below(&c->rng, e + 1), tmp = perm[e];
            perm[e] = perm[j];
            perm[j] = tmp;
        }
        double shift = 2.0 * cli_rng_uniform(&c->rng) - 1.0 - 0.125 * (double)E;
        for (int64_t e = 0; e < E; e++)
            l[t * E + e] = shift + 0.25 * (double)perm[e] + 0.1 * (cli_rng_uniform(&c->rng) - 0.5);
    }
}

/* ---- router ------------------------------------------------------------------------------ */

typedef struct router_case {
    int64_t T, E, k;
    moex_router_score score;
    moex_router_norm norm;
    moex_dtype dt;
} router_case;

static const router_case router_cases[] = {
    {37, 8, 2, MOEX_ROUTER_SOFTMAX, MOEX_ROUTER_RENORM, MOEX_DTYPE_F32},
    {20, 6, 3, MOEX_ROUTER_SIGMOID, MOEX_ROUTER_NO_RENORM, MOEX_DTYPE_BF16},
    {25, 5, 1, MOEX_ROUTER_SOFTMAX, MOEX_ROUTER_NO_RENORM, MOEX_DTYPE_F32},
    {16, 7, 7, MOEX_ROUTER_SIGMOID, MOEX_ROUTER_RENORM, MOEX_DTYPE_BF16},
};

static void check_router_case(checker *c, const router_case *rc) {
    const int64_t T = rc->T, E = rc->E, k = rc->k;
    char shape[96];
    snprintf(shape, sizeof shape, "T=%lld E=%lld k=%lld %s %s", (long long)T, (long long)E, (long long)k,
             rc->score == MOEX_ROUTER_SOFTMAX ? "softmax" : "sigmoid",
             rc->norm == MOEX_ROUTER_RENORM ? "renorm" : "no-renorm");
    double *logits = c_doubles(T * E), *probs = c_doubles(T * k), *idsd = c_doubles(T * k);
    double *dprobs = c_doubles(T * k);
    int32_t *ids = calloc((size_t)(T * k), sizeof(int32_t));
    separated_logits(c, T, E, logits);
    c_uniform(c, dprobs, T * k, -1, 1);
    cbuf bl = {0}, bp = {0}, bi = {0}, bdp = {0}, bdl = {0};
    int ok = ids && cb_in(c, &bl, rc->dt, logits, T * E) == 0;
    ref_router_forward(T, E, k, rc->score, rc->norm, logits, probs, ids);
    ints_to_doubles(ids, T * k, idsd);

    {
        crow r = {0};
        int done = 0;
        ok &= cb_out(c, &bp, MOEX_DTYPE_F32, T * k, NULL) == 0 && cb_out(c, &bi, MOEX_DTYPE_I32, T * k, NULL) == 0;
        moex_router_args a = {cb_2d(&bl, T, E), (int32_t)k, rc->score, rc->norm, cb_2d(&bp, T, k), cb_2d(&bi, T, k)};
        C_RUN(c, &r, ok, moex_router_forward_workspace_size, moex_router_forward, &a, done);
        if (done) {
            /* k = E + k + 16: the sum of E exps, the renormalisation, exp's own error */
            ref_tol_model m = ref_tol_for(MOEX_DTYPE_F32, MOEX_DTYPE_F32, 0, E + k + 16);
            c_compare(c, &r, "ids", &bi, idsd, NULL, T * k, exact_model());
            c_compare(c, &r, "probs", &bp, probs, NULL, T * k, &m);
        }
        c_row(c, "router_fwd", rc->dt, shape, &r);
    }
    {
        crow r = {0};
        int done = 0;
        cbuf bids = {0};
        ok &= cb_in(c, &bids, MOEX_DTYPE_I32, idsd, T * k) == 0 && cb_in(c, &bdp, MOEX_DTYPE_F32, dprobs, T * k) == 0 &&
              cb_out(c, &bdl, rc->dt, T * E, NULL) == 0;
        moex_router_grad_args a = {cb_2d(&bl, T, E), (int32_t)k, rc->score, rc->norm, cb_2d(&bids, T, k),
                                   cb_2d(&bdp, T, k), cb_2d(&bdl, T, E)};
        C_RUN(c, &r, ok, moex_router_backward_workspace_size, moex_router_backward, &a, done);
        if (done) {
            double *dl = c_doubles(T * E), *dlb = c_doubles(T * E);
            ref_router_backward(T, E, k, rc->score, rc->norm, logits, ids, dprobs, NULL, dl, dlb);
            ref_tol_model m = ref_tol_for(rc->dt, MOEX_DTYPE_F32, 0, E + k + 16);
            c_compare(c, &r, "dlogits", &bdl, dl, dlb, T * E, &m);
            free(dl);
            free(dlb);
        }
        c_row(c, "router_bwd", rc->dt, shape, &r);
        cb_free(c, &bids);
    }
    cb_free(c, &bl); cb_free(c, &bp); cb_free(c, &bi); cb_free(c, &bdp); cb_free(c, &bdl);
    free(logits); free(probs); free(idsd); free(dprobs); free(ids);
}

/* ---- permute and unpermute ------------------------------------------------------------------ */

typedef struct perm_case {
    int64_t T, H, E, k;
    moex_dtype dt;
    int probs;
} perm_case;

static const perm_case perm_cases[] = {
    {37, 24, 6, 2, MOEX_DTYPE_F32, 1},
    {19, 40, 9, 3, MOEX_DTYPE_BF16, 1},
    {30, 8, 4, 1, MOEX_DTYPE_BF16, 0},
    {1000, 96, 16, 4, MOEX_DTYPE_F32, 1},
};

/* k distinct ids per token from experts [1, E): expert 0 always gets no rows. */
static void random_ids(checker *c, int64_t T, int64_t E, int64_t k, int32_t *ids) {
    for (int64_t t = 0; t < T; t++) {
        for (int64_t j = 0; j < k; j++) {
            int32_t e;
            int dup;
            do {
                e = (int32_t)(1 + cli_rng_below(&c->rng, E - 1));
                dup = 0;
                for (int64_t i = 0; i < j; i++) dup |= ids[t * k + i] == e;
            } while (dup);
            ids[t * k + j] = e;
        }
    }
}

static void check_perm_case(checker *c, const perm_case *pc) {
    const int64_t T = pc->T, H = pc->H, E = pc->E, k = pc->k, R = T * k;
    const moex_dtype dt = pc->dt;
    char shape[96];
    snprintf(shape, sizeof shape, "T=%lld H=%lld E=%lld k=%lld expert 0 empty%s", (long long)T, (long long)H,
             (long long)E, (long long)k, pc->probs ? " probs" : "");
    int32_t *ids = calloc((size_t)R, sizeof(int32_t)), *row_map = calloc((size_t)R, sizeof(int32_t));
    int64_t *splits = calloc((size_t)E, sizeof(int64_t));
    double *x = c_doubles(T * H), *probs = c_doubles(R), *idsd = c_doubles(R), *xp = c_doubles(R * H);
    double *probs_p = c_doubles(R), *splitsd = c_doubles(E), *rmd = c_doubles(R);
    double *dxp = c_doubles(R * H), *dprobs_p = c_doubles(R), *dy = c_doubles(T * H);
    if (!ids || !row_map || !splits) {
        fprintf(stderr, "moex check: out of memory\n");
        exit(CLI_EXIT_FAIL);
    }
    random_ids(c, T, E, k, ids);
    ints_to_doubles(ids, R, idsd);
    c_uniform(c, x, T * H, -1, 1);
    c_uniform(c, probs, R, 0, 1);
    c_uniform(c, dxp, R * H, -1, 1);
    c_uniform(c, dprobs_p, R, -1, 1);
    c_uniform(c, dy, T * H, -1, 1);
    cbuf bx = {0}, bids = {0}, bp = {0}, brm = {0}, bdxp = {0}, bdpp = {0}, bdy = {0};
    int ok = cb_in(c, &bx, dt, x, T * H) == 0 && cb_in(c, &bids, MOEX_DTYPE_I32, idsd, R) == 0 &&
             cb_in(c, &bp, MOEX_DTYPE_F32, probs, R) == 0 && cb_in(c, &bdxp, dt, dxp, R * H) == 0 &&
             cb_in(c, &bdpp, MOEX_DTYPE_F32, dprobs_p, R) == 0 && cb_in(c, &bdy, dt, dy, T * H) == 0;
    ref_permute_forward(T, H, k, E, ids, x, probs, splits, row_map, xp, probs_p);
    ints_to_doubles(row_map, R, rmd);
    for (int64_t e = 0; e < E; e++) splitsd[e] = (double)splits[e];
    ok &= cb_in(c, &brm, MOEX_DTYPE_I32, rmd, R) == 0;

    {   /* permute forward: everything exact */
        crow r = {0};
        int done = 0;
        cbuf bxp = {0}, bpp = {0}, bs = {0}, bmap = {0};
        ok &= cb_out(c, &bxp, dt, R * H, NULL) == 0 && cb_out(c, &bpp, MOEX_DTYPE_F32, R, NULL) == 0 &&
              cb_out(c, &bs, MOEX_DTYPE_I64, E, NULL) == 0 && cb_out(c, &bmap, MOEX_DTYPE_I32, R, NULL) == 0;
        moex_permute_args a;
        memset(&a, 0, sizeof a);
        a.x = cb_2d(&bx, T, H);
        a.ids = cb_2d(&bids, T, k);
        if (pc->probs) {
            a.probs = cb_2d(&bp, T, k);
            a.probs_p = cb_1d(&bpp, R);
        }
        a.num_experts = (int32_t)E;
        a.xp = cb_2d(&bxp, R, H);
        a.splits = cb_1d(&bs, E);
        a.row_map = cb_1d(&bmap, R);
        C_RUN(c, &r, ok, moex_permute_forward_workspace_size, moex_permute_forward, &a, done);
        if (done) {
            c_compare(c, &r, "splits", &bs, splitsd, NULL, E, exact_model());
            c_compare(c, &r, "row_map", &bmap, rmd, NULL, R, exact_model());
            c_compare(c, &r, "xp", &bxp, xp, NULL, R * H, exact_model());
            if (pc->probs) c_compare(c, &r, "probs_p", &bpp, probs_p, NULL, R, exact_model());
        }
        c_row(c, "permute_fwd", dt, shape, &r);
        cb_free(c, &bxp); cb_free(c, &bpp); cb_free(c, &bs); cb_free(c, &bmap);
    }
    {   /* permute backward: dx sums k rows; dprobs is a gather (exact) */
        crow r = {0};
        int done = 0;
        cbuf bdx = {0}, bdp = {0};
        ok &= cb_out(c, &bdx, dt, T * H, NULL) == 0 && cb_out(c, &bdp, MOEX_DTYPE_F32, R, NULL) == 0;
        moex_permute_grad_args a;
        memset(&a, 0, sizeof a);
        a.row_map = cb_1d(&brm, R);
        a.dxp = cb_2d(&bdxp, R, H);
        a.dx = cb_2d(&bdx, T, H);
        if (pc->probs) {
            a.dprobs_p = cb_1d(&bdpp, R);
            a.dprobs = cb_2d(&bdp, T, k);
        }
        C_RUN(c, &r, ok, moex_permute_backward_workspace_size, moex_permute_backward, &a, done);
        if (done) {
            double *dx = c_doubles(T * H), *dxb = c_doubles(T * H), *dp = c_doubles(R);
            ref_permute_backward(T, H, k, row_map, dxp, NULL, dprobs_p, dx, dxb, dp);
            ref_tol_model m = ref_tol_for(dt, dt, 0, k);
            c_compare(c, &r, "dx", &bdx, dx, dxb, T * H, &m);
            if (pc->probs) c_compare(c, &r, "dprobs", &bdp, dp, NULL, R, exact_model());
            free(dx); free(dxb); free(dp);
        }
        c_row(c, "permute_bwd", dt, shape, &r);
        cb_free(c, &bdx); cb_free(c, &bdp);
    }
    {   /* unpermute forward: y sums k rows (dxp serves as yp); one block per op, alike: check.h */
        crow r = {0};
        int done = 0;
        cbuf by = {0};
        ok &= cb_out(c, &by, dt, T * H, NULL) == 0;
        moex_unpermute_args a = {cb_1d(&brm, R), cb_2d(&bdxp, R, H), cb_2d(&by, T, H)};
        C_RUN(c, &r, ok, moex_unpermute_forward_workspace_size, moex_unpermute_forward, &a, done);
        if (done) {
            double *y = c_doubles(T * H), *yb = c_doubles(T * H);
            ref_unpermute_forward(T, H, k, row_map, dxp, NULL, y, yb);
            ref_tol_model m = ref_tol_for(dt, dt, 0, k);
            c_compare(c, &r, "y", &by, y, yb, T * H, &m);
            free(y); free(yb);
        }
        c_row(c, "unpermute_fwd", dt, shape, &r);
        cb_free(c, &by);
    }
    {   /* unpermute backward: a scatter (exact); one block per op, alike: check.h */
        crow r = {0};
        int done = 0;
        cbuf bdyp = {0};
        ok &= cb_out(c, &bdyp, dt, R * H, NULL) == 0;
        moex_unpermute_grad_args a = {cb_1d(&brm, R), cb_2d(&bdy, T, H), cb_2d(&bdyp, R, H)};
        C_RUN(c, &r, ok, moex_unpermute_backward_workspace_size, moex_unpermute_backward, &a, done);
        if (done) {
            double *dyp = c_doubles(R * H);
            ref_unpermute_backward(T, H, k, row_map, dy, dyp);
            c_compare(c, &r, "dyp", &bdyp, dyp, NULL, R * H, exact_model());
            free(dyp);
        }
        c_row(c, "unpermute_bwd", dt, shape, &r);
        cb_free(c, &bdyp);
    }
    cb_free(c, &bx); cb_free(c, &bids); cb_free(c, &bp); cb_free(c, &brm); cb_free(c, &bdxp); cb_free(c, &bdpp);
    cb_free(c, &bdy);
    free(ids); free(row_map); free(splits); free(x); free(probs); free(idsd); free(xp); free(probs_p);
    free(splitsd); free(rmd); free(dxp); free(dprobs_p); free(dy);
}

void check_routing(checker *c) {
    for (size_t i = 0; i < sizeof router_cases / sizeof router_cases[0]; i++) check_router_case(c, &router_cases[i]);
    for (size_t i = 0; i < sizeof perm_cases / sizeof perm_cases[0]; i++) check_perm_case(c, &perm_cases[i]);
}

/* ---- MoE layer ------------------------------------------------------------------------------ */

/* The fields kind .. dw_dt are mlp_case's (check_ops.c), and check_moe_case follows
 * check_mlp_case step by step: see the note there. */
typedef struct moe_case {
    int64_t T, H, E, F, k;
    moex_router_score score;
    moex_router_norm norm;
    moex_dtype dt;
    moex_glu_kind kind;
    moex_glu_layout layout;
    int b1;
    moex_bias_mode b2_mode;
    moex_grad_mode dw_mode;
    moex_dtype dw_dt;
} moe_case;

static const moe_case moe_cases[] = {
    {40, 32, 6, 32, 2, MOEX_ROUTER_SOFTMAX, MOEX_ROUTER_RENORM, MOEX_DTYPE_F32, MOEX_GLU_SWIGLU,
     MOEX_GLU_CONTIGUOUS, 1, MOEX_BIAS_SCALED, MOEX_GRAD_WRITE, MOEX_DTYPE_F32},
    {24, 16, 5, 32, 1, MOEX_ROUTER_SIGMOID, MOEX_ROUTER_NO_RENORM, MOEX_DTYPE_BF16, MOEX_GLU_CLAMPED_SWIGLU,
     MOEX_GLU_INTERLEAVED_32, 0, MOEX_BIAS_ADD, MOEX_GRAD_ACCUMULATE, MOEX_DTYPE_F32},
    {30, 24, 8, 20, 3, MOEX_ROUTER_SOFTMAX, MOEX_ROUTER_NO_RENORM, MOEX_DTYPE_BF16, MOEX_GLU_SWIGLU,
     MOEX_GLU_CONTIGUOUS, 0, MOEX_BIAS_NONE, MOEX_GRAD_WRITE, MOEX_DTYPE_BF16},
    {512, 64, 8, 64, 2, MOEX_ROUTER_SOFTMAX, MOEX_ROUTER_RENORM, MOEX_DTYPE_F32, MOEX_GLU_SWIGLU,
     MOEX_GLU_CONTIGUOUS, 1, MOEX_BIAS_NONE, MOEX_GRAD_WRITE, MOEX_DTYPE_F32},
};

/* Redraws rows of x until every token's k-th and (k+1)-th logits (in fp64, on the rounded
 * inputs) are at least 1e-3 apart, so f32 and fp64 agree on the chosen experts. */
static void clear_topk_ties(checker *c, const moe_case *mc, double *x, const double *rw) {
    const int64_t H = mc->H, E = mc->E, k = mc->k;
    if (k >= E) return;
    double l[256];
    for (int64_t t = 0; t < mc->T; t++) {
        for (int tries = 0; tries < 1000; tries++) {
            for (int64_t e = 0; e < E; e++) {
                double s = 0;
                for (int64_t h = 0; h < H; h++) s += x[t * H + h] * rw[e * H + h];
                l[e] = s;
            }
            /* the k-th largest and the (k+1)-th largest */
            double kth = -INFINITY, next = -INFINITY;
            for (int64_t e = 0; e < E; e++) {
                int64_t above = 0;
                for (int64_t f = 0; f < E; f++) above += l[f] > l[e] || (l[f] == l[e] && f < e);
                if (above == k - 1) kth = l[e];
                if (above == k) next = l[e];
            }
            if (kth - next >= 1e-3) break;
            c_uniform(c, x + t * H, H, -1, 1);
            ref_round_array(mc->dt, x + t * H, H);
        }
    }
}

static void check_moe_case(checker *c, const moe_case *mc) {   /* as check_mlp_case: see mlp_case */
    const int64_t T = mc->T, H = mc->H, E = mc->E, F = mc->F, k = mc->k;
    const moex_dtype dt = mc->dt;
    const int has_b2 = mc->b2_mode != MOEX_BIAS_NONE, acc = mc->dw_mode == MOEX_GRAD_ACCUMULATE;
    moex_glu_params glu = c_glu(mc->kind, mc->layout);
    char shape[96];
    snprintf(shape, sizeof shape, "T=%lld H=%lld E=%lld F=%lld k=%lld %s %s", (long long)T, (long long)H,
             (long long)E, (long long)F, (long long)k, mc->score == MOEX_ROUTER_SOFTMAX ? "softmax" : "sigmoid",
             c_glu_name(mc->kind));

    double *x = c_doubles(T * H), *rw = c_doubles(E * H), *w1 = c_doubles(E * 2 * F * H), *b1 = c_doubles(E * 2 * F);
    double *w2 = c_doubles(E * H * F), *b2 = c_doubles(E * H), *dy = c_doubles(T * H);
    c_uniform(c, x, T * H, -1, 1);
    c_uniform(c, rw, E * H, -3.0 / sqrt((double)H), 3.0 / sqrt((double)H));
    c_uniform(c, w1, E * 2 * F * H, -2.0 / sqrt((double)H), 2.0 / sqrt((double)H));
    c_uniform(c, b1, E * 2 * F, -0.5, 0.5);
    c_uniform(c, w2, E * H * F, -1.0 / sqrt((double)F), 1.0 / sqrt((double)F));
    c_uniform(c, b2, E * H, -0.5, 0.5);
    c_uniform(c, dy, T * H, -1, 1);
    ref_round_array(dt, x, T * H);
    ref_round_array(dt, rw, E * H);
    clear_topk_ties(c, mc, x, rw);

    cbuf bx = {0}, brw = {0}, bw1 = {0}, bb1 = {0}, bw2 = {0}, bb2 = {0}, bdy = {0}, by = {0};
    int ok = cb_in(c, &bx, dt, x, T * H) == 0 && cb_in(c, &brw, dt, rw, E * H) == 0 &&
             cb_in(c, &bw1, dt, w1, E * 2 * F * H) == 0 && cb_in(c, &bb1, MOEX_DTYPE_F32, b1, E * 2 * F) == 0 &&
             cb_in(c, &bw2, dt, w2, E * H * F) == 0 && cb_in(c, &bb2, dt, b2, E * H) == 0 &&
             cb_in(c, &bdy, dt, dy, T * H) == 0 && cb_out(c, &by, dt, T * H, NULL) == 0;
    ref_moe p = {T, H, E, F, k, x, rw, w1, mc->b1 ? b1 : NULL, w2, b2, mc->score, mc->norm, mc->b2_mode, glu};

    moex_moe_layer_args a;
    memset(&a, 0, sizeof a);
    a.x = cb_2d(&bx, T, H);
    a.router_w = cb_2d(&brw, E, H);
    a.topk = (int32_t)k;
    a.score = mc->score;
    a.norm = mc->norm;
    a.w1 = moex_weight_packed(cb_3d(&bw1, E, 2 * F, H));
    if (mc->b1) a.b1 = cb_2d(&bb1, E, 2 * F);
    a.w2 = moex_weight_packed(cb_3d(&bw2, E, H, F));
    a.b2_mode = mc->b2_mode;
    if (has_b2) a.b2 = cb_2d(&bb2, E, H);
    a.glu = glu;
    a.y = cb_2d(&by, T, H);
    size_t saved_bytes = 0;
    void *saved = NULL;
    int fwd_ok = 0;
    {
        crow r = {0};
        moex_status st = MOEX_OK;
        if (ok) st = moex_moe_layer_saved_size(c->ctx, &a, &saved_bytes);
        if (ok && st == MOEX_OK && saved_bytes) {
            saved = cli_mem_alloc(c->be, saved_bytes);
            ok = saved != NULL;
        }
        if (st != MOEX_OK) {
            c_call_failed(c, &r, "moex_moe_layer_saved_size", st);
            ok = 0;
        }
        a.saved = saved;
        a.saved_bytes = saved_bytes;
        int done = 0;
        if (st == MOEX_OK)
            C_RUN(c, &r, ok, moex_moe_layer_forward_workspace_size, moex_moe_layer_forward, &a, done);
        if (done) {
            double *y = c_doubles(T * H), *yb = c_doubles(T * H);
            ref_moe_layer_forward(&p, y, yb, NULL, NULL, NULL);
            ref_tol_model m = ref_tol_for(dt, dt, 1, (H > 2 * F ? H : 2 * F) + 8);
            c_compare(c, &r, "y", &by, y, yb, T * H, &m);
            fwd_ok = r.bad == 0;
            free(y);
            free(yb);
        }
        c_row(c, "moe_layer_fwd", dt, shape, &r);
    }
    {
        crow r = {0};
        cbuf bdx = {0}, bdrw = {0}, bdw1 = {0}, bdw2 = {0}, bdb1 = {0}, bdb2 = {0};
        double *rw0 = c_random(c, E * H, -1, 1), *w10 = c_random(c, E * 2 * F * H, -1, 1);
        double *w20 = c_random(c, E * H * F, -1, 1);
        int run_ok = ok && fwd_ok && cb_out(c, &bdx, dt, T * H, NULL) == 0 &&
                     cb_out(c, &bdrw, mc->dw_dt, E * H, acc ? rw0 : NULL) == 0 &&
                     cb_out(c, &bdw1, mc->dw_dt, E * 2 * F * H, acc ? w10 : NULL) == 0 &&
                     cb_out(c, &bdw2, mc->dw_dt, E * H * F, acc ? w20 : NULL) == 0 &&
                     cb_out(c, &bdb1, MOEX_DTYPE_F32, E * 2 * F, NULL) == 0 &&
                     cb_out(c, &bdb2, MOEX_DTYPE_F32, E * H, NULL) == 0;
        moex_moe_layer_grad_args g;
        memset(&g, 0, sizeof g);
        g.fwd = a;
        g.dy = cb_2d(&bdy, T, H);
        g.dx = cb_2d(&bdx, T, H);
        g.dw_mode = mc->dw_mode;
        g.drouter_w = cb_2d(&bdrw, E, H);
        g.dw1 = moex_weight_packed(cb_3d(&bdw1, E, 2 * F, H));
        g.dw2 = moex_weight_packed(cb_3d(&bdw2, E, H, F));
        if (mc->b1) g.db1 = cb_2d(&bdb1, E, 2 * F);
        if (has_b2) g.db2 = cb_2d(&bdb2, E, H);
        int done = 0;
        if (ok && !fwd_ok) {
            r.bad++;
            snprintf(r.note, sizeof r.note, "not run: the forward failed");
        } else {
            C_RUN(c, &r, run_ok, moex_moe_layer_backward_workspace_size, moex_moe_layer_backward, &g, done);
        }
        if (done) {
            ref_moe_grads o;
            memset(&o, 0, sizeof o);
            o.dx = c_doubles(T * H); o.dxb = c_doubles(T * H);
            o.drouter_w = c_doubles(E * H); o.drouter_wb = c_doubles(E * H);
            o.dw1 = c_doubles(E * 2 * F * H); o.dw1b = c_doubles(E * 2 * F * H);
            o.dw2 = c_doubles(E * H * F); o.dw2b = c_doubles(E * H * F);
            o.db1 = c_doubles(E * 2 * F); o.db1b = c_doubles(E * 2 * F);
            o.db2 = c_doubles(E * H); o.db2b = c_doubles(E * H);
            ref_moe_layer_backward(&p, dy, &o);
            /* the longest reduction on any gradient's path (rows of an expert <= T), plus 8
             * for the exps of the GLU and the router */
            int64_t kb = T > H ? T : H;
            if (2 * F > kb) kb = 2 * F;
            kb += 8;
            ref_tol_model mx = ref_tol_for(dt, dt, 1, kb);
            ref_tol_model mw = ref_tol_for(mc->dw_dt, dt, 1, kb);
            ref_tol_model mb = ref_tol_for(MOEX_DTYPE_F32, dt, 1, kb);
            c_compare(c, &r, "dx", &bdx, o.dx, o.dxb, T * H, &mx);
            c_compare_from(c, &r, "drouter_w", &bdrw, acc ? rw0 : NULL, o.drouter_w, o.drouter_wb, E * H, &mw);
            c_compare_from(c, &r, "dw1", &bdw1, acc ? w10 : NULL, o.dw1, o.dw1b, E * 2 * F * H, &mw);
            c_compare_from(c, &r, "dw2", &bdw2, acc ? w20 : NULL, o.dw2, o.dw2b, E * H * F, &mw);
            if (mc->b1) c_compare(c, &r, "db1", &bdb1, o.db1, o.db1b, E * 2 * F, &mb);
            if (has_b2) c_compare(c, &r, "db2", &bdb2, o.db2, o.db2b, E * H, &mb);
            free(o.dx); free(o.dxb); free(o.drouter_w); free(o.drouter_wb); free(o.dw1); free(o.dw1b);
            free(o.dw2); free(o.dw2b); free(o.db1); free(o.db1b); free(o.db2); free(o.db2b);
        }
        c_row(c, "moe_layer_bwd", dt, shape, &r);
        cb_free(c, &bdx); cb_free(c, &bdrw); cb_free(c, &bdw1); cb_free(c, &bdw2); cb_free(c, &bdb1);
        cb_free(c, &bdb2);
        free(rw0); free(w10); free(w20);
    }
    cli_mem_free(c->be, saved);
    cb_free(c, &bx); cb_free(c, &brw); cb_free(c, &bw1); cb_free(c, &bb1); cb_free(c, &bw2); cb_free(c, &bb2);
    cb_free(c, &bdy); cb_free(c, &by);
    free(x); free(rw); free(w1); free(b1); free(w2); free(b2); free(dy);
}

void check_moe_layer(checker *c) {
    for (size_t i = 0; i < sizeof moe_cases / sizeof moe_cases[0]; i++) check_moe_case(c, &moe_cases[i]);
}
