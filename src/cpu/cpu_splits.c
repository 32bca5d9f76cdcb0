/*
 * cpu_splits.c - the CPU prepared groups (host splits -> checked offsets [G+1]),
 * splits_to_offsets, and zero_tail (the rows past off[G] set to zero bytes).
 *
 * splits_to_offsets: one pass over splits [G] fills up to
 * MOEX_MAX_OFFSETS offset arrays, each I32 or I64, each with its own stride:
 *   LEADING_ZERO: out[0] = 0, out[g+1] = stride * (s0 + .. + sg)      [G+1]   =
 *   INCLUSIVE:    out[g]   = stride * (s0 + .. + sg)                  [G]     =
 * Everything is checked before anything is written: no split is negative
 * (MOEX_ERR_BAD_SPLITS), the sum fits int64 (MOEX_ERR_BAD_SPLITS), and the largest
 * value of every output, stride * sum, fits its dtype (MOEX_ERR_INVALID_ARG). The
 * values only grow with g, so the last one is the largest. No workspace.
 */
#include <string.h>

#include "cpu_ops.h"
#include "splits_rule.h"

size_t moex_cpu_splits_to_offsets_ws(moex_context *ctx, const moex_splits_to_offsets_args *a,
                                     const moex_splits_dims *d) {
    return 0;
}

moex_status moex_cpu_splits_to_offsets(moex_context *ctx, const moex_call *c,
                                       const moex_splits_to_offsets_args *a, const moex_splits_dims *d,
                                       void *ws) {
    const char *op = c->op;
    const int64_t G = d->G;
    const int64_t *s = (const int64_t *)a->splits.data;
    int64_t total = 0;
    for (int64_t g = 0; g < G; g++) {
        if (s[g] < 0)
            return moex_fail(ctx, MOEX_ERR_BAD_SPLITS, "%s: splits[%lld] = %lld is negative", op, (long long)g,
                             (long long)s[g]);
        if (s[g] > INT64_MAX - total)
            return moex_fail(ctx, MOEX_ERR_BAD_SPLITS, "%s: the sum of splits overflows int64 at group %lld", op,
                             (long long)g);
        total += s[g];
    }
    for (int i = 0; i < a->num_outputs; i++) {
        const moex_offsets_output *o = &a->outputs[i];
        const int64_t limit = o->out.dtype == MOEX_DTYPE_I32 ? INT32_MAX : INT64_MAX;
        if (total > limit / o->stride)
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                             "%s: outputs[%d]: stride %lld * sum of splits %lld does not fit %s", op, i,
                             (long long)o->stride, (long long)total, moex_dtype_name(o->out.dtype));
    }
    for (int i = 0; i < a->num_outputs; i++) {
        const moex_offsets_output *o = &a->outputs[i];
        const int64_t first = o->start == MOEX_OFFSETS_LEADING_ZERO ? 1 : 0;
        int64_t sum = 0;
        if (o->out.dtype == MOEX_DTYPE_I32) {
            int32_t *out = (int32_t *)o->out.data;
            if (first) out[0] = 0;
            for (int64_t g = 0; g < G; g++) {
                sum += s[g];
                out[g + first] = (int32_t)(sum * o->stride);
            }
        } else {
            int64_t *out = (int64_t *)o->out.data;
            if (first) out[0] = 0;
            for (int64_t g = 0; g < G; g++) {
                sum += s[g];
                out[g + first] = sum * o->stride;
            }
        }
    }
    return MOEX_OK;
}

/* ---- the prepared groups ------------------------------------------------------------- */

size_t moex_cpu_groups_ws(moex_context *ctx, int64_t G, int64_t T, const moex_grouped_linear_args *fwd) {
    return moex_sz_bytes(G + 1, 1, sizeof(int64_t));
}

moex_status moex_cpu_groups_prepare(moex_context *ctx, const moex_call *c, const int64_t *splits, int64_t G,
                                    int64_t T, const moex_grouped_linear_args *fwd, void *ws, moex_groups *g) {
    int64_t *off = (int64_t *)ws;
    off[0] = 0;
    for (int64_t i = 0; i < G; i++) {
        const int64_t s = splits ? splits[i] : T;
        const int64_t rows = moex_split_rows(s, off[i], T);   /* the rule; bad splits where rows != s */
        if (s < 0)
            return moex_fail(ctx, MOEX_ERR_BAD_SPLITS, "%s: splits[%lld] = %lld is negative", c->op, (long long)i,
                             (long long)s);
        if (rows != s)
            return moex_fail(ctx, MOEX_ERR_BAD_SPLITS,
                             "%s: splits sum past T = %lld at group %lld (splits[%lld] = %lld after %lld rows)",
                             c->op, (long long)T, (long long)i, (long long)i, (long long)s, (long long)off[i]);
        off[i + 1] = off[i] + rows;
    }
    *g = (moex_groups){.G = G, .T = T, .splits = splits, .off = off};
    return MOEX_OK;
}

/* ---- zero_tail ------------------------------------------------------------------------ */

size_t moex_cpu_zero_tail_ws(moex_context *ctx, const moex_zero_tail_args *a, const moex_tail_dims *d) { return 0; }

moex_status moex_cpu_zero_tail(moex_context *ctx, const moex_call *c, const moex_groups *g,
                               const moex_zero_tail_args *a, const moex_tail_dims *d, void *ws) {
    const int64_t rows = d->T - g->off[g->G];   /* off[G] <= T: checked by the prepare */
    if (rows > 0 && d->row_bytes > 0) memset((char *)a->x.data + g->off[g->G] * d->row_bytes, 0, (size_t)(rows * d->row_bytes));
    return MOEX_OK;
}
