/*
 * backend.h - private: what a backend provides, and nothing more. The operations of the
 * public API are composed once, above the backends (src/core/<operation>.c), from the
 * primitives below; a backend implements each primitive for its memory and its hardware
 * (src/cpu, src/cuda), and src/core/registry.c lists the backends' constructors.
 *
 * Every primitive receives validated arguments (src/core/validate.c), the call it runs for
 * (moex_call: the public name for messages, the op id for the CUDA bad-input flag, the
 * stream) and a workspace of at least what its *_ws query returned, aligned to
 * MOEX_WS_ALIGN. The *_ws queries depend on shapes, dtypes and which optional tensors are
 * present, never on split values. A grouped primitive runs on a prepared-splits handle
 * (moex_groups) that the composition builds once per call.
 */
#ifndef MOEX_BACKEND_H
#define MOEX_BACKEND_H

#include "moex_impl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The public call a primitive runs for. */
typedef struct moex_call {
    const char *op;             /* "moex_<name>", for messages */
    moex_op_id id;              /* recorded by the CUDA bad-input flag */
    moex_stream stream;
} moex_call;

/* A prepared-splits handle: the row offsets of G groups over T rows, in the backend's
 * memory. CPU: off[G+1] read from host splits and checked (bad splits fail the prepare).
 * CUDA: the device schedule (off clamped to T, and row-tile offsets), built by one launch
 * when a kernel of the call first reads it (moex_cuda_sched_ready), or at the call's end
 * when none did; bad splits are flagged on the device. */
typedef struct moex_groups {
    int64_t G, T;
    const int64_t *splits;      /* the splits it was built from (NULL: one group of T rows) */
    int64_t *off;               /* [G+1] row offsets, off[0] = 0 */
    int32_t *tiles;             /* CUDA: [G+1] row-tile offsets; CPU: NULL */
    void *gemm_ws;              /* CUDA: the Hopper forward's own scratch, or NULL */
} moex_groups;

/* The FC1 of the grouped MLP with the scaled GLU fused into its epilogue:
 * h = x W_g^T (+ b_g) [T, 2F] and z = p glu(h) [T, F]. */
typedef struct moex_fc1_glu_args {
    moex_grouped_linear_args fc1;   /* x, w, bias (ADD or NONE), splits, y = h */
    moex_glu_params glu;
    moex_tensor probs;              /* [T] f32, or absent (p = 1) */
    moex_tensor z;
} moex_fc1_glu_args;

/* The grouped MLP's FC1 on FP8 operands with the scaled GLU fused (the layers' FP8 recipe):
 * h = fc1's FP8 forward (its y; bias b1 ADD or NONE), rounded, and z = p glu(h) [T, F] in h's
 * dtype, p = probs (1 when absent). */
typedef struct moex_fc1_glu_fp8_args {
    moex_grouped_linear_fp8_args fc1;
    moex_glu_params glu;
    moex_tensor probs;
    moex_tensor z;
} moex_fc1_glu_fp8_args;

/* The FC2 backward-data of the grouped MLP with the GLU's backward fused:
 *   dz = dy W_g [T, F], rounded to the activation dtype as if stored, but not stored;
 *   dh = glu'(h) dz [T, 2F] (=), with glu and p = probs (1 when absent);
 *   dbias = sum (p) dy as linear_dgrad computes it (fc2's bias_mode, probs, dbias);
 *   when dprobs is present: dprobs += dy . b_g (fc2.bias present, SCALED), then
 *   dprobs += the GLU's term sum_j dz_j act(a_j) g(b_j).
 * fc2.dx and fc2.dprobs are not used. */
typedef struct moex_fc2_glu_grad_args {
    moex_grouped_linear_dgrad_args fc2;   /* dy [T, H], w [G, H, F], the bias terms */
    moex_glu_params glu;
    moex_tensor h;                        /* [T, 2F] */
    moex_tensor probs;                    /* [T] f32, or absent (p = 1) */
    moex_tensor dh;                       /* [T, 2F]; may be h itself (in place) */
    moex_tensor dprobs;                   /* [T] f32 (+=), or absent */
    moex_tensor z;                        /* [T, F]: z = p glu(h) (=), bitwise glu_fwd's, from
                                             h before dh is written; or absent */
} moex_fc2_glu_grad_args;

/* A dense GEMM of the MoE layer's router (one group of all rows, f32 accumulation):
 *   MOEX_GEMM_NT:  C[M, N] = A[M, K] B[N, K]^T                     (logits = x Wr^T)
 *   MOEX_GEMM_TN:  C[M, N] = A[K, M]^T B[K, N], "=" or "+="        (dWr = dlogits^T x)
 *   MOEX_GEMM_NN:  C[M, N] = round(R[M, N] + A[M, K] B[K, N])      (dx = dx_perm + dlogits Wr)
 * A and B of dtypes ta, tb; C of dtype tc ("+=": f32 only); R f32, which the backend may
 * overwrite. The product runs in tb's precision (f32 inputs: exact f32). */
typedef enum moex_gemm_kind { MOEX_GEMM_NT = 0, MOEX_GEMM_TN = 1, MOEX_GEMM_NN = 2 } moex_gemm_kind;

typedef struct moex_dense_gemm {
    moex_gemm_kind kind;
    int64_t M, N, K;
    const void *a;
    moex_dtype ta;
    const void *b;
    moex_dtype tb;
    void *c;
    moex_dtype tc;
    moex_grad_mode mode;        /* TN: WRITE or ACCUMULATE */
    float *r;                   /* NN: the f32 addend */
} moex_dense_gemm;

/* weight_copy's arguments: each matrix of src [G, R, C] into dst [G, R, C], rounded to dst's
 * dtype (f32, bf16, f16); either may be packed or discrete (its pointer array in the backend's
 * memory). d: G, T = R, K = C. */
typedef struct moex_weight_copy_args {
    moex_weight src, dst;
} moex_weight_copy_args;

/* cast_rows' arguments: f32 rows src [T, N] and their rounded copy dst [T, N]. */
typedef struct moex_cast_rows_args {
    const float *src;
    moex_tensor dst;
} moex_cast_rows_args;

/* The signature of each function of moex_backend_ops below (what each does: its field's
 * comment), written once as a type moex_<field>_fn: the table's fields and each backend's
 * declarations of its definitions (src/cpu/cpu_ops.h, src/cuda/cuda_ops.h) are written with
 * these types, so a definition that disagrees with its field does not compile. The list repeats
 * in shape, by design: each line is a signature the compiler checks. */
typedef moex_status moex_enter_fn(moex_context *ctx, const moex_call *c, int *scope);
typedef moex_status moex_leave_fn(moex_context *ctx, int scope, moex_status st);
typedef moex_status moex_check_limits_fn(moex_context *ctx, const moex_call *c, int64_t rows, int64_t groups,
                                         int64_t experts);
typedef size_t moex_groups_ws_fn(moex_context *ctx, int64_t G, int64_t T, const moex_grouped_linear_args *fwd);
typedef moex_status moex_groups_prepare_fn(moex_context *ctx, const moex_call *c, const int64_t *splits, int64_t G,
                                           int64_t T, const moex_grouped_linear_args *fwd, void *ws, moex_groups *g);
typedef size_t moex_linear_fwd_ws_fn(moex_context *ctx, const moex_grouped_linear_args *a, const moex_gl_dims *d);
typedef moex_status moex_linear_fwd_fn(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                       const moex_grouped_linear_args *a, const moex_gl_dims *d, void *ws);
typedef size_t moex_linear_dgrad_ws_fn(moex_context *ctx, const moex_grouped_linear_dgrad_args *a,
                                       const moex_gl_dims *d);
typedef moex_status moex_linear_dgrad_fn(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                         const moex_grouped_linear_dgrad_args *a, const moex_gl_dims *d, void *ws);
typedef size_t moex_linear_wgrad_ws_fn(moex_context *ctx, const moex_grouped_linear_wgrad_args *a,
                                       const moex_gl_dims *d);
typedef moex_status moex_linear_wgrad_fn(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                         const moex_grouped_linear_wgrad_args *a, const moex_gl_dims *d, void *ws);
typedef size_t moex_glu_fwd_ws_fn(moex_context *ctx, const moex_scaled_glu_args *a, const moex_glu_dims *d);
typedef moex_status moex_glu_fwd_fn(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                    const moex_scaled_glu_args *a, const moex_glu_dims *d, void *ws);
typedef size_t moex_glu_bwd_ws_fn(moex_context *ctx, const moex_scaled_glu_grad_args *a, const moex_glu_dims *d);
typedef moex_status moex_glu_bwd_fn(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                    const moex_scaled_glu_grad_args *a, const moex_glu_dims *d, void *ws);
typedef size_t moex_quantize_ws_fn(moex_context *ctx, const moex_group_quantize_args *a, const moex_quant_dims *d);
typedef moex_status moex_quantize_fn(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                     const moex_group_quantize_args *a, const moex_quant_dims *d, void *ws);
typedef size_t moex_dequantize_ws_fn(moex_context *ctx, const moex_group_dequantize_args *a, const moex_quant_dims *d);
typedef moex_status moex_dequantize_fn(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                       const moex_group_dequantize_args *a, const moex_quant_dims *d, void *ws);
typedef size_t moex_cast_rows_ws_fn(moex_context *ctx, const moex_cast_rows_args *a, const moex_gl_dims *d);
typedef moex_status moex_cast_rows_fn(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                      const moex_cast_rows_args *a, const moex_gl_dims *d, void *ws);
typedef size_t moex_zero_tail_ws_fn(moex_context *ctx, const moex_zero_tail_args *a, const moex_tail_dims *d);
typedef moex_status moex_zero_tail_fn(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                      const moex_zero_tail_args *a, const moex_tail_dims *d, void *ws);
typedef size_t moex_splits_to_offsets_ws_fn(moex_context *ctx, const moex_splits_to_offsets_args *a,
                                            const moex_splits_dims *d);
typedef moex_status moex_splits_to_offsets_fn(moex_context *ctx, const moex_call *c,
                                              const moex_splits_to_offsets_args *a, const moex_splits_dims *d,
                                              void *ws);
typedef size_t moex_router_fwd_ws_fn(moex_context *ctx, const moex_router_args *a, const moex_router_dims *d);
typedef moex_status moex_router_fwd_fn(moex_context *ctx, const moex_call *c, const moex_router_args *a,
                                       const moex_router_dims *d, void *ws);
typedef size_t moex_router_bwd_ws_fn(moex_context *ctx, const moex_router_grad_args *a, const moex_router_dims *d);
typedef moex_status moex_router_bwd_fn(moex_context *ctx, const moex_call *c, const moex_router_grad_args *a,
                                       const moex_router_dims *d, void *ws);
typedef size_t moex_permute_fwd_ws_fn(moex_context *ctx, const moex_permute_args *a, const moex_perm_dims *d);
typedef moex_status moex_permute_fwd_fn(moex_context *ctx, const moex_call *c, const moex_permute_args *a,
                                        const moex_perm_dims *d, void *ws);
typedef size_t moex_permute_bwd_ws_fn(moex_context *ctx, const moex_permute_grad_args *a, const moex_perm_dims *d);
typedef moex_status moex_permute_bwd_fn(moex_context *ctx, const moex_call *c, const moex_permute_grad_args *a,
                                        const moex_perm_dims *d, void *ws);
typedef size_t moex_unpermute_fwd_ws_fn(moex_context *ctx, const moex_unpermute_args *a, const moex_perm_dims *d);
typedef moex_status moex_unpermute_fwd_fn(moex_context *ctx, const moex_call *c, const moex_unpermute_args *a,
                                          const moex_perm_dims *d, void *ws);
typedef size_t moex_unpermute_bwd_ws_fn(moex_context *ctx, const moex_unpermute_grad_args *a, const moex_perm_dims *d);
typedef moex_status moex_unpermute_bwd_fn(moex_context *ctx, const moex_call *c, const moex_unpermute_grad_args *a,
                                          const moex_perm_dims *d, void *ws);
typedef size_t moex_weight_quantize_ws_fn(moex_context *ctx, const moex_weight_quantize_args *a,
                                          const moex_quant_dims *d);
typedef moex_status moex_weight_quantize_fn(moex_context *ctx, const moex_call *c, const moex_weight_quantize_args *a,
                                            const moex_quant_dims *d, void *ws);
typedef size_t moex_weight_dequantize_ws_fn(moex_context *ctx, const moex_weight_dequantize_args *a,
                                            const moex_quant_dims *d);
typedef moex_status moex_weight_dequantize_fn(moex_context *ctx, const moex_call *c,
                                              const moex_weight_dequantize_args *a, const moex_quant_dims *d, void *ws);
typedef size_t moex_weight_maps_size_fn(moex_context *ctx, const moex_gl_dims *d);
typedef moex_status moex_weight_maps_write_fn(moex_context *ctx, const moex_call *c,
                                              const moex_weight_maps_write_args *a, const moex_gl_dims *d);
typedef size_t moex_weight_copy_ws_fn(moex_context *ctx, const moex_weight_copy_args *a, const moex_gl_dims *d);
typedef moex_status moex_weight_copy_fn(moex_context *ctx, const moex_call *c, const moex_weight_copy_args *a,
                                        const moex_gl_dims *d, void *ws);
typedef size_t moex_dense_gemm_ws_fn(moex_context *ctx, const moex_dense_gemm *p);
typedef moex_status moex_dense_gemm_fn(moex_context *ctx, const moex_call *c, const moex_groups *rows,
                                       const moex_dense_gemm *p, void *ws);
typedef moex_status moex_fc1_glu_fn(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                    const moex_fc1_glu_args *a, const moex_gl_dims *d, bool *ran);
typedef size_t moex_fc2_glu_grad_ws_fn(moex_context *ctx, const moex_fc2_glu_grad_args *a, const moex_gl_dims *d);
typedef moex_status moex_fc2_glu_grad_fn(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                         const moex_fc2_glu_grad_args *a, const moex_gl_dims *d, void *ws);
typedef size_t moex_linear_fp8_ws_fn(moex_context *ctx, const moex_grouped_linear_fp8_args *a, const moex_fp8_dims *d);
typedef moex_status moex_linear_fp8_fn(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                       const moex_grouped_linear_fp8_args *a, const moex_fp8_dims *d, void *ws);
typedef size_t moex_fc1_glu_fp8_ws_fn(moex_context *ctx, const moex_fc1_glu_fp8_args *a, const moex_fp8_dims *d);
typedef moex_status moex_fc1_glu_fp8_fn(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                        const moex_fc1_glu_fp8_args *a, const moex_fp8_dims *d, void *ws);
typedef size_t moex_linear_fp8_wgrad_ws_fn(moex_context *ctx, const moex_grouped_linear_fp8_wgrad_args *a,
                                           const moex_fp8_dims *d);
typedef moex_status moex_linear_fp8_wgrad_fn(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                             const moex_grouped_linear_fp8_wgrad_args *a, const moex_fp8_dims *d,
                                             void *ws);
typedef moex_status moex_glu_quantize_fn(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                         const moex_scaled_glu_args *glu, const moex_group_quantize_args *q,
                                         const moex_quant_dims *d, void *ws);
typedef moex_status moex_zero_f32_fn(moex_context *ctx, const moex_call *c, float *p, int64_t n);
typedef moex_status moex_check_splits_fn(moex_context *ctx, moex_stream stream);
typedef void moex_destroy_fn(moex_context *ctx);

typedef struct moex_backend_ops {
    const char *name;
    bool host_memory;           /* tensors are host memory: the core may read them */

    /* Around every public call's primitives (CUDA: makes ctx->device current and restores
     * the caller's device in leave; leave also launches the work a call left pending, and
     * returns its status; st: the primitives' status). NULL: nothing to do. */
    moex_enter_fn *enter;
    moex_leave_fn *leave;

    /* Limits of the backend's grouped kernels for `rows` rows in `groups` groups, and for
     * `experts` experts of a permute (0: none), checked before a call's first launch.
     * NULL: no limits. */
    moex_check_limits_fn *check_limits;

    /* The prepared-splits handle: its storage, and its build from splits [G] in the
     * backend's memory (NULL: one group of all T rows). `fwd`: the grouped linear forward the
     * handle serves, whose own GEMM scratch it then carries (CUDA: the Hopper forward's
     * stream-K partial sums, on the shapes where it runs stream-K); NULL: none. */
    moex_groups_ws_fn *groups_ws;
    moex_groups_prepare_fn *groups_prepare;

    /* The primitives with a workspace query, each a pair: <f>_ws, its workspace bytes, and <f>.
     * Those with a moex_groups *g run on the call's prepared handle and do not read the splits
     * fields of their args (the handle has them); the others need none. A backend defines each as
     * <prefix>_<f>_ws and <prefix>_<f> (declared with the field's types in its header:
     * src/cpu/cpu_ops.h, src/cuda/cuda_ops.h) and names them in its table. */

    /* The grouped linear forward y = x W_g^T with its bias epilogue. */
    moex_linear_fwd_ws_fn *linear_fwd_ws;
    moex_linear_fwd_fn *linear_fwd;

    /* Its backward data: dx, dbias, dprobs (+=). */
    moex_linear_dgrad_ws_fn *linear_dgrad_ws;
    moex_linear_dgrad_fn *linear_dgrad;

    /* Its backward weight: dW (= or +=). */
    moex_linear_wgrad_ws_fn *linear_wgrad_ws;
    moex_linear_wgrad_fn *linear_wgrad;

    /* The scaled GLU over the rows [0, off[G]) of g (g NULL: all T rows), forward and backward.
     * The backward also takes an absent dh (dprobs only), and its dh may be its h itself (each
     * pair of h is read before its dh is written: the grouped MLP's MOEX_H_OVERWRITE). */
    moex_glu_fwd_ws_fn *glu_fwd_ws;
    moex_glu_fwd_fn *glu_fwd;
    moex_glu_bwd_ws_fn *glu_bwd_ws;
    moex_glu_bwd_fn *glu_bwd;

    /* The FP8 copies of docs/ops.md section 9 (math: quant_math.h), and their way back. */
    moex_quantize_ws_fn *quantize_ws;
    moex_quantize_fn *quantize;
    moex_dequantize_ws_fn *dequantize_ws;
    moex_dequantize_fn *dequantize;

    /* dst[r, n] = round(src[r, n]) for the rows r < off[G]: f32 rows [T, N] into dst's dtype
     * (moex_cast_rows_args; d: T, N). */
    moex_cast_rows_ws_fn *cast_rows_ws;
    moex_cast_rows_fn *cast_rows;

    /* Every byte of x's rows r >= off[G] = 0 (d: T rows of row_bytes). */
    moex_zero_tail_ws_fn *zero_tail_ws;
    moex_zero_tail_fn *zero_tail;

    /* The public splits_to_offsets, router, permute and unpermute (forward and backward): one
     * primitive each (docs/ops.md 1, 5, 6, 7). */
    moex_splits_to_offsets_ws_fn *splits_to_offsets_ws;
    moex_splits_to_offsets_fn *splits_to_offsets;
    moex_router_fwd_ws_fn *router_fwd_ws;
    moex_router_fwd_fn *router_fwd;
    moex_router_bwd_ws_fn *router_bwd_ws;
    moex_router_bwd_fn *router_bwd;
    moex_permute_fwd_ws_fn *permute_fwd_ws;
    moex_permute_fwd_fn *permute_fwd;
    moex_permute_bwd_ws_fn *permute_bwd_ws;
    moex_permute_bwd_fn *permute_bwd;
    moex_unpermute_fwd_ws_fn *unpermute_fwd_ws;
    moex_unpermute_fwd_fn *unpermute_fwd;
    moex_unpermute_bwd_ws_fn *unpermute_bwd_ws;
    moex_unpermute_bwd_fn *unpermute_bwd;

    /* The FP8 copies of grouped weights and their way back (docs/ops.md 9.7; no splits). */
    moex_weight_quantize_ws_fn *weight_quantize_ws;
    moex_weight_quantize_fn *weight_quantize;
    moex_weight_dequantize_ws_fn *weight_dequantize_ws;
    moex_weight_dequantize_fn *weight_dequantize;

    /* A discrete weight's maps (moex_weight_maps_write, d: G, N, K, dt; T unused): their bytes
     * (0: this backend's GEMMs read none, and weight_maps_write is never called), and a->maps
     * = the maps of a->w's matrices. */
    moex_weight_maps_size_fn *weight_maps_size;
    moex_weight_maps_write_fn *weight_maps_write;

    /* Grouped weights from one form and dtype into another (moex_weight_copy_args). */
    moex_weight_copy_ws_fn *weight_copy_ws;
    moex_weight_copy_fn *weight_copy;

    /* The router's dense GEMMs; `rows` is a handle of one group of T rows (M of NT and NN,
     * K of TN). */
    moex_dense_gemm_ws_fn *dense_gemm_ws;
    moex_dense_gemm_fn *dense_gemm;

    /* The grouped MLP's FC1 with the GLU fused (no workspace). *ran = false, and nothing
     * launched, when the backend cannot: the composition then runs linear_fwd and glu_fwd.
     * NULL: never. */
    moex_fc1_glu_fn *fc1_glu;

    /* The grouped MLP's FC2 backward-data with the GLU's backward fused (d: FC2's dims, K = F,
     * N = H). fc2_glu_grad_ws: its workspace, or SIZE_MAX when the backend cannot run these
     * args (from shapes, dtypes, layouts and which tensors are present, never split values):
     * the composition then runs linear_dgrad and glu_bwd. NULL: never. */
    moex_fc2_glu_grad_ws_fn *fc2_glu_grad_ws;
    moex_fc2_glu_grad_fn *fc2_glu_grad;

    /* The FP8 grouped linear's forward on the backend's FP8 kernels. linear_fp8_ws: its
     * workspace, or SIZE_MAX when the backend cannot run these args (from shapes, dtypes,
     * recipes and which tensors are present, never pointers or split values): the composition
     * then dequantizes. NULL: never. */
    moex_linear_fp8_ws_fn *linear_fp8_ws;
    moex_linear_fp8_fn *linear_fp8;
    /* The FP8 FC1 + scaled GLU (moex_fc1_glu_fp8_args; d: fc1's). fc1_glu_fp8_ws: its
     * workspace, or SIZE_MAX when the backend cannot run these args (from shapes, dtypes,
     * recipes, the GLU's layout and which tensors are present, never pointers or split
     * values): the composition then runs linear_fp8's forward and the scaled GLU. NULL: never. */
    moex_fc1_glu_fp8_ws_fn *fc1_glu_fp8_ws;
    moex_fc1_glu_fp8_fn *fc1_glu_fp8;
    /* The same for the FP8 grouped linear's backward weight. */
    moex_linear_fp8_wgrad_ws_fn *linear_fp8_wgrad_ws;
    moex_linear_fp8_wgrad_fn *linear_fp8_wgrad;

    /* The scaled GLU's z quantized straight from h, z not written: the quantize primitive's
     * work for q (its x: z's shape and dtype [T, F], x.data unused; its workspace:
     * quantize_ws(q)) on z = p glu(h) of `glu` over the rows of g. NULL: the composition
     * runs glu_fwd into a z buffer and quantize on it. */
    moex_glu_quantize_fn *glu_quantize;

    /* Expert parallelism's local kernels (src/core/ep.h). NULL: the backend has none. */
    const struct moex_ep_kernels *ep;

    /* p[0, n) = 0 (f32). */
    moex_zero_f32_fn *zero_f32;

    /* moex_context_check_splits (NULL: nothing is ever flagged), and the backend's
     * destruction (frees ctx->backend_state). */
    moex_check_splits_fn *check_splits;
    moex_destroy_fn *destroy;
} moex_backend_ops;


/* Backend constructors (src/cpu/cpu_backend.c, src/cuda/cuda_backend.cu): fill ctx->ops,
 * ctx->backend_state and ctx->num_threads, or fail with a message. */
moex_status moex_cpu_backend_init(moex_context *ctx);
moex_status moex_cuda_backend_init(moex_context *ctx);

/* The constructor of ctx->backend (registry.c); MOEX_ERR_UNSUPPORTED when this build lacks it. */
moex_status moex_backend_init(moex_context *ctx);

#ifdef __cplusplus
}
#endif

#endif /* MOEX_BACKEND_H */
