/*
 * sm90_fp8_wgrad.cu - the Hopper (sm_90a) K-grouped FP8 weight gradient (contract:
 * moex_sm90_fp8_wgrad_args in sm90_grouped_gemm.h): dW_g = dy_g^T x_g from the columnwise
 * FP8 copies of dy [N, T] and x [K, T], scaled per group (current scaling) or per 1x128 block
 * of each copy (BLOCK), dW f32 written or accumulated, or written in bf16 / f16 (the f32 sums
 * rounded once: no f32 copy of dW and no second pass).
 *
 * The FP8 forward's CTA (sm90_fp8_gemm.cu: one TMA producer warpgroup, two wgmma consumer
 * warpgroups, 128 x 128 tiles, stages of 128 k, each stage's product promoted to f32 once it
 * is done) on the bf16 weight gradient's schedule (sm90_grouped_wgrad.cu: sm90_units_fixed,
 * every group the same output tiles). The reduction runs over a group's rows, the inner
 * (contiguous) dimension of both copies, so both operands are K-major as FP8 wgmma wants
 * them: a stage is 128 rows of the reduction of 128 dW rows (dy) and 128 dW columns (x).
 * TMA reads the inner dimension only from 16-byte-aligned offsets, so a group of rows
 * [r0, r1) is read in windows of 128 from a = r0 rounded down to 16: window kb holds rows
 * [a + 128 kb, a + 128 kb + 128). Bytes of a window outside [r0, r1) (the previous group's
 * head, o = r0 - a < 16 bytes; the next group's rows, or anything past off[G], NaN codes
 * included, zeros past T) are zeroed in shared memory before any wgmma reads them (each
 * consumer its 64 dy rows and half of the x rows, then a proxy fence and a barrier over both).
 * BLOCK: the copies' 1x128 blocks of group g start at r0 (block column b_g + j for block j,
 * b_g = sum over h < g of ceil(m_h / 128)), so window kb holds the last o rows of block
 * kb - 1 and the first 128 - o of block kb. Block kb's product (the window with its head's dy
 * bytes zeroed) is scaled by sdy[n] sx[k] when promoted; block kb - 1's last o rows, all in the
 * first k32 step, get a step of their own on a copy of that step's dy bytes with the rest
 * zeroed, promoted with block kb - 1's scales. A stage's scales (its 128 dy rows' and 128 x
 * columns') are written into the stage's slot of shared memory by the producer's second warp;
 * a consumer hands a stage back one stage later, once every warp has promoted it (the head
 * step of the next window reads its x scales). Current scaling scales before the epilogue.
 * Full tiles leave through TMA stores (reduce-adds for +=), others from registers. A group
 * with no rows writes zeros (=) or leaves dW_g alone (+=). Every output tile is computed by one
 * CTA, windows in row order: deterministic.
 * Alike by design with sm90_fp8_gemm.cu and sm90_grouped_wgrad.cu: a stage's wgmma steps,
 * written out in each kernel's k loop (the loops stay as measured, docs/hopper.md); each
 * role's walk over the one scheduler; the launch's flat parameter struct (hopper.md says why
 * not nested), filled from the args as theirs are.
 */
#include "sm90_epilogue.cuh"
#include "sm90_grouped_gemm.h"
#include "sm90_pipeline.cuh"
#include "sm90_scheduler.cuh"

#define F8W_BN 128                              /* dW rows (N) per tile: two consumers of 64 */
#define F8W_BK 128                              /* dW columns (K) per tile                  */
#define F8W_BR 128                              /* group rows per stage (bytes of one row)  */
#define F8W_STAGE_BYTES ((F8W_BN + F8W_BK) * F8W_BR)
#define F8W_HEAD_BYTES (2 * 64 * F8W_BR)        /* each consumer's copy of a window's head  */
#define F8W_STAGING_BYTES (2 * 2 * SM90_STAGE_HALF_BYTES)   /* each consumer's two TMA boxes */
#define F8W_SCALE_BYTES (SM90_STAGES * (F8W_BN + F8W_BK) * 4)   /* BLK: each stage's scales */
#define F8W_SMEM_BYTES                                                                                    \
    ((size_t)SM90_STAGES * F8W_STAGE_BYTES + F8W_HEAD_BYTES + F8W_STAGING_BYTES + F8W_SCALE_BYTES +       \
     3 * SM90_STAGES * 8 + 1024)
#define F8W_BAND 8                              /* N tiles per band of the tile order       */

typedef struct sm90_fp8_wgrad_params {
    void *dw;                   /* [G, N, K] in the output mode's dtype                  */
    const int64_t *splits;
    int G, N, K;
    int64_t T;
    const float *dys, *xs;      /* current: [1] or [G]; BLOCK: [N, ld], [K, ld]          */
    int dys_group, xs_group;
    int64_t ld;                 /* BLOCK: ceil(T / 128) + G                              */
    int mode;                   /* SM90W_OUT_*: f32 =, f32 +=, or 16-bit = (out_f16: f16)  */
    int out_f16;
    int epi_tma;                /* full tiles through the TMA epilogue (else register stores) */
    int *bad_flag;
    int bad_value;
} sm90_fp8_wgrad_params;

typedef struct sm90_fp8_wgrad_maps {
    CUtensorMap dy, x;          /* [N, T], [K, T]: boxes of 128 rows of 128 bytes        */
    CUtensorMap dw;             /* [G, N, K]: boxes [1][64][32] f32, [1][64][64] 16-bit     */
} sm90_fp8_wgrad_maps;

#if MOEX_SM90_DEVICE
/* The first block column of group g in the columnwise BLOCK scales, by a whole warp: *b
 * (for the group *g) moves forward to g, adding ceil(m_h / 128) for each group h passed, the
 * rows m_h clipped as the group cursor clips them (*row: the first row of group *g). */
static __device__ __forceinline__ void f8w_block_seek(int *bg, int64_t *row, int64_t *b, int g, const int64_t *splits,
                                                      int64_t T) {
    while (*bg < g) {
        int64_t s;
        const int64_t ps = sm90_warp_split_scan(splits, *bg, g, T, &s);   /* lanes past g: 0 */
        const int64_t row1 = *row + ps < T ? *row + ps : T;
        const int64_t row0 = *row + ps - s < T ? *row + ps - s : T;
        int64_t n = (row1 - row0 + F8W_BR - 1) / F8W_BR;
        for (int o = 16; o > 0; o >>= 1) n += __shfl_xor_sync(0xffffffffu, n, o);
        const int64_t last = __shfl_sync(0xffffffffu, ps, 31);
        *row = *row + last < T ? *row + last : T;
        *b += n;
        *bg = *bg + 32 < g ? *bg + 32 : g;
    }
}

/* Zeroes bytes [lo, hi) of each of `rows` rows of a [rows][128 bytes] 128-byte-swizzled tile
 * (the 16-byte chunk j of row r sits at chunk j ^ (r % 8)), by the 128 threads of a consumer. */
static __device__ __forceinline__ void f8w_zero_bytes(uint8_t *tile, int rows, int lo, int hi, int tid) {
    const int j0 = lo / 16, per_row = (hi + 15) / 16 - j0;   /* the chunks with bytes to zero */
    for (int i = tid; i < rows * per_row; i += 128) {
        const int r = i / per_row, j = j0 + i % per_row;
        uint8_t *p = tile + r * 128 + ((j ^ (r & 7)) * 16);
        if (16 * j >= lo && 16 * j + 16 <= hi) {
            *(uint4 *)p = make_uint4(0u, 0u, 0u, 0u);
        } else {
            for (int q = lo > 16 * j ? lo - 16 * j : 0; q < 16 && 16 * j + q < hi; q++) p[q] = 0;
        }
    }
}

/* The head of a window of this consumer's 64 dy rows: bytes [0, o) (o < 16) of each row go to
 * `head` (the same layout, the rest of the first k32 step zero) and are zeroed in the window. */
static __device__ __forceinline__ void f8w_split_head(uint8_t *win, uint8_t *head, int o, int tid) {
    const int r = tid / 2, j = tid % 2;   /* the first step's two chunks of 64 rows */
    const int at = r * 128 + ((j ^ (r & 7)) * 16);
    uint4 h = make_uint4(0u, 0u, 0u, 0u);
    if (j == 0) {   /* byte q of the chunk is the head's when q < o (little-endian words) */
        uint4 *w = (uint4 *)(win + at);
        const uint4 v = *w;
        uint32_t m[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int n = o - 4 * i < 0 ? 0 : o - 4 * i > 4 ? 4 : o - 4 * i;
            m[i] = n == 4 ? 0xffffffffu : (1u << (8 * n)) - 1u;
        }
        h = make_uint4(v.x & m[0], v.y & m[1], v.z & m[2], v.w & m[3]);
        *w = make_uint4(v.x & ~m[0], v.y & ~m[1], v.z & ~m[2], v.w & ~m[3]);
    }
    *(uint4 *)(head + at) = h;
}

/* acc += part scaled by sdy (pa: row rl, pb: row rl + 8) sx[k] (the tile's 128 x scales). */
static __device__ __forceinline__ void f8w_promote(float (&acc)[64], const float (&part)[64], const float *sx,
                                                   float pa, float pb, int lane) {
    const float *xk = sx + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const float2 v = *(const float2 *)(xk + 8 * j);
        acc[4 * j] += pa * v.x * part[4 * j];
        acc[4 * j + 1] += pa * v.y * part[4 * j + 1];
        acc[4 * j + 2] += pb * v.x * part[4 * j + 2];
        acc[4 * j + 3] += pb * v.y * part[4 * j + 3];
    }
}

/* The register epilogue: rows n and n + 8 of dW_g, columns k0 + 8 j + 2 (lane % 4) (+1),
 * masked to N and K (K % 8 == 0: the pair's second column too), in the output mode (IS_F16:
 * the 16-bit format); live = false writes zeros. */
template <int IS_F16>
static __device__ __forceinline__ void f8w_store(const float (&acc)[64], bool live, const sm90_fp8_wgrad_params &p,
                                                 int g, int n, int k0, int lane) {
    const int64_t base = (int64_t)g * p.N * p.K;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const int k = k0 + 8 * j + 2 * (lane % 4);
        if (k >= p.K) continue;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (n + 8 * h >= p.N) continue;
            sm90w_put_pair<IS_F16>(p.dw, base + (int64_t)(n + 8 * h) * p.K + k, live ? acc[4 * j + 2 * h] : 0.0f,
                                   live ? acc[4 * j + 2 * h + 1] : 0.0f, p.mode);
        }
    }
}

/* This CTA's tile of unit t of the cursor's group: first dW row *n0 and column *k0 (bands of
 * F8W_BAND N tiles, N tiles fastest, as sm90_wgrad_tile orders them). The kernel's three walks
 * (the producer thread, BLK's scale warp, the consumers) step the same units and call this,
 * then count the unit's windows beside what each derives from the same rows (the aligned
 * start, the block count, the head and the last window's bytes): alike loop heads, kept
 * written out, since a shared next-unit helper does not compile to the same code. */
static __device__ __forceinline__ void f8w_tile(const sm90_cursor *c, int64_t t, int64_t tn, int64_t tk, int *n0,
                                                int *k0) {
    int64_t kt, nt;
    sm90_tile_order<false>(t - c->tile0, tk, tn, F8W_BAND, 1, &kt, &nt);
    *n0 = (int)(nt * F8W_BN);
    *k0 = (int)(kt * F8W_BK);
}
#endif

/* D5, X5: dy, x in E5M2 (else E4M3); BLK: block scaling (else current scaling). */
template <int D5, int X5, int BLK>
__global__ void __launch_bounds__(SM90_THREADS, 1)
    sm90_fp8_wgrad_kernel(const __grid_constant__ sm90_fp8_wgrad_maps m, const sm90_fp8_wgrad_params p) {
#if MOEX_SM90_DEVICE
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = sm90_smem_aligned(smem_raw);
    uint8_t *sa = smem;                                            /* [STAGES][BN][BR] dy      */
    uint8_t *sb = sa + SM90_STAGES * F8W_BN * F8W_BR;              /* [STAGES][BK][BR] x       */
    uint8_t *sh = sb + SM90_STAGES * F8W_BK * F8W_BR;              /* [2][64][BR] heads         */
    uint8_t *stg = sh + F8W_HEAD_BYTES;                            /* [2][2][8 KB] staging      */
    float *ssc = (float *)(stg + F8W_STAGING_BYTES);               /* [STAGES][BN + BK] scales  */
    uint64_t *full = (uint64_t *)(ssc + SM90_STAGES * (F8W_BN + F8W_BK));
    uint64_t *empty = full + SM90_STAGES;
    uint64_t *sfull = empty + SM90_STAGES;                         /* BLK: a stage's scales     */
    const int wg = sm90_warpgroup(), tid = threadIdx.x % 128;
    if (BLK && threadIdx.x == 0)
        for (int i = 0; i < SM90_STAGES; i++) sm90_mbar_init(&sfull[i], 32);   /* fenced by the ring's init */
    sm90_ring_init<1>(full, empty);
    const int64_t tn = (p.N + F8W_BN - 1) / F8W_BN, tk = (p.K + F8W_BK - 1) / F8W_BK;
    const sm90_units_fixed units = {tn * tk};

    if (wg == 0) {
        /* ---- producer: thread 0 issues every load, warp 1 (BLK) writes the stages' scales ---- */
        sm90_setmaxnreg_dec<72>();   /* warp 1's walk and loads: fewer spill */
        if (tid == 0) {
            sm90_tma_prefetch_map(&m.dy);
            sm90_tma_prefetch_map(&m.x);
            sm90_walk wk;
            sm90_walk_start(&wk, false, 0, 0, 1, 0);
            uint32_t it = 0;
            while (sm90_walk_next<false>(&wk, p.splits, p.G, p.T, units)) {
                int n0, k0;
                f8w_tile(&wk.cur, wk.w.t, tn, tk, &n0, &k0);
                const int64_t a = wk.cur.row0 & ~(int64_t)15;   /* 16-byte-aligned windows */
                const int64_t nks = wk.cur.row1 > wk.cur.row0 ? (wk.cur.row1 - a + F8W_BR - 1) / F8W_BR : 0;
                for (int64_t kb = 0; kb < nks; kb++, it++) {
                    const uint32_t s = sm90_ring_fill(full, empty, it, F8W_STAGE_BYTES);
                    const int32_t r = (int32_t)(a + kb * F8W_BR);
                    sm90_tma_load_2d(sa + s * F8W_BN * F8W_BR, &m.dy, &full[s], r, n0);
                    sm90_tma_load_2d(sb + s * F8W_BK * F8W_BR, &m.x, &full[s], r, k0);
                }
            }
        } else if (BLK && tid / 32 == 1) {
            /* window kb's scales: block kb's (past the last block: the last, on zeros) of the
             * tile's 128 dy rows and 128 x columns (rows past N or K read the last: never
             * stored), into the stage's slot once the stage is free */
            const int lane = tid % 32;
            int bg = 0;           /* the group whose first block column is bcol */
            int64_t brow = 0, bcol = 0;
            sm90_walk wk;
            sm90_walk_start(&wk, false, 0, 0, 1, 0);
            uint32_t it = 0;
            while (sm90_walk_next<true>(&wk, p.splits, p.G, p.T, units)) {
                int n0, k0;
                f8w_tile(&wk.cur, wk.w.t, tn, tk, &n0, &k0);
                const int64_t rows = wk.cur.row1 - wk.cur.row0;
                const int64_t nks = rows > 0 ? (rows + (wk.cur.row0 & 15) + F8W_BR - 1) / F8W_BR : 0;
                const int64_t nblk = (rows + F8W_BR - 1) / F8W_BR;
                if (nks > 0) f8w_block_seek(&bg, &brow, &bcol, wk.cur.g, p.splits, p.T);
                for (int64_t kb = 0; kb < nks; kb++, it++) {
                    const int64_t j = bcol + (kb < nblk ? kb : nblk - 1);
                    float v[8];
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const int n = n0 + lane + 32 * i, k = k0 + lane + 32 * i;
                        v[i] = __ldg(p.dys + (int64_t)(n < p.N ? n : p.N - 1) * p.ld + j);
                        v[4 + i] = __ldg(p.xs + (int64_t)(k < p.K ? k : p.K - 1) * p.ld + j);
                    }
                    const uint32_t s = it % SM90_STAGES;
                    sm90_mbar_wait(&empty[s], ((it / SM90_STAGES) & 1u) ^ 1u);
                    float *slot = ssc + s * (F8W_BN + F8W_BK);
#pragma unroll
                    for (int i = 0; i < 4; i++) slot[lane + 32 * i] = v[i], slot[F8W_BN + lane + 32 * i] = v[4 + i];
                    sm90_mbar_arrive(&sfull[s]);
                }
            }
        } else if (tid == 64 && blockIdx.x == 0 && p.bad_flag != NULL) {
            sm90_check_splits(p.splits, p.G, p.T, p.bad_flag, p.bad_value);
        }
    } else {
        /* ---- consumers: warpgroup c computes dW rows [n0 + 64 c, n0 + 64 c + 64) ---- */
        sm90_setmaxnreg_inc<208>();   /* 128 x 72 + 256 x 208 registers */
        const int c = wg - 1, lane = tid % 32;
        const int rl = (tid / 32) * 16 + lane / 4;   /* block row of acc[4 j + {0, 1}]; + 8: {2, 3} */
        uint64_t da0 = sm90_desc_sw128(sa + 64 * c * F8W_BR), db0 = sm90_desc_sw128(sb);
        uint8_t *head = sh + c * 64 * F8W_BR;   /* this consumer's copy of a window's head */
        const uint64_t dh = sm90_desc_sw128(head);
        sm90_desc_hold(da0);
        sm90_desc_hold(db0);
        float acc[64], part[64];
        uint32_t it = 0;
        sm90_walk wk;
        sm90_walk_start(&wk, false, 0, 0, 1, 0);
        while (sm90_walk_next<true>(&wk, p.splits, p.G, p.T, units)) {
            int n0, k0;
            f8w_tile(&wk.cur, wk.w.t, tn, tk, &n0, &k0);
            const int g = wk.cur.g;
            const int64_t rows = wk.cur.row1 - wk.cur.row0;
            const int o = (int)(wk.cur.row0 & 15);   /* the first window's head: the previous group's */
            const int64_t nks = rows > 0 ? (rows + o + F8W_BR - 1) / F8W_BR : 0;
            const int end = (int)((rows + o) - (nks - 1) * F8W_BR);   /* the last window's bytes in the group */
            if (nks == 0 && p.mode == SM90W_OUT_F32_ACC) continue;   /* += an empty sum: dW_g unchanged */
#pragma unroll
            for (int i = 0; i < 64; i++) acc[i] = 0.0f;
            float pa = 0.0f, pb = 0.0f;   /* BLOCK: block kb - 1's dy scales */
            for (int64_t kb = 0; kb < nks; kb++, it++) {
                const uint32_t s = sm90_ring_wait(full, it);
                uint8_t *wa = sa + s * F8W_BN * F8W_BR + 64 * c * F8W_BR, *wb = sb + s * F8W_BK * F8W_BR + 64 * c * F8W_BR;
                const int lo = kb == 0 ? o : 0, hi = kb == nks - 1 ? end : F8W_BR;   /* the group's bytes */
                if (lo > 0 || hi < F8W_BR) {
                    if (lo > 0) f8w_zero_bytes(wa, 64, 0, lo, tid), f8w_zero_bytes(wb, 64, 0, lo, tid);
                    if (hi < F8W_BR) f8w_zero_bytes(wa, 64, hi, F8W_BR, tid), f8w_zero_bytes(wb, 64, hi, F8W_BR, tid);
                    sm90_fence_proxy_async_smem();
                    sm90_named_barrier(1, 256);
                }
                const bool split = BLK && kb > 0 && o > 0;   /* the head is block kb - 1's */
                if (split) {   /* on stage it - 1's scales, still held (released below) */
                    f8w_split_head(wa, head, o, tid);
                    sm90_fence_proxy_async_smem();
                    sm90_named_barrier(2 + c, 128);
                    /* the head's bytes lie in the first k32 step: one step, against the window's x */
                    sm90_wgmma_fp8_stage<D5, X5, 32>(part, dh, 0, db0, s * F8W_BK * F8W_BR);
                    f8w_promote(acc, part, ssc + ((it - 1) % SM90_STAGES) * (F8W_BN + F8W_BK) + F8W_BN, pa, pb,
                                lane);
                }
                sm90_wgmma_fp8_stage<D5, X5, F8W_BR>(part, da0, s * F8W_BN * F8W_BR, db0, s * F8W_BK * F8W_BR);
                /* every warp of the consumer issued this stage's wgmmas: all are past stage
                 * it - 1's promotion, so it goes back to the producers */
                if (kb > 0) sm90_ring_release<1>(empty, it - 1, tid);
                if (BLK) {
                    const float *slot = ssc + s * (F8W_BN + F8W_BK);
                    sm90_mbar_wait(&sfull[s], (it / SM90_STAGES) & 1u);
                    pa = slot[64 * c + rl], pb = slot[64 * c + rl + 8];
                    f8w_promote(acc, part, slot + F8W_BN, pa, pb, lane);
                } else {
#pragma unroll
                    for (int i = 0; i < 64; i++) acc[i] += part[i];
                }
            }
            if (nks > 0) {   /* the last stage, once every warp has promoted it */
                if (BLK) sm90_named_barrier(2 + c, 128);
                sm90_ring_release<1>(empty, it - 1, tid);
            }
            /* an empty group writes zeros (=) */
            const bool live = nks > 0;
            if (!BLK) {
                const float sc = p.dys[p.dys_group ? g : 0] * p.xs[p.xs_group ? g : 0];
#pragma unroll
                for (int i = 0; i < 64; i++) acc[i] *= sc;
            }
            const int nc = n0 + 64 * c;   /* this consumer's first dW row */
            uint8_t *const st = stg + c * 2 * SM90_STAGE_HALF_BYTES;
            if (p.epi_tma && nc + 64 <= p.N && k0 + F8W_BK <= p.K) {
                if (p.mode != SM90W_OUT_HALF)
                    sm90w_epilogue_tma<0, true, 16>(acc, live, st, &m.dw, k0, nc, g, p.mode == SM90W_OUT_F32_ACC,
                                                    2 + c, tid);
                else if (p.out_f16)
                    sm90w_epilogue_tma<1, false, 16>(acc, live, st, &m.dw, k0, nc, g, false, 2 + c, tid);
                else
                    sm90w_epilogue_tma<0, false, 16>(acc, live, st, &m.dw, k0, nc, g, false, 2 + c, tid);
            } else if (p.out_f16) {
                f8w_store<1>(acc, live, p, g, nc + rl, k0, lane);
            } else {
                f8w_store<0>(acc, live, p, g, nc + rl, k0, lane);
            }
        }
        if (tid == 0) sm90_bulk_wait<0>();   /* TMA stores done before the CTA ends (none: a no-op) */
    }
#endif /* MOEX_SM90_DEVICE */
}

/* ---- host side ---------------------------------------------------------------------------- */

typedef void (*sm90_fp8_wgrad_fn)(sm90_fp8_wgrad_maps, sm90_fp8_wgrad_params);

template <int BLK> static sm90_fp8_wgrad_fn sm90_fp8_wgrad_pick_b(bool d5, bool x5) {
    if (d5) return x5 ? sm90_fp8_wgrad_kernel<1, 1, BLK> : sm90_fp8_wgrad_kernel<1, 0, BLK>;
    return x5 ? sm90_fp8_wgrad_kernel<0, 1, BLK> : sm90_fp8_wgrad_kernel<0, 0, BLK>;
}

static sm90_fp8_wgrad_fn sm90_fp8_wgrad_pick(bool d5, bool x5, bool block) {
    return block ? sm90_fp8_wgrad_pick_b<1>(d5, x5) : sm90_fp8_wgrad_pick_b<0>(d5, x5);
}

cudaError_t sm90_fp8_wgrad_prepare(int sms, int *slots, const char **why) {
    for (int v = 0; v < 8; v++) {
        const cudaError_t e = sm90_prepare_kernel((const void *)sm90_fp8_wgrad_pick(v & 1, v & 2, v & 4),
                                                  F8W_SMEM_BYTES, 1, sms, slots, why);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

static bool sm90_fp8_wgrad_format(moex_dtype f) { return f == MOEX_DTYPE_E4M3 || f == MOEX_DTYPE_E5M2; }

extern "C" bool moex_sm90_fp8_wgrad_supported(const moex_sm90_context *c, const moex_sm90_fp8_wgrad_args *a) {
    if (c == NULL || a == NULL || !sm90_fp8_wgrad_format(a->dy_fmt) || !sm90_fp8_wgrad_format(a->x_fmt)) return false;
    if (!sm90_shape_ok(a->G, a->T, a->K, a->N, a->splits) || a->T % 16 != 0) return false;
    const bool half = a->dw_dtype == MOEX_DTYPE_BF16 || a->dw_dtype == MOEX_DTYPE_F16;
    if (!(a->dw_dtype == MOEX_DTYPE_F32 || (half && !a->accumulate))) return false;
    return sm90_aligned16(a->dy) && sm90_aligned16(a->x) && sm90_aligned16(a->dw) && a->dy_scales != NULL &&
           a->x_scales != NULL;
}

extern "C" moex_status moex_sm90_fp8_wgrad(const moex_sm90_context *c, const moex_sm90_fp8_wgrad_args *a,
                                           moex_stream stream, const char **why) {
    if (!moex_sm90_fp8_wgrad_supported(c, a))
        SM90_FAIL(MOEX_ERR_UNSUPPORTED, "sm90 FP8 wgrad: unsupported device, formats, shape or alignment");
    if (a->T == 0) {   /* every group is empty: dW = 0, or dW += nothing */
        const size_t bytes = (size_t)a->G * (size_t)a->N * (size_t)a->K * moex_dtype_size(a->dw_dtype);
        if (!a->accumulate && cudaMemsetAsync(a->dw, 0, bytes, (cudaStream_t)stream) != cudaSuccess) {
            cudaGetLastError();
            SM90_FAIL(MOEX_ERR_CUDA, "sm90 FP8 wgrad: cudaMemsetAsync failed");
        }
        return MOEX_OK;
    }
    sm90_fp8_wgrad_maps km;
    const cuuint64_t dydims[2] = {(cuuint64_t)a->T, (cuuint64_t)a->N};
    const cuuint64_t xdims[2] = {(cuuint64_t)a->T, (cuuint64_t)a->K};
    const cuuint32_t box[2] = {F8W_BR, 128};
    const CUtensorMapL2promotion promo = CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
    const char *kname = "sm90 FP8 wgrad";   /* a map failure names the kernel and the operand */
    if (!sm90_make_map(c, &km.dy, a->dy_fmt, a->dy, 2, dydims, box, promo, kname, "dy", why) ||
        !sm90_make_map(c, &km.x, a->x_fmt, a->x, 2, xdims, box, promo, kname, "x", why))
        return MOEX_ERR_CUDA;   /* *why names the operand and the CUresult */
    sm90_fp8_wgrad_params kp;
    memset(&kp, 0, sizeof kp);
    sm90w_params_shape(&kp, a);
    kp.dys = a->dy_scales;
    kp.xs = a->x_scales;
    kp.dys_group = a->dy_scale_per_group;
    kp.xs_group = a->x_scale_per_group;
    kp.ld = (a->T + F8W_BR - 1) / F8W_BR + a->G;
    kp.mode = sm90w_out_mode(a->accumulate, a->dw_dtype);
    kp.out_f16 = a->dw_dtype == MOEX_DTYPE_F16;
    /* dW through TMA stores (reduce-adds for +=); a shape the encoder refuses keeps the
     * register epilogue */
    kp.epi_tma = sm90_make_dw_map(c, &km.dw, a->dw_dtype, a->dw, a->G, a->N, a->K, promo, kname);
    kp.bad_flag = a->bad_flag;
    kp.bad_value = a->bad_value;
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr[1];
    sm90_launch_config(&cfg, attr, c->dev.sms, F8W_SMEM_BYTES, 1, false, stream);
    const sm90_fp8_wgrad_fn fn =
        sm90_fp8_wgrad_pick(a->dy_fmt == MOEX_DTYPE_E5M2, a->x_fmt == MOEX_DTYPE_E5M2, a->block != 0);
    if (cudaLaunchKernelEx(&cfg, fn, km, kp) != cudaSuccess) {
        cudaGetLastError();
        SM90_FAIL(MOEX_ERR_CUDA, "sm90 FP8 wgrad: kernel launch failed");
    }
    return MOEX_OK;
}
