/*
 * validate.c - argument checks shared by the public entry points (see validate.h): tensors
 * and weights, options, the caller's workspace and `saved` buffers, and the overlap rule
 * over the byte ranges the checks record.
 */
#include "validate.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

static void format_dtypes(char *buf, size_t n, unsigned dtypes) {
    buf[0] = '\0';
    for (int d = 0; d <= MOEX_DTYPE_E8M0; d++) {
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

/* ---- recorded spans ------------------------------------------------------------------ */

/* The span's name, cut to fit (a plain copy: this runs for every tensor of every call). */
static void span_name_set(moex_span *s, const char *name) {
    const size_t n = strnlen(name, sizeof s->name - 1);
    memcpy(s->name, name, n);
    s->name[n] = '\0';
}

/* Records a span; a second record of the same name replaces the first. */
static moex_status add_span(moex_context *ctx, const char *op, const moex_span *s) {
    int i = 0;
    while (i < ctx->nspans && strcmp(ctx->spans[i].name, s->name) != 0) i++;
    if (i == MOEX_MAX_SPANS)
        return moex_fail(ctx, MOEX_ERR_INTERNAL, "%s: more than %d tensors to check for overlap", op,
                         MOEX_MAX_SPANS);
    ctx->spans[i] = *s;
    if (i == ctx->nspans) ctx->nspans++;
    return MOEX_OK;
}

/* [p, p + bytes) as a span; fails when it wraps around the address space. */
static moex_status range_span(moex_context *ctx, const char *op, const char *name, const void *p, size_t bytes,
                              moex_span_role role, moex_span *s) {
    memset(s, 0, sizeof *s);
    span_name_set(s, name);
    s->out = role == MOEX_SPAN_OUT;
    if (!p || bytes == 0) return MOEX_OK;   /* empty: overlaps nothing */
    s->lo = (uintptr_t)p;
    if (bytes > UINTPTR_MAX - s->lo)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s (%zu bytes at %p) wraps around the address space", op,
                         name, bytes, p);
    s->hi = s->lo + bytes;
    return MOEX_OK;
}

moex_status moex_record_span(moex_context *ctx, const char *op, const char *name, const void *p, size_t bytes,
                             moex_span_role role) {
    moex_span s;
    MOEX_TRY(range_span(ctx, op, name, p, bytes, role, &s));
    return add_span(ctx, op, &s);
}

static size_t tensor_bytes(const moex_tensor *t) {
    return (size_t)moex_numel(t) * moex_dtype_size(t->dtype);   /* validated: <= 8 MOEX_MAX_ELEMS */
}

/* ---- tensors ------------------------------------------------------------------------- */

/* ndim, shape, element count, dtype and data of t (no span recorded). The messages are
 * formatted only on failure: validation runs on every call. */
static moex_status shape_fail(moex_context *ctx, const char *op, const char *name, const moex_tensor *t, int ndim,
                              const int64_t *shape, const char *why) {
    char want[128], got[128];
    format_shape(want, sizeof want, ndim, shape);
    format_shape(got, sizeof got, t->ndim, t->shape);
    if (why) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s %s %s", op, name, got, why);
    if (t->ndim != ndim)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s must be %d-D %s, got %d-D %s", op, name, ndim,
                         want, (int)t->ndim, got);
    return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s must be %s, got %s", op, name, want, got);
}

/* The alignment rule (moex.h, "Tensors"): data with elements is aligned to its dtype's size,
 * on every backend (the pointer's value is checked, never the memory). `what` follows the
 * name in the message (".data" for a tensor, "" for a discrete weight's matrix). */
static moex_status check_aligned(moex_context *ctx, const char *op, const char *name, const char *what,
                                 const void *p, moex_dtype dtype) {
    const size_t align = moex_dtype_size(dtype);
    if (align <= 1 || (uintptr_t)p % align == 0) return MOEX_OK;
    return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                     "%s: %s%s (%p) is not aligned to %zu bytes, the size of its dtype %s (moex.h: every tensor's "
                     "data is aligned to its dtype)", op, name, what, p, align, moex_dtype_name(dtype));
}

static moex_status check_shape(moex_context *ctx, const char *op, const char *name, const moex_tensor *t, int ndim,
                               const int64_t *shape, unsigned dtypes) {
    if (t->ndim == 0)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s is required but absent (ndim == 0)", op, name);
    if (t->ndim < 0 || t->ndim > MOEX_MAX_DIMS)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s has ndim %d", op, name, (int)t->ndim);
    if (t->ndim != ndim) return shape_fail(ctx, op, name, t, ndim, shape, NULL);
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (t->shape[i] < 0) return shape_fail(ctx, op, name, t, ndim, shape, "has a negative dimension");
        if (shape[i] >= 0 && t->shape[i] != shape[i]) return shape_fail(ctx, op, name, t, ndim, shape, NULL);
    }
    for (int i = 0; i < ndim; i++)
        if (!moex_i64_mul(numel, t->shape[i], &numel) || numel > MOEX_MAX_ELEMS)
            return shape_fail(ctx, op, name, t, ndim, shape, "has too many elements (2^60 or more)");
    if ((unsigned)t->dtype > (unsigned)MOEX_DTYPE_E8M0 || !(dtypes & MOEX_DT(t->dtype))) {
        char dts[64];
        format_dtypes(dts, sizeof dts, dtypes);
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s must be %s, got %s", op, name, dts,
                         moex_dtype_name(t->dtype));
    }
    if (!t->data && numel > 0)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s.data is NULL", op, name);
    if (numel > 0) MOEX_TRY(check_aligned(ctx, op, name, ".data", t->data, t->dtype));
    return MOEX_OK;
}

static moex_status check_tensor_as(moex_context *ctx, const char *op, const char *name, const moex_tensor *t,
                                   int ndim, const int64_t *shape, unsigned dtypes, moex_span_role role) {
    MOEX_TRY(check_shape(ctx, op, name, t, ndim, shape, dtypes));
    return moex_record_span(ctx, op, name, t->data, tensor_bytes(t), role);
}

moex_status moex_check_tensor(moex_context *ctx, const char *op, const char *name, const moex_tensor *t,
                              int ndim, const int64_t *shape, unsigned dtypes) {
    return check_tensor_as(ctx, op, name, t, ndim, shape, dtypes, MOEX_SPAN_IN);
}

moex_status moex_check_output(moex_context *ctx, const char *op, const char *name, const moex_tensor *t,
                              int ndim, const int64_t *shape, unsigned dtypes) {
    return check_tensor_as(ctx, op, name, t, ndim, shape, dtypes, MOEX_SPAN_OUT);
}

moex_status moex_check_optional(moex_context *ctx, const char *op, const char *name,
                                const moex_tensor *t, int ndim, const int64_t *shape, unsigned dtypes) {
    if (t->ndim == 0) return MOEX_OK;
    return check_tensor_as(ctx, op, name, t, ndim, shape, dtypes, MOEX_SPAN_IN);
}

moex_status moex_check_optional_output(moex_context *ctx, const char *op, const char *name,
                                       const moex_tensor *t, int ndim, const int64_t *shape, unsigned dtypes) {
    if (t->ndim == 0) return MOEX_OK;
    return check_tensor_as(ctx, op, name, t, ndim, shape, dtypes, MOEX_SPAN_OUT);
}

static moex_status check_weight_as(moex_context *ctx, const char *op, const char *name, const moex_weight *w,
                                   int64_t G, int64_t R, int64_t C, unsigned dtypes, moex_span_role role) {
    const int64_t shape[3] = {G, R, C};
    if (w->maps && (!w->ptrs || role == MOEX_SPAN_OUT))
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s has maps, which only a discrete weight that is read has "
                         "(include/moex.h: weight_maps_write)", op, name);
    if ((uintptr_t)w->maps % MOEX_WEIGHT_MAPS_ALIGN != 0)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s.maps (%p) is not %d-byte aligned", op, name, w->maps,
                         MOEX_WEIGHT_MAPS_ALIGN);
    if (!w->ptrs) return check_tensor_as(ctx, op, name, &w->t, 3, shape, dtypes, role);
    if (w->t.data)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: %s has both t.data and ptrs; discrete weights set t.data = NULL", op, name);
    if ((uintptr_t)w->ptrs % _Alignof(void *) != 0)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: %s.ptrs (%p) is not aligned to %zu bytes, the alignment of a pointer (moex.h: the "
                         "pointer array of discrete weights)", op, name, (const void *)w->ptrs, _Alignof(void *));
    /* Discrete: t describes dtype and shape only; check it as if it had data (the pointer
     * array, aligned to a pointer, passes the dtype's alignment). */
    moex_tensor desc = w->t;
    desc.data = (void *)w->ptrs;
    MOEX_TRY(check_shape(ctx, op, name, &desc, 3, shape, dtypes));
    const int64_t nmat = desc.shape[0];
    const size_t mat_bytes = (size_t)(desc.shape[1] * desc.shape[2]) * moex_dtype_size(desc.dtype);
    char arr[32];
    snprintf(arr, sizeof arr, "%s.ptrs", name);
    MOEX_TRY(moex_record_span(ctx, op, arr, w->ptrs, (size_t)nmat * sizeof(void *), MOEX_SPAN_IN));
    /* The pointer array is host memory only on the CPU backend: there the matrices are
     * checked too, and recorded for the overlap rule. */
    if (ctx->backend != MOEX_BACKEND_CPU || mat_bytes == 0) return MOEX_OK;
    for (int64_t g = 0; g < nmat; g++) {
        if (!w->ptrs[g])
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s.ptrs[%lld] is NULL", op, name, (long long)g);
        if (mat_bytes > UINTPTR_MAX - (uintptr_t)w->ptrs[g])
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s.ptrs[%lld] wraps around the address space", op,
                             name, (long long)g);
        if ((uintptr_t)w->ptrs[g] % moex_dtype_size(desc.dtype) != 0) {
            char mat[48];
            snprintf(mat, sizeof mat, "%s.ptrs[%lld]", name, (long long)g);
            return check_aligned(ctx, op, mat, "", w->ptrs[g], desc.dtype);
        }
    }
    moex_span s;
    memset(&s, 0, sizeof s);
    span_name_set(&s, name);
    s.mats = w->ptrs;
    s.nmats = nmat;
    s.mat_bytes = mat_bytes;
    s.out = role == MOEX_SPAN_OUT;
    return add_span(ctx, op, &s);
}

moex_status moex_check_weight(moex_context *ctx, const char *op, const char *name, const moex_weight *w,
                              int64_t G, int64_t R, int64_t C, unsigned dtypes) {
    return check_weight_as(ctx, op, name, w, G, R, C, dtypes, MOEX_SPAN_IN);
}

moex_status moex_check_weight_output(moex_context *ctx, const char *op, const char *name, const moex_weight *w,
                                     int64_t G, int64_t R, int64_t C, unsigned dtypes) {
    return check_weight_as(ctx, op, name, w, G, R, C, dtypes, MOEX_SPAN_OUT);
}

moex_status moex_check_internal(moex_context *ctx, const char *op, const char *name, int64_t rows, int64_t cols) {
    int64_t n;
    if (!moex_i64_mul(rows, cols, &n) || n > MOEX_MAX_ELEMS)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: the intermediate %s [%lld, %lld] would have too many elements (2^60 or more)", op, name,
                         (long long)rows, (long long)cols);
    return MOEX_OK;
}

/* ---- the overlap rule ------------------------------------------------------------------ */

/* Piece m of a span: the span's range, or matrix m of a discrete weight. */
static int64_t span_pieces(const moex_span *s) { return s->mats ? s->nmats : 1; }

static void span_piece(const moex_span *s, int64_t m, uintptr_t *lo, uintptr_t *hi) {
    if (!s->mats) {
        *lo = s->lo, *hi = s->hi;
        return;
    }
    *lo = (uintptr_t)s->mats[m];
    *hi = *lo + s->mat_bytes;
}

static void piece_name(char *buf, size_t n, const moex_span *s, int64_t m) {
    if (s->mats)
        snprintf(buf, n, "%s.ptrs[%lld]", s->name, (long long)m);
    else
        snprintf(buf, n, "%s", s->name);
}

/* Whether a piece of a overlaps a piece of b (for a == b, two different pieces). */
static bool spans_overlap(const moex_span *a, const moex_span *b, int64_t *ma, int64_t *mb) {
    for (int64_t i = 0; i < span_pieces(a); i++) {
        uintptr_t alo, ahi;
        span_piece(a, i, &alo, &ahi);
        if (alo == ahi) continue;
        for (int64_t j = a == b ? i + 1 : 0; j < span_pieces(b); j++) {
            uintptr_t blo, bhi;
            span_piece(b, j, &blo, &bhi);
            if (blo != bhi && alo < bhi && blo < ahi) {
                *ma = i, *mb = j;
                return true;
            }
        }
    }
    return false;
}

moex_status moex_check_overlap(moex_context *ctx, const char *op) {
    for (int i = 0; i < ctx->nspans; i++) {
        const moex_span *a = &ctx->spans[i];
        for (int j = a->out ? i : i + 1; j < ctx->nspans; j++) {
            const moex_span *b = &ctx->spans[j];
            int64_t ma, mb;
            if (!(a->out || b->out) || !spans_overlap(a, b, &ma, &mb)) continue;
            char an[64], bn[64];   /* the output first */
            piece_name(an, sizeof an, a->out ? a : b, a->out ? ma : mb);
            piece_name(bn, sizeof bn, a->out ? b : a, a->out ? mb : ma);
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                             "%s: %s overlaps %s in memory (an output may not overlap another tensor, the "
                             "workspace or saved)", op, an, bn);
        }
    }
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

moex_status moex_check_fp8_recipe(moex_context *ctx, const char *op, const char *name, const moex_fp8_recipe *r) {
    if (r->mode != MOEX_FP8_OFF && r->mode != MOEX_FP8_BLOCK && r->mode != MOEX_FP8_CURRENT &&
        r->mode != MOEX_FP8_MXFP8)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: unknown %s.mode %d", op, name, (int)r->mode);
    if (r->dtypes != MOEX_FP8_E4M3_ALL && r->dtypes != MOEX_FP8_HYBRID)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: unknown %s.dtypes %d", op, name, (int)r->dtypes);
    if (!isfinite(r->amax_epsilon) || r->amax_epsilon < 0.0f)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s.amax_epsilon must be finite and >= 0, got %g", op, name,
                         (double)r->amax_epsilon);
    if (r->pow2_scales && r->mode == MOEX_FP8_MXFP8)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: %s.pow2_scales is for BLOCK and CURRENT (MXFP8 scales are powers of 2 already)", op,
                         name);
    return MOEX_OK;
}

/* ---- caller buffers ------------------------------------------------------------------ */

moex_status moex_buffer_public_size(moex_context *ctx, const char *op, const char *name, size_t backend_bytes,
                                    size_t *bytes) {
    if (backend_bytes > (size_t)PTRDIFF_MAX - MOEX_WS_ALIGN)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: the %s would need more than PTRDIFF_MAX bytes; the shapes are too large", op, name);
    *bytes = backend_bytes ? backend_bytes + MOEX_WS_ALIGN : 0;
    return MOEX_OK;
}

/* The query that sizes the buffer `name` of op, for messages. */
static const char *size_query_of(const char *op, const char *name) {
    if (strcmp(name, "handle") == 0) return "moex_ep_get_info (handle_bytes)";
    if (strcmp(name, "saved") != 0) return "the workspace-size query";
    return strncmp(op, "moex_ep_", 8) == 0 ? "moex_ep_moe_layer_saved_size" : "moex_moe_layer_saved_size";
}

moex_status moex_buffer_prepare(moex_context *ctx, const char *op, const char *name, size_t backend_bytes,
                                void *buf, size_t buf_bytes, moex_span_role role, void **aligned) {
    size_t need = 0;
    *aligned = NULL;
    MOEX_TRY(moex_buffer_public_size(ctx, op, name, backend_bytes, &need));
    if (need == 0) return MOEX_OK;
    if (!buf || buf_bytes < need)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s %s%zu bytes, but %s asks for %zu", op, name,
                         buf ? "has " : "is NULL with ", buf_bytes,
                         size_query_of(op, name), need);
    uintptr_t p = ((uintptr_t)buf + MOEX_WS_ALIGN - 1) / MOEX_WS_ALIGN * MOEX_WS_ALIGN;
    *aligned = (void *)p;
    return moex_record_span(ctx, op, name, buf, buf_bytes, role);
}

moex_status moex_enter(moex_context *ctx, const char *op, const void *args) {
    if (!ctx) return moex_fail(NULL, MOEX_ERR_INVALID_ARG, "%s: ctx is NULL", op);
    ctx->msg[0] = '\0';
    ctx->nspans = 0;
    if (!args) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: args is NULL", op);
    return MOEX_OK;
}

/* ---- checks shared by several operations --------------------------------------------- */

/* Feature dimensions must be >= 1 (row counts T may be 0). */
moex_status moex_check_features(moex_context *ctx, const char *op, int64_t in, int64_t out) {
    if (in < 1 || out < 1)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: feature dimensions must be >= 1, got in %lld, out %lld",
                         op, (long long)in, (long long)out);
    return MOEX_OK;
}

/* The bias and probs a bias mode needs: ADD/SCALED need bias [G,N]; SCALED needs probs [T]. */
moex_status moex_check_probs_scaled(moex_context *ctx, const char *op, moex_bias_mode mode, const moex_tensor *probs) {
    if (mode == MOEX_BIAS_SCALED || !moex_present(probs)) return MOEX_OK;
    return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: probs is given but the bias mode is not MOEX_BIAS_SCALED", op);
}

moex_status moex_check_bias(moex_context *ctx, const char *op, moex_bias_mode mode, const moex_tensor *bias,
                              const char *bias_name, const moex_tensor *probs, int64_t G, int64_t T, int64_t N,
                              moex_dtype dt, bool bias_needed) {
    MOEX_TRY(moex_check_bias_mode(ctx, op, mode));
    const int64_t bshape[2] = {G, N}, pshape[1] = {T};
    if (mode == MOEX_BIAS_NONE) {
        if (moex_present(bias))
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: %s is given but the bias mode is MOEX_BIAS_NONE", op,
                             bias_name);
    } else if (bias_needed) {
        MOEX_TRY(moex_check_tensor(ctx, op, bias_name, bias, 2, bshape, MOEX_DT_BIAS(dt)));
    } else {
        MOEX_TRY(moex_check_optional(ctx, op, bias_name, bias, 2, bshape, MOEX_DT_BIAS(dt)));
    }
    if (mode == MOEX_BIAS_SCALED) {
        if (!moex_present(probs))
            return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: MOEX_BIAS_SCALED needs probs [%lld] f32", op,
                             (long long)T);
        MOEX_TRY(moex_check_tensor(ctx, op, "probs", probs, 1, pshape, MOEX_DT_F32));
    }
    return MOEX_OK;
}

/* dW: WRITE into f32 or the activation dtype, ACCUMULATE into f32 only. */
moex_status moex_check_dw(moex_context *ctx, const char *op, const char *name, moex_grad_mode mode,
                            const moex_weight *dw, int64_t G, int64_t R, int64_t C, moex_dtype dt) {
    MOEX_TRY(moex_check_grad_mode(ctx, op, mode));
    unsigned dts = mode == MOEX_GRAD_ACCUMULATE ? MOEX_DT_F32 : MOEX_DT_BIAS(dt);
    if (mode == MOEX_GRAD_ACCUMULATE && dw->t.ndim == 3 && dw->t.dtype != MOEX_DTYPE_F32)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: %s is %s, but MOEX_GRAD_ACCUMULATE accumulates into an f32 main grad", op, name,
                         moex_dtype_name(dw->t.dtype));
    return moex_check_weight_output(ctx, op, name, dw, G, R, C, dts);
}

/* T*k rows are addressed by I32 row_map values: T*k must fit. */
moex_status moex_check_rows_fit_i32(moex_context *ctx, const char *op, int64_t T, int64_t k) {
    if (k > 0 && T > INT32_MAX / k)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: T*k = %lld*%lld rows do not fit the I32 row_map", op,
                         (long long)T, (long long)k);
    return MOEX_OK;
}

moex_status moex_check_hidden(moex_context *ctx, const char *op, int64_t H) {
    if (H < 1) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: hidden size H = %lld, must be >= 1", op, (long long)H);
    return MOEX_OK;
}

moex_status moex_check_router_options(moex_context *ctx, const char *op, int32_t topk, int64_t E,
                                      moex_router_score score, moex_router_norm norm) {
    if (topk < 1 || topk > E)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: topk = %d, must be 1..E (E = %lld)", op, (int)topk,
                         (long long)E);
    if (score != MOEX_ROUTER_SOFTMAX && score != MOEX_ROUTER_SIGMOID)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: unknown router score %d", op, (int)score);
    if (norm != MOEX_ROUTER_NO_RENORM && norm != MOEX_ROUTER_RENORM)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: unknown router norm %d", op, (int)norm);
    return MOEX_OK;
}

moex_status moex_check_tokens(moex_context *ctx, const char *op, const char *name, const moex_tensor *t,
                              moex_span_role role, int64_t *T, int64_t *H, moex_dtype *dt) {
    const int64_t any2[2] = {-1, -1};
    if (role == MOEX_SPAN_OUT) MOEX_TRY(moex_check_output(ctx, op, name, t, 2, any2, MOEX_DT_FLOAT));
    else MOEX_TRY(moex_check_tensor(ctx, op, name, t, 2, any2, MOEX_DT_FLOAT));
    *T = t->shape[0];
    *H = t->shape[1];
    *dt = t->dtype;
    return moex_check_hidden(ctx, op, *H);
}

moex_status moex_check_grouped_rows(moex_context *ctx, const char *op, const moex_tensor *splits, const char *name,
                                    const moex_tensor *t, int64_t *G, int64_t *T, int64_t *cols, moex_dtype *dt) {
    const int64_t any2[2] = {-1, -1};
    MOEX_TRY(moex_check_splits_arg(ctx, op, splits, G));
    MOEX_TRY(moex_check_tensor(ctx, op, name, t, 2, any2, MOEX_DT_FLOAT));
    *T = t->shape[0];
    *cols = t->shape[1];
    *dt = t->dtype;
    return MOEX_OK;
}
