/*
 * router_math.h - private: the f32 math of the router's SIGMOID + RENORM scores, shared by the
 * CPU and CUDA routers (the functions are __host__ __device__ under nvcc) so that both use the
 * same formulas.
 *
 * With SIGMOID + RENORM the probs are P_j = q_j / Q, q_j = sigmoid(l_j) of the k chosen logits
 * and Q = sum_j q_j (docs/ops.md 5.1). Written that way it is 0 / 0 = NaN once every chosen
 * logit is below about -88 (1 / (1 + e^-l) is 0 in f32). Both routers compute it instead as the
 * softmax of the chosen log-sigmoids, the same value in exact arithmetic and finite for every
 * finite logit:
 *   ls_j = log sigmoid(l_j) = min(l_j, 0) - log1p(exp(-|l_j|)),   M = max_j ls_j,
 *   P_j  = exp(ls_j - M) / sum_j' exp(ls_j' - M)
 * (E = 1, k = 1 gives P = 1 at any finite logit). The backward (docs/ops.md 5.2) uses the same
 * P_j and never divides by Q:
 *   dlogits_e = (1 - s_e) * sum over the j with ids_j == e of (dprobs_j - sum_j' dprobs_j' P_j') P_j
 * with 1 - s_e = sigmoid(-l_e), which is u_j s_e (1 - s_e) summed as in docs/ops.md 5.2.
 */
#ifndef MOEX_ROUTER_MATH_H
#define MOEX_ROUTER_MATH_H

#include <math.h>

#if defined(__CUDACC__)
#define MOEX_ROUTER_FN static __host__ __device__ __forceinline__
#else
#define MOEX_ROUTER_FN static inline
#endif

/* log(sigmoid(l)) without overflow: finite for finite l, 0 at +inf, -inf at -inf, NaN at NaN. */
MOEX_ROUTER_FN float moex_router_log_sigmoid(float l) {
    return fminf(l, 0.0f) - log1pf(expf(-fabsf(l)));
}

/* 1 - sigmoid(l) = sigmoid(-l), without the cancellation of 1 - s where s -> 1. */
MOEX_ROUTER_FN float moex_router_one_minus_sigmoid(float l) {
    return 1.0f / (1.0f + expf(l));
}

#endif /* MOEX_ROUTER_MATH_H */
