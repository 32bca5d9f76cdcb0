/*
 * cuda_backend.cu - the CUDA backend's table of primitives (src/core/backend.h): entering a
 * call (the context's device; on leaving, the schedule the call left pending), the limits of
 * its kernels, the bad-input flag (allocated once here) and moex_context_check_splits,
 * construction and destruction.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_driver.h"
#include "cuda_ops.h"

/* ---- entering a call: ctx->device current, the caller's restored on leave -------------
 * cudaGetDevice answers 0 on a thread with no current context without binding one, and the
 * driver calls of a call (the Hopper GEMMs' tensor-map encoder) need one: so the thread's
 * context is asked first (cuCtxGetCurrent, a thread-local read), and a thread without one gets
 * the device's primary context through cudaSetDevice. */

moex_status moex_cuda_device_enter(moex_context *ctx, const char *op, int *prev) {
    CUcontext current = NULL;
    if (moex_cuda_st(ctx)->ctx_get_current(&current) != CUDA_SUCCESS || current == NULL) {
        *prev = ctx->device;   /* nothing to restore: the primary context stays bound */
        CUDA_TRY(ctx, op, cudaSetDevice(ctx->device));
        return MOEX_OK;
    }
    CUDA_TRY(ctx, op, cudaGetDevice(prev));
    if (*prev != ctx->device) CUDA_TRY(ctx, op, cudaSetDevice(ctx->device));
    return MOEX_OK;
}

void moex_cuda_device_leave(moex_context *ctx, int prev) {
    if (prev != ctx->device) cudaSetDevice(prev);
}

static moex_status cuda_enter(moex_context *ctx, const moex_call *c, int *scope) {
    return moex_cuda_device_enter(ctx, c->op, scope);
}

static moex_status cuda_leave(moex_context *ctx, int scope, moex_status st) {
    st = moex_cuda_sched_finish(ctx, st);
    moex_cuda_device_leave(ctx, scope);
    return st;
}

/* ---- limits ---------------------------------------------------------------------------
 * The grouped kernels' grids: ceil(rows / MOEX_CUDA_BM) + groups row tiles and `groups`
 * groups, each at most MOEX_CUDA_MAX_GRID; the permute kernel's expert count. */

static moex_status cuda_check_limits(moex_context *ctx, const moex_call *c, int64_t rows, int64_t groups,
                                     int64_t experts) {
    if (experts > MOEX_CUDA_MAX_EXPERTS)
        return moex_fail(ctx, MOEX_ERR_UNSUPPORTED, "%s: E = %lld experts exceed the CUDA permute limit (%d)", c->op,
                         (long long)experts, MOEX_CUDA_MAX_EXPERTS);
    if (moex_cuda_max_tiles(rows, groups) > MOEX_CUDA_MAX_GRID || groups > MOEX_CUDA_MAX_GRID)
        return moex_fail(ctx, MOEX_ERR_UNSUPPORTED,
                         "%s: %lld rows in %lld groups exceed the CUDA grid limits (ceil(T/%d) + G <= %d)", c->op,
                         (long long)rows, (long long)groups, MOEX_CUDA_BM, MOEX_CUDA_MAX_GRID);
    return MOEX_OK;
}

/* ---- the bad-input flag ---------------------------------------------------------------- */

static moex_status check_splits_run(moex_context *ctx, cudaStream_t stream) {
    const char *op = "moex_context_check_splits";
    const moex_cuda_state *st = moex_cuda_st(ctx);
    int flag = 0;
    CUDA_TRY(ctx, op, cudaStreamSynchronize(stream));
    CUDA_TRY(ctx, op, cudaMemcpyAsync(&flag, st->flag, sizeof flag, cudaMemcpyDeviceToHost, stream));
    CUDA_TRY(ctx, op, cudaStreamSynchronize(stream));
    if (flag == 0) return MOEX_OK;
    CUDA_TRY(ctx, op, cudaMemsetAsync(st->flag, 0, sizeof(int), stream));
    CUDA_TRY(ctx, op, cudaStreamSynchronize(stream));
    if ((flag & 15) == MOEX_CUDA_BAD_IDS)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: %s saw a routing id outside [0, E); those entries were skipped", op,
                         moex_op_name((moex_op_id)(flag >> 4)));
    if ((flag & 15) == MOEX_CUDA_BAD_ALIGN)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                         "%s: %s read a discrete weight with a matrix that is not 16-byte aligned, which the "
                         "Hopper kernels need (include/moex.h, Alignment); its outputs are not meaningful",
                         op, moex_op_name((moex_op_id)(flag >> 4)));
    if ((flag & 15) == MOEX_CUDA_EP_DROPPED)
        return moex_fail(ctx, MOEX_ERR_BAD_SPLITS,
                         "%s: %s dropped expert rows past the EP context's max_recv_rows (its `dropped` "
                         "output counts them)", op, moex_op_name((moex_op_id)(flag >> 4)));
    if ((flag >> 4) == MOEX_OP_SPLITS_TO_OFFSETS)
        return moex_fail(ctx, MOEX_ERR_BAD_SPLITS,
                         "%s: moex_splits_to_offsets saw a negative split, or an offset too large for "
                         "its output dtype (I32 or I64); its outputs are not meaningful", op);
    return moex_fail(ctx, MOEX_ERR_BAD_SPLITS,
                     "%s: %s saw bad split values (a negative split, or a sum past T); its kernels "
                     "clamped them to the T rows, so its outputs are not meaningful",
                     op, moex_op_name((moex_op_id)(flag >> 4)));
}

static moex_status cuda_check_splits(moex_context *ctx, moex_stream stream) {
    int prev;
    MOEX_TRY(moex_cuda_device_enter(ctx, "moex_context_check_splits", &prev));
    const moex_status s = check_splits_run(ctx, (cudaStream_t)stream);
    moex_cuda_device_leave(ctx, prev);
    return s;
}

static void cuda_destroy(moex_context *ctx) {
    moex_cuda_state *st = moex_cuda_st(ctx);
    if (!st) return;
    int prev;
    if (moex_cuda_device_enter(ctx, "moex_context_destroy", &prev) == MOEX_OK) {
        if (st->flag) cudaFree(st->flag);
        moex_cuda_sm90_release(ctx);
        moex_cuda_device_leave(ctx, prev);
    }
    free(st);
    ctx->backend_state = NULL;
}

/* ---- the table ------------------------------------------------------------------------- */

/* One named entry a primitive (backend.h's field = its definition), so grep finds each: alike
 * line for line with cpu_backend.c's table by design. */
static const moex_backend_ops cuda_ops = {
    .name = "cuda",
    .host_memory = false,
    .enter = cuda_enter,
    .leave = cuda_leave,
    .check_limits = cuda_check_limits,
    .groups_ws = moex_cuda_groups_ws,
    .groups_prepare = moex_cuda_groups_prepare,
    .linear_fwd_ws = moex_cuda_linear_fwd_ws,
    .linear_fwd = moex_cuda_linear_fwd,
    .linear_dgrad_ws = moex_cuda_linear_dgrad_ws,
    .linear_dgrad = moex_cuda_linear_dgrad,
    .linear_wgrad_ws = moex_cuda_linear_wgrad_ws,
    .linear_wgrad = moex_cuda_linear_wgrad,
    .glu_fwd_ws = moex_cuda_glu_fwd_ws,
    .glu_fwd = moex_cuda_glu_fwd,
    .glu_bwd_ws = moex_cuda_glu_bwd_ws,
    .glu_bwd = moex_cuda_glu_bwd,
    .quantize_ws = moex_cuda_quantize_ws,
    .quantize = moex_cuda_quantize,
    .dequantize_ws = moex_cuda_dequantize_ws,
    .dequantize = moex_cuda_dequantize,
    .cast_rows_ws = moex_cuda_cast_rows_ws,
    .cast_rows = moex_cuda_cast_rows,
    .zero_tail_ws = moex_cuda_zero_tail_ws,
    .zero_tail = moex_cuda_zero_tail,
    .splits_to_offsets_ws = moex_cuda_splits_to_offsets_ws,
    .splits_to_offsets = moex_cuda_splits_to_offsets,
    .router_fwd_ws = moex_cuda_router_fwd_ws,
    .router_fwd = moex_cuda_router_fwd,
    .router_bwd_ws = moex_cuda_router_bwd_ws,
    .router_bwd = moex_cuda_router_bwd,
    .permute_fwd_ws = moex_cuda_permute_fwd_ws,
    .permute_fwd = moex_cuda_permute_fwd,
    .permute_bwd_ws = moex_cuda_permute_bwd_ws,
    .permute_bwd = moex_cuda_permute_bwd,
    .unpermute_fwd_ws = moex_cuda_unpermute_fwd_ws,
    .unpermute_fwd = moex_cuda_unpermute_fwd,
    .unpermute_bwd_ws = moex_cuda_unpermute_bwd_ws,
    .unpermute_bwd = moex_cuda_unpermute_bwd,
    .weight_quantize_ws = moex_cuda_weight_quantize_ws,
    .weight_quantize = moex_cuda_weight_quantize,
    .weight_dequantize_ws = moex_cuda_weight_dequantize_ws,
    .weight_dequantize = moex_cuda_weight_dequantize,
    .weight_maps_size = moex_cuda_weight_maps_size,
    .weight_maps_write = moex_cuda_weight_maps_write,
    .weight_copy_ws = moex_cuda_weight_copy_ws,
    .weight_copy = moex_cuda_weight_copy,
    .dense_gemm_ws = moex_cuda_dense_gemm_ws,
    .dense_gemm = moex_cuda_dense_gemm,
    .fc1_glu = moex_cuda_fc1_glu,
    .fc2_glu_grad_ws = moex_cuda_fc2_glu_grad_ws,
    .fc2_glu_grad = moex_cuda_fc2_glu_grad,
    .linear_fp8_ws = moex_cuda_linear_fp8_ws,
    .linear_fp8 = moex_cuda_linear_fp8,
    .fc1_glu_fp8_ws = moex_cuda_fc1_glu_fp8_ws,
    .fc1_glu_fp8 = moex_cuda_fc1_glu_fp8,
    .linear_fp8_wgrad_ws = moex_cuda_linear_fp8_wgrad_ws,
    .linear_fp8_wgrad = moex_cuda_linear_fp8_wgrad,
    .glu_quantize = moex_cuda_glu_quantize,
    .ep = &moex_cuda_ep_kernels,
    .zero_f32 = moex_cuda_zero_f32,
    .check_splits = cuda_check_splits,
    .destroy = cuda_destroy,
};

/* ---- construction ---------------------------------------------------------------------- */

static moex_status init_run(moex_context *ctx) {
    const char *op = "moex_context_create";
    moex_cuda_state *st = moex_cuda_st(ctx);
    CUDA_TRY(ctx, op, cudaDeviceGetAttribute(&st->num_sms, cudaDevAttrMultiProcessorCount, ctx->device));
    int major = 0;
    CUDA_TRY(ctx, op, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ctx->device));
    if (major < 8)
        return moex_fail(ctx, MOEX_ERR_UNSUPPORTED,
                         "%s: device %d has compute capability %d.x; the CUDA backend needs sm_80 or newer",
                         op, ctx->device, major);
    const char *gemm = getenv("MOEX_CUDA_GEMM");
    st->sm90 = major == 9 && !(gemm && strcmp(gemm, "portable") == 0);
    cudaError_t err = cudaMalloc((void **)&st->flag, sizeof(int));
    if (err != cudaSuccess)
        return moex_fail(ctx, err == cudaErrorMemoryAllocation ? MOEX_ERR_OUT_OF_MEMORY : MOEX_ERR_CUDA,
                         "%s: cudaMalloc of the bad-splits flag failed: %s", op, cudaGetErrorString(err));
    CUDA_TRY(ctx, op, cudaMemset(st->flag, 0, sizeof(int)));
    MOEX_TRY(moex_cuda_gemm_prepare(ctx));
    MOEX_TRY(moex_cuda_sm90_prepare(ctx));
    CUDA_TRY(ctx, op, cudaDeviceSynchronize());
    return MOEX_OK;
}

extern "C" moex_status moex_cuda_backend_init(moex_context *ctx) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0)
        return moex_fail(ctx, MOEX_ERR_CUDA, "moex_context_create: no CUDA device (%s)",
                         err != cudaSuccess ? cudaGetErrorString(err) : "none found");
    if (ctx->device >= count)
        return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "moex_context_create: device %d, but only %d CUDA device(s)",
                         ctx->device, count);
    moex_cuda_state *st = (moex_cuda_state *)calloc(1, sizeof *st);
    if (!st) return moex_fail(ctx, MOEX_ERR_OUT_OF_MEMORY, "moex_context_create: out of host memory");
    st->ctx_get_current = (CUresult(*)(CUcontext *))moex_cuda_driver_entry("cuCtxGetCurrent", 4000);
    if (st->ctx_get_current == NULL) {
        free(st);
        return moex_fail(ctx, MOEX_ERR_CUDA, "moex_context_create: the driver gives no cuCtxGetCurrent");
    }
    ctx->backend_state = st;
    ctx->ops = &cuda_ops;
    int prev;
    moex_status s = moex_cuda_device_enter(ctx, "moex_context_create", &prev);
    if (s == MOEX_OK) {
        s = init_run(ctx);
        moex_cuda_device_leave(ctx, prev);
    }
    if (s != MOEX_OK) {
        cuda_destroy(ctx);
        ctx->ops = NULL;
    }
    return s;
}
