/*
 * sm90_grouped_gemm.h - private: the Hopper (sm_90a) grouped GEMMs of the CUDA backend, the
 * production contract (cuda_sm90.cu calls it; tests and benchmarks add the knobs of
 * sm90_tuning.h; docs/hopper.md has the design and which file holds what).
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
 * stores, so tail tiles never write past their group. With a workspace, on the shapes where
 * the heuristic says it pays (sm90_heuristics.h), the last round of tiles is shared out along
 * k (stream-K), so that no SM idles while a few finish. The forward can fuse a bias, a
 * probs-scaled bias, or the grouped MLP's scaled GLU into its epilogue.
 *
 * K-grouped weight gradient (same kernel family, its own kernel): for every group g
 *   wgrad:   dW_g = dy_g^T x_g      dy [T, N], x [T, K], dW [G, N, K]
 * where the sum runs over the group's rows [off[g], off[g+1]); written ("=", an empty group
 * gives zeros) in f32 or the input dtype, or accumulated ("+=", an empty group leaves dW_g
 * unchanged) into f32. Rows at or past off[G] never contribute (their values may be
 * anything, NaN included). Output tiles [128 rows of N, 256 columns of K] of every group,
 * each computed by one CTA in a fixed order (deterministic: each element gets one store, or
 * for "+=" one TMA reduce-add, from one CTA).
 *
 * Every launch reads a moex_sm90_context: what the launches need to know about the device,
 * found once (kernel attributes set, resident clusters counted), so that a launch makes no
 * attribute call and no occupancy query. No launch allocates or synchronises.
 */
#ifndef MOEX_SM90_GROUPED_GEMM_H
#define MOEX_SM90_GROUPED_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moex.h"
#include "glu_math.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The per-device state of the Hopper GEMMs (opaque; the CUDA backend keeps one per moex
 * context in moex_cuda_state.sm90_ctx). */
typedef struct moex_sm90_context moex_sm90_context;

/* Makes the state for `device`: checks that it is a compute capability 9.0 GPU, that this
 * binary has the sm_90a kernels and that the driver gives the tensor-map encoder; raises the
 * dynamic shared-memory limit of every sm90 kernel instantiation on that device and counts
 * the 2-CTA clusters that fit at once. The calling thread's current device is unchanged
 * afterwards. MOEX_ERR_UNSUPPORTED (and *out = NULL): the device cannot run the kernels;
 * MOEX_ERR_CUDA: a CUDA call failed; *why (when not NULL) says which. */
moex_status moex_sm90_context_create(int device, moex_sm90_context **out, const char **why);
/* Frees c (NULL: nothing). Launches reading c must be done enqueuing (not executing). */
void moex_sm90_context_destroy(moex_sm90_context *c);

typedef struct moex_sm90_gemm_args {
    moex_dtype dtype;           /* MOEX_DTYPE_BF16 or MOEX_DTYPE_F16: x, w and y        */
    int64_t G, T, K, N;         /* G >= 1; K, N multiples of 8; T < 2^31 - 128           */
    const void *x;              /* [T, K] (dgrad: dy [T, N]) device, 16-byte aligned     */
    const void *w;              /* [G, N, K] device, 16-byte aligned (NULL with w_ptrs)  */
    void *y;                    /* [T, N] (dgrad: dx [T, K]) device, 16-byte aligned;
                                   rows < off[G] written                                 */
    const int64_t *splits;      /* [G] device; negative values count as 0, the running
                                   sum is clamped to T                                   */
    int *bad_flag;              /* optional device int: set to bad_value (only if it is
                                   0) when a split is negative or the sum exceeds T      */
    int bad_value;
    void *workspace;            /* optional device scratch of moex_sm90_gemm_workspace_bytes
                                   bytes, 16-byte aligned, not shared with a launch that
                                   may run at the same time: where the heuristic cuts the
                                   last round of tiles along k (stream-K), the f32 partial
                                   sums go through it; NULL: every tile whole            */
    /* Discrete weights (w NULL): G separate [N, K] matrices, each 16-byte aligned (one that
     * is not sets bad_flag to bad_align_value, and y is then not meaningful; nothing outside
     * the matrices is read). The kernel reads them through per-group tensor maps: w_maps_kept
     * when given, else written into w_maps on the device before it starts. */
    void *const *w_ptrs;        /* device array of G pointers, or NULL: w is packed      */
    void *w_maps;               /* with w_ptrs and no w_maps_kept:
                                   moex_sm90_weight_maps_bytes(G) bytes of device
                                   scratch, 128-byte aligned, used as workspace          */
    int bad_align_value;
    const void *w_maps_kept;    /* optional, with w_ptrs: moex_sm90_kept_maps_write's maps
                                   of this weight (then w_maps is not used)              */
} moex_sm90_gemm_args;

/* The w_maps bytes of a discrete weight of G matrices. */
size_t moex_sm90_weight_maps_bytes(int64_t G);

/* A discrete weight's kept maps: the bytes they need (0: the kernels do not read such a
 * weight: dtype not bf16 or f16, N or K outside sm90_features_ok, or c NULL), and their
 * write, one launch on stream from the device array ptrs into maps (128-byte aligned) as
 * the array is when it runs. A matrix not 16-byte aligned sets *bad_flag to bad_value (when
 * bad_flag is not NULL and *bad_flag is 0). MOEX_ERR_UNSUPPORTED where the bytes are 0 or
 * maps is misaligned, MOEX_ERR_CUDA where a map or the launch failed; *why says which. */
size_t moex_sm90_kept_maps_bytes(const moex_sm90_context *c, moex_dtype dtype, int64_t G, int64_t N, int64_t K);
moex_status moex_sm90_kept_maps_write(const moex_sm90_context *c, moex_dtype dtype, int64_t G, int64_t N, int64_t K,
                                      void *const *ptrs, void *maps, int *bad_flag, int bad_value,
                                      moex_stream stream, const char **why);

/* What the forward's epilogue adds (all fields zero / NULL: y = x W_g^T as above).
 *   bias_mode ADD:    y[r] = x[r] W_g^T + b_g          bias [G, N]
 *   bias_mode SCALED: y[r] = x[r] W_g^T + p_r b_g      p = probs [T]
 *   glu != NULL: the FC1 of the grouped MLP, N = 2F: y is h = x W_g^T (+ b_g), rounded to
 *   the input dtype, and z[r] = p_r glu(h[r]) [T, F] is written too (p = 1 without probs;
 *   the GLU reads h as stored; its halves laid out as glu->layout says).
 * bias: f32 or the input dtype, 16-byte aligned; z: the input dtype, 16-byte aligned,
 * F a multiple of 8 (INTERLEAVED_32: of 32). Rows at or past off[G] of y and z are never
 * written, and probs past them never read.
 * The dgrad's epilogue (dh != NULL; the dgrad only): the FC2 of the grouped MLP's backward
 * with the GLU's backward, F = K (dx is dz [T, F]): dz = dy W_g, rounded to the input dtype,
 * is not stored (a->y only names memory of [T, F] elements for the launch: it is not
 * written); the GLU's backward with glu and p = probs (1 without) reads h [T, 2F] and writes
 * dh = glu'(h) dz [T, 2F] (=), dh may be h itself; with dprobs_part, the GLU's dprobs term
 * sum_j dz_j act(a_j) g(b_j) of each row over each 128 dz columns is written to
 * dprobs_part [T, ceil(F / 128)] (f32, =); with z, z = p glu(h) [T, F] is written too,
 * bitwise as the forward's epilogue writes it. h, dh, z: the input dtype, 16-byte aligned;
 * F a multiple of 8 (INTERLEAVED_32: of 32); bias_mode NONE. Rows at or past off[G] of dh, z
 * and dprobs_part are never written nor those of h read. */
typedef struct moex_sm90_epilogue {
    moex_bias_mode bias_mode;
    const void *bias;
    moex_dtype bias_dtype;
    const float *probs;
    const moex_glu_params *glu;
    void *z;
    const void *h;
    void *dh;
    float *dprobs_part;
} moex_sm90_epilogue;

/* The stream-K workspace the forward of (a, e) will use on c's device (e NULL: no
 * epilogue): nonzero only for the shapes on which the heuristic cuts the last round along k;
 * a == NULL: the most that any launch on c's device uses. 0 when c is NULL. */
size_t moex_sm90_gemm_workspace_bytes(const moex_sm90_context *c, const moex_sm90_gemm_args *a,
                                      const moex_sm90_epilogue *e);

/* Whether the forward and the dgrad can run these args with c (NULL: false): the dtype, the
 * shape limits above and aligned pointers. Reads no device memory and calls no CUDA. */
bool moex_sm90_supported(const moex_sm90_context *c, const moex_sm90_gemm_args *a);
/* The same with the epilogue e (NULL: none; the forward's, or with e->dh the dgrad's): also
 * the epilogue's conditions. */
bool moex_sm90_epilogue_supported(const moex_sm90_context *c, const moex_sm90_gemm_args *a,
                                  const moex_sm90_epilogue *e);

/* Launch the forward y = x W_g^T with the epilogue e (NULL: none), or the data gradient
 * dx = dy W_g (a->x is dy [T, N], a->y is dx [T, K], a->w is W [G, N, K]) with its epilogue
 * e (NULL: none), on `stream` (the current device must be c's). No allocation, no synchronisation. On failure returns a status
 * and, when `why` is not NULL, sets *why to a static message (MOEX_ERR_UNSUPPORTED: the
 * args fail moex_sm90_epilogue_supported; MOEX_ERR_CUDA: a CUDA call failed). T == 0
 * launches nothing. */
moex_status moex_sm90_grouped_gemm_fwd(const moex_sm90_context *c, const moex_sm90_gemm_args *a,
                                       const moex_sm90_epilogue *e, moex_stream stream, const char **why);
moex_status moex_sm90_grouped_gemm_dgrad(const moex_sm90_context *c, const moex_sm90_gemm_args *a,
                                         const moex_sm90_epilogue *e, moex_stream stream, const char **why);

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
    int *bad_flag;              /* optional, as in moex_sm90_gemm_args                   */
    int bad_value;
} moex_sm90_wgrad_args;

/* Whether the weight gradient can run these args with c (NULL: false): the dtypes and
 * limits above, aligned pointers. Reads no device memory and calls no CUDA. */
bool moex_sm90_wgrad_supported(const moex_sm90_context *c, const moex_sm90_wgrad_args *a);

/* Launches the weight gradient on `stream` (the current device must be c's). No
 * allocation, no synchronisation, no workspace; T == 0 writes zeros (=) or nothing (+=).
 * Errors as for moex_sm90_grouped_gemm_fwd. */
moex_status moex_sm90_grouped_gemm_wgrad(const moex_sm90_context *c, const moex_sm90_wgrad_args *a,
                                         moex_stream stream, const char **why);

/* M-grouped FP8 forward (sm90_fp8_gemm.cu): for the rows r of group g
 *   y[r, :] = x[r, :] W_g^T     x [T, K], W [G, N, K] FP8 (dequantized values), y [T, N]
 * scaled as moex_group_quantize / moex_weight_quantize scale them: current scaling (x_scales
 * [1], or [G] with x_scale_per_group; w_scales [G]) or BLOCK (block != 0: x_scales [T,
 * ceil(K/128)], w_scales [G, ceil(N/128), ceil(K/128)]); f32 sums of the FP8 products moved
 * out of the tensor cores every 128 k, plus an optional bias (or probs-scaled bias) of the
 * group, y bf16 or f16 ("=", rows at or past off[G] never written). x and W E4M3 or E5M2 each, both K-major (the backward data passes dy and the
 * weights' columnwise copy).
 * With glu (FC1 of the grouped MLP, E4M3 operands): y is h [T, 2F] (N = 2F, bias: b1, ADD),
 * and z = p glu(h) [T, F] of the rounded h is written too, p = glu_probs[r] (1 when NULL);
 * glu 1: contiguous halves, 2: interleaved_32 (docs/ops.md 4). */
typedef struct moex_sm90_fp8_args {
    moex_dtype x_fmt, w_fmt, y_dtype;
    int64_t G, T, K, N;
    const void *x, *w;
    void *y;
    const int64_t *splits;      /* [G] device                                            */
    int block;                  /* BLOCK scales (else current scaling)                   */
    const float *x_scales;      /* device, as above                                      */
    int x_scale_per_group;
    const float *w_scales;      /* device, as above                                      */
    const void *bias;           /* [G, N] f32 or y's dtype, or NULL: y += b_g (+= p_r b_g) */
    int bias_f32, bias_scaled;
    const float *probs;         /* [T] f32: bias_scaled                                  */
    int *bad_flag;              /* optional, as in moex_sm90_gemm_args                   */
    int bad_value;
    int glu;                    /* 0; 1 contiguous, 2 interleaved_32: FC1 + scaled GLU   */
    void *z;                    /* glu: [T, F] in y's dtype                              */
    int64_t F;                  /* glu: N / 2, a multiple of 8 (of 64 with BLOCK and 1)  */
    moex_glu_consts glu_consts;
    const float *glu_probs;     /* glu: [T] f32 or NULL                                  */
} moex_sm90_fp8_args;

/* Whether the FP8 forward can run these args with c (NULL: false): formats, y bf16 or f16,
 * K a multiple of 16 and N of 8 (>= 16 / 8), the M-grouped limits, x, w, y 16-byte aligned,
 * splits 8-byte aligned. Reads no device memory and calls no CUDA. */
bool moex_sm90_fp8_supported(const moex_sm90_context *c, const moex_sm90_fp8_args *a);

/* Launches the FP8 forward on `stream`. No allocation, no synchronisation, no workspace.
 * Errors as for moex_sm90_grouped_gemm_fwd. */
moex_status moex_sm90_fp8_gemm(const moex_sm90_context *c, const moex_sm90_fp8_args *a, moex_stream stream,
                               const char **why);

/* K-grouped FP8 weight gradient (sm90_fp8_wgrad.cu): for each group g of rows [o_g, o_g+1)
 *   dW_g (=|+=) dy_g^T x_g      dy: columnwise copy [N, T], x: columnwise copy [K, T], FP8
 *                                (dequantized values), dW [G, N, K] f32
 * scaled as moex_group_quantize scales columnwise copies: current scaling (dy_scales,
 * x_scales [1], or [G] with *_scale_per_group) or BLOCK (block != 0: dy_scales [N, ld],
 * x_scales [K, ld], ld = ceil(T/128) + G, group g's 1x128 blocks from its first row); f32
 * sums of the FP8 products moved out of the tensor cores every 128 rows. A group with no rows
 * writes zeros (accumulate: leaves dW_g alone). dy and x E4M3 or E5M2 each. */
typedef struct moex_sm90_fp8_wgrad_args {
    moex_dtype dy_fmt, x_fmt;
    int64_t G, T, K, N;
    const void *dy, *x;
    void *dw;                   /* [G, N, K] of dw_dtype                                 */
    moex_dtype dw_dtype;        /* F32 (= or +=), or BF16 / F16 (=: the f32 sums rounded once) */
    int accumulate;
    const int64_t *splits;      /* [G] device                                            */
    int block;                  /* BLOCK scales (else current scaling)                   */
    const float *dy_scales;     /* device, as above                                      */
    int dy_scale_per_group;
    const float *x_scales;      /* device, as above                                      */
    int x_scale_per_group;
    int *bad_flag;              /* optional, as in moex_sm90_gemm_args                   */
    int bad_value;
} moex_sm90_fp8_wgrad_args;

/* Whether the FP8 weight gradient can run these args with c (NULL: false): formats, K and N
 * multiples of 8 (>= 8), T a multiple of 16 (the copies' row stride), the common limits,
 * dy, x, dw 16-byte aligned. Reads no device memory and calls no CUDA. */
bool moex_sm90_fp8_wgrad_supported(const moex_sm90_context *c, const moex_sm90_fp8_wgrad_args *a);

/* Launches the FP8 weight gradient on `stream`. No allocation, no synchronisation, no
 * workspace; T == 0 writes zeros (=) or nothing (+=). Errors as for moex_sm90_grouped_gemm_fwd. */
moex_status moex_sm90_fp8_wgrad(const moex_sm90_context *c, const moex_sm90_fp8_wgrad_args *a, moex_stream stream,
                                const char **why);

#ifdef __cplusplus
}
#endif

#endif /* MOEX_SM90_GROUPED_GEMM_H */
