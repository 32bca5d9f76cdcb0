/*
 * cuda_backend.cu - the CUDA backend's function table, its construction and destruction,
 * the bad-input flag (allocated once here) and moex_context_check_splits.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_ops.h"

#define OP(name) .name##_ws = moex_cuda_##name##_ws, .name = moex_cuda_##name

static moex_status cuda_check_splits(moex_context *ctx, moex_stream stream);
static void cuda_destroy(moex_context *ctx);

static const moex_backend_ops cuda_ops = {
    .name = "cuda",
    OP(splits_to_offsets),
    OP(grouped_linear_forward),
    OP(grouped_linear_backward_data),
    OP(grouped_linear_backward_weight),
    OP(scaled_glu_forward),
    OP(scaled_glu_backward),
    OP(grouped_mlp_forward),
    OP(grouped_mlp_backward),
    OP(router_forward),
    OP(router_backward),
    OP(permute_forward),
    OP(permute_backward),
    OP(unpermute_forward),
    OP(unpermute_backward),
    OP(moe_layer_forward),
    OP(moe_layer_backward),
    .moe_layer_saved = moex_cuda_moe_layer_saved,
    .check_splits = cuda_check_splits,
    .destroy = cuda_destroy,
};

moex_status moex_cuda_device_enter(moex_context *ctx, const char *op, moex_cuda_device_guard *g) {
    g->changed = 0;
    CUDA_TRY(ctx, op, cudaGetDevice(&g->prev));
    if (g->prev != ctx->device) {
        CUDA_TRY(ctx, op, cudaSetDevice(ctx->device));
        g->changed = 1;
    }
    return MOEX_OK;
}

void moex_cuda_device_leave(moex_cuda_device_guard *g) {
    if (g->changed) cudaSetDevice(g->prev);
}

static const char *op_name(int id) {
    static const char *names[MOEX_CUDA_OP_COUNT] = {
        "?", "moex_splits_to_offsets", "moex_grouped_linear_forward", "moex_grouped_linear_backward_data",
        "moex_grouped_linear_backward_weight", "moex_scaled_glu_forward", "moex_scaled_glu_backward",
        "moex_grouped_mlp_forward", "moex_grouped_mlp_backward", "moex_permute_forward",
        "moex_permute_backward", "moex_unpermute_forward", "moex_unpermute_backward",
        "moex_moe_layer_forward", "moex_moe_layer_backward", "moex_router_forward", "moex_router_backward"};
    return id > 0 && id < MOEX_CUDA_OP_COUNT ? names[id] : "an unknown operation";
}

static moex_status check_splits_run(moex_context *ctx, cudaStream_t stream) {
    const char *op = "moex_context_check_splits";
    moex_cuda_state *st = moex_cuda_st(ctx);
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
                         op_name(flag >> 4));
    if ((flag >> 4) == MOEX_CUDA_OP_SPLITS_TO_OFFSETS)
        return moex_fail(ctx, MOEX_ERR_BAD_SPLITS,
                         "%s: moex_splits_to_offsets saw a negative split, or an offset too large for "
                         "its output dtype (I32 or I64); its outputs are not meaningful", op);
    return moex_fail(ctx, MOEX_ERR_BAD_SPLITS,
                     "%s: %s saw bad split values (a negative split, or a sum past T); its kernels "
                     "clamped them to the T rows, so its outputs are not meaningful",
                     op, op_name(flag >> 4));
}

static moex_status cuda_check_splits(moex_context *ctx, moex_stream stream) {
    MOEX_CUDA_GUARDED(ctx, "moex_context_check_splits", check_splits_run(ctx, (cudaStream_t)stream));
}

static void cuda_destroy(moex_context *ctx) {
    moex_cuda_state *st = moex_cuda_st(ctx);
    if (!st) return;
    moex_cuda_device_guard g;
    if (moex_cuda_device_enter(ctx, "moex_context_destroy", &g) == MOEX_OK) {
        if (st->flag) cudaFree(st->flag);
        moex_cuda_sm90_release(ctx);
        moex_cuda_device_leave(&g);
    }
    free(st);
    ctx->backend_state = NULL;
}

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
    ctx->backend_state = st;
    ctx->ops = &cuda_ops;
    moex_cuda_device_guard g;
    moex_status s = moex_cuda_device_enter(ctx, "moex_context_create", &g);
    if (s == MOEX_OK) {
        s = init_run(ctx);
        moex_cuda_device_leave(&g);
    }
    if (s != MOEX_OK) {
        cuda_destroy(ctx);
        ctx->ops = NULL;
    }
    return s;
}
