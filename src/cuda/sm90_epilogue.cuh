/*
 * sm90_epilogue.cuh - private: the epilogues of the Hopper grouped GEMMs: how a consumer
 * warpgroup's f32 accumulators become output.
 *
 * M-grouped (forward, dgrad; sm90_grouped_gemm.cu). A consumer warpgroup owns a block of 64
 * rows by NC columns of the CTA tile: with BM = 128 rows [64 c, 64 c + 64) and all NC = 256
 * columns, with BM = 64 all rows and the NC = 128 columns [128 c, 128 c + 128). Thread
 * (warp, lane) holds block rows rl = 16 warp + lane / 4 and rl + 8, and for every j < NC / 8
 * the block columns lc = 8 j + 2 (lane % 4) + {0, 1}: acc[4 j + {0, 1}] (row rl) and
 * acc[4 j + {2, 3}] (row rl + 8). The epilogue kinds (MOEX_SM90_EPI_*, sm90_heuristics.h):
 *   PLAIN   y = acc;
 *   BIAS    y = acc + b_g or acc + p_r b_g (bias [G, N], f32 or the input dtype; the bias
 *           row is fetched with cp.async into the staging buffer and p of the block's rows
 *           into registers while the tile is computed);
 *   GLU_*   FC1 of the grouped MLP with the scaled GLU: h = acc (+ b_g) rounded to the input
 *           dtype is stored, then z = p_r glu(h) [T, F], GLU halves CONTIGUOUS or
 *           INTERLEAVED_32. A GLU output element needs its two halves in one thread, so the
 *           column tiles are "virtual": column tile t yields the z columns [128 t, 128 t + 128),
 *           and a consumer block yields NC / 2 of them, starting at z column zb.
 *           INTERLEAVED_32 needs nothing more (a block of h columns [2 zb, 2 zb + NC) holds
 *           whole 64-column segments); for CONTIGUOUS the producer loads the weight tile as
 *           four 64-row boxes so that each block is [NC / 2 rows of the first half (rows
 *           zb ...)][NC / 2 rows of the second half (F + zb ...)], one segment of length NC / 2.
 *   DGLU_*  (dgrad) FC2's backward-data of the grouped MLP with the GLU's backward: the block
 *           is dz = dy W2 [T, F], rounded to the input dtype as if stored, never stored in
 *           global memory; it passes through the staging buffer so that each thread reads
 *           h [T, 2F] at the two halves of 8 consecutive dz columns (16 bytes each) and writes
 *           dh = glu'(h) dz there (dh may be h itself: each element is read, then written, by
 *           one thread), and the GLU's dprobs term of its rows, summed over each 128 dz
 *           columns, to a partial [T, ceil(F / 128)] (no atomics: one writer per element).
 * Full blocks (all rows inside the group, all columns inside the output) leave through the
 * swizzled staging buffer and TMA stores, a 64-column box at a time (sm90_stage_pass); other
 * blocks through masked stores from registers (DGLU: every block through masked 16-byte
 * stores, sm90_epi_dglu). Rows past the group's end are never written, nor their h read.
 *
 * K-grouped (wgrad; sm90_grouped_wgrad.cu). A consumer's block is 64 dW rows by 256 columns,
 * the same fragment layout. Blocks inside [N, K] go registers -> 128-byte-swizzled staging ->
 * TMA, in boxes of 64 rows by 128 bytes (64 bf16/f16 or 32 f32 columns) through two 8 KB
 * halves used in turn (sm90w_send_box); "+=" uses the TMA reduce-add (one add per element,
 * from one CTA: deterministic, and the old dW never passes through the SM). Other blocks use
 * masked stores from registers (sm90w_store_masked).
 */
#ifndef MOEX_SM90_EPILOGUE_CUH
#define MOEX_SM90_EPILOGUE_CUH

#include "glu_math.h"
#include "sm90_common.cuh"

/* What the M-grouped epilogue reads besides the accumulators (a kernel parameter). */
typedef struct sm90_epi {
    const void *bias;           /* [G, N] (GLU: N = 2F); NULL: no bias                       */
    const float *probs;         /* [T]: the scaled bias's and the GLU's p (NULL: p = 1)      */
    uint16_t *z;                /* GLU: [T, F]; DGLU: [T, F] z = p glu(h) too, or NULL       */
    const uint16_t *h;          /* DGLU: h [T, 2F], read                                     */
    uint16_t *dh;               /* DGLU: dh [T, 2F], written (may be h)                      */
    float *dp_part;             /* DGLU: [T, dp_ld] the dprobs partials, or NULL             */
    int dp_ld;                  /* DGLU: ceil(F / 128)                                       */
    int bias_f32, bias_scaled;  /* bias dtype f32 (else the input dtype); y += p_r b_g       */
    int F;                      /* GLU, DGLU: half width                                     */
    moex_glu_consts glu;
} sm90_epi;

/* The K-grouped output modes (kernel parameter), and the mode of a dW of dtype dt written
 * (=) or accumulated (+=, f32 only). */
enum { SM90W_OUT_F32 = 0, SM90W_OUT_F32_ACC = 1, SM90W_OUT_HALF = 2 };
static inline int sm90w_out_mode(int accumulate, moex_dtype dt) {
    return accumulate ? SM90W_OUT_F32_ACC : dt == MOEX_DTYPE_F32 ? SM90W_OUT_F32 : SM90W_OUT_HALF;
}

#define SM90_STAGE_HALF_BYTES 8192   /* one staging box: 64 rows of 128 bytes */

#if MOEX_SM90_DEVICE

/* f32 pair -> two packed 16-bit values of the input dtype (round to nearest even) */
template <int IS_F16> struct sm90_io;
template <> struct sm90_io<0> {
    static __device__ __forceinline__ uint32_t pack(float a, float b) {
        __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
        return *(uint32_t *)&v;
    }
};
template <> struct sm90_io<1> {
    static __device__ __forceinline__ uint32_t pack(float a, float b) {
        __half2 v = __floats2half2_rn(a, b);
        return *(uint32_t *)&v;
    }
};

template <int IS_F16> static __device__ __forceinline__ float sm90_round(float v) {
    if (IS_F16) return __half2float(__float2half_rn(v));
    return __bfloat162float(__float2bfloat16_rn(v));
}

/* ---- M-grouped --------------------------------------------------------------------------- */

/* Block column lc -> output column (y, or h for the GLU) and whether it is inside the output. */
template <int EPI, int NC> struct sm90_cols {
    int ob;    /* PLAIN/BIAS: the block's first y column; GLU: zb, its first z column */
    int lim;   /* PLAIN/BIAS: N; GLU: F */
    __device__ __forceinline__ int zcol(int lc) const {
        return EPI == MOEX_SM90_EPI_GLU_CONTIG ? ob + lc % (NC / 2) : ob + (lc / 64) * 32 + lc % 32;
    }
    __device__ __forceinline__ int col(int lc) const {
        if (EPI == MOEX_SM90_EPI_GLU_CONTIG) return zcol(lc) + (lc >= NC / 2 ? lim : 0);
        if (EPI == MOEX_SM90_EPI_GLU_INTERLEAVED) return 2 * ob + lc;
        return ob + lc;
    }
    __device__ __forceinline__ bool ok(int lc) const {
        return MOEX_SM90_EPI_IS_GLU(EPI) ? zcol(lc) < lim : ob + lc < lim;
    }
};

/* The j of the i-th GLU output pair: its first half at j, its second at j + sm90_glu_step. */
template <int EPI> static __device__ __forceinline__ constexpr int sm90_glu_j(int i) {
    return EPI == MOEX_SM90_EPI_GLU_CONTIG ? i : 8 * (i / 4) + i % 4;
}
template <int EPI, int NC> static __device__ __forceinline__ constexpr int sm90_glu_step(void) {
    return EPI == MOEX_SM90_EPI_GLU_CONTIG ? NC / 16 : 4;
}

/* Writes NJ fragment columns (j = JSEL(jj), jj < NJ; 8 columns each) of the block's two rows
 * into `stage`: [NJ / 8 boxes][64 rows][64 columns], 128-byte rows, 16-byte chunk ch ^ (row % 8). */
template <int IS_F16, int NJ, int NA, class JSEL>
static __device__ __forceinline__ void sm90_stage_write(uint8_t *stage, const float (&acc)[NA], JSEL jsel, int rl,
                                                        int lane) {
#pragma unroll
    for (int jj = 0; jj < NJ; jj++) {
        const int j = jsel(jj), q = jj / 8, ch = jj % 8;
        uint8_t *base = stage + q * SM90_STAGE_HALF_BYTES + (lane % 4) * 4;
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
        uint8_t *half = stage + (q % 2) * SM90_STAGE_HALF_BYTES;
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

/* Masked register stores of fragment column j: acc[4 j + {0, 1}] to row a at column col,
 * acc[4 j + {2, 3}] to row b, each where its row exists. */
template <int IS_F16, int NA>
static __device__ __forceinline__ void sm90_store_pair(uint16_t *a, uint16_t *b, int col, bool oka, bool okb,
                                                       const float (&acc)[NA], int j) {
    if (oka) *(uint32_t *)(a + col) = sm90_io<IS_F16>::pack(acc[4 * j + 0], acc[4 * j + 1]);
    if (okb) *(uint32_t *)(b + col) = sm90_io<IS_F16>::pack(acc[4 * j + 2], acc[4 * j + 3]);
}

/* The consumer block being computed: its first row mr (rows past row1, the group's end, are
 * not its own), the thread's rows ra = mr + rl and rb = ra + 8 (oka, okb: inside the group),
 * its consumer warpgroup c and the thread's index tid in it. */
typedef struct sm90_block {
    int64_t mr, ra, rb, row1;
    bool oka, okb;
    int c, tid, rl, lane;
} sm90_block;

/* p of the block's two rows (1 unless the epilogue scales by probs), loaded in registers
 * while the tile is computed (the DGLU epilogue reads its own rows' p). */
template <int EPI>
static __device__ __forceinline__ void sm90_epi_probs(const sm90_epi &epi, const sm90_block &k, float *pa, float *pb) {
    *pa = 1.0f;
    *pb = 1.0f;
    if (epi.probs != NULL && (MOEX_SM90_EPI_IS_GLU(EPI) || epi.bias_scaled)) {
        *pa = k.oka ? __ldg(epi.probs + k.ra) : 0.0f;
        *pb = k.okb ? __ldg(epi.probs + k.rb) : 0.0f;
    }
}

/* Starts the copy of group g's bias row (the block's columns) into `stage` (cp.async, block
 * column pair lc / 2 at 4 or 8 bytes each; a bias whose pairs are not aligned so, at its
 * dtype's natural alignment only, by two loads and a shared store), once the last tile's TMA
 * stores have read it. */
template <int EPI, int NC>
static __device__ __forceinline__ void sm90_epi_bias_fetch(const sm90_epi &epi, const sm90_cols<EPI, NC> &cols, int g,
                                                           int N, uint8_t *stage, const sm90_block &k) {
    if (k.tid == 0) sm90_bulk_wait_read<0>();   /* the last tile's stores read `stage` */
    sm90_named_barrier(1 + k.c, 128);
    const int lc = 2 * k.tid;
    if (lc < NC && cols.ok(lc)) {
        const int64_t bi = (int64_t)g * N + cols.col(lc);   /* even: N and the columns' pairs */
        const bool pairs = (uintptr_t)epi.bias % (epi.bias_f32 ? 8u : 4u) == 0;   /* uniform */
        if (epi.bias_f32) {
            const float *b = (const float *)epi.bias + bi;
            if (pairs) sm90_cp_async<8>(stage + 8 * k.tid, b);
            else *(float2 *)(stage + 8 * k.tid) = make_float2(__ldg(b), __ldg(b + 1));
        } else {
            const uint16_t *b = (const uint16_t *)epi.bias + bi;
            if (pairs) sm90_cp_async<4>(stage + 4 * k.tid, b);
            else *(uint32_t *)(stage + 4 * k.tid) = (uint32_t)__ldg(b) | (uint32_t)__ldg(b + 1) << 16;
        }
    }
    sm90_cp_async_commit();
}

/* The whole M-grouped epilogue of one block: bias (has_bias: its row was fetched into
 * `stage` by sm90_epi_bias_fetch), then y (or h, rounded) and for the GLU z, through TMA
 * stores (EPI_TMA, full blocks) or masked stores. y: [T, N] (h: [T, 2F]). */
template <int IS_F16, int EPI_TMA, int EPI, int NC>
static __device__ __forceinline__ void sm90_epi_rows(float (&acc)[NC / 2], const sm90_epi &epi,
                                                     const sm90_cols<EPI, NC> &cols, bool has_bias, float pa,
                                                     float pb, uint8_t *stage, const CUtensorMap *tm_y,
                                                     const CUtensorMap *tm_z, uint16_t *y, int N,
                                                     const sm90_block &k) {
    constexpr int NA = NC / 2;
    const int lc0 = 2 * (k.lane % 4);
    if (has_bias) {
        sm90_cp_async_wait_all();
        sm90_named_barrier(1 + k.c, 128);   /* every thread's part of the bias row landed */
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
    if (MOEX_SM90_EPI_IS_GLU(EPI)) {
#pragma unroll
        for (int i = 0; i < NA; i++) acc[i] = sm90_round<IS_F16>(acc[i]);   /* h as stored */
    }
    const bool full_block = EPI_TMA && k.mr + 64 <= k.row1 &&
                            (MOEX_SM90_EPI_IS_GLU(EPI) ? cols.ob + NC / 2 <= epi.F : cols.ob + NC <= N);
    /* y (or h) */
    if (full_block) {
#pragma unroll
        for (int p = 0; p < NC / 128; p++)
            sm90_stage_pass<IS_F16, 16>(
                stage, acc, [&](int jj) { return 16 * p + jj; }, [&](int q) { return cols.col(128 * p + 64 * q); },
                tm_y, (int32_t)k.mr, k.c, k.tid, k.rl, k.lane);
    } else {
        uint16_t *ya = y + k.ra * N, *yb = y + k.rb * N;
#pragma unroll
        for (int j = 0; j < NA / 4; j++) {
            const int lc = 8 * j + lc0;
            if (cols.ok(lc)) sm90_store_pair<IS_F16>(ya, yb, cols.col(lc), k.oka, k.okb, acc, j);
        }
    }
    if (MOEX_SM90_EPI_IS_GLU(EPI)) {
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
            sm90_stage_pass<IS_F16, NA / 8>(stage, acc, zsel, [&](int q) { return cols.ob + 64 * q; }, tm_z,
                                            (int32_t)k.mr, k.c, k.tid, k.rl, k.lane);
        } else {
            uint16_t *za = epi.z + k.ra * epi.F, *zb = epi.z + k.rb * epi.F;
#pragma unroll
            for (int i = 0; i < NA / 8; i++) {
                const int zc = cols.ob + 8 * i + lc0;
                if (zc < epi.F) sm90_store_pair<IS_F16>(za, zb, zc, k.oka, k.okb, acc, zsel(i));
            }
        }
    }
}

/* Two 16-bit values of the input dtype (packed, the lower first) as f32. */
template <int IS_F16> static __device__ __forceinline__ float2 sm90_unpack(uint32_t v) {
    const unsigned short lo = (unsigned short)(v & 0xFFFFu), hi = (unsigned short)(v >> 16);
    if (IS_F16) return make_float2(__half2float(__ushort_as_half(lo)), __half2float(__ushort_as_half(hi)));
    return make_float2(__bfloat162float(__ushort_as_bfloat16(lo)), __bfloat162float(__ushort_as_bfloat16(hi)));
}

/* The h column of the first half of z column zc (the second half's is F or 32 further). */
template <int EPI> static __device__ __forceinline__ int sm90_dglu_col(int zc) {
    return EPI == MOEX_SM90_EPI_DGLU_CONTIG ? zc : 64 * (zc / 32) + zc % 32;
}

/* The DGLU epilogue of one block (see the top of this file): acc is dz of the block's rows
 * and the dz columns [ob, ob + NC); p: the probs (NULL: 1). dh rows past the group's end and
 * columns past F are neither read nor written. The block goes in passes of 128 dz columns
 * (the 128 columns of one dprobs partial): dz, rounded to the input dtype, is written into
 * the consumer's staging buffer (two swizzled boxes of 64 rows by 64 columns, as the TMA
 * epilogue's), then each thread takes 8 consecutive dz columns (16 bytes) of 8 rows, so that
 * h, dh and z move in 16-byte accesses, 16 lanes along a row. A thread's h is loaded in
 * batches of 4 rows (what the registers hold beside the accumulators without spilling),
 * each read before dh is written there (dh may be h:
 * every element is read, then written, by one thread). With epi.z, z = p glu(h) of the same
 * elements is written too, as the forward's epilogue computes it. A row's dprobs term of a
 * pass is the sum of its 16 lanes' sums (a fixed order: deterministic). */
template <int IS_F16, int EPI, int NC>
static __device__ __forceinline__ void sm90_epi_dglu(const float (&acc)[NC / 2], const sm90_epi &epi, int ob,
                                                     uint8_t *stage, const sm90_block &k) {
    constexpr int R = 4;   /* rows of a batch: a thread's rows are r0 + 8 i, i < 8, in 2 batches */
    const int F = epi.F, cc = k.tid % 16, r0 = k.tid / 16;
    const int bstep = EPI == MOEX_SM90_EPI_DGLU_CONTIG ? F : 32;
    const int64_t ld = 2 * (int64_t)F;
#pragma unroll
    for (int q = 0; q < NC / 128; q++) {
        const int zc = ob + 128 * q + 8 * cc, c = sm90_dglu_col<EPI>(zc);
        const bool col_in = zc < F;   /* F % 8 == 0: a chunk is all in or all out */
        sm90_named_barrier(1 + k.c, 128);   /* the last pass's dz reads are done */
        sm90_stage_write<IS_F16, 16>(stage, acc, [&](int jj) { return 16 * q + jj; }, k.rl, k.lane);
        sm90_named_barrier(1 + k.c, 128);   /* the pass's dz is staged */
#pragma unroll 1
        for (int bt = 0; bt < 8 / R; bt++) {
            uint4 va[R], vb[R];
            float p[R];
#pragma unroll
            for (int i = 0; i < R; i++) {   /* the batch's h, all loaded before any is used */
                const int64_t row = k.mr + r0 + 8 * (R * bt + i);
                const bool in = col_in && row < k.row1;
                const uint16_t *hr = epi.h + row * ld + c;
                va[i] = in ? *(const uint4 *)hr : make_uint4(0u, 0u, 0u, 0u);
                vb[i] = in ? *(const uint4 *)(hr + bstep) : make_uint4(0u, 0u, 0u, 0u);
                p[i] = in && epi.probs != NULL ? __ldg(epi.probs + row) : 1.0f;
            }
#pragma unroll
            for (int i = 0; i < R; i++) {
                const int r = r0 + 8 * (R * bt + i);
                const int64_t row = k.mr + r;
                const bool in = col_in && row < k.row1;
                const uint4 dzv = *(const uint4 *)(stage + (cc / 8) * SM90_STAGE_HALF_BYTES + r * 128 +
                                                   (((cc % 8) ^ (r % 8)) << 4));
                const uint32_t *dzw = &dzv.x, *aw = &va[i].x, *bw = &vb[i].x;
                uint4 da, db, zo;
                uint32_t *daw = &da.x, *dbw = &db.x, *zw = &zo.x;
                float t = 0.0f;
#pragma unroll
                for (int e = 0; e < 4; e++) {   /* element pairs 2e, 2e + 1 */
                    const float2 a = sm90_unpack<IS_F16>(aw[e]), b = sm90_unpack<IS_F16>(bw[e]);
                    const float2 d = sm90_unpack<IS_F16>(dzw[e]);
                    float da0, da1, db0, db1, t0, t1;
                    moex_glu_backward(epi.glu, a.x, b.x, p[i], d.x, &da0, &db0, &t0);
                    moex_glu_backward(epi.glu, a.y, b.y, p[i], d.y, &da1, &db1, &t1);
                    daw[e] = sm90_io<IS_F16>::pack(da0, da1);
                    dbw[e] = sm90_io<IS_F16>::pack(db0, db1);
                    if (epi.z)
                        zw[e] = sm90_io<IS_F16>::pack(moex_glu_forward(epi.glu, a.x, b.x, p[i]),
                                                      moex_glu_forward(epi.glu, a.y, b.y, p[i]));
                    t += t0 + t1;
                }
                t = in ? t : 0.0f;
                if (in) {
                    uint16_t *dr = epi.dh + row * ld + c;
                    *(uint4 *)dr = da;
                    *(uint4 *)(dr + bstep) = db;
                    if (epi.z) *(uint4 *)(epi.z + row * (int64_t)F + zc) = zo;
                }
                if (epi.dp_part != NULL) {   /* the 16 lanes of the row (lanes 0-15 or 16-31) */
#pragma unroll
                    for (int o = 1; o < 16; o <<= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
                    if (cc == 0 && row < k.row1 && ob + 128 * q < F)
                        epi.dp_part[row * epi.dp_ld + ob / 128 + q] = t;
                }
            }
        }
    }
}

/* ---- K-grouped (wgrad) ------------------------------------------------------------------- */

/* Overwrites rows [v, 64) of one swizzled box [64 rows][128 bytes] with zeros (the 128-byte
 * swizzle permutes 16-byte chunks inside a row, so a row stays bytes [128 r, 128 r + 128)):
 * the rows of a partial last stage that are not the group's. */
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

/* A pair (x, y) into a staging row at p: packed into the input dtype (4 bytes), or f32 (8). */
template <int IS_F16, bool F32> static __device__ __forceinline__ void sm90w_stage_pair(uint8_t *p, float x, float y) {
    if (F32)
        *(float2 *)p = make_float2(x, y);
    else
        *(uint32_t *)p = sm90_io<IS_F16>::pack(x, y);
}

/* The TMA epilogue of one consumer block dW_g[n .. n + 64, k0 .. k0 + 8 NJ) (NJ = 32: 256
 * columns, the bf16 kernel's; 16: 128, the FP8 kernel's), in the input dtype (F32 = false:
 * boxes of 64 columns) or in f32 (boxes of 32 columns; add: "+=" through TMA reduce-adds).
 * Thread (warp, lane) holds rows rl = 16 warp + lane / 4 and
 * rl + 8 ((rl + 8) % 8 == rl % 8), columns 8 j + 2 (lane % 4) (+1) for j < NJ. 16-bit: box
 * j / 8, 16-byte chunk j % 8 of the row, byte 4 (lane % 4) in it; f32: box j / 4, bytes
 * 32 (j % 4) + 8 (lane % 4) of the row, i.e. chunk 2 (j % 4) + (lane % 4) / 2, byte
 * 8 (lane % 2) in it; chunk c of row r is stored at chunk c ^ (r % 8). live = 0 writes
 * zeros. */
template <int IS_F16, bool F32, int NJ = 32>
static __device__ __forceinline__ void sm90w_epilogue_tma(const float (&acc)[4 * NJ], bool live, uint8_t *stage,
                                                          const CUtensorMap *tm, int k0, int n, int g, bool add,
                                                          int bar, int tid) {
    constexpr int JB = F32 ? 4 : 8;   /* fragment columns (of 8 columns) per box */
    const int warp = tid / 32, lane = tid % 32, rl = warp * 16 + lane / 4;
#pragma unroll
    for (int b = 0; b < NJ / JB; b++) {
        uint8_t *half = stage + (b & 1) * SM90_STAGE_HALF_BYTES;
        uint8_t *ta = half + rl * 128 + (F32 ? (lane % 2) * 8 : (lane % 4) * 4), *tb = ta + 8 * 128;
#pragma unroll
        for (int q = 0; q < JB; q++) {
            const int j = b * JB + q, off = ((F32 ? 2 * q + (lane % 4) / 2 : q) ^ (rl & 7)) << 4;
            sm90w_stage_pair<IS_F16, F32>(ta + off, live ? acc[j * 4 + 0] : 0.0f, live ? acc[j * 4 + 1] : 0.0f);
            sm90w_stage_pair<IS_F16, F32>(tb + off, live ? acc[j * 4 + 2] : 0.0f, live ? acc[j * 4 + 3] : 0.0f);
        }
        sm90w_send_box(tm, half, k0 + b * JB * 8, n, g, add, bar, tid);
    }
}

/* The pair (x, y) to elements i, i + 1 of dw in the output mode: packed into the input dtype
 * (SM90W_OUT_HALF), f32, or added to the f32 values there (SM90W_OUT_F32_ACC). */
template <int IS_F16>
static __device__ __forceinline__ void sm90w_put_pair(void *dw, int64_t i, float x, float y, int mode) {
    if (mode == SM90W_OUT_HALF) {
        *(uint32_t *)((uint16_t *)dw + i) = sm90_io<IS_F16>::pack(x, y);
        return;
    }
    float2 *p = (float2 *)((float *)dw + i);
    if (mode == SM90W_OUT_F32_ACC) {
        const float2 o = *p;
        x = o.x + x;
        y = o.y + y;
    }
    *p = make_float2(x, y);
}

/* Masked register stores of a consumer block dW_g[nc .. nc + 64, k0 .. k0 + 256) (dw [G, N, K]
 * in the mode's dtype): thread (warp, lane) holds dW rows ra = nc + 16 warp + lane / 4 and
 * ra + 8, column pairs 8 j + 2 (lane % 4); rows past N and columns past K are skipped.
 * live = 0 writes zeros. */
template <int IS_F16>
static __device__ __forceinline__ void sm90w_store_masked(const float (&acc)[128], bool live, void *dw, int64_t g,
                                                          int N, int K, int nc, int k0, int mode, int warp,
                                                          int lane) {
    const int64_t ra = nc + warp * 16 + lane / 4, rb = ra + 8;
    const bool oka = ra < N, okb = rb < N;
    const int64_t ia = (g * N + ra) * K, ib = (g * N + rb) * K;
#pragma unroll
    for (int j = 0; j < 32; j++) {
        const int col = k0 + j * 8 + (lane % 4) * 2;
        if (col < K) {
            if (oka) sm90w_put_pair<IS_F16>(dw, ia + col, live ? acc[j * 4 + 0] : 0.0f, live ? acc[j * 4 + 1] : 0.0f, mode);
            if (okb) sm90w_put_pair<IS_F16>(dw, ib + col, live ? acc[j * 4 + 2] : 0.0f, live ? acc[j * 4 + 3] : 0.0f, mode);
        }
    }
}

#endif /* MOEX_SM90_DEVICE */

#endif /* MOEX_SM90_EPILOGUE_CUH */
