/*
 * cuda_splits.cu - split values on the device: the group schedule every grouped kernel
 * walks (clamped row offsets and row-tile offsets), and the splits_to_offsets operation.
 * Both are one launch of one block that scans the splits in chunks of 1024; the host
 * never reads a split value. The schedule launches on first need (cuda_ops.h).
 */
#include "cuda_common.cuh"
#include "cuda_ops.h"

#define SCAN_THREADS 1024   /* the block of block_scan_i64 (cuda_common.cuh) */

/* off[g+1] = min(off[g] + max(s_g, 0), T); tiles[g+1] = tiles[g] + ceil(rows_g / BM).
 * splits == NULL: one group of T rows. */
static __global__ void __launch_bounds__(SCAN_THREADS)
sched_kernel(const int64_t *splits, int64_t G, int64_t T, int64_t *off, int32_t *tiles,
             int *flag, int op_id) {
    __shared__ int64_t sh[32];
    int64_t carry_rows = 0, carry_tiles = 0;
    int bad = 0;
    if (threadIdx.x == 0) {
        off[0] = 0;
        tiles[0] = 0;
    }
    for (int64_t base = 0; base < G; base += SCAN_THREADS) {
        int64_t g = base + threadIdx.x;
        int64_t s = 0;
        if (g < G) s = splits ? moex_split_count(splits[g], T, &bad) : T;   /* bounded: the sums cannot wrap */
        int64_t total;
        int64_t incl = block_scan_i64(s, sh, &total) + carry_rows;
        int64_t prev = incl - s;
        int64_t hi = incl > T ? T : incl, lo = prev > T ? T : prev;
        if (incl > T) bad = 1;
        int64_t nt = (hi - lo + MOEX_CUDA_BM - 1) / MOEX_CUDA_BM;
        int64_t ttotal;
        int64_t tincl = block_scan_i64(nt, sh, &ttotal) + carry_tiles;
        if (g < G) {
            off[g + 1] = hi;
            tiles[g + 1] = (int32_t)tincl;
        }
        carry_rows += total;
        carry_tiles += ttotal;
        __syncthreads();
    }
    if (bad) flag_bad(flag, op_id, MOEX_CUDA_BAD_SPLITS);
}

/* ---- the prepared groups ------------------------------------------------------------- */

/* The schedule's arrays, then the Hopper forward's scratch for fwd (when it wants one). */
static size_t groups_layout(moex_context *ctx, int64_t G, int64_t T, const moex_grouped_linear_args *fwd, void *ws,
                            moex_groups *g) {
    moex_carver c = {(char *)ws, 0};
    g->G = G;
    g->T = T;
    g->off = (int64_t *)moex_take(&c, moex_sz_bytes(G + 1, 1, sizeof(int64_t)));
    g->tiles = (int32_t *)moex_take(&c, moex_sz_bytes(G + 1, 1, sizeof(int32_t)));
    g->gemm_ws = fwd ? moex_cuda_gemm_ws_take(ctx, &c, fwd) : NULL;
    return c.used;
}

size_t moex_cuda_groups_ws(moex_context *ctx, int64_t G, int64_t T, const moex_grouped_linear_args *fwd) {
    moex_groups g;
    return groups_layout(ctx, G, T, fwd, NULL, &g);
}

/* ---- the deferred launch: the state machine of cuda_sched_state.h ------------------- */

static moex_status sched_launch(moex_context *ctx, const char *op, const moex_sched_launch *l) {
    const moex_groups *g = &l->groups;
    sched_kernel<<<1, SCAN_THREADS, 0, (cudaStream_t)l->stream>>>(g->splits, g->G, g->T, g->off, g->tiles,
                                                                   moex_cuda_st(ctx)->flag, l->op_id);
    CUDA_TRY_LAUNCH(ctx, op);
    return MOEX_OK;
}

moex_status moex_cuda_groups_prepare(moex_context *ctx, const moex_call *c, const int64_t *splits, int64_t G,
                                     int64_t T, const moex_grouped_linear_args *fwd, void *ws, moex_groups *g) {
    groups_layout(ctx, G, T, fwd, ws, g);
    g->splits = splits;
    moex_sched_launch earlier;   /* an earlier handle of the call, still pending */
    if (moex_sched_prepare(&moex_cuda_st(ctx)->sched, g, c->stream, c->id, &earlier))
        return sched_launch(ctx, c->op, &earlier);
    return MOEX_OK;
}

moex_status moex_cuda_sched_ready(moex_context *ctx, const char *op, const moex_cuda_sched *s) {
    moex_sched_launch l;
    return moex_sched_need(&moex_cuda_st(ctx)->sched, s, &l) ? sched_launch(ctx, op, &l) : MOEX_OK;
}

int *moex_cuda_bad_splits_flag(moex_context *ctx, const moex_cuda_sched *s, int *value) {
    moex_cuda_state *st = moex_cuda_st(ctx);
    moex_sched_checked(&st->sched, s);
    *value = (st->sched.pending.op_id << 4) | MOEX_CUDA_BAD_SPLITS;   /* the call's op (it prepared s) */
    return st->flag;
}

moex_status moex_cuda_sched_finish(moex_context *ctx, moex_status st) {
    moex_sched_launch l;
    if (moex_sched_finish(&moex_cuda_st(ctx)->sched, st == MOEX_OK, &l))
        st = sched_launch(ctx, moex_op_name((moex_op_id)l.op_id), &l);
    return st;
}

/* ---- splits_to_offsets --------------------------------------------------------------- */

typedef struct offsets_outs {
    void *out[MOEX_MAX_OFFSETS];
    int64_t stride[MOEX_MAX_OFFSETS];
    int is_i64[MOEX_MAX_OFFSETS];
    int leading_zero[MOEX_MAX_OFFSETS];
    int n;
} offsets_outs;

/* Stores stride_i * incl (incl >= 0 unless the prefix sum wrapped); returns 1 when the
 * value does not fit the output, which then keeps a saturated or truncated value (the
 * caller flags the splits). */
static __device__ int put_offset(const offsets_outs &o, int i, int64_t at, int64_t incl) {
    if (incl < 0 || incl > INT64_MAX / o.stride[i]) {
        if (o.is_i64[i]) ((int64_t *)o.out[i])[at] = INT64_MAX;
        else ((int32_t *)o.out[i])[at] = INT32_MAX;
        return 1;
    }
    const int64_t v = incl * o.stride[i];
    if (o.is_i64[i]) {
        ((int64_t *)o.out[i])[at] = v;
        return 0;
    }
    ((int32_t *)o.out[i])[at] = (int32_t)v;
    return v > INT32_MAX;
}

/* out_i[g (+1)] = stride_i * (s_0 + ... + s_g), negative splits counted as 0; negative
 * splits and values that do not fit their output are flagged. */
static __global__ void __launch_bounds__(SCAN_THREADS)
offsets_kernel(const int64_t *splits, int64_t G, offsets_outs o, int *flag) {
    __shared__ int64_t sh[32];
    int64_t carry = 0;
    int bad = 0;
    if (threadIdx.x == 0)
        for (int i = 0; i < o.n; i++)
            if (o.leading_zero[i]) put_offset(o, i, 0, 0);
    for (int64_t base = 0; base < G; base += SCAN_THREADS) {
        int64_t g = base + threadIdx.x;
        int64_t s = g < G ? splits[g] : 0;
        if (s < 0) {
            bad = 1;
            s = 0;
        }
        int64_t total;
        int64_t incl = block_scan_i64(s, sh, &total) + carry;
        if (g < G)
            for (int i = 0; i < o.n; i++) bad |= put_offset(o, i, g + o.leading_zero[i], incl);
        carry += total;
        __syncthreads();
    }
    if (bad) flag_bad(flag, MOEX_OP_SPLITS_TO_OFFSETS, MOEX_CUDA_BAD_SPLITS);
}

size_t moex_cuda_splits_to_offsets_ws(moex_context *ctx, const moex_splits_to_offsets_args *a,
                                      const moex_splits_dims *d) {
    return 0;
}

moex_status moex_cuda_splits_to_offsets(moex_context *ctx, const moex_call *c, const moex_splits_to_offsets_args *a,
                                        const moex_splits_dims *d, void *ws) {
    offsets_outs o;
    o.n = a->num_outputs;
    for (int i = 0; i < MOEX_MAX_OFFSETS; i++) {
        o.out[i] = i < o.n ? a->outputs[i].out.data : NULL;
        o.stride[i] = i < o.n ? a->outputs[i].stride : 1;
        o.is_i64[i] = i < o.n && a->outputs[i].out.dtype == MOEX_DTYPE_I64;
        o.leading_zero[i] = i < o.n && a->outputs[i].start == MOEX_OFFSETS_LEADING_ZERO;
    }
    offsets_kernel<<<1, SCAN_THREADS, 0, (cudaStream_t)c->stream>>>((const int64_t *)a->splits.data, d->G, o,
                                                                     moex_cuda_st(ctx)->flag);
    CUDA_TRY_LAUNCH(ctx, c->op);
    return MOEX_OK;
}
