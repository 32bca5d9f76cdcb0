/*
 * test_splits_to_offsets.c - moex_splits_to_offsets against the reference: G = 1, 5, 128;
 * every splits kind (empty groups first/middle/last, skewed, all in one group, all empty);
 * 1..8 outputs mixing I32 and I64, strides 1, K, 7 and large, with and without the
 * leading zero. Every output buffer has poisoned guard elements past its end that must
 * stay untouched; the splits must stay unchanged. Negative splits fail with
 * MOEX_ERR_BAD_SPLITS and write nothing.
 * moex_zero_tail: x [T, ...] of every dtype, 1 to 4 dimensions, rows of 1 to 4096 bytes (odd
 * sizes and 16-byte multiples), every splits kind with sum(splits) from 0 to T: the rows
 * before the sum keep their bytes, every byte of the rows after is 0; a sum past T on the CPU
 * is MOEX_ERR_BAD_SPLITS with nothing written; x of 0 or 5 dimensions is refused.
 */
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GUARD 4

static void run_case(moex_context *ctx, tu_rng *r, int64_t G, const int64_t *splits, int num_outputs,
                     const char *label) {
    moex_splits_to_offsets_args a;
    memset(&a, 0, sizeof a);
    int64_t *sp = (int64_t *)tu_alloc((size_t)G * sizeof(int64_t));
    memcpy(sp, splits, (size_t)G * sizeof(int64_t));
    a.splits = moex_tensor_1d(sp, MOEX_DTYPE_I64, G);
    a.num_outputs = num_outputs;
    void *buf[MOEX_MAX_OFFSETS];
    int64_t len[MOEX_MAX_OFFSETS];
    static const int64_t strides[] = {1, 4096, 7, 1, 3, 1 << 20, 1, 11};
    for (int i = 0; i < num_outputs; i++) {
        moex_offsets_output *o = &a.outputs[i];
        moex_dtype dt = (i + (int)tu_randint(r, 2)) % 2 ? MOEX_DTYPE_I64 : MOEX_DTYPE_I32;
        o->stride = strides[i];
        if (dt == MOEX_DTYPE_I32 && o->stride > 4096) dt = MOEX_DTYPE_I64; /* keep within int32 */
        o->start = tu_randint(r, 2) ? MOEX_OFFSETS_LEADING_ZERO : MOEX_OFFSETS_INCLUSIVE;
        len[i] = G + (o->start == MOEX_OFFSETS_LEADING_ZERO);
        buf[i] = tu_poisoned(dt, len[i] + GUARD);
        o->out = moex_tensor_1d(buf[i], dt, len[i]);
    }
    size_t bytes = 0;
    CHECK_STATUS(ctx, moex_splits_to_offsets_workspace_size(ctx, &a, &bytes), MOEX_OK);
    void *ws = tu_workspace(bytes);
    moex_status st = moex_splits_to_offsets(ctx, &a, ws, bytes, NULL);
    CHECK_STATUS(ctx, st, MOEX_OK);
    int64_t *want = (int64_t *)tu_alloc((size_t)(G + 1) * sizeof(int64_t));
    for (int i = 0; i < num_outputs; i++) {
        const moex_offsets_output *o = &a.outputs[i];
        ref_splits_to_offsets(splits, G, o->stride, o->start == MOEX_OFFSETS_LEADING_ZERO, want);
        int64_t bad = -1;
        for (int64_t j = 0; j < len[i] && bad < 0; j++)
            if ((int64_t)ref_load(o->out.dtype, buf[i], j) != want[j]) bad = j;
        CHECK_MSG(bad < 0, "%s G=%lld output %d (%s, stride %lld, %s): element %lld is %lld, want %lld", label,
                  (long long)G, i, o->out.dtype == MOEX_DTYPE_I32 ? "i32" : "i64", (long long)o->stride,
                  o->start == MOEX_OFFSETS_LEADING_ZERO ? "leading zero" : "inclusive", (long long)bad,
                  bad < 0 ? 0LL : (long long)ref_load(o->out.dtype, buf[i], bad), bad < 0 ? 0LL : (long long)want[bad]);
        CHECK_POISONED("guard past the output", o->out.dtype, buf[i], len[i], len[i] + GUARD);
    }
    CHECK_MSG(memcmp(sp, splits, (size_t)G * sizeof(int64_t)) == 0, "%s: splits changed", label);
    for (int i = 0; i < num_outputs; i++) free(buf[i]);
    free(want);
    free(ws);
    free(sp);
}

/* A negative split: MOEX_ERR_BAD_SPLITS naming the group, nothing written. */
static void run_negative(moex_context *ctx, int64_t G, int64_t bad_group) {
    int64_t *sp = (int64_t *)tu_alloc((size_t)G * sizeof(int64_t));
    for (int64_t g = 0; g < G; g++) sp[g] = g % 3;
    sp[bad_group] = -2;
    moex_splits_to_offsets_args a;
    memset(&a, 0, sizeof a);
    a.splits = moex_tensor_1d(sp, MOEX_DTYPE_I64, G);
    a.num_outputs = 2;
    void *o0 = tu_poisoned(MOEX_DTYPE_I64, G + 1), *o1 = tu_poisoned(MOEX_DTYPE_I32, G);
    a.outputs[0] = (moex_offsets_output){.out = moex_tensor_1d(o0, MOEX_DTYPE_I64, G + 1), .stride = 1,
                                         .start = MOEX_OFFSETS_LEADING_ZERO};
    a.outputs[1] = (moex_offsets_output){.out = moex_tensor_1d(o1, MOEX_DTYPE_I32, G), .stride = 5,
                                         .start = MOEX_OFFSETS_INCLUSIVE};
    size_t bytes = 0;
    CHECK_STATUS(ctx, moex_splits_to_offsets_workspace_size(ctx, &a, &bytes), MOEX_OK);
    void *ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_splits_to_offsets(ctx, &a, ws, bytes, NULL), MOEX_ERR_BAD_SPLITS);
    char num[32];
    snprintf(num, sizeof num, "%lld", (long long)bad_group);
    CHECK_MSG_HAS(ctx, "splits_to_offsets");
    CHECK_MSG_HAS(ctx, num);
    CHECK_POISONED("offsets after bad splits", MOEX_DTYPE_I64, o0, 0, G + 1);
    CHECK_POISONED("offsets after bad splits", MOEX_DTYPE_I32, o1, 0, G);
    free(o0);
    free(o1);
    free(ws);
    free(sp);
}

/* x [T, cols...] of dt filled with nonzero bytes, splits summing to `used` <= T (kind): after
 * moex_zero_tail the first `used` rows are unchanged and the rest are zero bytes. */
static void run_zero_tail(moex_context *ctx, tu_rng *r, moex_dtype dt, int ndim, int64_t T, const int64_t *inner,
                          int64_t G, tu_splits_kind kind, int64_t used) {
    moex_zero_tail_args a;
    memset(&a, 0, sizeof a);
    int64_t row = (int64_t)moex_dtype_size(dt);
    a.x.dtype = dt;
    a.x.ndim = ndim;
    a.x.shape[0] = T;
    for (int i = 1; i < ndim; i++) row *= (a.x.shape[i] = inner[i - 1]);
    const size_t bytes = (size_t)(T * row);
    unsigned char *x = (unsigned char *)tu_alloc(bytes + 1), *before = (unsigned char *)tu_alloc(bytes + 1);
    for (size_t i = 0; i < bytes; i++) x[i] = (unsigned char)(1 + tu_randint(r, 255));
    memcpy(before, x, bytes);
    a.x.data = x;
    int64_t *sp = (int64_t *)tu_alloc((size_t)G * sizeof(int64_t));
    tu_make_splits(r, kind, G, used, sp);
    a.splits = moex_tensor_1d(sp, MOEX_DTYPE_I64, G);
    size_t ws_bytes = 0;
    CHECK_STATUS(ctx, moex_zero_tail_workspace_size(ctx, &a, &ws_bytes), MOEX_OK);
    void *ws = tu_workspace(ws_bytes);
    CHECK_STATUS(ctx, moex_zero_tail(ctx, &a, ws, ws_bytes, NULL), MOEX_OK);
    const size_t kept = (size_t)(used * row);
    size_t bad = SIZE_MAX;
    for (size_t i = 0; i < bytes && bad == SIZE_MAX; i++)
        if (x[i] != (i < kept ? before[i] : 0)) bad = i;
    CHECK_MSG(bad == SIZE_MAX, "zero_tail %s %d-D T=%lld row %lld bytes G=%lld %s sum %lld: byte %zu (row %lld) is %u",
              moex_dtype_name(dt), ndim, (long long)T, (long long)row, (long long)G, tu_splits_name(kind),
              (long long)used, bad, bad == SIZE_MAX ? 0LL : (long long)(bad / (size_t)row),
              bad == SIZE_MAX ? 0u : x[bad]);
    free(ws);
    free(sp);
    free(before);
    free(x);
}

/* Refusals: x of 0 or 5 dimensions (INVALID_ARG) and a sum past T on the CPU (BAD_SPLITS),
 * nothing written. */
static void run_zero_tail_refused(moex_context *ctx) {
    float x[12];
    for (int i = 0; i < 12; i++) x[i] = 1.0f + (float)i;
    int64_t sp[2] = {1, 1};
    moex_zero_tail_args a;
    memset(&a, 0, sizeof a);
    a.splits = moex_tensor_1d(sp, MOEX_DTYPE_I64, 2);
    a.x = moex_tensor_1d(x, MOEX_DTYPE_F32, 12);
    a.x.ndim = 0;
    size_t bytes = 0;
    CHECK_STATUS(ctx, moex_zero_tail_workspace_size(ctx, &a, &bytes), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "x must have 1 to 4 dimensions");
    a.x.ndim = 5;
    CHECK_STATUS(ctx, moex_zero_tail_workspace_size(ctx, &a, &bytes), MOEX_ERR_INVALID_ARG);
    if (moex_context_backend(ctx) != MOEX_BACKEND_CPU) return;   /* CUDA flags bad splits */
    a.x = moex_tensor_1d(x, MOEX_DTYPE_F32, 12);
    sp[0] = 10, sp[1] = 3;
    CHECK_STATUS(ctx, moex_zero_tail_workspace_size(ctx, &a, &bytes), MOEX_OK);
    void *ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_zero_tail(ctx, &a, ws, bytes, NULL), MOEX_ERR_BAD_SPLITS);
    for (int i = 0; i < 12; i++) CHECK_MSG(x[i] == 1.0f + (float)i, "zero_tail refused, x[%d] written", i);
    free(ws);
}

static void zero_tail_suite(moex_context *ctx, tu_rng *r) {
    static const moex_dtype dts[] = {MOEX_DTYPE_F32, MOEX_DTYPE_BF16, MOEX_DTYPE_F16, MOEX_DTYPE_I32,
                                     MOEX_DTYPE_I64, MOEX_DTYPE_E4M3, MOEX_DTYPE_E5M2, MOEX_DTYPE_E8M0};
    static const int64_t inners[][3] = {{1, 1, 1}, {7, 1, 1}, {64, 1, 1}, {3, 5, 1}, {2, 3, 2}, {1024, 1, 1}};
    int n = 0;
    for (int di = 0; di < 8; di++)
        for (int ii = 0; ii < 6; ii++) {
            const int ndim = 1 + (ii == 0 ? 0 : ii < 3 || ii == 5 ? 1 : ii == 3 ? 2 : 3);
            const int64_t T = 1 + tu_randint(r, 300), G = 1 + tu_randint(r, 9);
            const tu_splits_kind kind = (tu_splits_kind)(n++ % TU_SPLITS_NUM_KINDS);
            run_zero_tail(ctx, r, dts[di], ndim, T, inners[ii], G, kind, tu_randint(r, T + 1));
            run_zero_tail(ctx, r, dts[di], ndim, T, inners[ii], G, kind, T);   /* no tail */
        }
    const int64_t one[3] = {1, 1, 1};
    run_zero_tail(ctx, r, MOEX_DTYPE_BF16, 1, 0, one, 3, TU_SPLITS_BALANCED, 0);   /* T = 0 */
    /* rows of no bytes: x.data may be NULL (fuzz finding: NULL + 0 under UBSan) */
    int64_t sp[2] = {1, 0};
    moex_zero_tail_args a;
    memset(&a, 0, sizeof a);
    a.splits = moex_tensor_1d(sp, MOEX_DTYPE_I64, 2);
    a.x = moex_tensor_2d(NULL, MOEX_DTYPE_F32, 5, 0);
    size_t bytes = 0;
    CHECK_STATUS(ctx, moex_zero_tail_workspace_size(ctx, &a, &bytes), MOEX_OK);
    void *ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_zero_tail(ctx, &a, ws, bytes, NULL), MOEX_OK);
    free(ws);
    /* no rows, other sizes whose product overflows (fuzz finding zt-2: signed overflow, UBSan) */
    a.x = moex_tensor_2d(NULL, MOEX_DTYPE_F32, 0, (int64_t)1 << 62);
    a.x.ndim = 3;
    a.x.shape[2] = 5;
    CHECK_STATUS(ctx, moex_zero_tail_workspace_size(ctx, &a, &bytes), MOEX_OK);
    run_zero_tail_refused(ctx);
}

int main(void) {
    moex_context *ctx = tu_cpu_context();
    tu_rng r = tu_rng_seed(7);
    static const int64_t Gs[] = {1, 5, 128};
    for (int gi = 0; gi < 3; gi++) {
        int64_t G = Gs[gi];
        int64_t *splits = (int64_t *)tu_alloc((size_t)G * sizeof(int64_t));
        for (int kind = 0; kind < TU_SPLITS_NUM_KINDS; kind++) {
            int64_t total = 3 * G + 17;
            tu_make_splits(&r, (tu_splits_kind)kind, G, total, splits);
            for (int n = 1; n <= MOEX_MAX_OFFSETS; n += 3)
                run_case(ctx, &r, G, splits, n, tu_splits_name((tu_splits_kind)kind));
            run_case(ctx, &r, G, splits, MOEX_MAX_OFFSETS, tu_splits_name((tu_splits_kind)kind));
        }
        memset(splits, 0, (size_t)G * sizeof(int64_t)); /* all groups empty */
        run_case(ctx, &r, G, splits, 3, "all-empty");
        run_negative(ctx, G, G - 1);
        run_negative(ctx, G, 0);
        free(splits);
    }
    zero_tail_suite(ctx, &r);
    moex_context_destroy(ctx);
    return tu_finish();
}
