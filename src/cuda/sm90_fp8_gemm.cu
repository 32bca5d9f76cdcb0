/*
 * sm90_fp8_gemm.cu - the Hopper (sm_90a) M-grouped FP8 GEMM (contract: moex_sm90_fp8_args in
 * sm90_grouped_gemm.h): y_g = x_g W_g^T (+ b_g | + p_r b_g) with x and W FP8 and K-major,
 * scaled per group (current scaling) or per 1x128 / 128x128 block (BLOCK), y bf16 or f16.
 *
 * The kernel reuses the bf16 kernels' pieces (the group cursor and work list of
 * sm90_scheduler.cuh, the stage ring of sm90_pipeline.cuh, TMA and wgmma PTX): a persistent
 * grid, one CTA per SM, one TMA producer warpgroup and two wgmma consumer warpgroups; tiles of
 * 128 rows x 128 columns (each consumer 64 x 128); a stage is 128 k of both operands (one
 * 128-byte swizzle row, 16 KB each), F8_STAGES of them. In 2-CTA clusters (CM = 2, on long
 * reductions) the two CTAs take two tiles that share an operand, as the bf16 kernel's do: a
 * pair of row tiles (the weight tile) or, on a group's odd last row tile, a pair of column
 * tiles (the input tile); each CTA loads half of the shared tile, multicast into both. The
 * tensor cores' FP8 accumulation keeps fewer bits than f32, so each stage's four m64n128k32
 * steps go into a product of their own that is added to the f32 sums once the stage is done
 * (DeepSeek-V3's promotion every 128 k); with BLOCK the product is scaled there by the row's x
 * scale and the weight block's (a tile's 128 columns are one weight block). The epilogue scales
 * by xs ws_g (current scaling), then is the bf16 kernels' (sm90_epilogue.cuh) on each
 * consumer's 64 x 128 block: the bias row (b_g, or p_r b_g) fetched into the consumer's staging
 * buffer while the tile is computed, full blocks through that buffer and TMA stores, the others
 * through masked stores to the group's rows and the output width; with GLU (FC1 of the grouped
 * MLP) h rounded and stored, then z = p glu(h) of the rounded h (the contiguous layout's tile
 * is two 64-row weight boxes, rows zb and F + zb, as the bf16 kernel's GLU tile). No stream-K:
 * the caller falls back.
 */
#include "glu_math.h"
#include "sm90_epilogue.cuh"
#include "sm90_grouped_gemm.h"
#include "sm90_pipeline.cuh"
#include "sm90_scheduler.cuh"

#define F8_BM 128                               /* rows per tile: two consumers of 64 */
#define F8_BN 128                               /* columns per tile                   */
#define F8_BK 128                               /* k per stage (bytes of one row)     */
#define F8_STAGE_BYTES ((F8_BM + F8_BN) * F8_BK)
#define F8_STAGES 6                             /* 32 KB stages: six fit beside the staging */
#define F8_STAGING_BYTES (2 * 2 * SM90_STAGE_HALF_BYTES)   /* each consumer's two output boxes */
#define F8_SMEM_BYTES ((size_t)F8_STAGES * F8_STAGE_BYTES + F8_STAGING_BYTES + 2 * F8_STAGES * 8 + 1024)
static_assert(F8_SMEM_BYTES <= 227 * 1024, "sm90 FP8 forward: shared memory past the 227 KB a Hopper CTA may have");
#define F8_CLUSTER_MIN_K 2560                   /* clusters from this reduction length on */

typedef struct sm90_fp8_params {
    void *y;
    const int64_t *splits;
    int G;
    int64_t T;
    int N, K;
    const float *xs, *ws;       /* current: [1] or [G], and [G]; BLOCK: [T, nk], [G, nt, nk] */
    int xs_group;
    const void *bias;           /* [G, N] f32 or y's dtype, or NULL                       */
    int bias_f32, bias_scaled;  /* SCALED: the bias times probs[r]                        */
    const float *probs;
    void *z;                    /* GLU: z [T, F] in y's dtype (y is h [T, 2F])            */
    int F;                      /* GLU: the half width                                    */
    moex_glu_consts glu;
    const float *glu_probs;     /* GLU: p of each row, or NULL (p = 1)                    */
    int *bad_flag;
    int bad_value;
} sm90_fp8_params;

#if MOEX_SM90_DEVICE
/* The first row and column of this CTA's tile (cluster rank `rank` of CM) of unit t of the
 * cursor's group (sm90_units_rows with F8_BM, CM), the column unit fastest. Returns 1 for a
 * column pair (the CTAs share the input tile; the second column tile may be past the output
 * width), 0 otherwise (CM = 2: a row pair, sharing the weight tile). */
template <int CM>
static __device__ __forceinline__ int f8_tile(const sm90_cursor *c, int64_t t, int64_t nt, int rank, int64_t *m0,
                                              int *n0) {
    int64_t l = t - c->tile0;
    const int64_t rows = CM == 1 ? c->mt : c->mt / 2;
    if (l < rows * nt) {
        *m0 = c->row0 + ((l / nt) * CM + rank) * F8_BM;
        *n0 = (int)(l % nt) * F8_BN;
        return 0;
    }
    l -= rows * nt;
    *m0 = c->row0 + (c->mt - 1) * F8_BM;
    *n0 = (int)(2 * l + rank) * F8_BN;
    return 1;
}

/* The first weight row of half `half` (64 rows) of the weight tile of output tile column n0:
 * rows n0 + 64 half, or with the contiguous GLU (virtual tiles of 64 z columns zb = n0 / 2)
 * the first half's rows zb and the second's F + zb. */
template <int GLU> static __device__ __forceinline__ int f8_wrow(int n0, int half, int F) {
    return GLU == 1 ? (half ? F : 0) + n0 / 2 : n0 + 64 * half;
}

/* The epilogue kind (sm90_epilogue.cuh) of this instance's consumer blocks of 64 x 128: the
 * GLU's, else the bias's (which adds nothing where there is no bias). */
template <int GLU> static __device__ __forceinline__ constexpr int f8_epi_kind(void) {
    return GLU == 1 ? MOEX_SM90_EPI_GLU_CONTIG : GLU == 2 ? MOEX_SM90_EPI_GLU_INTERLEAVED : MOEX_SM90_EPI_BIAS;
}
#endif

/* The tensor maps: boxes of 128 k by 128 rows (x) or 128 weight rows (w), and by 64 (the
 * halves a cluster's CTAs load of a shared tile); the output's y (h with the GLU) and z, boxes
 * of 64 x 64 for the TMA stores. */
typedef struct sm90_fp8_maps {
    CUtensorMap x, xh, w, wh, y, z;
} sm90_fp8_maps;

/* X5, W5: x, W in E5M2 (else E4M3); YF16: y in f16 (else bf16); CM: CTAs per cluster; BLK:
 * block scaling (else current scaling); GLU: FC1 + scaled GLU (1 contiguous halves, 2
 * interleaved_32; y is h [T, 2F]), else 0. */
template <int X5, int W5, int YF16, int CM, int BLK, int GLU>
__global__ void __launch_bounds__(SM90_THREADS, 1)
    sm90_fp8_kernel(const __grid_constant__ sm90_fp8_maps m, const sm90_fp8_params p) {
#if MOEX_SM90_DEVICE
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = sm90_smem_aligned(smem_raw);
    uint8_t *sa = smem;                                            /* [STAGES][BM][BK] */
    uint8_t *sb = sa + F8_STAGES * F8_BM * F8_BK;                  /* [STAGES][BN][BK] */
    uint8_t *sc = sb + F8_STAGES * F8_BN * F8_BK;                  /* [2][2][8 KB] staging */
    uint64_t *full = (uint64_t *)(sc + F8_STAGING_BYTES);
    uint64_t *empty = full + F8_STAGES;
    const int wg = sm90_warpgroup(), tid = threadIdx.x % 128;
    sm90_ring_init<CM, F8_STAGES>(full, empty);
    /* column tiles (GLU: virtual, 64 z columns each) and weight block rows */
    const int64_t nt = GLU ? (p.F + 63) / 64 : (p.N + F8_BN - 1) / F8_BN, ntw = (p.N + F8_BN - 1) / F8_BN;
    const sm90_units_rows units = {nt, F8_BM, CM};
    const int nk = (p.K + F8_BK - 1) / F8_BK;
    const int rank = CM > 1 ? (int)sm90_cluster_rank() : 0;

    if (wg == 0) {
        /* ---- producer: one thread issues every load ---- */
        sm90_setmaxnreg_dec<40>();
        if (tid == 0) {
            sm90_tma_prefetch_map(&m.x);
            sm90_tma_prefetch_map(CM > 1 ? &m.wh : &m.w);
            sm90_walk wk;
            sm90_walk_start(&wk, false, 0, nk, CM, 0);
            uint32_t it = 0;
            const uint16_t both = (uint16_t)((1u << CM) - 1u);
            while (sm90_walk_next<false>(&wk, p.splits, p.G, p.T, units)) {
                int64_t m0;
                int n0;
                const int colpair = f8_tile<CM>(&wk.cur, wk.w.t, nt, rank, &m0, &n0);
                for (int kb = 0; kb < nk; kb++, it++) {
                    const uint32_t s = sm90_ring_fill<F8_STAGES>(full, empty, it, F8_STAGE_BYTES);
                    uint8_t *a = sa + s * F8_BM * F8_BK, *b = sb + s * F8_BN * F8_BK;
                    const int g = wk.cur.g;
                    if (CM > 1 && !colpair) {   /* 64 of the shared weight rows each, into both CTAs */
                        sm90_tma_load_2d(a, &m.x, &full[s], kb * F8_BK, (int32_t)m0);
                        sm90_tma_load_3d_multicast(b + rank * 64 * F8_BK, &m.wh, &full[s], kb * F8_BK,
                                                   f8_wrow<GLU>(n0, rank, p.F), g, both);
                        continue;
                    }
                    if (CM > 1)   /* a column pair: 64 of the shared input rows each, into both CTAs */
                        sm90_tma_load_2d_multicast(a + rank * 64 * F8_BK, &m.xh, &full[s], kb * F8_BK,
                                                   (int32_t)(m0 + 64 * rank), both);
                    else
                        sm90_tma_load_2d(a, &m.x, &full[s], kb * F8_BK, (int32_t)m0);
                    if (GLU == 1) {   /* the tile's two halves */
                        sm90_tma_load_3d(b, &m.wh, &full[s], kb * F8_BK, f8_wrow<GLU>(n0, 0, p.F), g);
                        sm90_tma_load_3d(b + 64 * F8_BK, &m.wh, &full[s], kb * F8_BK, f8_wrow<GLU>(n0, 1, p.F), g);
                    } else {
                        sm90_tma_load_3d(b, &m.w, &full[s], kb * F8_BK, n0, g);
                    }
                }
            }
        } else if (tid == 32 && blockIdx.x == 0 && p.bad_flag != NULL) {
            sm90_check_splits(p.splits, p.G, p.T, p.bad_flag, p.bad_value);
        }
    } else {
        /* ---- consumers: warpgroup c computes rows [64 c, 64 c + 64) of each tile ---- */
        sm90_setmaxnreg_inc<232>();
        const int c = wg - 1, lane = tid % 32;
        const int rl = (tid / 32) * 16 + lane / 4;   /* block row of acc[4 j + {0, 1}]; + 8: {2, 3} */
        uint64_t da0 = sm90_desc_sw128(sa + 64 * c * F8_BK), db0 = sm90_desc_sw128(sb);
        sm90_desc_hold(da0);
        sm90_desc_hold(db0);
        float acc[64], part[64];
        uint32_t it = 0;
        /* the epilogue's view of the parameters (sm90_epilogue.cuh): the probs are the GLU's or
         * the scaled bias's */
        constexpr int EPI = f8_epi_kind<GLU>();
        sm90_epi e;
        memset(&e, 0, sizeof e);
        e.bias = p.bias;
        e.bias_f32 = p.bias_f32;
        e.bias_scaled = p.bias_scaled;
        e.probs = GLU ? p.glu_probs : p.probs;
        e.z = (uint16_t *)p.z;
        e.F = p.F;
        e.glu = p.glu;
        sm90_block k;
        k.c = c;
        k.tid = tid;
        k.lane = lane;
        k.rl = rl;
        uint8_t *stage = sc + c * 2 * SM90_STAGE_HALF_BYTES;
        sm90_walk wk;
        sm90_walk_start(&wk, false, 0, nk, CM, 0);
        while (sm90_walk_next<true>(&wk, p.splits, p.G, p.T, units)) {
            int64_t m0;
            int n0;
            f8_tile<CM>(&wk.cur, wk.w.t, nt, rank, &m0, &n0);
            const int g = wk.cur.g;
            const int64_t ra = m0 + 64 * c + rl, rb = ra + 8, row1 = wk.cur.row1;
            k.mr = m0 + 64 * c;
            k.ra = ra;
            k.rb = rb;
            k.row1 = row1;
            k.oka = ra < row1;
            k.okb = rb < row1;
            sm90_cols<EPI, 128> cols;
            cols.ob = GLU ? n0 / 2 : n0;
            cols.lim = GLU ? p.F : p.N;
            const bool has_bias = p.bias != NULL;
            /* BLOCK: this thread's rows' scale rows and the tile's weight block row (rows past T
             * read row T - 1, a column tile past N, a cluster's second of a column pair, reads
             * the last: never stored) */
            const float *sxa = p.xs + (ra < p.T ? ra : p.T - 1) * nk, *sxb = p.xs + (rb < p.T ? rb : p.T - 1) * nk;
            const int wa = f8_wrow<GLU>(n0, 0, p.F) / F8_BN, wb = f8_wrow<GLU>(n0, 1, p.F) / F8_BN;
            const float *swt = p.ws + ((int64_t)g * ntw + (wa < ntw ? wa : ntw - 1)) * nk;
            const float *swt2 = p.ws + ((int64_t)g * ntw + (wb < ntw ? wb : ntw - 1)) * nk;   /* GLU 1 */
#pragma unroll
            for (int i = 0; i < 64; i++) acc[i] = 0.0f;
            for (int kb = 0; kb < nk; kb++, it++) {
                float fa = 1.0f, fb = 1.0f, fa2 = 1.0f, fb2 = 1.0f;   /* 2: the second half's (GLU 1) */
                if (BLK) {   /* loaded now, used once the stage's steps are done */
                    const float w = __ldg(swt + kb), w2 = GLU == 1 ? __ldg(swt2 + kb) : w;
                    const float xa = __ldg(sxa + kb), xb = __ldg(sxb + kb);
                    fa = xa * w, fb = xb * w, fa2 = xa * w2, fb2 = xb * w2;
                }
                const uint32_t s = sm90_ring_wait<F8_STAGES>(full, it);
                sm90_wgmma_fp8_stage<X5, W5, F8_BK>(part, da0, s * F8_BM * F8_BK, db0, s * F8_BN * F8_BK);
                sm90_ring_release<CM, F8_STAGES>(empty, it, tid);
                if (has_bias && kb == 0)   /* the bias row, fetched while the tile is computed */
                    sm90_epi_bias_fetch(e, cols, g, p.N, stage, k);
                if (BLK) {
#pragma unroll
                    for (int i = 0; i < 64; i += 4) {
                        const float ua = GLU == 1 && i >= 32 ? fa2 : fa, ub = GLU == 1 && i >= 32 ? fb2 : fb;
                        acc[i] += ua * part[i], acc[i + 1] += ua * part[i + 1];
                        acc[i + 2] += ub * part[i + 2], acc[i + 3] += ub * part[i + 3];
                    }
                } else {
#pragma unroll
                    for (int i = 0; i < 64; i++) acc[i] += part[i];
                }
            }
            if (!BLK) {   /* current scaling: the group's scales once */
                const float f = p.xs[p.xs_group ? g : 0] * p.ws[g];
#pragma unroll
                for (int i = 0; i < 64; i++) acc[i] *= f;
            }
            float pa, pb;
            sm90_epi_probs<EPI>(e, k, &pa, &pb);
            sm90_epi_rows<YF16, 1, EPI, 128>(acc, e, cols, has_bias, pa, pb, stage, &m.y, &m.z, (uint16_t *)p.y, p.N,
                                              k);
        }
        if (tid == 0) sm90_bulk_wait<0>();   /* stores done before the CTA ends */
    }
    /* no CTA of a cluster leaves while its peer may still arrive on its barriers */
    if (CM > 1) sm90_cluster_sync();
#endif /* MOEX_SM90_DEVICE */
}

/* ---- host side ---------------------------------------------------------------------------- */

typedef void (*sm90_fp8_fn)(sm90_fp8_maps, sm90_fp8_params);

template <int X5, int W5, int BLK, int GLU> static sm90_fp8_fn sm90_fp8_pick_y(bool yf16, int cm) {
    if (cm > 1) return yf16 ? sm90_fp8_kernel<X5, W5, 1, 2, BLK, GLU> : sm90_fp8_kernel<X5, W5, 0, 2, BLK, GLU>;
    return yf16 ? sm90_fp8_kernel<X5, W5, 1, 1, BLK, GLU> : sm90_fp8_kernel<X5, W5, 0, 1, BLK, GLU>;
}

template <int BLK> static sm90_fp8_fn sm90_fp8_pick_b(bool x5, bool w5, bool yf16, int cm, int glu) {
    if (glu == 1) return sm90_fp8_pick_y<0, 0, BLK, 1>(yf16, cm);   /* FC1: E4M3 operands */
    if (glu == 2) return sm90_fp8_pick_y<0, 0, BLK, 2>(yf16, cm);
    if (x5) return w5 ? sm90_fp8_pick_y<1, 1, BLK, 0>(yf16, cm) : sm90_fp8_pick_y<1, 0, BLK, 0>(yf16, cm);
    return w5 ? sm90_fp8_pick_y<0, 1, BLK, 0>(yf16, cm) : sm90_fp8_pick_y<0, 0, BLK, 0>(yf16, cm);
}

/* glu: 0, or 1 / 2 (E4M3 operands only) */
static sm90_fp8_fn sm90_fp8_pick(bool x5, bool w5, bool yf16, int cm, bool block, int glu) {
    return block ? sm90_fp8_pick_b<1>(x5, w5, yf16, cm, glu) : sm90_fp8_pick_b<0>(x5, w5, yf16, cm, glu);
}

cudaError_t sm90_fp8_prepare(int sms, int *slots, const char **why) {
    for (int v = 0; v < 32; v++) {   /* the plain instances */
        const int cm = v & 8 ? 2 : 1;
        const cudaError_t e = sm90_prepare_kernel((const void *)sm90_fp8_pick(v & 1, v & 2, v & 4, cm, v & 16, 0),
                                                  F8_SMEM_BYTES, cm, sms, slots, why);
        if (e != cudaSuccess) return e;
    }
    for (int v = 0; v < 16; v++) {   /* the GLU instances (E4M3 operands) */
        const int cm = v & 4 ? 2 : 1;
        const cudaError_t e = sm90_prepare_kernel(
            (const void *)sm90_fp8_pick(false, false, v & 2, cm, v & 8, 1 + (v & 1)), F8_SMEM_BYTES, cm, sms, slots, why);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

static bool sm90_fp8_format(moex_dtype f) { return f == MOEX_DTYPE_E4M3 || f == MOEX_DTYPE_E5M2; }

extern "C" bool moex_sm90_fp8_supported(const moex_sm90_context *c, const moex_sm90_fp8_args *a) {
    if (c == NULL || a == NULL || !sm90_fp8_format(a->x_fmt) || !sm90_fp8_format(a->w_fmt)) return false;
    if (a->y_dtype != MOEX_DTYPE_BF16 && a->y_dtype != MOEX_DTYPE_F16) return false;
    if (!sm90_shape_ok(a->G, a->T, a->K, a->N, a->splits) || a->K % 16 != 0) return false;
    if (a->glu != 0) {   /* FC1 + GLU: E4M3, whole halves, the two halves of a BLOCK tile in whole blocks */
        if (a->glu > 2 || a->x_fmt != MOEX_DTYPE_E4M3 || a->w_fmt != MOEX_DTYPE_E4M3 || a->N != 2 * a->F ||
            a->F % 8 != 0 || (a->block && a->glu == 1 && a->F % 64 != 0) || a->bias_scaled || !sm90_aligned16(a->z))
            return false;
    }
    /* (a bias at any natural alignment: sm90_epi_bias_fetch) */
    return sm90_aligned16(a->x) && sm90_aligned16(a->w) && sm90_aligned16(a->y) && a->x_scales != NULL &&
           a->w_scales != NULL;
}

extern "C" moex_status moex_sm90_fp8_gemm(const moex_sm90_context *c, const moex_sm90_fp8_args *a, moex_stream stream,
                                          const char **why) {
    if (!moex_sm90_fp8_supported(c, a))
        SM90_FAIL(MOEX_ERR_UNSUPPORTED, "sm90 FP8 GEMM: unsupported device, formats, shape or alignment");
    if (a->T == 0) return MOEX_OK;
    sm90_fp8_maps km;
    const cuuint64_t xdims[2] = {(cuuint64_t)a->K, (cuuint64_t)a->T};
    const cuuint32_t xbox[2] = {F8_BK, F8_BM}, xhbox[2] = {F8_BK, 64};
    const cuuint64_t wdims[3] = {(cuuint64_t)a->K, (cuuint64_t)a->N, (cuuint64_t)a->G};
    const cuuint32_t wbox[3] = {F8_BK, F8_BN, 1}, whbox[3] = {F8_BK, 64, 1};
    const CUtensorMapL2promotion promo = CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
    const char *kname = "sm90 FP8 GEMM";   /* a map failure names the kernel and the operand */
    if (!sm90_make_map(c, &km.x, a->x_fmt, a->x, 2, xdims, xbox, promo, kname, "x", why) ||
        !sm90_make_map(c, &km.xh, a->x_fmt, a->x, 2, xdims, xhbox, promo, kname, "x", why) ||
        !sm90_make_map(c, &km.w, a->w_fmt, a->w, 3, wdims, wbox, promo, kname, "w", why) ||
        !sm90_make_map(c, &km.wh, a->w_fmt, a->w, 3, wdims, whbox, promo, kname, "w", why))
        return MOEX_ERR_CUDA;   /* *why names the operand and the CUresult */
    /* the output's maps for the TMA stores (z: a copy of y's without the GLU, never read) */
    const cuuint64_t ydims[2] = {(cuuint64_t)a->N, (cuuint64_t)a->T}, zdims[2] = {(cuuint64_t)a->F, (cuuint64_t)a->T};
    const cuuint32_t ybox[2] = {64, 64};
    const bool glu = a->glu != 0;
    if (!sm90_make_map(c, &km.y, a->y_dtype, a->y, 2, ydims, ybox, promo, kname, glu ? "h" : "y", why))
        return MOEX_ERR_CUDA;
    km.z = km.y;
    if (glu && !sm90_make_map(c, &km.z, a->y_dtype, a->z, 2, zdims, ybox, promo, kname, "z", why))
        return MOEX_ERR_CUDA;
    sm90_fp8_params kp;
    memset(&kp, 0, sizeof kp);
    kp.y = a->y;
    kp.splits = a->splits;
    kp.G = (int)a->G;
    kp.T = a->T;
    kp.N = (int)a->N;
    kp.K = (int)a->K;
    kp.xs = a->x_scales;
    kp.ws = a->w_scales;
    kp.xs_group = a->x_scale_per_group;
    kp.bias = a->bias;
    kp.bias_f32 = a->bias_f32;
    kp.bias_scaled = a->bias_scaled;
    kp.probs = a->probs;
    kp.bad_flag = a->bad_flag;
    kp.bad_value = a->bad_value;
    kp.z = a->z;
    kp.F = (int)a->F;
    kp.glu = a->glu_consts;
    kp.glu_probs = a->glu_probs;
    /* 2-CTA clusters, as many as fit at once, on long reductions (their pairs of tiles wait
     * for each other: on short ones single CTAs measured faster); else one CTA per SM */
    const int cm = c->dev.fp8_cluster_slots > 0 && a->K >= F8_CLUSTER_MIN_K ? 2 : 1;
    const int grid = cm > 1 ? 2 * (c->dev.fp8_cluster_slots < c->dev.sms / 2 ? c->dev.fp8_cluster_slots
                                                                               : c->dev.sms / 2)
                            : c->dev.sms;
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr[1];
    sm90_launch_config(&cfg, attr, grid, F8_SMEM_BYTES, cm, false, stream);
    const sm90_fp8_fn fn = sm90_fp8_pick(a->x_fmt == MOEX_DTYPE_E5M2, a->w_fmt == MOEX_DTYPE_E5M2,
                                         a->y_dtype == MOEX_DTYPE_F16, cm, a->block != 0, a->glu);
    if (cudaLaunchKernelEx(&cfg, fn, km, kp) != cudaSuccess) {
        cudaGetLastError();
        SM90_FAIL(MOEX_ERR_CUDA, "sm90 FP8 GEMM: kernel launch failed");
    }
    return MOEX_OK;
}
