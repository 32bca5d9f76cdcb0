/*
 * ref_routing.c - the fp64 reference of the router, permute, unpermute and the MoE layer
 * (see ref_routing.h). Plain loops, written for clarity; the top-k is found by ranking
 * (not by the library's repeated selection) and the permutation by a scan per expert.
 */
#include "ref_routing.h"

#include <math.h>
#include <stdlib.h>

/* calloc of n doubles (or other elements) that aborts on failure; n may be 0. */
static void *zalloc(size_t n, size_t size) {
    void *p = calloc(n + 1, size);
    if (!p) abort();
    return p;
}

/* ---- router ---------------------------------------------------------------------------- */

void ref_router_scores(moex_router_score score, int64_t E, const double *l, double *s) {
    if (score == MOEX_ROUTER_SIGMOID) {
        for (int64_t e = 0; e < E; e++) s[e] = 1.0 / (1.0 + exp(-l[e]));
        return;
    }
    double m = l[0], sum = 0;
    for (int64_t e = 1; e < E; e++) m = l[e] > m ? l[e] : m;
    for (int64_t e = 0; e < E; e++) sum += exp(l[e] - m);
    for (int64_t e = 0; e < E; e++) s[e] = exp(l[e] - m) / sum;
}

void ref_router_forward(int64_t T, int64_t E, int64_t k, moex_router_score score, moex_router_norm norm,
                        const double *logits, double *probs, int32_t *ids) {
    double *s = (double *)zalloc((size_t)E, sizeof(double));
    for (int64_t t = 0; t < T; t++) {
        ref_router_scores(score, E, logits + t * E, s);
        /* rank of e = experts ahead of it: a larger score, or the same score and a lower index */
        for (int64_t e = 0; e < E; e++) {
            int64_t rank = 0;
            for (int64_t f = 0; f < E; f++) rank += s[f] > s[e] || (s[f] == s[e] && f < e);
            if (rank < k) {
                ids[t * k + rank] = (int32_t)e;
                probs[t * k + rank] = s[e];
            }
        }
        if (norm == MOEX_ROUTER_RENORM) {
            double sum = 0;
            for (int64_t j = 0; j < k; j++) sum += probs[t * k + j];
            for (int64_t j = 0; j < k; j++) probs[t * k + j] /= sum;
        }
    }
    free(s);
}

void ref_router_backward(int64_t T, int64_t E, int64_t k, moex_router_score score, moex_router_norm norm,
                         const double *logits, const int32_t *ids, const double *dprobs,
                         const double *dprobsb, double *dlogits, double *dlogitsb) {
    double *s = (double *)zalloc((size_t)E, sizeof(double));
    double *ds = (double *)zalloc((size_t)E, sizeof(double)), *dsb = (double *)zalloc((size_t)E, sizeof(double));
    double *dp = (double *)zalloc((size_t)k, sizeof(double)), *dpb = (double *)zalloc((size_t)k, sizeof(double));
    for (int64_t t = 0; t < T; t++) {
        const int32_t *id = ids + t * k;
        const double *dq = dprobs + t * k;
        ref_router_scores(score, E, logits + t * E, s);
        double S = 0;
        for (int64_t j = 0; j < k; j++) S += s[id[j]];
        /* through the renormalisation q_j = p_j / S */
        double c1 = 0, c1b = 0;
        for (int64_t j = 0; j < k; j++) {
            double dqb = dprobsb ? dprobsb[t * k + j] : fabs(dq[j]);
            c1 += dq[j] * s[id[j]] / S;
            c1b += dqb * s[id[j]] / S;
        }
        for (int64_t j = 0; j < k; j++) {
            double dqb = dprobsb ? dprobsb[t * k + j] : fabs(dq[j]);
            dp[j] = norm == MOEX_ROUTER_RENORM ? (dq[j] - c1) / S : dq[j];
            dpb[j] = norm == MOEX_ROUTER_RENORM ? (dqb + c1b) / S : dqb;
        }
        /* to the scores of the chosen experts, then through softmax or sigmoid */
        for (int64_t e = 0; e < E; e++) ds[e] = dsb[e] = 0;
        double c = 0, cb = 0;
        for (int64_t j = 0; j < k; j++) {
            ds[id[j]] += dp[j];
            dsb[id[j]] += dpb[j];
            c += dp[j] * s[id[j]];
            cb += dpb[j] * s[id[j]];
        }
        for (int64_t e = 0; e < E; e++) {
            double v, b;
            if (score == MOEX_ROUTER_SIGMOID) {
                v = ds[e] * s[e] * (1 - s[e]);
                b = dsb[e] * s[e] * (1 - s[e]);
            } else {
                v = s[e] * (ds[e] - c);
                b = s[e] * (dsb[e] + cb);
            }
            dlogits[t * E + e] = v;
            if (dlogitsb) dlogitsb[t * E + e] = b;
        }
    }
    free(s);
    free(ds);
    free(dsb);
    free(dp);
    free(dpb);
}

/* ---- permute and unpermute --------------------------------------------------------- */

void ref_permute_forward(int64_t T, int64_t H, int64_t k, int64_t E, const int32_t *ids, const double *x,
                         const double *probs, int64_t *splits, int32_t *row_map, double *xp, double *probs_p) {
    int64_t row = 0;
    for (int64_t e = 0; e < E; e++) {
        splits[e] = 0;
        for (int64_t i = 0; i < T * k; i++) {
            if (ids[i] != e) continue;
            row_map[i] = (int32_t)row++;
            splits[e]++;
        }
    }
    for (int64_t i = 0; i < T * k; i++) {
        if (xp)
            for (int64_t h = 0; h < H; h++) xp[(int64_t)row_map[i] * H + h] = x[(i / k) * H + h];
        if (probs && probs_p) probs_p[row_map[i]] = probs[i];
    }
}

void ref_permute_backward(int64_t T, int64_t H, int64_t k, const int32_t *row_map, const double *dxp,
                          const double *dxpb, const double *dprobs_p, double *dx, double *dxb, double *dprobs) {
    for (int64_t t = 0; t < T; t++) {
        for (int64_t h = 0; h < H && dx; h++) {
            double s = 0, b = 0;
            for (int64_t j = 0; j < k; j++) {
                const int64_t r = row_map[t * k + j];
                s += dxp[r * H + h];
                b += dxpb ? dxpb[r * H + h] : fabs(dxp[r * H + h]);
            }
            dx[t * H + h] = s;
            if (dxb) dxb[t * H + h] = b;
        }
        if (dprobs_p && dprobs)
            for (int64_t j = 0; j < k; j++) dprobs[t * k + j] = dprobs_p[row_map[t * k + j]];
    }
}

void ref_unpermute_forward(int64_t T, int64_t H, int64_t k, const int32_t *row_map, const double *yp,
                           const double *ypb, double *y, double *yb) {
    ref_permute_backward(T, H, k, row_map, yp, ypb, NULL, y, yb, NULL);
}

void ref_unpermute_backward(int64_t T, int64_t H, int64_t k, const int32_t *row_map, const double *dy,
                            double *dyp) {
    for (int64_t i = 0; i < T * k; i++)
        for (int64_t h = 0; h < H; h++) dyp[(int64_t)row_map[i] * H + h] = dy[(i / k) * H + h];
}

/* ---- MoE layer ----------------------------------------------------------------------- */

/* Everything the forward computes up to the grouped MLP. */
typedef struct moe_fwd {
    double *logits, *L;          /* [T,E], [T]: max_e sum_h |x Wr| */
    double *probs;               /* [T,k] */
    int32_t *ids, *row_map;      /* [T,k], [T*k] */
    int64_t *splits;             /* [E] */
    double *xp, *probs_p;        /* [T*k,H], [T*k] */
    ref_mlp mlp;
} moe_fwd;

static void moe_fwd_run(const ref_moe *p, moe_fwd *f) {
    const int64_t T = p->T, H = p->H, E = p->E, k = p->k;
    f->logits = (double *)zalloc((size_t)(T * E), sizeof(double));
    f->L = (double *)zalloc((size_t)T, sizeof(double));
    f->probs = (double *)zalloc((size_t)(T * k), sizeof(double));
    f->ids = (int32_t *)zalloc((size_t)(T * k), sizeof(int32_t));
    f->row_map = (int32_t *)zalloc((size_t)(T * k), sizeof(int32_t));
    f->splits = (int64_t *)zalloc((size_t)E, sizeof(int64_t));
    f->xp = (double *)zalloc((size_t)(T * k * H), sizeof(double));
    f->probs_p = (double *)zalloc((size_t)(T * k), sizeof(double));
    for (int64_t t = 0; t < T; t++) {
        for (int64_t e = 0; e < E; e++) {
            double s = 0, m = 0;
            for (int64_t h = 0; h < H; h++) {
                s += p->x[t * H + h] * p->router_w[e * H + h];
                m += fabs(p->x[t * H + h] * p->router_w[e * H + h]);
            }
            f->logits[t * E + e] = s;
            if (m > f->L[t]) f->L[t] = m;
        }
    }
    ref_router_forward(T, E, k, p->score, p->norm, f->logits, f->probs, f->ids);
    ref_permute_forward(T, H, k, E, f->ids, p->x, f->probs, f->splits, f->row_map, f->xp, f->probs_p);
    f->mlp = (ref_mlp){.G = E, .T = T * k, .H = H, .F = p->F, .splits = f->splits, .x = f->xp, .w1 = p->w1,
                       .b1 = p->b1, .w2 = p->w2, .b2 = p->b2, .probs = f->probs_p, .b2_mode = p->b2_mode,
                       .glu = p->glu};
}

static void moe_fwd_free(moe_fwd *f) {
    free(f->logits); free(f->L); free(f->probs); free(f->ids); free(f->row_map);
    free(f->splits); free(f->xp); free(f->probs_p);
}

void ref_moe_layer_forward(const ref_moe *p, double *y, double *yb, double *logits, double *probs,
                           int32_t *ids) {
    const int64_t T = p->T, H = p->H, E = p->E, F = p->F, k = p->k, rows = T * k;
    moe_fwd f;
    moe_fwd_run(p, &f);
    double *h = (double *)zalloc((size_t)(rows * 2 * F), sizeof(double));
    double *z = (double *)zalloc((size_t)(rows * F), sizeof(double));
    double *yp = (double *)zalloc((size_t)(rows * H), sizeof(double));
    double *ypb = (double *)zalloc((size_t)(rows * H), sizeof(double));
    ref_grouped_mlp_forward(&f.mlp, h, NULL, z, NULL, yp, ypb);
    ref_unpermute_forward(T, H, k, f.row_map, yp, ypb, y, yb);
    for (int64_t i = 0; i < T * E && logits; i++) logits[i] = f.logits[i];
    for (int64_t i = 0; i < rows && probs; i++) probs[i] = f.probs[i];
    for (int64_t i = 0; i < rows && ids; i++) ids[i] = f.ids[i];
    free(h); free(z); free(yp); free(ypb);
    moe_fwd_free(&f);
}

void ref_moe_logit_bounds(const ref_moe *p, double *L) {
    for (int64_t t = 0; t < p->T; t++) {
        L[t] = 0;
        for (int64_t e = 0; e < p->E; e++) {
            double m = 0;
            for (int64_t h = 0; h < p->H; h++) m += fabs(p->x[t * p->H + h] * p->router_w[e * p->H + h]);
            L[t] = fmax(L[t], m);
        }
    }
}

double ref_moe_bound(const ref_tol_model *m, double M, double L) {
    const double acc = m->k * m->u_acc;
    return M * (1 + (1 + 4 * L) * acc / (m->u_mid + acc));
}

void ref_moe_layer_backward(const ref_moe *p, const double *dy, ref_moe_grads *o) {
    const int64_t T = p->T, H = p->H, E = p->E, k = p->k, rows = T * k;
    moe_fwd f;
    moe_fwd_run(p, &f);
    o->L_max = 0;
    for (int64_t t = 0; t < T; t++) o->L_max = fmax(o->L_max, f.L[t]);

    /* unpermute, then the grouped MLP with dprobs_p */
    double *dyp = (double *)zalloc((size_t)(rows * H), sizeof(double));
    double *dxp = (double *)zalloc((size_t)(rows * H), sizeof(double));
    double *dxpb = (double *)zalloc((size_t)(rows * H), sizeof(double));
    double *dpp = (double *)zalloc((size_t)rows, sizeof(double)), *dppb = (double *)zalloc((size_t)rows, sizeof(double));
    ref_unpermute_backward(T, H, k, f.row_map, dy, dyp);
    const int with_b2 = p->b2_mode != MOEX_BIAS_NONE;
    ref_mlp_grads mg = {.dx = dxp, .dxb = dxpb, .dw1 = o->dw1, .dw1b = o->dw1b, .dw2 = o->dw2, .dw2b = o->dw2b,
                        .db1 = o->db1, .db1b = o->db1b, .db2 = with_b2 ? o->db2 : NULL,
                        .db2b = with_b2 ? o->db2b : NULL, .dprobs = dpp, .dprobsb = dppb};
    ref_grouped_mlp_backward(&f.mlp, dyp, &mg);

    /* permute backward: dx_perm and dprobs (and the bound of dprobs) */
    double *dx = (double *)zalloc((size_t)(T * H), sizeof(double)), *dxb = (double *)zalloc((size_t)(T * H), sizeof(double));
    double *dpr = (double *)zalloc((size_t)rows, sizeof(double)), *dprb = (double *)zalloc((size_t)rows, sizeof(double));
    ref_permute_backward(T, H, k, f.row_map, dxp, dxpb, dpp, dx, dxb, dpr);
    ref_permute_backward(T, H, k, f.row_map, NULL, NULL, dppb, NULL, NULL, dprb);

    /* router backward, then the router's linear layer */
    double *dl = (double *)zalloc((size_t)(T * E), sizeof(double)), *dlb = (double *)zalloc((size_t)(T * E), sizeof(double));
    ref_router_backward(T, E, k, p->score, p->norm, f.logits, f.ids, dpr, dprb, dl, dlb);
    for (int64_t t = 0; t < T; t++) {
        for (int64_t c = 0; c < H; c++) {
            double s = dx[t * H + c], b = dxb[t * H + c];
            for (int64_t e = 0; e < E; e++) {
                s += dl[t * E + e] * p->router_w[e * H + c];
                b += dlb[t * E + e] * fabs(p->router_w[e * H + c]);
            }
            if (o->dx) o->dx[t * H + c] = s;
            if (o->dxb) o->dxb[t * H + c] = b;
        }
    }
    for (int64_t e = 0; e < E; e++) {
        for (int64_t c = 0; c < H; c++) {
            double s = 0, b = 0;
            for (int64_t t = 0; t < T; t++) {
                s += dl[t * E + e] * p->x[t * H + c];
                b += dlb[t * E + e] * fabs(p->x[t * H + c]);
            }
            if (o->drouter_w) o->drouter_w[e * H + c] = s;
            if (o->drouter_wb) o->drouter_wb[e * H + c] = b;
        }
    }
    free(dyp); free(dxp); free(dxpb); free(dpp); free(dppb);
    free(dx); free(dxb); free(dpr); free(dprb); free(dl); free(dlb);
    moe_fwd_free(&f);
}
