/*
 * sm90_grouped_wgrad.cu - the Hopper (sm_90a) K-grouped weight gradient dW_g = dy_g^T x_g
 * (contract in sm90_grouped_gemm.h; the CTA shape and the host helpers in sm90_common.cuh).
 */
#include "sm90_common.cuh"

/* ---- the weight gradient (K-grouped): dW_g = dy_g^T x_g ------------------------------------
 * Same CTA shape as the forward (one producer warpgroup, two wgmma consumer warpgroups), its
 * own kernel. A work unit is CM output tiles [128 rows of N, 256 columns of K] of one group
 * (CM = CTAs per cluster: the CTA of rank r takes N tile CM p + r of unit p); every group has
 * the same ceil(ceil(N/128) / CM) * ceil(K/256) units, so the unit list is known on the host
 * and CTA (cluster) b takes units b, b + grid, ... (the group of a unit only grows, so a
 * cursor over the splits costs O(G) per CTA); inside a group, units go in bands of N units
 * (sm90w_tile_coords) so that the CTAs running at once share dy and x columns. A unit
 * reduces over its group's rows in stages of 64 rows: dy box [64 rows][64 N] per consumer
 * (A, MN-major, transposed by wgmma) and four x boxes [64 rows][64 K] (B, MN-major). A
 * stage that reaches past the group's end holds rows of the next group (or past off[G]:
 * anything, NaN included; past T: TMA zero fill); the consumers overwrite those rows with
 * zeros in shared memory before any wgmma reads the stage (each consumer its own dy box and
 * two of the four x boxes, then a proxy fence and a barrier over both consumers). A group
 * with no rows has no stages: its tiles are written as zeros (=) or left alone (+=). Every
 * output tile is computed by one CTA, stages in row order: deterministic.
 *
 * Output (EPI_TMA): a consumer's 64 x 256 block that lies inside [N, K] goes registers ->
 * 128-byte-swizzled shared staging -> TMA, in boxes of 64 rows by 128 bytes (64 bf16/f16 or
 * 32 f32 columns) through two 8 KB halves used in turn, so the threads write one half while
 * the copy engine reads the other; "+=" uses the TMA reduce-add (each element gets exactly
 * one add, from one CTA: still deterministic, and the old dW never passes through the SM).
 * Blocks that reach past N or K (and every block without EPI_TMA) use masked stores from
 * registers.
 * Clusters (CM = 2): the two CTAs take N tiles 2p and 2p + 1 of the same group and K tile,
 * so they read the same x boxes: each loads two of the four with TMA multicast into both,
 * and a stage is refilled only after the consumers of both CTAs released it (each consumer
 * arrives on the empty barrier of both CTAs). Where N has an odd number of tiles, the rank 1
 * CTA of the last pair computes a tile it never stores (dy read from tile 0). */

#define SM90W_BR 64                      /* group rows (the reduction) per stage            */
#define SM90W_BOX (64 * 64)              /* elements of one TMA box [64 rows][64 columns]     */
#define SM90W_A_BOXES (SM90_BM / 64)     /* dy boxes per stage: one per consumer            */
#define SM90W_B_BOXES (SM90_BN / 64)     /* x boxes per stage                              */
#define SM90W_HALF_BYTES 8192            /* one output staging box: 64 rows of 128 bytes     */
#define SM90W_BAND 16                    /* N tiles per band of the tile order              */
static const uint32_t SM90W_STAGE_BYTES = (uint32_t)(SM90W_A_BOXES + SM90W_B_BOXES) * SM90W_BOX * 2u;
/* stages + output staging (2 consumers x 2 halves) + barriers + slack to align to 1024 bytes */
static const size_t SM90W_SMEM_BYTES =
    (size_t)SM90_STAGES * SM90W_STAGE_BYTES + 4 * SM90W_HALF_BYTES + 2 * SM90_STAGES * 8 + 1024;

enum { SM90W_OUT_F32 = 0, SM90W_OUT_F32_ACC = 1, SM90W_OUT_HALF = 2 };

#if MOEX_SM90_DEVICE
/* The rows [row0, row1) of group g; moves forward only. */
typedef struct sm90w_cursor {
    int64_t g, row0, row1;
} sm90w_cursor;

static __device__ __forceinline__ void sm90w_seek(sm90w_cursor *c, int64_t g, const int64_t *splits, int64_t T) {
    while (c->g < g) {
        c->g++;
        int64_t s = __ldg(splits + c->g);
        s = s < 0 ? 0 : s;
        c->row0 = c->row1;
        c->row1 = s > T - c->row0 ? T : c->row0 + s;
    }
}

/* The same by the 32 lanes of a warp together (the consumers; see sm90_warp_split_scan):
 * up to 32 groups per step. */
static __device__ __forceinline__ void sm90w_seek_warp(sm90w_cursor *c, int64_t g, const int64_t *splits, int64_t G,
                                                       int64_t T) {
    while (c->g < g) {
        int64_t s;
        const int64_t ps = sm90_warp_split_scan(splits, c->g + 1, G, T, &s);
        const int L = g - c->g < 32 ? (int)(g - c->g) - 1 : 31;   /* the lane of group g, or the last */
        const int64_t end = c->row1 + __shfl_sync(0xffffffffu, ps, L);
        c->row0 = end - __shfl_sync(0xffffffffu, s, L) < T ? end - __shfl_sync(0xffffffffu, s, L) : T;
        c->row1 = end < T ? end : T;
        c->g += L + 1;
    }
}

/* The first dW row n0 and column k0 of this CTA's tile (cluster rank `rank`) of unit l of a
 * group (tnu N units of CM tiles, tk K tiles). Units go in bands of band_w N units, N units
 * fastest, so the CTAs running at the same time cover a block of about band_w N units by
 * grid / band_w K tiles and share both the dy and the x columns of each stage in L2. */
static __device__ __forceinline__ void sm90w_tile_coords(int64_t l, int64_t tnu, int64_t tk, int64_t band_w, int cm,
                                                         int rank, int *n0, int *k0) {
    const int64_t band = l / (band_w * tk), r = l - band * band_w * tk;
    const int64_t w = tnu - band * band_w < band_w ? tnu - band * band_w : band_w;   /* the last: narrower */
    *n0 = (int)(((band * band_w + r % w) * cm + rank) * SM90_BM);
    *k0 = (int)(r / w) * SM90_BN;
}

/* Overwrites rows [v, 64) of one swizzled box [64 rows][128 bytes] with zeros (the 128-byte
 * swizzle permutes 16-byte chunks inside a row, so a row stays bytes [128 r, 128 r + 128)). */
static __device__ __forceinline__ void sm90w_zero_rows(uint8_t *box, int v, int tid) {
    uint4 *p = (uint4 *)(box + v * 128);
    const int n = (64 - v) * 8;
    for (int i = tid; i < n; i += 128) p[i] = make_uint4(0u, 0u, 0u, 0u);
}

/* The staging box `half` (8 KB, [64 rows][128 bytes], 128-byte swizzle) has been written by
 * the 128 threads of a consumer: thread 0 sends it to dW_g[n .. n + 64, k .. k + box) with a
 * TMA store (add: reduce-add). Before the barrier, thread 0 waits until every earlier store
 * has read its staging box, so that after the barrier the other half may be rewritten while
 * this one is in flight. */
static __device__ __forceinline__ void sm90w_send_box(const CUtensorMap *tm, const uint8_t *half, int k, int n,
                                                      int g, bool add, int bar, int tid) {
    sm90_fence_proxy_async_smem();
    if (tid == 0) sm90_bulk_wait_read<0>();
    sm90_named_barrier(bar, 128);
    if (tid == 0) {
        if (add)
            sm90_tma_reduce_add_3d(tm, half, k, n, g);
        else
            sm90_tma_store_3d(tm, half, k, n, g);
        sm90_bulk_commit();
    }
}

/* The TMA epilogue of one consumer block dW_g[n .. n + 64, k0 .. k0 + 256), in the input
 * dtype: four boxes of 64 columns. Thread (warp, lane) holds rows rl = 16 warp + lane / 4 and
 * rl + 8, columns 8 j + 2 (lane % 4) (+1) for j < 32: box j / 8, 16-byte chunk j % 8 of the
 * row, stored at chunk (j % 8) ^ (row % 8). live = 0 writes zeros. */
template <int IS_F16>
static __device__ __forceinline__ void sm90w_epilogue_half(const float (&acc)[128], bool live, uint8_t *stage,
                                                           const CUtensorMap *tm, int k0, int n, int g, int bar,
                                                           int tid) {
    const int warp = tid / 32, lane = tid % 32, rl = warp * 16 + lane / 4;
#pragma unroll
    for (int b = 0; b < 4; b++) {
        uint8_t *half = stage + (b & 1) * SM90W_HALF_BYTES;
        uint8_t *ta = half + rl * 128 + (lane % 4) * 4, *tb = ta + 8 * 128;
#pragma unroll
        for (int ch = 0; ch < 8; ch++) {
            const int j = b * 8 + ch, off = (ch ^ (rl & 7)) << 4;   /* (rl + 8) % 8 == rl % 8 */
            *(uint32_t *)(ta + off) = sm90_io<IS_F16>::pack(live ? acc[j * 4 + 0] : 0.0f, live ? acc[j * 4 + 1] : 0.0f);
            *(uint32_t *)(tb + off) = sm90_io<IS_F16>::pack(live ? acc[j * 4 + 2] : 0.0f, live ? acc[j * 4 + 3] : 0.0f);
        }
        sm90w_send_box(tm, half, k0 + b * 64, n, g, false, bar, tid);
    }
}

/* The same in f32 (add: "+=" through TMA reduce-adds): eight boxes of 32 columns. Columns
 * 8 j + 2 (lane % 4) are box j / 4, bytes 32 (j % 4) + 8 (lane % 4) of the row: chunk
 * 2 (j % 4) + (lane % 4) / 2, byte 8 (lane % 2) inside it. */
static __device__ __forceinline__ void sm90w_epilogue_f32(const float (&acc)[128], bool live, uint8_t *stage,
                                                          const CUtensorMap *tm, int k0, int n, int g, bool add,
                                                          int bar, int tid) {
    const int warp = tid / 32, lane = tid % 32, rl = warp * 16 + lane / 4;
#pragma unroll
    for (int b = 0; b < 8; b++) {
        uint8_t *half = stage + (b & 1) * SM90W_HALF_BYTES;
        uint8_t *ta = half + rl * 128 + (lane % 2) * 8, *tb = ta + 8 * 128;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int j = b * 4 + q, off = ((2 * q + (lane % 4) / 2) ^ (rl & 7)) << 4;
            *(float2 *)(ta + off) = make_float2(live ? acc[j * 4 + 0] : 0.0f, live ? acc[j * 4 + 1] : 0.0f);
            *(float2 *)(tb + off) = make_float2(live ? acc[j * 4 + 2] : 0.0f, live ? acc[j * 4 + 3] : 0.0f);
        }
        sm90w_send_box(tm, half, k0 + b * 32, n, g, add, bar, tid);
    }
}
#endif /* MOEX_SM90_DEVICE */

/* mode: SM90W_OUT_F32 (dw f32, =), SM90W_OUT_F32_ACC (dw f32, +=), SM90W_OUT_HALF (dw in the
 * input dtype, =). tm_dy: dy [T, N], tm_x: x [T, K], both boxes [64 rows][64 columns];
 * tm_dw: dw [G, N, K] (3-D, dw's dtype), boxes [1][64 rows][128 bytes] (only with EPI_TMA). */
template <int IS_F16, int EPI_TMA, int CM>
__global__ void __launch_bounds__(SM90_THREADS, 1)
    sm90_wgrad_kernel(const __grid_constant__ CUtensorMap tm_dy, const __grid_constant__ CUtensorMap tm_x,
                      const __grid_constant__ CUtensorMap tm_dw, void *__restrict__ dw,
                      const int64_t *__restrict__ splits, int64_t G, int64_t T, int N, int K, int band_w,
                      int mode) {
#if MOEX_SM90_DEVICE
    extern __shared__ uint8_t smem_raw[];
    /* aligned up to 1024 bytes by an offset from smem_raw (not through an integer), so the
     * compiler keeps seeing shared memory and emits shared stores, not generic ones */
    uint8_t *smem = smem_raw + ((1024u - (sm90_smem_addr(smem_raw) & 1023u)) & 1023u);
    uint16_t *sa = (uint16_t *)smem;                                       /* [STAGES][2][64][64] */
    uint16_t *sb = sa + SM90_STAGES * SM90W_A_BOXES * SM90W_BOX;           /* [STAGES][4][64][64] */
    uint8_t *sc = (uint8_t *)(sb + SM90_STAGES * SM90W_B_BOXES * SM90W_BOX); /* [2][2][8 KB]      */
    uint64_t *full = (uint64_t *)(sc + 4 * SM90W_HALF_BYTES);
    uint64_t *empty = full + SM90_STAGES;

    const int wg = sm90_warpgroup(), tid = threadIdx.x % 128;
    sm90_ring_init<CM>(full, empty);

    const int64_t tn = (N + SM90_BM - 1) / SM90_BM, tk = (K + SM90_BN - 1) / SM90_BN;
    const int64_t tnu = (tn + CM - 1) / CM;                 /* units along N: CM tiles each */
    const int64_t per_group = tnu * tk, units = G * per_group;
    const int rank = CM > 1 ? (int)sm90_cluster_rank() : 0;
    const int64_t unit0 = blockIdx.x / CM, units_step = gridDim.x / CM;

    if (wg == 0) {
        /* ---- producer ---- */
        sm90_setmaxnreg_dec<40>();
        if (tid == 0) {
            sm90_tma_prefetch_map(&tm_dy);
            sm90_tma_prefetch_map(&tm_x);
            sm90w_cursor cur = {-1, 0, 0};
            uint32_t it = 0;
            for (int64_t u = unit0; u < units; u += units_step) {
                const int64_t g = u / per_group, l = u - g * per_group;
                sm90w_seek(&cur, g, splits, T);
                int n0, k0;
                sm90w_tile_coords(l, tnu, tk, band_w, CM, rank, &n0, &k0);
                const int ny = n0 < N ? n0 : 0;   /* a cluster's tile past N: any dy, never stored */
                const int nks = (int)((cur.row1 - cur.row0 + SM90W_BR - 1) / SM90W_BR);
                for (int kb = 0; kb < nks; kb++, it++) {
                    const int s = it % SM90_STAGES;
                    const int32_t r = (int32_t)(cur.row0 + (int64_t)kb * SM90W_BR);
                    sm90_mbar_wait(&empty[s], ((it / SM90_STAGES) & 1u) ^ 1u);
                    /* every box lands in full (zero-filled past the tensor; with clusters
                     * half of the x boxes come from the peer): constant bytes */
                    sm90_mbar_arrive_expect_tx(&full[s], SM90W_STAGE_BYTES);
#pragma unroll
                    for (int j = 0; j < SM90W_A_BOXES; j++)
                        sm90_tma_load_2d(sa + (s * SM90W_A_BOXES + j) * SM90W_BOX, &tm_dy, &full[s], ny + j * 64, r);
                    if (CM > 1) {
#pragma unroll
                        for (int j = rank * (SM90W_B_BOXES / CM); j < (rank + 1) * (SM90W_B_BOXES / CM); j++)
                            sm90_tma_load_2d_multicast(sb + (s * SM90W_B_BOXES + j) * SM90W_BOX, &tm_x, &full[s],
                                                       k0 + j * 64, r, (uint16_t)((1u << CM) - 1u));
                    } else {
#pragma unroll
                        for (int j = 0; j < SM90W_B_BOXES; j++)
                            sm90_tma_load_2d(sb + (s * SM90W_B_BOXES + j) * SM90W_BOX, &tm_x, &full[s], k0 + j * 64,
                                             r);
                    }
                }
            }
        }
    } else {
        /* ---- consumers: warpgroup c computes dW rows [n0 + 64 c, n0 + 64 c + 64) ---- */
        sm90_setmaxnreg_inc<232>();
        const int c = wg - 1;
        const int warp = tid / 32, lane = tid % 32;
        float acc[128];
#pragma unroll
        for (int i = 0; i < 128; i++) acc[i] = 0.0f;
        /* stage 0's descriptors of this consumer's dy box and of the x boxes (64-column
         * blocks one box apart); a stage and a k step (16 rows of 128 bytes) are adds */
        uint64_t da0 = sm90_desc_mn_sw128(sa + c * SM90W_BOX, SM90W_BOX * 2, 1024);
        uint64_t db0 = sm90_desc_mn_sw128(sb, SM90W_BOX * 2, 1024);
        sm90_desc_hold(da0);
        sm90_desc_hold(db0);
        sm90w_cursor cur = {-1, 0, 0};
        uint32_t it = 0;
        for (int64_t u = unit0; u < units; u += units_step) {
            const int64_t g = u / per_group, l = u - g * per_group;
            sm90w_seek_warp(&cur, g, splits, G, T);
            int n0, k0;
            sm90w_tile_coords(l, tnu, tk, band_w, CM, rank, &n0, &k0);
            const int nks = (int)((cur.row1 - cur.row0 + SM90W_BR - 1) / SM90W_BR);
            const int tail = (int)((cur.row1 - cur.row0) % SM90W_BR);   /* rows of a partial last stage */
            for (int kb = 0; kb < nks; kb++, it++) {
                const uint32_t s = it % SM90_STAGES;
                sm90_mbar_wait(&full[s], (it / SM90_STAGES) & 1u);
                if (tail != 0 && kb == nks - 1) {
                    /* rows [tail, 64) are not the group's: zero them in this consumer's dy box
                     * and in x boxes 2c, 2c + 1, then make both consumers' zeros visible to
                     * the tensor cores before either reads the stage */
                    uint16_t *b = sb + s * SM90W_B_BOXES * SM90W_BOX;
                    sm90w_zero_rows((uint8_t *)(sa + (s * SM90W_A_BOXES + c) * SM90W_BOX), tail, tid);
                    sm90w_zero_rows((uint8_t *)(b + (2 * c) * SM90W_BOX), tail, tid);
                    sm90w_zero_rows((uint8_t *)(b + (2 * c + 1) * SM90W_BOX), tail, tid);
                    sm90_fence_proxy_async_smem();
                    sm90_named_barrier(1, 256);
                }
                sm90_wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < SM90W_BR / 16; kk++) {
                    const uint64_t da = sm90_desc_add(da0, (s * SM90W_A_BOXES * SM90W_BOX + kk * 16 * 64) * 2);
                    const uint64_t db = sm90_desc_add(db0, (s * SM90W_B_BOXES * SM90W_BOX + kk * 16 * 64) * 2);
                    const uint32_t keep = (kb | kk) != 0;
                    if (IS_F16)
                        wgmma_m64n256k16_f16_tatb(acc, da, db, keep);
                    else
                        wgmma_m64n256k16_bf16_tatb(acc, da, db, keep);
                }
                sm90_wgmma_commit();
                if (kb > 0) {
                    /* the previous stage's wgmmas are done: hand it back to the producer(s) */
                    sm90_wgmma_wait<1>();
                    if (tid < CM) sm90_release_stage<CM>(&empty[(it - 1) % SM90_STAGES], tid);
                }
            }
            /* unconditional (a no-op without stages): ptxas then sees every path to the
             * epilogue's reads of acc close the wgmma pipeline, and serialises nothing */
            sm90_wgmma_wait<0>();
            if (nks > 0) {
                if (tid < CM) sm90_release_stage<CM>(&empty[(it - 1) % SM90_STAGES], tid);
            } else if (mode == SM90W_OUT_F32_ACC) {
                continue;   /* += an empty sum: dW_g unchanged */
            }
            /* an empty group writes zeros (selected, not computed: acc holds an older tile) */
            const bool live = nks > 0;

            const int nc = n0 + c * 64;   /* this consumer's first dW row */
            if (EPI_TMA && nc + 64 <= N && k0 + SM90_BN <= K) {
                uint8_t *stage = sc + c * 2 * SM90W_HALF_BYTES;
                if (mode == SM90W_OUT_HALF)
                    sm90w_epilogue_half<IS_F16>(acc, live, stage, &tm_dw, k0, nc, (int)g, 2 + c, tid);
                else
                    sm90w_epilogue_f32(acc, live, stage, &tm_dw, k0, nc, (int)g, mode == SM90W_OUT_F32_ACC, 2 + c,
                                       tid);
                continue;
            }

            /* masked register stores: thread holds dW rows ra, ra + 8 and column pairs
             * j*8 + 2*(lane%4) */
            const int64_t ra = nc + warp * 16 + lane / 4, rb = ra + 8;
            const bool oka = ra < N, okb = rb < N;
            const int64_t base = g * (int64_t)N * K;
            if (mode == SM90W_OUT_HALF) {
                uint16_t *oa = (uint16_t *)dw + base + ra * K, *ob = (uint16_t *)dw + base + rb * K;
#pragma unroll
                for (int j = 0; j < 32; j++) {
                    const int col = k0 + j * 8 + (lane % 4) * 2;
                    if (col < K) {
                        if (oka)
                            *(uint32_t *)(oa + col) = sm90_io<IS_F16>::pack(live ? acc[j * 4 + 0] : 0.0f,
                                                                            live ? acc[j * 4 + 1] : 0.0f);
                        if (okb)
                            *(uint32_t *)(ob + col) = sm90_io<IS_F16>::pack(live ? acc[j * 4 + 2] : 0.0f,
                                                                            live ? acc[j * 4 + 3] : 0.0f);
                    }
                }
            } else {
                const bool add = mode == SM90W_OUT_F32_ACC;
                float *oa = (float *)dw + base + ra * K, *ob = (float *)dw + base + rb * K;
#pragma unroll
                for (int j = 0; j < 32; j++) {
                    const int col = k0 + j * 8 + (lane % 4) * 2;
                    if (col < K) {
                        if (oka) {
                            float2 v = make_float2(live ? acc[j * 4 + 0] : 0.0f, live ? acc[j * 4 + 1] : 0.0f);
                            if (add) {
                                const float2 o = *(const float2 *)(oa + col);
                                v.x = o.x + v.x;
                                v.y = o.y + v.y;
                            }
                            *(float2 *)(oa + col) = v;
                        }
                        if (okb) {
                            float2 v = make_float2(live ? acc[j * 4 + 2] : 0.0f, live ? acc[j * 4 + 3] : 0.0f);
                            if (add) {
                                const float2 o = *(const float2 *)(ob + col);
                                v.x = o.x + v.x;
                                v.y = o.y + v.y;
                            }
                            *(float2 *)(ob + col) = v;
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

/* ---- weight gradient: host side -------------------------------------------------------- */

typedef void (*sm90w_kernel_fn)(CUtensorMap, CUtensorMap, CUtensorMap, void *, const int64_t *, int64_t, int64_t, int,
                                int, int, int);

static sm90w_kernel_fn sm90w_pick(bool f16, bool epi_tma, int cm) {
    if (cm > 1) {
        if (f16) return epi_tma ? sm90_wgrad_kernel<1, 1, 2> : sm90_wgrad_kernel<1, 0, 2>;
        return epi_tma ? sm90_wgrad_kernel<0, 1, 2> : sm90_wgrad_kernel<0, 0, 2>;
    }
    if (f16) return epi_tma ? sm90_wgrad_kernel<1, 1, 1> : sm90_wgrad_kernel<1, 0, 1>;
    return epi_tma ? sm90_wgrad_kernel<0, 1, 1> : sm90_wgrad_kernel<0, 0, 1>;
}

extern "C" bool moex_sm90_wgrad_supported(int device, const moex_sm90_wgrad_args *a) {
    if (a == NULL) return false;
    if (a->dtype != MOEX_DTYPE_BF16 && a->dtype != MOEX_DTYPE_F16) return false;
    if (a->accumulate ? a->dw_dtype != MOEX_DTYPE_F32 : a->dw_dtype != MOEX_DTYPE_F32 && a->dw_dtype != a->dtype)
        return false;
    if (a->G < 1 || a->G > INT32_MAX || a->T < 0 || a->T > (int64_t)INT32_MAX - SM90_BM) return false;
    if (a->K < 8 || a->N < 8 || a->K % 8 != 0 || a->N % 8 != 0) return false;
    if (a->K > INT32_MAX / 2 || a->N > INT32_MAX / 2) return false;
    if (!sm90_aligned16(a->dy) || !sm90_aligned16(a->x) || !sm90_aligned16(a->dw)) return false;
    if (a->splits == NULL || ((uintptr_t)a->splits & 7u) != 0) return false;
    return sm90_device_ok(device, (const void *)sm90_wgrad_kernel<0, 1, 1>);
}

extern "C" moex_status moex_sm90_grouped_gemm_wgrad_tuned(const moex_sm90_wgrad_args *a, moex_sm90_tuning *tune,
                                                          moex_stream stream, const char **why) {
    int device = 0;
    if (tune != NULL) tune->grid_used = 0;
    if (cudaGetDevice(&device) != cudaSuccess) SM90_FAIL(MOEX_ERR_CUDA, "cudaGetDevice failed");
    if (!moex_sm90_wgrad_supported(device, a))
        SM90_FAIL(MOEX_ERR_UNSUPPORTED, "sm90 grouped wgrad: unsupported device, dtype, shape or alignment");
    const size_t out_bytes = (size_t)a->G * (size_t)a->N * (size_t)a->K * (a->dw_dtype == MOEX_DTYPE_F32 ? 4u : 2u);
    if (a->T == 0) {
        /* every group is empty: dW = 0, or dW += nothing */
        if (!a->accumulate && cudaMemsetAsync(a->dw, 0, out_bytes, (cudaStream_t)stream) != cudaSuccess) {
            cudaGetLastError();
            SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped wgrad: cudaMemsetAsync failed");
        }
        return MOEX_OK;
    }
    const int mode = a->accumulate ? SM90W_OUT_F32_ACC
                                   : a->dw_dtype == MOEX_DTYPE_F32 ? SM90W_OUT_F32 : SM90W_OUT_HALF;
    bool epi_tma = tune == NULL || tune->epilogue_tma;
    const int cm = tune != NULL && tune->cluster == 2 ? 2 : 1;

    CUtensorMap tm_dy, tm_x, tm_dw;
    const cuuint64_t dydims[2] = {(cuuint64_t)a->N, (cuuint64_t)a->T};
    const cuuint64_t xdims[2] = {(cuuint64_t)a->K, (cuuint64_t)a->T};
    const cuuint32_t box[2] = {64, SM90W_BR};
    const CUtensorMapL2promotion promo = sm90_l2_promotion(tune);
    if (!sm90_make_map(&tm_dy, a->dtype, a->dy, 2, dydims, box, promo) ||
        !sm90_make_map(&tm_x, a->dtype, a->x, 2, xdims, box, promo))
        SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped wgrad: cuTensorMapEncodeTiled failed");
    /* dW [G, N, K]; a shape the encoder refuses (a group over 2^40 bytes) keeps the register
     * epilogue, which needs no map */
    memset(&tm_dw, 0, sizeof tm_dw);
    const cuuint64_t dwdims[3] = {(cuuint64_t)a->K, (cuuint64_t)a->N, (cuuint64_t)a->G};
    const cuuint32_t dwbox[3] = {a->dw_dtype == MOEX_DTYPE_F32 ? 32u : 64u, 64u, 1u};
    if (epi_tma && !sm90_make_map(&tm_dw, a->dw_dtype, a->dw, 3, dwdims, dwbox, promo)) epi_tma = false;

    const sm90w_kernel_fn fn = sm90w_pick(a->dtype == MOEX_DTYPE_F16, epi_tma, cm);
    if (cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)SM90W_SMEM_BYTES) != cudaSuccess) {
        cudaGetLastError();
        SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped wgrad: cudaFuncSetAttribute failed");
    }

    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cudaLaunchAttribute attr[1];
    cfg.blockDim = dim3(SM90_THREADS, 1, 1);
    cfg.dynamicSmemBytes = SM90W_SMEM_BYTES;
    cfg.stream = (cudaStream_t)stream;
    if (cm > 1) {
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = (unsigned)cm;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
    }

    /* persistent grid: as many CTAs (clusters) as can be resident at once, at most the work */
    int slots = 0, sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms < 1)
        SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped wgrad: cudaDeviceGetAttribute failed");
    if (cm > 1) {
        cfg.gridDim = dim3((unsigned)(sms / cm * cm), 1, 1);
        if (cudaOccupancyMaxActiveClusters(&slots, (const void *)fn, &cfg) != cudaSuccess || slots < 1) {
            cudaGetLastError();
            SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped wgrad: cudaOccupancyMaxActiveClusters failed");
        }
    } else {
        slots = sms;
    }
    if (tune != NULL && tune->grid > 0 && tune->grid / cm < slots) slots = tune->grid / cm > 0 ? tune->grid / cm : 1;
    const int64_t tnu = ((a->N + SM90_BM - 1) / SM90_BM + cm - 1) / cm;
    const int64_t units = a->G * tnu * ((a->K + SM90_BN - 1) / SM90_BN);
    cfg.gridDim = dim3((unsigned)((units < slots ? units : slots) * cm), 1, 1);

    /* bands of SM90W_BAND N tiles (or tune->band), in N units */
    const int band_tiles = tune != NULL && tune->band > 0 ? tune->band : SM90W_BAND;
    const int band_w = band_tiles / cm > 0 ? band_tiles / cm : 1;
    if (cudaLaunchKernelEx(&cfg, fn, tm_dy, tm_x, tm_dw, a->dw, a->splits, a->G, a->T, (int)a->N, (int)a->K, band_w,
                           mode) != cudaSuccess) {
        cudaGetLastError();
        SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped wgrad: kernel launch failed");
    }
    if (tune != NULL) tune->grid_used = (int)cfg.gridDim.x;
    return MOEX_OK;
}

extern "C" moex_status moex_sm90_grouped_gemm_wgrad(const moex_sm90_wgrad_args *a, moex_stream stream,
                                                    const char **why) {
    return moex_sm90_grouped_gemm_wgrad_tuned(a, NULL, stream, why);
}
