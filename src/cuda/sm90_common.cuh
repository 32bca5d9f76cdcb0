/*
 * sm90_common.cuh - private: what both Hopper (sm_90a) grouped GEMM kernels and their host
 * sides share: the CTA shape (one TMA producer warpgroup and two wgmma consumer warpgroups,
 * 128x256x64 tiles, a 4-stage ring, the dynamic shared memory both kernels ask for), the
 * warpgroup index, the per-device context (struct moex_sm90_context, made once by
 * sm90_context.cu) and the host helpers of a launch (tensor maps, launch configuration,
 * errors). Included by sm90_grouped_gemm.cu, sm90_grouped_wgrad.cu and sm90_context.cu,
 * through sm90_scheduler.cuh, sm90_pipeline.cuh and sm90_epilogue.cuh.
 */
#ifndef MOEX_SM90_COMMON_CUH
#define MOEX_SM90_COMMON_CUH

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "sm90_grouped_gemm.h"
#include "sm90_heuristics.h"
#include "sm90_ptx_cp_async.cuh"
#include "sm90_ptx_mbarrier.cuh"
#include "sm90_ptx_sync.cuh"
#include "sm90_ptx_tma.cuh"
#include "sm90_ptx_wgmma.cuh"

#define SM90_BM MOEX_SM90_TILE_M    /* output rows per tile at most (2 consumers x 64) */
#define SM90_BN MOEX_SM90_TILE_N    /* output columns per tile                        */
#define SM90_BK MOEX_SM90_TILE_K    /* k per stage: one 128-byte swizzle row of bf16   */
#define SM90_STAGES 4
#define SM90_THREADS 384

/* The dynamic shared memory of a kernel with tiles of bm rows: 4 stages of (bm + 256) x 64
 * 16-bit elements (M-grouped: bm input rows and 256 weight rows by 64 k; K-grouped, bm = 128:
 * two dy and four x boxes of 64 x 64), 32 KB of output staging (2 consumers x two 8 KB
 * halves), the ring's barriers and the slack to align the start to 1024 bytes. */
#define SM90_SMEM_BYTES(bm) ((size_t)SM90_STAGES * ((bm) + SM90_BN) * SM90_BK * 2 + 4 * 8192 + 2 * SM90_STAGES * 8 + 1024)

#if MOEX_SM90_DEVICE
/* This thread's warpgroup (0: producer, 1 and 2: consumers), through a shuffle: the compiler
 * then knows it is warp-uniform and keeps the values derived from it (the consumers' wgmma
 * descriptors) in uniform registers. */
static __device__ __forceinline__ int sm90_warpgroup(void) {
    return __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0);
}

#endif /* MOEX_SM90_DEVICE */

/* ---- host side ---------------------------------------------------------------------- */

/* The per-device state every launch reads (sm90_grouped_gemm.h), made once. */
struct moex_sm90_context {
    int device;
    moex_sm90_device dev;                       /* the plans' device facts      */
    PFN_cuTensorMapEncodeTiled_v12000 encode;   /* the driver's map encoder     */
    PFN_cuGetErrorName_v6000 error_name;        /* the driver's CUresult names  */
};

/* Once per context (sm90_context.cu): each kernel file raises the dynamic shared-memory
 * limit of every instantiation it launches and counts its 2-CTA clusters that fit at once
 * into *slots (the fewest over its cluster instances). 0, or a CUDA error with *why set. */
cudaError_t sm90_rows_prepare(int sms, int *slots, const char **why);
cudaError_t sm90_wgrad_prepare(int sms, int *slots, const char **why);
cudaError_t sm90_fp8_prepare(int sms, int *slots, const char **why);
cudaError_t sm90_fp8_wgrad_prepare(int sms, int *slots, const char **why);
/* The attributes of one M-grouped kernel: its binaryVersion says whether this binary has the
 * sm_90a image (a JIT of the sm_80 PTX would compile the guarded kernel bodies out). */
cudaError_t sm90_rows_probe(cudaFuncAttributes *fa);

/* The per-group weight maps of a discrete weight (sm90_weight_maps.cu), written by one launch
 * on stream before the GEMMs that read them: planes of G maps, maps[j * G + g] being t->m[j]
 * (j < t->n) with its global address set to ptrs[g]; a pointer that is not 16-byte aligned is
 * aligned down (still inside its allocation, so the loads cannot fault) and sets *bad_flag to
 * bad_value (when bad_flag is not NULL and *bad_flag is 0). maps: 128-byte aligned device
 * memory. A GEMM call writes the two maps it reads into its scratch (planes w, wb); the kept
 * maps (moex_sm90_kept_maps_write) are one plane per box height of SM90_KEPT_ROWS, from
 * which each launch picks its two (sm90_kept_plane). */
#define SM90_WEIGHT_PLANES_MAX 3
typedef struct sm90_weight_templates {
    CUtensorMap m[SM90_WEIGHT_PLANES_MAX];
    int n;
} sm90_weight_templates;
cudaError_t sm90_weight_maps_write(const sm90_weight_templates *t, void *const *ptrs, int G, CUtensorMap *maps,
                                   int *bad_flag, int bad_value, cudaStream_t stream);
/* The box heights of the kept planes: the forward's w, a cluster's row-pair half (wb), and
 * 64 rows (the dgrad's w, wb without clusters). */
#define SM90_KEPT_PLANES 3
static const cuuint32_t SM90_KEPT_ROWS[SM90_KEPT_PLANES] = {SM90_BN, SM90_BN / 2, 64};
static inline int sm90_kept_plane(cuuint32_t rows) { return rows == SM90_BN ? 0 : rows == SM90_BN / 2 ? 1 : 2; }

/* The attribute (smem bytes of dynamic shared memory) and the cluster count of one kernel
 * (cm CTAs per cluster; with cm = 1 the slots are left alone). */
static inline cudaError_t sm90_prepare_kernel(const void *fn, size_t smem, int cm, int sms, int *slots,
                                              const char **why) {
    cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) {
        *why = "sm90: cudaFuncSetAttribute (dynamic shared memory) failed";
        return e;
    }
    if (cm < 2) return cudaSuccess;
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr[1];
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = dim3((unsigned)(sms / cm * cm), 1, 1);
    cfg.blockDim = dim3(SM90_THREADS, 1, 1);
    cfg.dynamicSmemBytes = smem;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)cm;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    int n = 0;
    e = cudaOccupancyMaxActiveClusters(&n, fn, &cfg);
    if (e == cudaSuccess && n < 1) e = cudaErrorInvalidConfiguration;
    if (e != cudaSuccess) {
        *why = "sm90: cudaOccupancyMaxActiveClusters failed";
        return e;
    }
    if (*slots == 0 || n < *slots) *slots = n;
    return cudaSuccess;
}

/* The launch configuration of `grid` CTAs of SM90_THREADS with smem bytes of dynamic shared
 * memory on `stream`; the cluster dimension attribute (cm CTAs) is set when cm > 1 or
 * cluster_attr (the M-grouped launches carry it always, cm = 1 included). attr outlives
 * cfg's use. */
static inline void sm90_launch_config(cudaLaunchConfig_t *cfg, cudaLaunchAttribute *attr, int grid, size_t smem,
                                      int cm, bool cluster_attr, moex_stream stream) {
    memset(cfg, 0, sizeof *cfg);
    cfg->gridDim = dim3((unsigned)grid, 1, 1);
    cfg->blockDim = dim3(SM90_THREADS, 1, 1);
    cfg->dynamicSmemBytes = smem;
    cfg->stream = (cudaStream_t)stream;
    if (cm > 1 || cluster_attr) {
        cfg->attrs = attr;
        cfg->numAttrs = 1;
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = (unsigned)cm;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
    }
}

static inline bool sm90_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* The tensor maps' L2 promotion for a plan's l2_promotion bytes (0: none). */
static inline CUtensorMapL2promotion sm90_l2_promotion(int bytes) {
    switch (bytes) {
    case 0: return CU_TENSOR_MAP_L2_PROMOTION_NONE;
    case 64: return CU_TENSOR_MAP_L2_PROMOTION_L2_64B;
    case 128: return CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
    default: return CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
    }
}

/* The message of a tensor map the driver refused (sm90_context.cu): "<kernel>: the tensor map
 * of <operand>: <reason>", in a buffer of the calling thread's, valid until its next failure. */
const char *sm90_map_failure(const moex_sm90_context *c, const char *kernel, const char *operand, CUresult r);

/* A 2-D or 3-D row-major bf16/f16/f32 or FP8 (as bytes) tensor map of `operand` through c's
 * encoder: dims innermost first, box as given (its inner extent at most 128 bytes), 128-byte
 * swizzle, zero fill outside the tensor, L2 promotion `promo`. False when the base is not
 * 16-byte aligned or the driver refuses the map; then *why (when why is not NULL: an optional
 * map) names the kernel, the operand and the driver's CUresult. */
static inline bool sm90_make_map(const moex_sm90_context *c, CUtensorMap *m, moex_dtype dt, const void *base,
                                 int rank, const cuuint64_t *dims, const cuuint32_t *box,
                                 CUtensorMapL2promotion promo, const char *kernel, const char *operand,
                                 const char **why) {
    CUresult r = CUDA_ERROR_MISALIGNED_ADDRESS;
    if (sm90_aligned16(base)) {
        const bool fp8 = dt == MOEX_DTYPE_E4M3 || dt == MOEX_DTYPE_E5M2;
        const cuuint64_t es = dt == MOEX_DTYPE_F32 ? 4 : fp8 ? 1 : 2;
        cuuint64_t strides[2];
        strides[0] = dims[0] * es;
        if (rank == 3) strides[1] = dims[0] * dims[1] * es;
        const cuuint32_t estr[3] = {1, 1, 1};
        r = c->encode(m, dt == MOEX_DTYPE_F32   ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                         : dt == MOEX_DTYPE_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                         : fp8                  ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                                : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                      (cuuint32_t)rank, (void *)base, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                      CU_TENSOR_MAP_SWIZZLE_128B, promo, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
        if (r == CUDA_SUCCESS) return true;
    }
    if (why != NULL) *why = sm90_map_failure(c, kernel, operand, r);
    return false;
}

/* The K-grouped kernels' map of dW [G, N, K] (f32, or bf16/f16) for their TMA stores and
 * reduce-adds: boxes of 64 rows by 128 bytes of one group. Optional: false, with no message,
 * where the encoder refuses it (a group over 2^40 bytes) or dw is not 16-byte aligned, and the
 * kernel then keeps its register epilogue. */
static inline bool sm90_make_dw_map(const moex_sm90_context *c, CUtensorMap *m, moex_dtype dt, void *dw, int64_t G,
                                    int64_t N, int64_t K, CUtensorMapL2promotion promo, const char *kernel) {
    const cuuint64_t dims[3] = {(cuuint64_t)K, (cuuint64_t)N, (cuuint64_t)G};
    const cuuint32_t box[3] = {dt == MOEX_DTYPE_F32 ? 32u : 64u, 64u, 1u};
    return sm90_make_map(c, m, dt, dw, 3, dims, box, promo, kernel, "dw", NULL);
}

/* A map of grouped weights [G, N, K] (dims innermost first: K, N, G; a discrete weight's
 * template G = 1, whose address the device sets per matrix): boxes of SM90_BK by `rows`, as
 * sm90_make_map (kernel names the kernel for *why). */
static inline bool sm90_make_weight_map(const moex_sm90_context *c, CUtensorMap *m, moex_dtype dt, const void *base,
                                        int64_t G, int64_t N, int64_t K, cuuint32_t rows,
                                        CUtensorMapL2promotion promo, const char *kernel, const char **why) {
    const cuuint64_t dims[3] = {(cuuint64_t)K, (cuuint64_t)N, (cuuint64_t)G};
    const cuuint32_t box[3] = {SM90_BK, rows, 1};
    return sm90_make_map(c, m, dt, base, 3, dims, box, promo, kernel, "w", why);
}

/* Whether the common shape limits hold: G in [1, 2^31), T in [0, 2^31 - 128), K and N
 * multiples of 8 in [8, 2^30] (sm90_features_ok), splits 8-byte aligned. */
static inline bool sm90_features_ok(int64_t K, int64_t N) {
    return K >= 8 && N >= 8 && K % 8 == 0 && N % 8 == 0 && K <= INT32_MAX / 2 && N <= INT32_MAX / 2;
}

static inline bool sm90_shape_ok(int64_t G, int64_t T, int64_t K, int64_t N, const int64_t *splits) {
    if (G < 1 || G > INT32_MAX || T < 0 || T > (int64_t)INT32_MAX - SM90_BM) return false;
    if (!sm90_features_ok(K, N)) return false;
    return splits != NULL && ((uintptr_t)splits & 7u) == 0;
}

/* The fields a weight-gradient kernel's params (kp: sm90_grouped_wgrad.cu's or
 * sm90_fp8_wgrad.cu's) take from its launch args (a) as they are: dW, the splits and the
 * shapes (G, N and K as int, which sm90_shape_ok bounds). */
template <class P, class A> static inline void sm90w_params_shape(P *kp, const A *a) {
    kp->dw = a->dw;
    kp->splits = a->splits;
    kp->G = (int)a->G;
    kp->N = (int)a->N;
    kp->K = (int)a->K;
    kp->T = a->T;
}

#define SM90_FAIL(st, msg)               \
    do {                                 \
        if (why != NULL) *why = (msg);   \
        return (st);                     \
    } while (0)

#endif /* MOEX_SM90_COMMON_CUH */
