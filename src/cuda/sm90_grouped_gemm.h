/*
 * sm90_grouped_gemm.h - private: the Hopper (sm_90a) grouped GEMMs of the CUDA backend.
 *
 * M-grouped products, rows ordered by group: group g owns rows [off[g], off[g+1]) with
 * off = [0, s0, s0+s1, ...] clamped to T, and for every row r of group g
 *   forward: y[r, :] = x[r, :] W_g^T    x [T, K], W [G, N, K], y [T, N]
 *   dgrad:   y[r, :] = x[r, :] W_g      x = dy [T, N], W [G, N, K], y = dx [T, K]
 * ("=", f32 accumulate), all dense row-major, bf16 or f16 (one dtype for all). Rows of y at
 * or past off[G] are never written. Split values are read on the device only (graph-safe: a
 * captured launch replays correctly after the split values change).
 *
 * The kernel is persistent (one CTA per SM), warp-specialised (one TMA producer warpgroup,
 * two wgmma consumer warpgroups), with 128x256x64 (or, for small groups, 64x256x64) tiles
 * in a 4-stage mbarrier ring; full output blocks leave through shared memory and TMA
 * stores, blocks that reach past the group's end (or past the output width) through masked
 * stores, so tail tiles never write past their group. With a workspace, the last round of
 * tiles is shared out along k (stream-K), so that no SM idles while a few finish. The forward can fuse a bias, a
 * probs-scaled bias, or the grouped MLP's scaled GLU into its epilogue
 * (moex_sm90_grouped_gemm_fwd_epi).
 *
 * K-grouped weight gradient (same kernel family, its own kernel): for every group g
 *   wgrad:   dW_g = dy_g^T x_g      dy [T, N], x [T, K], dW [G, N, K]
 * where the sum runs over the group's rows [off[g], off[g+1]); written ("=", an empty group
 * gives zeros) in f32 or the input dtype, or accumulated ("+=", an empty group leaves dW_g
 * unchanged) into f32. Rows at or past off[G] never contribute (their values may be
 * anything, NaN included). Output tiles [128 rows of N, 256 columns of K] of every group,
 * each computed by one CTA in a fixed order (deterministic: each element gets one store, or
 * for "+=" one TMA reduce-add, from one CTA).
 */
#ifndef MOEX_SM90_GROUPED_GEMM_H
#define MOEX_SM90_GROUPED_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "moex.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moex_sm90_gemm_args {
    moex_dtype dtype;           /* MOEX_DTYPE_BF16 or MOEX_DTYPE_F16: x, w and y        */
    int64_t G, T, K, N;         /* G >= 1; K, N multiples of 8; T < 2^31 - 128           */
    const void *x;              /* [T, K] (dgrad: dy [T, N]) device, 16-byte aligned     */
    const void *w;              /* [G, N, K] device, 16-byte aligned                     */
    void *y;                    /* [T, N] (dgrad: dx [T, K]) device, 16-byte aligned;
                                   rows < off[G] written                                 */
    const int64_t *splits;      /* [G] device; negative values count as 0, the running
                                   sum is clamped to T                                   */
    int *bad_flag;              /* optional device int: set to bad_value (only if it is
                                   0) when a split is negative or the sum exceeds T      */
    int bad_value;
    void *workspace;            /* optional device scratch of moex_sm90_gemm_workspace_bytes
                                   bytes, 16-byte aligned, not shared with a launch that
                                   may run at the same time: the last round of tiles is
                                   split along k (stream-K, f32 partial sums through it);
                                   NULL: every tile whole                               */
} moex_sm90_gemm_args;

/* The workspace the forward and the dgrad can use on `device` (stream-K partial sums for
 * one tile per consumer warpgroup of every SM, and their flags); 0 when the device count
 * of SMs cannot be read. */
size_t moex_sm90_gemm_workspace_bytes(int device);

/* Whether the forward and the dgrad can run these args on `device`: compute capability
 * exactly 9.0 with the sm_90a kernel in the binary, dtype bf16/f16, the shape limits above,
 * and aligned pointers. Reads no device memory and never fails loudly. */
bool moex_sm90_supported(int device, const moex_sm90_gemm_args *a);

/* Launches the forward on `stream` (the current device must be the data's device).
 * No allocation, no synchronisation, no workspace. On failure returns a status and, when
 * `why` is not NULL, sets *why to a static message (MOEX_ERR_UNSUPPORTED: the args fail
 * moex_sm90_supported; MOEX_ERR_CUDA: a CUDA call failed). T == 0 launches nothing. */
moex_status moex_sm90_grouped_gemm_fwd(const moex_sm90_gemm_args *a, moex_stream stream, const char **why);

/* Knobs for benchmarks and tests (tune may be NULL: the defaults, as the untuned calls use):
 *   grid          CTAs (0: as many as can be resident);
 *   band          column tiles per band of the tile order (0: 8);
 *   epilogue_tma  1 (as with NULL): TMA stores for full blocks; 0: masked register stores
 *                 everywhere (the plain 128-row kernels without clusters only);
 *   cluster       0 (as with NULL): 2-CTA clusters sharing an operand through TMA multicast
 *                 for the plain 128-row forward and dgrad, none elsewhere; 1: none; 2:
 *                 clusters wherever the kernel has them (those two, the wgrad);
 *   tile_rows     0: the heuristic of moex_sm90_tile_rows; 64 or 128;
 *   grid_used     out: the CTAs launched (0 when nothing was launched);
 *   band_rows     input rows per block of a band of the tile order (0: 2048; forward and
 *                 dgrad);
 *   stream_k      0: stream-K for the forward's last round when a->workspace is given and
 *                 the shapes say it pays (groups of T / G rows leave a last round with at
 *                 least 40 k steps to save per CTA); 1: never; 2: whenever a last round
 *                 is left, forward and dgrad (tests);
 *   l2_promotion  of the tensor maps: 0: 256 bytes; 1: none; 64, 128 or 256 bytes (all
 *                 three products).
 * Same contract otherwise. */
typedef struct moex_sm90_tuning {
    int grid;
    int band;
    int epilogue_tma;
    int cluster;
    int grid_used;              /* out */
    int tile_rows;
    int band_rows;
    int stream_k;
    int l2_promotion;
} moex_sm90_tuning;

/* The rows per tile the kernels use by default: 64 when the groups average under one
 * 128-row tile (T < 128 G: a 128-row tile would be mostly rows of the next group), else
 * 128 (more reuse of each loaded weight tile). From the shapes only, never the split values. */
int moex_sm90_tile_rows(int64_t T, int64_t G, int64_t N, int64_t K);

moex_status moex_sm90_grouped_gemm_fwd_tuned(const moex_sm90_gemm_args *a, moex_sm90_tuning *tune,
                                             moex_stream stream, const char **why);

/* What the forward's epilogue adds (all fields zero / NULL: y = x W_g^T as above).
 *   bias_mode ADD:    y[r] = x[r] W_g^T + b_g          bias [G, N]
 *   bias_mode SCALED: y[r] = x[r] W_g^T + p_r b_g      p = probs [T]
 *   glu != NULL: the FC1 of the grouped MLP, N = 2F: y is h = x W_g^T (+ b_g), rounded to
 *   the input dtype, and z[r] = p_r glu(h[r]) [T, F] is written too (p = 1 without probs;
 *   the GLU reads h as stored; its halves laid out as glu->layout says).
 * bias: f32 or the input dtype, 16-byte aligned; z: the input dtype, 16-byte aligned,
 * F a multiple of 8 (INTERLEAVED_32: of 32). Rows at or past off[G] of y and z are never
 * written, and probs past them never read. */
typedef struct moex_sm90_epilogue {
    moex_bias_mode bias_mode;
    const void *bias;
    moex_dtype bias_dtype;
    const float *probs;
    const moex_glu_params *glu;
    void *z;
} moex_sm90_epilogue;

/* Whether moex_sm90_grouped_gemm_fwd_epi can run (a, e) on `device` (moex_sm90_supported
 * and the epilogue's conditions above). */
bool moex_sm90_epilogue_supported(int device, const moex_sm90_gemm_args *a, const moex_sm90_epilogue *e);

/* The forward with the epilogue e (NULL: none) and the knobs tune (NULL: defaults). */
moex_status moex_sm90_grouped_gemm_fwd_epi(const moex_sm90_gemm_args *a, const moex_sm90_epilogue *e,
                                           moex_sm90_tuning *tune, moex_stream stream, const char **why);

/* The data gradient dx = dy W_g (see the top of this file): a->x is dy [T, N], a->y is dx
 * [T, K], a->w is W [G, N, K]; K, N, splits, flag and the limits as for the forward. */
moex_status moex_sm90_grouped_gemm_dgrad(const moex_sm90_gemm_args *a, moex_stream stream, const char **why);
moex_status moex_sm90_grouped_gemm_dgrad_tuned(const moex_sm90_gemm_args *a, moex_sm90_tuning *tune,
                                               moex_stream stream, const char **why);

/* The weight gradient dW_g = dy_g^T x_g (see the top of this file). */
typedef struct moex_sm90_wgrad_args {
    moex_dtype dtype;           /* MOEX_DTYPE_BF16 or MOEX_DTYPE_F16: dy and x           */
    int64_t G, T, K, N;         /* G >= 1; K, N multiples of 8; T < 2^31 - 128           */
    const void *dy;             /* [T, N] device, 16-byte aligned                        */
    const void *x;              /* [T, K] device, 16-byte aligned                        */
    void *dw;                   /* [G, N, K] device, 16-byte aligned, dtype dw_dtype     */
    moex_dtype dw_dtype;        /* MOEX_DTYPE_F32, or `dtype` when not accumulating      */
    int accumulate;             /* 0: dW = (empty group: 0); 1: dW += (f32 only; empty
                                   group: unchanged)                                     */
    const int64_t *splits;      /* [G] device; negative values count as 0, the running
                                   sum is clamped to T                                   */
} moex_sm90_wgrad_args;

/* Whether the weight gradient can run these args on `device` (as moex_sm90_supported:
 * compute capability 9.0 with the sm_90a kernel in the binary, the dtypes and limits above,
 * aligned pointers). Reads no device memory and never fails loudly. */
bool moex_sm90_wgrad_supported(int device, const moex_sm90_wgrad_args *a);

/* Launches the weight gradient on `stream` (the current device must be the data's device).
 * No allocation, no synchronisation, no workspace; T == 0 writes zeros (=) or nothing (+=).
 * Errors as for moex_sm90_grouped_gemm_fwd. */
moex_status moex_sm90_grouped_gemm_wgrad(const moex_sm90_wgrad_args *a, moex_stream stream, const char **why);

/* The weight gradient with knobs (moex_sm90_tuning): grid (0: one CTA per SM, or per SM pair
 * with clusters), epilogue_tma (1, as with tune == NULL: output blocks inside [N, K] leave
 * through shared memory and TMA stores, "+=" through TMA reduce-adds; 0: masked register
 * stores everywhere), cluster (0 or 1: none; 2: CTA pairs on neighbouring N tiles share the
 * x tiles through TMA multicast), band (N tiles per band of the tile order; 0: 16).
 * grid_used as for the forward. */
moex_status moex_sm90_grouped_gemm_wgrad_tuned(const moex_sm90_wgrad_args *a, moex_sm90_tuning *tune,
                                               moex_stream stream, const char **why);

#ifdef __cplusplus
}
#endif

#endif /* MOEX_SM90_GROUPED_GEMM_H */
