/*
 * test_router.c - the top-k router on the CPU against the fp64 reference (ref_routing.h):
 * softmax and sigmoid scores, with and without renormalisation, k = 1, k = E, exact ties
 * (broken toward the lower expert index), f32 and bf16 logits, T = 0; the backward against
 * the reference, whose own backward is checked against central differences of its forward
 * in fp64; determinism; and argument errors, including ids outside [0, E) in the backward
 * (which must fail before dlogits is written); sigmoid + renorm where every chosen sigmoid
 * underflows in f32 (probs the limit, not 0/0).
 */
#include "ref_routing.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static moex_context *ctx;

typedef struct router_case {
    int64_t T, E, k;
    moex_router_score score;
    moex_router_norm norm;
    moex_dtype dt;          /* logits dtype */
    int grid;               /* logits on a coarse grid: many exact ties */
} router_case;

static const char *score_name(moex_router_score s) { return s == MOEX_ROUTER_SIGMOID ? "sigmoid" : "softmax"; }

static void describe(char *buf, size_t n, const router_case *c) {
    snprintf(buf, n, "T%lld E%lld k%lld %s %s %s%s", (long long)c->T, (long long)c->E, (long long)c->k,
             score_name(c->score), c->norm == MOEX_ROUTER_RENORM ? "renorm" : "no-renorm",
             c->dt == MOEX_DTYPE_BF16 ? "bf16" : "f32", c->grid ? " ties" : "");
}

/* Logits in [-4, 4]: on a grid of 1/8 (exact in bf16, many ties), or continuous. */
static void make_logits(tu_rng *r, const router_case *c, double *l) {
    for (int64_t i = 0; i < c->T * c->E; i++)
        l[i] = c->grid ? (double)(tu_randint(r, 65) - 32) / 8.0 : tu_uniform_range(r, -4, 4);
    ref_round_array(c->dt, l, c->T * c->E);
}

/* Runs the library forward; returns its status. */
static moex_status lib_forward(const router_case *c, void *logits, float *probs, int32_t *ids) {
    moex_router_args a = {0};
    a.logits = moex_tensor_2d(logits, c->dt, c->T, c->E);
    a.topk = (int32_t)c->k;
    a.score = c->score;
    a.norm = c->norm;
    a.probs = moex_tensor_2d(probs, MOEX_DTYPE_F32, c->T, c->k);
    a.ids = moex_tensor_2d(ids, MOEX_DTYPE_I32, c->T, c->k);
    size_t bytes = 0;
    moex_status st = moex_router_forward_workspace_size(ctx, &a, &bytes);
    if (st != MOEX_OK) return st;
    void *ws = tu_workspace(bytes);
    st = moex_router_forward(ctx, &a, ws, bytes, NULL);
    free(ws);
    return st;
}

static moex_status lib_backward(const router_case *c, void *logits, int32_t *ids, float *dprobs, void *dlogits) {
    moex_router_grad_args a = {0};
    a.logits = moex_tensor_2d(logits, c->dt, c->T, c->E);
    a.topk = (int32_t)c->k;
    a.score = c->score;
    a.norm = c->norm;
    a.ids = moex_tensor_2d(ids, MOEX_DTYPE_I32, c->T, c->k);
    a.dprobs = moex_tensor_2d(dprobs, MOEX_DTYPE_F32, c->T, c->k);
    a.dlogits = moex_tensor_2d(dlogits, c->dt, c->T, c->E);
    size_t bytes = 0;
    moex_status st = moex_router_backward_workspace_size(ctx, &a, &bytes);
    if (st != MOEX_OK) return st;
    void *ws = tu_workspace(bytes);
    st = moex_router_backward(ctx, &a, ws, bytes, NULL);
    free(ws);
    return st;
}

/* Forward and backward of one case against the reference. */
static void test_case(tu_rng *r, const router_case *c) {
    char name[128], what[192];
    describe(name, sizeof name, c);
    const int64_t T = c->T, E = c->E, k = c->k;
    double *l = tu_doubles(T * E), *rp = tu_doubles(T * k), *dq = tu_doubles(T * k);
    double *rdl = tu_doubles(T * E), *rdlb = tu_doubles(T * E);
    int32_t *rids = (int32_t *)tu_alloc((size_t)(T * k + 1) * sizeof(int32_t));
    make_logits(r, c, l);
    void *logits = tu_buffer(c->dt, l, T * E);
    float *probs = (float *)tu_alloc((size_t)(T * k + 1) * sizeof(float));
    int32_t *ids = (int32_t *)tu_alloc((size_t)(T * k + 1) * sizeof(int32_t));
    tu_poison(probs, (size_t)(T * k) * sizeof(float));
    tu_poison(ids, (size_t)(T * k) * sizeof(int32_t));

    CHECK_STATUS(ctx, lib_forward(c, logits, probs, ids), MOEX_OK);
    ref_router_forward(T, E, k, c->score, c->norm, l, rp, rids);
    int64_t id_bad = 0;
    for (int64_t i = 0; i < T * k; i++) id_bad += ids[i] != rids[i];
    CHECK_MSG(id_bad == 0, "%s: %lld of %lld ids differ from the reference", name, (long long)id_bad,
              (long long)(T * k));
    /* f32 scores: exp, a sum over E and a division, then the renormalising sum over k */
    ref_tol_model m = ref_tol_for(MOEX_DTYPE_F32, MOEX_DTYPE_F32, 0, E + k + 16);
    snprintf(what, sizeof what, "%s: probs", name);
    CHECK_CLOSE(what, MOEX_DTYPE_F32, probs, rp, NULL, T * k, k, &m);
    if (c->norm == MOEX_ROUTER_RENORM) {   /* each token's probs sum to 1 */
        int64_t bad = 0;
        for (int64_t t = 0; t < T; t++) {
            double s = 0;
            for (int64_t j = 0; j < k; j++) s += probs[t * k + j];
            bad += fabs(s - 1.0) > 1e-6;
        }
        CHECK_MSG(bad == 0, "%s: %lld tokens' renormalised probs do not sum to 1", name, (long long)bad);
    }

    /* backward with the forward's ids */
    tu_fill_uniform(r, dq, T * k, -1, 1, MOEX_DTYPE_F32);
    float *dprobs = (float *)tu_buffer(MOEX_DTYPE_F32, dq, T * k);
    void *dlogits = tu_alloc((size_t)(T * E + 1) * moex_dtype_size(c->dt));
    tu_poison(dlogits, (size_t)(T * E) * moex_dtype_size(c->dt));
    CHECK_STATUS(ctx, lib_backward(c, logits, ids, dprobs, dlogits), MOEX_OK);
    ref_router_backward(T, E, k, c->score, c->norm, l, rids, dq, NULL, rdl, rdlb);
    ref_tol_model mb = ref_tol_for(c->dt, MOEX_DTYPE_F32, 0, E + k + 16);
    snprintf(what, sizeof what, "%s: dlogits", name);
    CHECK_CLOSE(what, c->dt, dlogits, rdl, rdlb, T * E, E, &mb);

    /* determinism: a second run gives the same bits */
    float *probs2 = (float *)tu_alloc((size_t)(T * k + 1) * sizeof(float));
    int32_t *ids2 = (int32_t *)tu_alloc((size_t)(T * k + 1) * sizeof(int32_t));
    void *dlogits2 = tu_alloc((size_t)(T * E + 1) * moex_dtype_size(c->dt));
    CHECK_STATUS(ctx, lib_forward(c, logits, probs2, ids2), MOEX_OK);
    CHECK_STATUS(ctx, lib_backward(c, logits, ids, dprobs, dlogits2), MOEX_OK);
    CHECK_MSG(memcmp(probs, probs2, (size_t)(T * k) * sizeof(float)) == 0 &&
                  memcmp(ids, ids2, (size_t)(T * k) * sizeof(int32_t)) == 0 &&
                  memcmp(dlogits, dlogits2, (size_t)(T * E) * moex_dtype_size(c->dt)) == 0,
              "%s: a second run differs", name);

    free(l); free(rp); free(dq); free(rdl); free(rdlb); free(rids); free(logits); free(probs); free(ids);
    free(dprobs); free(dlogits); free(probs2); free(ids2); free(dlogits2);
}

/* The reference backward against central differences of the reference forward (fp64),
 * with continuous logits so that no step changes the choice of experts. */
static void test_reference_fd(tu_rng *r, const router_case *c) {
    char name[128];
    describe(name, sizeof name, c);
    const int64_t T = c->T, E = c->E, k = c->k;
    double *l = tu_doubles(T * E), *dq = tu_doubles(T * k), *dl = tu_doubles(T * E);
    double *p = tu_doubles(T * k), *pp = tu_doubles(T * k), *pm = tu_doubles(T * k);
    int32_t *ids = (int32_t *)tu_alloc((size_t)(T * k + 1) * sizeof(int32_t));
    int32_t *idp = (int32_t *)tu_alloc((size_t)(T * k + 1) * sizeof(int32_t));
    for (int64_t i = 0; i < T * E; i++) l[i] = tu_uniform_range(r, -3, 3);
    for (int64_t i = 0; i < T * k; i++) dq[i] = tu_uniform_range(r, -1, 1);
    ref_router_forward(T, E, k, c->score, c->norm, l, p, ids);
    ref_router_backward(T, E, k, c->score, c->norm, l, ids, dq, NULL, dl, NULL);
    const double eps = 1e-6;
    double worst = 0;
    int64_t flips = 0;
    for (int64_t i = 0; i < T * E; i++) {
        double keep = l[i], lp = 0, lm = 0;
        l[i] = keep + eps;
        ref_router_forward(T, E, k, c->score, c->norm, l, pp, idp);
        flips += memcmp(ids, idp, (size_t)(T * k) * sizeof(int32_t)) != 0;
        l[i] = keep - eps;
        ref_router_forward(T, E, k, c->score, c->norm, l, pm, idp);
        flips += memcmp(ids, idp, (size_t)(T * k) * sizeof(int32_t)) != 0;
        l[i] = keep;
        for (int64_t j = 0; j < T * k; j++) {
            lp += dq[j] * pp[j];
            lm += dq[j] * pm[j];
        }
        double fd = (lp - lm) / (2 * eps);
        double err = fabs(fd - dl[i]) / (1e-7 + 1e-6 * fabs(dl[i]));
        if (err > worst) worst = err;
    }
    CHECK_MSG(flips == 0, "%s: a finite-difference step changed the routing (%lld)", name, (long long)flips);
    CHECK_MSG(worst <= 1.0, "%s: reference dlogits vs central differences: worst err/tol %.3g", name, worst);
    tu_log("  %s: reference FD worst err/tol %.3g\n", name, worst);
    free(l); free(dq); free(dl); free(p); free(pp); free(pm); free(ids); free(idp);
}

/* Hand-made ties: equal logits choose the lower index, in both score functions. */
static void test_ties(void) {
    const float l[2 * 6] = {1, 3, 3, 0, 3, -1,      /* three-way tie for the top    */
                            2, 2, 2, 2, 2, 2};      /* all equal: ids 0, 1, 2       */
    const int32_t want[2 * 3] = {1, 2, 4, 0, 1, 2};
    for (int s = 0; s < 2; s++) {
        router_case c = {.T = 2, .E = 6, .k = 3, .score = s ? MOEX_ROUTER_SIGMOID : MOEX_ROUTER_SOFTMAX,
                         .norm = MOEX_ROUTER_RENORM, .dt = MOEX_DTYPE_F32, .grid = 1};
        float probs[6];
        int32_t ids[6];
        CHECK_STATUS(ctx, lib_forward(&c, (void *)l, probs, ids), MOEX_OK);
        CHECK_MSG(memcmp(ids, want, sizeof want) == 0, "%s ties: ids %d %d %d / %d %d %d", score_name(c.score),
                  ids[0], ids[1], ids[2], ids[3], ids[4], ids[5]);
        CHECK_MSG(probs[0] == probs[1] && probs[1] == probs[2] && fabsf(probs[3] - 1.0f / 3) < 1e-7f,
                  "%s ties: probs %g %g %g / %g", score_name(c.score), probs[0], probs[1], probs[2], probs[3]);
    }
}

/* A NaN logit ranks below every number (as on the GPU), wherever it stands in the row. */
static void test_nan(void) {
    const float l[2 * 3] = {NAN, 1, 2, 1, NAN, 2};
    router_case c = {.T = 2, .E = 3, .k = 2, .score = MOEX_ROUTER_SIGMOID, .norm = MOEX_ROUTER_NO_RENORM,
                     .dt = MOEX_DTYPE_F32, .grid = 1};
    float probs[4];
    int32_t ids[4];
    CHECK_STATUS(ctx, lib_forward(&c, (void *)l, probs, ids), MOEX_OK);
    CHECK_MSG(ids[0] == 2 && ids[1] == 1 && ids[2] == 2 && ids[3] == 0, "NaN logits: ids %d %d / %d %d", ids[0],
              ids[1], ids[2], ids[3]);
    CHECK_MSG(!isnan(probs[0]) && !isnan(probs[1]) && !isnan(probs[2]) && !isnan(probs[3]),
              "NaN logits: the chosen probs are the finite ones");
}

/* k = 1 with renormalisation: probs are 1 and the gradient to the logits is exactly 0. */
static void test_k1_renorm_zero_grad(tu_rng *r) {
    router_case c = {.T = 9, .E = 5, .k = 1, .score = MOEX_ROUTER_SOFTMAX, .norm = MOEX_ROUTER_RENORM,
                     .dt = MOEX_DTYPE_F32};
    double l[45], dq[9];
    make_logits(r, &c, l);
    tu_fill_uniform(r, dq, 9, -1, 1, MOEX_DTYPE_F32);
    float *logits = (float *)tu_buffer(MOEX_DTYPE_F32, l, 45), *dprobs = (float *)tu_buffer(MOEX_DTYPE_F32, dq, 9);
    float probs[9], dl[45];
    int32_t ids[9];
    CHECK_STATUS(ctx, lib_forward(&c, logits, probs, ids), MOEX_OK);
    CHECK_STATUS(ctx, lib_backward(&c, logits, ids, dprobs, dl), MOEX_OK);
    int bad = 0;
    for (int i = 0; i < 9; i++) bad += probs[i] != 1.0f;
    for (int i = 0; i < 45; i++) bad += dl[i] != 0.0f;
    CHECK_MSG(bad == 0, "k = 1 renorm: probs must be 1 and dlogits 0 (%d bad)", bad);
    free(logits);
    free(dprobs);
}

/* SIGMOID + RENORM where every chosen sigmoid underflows in f32 (logits below about -88):
 * probs_j = s_j / sum s is 0/0 written naively; the router must give the limit, the softmax
 * of the chosen log-sigmoids (for such logits e^(l_j - l_max) / sum e^(l_i - l_max)), and a
 * finite backward. E = 1, k = 1 gives prob 1 and dlogits 0 at any logit. */
static void test_sigmoid_renorm_tiny(void) {
    const float one[3] = {-100.0f, -1000.0f, -1e30f};
    for (int v = 0; v < 3; v++) {
        router_case c = {.T = 1, .E = 1, .k = 1, .score = MOEX_ROUTER_SIGMOID, .norm = MOEX_ROUTER_RENORM,
                         .dt = MOEX_DTYPE_F32};
        float probs[1] = {0}, dq[1] = {0.75f}, dl[1] = {NAN};
        int32_t ids[1] = {-1};
        CHECK_STATUS(ctx, lib_forward(&c, (void *)&one[v], probs, ids), MOEX_OK);
        CHECK_STATUS(ctx, lib_backward(&c, (void *)&one[v], ids, dq, dl), MOEX_OK);
        CHECK_MSG(ids[0] == 0 && probs[0] == 1.0f && dl[0] == 0.0f,
                  "sigmoid renorm E1 k1 logit %g: id %d prob %g dlogit %g (want 0, 1, 0)", one[v], ids[0], probs[0],
                  dl[0]);
    }
    /* E = 4, k = 2: every f32 sigmoid is 0 (a tie: experts 0 and 1 by the lower index), and the
     * renormalised probs of logits -95 and -97 are sigmoid(2) and sigmoid(-2) */
    const float l[4] = {-95.0f, -97.0f, -120.0f, -100.0f};
    const float dq[2] = {0.5f, -0.25f};
    for (int d = 0; d < 2; d++) {
        router_case c = {.T = 1, .E = 4, .k = 2, .score = MOEX_ROUTER_SIGMOID, .norm = MOEX_ROUTER_RENORM,
                         .dt = d ? MOEX_DTYPE_BF16 : MOEX_DTYPE_F32};
        double ld[4] = {l[0], l[1], l[2], l[3]};
        void *logits = tu_buffer(c.dt, ld, 4);
        float probs[2] = {0};
        int32_t ids[2] = {-1, -1};
        float dlf[4];
        uint16_t dlh[4];
        void *dl = d ? (void *)dlh : (void *)dlf;
        CHECK_STATUS(ctx, lib_forward(&c, logits, probs, ids), MOEX_OK);
        CHECK_STATUS(ctx, lib_backward(&c, logits, ids, (float *)dq, dl), MOEX_OK);
        const double p0 = 1.0 / (1.0 + exp(-2.0)), p1 = 1.0 - p0;
        CHECK_MSG(ids[0] == 0 && ids[1] == 1 && fabs(probs[0] - p0) < 1e-6 && fabs(probs[1] - p1) < 1e-6,
                  "sigmoid renorm, tiny scores (%s): ids %d %d probs %g %g (want 0 1, %g %g)",
                  d ? "bf16" : "f32", ids[0], ids[1], probs[0], probs[1], p0, p1);
        /* dlogits_e = (dq_j - sum_i dq_i p_i) p_j (1 - s_e) for the chosen e (1 - s_e = 1 here), 0 elsewhere */
        const double c1 = dq[0] * p0 + dq[1] * p1;
        const double want[4] = {(dq[0] - c1) * p0, (dq[1] - c1) * p1, 0.0, 0.0};
        double got[4];
        for (int e = 0; e < 4; e++) got[e] = ref_load(c.dt, dl, e);
        int bad = 0;
        for (int e = 0; e < 4; e++) bad += !(fabs(got[e] - want[e]) <= (d ? 4e-3 : 1e-6) * (1 + fabs(want[e])));
        CHECK_MSG(bad == 0, "sigmoid renorm, tiny scores (%s): dlogits %g %g %g %g (want %g %g %g %g)",
                  d ? "bf16" : "f32", got[0], got[1], got[2], got[3], want[0], want[1], want[2], want[3]);
        free(logits);
    }
}

static void test_errors(void) {
    float logits[4 * 6] = {0}, probs[8], dprobs[8] = {0}, dl[24];
    int32_t ids[8];
    router_case c = {.T = 4, .E = 6, .k = 2, .score = MOEX_ROUTER_SOFTMAX, .norm = MOEX_ROUTER_NO_RENORM,
                     .dt = MOEX_DTYPE_F32};
    moex_router_args a = {0};
    a.logits = moex_tensor_2d(logits, MOEX_DTYPE_F32, 4, 6);
    a.topk = 2;
    a.probs = moex_tensor_2d(probs, MOEX_DTYPE_F32, 4, 2);
    a.ids = moex_tensor_2d(ids, MOEX_DTYPE_I32, 4, 2);
    size_t bytes;
    moex_router_args b = a;
    b.topk = 0;
    CHECK_STATUS(ctx, moex_router_forward(ctx, &b, NULL, 0, NULL), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "topk");
    b = a;
    b.topk = 7;
    CHECK_STATUS(ctx, moex_router_forward_workspace_size(ctx, &b, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "topk");
    b = a;
    b.score = (moex_router_score)5;
    CHECK_STATUS(ctx, moex_router_forward_workspace_size(ctx, &b, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "score");
    b = a;
    b.norm = (moex_router_norm)-1;
    CHECK_STATUS(ctx, moex_router_forward_workspace_size(ctx, &b, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "norm");
    b = a;
    b.logits.dtype = MOEX_DTYPE_F16;
    CHECK_STATUS(ctx, moex_router_forward_workspace_size(ctx, &b, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "logits");
    b = a;
    b.ids = moex_tensor_2d(ids, MOEX_DTYPE_I64, 4, 2);
    CHECK_STATUS(ctx, moex_router_forward_workspace_size(ctx, &b, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "ids");
    b = a;
    b.probs = moex_tensor_2d(probs, MOEX_DTYPE_F32, 4, 3);
    CHECK_STATUS(ctx, moex_router_forward_workspace_size(ctx, &b, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "probs");
    b = a;
    b.ids.data = NULL;
    CHECK_STATUS(ctx, moex_router_forward_workspace_size(ctx, &b, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_STATUS(ctx, moex_router_forward(NULL, &a, NULL, 0, NULL), MOEX_ERR_INVALID_ARG);
    CHECK_STATUS(ctx, moex_router_forward(ctx, NULL, NULL, 0, NULL), MOEX_ERR_INVALID_ARG);
    /* a workspace smaller than asked */
    CHECK_STATUS(ctx, moex_router_forward_workspace_size(ctx, &a, &bytes), MOEX_OK);
    CHECK(bytes > 0);
    void *ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_router_forward(ctx, &a, ws, bytes - 1, NULL), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "workspace");
    free(ws);

    /* backward: ids outside [0, E) fail before dlogits is written */
    const int32_t bad_ids[2][8] = {{0, 1, 2, 3, 4, 5, 0, -1}, {0, 1, 2, 3, 4, 5, 6, 0}};
    for (int v = 0; v < 2; v++) {
        int32_t bi[8];
        memcpy(bi, bad_ids[v], sizeof bi);
        tu_poison(dl, sizeof dl);
        CHECK_STATUS(ctx, lib_backward(&c, logits, bi, dprobs, dl), MOEX_ERR_INVALID_ARG);
        CHECK_MSG_HAS(ctx, "ids");
        CHECK_POISONED("dlogits after bad ids", MOEX_DTYPE_F32, dl, 0, 24);
    }
    /* backward: dlogits must have the logits dtype */
    moex_router_grad_args g = {0};
    g.logits = a.logits;
    g.topk = 2;
    g.ids = a.ids;
    g.dprobs = moex_tensor_2d(dprobs, MOEX_DTYPE_F32, 4, 2);
    g.dlogits = moex_tensor_2d(dl, MOEX_DTYPE_BF16, 4, 6);
    CHECK_STATUS(ctx, moex_router_backward_workspace_size(ctx, &g, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "dlogits");
}

/* T = 0: nothing to do, no workspace. */
static void test_empty(void) {
    router_case c = {.T = 0, .E = 4, .k = 2, .score = MOEX_ROUTER_SOFTMAX, .norm = MOEX_ROUTER_RENORM,
                     .dt = MOEX_DTYPE_F32};
    float dummy[1];
    int32_t idummy[1];
    CHECK_STATUS(ctx, lib_forward(&c, dummy, dummy, idummy), MOEX_OK);
    CHECK_STATUS(ctx, lib_backward(&c, dummy, idummy, dummy, dummy), MOEX_OK);
}

/* The same results with 1 thread and with several. */
static void test_threads(tu_rng *r) {
    router_case c = {.T = 301, .E = 16, .k = 4, .score = MOEX_ROUTER_SOFTMAX, .norm = MOEX_ROUTER_RENORM,
                     .dt = MOEX_DTYPE_F32};
    double *l = tu_doubles(c.T * c.E), *dq = tu_doubles(c.T * c.k);
    make_logits(r, &c, l);
    tu_fill_uniform(r, dq, c.T * c.k, -1, 1, MOEX_DTYPE_F32);
    float *logits = (float *)tu_buffer(MOEX_DTYPE_F32, l, c.T * c.E);
    float *dprobs = (float *)tu_buffer(MOEX_DTYPE_F32, dq, c.T * c.k);
    float *p[2], *dl[2];
    int32_t *ids[2];
    for (int v = 0; v < 2; v++) {
        moex_context_set_num_threads(ctx, v ? 5 : 1);
        p[v] = (float *)tu_alloc((size_t)(c.T * c.k) * sizeof(float));
        ids[v] = (int32_t *)tu_alloc((size_t)(c.T * c.k) * sizeof(int32_t));
        dl[v] = (float *)tu_alloc((size_t)(c.T * c.E) * sizeof(float));
        CHECK_STATUS(ctx, lib_forward(&c, logits, p[v], ids[v]), MOEX_OK);
        CHECK_STATUS(ctx, lib_backward(&c, logits, ids[v], dprobs, dl[v]), MOEX_OK);
    }
    CHECK_MSG(memcmp(p[0], p[1], (size_t)(c.T * c.k) * sizeof(float)) == 0 &&
                  memcmp(ids[0], ids[1], (size_t)(c.T * c.k) * sizeof(int32_t)) == 0 &&
                  memcmp(dl[0], dl[1], (size_t)(c.T * c.E) * sizeof(float)) == 0,
              "router: 1 thread and 5 threads differ");
    for (int v = 0; v < 2; v++) {
        free(p[v]);
        free(ids[v]);
        free(dl[v]);
    }
    free(l); free(dq); free(logits); free(dprobs);
}

int main(void) {
    ctx = tu_cpu_context();
    tu_rng r = tu_rng_seed(20240611);
    const moex_router_score scores[2] = {MOEX_ROUTER_SOFTMAX, MOEX_ROUTER_SIGMOID};
    const moex_router_norm norms[2] = {MOEX_ROUTER_NO_RENORM, MOEX_ROUTER_RENORM};
    const moex_dtype dts[2] = {MOEX_DTYPE_F32, MOEX_DTYPE_BF16};
    const int64_t shapes[][3] = {{37, 8, 2}, {23, 5, 1}, {17, 6, 6}, {64, 64, 8}, {1, 3, 2}, {50, 1, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int sc = 0; sc < 2; sc++)
            for (int nm = 0; nm < 2; nm++)
                for (int d = 0; d < 2; d++)
                    for (int grid = 0; grid < 2; grid++) {
                        router_case c = {.T = shapes[s][0], .E = shapes[s][1], .k = shapes[s][2], .score = scores[sc],
                                         .norm = norms[nm], .dt = dts[d], .grid = grid};
                        test_case(&r, &c);
                    }
    for (int sc = 0; sc < 2; sc++)
        for (int nm = 0; nm < 2; nm++) {
            const int64_t fd_shapes[][3] = {{5, 6, 2}, {4, 4, 4}, {3, 5, 1}};
            for (int s = 0; s < 3; s++) {
                router_case c = {.T = fd_shapes[s][0], .E = fd_shapes[s][1], .k = fd_shapes[s][2],
                                 .score = scores[sc], .norm = norms[nm], .dt = MOEX_DTYPE_F32};
                test_reference_fd(&r, &c);
            }
        }
    test_ties();
    test_nan();
    test_k1_renorm_zero_grad(&r);
    test_sigmoid_renorm_tiny();
    test_errors();
    test_empty();
    test_threads(&r);
    moex_context_destroy(ctx);
    return tu_finish();
}
