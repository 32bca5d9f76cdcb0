/*
 * cuda_cast.cu - the casts: cast_rows (f32 rows [T, N] rounded once into an output of another
 * dtype, for the rows r < off[G] of the prepared groups, read on the device) and weight_copy
 * (grouped weights from one form, packed or discrete, and dtype into another; the discrete
 * pointer arrays are read on the device).
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

/* Matrix g of a grouped weight: its pointer (discrete: read on the device) or its slice. */
static __device__ __forceinline__ void *weight_at(void *base, void *const *ptrs, int64_t g, int64_t per, int es) {
    return ptrs != NULL ? ptrs[g] : (char *)base + g * per * es;
}

/* dst[g][i] = round(src[g][i]) for the per elements i of each of the G matrices, grid-stride
 * over the G per elements. */
static __global__ void weight_copy_kernel(const void *src, void *const *src_ptrs, int src_f32, int src_bf16, void *dst,
                                          void *const *dst_ptrs, int dst_f32, int dst_bf16, int64_t G, int64_t per) {
    const int ses = src_f32 ? 4 : 2, des = dst_f32 ? 4 : 2;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < G * per; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t g = i / per, e = i % per;
        const void *s = weight_at((void *)src, src_ptrs, g, per, ses);
        store_any(weight_at(dst, dst_ptrs, g, per, des), dst_f32, dst_bf16, e, load_any(s, src_f32, src_bf16, e));
    }
}

size_t moex_cuda_weight_copy_ws(moex_context *ctx, const moex_weight_copy_args *a, const moex_gl_dims *d) { return 0; }

moex_status moex_cuda_weight_copy(moex_context *ctx, const moex_call *c, const moex_weight_copy_args *a,
                                  const moex_gl_dims *d, void *ws) {
    const int64_t per = d->T * d->K;   /* < 2^62: a validated weight */
    if (d->G == 0 || per == 0) return MOEX_OK;
    const int64_t want = (d->G * per + CAST_THREADS - 1) / CAST_THREADS;
    const unsigned blocks = (unsigned)(want < CAST_MAX_BLOCKS ? want : CAST_MAX_BLOCKS);
    const moex_dtype st = a->src.t.dtype, dt = a->dst.t.dtype;
    weight_copy_kernel<<<blocks, CAST_THREADS, 0, (cudaStream_t)c->stream>>>(
        a->src.t.data, a->src.ptrs, st == MOEX_DTYPE_F32, st == MOEX_DTYPE_BF16, a->dst.t.data, a->dst.ptrs,
        dt == MOEX_DTYPE_F32, dt == MOEX_DTYPE_BF16, d->G, per);
    CUDA_TRY_LAUNCH(ctx, c->op);
    return MOEX_OK;
}
