/*
 * cuda_zero_tail.cu - zero_tail: every byte of the rows r >= off[G] of x [T, row_bytes] set to
 * 0, where off[G] (the clamped end of the groups, <= T) is read on the device from the
 * prepared groups. Grid-stride over the whole T rows' bytes, so one launch covers every
 * split value; a thread writes only bytes past off[G] * row_bytes: the work is the tail's.
 */
#include "cuda_common.cuh"
#include "cuda_ops.h"

#define TAIL_THREADS 256
#define TAIL_MAX_BLOCKS 2048

/* p[i] = 0 for i in [*rows_end * row_units, T * row_units), units of type U. */
template <typename U>
static __global__ void zero_tail_kernel(const int64_t *rows_end, int64_t row_units, int64_t T, U *p) {
    const int64_t lo = *rows_end * row_units, hi = T * row_units;
    for (int64_t i = lo + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < hi; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = U{};
}

size_t moex_cuda_zero_tail_ws(moex_context *ctx, const moex_zero_tail_args *a, const moex_tail_dims *d) { return 0; }

moex_status moex_cuda_zero_tail(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                const moex_zero_tail_args *a, const moex_tail_dims *d, void *ws) {
    if (d->T == 0 || d->row_bytes == 0) return MOEX_OK;
    MOEX_TRY(moex_cuda_sched_ready(ctx, c->op, g));
    const bool wide = ((uintptr_t)a->x.data % 16 == 0) && d->row_bytes % 16 == 0;
    const int64_t unit = wide ? 16 : 1, units = d->T * (d->row_bytes / unit);   /* < 2^63: a validated x */
    const int64_t want = (units + TAIL_THREADS - 1) / TAIL_THREADS;
    const unsigned blocks = (unsigned)(want < TAIL_MAX_BLOCKS ? want : TAIL_MAX_BLOCKS);
    const cudaStream_t s = (cudaStream_t)c->stream;
    const int64_t *end = g->off + g->G;
    if (wide)
        zero_tail_kernel<uint4><<<blocks, TAIL_THREADS, 0, s>>>(end, d->row_bytes / 16, d->T, (uint4 *)a->x.data);
    else
        zero_tail_kernel<unsigned char><<<blocks, TAIL_THREADS, 0, s>>>(end, d->row_bytes, d->T,
                                                                       (unsigned char *)a->x.data);
    CUDA_TRY_LAUNCH(ctx, c->op);
    return MOEX_OK;
}
