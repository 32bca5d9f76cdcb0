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
 * and its public pair as plain definitions that return moex_op_workspace_size(...) and
 * moex_op_run(...).
 */
#ifndef MOEX_OP_H
#define MOEX_OP_H

#include "backend.h"
#include "validate.h"

typedef enum moex_purpose { MOEX_FOR_SIZE = 0, MOEX_FOR_RUN = 1 } moex_purpose;

#define MOEX_OP_DECLARE_(ID, name, args_t, dims_t)                                                      \
    moex_status moex_op_##name##_validate(moex_context *ctx, const char *op, const args_t *a, moex_purpose p, \
                                          dims_t *d);                                                   \
    size_t moex_op_##name##_ws(moex_context *ctx, const args_t *a, const dims_t *d);                    \
    moex_status moex_op_##name##_run(moex_context *ctx, const moex_call *c, const args_t *a, const dims_t *d, \
                                     void *ws);
MOEX_OPS(MOEX_OP_DECLARE_)
#undef MOEX_OP_DECLARE_

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

/* The layers' FP8 recipe (fp8_layers.c; docs/ops.md 9.11): the grouped linear's and the grouped
 * MLP's compositions when fp8.mode is not MOEX_FP8_OFF (validated args and dims, as the plain
 * ones get them). */
/* On a device backend the FP8 GEMM kernels need the outputs they write (data: y, h, dx, a
 * packed f32 dW) 16-byte aligned: checked with the arguments (p: for a run), so that a refused
 * call has written nothing. */
moex_status moex_fp8_check_out(moex_context *ctx, const char *op, const moex_fp8_recipe *r, moex_purpose p,
                               const char *name, const void *data);
size_t moex_fp8_linear_forward_ws(moex_context *ctx, const moex_grouped_linear_args *a, const moex_gl_dims *d);
moex_status moex_fp8_linear_forward_run(moex_context *ctx, const moex_call *c, const moex_grouped_linear_args *a,
                                        const moex_gl_dims *d, void *ws);
size_t moex_fp8_linear_dgrad_ws(moex_context *ctx, const moex_grouped_linear_dgrad_args *a, const moex_gl_dims *d);
moex_status moex_fp8_linear_dgrad_run(moex_context *ctx, const moex_call *c, const moex_grouped_linear_dgrad_args *a,
                                      const moex_gl_dims *d, void *ws);
size_t moex_fp8_linear_wgrad_ws(moex_context *ctx, const moex_grouped_linear_wgrad_args *a, const moex_gl_dims *d);
moex_status moex_fp8_linear_wgrad_run(moex_context *ctx, const moex_call *c, const moex_grouped_linear_wgrad_args *a,
                                      const moex_gl_dims *d, void *ws);
size_t moex_fp8_mlp_forward_ws(moex_context *ctx, const moex_grouped_mlp_args *a, const moex_mlp_dims *d);
moex_status moex_fp8_mlp_forward_run(moex_context *ctx, const moex_call *c, const moex_grouped_mlp_args *a,
                                     const moex_mlp_dims *d, void *ws);
size_t moex_fp8_mlp_backward_ws(moex_context *ctx, const moex_grouped_mlp_grad_args *a, const moex_mlp_dims *d);
moex_status moex_fp8_mlp_backward_run(moex_context *ctx, const moex_call *c, const moex_grouped_mlp_grad_args *a,
                                      const moex_mlp_dims *d, void *ws);

/* The MoE layers (moe_layer.c, shared with the EP MoE layer, ep_layer.c): the layer's inputs
 * (and y when need_y) with the weights of G experts (0: the router's E), setting d; the
 * gradients' outputs of the backward (weights of d->G experts, drouter_w of d->E). */
moex_status moex_moe_layer_check(moex_context *ctx, const char *op, const moex_moe_layer_args *a, bool need_y,
                                 int64_t G, moex_moe_dims *d);
moex_status moex_moe_layer_check_grads(moex_context *ctx, const char *op, const moex_moe_layer_grad_args *a,
                                       moex_purpose p, const moex_moe_dims *d);

/* The MoE layers' router steps (moe_router.c): the forward writes io's logits [T, E] f32,
 * probs [T, k] f32 and ids [T, k] i32; the backward reads io's logits and ids and dprobs
 * [T, k] f32, writes drouter_w and dx as asked (dx = round(dxf + dlogits Wr), dxf [T, H] f32,
 * which it may overwrite). Each takes a workspace of its query's bytes. */
typedef struct moex_moe_router_io {
    moex_tensor logits, probs, ids;
} moex_moe_router_io;
size_t moex_moe_router_forward_ws(moex_context *ctx, const moex_moe_layer_args *a, const moex_moe_dims *d);
moex_status moex_moe_router_forward(moex_context *ctx, const moex_call *c, const moex_moe_layer_args *a,
                                    const moex_moe_dims *d, const moex_moe_router_io *io, void *ws);
size_t moex_moe_router_backward_ws(moex_context *ctx, const moex_moe_layer_grad_args *a, const moex_moe_dims *d);
moex_status moex_moe_router_backward(moex_context *ctx, const moex_call *c, const moex_moe_layer_grad_args *a,
                                     const moex_moe_dims *d, const moex_moe_router_io *io,
                                     const moex_tensor *dprobs, float *dxf, void *ws);

/* An op that is one plain primitive: its workspace is the primitive's, its run the
 * primitive (defines moex_op_<name>_ws and moex_op_<name>_run). */
#define MOEX_ONE_PRIMITIVE(name, prim, args_t, dims_t)                                                   \
    size_t moex_op_##name##_ws(moex_context *ctx, const args_t *a, const dims_t *d) {                    \
        return moex_ops(ctx)->prim##_ws(ctx, a, d);                                                      \
    }                                                                                                    \
    moex_status moex_op_##name##_run(moex_context *ctx, const moex_call *c, const args_t *a, const dims_t *d, \
                                     void *ws) {                                                         \
        return moex_ops(ctx)->prim(ctx, c, a, d, ws);                                                    \
    }

#endif /* MOEX_OP_H */
