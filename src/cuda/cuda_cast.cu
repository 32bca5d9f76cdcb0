/*
 * cuda_cast.cu - the cast_rows primitive: f32 rows [T, N] rounded once into an output of
 * another dtype, for the rows r < off[G] of the prepared groups (read on the device).
 */
#include "cuda_common.cuh"
#include "cuda_ops.h"

#define CAST_THREADS 256
#define CAST_MAX_BLOCKS 4096

/* dst[i] = round(src[i]) for i < min(*rows_end, T) * N, grid-stride. */
template <typename T>
static __global__ void cast_rows_kernel(const int64_t *rows_end, int64_t rows_max, int64_t N, const float *src,
                                        T *dst) {
    const int64_t n = min(*rows_end, rows_max) * N;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = from_f32<T>(src[i]);
}

size_t moex_cuda_cast_rows_ws(moex_context *ctx, const moex_cast_rows_args *a, const moex_gl_dims *d) { return 0; }

moex_status moex_cuda_cast_rows(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                const moex_cast_rows_args *a, const moex_gl_dims *d, void *ws) {
    if (d->T == 0 || d->N == 0) return MOEX_OK;
    MOEX_TRY(moex_cuda_sched_ready(ctx, c->op, g));
    const int64_t want = (d->T * d->N + CAST_THREADS - 1) / CAST_THREADS;   /* T * N < 2^62: checked limits */
    const unsigned blocks = (unsigned)(want < CAST_MAX_BLOCKS ? want : CAST_MAX_BLOCKS);
    const cudaStream_t s = (cudaStream_t)c->stream;
    const int64_t *end = g->off + g->G;
    if (a->dst.dtype == MOEX_DTYPE_F32)
        cast_rows_kernel<float><<<blocks, CAST_THREADS, 0, s>>>(end, d->T, d->N, a->src, (float *)a->dst.data);
    else if (a->dst.dtype == MOEX_DTYPE_BF16)
        cast_rows_kernel<bf16><<<blocks, CAST_THREADS, 0, s>>>(end, d->T, d->N, a->src, (bf16 *)a->dst.data);
    else
        cast_rows_kernel<f16><<<blocks, CAST_THREADS, 0, s>>>(end, d->T, d->N, a->src, (f16 *)a->dst.data);
    CUDA_TRY_LAUNCH(ctx, c->op);
    return MOEX_OK;
}
