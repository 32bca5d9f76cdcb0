/*
 * test_permute.c - permute and unpermute on the CPU, forward and backward, against the
 * fp64 reference (ref_routing.h): splits, row_map and the copies exact, sums within the
 * tolerance model; k = 1, k = E, repeated experts in a token, experts that receive no
 * token (first, middle, last, all but one), every dtype, T = 0; the reference backward
 * against central differences of the reference forward; determinism across thread
 * counts; and argument errors, including ids outside [0, E) and row_map values outside
 * [0, T*k), which must fail before anything is written.
 */
#include "ref_routing.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static moex_context *ctx;

static const char *dt_name(moex_dtype dt) {
    return dt == MOEX_DTYPE_BF16 ? "bf16" : dt == MOEX_DTYPE_F16 ? "f16" : "f32";
}

/* How the ids of a case are drawn. */
typedef enum ids_kind {
    IDS_DISTINCT,       /* k distinct experts per token, as a router gives        */
    IDS_REPEATS,        /* any expert, repeats within a token allowed              */
    IDS_SKIP_SOME,      /* distinct, never experts 0, E/2 and E-1 (E >= k + 3)     */
    IDS_ONE_EXPERT      /* every row to one expert (k = 1)                         */
} ids_kind;

typedef struct perm_case {
    int64_t T, H, k, E;
    moex_dtype dt;
    ids_kind ids;
    int with_probs;
} perm_case;

static void make_ids(tu_rng *r, const perm_case *c, int32_t *ids) {
    const int64_t only = tu_randint(r, c->E);
    for (int64_t t = 0; t < c->T; t++) {
        for (int64_t j = 0; j < c->k; j++) {
            int32_t v;
            for (;;) {
                v = (int32_t)tu_randint(r, c->E);
                if (c->ids == IDS_ONE_EXPERT) v = (int32_t)only;
                if (c->ids == IDS_SKIP_SOME && (v == 0 || v == c->E / 2 || v == c->E - 1)) continue;
                int dup = 0;
                for (int64_t i = 0; i < j; i++) dup |= ids[t * c->k + i] == v;
                if (dup && (c->ids == IDS_DISTINCT || c->ids == IDS_SKIP_SOME)) continue;
                break;
            }
            ids[t * c->k + j] = v;
        }
    }
}

static moex_status lib_permute(const perm_case *c, void *x, int32_t *ids, float *probs, void *xp, float *probs_p,
                               int64_t *splits, int32_t *row_map) {
    const int64_t rows = c->T * c->k;
    moex_permute_args a = {0};
    a.x = moex_tensor_2d(x, c->dt, c->T, c->H);
    a.ids = moex_tensor_2d(ids, MOEX_DTYPE_I32, c->T, c->k);
    if (probs) a.probs = moex_tensor_2d(probs, MOEX_DTYPE_F32, c->T, c->k);
    a.num_experts = (int32_t)c->E;
    a.xp = moex_tensor_2d(xp, c->dt, rows, c->H);
    if (probs_p) a.probs_p = moex_tensor_1d(probs_p, MOEX_DTYPE_F32, rows);
    a.splits = moex_tensor_1d(splits, MOEX_DTYPE_I64, c->E);
    a.row_map = moex_tensor_1d(row_map, MOEX_DTYPE_I32, rows);
    size_t bytes = 0;
    moex_status st = moex_permute_forward_workspace_size(ctx, &a, &bytes);
    if (st != MOEX_OK) return st;
    void *ws = tu_workspace(bytes);
    st = moex_permute_forward(ctx, &a, ws, bytes, NULL);
    free(ws);
    return st;
}

static moex_status lib_permute_backward(const perm_case *c, int32_t *row_map, void *dxp, float *dprobs_p, void *dx,
                                        float *dprobs) {
    const int64_t rows = c->T * c->k;
    moex_permute_grad_args a = {0};
    a.row_map = moex_tensor_1d(row_map, MOEX_DTYPE_I32, rows);
    a.dxp = moex_tensor_2d(dxp, c->dt, rows, c->H);
    if (dprobs_p) a.dprobs_p = moex_tensor_1d(dprobs_p, MOEX_DTYPE_F32, rows);
    a.dx = moex_tensor_2d(dx, c->dt, c->T, c->H);
    if (dprobs) a.dprobs = moex_tensor_2d(dprobs, MOEX_DTYPE_F32, c->T, c->k);
    size_t bytes = 0;
    moex_status st = moex_permute_backward_workspace_size(ctx, &a, &bytes);
    if (st != MOEX_OK) return st;
    void *ws = tu_workspace(bytes);
    st = moex_permute_backward(ctx, &a, ws, bytes, NULL);
    free(ws);
    return st;
}

static moex_status lib_unpermute(const perm_case *c, int32_t *row_map, void *yp, void *y) {
    moex_unpermute_args a = {0};
    a.row_map = moex_tensor_1d(row_map, MOEX_DTYPE_I32, c->T * c->k);
    a.yp = moex_tensor_2d(yp, c->dt, c->T * c->k, c->H);
    a.y = moex_tensor_2d(y, c->dt, c->T, c->H);
    size_t bytes = 0;
    moex_status st = moex_unpermute_forward_workspace_size(ctx, &a, &bytes);
    if (st != MOEX_OK) return st;
    void *ws = tu_workspace(bytes);
    st = moex_unpermute_forward(ctx, &a, ws, bytes, NULL);
    free(ws);
    return st;
}

static moex_status lib_unpermute_backward(const perm_case *c, int32_t *row_map, void *dy, void *dyp) {
    moex_unpermute_grad_args a = {0};
    a.row_map = moex_tensor_1d(row_map, MOEX_DTYPE_I32, c->T * c->k);
    a.dy = moex_tensor_2d(dy, c->dt, c->T, c->H);
    a.dyp = moex_tensor_2d(dyp, c->dt, c->T * c->k, c->H);
    size_t bytes = 0;
    moex_status st = moex_unpermute_backward_workspace_size(ctx, &a, &bytes);
    if (st != MOEX_OK) return st;
    void *ws = tu_workspace(bytes);
    st = moex_unpermute_backward(ctx, &a, ws, bytes, NULL);
    free(ws);
    return st;
}

/* Index of the first differing element of two n-element buffers, or -1. */
static int64_t first_diff(const void *a, const void *b, int64_t n, size_t es) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp((const char *)a + (size_t)i * es, (const char *)b + (size_t)i * es, es) != 0) return i;
    return -1;
}

static void test_case(tu_rng *r, const perm_case *c) {
    char name[160], what[224];
    static const char *kinds[] = {"distinct", "repeats", "skip-some", "one-expert"};
    snprintf(name, sizeof name, "T%lld H%lld k%lld E%lld %s %s%s", (long long)c->T, (long long)c->H,
             (long long)c->k, (long long)c->E, dt_name(c->dt), kinds[c->ids], c->with_probs ? " probs" : "");
    const int64_t T = c->T, H = c->H, k = c->k, E = c->E, rows = T * k;
    const size_t es = moex_dtype_size(c->dt);

    int32_t *ids = (int32_t *)tu_alloc((size_t)(rows + 1) * sizeof(int32_t));
    make_ids(r, c, ids);
    double *x = tu_doubles(T * H), *p = tu_doubles(rows);
    tu_fill_uniform(r, x, T * H, -2, 2, c->dt);
    tu_fill_uniform(r, p, rows, 0, 1, MOEX_DTYPE_F32);
    void *xb = tu_buffer(c->dt, x, T * H);
    float *pb = (float *)tu_buffer(MOEX_DTYPE_F32, p, rows);

    /* ---- permute forward: everything exact ---- */
    void *xp = tu_alloc((size_t)(rows * H + 1) * es);
    float *probs_p = (float *)tu_alloc((size_t)(rows + 1) * sizeof(float));
    int64_t *splits = (int64_t *)tu_alloc((size_t)(E + 1) * sizeof(int64_t));
    int32_t *row_map = (int32_t *)tu_alloc((size_t)(rows + 1) * sizeof(int32_t));
    tu_poison(xp, (size_t)(rows * H) * es);
    tu_poison(probs_p, (size_t)rows * sizeof(float));
    tu_poison(splits, (size_t)E * sizeof(int64_t));
    tu_poison(row_map, (size_t)rows * sizeof(int32_t));
    CHECK_STATUS(ctx, lib_permute(c, xb, ids, c->with_probs ? pb : NULL, xp, c->with_probs ? probs_p : NULL,
                                  splits, row_map), MOEX_OK);
    int64_t *rs = (int64_t *)tu_alloc((size_t)(E + 1) * sizeof(int64_t));
    int32_t *rrm = (int32_t *)tu_alloc((size_t)(rows + 1) * sizeof(int32_t));
    double *rxp = tu_doubles(rows * H), *rpp = tu_doubles(rows);
    ref_permute_forward(T, H, k, E, ids, x, p, rs, rrm, rxp, rpp);
    CHECK_MSG(first_diff(splits, rs, E, sizeof(int64_t)) < 0, "%s: splits differ from the reference", name);
    CHECK_MSG(first_diff(row_map, rrm, rows, sizeof(int32_t)) < 0, "%s: row_map differs from the reference", name);
    void *rxpb = tu_buffer(c->dt, rxp, rows * H);
    CHECK_MSG(first_diff(xp, rxpb, rows * H, es) < 0, "%s: xp is not the exact copy", name);
    if (c->with_probs) {
        float *rppb = (float *)tu_buffer(MOEX_DTYPE_F32, rpp, rows);
        CHECK_MSG(first_diff(probs_p, rppb, rows, sizeof(float)) < 0, "%s: probs_p is not the exact copy", name);
        free(rppb);
    } else {
        CHECK_POISONED("probs_p without probs", MOEX_DTYPE_F32, probs_p, 0, rows);
    }
    int64_t empty = 0;
    for (int64_t e = 0; e < E; e++) empty += rs[e] == 0;
    tu_log("  %s: %lld empty experts\n", name, (long long)empty);
    if (c->ids == IDS_SKIP_SOME) CHECK_MSG(empty >= (E > 2 ? 2 : 1), "%s: expected empty experts", name);

    /* ---- permute backward ---- */
    double *dxp = tu_doubles(rows * H), *dpp = tu_doubles(rows);
    tu_fill_uniform(r, dxp, rows * H, -1, 1, c->dt);
    tu_fill_uniform(r, dpp, rows, -1, 1, MOEX_DTYPE_F32);
    void *dxpb = tu_buffer(c->dt, dxp, rows * H);
    float *dppb = (float *)tu_buffer(MOEX_DTYPE_F32, dpp, rows);
    void *dx = tu_alloc((size_t)(T * H + 1) * es);
    float *dprobs = (float *)tu_alloc((size_t)(rows + 1) * sizeof(float));
    tu_poison(dx, (size_t)(T * H) * es);
    tu_poison(dprobs, (size_t)rows * sizeof(float));
    CHECK_STATUS(ctx, lib_permute_backward(c, row_map, dxpb, c->with_probs ? dppb : NULL, dx,
                                           c->with_probs ? dprobs : NULL), MOEX_OK);
    double *rdx = tu_doubles(T * H), *rdxb = tu_doubles(T * H), *rdp = tu_doubles(rows);
    ref_permute_backward(T, H, k, rrm, dxp, NULL, dpp, rdx, rdxb, rdp);
    ref_tol_model m = ref_tol_for(c->dt, MOEX_DTYPE_F32, 0, k);
    snprintf(what, sizeof what, "%s: permute dx", name);
    CHECK_CLOSE(what, c->dt, dx, rdx, rdxb, T * H, H, &m);
    if (c->with_probs) {
        float *rdpb = (float *)tu_buffer(MOEX_DTYPE_F32, rdp, rows);
        CHECK_MSG(first_diff(dprobs, rdpb, rows, sizeof(float)) < 0, "%s: dprobs is not the exact gather", name);
        free(rdpb);
    }

    /* ---- unpermute forward and backward ---- */
    void *y = tu_alloc((size_t)(T * H + 1) * es);
    tu_poison(y, (size_t)(T * H) * es);
    CHECK_STATUS(ctx, lib_unpermute(c, row_map, dxpb, y), MOEX_OK);
    double *ry = tu_doubles(T * H), *ryb = tu_doubles(T * H);
    ref_unpermute_forward(T, H, k, rrm, dxp, NULL, ry, ryb);
    snprintf(what, sizeof what, "%s: unpermute y", name);
    CHECK_CLOSE(what, c->dt, y, ry, ryb, T * H, H, &m);
    void *dyp = tu_alloc((size_t)(rows * H + 1) * es);
    tu_poison(dyp, (size_t)(rows * H) * es);
    CHECK_STATUS(ctx, lib_unpermute_backward(c, row_map, xb, dyp), MOEX_OK);
    double *rdyp = tu_doubles(rows * H);
    ref_unpermute_backward(T, H, k, rrm, x, rdyp);
    void *rdypb = tu_buffer(c->dt, rdyp, rows * H);
    CHECK_MSG(first_diff(dyp, rdypb, rows * H, es) < 0, "%s: unpermute dyp is not the exact scatter", name);

    free(ids); free(x); free(p); free(xb); free(pb); free(xp); free(probs_p); free(splits); free(row_map);
    free(rs); free(rrm); free(rxp); free(rpp); free(rxpb); free(dxp); free(dpp); free(dxpb); free(dppb);
    free(dx); free(dprobs); free(rdx); free(rdxb); free(rdp); free(y); free(ry); free(ryb); free(dyp);
    free(rdyp); free(rdypb);
}

/* The reference backward of permute (x and probs) and of unpermute against central
 * differences of the reference forward: sum(dxp * xp) + sum(dpp * probs_p) and sum(dy * y). */
static void test_reference_fd(tu_rng *r) {
    const perm_case c = {.T = 7, .H = 3, .k = 3, .E = 5, .dt = MOEX_DTYPE_F32, .ids = IDS_REPEATS, .with_probs = 1};
    const int64_t T = c.T, H = c.H, k = c.k, E = c.E, rows = T * k;
    int32_t *ids = (int32_t *)tu_alloc((size_t)rows * sizeof(int32_t)), *rm = (int32_t *)tu_alloc((size_t)rows * 4);
    int64_t *splits = (int64_t *)tu_alloc((size_t)E * sizeof(int64_t));
    make_ids(r, &c, ids);
    double *x = tu_doubles(T * H), *p = tu_doubles(rows), *xp = tu_doubles(rows * H), *pp = tu_doubles(rows);
    double *dxp = tu_doubles(rows * H), *dpp = tu_doubles(rows), *dx = tu_doubles(T * H), *dp = tu_doubles(rows);
    for (int64_t i = 0; i < T * H; i++) x[i] = tu_uniform_range(r, -1, 1);
    for (int64_t i = 0; i < rows; i++) p[i] = tu_uniform(r);
    for (int64_t i = 0; i < rows * H; i++) dxp[i] = tu_uniform_range(r, -1, 1);
    for (int64_t i = 0; i < rows; i++) dpp[i] = tu_uniform_range(r, -1, 1);
    ref_permute_forward(T, H, k, E, ids, x, p, splits, rm, xp, pp);
    ref_permute_backward(T, H, k, rm, dxp, NULL, dpp, dx, NULL, dp);

    const double eps = 1e-3;   /* the forward is linear: differences are exact up to rounding */
    double worst = 0;
    for (int64_t v = 0; v < T * H + rows; v++) {
        double *var = v < T * H ? &x[v] : &p[v - T * H], keep = *var, lv[2];
        for (int s = 0; s < 2; s++) {
            *var = keep + (s ? -eps : eps);
            ref_permute_forward(T, H, k, E, ids, x, p, splits, rm, xp, pp);
            double l = 0;
            for (int64_t i = 0; i < rows * H; i++) l += dxp[i] * xp[i];
            for (int64_t i = 0; i < rows; i++) l += dpp[i] * pp[i];
            lv[s] = l;
        }
        *var = keep;
        double fd = (lv[0] - lv[1]) / (2 * eps), an = v < T * H ? dx[v] : dp[v - T * H];
        worst = fmax(worst, fabs(fd - an) / (1e-10 + 1e-9 * fabs(an)));
    }
    CHECK_MSG(worst <= 1.0, "permute: reference backward vs central differences: worst err/tol %.3g", worst);

    /* unpermute: d sum(dy * y) / d yp = unpermute_backward(dy) */
    double *yp = tu_doubles(rows * H), *y = tu_doubles(T * H), *dy = tu_doubles(T * H), *dyp = tu_doubles(rows * H);
    for (int64_t i = 0; i < rows * H; i++) yp[i] = tu_uniform_range(r, -1, 1);
    for (int64_t i = 0; i < T * H; i++) dy[i] = tu_uniform_range(r, -1, 1);
    ref_unpermute_backward(T, H, k, rm, dy, dyp);
    double worst_u = 0;
    for (int64_t v = 0; v < rows * H; v++) {
        double keep = yp[v], lv[2];
        for (int s = 0; s < 2; s++) {
            yp[v] = keep + (s ? -eps : eps);
            ref_unpermute_forward(T, H, k, rm, yp, NULL, y, NULL);
            double l = 0;
            for (int64_t i = 0; i < T * H; i++) l += dy[i] * y[i];
            lv[s] = l;
        }
        yp[v] = keep;
        double fd = (lv[0] - lv[1]) / (2 * eps);
        worst_u = fmax(worst_u, fabs(fd - dyp[v]) / (1e-10 + 1e-9 * fabs(dyp[v])));
    }
    CHECK_MSG(worst_u <= 1.0, "unpermute: reference backward vs central differences: worst err/tol %.3g", worst_u);
    free(ids); free(rm); free(splits); free(x); free(p); free(xp); free(pp); free(dxp); free(dpp); free(dx);
    free(dp); free(yp); free(y); free(dy); free(dyp);
}

/* Bad ids and row_map values fail before anything is written; shape errors are named. */
static void test_errors(void) {
    const perm_case c = {.T = 3, .H = 4, .k = 2, .E = 4, .dt = MOEX_DTYPE_F32, .ids = IDS_DISTINCT, .with_probs = 1};
    float x[12] = {0}, probs[6] = {0}, xp[24], probs_p[6], dxp[24] = {0}, dx[12], dprobs[6];
    int64_t splits[4];
    int32_t row_map[6];
    const int32_t bad[][6] = {{0, 1, 2, 3, 1, -1}, {0, 4, 1, 2, 3, 0}, {(int32_t)0x80000000, 0, 1, 2, 3, 0}};
    for (int v = 0; v < 3; v++) {
        int32_t ids[6];
        memcpy(ids, bad[v], sizeof ids);
        tu_poison(xp, sizeof xp);
        tu_poison(probs_p, sizeof probs_p);
        tu_poison(splits, sizeof splits);
        tu_poison(row_map, sizeof row_map);
        CHECK_STATUS(ctx, lib_permute(&c, x, ids, probs, xp, probs_p, splits, row_map), MOEX_ERR_INVALID_ARG);
        CHECK_MSG_HAS(ctx, "ids[");
        CHECK_POISONED("xp after bad ids", MOEX_DTYPE_F32, xp, 0, 24);
        CHECK_POISONED("probs_p after bad ids", MOEX_DTYPE_F32, probs_p, 0, 6);
        CHECK_POISONED("splits after bad ids", MOEX_DTYPE_I64, splits, 0, 4);
        CHECK_POISONED("row_map after bad ids", MOEX_DTYPE_I32, row_map, 0, 6);
    }
    const int32_t bad_rm[][6] = {{0, 1, 2, 3, 4, 6}, {-1, 1, 2, 3, 4, 5}};
    for (int v = 0; v < 2; v++) {
        int32_t rm[6];
        memcpy(rm, bad_rm[v], sizeof rm);
        tu_poison(dx, sizeof dx);
        tu_poison(dprobs, sizeof dprobs);
        CHECK_STATUS(ctx, lib_permute_backward(&c, rm, dxp, probs, dx, dprobs), MOEX_ERR_INVALID_ARG);
        CHECK_MSG_HAS(ctx, "row_map");
        CHECK_POISONED("dx after bad row_map", MOEX_DTYPE_F32, dx, 0, 12);
        CHECK_POISONED("dprobs after bad row_map", MOEX_DTYPE_F32, dprobs, 0, 6);
        CHECK_STATUS(ctx, lib_unpermute(&c, rm, dxp, dx), MOEX_ERR_INVALID_ARG);
        CHECK_POISONED("y after bad row_map", MOEX_DTYPE_F32, dx, 0, 12);
        tu_poison(xp, sizeof xp);
        CHECK_STATUS(ctx, lib_unpermute_backward(&c, rm, x, xp), MOEX_ERR_INVALID_ARG);
        CHECK_POISONED("dyp after bad row_map", MOEX_DTYPE_F32, xp, 0, 24);
    }

    /* unpermute backward scatters: a row_map with a repeated row is refused */
    int32_t dup[6] = {0, 1, 2, 3, 3, 5};
    tu_poison(xp, sizeof xp);
    CHECK_STATUS(ctx, lib_unpermute_backward(&c, dup, x, xp), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "permutation");
    CHECK_POISONED("dyp after a repeated row", MOEX_DTYPE_F32, xp, 0, 24);

    /* argument errors */
    int32_t ids[6] = {0, 1, 2, 3, 1, 0};
    moex_permute_args a = {0};
    a.x = moex_tensor_2d(x, MOEX_DTYPE_F32, 3, 4);
    a.ids = moex_tensor_2d(ids, MOEX_DTYPE_I32, 3, 2);
    a.probs = moex_tensor_2d(probs, MOEX_DTYPE_F32, 3, 2);
    a.num_experts = 4;
    a.xp = moex_tensor_2d(xp, MOEX_DTYPE_F32, 6, 4);
    a.probs_p = moex_tensor_1d(probs_p, MOEX_DTYPE_F32, 6);
    a.splits = moex_tensor_1d(splits, MOEX_DTYPE_I64, 4);
    a.row_map = moex_tensor_1d(row_map, MOEX_DTYPE_I32, 6);
    size_t bytes;
    CHECK_STATUS(ctx, moex_permute_forward_workspace_size(ctx, &a, &bytes), MOEX_OK);
    moex_permute_args b = a;
    b.num_experts = 0;
    CHECK_STATUS(ctx, moex_permute_forward_workspace_size(ctx, &b, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "num_experts");
    b = a;
    b.splits = moex_tensor_1d(splits, MOEX_DTYPE_I64, 3);
    CHECK_STATUS(ctx, moex_permute_forward_workspace_size(ctx, &b, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "splits");
    b = a;
    b.xp = moex_tensor_2d(xp, MOEX_DTYPE_BF16, 6, 4);
    CHECK_STATUS(ctx, moex_permute_forward_workspace_size(ctx, &b, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "xp");
    b = a;
    b.probs = (moex_tensor){0};
    CHECK_STATUS(ctx, moex_permute_forward_workspace_size(ctx, &b, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "probs_p");
    b = a;
    b.probs_p = (moex_tensor){0};
    CHECK_STATUS(ctx, moex_permute_forward_workspace_size(ctx, &b, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "probs_p");
    b = a;
    b.row_map = moex_tensor_1d(row_map, MOEX_DTYPE_I64, 6);
    CHECK_STATUS(ctx, moex_permute_forward_workspace_size(ctx, &b, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "row_map");
    /* T*k past INT32_MAX (shapes only: validation fails before any data is read) */
    b = a;
    b.x = moex_tensor_2d(x, MOEX_DTYPE_F32, (int64_t)1 << 20, 4);
    b.ids = moex_tensor_2d(ids, MOEX_DTYPE_I32, (int64_t)1 << 20, 4096);
    CHECK_STATUS(ctx, moex_permute_forward_workspace_size(ctx, &b, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "I32");

    moex_permute_grad_args g = {0};
    g.row_map = moex_tensor_1d(row_map, MOEX_DTYPE_I32, 5);   /* not a multiple of T = 3 */
    g.dxp = moex_tensor_2d(dxp, MOEX_DTYPE_F32, 5, 4);
    g.dx = moex_tensor_2d(dx, MOEX_DTYPE_F32, 3, 4);
    CHECK_STATUS(ctx, moex_permute_backward_workspace_size(ctx, &g, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "row_map");
    g.row_map = moex_tensor_1d(row_map, MOEX_DTYPE_I32, 6);
    g.dxp = moex_tensor_2d(dxp, MOEX_DTYPE_F32, 6, 4);
    g.dprobs = moex_tensor_2d(dprobs, MOEX_DTYPE_F32, 3, 2);   /* without dprobs_p */
    CHECK_STATUS(ctx, moex_permute_backward_workspace_size(ctx, &g, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "dprobs_p");
    g.dprobs_p = moex_tensor_1d(probs_p, MOEX_DTYPE_F32, 6);
    g.dx = moex_tensor_2d(dx, MOEX_DTYPE_BF16, 3, 4);          /* dtype of dxp */
    CHECK_STATUS(ctx, moex_permute_backward_workspace_size(ctx, &g, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "dxp");

    moex_unpermute_args u = {0};
    u.row_map = moex_tensor_1d(row_map, MOEX_DTYPE_I32, 6);
    u.yp = moex_tensor_2d(xp, MOEX_DTYPE_F32, 6, 3);           /* H mismatch */
    u.y = moex_tensor_2d(dx, MOEX_DTYPE_F32, 3, 4);
    CHECK_STATUS(ctx, moex_unpermute_forward_workspace_size(ctx, &u, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "yp");
    moex_unpermute_grad_args ug = {0};
    ug.row_map = moex_tensor_1d(row_map, MOEX_DTYPE_I32, 6);
    ug.dy = moex_tensor_2d(dx, MOEX_DTYPE_F32, 3, 4);
    CHECK_STATUS(ctx, moex_unpermute_backward_workspace_size(ctx, &ug, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "dyp");
}

/* Bitwise the same results with 1 thread and with several. */
static void test_threads(tu_rng *r) {
    const perm_case c = {.T = 513, .H = 40, .k = 3, .E = 9, .dt = MOEX_DTYPE_BF16, .ids = IDS_DISTINCT,
                         .with_probs = 1};
    const int64_t rows = c.T * c.k;
    int32_t *ids = (int32_t *)tu_alloc((size_t)rows * sizeof(int32_t));
    make_ids(r, &c, ids);
    double *x = tu_doubles(c.T * c.H), *p = tu_doubles(rows);
    tu_fill_uniform(r, x, c.T * c.H, -1, 1, c.dt);
    tu_fill_uniform(r, p, rows, 0, 1, MOEX_DTYPE_F32);
    void *xb = tu_buffer(c.dt, x, c.T * c.H);
    float *pb = (float *)tu_buffer(MOEX_DTYPE_F32, p, rows);
    void *xp[2], *dx[2];
    float *pp[2];
    int64_t *sp[2];
    int32_t *rm[2];
    for (int v = 0; v < 2; v++) {
        moex_context_set_num_threads(ctx, v ? 6 : 1);
        xp[v] = tu_alloc((size_t)(rows * c.H) * 2);
        pp[v] = (float *)tu_alloc((size_t)rows * sizeof(float));
        sp[v] = (int64_t *)tu_alloc((size_t)c.E * sizeof(int64_t));
        rm[v] = (int32_t *)tu_alloc((size_t)rows * sizeof(int32_t));
        dx[v] = tu_alloc((size_t)(c.T * c.H) * 2);
        CHECK_STATUS(ctx, lib_permute(&c, xb, ids, pb, xp[v], pp[v], sp[v], rm[v]), MOEX_OK);
        CHECK_STATUS(ctx, lib_unpermute(&c, rm[v], xp[v], dx[v]), MOEX_OK);
    }
    CHECK_MSG(memcmp(xp[0], xp[1], (size_t)(rows * c.H) * 2) == 0 && memcmp(rm[0], rm[1], (size_t)rows * 4) == 0 &&
                  memcmp(dx[0], dx[1], (size_t)(c.T * c.H) * 2) == 0,
              "permute/unpermute: 1 thread and 6 threads differ");
    for (int v = 0; v < 2; v++) {
        free(xp[v]); free(pp[v]); free(sp[v]); free(rm[v]); free(dx[v]);
    }
    free(ids); free(x); free(p); free(xb); free(pb);
}

int main(void) {
    ctx = tu_cpu_context();
    tu_rng r = tu_rng_seed(77);
    const moex_dtype dts[3] = {MOEX_DTYPE_F32, MOEX_DTYPE_BF16, MOEX_DTYPE_F16};
    const perm_case shapes[] = {
        {.T = 37, .H = 24, .k = 2, .E = 8, .ids = IDS_DISTINCT, .with_probs = 1},
        {.T = 23, .H = 7, .k = 1, .E = 5, .ids = IDS_DISTINCT, .with_probs = 1},
        {.T = 19, .H = 5, .k = 4, .E = 4, .ids = IDS_DISTINCT, .with_probs = 1},  /* k = E */
        {.T = 31, .H = 9, .k = 3, .E = 6, .ids = IDS_REPEATS, .with_probs = 1},
        {.T = 29, .H = 13, .k = 2, .E = 9, .ids = IDS_SKIP_SOME, .with_probs = 1},
        {.T = 17, .H = 6, .k = 1, .E = 7, .ids = IDS_ONE_EXPERT, .with_probs = 1},
        {.T = 11, .H = 3, .k = 2, .E = 1, .ids = IDS_REPEATS},                    /* E = 1, no probs */
        {.T = 1, .H = 1, .k = 1, .E = 3, .ids = IDS_DISTINCT, .with_probs = 1},
        {.T = 0, .H = 8, .k = 2, .E = 4, .ids = IDS_DISTINCT, .with_probs = 1},   /* T = 0 */
        {.T = 200, .H = 65, .k = 3, .E = 16, .ids = IDS_SKIP_SOME},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int d = 0; d < 3; d++) {
            perm_case c = shapes[s];
            c.dt = dts[d];
            test_case(&r, &c);
        }
    test_reference_fd(&r);
    test_errors();
    test_threads(&r);
    moex_context_destroy(ctx);
    return tu_finish();
}
