/*
 * sm90_grouped_wgrad.cu - the Hopper (sm_90a) K-grouped weight gradient dW_g = dy_g^T x_g
 * and its launch (contract in sm90_grouped_gemm.h and sm90_tuning.h; docs/hopper.md).
 *
 * Same CTA shape as the M-grouped kernel (one producer warpgroup, two wgmma consumer
 * warpgroups) and the same shared pieces: the work list, group cursor and tile order of
 * sm90_scheduler.cuh (with sm90_units_fixed: every group has the same units), the stage ring
 * of sm90_pipeline.cuh, the wgrad epilogues of sm90_epilogue.cuh. A work unit is CM output
 * tiles [128 rows of N, 256 columns of K] of one group (CM = CTAs per cluster: the CTA of
 * rank r takes N tile CM p + r of unit p); every group has ceil(ceil(N/128) / CM) *
 * ceil(K/256) units, in bands of N units (sm90_wgrad_tile) so that the CTAs running at once
 * share dy and x columns. A unit reduces over its group's rows in stages of 64 rows: dy box
 * [64 rows][64 N] per consumer (A, MN-major, transposed by wgmma) and four x boxes
 * [64 rows][64 K] (B, MN-major). A stage that reaches past the group's end holds rows of the
 * next group (or past off[G]: anything, NaN included; past T: TMA zero fill); the consumers
 * overwrite those rows with zeros in shared memory before any wgmma reads the stage (each
 * consumer its own dy box and two of the four x boxes, then a proxy fence and a barrier over
 * both consumers). A group with no rows has no stages: its tiles are written as zeros (=) or
 * left alone (+=). Every output tile is computed by one CTA, stages in row order:
 * deterministic.
 * Clusters (CM = 2): the two CTAs take N tiles 2p and 2p + 1 of the same group and K tile,
 * so they read the same x boxes: each loads two of the four with TMA multicast into both.
 * Where N has an odd number of tiles, the rank 1 CTA of the last pair computes a tile it
 * never stores (dy read from tile 0).
 */
#include "sm90_epilogue.cuh"
#include "sm90_pipeline.cuh"
#include "sm90_scheduler.cuh"
#include "sm90_tuning.h"

#define SM90W_BR 64                      /* group rows (the reduction) per stage            */
#define SM90W_BOX (64 * 64)              /* elements of one TMA box [64 rows][64 columns]     */
#define SM90W_A_BOXES (SM90_BM / 64)     /* dy boxes per stage: one per consumer            */
#define SM90W_B_BOXES (SM90_BN / 64)     /* x boxes per stage                              */
/* bytes of one stage: a macro, as the other sizes (a file-scope constant that only the sm_90a
 * kernel body reads is unused in the sm_80 pass, and nvcc warned about it in every build) */
#define SM90W_STAGE_BYTES ((uint32_t)(SM90W_A_BOXES + SM90W_B_BOXES) * SM90W_BOX * 2u)

/* The kernel's parameters (one __grid_constant__ struct). */
typedef struct sm90_wgrad_params {
    CUtensorMap tm_dy;          /* dy [T, N], boxes [64 rows][64 columns]                      */
    CUtensorMap tm_x;           /* x [T, K], the same boxes                                    */
    CUtensorMap tm_dw;          /* dW [G, N, K] in its dtype, boxes [1][64][128 bytes] (only
                                   with epi_tma)                                             */
    void *dw;                   /* dW, for the masked stores                                   */
    const int64_t *splits;      /* [G] device                                                  */
    int G, N, K;
    int64_t T;
    int band_w;                 /* N units per band of the tile order                          */
    int mode;                   /* SM90W_OUT_*                                                 */
    int epi_tma;                /* blocks inside [N, K] through TMA stores (0: masked stores)  */
    int *bad_flag;              /* optional: set to bad_value when a split is bad              */
    int bad_value;
} sm90_wgrad_params;

#if MOEX_SM90_DEVICE
/* The next unit of the walk (WARP: by a whole warp) as this CTA's output tile (first dW row
 * *n0, column *k0) and its stages of SM90W_BR group rows (*nks); false at the end. */
template <bool WARP>
static __device__ __forceinline__ bool sm90w_next(sm90_walk *wk, const int64_t *splits, int G, int64_t T,
                                                  const sm90_units_fixed &units, int64_t tnu, int64_t tk, int band_w,
                                                  int cm, int rank, int *n0, int *k0, int *nks) {
    if (!sm90_walk_next<WARP>(wk, splits, G, T, units)) return false;
    sm90_wgrad_tile(&wk->cur, wk->w.t, tnu, tk, band_w, cm, rank, n0, k0);
    *nks = (int)((wk->cur.row1 - wk->cur.row0 + SM90W_BR - 1) / SM90W_BR);
    return true;
}
#endif /* MOEX_SM90_DEVICE */

/* IS_F16: f16 (else bf16) inputs; CM: CTAs per cluster. */
template <int IS_F16, int CM>
__global__ void __launch_bounds__(SM90_THREADS, 1) sm90_wgrad_kernel(const __grid_constant__ sm90_wgrad_params p) {
#if MOEX_SM90_DEVICE
    const int64_t *__restrict__ splits = p.splits;
    const int G = p.G, N = p.N, K = p.K;
    const int64_t T = p.T;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = sm90_smem_aligned(smem_raw);
    uint16_t *sa = (uint16_t *)smem;                                       /* [STAGES][2][64][64] */
    uint16_t *sb = sa + SM90_STAGES * SM90W_A_BOXES * SM90W_BOX;           /* [STAGES][4][64][64] */
    uint8_t *sc = (uint8_t *)(sb + SM90_STAGES * SM90W_B_BOXES * SM90W_BOX); /* [2][2][8 KB]      */
    uint64_t *full = (uint64_t *)(sc + 4 * SM90_STAGE_HALF_BYTES);
    uint64_t *empty = full + SM90_STAGES;

    const int wg = sm90_warpgroup(), tid = threadIdx.x % 128;
    sm90_ring_init<CM>(full, empty);

    const int64_t tn = (N + SM90_BM - 1) / SM90_BM, tk = (K + SM90_BN - 1) / SM90_BN;
    const int64_t tnu = (tn + CM - 1) / CM;                 /* units along N: CM tiles each */
    const sm90_units_fixed units = {tnu * tk};
    const int rank = CM > 1 ? (int)sm90_cluster_rank() : 0;

    if (wg == 0) {
        /* ---- producer ---- */
        sm90_setmaxnreg_dec<40>();
        if (tid == 0) {
            sm90_tma_prefetch_map(&p.tm_dy);
            sm90_tma_prefetch_map(&p.tm_x);
            sm90_walk wk;
            sm90_walk_start(&wk, false, 0, 0, CM, 0);
            uint32_t it = 0;
            int n0, k0, nks;
            while (sm90w_next<false>(&wk, splits, G, T, units, tnu, tk, p.band_w, CM, rank, &n0, &k0, &nks)) {
                const int ny = n0 < N ? n0 : 0;   /* a cluster's tile past N: any dy, never stored */
                for (int kb = 0; kb < nks; kb++, it++) {
                    /* every box lands in full (zero-filled past the tensor; with clusters
                     * half of the x boxes come from the peer): constant bytes */
                    const uint32_t s = sm90_ring_fill(full, empty, it, SM90W_STAGE_BYTES);
                    const int32_t r = (int32_t)(wk.cur.row0 + (int64_t)kb * SM90W_BR);
#pragma unroll
                    for (int j = 0; j < SM90W_A_BOXES; j++)
                        sm90_tma_load_2d(sa + (s * SM90W_A_BOXES + j) * SM90W_BOX, &p.tm_dy, &full[s], ny + j * 64, r);
                    if (CM > 1) {
#pragma unroll
                        for (int j = rank * (SM90W_B_BOXES / CM); j < (rank + 1) * (SM90W_B_BOXES / CM); j++)
                            sm90_tma_load_2d_multicast(sb + (s * SM90W_B_BOXES + j) * SM90W_BOX, &p.tm_x, &full[s],
                                                       k0 + j * 64, r, (uint16_t)((1u << CM) - 1u));
                    } else {
#pragma unroll
                        for (int j = 0; j < SM90W_B_BOXES; j++)
                            sm90_tma_load_2d(sb + (s * SM90W_B_BOXES + j) * SM90W_BOX, &p.tm_x, &full[s],
                                             k0 + j * 64, r);
                    }
                }
            }
        } else if (tid == 32 && blockIdx.x == 0 && p.bad_flag != NULL) {
            sm90_check_splits(splits, G, T, p.bad_flag, p.bad_value);
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
        sm90_walk wk;
        sm90_walk_start(&wk, false, 0, 0, CM, 0);
        const sm90_cursor &cur = wk.cur;
        uint32_t it = 0;
        int n0, k0, nks;
        while (sm90w_next<true>(&wk, splits, G, T, units, tnu, tk, p.band_w, CM, rank, &n0, &k0, &nks)) {
            const int tail = (int)((cur.row1 - cur.row0) % SM90W_BR);   /* rows of a partial last stage */
            for (int kb = 0; kb < nks; kb++, it++) {
                const uint32_t s = sm90_ring_wait(full, it);
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
                for (int kk = 0; kk < SM90W_BR / 16; kk++)
                    sm90_wgmma<IS_F16, 1, 1>(acc, sm90_desc_add(da0, (s * SM90W_A_BOXES * SM90W_BOX + kk * 16 * 64) * 2),
                                             sm90_desc_add(db0, (s * SM90W_B_BOXES * SM90W_BOX + kk * 16 * 64) * 2),
                                             (kb | kk) != 0);
                sm90_wgmma_commit();
                if (kb > 0) {
                    /* the previous stage's wgmmas are done: hand it back to the producer(s) */
                    sm90_wgmma_wait<1>();
                    sm90_ring_release<CM>(empty, it - 1, tid);
                }
            }
            /* unconditional (a no-op without stages): ptxas then sees every path to the
             * epilogue's reads of acc close the wgmma pipeline, and serialises nothing */
            sm90_wgmma_wait<0>();
            if (nks > 0) {
                sm90_ring_release<CM>(empty, it - 1, tid);
            } else if (p.mode == SM90W_OUT_F32_ACC) {
                continue;   /* += an empty sum: dW_g unchanged */
            }
            /* an empty group writes zeros (selected, not computed: acc holds an older tile) */
            const bool live = nks > 0;
            const int nc = n0 + c * 64;   /* this consumer's first dW row */
            if (p.epi_tma && nc + 64 <= N && k0 + SM90_BN <= K) {
                uint8_t *stage = sc + c * 2 * SM90_STAGE_HALF_BYTES;
                if (p.mode == SM90W_OUT_HALF)
                    sm90w_epilogue_tma<IS_F16, false>(acc, live, stage, &p.tm_dw, k0, nc, cur.g, false, 2 + c, tid);
                else
                    sm90w_epilogue_tma<IS_F16, true>(acc, live, stage, &p.tm_dw, k0, nc, cur.g,
                                                     p.mode == SM90W_OUT_F32_ACC, 2 + c, tid);
            } else {
                sm90w_store_masked<IS_F16>(acc, live, p.dw, cur.g, N, K, nc, k0, p.mode, warp, lane);
            }
        }
        if (tid == 0) sm90_bulk_wait<0>();   /* TMA stores done before the CTA ends (none: a no-op) */
    }
    /* no CTA of a cluster leaves while its peer may still arrive on its barriers */
    if (CM > 1) sm90_cluster_sync();
#endif /* MOEX_SM90_DEVICE */
}

/* ---- host side ------------------------------------------------------------------------------ */

typedef void (*sm90w_fn)(sm90_wgrad_params);

static sm90w_fn sm90w_pick(bool f16, int cm) {
    if (cm > 1) return f16 ? sm90_wgrad_kernel<1, 2> : sm90_wgrad_kernel<0, 2>;
    return f16 ? sm90_wgrad_kernel<1, 1> : sm90_wgrad_kernel<0, 1>;
}

cudaError_t sm90_wgrad_prepare(int sms, int *slots, const char **why) {
    for (int f16 = 0; f16 < 2; f16++)
        for (int cm = 1; cm <= 2; cm++) {
            const cudaError_t e =
                sm90_prepare_kernel((const void *)sm90w_pick(f16, cm), SM90_SMEM_BYTES(SM90_BM), cm, sms, slots, why);
            if (e != cudaSuccess) return e;
        }
    return cudaSuccess;
}

extern "C" bool moex_sm90_wgrad_supported(const moex_sm90_context *c, const moex_sm90_wgrad_args *a) {
    if (c == NULL || a == NULL) return false;
    if (a->dtype != MOEX_DTYPE_BF16 && a->dtype != MOEX_DTYPE_F16) return false;
    if (a->accumulate ? a->dw_dtype != MOEX_DTYPE_F32 : a->dw_dtype != MOEX_DTYPE_F32 && a->dw_dtype != a->dtype)
        return false;
    if (!sm90_shape_ok(a->G, a->T, a->K, a->N, a->splits)) return false;
    return sm90_aligned16(a->dy) && sm90_aligned16(a->x) && sm90_aligned16(a->dw);
}

/* The weight gradient as one launch of the planned instance; tune: the knobs (NULL in
 * production). */
static moex_status sm90w_run(const moex_sm90_context *ctx, const moex_sm90_wgrad_args *a, moex_sm90_tuning *tune,
                             moex_stream stream, const char **why) {
    if (tune != NULL) tune->grid_used = 0;
    if (!moex_sm90_wgrad_supported(ctx, a))
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
    moex_sm90_shape shape;
    memset(&shape, 0, sizeof shape);
    shape.product = MOEX_SM90_WGRAD;
    shape.G = a->G;
    shape.T = a->T;
    shape.K = a->K;
    shape.N = a->N;
    moex_sm90_plan plan;
    moex_sm90_plan_make(&ctx->dev, &shape, tune, &plan);

    sm90_wgrad_params kp;
    memset(&kp, 0, sizeof kp);
    const cuuint64_t dydims[2] = {(cuuint64_t)a->N, (cuuint64_t)a->T};
    const cuuint64_t xdims[2] = {(cuuint64_t)a->K, (cuuint64_t)a->T};
    const cuuint32_t box[2] = {64, SM90W_BR};
    const CUtensorMapL2promotion promo = sm90_l2_promotion(plan.l2_promotion);
    const char *kname = "sm90 grouped wgrad";   /* a map failure names the kernel and the operand */
    if (!sm90_make_map(ctx, &kp.tm_dy, a->dtype, a->dy, 2, dydims, box, promo, kname, "dy", why) ||
        !sm90_make_map(ctx, &kp.tm_x, a->dtype, a->x, 2, xdims, box, promo, kname, "x", why))
        return MOEX_ERR_CUDA;   /* *why names the operand and the CUresult */
    /* without the map (the plan's choice, or the encoder refused it) the register epilogue */
    kp.epi_tma =
        plan.epilogue_tma && sm90_make_dw_map(ctx, &kp.tm_dw, a->dw_dtype, a->dw, a->G, a->N, a->K, promo, kname);
    sm90w_params_shape(&kp, a);
    kp.band_w = plan.band;
    kp.bad_flag = a->bad_flag;
    kp.bad_value = a->bad_value;
    kp.mode = sm90w_out_mode(a->accumulate, a->dw_dtype);

    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr[1];
    sm90_launch_config(&cfg, attr, plan.grid, SM90_SMEM_BYTES(SM90_BM), plan.cluster, false, stream);
    if (cudaLaunchKernelEx(&cfg, sm90w_pick(a->dtype == MOEX_DTYPE_F16, plan.cluster), kp) != cudaSuccess) {
        cudaGetLastError();
        SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped wgrad: kernel launch failed");
    }
    if (tune != NULL) tune->grid_used = plan.grid;
    return MOEX_OK;
}

extern "C" moex_status moex_sm90_grouped_gemm_wgrad(const moex_sm90_context *c, const moex_sm90_wgrad_args *a,
                                                    moex_stream stream, const char **why) {
    return sm90w_run(c, a, NULL, stream, why);
}

extern "C" moex_status moex_sm90_grouped_gemm_wgrad_tuned(const moex_sm90_context *c, const moex_sm90_wgrad_args *a,
                                                          moex_sm90_tuning *tune, moex_stream stream,
                                                          const char **why) {
    return sm90w_run(c, a, tune, stream, why);
}
