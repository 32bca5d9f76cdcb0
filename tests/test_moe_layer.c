/*
 * test_moe_layer.c - the whole MoE layer on the CPU (router, permute, grouped MLP,
 * unpermute), forward and backward, against the fp64 reference (ref_routing.h):
 *   - y and every gradient (dx, drouter_w, dw1, dw2, db1, db2) within the tolerance model,
 *     for f32, bf16 and f16, softmax and sigmoid, with and without renormalisation,
 *     k = 1, k = E, experts that receive no token, b1 / b2 modes, both GLUs and layouts,
 *     packed and discrete weights, WRITE and ACCUMULATE weight gradients;
 *   - the reference backward against central differences of the reference forward (fp64),
 *     for every parameter (the probs path through the router included);
 *   - the library backward against central differences of the library forward (f32);
 *   - a saved buffer at an odd address, determinism, T = 0, and argument errors
 *     (saved missing, too small, from another layer, or never written).
 * The routing is made robust first: each token's k-th and (k+1)-th logits are at least
 * GAP apart (rows of x are redrawn until they are), so that f32 rounding and finite-
 * difference steps cannot change which experts are chosen.
 */
#include "ref_routing.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GAP 0.1           /* smallest margin of the routing decision, in logits */
#define EMPTY_LOGIT (-20) /* router weight that keeps an expert empty (x[:, 0] = 1) */

static moex_context *ctx;

typedef struct moe_case {
    int64_t T, H, E, F, k;
    moex_router_score score;
    moex_router_norm norm;
    moex_bias_mode b2_mode;
    int with_b1;
    moex_glu_kind glu;
    moex_glu_layout layout;
    moex_dtype dt;
    int n_empty;             /* experts 0 .. n_empty-1 receive no token */
    moex_grad_mode dw_mode;
    moex_dtype dw_dt;        /* dtype of drouter_w, dw1, dw2 (f32, or dt with WRITE) */
    int discrete;            /* w1, w2 (and dw1, dw2) as arrays of per-expert pointers */
} moe_case;

static void describe(char *buf, size_t n, const moe_case *c) {
    static const char *dtn[] = {"f32", "bf16", "f16"};
    static const char *b2n[] = {"b2-none", "b2-add", "b2-scaled"};
    snprintf(buf, n, "T%lld H%lld E%lld F%lld k%lld %s %s %s%s %s%s %s empty%d %s-%s%s", (long long)c->T,
             (long long)c->H, (long long)c->E, (long long)c->F, (long long)c->k,
             c->score == MOEX_ROUTER_SIGMOID ? "sigmoid" : "softmax", c->norm == MOEX_ROUTER_RENORM ? "renorm" : "raw",
             b2n[c->b2_mode], c->with_b1 ? " b1" : "", c->glu == MOEX_GLU_CLAMPED_SWIGLU ? "clamped" : "swiglu",
             c->layout == MOEX_GLU_INTERLEAVED_32 ? "-il32" : "", dtn[c->dt], c->n_empty,
             c->dw_mode == MOEX_GRAD_ACCUMULATE ? "acc" : "write", dtn[c->dw_dt], c->discrete ? " discrete" : "");
}

static moex_glu_params glu_of(const moe_case *c) {
    moex_glu_params g = moex_glu_params_default(c->glu);
    g.layout = c->layout;
    return g;
}

/* The layer's values in fp64, already rounded to their dtypes. */
typedef struct moe_data {
    double *x, *wr, *w1, *b1, *w2, *b2, *dy;
} moe_data;

/* Redraws row t of x (keeping x[t, 0] = 1 when experts are kept empty) until the gap
 * between the token's k-th and (k+1)-th logits is at least GAP. */
static void condition_row(tu_rng *r, const moe_case *c, moe_data *v, int64_t t) {
    const int64_t H = c->H, E = c->E, k = c->k;
    double *l = tu_doubles(E);
    for (int tries = 0;; tries++) {
        tu_fill_uniform(r, v->x + t * H, H, -1, 1, c->dt);
        if (c->n_empty) v->x[t * H] = 1.0;
        if (k == E) break;
        for (int64_t e = 0; e < E; e++) {
            l[e] = 0;
            for (int64_t h = 0; h < H; h++) l[e] += v->x[t * H + h] * v->wr[e * H + h];
        }
        /* sort descending (E is small) */
        for (int64_t i = 0; i < E; i++)
            for (int64_t j = i + 1; j < E; j++)
                if (l[j] > l[i]) {
                    double s = l[i];
                    l[i] = l[j];
                    l[j] = s;
                }
        if (l[k - 1] - l[k] >= GAP) break;
        if (tries > 100000) {
            fprintf(stderr, "test: cannot condition the routing of token %lld\n", (long long)t);
            exit(1);
        }
    }
    free(l);
}

static moe_data make_data(tu_rng *r, const moe_case *c) {
    const int64_t T = c->T, H = c->H, E = c->E, F = c->F;
    moe_data v;
    v.x = tu_doubles(T * H);
    v.wr = tu_doubles(E * H);
    v.w1 = tu_doubles(E * 2 * F * H);
    v.b1 = tu_doubles(E * 2 * F);
    v.w2 = tu_doubles(E * H * F);
    v.b2 = tu_doubles(E * H);
    v.dy = tu_doubles(T * H);
    tu_fill_uniform(r, v.wr, E * H, -0.5, 0.5, c->dt);
    for (int64_t e = 0; e < c->n_empty; e++) v.wr[e * H] = EMPTY_LOGIT;
    for (int64_t t = 0; t < T; t++) condition_row(r, c, &v, t);
    tu_fill_uniform(r, v.w1, E * 2 * F * H, -0.5, 0.5, c->dt);
    tu_fill_uniform(r, v.w2, E * H * F, -0.5, 0.5, c->dt);
    tu_fill_uniform(r, v.b1, E * 2 * F, -0.2, 0.2, c->dt);
    tu_fill_uniform(r, v.b2, E * H, -0.2, 0.2, c->dt);
    tu_fill_uniform(r, v.dy, T * H, -1, 1, c->dt);
    return v;
}

static void free_data(moe_data *v) {
    free(v->x); free(v->wr); free(v->w1); free(v->b1); free(v->w2); free(v->b2); free(v->dy);
}

static ref_moe ref_of(const moe_case *c, const moe_data *v) {
    ref_moe p = {.T = c->T, .H = c->H, .E = c->E, .F = c->F, .k = c->k, .x = v->x, .router_w = v->wr,
                 .w1 = v->w1, .b1 = c->with_b1 ? v->b1 : NULL, .w2 = v->w2,
                 .b2 = c->b2_mode != MOEX_BIAS_NONE ? v->b2 : NULL, .score = c->score, .norm = c->norm,
                 .b2_mode = c->b2_mode, .glu = glu_of(c)};
    return p;
}

/* The library's view of one case: buffers in the case's dtypes. */
typedef struct moe_lib {
    void *x, *wr, *b1, *b2, *y, *dy, *dx, *drw, *db1, *db2;
    tu_weight w1, w2, dw1, dw2;
    void *saved_alloc;     /* saved = saved_alloc + 3: an odd address */
    size_t saved_bytes;
    moex_moe_layer_args a;
    moex_moe_layer_grad_args g;
} moe_lib;

static void lib_make(const moe_case *c, const moe_data *v, moe_lib *L) {
    const int64_t T = c->T, H = c->H, E = c->E, F = c->F;
    memset(L, 0, sizeof *L);
    L->x = tu_buffer(c->dt, v->x, T * H);
    L->wr = tu_buffer(c->dt, v->wr, E * H);
    L->b1 = tu_buffer(c->dt, v->b1, E * 2 * F);
    L->b2 = tu_buffer(c->dt, v->b2, E * H);
    L->dy = tu_buffer(c->dt, v->dy, T * H);
    L->y = tu_poisoned(c->dt, T * H);
    L->dx = tu_poisoned(c->dt, T * H);
    L->drw = tu_poisoned(c->dw_dt, E * H);
    L->db1 = tu_poisoned(c->dw_dt, E * 2 * F);   /* the bias gradients in the weight gradients' dtype */
    L->db2 = tu_poisoned(c->dw_dt, E * H);
    L->w1 = tu_weight_make(c->dt, E, 2 * F, H, v->w1, c->discrete);
    L->w2 = tu_weight_make(c->dt, E, H, F, v->w2, c->discrete);
    L->dw1 = tu_weight_make(c->dw_dt, E, 2 * F, H, NULL, c->discrete);
    L->dw2 = tu_weight_make(c->dw_dt, E, H, F, NULL, c->discrete);

    moex_moe_layer_args *a = &L->a;
    a->x = moex_tensor_2d(L->x, c->dt, T, H);
    a->router_w = moex_tensor_2d(L->wr, c->dt, E, H);
    a->topk = (int32_t)c->k;
    a->score = c->score;
    a->norm = c->norm;
    a->w1 = L->w1.w;
    if (c->with_b1) a->b1 = moex_tensor_2d(L->b1, c->dt, E, 2 * F);
    a->w2 = L->w2.w;
    a->b2_mode = c->b2_mode;
    if (c->b2_mode != MOEX_BIAS_NONE) a->b2 = moex_tensor_2d(L->b2, c->dt, E, H);
    a->glu = glu_of(c);
    a->y = moex_tensor_2d(L->y, c->dt, T, H);

    moex_moe_layer_grad_args *g = &L->g;
    g->dy = moex_tensor_2d(L->dy, c->dt, T, H);
    g->dx = moex_tensor_2d(L->dx, c->dt, T, H);
    g->dw_mode = c->dw_mode;
    g->drouter_w = moex_tensor_2d(L->drw, c->dw_dt, E, H);
    g->dw1 = L->dw1.w;
    g->dw2 = L->dw2.w;
    g->db1 = moex_tensor_2d(L->db1, c->dw_dt, E, 2 * F);
    if (c->b2_mode != MOEX_BIAS_NONE) g->db2 = moex_tensor_2d(L->db2, c->dw_dt, E, H);
}

static void lib_free(moe_lib *L) {
    free(L->x); free(L->wr); free(L->b1); free(L->b2); free(L->y); free(L->dy); free(L->dx); free(L->drw);
    free(L->db1); free(L->db2); free(L->saved_alloc);
    tu_weight_free(&L->w1); tu_weight_free(&L->w2); tu_weight_free(&L->dw1); tu_weight_free(&L->dw2);
}

/* Sizes the saved buffer (at an odd address) and runs the forward. */
static moex_status lib_forward(moe_lib *L) {
    size_t bytes = 0;
    moex_status st = moex_moe_layer_saved_size(ctx, &L->a, &bytes);
    if (st != MOEX_OK) return st;
    if (!L->saved_alloc || L->saved_bytes != bytes) {
        free(L->saved_alloc);
        L->saved_alloc = tu_alloc(bytes + 3);
        L->saved_bytes = bytes;
    }
    L->a.saved = (char *)L->saved_alloc + 3;
    L->a.saved_bytes = bytes;
    st = moex_moe_layer_forward_workspace_size(ctx, &L->a, &bytes);
    if (st != MOEX_OK) return st;
    void *ws = tu_workspace(bytes);
    st = moex_moe_layer_forward(ctx, &L->a, ws, bytes, NULL);
    free(ws);
    return st;
}

static moex_status lib_backward(moe_lib *L) {
    L->g.fwd = L->a;
    size_t bytes = 0;
    moex_status st = moex_moe_layer_backward_workspace_size(ctx, &L->g, &bytes);
    if (st != MOEX_OK) return st;
    void *ws = tu_workspace(bytes);
    st = moex_moe_layer_backward(ctx, &L->g, ws, bytes, NULL);
    free(ws);
    return st;
}

/* Element count of a weight gradient. */
static int64_t n1(const moe_case *c) { return c->E * 2 * c->F * c->H; }
static int64_t n2(const moe_case *c) { return c->E * c->H * c->F; }

/* The longest reduction on an output's path (ref.h's k): H (FC1, the logits), 2F (FC2 and
 * FC1's dgrad), E + k (the softmax sum and the router backward) plus a few f32 operations
 * (exp, divisions); for weight gradients also the rows (T*k, and T for drouter_w). */
static int64_t longest(const moe_case *c, int weights) {
    int64_t k = c->H;
    if (2 * c->F > k) k = 2 * c->F;
    if (c->E + c->k > k) k = c->E + c->k;
    if (weights && c->T * c->k > k) k = c->T * c->k;
    return k + 4;
}

/* b[i] = ref_moe_bound(m, b[i], L): the MLP-model bound plus the routing's error. */
static void with_routing_error(const ref_tol_model *m, double *b, int64_t n, double L) {
    for (int64_t i = 0; i < n; i++) b[i] = ref_moe_bound(m, b[i], L);
}

/* Forward and backward of one case against the reference. */
static void test_case(tu_rng *r, const moe_case *c) {
    char name[256], what[320];
    describe(name, sizeof name, c);
    const int64_t T = c->T, H = c->H, E = c->E, F = c->F;
    moe_data v = make_data(r, c);
    ref_moe p = ref_of(c, &v);
    moe_lib L;
    lib_make(c, &v, &L);

    /* ACCUMULATE: the gradients start from random f32 values */
    double *acc_rw = tu_doubles(E * H), *acc1 = tu_doubles(n1(c)), *acc2 = tu_doubles(n2(c));
    if (c->dw_mode == MOEX_GRAD_ACCUMULATE) {
        tu_fill_uniform(r, acc_rw, E * H, -1, 1, MOEX_DTYPE_F32);
        tu_fill_uniform(r, acc1, n1(c), -1, 1, MOEX_DTYPE_F32);
        tu_fill_uniform(r, acc2, n2(c), -1, 1, MOEX_DTYPE_F32);
        ref_fill(MOEX_DTYPE_F32, L.drw, acc_rw, E * H);
        tu_weight_free(&L.dw1);
        tu_weight_free(&L.dw2);
        L.dw1 = tu_weight_make(MOEX_DTYPE_F32, E, 2 * F, H, acc1, c->discrete);
        L.dw2 = tu_weight_make(MOEX_DTYPE_F32, E, H, F, acc2, c->discrete);
        L.g.dw1 = L.dw1.w;
        L.g.dw2 = L.dw2.w;
    }

    CHECK_STATUS(ctx, lib_forward(&L), MOEX_OK);
    CHECK_STATUS(ctx, lib_backward(&L), MOEX_OK);

    /* reference */
    double *y = tu_doubles(T * H), *yb = tu_doubles(T * H), *Lt = tu_doubles(T);
    ref_moe_layer_forward(&p, y, yb, NULL, NULL, NULL);
    ref_moe_logit_bounds(&p, Lt);
    ref_moe_grads rg = {.dx = tu_doubles(T * H), .dxb = tu_doubles(T * H), .drouter_w = tu_doubles(E * H),
                        .drouter_wb = tu_doubles(E * H), .dw1 = tu_doubles(n1(c)), .dw1b = tu_doubles(n1(c)),
                        .dw2 = tu_doubles(n2(c)), .dw2b = tu_doubles(n2(c)), .db1 = tu_doubles(E * 2 * F),
                        .db1b = tu_doubles(E * 2 * F), .db2 = tu_doubles(E * H), .db2b = tu_doubles(E * H)};
    ref_moe_layer_backward(&p, v.dy, &rg);
    for (int64_t i = 0; i < E * H; i++) rg.drouter_w[i] += acc_rw[i];
    for (int64_t i = 0; i < n1(c); i++) rg.dw1[i] += acc1[i];
    for (int64_t i = 0; i < n2(c); i++) rg.dw2[i] += acc2[i];

    const int mid = c->dt != MOEX_DTYPE_F32;
    ref_tol_model my = ref_tol_for(c->dt, c->dt, mid, longest(c, 0));
    ref_tol_model mg = ref_tol_for(c->dt, c->dt, mid, longest(c, 0));
    ref_tol_model mw = ref_tol_for(c->dw_dt, c->dt, mid, longest(c, 1));
    ref_tol_model mb = ref_tol_for(c->dw_dt, c->dt, mid, longest(c, 1));
    for (int64_t i = 0; i < T * H; i++) yb[i] = ref_moe_bound(&my, yb[i], Lt[i / H]);
    with_routing_error(&mg, rg.dxb, T * H, rg.L_max);
    with_routing_error(&mw, rg.drouter_wb, E * H, rg.L_max);
    with_routing_error(&mw, rg.dw1b, n1(c), rg.L_max);
    with_routing_error(&mw, rg.dw2b, n2(c), rg.L_max);
    with_routing_error(&mb, rg.db1b, E * 2 * F, rg.L_max);
    with_routing_error(&mb, rg.db2b, E * H, rg.L_max);
    snprintf(what, sizeof what, "%s: y", name);
    CHECK_CLOSE(what, c->dt, L.y, y, yb, T * H, H, &my);
    snprintf(what, sizeof what, "%s: dx", name);
    CHECK_CLOSE(what, c->dt, L.dx, rg.dx, rg.dxb, T * H, H, &mg);
    snprintf(what, sizeof what, "%s: drouter_w", name);
    CHECK_CLOSE(what, c->dw_dt, L.drw, rg.drouter_w, rg.drouter_wb, E * H, H, &mw);
    double *dw1 = tu_doubles(n1(c)), *dw2 = tu_doubles(n2(c));
    tu_weight_read(&L.dw1, dw1);
    tu_weight_read(&L.dw2, dw2);
    /* the weights' values (in dw_dt) are exact in f32 */
    float *dw1f = (float *)tu_buffer(MOEX_DTYPE_F32, dw1, n1(c)), *dw2f = (float *)tu_buffer(MOEX_DTYPE_F32, dw2, n2(c));
    snprintf(what, sizeof what, "%s: dw1", name);
    CHECK_CLOSE(what, MOEX_DTYPE_F32, dw1f, rg.dw1, rg.dw1b, n1(c), H, &mw);
    snprintf(what, sizeof what, "%s: dw2", name);
    CHECK_CLOSE(what, MOEX_DTYPE_F32, dw2f, rg.dw2, rg.dw2b, n2(c), F, &mw);
    free(dw1f);
    free(dw2f);
    snprintf(what, sizeof what, "%s: db1", name);
    CHECK_CLOSE(what, c->dw_dt, L.db1, rg.db1, rg.db1b, E * 2 * F, 2 * F, &mb);
    if (c->b2_mode != MOEX_BIAS_NONE) {
        snprintf(what, sizeof what, "%s: db2", name);
        CHECK_CLOSE(what, c->dw_dt, L.db2, rg.db2, rg.db2b, E * H, H, &mb);
    }
    /* experts that received no token: zero gradients (WRITE) or untouched ones (ACCUMULATE) */
    double *db1 = tu_read(c->dw_dt, L.db1, E * 2 * F);
    int64_t bad = 0;
    for (int64_t e = 0; e < c->n_empty; e++) {
        for (int64_t i = e * 2 * F * H; i < (e + 1) * 2 * F * H; i++) bad += dw1[i] != acc1[i];
        for (int64_t i = e * H * F; i < (e + 1) * H * F; i++) bad += dw2[i] != acc2[i];
        for (int64_t i = e * 2 * F; i < (e + 1) * 2 * F; i++) bad += db1[i] != 0.0;
    }
    free(db1);
    CHECK_MSG(bad == 0, "%s: %lld gradient elements of empty experts are not exactly 0 / untouched", name,
              (long long)bad);

    /* determinism: forward and backward again (WRITE mode: the same outputs bit for bit) */
    if (c->dw_mode == MOEX_GRAD_WRITE) {
        const size_t ys = (size_t)(T * H) * moex_dtype_size(c->dt), rs = (size_t)(E * H) * moex_dtype_size(c->dw_dt);
        void *y1 = tu_alloc(ys), *dx1 = tu_alloc(ys), *drw1 = tu_alloc(rs);
        memcpy(y1, L.y, ys);
        memcpy(dx1, L.dx, ys);
        memcpy(drw1, L.drw, rs);
        CHECK_STATUS(ctx, lib_forward(&L), MOEX_OK);
        CHECK_STATUS(ctx, lib_backward(&L), MOEX_OK);
        double *dw1b = tu_doubles(n1(c));
        tu_weight_read(&L.dw1, dw1b);
        CHECK_MSG(memcmp(y1, L.y, ys) == 0 && memcmp(dx1, L.dx, ys) == 0 && memcmp(drw1, L.drw, rs) == 0 &&
                      memcmp(dw1, dw1b, (size_t)n1(c) * sizeof(double)) == 0,
                  "%s: a second run differs", name);
        free(y1); free(dx1); free(drw1); free(dw1b);
    }

    free(acc_rw); free(acc1); free(acc2); free(y); free(yb); free(Lt); free(dw1); free(dw2);
    free(rg.dx); free(rg.dxb); free(rg.drouter_w); free(rg.drouter_wb); free(rg.dw1); free(rg.dw1b);
    free(rg.dw2); free(rg.dw2b); free(rg.db1); free(rg.db1b); free(rg.db2); free(rg.db2b);
    lib_free(&L);
    free_data(&v);
}

/* ---- finite differences -------------------------------------------------------------- */

/* The parameters of a case, as (name, values, count, gradient) for the FD loops. */
typedef struct param {
    const char *name;
    double *v;
    int64_t n;
    const double *grad;
} param;

static int params_of(const moe_case *c, moe_data *v, const ref_moe_grads *g, param *out) {
    int n = 0;
    out[n++] = (param){.name = "x", .v = v->x, .n = c->T * c->H, .grad = g->dx};
    out[n++] = (param){.name = "router_w", .v = v->wr, .n = c->E * c->H, .grad = g->drouter_w};
    out[n++] = (param){.name = "w1", .v = v->w1, .n = n1(c), .grad = g->dw1};
    out[n++] = (param){.name = "w2", .v = v->w2, .n = n2(c), .grad = g->dw2};
    if (c->with_b1) out[n++] = (param){.name = "b1", .v = v->b1, .n = c->E * 2 * c->F, .grad = g->db1};
    if (c->b2_mode != MOEX_BIAS_NONE) out[n++] = (param){.name = "b2", .v = v->b2, .n = c->E * c->H, .grad = g->db2};
    return n;
}

static double ref_loss(const moe_case *c, const moe_data *v) {
    ref_moe p = ref_of(c, v);
    double *y = tu_doubles(c->T * c->H), l = 0;
    ref_moe_layer_forward(&p, y, NULL, NULL, NULL, NULL);
    for (int64_t i = 0; i < c->T * c->H; i++) l += v->dy[i] * y[i];
    free(y);
    return l;
}

/* The reference backward against central differences of the reference forward, for every
 * parameter, in fp64 (the routing keeps a margin of GAP, far above the step). */
static void test_reference_fd(tu_rng *r, const moe_case *c) {
    char name[256];
    describe(name, sizeof name, c);
    moe_data v = make_data(r, c);
    ref_moe p = ref_of(c, &v);
    ref_moe_grads g = {.dx = tu_doubles(c->T * c->H), .drouter_w = tu_doubles(c->E * c->H), .dw1 = tu_doubles(n1(c)),
                       .dw2 = tu_doubles(n2(c)), .db1 = tu_doubles(c->E * 2 * c->F), .db2 = tu_doubles(c->E * c->H)};
    ref_moe_layer_backward(&p, v.dy, &g);
    param ps[6];
    const int np = params_of(c, &v, &g, ps);
    const double eps = 1e-5;
    for (int q = 0; q < np; q++) {
        double worst = 0, scale = 0;
        for (int64_t i = 0; i < ps[q].n; i++) scale = fmax(scale, fabs(ps[q].grad[i]));
        for (int64_t i = 0; i < ps[q].n; i++) {
            double keep = ps[q].v[i];
            ps[q].v[i] = keep + eps;
            double lp = ref_loss(c, &v);
            ps[q].v[i] = keep - eps;
            double lm = ref_loss(c, &v);
            ps[q].v[i] = keep;
            double fd = (lp - lm) / (2 * eps), an = ps[q].grad[i];
            worst = fmax(worst, fabs(fd - an) / (1e-8 * scale + 1e-6 * fabs(an) + 1e-12));
        }
        CHECK_MSG(worst <= 1.0, "%s: reference d%s vs central differences: worst err/tol %.3g", name, ps[q].name,
                  worst);
        tu_log("  %s: reference d%s FD worst err/tol %.3g\n", name, ps[q].name, worst);
    }
    free(g.dx); free(g.drouter_w); free(g.dw1); free(g.dw2); free(g.db1); free(g.db2);
    free_data(&v);
}

/* sum(dy * y) of the library's forward (f32 case). */
static double lib_loss(moe_lib *L, const moe_case *c, const moe_data *v) {
    CHECK_STATUS(ctx, lib_forward(L), MOEX_OK);
    double l = 0;
    for (int64_t i = 0; i < c->T * c->H; i++) l += v->dy[i] * (double)((float *)L->y)[i];
    return l;
}

/* The library backward against central differences of the library forward, in f32, at a few
 * random coordinates of every parameter (packed weights, f32). */
static void test_library_fd(tu_rng *r, const moe_case *c) {
    char name[256];
    describe(name, sizeof name, c);
    moe_data v = make_data(r, c);
    moe_lib L;
    lib_make(c, &v, &L);
    CHECK_STATUS(ctx, lib_forward(&L), MOEX_OK);
    CHECK_STATUS(ctx, lib_backward(&L), MOEX_OK);
    /* library gradients as doubles, and the library buffer behind each parameter */
    double *gx = tu_read(MOEX_DTYPE_F32, L.dx, c->T * c->H), *grw = tu_read(MOEX_DTYPE_F32, L.drw, c->E * c->H);
    double *g1 = tu_read(MOEX_DTYPE_F32, L.dw1.packed, n1(c)), *g2 = tu_read(MOEX_DTYPE_F32, L.dw2.packed, n2(c));
    double *gb1 = tu_read(c->dw_dt, L.db1, c->E * 2 * c->F), *gb2 = tu_read(c->dw_dt, L.db2, c->E * c->H);
    ref_moe_grads g = {.dx = gx, .drouter_w = grw, .dw1 = g1, .dw2 = g2, .db1 = gb1, .db2 = gb2};
    param ps[6];
    const int np = params_of(c, &v, &g, ps);
    float *bufs[6] = {(float *)L.x, (float *)L.wr, (float *)L.w1.packed, (float *)L.w2.packed, NULL, NULL};
    int nb = 4;
    if (c->with_b1) bufs[nb++] = (float *)L.b1;
    if (c->b2_mode != MOEX_BIAS_NONE) bufs[nb++] = (float *)L.b2;
    const float eps = 1e-2f;
    for (int q = 0; q < np; q++) {
        double worst = 0, scale = 0;
        for (int64_t i = 0; i < ps[q].n; i++) scale = fmax(scale, fabs(ps[q].grad[i]));
        for (int s = 0; s < 6; s++) {
            int64_t i = tu_randint(r, ps[q].n);
            if (c->n_empty && q == 0) i = (i / c->H) * c->H + 1 + tu_randint(r, c->H - 1);   /* keep x[:,0] = 1 */
            float keep = bufs[q][i];
            bufs[q][i] = keep + eps;
            double lp = lib_loss(&L, c, &v);
            bufs[q][i] = keep - eps;
            double lm = lib_loss(&L, c, &v);
            bufs[q][i] = keep;
            double fd = (lp - lm) / (2.0 * ((double)(keep + eps) - keep)), an = ps[q].grad[i];
            worst = fmax(worst, fabs(fd - an) / (1e-3 * scale + 1e-2 * fabs(an) + 1e-6));
        }
        CHECK_MSG(worst <= 1.0, "%s: library d%s vs central differences of the library forward: worst err/tol %.3g",
                  name, ps[q].name, worst);
        tu_log("  %s: library d%s FD worst err/tol %.3g\n", name, ps[q].name, worst);
    }
    free(gx); free(grw); free(g1); free(g2); free(gb1); free(gb2);
    lib_free(&L);
    free_data(&v);
}

/* ---- errors, T = 0 ------------------------------------------------------------------- */

static void test_errors(tu_rng *r) {
    const moe_case c = {.T = 9, .H = 8, .E = 4, .F = 4, .k = 2, .score = MOEX_ROUTER_SOFTMAX,
                        .norm = MOEX_ROUTER_RENORM, .b2_mode = MOEX_BIAS_ADD, .with_b1 = 1, .glu = MOEX_GLU_SWIGLU,
                        .layout = MOEX_GLU_CONTIGUOUS, .dt = MOEX_DTYPE_F32, .dw_mode = MOEX_GRAD_WRITE,
                        .dw_dt = MOEX_DTYPE_F32};
    moe_data v = make_data(r, &c);
    moe_lib L;
    lib_make(&c, &v, &L);
    size_t bytes, saved_bytes;
    CHECK_STATUS(ctx, moex_moe_layer_saved_size(ctx, &L.a, &saved_bytes), MOEX_OK);
    CHECK(saved_bytes > 0);
    void *saved = tu_zalloc(saved_bytes);
    CHECK_STATUS(ctx, moex_moe_layer_forward_workspace_size(ctx, &L.a, &bytes), MOEX_OK);
    void *ws = tu_workspace(bytes);
    size_t ws_bytes = bytes;

    moex_moe_layer_args a = L.a;
    a.saved = NULL;
    a.saved_bytes = saved_bytes;
    CHECK_STATUS(ctx, moex_moe_layer_forward(ctx, &a, ws, ws_bytes, NULL), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "saved");
    a.saved = saved;
    a.saved_bytes = saved_bytes - 1;
    CHECK_STATUS(ctx, moex_moe_layer_forward(ctx, &a, ws, ws_bytes, NULL), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "moex_moe_layer_saved_size");
    CHECK_POISONED("y after a bad saved", MOEX_DTYPE_F32, L.y, 0, c.T * c.H);
    a.saved_bytes = saved_bytes;
    CHECK_STATUS(ctx, moex_moe_layer_forward(ctx, &a, ws, ws_bytes - 1, NULL), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "workspace");

    /* backward from a saved buffer that holds no forward: fails before writing */
    moex_moe_layer_grad_args g = L.g;
    g.fwd = a;
    CHECK_STATUS(ctx, moex_moe_layer_backward_workspace_size(ctx, &g, &bytes), MOEX_OK);
    void *wsb = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_moe_layer_backward(ctx, &g, wsb, bytes, NULL), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "does not hold a forward");
    CHECK_POISONED("dx without a forward", MOEX_DTYPE_F32, L.dx, 0, c.T * c.H);
    CHECK_POISONED("drouter_w without a forward", MOEX_DTYPE_F32, L.drw, 0, c.E * c.H);
    CHECK_POISONED("db1 without a forward", MOEX_DTYPE_F32, L.db1, 0, c.E * 2 * c.F);
    /* backward with other routing options than the forward's */
    CHECK_STATUS(ctx, moex_moe_layer_forward(ctx, &a, ws, ws_bytes, NULL), MOEX_OK);
    g.fwd.score = MOEX_ROUTER_SIGMOID;
    CHECK_STATUS(ctx, moex_moe_layer_backward(ctx, &g, wsb, bytes, NULL), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "another layer");
    CHECK_POISONED("dx after a mismatched saved", MOEX_DTYPE_F32, L.dx, 0, c.T * c.H);
    g.fwd = a;
    CHECK_STATUS(ctx, moex_moe_layer_backward(ctx, &g, wsb, bytes, NULL), MOEX_OK);

    /* argument errors */
    moex_moe_layer_args b = a;
    b.topk = 0;
    CHECK_STATUS(ctx, moex_moe_layer_saved_size(ctx, &b, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "topk");
    b.topk = 5;
    CHECK_STATUS(ctx, moex_moe_layer_forward_workspace_size(ctx, &b, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "topk");
    b = a;
    b.router_w.dtype = MOEX_DTYPE_BF16;
    CHECK_STATUS(ctx, moex_moe_layer_forward_workspace_size(ctx, &b, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "router_w");
    b = a;
    b.w1.t.shape[1] = 7;
    CHECK_STATUS(ctx, moex_moe_layer_forward_workspace_size(ctx, &b, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "w1");
    b = a;
    b.b2_mode = MOEX_BIAS_NONE;
    CHECK_STATUS(ctx, moex_moe_layer_forward_workspace_size(ctx, &b, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "b2");
    b = a;
    b.score = (moex_router_score)3;
    CHECK_STATUS(ctx, moex_moe_layer_forward_workspace_size(ctx, &b, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "score");
    b = a;
    b.glu.layout = MOEX_GLU_INTERLEAVED_32;   /* F = 4 is not a multiple of 32 */
    CHECK_STATUS(ctx, moex_moe_layer_forward_workspace_size(ctx, &b, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "INTERLEAVED_32");
    b = a;
    b.y = moex_tensor_2d(L.y, MOEX_DTYPE_F32, c.T, c.H + 1);
    CHECK_STATUS(ctx, moex_moe_layer_forward_workspace_size(ctx, &b, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "y");
    moex_moe_layer_grad_args h = g;
    h.dw_mode = MOEX_GRAD_ACCUMULATE;
    h.drouter_w.dtype = MOEX_DTYPE_BF16;
    CHECK_STATUS(ctx, moex_moe_layer_backward_workspace_size(ctx, &h, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "drouter_w");
    h = g;
    h.fwd.b2_mode = MOEX_BIAS_NONE;
    h.fwd.b2 = (moex_tensor){0};
    CHECK_STATUS(ctx, moex_moe_layer_backward_workspace_size(ctx, &h, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "db2");
    h = g;
    h.dx.dtype = MOEX_DTYPE_F16;
    CHECK_STATUS(ctx, moex_moe_layer_backward_workspace_size(ctx, &h, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "dx");
    h = g;
    h.dy = (moex_tensor){0};
    CHECK_STATUS(ctx, moex_moe_layer_backward_workspace_size(ctx, &h, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "dy");
    CHECK_STATUS(ctx, moex_moe_layer_forward(NULL, &a, ws, ws_bytes, NULL), MOEX_ERR_INVALID_ARG);
    CHECK_STATUS(ctx, moex_moe_layer_backward(ctx, NULL, wsb, bytes, NULL), MOEX_ERR_INVALID_ARG);

    free(saved); free(ws); free(wsb);
    lib_free(&L);
    free_data(&v);
}

/* T = 0 runs (nothing to route); an absent dx and drouter_w skip the router path. */
static void test_empty_and_partial(tu_rng *r) {
    moe_case c = {.T = 0, .H = 8, .E = 3, .F = 4, .k = 2, .score = MOEX_ROUTER_SIGMOID, .norm = MOEX_ROUTER_RENORM,
                  .b2_mode = MOEX_BIAS_SCALED, .with_b1 = 1, .glu = MOEX_GLU_SWIGLU, .layout = MOEX_GLU_CONTIGUOUS,
                  .dt = MOEX_DTYPE_F32, .dw_mode = MOEX_GRAD_WRITE, .dw_dt = MOEX_DTYPE_F32};
    moe_data v = make_data(r, &c);
    moe_lib L;
    lib_make(&c, &v, &L);
    CHECK_STATUS(ctx, lib_forward(&L), MOEX_OK);
    CHECK_STATUS(ctx, lib_backward(&L), MOEX_OK);
    double *z = tu_doubles(c.E * 2 * c.F * c.H);
    tu_weight_read(&L.dw1, z);
    int64_t nz = 0;
    for (int64_t i = 0; i < n1(&c); i++) nz += z[i] != 0.0;
    CHECK_MSG(nz == 0, "T = 0: dw1 must be all zeros (WRITE), %lld are not", (long long)nz);
    free(z);
    lib_free(&L);
    free_data(&v);

    /* only weight gradients: dx and drouter_w absent */
    c.T = 11;
    v = make_data(r, &c);
    lib_make(&c, &v, &L);
    L.g.dx = (moex_tensor){0};
    L.g.drouter_w = (moex_tensor){0};
    CHECK_STATUS(ctx, lib_forward(&L), MOEX_OK);
    CHECK_STATUS(ctx, lib_backward(&L), MOEX_OK);
    ref_moe p = ref_of(&c, &v);
    ref_moe_grads rg = {.dw2 = tu_doubles(n2(&c)), .dw2b = tu_doubles(n2(&c))};
    ref_moe_layer_backward(&p, v.dy, &rg);
    ref_tol_model m = ref_tol_for(MOEX_DTYPE_F32, MOEX_DTYPE_F32, 0, longest(&c, 1));
    with_routing_error(&m, rg.dw2b, n2(&c), rg.L_max);
    CHECK_CLOSE("weights only: dw2", MOEX_DTYPE_F32, L.dw2.packed, rg.dw2, rg.dw2b, n2(&c), c.F, &m);
    CHECK_POISONED("dx not asked", MOEX_DTYPE_F32, L.dx, 0, c.T * c.H);
    CHECK_POISONED("drouter_w not asked", MOEX_DTYPE_F32, L.drw, 0, c.E * c.H);
    free(rg.dw2);
    free(rg.dw2b);
    lib_free(&L);

    /* only drouter_w, then only dx: each alone must match the reference */
    for (int only_dx = 0; only_dx < 2; only_dx++) {
        lib_make(&c, &v, &L);
        L.g.dw1 = (moex_weight){0};
        L.g.dw2 = (moex_weight){0};
        L.g.db1 = (moex_tensor){0};
        L.g.db2 = (moex_tensor){0};
        if (only_dx)
            L.g.drouter_w = (moex_tensor){0};
        else
            L.g.dx = (moex_tensor){0};
        CHECK_STATUS(ctx, lib_forward(&L), MOEX_OK);
        CHECK_STATUS(ctx, lib_backward(&L), MOEX_OK);
        ref_moe_grads g1 = {.dx = tu_doubles(c.T * c.H), .dxb = tu_doubles(c.T * c.H),
                            .drouter_w = tu_doubles(c.E * c.H), .drouter_wb = tu_doubles(c.E * c.H)};
        ref_moe_layer_backward(&p, v.dy, &g1);
        ref_tol_model m0 = ref_tol_for(MOEX_DTYPE_F32, MOEX_DTYPE_F32, 0, longest(&c, 1));
        if (only_dx) {
            with_routing_error(&m0, g1.dxb, c.T * c.H, g1.L_max);
            CHECK_CLOSE("dx alone", MOEX_DTYPE_F32, L.dx, g1.dx, g1.dxb, c.T * c.H, c.H, &m0);
            CHECK_POISONED("drouter_w not asked", MOEX_DTYPE_F32, L.drw, 0, c.E * c.H);
        } else {
            with_routing_error(&m0, g1.drouter_wb, c.E * c.H, g1.L_max);
            CHECK_CLOSE("drouter_w alone", MOEX_DTYPE_F32, L.drw, g1.drouter_w, g1.drouter_wb, c.E * c.H, c.H, &m0);
            CHECK_POISONED("dx not asked", MOEX_DTYPE_F32, L.dx, 0, c.T * c.H);
        }
        CHECK_POISONED("db1 not asked", MOEX_DTYPE_F32, L.db1, 0, c.E * 2 * c.F);
        free(g1.dx); free(g1.dxb); free(g1.drouter_w); free(g1.drouter_wb);
        lib_free(&L);
    }
    free_data(&v);
}

/* The cases every backend runs (tests/cuda/test_gpu_moe_layer.c runs them on the GPU):
 * the layer against the reference, and the library backward against finite differences. */
static void run_backend_cases(tu_rng *r) {
    const moex_router_score SM = MOEX_ROUTER_SOFTMAX, SG = MOEX_ROUTER_SIGMOID;
    const moex_router_norm RN = MOEX_ROUTER_RENORM, RAW = MOEX_ROUTER_NO_RENORM;
    const moex_glu_kind SW = MOEX_GLU_SWIGLU, CL = MOEX_GLU_CLAMPED_SWIGLU;
    const moex_glu_layout CT = MOEX_GLU_CONTIGUOUS, IL = MOEX_GLU_INTERLEAVED_32;
    const moex_dtype F32 = MOEX_DTYPE_F32, BF = MOEX_DTYPE_BF16, F16 = MOEX_DTYPE_F16;
    const moex_grad_mode WR = MOEX_GRAD_WRITE, AC = MOEX_GRAD_ACCUMULATE;
    const moe_case cases[] = {
        {.T = 23, .H = 16, .E = 4, .F = 8, .k = 2, .score = SM, .norm = RN, .b2_mode = MOEX_BIAS_NONE, .glu = SW,
         .layout = CT, .dt = F32, .n_empty = 1, .dw_mode = WR, .dw_dt = F32},
        {.T = 19, .H = 12, .E = 5, .F = 6, .k = 1, .score = SG, .norm = RAW, .b2_mode = MOEX_BIAS_ADD, .with_b1 = 1,
         .glu = SW, .layout = CT, .dt = F32, .n_empty = 2, .dw_mode = WR, .dw_dt = F32, .discrete = 1},
        /* k = E */
        {.T = 13, .H = 8, .E = 3, .F = 4, .k = 3, .score = SM, .norm = RAW, .b2_mode = MOEX_BIAS_SCALED, .with_b1 = 1,
         .glu = CL, .layout = CT, .dt = F32, .dw_mode = AC, .dw_dt = F32},
        {.T = 29, .H = 16, .E = 6, .F = 32, .k = 2, .score = SM, .norm = RN, .b2_mode = MOEX_BIAS_SCALED,
         .with_b1 = 1, .glu = CL, .layout = IL, .dt = BF, .n_empty = 2, .dw_mode = WR, .dw_dt = BF},
        {.T = 29, .H = 16, .E = 6, .F = 32, .k = 2, .score = SM, .norm = RN, .b2_mode = MOEX_BIAS_SCALED,
         .with_b1 = 1, .glu = CL, .layout = IL, .dt = F16, .n_empty = 2, .dw_mode = AC, .dw_dt = F32, .discrete = 1},
        {.T = 31, .H = 24, .E = 8, .F = 8, .k = 4, .score = SG, .norm = RN, .b2_mode = MOEX_BIAS_ADD, .glu = SW,
         .layout = CT, .dt = BF, .n_empty = 3, .dw_mode = WR, .dw_dt = F32},
        /* k = 1 renorm: dlogits = 0 */
        {.T = 7, .H = 5, .E = 2, .F = 3, .k = 1, .score = SM, .norm = RN, .b2_mode = MOEX_BIAS_NONE, .with_b1 = 1,
         .glu = SW, .layout = CT, .dt = F32, .dw_mode = WR, .dw_dt = F32},
        {.T = 40, .H = 9, .E = 7, .F = 5, .k = 2, .score = SG, .norm = RAW, .b2_mode = MOEX_BIAS_SCALED, .with_b1 = 1,
         .glu = CL, .layout = CT, .dt = F16, .n_empty = 4, .dw_mode = WR, .dw_dt = F16, .discrete = 1},
        /* one token, k = E */
        {.T = 1, .H = 3, .E = 2, .F = 1, .k = 2, .score = SG, .norm = RN, .b2_mode = MOEX_BIAS_ADD, .with_b1 = 1,
         .glu = SW, .layout = CT, .dt = F32, .dw_mode = AC, .dw_dt = F32},
        {.T = 64, .H = 20, .E = 12, .F = 10, .k = 3, .score = SM, .norm = RN, .b2_mode = MOEX_BIAS_SCALED,
         .with_b1 = 1, .glu = SW, .layout = CT, .dt = BF, .n_empty = 5, .dw_mode = AC, .dw_dt = F32},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_case(r, &cases[i]);

    const moe_case lib_fd_cases[] = {
        {.T = 17, .H = 10, .E = 4, .F = 6, .k = 2, .score = SM, .norm = RN, .b2_mode = MOEX_BIAS_SCALED, .with_b1 = 1,
         .glu = SW, .layout = CT, .dt = F32, .n_empty = 1, .dw_mode = WR, .dw_dt = F32},
        {.T = 12, .H = 8, .E = 5, .F = 4, .k = 2, .score = SG, .norm = RAW, .b2_mode = MOEX_BIAS_ADD, .with_b1 = 1,
         .glu = CL, .layout = CT, .dt = F32, .dw_mode = WR, .dw_dt = F32},
        {.T = 9, .H = 6, .E = 3, .F = 4, .k = 3, .score = SG, .norm = RN, .b2_mode = MOEX_BIAS_NONE, .glu = SW,
         .layout = CT, .dt = F32, .dw_mode = WR, .dw_dt = F32},
    };
    for (size_t i = 0; i < sizeof lib_fd_cases / sizeof lib_fd_cases[0]; i++) test_library_fd(r, &lib_fd_cases[i]);
}

int main(void) {
    ctx = tu_cpu_context();
    tu_rng r = tu_rng_seed(4242);
    run_backend_cases(&r);

    /* the reference backward against finite differences (CPU only: it tests the reference) */
    const moex_router_score SM = MOEX_ROUTER_SOFTMAX, SG = MOEX_ROUTER_SIGMOID;
    const moex_router_norm RN = MOEX_ROUTER_RENORM, RAW = MOEX_ROUTER_NO_RENORM;
    const moex_glu_kind SW = MOEX_GLU_SWIGLU, CL = MOEX_GLU_CLAMPED_SWIGLU;
    const moex_glu_layout CT = MOEX_GLU_CONTIGUOUS;
    const moex_dtype F32 = MOEX_DTYPE_F32;
    const moex_grad_mode WR = MOEX_GRAD_WRITE;
    const moe_case fd_cases[] = {
        {.T = 5, .H = 4, .E = 3, .F = 2, .k = 2, .score = SM, .norm = RN, .b2_mode = MOEX_BIAS_SCALED, .with_b1 = 1,
         .glu = SW, .layout = CT, .dt = F32, .dw_mode = WR, .dw_dt = F32},
        {.T = 4, .H = 3, .E = 4, .F = 3, .k = 1, .score = SG, .norm = RAW, .b2_mode = MOEX_BIAS_ADD, .with_b1 = 1,
         .glu = CL, .layout = CT, .dt = F32, .dw_mode = WR, .dw_dt = F32},
        {.T = 3, .H = 4, .E = 3, .F = 2, .k = 3, .score = SG, .norm = RN, .b2_mode = MOEX_BIAS_NONE, .glu = SW,
         .layout = CT, .dt = F32, .dw_mode = WR, .dw_dt = F32},
        {.T = 6, .H = 4, .E = 5, .F = 2, .k = 2, .score = SM, .norm = RAW, .b2_mode = MOEX_BIAS_SCALED, .with_b1 = 1,
         .glu = CL, .layout = CT, .dt = F32, .n_empty = 1, .dw_mode = WR, .dw_dt = F32},
        {.T = 5, .H = 3, .E = 4, .F = 2, .k = 3, .score = SG, .norm = RN, .b2_mode = MOEX_BIAS_SCALED, .with_b1 = 1,
         .glu = SW, .layout = CT, .dt = F32, .dw_mode = WR, .dw_dt = F32},
    };
    for (size_t i = 0; i < sizeof fd_cases / sizeof fd_cases[0]; i++) test_reference_fd(&r, &fd_cases[i]);

    test_errors(&r);
    test_empty_and_partial(&r);
    moex_context_destroy(ctx);
    return tu_finish();
}
