/*
 * validate.c - argument checks shared by the public entry points (see validate.h).
 */
#include "validate.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

const char *moex_dtype_name(moex_dtype dt) {
    switch (dt) {
    case MOEX_DTYPE_F32: return "f32";
    case MOEX_DTYPE_BF16: return "bf16";
    case MOEX_DTYPE_F16: return "f16";
    case MOEX_DTYPE_I32: return "i32";
    case MOEX_DTYPE_I64: return "i64";
    }
    return "unknown";
}

static void format_dtypes(char *buf, size_t n, unsigned dtypes) {
    buf[0] = '\0';
    for (int d = 0; d <= MOEX_DTYPE_I64; d++) {
        if (!(dtypes & MOEX_DT(d))) continue;
        size_t len = strlen(buf);
        snprintf(buf + len, n - len, "%s%s", len ? " or " : "", moex_dtype_name((moex_dtype)d));
    }
}

static void format_shape(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t len = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && len < n; i++) {
        if (shape[i] < 0)
            len += (size_t)snprintf(buf + len, n - len, "%s*", i ? ", " : "");
        else
            len += (size_t)snprintf(buf + len, n - len, "%s%lld", i ? ", " : "", (long long)shape[i]);
    }
    if (len < n) snprintf(buf + len, n - len, "]");
}

moex_status moex_check_tensor(moex_context *ctx, const char *op, const char *name, const moex_tensor *t,
                              int ndim, const int64_t *shape, unsigned dtypes) {
    char want[128], got[128];
    if (t->ndim == 0)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s is required but absent (ndim == 0)", op, name);
    if (t->ndim < 0 || t->ndim > MOEX_MAX_DIMS)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s has ndim %d", op, name, (int)t->ndim);
    format_shape(want, sizeof want, ndim, shape);
    format_shape(got, sizeof got, t->ndim, t->shape);
    if (t->ndim != ndim)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s must be %d-D %s, got %d-D %s", op, name, ndim,
                         want, (int)t->ndim, got);
    /* The element count, kept small enough that every byte offset fits an int64. */
    const int64_t max_elems = INT64_MAX / 8;
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (t->shape[i] < 0)
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s has a negative dimension: %s", op, name, got);
        if (shape[i] >= 0 && t->shape[i] != shape[i])
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s must be %s, got %s", op, name, want, got);
        if (t->shape[i] > 0 && numel > max_elems / t->shape[i])
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s %s has too many elements", op, name, got);
        numel *= t->shape[i];
    }
    if ((unsigned)t->dtype > (unsigned)MOEX_DTYPE_I64 || !(dtypes & MOEX_DT(t->dtype))) {
        char dts[64];
        format_dtypes(dts, sizeof dts, dtypes);
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s must be %s, got %s", op, name, dts,
                         moex_dtype_name(t->dtype));
    }
    if (!t->data && numel > 0)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s.data is NULL", op, name);
    return MOEX_OK;
}

moex_status moex_check_optional(moex_context *ctx, const char *op, const char *name,
                                const moex_tensor *t, int ndim, const int64_t *shape, unsigned dtypes) {
    if (t->ndim == 0) return MOEX_OK;
    return moex_check_tensor(ctx, op, name, t, ndim, shape, dtypes);
}

moex_status moex_check_weight(moex_context *ctx, const char *op, const char *name, const moex_weight *w,
                              int64_t G, int64_t R, int64_t C, unsigned dtypes) {
    const int64_t shape[3] = {G, R, C};
    if (!w->ptrs) return moex_check_tensor(ctx, op, name, &w->t, 3, shape, dtypes);
    if (w->t.data)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: %s has both t.data and ptrs; discrete weights set t.data = NULL", op, name);
    /* Discrete: t describes dtype and shape only; check it as if it had data. */
    moex_tensor desc = w->t;
    desc.data = (void *)w->ptrs;
    MOEX_TRY(moex_check_tensor(ctx, op, name, &desc, 3, shape, dtypes));
    /* The pointer array is host memory only on the CPU backend. */
    if (ctx->backend == MOEX_BACKEND_CPU && desc.shape[1] * desc.shape[2] > 0)
        for (int64_t g = 0; g < desc.shape[0]; g++)
            if (!w->ptrs[g])
                return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s.ptrs[%lld] is NULL", op, name, (long long)g);
    return MOEX_OK;
}

moex_status moex_check_splits_arg(moex_context *ctx, const char *op, const moex_tensor *splits, int64_t *G) {
    const int64_t any[1] = {-1};
    MOEX_TRY(moex_check_tensor(ctx, op, "splits", splits, 1, any, MOEX_DT(MOEX_DTYPE_I64)));
    if (splits->shape[0] < 1)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: splits has G = 0 groups; need G >= 1", op);
    *G = splits->shape[0];
    return MOEX_OK;
}

moex_status moex_check_glu(moex_context *ctx, const char *op, const moex_glu_params *glu, int64_t F) {
    if (glu->kind != MOEX_GLU_SWIGLU && glu->kind != MOEX_GLU_CLAMPED_SWIGLU)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: unknown glu.kind %d", op, (int)glu->kind);
    if (glu->layout != MOEX_GLU_CONTIGUOUS && glu->layout != MOEX_GLU_INTERLEAVED_32)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: unknown glu.layout %d", op, (int)glu->layout);
    if (glu->layout == MOEX_GLU_INTERLEAVED_32 && F % 32 != 0)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: glu.layout INTERLEAVED_32 needs F a multiple of 32, got F = %lld", op, (long long)F);
    if (glu->kind == MOEX_GLU_CLAMPED_SWIGLU &&
        (!isfinite(glu->limit) || !isfinite(glu->alpha) || !isfinite(glu->offset) || !(glu->limit > 0.0f)))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: clamped SwiGLU needs finite constants and limit > 0, got limit %g alpha %g offset %g "
                         "(moex_glu_params_default gives the GPT-OSS ones)",
                         op, (double)glu->limit, (double)glu->alpha, (double)glu->offset);
    return MOEX_OK;
}

moex_status moex_check_bias_mode(moex_context *ctx, const char *op, moex_bias_mode mode) {
    if (mode != MOEX_BIAS_NONE && mode != MOEX_BIAS_ADD && mode != MOEX_BIAS_SCALED)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: unknown bias mode %d", op, (int)mode);
    return MOEX_OK;
}

moex_status moex_check_grad_mode(moex_context *ctx, const char *op, moex_grad_mode mode) {
    if (mode != MOEX_GRAD_WRITE && mode != MOEX_GRAD_ACCUMULATE)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: unknown grad mode %d", op, (int)mode);
    return MOEX_OK;
}

size_t moex_ws_public_size(size_t backend_bytes) {
    return backend_bytes ? backend_bytes + MOEX_WS_ALIGN : 0;
}

moex_status moex_ws_prepare(moex_context *ctx, const char *op, size_t backend_bytes, void *ws,
                            size_t ws_bytes, void **aligned) {
    *aligned = NULL;
    if (backend_bytes == 0) return MOEX_OK;
    size_t need = moex_ws_public_size(backend_bytes);
    if (!ws || ws_bytes < need)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: workspace %s%zu bytes, but the workspace-size query asks for %zu", op,
                         ws ? "has " : "is NULL with ", ws_bytes, need);
    uintptr_t p = ((uintptr_t)ws + MOEX_WS_ALIGN - 1) / MOEX_WS_ALIGN * MOEX_WS_ALIGN;
    *aligned = (void *)p;
    return MOEX_OK;
}

moex_status moex_enter(moex_context *ctx, const char *op, const void *args) {
    if (!ctx) return moex_fail(NULL, MOEX_ERR_INVALID_ARG, "%s: ctx is NULL", op);
    ctx->msg[0] = '\0';
    if (!args) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: args is NULL", op);
    return MOEX_OK;
}
