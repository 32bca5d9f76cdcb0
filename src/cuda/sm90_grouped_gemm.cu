/*
 * sm90_grouped_gemm.cu - the Hopper (sm_90a) M-grouped GEMM kernel and its launch: the
 * forward y_g = x_g W_g^T with its fused epilogues (bias, probs-scaled bias, the grouped
 * MLP's FC1 with the scaled GLU writing h and z) and the dgrad dx_g = dy_g W_g, plain or as
 * the grouped MLP's FC2 with the GLU's backward writing dh (contract in sm90_grouped_gemm.h
 * and sm90_tuning.h; docs/hopper.md tells the story).
 *
 * The kernel is the composition of the shared pieces: the work list, group cursor and tile
 * order of sm90_scheduler.cuh, the stage ring of sm90_pipeline.cuh, the epilogues of
 * sm90_epilogue.cuh. Its own parts:
 *   - persistent grid, one CTA of 384 threads per SM: warpgroup 0 is the producer (one
 *     thread issues TMA loads), warpgroups 1 and 2 are consumers, f32 accumulators in
 *     registers. Tiles of 128 rows x 256 columns (each consumer 64 x 256, wgmma m64n256k16)
 *     or, for small groups, 64 x 256 (each consumer 64 x 128, m64n128k16);
 *   - a stage is an input tile [BM rows, 64 k] and a weight tile of 256 output columns by
 *     64 k, 128-byte swizzled by TMA. Forward: the weight tile is K-major (W_g rows); dgrad:
 *     it is MN-major (four boxes of 64 W_g rows by 64 columns) and wgmma reads it transposed;
 *   - input tiles are loaded from the global row offset of the group, so a tile can
 *     straddle the next group (or the rows past off[G]; TMA zero-fills past T); those rows
 *     are computed but never stored;
 *   - the 128-row forward and dgrad (every epilogue kind) run in 2-CTA clusters: the two
 *     CTAs take two tiles that share the weight tile (or, on a group's odd last row tile,
 *     the input tile) and load half of it each, multicast into both, which halves that
 *     operand's L2 traffic;
 *   - discrete weights (G separate matrices) are read through per-group copies of the weight
 *     maps written on the device before the launch (sm90_weight_maps.cu); the producer
 *     acquires a group's maps when its walk reaches the group.
 * The host side asks the heuristic (sm90_heuristics.h) for the plan, encodes the tensor maps
 * (they depend on pointers and shapes only, so a launch captured in a CUDA graph stays
 * correct when the split values change) and launches the planned instance.
 */
#include "sm90_epilogue.cuh"
#include "sm90_pipeline.cuh"
#include "sm90_scheduler.cuh"
#include "sm90_tuning.h"

/* The products of the kernel (its OP template value): the forward with each of its epilogue
 * kinds (OP = MOEX_SM90_EPI_*), and the dgrad (weight tile MN-major) with its own (OP =
 * SM90_OP_DGRAD + MOEX_SM90_EPI_PLAIN or + a DGLU kind). */
enum { SM90_OP_DGRAD = 8 };

/* The kernel's parameters, three structs: the tensor maps (__grid_constant__: TMA reads them
 * where they are, by address), the epilogue's inputs (sm90_epi, sm90_epilogue.cuh) and the
 * rest. The epilogue's struct is a parameter of its own: nested in the third one, the tests
 * on its fields were no longer hoisted out of the unrolled epilogue loops (slower bias
 * forwards: docs/hopper.md). In the kernel, N is the output width and K the reduction
 * length. */
typedef struct sm90_rows_maps {
    CUtensorMap x;              /* input [T, K]: boxes [BM rows][64]                           */
    CUtensorMap xh;             /* input, boxes of 64 rows (a cluster's column pair)           */
    CUtensorMap w;              /* weights [G, rows, 64-column boxes]: forward [256][64], dgrad
                                   [64][64] (MN-major)                                       */
    CUtensorMap wb;             /* weights, the second box: [128][64] (a cluster's row pair),
                                   [64][64] (the CONTIGUOUS GLU's halves)                    */
    CUtensorMap y;              /* output [T, N], staging boxes [64][64]                       */
    CUtensorMap z;              /* GLU: z [T, F], boxes [64][64] (else as y)                   */
} sm90_rows_maps;

typedef struct sm90_rows_params {
    uint16_t *y;                /* the output, for the masked stores                            */
    const int64_t *splits;      /* [G] device                                                  */
    int G;
    int64_t T;
    int N, K;
    int band_w, band_r;         /* the tile order: column tiles per band, row units per block  */
    int *bad_flag;              /* optional: set to bad_value when a split is bad              */
    int bad_value;
    float4 *sk_part;            /* stream-K partials (NULL: none) and flags                    */
    int *sk_flag;
    int sk_min;                 /* stream-K's threshold in k steps, as the plan's              */
    const CUtensorMap *wmaps_w; /* discrete weights: group g's w and wb maps at wmaps_w[g]
                                   and wmaps_wb[g] (their group coordinate 0); NULL:
                                   packed, m.w and m.wb                                      */
    const CUtensorMap *wmaps_wb;
} sm90_rows_params;

/* ---- the kernel ----------------------------------------------------------------------------
 * IS_F16: f16 (else bf16). BM: rows per tile, 128 or 64. CM: CTAs per cluster (1 or 2; with
 * 2 the CTAs of a cluster take the two tiles of one work unit, a row pair or a column pair,
 * and each loads half of the shared operand with TMA multicast into both). OP: the product.
 * SK: the stream-K instance (its k ranges come from device data, so its k loop cannot keep
 * the descriptors in uniform registers: a separate instance, used only where planned).
 * EPI_TMA: full blocks leave through TMA stores (0: every block through masked register
 * stores; a tuning knob). */
template <int IS_F16, int BM, int CM, int OP, int SK, int EPI_TMA>
__global__ void __launch_bounds__(SM90_THREADS, 1)
    sm90_rows_kernel(const __grid_constant__ sm90_rows_maps m, const sm90_epi epi, const sm90_rows_params p) {
#if MOEX_SM90_DEVICE
    constexpr int TB = OP >= SM90_OP_DGRAD;                        /* weight tile MN-major */
    constexpr int EPI = TB ? OP - SM90_OP_DGRAD : OP;
    constexpr bool GLU = MOEX_SM90_EPI_IS_GLU(EPI), DGLU = MOEX_SM90_EPI_IS_DGLU(EPI);
    constexpr int NC = BM == 128 ? 256 : 128;              /* columns of a consumer's block */
    constexpr int NA = NC / 2;                             /* its accumulators per thread   */
    constexpr int A_ELEMS = BM * SM90_BK, B_ELEMS = SM90_BN * SM90_BK;
    constexpr uint32_t STAGE_BYTES = (uint32_t)(BM + SM90_BN) * SM90_BK * 2u;
    const int64_t *__restrict__ splits = p.splits;
    const int G = p.G, N = p.N, K = p.K, band_w = p.band_w, band_r = p.band_r, sk_min = p.sk_min;
    const int64_t T = p.T;
    float4 *const sk_part = p.sk_part;
    int *const sk_flag = p.sk_flag;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = sm90_smem_aligned(smem_raw);
    uint16_t *sa = (uint16_t *)smem;                                /* [STAGES][BM][BK] */
    uint16_t *sb = sa + SM90_STAGES * A_ELEMS;                      /* [STAGES][BN][BK] */
    uint8_t *sc = (uint8_t *)(sb + SM90_STAGES * B_ELEMS);          /* [2][2][8 KB]     */
    uint64_t *full = (uint64_t *)(sc + 4 * SM90_STAGE_HALF_BYTES);  /* TMA landed       */
    uint64_t *empty = full + SM90_STAGES;                           /* consumers done   */

    const int wg = sm90_warpgroup(), tid = threadIdx.x % 128;
    sm90_ring_init<CM>(full, empty);

    /* GLU: N = 2F columns of h in column tiles of 128 z columns */
    const int64_t nt = GLU ? (epi.F + 127) / 128 : (N + SM90_BN - 1) / SM90_BN;
    const sm90_units_rows units = {nt, BM, CM};
    const int nk = (K + SM90_BK - 1) / SM90_BK;
    const int rank = CM > 1 ? (int)sm90_cluster_rank() : 0;
    const bool sk = SK && sk_part != NULL;   /* stream-K over the last round (see sm90_sched) */

    if (wg == 0) {
        /* ---- producer ---- */
        sm90_setmaxnreg_dec<40>();
        if (tid < 32) {
            const int64_t U = sk ? sm90_units_total(splits, G, T, units) : 0;
            if (tid == 0) {   /* the walk: one thread issues every load */
                sm90_tma_prefetch_map(&m.x);
                if (p.wmaps_w == NULL)
                    sm90_tma_prefetch_map(!TB && (CM > 1 || EPI == MOEX_SM90_EPI_GLU_CONTIG) ? &m.wb : &m.w);
                sm90_walk wk;
                sm90_walk_start(&wk, sk, U, nk, CM, sk_min);
                const sm90_cursor &cur = wk.cur;
                uint32_t it = 0;
                const uint16_t both = (uint16_t)((1u << CM) - 1u);
                int acquired = -1;   /* the group whose discrete maps this thread acquired last */
                while (sm90_walk_next<false>(&wk, splits, G, T, units)) {
                    int64_t m0;
                    int n0;
                    const int colpair = sm90_rows_tile(&cur, wk.w.t, nt, band_w, band_r, BM, CM, rank, &m0, &n0);
                    /* the weight maps and their group coordinate */
                    const CUtensorMap *mw = &m.w, *mwb = &m.wb;
                    int wz = cur.g;
                    if (p.wmaps_w != NULL) {
                        mw = p.wmaps_w + cur.g;
                        mwb = p.wmaps_wb + cur.g;
                        wz = 0;
                        if (cur.g != acquired) {
                            sm90_tensormap_acquire(mw);
                            sm90_tensormap_acquire(mwb);
                            acquired = cur.g;
                        }
                    }
                    for (int kb = wk.w.kb0; kb < wk.w.kb1; kb++, it++) {
                        const int s = (int)sm90_ring_fill(full, empty, it, STAGE_BYTES);
                        uint16_t *b = sb + s * B_ELEMS;
                        if (CM > 1 && colpair)   /* 64 of the shared input rows each, into both CTAs */
                            sm90_tma_load_2d_multicast(sa + s * A_ELEMS + rank * 64 * SM90_BK, &m.xh, &full[s],
                                                       kb * SM90_BK, (int32_t)(m0 + 64 * rank), both);
                        else
                            sm90_tma_load_2d(sa + s * A_ELEMS, &m.x, &full[s], kb * SM90_BK, (int32_t)m0);
                        if (TB) {
                            /* four boxes of 64 output columns; a row pair loads two each, into both CTAs */
                            const bool split = CM > 1 && !colpair;
                            const int j0 = split ? rank * 2 : 0, j1 = split ? j0 + 2 : SM90_BN / 64;
                            for (int j = j0; j < j1; j++) {
                                if (split)
                                    sm90_tma_load_3d_multicast(b + j * 64 * SM90_BK, mw, &full[s], n0 + j * 64,
                                                               kb * SM90_BK, wz, both);
                                else
                                    sm90_tma_load_3d(b + j * 64 * SM90_BK, mw, &full[s], n0 + j * 64,
                                                     kb * SM90_BK, wz);
                            }
                        } else if (EPI == MOEX_SM90_EPI_GLU_CONTIG) {
                            /* box i: 64 rows of the first (h = 0) or second (h = 1) half (sm90_epilogue.cuh);
                             * a row pair loads one half each, into both CTAs */
                            const bool split = CM > 1 && !colpair;
                            const int i0 = split ? rank * 2 : 0, i1 = split ? i0 + 2 : 4;
                            for (int i = i0; i < i1; i++) {
                                const int h = BM == 128 ? i / 2 : i % 2, q = BM == 128 ? i % 2 : i / 2;
                                const int32_t wr = h * epi.F + n0 / 2 + q * 64;
                                if (split)
                                    sm90_tma_load_3d_multicast(b + i * 64 * SM90_BK, mwb, &full[s], kb * SM90_BK, wr,
                                                               wz, both);
                                else
                                    sm90_tma_load_3d(b + i * 64 * SM90_BK, mwb, &full[s], kb * SM90_BK, wr, wz);
                            }
                        } else if (CM > 1 && !colpair) {   /* half of the shared weight tile each */
                            sm90_tma_load_3d_multicast(b + rank * (SM90_BN / 2) * SM90_BK, mwb, &full[s],
                                                       kb * SM90_BK, n0 + rank * (SM90_BN / 2), wz, both);
                        } else {
                            sm90_tma_load_3d(b, mw, &full[s], kb * SM90_BK, n0, wz);
                        }
                    }
                }
            }
        } else if (tid == 32 && blockIdx.x == 0 && p.bad_flag != NULL) {
            sm90_check_splits(splits, G, T, p.bad_flag, p.bad_value);
        }
    } else {
        /* ---- consumers: warpgroup c computes its block of each tile (sm90_epilogue.cuh) ---- */
        sm90_setmaxnreg_inc<232>();
        const int c = wg - 1;
        const int a_row = BM == 128 ? 64 * c : 0, b_col = BM == 128 ? 0 : 128 * c;
        float acc[NA];
#pragma unroll
        for (int i = 0; i < NA; i++) acc[i] = 0.0f;
        uint32_t it = 0;
        sm90_block k;
        k.c = c;
        k.tid = tid;
        k.lane = tid % 32;
        k.rl = (tid / 32) * 16 + k.lane / 4;   /* block row of acc[4 j + {0, 1}]; + 8 for {2, 3} */
        /* stage 0's descriptors of this consumer's A rows and B columns; a stage and a k step
         * are adds (K-major: 32 bytes along the row; TB: 16 reduction rows of 128 bytes, the
         * 64-column blocks 8 KB apart) */
        uint64_t da0 = sm90_desc_sw128(sa + a_row * SM90_BK);
        uint64_t db0 = TB ? sm90_desc_mn_sw128(sb + (b_col / 64) * 64 * SM90_BK, 64 * SM90_BK * 2, 1024)
                          : sm90_desc_sw128(sb + b_col * SM90_BK);
        sm90_desc_hold(da0);
        sm90_desc_hold(db0);
        const uint32_t b_step = TB ? 16 * 64 * 2 : 16 * 2;
        sm90_walk wk;
        sm90_walk_start(&wk, sk, sk ? sm90_units_total(splits, G, T, units) : 0, nk, CM, sk_min);
        const sm90_cursor &cur = wk.cur;
        while (sm90_walk_next<true>(&wk, splits, G, T, units)) {
            const int kb0 = wk.w.kb0, steps = wk.w.kb1 - wk.w.kb0;
            int64_t m0;
            int n0;
            sm90_rows_tile(&cur, wk.w.t, nt, band_w, band_r, BM, CM, rank, &m0, &n0);
            k.mr = m0 + a_row;   /* the block's first row */
            k.ra = k.mr + k.rl;
            k.rb = k.ra + 8;
            k.row1 = cur.row1;
            k.oka = k.ra < cur.row1;
            k.okb = k.rb < cur.row1;
            sm90_cols<EPI, NC> cols;
            cols.ob = GLU ? (n0 + b_col) / 2 : n0 + b_col;
            cols.lim = GLU ? epi.F : N;
            /* the epilogue's inputs, fetched while the tile is computed: p of the block's
             * rows and the bias row (after the first k step) */
            float pa, pb;
            sm90_epi_probs<EPI>(epi, k, &pa, &pb);
            const bool has_bias = (EPI == MOEX_SM90_EPI_BIAS || GLU) && epi.bias != NULL;
            uint8_t *stage = sc + c * 2 * SM90_STAGE_HALF_BYTES;
            for (int kq = 0; kq < steps; kq++, it++) {
                const uint32_t s = sm90_ring_wait(full, it);
                sm90_wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < SM90_BK / 16; kk++)
                    sm90_wgmma<IS_F16, 0, TB>(acc, sm90_desc_add(da0, s * A_ELEMS * 2 + kk * 16 * 2),
                                              sm90_desc_add(db0, s * B_ELEMS * 2 + kk * b_step), (kq | kk) != 0);
                sm90_wgmma_commit();
                if (has_bias && kq == 0 && kb0 == 0)   /* only the owner runs the epilogue */
                    sm90_epi_bias_fetch(epi, cols, cur.g, N, stage, k);
                if (kq > 0) {
                    /* the previous stage's wgmmas are done: hand it back to the producer */
                    sm90_wgmma_wait<1>();
                    sm90_ring_release<CM>(empty, it - 1, tid);
                }
            }
            sm90_wgmma_wait<0>();
            sm90_ring_release<CM>(empty, it - 1, tid);
            if (kb0 > 0) {   /* the rest of a unit another worker owns: hand over the sums */
                sm90_sk_put(acc, sk_part, sk_flag, 2 * blockIdx.x + c, c, tid);
                continue;
            }
            if (kb0 + steps < nk)   /* the next worker's CTA of the same rank has the rest */
                sm90_sk_add(acc, sk_part, sk_flag, 2 * (blockIdx.x + CM) + c, c, tid);
            if (DGLU)
                sm90_epi_dglu<IS_F16, EPI, NC>(acc, epi, cols.ob, stage, k);
            else
                sm90_epi_rows<IS_F16, EPI_TMA, EPI, NC>(acc, epi, cols, has_bias, pa, pb, stage, &m.y, &m.z, p.y,
                                                        N, k);
        }
        if (EPI_TMA && tid == 0) sm90_bulk_wait<0>();   /* stores done before the CTA ends */
    }
    /* no CTA of a cluster leaves while its peer may still arrive on its barriers */
    if (CM > 1) sm90_cluster_sync();
#endif /* MOEX_SM90_DEVICE */
}

/* ---- host side ---------------------------------------------------------------------------- */

typedef void (*sm90_rows_fn)(sm90_rows_maps, sm90_epi, sm90_rows_params);

/* The instance for (dtype, product, plan). Instantiated: every product with both tile heights
 * and the TMA epilogue, at 128 rows with and without 2-CTA clusters (clusters are the
 * default); the plain forward and dgrad at 128 rows also with the register epilogue; each
 * also as its stream-K instance but the DGLU dgrad, which has none. */
template <int F16, int SK> static sm90_rows_fn sm90_rows_pick_t(int op, int bm, int cm, bool epi_tma) {
    constexpr int DC = SM90_OP_DGRAD + MOEX_SM90_EPI_DGLU_CONTIG, DI = SM90_OP_DGRAD + MOEX_SM90_EPI_DGLU_INTERLEAVED;
    switch (op) {
    case DC:
        if (bm == 64) return sm90_rows_kernel<F16, 64, 1, DC, 0, 1>;
        return cm > 1 ? sm90_rows_kernel<F16, 128, 2, DC, 0, 1> : sm90_rows_kernel<F16, 128, 1, DC, 0, 1>;
    case DI:
        if (bm == 64) return sm90_rows_kernel<F16, 64, 1, DI, 0, 1>;
        return cm > 1 ? sm90_rows_kernel<F16, 128, 2, DI, 0, 1> : sm90_rows_kernel<F16, 128, 1, DI, 0, 1>;
    case MOEX_SM90_EPI_BIAS:
        if (bm == 64) return sm90_rows_kernel<F16, 64, 1, 1, SK, 1>;
        return cm > 1 ? sm90_rows_kernel<F16, 128, 2, 1, SK, 1> : sm90_rows_kernel<F16, 128, 1, 1, SK, 1>;
    case MOEX_SM90_EPI_GLU_CONTIG:
        if (bm == 64) return sm90_rows_kernel<F16, 64, 1, 2, SK, 1>;
        return cm > 1 ? sm90_rows_kernel<F16, 128, 2, 2, SK, 1> : sm90_rows_kernel<F16, 128, 1, 2, SK, 1>;
    case MOEX_SM90_EPI_GLU_INTERLEAVED:
        if (bm == 64) return sm90_rows_kernel<F16, 64, 1, 3, SK, 1>;
        return cm > 1 ? sm90_rows_kernel<F16, 128, 2, 3, SK, 1> : sm90_rows_kernel<F16, 128, 1, 3, SK, 1>;
    case SM90_OP_DGRAD:
        if (bm == 64) return sm90_rows_kernel<F16, 64, 1, SM90_OP_DGRAD, SK, 1>;
        if (cm > 1) return sm90_rows_kernel<F16, 128, 2, SM90_OP_DGRAD, SK, 1>;
        return epi_tma ? sm90_rows_kernel<F16, 128, 1, SM90_OP_DGRAD, SK, 1>
                       : sm90_rows_kernel<F16, 128, 1, SM90_OP_DGRAD, SK, 0>;
    default: break;
    }
    if (bm == 64) return sm90_rows_kernel<F16, 64, 1, 0, SK, 1>;
    if (cm > 1) return sm90_rows_kernel<F16, 128, 2, 0, SK, 1>;
    return epi_tma ? sm90_rows_kernel<F16, 128, 1, 0, SK, 1> : sm90_rows_kernel<F16, 128, 1, 0, SK, 0>;
}

static sm90_rows_fn sm90_rows_pick(bool f16, bool sk, int op, int bm, int cm, bool epi_tma) {
    if (f16) return sk ? sm90_rows_pick_t<1, 1>(op, bm, cm, epi_tma) : sm90_rows_pick_t<1, 0>(op, bm, cm, epi_tma);
    return sk ? sm90_rows_pick_t<0, 1>(op, bm, cm, epi_tma) : sm90_rows_pick_t<0, 0>(op, bm, cm, epi_tma);
}

cudaError_t sm90_rows_probe(cudaFuncAttributes *fa) {
    return cudaFuncGetAttributes(fa, (const void *)sm90_rows_kernel<0, 128, 1, MOEX_SM90_EPI_PLAIN, 0, 1>);
}

cudaError_t sm90_rows_prepare(int sms, int *slots, const char **why) {
    static const int ops[] = {MOEX_SM90_EPI_PLAIN, MOEX_SM90_EPI_BIAS, MOEX_SM90_EPI_GLU_CONTIG,
                              MOEX_SM90_EPI_GLU_INTERLEAVED, SM90_OP_DGRAD,
                              SM90_OP_DGRAD + MOEX_SM90_EPI_DGLU_CONTIG,
                              SM90_OP_DGRAD + MOEX_SM90_EPI_DGLU_INTERLEAVED};
    const int nops = (int)(sizeof ops / sizeof ops[0]);
    static const struct {
        int bm, cm, epi_tma;
    } shapes[] = {{64, 1, 1}, {128, 1, 1}, {128, 2, 1}, {128, 1, 0}};
    for (int f16 = 0; f16 < 2; f16++)
        for (int sk = 0; sk < 2; sk++)
            for (int o = 0; o < nops; o++)
                for (int v = 0; v < 4; v++) {
                    /* the plain kernels have all four shapes, the fused epilogues three (the
                     * register epilogue falls back to a plain kernel's) */
                    const bool own = ops[o] == MOEX_SM90_EPI_PLAIN || ops[o] == SM90_OP_DGRAD || v < 3;
                    if (!own) continue;
                    const sm90_rows_fn fn = sm90_rows_pick(f16, sk, ops[o], shapes[v].bm, shapes[v].cm,
                                                           shapes[v].epi_tma);
                    const cudaError_t e = sm90_prepare_kernel((const void *)fn, SM90_SMEM_BYTES(shapes[v].bm),
                                                              shapes[v].cm, sms, slots, why);
                    if (e != cudaSuccess) return e;
                }
    return cudaSuccess;
}

/* The epilogue kind of e (MOEX_SM90_EPI_*) for the forward or the dgrad, or -1 when the
 * kernels cannot run it. */
static int sm90_epi_kind(const moex_sm90_gemm_args *a, const moex_sm90_epilogue *e, bool dgrad) {
    if (e == NULL) return MOEX_SM90_EPI_PLAIN;
    if (dgrad != (e->dh != NULL)) return -1;
    if (dgrad) {   /* FC2's dz into the GLU's backward: dz [T, F], F = a->K */
        const int64_t F = a->K;
        if (e->glu == NULL || e->bias_mode != MOEX_BIAS_NONE || e->h == NULL || !sm90_aligned16(e->h) ||
            !sm90_aligned16(e->dh) || (e->z != NULL && !sm90_aligned16(e->z)) || F % 8 != 0)
            return -1;
        if (e->glu->layout == MOEX_GLU_INTERLEAVED_32) return F % 32 == 0 ? MOEX_SM90_EPI_DGLU_INTERLEAVED : -1;
        return e->glu->layout == MOEX_GLU_CONTIGUOUS ? MOEX_SM90_EPI_DGLU_CONTIG : -1;
    }
    const bool bias = e->bias_mode != MOEX_BIAS_NONE;
    if (bias) {
        if (e->bias == NULL || !sm90_aligned16(e->bias)) return -1;
        if (e->bias_dtype != MOEX_DTYPE_F32 && e->bias_dtype != a->dtype) return -1;
        if (e->bias_mode == MOEX_BIAS_SCALED && e->probs == NULL) return -1;
    }
    if (e->glu == NULL) return bias ? MOEX_SM90_EPI_BIAS : MOEX_SM90_EPI_PLAIN;
    const int64_t F = a->N / 2;
    if (e->bias_mode == MOEX_BIAS_SCALED || e->z == NULL || !sm90_aligned16(e->z) || F % 8 != 0) return -1;
    if (e->glu->layout == MOEX_GLU_INTERLEAVED_32) return F % 32 == 0 ? MOEX_SM90_EPI_GLU_INTERLEAVED : -1;
    return e->glu->layout == MOEX_GLU_CONTIGUOUS ? MOEX_SM90_EPI_GLU_CONTIG : -1;
}

extern "C" bool moex_sm90_supported(const moex_sm90_context *c, const moex_sm90_gemm_args *a) {
    if (c == NULL || a == NULL) return false;
    if (a->dtype != MOEX_DTYPE_BF16 && a->dtype != MOEX_DTYPE_F16) return false;
    if (!sm90_shape_ok(a->G, a->T, a->K, a->N, a->splits)) return false;
    if (!sm90_aligned16(a->x) || !sm90_aligned16(a->w) || !sm90_aligned16(a->y)) return false;
    const void *maps = a->w_maps_kept != NULL ? a->w_maps_kept : a->w_maps;
    if (a->w_ptrs != NULL && (a->w != NULL || maps == NULL || ((uintptr_t)maps & 127u) != 0 ||
                              ((uintptr_t)a->w_ptrs & 7u) != 0))
        return false;
    if (a->w_ptrs == NULL && a->w_maps_kept != NULL) return false;
    if (a->w_ptrs == NULL && a->w == NULL) return false;
    return a->workspace == NULL || sm90_aligned16(a->workspace);
}

extern "C" bool moex_sm90_epilogue_supported(const moex_sm90_context *c, const moex_sm90_gemm_args *a,
                                             const moex_sm90_epilogue *e) {
    return moex_sm90_supported(c, a) && sm90_epi_kind(a, e, e != NULL && e->dh != NULL) >= 0;
}

/* The shape the heuristic plans for. */
static moex_sm90_shape sm90_rows_shape(const moex_sm90_gemm_args *a, int epi, bool dgrad) {
    moex_sm90_shape s;
    memset(&s, 0, sizeof s);
    s.product = dgrad ? MOEX_SM90_DGRAD : MOEX_SM90_FORWARD;
    s.epi = epi;
    s.G = a->G;
    s.T = a->T;
    s.K = a->K;
    s.N = a->N;
    s.workspace = a->workspace != NULL;
    return s;
}

extern "C" size_t moex_sm90_gemm_workspace_bytes(const moex_sm90_context *c, const moex_sm90_gemm_args *a,
                                                 const moex_sm90_epilogue *e) {
    if (c == NULL) return 0;
    if (a == NULL) return moex_sm90_workspace_bytes_max(&c->dev);
    const int epi = sm90_epi_kind(a, e, false);
    if (epi < 0 || a->T <= 0 || a->G < 1) return 0;
    moex_sm90_shape s = sm90_rows_shape(a, epi, false);
    s.workspace = true;
    moex_sm90_plan p;
    moex_sm90_plan_make(&c->dev, &s, NULL, &p);
    return moex_sm90_plan_workspace_bytes(&c->dev, &p);
}

/* The forward (dgrad = 0: y = x W_g^T, with the epilogue e) or the data gradient (dgrad = 1:
 * y = x W_g, x [T, N], y [T, K]) as one launch of the planned instance; tune: the knobs
 * (NULL in production). */
static moex_status sm90_rows_run(const moex_sm90_context *ctx, const moex_sm90_gemm_args *a,
                                 const moex_sm90_epilogue *e, bool dgrad, moex_sm90_tuning *tune, moex_stream stream,
                                 const char **why) {
    if (tune != NULL) tune->grid_used = 0;
    if (!moex_sm90_supported(ctx, a))
        SM90_FAIL(MOEX_ERR_UNSUPPORTED, "sm90 grouped GEMM: unsupported device, dtype, shape or alignment");
    const int epi = sm90_epi_kind(a, e, dgrad);
    if (epi < 0)
        SM90_FAIL(MOEX_ERR_UNSUPPORTED, "sm90 grouped GEMM: unsupported epilogue (bias, probs, GLU, z, h or dh)");
    if (a->T == 0) return MOEX_OK;
    const moex_sm90_shape shape = sm90_rows_shape(a, epi, dgrad);
    moex_sm90_plan plan;
    moex_sm90_plan_make(&ctx->dev, &shape, tune, &plan);
    const int bm = plan.tile_rows, cm = plan.cluster;
    /* kernel view: out = in [T, red] times B_g (red x out_w) */
    const int64_t red = dgrad ? a->N : a->K, out_w = dgrad ? a->K : a->N;
    const bool glu = MOEX_SM90_EPI_IS_GLU(epi);

    sm90_rows_maps km;
    sm90_epi ke;
    sm90_rows_params kp;
    memset(&km, 0, sizeof km);
    memset(&ke, 0, sizeof ke);
    memset(&kp, 0, sizeof kp);
    const CUtensorMapL2promotion promo = sm90_l2_promotion(plan.l2_promotion);
    const cuuint64_t xdims[2] = {(cuuint64_t)red, (cuuint64_t)a->T};
    const cuuint32_t xbox[2] = {SM90_BK, (cuuint32_t)bm}, xhbox[2] = {SM90_BK, 64};
    /* the weight maps w and wb, boxes of w_rows and wb_rows rows. A discrete weight's are per
     * group: the caller's kept planes of those heights, or written before the launch from
     * templates of one matrix whose address the device sets per group (sm90_weight_maps.cu;
     * any 16-byte aligned address stands in meanwhile) */
    const bool discrete = a->w_ptrs != NULL, kept = a->w_maps_kept != NULL;
    const cuuint32_t w_rows = dgrad ? 64u : (cuuint32_t)SM90_BN;
    const cuuint32_t wb_rows = cm > 1 && epi != MOEX_SM90_EPI_GLU_CONTIG ? SM90_BN / 2u : 64u;
    const void *wbase = discrete ? a->w_maps : a->w;
    const int64_t wG = discrete ? 1 : a->G;
    const cuuint64_t ydims[2] = {(cuuint64_t)out_w, (cuuint64_t)a->T};
    const cuuint64_t zdims[2] = {(cuuint64_t)(a->N / 2), (cuuint64_t)a->T};
    const cuuint32_t ybox[2] = {64, 64};
    const char *kname = "sm90 grouped GEMM";   /* a map failure names the kernel and the operand */
    const char *in = dgrad ? "dy" : "x", *out = dgrad ? "dx" : "y";
    if (!sm90_make_map(ctx, &km.x, a->dtype, a->x, 2, xdims, xbox, promo, kname, in, why) ||
        !sm90_make_map(ctx, &km.xh, a->dtype, a->x, 2, xdims, xhbox, promo, kname, in, why) ||
        (!kept && (!sm90_make_weight_map(ctx, &km.w, a->dtype, wbase, wG, a->N, a->K, w_rows, promo, kname, why) ||
                   !sm90_make_weight_map(ctx, &km.wb, a->dtype, wbase, wG, a->N, a->K, wb_rows, promo, kname, why))) ||
        !sm90_make_map(ctx, &km.y, a->dtype, a->y, 2, ydims, ybox, promo, kname, out, why) ||
        !sm90_make_map(ctx, &km.z, a->dtype, glu ? e->z : a->y, 2, glu ? zdims : ydims, ybox, promo, kname,
                       glu ? "z" : out, why))
        return MOEX_ERR_CUDA;   /* *why names the operand and the CUresult */

    if (e != NULL && epi != MOEX_SM90_EPI_PLAIN) {
        ke.bias = e->bias_mode != MOEX_BIAS_NONE ? e->bias : NULL;
        ke.bias_f32 = e->bias_dtype == MOEX_DTYPE_F32;
        ke.bias_scaled = e->bias_mode == MOEX_BIAS_SCALED;
        ke.probs = e->probs;
        if (glu) {
            ke.z = (uint16_t *)e->z;
            ke.F = (int)(a->N / 2);
            ke.glu = moex_glu_consts_of(e->glu);
        }
        if (MOEX_SM90_EPI_IS_DGLU(epi)) {
            ke.h = (const uint16_t *)e->h;
            ke.dh = (uint16_t *)e->dh;
            ke.z = (uint16_t *)e->z;
            ke.dp_part = e->dprobs_part;
            ke.F = (int)a->K;
            ke.dp_ld = (int)((a->K + 127) / 128);
            ke.glu = moex_glu_consts_of(e->glu);
        }
    }
    kp.y = (uint16_t *)a->y;
    kp.splits = a->splits;
    kp.G = (int)a->G;
    kp.T = a->T;
    kp.N = (int)out_w;
    kp.K = (int)red;
    kp.band_w = plan.band;
    kp.band_r = plan.band_rows;
    kp.bad_flag = a->bad_flag;
    kp.bad_value = a->bad_value;
    kp.sk_min = plan.sk_min;

    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr[1];
    sm90_launch_config(&cfg, attr, plan.grid, SM90_SMEM_BYTES(bm), cm, true, stream);
    /* stream-K: the flags start at 0 (a memset captured with the launch in a graph); the
     * partials need nothing */
    if (plan.stream_k) {
        kp.sk_flag = (int *)a->workspace;
        kp.sk_part = (float4 *)((char *)a->workspace + moex_sm90_sk_flag_bytes(&ctx->dev));
        if (cudaMemsetAsync(kp.sk_flag, 0, (size_t)2 * plan.grid * sizeof(int), cfg.stream) != cudaSuccess) {
            cudaGetLastError();
            SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped GEMM: cudaMemsetAsync of the stream-K flags failed");
        }
    }
    if (kept) {
        const CUtensorMap *planes = (const CUtensorMap *)a->w_maps_kept;
        kp.wmaps_w = planes + sm90_kept_plane(w_rows) * a->G;
        kp.wmaps_wb = planes + sm90_kept_plane(wb_rows) * a->G;
    } else if (discrete) {
        sm90_weight_templates wt;
        memset(&wt, 0, sizeof wt);
        wt.m[0] = km.w, wt.m[1] = km.wb, wt.n = 2;
        kp.wmaps_w = (const CUtensorMap *)a->w_maps;
        kp.wmaps_wb = kp.wmaps_w + a->G;
        if (sm90_weight_maps_write(&wt, a->w_ptrs, (int)a->G, (CUtensorMap *)a->w_maps, a->bad_flag,
                                   a->bad_align_value, cfg.stream) != cudaSuccess) {
            cudaGetLastError();
            SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped GEMM: the discrete weight maps' launch failed");
        }
    }
    const sm90_rows_fn fn = sm90_rows_pick(a->dtype == MOEX_DTYPE_F16, plan.stream_k,
                                           dgrad ? SM90_OP_DGRAD + epi : epi, bm, cm, plan.epilogue_tma);
    if (cudaLaunchKernelEx(&cfg, fn, km, ke, kp) != cudaSuccess) {
        cudaGetLastError();
        SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped GEMM: kernel launch failed");
    }
    if (tune != NULL) tune->grid_used = plan.grid;
    return MOEX_OK;
}

extern "C" moex_status moex_sm90_grouped_gemm_fwd(const moex_sm90_context *c, const moex_sm90_gemm_args *a,
                                                  const moex_sm90_epilogue *e, moex_stream stream, const char **why) {
    return sm90_rows_run(c, a, e, false, NULL, stream, why);
}

extern "C" moex_status moex_sm90_grouped_gemm_dgrad(const moex_sm90_context *c, const moex_sm90_gemm_args *a,
                                                    const moex_sm90_epilogue *e, moex_stream stream,
                                                    const char **why) {
    return sm90_rows_run(c, a, e, true, NULL, stream, why);
}

extern "C" moex_status moex_sm90_grouped_gemm_fwd_tuned(const moex_sm90_context *c, const moex_sm90_gemm_args *a,
                                                        const moex_sm90_epilogue *e, moex_sm90_tuning *tune,
                                                        moex_stream stream, const char **why) {
    return sm90_rows_run(c, a, e, false, tune, stream, why);
}

extern "C" moex_status moex_sm90_grouped_gemm_dgrad_tuned(const moex_sm90_context *c, const moex_sm90_gemm_args *a,
                                                          moex_sm90_tuning *tune, moex_stream stream,
                                                          const char **why) {
    return sm90_rows_run(c, a, NULL, true, tune, stream, why);
}
