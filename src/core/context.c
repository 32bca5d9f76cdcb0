/*
 * context.c - version, status strings, the context and its error message.
 */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MOEX_STR2(x) #x
#define MOEX_STR(x) MOEX_STR2(x)

unsigned moex_version(void) { return MOEX_VERSION_NUMBER; }

const char *moex_version_string(void) {
    return MOEX_STR(MOEX_VERSION_MAJOR) "." MOEX_STR(MOEX_VERSION_MINOR) "." MOEX_STR(MOEX_VERSION_PATCH);
}

const char *moex_status_string(moex_status status) {
    switch (status) {
    case MOEX_OK: return "MOEX_OK";
    case MOEX_ERR_INVALID_ARG: return "MOEX_ERR_INVALID_ARG";
    case MOEX_ERR_UNSUPPORTED: return "MOEX_ERR_UNSUPPORTED";
    case MOEX_ERR_OUT_OF_MEMORY: return "MOEX_ERR_OUT_OF_MEMORY";
    case MOEX_ERR_CUDA: return "MOEX_ERR_CUDA";
    case MOEX_ERR_BAD_SPLITS: return "MOEX_ERR_BAD_SPLITS";
    case MOEX_ERR_INTERNAL: return "MOEX_ERR_INTERNAL";
    }
    return "MOEX_ERR_UNKNOWN_STATUS";
}

size_t moex_dtype_size(moex_dtype dtype) {
    switch (dtype) {
    case MOEX_DTYPE_F32: return 4;
    case MOEX_DTYPE_BF16: return 2;
    case MOEX_DTYPE_F16: return 2;
    case MOEX_DTYPE_I32: return 4;
    case MOEX_DTYPE_I64: return 8;
    case MOEX_DTYPE_E4M3: return 1;
    case MOEX_DTYPE_E5M2: return 1;
    case MOEX_DTYPE_E8M0: return 1;
    }
    return 0;
}

const char *moex_dtype_name(moex_dtype dtype) {
    switch (dtype) {
    case MOEX_DTYPE_F32: return "f32";
    case MOEX_DTYPE_BF16: return "bf16";
    case MOEX_DTYPE_F16: return "f16";
    case MOEX_DTYPE_I32: return "i32";
    case MOEX_DTYPE_I64: return "i64";
    case MOEX_DTYPE_E4M3: return "e4m3";
    case MOEX_DTYPE_E5M2: return "e5m2";
    case MOEX_DTYPE_E8M0: return "e8m0";
    }
    return "unknown";
}

/* The message of a failed moex_context_create, which has no context to keep it in. */
static _Thread_local char create_msg[MOEX_MSG_LEN];

moex_status moex_fail(moex_context *ctx, moex_status status, const char *fmt, ...) {
    char *dst = ctx ? ctx->msg : create_msg;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, MOEX_MSG_LEN, fmt, ap);
    va_end(ap);
    return status;
}

const char *moex_last_error(const moex_context *ctx) { return ctx ? ctx->msg : create_msg; }

moex_status moex_context_create(moex_context **out, moex_backend backend, int device) {
    create_msg[0] = '\0';
    if (!out) return moex_fail(NULL, MOEX_ERR_INVALID_ARG, "moex_context_create: out is NULL");
    *out = NULL;
    if (backend != MOEX_BACKEND_CPU && backend != MOEX_BACKEND_CUDA)
        return moex_fail(NULL, MOEX_ERR_INVALID_ARG,
                         "moex_context_create: unknown backend %d (MOEX_BACKEND_CPU or MOEX_BACKEND_CUDA)",
                         (int)backend);
    if (backend == MOEX_BACKEND_CPU && device != 0)
        return moex_fail(NULL, MOEX_ERR_INVALID_ARG,
                         "moex_context_create: the CPU backend has only device 0, got %d", device);
    if (device < 0)
        return moex_fail(NULL, MOEX_ERR_INVALID_ARG, "moex_context_create: device %d < 0", device);
    moex_context *ctx = (moex_context *)calloc(1, sizeof *ctx);
    if (!ctx) return moex_fail(NULL, MOEX_ERR_OUT_OF_MEMORY, "moex_context_create: out of host memory");
    ctx->backend = backend;
    ctx->device = device;
    const moex_status st = moex_backend_init(ctx);
    if (st != MOEX_OK) {
        snprintf(create_msg, MOEX_MSG_LEN, "%s", ctx->msg);
        free(ctx);
        return st;
    }
    ctx->msg[0] = '\0';
    *out = ctx;
    return MOEX_OK;
}

void moex_context_destroy(moex_context *ctx) {
    if (!ctx) return;
    if (ctx->ops && ctx->ops->destroy) ctx->ops->destroy(ctx);
    free(ctx);
}

moex_backend moex_context_backend(const moex_context *ctx) { return ctx ? ctx->backend : MOEX_BACKEND_CPU; }

moex_status moex_context_set_num_threads(moex_context *ctx, int n) {
    if (!ctx) return moex_fail(NULL, MOEX_ERR_INVALID_ARG, "moex_context_set_num_threads: ctx is NULL");
    ctx->msg[0] = '\0';
    if (n < 1)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "moex_context_set_num_threads: n = %d, must be >= 1", n);
    ctx->num_threads = n;
    return MOEX_OK;
}

moex_status moex_context_check_splits(moex_context *ctx, moex_stream stream) {
    if (!ctx) return moex_fail(NULL, MOEX_ERR_INVALID_ARG, "moex_context_check_splits: ctx is NULL");
    ctx->msg[0] = '\0';
    if (ctx->ep_dropped > 0) {   /* host-memory backends: an EP dispatch's drops */
        const long long n = (long long)ctx->ep_dropped;
        ctx->ep_dropped = 0;
        return moex_fail(ctx, MOEX_ERR_BAD_SPLITS,
                         "moex_context_check_splits: %s dropped %lld expert rows past the EP context's "
                         "max_recv_rows (its `dropped` output counts them per call)",
                         moex_op_name(ctx->ep_dropped_op), n);
    }
    if (!ctx->ops->check_splits) return MOEX_OK;
    return ctx->ops->check_splits(ctx, stream);
}

moex_glu_params moex_glu_params_default(moex_glu_kind kind) {
    moex_glu_params p = {kind, MOEX_GLU_CONTIGUOUS, 7.0f, 1.702f, 1.0f};
    return p;
}
