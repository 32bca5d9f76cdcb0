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
    L->db1 = tu_poisoned(MOEX_DTYPE_F32, E * 2 * F);
    L->db2 = tu_poisoned(MOEX_DTYPE_F32, E * H);
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
    g->db1 = moex_tensor_2d(L->db1, MOEX_DTYPE_F32, E, 2 * F);
    if (c->b2_mode != MOEX_BIAS_NONE) g->db2 = moex_tensor_2d(L->db2, MOEX_DTYPE_F32, E, H);
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

/* Forward and backward of one case against the reference. */
static void test_case(tu_rng *r, const moe_case *c) {
    char name[256], what[320];
    describe(name, sizeof name, c);
    const int64_t T = c->T, H = c->H, E = c->E, F = c->F, k = c->k;
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
    double *y = tu_doubles(T * H), *yb = tu_doubles(T * H);
    ref_moe_layer_forward(&p, y, yb, NULL, NULL, NULL);
    ref_moe_grads rg = {tu_doubles(T * H), tu_doubles(T * H), tu_doubles(E * H), tu_doubles(E * H),
                        tu_doubles(n1(c)), tu_doubles(n1(c)), tu_doubles(n2(c)), tu_doubles(n2(c)),
                        tu_doubles(E * 2 * F), tu_doubles(E * 2 * F), tu_doubles(E * H), tu_doubles(E * H)};
    ref_moe_layer_backward(&p, v.dy, &rg);
    for (int64_t i = 0; i < E * H; i++) rg.drouter_w[i] += acc_rw[i];
    for (int64_t i = 0; i < n1(c); i++) rg.dw1[i] += acc1[i];
    for (int64_t i = 0; i < n2(c); i++) rg.dw2[i] += acc2[i];

    /* longest reductions: H (FC1, logits), F (FC2), E (dx through the router), T*k (dW) */
    const int mid = c->dt != MOEX_DTYPE_F32;
    ref_tol_model my = ref_tol_for(c->dt, c->dt, mid, H + 2 * F + E + k + 16);
    ref_tol_model mg = ref_tol_for(c->dt, c->dt, mid, T * k + H + 2 * F + E + 16);
    ref_tol_model mw = ref_tol_for(c->dw_dt, c->dt, mid, T * k + H + 2 * F + E + 16);
    ref_tol_model mb = ref_tol_for(MOEX_DTYPE_F32, c->dt, mid, T * k + H + 2 * F + E + 16);
    snprintf(what, sizeof what, "%s: y", name);
    CHECK_CLOSE(what, c->dt, L.y, y, yb, T * H, H, &my);
    snprintf(what, sizeof what, "%s: dx", name);
    CHECK_CLOSE(what, c->dt, L.dx, rg.dx, rg.dxb, T * H, H, &mg);
    snprintf(what, sizeof what, "%s: drouter_w", name);
    CHECK_CLOSE(what, c->dw_dt, L.drw, rg.drouter_w, rg.drouter_wb, E * H, H, &mw);
    double *dw1 = tu_doubles(n1(c)), *dw2 = tu_doubles(n2(c));
    tu_weight_read(&L.dw1, dw1);
    tu_weight_read(&L.dw2, dw2);
    snprintf(what, sizeof what, "%s: dw1", name);
    CHECK_CLOSE(what, MOEX_DTYPE_F64_AS_F32(c), dw1, rg.dw1, rg.dw1b, n1(c), H, &mw);
    snprintf(what, sizeof what, "%s: dw2", name);
    CHECK_CLOSE(what, MOEX_DTYPE_F64_AS_F32(c), dw2, rg.dw2, rg.dw2b, n2(c), F, &mw);
    snprintf(what, sizeof what, "%s: db1", name);
    CHECK_CLOSE(what, MOEX_DTYPE_F32, L.db1, rg.db1, rg.db1b, E * 2 * F, 2 * F, &mb);
    if (c->b2_mode != MOEX_BIAS_NONE) {
        snprintf(what, sizeof what, "%s: db2", name);
        CHECK_CLOSE(what, MOEX_DTYPE_F32, L.db2, rg.db2, rg.db2b, E * H, H, &mb);
    }
    /* experts that received no token: zero gradients (WRITE) or untouched ones (ACCUMULATE) */
    int64_t bad = 0;
    for (int64_t e = 0; e < c->n_empty; e++) {
        for (int64_t i = e * 2 * F * H; i < (e + 1) * 2 * F * H; i++) bad += dw1[i] != acc1[i];
        for (int64_t i = e * H * F; i < (e + 1) * H * F; i++) bad += dw2[i] != acc2[i];
        for (int64_t i = e * 2 * F; i < (e + 1) * 2 * F; i++) bad += ((float *)L.db1)[i] != 0.0f;
    }
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

    free(acc_rw); free(acc1); free(acc2); free(y); free(yb); free(dw1); free(dw2);
    free(rg.dx); free(rg.dxb); free(rg.drouter_w); free(rg.drouter_wb); free(rg.dw1); free(rg.dw1b);
    free(rg.dw2); free(rg.dw2b); free(rg.db1); free(rg.db1b); free(rg.db2); free(rg.db2b);
    lib_free(&L);
    free_data(&v);
}
