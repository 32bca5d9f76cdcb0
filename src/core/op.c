/*
 * op.c - the op names and the dispatch to each op's functions, both from op_list.h, the two
 * functions behind every public entry point (the workspace size query and the run), and the
 * steps the compositions share.
 */
#include "op.h"

/* The public names of the ops, from op_list.h. */
#define NAME_(ID, name, args_t, dims_t) [MOEX_OP_##ID] = "moex_" #name,
#define NAME_P_(ID, name, args_t, dims_t, prim) NAME_(ID, name, args_t, dims_t)
static const char *const op_names[] = {[MOEX_OP_NONE] = "an unknown operation", MOEX_OPS(NAME_, NAME_P_)};
#undef NAME_
#undef NAME_P_
#define SIZE_NAME_(ID, name, args_t, dims_t) [MOEX_OP_##ID] = "moex_" #name "_workspace_size",
#define SIZE_NAME_P_(ID, name, args_t, dims_t, prim) SIZE_NAME_(ID, name, args_t, dims_t)
static const char *const op_size_names[] = {[MOEX_OP_NONE] = "", MOEX_OPS(SIZE_NAME_, SIZE_NAME_P_)};
#undef SIZE_NAME_
#undef SIZE_NAME_P_

_Static_assert(sizeof op_names / sizeof op_names[0] == MOEX_OP_COUNT, "op_names must have a row per op_list.h row");
_Static_assert(sizeof op_size_names / sizeof op_size_names[0] == MOEX_OP_COUNT,
               "op_size_names must have a row per op_list.h row");

const char *moex_op_name(moex_op_id id) {
    return id > MOEX_OP_NONE && id < MOEX_OP_COUNT ? op_names[id] : op_names[MOEX_OP_NONE];
}

/* ---- the dispatch: each op's functions (op.h) by its id -------------------------------
 * Three switches from op_list.h's rows: the untyped args become the row's argument struct,
 * and the dims its member of the union (a pointer to a union, converted, points to each of
 * its members). A P row's workspace query and run are its backend primitive's. */

static moex_status op_validate(moex_context *ctx, moex_op_id id, const char *op, const void *a, moex_purpose p,
                               moex_dims *d) {
#define CASE_(ID, name, args_t, dims_t) \
    case MOEX_OP_##ID: return moex_op_##name##_validate(ctx, op, (const args_t *)a, p, (dims_t *)d);
#define CASE_P_(ID, name, args_t, dims_t, prim) CASE_(ID, name, args_t, dims_t)
    switch (id) {
        MOEX_OPS(CASE_, CASE_P_)
    default: break;   /* MOEX_OP_NONE, MOEX_OP_COUNT */
    }
#undef CASE_
#undef CASE_P_
    return moex_fail(ctx, MOEX_ERR_INTERNAL, "%s: no operation has id %d", op, (int)id);
}

/* Called after op_validate succeeded: id is an op's. */
static size_t op_ws(moex_context *ctx, moex_op_id id, const void *a, const moex_dims *d) {
#define CASE_(ID, name, args_t, dims_t) \
    case MOEX_OP_##ID: return moex_op_##name##_ws(ctx, (const args_t *)a, (const dims_t *)d);
#define CASE_P_(ID, name, args_t, dims_t, prim) \
    case MOEX_OP_##ID: return ctx->ops->prim##_ws(ctx, (const args_t *)a, (const dims_t *)d);
    switch (id) {
        MOEX_OPS(CASE_, CASE_P_)
    default: break;   /* MOEX_OP_NONE, MOEX_OP_COUNT */
    }
#undef CASE_
#undef CASE_P_
    return 0;
}

static moex_status op_run(moex_context *ctx, moex_op_id id, const moex_call *c, const void *a, const moex_dims *d,
                          void *ws) {
#define CASE_(ID, name, args_t, dims_t) \
    case MOEX_OP_##ID: return moex_op_##name##_run(ctx, c, (const args_t *)a, (const dims_t *)d, ws);
#define CASE_P_(ID, name, args_t, dims_t, prim) \
    case MOEX_OP_##ID: return ctx->ops->prim(ctx, c, (const args_t *)a, (const dims_t *)d, ws);
    switch (id) {
        MOEX_OPS(CASE_, CASE_P_)
    default: break;   /* MOEX_OP_NONE, MOEX_OP_COUNT */
    }
#undef CASE_
#undef CASE_P_
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
