/*
 * cuda_ops.h - private: the CUDA backend's primitives (src/core/backend.h; one file per
 * kernel idea) and the building blocks they share: the device-side group schedule, the
 * grouped GEMM, the deterministic reductions.
 *
 * Rules every file here keeps (docs/conventions.md):
 *   - split values are read on the device only; the schedule kernel (cuda_splits.cu) turns
 *     splits into clamped row offsets and tile offsets in the workspace, and later kernels
 *     read those; nothing ever writes outside the T rows whatever the splits say;
 *   - no allocation and no synchronisation inside an operation: all scratch is carved from
 *     the caller's workspace, whose size depends on shapes only;
 *   - no floating-point atomics: reductions go through per-tile partials and a fixed-order
 *     second pass, so results are bitwise reproducible.
 */
#ifndef MOEX_CUDA_OPS_H
#define MOEX_CUDA_OPS_H

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend.h"
#include "cuda_check.h"
#include "cuda_sched_state.h"

/* ---- backend state ----------------------------------------------------------------- */

/* What the flag recorded: flag = (op_id << 4) | kind, 0 when nothing was seen; op_id is
 * the moex_op_id of the call (src/core/op_list.h). */
enum moex_cuda_flag_kind {
    MOEX_CUDA_BAD_SPLITS = 1,   /* a negative split, or a sum past T          */
    MOEX_CUDA_BAD_IDS = 2,      /* a routing id outside [0, E) (skipped)        */
    MOEX_CUDA_EP_DROPPED = 3,   /* expert rows past R dropped (an EP dispatch)  */
    MOEX_CUDA_BAD_ALIGN = 4     /* a discrete weight's matrix not 16-byte aligned
                                   where the Hopper kernels read it             */
};

typedef struct moex_cuda_state {
    int *flag;                  /* device int, zero when clean; allocated once  */
    CUresult (*ctx_get_current)(CUcontext *);   /* the driver's cuCtxGetCurrent (entering) */
    int num_sms;
    int sm90;                   /* 1: the Hopper GEMMs (sm90_grouped_gemm.h) may run: a
                                   cc 9.0 device and MOEX_CUDA_GEMM != "portable"      */
    struct moex_sm90_context *sm90_ctx;   /* the Hopper GEMMs' per-context state, owned by
                                   cuda_sm90.cu (NULL: none)                           */
    /* The current call's deferred schedule launch (cuda_sched_state.h; cuda_splits.cu). */
    moex_sched_state sched;
} moex_cuda_state;

static inline moex_cuda_state *moex_cuda_st(moex_context *ctx) {
    return (moex_cuda_state *)ctx->backend_state;
}

/* Entering a call on any thread (cuda_backend.cu): makes ctx->device's context current on the
 * calling thread before any driver or runtime call of the call. A thread with no current
 * context (new, or whose first CUDA work this is) gets the device's primary context bound,
 * and keeps it; a thread on another device is switched, and moex_cuda_device_leave switches it
 * back to *prev. */
moex_status moex_cuda_device_enter(moex_context *ctx, const char *op, int *prev);
void moex_cuda_device_leave(moex_context *ctx, int prev);

/* ---- the group schedule (cuda_splits.cu): the prepared groups of backend.h -----------
 * off[G+1] (int64): clamped row offsets, off[0] = 0, off[g+1] = min(off[g] + max(s_g, 0), T)
 * (the rule of splits_rule.h). tiles[G+1] (int32): tiles[g] = sum over groups before g of
 * ceil(rows / MOEX_CUDA_BM). A grid of moex_cuda_max_tiles(T, G) row tiles covers every
 * schedule. The schedule kernel launches lazily (the state machine of cuda_sched_state.h):
 * groups_prepare records it, and a kernel that reads off or tiles must first call
 * moex_cuda_sched_ready. The Hopper GEMMs read the splits themselves and flag bad ones
 * (moex_cuda_bad_splits_flag), so a call made only of them launches no schedule; one that
 * launched neither gets it at its end (moex_cuda_sched_finish), which checks its splits. */

#define MOEX_CUDA_BM 128        /* row tile of the GEMMs and the row reductions */

typedef moex_groups moex_cuda_sched;

/* Launches s's schedule kernel if it is still pending (s: the call's prepared groups). */
moex_status moex_cuda_sched_ready(moex_context *ctx, const char *op, const moex_cuda_sched *s);
/* For a Hopper GEMM launched on s's splits: the flag and the value it sets for bad splits
 * (*value); records that the call's splits are checked. */
int *moex_cuda_bad_splits_flag(moex_context *ctx, const moex_cuda_sched *s, int *value);
/* At the end of a call (st: its status so far): launches a pending schedule whose splits no
 * Hopper GEMM checked, and forgets it. */
moex_status moex_cuda_sched_finish(moex_context *ctx, moex_status st);

static inline int64_t moex_cuda_max_tiles(int64_t T, int64_t G) {
    return (T + MOEX_CUDA_BM - 1) / MOEX_CUDA_BM + G;
}

/* The grid limits of the grouped kernels: ceil(T / MOEX_CUDA_BM) + G row tiles and G groups,
 * each at most 65535. */
#define MOEX_CUDA_MAX_GRID 65535

/* The most experts the permute kernel counts in shared memory (48 KiB of int32). */
#define MOEX_CUDA_MAX_EXPERTS 12288

/* ---- the grouped GEMM (sm80_grouped_gemm.cu) --------------------------------------- */

typedef enum moex_cuda_gemm_kind {
    /* C rows follow the group rows: for each group g and its rows r in [off[g], off[g+1]),
     *   C[r, n] = sum_k A[r, k] * B_g(n, k), A row-major [T, k_dim] (ld lda),
     *   B_g(n, k) = b_kc ? B_g[n * ldb + k] : B_g[k * ldb + n].                         */
    MOEX_CUDA_GEMM_ROWS = 0,
    /* One output matrix per group, reduced over the group's rows:
     *   C_g[m, n] = sum_{r in group g} A[r, m] * B[r, n],  A [T, m_dim] (lda), B [T, n_dim] (ldb). */
    MOEX_CUDA_GEMM_WGRAD = 1
} moex_cuda_gemm_kind;

/* The portable GEMM's output tile: MOEX_CUDA_GEMM_TILE x MOEX_CUDA_GEMM_TILE (sm80_grouped_gemm.cu). */
#define MOEX_CUDA_GEMM_TILE 128

typedef struct moex_cuda_gemm {
    moex_cuda_gemm_kind kind;
    const moex_cuda_sched *sched;
    moex_dtype ta, tb, tc;      /* operand dtypes and the compute dtype (tc = f32: exact SIMT) */
    moex_dtype to;              /* output dtype */
    int64_t m_dim;              /* WGRAD: rows of each C_g */
    int64_t n_dim;              /* columns of C */
    int64_t k_dim;              /* ROWS: the reduction length */
    const void *a;
    int64_t lda;
    const void *b;              /* packed: B_0, group g at b + g * b_gstride elements */
    void *const *b_ptrs;        /* discrete: device array of G pointers (b unused)     */
    int64_t b_gstride, ldb;
    int b_kc;                   /* ROWS: B_g indexed (n, k) as n * ldb + k              */
    void *c;
    void *const *c_ptrs;        /* WGRAD discrete output */
    int64_t c_gstride, ldc;
    /* epilogue: out = acc (+ bias_g[n] | + p_r bias_g[n]) (+ residual[r, n]); ROWS only
     * for bias/residual. accumulate: f32 out += acc (empty groups untouched).            */
    int accumulate;
    const void *bias;
    moex_dtype bias_dt;
    int64_t bias_gstride;
    int bias_scaled;
    const float *probs;
    const float *residual;
    int64_t ldr;
    /* split-K (ROWS, or WGRAD of one group): ksplit > 1 CTAs share each output tile, each
     * reducing over one of ksplit equal runs of k tiles into its own f32 slice of part
     * [ksplit, rows, n_dim] (rows: T for ROWS, m_dim for WGRAD; moex_cuda_gemm_part_bytes),
     * which a second launch sums in slice order into C with the epilogue above. */
    int ksplit;
    float *part;
} moex_cuda_gemm;

/* The bytes of part for a split-K GEMM of `rows` x n_dim outputs (0: ksplit <= 1). */
size_t moex_cuda_gemm_part_bytes(int ksplit, int64_t rows, int64_t n_dim);

/* C[M, N] = round(R[M, N] + A[M, K] B[K, N]) for K <= MOEX_CUDA_SHORT_K and M <=
 * MOEX_CUDA_SHORT_K_ROWS (cuda_dense_short_k.cu): A f32 (rounded to dt on the way in), B and C
 * of dtype dt, R f32, all packed. */
#define MOEX_CUDA_SHORT_K 256
#define MOEX_CUDA_SHORT_K_ROWS ((int64_t)65535 * 64)
moex_status moex_cuda_dense_short_k(moex_context *ctx, const char *op, const float *A, const void *B,
                                    moex_dtype dt, const float *R, void *C, int64_t M, int64_t N, int64_t K,
                                    cudaStream_t stream);

moex_status moex_cuda_gemm_run(moex_context *ctx, const char *op, const moex_cuda_gemm *p,
                               cudaStream_t stream);
/* Once per context (device): kernel attributes the GEMM launches rely on. */
moex_status moex_cuda_gemm_prepare(moex_context *ctx);

/* ---- the Hopper grouped GEMMs' glue (cuda_sm90.cu) ---------------------------------- */

struct moex_sm90_epilogue;

/* Runs y = x W_g^T with the epilogue e (NULL: none; dgrad: dx = dy W_g, e NULL) on the
 * Hopper kernel when the context allows it and the kernel supports the arguments (device
 * splits; packed weights, or discrete ones with their kept maps, w->maps, or w_maps from
 * moex_cuda_weight_maps_take);
 * *ran says whether it did (false: nothing launched). */
moex_status moex_cuda_sm90_rows(moex_context *ctx, const char *op, const moex_cuda_sched *s, moex_dtype dt,
                                int64_t K, int64_t N, const void *x, const moex_weight *w, void *w_maps, void *y,
                                const struct moex_sm90_epilogue *e, bool dgrad, cudaStream_t stream, bool *ran);
/* dW_g = dy_g^T x_g (= or +=) on the Hopper kernel under the same conditions; *ran as above. */
moex_status moex_cuda_sm90_wgrad(moex_context *ctx, const char *op, const moex_cuda_sched *s, moex_dtype dt,
                                 int64_t K, int64_t N, const void *x, const void *dy, const moex_weight *dw,
                                 moex_grad_mode mode, cudaStream_t stream, bool *ran);
/* Takes from c the scratch the Hopper kernel uses for the grouped linear forward `fwd` (its
 * stream-K partial sums, on the shapes where its plan cuts the last round along k), else
 * nothing (NULL). From shapes, dtypes and options only. */
void *moex_cuda_gemm_ws_take(moex_context *ctx, moex_carver *c, const moex_grouped_linear_args *fwd);
/* Takes from c the scratch in which the Hopper kernel keeps the tensor maps of the discrete
 * weight w (G matrices), or nothing (NULL) for a packed one, one whose maps the caller keeps
 * (w->maps), or without the Hopper kernels. */
void *moex_cuda_weight_maps_take(moex_context *ctx, moex_carver *c, const moex_weight *w);
/* The weight_maps_write primitives (backend.h): the Hopper kernels' kept maps. */
moex_weight_maps_size_fn moex_cuda_weight_maps_size;
moex_weight_maps_write_fn moex_cuda_weight_maps_write;
/* Once per context, after st->sm90 is set: the Hopper GEMMs' per-context state
 * (st->sm90_ctx); release frees it (accepts none). */
moex_status moex_cuda_sm90_prepare(moex_context *ctx);
void moex_cuda_sm90_release(moex_context *ctx);

/* ---- grouped linear building blocks (cuda_grouped_linear.cu), on a built schedule ---- */

/* y = x W_g^T (+ b_g | + p b_g); x [T, K], w [G, N, K] (w_maps: moex_cuda_weight_maps_take's),
 * y [T, N]. */
moex_status moex_cuda_linear_fwd_run(moex_context *ctx, const char *op, const moex_cuda_sched *s, moex_dtype dt,
                                 int64_t K, int64_t N, const void *x, const moex_weight *w, void *w_maps,
                                 moex_bias_mode bias_mode, const moex_tensor *bias, const float *probs, void *y,
                                 cudaStream_t stream);
/* The FC1 of the grouped MLP with the scaled GLU fused into one Hopper launch: h = x W_g^T
 * (+ b_g) [T, 2F] and z = p glu(h) [T, F] (p = probs, or 1 when NULL). *ran = false (and
 * nothing launched) when the Hopper kernel cannot run it: the caller then runs the product
 * and the GLU separately. */
moex_status moex_cuda_linear_fwd_glu(moex_context *ctx, const char *op, const moex_cuda_sched *s, moex_dtype dt,
                                     int64_t K, int64_t F, const void *x, const moex_weight *w, const moex_tensor *bias,
                                     const moex_glu_params *glu, const float *probs, void *h, void *z,
                                     cudaStream_t stream, bool *ran);
typedef struct moex_cuda_row_grads moex_cuda_row_grads;   /* below */
/* dx = dy W_g (dx != NULL; w_maps as above), then the bias gradients r of dy
 * (moex_cuda_row_grads_run). */
moex_status moex_cuda_linear_dgrad_run(moex_context *ctx, const char *op, const moex_cuda_sched *s, moex_dtype dt,
                                       int64_t K, int64_t N, const void *dy, const moex_weight *w, void *w_maps,
                                       void *dx,
                                       const moex_cuda_row_grads *r, cudaStream_t stream);
/* dW_g = dy_g^T x_g, written (f32 or dt) or accumulated (f32). */
moex_status moex_cuda_linear_wgrad_run(moex_context *ctx, const char *op, const moex_cuda_sched *s, moex_dtype dt,
                                   int64_t K, int64_t N, const void *x, const void *dy, const moex_weight *dw,
                                   moex_grad_mode mode, cudaStream_t stream);

/* ---- deterministic reductions (cuda_reduce.cu) ------------------------------------- */

/* The bias gradients of src = dy [T, N] over the groups' rows, in one pass over src:
 *   dbias[g, n] = sum over the rows r of group g of (p_r *) src[r, n] (summed in f32, stored
 *                 in dbias_dt, "="; dbias != NULL; p = probs, or 1 when NULL);
 *   for every row r < off[G] (g its group), when dprobs != NULL:
 *                 dprobs[r] += sum_n src[r, n] * bias_g[n] (bias != NULL), then
 *                 dprobs[r] += sum_s part[r, s] over s < part_ld, in order (part != NULL).
 * partial and dots: workspace from moex_cuda_row_grads_take (with dbias asked; with the
 * bias term asked). */
struct moex_cuda_row_grads {
    const void *src;
    moex_dtype dt;
    int64_t N;
    const float *probs;
    void *dbias;
    moex_dtype dbias_dt;
    const void *bias;
    moex_dtype bias_dt;
    const float *part;
    int64_t part_ld;
    float *dprobs;
    float *partial, *dots;      /* workspace */
};
size_t moex_cuda_colsum_partial_bytes(int64_t T, int64_t G, int64_t N);
/* Takes the workspace of a for T rows in G groups from c (base NULL: only counts it). */
void moex_cuda_row_grads_take(moex_carver *c, int64_t T, int64_t G, int64_t N, bool dbias, bool dots,
                              moex_cuda_row_grads *a);
moex_status moex_cuda_row_grads_run(moex_context *ctx, const char *op, const moex_cuda_sched *s,
                                    const moex_cuda_row_grads *a, cudaStream_t stream);
/* Pass 2 alone: dbias[g, n] = the sum of partial[t, n] over group g's row tiles t (tiles[]:
 * the handle's 128-row tile offsets), in tile order. */
moex_status moex_cuda_colsum_reduce(moex_context *ctx, const char *op, const int32_t *tiles, int64_t G,
                                    const float *partial, int64_t N, float *dbias, cudaStream_t stream);

/* ---- scaled GLU launchers (cuda_glu.cu), used by the GLU ops and the grouped MLP ----- */

/* z[r] = p_r * glu(h[r]) for rows r < *total_rows (a device int64; NULL: all T rows). */
moex_status moex_cuda_glu_fwd_run(moex_context *ctx, const char *op, const moex_glu_params *glu,
                              const int64_t *total_rows, int64_t T, int64_t F, moex_dtype dt,
                              const void *h, const float *probs, void *z, cudaStream_t stream);
/* dh = glu'(h) dz (dh != NULL); dprobs[r] += sum_j dz act g (dprobs != NULL); same rows. */
moex_status moex_cuda_glu_bwd_run(moex_context *ctx, const char *op, const moex_glu_params *glu,
                              const int64_t *total_rows, int64_t T, int64_t F, moex_dtype dt,
                              const void *h, const float *probs, const void *dz, void *dh,
                              float *dprobs, cudaStream_t stream);

/* ---- routing launchers (cuda_routing.cu), used by the routing ops and the MoE layer -- */

size_t moex_cuda_permute_ws(int64_t T, int64_t k, int64_t E);
moex_status moex_cuda_permute_run(moex_context *ctx, const char *op, int op_id, const void *x,
                                  moex_dtype dt, const int32_t *ids, const float *probs,
                                  int64_t T, int64_t H, int64_t k, int64_t E, void *xp,
                                  float *probs_p, int64_t *splits, int32_t *row_map, void *ws,
                                  cudaStream_t stream);
/* dx[t] = sum_j dxp[row_map[t*k+j]] (out dtype dx_dt: dt or f32);
 * dprobs[t*k+j] = dprobs_p[row_map[t*k+j]] when both are given. */
moex_status moex_cuda_permute_bwd_run(moex_context *ctx, const char *op, const int32_t *row_map,
                                      const void *dxp, moex_dtype dt, const float *dprobs_p,
                                      int64_t T, int64_t H, int64_t k, void *dx, moex_dtype dx_dt,
                                      float *dprobs, cudaStream_t stream);
moex_status moex_cuda_unpermute_run(moex_context *ctx, const char *op, const int32_t *row_map,
                                    const void *yp, moex_dtype dt, int64_t T, int64_t H, int64_t k,
                                    void *y, cudaStream_t stream);
moex_status moex_cuda_unpermute_bwd_run(moex_context *ctx, const char *op, const int32_t *row_map,
                                        const void *dy, moex_dtype dt, int64_t T, int64_t H,
                                        int64_t k, void *dyp, int64_t rows_p, cudaStream_t stream);
moex_status moex_cuda_router_fwd_run(moex_context *ctx, const char *op, const void *logits,
                                     moex_dtype dt, int64_t T, int64_t E, int64_t k,
                                     moex_router_score score, moex_router_norm norm, float *probs,
                                     int32_t *ids, cudaStream_t stream);
moex_status moex_cuda_router_bwd_run(moex_context *ctx, const char *op, const void *logits,
                                     moex_dtype dt, int64_t T, int64_t E, int64_t k,
                                     moex_router_score score, moex_router_norm norm,
                                     const int32_t *ids, const float *dprobs, void *dlogits,
                                     cudaStream_t stream);

/* ---- expert parallelism (cuda_ep.cu) ------------------------------------------------ */

/* The local kernels of EP (src/core/ep.h), the table's `ep`. */
extern "C" const struct moex_ep_kernels moex_cuda_ep_kernels;

/* ---- small kernels (cuda_reduce.cu) -------------------------------------------------- */

/* Zeroes n floats (a kernel, so that it is the same in and out of graphs): the zero_f32
 * primitive. */
moex_zero_f32_fn moex_cuda_zero_f32;

/* ---- the primitives of backend.h (cuda_backend.cu's table), by file -------------------- */
/* One declaration a primitive, by the file that defines it, with its field's type
 * (moex_<field>_fn, backend.h); the definitions are plain, so grep finds each. */

/* cuda_splits.cu: the prepared groups (the schedule's arrays, and for a grouped linear
 * forward the Hopper GEMM's scratch, from ws; built by one launch), splits_to_offsets. */
moex_groups_ws_fn moex_cuda_groups_ws;
moex_groups_prepare_fn moex_cuda_groups_prepare;
moex_splits_to_offsets_ws_fn moex_cuda_splits_to_offsets_ws;
moex_splits_to_offsets_fn moex_cuda_splits_to_offsets;

/* cuda_zero_tail.cu. */
moex_zero_tail_ws_fn moex_cuda_zero_tail_ws;
moex_zero_tail_fn moex_cuda_zero_tail;

/* cuda_grouped_linear.cu (with fc1_glu, fc2_glu_grad and the FP8 slots below). */
moex_linear_fwd_ws_fn moex_cuda_linear_fwd_ws;
moex_linear_fwd_fn moex_cuda_linear_fwd;
moex_linear_dgrad_ws_fn moex_cuda_linear_dgrad_ws;
moex_linear_dgrad_fn moex_cuda_linear_dgrad;
moex_linear_wgrad_ws_fn moex_cuda_linear_wgrad_ws;
moex_linear_wgrad_fn moex_cuda_linear_wgrad;

/* cuda_glu.cu. */
moex_glu_fwd_ws_fn moex_cuda_glu_fwd_ws;
moex_glu_fwd_fn moex_cuda_glu_fwd;
moex_glu_bwd_ws_fn moex_cuda_glu_bwd_ws;
moex_glu_bwd_fn moex_cuda_glu_bwd;

/* cuda_quantize.cu (with glu_quantize below), and cuda_weight_dequantize.cu. */
moex_quantize_ws_fn moex_cuda_quantize_ws;
moex_quantize_fn moex_cuda_quantize;
moex_dequantize_ws_fn moex_cuda_dequantize_ws;
moex_dequantize_fn moex_cuda_dequantize;
moex_weight_quantize_ws_fn moex_cuda_weight_quantize_ws;
moex_weight_quantize_fn moex_cuda_weight_quantize;
moex_weight_dequantize_ws_fn moex_cuda_weight_dequantize_ws;
moex_weight_dequantize_fn moex_cuda_weight_dequantize;

/* cuda_cast.cu. */
moex_cast_rows_ws_fn moex_cuda_cast_rows_ws;
moex_cast_rows_fn moex_cuda_cast_rows;
moex_weight_copy_ws_fn moex_cuda_weight_copy_ws;
moex_weight_copy_fn moex_cuda_weight_copy;

/* cuda_routing.cu. */
moex_router_fwd_ws_fn moex_cuda_router_fwd_ws;
moex_router_fwd_fn moex_cuda_router_fwd;
moex_router_bwd_ws_fn moex_cuda_router_bwd_ws;
moex_router_bwd_fn moex_cuda_router_bwd;
moex_permute_fwd_ws_fn moex_cuda_permute_fwd_ws;
moex_permute_fwd_fn moex_cuda_permute_fwd;
moex_permute_bwd_ws_fn moex_cuda_permute_bwd_ws;
moex_permute_bwd_fn moex_cuda_permute_bwd;
moex_unpermute_fwd_ws_fn moex_cuda_unpermute_fwd_ws;
moex_unpermute_fwd_fn moex_cuda_unpermute_fwd;
moex_unpermute_bwd_ws_fn moex_cuda_unpermute_bwd_ws;
moex_unpermute_bwd_fn moex_cuda_unpermute_bwd;

/* cuda_dense_gemm.cu: the router's GEMMs on the grouped GEMM with one group. */
moex_dense_gemm_ws_fn moex_cuda_dense_gemm_ws;
moex_dense_gemm_fn moex_cuda_dense_gemm;

/* The optional slots: fc1_glu, fc2_glu_grad and the FP8 GEMMs in cuda_grouped_linear.cu,
 * glu_quantize in cuda_quantize.cu. */
moex_fc1_glu_fn moex_cuda_fc1_glu;
moex_fc2_glu_grad_ws_fn moex_cuda_fc2_glu_grad_ws;
moex_fc2_glu_grad_fn moex_cuda_fc2_glu_grad;
moex_linear_fp8_ws_fn moex_cuda_linear_fp8_ws;
moex_linear_fp8_fn moex_cuda_linear_fp8;
moex_fc1_glu_fp8_ws_fn moex_cuda_fc1_glu_fp8_ws;
moex_fc1_glu_fp8_fn moex_cuda_fc1_glu_fp8;
moex_linear_fp8_wgrad_ws_fn moex_cuda_linear_fp8_wgrad_ws;
moex_linear_fp8_wgrad_fn moex_cuda_linear_fp8_wgrad;
moex_glu_quantize_fn moex_cuda_glu_quantize;

#endif /* MOEX_CUDA_OPS_H */
