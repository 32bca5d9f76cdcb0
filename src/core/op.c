/*
 * op.c - the op table built from op_list.h, the two functions behind every public entry
 * point (the workspace size query and the run), and two steps the compositions share.
 */
#include "op.h"

typedef struct op_def {
    const char *name;           /* "moex_<name>" */
    const char *size_name;      /* "moex_<name>_workspace_size" */
    moex_status (*validate)(moex_context *ctx, const char *op, const void *a, moex_purpose p, moex_dims *d);
    size_t (*ws)(moex_context *ctx, const void *a, const moex_dims *d);
    moex_status (*run)(moex_context *ctx, const moex_call *c, const void *a, const moex_dims *d, void *ws);
} op_def;

/* Each op's functions behind the table's untyped signatures (a pointer to the union is a
 * pointer to each of its members). */
#define THUNKS_(ID, name, args_t, dims_t)                                                               \
    static moex_status name##_validate(moex_context *ctx, const char *op, const void *a, moex_purpose p, \
                                       moex_dims *d) {                                                  \
        return moex_op_##name##_validate(ctx, op, (const args_t *)a, p, (dims_t *)d);                   \
    }                                                                                                   \
    static size_t name##_ws(moex_context *ctx, const void *a, const moex_dims *d) {                     \
        return moex_op_##name##_ws(ctx, (const args_t *)a, (const dims_t *)d);                          \
    }                                                                                                   \
    static moex_status name##_run(moex_context *ctx, const moex_call *c, const void *a, const moex_dims *d, \
                                  void *ws) {                                                           \
        return moex_op_##name##_run(ctx, c, (const args_t *)a, (const dims_t *)d, ws);                  \
    }
MOEX_OPS(THUNKS_)
#undef THUNKS_

#define ROW_(ID, name, args_t, dims_t) \
    [MOEX_OP_##ID] = {"moex_" #name, "moex_" #name "_workspace_size", name##_validate, name##_ws, name##_run},
static const op_def op_table[] = {[MOEX_OP_NONE] = {"an unknown operation", "", 0, 0, 0}, MOEX_OPS(ROW_)};
#undef ROW_

_Static_assert(sizeof op_table / sizeof op_table[0] == MOEX_OP_COUNT, "op_table must have a row per op_list.h row");

const char *moex_op_name(moex_op_id id) {
    return id > MOEX_OP_NONE && id < MOEX_OP_COUNT ? op_table[id].name : op_table[MOEX_OP_NONE].name;
}

moex_status moex_op_workspace_size(moex_context *ctx, moex_op_id id, const void *args, size_t *bytes) {
    const op_def *o = &op_table[id];
    const char *op = o->size_name;
    MOEX_TRY(moex_enter(ctx, op, args));
    if (!bytes) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: bytes is NULL", op);
    moex_dims d;
    MOEX_TRY(o->validate(ctx, op, args, MOEX_FOR_SIZE, &d));
    return moex_buffer_public_size(ctx, op, "workspace", o->ws(ctx, args, &d), bytes);
}

moex_status moex_op_run(moex_context *ctx, moex_op_id id, const void *args, void *workspace,
                        size_t workspace_bytes, moex_stream stream) {
    const op_def *o = &op_table[id];
    const char *op = o->name;
    MOEX_TRY(moex_enter(ctx, op, args));
    moex_dims d;
    MOEX_TRY(o->validate(ctx, op, args, MOEX_FOR_RUN, &d));
    const size_t need = o->ws(ctx, args, &d);
    void *ws = NULL;
    MOEX_TRY(moex_buffer_prepare(ctx, op, "workspace", need, workspace, workspace_bytes, MOEX_SPAN_OUT, &ws));
    MOEX_TRY(moex_check_overlap(ctx, op));
    const moex_call c = {op, id, stream};
    const moex_backend_ops *ops = ctx->ops;
    int scope = 0;
    if (ops->enter) MOEX_TRY(ops->enter(ctx, &c, &scope));
    const moex_status st = o->run(ctx, &c, args, &d, ws);
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
