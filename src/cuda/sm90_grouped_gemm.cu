/*
 * sm90_grouped_gemm.cu - the Hopper (sm_90a) grouped GEMMs: the M-grouped forward
 * y_g = x_g W_g^T and dgrad dx_g = dy_g W_g, and the K-grouped weight gradient
 * dW_g = dy_g^T x_g (its own kernel, described above it; contract in sm90_grouped_gemm.h).
 *
 * Design:
 *   - persistent grid, one CTA of 384 threads per SM: warpgroup 0 is the producer (one
 *     thread issues TMA loads), warpgroups 1 and 2 are consumers (each computes 64 rows of
 *     the 128x256 output tile with wgmma m64n256k16, f32 accumulators in registers);
 *   - a ring of 4 shared-memory stages, each an input tile [128 rows, 64 k]
 *     and a weight tile of 256 output columns by 64 k, 128-byte swizzled by TMA; a full and
 *     an empty mbarrier per stage. Forward: the weight tile is K-major (W_g rows); dgrad: it
 *     is MN-major (four boxes of 64 W_g rows by 64 columns) and wgmma reads it transposed;
 *   - a device-side tile schedule: every thread walks the groups with a cursor (tile
 *     indices of a CTA only grow, so the walk is O(G + tiles) per CTA), reading the split
 *     values from device memory; nothing about the splits is known on the host;
 *   - tile order inside a group: bands of SM90_BAND column tiles, row tiles fastest, so
 *     CTAs running at the same time share weight tiles and input tiles in L2;
 *   - input tiles are loaded from the global row offset of the group, so a tile can
 *     straddle the next group (or the rows past off[G]; TMA zero-fills past T); those rows
 *     are computed but never stored: full 64-row blocks inside the group leave through a
 *     swizzled shared-memory staging buffer and TMA stores, other blocks through masked
 *     stores from registers (rows below the group's end, columns below the output width);
 *   - optional (tuning): 2-CTA clusters that share the weight tile through TMA multicast
 *     (correct, but slower than no cluster in our measurements), masked register stores
 *     everywhere instead of the TMA epilogue, the grid size and the band width.
 * Tensor maps depend on pointers and shapes only, so a launch captured in a CUDA graph stays
 * correct when the split values change.
 */
#include "sm90_common.cuh"

#define SM90_DEFAULT_CLUSTER 1      /* CTAs per cluster unless tuned otherwise */

#define SM90_A_ELEMS (SM90_BM * SM90_BK)
#define SM90_B_ELEMS (SM90_BN * SM90_BK)
static const uint32_t SM90_STAGE_BYTES = (uint32_t)(SM90_BM + SM90_BN) * SM90_BK * 2u;
#define SM90_C_ELEMS (64 * 128)       /* a consumer's output staging: 64 rows x 128 columns */
/* stages + output staging (2 consumers) + barriers + slack to align to 1024 bytes */
static const size_t SM90_SMEM_BYTES =
    (size_t)SM90_STAGES * SM90_STAGE_BYTES + 2 * SM90_C_ELEMS * 2 + 2 * SM90_STAGES * 8 + 1024;

/* ---- the device-side group schedule ------------------------------------------------- */

#if MOEX_SM90_DEVICE

/* The group that owns the cursor's work units: rows [row0, row1), units [tile0, tile0 + mt * nt).
 * A unit is CM row tiles (one per CTA of a cluster) by one column tile. */
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

/* Moves the cursor forward to the group that owns tile t (t never decreases between calls).
 * Returns 0 when t is past the last tile. */
static __device__ __forceinline__ int sm90_cursor_seek(sm90_cursor *c, int64_t t, const int64_t *splits, int G,
                                                       int64_t T, int64_t nt, int cm) {
    while (t >= c->tile0 + c->mt * nt) {
        c->tile0 += c->mt * nt;
        c->g++;
        if (c->g >= G) return 0;
        int64_t s = __ldg(splits + c->g);
        s = s < 0 ? 0 : s;
        c->row0 = c->row1;
        c->row1 = c->row0 + s < T ? c->row0 + s : T;
        c->mt = (c->row1 - c->row0 + SM90_BM * cm - 1) / (SM90_BM * cm);
    }
    return 1;
}

/* Row and column of the first element of the row tile `rank` of unit t in the cursor's group
 * (the row may be past the group's end when the group has fewer row tiles than the unit). */
static __device__ __forceinline__ void sm90_tile_coords(const sm90_cursor *c, int64_t t, int band_w, int cm, int rank,
                                                        int64_t *m0, int *n0) {
    int64_t l = t - c->tile0;
    int64_t band_tiles = c->mt * band_w;
    int64_t band = l / band_tiles;
    int64_t r = l - band * band_tiles;
    *m0 = c->row0 + ((r % c->mt) * cm + rank) * SM90_BM;
    *n0 = (int)((band * band_w + r / c->mt) * SM90_BN);
}

/* ---- the kernel ------------------------------------------------------------------------ */

/* A consumer warpgroup hands a stage back: with clusters, thread `cta` arrives on CTA cta's
 * empty barrier of that stage (the peer's producer multicasts into this CTA too). */
template <int CM> static __device__ __forceinline__ void sm90_release_stage(uint64_t *bar, int cta) {
    if (CM > 1)
        sm90_mbar_arrive_cluster(bar, (uint32_t)cta);
    else
        sm90_mbar_arrive(bar);
}

#endif /* MOEX_SM90_DEVICE */

/* EPI_TMA: full 64x256 output blocks of a consumer go registers -> swizzled shared memory ->
 * TMA store (two 128-column passes), so the consumer moves on while the copy engine writes;
 * blocks that reach past the group's end or past N use masked stores from registers.
 * CM: CTAs per cluster (1 or 2). With 2, the CTAs of a cluster take the two row tiles of one
 * work unit (same group, same column tile) and each loads half of the weight tile with TMA
 * multicast into both; a stage is refilled only when the consumers of both CTAs released it
 * (each consumer arrives on the empty barrier of both CTAs). tm_wh is the half-tile map.
 * TB: the weight tile is MN-major (dgrad: y = x W_g, W_g [K_red = rows, N_out = columns]):
 * four TMA boxes [64 reduction rows][64 output columns], wgmma with B transposed. CM must be 1.
 * In the kernel, N is the output width and K the reduction length. */
template <int IS_F16, int EPI_TMA, int CM, int TB>
__global__ void __launch_bounds__(SM90_THREADS, 1)
    sm90_grouped_kernel(const __grid_constant__ CUtensorMap tm_x, const __grid_constant__ CUtensorMap tm_w,
                        const __grid_constant__ CUtensorMap tm_wh, const __grid_constant__ CUtensorMap tm_y,
                        uint16_t *__restrict__ y,
                            const int64_t *__restrict__ splits, int G, int64_t T, int N, int K, int band_w,
                            int *bad_flag, int bad_value) {
#if MOEX_SM90_DEVICE
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint16_t *sa = (uint16_t *)smem;                                /* [STAGES][BM][BK] */
    uint16_t *sb = sa + SM90_STAGES * SM90_A_ELEMS;                 /* [STAGES][BN][BK] */
    uint16_t *sc = sb + SM90_STAGES * SM90_B_ELEMS;                 /* [2][64][128]     */
    uint64_t *full = (uint64_t *)(sc + 2 * SM90_C_ELEMS);           /* TMA landed       */
    uint64_t *empty = full + SM90_STAGES;                           /* consumers done   */

    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    if (threadIdx.x == 0) {
        for (int s = 0; s < SM90_STAGES; s++) {
            sm90_mbar_init(&full[s], 1);
            sm90_mbar_init(&empty[s], 2 * CM);
        }
        sm90_mbar_init_fence();
    }
    if (CM > 1)
        sm90_cluster_sync();   /* the peer's barriers exist before anything multicasts into them */
    else
        __syncthreads();

    const int64_t nt = (N + SM90_BN - 1) / SM90_BN;
    const int nk = (K + SM90_BK - 1) / SM90_BK;
    const int rank = CM > 1 ? (int)sm90_cluster_rank() : 0;
    const int64_t unit0 = blockIdx.x / CM, units_step = gridDim.x / CM;

    if (wg == 0) {
        /* ---- producer ---- */
        sm90_setmaxnreg_dec<40>();
        if (tid == 0) {
            sm90_tma_prefetch_map(&tm_x);
            sm90_tma_prefetch_map(CM > 1 ? &tm_wh : &tm_w);
            sm90_cursor cur;
            sm90_cursor_start(&cur);
            uint32_t it = 0;
            for (int64_t t = unit0; sm90_cursor_seek(&cur, t, splits, G, T, nt, CM); t += units_step) {
                int64_t m0;
                int n0;
                sm90_tile_coords(&cur, t, band_w, CM, rank, &m0, &n0);
                for (int kb = 0; kb < nk; kb++, it++) {
                    const int s = it % SM90_STAGES;
                    sm90_mbar_wait(&empty[s], ((it / SM90_STAGES) & 1u) ^ 1u);
                    sm90_mbar_arrive_expect_tx(&full[s], SM90_STAGE_BYTES);
                    sm90_tma_load_2d(sa + s * SM90_A_ELEMS, &tm_x, &full[s], kb * SM90_BK, (int32_t)m0);
                    if (TB) {
#pragma unroll
                        for (int j = 0; j < SM90_BN / 64; j++)
                            sm90_tma_load_3d(sb + s * SM90_B_ELEMS + j * 64 * SM90_BK, &tm_w, &full[s], n0 + j * 64,
                                             kb * SM90_BK, cur.g);
                    } else if (CM > 1)
                        sm90_tma_load_3d_multicast(sb + s * SM90_B_ELEMS + rank * (SM90_BN / 2) * SM90_BK, &tm_wh,
                                                   &full[s], kb * SM90_BK, n0 + rank * (SM90_BN / 2), cur.g,
                                                   (uint16_t)((1u << CM) - 1u));
                    else
                        sm90_tma_load_3d(sb + s * SM90_B_ELEMS, &tm_w, &full[s], kb * SM90_BK, n0, cur.g);
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
        /* ---- consumers: warpgroup c computes rows [64 c, 64 c + 64) of each tile ---- */
        sm90_setmaxnreg_inc<232>();
        const int c = wg - 1;
        float acc[128];
#pragma unroll
        for (int i = 0; i < 128; i++) acc[i] = 0.0f;
        sm90_cursor cur;
        sm90_cursor_start(&cur);
        uint32_t it = 0;
        const int warp = tid / 32, lane = tid % 32;
        for (int64_t t = unit0; sm90_cursor_seek(&cur, t, splits, G, T, nt, CM); t += units_step) {
            int64_t m0;
            int n0;
            sm90_tile_coords(&cur, t, band_w, CM, rank, &m0, &n0);
            for (int kb = 0; kb < nk; kb++, it++) {
                const int s = it % SM90_STAGES;
                sm90_mbar_wait(&full[s], (it / SM90_STAGES) & 1u);
                const uint16_t *a = sa + s * SM90_A_ELEMS + c * 64 * SM90_BK;
                const uint16_t *b = sb + s * SM90_B_ELEMS;
                sm90_wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < SM90_BK / 16; kk++) {
                    const uint64_t da = sm90_desc_sw128(a + kk * 16);
                    const uint32_t keep = (kb | kk) != 0;
                    if (TB) {
                        /* 16 reduction rows of 128 bytes per k step; 64-column blocks 8 KB apart */
                        const uint64_t db = sm90_desc_mn_sw128(b + kk * 16 * 64, 64 * SM90_BK * 2, 1024);
                        if (IS_F16)
                            wgmma_m64n256k16_f16_tb(acc, da, db, keep);
                        else
                            wgmma_m64n256k16_bf16_tb(acc, da, db, keep);
                    } else {
                        const uint64_t db = sm90_desc_sw128(b + kk * 16);
                        if (IS_F16)
                            wgmma_m64n256k16_f16(acc, da, db, keep);
                        else
                            wgmma_m64n256k16_bf16(acc, da, db, keep);
                    }
                }
                sm90_wgmma_commit();
                if (kb > 0) {
                    /* the previous stage's wgmmas are done: hand it back to the producer */
                    sm90_wgmma_wait<1>();
                    if (tid < CM) sm90_release_stage<CM>(&empty[(it - 1) % SM90_STAGES], tid);
                }
            }
            sm90_wgmma_wait<0>();
            if (tid < CM) sm90_release_stage<CM>(&empty[(it - 1) % SM90_STAGES], tid);

            /* epilogue: thread holds rows ra, ra + 8 and column pairs j*8 + 2*(lane%4) */
            const int64_t ra = m0 + c * 64 + warp * 16 + lane / 4, rb = ra + 8;
            if (EPI_TMA && m0 + c * 64 + 64 <= cur.row1 && n0 + SM90_BN <= N) {
                uint8_t *stage = (uint8_t *)(sc + c * SM90_C_ELEMS);
                const int rl = warp * 16 + lane / 4;   /* local row of ra; rb is rl + 8 */
#pragma unroll
                for (int p = 0; p < 2; p++) {
                    if (tid == 0) sm90_bulk_wait_read<0>();   /* the last store has read `stage` */
                    sm90_named_barrier(1 + c, 128);
#pragma unroll
                    for (int jj = 0; jj < 16; jj++) {
                        const int j = p * 16 + jj, q = jj / 8, ch = jj % 8;
                        /* [q][64 rows][64 cols], 128-byte rows, 16-byte chunk ch ^ (row % 8) */
                        uint8_t *base = stage + q * 8192 + (lane % 4) * 4;
                        *(uint32_t *)(base + rl * 128 + ((ch ^ (rl & 7)) << 4)) =
                            sm90_io<IS_F16>::pack(acc[j * 4 + 0], acc[j * 4 + 1]);
                        *(uint32_t *)(base + (rl + 8) * 128 + ((ch ^ ((rl + 8) & 7)) << 4)) =
                            sm90_io<IS_F16>::pack(acc[j * 4 + 2], acc[j * 4 + 3]);
                    }
                    sm90_fence_proxy_async_smem();
                    sm90_named_barrier(1 + c, 128);
                    if (tid == 0) {
                        const int32_t row = (int32_t)(m0 + c * 64);
                        sm90_tma_store_2d(&tm_y, stage, n0 + p * 128, row);
                        sm90_tma_store_2d(&tm_y, stage + 8192, n0 + p * 128 + 64, row);
                        sm90_bulk_commit();
                    }
                }
            } else {
                const bool oka = ra < cur.row1, okb = rb < cur.row1;
                uint16_t *ya = y + ra * N, *yb = y + rb * N;
#pragma unroll
                for (int j = 0; j < 32; j++) {
                    const int col = n0 + j * 8 + (lane % 4) * 2;
                    if (col < N) {
                        if (oka) *(uint32_t *)(ya + col) = sm90_io<IS_F16>::pack(acc[j * 4 + 0], acc[j * 4 + 1]);
                        if (okb) *(uint32_t *)(yb + col) = sm90_io<IS_F16>::pack(acc[j * 4 + 2], acc[j * 4 + 3]);
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

extern "C" bool moex_sm90_supported(int device, const moex_sm90_gemm_args *a) {
    if (a == NULL) return false;
    if (a->dtype != MOEX_DTYPE_BF16 && a->dtype != MOEX_DTYPE_F16) return false;
    if (a->G < 1 || a->G > INT32_MAX || a->T < 0 || a->T > (int64_t)INT32_MAX - SM90_BM) return false;
    if (a->K < 8 || a->N < 8 || a->K % 8 != 0 || a->N % 8 != 0) return false;
    if (a->K > INT32_MAX / 2 || a->N > INT32_MAX / 2) return false;
    if (!sm90_aligned16(a->x) || !sm90_aligned16(a->w) || !sm90_aligned16(a->y)) return false;
    if (a->splits == NULL || ((uintptr_t)a->splits & 7u) != 0) return false;
    return sm90_device_ok(device, (const void *)sm90_grouped_kernel<0, 1, 1, 0>);
}

typedef void (*sm90_kernel_fn)(CUtensorMap, CUtensorMap, CUtensorMap, CUtensorMap, uint16_t *,
                               const int64_t *, int, int64_t, int, int, int, int *, int);

static sm90_kernel_fn sm90_pick(bool f16, bool epi_tma, int cm, bool dgrad) {
    if (dgrad) {
        if (f16) return epi_tma ? sm90_grouped_kernel<1, 1, 1, 1> : sm90_grouped_kernel<1, 0, 1, 1>;
        return epi_tma ? sm90_grouped_kernel<0, 1, 1, 1> : sm90_grouped_kernel<0, 0, 1, 1>;
    }
    if (cm > 1) {
        if (f16) return epi_tma ? sm90_grouped_kernel<1, 1, 2, 0> : sm90_grouped_kernel<1, 0, 2, 0>;
        return epi_tma ? sm90_grouped_kernel<0, 1, 2, 0> : sm90_grouped_kernel<0, 0, 2, 0>;
    }
    if (f16) return epi_tma ? sm90_grouped_kernel<1, 1, 1, 0> : sm90_grouped_kernel<1, 0, 1, 0>;
    return epi_tma ? sm90_grouped_kernel<0, 1, 1, 0> : sm90_grouped_kernel<0, 0, 1, 0>;
}

/* The forward (dgrad = 0: y = x W_g^T) or the data gradient (dgrad = 1: y = x W_g, x [T, N],
 * y [T, K]) as one launch of the kernel above. */
static moex_status sm90_run(const moex_sm90_gemm_args *a, int dgrad, moex_sm90_tuning *tune, moex_stream stream,
                            const char **why) {
    int device = 0;
    if (tune != NULL) tune->grid_used = 0;
    if (cudaGetDevice(&device) != cudaSuccess) SM90_FAIL(MOEX_ERR_CUDA, "cudaGetDevice failed");
    if (!moex_sm90_supported(device, a))
        SM90_FAIL(MOEX_ERR_UNSUPPORTED, "sm90 grouped GEMM: unsupported device, dtype, shape or alignment");
    if (a->T == 0) return MOEX_OK;
    const bool epi_tma = tune == NULL || tune->epilogue_tma;
    const int band = tune != NULL && tune->band > 0 ? tune->band : SM90_BAND;
    const int cm = !dgrad && tune != NULL && tune->cluster == 2 ? 2 : SM90_DEFAULT_CLUSTER;
    /* kernel view: out = in [T, red] times B_g (red x out_w) */
    const int64_t red = dgrad ? a->N : a->K, out_w = dgrad ? a->K : a->N;

    CUtensorMap tm_x, tm_w, tm_wh, tm_y;
    const cuuint64_t xdims[2] = {(cuuint64_t)red, (cuuint64_t)a->T};
    const cuuint32_t xbox[2] = {SM90_BK, SM90_BM};
    const cuuint64_t wdims[3] = {(cuuint64_t)a->K, (cuuint64_t)a->N, (cuuint64_t)a->G};
    const cuuint32_t wbox[3] = {SM90_BK, dgrad ? 64u : (cuuint32_t)SM90_BN, 1}, whbox[3] = {SM90_BK, SM90_BN / 2, 1};
    const cuuint64_t ydims[2] = {(cuuint64_t)out_w, (cuuint64_t)a->T};
    const cuuint32_t ybox[2] = {64, 64};
    if (!sm90_make_map(&tm_x, a->dtype, a->x, 2, xdims, xbox) ||
        !sm90_make_map(&tm_w, a->dtype, a->w, 3, wdims, wbox) ||
        !sm90_make_map(&tm_wh, a->dtype, a->w, 3, wdims, whbox) ||
        !sm90_make_map(&tm_y, a->dtype, a->y, 2, ydims, ybox))
        SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped GEMM: cuTensorMapEncodeTiled failed");

    const sm90_kernel_fn fn = sm90_pick(a->dtype == MOEX_DTYPE_F16, epi_tma, cm, dgrad != 0);
    if (cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SM90_SMEM_BYTES) !=
        cudaSuccess)
        SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped GEMM: cudaFuncSetAttribute failed");

    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cudaLaunchAttribute attr[1];
    cfg.blockDim = dim3(SM90_THREADS, 1, 1);
    cfg.dynamicSmemBytes = SM90_SMEM_BYTES;
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
        cfg.gridDim = dim3(2 * 66, 1, 1);
        if (cudaOccupancyMaxActiveClusters(&slots, (const void *)fn, &cfg) != cudaSuccess || slots < 1)
            SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped GEMM: cudaOccupancyMaxActiveClusters failed");
    } else if (cudaDeviceGetAttribute(&slots, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
        SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped GEMM: cudaDeviceGetAttribute failed");
    }
    if (tune != NULL && tune->grid > 0 && tune->grid / cm < slots) slots = tune->grid / cm;
    const int64_t nt = (out_w + SM90_BN - 1) / SM90_BN;
    const int64_t row_tiles = (a->T + SM90_BM - 1) / SM90_BM;
    const int64_t max_units = ((row_tiles + cm - 1) / cm + a->G) * nt;
    cfg.gridDim = dim3((unsigned)((max_units < slots ? max_units : slots) * cm), 1, 1);

    if (cudaLaunchKernelEx(&cfg, fn, tm_x, tm_w, tm_wh, tm_y, (uint16_t *)a->y, a->splits, (int)a->G,
                           a->T, (int)out_w, (int)red, band, a->bad_flag, a->bad_value) != cudaSuccess) {
        cudaGetLastError();
        SM90_FAIL(MOEX_ERR_CUDA, "sm90 grouped GEMM: kernel launch failed");
    }
    if (tune != NULL) tune->grid_used = (int)cfg.gridDim.x;
    return MOEX_OK;
}

extern "C" moex_status moex_sm90_grouped_gemm_fwd_tuned(const moex_sm90_gemm_args *a, moex_sm90_tuning *tune,
                                                        moex_stream stream, const char **why) {
    return sm90_run(a, 0, tune, stream, why);
}

extern "C" moex_status moex_sm90_grouped_gemm_dgrad_tuned(const moex_sm90_gemm_args *a, moex_sm90_tuning *tune,
                                                          moex_stream stream, const char **why) {
    return sm90_run(a, 1, tune, stream, why);
}

extern "C" moex_status moex_sm90_grouped_gemm_dgrad(const moex_sm90_gemm_args *a, moex_stream stream,
                                                    const char **why) {
    return sm90_run(a, 1, NULL, stream, why);
}

extern "C" moex_status moex_sm90_grouped_gemm_fwd(const moex_sm90_gemm_args *a, moex_stream stream,
                                                  const char **why) {
    return moex_sm90_grouped_gemm_fwd_tuned(a, NULL, stream, why);
}
