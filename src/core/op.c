/*
 * op.c - the op names from op_list.h and the dispatch to each op's functions, the two
 * functions behind every public entry point (the workspace size query and the run), and the
 * steps the compositions share.
 */
#include "op.h"

/* The public names of the ops, from op_list.h. */
#define NAME_(ID, name, args_t, dims_t) [MOEX_OP_##ID] = "moex_" #name,
static const char *const op_names[] = {[MOEX_OP_NONE] = "an unknown operation", MOEX_OPS(NAME_)};
#undef NAME_
#define SIZE_NAME_(ID, name, args_t, dims_t) [MOEX_OP_##ID] = "moex_" #name "_workspace_size",
static const char *const op_size_names[] = {[MOEX_OP_NONE] = "", MOEX_OPS(SIZE_NAME_)};
#undef SIZE_NAME_

_Static_assert(sizeof op_names / sizeof op_names[0] == MOEX_OP_COUNT, "op_names must have a row per op_list.h row");
_Static_assert(sizeof op_size_names / sizeof op_size_names[0] == MOEX_OP_COUNT,
               "op_size_names must have a row per op_list.h row");

const char *moex_op_name(moex_op_id id) {
    return id > MOEX_OP_NONE && id < MOEX_OP_COUNT ? op_names[id] : op_names[MOEX_OP_NONE];
}

/* ---- the dispatch: each op's functions (op.h) by its id -------------------------------
 * One case per row of op_list.h (a missing one is a -Wswitch warning); the untyped args
 * become the op's argument struct, and the dims its member of the union. Each case is a plain
 * call that grep finds: the three switches repeat in shape by design. */

static moex_status op_validate(moex_context *ctx, moex_op_id id, const char *op, const void *a, moex_purpose p,
                               moex_dims *d) {
    switch (id) {
    case MOEX_OP_SPLITS_TO_OFFSETS: return moex_op_splits_to_offsets_validate(ctx, op, a, p, &d->splits);
    case MOEX_OP_ZERO_TAIL: return moex_op_zero_tail_validate(ctx, op, a, p, &d->tail);
    case MOEX_OP_WEIGHT_MAPS_WRITE: return moex_op_weight_maps_write_validate(ctx, op, a, p, &d->gl);
    case MOEX_OP_GROUPED_LINEAR_FORWARD: return moex_op_grouped_linear_forward_validate(ctx, op, a, p, &d->gl);
    case MOEX_OP_GROUPED_LINEAR_BACKWARD_DATA:
        return moex_op_grouped_linear_backward_data_validate(ctx, op, a, p, &d->gl);
    case MOEX_OP_GROUPED_LINEAR_BACKWARD_WEIGHT:
        return moex_op_grouped_linear_backward_weight_validate(ctx, op, a, p, &d->gl);
    case MOEX_OP_SCALED_GLU_FORWARD: return moex_op_scaled_glu_forward_validate(ctx, op, a, p, &d->glu);
    case MOEX_OP_SCALED_GLU_BACKWARD: return moex_op_scaled_glu_backward_validate(ctx, op, a, p, &d->glu);
    case MOEX_OP_GROUPED_MLP_FORWARD: return moex_op_grouped_mlp_forward_validate(ctx, op, a, p, &d->mlp);
    case MOEX_OP_GROUPED_MLP_BACKWARD: return moex_op_grouped_mlp_backward_validate(ctx, op, a, p, &d->mlp);
    case MOEX_OP_ROUTER_FORWARD: return moex_op_router_forward_validate(ctx, op, a, p, &d->router);
    case MOEX_OP_ROUTER_BACKWARD: return moex_op_router_backward_validate(ctx, op, a, p, &d->router);
    case MOEX_OP_PERMUTE_FORWARD: return moex_op_permute_forward_validate(ctx, op, a, p, &d->perm);
    case MOEX_OP_PERMUTE_BACKWARD: return moex_op_permute_backward_validate(ctx, op, a, p, &d->perm);
    case MOEX_OP_UNPERMUTE_FORWARD: return moex_op_unpermute_forward_validate(ctx, op, a, p, &d->perm);
    case MOEX_OP_UNPERMUTE_BACKWARD: return moex_op_unpermute_backward_validate(ctx, op, a, p, &d->perm);
    case MOEX_OP_MOE_LAYER_FORWARD: return moex_op_moe_layer_forward_validate(ctx, op, a, p, &d->moe);
    case MOEX_OP_MOE_LAYER_BACKWARD: return moex_op_moe_layer_backward_validate(ctx, op, a, p, &d->moe);
    case MOEX_OP_GROUP_QUANTIZE: return moex_op_group_quantize_validate(ctx, op, a, p, &d->quant);
    case MOEX_OP_GROUP_DEQUANTIZE: return moex_op_group_dequantize_validate(ctx, op, a, p, &d->quant);
    case MOEX_OP_WEIGHT_QUANTIZE: return moex_op_weight_quantize_validate(ctx, op, a, p, &d->quant);
    case MOEX_OP_WEIGHT_DEQUANTIZE: return moex_op_weight_dequantize_validate(ctx, op, a, p, &d->quant);
    case MOEX_OP_GROUPED_LINEAR_FP8_FORWARD: return moex_op_grouped_linear_fp8_forward_validate(ctx, op, a, p, &d->fp8);
    case MOEX_OP_GROUPED_LINEAR_FP8_BACKWARD_WEIGHT:
        return moex_op_grouped_linear_fp8_backward_weight_validate(ctx, op, a, p, &d->fp8);
    case MOEX_OP_EP_DISPATCH_FORWARD: return moex_op_ep_dispatch_forward_validate(ctx, op, a, p, &d->ep);
    case MOEX_OP_EP_DISPATCH_BACKWARD: return moex_op_ep_dispatch_backward_validate(ctx, op, a, p, &d->ep);
    case MOEX_OP_EP_COMBINE_FORWARD: return moex_op_ep_combine_forward_validate(ctx, op, a, p, &d->ep);
    case MOEX_OP_EP_COMBINE_BACKWARD: return moex_op_ep_combine_backward_validate(ctx, op, a, p, &d->ep);
    case MOEX_OP_EP_MOE_LAYER_FORWARD: return moex_op_ep_moe_layer_forward_validate(ctx, op, a, p, &d->ep);
    case MOEX_OP_EP_MOE_LAYER_BACKWARD: return moex_op_ep_moe_layer_backward_validate(ctx, op, a, p, &d->ep);
    case MOEX_OP_NONE:
    case MOEX_OP_COUNT: break;
    }
    return moex_fail(ctx, MOEX_ERR_INTERNAL, "%s: no operation has id %d", op, (int)id);
}

/* Called after op_validate succeeded: id is an op's. */
static size_t op_ws(moex_context *ctx, moex_op_id id, const void *a, const moex_dims *d) {
    switch (id) {
    case MOEX_OP_SPLITS_TO_OFFSETS: return moex_op_splits_to_offsets_ws(ctx, a, &d->splits);
    case MOEX_OP_ZERO_TAIL: return moex_op_zero_tail_ws(ctx, a, &d->tail);
    case MOEX_OP_WEIGHT_MAPS_WRITE: return moex_op_weight_maps_write_ws(ctx, a, &d->gl);
    case MOEX_OP_GROUPED_LINEAR_FORWARD: return moex_op_grouped_linear_forward_ws(ctx, a, &d->gl);
    case MOEX_OP_GROUPED_LINEAR_BACKWARD_DATA: return moex_op_grouped_linear_backward_data_ws(ctx, a, &d->gl);
    case MOEX_OP_GROUPED_LINEAR_BACKWARD_WEIGHT: return moex_op_grouped_linear_backward_weight_ws(ctx, a, &d->gl);
    case MOEX_OP_SCALED_GLU_FORWARD: return moex_op_scaled_glu_forward_ws(ctx, a, &d->glu);
    case MOEX_OP_SCALED_GLU_BACKWARD: return moex_op_scaled_glu_backward_ws(ctx, a, &d->glu);
    case MOEX_OP_GROUPED_MLP_FORWARD: return moex_op_grouped_mlp_forward_ws(ctx, a, &d->mlp);
    case MOEX_OP_GROUPED_MLP_BACKWARD: return moex_op_grouped_mlp_backward_ws(ctx, a, &d->mlp);
    case MOEX_OP_ROUTER_FORWARD: return moex_op_router_forward_ws(ctx, a, &d->router);
    case MOEX_OP_ROUTER_BACKWARD: return moex_op_router_backward_ws(ctx, a, &d->router);
    case MOEX_OP_PERMUTE_FORWARD: return moex_op_permute_forward_ws(ctx, a, &d->perm);
    case MOEX_OP_PERMUTE_BACKWARD: return moex_op_permute_backward_ws(ctx, a, &d->perm);
    case MOEX_OP_UNPERMUTE_FORWARD: return moex_op_unpermute_forward_ws(ctx, a, &d->perm);
    case MOEX_OP_UNPERMUTE_BACKWARD: return moex_op_unpermute_backward_ws(ctx, a, &d->perm);
    case MOEX_OP_MOE_LAYER_FORWARD: return moex_op_moe_layer_forward_ws(ctx, a, &d->moe);
    case MOEX_OP_MOE_LAYER_BACKWARD: return moex_op_moe_layer_backward_ws(ctx, a, &d->moe);
    case MOEX_OP_GROUP_QUANTIZE: return moex_op_group_quantize_ws(ctx, a, &d->quant);
    case MOEX_OP_GROUP_DEQUANTIZE: return moex_op_group_dequantize_ws(ctx, a, &d->quant);
    case MOEX_OP_WEIGHT_QUANTIZE: return moex_op_weight_quantize_ws(ctx, a, &d->quant);
    case MOEX_OP_WEIGHT_DEQUANTIZE: return moex_op_weight_dequantize_ws(ctx, a, &d->quant);
    case MOEX_OP_GROUPED_LINEAR_FP8_FORWARD: return moex_op_grouped_linear_fp8_forward_ws(ctx, a, &d->fp8);
    case MOEX_OP_GROUPED_LINEAR_FP8_BACKWARD_WEIGHT:
        return moex_op_grouped_linear_fp8_backward_weight_ws(ctx, a, &d->fp8);
    case MOEX_OP_EP_DISPATCH_FORWARD: return moex_op_ep_dispatch_forward_ws(ctx, a, &d->ep);
    case MOEX_OP_EP_DISPATCH_BACKWARD: return moex_op_ep_dispatch_backward_ws(ctx, a, &d->ep);
    case MOEX_OP_EP_COMBINE_FORWARD: return moex_op_ep_combine_forward_ws(ctx, a, &d->ep);
    case MOEX_OP_EP_COMBINE_BACKWARD: return moex_op_ep_combine_backward_ws(ctx, a, &d->ep);
    case MOEX_OP_EP_MOE_LAYER_FORWARD: return moex_op_ep_moe_layer_forward_ws(ctx, a, &d->ep);
    case MOEX_OP_EP_MOE_LAYER_BACKWARD: return moex_op_ep_moe_layer_backward_ws(ctx, a, &d->ep);
    case MOEX_OP_NONE:
    case MOEX_OP_COUNT: break;
    }
    return 0;
}

static moex_status op_run(moex_context *ctx, moex_op_id id, const moex_call *c, const void *a, const moex_dims *d,
                          void *ws) {
    switch (id) {
    case MOEX_OP_SPLITS_TO_OFFSETS: return moex_op_splits_to_offsets_run(ctx, c, a, &d->splits, ws);
    case MOEX_OP_ZERO_TAIL: return moex_op_zero_tail_run(ctx, c, a, &d->tail, ws);
    case MOEX_OP_WEIGHT_MAPS_WRITE: return moex_op_weight_maps_write_run(ctx, c, a, &d->gl, ws);
    case MOEX_OP_GROUPED_LINEAR_FORWARD: return moex_op_grouped_linear_forward_run(ctx, c, a, &d->gl, ws);
    case MOEX_OP_GROUPED_LINEAR_BACKWARD_DATA: return moex_op_grouped_linear_backward_data_run(ctx, c, a, &d->gl, ws);
    case MOEX_OP_GROUPED_LINEAR_BACKWARD_WEIGHT:
        return moex_op_grouped_linear_backward_weight_run(ctx, c, a, &d->gl, ws);
    case MOEX_OP_SCALED_GLU_FORWARD: return moex_op_scaled_glu_forward_run(ctx, c, a, &d->glu, ws);
    case MOEX_OP_SCALED_GLU_BACKWARD: return moex_op_scaled_glu_backward_run(ctx, c, a, &d->glu, ws);
    case MOEX_OP_GROUPED_MLP_FORWARD: return moex_op_grouped_mlp_forward_run(ctx, c, a, &d->mlp, ws);
    case MOEX_OP_GROUPED_MLP_BACKWARD: return moex_op_grouped_mlp_backward_run(ctx, c, a, &d->mlp, ws);
    case MOEX_OP_ROUTER_FORWARD: return moex_op_router_forward_run(ctx, c, a, &d->router, ws);
    case MOEX_OP_ROUTER_BACKWARD: return moex_op_router_backward_run(ctx, c, a, &d->router, ws);
    case MOEX_OP_PERMUTE_FORWARD: return moex_op_permute_forward_run(ctx, c, a, &d->perm, ws);
    case MOEX_OP_PERMUTE_BACKWARD: return moex_op_permute_backward_run(ctx, c, a, &d->perm, ws);
    case MOEX_OP_UNPERMUTE_FORWARD: return moex_op_unpermute_forward_run(ctx, c, a, &d->perm, ws);
    case MOEX_OP_UNPERMUTE_BACKWARD: return moex_op_unpermute_backward_run(ctx, c, a, &d->perm, ws);
    case MOEX_OP_MOE_LAYER_FORWARD: return moex_op_moe_layer_forward_run(ctx, c, a, &d->moe, ws);
    case MOEX_OP_MOE_LAYER_BACKWARD: return moex_op_moe_layer_backward_run(ctx, c, a, &d->moe, ws);
    case MOEX_OP_GROUP_QUANTIZE: return moex_op_group_quantize_run(ctx, c, a, &d->quant, ws);
    case MOEX_OP_GROUP_DEQUANTIZE: return moex_op_group_dequantize_run(ctx, c, a, &d->quant, ws);
    case MOEX_OP_WEIGHT_QUANTIZE: return moex_op_weight_quantize_run(ctx, c, a, &d->quant, ws);
    case MOEX_OP_WEIGHT_DEQUANTIZE: return moex_op_weight_dequantize_run(ctx, c, a, &d->quant, ws);
    case MOEX_OP_GROUPED_LINEAR_FP8_FORWARD: return moex_op_grouped_linear_fp8_forward_run(ctx, c, a, &d->fp8, ws);
    case MOEX_OP_GROUPED_LINEAR_FP8_BACKWARD_WEIGHT:
        return moex_op_grouped_linear_fp8_backward_weight_run(ctx, c, a, &d->fp8, ws);
    case MOEX_OP_EP_DISPATCH_FORWARD: return moex_op_ep_dispatch_forward_run(ctx, c, a, &d->ep, ws);
    case MOEX_OP_EP_DISPATCH_BACKWARD: return moex_op_ep_dispatch_backward_run(ctx, c, a, &d->ep, ws);
    case MOEX_OP_EP_COMBINE_FORWARD: return moex_op_ep_combine_forward_run(ctx, c, a, &d->ep, ws);
    case MOEX_OP_EP_COMBINE_BACKWARD: return moex_op_ep_combine_backward_run(ctx, c, a, &d->ep, ws);
    case MOEX_OP_EP_MOE_LAYER_FORWARD: return moex_op_ep_moe_layer_forward_run(ctx, c, a, &d->ep, ws);
    case MOEX_OP_EP_MOE_LAYER_BACKWARD: return moex_op_ep_moe_layer_backward_run(ctx, c, a, &d->ep, ws);
    case MOEX_OP_NONE:
    case MOEX_OP_COUNT: break;
    }
    return moex_fail(ctx, MOEX_ERR_INTERNAL, "%s: no operation has id %d", c->op, (int)id);
}

/* ---- the two functions behind every public entry point -------------------------------- */

moex_status moex_op_workspace_size(moex_context *ctx, moex_op_id id, const void *args, size_t *bytes) {
    const char *op = op_size_names[id];
    MOEX_TRY(moex_enter(ctx, op, args));
    if (!bytes) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: bytes is NULL", op);
    moex_dims d;
    MOEX_TRY(op_validate(ctx, id, op, args, MOEX_FOR_SIZE, &d));
    return moex_buffer_public_size(ctx, op, "workspace", op_ws(ctx, id, args, &d), bytes);
}

moex_status moex_op_run(moex_context *ctx, moex_op_id id, const void *args, void *workspace,
                        size_t workspace_bytes, moex_stream stream) {
    const char *op = op_names[id];
    MOEX_TRY(moex_enter(ctx, op, args));
    moex_dims d;
    MOEX_TRY(op_validate(ctx, id, op, args, MOEX_FOR_RUN, &d));
    const size_t need = op_ws(ctx, id, args, &d);
    void *ws = NULL;
    MOEX_TRY(moex_buffer_prepare(ctx, op, "workspace", need, workspace, workspace_bytes, MOEX_SPAN_OUT, &ws));
    MOEX_TRY(moex_check_overlap(ctx, op));
    const moex_call c = {op, id, stream};
    const moex_backend_ops *ops = ctx->ops;
    int scope = 0;
    if (ops->enter) MOEX_TRY(ops->enter(ctx, &c, &scope));
    const moex_status st = op_run(ctx, id, &c, args, &d, ws);
    return ops->leave ? ops->leave(ctx, scope, st) : st;
}

moex_status moex_check_limits(moex_context *ctx, const moex_call *c, int64_t rows, int64_t groups, int64_t experts) {
    const moex_backend_ops *ops = ctx->ops;
    return ops->check_limits ? ops->check_limits(ctx, c, rows, groups, experts) : MOEX_OK;
}

moex_status moex_prepare_groups(moex_context *ctx, const moex_call *c, const moex_tensor *splits, int64_t T,
                                const moex_grouped_linear_args *fwd, void *storage, moex_groups *g) {
    return ctx->ops->groups_prepare(ctx, c, (const int64_t *)splits->data, splits->shape[0], T, fwd, storage, g);
}

moex_status moex_begin_groups(moex_context *ctx, const moex_call *c, const moex_tensor *splits, int64_t T,
                              const moex_grouped_linear_args *fwd, void *storage, moex_groups *g) {
    MOEX_TRY(moex_check_limits(ctx, c, T, splits->shape[0], 0));
    return moex_prepare_groups(ctx, c, splits, T, fwd, storage, g);
}

moex_groups_layout moex_groups_layout_of(moex_context *ctx, int64_t G, int64_t T, const moex_grouped_linear_args *fwd,
                                         size_t sub, void *ws) {
    moex_carver c = {(char *)ws, 0};
    moex_groups_layout l;
    l.groups = G > 0 ? moex_take(&c, ctx->ops->groups_ws(ctx, G, T, fwd)) : NULL;
    l.sub = moex_take(&c, sub);
    l.total = c.used;
    return l;
}

moex_status moex_groups_layout_prepare(moex_context *ctx, const moex_call *c, const moex_tensor *splits, int64_t G,
                                       int64_t T, const moex_grouped_linear_args *fwd, void *ws, moex_groups *g,
                                       void **sub) {
    const moex_groups_layout l = moex_groups_layout_of(ctx, G, T, fwd, 0, ws);
    *sub = l.sub;
    return G > 0 ? moex_prepare_groups(ctx, c, splits, T, fwd, l.groups, g) : MOEX_OK;
}
