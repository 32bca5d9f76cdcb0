/*
 * sm90_scheduler.cuh - private: the device-side work schedule of the Hopper grouped GEMMs,
 * shared by the M-grouped kernel (forward, dgrad: sm90_grouped_gemm.cu) and the K-grouped
 * kernel (wgrad: sm90_grouped_wgrad.cu). Nothing here is known on the host: every thread
 * reads the split values itself, so a launch captured in a CUDA graph replays correctly for
 * any routing.
 *
 *   - Work units. The launch's work is a list of units, group after group; a policy says how
 *     many units a group of `rows` rows has: sm90_units_rows (M-grouped: the group's row tiles
 *     times the column tiles, in CM-tile units, see sm90_units) or sm90_units_fixed
 *     (K-grouped: the same number in every group, the output tiles of one dW_g).
 *   - The work list (sm90_sched). Worker w (cluster blockIdx.x / CM of P = gridDim.x / CM)
 *     takes units w, w + P, ...; with stream-K (M-grouped, below) the last round is cut
 *     along k instead.
 *   - The group cursor (sm90_cursor). It moves forward to the group that owns a unit: one
 *     group per step (the producer thread: it runs stages ahead, so its steps are hidden), or
 *     32 groups per step by a whole warp (the consumers: sm90_warp_split_scan). Unit indices
 *     of a worker only grow, so the walk is O(G + units) per worker. Split values are clipped
 *     to [0, T] before any sum and the running sum to T, so no value overflows a row offset.
 *   - The tile order inside a group (sm90_tile_order): bands of band_w column units, a band in
 *     blocks of band_r row units, row units fastest, so the CTAs that run at the same time
 *     share their operand tiles in L2.
 *   - Stream-K hand-over (sm90_sk_put / sm90_sk_add): f32 partial sums between the two
 *     workers that share a unit, through the workspace, with a release/acquire flag.
 * The unit count and the stream-K test are the heuristic's own (sm90_heuristics.h), so that
 * the host's plan and the kernel count alike.
 */
#ifndef MOEX_SM90_SCHEDULER_CUH
#define MOEX_SM90_SCHEDULER_CUH

#include <stdint.h>

#include "sm90_common.cuh"
#include "splits_rule.h"

#if MOEX_SM90_DEVICE

/* Group schedule, by a whole warp (all 32 lanes call it with the same arguments): lane i
 * reads the split value of group g0 + i, clipped to [0, T] (0 for groups past G), into *s,
 * and returns the inclusive prefix sum of those values over lanes 0..i (at most 32 T: no
 * overflow). One group per step would cost a dependent load each (docs/hopper.md). */
static __device__ __forceinline__ int64_t sm90_warp_split_scan(const int64_t *splits, int64_t g0, int64_t G, int64_t T,
                                                               int64_t *s) {
    const int lane = threadIdx.x % 32;
    /* loaded, then clipped (the order the kernels were measured with) */
    int64_t v = moex_split_clip(g0 + lane < G ? __ldg(splits + g0 + lane) : 0, T);
    *s = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int64_t u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += u;
    }
    return v;
}

/* ---- work units per group ------------------------------------------------------------ */

/* M-grouped units of mt row tiles and nt column tiles. With CM = 1 a unit is one tile
 * (units = mt nt). With CM = 2 the two CTAs of a cluster take two tiles that share an
 * operand, loaded half by each and multicast into both: a row pair (row tiles 2p and 2p + 1,
 * one column tile: they share the weight tile) for every whole pair of row tiles, then, for
 * the last row tile of a group with an odd count, column pairs (that row tile, column tiles
 * 2q and 2q + 1: they share the input tile), so no CTA computes a tile past its group:
 * units = (mt / 2) nt + (mt % 2) ceil(nt / 2). */
static __device__ __forceinline__ int64_t sm90_units(int64_t mt, int64_t nt, int cm) {
    return moex_sm90_units(mt, nt, cm);
}

/* The M-grouped policy: a group of `rows` rows has tiles(rows) = ceil(rows / bm) row tiles
 * and units(tiles) units. */
struct sm90_units_rows {
    int64_t nt;
    int bm, cm;
    __device__ __forceinline__ int64_t tiles(int64_t rows) const { return (rows + bm - 1) / bm; }
    __device__ __forceinline__ int64_t units(int64_t mt) const { return sm90_units(mt, nt, cm); }
};

/* The K-grouped policy: every group has per_group units, whatever its rows (an empty group's
 * output tiles are written too): each group counts as one "row tile" (the cursor's mt is 1
 * on a group, 0 before the first, which owns no units). */
struct sm90_units_fixed {
    int64_t per_group;
    __device__ __forceinline__ int64_t tiles(int64_t) const { return 1; }
    __device__ __forceinline__ int64_t units(int64_t mt) const { return mt != 0 ? per_group : 0; }
};

/* ---- the group cursor ------------------------------------------------------------------
 * The group g that owns the cursor's work units: rows [row0, row1) in mt = U::tiles(rows)
 * row tiles, units [tile0, tile0 + U::units(mt)). It starts before the first group (g = -1,
 * mt = 0), which every policy gives no units. */
typedef struct sm90_cursor {
    int g;
    int64_t mt;
    int64_t row0, row1, tile0;
} sm90_cursor;

static __device__ __forceinline__ void sm90_cursor_start(sm90_cursor *c) {
    c->g = -1;
    c->mt = 0;
    c->row0 = 0;
    c->row1 = 0;
    c->tile0 = 0;
}

/* Moves the cursor forward to the group that owns unit t (t never decreases between calls),
 * one group per step. Returns 0 when t is past the last unit. */
template <class U>
static __device__ __forceinline__ int sm90_cursor_seek(sm90_cursor *c, int64_t t, const int64_t *splits, int G,
                                                       int64_t T, const U &u) {
    while (t >= c->tile0 + u.units(c->mt)) {
        c->tile0 += u.units(c->mt);
        c->g++;
        if (c->g >= G) return 0;
        const int64_t s = moex_split_clip(__ldg(splits + c->g), T);   /* row0 + s cannot overflow */
        c->row0 = c->row1;
        c->row1 = c->row0 + s < T ? c->row0 + s : T;
        c->mt = u.tiles(c->row1 - c->row0);
    }
    return 1;
}

/* The same by the 32 lanes of a warp together, up to 32 groups per step: lane i looks at
 * group g + 1 + i, and the first lane whose units reach past t owns it. */
template <class U>
static __device__ __forceinline__ int sm90_cursor_seek_warp(sm90_cursor *c, int64_t t, const int64_t *splits, int G,
                                                            int64_t T, const U &u) {
    const int lane = threadIdx.x % 32;
    while (t >= c->tile0 + u.units(c->mt)) {
        if (c->g + 1 >= G) return 0;
        const int64_t tile_base = c->tile0 + u.units(c->mt), row_base = c->row1;
        int64_t s;
        const int64_t ps = sm90_warp_split_scan(splits, c->g + 1, G, T, &s);
        const int64_t row1 = row_base + ps < T ? row_base + ps : T;
        const int64_t row0 = row_base + ps - s < T ? row_base + ps - s : T;
        const int64_t mt = u.tiles(row1 - row0);
        int64_t pu = u.units(mt);   /* inclusive prefix of the units over lanes */
        for (int o = 1; o < 32; o <<= 1) {
            const int64_t v = __shfl_up_sync(0xffffffffu, pu, o);
            if (lane >= o) pu += v;
        }
        const unsigned hit = __ballot_sync(0xffffffffu, c->g + 1 + lane < G && t < tile_base + pu);
        const int L = hit != 0 ? __ffs((int)hit) - 1 : 31;
        c->g += 1 + L;
        c->row0 = __shfl_sync(0xffffffffu, row0, L);
        c->row1 = __shfl_sync(0xffffffffu, row1, L);
        c->mt = __shfl_sync(0xffffffffu, mt, L);
        c->tile0 = tile_base + __shfl_sync(0xffffffffu, pu, L) - u.units(c->mt);
        if (c->g >= G) return 0;   /* past the last group (lanes past G count no units) */
    }
    return 1;
}

/* ---- the tile order inside a group -----------------------------------------------------
 * Unit l of a group of `rows` row units by `cols` column units: bands of band_w column units
 * (the last band may be narrower), a band in blocks of band_r row units (the last block may
 * be lower), a block row units fastest. Returns the unit's row unit *ru and column unit *cu.
 * BLOCKS = false is band_r = 1 (one row unit per block: column units fastest inside a band)
 * with the divisions by it folded at compile time. */
template <bool BLOCKS>
static __device__ __forceinline__ void sm90_tile_order(int64_t l, int64_t rows, int64_t cols, int band_w,
                                                       int band_r, int64_t *ru, int64_t *cu) {
    const int64_t band = l / (rows * band_w), r = l - band * rows * band_w;
    const int64_t w = cols - band * band_w < band_w ? cols - band * band_w : band_w;
    if (BLOCKS) {
        const int64_t blk = r / (band_r * w), q = r - blk * band_r * w;
        const int64_t h = rows - blk * band_r < band_r ? rows - blk * band_r : band_r;
        *ru = blk * band_r + q % h;
        *cu = band * band_w + q / h;
    } else {
        *ru = r / w;
        *cu = band * band_w + r % w;
    }
}

/* Row and column of the first element of this CTA's tile (cluster rank `rank`) of unit t in
 * the cursor's M-grouped group (sm90_units_rows with bm, cm; nt column tiles of SM90_BN).
 * Row units (CM = 1: tiles; CM = 2: row pairs) go in the tile order above. Returns 1 for a
 * column pair (the CTAs share the input tile; the second column may be past the output
 * width), 0 otherwise. */
static __device__ __forceinline__ int sm90_rows_tile(const sm90_cursor *c, int64_t t, int64_t nt, int band_w,
                                                     int band_r, int bm, int cm, int rank, int64_t *m0, int *n0) {
    int64_t l = t - c->tile0;
    const int64_t rows = cm == 1 ? c->mt : c->mt / 2;
    if (l < rows * nt) {
        int64_t ru, cu;
        sm90_tile_order<true>(l, rows, nt, band_w, band_r, &ru, &cu);
        *m0 = c->row0 + (ru * cm + rank) * bm;
        *n0 = (int)(cu * SM90_BN);
        return 0;
    }
    l -= rows * nt;
    *m0 = c->row0 + (c->mt - 1) * bm;
    *n0 = (int)((2 * l + rank) * SM90_BN);
    return 1;
}

/* The first dW row n0 and column k0 of this CTA's tile (cluster rank `rank`) of unit t in the
 * cursor's K-grouped group (sm90_units_fixed: tnu N units of CM tiles of SM90_BM rows by tk K
 * tiles of SM90_BN columns): bands of band_w N units, N units fastest (sm90_tile_order with
 * one K tile per block), so the CTAs running at the same time cover about band_w N units by
 * grid / band_w K tiles and share both operands' columns in L2. */
static __device__ __forceinline__ void sm90_wgrad_tile(const sm90_cursor *c, int64_t t, int64_t tnu, int64_t tk,
                                                       int band_w, int cm, int rank, int *n0, int *k0) {
    int64_t kt, nu;
    sm90_tile_order<false>(t - c->tile0, tk, tnu, band_w, 1, &kt, &nu);
    *n0 = (int)((nu * cm + rank) * SM90_BM);
    *k0 = (int)kt * SM90_BN;
}

/* ---- the work list, with stream-K over the last round ----------------------------------
 * Worker w takes the units w, w + P, ... whole. When the U units leave a last round of
 * r = U % P units, P - r workers would idle while it runs. With a workspace (and at least
 * sk_min idle k steps per worker to win) the first D = U / P - 1 rounds stay whole and the
 * last P + r units are cut along k into P consecutive ranges of (P + r) nk / P >= nk k steps,
 * one per worker, in unit order. A unit is then split between at most two workers: w
 * computes its k steps [0, kb) last in its range, w + 1 the rest [kb, nk) first in its own.
 * w + 1 writes its f32 partial sums to its slot of the workspace and raises its flag; w, the
 * unit's owner, waits for the flag, adds them and runs the epilogue. A CTA writes at most one
 * partial per launch, the owner waits only on the next worker (no cycle), and the cut depends
 * on the split values through U only (the same in every run: deterministic). */
typedef struct sm90_work {
    int64_t t;      /* unit */
    int kb0, kb1;   /* its k steps done here: [kb0, kb1) */
} sm90_work;

typedef struct sm90_sched {
    int64_t t, step, dp_end;   /* whole units t, t + step, ... below dp_end */
    int64_t pos, pos_end;      /* this worker's stream-K range, in k steps from unit dp_end */
    int nk;
} sm90_sched;

/* sk: stream-K for the last round; U: the units of the launch (sm90_units_total), read only
 * when sk. Without it the list ends where the group cursor does. */
static __device__ __forceinline__ void sm90_sched_start(sm90_sched *s, bool sk, int64_t U, int nk, int cm,
                                                        int sk_min) {
    const int64_t P = gridDim.x / cm, w = blockIdx.x / cm;
    s->t = w;
    s->step = P;
    s->nk = nk;
    s->dp_end = INT64_MAX;   /* every unit whole: the walk ends where the cursor does */
    s->pos = s->pos_end = 0;
    if (sk && moex_sm90_sk_worth(U, P, nk, sk_min)) {
        s->dp_end = (U / P - 1) * P;
        const int64_t steps = (U - s->dp_end) * nk;
        s->pos = w * steps / P;
        s->pos_end = (w + 1) * steps / P;
    }
}

/* The next piece of work of this worker; false when there is none. */
static __device__ __forceinline__ bool sm90_sched_next(sm90_sched *s, sm90_work *wk) {
    if (s->t < s->dp_end) {
        wk->t = s->t;
        wk->kb0 = 0;
        wk->kb1 = s->nk;
        s->t += s->step;
        return true;
    }
    if (s->pos >= s->pos_end) return false;
    wk->t = s->dp_end + s->pos / s->nk;
    wk->kb0 = (int)(s->pos % s->nk);
    wk->kb1 = s->pos_end - s->pos < s->nk - wk->kb0 ? wk->kb0 + (int)(s->pos_end - s->pos) : s->nk;
    s->pos += wk->kb1 - wk->kb0;
    return true;
}

/* A worker's walk: its work list and the group cursor that follows it. */
typedef struct sm90_walk {
    sm90_sched sch;
    sm90_cursor cur;
    sm90_work w;   /* the current piece of work, in group cur.g */
} sm90_walk;

static __device__ __forceinline__ void sm90_walk_start(sm90_walk *k, bool sk, int64_t U, int nk, int cm, int sk_min) {
    sm90_cursor_start(&k->cur);
    sm90_sched_start(&k->sch, sk, U, nk, cm, sk_min);
}

/* The next piece of work (k->w) and its group (k->cur); false when the walk is over. WARP:
 * the 32 lanes of a warp walk together (sm90_cursor_seek_warp), else one thread. */
template <bool WARP, class U>
static __device__ __forceinline__ bool sm90_walk_next(sm90_walk *k, const int64_t *splits, int G, int64_t T,
                                                      const U &u) {
    if (!sm90_sched_next(&k->sch, &k->w)) return false;
    return WARP ? sm90_cursor_seek_warp(&k->cur, k->w.t, splits, G, T, u)
                : sm90_cursor_seek(&k->cur, k->w.t, splits, G, T, u);
}

/* The units of the launch (all groups) under policy u, by a whole warp. */
template <class U>
static __device__ __forceinline__ int64_t sm90_units_total(const int64_t *splits, int G, int64_t T, const U &u) {
    int64_t row_base = 0, units = 0;
    for (int g0 = 0; g0 < G; g0 += 32) {
        int64_t s;
        const int64_t ps = sm90_warp_split_scan(splits, g0, G, T, &s);
        const int64_t row1 = row_base + ps < T ? row_base + ps : T;
        const int64_t row0 = row_base + ps - s < T ? row_base + ps - s : T;
        int64_t n = u.units(u.tiles(row1 - row0));
        for (int o = 16; o > 0; o >>= 1) n += __shfl_xor_sync(0xffffffffu, n, o);
        units += n;
        const int64_t all = __shfl_sync(0xffffffffu, ps, 31);
        row_base = row_base + all < T ? row_base + all : T;
    }
    /* lane 0's value: the compiler then knows it is warp-uniform, and so is the k range of
     * every piece of work (the consumers' k loop stays in uniform registers) */
    return __shfl_sync(0xffffffffu, units, 0);
}

/* ---- stream-K hand-over ----------------------------------------------------------------
 * A partial of consumer warpgroup c: slot 2 blockIdx.x + c of the workspace holds
 * [NA / 4][128 threads] float4 (thread tid's accumulators), flag[slot] says it is there. */
template <int NA>
static __device__ __forceinline__ void sm90_sk_put(const float (&acc)[NA], float4 *part, int *flag, int slot, int c,
                                                   int tid) {
    float4 *p = part + (size_t)slot * (NA / 4) * 128 + tid;
#pragma unroll
    for (int v = 0; v < NA / 4; v++)
        __stcg(p + v * 128, make_float4(acc[4 * v], acc[4 * v + 1], acc[4 * v + 2], acc[4 * v + 3]));
    sm90_named_barrier(1 + c, 128);   /* every thread's part written */
    if (tid == 0) sm90_flag_release(flag + slot, 1);
}

/* acc += the partial in `slot` (written by sm90_sk_put of another CTA), once it is there. */
template <int NA>
static __device__ __forceinline__ void sm90_sk_add(float (&acc)[NA], const float4 *part, const int *flag, int slot,
                                                   int c, int tid) {
    if (tid == 0)
        while (sm90_flag_acquire(flag + slot) == 0) __nanosleep(64);
    sm90_named_barrier(1 + c, 128);
    const float4 *p = part + (size_t)slot * (NA / 4) * 128 + tid;
#pragma unroll
    for (int v = 0; v < NA / 4; v++) {
        const float4 q = __ldcg(p + v * 128);
        acc[4 * v] += q.x;
        acc[4 * v + 1] += q.y;
        acc[4 * v + 2] += q.z;
        acc[4 * v + 3] += q.w;
    }
}

/* The caller's bad-input flag (optional): one thread sets *flag to value (only if it is 0)
 * when the splits are bad (splits_rule.h), as the CUDA backend's schedule kernel does. */
static __device__ __forceinline__ void sm90_check_splits(const int64_t *splits, int G, int64_t T, int *flag,
                                                         int value) {
    int64_t sum = 0;
    int bad = 0;
    for (int g = 0; g < G && !bad; g++) {
        sum += moex_split_count(splits[g], T, &bad);   /* at most G (T + 1): no wrap */
        bad |= sum > T;
    }
    if (bad) atomicCAS(flag, 0, value);
}

#endif /* MOEX_SM90_DEVICE */

#endif /* MOEX_SM90_SCHEDULER_CUH */
