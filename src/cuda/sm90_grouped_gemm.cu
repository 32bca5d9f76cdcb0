/*
 * sm90_grouped_gemm.cu - the Hopper (sm_90a) M-grouped GEMMs: the forward y_g = x_g W_g^T
 * with its fused epilogues (bias, probs-scaled bias, the grouped MLP's FC1 with the scaled
 * GLU writing h and z) and the dgrad dx_g = dy_g W_g (contract in sm90_grouped_gemm.h; the
 * K-grouped weight gradient is sm90_grouped_wgrad.cu; docs/hopper.md tells the story).
 *
 * Design:
 *   - persistent grid, one CTA of 384 threads per SM: warpgroup 0 is the producer (one
 *     thread issues TMA loads), warpgroups 1 and 2 are consumers, f32 accumulators in
 *     registers. Tiles of 128 rows x 256 columns (each consumer 64 x 256, wgmma m64n256k16)
 *     or, for small groups, 64 x 256 (each consumer 64 x 128, m64n128k16);
 *   - a ring of 4 shared-memory stages, each an input tile [BM rows, 64 k] and a weight tile
 *     of 256 output columns by 64 k, 128-byte swizzled by TMA; a full and an empty mbarrier
 *     per stage. Forward: the weight tile is K-major (W_g rows); dgrad: it is MN-major (four
 *     boxes of 64 W_g rows by 64 columns) and wgmma reads it transposed;
 *   - a device-side tile schedule: every thread walks the groups with a cursor (tile
 *     indices of a CTA only grow, so the walk is O(G + tiles) per CTA), reading the split
 *     values from device memory; nothing about the splits is known on the host;
 *   - tile order inside a group: bands of SM90_BAND column tiles, a band in blocks of
 *     SM90_BAND_ROWS input rows, row tiles fastest, so CTAs running at the same time share
 *     weight tiles and input tiles in L2;
 *   - input tiles are loaded from the global row offset of the group, so a tile can
 *     straddle the next group (or the rows past off[G]; TMA zero-fills past T); those rows
 *     are computed but never stored: full blocks inside the group leave through a swizzled
 *     shared-memory staging buffer and TMA stores, other blocks through masked stores from
 *     registers (rows below the group's end, columns below the output width);
 *   - the epilogue's inputs (bias row, probs) are fetched while the tile is computed;
 *   - the plain 128-row forward and dgrad run in 2-CTA clusters: the two CTAs take two
 *     tiles that share the weight tile (or, on a group's odd last row tile, the input tile)
 *     and load half of it each, multicast into both, which halves that operand's L2 traffic;
 *   - tuning knobs (tests, benchmarks): no cluster, masked register stores everywhere
 *     instead of the TMA epilogue, the grid size, the band width and height, the tile height.
 * Tensor maps depend on pointers and shapes only, so a launch captured in a CUDA graph stays
 * correct when the split values change.
 */
#include <atomic>

#include "glu_math.h"
#include "sm90_common.cuh"


#define SM90_C_ELEMS (64 * 128)       /* a consumer's output staging: 64 rows x 128 columns */
/* stages of BM input rows and 256 weight rows by 64 k + output staging (2 consumers) +
 * barriers + slack to align to 1024 bytes */
static size_t sm90_smem_bytes(int bm) {
    return (size_t)SM90_STAGES * (bm + SM90_BN) * SM90_BK * 2 + 2 * SM90_C_ELEMS * 2 + 2 * SM90_STAGES * 8 + 1024;
}

/* Stream-K (sm90_sched below): whether the last round of U units on P workers is worth
 * cutting along k: at least sk_min k steps saved per worker (the partials' round trip
 * through L2 costs about 10; measured, SM90_SK_MIN = 40 is where it starts to pay). */
#define SM90_SK_MIN 40
static __host__ __device__ __forceinline__ bool sm90_sk_worth(int64_t U, int64_t P, int nk, int sk_min) {
    const int64_t r = U % P;
    return r != 0 && U > P && (P - r) * nk >= (int64_t)sk_min * P;
}

/* ---- the device-side group schedule ------------------------------------------------- */

#if MOEX_SM90_DEVICE

/* The group that owns the cursor's work units: rows [row0, row1) in mt row tiles, units
 * [tile0, tile0 + units). With CM = 1 a unit is one tile (units = mt nt). With CM = 2 the two
 * CTAs of a cluster take two tiles that share an operand, loaded half by each and multicast
 * into both: a row pair (row tiles 2p and 2p + 1, one column tile: they share the weight
 * tile) for every whole pair of row tiles, then, for the last row tile of a group with an
 * odd count, column pairs (that row tile, column tiles 2q and 2q + 1: they share the input
 * tile), so no CTA computes a tile past its group:
 * units = (mt / 2) nt + (mt % 2) ceil(nt / 2). */
typedef struct sm90_cursor {
    int g;
    int64_t mt;
    int64_t row0, row1, tile0;
} sm90_cursor;

static __device__ __forceinline__ int64_t sm90_units(int64_t mt, int64_t nt, int cm) {
    return cm == 1 ? mt * nt : (mt / 2) * nt + (mt % 2) * ((nt + 1) / 2);
}

static __device__ __forceinline__ void sm90_cursor_start(sm90_cursor *c) {
    c->g = -1;
    c->mt = 0;
    c->row0 = 0;
    c->row1 = 0;
    c->tile0 = 0;
}

/* Moves the cursor forward to the group that owns unit t (t never decreases between calls).
 * Returns 0 when t is past the last unit. */
static __device__ __forceinline__ int sm90_cursor_seek(sm90_cursor *c, int64_t t, const int64_t *splits, int G,
                                                       int64_t T, int64_t nt, int bm, int cm) {
    while (t >= c->tile0 + sm90_units(c->mt, nt, cm)) {
        c->tile0 += sm90_units(c->mt, nt, cm);
        c->g++;
        if (c->g >= G) return 0;
        int64_t s = __ldg(splits + c->g);
        s = s < 0 ? 0 : s > T ? T : s;   /* clipped first: row0 + s cannot overflow */
        c->row0 = c->row1;
        c->row1 = c->row0 + s < T ? c->row0 + s : T;
        c->mt = (c->row1 - c->row0 + bm - 1) / bm;
    }
    return 1;
}

/* The same by the 32 lanes of a warp together (the consumers; see sm90_warp_split_scan):
 * lane i looks at group g + 1 + i, and the first lane whose units reach past t owns it. */
static __device__ __forceinline__ int sm90_cursor_seek_warp(sm90_cursor *c, int64_t t, const int64_t *splits, int G,
                                                            int64_t T, int64_t nt, int bm, int cm) {
    const int lane = threadIdx.x % 32;
    while (t >= c->tile0 + sm90_units(c->mt, nt, cm)) {
        if (c->g + 1 >= G) return 0;
        const int64_t tile_base = c->tile0 + sm90_units(c->mt, nt, cm), row_base = c->row1;
        int64_t s;
        const int64_t ps = sm90_warp_split_scan(splits, c->g + 1, G, T, &s);
        const int64_t row1 = row_base + ps < T ? row_base + ps : T;
        const int64_t row0 = row_base + ps - s < T ? row_base + ps - s : T;
        const int64_t mt = (row1 - row0 + bm - 1) / bm;
        int64_t pu = sm90_units(mt, nt, cm);   /* inclusive prefix of the units over lanes */
        for (int o = 1; o < 32; o <<= 1) {
            const int64_t u = __shfl_up_sync(0xffffffffu, pu, o);
            if (lane >= o) pu += u;
        }
        const unsigned hit = __ballot_sync(0xffffffffu, c->g + 1 + lane < G && t < tile_base + pu);
        const int L = hit != 0 ? __ffs((int)hit) - 1 : 31;
        c->g += 1 + L;
        c->row0 = __shfl_sync(0xffffffffu, row0, L);
        c->row1 = __shfl_sync(0xffffffffu, row1, L);
        c->mt = __shfl_sync(0xffffffffu, mt, L);
        c->tile0 = tile_base + __shfl_sync(0xffffffffu, pu, L) - sm90_units(c->mt, nt, cm);
        if (c->g >= G) return 0;   /* past the last group (lanes past G count no units) */
    }
    return 1;
}

/* Row and column of the first element of this CTA's tile (cluster rank `rank`) of unit t in
 * the cursor's group. Row units (CM = 1: tiles; CM = 2: row pairs) go in bands of band_w
 * column tiles; a band in blocks of band_r row units; a block row units fastest. So the
 * units running at the same time cover about band_r row units by band_w column tiles of a
 * group and share their input and weight tiles in L2. Returns 1 for a column pair (the
 * CTAs share the input tile; the second column may be past the output width), 0 otherwise. */
static __device__ __forceinline__ int sm90_tile_coords(const sm90_cursor *c, int64_t t, int64_t nt, int band_w,
                                                       int band_r, int bm, int cm, int rank, int64_t *m0, int *n0) {
    int64_t l = t - c->tile0;
    const int64_t rows = cm == 1 ? c->mt : c->mt / 2;
    if (l < rows * nt) {
        /* band (w column tiles: the last band may be narrower), block (h row units: the last
         * block may be lower), unit q of the block */
        const int64_t band = l / (rows * band_w), r = l - band * rows * band_w;
        const int64_t w = nt - band * band_w < band_w ? nt - band * band_w : band_w;
        const int64_t blk = r / (band_r * w), q = r - blk * band_r * w;
        const int64_t h = rows - blk * band_r < band_r ? rows - blk * band_r : band_r;
        *m0 = c->row0 + ((blk * band_r + q % h) * cm + rank) * bm;
        *n0 = (int)((band * band_w + q / h) * SM90_BN);
        return 0;
    }
    l -= rows * nt;
    *m0 = c->row0 + (c->mt - 1) * bm;
    *n0 = (int)((2 * l + rank) * SM90_BN);
    return 1;
}

/* The units of the launch (all groups), by a whole warp. */
static __device__ __forceinline__ int64_t sm90_units_total(const int64_t *splits, int G, int64_t T, int64_t nt, int bm,
                                                           int cm) {
    int64_t row_base = 0, units = 0;
    for (int g0 = 0; g0 < G; g0 += 32) {
        int64_t s;
        const int64_t ps = sm90_warp_split_scan(splits, g0, G, T, &s);
        const int64_t row1 = row_base + ps < T ? row_base + ps : T;
        const int64_t row0 = row_base + ps - s < T ? row_base + ps - s : T;
        int64_t u = sm90_units((row1 - row0 + bm - 1) / bm, nt, cm);
        for (int o = 16; o > 0; o >>= 1) u += __shfl_xor_sync(0xffffffffu, u, o);
        units += u;
        const int64_t all = __shfl_sync(0xffffffffu, ps, 31);
        row_base = row_base + all < T ? row_base + all : T;
    }
    /* lane 0's value: the compiler then knows it is warp-uniform, and so is the k range of
     * every piece of work (the consumers' k loop stays in uniform registers) */
    return __shfl_sync(0xffffffffu, units, 0);
}

/* ---- stream-K over the last round ----------------------------------------------------
 * Worker w (cluster blockIdx.x / CM of P = gridDim.x / CM) takes the units w, w + P, ...
 * whole. When the U units leave a last round of r = U % P units, P - r workers would idle
 * while it runs. With a workspace (and at least sk_min idle k steps per worker to win)
 * the first D = U / P - 1 rounds stay whole and the last P + r units are cut along k into P
 * consecutive ranges of (P + r) nk / P >= nk k steps, one per worker, in unit order. A unit
 * is then split between at most two workers: w computes its k steps [0, kb) last in its
 * range, w + 1 the rest [kb, nk) first in its own. w + 1 writes its f32 partial sums to its
 * slot of the workspace and raises its flag; w, the unit's owner, waits for the flag, adds
 * them and runs the epilogue. A CTA writes at most one partial per launch, the owner waits
 * only on the next worker (no cycle), and the cut depends on the split values through U
 * only (the same in every run: deterministic). */
typedef struct sm90_work {
    int64_t t;      /* unit */
    int kb0, kb1;   /* its k steps done here: [kb0, kb1) */
} sm90_work;

typedef struct sm90_sched {
    int64_t t, step, dp_end;   /* whole units t, t + step, ... below dp_end */
    int64_t pos, pos_end;      /* this worker's stream-K range, in k steps from unit dp_end */
    int nk;
} sm90_sched;

/* U: the units of the launch (sm90_units_total), read only when sk. */
static __device__ __forceinline__ void sm90_sched_start(sm90_sched *s, bool sk, int64_t U, int nk, int cm,
                                                        int sk_min) {
    const int64_t P = gridDim.x / cm, w = blockIdx.x / cm;
    s->t = w;
    s->step = P;
    s->nk = nk;
    s->dp_end = INT64_MAX;   /* every unit whole: the walk ends where the cursor does */
    s->pos = s->pos_end = 0;
    if (sk && sm90_sk_worth(U, P, nk, sk_min)) {
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

/* A stream-K partial of consumer warpgroup c: slot 2 blockIdx.x + c of the workspace holds
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

#endif /* MOEX_SM90_DEVICE */

/* ---- the epilogue ------------------------------------------------------------------------
 * A consumer warpgroup owns a block of 64 rows by NC columns of the CTA tile: with BM = 128
 * rows [64 c, 64 c + 64) and all NC = 256 columns, with BM = 64 all rows and the NC = 128
 * columns [128 c, 128 c + 128). Thread (warp, lane) holds block rows rl = 16 warp + lane / 4
 * and rl + 8, and for every j < NC / 8 the block columns lc = 8 j + 2 (lane % 4) + {0, 1}:
 * acc[4 j + {0, 1}] (row rl) and acc[4 j + {2, 3}] (row rl + 8).
 *
 * EPI: 0 y = acc; 1 y = acc + b_g or acc + p_r b_g (bias [G, N], f32 or the input dtype);
 * 2 and 3: FC1 of the grouped MLP with the scaled GLU fused: h = acc (+ b_g) rounded to the
 * input dtype is stored, then z = p_r glu(h) [T, F], GLU halves CONTIGUOUS (2) or
 * INTERLEAVED_32 (3). A GLU output element needs its two halves in one thread, so the
 * column tiles are "virtual": column tile t yields the z columns [128 t, 128 t + 128), and a
 * consumer block yields NC / 2 of them, starting at z column zb. INTERLEAVED_32 needs nothing
 * more (a block of h columns [2 zb, 2 zb + NC) holds whole 64-column segments); for
 * CONTIGUOUS the producer loads the weight tile as four 64-row boxes so that each block is
 * [NC / 2 rows of the first half (rows zb ...)][NC / 2 rows of the second half (F + zb ...)],
 * one segment of length L = NC / 2.
 * Full blocks (all rows inside the group, all columns inside the output) leave through the
 * swizzled staging buffer and TMA stores, a 64-column box at a time; other blocks through
 * masked stores from registers. Rows past the group's end are never written. */

enum { SM90_EPI_PLAIN = 0, SM90_EPI_BIAS = 1, SM90_EPI_GLU_CONTIG = 2, SM90_EPI_GLU_INTERLEAVED = 3 };

/* What the epilogue reads besides the accumulators (kernel parameter, by value). */
typedef struct sm90_epi {
    const void *bias;           /* [G, N] (GLU: N = 2F); NULL: no bias                       */
    const float *probs;         /* [T]: the scaled bias's and the GLU's p (NULL: p = 1)      */
    uint16_t *z;                /* GLU: [T, F]                                               */
    int bias_f32, bias_scaled;  /* bias dtype f32 (else the input dtype); y += p_r b_g       */
    int F;                      /* GLU: half width                                           */
    moex_glu_consts glu;
} sm90_epi;

#if MOEX_SM90_DEVICE
/* Block column lc -> output column (y, or h for the GLU) and whether it is inside the output. */
template <int EPI, int NC> struct sm90_cols {
    int ob;    /* EPI 0/1: the block's first y column; GLU: zb, its first z column */
    int lim;   /* EPI 0/1: N; GLU: F */
    __device__ __forceinline__ int zcol(int lc) const {
        return EPI == SM90_EPI_GLU_CONTIG ? ob + lc % (NC / 2) : ob + (lc / 64) * 32 + lc % 32;
    }
    __device__ __forceinline__ int col(int lc) const {
        if (EPI == SM90_EPI_GLU_CONTIG) return zcol(lc) + (lc >= NC / 2 ? lim : 0);
        if (EPI == SM90_EPI_GLU_INTERLEAVED) return 2 * ob + lc;
        return ob + lc;
    }
    __device__ __forceinline__ bool ok(int lc) const { return EPI >= SM90_EPI_GLU_CONTIG ? zcol(lc) < lim : ob + lc < lim; }
};

/* The j of the i-th GLU output pair: its first half at j, its second at j + sm90_glu_step. */
template <int EPI> static __device__ __forceinline__ constexpr int sm90_glu_j(int i) {
    return EPI == SM90_EPI_GLU_CONTIG ? i : 8 * (i / 4) + i % 4;
}
template <int EPI, int NC> static __device__ __forceinline__ constexpr int sm90_glu_step(void) {
    return EPI == SM90_EPI_GLU_CONTIG ? NC / 16 : 4;
}

template <int IS_F16> static __device__ __forceinline__ float sm90_round(float v) {
    if (IS_F16) return __half2float(__float2half_rn(v));
    return __bfloat162float(__float2bfloat16_rn(v));
}

/* Writes NJ fragment columns (j = JSEL(jj), jj < NJ; 8 columns each) of the block's two rows
 * into `stage`: [NJ / 8 boxes][64 rows][64 columns], 128-byte rows, 16-byte chunk ch ^ (row % 8). */
template <int IS_F16, int NJ, int NA, class JSEL>
static __device__ __forceinline__ void sm90_stage_write(uint8_t *stage, const float (&acc)[NA], JSEL jsel, int rl,
                                                        int lane) {
#pragma unroll
    for (int jj = 0; jj < NJ; jj++) {
        const int j = jsel(jj), q = jj / 8, ch = jj % 8;
        uint8_t *base = stage + q * 8192 + (lane % 4) * 4;
        *(uint32_t *)(base + rl * 128 + ((ch ^ (rl & 7)) << 4)) = sm90_io<IS_F16>::pack(acc[j * 4 + 0], acc[j * 4 + 1]);
        *(uint32_t *)(base + (rl + 8) * 128 + ((ch ^ ((rl + 8) & 7)) << 4)) =
            sm90_io<IS_F16>::pack(acc[j * 4 + 2], acc[j * 4 + 3]);
    }
}

/* One pass of the TMA epilogue: NJ fragment columns (NJ / 8 boxes of 64 columns), box q
 * through half q % 2 of the staging buffer and its own bulk group, stored at (col(q), row).
 * Before a half is rewritten, the store that last read it must have finished reading: with
 * one group per box, that is every group but the newest (wait_read<1>), so the threads
 * write one half while the copy engine still reads the other. */
template <int IS_F16, int NJ, int NA, class JSEL, class COL>
static __device__ __forceinline__ void sm90_stage_pass(uint8_t *stage, const float (&acc)[NA], JSEL jsel, COL col,
                                                       const CUtensorMap *map, int32_t row, int c, int tid, int rl,
                                                       int lane) {
#pragma unroll
    for (int q = 0; q < NJ / 8; q++) {
        uint8_t *half = stage + (q % 2) * 8192;
        if (tid == 0) sm90_bulk_wait_read<1>();
        sm90_named_barrier(1 + c, 128);
        sm90_stage_write<IS_F16, 8>(half, acc, [&](int jj) { return jsel(8 * q + jj); }, rl, lane);
        sm90_fence_proxy_async_smem();
        sm90_named_barrier(1 + c, 128);
        if (tid == 0) {
            sm90_tma_store_2d(map, half, col(q), row);
            sm90_bulk_commit();
        }
    }
}

/* One m64nNCk16 wgmma step (NC = 256: 128 accumulators, NC = 128: 64). */
template <int IS_F16, int TB>
static __device__ __forceinline__ void sm90_mma(float (&d)[128], uint64_t da, uint64_t db, uint32_t keep) {
    if (TB) {
        if (IS_F16) wgmma_m64n256k16_f16_tb(d, da, db, keep); else wgmma_m64n256k16_bf16_tb(d, da, db, keep);
    } else {
        if (IS_F16) wgmma_m64n256k16_f16(d, da, db, keep); else wgmma_m64n256k16_bf16(d, da, db, keep);
    }
}
template <int IS_F16, int TB>
static __device__ __forceinline__ void sm90_mma(float (&d)[64], uint64_t da, uint64_t db, uint32_t keep) {
    if (TB) {
        if (IS_F16) wgmma_m64n128k16_f16_tb(d, da, db, keep); else wgmma_m64n128k16_bf16_tb(d, da, db, keep);
    } else {
        if (IS_F16) wgmma_m64n128k16_f16(d, da, db, keep); else wgmma_m64n128k16_bf16(d, da, db, keep);
    }
}
#endif /* MOEX_SM90_DEVICE */

/* ---- the kernel ----------------------------------------------------------------------------
 * EPI_TMA: full blocks leave through the TMA epilogue (else everything through masked
 * register stores; a tuning knob). CM: CTAs per cluster (1 or 2). With 2, the CTAs of a
 * cluster take the two tiles of one work unit (a row pair or a column pair, see
 * sm90_cursor) and each loads half of the shared operand with TMA multicast into both; a
 * stage is refilled only when the consumers of both CTAs released it (each consumer
 * arrives on the empty barrier of both CTAs). tm_xh is the half-tile input map.
 * TB: the weight tile is MN-major (dgrad: y = x W_g, W_g [K_red = rows, N_out = columns]):
 * four TMA boxes [64 reduction rows][64 output columns] (with CM = 2, two per CTA), wgmma
 * with B transposed. BM: rows per tile, 128 or 64 (small groups). EPI: the epilogue above.
 * tm_wb is the second weight map (not TB): the half-tile box for CM = 2, the 64-row box for
 * the CONTIGUOUS GLU.
 * In the kernel, N is the output width and K the reduction length. */
template <int IS_F16, int EPI_TMA, int CM, int TB, int BM, int EPI, int SK>
__global__ void __launch_bounds__(SM90_THREADS, 1)
    sm90_grouped_kernel(const __grid_constant__ CUtensorMap tm_x, const __grid_constant__ CUtensorMap tm_xh,
                        const __grid_constant__ CUtensorMap tm_w,
                        const __grid_constant__ CUtensorMap tm_wb, const __grid_constant__ CUtensorMap tm_y,
                        const __grid_constant__ CUtensorMap tm_z, uint16_t *__restrict__ y, const sm90_epi epi,
                        const int64_t *__restrict__ splits, int G, int64_t T, int N, int K, int band_w,
                        int band_r, int *bad_flag, int bad_value, float4 *sk_part, int *sk_flag, int sk_min) {
#if MOEX_SM90_DEVICE
    constexpr int NC = BM == 128 ? 256 : 128;              /* columns of a consumer's block */
    constexpr int NA = NC / 2;                             /* its accumulators per thread   */
    constexpr int A_ELEMS = BM * SM90_BK, B_ELEMS = SM90_BN * SM90_BK;
    constexpr uint32_t STAGE_BYTES = (uint32_t)(BM + SM90_BN) * SM90_BK * 2u;
    extern __shared__ uint8_t smem_raw[];
    /* aligned to 1024 bytes by an offset (a cast through an integer would lose the shared
     * address space and turn every staging store into a generic one) */
    uint8_t *smem = smem_raw + ((1024u - (sm90_smem_addr(smem_raw) & 1023u)) & 1023u);
    uint16_t *sa = (uint16_t *)smem;                                /* [STAGES][BM][BK] */
    uint16_t *sb = sa + SM90_STAGES * A_ELEMS;                      /* [STAGES][BN][BK] */
    uint16_t *sc = sb + SM90_STAGES * B_ELEMS;                      /* [2][64][128]     */
    uint64_t *full = (uint64_t *)(sc + 2 * SM90_C_ELEMS);           /* TMA landed       */
    uint64_t *empty = full + SM90_STAGES;                           /* consumers done   */

    const int wg = sm90_warpgroup(), tid = threadIdx.x % 128;
    sm90_ring_init<CM>(full, empty);

    /* GLU: N = 2F columns of h in column tiles of 128 z columns */
    const int64_t nt = EPI >= SM90_EPI_GLU_CONTIG ? (epi.F + 127) / 128 : (N + SM90_BN - 1) / SM90_BN;
    const int nk = (K + SM90_BK - 1) / SM90_BK;
    const int rank = CM > 1 ? (int)sm90_cluster_rank() : 0;
    const bool sk = SK && sk_part != NULL;   /* stream-K over the last round (see sm90_sched) */

    if (wg == 0) {
        /* ---- producer ---- */
        sm90_setmaxnreg_dec<40>();
        if (tid < 32) {
            const int64_t U = sk ? sm90_units_total(splits, G, T, nt, BM, CM) : 0;
            if (tid == 0) {   /* the walk: one thread issues every load */
                sm90_tma_prefetch_map(&tm_x);
                sm90_tma_prefetch_map(!TB && (CM > 1 || EPI == SM90_EPI_GLU_CONTIG) ? &tm_wb : &tm_w);
                sm90_cursor cur;
                sm90_cursor_start(&cur);
                sm90_sched sch;
                sm90_sched_start(&sch, sk, U, nk, CM, sk_min);
                uint32_t it = 0;
                const uint16_t both = (uint16_t)((1u << CM) - 1u);
                sm90_work wk;
                while (sm90_sched_next(&sch, &wk) && sm90_cursor_seek(&cur, wk.t, splits, G, T, nt, BM, CM)) {
                    int64_t m0;
                    int n0;
                    const int colpair = sm90_tile_coords(&cur, wk.t, nt, band_w, band_r, BM, CM, rank, &m0, &n0);
                    for (int kb = wk.kb0; kb < wk.kb1; kb++, it++) {
                        const int s = it % SM90_STAGES;
                        uint16_t *b = sb + s * B_ELEMS;
                        sm90_mbar_wait(&empty[s], ((it / SM90_STAGES) & 1u) ^ 1u);
                        sm90_mbar_arrive_expect_tx(&full[s], STAGE_BYTES);
                        if (CM > 1 && colpair)   /* 64 of the shared input rows each, into both CTAs */
                            sm90_tma_load_2d_multicast(sa + s * A_ELEMS + rank * 64 * SM90_BK, &tm_xh, &full[s],
                                                       kb * SM90_BK, (int32_t)(m0 + 64 * rank), both);
                        else
                            sm90_tma_load_2d(sa + s * A_ELEMS, &tm_x, &full[s], kb * SM90_BK, (int32_t)m0);
                        if (TB) {
                            /* four boxes of 64 output columns; a row pair loads two each, into both CTAs */
                            const bool split = CM > 1 && !colpair;
                            const int j0 = split ? rank * 2 : 0, j1 = split ? j0 + 2 : SM90_BN / 64;
                            for (int j = j0; j < j1; j++) {
                                if (split)
                                    sm90_tma_load_3d_multicast(b + j * 64 * SM90_BK, &tm_w, &full[s], n0 + j * 64,
                                                               kb * SM90_BK, cur.g, both);
                                else
                                    sm90_tma_load_3d(b + j * 64 * SM90_BK, &tm_w, &full[s], n0 + j * 64, kb * SM90_BK,
                                                     cur.g);
                            }
                        } else if (EPI == SM90_EPI_GLU_CONTIG) {
                            /* box i: 64 rows of the first (h = 0) or second (h = 1) half, see above */
#pragma unroll
                            for (int i = 0; i < 4; i++) {
                                const int h = BM == 128 ? i / 2 : i % 2, q = BM == 128 ? i % 2 : i / 2;
                                sm90_tma_load_3d(b + i * 64 * SM90_BK, &tm_wb, &full[s], kb * SM90_BK,
                                                 h * epi.F + n0 / 2 + q * 64, cur.g);
                            }
                        } else if (CM > 1 && !colpair) {   /* half of the shared weight tile each */
                            sm90_tma_load_3d_multicast(b + rank * (SM90_BN / 2) * SM90_BK, &tm_wb, &full[s],
                                                       kb * SM90_BK, n0 + rank * (SM90_BN / 2), cur.g, both);
                        } else {
                            sm90_tma_load_3d(b, &tm_w, &full[s], kb * SM90_BK, n0, cur.g);
                        }
                    }
                }
            }
        } else if (tid == 32 && blockIdx.x == 0 && bad_flag != NULL) {
            /* one thread of the grid checks the split values for the caller's flag */
            int64_t sum = 0;
            int bad = 0;
            for (int g = 0; g < G; g++) {
                int64_t s = splits[g];
                bad |= s < 0;
                sum += s < 0 ? 0 : s;
            }
            if (bad || sum > T) atomicCAS(bad_flag, 0, bad_value);
        }
    } else {
        /* ---- consumers: warpgroup c computes its block of each tile (see the epilogue) ---- */
        sm90_setmaxnreg_inc<232>();
        const int c = wg - 1;
        const int a_row = BM == 128 ? 64 * c : 0, b_col = BM == 128 ? 0 : 128 * c;
        float acc[NA];
#pragma unroll
        for (int i = 0; i < NA; i++) acc[i] = 0.0f;
        sm90_cursor cur;
        sm90_cursor_start(&cur);
        uint32_t it = 0;
        const int warp = tid / 32, lane = tid % 32;
        const int rl = warp * 16 + lane / 4;   /* block row of acc[4 j + {0, 1}]; + 8 for {2, 3} */
        /* stage 0's descriptors of this consumer's A rows and B columns; a stage and a k step
         * are adds (K-major: 32 bytes along the row; TB: 16 reduction rows of 128 bytes, the
         * 64-column blocks 8 KB apart) */
        uint64_t da0 = sm90_desc_sw128(sa + a_row * SM90_BK);
        uint64_t db0 = TB ? sm90_desc_mn_sw128(sb + (b_col / 64) * 64 * SM90_BK, 64 * SM90_BK * 2, 1024)
                          : sm90_desc_sw128(sb + b_col * SM90_BK);
        sm90_desc_hold(da0);
        sm90_desc_hold(db0);
        const uint32_t b_step = TB ? 16 * 64 * 2 : 16 * 2;
        sm90_sched sch;
        sm90_sched_start(&sch, sk, sk ? sm90_units_total(splits, G, T, nt, BM, CM) : 0, nk, CM, sk_min);
        sm90_work wk;
        while (sm90_sched_next(&sch, &wk) && sm90_cursor_seek_warp(&cur, wk.t, splits, G, T, nt, BM, CM)) {
            const int kb0 = wk.kb0, steps = wk.kb1 - wk.kb0;
            int64_t m0;
            int n0;
            sm90_tile_coords(&cur, wk.t, nt, band_w, band_r, BM, CM, rank, &m0, &n0);
            const int64_t mr = m0 + a_row;             /* the block's first row */
            const int64_t ra = mr + rl, rb = ra + 8;
            const bool oka = ra < cur.row1, okb = rb < cur.row1;
            sm90_cols<EPI, NC> cols;
            cols.ob = EPI >= SM90_EPI_GLU_CONTIG ? (n0 + b_col) / 2 : n0 + b_col;
            cols.lim = EPI >= SM90_EPI_GLU_CONTIG ? epi.F : N;
            /* the epilogue's inputs, fetched while the tile is computed: p of rows ra, rb
             * (registers) and the bias row (cp.async into the staging buffer, block column
             * pair lc / 2 at 4 or 8 bytes each, after the first k step) */
            float pa = 1.0f, pb = 1.0f;
            if (epi.probs != NULL && (EPI >= SM90_EPI_GLU_CONTIG || epi.bias_scaled)) {
                pa = oka ? __ldg(epi.probs + ra) : 0.0f;
                pb = okb ? __ldg(epi.probs + rb) : 0.0f;
            }
            const bool has_bias = EPI != SM90_EPI_PLAIN && epi.bias != NULL;
            uint8_t *stage = (uint8_t *)(sc + c * SM90_C_ELEMS);
            for (int kq = 0; kq < steps; kq++, it++) {
                const uint32_t s = it % SM90_STAGES;
                sm90_mbar_wait(&full[s], (it / SM90_STAGES) & 1u);
                sm90_wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < SM90_BK / 16; kk++)
                    sm90_mma<IS_F16, TB>(acc, sm90_desc_add(da0, s * A_ELEMS * 2 + kk * 16 * 2),
                                         sm90_desc_add(db0, s * B_ELEMS * 2 + kk * b_step), (kq | kk) != 0);
                sm90_wgmma_commit();
                if (has_bias && kq == 0 && kb0 == 0) {   /* only the owner runs the epilogue */
                    if (tid == 0) sm90_bulk_wait_read<0>();   /* the last tile's stores read `stage` */
                    sm90_named_barrier(1 + c, 128);
                    const int lc = 2 * tid;
                    if (lc < NC && cols.ok(lc)) {
                        const int64_t bi = (int64_t)cur.g * N + cols.col(lc);
                        if (epi.bias_f32)
                            sm90_cp_async<8>(stage + 8 * tid, (const float *)epi.bias + bi);
                        else
                            sm90_cp_async<4>(stage + 4 * tid, (const uint16_t *)epi.bias + bi);
                    }
                    sm90_cp_async_commit();
                }
                if (kq > 0) {
                    /* the previous stage's wgmmas are done: hand it back to the producer */
                    sm90_wgmma_wait<1>();
                    if (tid < CM) sm90_release_stage<CM>(&empty[(it - 1) % SM90_STAGES], tid);
                }
            }
            sm90_wgmma_wait<0>();
            if (tid < CM) sm90_release_stage<CM>(&empty[(it - 1) % SM90_STAGES], tid);
            if (kb0 > 0) {   /* the rest of a unit another worker owns: hand over the sums */
                sm90_sk_put(acc, sk_part, sk_flag, 2 * blockIdx.x + c, c, tid);
                continue;
            }
            if (kb0 + steps < nk)   /* the next worker's CTA of the same rank has the rest */
                sm90_sk_add(acc, sk_part, sk_flag, 2 * (blockIdx.x + CM) + c, c, tid);

            /* ---- epilogue ---- */
            const int lc0 = 2 * (lane % 4);
            if (has_bias) {
                sm90_cp_async_wait_all();
                sm90_named_barrier(1 + c, 128);   /* every thread's part of the bias row landed */
                const float sa_ = epi.bias_scaled ? pa : 1.0f, sb_ = epi.bias_scaled ? pb : 1.0f;
#pragma unroll
                for (int j = 0; j < NA / 4; j++) {
                    const int lc = 8 * j + lc0;
                    if (cols.ok(lc)) {
                        float b0, b1;
                        if (epi.bias_f32) {
                            const float2 v = *(const float2 *)(stage + 4 * lc);
                            b0 = v.x;
                            b1 = v.y;
                        } else {
                            const uint32_t v = *(const uint32_t *)(stage + 2 * lc);
                            b0 = IS_F16 ? __half2float(__ushort_as_half((unsigned short)(v & 0xFFFFu)))
                                        : __bfloat162float(__ushort_as_bfloat16((unsigned short)(v & 0xFFFFu)));
                            b1 = IS_F16 ? __half2float(__ushort_as_half((unsigned short)(v >> 16)))
                                        : __bfloat162float(__ushort_as_bfloat16((unsigned short)(v >> 16)));
                        }
                        acc[4 * j + 0] += sa_ * b0;
                        acc[4 * j + 1] += sa_ * b1;
                        acc[4 * j + 2] += sb_ * b0;
                        acc[4 * j + 3] += sb_ * b1;
                    }
                }
            }
            if (EPI >= SM90_EPI_GLU_CONTIG) {
#pragma unroll
                for (int i = 0; i < NA; i++) acc[i] = sm90_round<IS_F16>(acc[i]);   /* h as stored */
            }
            const bool full_block = EPI_TMA && mr + 64 <= cur.row1 &&
                                    (EPI >= SM90_EPI_GLU_CONTIG ? cols.ob + NC / 2 <= epi.F : cols.ob + NC <= N);
            /* y (or h) */
            if (full_block) {
#pragma unroll
                for (int p = 0; p < NC / 128; p++)
                    sm90_stage_pass<IS_F16, 16>(
                        stage, acc, [&](int jj) { return 16 * p + jj; },
                        [&](int q) { return cols.col(128 * p + 64 * q); }, &tm_y, (int32_t)mr, c, tid, rl, lane);
            } else {
                uint16_t *ya = y + ra * N, *yb = y + rb * N;
#pragma unroll
                for (int j = 0; j < NA / 4; j++) {
                    const int lc = 8 * j + lc0;
                    if (cols.ok(lc)) {
                        const int col = cols.col(lc);
                        if (oka) *(uint32_t *)(ya + col) = sm90_io<IS_F16>::pack(acc[4 * j + 0], acc[4 * j + 1]);
                        if (okb) *(uint32_t *)(yb + col) = sm90_io<IS_F16>::pack(acc[4 * j + 2], acc[4 * j + 3]);
                    }
                }
            }
            if (EPI >= SM90_EPI_GLU_CONTIG) {
                /* z = p glu(h), written over the first half's accumulators */
                constexpr int STEP = sm90_glu_step<EPI, NC>();
#pragma unroll
                for (int i = 0; i < NA / 8; i++) {
                    const int ja = sm90_glu_j<EPI>(i), jb = ja + STEP;
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        acc[4 * ja + e] = moex_glu_forward(epi.glu, acc[4 * ja + e], acc[4 * jb + e], e < 2 ? pa : pb);
                }
                auto zsel = [](int jj) { return sm90_glu_j<EPI>(jj); };
                if (full_block) {
                    sm90_stage_pass<IS_F16, NA / 8>(stage, acc, zsel, [&](int q) { return cols.ob + 64 * q; }, &tm_z,
                                                    (int32_t)mr, c, tid, rl, lane);
                } else {
                    uint16_t *za = epi.z + ra * epi.F, *zb = epi.z + rb * epi.F;
#pragma unroll
                    for (int i = 0; i < NA / 8; i++) {
                        const int ja = zsel(i), zc = cols.ob + 8 * i + lc0;
                        if (zc < epi.F) {
                            if (oka) *(uint32_t *)(za + zc) = sm90_io<IS_F16>::pack(acc[4 * ja + 0], acc[4 * ja + 1]);
                            if (okb) *(uint32_t *)(zb + zc) = sm90_io<IS_F16>::pack(acc[4 * ja + 2], acc[4 * ja + 3]);
                        }
                    }
                }
            }
        }
        if (EPI_TMA && tid == 0) sm90_bulk_wait<0>();   /* stores done before the CTA ends */
    }
    /* no CTA of a cluster leaves while its peer may still arrive on its barriers */
    if (CM > 1) sm90_cluster_sync();
#endif /* MOEX_SM90_DEVICE */
}

/* ---- host side ---------------------------------------------------------------------------- */

extern "C" int moex_sm90_tile_rows(int64_t T, int64_t G, int64_t N, int64_t K) {
    (void)N;
    (void)K;
    return T < 128 * G ? 64 : 128;
}

extern "C" bool moex_sm90_supported(int device, const moex_sm90_gemm_args *a) {
    if (a == NULL) return false;
    if (a->dtype != MOEX_DTYPE_BF16 && a->dtype != MOEX_DTYPE_F16) return false;
    if (a->G < 1 || a->G > INT32_MAX || a->T < 0 || a->T > (int64_t)INT32_MAX - SM90_BM) return false;
    if (a->K < 8 || a->N < 8 || a->K % 8 != 0 || a->N % 8 != 0) return false;
    if (a->K > INT32_MAX / 2 || a->N > INT32_MAX / 2) return false;
    if (!sm90_aligned16(a->x) || !sm90_aligned16(a->w) || !sm90_aligned16(a->y)) return false;
    if (a->splits == NULL || ((uintptr_t)a->splits & 7u) != 0) return false;
    if (a->workspace != NULL && !sm90_aligned16(a->workspace)) return false;
    return sm90_device_ok(device, (const void *)sm90_grouped_kernel<0, 1, 1, 0, 128, 0, 0>);
}

/* Workspace: [2 flags per SM, 256-byte aligned][2 partials per SM, SM90_SK_SLOT bytes each]
 * (a CTA per SM at most; its consumer c uses slot 2 blockIdx.x + c). */
#define SM90_SK_SLOT ((size_t)128 * 128 * 4)   /* a consumer's 64 x 256 (or 64 x 128) f32 sums */
static size_t sm90_sk_flag_bytes(int sms) { return ((size_t)2 * sms * sizeof(int) + 255) / 256 * 256; }

extern "C" size_t moex_sm90_gemm_workspace_bytes(int device) {
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms < 1) {
        cudaGetLastError();
        return 0;
    }
    return sm90_sk_flag_bytes(sms) + (size_t)2 * sms * SM90_SK_SLOT;
}

/* The epilogue kind of e (SM90_EPI_*), or -1 when the kernels cannot run it. */
static int sm90_epi_kind(const moex_sm90_gemm_args *a, const moex_sm90_epilogue *e) {
    if (e == NULL) return SM90_EPI_PLAIN;
    const bool bias = e->bias_mode != MOEX_BIAS_NONE;
    if (bias) {
        if (e->bias == NULL || !sm90_aligned16(e->bias)) return -1;
        if (e->bias_dtype != MOEX_DTYPE_F32 && e->bias_dtype != a->dtype) return -1;
        if (e->bias_mode == MOEX_BIAS_SCALED && e->probs == NULL) return -1;
    }
    if (e->glu == NULL) return bias ? SM90_EPI_BIAS : SM90_EPI_PLAIN;
    const int64_t F = a->N / 2;
    if (e->bias_mode == MOEX_BIAS_SCALED || e->z == NULL || !sm90_aligned16(e->z) || F % 8 != 0) return -1;
    if (e->glu->layout == MOEX_GLU_INTERLEAVED_32) return F % 32 == 0 ? SM90_EPI_GLU_INTERLEAVED : -1;
    return e->glu->layout == MOEX_GLU_CONTIGUOUS ? SM90_EPI_GLU_CONTIG : -1;
}

extern "C" bool moex_sm90_epilogue_supported(int device, const moex_sm90_gemm_args *a, const moex_sm90_epilogue *e) {
    return moex_sm90_supported(device, a) && sm90_epi_kind(a, e) >= 0;
}

typedef void (*sm90_kernel_fn)(CUtensorMap, CUtensorMap, CUtensorMap, CUtensorMap, CUtensorMap, CUtensorMap, uint16_t *,
                               sm90_epi, const int64_t *, int, int64_t, int, int, int, int, int *, int, float4 *, int *,
                               int);

/* The kernel instance for one dtype. Instantiated: every epilogue kind with both tile
 * heights (TMA epilogue, no cluster); the plain forward and the dgrad (plain only) with both
 * tile heights, at 128 rows also with 2-CTA clusters (their default) and with the register
 * epilogue. */
template <int F16, int SK> static sm90_kernel_fn sm90_pick_t(int epi, int bm, int cm, bool epi_tma, bool dgrad) {
    if (dgrad) {
        if (bm == 64) return sm90_grouped_kernel<F16, 1, 1, 1, 64, 0, SK>;
        if (cm > 1) return sm90_grouped_kernel<F16, 1, 2, 1, 128, 0, SK>;
        return epi_tma ? sm90_grouped_kernel<F16, 1, 1, 1, 128, 0, SK> : sm90_grouped_kernel<F16, 0, 1, 1, 128, 0, SK>;
    }
    switch (epi) {
    case SM90_EPI_BIAS:
        return bm == 64 ? sm90_grouped_kernel<F16, 1, 1, 0, 64, 1, SK> : sm90_grouped_kernel<F16, 1, 1, 0, 128, 1, SK>;
    case SM90_EPI_GLU_CONTIG:
        return bm == 64 ? sm90_grouped_kernel<F16, 1, 1, 0, 64, 2, SK> : sm90_grouped_kernel<F16, 1, 1, 0, 128, 2, SK>;
    case SM90_EPI_GLU_INTERLEAVED:
        return bm == 64 ? sm90_grouped_kernel<F16, 1, 1, 0, 64, 3, SK> : sm90_grouped_kernel<F16, 1, 1, 0, 128, 3, SK>;
    default: break;
    }
    if (bm == 64) return sm90_grouped_kernel<F16, 1, 1, 0, 64, 0, SK>;
    if (cm > 1) return sm90_grouped_kernel<F16, 1, 2, 0, 128, 0, SK>;
    return epi_tma ? sm90_grouped_kernel<F16, 1, 1, 0, 128, 0, SK> : sm90_grouped_kernel<F16, 0, 1, 0, 128, 0, SK>;
}

/* The forward (dgrad = 0: y = x W_g^T, with the epilogue e) or the data gradient (dgrad = 1:
 * y = x W_g, x [T, N], y [T, K]) as one launch of the kernel above. */
static moex_status sm90_run(const moex_sm90_gemm_args *a, const moex_sm90_epilogue *e, int dgrad,
                            moex_sm90_tuning *tune, moex_stream stream, const char **why) {
    int device = 0;
    if (tune != NULL) tune->grid_used = 0;
    if (cudaGetDevice(&device) != cudaSuccess) SM90_FAIL(MOEX_ERR_CUDA, "cudaGetDevice failed");
    if (!moex_sm90_supported(device, a))
        SM90_FAIL(MOEX_ERR_UNSUPPORTED, "sm90 grouped GEMM: unsupported device, dtype, shape or alignment");
    const int epi = sm90_epi_kind(a, e);
    if (epi < 0) SM90_FAIL(MOEX_ERR_UNSUPPORTED, "sm90 grouped GEMM: unsupported epilogue (bias, probs, GLU or z)");
    if (a->T == 0) return MOEX_OK;
    const bool epi_tma = tune == NULL || tune->epilogue_tma;
    const int band = tune != NULL && tune->band > 0 ? tune->band : SM90_BAND;
    const int bm = tune != NULL && (tune->tile_rows == 64 || tune->tile_rows == 128)
                       ? tune->tile_rows
                       : moex_sm90_tile_rows(a->T, a->G, a->N, a->K);
    const int band_rows = tune != NULL && tune->band_rows > 0 ? tune->band_rows : SM90_BAND_ROWS;
    /* 2-CTA clusters for the plain 128-row forward and dgrad with the TMA epilogue, unless
     * tuned off */
    const bool cluster_ok = epi == SM90_EPI_PLAIN && bm == 128 && epi_tma;
    const int cm = cluster_ok && (tune == NULL || tune->cluster != 1) ? 2 : 1;
    const int band_r = band_rows / (bm * cm) > 0 ? band_rows / (bm * cm) : 1;   /* in row units */
    /* kernel view: out = in [T, red] times B_g (red x out_w) */
    const int64_t red = dgrad ? a->N : a->K, out_w = dgrad ? a->K : a->N;
    const bool glu = epi >= SM90_EPI_GLU_CONTIG;

    CUtensorMap tm_x, tm_xh, tm_w, tm_wb, tm_y, tm_z;
    const CUtensorMapL2promotion promo = sm90_l2_promotion(tune);
    const cuuint64_t xdims[2] = {(cuuint64_t)red, (cuuint64_t)a->T};
    const cuuint32_t xbox[2] = {SM90_BK, (cuuint32_t)bm}, xhbox[2] = {SM90_BK, 64};
    const cuuint64_t wdims[3] = {(cuuint64_t)a->K, (cuuint64_t)a->N, (cuuint64_t)a->G};
    const cuuint32_t wbox[3] = {SM90_BK, dgrad ? 64u : (cuuint32_t)SM90_BN, 1};
    const cuuint32_t wbbox[3] = {SM90_BK, cm > 1 ? SM90_BN / 2u : 64u, 1};
    const cuuint64_t ydims[2] = {(cuuint64_t)out_w, (cuuint64_t)a->T};
    const cuuint64_t zdims[2] = {(cuuint64_t)(a->N / 2), (cuuint64_t)a->T};
    const cuuint32_t ybox[2] = {64, 64};
    if (!sm90_make_map(&tm_x, a->dtype, a->x, 2, xdims, xbox, promo) ||
        !sm90_make_map(&tm_xh, a->dtype, a->x, 2, xdims, xhbox, promo) ||
        !sm90_make_map(&tm_w, a->dtype, a->w, 3, wdims, wbox, promo) ||
        !sm90_make_map(&tm_wb, a->dtype, a->w, 3, wdims, wbbox, promo) ||
        !sm90_make_map(&tm_y, a->dtype, a->y, 2, ydims, ybox, promo) ||
        !sm90_make_map(&tm_z, a->dtype, glu ? e->z : a->y, 2, glu ? zdims : ydims, ybox, promo))
        SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped GEMM: cuTensorMapEncodeTiled failed");

    sm90_epi ep;
    memset(&ep, 0, sizeof ep);
    if (e != NULL && epi != SM90_EPI_PLAIN) {
        ep.bias = e->bias_mode != MOEX_BIAS_NONE ? e->bias : NULL;
        ep.bias_f32 = e->bias_dtype == MOEX_DTYPE_F32;
        ep.bias_scaled = e->bias_mode == MOEX_BIAS_SCALED;
        ep.probs = e->probs;
        if (glu) {
            ep.z = (uint16_t *)e->z;
            ep.F = (int)(a->N / 2);
            ep.glu = moex_glu_consts_of(e->glu);
        }
    }

    /* the kernel without stream-K (the one with it has the same resources) */
    sm90_kernel_fn fn = a->dtype == MOEX_DTYPE_F16 ? sm90_pick_t<1, 0>(epi, bm, cm, epi_tma, dgrad != 0)
                                                   : sm90_pick_t<0, 0>(epi, bm, cm, epi_tma, dgrad != 0);
    const size_t smem = sm90_smem_bytes(bm);

    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cudaLaunchAttribute attr[1];
    cfg.blockDim = dim3(SM90_THREADS, 1, 1);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = (cudaStream_t)stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)cm;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;

    /* persistent grid: as many CTAs (clusters) as can be resident at once, at most the work */
    int slots = 0;
    if (cm > 1) {
        /* clusters that fit at once: asked once per process and kernel (one GPU model) */
        static std::atomic<int> cluster_slots[2][2];
        std::atomic<int> &cached = cluster_slots[dgrad != 0][a->dtype == MOEX_DTYPE_F16];
        slots = cached.load(std::memory_order_relaxed);
        if (slots < 1) {
            cfg.gridDim = dim3(2 * 66, 1, 1);
            if (cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
                    cudaSuccess ||
                cudaOccupancyMaxActiveClusters(&slots, (const void *)fn, &cfg) != cudaSuccess || slots < 1)
                SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped GEMM: cudaOccupancyMaxActiveClusters failed");
            cached.store(slots, std::memory_order_relaxed);
        }
    } else if (cudaDeviceGetAttribute(&slots, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
        SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped GEMM: cudaDeviceGetAttribute failed");
    }
    if (tune != NULL && tune->grid > 0 && tune->grid / cm < slots) slots = tune->grid / cm;
    const int64_t nt = glu ? (a->N / 2 + 127) / 128 : (out_w + SM90_BN - 1) / SM90_BN;
    const int64_t row_tiles = (a->T + bm - 1) / bm;
    const int64_t max_units = ((row_tiles + cm - 1) / cm + a->G) * nt;
    cfg.gridDim = dim3((unsigned)((max_units < slots ? max_units : slots) * cm), 1, 1);

    /* Stream-K (sm90_sched) with a workspace where the shapes say it pays (forward only: in
     * the dgrad it measured -1.3 to +0.3% on dsv3 and -5% on mixtral skewed): the units of
     * groups of T / G rows each leave a last round worth cutting (the kernel decides again
     * from the actual split values; from the shapes only, the kernel with it has a slower k
     * loop: its k ranges are not compile-time uniform). stream_k = 2 (tests): whenever there
     * is a last round. The flags start at 0; the partials need nothing. */
    const int sk_mode = tune != NULL ? tune->stream_k : 0;
    const int sk_min = sk_mode == 2 ? 0 : SM90_SK_MIN;
    const int64_t tile_rows_g = (a->T / a->G + bm - 1) / bm, P = cfg.gridDim.x / cm;
    const int64_t units_est =
        a->G * (cm == 1 ? tile_rows_g * nt : (tile_rows_g / 2) * nt + (tile_rows_g % 2) * ((nt + 1) / 2));
    int *sk_flag = NULL;
    float4 *sk_part = NULL;
    if (a->workspace != NULL && sk_mode != 1 &&
        (sk_mode == 2 || (!dgrad && sm90_sk_worth(units_est, P, (int)((red + SM90_BK - 1) / SM90_BK), sk_min)))) {
        fn = a->dtype == MOEX_DTYPE_F16 ? sm90_pick_t<1, 1>(epi, bm, cm, epi_tma, dgrad != 0)
                                        : sm90_pick_t<0, 1>(epi, bm, cm, epi_tma, dgrad != 0);
        int sms = 0;
        if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
            SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped GEMM: cudaDeviceGetAttribute failed");
        sk_flag = (int *)a->workspace;
        sk_part = (float4 *)((char *)a->workspace + sm90_sk_flag_bytes(sms));
        if (cudaMemsetAsync(sk_flag, 0, (size_t)2 * cfg.gridDim.x * sizeof(int), cfg.stream) != cudaSuccess) {
            cudaGetLastError();
            SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped GEMM: cudaMemsetAsync of the stream-K flags failed");
        }
    }
    if (cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped GEMM: cudaFuncSetAttribute failed");

    if (cudaLaunchKernelEx(&cfg, fn, tm_x, tm_xh, tm_w, tm_wb, tm_y, tm_z, (uint16_t *)a->y, ep, a->splits, (int)a->G,
                           a->T, (int)out_w, (int)red, band, band_r, a->bad_flag, a->bad_value, sk_part,
                           sk_flag, sk_min) != cudaSuccess) {
        cudaGetLastError();
        SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped GEMM: kernel launch failed");
    }
    if (tune != NULL) tune->grid_used = (int)cfg.gridDim.x;
    return MOEX_OK;
}

extern "C" moex_status moex_sm90_grouped_gemm_fwd_epi(const moex_sm90_gemm_args *a, const moex_sm90_epilogue *e,
                                                      moex_sm90_tuning *tune, moex_stream stream, const char **why) {
    return sm90_run(a, e, 0, tune, stream, why);
}

extern "C" moex_status moex_sm90_grouped_gemm_fwd_tuned(const moex_sm90_gemm_args *a, moex_sm90_tuning *tune,
                                                        moex_stream stream, const char **why) {
    return sm90_run(a, NULL, 0, tune, stream, why);
}

extern "C" moex_status moex_sm90_grouped_gemm_fwd(const moex_sm90_gemm_args *a, moex_stream stream,
                                                  const char **why) {
    return sm90_run(a, NULL, 0, NULL, stream, why);
}

extern "C" moex_status moex_sm90_grouped_gemm_dgrad_tuned(const moex_sm90_gemm_args *a, moex_sm90_tuning *tune,
                                                          moex_stream stream, const char **why) {
    return sm90_run(a, NULL, 1, tune, stream, why);
}

extern "C" moex_status moex_sm90_grouped_gemm_dgrad(const moex_sm90_gemm_args *a, moex_stream stream,
                                                    const char **why) {
    return sm90_run(a, NULL, 1, NULL, stream, why);
}
