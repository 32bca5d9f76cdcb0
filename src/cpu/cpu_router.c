/*
 * cpu_router.c - the CPU top-k router, forward and backward.
 *
 *   forward:  s = softmax(l) or sigmoid(l) over the E logits of a token (f32);
 *             ids[t, j] = the j-th largest score (ties to the lower expert index),
 *             probs[t, j] = s[ids[t, j]], divided by their sum when renormalised
 *             (SIGMOID + RENORM as the softmax of the chosen log-sigmoids: router_math.h).
 *             probs [T, k] f32 =, ids [T, k] I32 =
 *   backward: with p_j = s[ids_j] and S = sum_j p_j,
 *             renorm:   dp_j = (dprobs_j - sum_i dprobs_i p_i / S) / S   (else dp_j = dprobs_j)
 *             ds[e]    = sum of dp_j over the j with ids_j == e (0 for experts not chosen)
 *             softmax:  dl[e] = s[e] (ds[e] - sum_j dp_j p_j)
 *             sigmoid:  dl[e] = ds[e] s[e] (1 - s[e])   (1 - s[e] = e^-l s[e] for l >= 0: no cancellation)
 *             (SIGMOID + RENORM without dividing by S: router_math.h)
 *             dlogits [T, E] in the logits dtype =
 * The choice of experts is piecewise constant in the logits, so it has no gradient.
 * Every row is independent and computed in f32 in a fixed order: results do not depend on
 * the number of threads. The backward checks that every id is in [0, E) before it writes.
 *
 * Workspace: up to ROUTER_CHUNKS chunks of rows, each with 2E floats of scratch.
 */
#include "cpu_ops.h"
#include "moex_half.h"
#include "router_math.h"

#include <math.h>

#define ROUTER_CHUNKS 256
#define ROUTER_GRAIN_ELEMS 16384   /* logits per thread worth the hand-off */
#define TAKEN (-1.0f)              /* marks a chosen expert's score (scores are >= 0 or NaN) */

static inline float load_logit(const void *base, moex_dtype dt, int64_t i) {
    return dt == MOEX_DTYPE_BF16 ? moex_bf16_to_f32(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

static inline void store_logit(void *base, moex_dtype dt, int64_t i, float v) {
    if (dt == MOEX_DTYPE_BF16)
        ((uint16_t *)base)[i] = moex_f32_to_bf16(v);
    else
        ((float *)base)[i] = v;
}

/* s[0..E) = the scores of one row of logits, in f32. */
static void score_row(const void *logits, moex_dtype dt, int64_t row, int64_t E, moex_router_score score,
                      float *s) {
    const int64_t base = row * E;
    if (score == MOEX_ROUTER_SIGMOID) {
        for (int64_t e = 0; e < E; e++) s[e] = 1.0f / (1.0f + expf(-load_logit(logits, dt, base + e)));
        return;
    }
    float m = load_logit(logits, dt, base);
    for (int64_t e = 1; e < E; e++) {
        float l = load_logit(logits, dt, base + e);
        if (l > m) m = l;
    }
    float sum = 0.0f;
    for (int64_t e = 0; e < E; e++) {
        s[e] = expf(load_logit(logits, dt, base + e) - m);
        sum += s[e];
    }
    for (int64_t e = 0; e < E; e++) s[e] = s[e] / sum;
}

/* p[0..k) = the SIGMOID + RENORM probs of one token's chosen experts `id` (router_math.h),
 * base = the token's first logit; p may be any k floats. */
static void sigmoid_renorm(const void *logits, moex_dtype dt, int64_t base, const int32_t *id, int64_t k, float *p) {
    float m = -INFINITY, z = 0.0f;
    for (int64_t j = 0; j < k; j++) {
        p[j] = moex_router_log_sigmoid(load_logit(logits, dt, base + id[j]));
        if (p[j] > m) m = p[j];
    }
    for (int64_t j = 0; j < k; j++) {
        p[j] = expf(p[j] - m);
        z += p[j];
    }
    for (int64_t j = 0; j < k; j++) p[j] = p[j] / z;
}

/* Rows [begin, end) of chunk c out of n for T rows. */
static void chunk_rows(int64_t T, int64_t n, int64_t c, int64_t *begin, int64_t *end) {
    *begin = T * c / n;
    *end = T * (c + 1) / n;
}

static int64_t num_chunks(int64_t T) { return T < ROUTER_CHUNKS ? T : ROUTER_CHUNKS; }

/* Chunks per thread worth the hand-off, for n chunks of T rows of E logits. */
static int64_t chunk_grain(int64_t T, int64_t E, int64_t n) {
    int64_t per_chunk = (T / n + 1) * E;
    int64_t g = ROUTER_GRAIN_ELEMS / per_chunk;
    return g < 1 ? 1 : g;
}

typedef struct router_job {
    const moex_router_args *fa;        /* forward or ...  */
    const moex_router_grad_args *ba;   /* ... backward     */
    const moex_router_dims *d;
    int64_t n;                         /* chunks */
    float *scratch;                    /* [n, 2E] */
} router_job;

static void router_forward_chunks(void *arg, int64_t cbegin, int64_t cend) {
    const router_job *jb = (const router_job *)arg;
    const moex_router_args *a = jb->fa;
    const int64_t E = jb->d->E, k = jb->d->k;
    float *probs = (float *)a->probs.data;
    int32_t *ids = (int32_t *)a->ids.data;
    for (int64_t c = cbegin; c < cend; c++) {
        float *s = jb->scratch + c * 2 * E;
        int64_t begin, end;
        chunk_rows(jb->d->T, jb->n, c, &begin, &end);
        for (int64_t t = begin; t < end; t++) {
            score_row(a->logits.data, jb->d->dt, t, E, a->score, s);
            float sum = 0.0f;
            for (int64_t j = 0; j < k; j++) {
                int64_t best = -1;
                for (int64_t e = 0; e < E; e++) {   /* strict > keeps the lower index on ties; */
                    if (s[e] == TAKEN) continue;         /* a NaN score ranks below every number */
                    if (best < 0 || s[e] > s[best] || (isnan(s[best]) && !isnan(s[e]))) best = e;
                }
                probs[t * k + j] = s[best];
                ids[t * k + j] = (int32_t)best;
                sum += s[best];
                s[best] = TAKEN;
            }
            if (a->norm == MOEX_ROUTER_RENORM && a->score == MOEX_ROUTER_SIGMOID)
                sigmoid_renorm(a->logits.data, jb->d->dt, t * E, ids + t * k, k, probs + t * k);
            else if (a->norm == MOEX_ROUTER_RENORM)
                for (int64_t j = 0; j < k; j++) probs[t * k + j] = probs[t * k + j] / sum;
        }
    }
}

size_t moex_cpu_router_fwd_ws(moex_context *ctx, const moex_router_args *a, const moex_router_dims *d) {
    return moex_sz_bytes(num_chunks(d->T), 2 * d->E, sizeof(float));
}

moex_status moex_cpu_router_fwd(moex_context *ctx, const moex_call *c, const moex_router_args *a,
                                    const moex_router_dims *d, void *ws) {
    if (d->T == 0) return MOEX_OK;
    router_job jb = {.fa = a, .d = d, .n = num_chunks(d->T), .scratch = (float *)ws};
    moex_cpu_parallel_for(ctx, jb.n, chunk_grain(d->T, d->E, jb.n), router_forward_chunks, &jb);
    return MOEX_OK;
}

static void router_backward_chunks(void *arg, int64_t cbegin, int64_t cend) {
    const router_job *jb = (const router_job *)arg;
    const moex_router_grad_args *a = jb->ba;
    const int64_t E = jb->d->E, k = jb->d->k;
    const int32_t *ids = (const int32_t *)a->ids.data;
    const float *dq = (const float *)a->dprobs.data;
    for (int64_t c = cbegin; c < cend; c++) {
        float *s = jb->scratch + c * 2 * E, *ds = s + E;
        int64_t begin, end;
        chunk_rows(jb->d->T, jb->n, c, &begin, &end);
        for (int64_t t = begin; t < end; t++) {
            const int32_t *id = ids + t * k;
            if (a->score == MOEX_ROUTER_SIGMOID && a->norm == MOEX_ROUTER_RENORM) {
                float *p = s, c1 = 0.0f;   /* P_j, and sum_j dprobs_j P_j */
                sigmoid_renorm(a->logits.data, jb->d->dt, t * E, id, k, p);
                for (int64_t j = 0; j < k; j++) c1 += dq[t * k + j] * p[j];
                for (int64_t e = 0; e < E; e++) ds[e] = 0.0f;
                for (int64_t j = 0; j < k; j++) ds[id[j]] += (dq[t * k + j] - c1) * p[j];
                for (int64_t e = 0; e < E; e++) {
                    float l = load_logit(a->logits.data, jb->d->dt, t * E + e);
                    store_logit(a->dlogits.data, jb->d->dt, t * E + e, ds[e] * moex_router_one_minus_sigmoid(l));
                }
                continue;
            }
            score_row(a->logits.data, jb->d->dt, t, E, a->score, s);
            float sum = 0.0f, dq_q = 0.0f;
            for (int64_t j = 0; j < k; j++) sum += s[id[j]];
            if (a->norm == MOEX_ROUTER_RENORM)
                for (int64_t j = 0; j < k; j++) dq_q += dq[t * k + j] * (s[id[j]] / sum);
            for (int64_t e = 0; e < E; e++) ds[e] = 0.0f;
            float dp_p = 0.0f;   /* sum_j dp_j p_j */
            for (int64_t j = 0; j < k; j++) {
                float dp = a->norm == MOEX_ROUTER_RENORM ? (dq[t * k + j] - dq_q) / sum : dq[t * k + j];
                ds[id[j]] += dp;
                dp_p += dp * s[id[j]];
            }
            for (int64_t e = 0; e < E; e++) {
                float dl;
                if (a->score == MOEX_ROUTER_SIGMOID) {   /* s (1 - s), with 1 - s = e^-l s where s > 1/2 */
                    float l = load_logit(a->logits.data, jb->d->dt, t * E + e);
                    float one_minus_s = l >= 0.0f ? expf(-l) * s[e] : 1.0f - s[e];
                    dl = ds[e] * s[e] * one_minus_s;
                } else {
                    dl = s[e] * (ds[e] - dp_p);
                }
                store_logit(a->dlogits.data, jb->d->dt, t * E + e, dl);
            }
        }
    }
}

size_t moex_cpu_router_bwd_ws(moex_context *ctx, const moex_router_grad_args *a, const moex_router_dims *d) {
    return moex_sz_bytes(num_chunks(d->T), 2 * d->E, sizeof(float));
}

moex_status moex_cpu_router_bwd(moex_context *ctx, const moex_call *c, const moex_router_grad_args *a,
                                     const moex_router_dims *d, void *ws) {
    const int32_t *ids = (const int32_t *)a->ids.data;
    for (int64_t i = 0; i < d->T * d->k; i++)
        if (ids[i] < 0 || ids[i] >= d->E)
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                             "%s: ids[%lld, %lld] = %d is outside [0, E = %lld)", c->op,
                             (long long)(i / d->k), (long long)(i % d->k), (int)ids[i], (long long)d->E);
    if (d->T == 0) return MOEX_OK;
    router_job jb = {.ba = a, .d = d, .n = num_chunks(d->T), .scratch = (float *)ws};
    moex_cpu_parallel_for(ctx, jb.n, chunk_grain(d->T, d->E, jb.n), router_backward_chunks, &jb);
    return MOEX_OK;
}
