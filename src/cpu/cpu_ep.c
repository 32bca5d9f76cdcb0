/*
 * cpu_ep.c - the CPU backend's local kernels of expert parallelism (moex_ep_kernels, the
 * contract in src/core/ep.h): routing tokens to ranks, packing and unpacking wire rows, and
 * the fixed-order f32 sums of the combine. Host memory, single-threaded (the ranks of an
 * MPI job are the parallelism). Counts from the transport are clamped to [0, Tm], ids and
 * maps checked against their ranges; nothing is written outside T tokens or R expert rows.
 */
#include "cpu_convert.h"
#include "cpu_ops.h"
#include "ep.h"

#include <string.h>

/* A wire row of the receive buffer, and row `row` (region row / Tm) of the outgoing regions. */
static inline char *wire_row(void *buf, const moex_ep_geom *g, int64_t row) {
    return (char *)buf + (size_t)row * g->wire;
}
static inline char *out_row(void *const *out, const moex_ep_geom *g, int64_t row) {
    return (char *)out[row / g->Tm] + (size_t)(row % g->Tm) * g->wire;
}

static inline int64_t clamp_count(int64_t n, int64_t Tm) { return n < 0 ? 0 : n > Tm ? Tm : n; }

/* Token t's slot j is its rank's first: a valid slot_row no earlier slot shares. */
static bool first_slot(const int32_t *slots, int64_t j) {
    if (slots[j] < 0) return false;
    for (int64_t i = 0; i < j; i++)
        if (slots[i] == slots[j]) return false;
    return true;
}

static moex_status cpu_ep_route(moex_context *ctx, const moex_call *c, const moex_ep_geom *g, const int32_t *ids,
                                const moex_ep_routing *r) {
    for (int64_t i = 0; i < g->T * g->k; i++)
        if (ids[i] < 0 || ids[i] >= g->E)
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: ids[%lld][%lld] = %d is outside [0, E = %lld)", c->op,
                             (long long)(i / g->k), (long long)(i % g->k), (int)ids[i], (long long)g->E);
    for (int32_t w = 0; w < g->world; w++) r->send_counts[w] = 0;
    for (int64_t t = 0; t < g->T; t++)
        for (int64_t j = 0; j < g->k; j++) {
            const int64_t w = ids[t * g->k + j] / g->El;
            int64_t prev = -1;   /* an earlier slot of t to the same rank shares its row */
            for (int64_t i = 0; i < j && prev < 0; i++)
                if (ids[t * g->k + i] / g->El == w) prev = r->slot_row[t * g->k + i];
            r->slot_row[t * g->k + j] = (int32_t)(prev >= 0 ? prev : w * g->Tm + r->send_counts[w]++);
        }
    return MOEX_OK;
}

static moex_status cpu_ep_pack(moex_context *ctx, const moex_call *c, const moex_ep_geom *g,
                               const moex_ep_routing *r, const moex_ep_rows *src, const int32_t *ids,
                               const float *probs, void *const *out) {
    const size_t at = g->meta;   /* the meta words */
    for (int64_t t = 0; t < g->T; t++) {
        const int32_t *slots = r->slot_row + t * g->k;
        for (int64_t j = 0; j < g->k; j++) {
            if (!first_slot(slots, j) || slots[j] >= g->world * g->Tm) continue;
            char *row = out_row(out, g, slots[j]);
            memcpy(row, (const char *)src->a + (size_t)t * src->a_bytes, src->a_bytes);
            if (src->b) memcpy(row + src->a_bytes, (const char *)src->b + (size_t)t * src->b_bytes, src->b_bytes);
            if (!ids) continue;
            const int64_t w = slots[j] / g->Tm;
            int32_t *local = (int32_t *)(row + at);
            float *p = (float *)(local + g->k);
            for (int64_t i = 0; i < g->k; i++) {
                const int32_t e = ids[t * g->k + i];
                local[i] = e / g->El == w ? (int32_t)(e - w * g->El) : -1;
                p[i] = probs[t * g->k + i];
            }
        }
    }
    return MOEX_OK;
}

static moex_status cpu_ep_expand_plan(moex_context *ctx, const moex_call *c, const moex_ep_geom *g,
                                      const moex_ep_routing *r, const void *rcv, int64_t *splits, int64_t *dropped) {
    const size_t at = g->meta;   /* the meta words */
    const int64_t entries = g->world * g->Tm * g->k;
    for (int64_t i = 0; i < entries; i++) r->recv_map[i] = -1;
    for (int32_t e = 0; e < g->El; e++) splits[e] = 0;
    /* Counts per expert (pass 0), then each entry's row (pass 1, splits[e] the next free row
     * of expert e): expert e's rows in (region, row, slot) order, as if R were unbounded. */
    for (int pass = 0; pass < 2; pass++) {
        int64_t base = 0;
        for (int32_t e = 0; pass == 1 && e < g->El; e++) {
            const int64_t n = splits[e];
            splits[e] = base;
            base += n;
        }
        for (int32_t s = 0; s < g->world; s++) {
            const int64_t n = clamp_count(r->recv_counts[s], g->Tm);
            for (int64_t i = 0; i < n; i++) {
                const int64_t row = s * g->Tm + i;
                const int32_t *local = (const int32_t *)(wire_row((void *)rcv, g, row) + at);
                for (int64_t j = 0; j < g->k; j++) {
                    const int32_t e = local[j];
                    if (e < 0 || e >= g->El) continue;
                    if (pass == 0) splits[e]++;
                    else r->recv_map[row * g->k + j] = (int32_t)splits[e]++;   /* past R: dropped below */
                }
            }
        }
    }
    /* splits[e] is now the end of expert e's rows; drop the rows past R. */
    int64_t drop = 0, start = 0;
    for (int32_t e = 0; e < g->El; e++) {
        const int64_t end = splits[e];
        const int64_t lo = start < g->R ? start : g->R, hi = end < g->R ? end : g->R;
        drop += (end - start) - (hi - lo);
        splits[e] = hi - lo;
        start = end;
    }
    for (int64_t i = 0; i < entries; i++)
        if (r->recv_map[i] >= g->R) r->recv_map[i] = -1;
    if (dropped) *dropped = drop;
    return MOEX_OK;
}

/* Calls fn(row, slot j, expert row m) for every valid map entry of the received rows. */
#define FOR_EACH_ENTRY(g, r, BODY)                                                                \
    for (int32_t s_ = 0; s_ < (g)->world; s_++) {                                                 \
        const int64_t n_ = clamp_count((r)->recv_counts[s_], (g)->Tm);                             \
        for (int64_t i_ = 0; i_ < n_; i_++) {                                                     \
            const int64_t row = s_ * (g)->Tm + i_;                                                \
            BODY                                                                                  \
        }                                                                                         \
    }

static moex_status cpu_ep_expand_rows(moex_context *ctx, const moex_call *c, const moex_ep_geom *g,
                                      const moex_ep_routing *r, const void *rcv, const moex_ep_rows *dst,
                                      float *probs_r) {
    const size_t at = g->meta;   /* the meta words */
    FOR_EACH_ENTRY(g, r, {
        const char *w = wire_row((void *)rcv, g, row);
        const float *p = (const float *)(w + at) + g->k;
        for (int64_t j = 0; j < g->k; j++) {
            const int32_t m = r->recv_map[row * g->k + j];
            if (m < 0 || m >= g->R) continue;
            memcpy((char *)dst->a + (size_t)m * dst->a_bytes, w, dst->a_bytes);
            if (dst->b) memcpy((char *)dst->b + (size_t)m * dst->b_bytes, w + dst->a_bytes, dst->b_bytes);
            if (probs_r) probs_r[m] = p[j];
        }
    })
    return MOEX_OK;
}

static moex_status cpu_ep_gather_local(moex_context *ctx, const moex_call *c, const moex_ep_geom *g,
                                       const moex_ep_routing *r, const void *src, const float *dsrc,
                                       void *const *out) {
    const size_t at = g->meta;   /* the meta words */
    FOR_EACH_ENTRY(g, r, {
        char *w = out_row(out, g, row);
        const int32_t *map = r->recv_map + row * g->k;
        for (int64_t h = 0; h < g->H; h++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < g->k; j++)
                if (map[j] >= 0 && map[j] < g->R) acc += moex_cpu_load1(src, g->dt, map[j] * g->H + h);
            moex_cpu_store1(w, g->dt, h, acc);
        }
        if (dsrc) {
            float *meta = (float *)(w + at);
            for (int64_t j = 0; j < g->k; j++) meta[j] = map[j] >= 0 && map[j] < g->R ? dsrc[map[j]] : 0.0f;
        }
    })
    return MOEX_OK;
}

static moex_status cpu_ep_reduce(moex_context *ctx, const moex_call *c, const moex_ep_geom *g,
                                 const moex_ep_routing *r, const void *rcv, void *dst, moex_dtype dst_dt,
                                 float *dprobs) {
    const size_t at = g->meta;   /* the meta words */
    const int64_t rows = g->world * g->Tm;
    for (int64_t t = 0; t < g->T; t++) {
        const int32_t *slots = r->slot_row + t * g->k;
        for (int64_t h = 0; h < g->H; h++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < g->k; j++)
                if (first_slot(slots, j) && slots[j] < rows)
                    acc += moex_cpu_load1(wire_row((void *)rcv, g, slots[j]), g->dt, h);
            moex_cpu_store1(dst, dst_dt, t * g->H + h, acc);
        }
        if (dprobs)
            for (int64_t j = 0; j < g->k; j++) {
                const bool ok = slots[j] >= 0 && slots[j] < rows;
                dprobs[t * g->k + j] = ok ? ((const float *)(wire_row((void *)rcv, g, slots[j]) + at))[j] : 0.0f;
            }
    }
    return MOEX_OK;
}

const moex_ep_kernels moex_cpu_ep_kernels = {
    .route = cpu_ep_route,
    .pack = cpu_ep_pack,
    .expand_plan = cpu_ep_expand_plan,
    .expand_rows = cpu_ep_expand_rows,
    .gather_local = cpu_ep_gather_local,
    .reduce = cpu_ep_reduce,
};
