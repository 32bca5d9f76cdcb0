/*
 * sm90_heuristics.c - the Hopper grouped GEMMs' launch plan from the shapes (contract in
 * sm90_heuristics.h). Pure C: no CUDA, no allocation, no global state, so it builds and is
 * tested (tests/test_sm90_heuristics.c) in CPU-only configurations too.
 */
#include "sm90_heuristics.h"

#include <string.h>

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

int moex_sm90_tile_rows(int64_t T, int64_t G, int64_t N, int64_t K) {
    (void)N;
    (void)K;
    return T < 128 * G ? 64 : 128;
}

/* tune->l2_promotion in bytes (0: none). */
static int l2_promotion(const moex_sm90_tuning *tune) {
    switch (tune != NULL ? tune->l2_promotion : 0) {
    case 1: return 0;
    case 64: return 64;
    case 128: return 128;
    default: return MOEX_SM90_L2_PROMOTION;
    }
}

/* The clusters (of cm CTAs) to launch: `slots` resident at once, fewer when tune->grid asks
 * for fewer CTAs (at least one cluster), and never more than `units`. */
static int grid_of(int64_t units, int slots, int cm, const moex_sm90_tuning *tune) {
    if (tune != NULL && tune->grid > 0 && tune->grid / cm < slots) slots = tune->grid / cm;
    if (slots < 1) slots = 1;
    return (int)min64(units, slots) * cm;
}

static void plan_wgrad(const moex_sm90_device *d, const moex_sm90_shape *s, const moex_sm90_tuning *tune,
                       moex_sm90_plan *p) {
    p->tile_rows = MOEX_SM90_TILE_M;
    p->cluster = tune != NULL && tune->cluster == 2 ? 2 : 1;
    /* every group has the same output tiles: ceil(N / 128) in units of `cluster` by ceil(K / 256) */
    const int64_t per_group = cdiv(cdiv(s->N, MOEX_SM90_TILE_M), p->cluster) * cdiv(s->K, MOEX_SM90_TILE_N);
    const int64_t units = per_group > INT64_MAX / s->G ? INT64_MAX : s->G * per_group;   /* < 2^45 each */
    p->grid = grid_of(units, p->cluster > 1 ? d->wgrad_cluster_slots : d->sms, p->cluster, tune);
    const int band = tune != NULL && tune->band > 0 ? tune->band : MOEX_SM90_WGRAD_BAND;
    p->band = band / p->cluster > 0 ? band / p->cluster : 1;
}

void moex_sm90_plan_make(const moex_sm90_device *d, const moex_sm90_shape *s, const moex_sm90_tuning *tune,
                         moex_sm90_plan *p) {
    memset(p, 0, sizeof *p);
    p->epilogue_tma = tune == NULL || tune->epilogue_tma;
    p->l2_promotion = l2_promotion(tune);
    if (s->product == MOEX_SM90_WGRAD) {
        plan_wgrad(d, s, tune, p);
        return;
    }
    const bool dgrad = s->product == MOEX_SM90_DGRAD, glu = MOEX_SM90_EPI_IS_GLU(s->epi);
    const int bm = tune != NULL && (tune->tile_rows == 64 || tune->tile_rows == 128)
                       ? tune->tile_rows
                       : moex_sm90_tile_rows(s->T, s->G, s->N, s->K);
    /* 2-CTA clusters for every 128-row product with the TMA epilogue: the register epilogue
     * is built without */
    const bool cluster_ok = bm == 128 && p->epilogue_tma;
    const int cm = cluster_ok && (tune == NULL || tune->cluster != 1) ? 2 : 1;
    const int band_rows = tune != NULL && tune->band_rows > 0 ? tune->band_rows : MOEX_SM90_BAND_ROWS;
    p->tile_rows = bm;
    p->cluster = cm;
    p->band = tune != NULL && tune->band > 0 ? tune->band : MOEX_SM90_BAND;
    p->band_rows = band_rows / (bm * cm) > 0 ? band_rows / (bm * cm) : 1;   /* in row units */

    /* kernel view: out = in [T, red] times B_g (red x out_w); the GLU's column tiles are
     * 128 z columns (256 of h) */
    const int64_t red = dgrad ? s->N : s->K, out_w = dgrad ? s->K : s->N;
    const int64_t nt = glu ? cdiv(s->N / 2, 128) : cdiv(out_w, MOEX_SM90_TILE_N);
    /* at most one CTA (cluster) per unit: every group has at most one partial row tile */
    const int64_t max_units = (cdiv(cdiv(s->T, bm), cm) + s->G) * nt;
    p->grid = grid_of(max_units, cm > 1 ? d->rows_cluster_slots : d->sms, cm, tune);

    /* Stream-K: with a workspace, where groups of T / G rows each would leave a last round
     * worth cutting (the kernel decides again from the actual split values). The plain and
     * bias forward only: the dgrad and the GLU did not gain from it (docs/hopper.md);
     * stream_k = 2 (tests): whenever there is a last round, any product but the DGLU dgrad (built
     * without a stream-K instance). */
    const int mode = tune != NULL ? tune->stream_k : 0;
    p->sk_min = mode == 2 ? 0 : MOEX_SM90_SK_MIN_STEPS;
    if (s->workspace && mode != 1) {
        const int64_t P = p->grid / cm, nk = cdiv(red, MOEX_SM90_TILE_K);
        const int64_t units_est = s->G * moex_sm90_units(cdiv(s->T / s->G, bm), nt, cm);
        p->stream_k = (mode == 2 && !MOEX_SM90_EPI_IS_DGLU(s->epi)) ||
                      (!dgrad && !glu && moex_sm90_sk_worth(units_est, P, (int)nk, p->sk_min));
    }
}

size_t moex_sm90_sk_flag_bytes(const moex_sm90_device *d) {
    return ((size_t)2 * (size_t)d->sms * sizeof(int) + 255) / 256 * 256;
}

size_t moex_sm90_plan_workspace_bytes(const moex_sm90_device *d, const moex_sm90_plan *p) {
    if (!p->stream_k) return 0;
    return moex_sm90_sk_flag_bytes(d) + (size_t)2 * (size_t)p->grid * MOEX_SM90_SK_SLOT_BYTES;
}

size_t moex_sm90_workspace_bytes_max(const moex_sm90_device *d) {
    if (d->sms < 1) return 0;
    return moex_sm90_sk_flag_bytes(d) + (size_t)2 * (size_t)d->sms * MOEX_SM90_SK_SLOT_BYTES;
}
