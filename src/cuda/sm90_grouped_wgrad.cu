/*
 * sm90_grouped_wgrad.cu - the Hopper (sm_90a) K-grouped weight gradient dW_g = dy_g^T x_g
 * (contract in sm90_grouped_gemm.h; the CTA shape and the host helpers in sm90_common.cuh).
 */
#include "sm90_common.cuh"

/* ---- the weight gradient (K-grouped): dW_g = dy_g^T x_g ------------------------------------
 * Same CTA shape as above (one producer warpgroup, two wgmma consumer warpgroups), its own
 * kernel. A work unit is one output tile [128 rows of N, 256 columns of K] of one group;
 * every group has the same ceil(N/128) * ceil(K/256) units, so the unit list is known on the
 * host and CTA b takes units b, b + grid, ... (the group of a unit only grows, so a cursor
 * over the splits costs O(G) per CTA). A unit reduces over its group's rows in stages of 64
 * rows: dy box [64 rows][64 N] per consumer (A, MN-major, transposed by wgmma) and four x
 * boxes [64 rows][64 K] (B, MN-major). A stage that reaches past the group's end holds rows
 * of the next group (or past off[G]: anything, NaN included; past T: TMA zero fill); the
 * consumers overwrite those rows with zeros in shared memory before any wgmma reads the
 * stage (each consumer its own dy box and two of the four x boxes, then a proxy fence and a
 * barrier over both consumers). A group with no rows has no stages: its tiles are written as
 * zeros (=) or left alone (+=). Every output tile is computed by one CTA, stages in row
 * order: deterministic. Output goes from registers (masked to N and K). */

#define SM90W_BR 64                      /* group rows (the reduction) per stage            */
#define SM90W_BOX (64 * 64)              /* elements of one TMA box [64 rows][64 columns]     */
#define SM90W_A_BOXES (SM90_BM / 64)     /* dy boxes per stage: one per consumer            */
#define SM90W_B_BOXES (SM90_BN / 64)     /* x boxes per stage                              */
static const uint32_t SM90W_STAGE_BYTES = (uint32_t)(SM90W_A_BOXES + SM90W_B_BOXES) * SM90W_BOX * 2u;
/* stages + barriers + slack to align to 1024 bytes */
static const size_t SM90W_SMEM_BYTES = (size_t)SM90_STAGES * SM90W_STAGE_BYTES + 2 * SM90_STAGES * 8 + 1024;

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

/* Overwrites rows [v, 64) of one swizzled box [64 rows][128 bytes] with zeros (the 128-byte
 * swizzle permutes 16-byte chunks inside a row, so a row stays bytes [128 r, 128 r + 128)). */
static __device__ __forceinline__ void sm90w_zero_rows(uint8_t *box, int v, int tid) {
    uint4 *p = (uint4 *)(box + v * 128);
    const int n = (64 - v) * 8;
    for (int i = tid; i < n; i += 128) p[i] = make_uint4(0u, 0u, 0u, 0u);
}
#endif /* MOEX_SM90_DEVICE */

/* mode: SM90W_OUT_F32 (dw f32, =), SM90W_OUT_F32_ACC (dw f32, +=), SM90W_OUT_HALF (dw in the
 * input dtype, =). tm_dy: dy [T, N], tm_x: x [T, K], both boxes [64 rows][64 columns]. */
template <int IS_F16>
__global__ void __launch_bounds__(SM90_THREADS, 1)
    sm90_wgrad_kernel(const __grid_constant__ CUtensorMap tm_dy, const __grid_constant__ CUtensorMap tm_x,
                      void *__restrict__ dw, const int64_t *__restrict__ splits, int64_t G, int64_t T, int N, int K,
                      int mode) {
#if MOEX_SM90_DEVICE
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint16_t *sa = (uint16_t *)smem;                                       /* [STAGES][2][64][64] */
    uint16_t *sb = sa + SM90_STAGES * SM90W_A_BOXES * SM90W_BOX;           /* [STAGES][4][64][64] */
    uint64_t *full = (uint64_t *)(sb + SM90_STAGES * SM90W_B_BOXES * SM90W_BOX);
    uint64_t *empty = full + SM90_STAGES;

    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    if (threadIdx.x == 0) {
        for (int s = 0; s < SM90_STAGES; s++) {
            sm90_mbar_init(&full[s], 1);
            sm90_mbar_init(&empty[s], 2);
        }
        sm90_mbar_init_fence();
    }
    __syncthreads();

    const int64_t tn = (N + SM90_BM - 1) / SM90_BM, tk = (K + SM90_BN - 1) / SM90_BN;
    const int64_t per_group = tn * tk, units = G * per_group;

    if (wg == 0) {
        /* ---- producer ---- */
        sm90_setmaxnreg_dec<40>();
        if (tid == 0) {
            sm90_tma_prefetch_map(&tm_dy);
            sm90_tma_prefetch_map(&tm_x);
            sm90w_cursor cur = {-1, 0, 0};
            uint32_t it = 0;
            for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
                const int64_t g = u / per_group, l = u - g * per_group;
                sm90w_seek(&cur, g, splits, T);
                const int n0 = (int)(l % tn) * SM90_BM, k0 = (int)(l / tn) * SM90_BN;
                const int nks = (int)((cur.row1 - cur.row0 + SM90W_BR - 1) / SM90W_BR);
                for (int kb = 0; kb < nks; kb++, it++) {
                    const int s = it % SM90_STAGES;
                    const int32_t r = (int32_t)(cur.row0 + (int64_t)kb * SM90W_BR);
                    sm90_mbar_wait(&empty[s], ((it / SM90_STAGES) & 1u) ^ 1u);
                    /* every box lands in full (zero-filled past the tensor): constant bytes */
                    sm90_mbar_arrive_expect_tx(&full[s], SM90W_STAGE_BYTES);
#pragma unroll
                    for (int j = 0; j < SM90W_A_BOXES; j++)
                        sm90_tma_load_2d(sa + (s * SM90W_A_BOXES + j) * SM90W_BOX, &tm_dy, &full[s], n0 + j * 64, r);
#pragma unroll
                    for (int j = 0; j < SM90W_B_BOXES; j++)
                        sm90_tma_load_2d(sb + (s * SM90W_B_BOXES + j) * SM90W_BOX, &tm_x, &full[s], k0 + j * 64, r);
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
        sm90w_cursor cur = {-1, 0, 0};
        uint32_t it = 0;
        for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
            const int64_t g = u / per_group, l = u - g * per_group;
            sm90w_seek(&cur, g, splits, T);
            const int n0 = (int)(l % tn) * SM90_BM, k0 = (int)(l / tn) * SM90_BN;
            const int nks = (int)((cur.row1 - cur.row0 + SM90W_BR - 1) / SM90W_BR);
            for (int kb = 0; kb < nks; kb++, it++) {
                const int s = it % SM90_STAGES;
                sm90_mbar_wait(&full[s], (it / SM90_STAGES) & 1u);
                uint16_t *a = sa + (s * SM90W_A_BOXES + c) * SM90W_BOX;
                uint16_t *b = sb + s * SM90W_B_BOXES * SM90W_BOX;
                const int64_t left = cur.row1 - cur.row0 - (int64_t)kb * SM90W_BR;   /* >= 1 */
                if (left < SM90W_BR) {
                    /* rows [left, 64) are not the group's: zero them in this consumer's dy box
                     * and in x boxes 2c, 2c + 1, then make both consumers' zeros visible to
                     * the tensor cores before either reads the stage */
                    sm90w_zero_rows((uint8_t *)a, (int)left, tid);
                    sm90w_zero_rows((uint8_t *)(b + (2 * c) * SM90W_BOX), (int)left, tid);
                    sm90w_zero_rows((uint8_t *)(b + (2 * c + 1) * SM90W_BOX), (int)left, tid);
                    sm90_fence_proxy_async_smem();
                    sm90_named_barrier(1, 256);
                }
                sm90_wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < SM90W_BR / 16; kk++) {
                    /* 16 rows of 128 bytes per k step; 64-column blocks one box apart */
                    const uint64_t da = sm90_desc_mn_sw128(a + kk * 16 * 64, SM90W_BOX * 2, 1024);
                    const uint64_t db = sm90_desc_mn_sw128(b + kk * 16 * 64, SM90W_BOX * 2, 1024);
                    const uint32_t keep = (kb | kk) != 0;
                    if (IS_F16)
                        wgmma_m64n256k16_f16_tatb(acc, da, db, keep);
                    else
                        wgmma_m64n256k16_bf16_tatb(acc, da, db, keep);
                }
                sm90_wgmma_commit();
                if (kb > 0) {
                    /* the previous stage's wgmmas are done: hand it back to the producer */
                    sm90_wgmma_wait<1>();
                    if (tid == 0) sm90_mbar_arrive(&empty[(it - 1) % SM90_STAGES]);
                }
            }
            /* unconditional (a no-op without stages): ptxas then sees every path to the
             * epilogue's reads of acc close the wgmma pipeline, and serialises nothing */
            sm90_wgmma_wait<0>();
            if (nks > 0) {
                if (tid == 0) sm90_mbar_arrive(&empty[(it - 1) % SM90_STAGES]);
            } else if (mode == SM90W_OUT_F32_ACC) {
                continue;   /* += an empty sum: dW_g unchanged */
            }
            /* an empty group writes zeros (selected, not computed: acc holds an older tile) */
            const bool live = nks > 0;

            /* epilogue: thread holds dW rows ra, ra + 8 and column pairs j*8 + 2*(lane%4) */
            const int64_t ra = n0 + c * 64 + warp * 16 + lane / 4, rb = ra + 8;
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
    }
#endif /* MOEX_SM90_DEVICE */
}

/* ---- weight gradient: host side -------------------------------------------------------- */

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
    return sm90_device_ok(device, (const void *)sm90_wgrad_kernel<0>);
}

extern "C" moex_status moex_sm90_grouped_gemm_wgrad(const moex_sm90_wgrad_args *a, moex_stream stream,
                                                    const char **why) {
    int device = 0;
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

    CUtensorMap tm_dy, tm_x;
    const cuuint64_t dydims[2] = {(cuuint64_t)a->N, (cuuint64_t)a->T};
    const cuuint64_t xdims[2] = {(cuuint64_t)a->K, (cuuint64_t)a->T};
    const cuuint32_t box[2] = {64, SM90W_BR};
    if (!sm90_make_map(&tm_dy, a->dtype, a->dy, 2, dydims, box) || !sm90_make_map(&tm_x, a->dtype, a->x, 2, xdims, box))
        SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped wgrad: cuTensorMapEncodeTiled failed");

    void (*fn)(CUtensorMap, CUtensorMap, void *, const int64_t *, int64_t, int64_t, int, int, int) =
        a->dtype == MOEX_DTYPE_F16 ? sm90_wgrad_kernel<1> : sm90_wgrad_kernel<0>;
    if (cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)SM90W_SMEM_BYTES) != cudaSuccess) {
        cudaGetLastError();
        SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped wgrad: cudaFuncSetAttribute failed");
    }
    int slots = 0;
    if (cudaDeviceGetAttribute(&slots, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || slots < 1)
        SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped wgrad: cudaDeviceGetAttribute failed");
    const int64_t units = a->G * ((a->N + SM90_BM - 1) / SM90_BM) * ((a->K + SM90_BN - 1) / SM90_BN);

    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = dim3((unsigned)(units < slots ? units : slots), 1, 1);
    cfg.blockDim = dim3(SM90_THREADS, 1, 1);
    cfg.dynamicSmemBytes = SM90W_SMEM_BYTES;
    cfg.stream = (cudaStream_t)stream;
    if (cudaLaunchKernelEx(&cfg, fn, tm_dy, tm_x, a->dw, a->splits, a->G, a->T, (int)a->N, (int)a->K, mode) !=
        cudaSuccess) {
        cudaGetLastError();
        SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped wgrad: kernel launch failed");
    }
    return MOEX_OK;
}

