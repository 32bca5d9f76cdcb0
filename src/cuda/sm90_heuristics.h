/*
 * sm90_heuristics.h - private: the Hopper grouped GEMMs' launch plan as a pure function of
 * the shapes: tile rows, clusters, the tile order's bands, whether the last round runs
 * stream-K, and the grid. Plain C (sm90_heuristics.c), no CUDA: the launches
 * (sm90_grouped_gemm.cu, sm90_grouped_wgrad.cu) call it with the device facts their context
 * found once, and tests/test_sm90_heuristics.c checks its rules on machines without a GPU.
 * Split values never enter a plan (they live on the device), only T, G, K, N: a launch
 * captured in a graph stays right for any routing. docs/hopper.md has the measurements
 * behind each rule.
 */
#ifndef MOEX_SM90_HEURISTICS_H
#define MOEX_SM90_HEURISTICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sm90_tuning.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __CUDACC__
#define MOEX_SM90_HD __host__ __device__
#else
#define MOEX_SM90_HD
#endif

/* The tile shape the kernels are built for (sm90_common.cuh's SM90_BM, SM90_BN, SM90_BK). */
#define MOEX_SM90_TILE_M 128            /* rows per tile at most (wgrad: dW rows, of N)      */
#define MOEX_SM90_TILE_N 256            /* output columns per tile (wgrad: dW columns, of K) */
#define MOEX_SM90_TILE_K 64             /* reduction per stage (wgrad: 64 group rows)        */

/* The tensor maps' L2 promotion in bytes where no tuning says otherwise (a discrete weight's
 * kept maps always have it). */
#define MOEX_SM90_L2_PROMOTION 256

/* The defaults of the tile order: column tiles per band and input rows per block of a band
 * (forward, dgrad), N tiles per band (wgrad). */
#define MOEX_SM90_BAND 8
#define MOEX_SM90_BAND_ROWS 2048
#define MOEX_SM90_WGRAD_BAND 16

/* Stream-K cuts the forward's last round along k only when that saves at least this many k
 * steps per worker (the partials' round trip through L2 costs a few; docs/hopper.md has the
 * configs measured on either side). */
#define MOEX_SM90_SK_MIN_STEPS 40

/* Stream-K: whether the last round of U units on P workers is worth cutting along k: at
 * least sk_min k steps (of nk per unit) saved per worker. The kernel asks the same again
 * with the launch's actual units. */
static inline MOEX_SM90_HD bool moex_sm90_sk_worth(int64_t U, int64_t P, int nk, int sk_min) {
    const int64_t r = U % P;
    return r != 0 && U > P && (P - r) * nk >= (int64_t)sk_min * P;
}

/* Work units of a group of mt row tiles and nt column tiles in clusters of cm CTAs: with
 * cm = 1 a unit is a tile; with cm = 2 a row pair for every whole pair of row tiles, then
 * for an odd last row tile column pairs (sm90_scheduler.cuh). */
static inline MOEX_SM90_HD int64_t moex_sm90_units(int64_t mt, int64_t nt, int cm) {
    return cm == 1 ? mt * nt : (mt / 2) * nt + (mt % 2) * ((nt + 1) / 2);
}

/* What a plan needs to know about the device (moex_sm90_context_create finds it once). */
typedef struct moex_sm90_device {
    int sms;                    /* multiprocessors                                        */
    int rows_cluster_slots;     /* 2-CTA clusters of the forward/dgrad kernels resident at
                                   once (the fewest over their cluster instances)        */
    int wgrad_cluster_slots;    /* the same for the wgrad kernels                         */
    int fp8_cluster_slots;      /* the same for the FP8 kernels (sm90_fp8_gemm.cu)        */
} moex_sm90_device;

typedef enum moex_sm90_product {
    MOEX_SM90_FORWARD = 0,
    MOEX_SM90_DGRAD = 1,
    MOEX_SM90_WGRAD = 2
} moex_sm90_product;

/* The epilogue kinds (the kernel's EPI template value): the forward's, and the dgrad's. */
enum {
    MOEX_SM90_EPI_PLAIN = 0,            /* y = x W^T (dgrad: dx = dy W)     */
    MOEX_SM90_EPI_BIAS = 1,             /* + b_g or + p_r b_g               */
    MOEX_SM90_EPI_GLU_CONTIG = 2,       /* FC1 + scaled GLU, CONTIGUOUS     */
    MOEX_SM90_EPI_GLU_INTERLEAVED = 3,  /* FC1 + scaled GLU, INTERLEAVED_32 */
    MOEX_SM90_EPI_DGLU_CONTIG = 4,      /* dgrad: FC2's dz into the GLU's backward, CONTIGUOUS */
    MOEX_SM90_EPI_DGLU_INTERLEAVED = 5  /* dgrad: the same, INTERLEAVED_32  */
};
/* The forward's GLU kinds (column tiles of 128 z columns) and the dgrad's. */
#define MOEX_SM90_EPI_IS_GLU(e) ((e) == MOEX_SM90_EPI_GLU_CONTIG || (e) == MOEX_SM90_EPI_GLU_INTERLEAVED)
#define MOEX_SM90_EPI_IS_DGLU(e) ((e) == MOEX_SM90_EPI_DGLU_CONTIG || (e) == MOEX_SM90_EPI_DGLU_INTERLEAVED)

typedef struct moex_sm90_shape {
    moex_sm90_product product;
    int epi;                    /* forward: PLAIN, BIAS or a GLU kind; dgrad: PLAIN or a
                                   DGLU kind; wgrad: PLAIN                               */
    int64_t G, T, K, N;         /* the product's G, T, K, N (sm90_grouped_gemm.h); T > 0  */
    bool workspace;             /* forward, dgrad: a stream-K workspace is given          */
} moex_sm90_shape;

typedef struct moex_sm90_plan {
    int tile_rows;              /* forward, dgrad: 128 or 64 rows per tile                */
    int cluster;                /* CTAs per cluster: 1 or 2                               */
    int epilogue_tma;           /* 1: full blocks through TMA stores; 0: masked stores     */
    int band;                   /* column units per band of the tile order (wgrad: N
                                   units of `cluster` tiles)                             */
    int band_rows;              /* forward, dgrad: row units per block of a band          */
    int grid;                   /* CTAs to launch: a whole number of clusters, >= 1       */
    bool stream_k;              /* forward, dgrad: the stream-K kernel, its flags cleared  */
    int sk_min;                 /* stream-K: the kernel's own threshold (k steps)         */
    int l2_promotion;           /* the tensor maps' L2 promotion in bytes (0: none)       */
} moex_sm90_plan;

/* The rows per tile of the forward and the dgrad: 64 when the groups average under one
 * 128-row tile (T < 128 G: a 128-row tile would be mostly rows of the next group), else 128
 * (more reuse of each loaded weight tile). */
int moex_sm90_tile_rows(int64_t T, int64_t G, int64_t N, int64_t K);

/* The plan for shape s on device d, with the knobs tune (NULL: the production plan; see
 * sm90_tuning.h for what each knob overrides). The rules:
 *   forward, dgrad: tile rows by moex_sm90_tile_rows; 2-CTA clusters for every 128-row
 *     product with the TMA epilogue (any epilogue kind); bands of MOEX_SM90_BAND column
 *     tiles in blocks of MOEX_SM90_BAND_ROWS input rows; the grid is the resident CTAs
 *     (clusters), at most one unit each for groups of T / G rows; stream-K when a workspace
 *     is given, for the plain or bias forward only, and only when groups of T / G rows would
 *     leave a last round that saves at least MOEX_SM90_SK_MIN_STEPS k steps per cluster;
 *   wgrad: no clusters, bands of MOEX_SM90_WGRAD_BAND N tiles, one CTA per SM at most one per
 *     output tile; never stream-K. */
void moex_sm90_plan_make(const moex_sm90_device *d, const moex_sm90_shape *s, const moex_sm90_tuning *tune,
                         moex_sm90_plan *p);

/* Stream-K's workspace: flags first (2 ints per SM, the region rounded up to 256 bytes),
 * then the f32 partials, one slot of MOEX_SM90_SK_SLOT_BYTES per consumer warpgroup of each
 * CTA (slot 2 b + c of CTA b's consumer c). */
#define MOEX_SM90_SK_SLOT_BYTES ((size_t)128 * 128 * 4)
size_t moex_sm90_sk_flag_bytes(const moex_sm90_device *d);
/* The workspace plan p uses: 0 without stream-K, else the flags and 2 slots per CTA of the
 * grid. */
size_t moex_sm90_plan_workspace_bytes(const moex_sm90_device *d, const moex_sm90_plan *p);
/* The most any plan on d uses (a grid of one CTA per SM). */
size_t moex_sm90_workspace_bytes_max(const moex_sm90_device *d);

#ifdef __cplusplus
}
#endif

#endif /* MOEX_SM90_HEURISTICS_H */
