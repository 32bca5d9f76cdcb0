/*
 * ref_routing.h - the fp64 reference of routing and the whole MoE layer: the top-k router,
 * permute, unpermute (each with its backward), and the MoE layer forward and backward
 * composed from them and the grouped MLP reference (ref.h). Conventions, bounds and the
 * tolerance model are those of ref.h; every output is "=".
 *
 * Layouts as in moex.h: logits [T,E], probs and ids [T,k] (best first), x [T,H],
 * row_map [T*k], permuted rows [T*k,H] sorted by expert, then token, then j.
 */
#ifndef MOEX_REF_ROUTING_H
#define MOEX_REF_ROUTING_H

#include "ref.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- router ---------------------------------------------------------------------------- */

/* s[0..E) = softmax(l) or sigmoid(l) of one token's logits l[0..E). */
void ref_router_scores(moex_router_score score, int64_t E, const double *l, double *s);

/* ids[t, j] = the expert with the j-th largest score (ties to the lower index),
 * probs[t, j] = its score, divided by the sum of the k chosen when norm is RENORM. */
void ref_router_forward(int64_t T, int64_t E, int64_t k, moex_router_score score, moex_router_norm norm,
                        const double *logits, double *probs, int32_t *ids);

/* dlogits [T,E] = d(sum dprobs * probs) / d logits with the forward's ids held fixed.
 * dprobsb bounds dprobs (NULL: exact, |dprobs| is used); dlogitsb (may be NULL) is the
 * output bound: the same formulas with every term replaced by its magnitude. */
void ref_router_backward(int64_t T, int64_t E, int64_t k, moex_router_score score, moex_router_norm norm,
                         const double *logits, const int32_t *ids, const double *dprobs,
                         const double *dprobsb, double *dlogits, double *dlogitsb);

/* ---- permute and unpermute --------------------------------------------------------- */

/* splits [E] (count per expert), row_map [T*k], xp [T*k,H] (xp[row_map[t*k+j]] = x[t]),
 * probs_p [T*k] from probs [T,k] (both may be NULL). ids must be in [0, E). */
void ref_permute_forward(int64_t T, int64_t H, int64_t k, int64_t E, const int32_t *ids, const double *x,
                         const double *probs, int64_t *splits, int32_t *row_map, double *xp, double *probs_p);

/* dx [T,H] = sum_j dxp[row_map[t*k+j]] with bound dxb = sum_j dxpb (dxpb NULL: |dxp|);
 * dprobs [T,k] = dprobs_p[row_map] (dprobs_p NULL: skipped). Outputs may be NULL. */
void ref_permute_backward(int64_t T, int64_t H, int64_t k, const int32_t *row_map, const double *dxp,
                          const double *dxpb, const double *dprobs_p, double *dx, double *dxb, double *dprobs);

/* y [T,H] = sum_j yp[row_map[t*k+j]]; yb = sum_j ypb (ypb NULL: |yp|; yb may be NULL). */
void ref_unpermute_forward(int64_t T, int64_t H, int64_t k, const int32_t *row_map, const double *yp,
                           const double *ypb, double *y, double *yb);

/* dyp[row_map[t*k+j]] = dy[t]. */
void ref_unpermute_backward(int64_t T, int64_t H, int64_t k, const int32_t *row_map, const double *dy,
                            double *dyp);

/* ---- MoE layer ----------------------------------------------------------------------- */

/* x [T,H], router_w [E,H], w1 [E,2F,H], b1 [E,2F] or NULL, w2 [E,H,F], b2 [E,H]
 * (ADD/SCALED). The router's probs scale the GLU (and b2 when SCALED). */
typedef struct ref_moe {
    int64_t T, H, E, F, k;
    const double *x, *router_w, *w1, *b1, *w2, *b2;
    moex_router_score score;
    moex_router_norm norm;
    moex_bias_mode b2_mode;
    moex_glu_params glu;
} ref_moe;

/* y [T,H] with bound yb, and the routing (logits [T,E], probs and ids [T,k]); every output
 * but y may be NULL.
 * yb is the grouped MLP's bound of each expert row, summed over the token's k rows. It
 * covers the MLP's own roundings; the routing adds one more error: an f32 logit is off by
 * at most (k u_acc) L_t with L_t = max_e sum_h |x_th Wr_eh| (ref_moe_logit_bounds), which
 * softmax or sigmoid (and the renormalisation) turn into a relative error of at most
 * 4 (k u_acc) L_t in each prob, plus the router's own f32 rounding (k u_acc); y is linear
 * in each prob. Compare with ref_moe_bound(m, yb, L_t), which adds that term. */
void ref_moe_layer_forward(const ref_moe *p, double *y, double *yb, double *logits, double *probs,
                           int32_t *ids);

/* L [T]: L_t = max_e sum_h |x_th Wr_eh|, the magnitude bound of token t's logits. */
void ref_moe_logit_bounds(const ref_moe *p, double *L);

/* The bound M' to give ref_tol(m, ref, M') for an MoE-layer output with MLP-model bound M
 * and logit bound L: (u_mid + k u_acc) M' = (u_mid + k u_acc) M + k u_acc (1 + 4 L) M. */
double ref_moe_bound(const ref_tol_model *m, double M, double L);

/* Gradients of sum(dy * y) (each output and bound may be NULL): dx [T,H],
 * drouter_w [E,H], dw1 [E,2F,H], dw2 [E,H,F], db1 [E,2F], db2 [E,H] (ADD/SCALED).
 * Experts that receive no row get 0. The bounds are those of the composed references;
 * L_max = max_t L_t: compare with ref_moe_bound(m, bound, L_max) (the backward is linear
 * in each prob and in the scores, so the routing's relative error scales every term). */
typedef struct ref_moe_grads {
    double *dx, *dxb;
    double *drouter_w, *drouter_wb;
    double *dw1, *dw1b;
    double *dw2, *dw2b;
    double *db1, *db1b;
    double *db2, *db2b;
    double L_max;               /* out */
} ref_moe_grads;
void ref_moe_layer_backward(const ref_moe *p, const double *dy, ref_moe_grads *out);

#ifdef __cplusplus
}
#endif

#endif /* MOEX_REF_ROUTING_H */
