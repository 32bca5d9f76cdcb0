/*
 * cpu_permute.c - the CPU permute and unpermute, forward and backward.
 *
 * Token t's copy for its j-th expert is row row_map[t*k + j] of the permuted [T*k, H]
 * buffer; rows are sorted by expert and, within an expert, by (t, j) (stable).
 *   permute forward:    splits[e] = #{(t, j): ids[t, j] == e}      splits [E] I64   =
 *                       row_map[t*k + j] = the row of (t, j)       row_map [T*k]    =
 *                       xp[row_map[t*k + j]] = x[t]                xp [T*k, H]      =
 *                       probs_p[row_map[t*k + j]] = probs[t, j]    probs_p [T*k]    =
 *   permute backward:   dx[t] = sum_j dxp[row_map[t*k + j]]        dx [T, H]        =
 *                       dprobs[t, j] = dprobs_p[row_map[t*k + j]]  dprobs [T, k]    =
 *   unpermute forward:  y[t] = sum_j yp[row_map[t*k + j]]          y [T, H]         =
 *   unpermute backward: dyp[row_map[t*k + j]] = dy[t]              dyp [T*k, H]     =
 * Sums run over j in increasing order in f32 and are rounded once. Ids outside [0, E),
 * row_map values outside [0, T*k), and (unpermute backward, which scatters) a row_map that
 * is not a permutation fail with MOEX_ERR_INVALID_ARG before anything is written.
 *
 * Inside the backend the permute backward also accepts an absent dx, and a dx whose dtype
 * differs from dxp's (the MoE layer sums into f32); the public API always passes dx in the
 * dtype of dxp.
 *
 * Workspace: permute forward E int64 (the next free row of each expert); unpermute backward
 * T*k bytes (rows seen); the others none.
 */
#include "cpu_ops.h"
#include "cpu_convert.h"
#include "moex_half.h"

#include <string.h>

#define PERM_GRAIN_ELEMS 16384   /* elements per thread worth the hand-off */

/* Rows of T tokens per thread chunk, for k rows of H elements per token. */
static int64_t token_grain(int64_t k, int64_t H) {
    int64_t g = PERM_GRAIN_ELEMS / (k * H);
    return g < 1 ? 1 : g;
}

/* Fails unless every row_map value is in [0, T*k). */
static moex_status check_row_map(moex_context *ctx, const char *op, const moex_tensor *row_map, int64_t T,
                                 int64_t k) {
    const int32_t *rm = (const int32_t *)row_map->data;
    for (int64_t i = 0; i < T * k; i++)
        if (rm[i] < 0 || rm[i] >= T * k)
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: row_map[%lld] = %d is outside [0, T*k = %lld)", op,
                             (long long)i, (int)rm[i], (long long)(T * k));
    return MOEX_OK;
}

/* What a range of tokens needs (NULL for tensors an op does not use). */
typedef struct perm_job {
    int64_t H, k;
    const int32_t *row_map;   /* [T*k] */
    moex_dtype src_dt, dst_dt;
    size_t row_bytes;         /* H elements of the copied dtype */
    const void *src;          /* gather: [T*k, H]; scatter: [T, H] */
    void *dst;                /* gather: [T, H];   scatter: [T*k, H] */
    const float *vsrc;        /* per-(t, j) values: gather [T*k] by row, scatter [T, k] */
    float *vdst;              /* gather [T, k], scatter [T*k] by row */
} perm_job;

/* dst[t] = sum_j src[row_map[t*k + j]] (f32, j ascending, one rounding);
 * vdst[t*k + j] = vsrc[row_map[t*k + j]]. */
static void gather_tokens(void *arg, int64_t begin, int64_t end) {
    const perm_job *jb = (const perm_job *)arg;
    const int64_t H = jb->H, k = jb->k;
    for (int64_t t = begin; t < end; t++) {
        const int32_t *rm = jb->row_map + t * k;
        if (jb->dst) {
            for (int64_t h = 0; h < H; h++) {
                float acc = moex_cpu_load1(jb->src, jb->src_dt, (int64_t)rm[0] * H + h);
                for (int64_t j = 1; j < k; j++) acc += moex_cpu_load1(jb->src, jb->src_dt, (int64_t)rm[j] * H + h);
                moex_cpu_store1(jb->dst, jb->dst_dt, t * H + h, acc);
            }
        }
        if (jb->vdst)
            for (int64_t j = 0; j < k; j++) jb->vdst[t * k + j] = jb->vsrc[rm[j]];
    }
}

/* dst[row_map[t*k + j]] = src[t] (a copy); vdst[row_map[t*k + j]] = vsrc[t*k + j]. */
static void scatter_tokens(void *arg, int64_t begin, int64_t end) {
    const perm_job *jb = (const perm_job *)arg;
    const int64_t k = jb->k;
    for (int64_t t = begin; t < end; t++) {
        const int32_t *rm = jb->row_map + t * k;
        const char *src = (const char *)jb->src + (size_t)t * jb->row_bytes;
        for (int64_t j = 0; j < k; j++) {
            memcpy((char *)jb->dst + (size_t)rm[j] * jb->row_bytes, src, jb->row_bytes);
            if (jb->vdst) jb->vdst[rm[j]] = jb->vsrc[t * k + j];
        }
    }
}

/* The gathers (permute backward, unpermute forward): row_map checked, then gather_tokens
 * over the T tokens; jb's H, k and row_map are set here. */
static moex_status gather(moex_context *ctx, const char *op, const moex_tensor *row_map, const moex_perm_dims *d,
                          perm_job *jb) {
    moex_status st = check_row_map(ctx, op, row_map, d->T, d->k);
    if (st != MOEX_OK) return st;
    if (d->T == 0) return MOEX_OK;
    jb->H = d->H;
    jb->k = d->k;
    jb->row_map = (const int32_t *)row_map->data;
    moex_cpu_parallel_for(ctx, d->T, token_grain(d->k, d->H), gather_tokens, jb);
    return MOEX_OK;
}

/* ---- permute ------------------------------------------------------------------------- */

size_t moex_cpu_permute_fwd_ws(moex_context *ctx, const moex_permute_args *a, const moex_perm_dims *d) {
    return moex_sz_bytes(d->E, 1, sizeof(int64_t));
}

moex_status moex_cpu_permute_fwd(moex_context *ctx, const moex_call *c, const moex_permute_args *a,
                                     const moex_perm_dims *d, void *ws) {
    const int64_t T = d->T, k = d->k, E = d->E, n = T * k;
    const int32_t *ids = (const int32_t *)a->ids.data;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= E)
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                             "%s: ids[%lld, %lld] = %d is outside [0, num_experts = %lld)", c->op,
                             (long long)(i / k), (long long)(i % k), (int)ids[i], (long long)E);

    int64_t *splits = (int64_t *)a->splits.data, *next = (int64_t *)ws;
    int32_t *row_map = (int32_t *)a->row_map.data;
    for (int64_t e = 0; e < E; e++) splits[e] = 0;
    for (int64_t i = 0; i < n; i++) splits[ids[i]]++;
    int64_t off = 0;
    for (int64_t e = 0; e < E; e++) {
        next[e] = off;
        off += splits[e];
    }
    for (int64_t i = 0; i < n; i++) row_map[i] = (int32_t)next[ids[i]]++;   /* (t, j) ascending: stable */

    if (T == 0) return MOEX_OK;
    const bool with_probs = moex_present(&a->probs);
    perm_job jb = {.H = d->H, .k = k, .row_map = row_map, .src_dt = d->dt, .dst_dt = d->dt,
                   .row_bytes = (size_t)d->H * moex_dtype_size(d->dt), .src = a->x.data, .dst = a->xp.data,
                   .vsrc = with_probs ? (const float *)a->probs.data : NULL,
                   .vdst = with_probs ? (float *)a->probs_p.data : NULL};
    moex_cpu_parallel_for(ctx, T, token_grain(k, d->H), scatter_tokens, &jb);
    return MOEX_OK;
}

size_t moex_cpu_permute_bwd_ws(moex_context *ctx, const moex_permute_grad_args *a, const moex_perm_dims *d) {
    return 0;
}

moex_status moex_cpu_permute_bwd(moex_context *ctx, const moex_call *c, const moex_permute_grad_args *a,
                                      const moex_perm_dims *d, void *ws) {
    const bool with_dx = moex_present(&a->dx), with_dprobs = moex_present(&a->dprobs_p);
    perm_job jb = {.src_dt = a->dxp.dtype, .dst_dt = with_dx ? a->dx.dtype : a->dxp.dtype, .src = a->dxp.data,
                   .dst = with_dx ? a->dx.data : NULL,
                   .vsrc = with_dprobs ? (const float *)a->dprobs_p.data : NULL,
                   .vdst = with_dprobs ? (float *)a->dprobs.data : NULL};
    return gather(ctx, c->op, &a->row_map, d, &jb);
}

/* ---- unpermute ----------------------------------------------------------------------- */

size_t moex_cpu_unpermute_fwd_ws(moex_context *ctx, const moex_unpermute_args *a, const moex_perm_dims *d) {
    return 0;
}

moex_status moex_cpu_unpermute_fwd(moex_context *ctx, const moex_call *c, const moex_unpermute_args *a,
                                       const moex_perm_dims *d, void *ws) {
    perm_job jb = {.src_dt = d->dt, .dst_dt = d->dt, .src = a->yp.data, .dst = a->y.data};
    return gather(ctx, c->op, &a->row_map, d, &jb);
}

size_t moex_cpu_unpermute_bwd_ws(moex_context *ctx, const moex_unpermute_grad_args *a,
                                      const moex_perm_dims *d) {
    return moex_sz_bytes(d->T, d->k, 1);   /* one flag per row */
}

moex_status moex_cpu_unpermute_bwd(moex_context *ctx, const moex_call *c,
                                        const moex_unpermute_grad_args *a, const moex_perm_dims *d, void *ws) {
    const char *op = c->op;
    moex_status st = check_row_map(ctx, op, &a->row_map, d->T, d->k);
    if (st != MOEX_OK) return st;
    if (d->T == 0) return MOEX_OK;
    /* The scatter writes each row once only if row_map is a permutation (as permute makes
     * it): threads then never write the same row, and every row of dyp is written. */
    const int32_t *rm = (const int32_t *)a->row_map.data;
    unsigned char *seen = (unsigned char *)ws;
    memset(seen, 0, (size_t)(d->T * d->k));
    for (int64_t i = 0; i < d->T * d->k; i++) {
        if (seen[rm[i]])
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: row_map is not a permutation: row %d appears twice",
                             op, (int)rm[i]);
        seen[rm[i]] = 1;
    }
    perm_job jb = {.H = d->H, .k = d->k, .row_map = (const int32_t *)a->row_map.data, .src_dt = d->dt,
                   .dst_dt = d->dt, .row_bytes = (size_t)d->H * moex_dtype_size(d->dt), .src = a->dy.data,
                   .dst = a->dyp.data};
    moex_cpu_parallel_for(ctx, d->T, token_grain(d->k, d->H), scatter_tokens, &jb);
    return MOEX_OK;
}
