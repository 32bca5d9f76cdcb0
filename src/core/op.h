/*
 * op.h - private: what each operation of op_list.h defines, and the two functions every
 * public entry point calls. An op's file (src/core/<family>.c) defines, for each of its ops:
 *
 *   moex_op_<name>_validate(ctx, op, args, purpose, dims)
 *       checks the argument struct (validate.h) and fills the dims; MOEX_FOR_RUN also checks
 *       what only a run needs (the MoE layer's `saved`);
 *   moex_op_<name>_ws(ctx, args, dims)
 *       the workspace bytes its composition needs (before the core's alignment slack);
 *   moex_op_<name>_run(ctx, call, args, dims, ws)
 *       its composition of backend primitives (backend.h), ws aligned to MOEX_WS_ALIGN;
 *
 * (an op that is one primitive, a P row, defines only its validate: the primitive's _ws and
 * run are its own), declared below from op_list.h's rows, and called by op.c's dispatch (its cases come from the
 * same rows); its public pair is in api.c. Each definition is plain (no macro pastes its
 * name), so grep finds it.
 */
#ifndef MOEX_OP_H
#define MOEX_OP_H

#include "backend.h"
#include "validate.h"

typedef enum moex_purpose { MOEX_FOR_SIZE = 0, MOEX_FOR_RUN = 1 } moex_purpose;

/* ---- each op's functions (op.c's dispatch calls them) -----------------------------------
 * Their signatures are written once, here, for every row of op_list.h (ID, name, args type,
 * dims type): the three of an X row, the validate of a P row (its ws and run: its backend
 * primitive's). The row fixes the types, so a definition that disagrees with its row does not
 * compile. The definitions are plain, in the op's file, where grep finds each by its name. */
#define MOEX_OP_DECLARE_(ID, name, args_t, dims_t)                                                        \
    moex_status moex_op_##name##_validate(moex_context *ctx, const char *op, const args_t *a, moex_purpose p, \
                                          dims_t *d);                                                     \
    size_t moex_op_##name##_ws(moex_context *ctx, const args_t *a, const dims_t *d);                      \
    moex_status moex_op_##name##_run(moex_context *ctx, const moex_call *c, const args_t *a, const dims_t *d, \
                                     void *ws);
#define MOEX_OP_DECLARE_P_(ID, name, args_t, dims_t, prim)                                                 \
    moex_status moex_op_##name##_validate(moex_context *ctx, const char *op, const args_t *a, moex_purpose p, \
                                          dims_t *d);
MOEX_OPS(MOEX_OP_DECLARE_, MOEX_OP_DECLARE_P_)
#undef MOEX_OP_DECLARE_
#undef MOEX_OP_DECLARE_P_

/* The grouped MLP's forward (grouped_mlp.c; the op's ws and run with xq NULL), in FP8 given
 * xq, x's rowwise copy as the recipe's quantize writes it (an FP8 dispatch's rows and scales,
 * ep_layer.c): FC1 reads it, and x is not quantized. Plain precision ignores xq. */
size_t moex_mlp_fwd_ws(moex_context *ctx, const moex_grouped_mlp_args *a, const moex_quant_tensor *xq,
                       const moex_mlp_dims *d);
moex_status moex_mlp_fwd_run(moex_context *ctx, const moex_call *c, const moex_grouped_mlp_args *a,
                             const moex_quant_tensor *xq, const moex_mlp_dims *d, void *ws);

/* moex_<name>_workspace_size: validate, then *bytes = the op's size plus alignment slack. */
moex_status moex_op_workspace_size(moex_context *ctx, moex_op_id id, const void *args, size_t *bytes);

/* moex_<name>: validate, check the workspace and the overlap rule, run the composition
 * inside the backend's enter/leave. */
moex_status moex_op_run(moex_context *ctx, moex_op_id id, const void *args, void *workspace,
                        size_t workspace_bytes, moex_stream stream);

/* The backend's primitives, for compositions. */
static inline const moex_backend_ops *moex_ops(const moex_context *ctx) { return ctx->ops; }

/* The backend's limits for `rows` rows in `groups` groups and a permute of `experts`
 * experts (0: none), before a call's first launch. */
moex_status moex_check_limits(moex_context *ctx, const moex_call *c, int64_t rows, int64_t groups, int64_t experts);

/* Prepares the groups of `splits` (a validated [G] I64 tensor) over T rows in `storage`
 * (groups_ws bytes; fwd as there). */
moex_status moex_prepare_groups(moex_context *ctx, const moex_call *c, const moex_tensor *splits, int64_t T,
                                const moex_grouped_linear_args *fwd, void *storage, moex_groups *g);

/* The start of a grouped composition's run: the backend's limits for T rows in the groups of
 * `splits` (a validated [G] I64 tensor), then those groups prepared in `storage`
 * (moex_prepare_groups; fwd as there). */
moex_status moex_begin_groups(moex_context *ctx, const moex_call *c, const moex_tensor *splits, int64_t T,
                              const moex_grouped_linear_args *fwd, void *storage, moex_groups *g);

/* The workspace of a composition that runs one primitive on the groups of its splits: the
 * prepared handle's storage (G groups over T rows, carrying the GEMM scratch of fwd, a grouped
 * linear forward's args, or NULL; none when G = 0: no splits), then the primitive's region of
 * `sub` bytes. ws NULL: the sizes only. */
typedef struct moex_groups_layout {
    void *groups, *sub;
    size_t total;
} moex_groups_layout;
moex_groups_layout moex_groups_layout_of(moex_context *ctx, int64_t G, int64_t T, const moex_grouped_linear_args *fwd,
                                         size_t sub, void *ws);

/* Its run up to the primitive: the groups of `splits` prepared in ws's storage (moex_prepare_groups;
 * G = 0: none, g not written); *sub: the primitive's region. The caller checks the backend's
 * limits before, where it needs them. */
moex_status moex_groups_layout_prepare(moex_context *ctx, const moex_call *c, const moex_tensor *splits, int64_t G,
                                       int64_t T, const moex_grouped_linear_args *fwd, void *ws, moex_groups *g,
                                       void **sub);

/* The FP8 outputs of a grouped quantize of [T, K] rows in G groups (d->G, T, K and dt set):
 * the params, the rowwise and columnwise copies and amax (docs/ops.md 9.4, 9.6), their names
 * prefixed by `prefix` in messages; sets the rest of d (quantize.c; also the scaled GLU's zq). */
moex_status moex_quant_check_outputs(moex_context *ctx, const char *op, const char *prefix,
                                     const moex_quant_params *params, const moex_quant_tensor *rowwise,
                                     const moex_quant_tensor *columnwise, const moex_tensor *amax,
                                     moex_quant_dims *d);

/* An FP8 operand read by a GEMM (fp8_linear.c), checked as the dequantize reads it (quantize.c):
 *   rows:   a grouped-rows copy of [T, K] rows in G groups (d->G, T, K set), data [T, K]
 *           (ROWWISE) or [K, T] (COLUMNWISE), and its scales; sets the rest of d;
 *   weight: a weight copy, data [G, T, K] (d->G, T, K set; scales as a rowwise copy's).
 * The names are those of the data and scales fields, for messages. */
moex_status moex_quant_check_rows_input(moex_context *ctx, const char *op, const char *data_name,
                                        const char *scales_name, const moex_quant_params *params,
                                        const moex_quant_tensor *copy, moex_quant_orientation orient,
                                        moex_quant_dims *d);
moex_status moex_quant_check_weight_input(moex_context *ctx, const char *op, const char *data_name,
                                          const char *scales_name, const moex_quant_params *params,
                                          const moex_quant_tensor *copy, moex_quant_dims *d);

/* ---- The grouped linear's GEMMs in either precision (grouped_linear.c; docs/ops.md 9.11) ----
 * The grouped linear's and the grouped MLP's plans are written once for both precisions of
 * their `fp8` recipe. Plain (MOEX_FP8_OFF): each GEMM is a linear primitive on the activation-
 * dtype tensors of its plain args, and no operand has FP8 copies. FP8: the operands the GEMMs
 * read are quantized into FP8 copies in the workspace (the plan's copy steps), and each GEMM is
 * the FP8 grouped linear's op (fp8_linear.c, run without validation on its own prepared handle)
 * on those copies, writing the plain args' outputs. */

/* On a device backend the FP8 GEMM kernels need the outputs they write (data: y, h, dx, a
 * packed f32 dW) 16-byte aligned: checked with the arguments (p: for a run), so that a refused
 * call has written nothing. */
moex_status moex_fp8_check_out(moex_context *ctx, const char *op, const moex_fp8_recipe *r, moex_purpose p,
                               const char *name, const void *data);

/* The FP8 copies of one operand: its quantization (by its role: activation, weight, gradient),
 * the dims of its quantize, and the rowwise and columnwise copies the plan asks for (absent:
 * ndim 0). All zero in plain precision. */
typedef struct moex_fp8_operand {
    moex_quant_params p;
    moex_quant_dims d;
    moex_quant_tensor row, col;
    bool row_given, col_given;  /* a weight's copy the caller keeps (recipe.weights): read, not
                                   quantized */
} moex_fp8_operand;

/* The copies of grouped rows [T, K] of dtype dt in G groups (grad: a gradient's quantization),
 * or of the layer's weight `which` [G, N, K] (its index in recipe.weights), carved from c
 * where row / col are asked; a weight's copy the caller keeps is taken instead of carved.
 * With r->mode OFF nothing is carved and *q is all zero. */
void moex_fp8_take_rows(moex_carver *c, const moex_fp8_recipe *r, bool grad, int64_t G, int64_t T, int64_t K,
                        moex_dtype dt, bool row, bool col, moex_fp8_operand *q);
void moex_fp8_take_weight(moex_carver *c, const moex_fp8_recipe *r, int which, int64_t G, int64_t N, int64_t K,
                          moex_dtype dt, bool row, bool col, moex_fp8_operand *q);

/* The copies the caller keeps of the layer's weight `which` [G, N, K] (recipe.weights, named
 * `name` in messages): each present copy checked as moex_weight_quantize writes it under
 * moex_fp8_weight_params, as an input. Nothing with MOEX_FP8_OFF or no weights. */
moex_status moex_fp8_check_weight_copies(moex_context *ctx, const char *op, const moex_fp8_recipe *r, int which,
                                         const char *name, int64_t G, int64_t N, int64_t K);
/* The same for an MLP's two weights: w1 [G, 2F, H] (weights[0]) and w2 [G, H, F] (weights[1]). */
moex_status moex_fp8_check_mlp_weight_copies(moex_context *ctx, const char *op, const moex_fp8_recipe *r, int64_t G,
                                             int64_t H, int64_t F);

/* The copy steps: q's copies (=) quantized from rows x [T, K] (splits: x's) on the groups of g,
 * or from weights w (a discrete w first packed at the start of sub); their bytes of the shared
 * region. Nothing (0, MOEX_OK) when q has no copies to write (a weight's given ones are not). */
size_t moex_fp8_rows_ws(moex_context *ctx, const moex_tensor *x, const moex_tensor *splits, const moex_fp8_operand *q);
moex_status moex_fp8_rows_quantize(moex_context *ctx, const moex_call *c, const moex_groups *g, const moex_tensor *x,
                                   const moex_tensor *splits, const moex_fp8_operand *q, void *sub);
size_t moex_fp8_weight_ws(moex_context *ctx, const moex_weight *w, const moex_fp8_operand *q);
moex_status moex_fp8_weight_quantize(moex_context *ctx, const moex_call *c, const moex_weight *w,
                                     const moex_fp8_operand *q, void *sub);

/* The forward GEMM y = x W_g^T (+ b_g | + p b_g) [T, N] (=) of the args a (dims d). Plain
 * (x, w NULL): linear_fwd on a. FP8: the FP8 grouped linear's forward on x's rowwise copy and
 * W's rowwise copy, with a's bias, probs, splits and y. */
typedef struct moex_gl_fwd {
    moex_grouped_linear_args a;
    moex_gl_dims d;
    bool fp8;
    moex_grouped_linear_fp8_args f;
    moex_fp8_dims fd;
} moex_gl_fwd;
moex_gl_fwd moex_gl_fwd_of(const moex_grouped_linear_args *a, const moex_gl_dims *d, const moex_fp8_operand *x,
                           const moex_fp8_operand *w);
size_t moex_gl_fwd_ws(moex_context *ctx, const moex_gl_fwd *s);
moex_status moex_gl_fwd_run(moex_context *ctx, const moex_call *c, const moex_groups *g, const moex_gl_fwd *s,
                            void *sub);

/* The backward data of the args a (dims d): dx = dy W_g [T, K] (=), dbias (=), dprobs (+=), as
 * a asks. Plain (dy, w NULL): linear_dgrad on a, all three in dgrad_run (dgrad_bias_run does
 * nothing). FP8: dbias and dprobs by linear_dgrad on dy (dx absent) in dgrad_bias_run, and dx by
 * the FP8 grouped linear's forward on dy's rowwise copy and W's columnwise copy (W^T
 * [G, K, N]) in dgrad_run; each where asked. */
typedef struct moex_gl_dgrad {
    moex_grouped_linear_dgrad_args a;     /* FP8: dx absent */
    moex_gl_dims d;
    bool fp8;
    bool bias, dx;                        /* FP8: dbias or dprobs asked; dx asked */
    moex_grouped_linear_fp8_args f;       /* FP8: dx */
    moex_fp8_dims fd;
} moex_gl_dgrad;
moex_gl_dgrad moex_gl_dgrad_of(const moex_grouped_linear_dgrad_args *a, const moex_gl_dims *d,
                               const moex_fp8_operand *dy, const moex_fp8_operand *w);
size_t moex_gl_dgrad_ws(moex_context *ctx, const moex_gl_dgrad *s);
moex_status moex_gl_dgrad_bias_run(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                   const moex_gl_dgrad *s, void *sub);
moex_status moex_gl_dgrad_run(moex_context *ctx, const moex_call *c, const moex_groups *g, const moex_gl_dgrad *s,
                              void *sub);

/* The backward weight dW = dy_g^T x_g [G, N, K] (= or +=) of the args a (dims d). Plain (dy, x
 * NULL): linear_wgrad on a. FP8: the FP8 grouped linear's backward weight on dy's and x's
 * columnwise copies, into dW as it is (f32 = or +=, bf16/f16 =: the f32 sums rounded once). */
typedef struct moex_gl_wgrad {
    moex_grouped_linear_wgrad_args a;
    moex_gl_dims d;
    bool fp8;
    moex_grouped_linear_fp8_wgrad_args f;
    moex_fp8_dims fd;
} moex_gl_wgrad;
moex_gl_wgrad moex_gl_wgrad_of(const moex_grouped_linear_wgrad_args *a, const moex_gl_dims *d,
                               const moex_fp8_operand *dy, const moex_fp8_operand *x);
size_t moex_gl_wgrad_ws(moex_context *ctx, const moex_gl_wgrad *s);
moex_status moex_gl_wgrad_run(moex_context *ctx, const moex_call *c, const moex_groups *g, const moex_gl_wgrad *s,
                              void *sub);

/* The MoE layers (moe_layer.c, shared with the EP MoE layer, ep_layer.c): the layer's inputs
 * (and y when need_y) with the weights of G experts (0: the router's E), setting d; the
 * gradients' outputs of the backward (weights of d->G experts, drouter_w of d->E). */
moex_status moex_moe_layer_check(moex_context *ctx, const char *op, const moex_moe_layer_args *a, bool need_y,
                                 int64_t G, moex_moe_dims *d);
moex_status moex_moe_layer_check_grads(moex_context *ctx, const char *op, const moex_moe_layer_grad_args *a,
                                       moex_purpose p, const moex_moe_dims *d);

/* The grouped MLP of the MoE layers (moe_layer.c, shared with ep_layer.c) on their R expert
 * rows (the MoE layer's T k permuted rows, the EP MoE layer's received ones) in d->G groups:
 * the operands a layer keeps in `saved` for it, carved from c (data NULL where c has no base:
 * shapes only), and its forward's and backward's arguments from the layer's, on those rows
 * (y, dy, dx: [R, H]; dprobs: [R] f32 or absent). */
typedef struct moex_moe_rows {
    moex_tensor splits;                 /* [G] i64 */
    moex_tensor probs;                  /* [R] f32 */
    moex_tensor x, h, z;                /* [R, H], [R, 2F], [R, F] */
} moex_moe_rows;
moex_moe_rows moex_moe_rows_take(moex_carver *c, const moex_moe_dims *d, int64_t R);
moex_grouped_mlp_args moex_moe_mlp_args(const moex_moe_layer_args *a, const moex_moe_rows *r, moex_tensor y);
moex_grouped_mlp_grad_args moex_moe_mlp_grad_args(const moex_moe_layer_grad_args *a, const moex_moe_rows *r,
                                                  moex_tensor dy, moex_tensor dx, moex_tensor dprobs);

/* The MoE layers' router steps (moe_router.c): the forward writes io's logits [T, E] f32,
 * probs [T, k] f32 and ids [T, k] i32; the backward reads io's logits and ids and dprobs
 * [T, k] f32, writes drouter_w and dx as asked (dx = round(dxf + dlogits Wr), dxf [T, H] f32,
 * which it may overwrite). Each takes a workspace of its query's bytes. */
typedef struct moex_moe_router_io {
    moex_tensor logits, probs, ids;
} moex_moe_router_io;
/* The router's outputs that a layer keeps in its `saved` buffer, carved from c (data NULL
 * where c has no base: shapes only): logits [T, E] f32, probs [T, k] f32, ids [T, k] i32. */
moex_moe_router_io moex_moe_router_io_take(moex_carver *c, const moex_moe_dims *d);
size_t moex_moe_router_forward_ws(moex_context *ctx, const moex_moe_layer_args *a, const moex_moe_dims *d);
moex_status moex_moe_router_forward(moex_context *ctx, const moex_call *c, const moex_moe_layer_args *a,
                                    const moex_moe_dims *d, const moex_moe_router_io *io, void *ws);
size_t moex_moe_router_backward_ws(moex_context *ctx, const moex_moe_layer_grad_args *a, const moex_moe_dims *d);
moex_status moex_moe_router_backward(moex_context *ctx, const moex_call *c, const moex_moe_layer_grad_args *a,
                                     const moex_moe_dims *d, const moex_moe_router_io *io,
                                     const moex_tensor *dprobs, float *dxf, void *ws);

#endif /* MOEX_OP_H */
