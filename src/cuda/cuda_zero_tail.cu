/*
 * cuda_zero_tail.cu - zero_tail: every byte of the rows r >= E of x [T, row_bytes] set to 0,
 * E = min(sum(splits), T) the clamped end of the groups. One launch, no schedule: each block
 * sums the G split values itself (block_groups_end, the schedule's rule), then the grid
 * strides over the T rows' bytes, so one launch covers every split value; a thread writes
 * only bytes past E * row_bytes: the work is the tail's. The grid is two blocks per SM at
 * most: every block pays the sum, and a call whose tail is empty (the common case) costs
 * one wave of it. Bad splits set the call's flag.
 */
#include "cuda_common.cuh"
#include "cuda_ops.h"

#define TAIL_THREADS 256
#define TAIL_BLOCKS_PER_SM 2

/* p[i] = 0 for i in [E * row_units, T * row_units), units of type U; block 0 flags bad splits. */
template <typename U>
static __global__ void __launch_bounds__(TAIL_THREADS)
zero_tail_kernel(const int64_t *splits, int64_t G, int64_t T, int64_t row_units, U *p, int *flag, int flag_value) {
    __shared__ int64_t sh[32];
    int bad;
    const int64_t end = block_groups_end(splits, G, T, sh, &bad);
    if (bad && blockIdx.x == 0 && threadIdx.x == 0) atomicCAS(flag, 0, flag_value);
    const int64_t lo = end * row_units, hi = T * row_units;
    for (int64_t i = lo + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < hi; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = U{};
}

size_t moex_cuda_zero_tail_ws(moex_context *ctx, const moex_zero_tail_args *a, const moex_tail_dims *d) { return 0; }

moex_status moex_cuda_zero_tail(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                const moex_zero_tail_args *a, const moex_tail_dims *d, void *ws) {
    if (d->T == 0 || d->row_bytes == 0) return MOEX_OK;
    int flag_value;
    int *flag = moex_cuda_bad_splits_flag(ctx, g, &flag_value);   /* this kernel checks the splits */
    const bool wide = ((uintptr_t)a->x.data % 16 == 0) && d->row_bytes % 16 == 0;
    const int64_t unit = wide ? 16 : 1, units = d->T * (d->row_bytes / unit);   /* < 2^63: a validated x */
    const int64_t want = (units + TAIL_THREADS - 1) / TAIL_THREADS;
    const int64_t most = (int64_t)TAIL_BLOCKS_PER_SM * moex_cuda_st(ctx)->num_sms;
    const unsigned blocks = (unsigned)(want < most ? want : most);
    const cudaStream_t s = (cudaStream_t)c->stream;
    const int64_t *splits = (const int64_t *)a->splits.data;
    if (wide)
        zero_tail_kernel<uint4><<<blocks, TAIL_THREADS, 0, s>>>(splits, d->G, d->T, d->row_bytes / 16,
                                                                (uint4 *)a->x.data, flag, flag_value);
    else
        zero_tail_kernel<unsigned char><<<blocks, TAIL_THREADS, 0, s>>>(splits, d->G, d->T, d->row_bytes,
                                                                       (unsigned char *)a->x.data, flag, flag_value);
    CUDA_TRY_LAUNCH(ctx, c->op);
    return MOEX_OK;
}
