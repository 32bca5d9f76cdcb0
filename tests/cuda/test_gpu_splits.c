/*
 * test_gpu_splits.c - split values on the GPU:
 *   - splits_to_offsets against the reference (the CPU test's run_case for G = 1, 5, 128
 *     and 3000, i.e. more than one 1024-group scan chunk), through cuda_mirror.h;
 *   - moex_zero_tail: the CPU test's zero_tail_suite, through cuda_mirror.h; G = 255 to 3000
 *     (past one block of the kernel, which sums the splits itself); bad splits: the clamped
 *     end's rows kept, the rest zero, one BAD_SPLITS report naming zero_tail;
 *   - bad splits (a negative split; a sum past T; a sum that wraps int64): the grouped
 *     linear forward / backward (data; weight: flagged, nothing outside dW) and the grouped
 *     MLP forward write nothing outside their T rows (device buffers with
 *     poisoned guard rows past T), compute the clamped schedule (checked against the
 *     reference run on the clamped splits), and moex_context_check_splits then reports
 *     MOEX_ERR_BAD_SPLITS naming the operation, once (the record is cleared);
 *   - routing ids outside [0, E) in permute: skipped, reported as MOEX_ERR_INVALID_ARG;
 *   - splits_to_offsets into an I32 output that overflows: flagged, MOEX_ERR_BAD_SPLITS;
 *   - determinism: the grouped linear backward (dbias, dprobs) and the grouped MLP backward
 *     run twice on the same inputs give bitwise equal outputs.
 * Exits 77 (skipped) without a GPU.
 */
#include "cuda_mirror.h"

#define tu_cpu_context() cm_context()
#define moex_splits_to_offsets(c, a, w, b, s) gpu_splits_to_offsets((c), (a))
#define moex_zero_tail(c, a, w, b, s) gpu_zero_tail((c), (a))
#define main cpu_suite_main
#include "../test_splits_to_offsets.c"
#undef main

#include <math.h>

#define GUARD_ROWS 37

/* A device buffer of (rows + GUARD_ROWS) * cols elements: rows [0, n_valid) from v (rounded
 * to dt), the rest poison. */
static void *dev_rows(moex_dtype dt, const double *v, int64_t n_valid, int64_t rows, int64_t cols) {
    void *h = tu_buffer_rows(dt, v, n_valid, rows + GUARD_ROWS, cols);
    void *d = cm_to_dev(h, (size_t)((rows + GUARD_ROWS) * cols) * moex_dtype_size(dt));
    free(h);
    return d;
}

/* Host copy of a device buffer of n elements of dt. */
static void *host_of(moex_dtype dt, const void *d, int64_t n) {
    void *h = tu_alloc((size_t)n * moex_dtype_size(dt));
    cm_to_host(h, d, (size_t)n * moex_dtype_size(dt));
    return h;
}

/* The grouped linear with bad splits: nothing outside the T rows, the clamped result,
 * and one BAD_SPLITS report naming the op. */
static void test_bad_splits_linear(moex_context *ctx, tu_rng *r, moex_dtype dt, const int64_t *bad,
                                   const int64_t *clamped, const char *label) {
    const int64_t G = 4, T = 100, K = 24, N = 40;
    double *x = tu_doubles(T * K), *w = tu_doubles(G * N * K), *dy = tu_doubles(T * N);
    tu_fill_uniform(r, x, T * K, -1, 1, dt);
    tu_fill_uniform(r, w, G * N * K, -1, 1, dt);
    tu_fill_uniform(r, dy, T * N, -1, 1, dt);
    void *dx_in = dev_rows(dt, x, T, T, K), *ddy = dev_rows(dt, dy, T, T, N);
    void *hw = tu_buffer(dt, w, G * N * K), *dw = cm_to_dev(hw, (size_t)(G * N * K) * moex_dtype_size(dt));
    void *dsplits = cm_to_dev(bad, (size_t)G * sizeof(int64_t));
    void *dy_out = dev_rows(dt, NULL, 0, T, N), *ddx = dev_rows(dt, NULL, 0, T, K);
    void *ddb = dev_rows(MOEX_DTYPE_F32, NULL, 0, G, N);

    moex_grouped_linear_args fa = {0};
    fa.x = moex_tensor_2d(dx_in, dt, T, K);
    fa.w = moex_weight_packed(moex_tensor_3d(dw, dt, G, N, K));
    fa.splits = moex_tensor_1d(dsplits, MOEX_DTYPE_I64, G);
    fa.y = moex_tensor_2d(dy_out, dt, T, N);
    size_t bytes = 0;
    CHECK_STATUS(ctx, moex_grouped_linear_forward_workspace_size(ctx, &fa, &bytes), MOEX_OK);
    cm_mirror m = {0};
    CHECK_STATUS(ctx, moex_grouped_linear_forward(ctx, &fa, cm_workspace(&m, bytes), bytes, NULL), MOEX_OK);
    CHECK_STATUS(ctx, moex_context_check_splits(ctx, NULL), MOEX_ERR_BAD_SPLITS);
    CHECK_MSG_HAS(ctx, "moex_grouped_linear_forward");
    CHECK_STATUS(ctx, moex_context_check_splits(ctx, NULL), MOEX_OK);   /* cleared */

    moex_grouped_linear_dgrad_args da = {0};
    da.dy = moex_tensor_2d(ddy, dt, T, N);
    da.w = fa.w;
    da.bias_mode = MOEX_BIAS_ADD;
    da.splits = fa.splits;
    da.dx = moex_tensor_2d(ddx, dt, T, K);
    da.dbias = moex_tensor_2d(ddb, MOEX_DTYPE_F32, G, N);
    CHECK_STATUS(ctx, moex_grouped_linear_backward_data_workspace_size(ctx, &da, &bytes), MOEX_OK);
    CHECK_STATUS(ctx, moex_grouped_linear_backward_data(ctx, &da, cm_workspace(&m, bytes), bytes, NULL), MOEX_OK);
    CHECK_STATUS(ctx, moex_context_check_splits(ctx, NULL), MOEX_ERR_BAD_SPLITS);
    CHECK_MSG_HAS(ctx, "moex_grouped_linear_backward_data");

    /* the weight gradient alone (on Hopper: no schedule kernel, the GEMM checks the splits) */
    void *ddw = dev_rows(MOEX_DTYPE_F32, NULL, 0, G * N, K);
    moex_grouped_linear_wgrad_args wa = {0};
    wa.x = fa.x;
    wa.dy = da.dy;
    wa.splits = fa.splits;
    wa.dw_mode = MOEX_GRAD_WRITE;
    wa.dw = moex_weight_packed(moex_tensor_3d(ddw, MOEX_DTYPE_F32, G, N, K));
    CHECK_STATUS(ctx, moex_grouped_linear_backward_weight_workspace_size(ctx, &wa, &bytes), MOEX_OK);
    CHECK_STATUS(ctx, moex_grouped_linear_backward_weight(ctx, &wa, cm_workspace(&m, bytes), bytes, NULL), MOEX_OK);
    CHECK_STATUS(ctx, moex_context_check_splits(ctx, NULL), MOEX_ERR_BAD_SPLITS);
    CHECK_MSG_HAS(ctx, "moex_grouped_linear_backward_weight");
    cm_finish(&m, ctx, MOEX_OK);
    void *hdw = host_of(MOEX_DTYPE_F32, ddw, (G * N + GUARD_ROWS) * K);
    CHECK_FINITE("bad splits: dw", MOEX_DTYPE_F32, hdw, G * N * K);
    CHECK_POISONED("bad splits: dw guard", MOEX_DTYPE_F32, hdw, G * N * K, (G * N + GUARD_ROWS) * K);
    free(hdw);
    cudaFree(ddw);

    /* reference on the clamped splits */
    int64_t rows = 0;
    for (int64_t g = 0; g < G; g++) rows += clamped[g];
    double *y = tu_doubles(T * N), *yb = tu_doubles(T * N), *rdx = tu_doubles(T * K), *rdxb = tu_doubles(T * K);
    double *rdb = tu_doubles(G * N), *rdbb = tu_doubles(G * N);
    ref_grouped_linear_forward(G, T, K, N, clamped, x, w, MOEX_BIAS_NONE, NULL, NULL, y, yb);
    ref_grouped_linear_backward_data(G, T, K, N, clamped, dy, w, MOEX_BIAS_ADD, NULL, NULL, rdx, rdxb, rdb, rdbb,
                                     NULL, NULL);
    void *hy = host_of(dt, dy_out, (T + GUARD_ROWS) * N), *hdx = host_of(dt, ddx, (T + GUARD_ROWS) * K);
    void *hdb = host_of(MOEX_DTYPE_F32, ddb, (G + GUARD_ROWS) * N);
    char what[256];
    ref_tol_model mk = ref_tol_for(dt, dt, 0, K), mn = ref_tol_for(dt, dt, 0, N);
    ref_tol_model mr = ref_tol_for(MOEX_DTYPE_F32, dt, 0, T);
    snprintf(what, sizeof what, "bad splits %s: y of the clamped schedule", label);
    CHECK_CLOSE(what, dt, hy, y, yb, rows * N, N, &mk);
    snprintf(what, sizeof what, "bad splits %s: dx of the clamped schedule", label);
    CHECK_CLOSE(what, dt, hdx, rdx, rdxb, rows * K, K, &mn);
    snprintf(what, sizeof what, "bad splits %s: dbias of the clamped schedule", label);
    CHECK_CLOSE(what, MOEX_DTYPE_F32, hdb, rdb, rdbb, G * N, N, &mr);
    CHECK_POISONED("bad splits: y rows past the clamped sum and past T", dt, hy, rows * N, (T + GUARD_ROWS) * N);
    CHECK_POISONED("bad splits: dx rows past the clamped sum and past T", dt, hdx, rows * K, (T + GUARD_ROWS) * K);
    CHECK_POISONED("bad splits: dbias guard", MOEX_DTYPE_F32, hdb, G * N, (G + GUARD_ROWS) * N);

    free(x); free(w); free(dy); free(hw); free(y); free(yb); free(rdx); free(rdxb); free(rdb); free(rdbb);
    free(hy); free(hdx); free(hdb);
    cudaFree(dx_in); cudaFree(ddy); cudaFree(dw); cudaFree(dsplits); cudaFree(dy_out); cudaFree(ddx); cudaFree(ddb);
}

/* The grouped MLP forward with a sum past T: h, z, y stay inside the T rows. */
static void test_bad_splits_mlp(moex_context *ctx, tu_rng *r) {
    const moex_dtype dt = MOEX_DTYPE_BF16;
    const int64_t G = 3, T = 70, H = 32, F = 24;
    const int64_t bad[3] = {50, 40, 30};
    double *x = tu_doubles(T * H), *w1 = tu_doubles(G * 2 * F * H), *w2 = tu_doubles(G * H * F);
    tu_fill_uniform(r, x, T * H, -1, 1, dt);
    tu_fill_uniform(r, w1, G * 2 * F * H, -1, 1, dt);
    tu_fill_uniform(r, w2, G * H * F, -1, 1, dt);
    void *dxin = dev_rows(dt, x, T, T, H);
    void *h1 = tu_buffer(dt, w1, G * 2 * F * H), *h2 = tu_buffer(dt, w2, G * H * F);
    void *dw1 = cm_to_dev(h1, (size_t)(G * 2 * F * H) * 2), *dw2 = cm_to_dev(h2, (size_t)(G * H * F) * 2);
    void *dsplits = cm_to_dev(bad, sizeof bad);
    void *dh = dev_rows(dt, NULL, 0, T, 2 * F), *dz = dev_rows(dt, NULL, 0, T, F), *dyy = dev_rows(dt, NULL, 0, T, H);
    moex_grouped_mlp_args a = {0};
    a.x = moex_tensor_2d(dxin, dt, T, H);
    a.w1 = moex_weight_packed(moex_tensor_3d(dw1, dt, G, 2 * F, H));
    a.w2 = moex_weight_packed(moex_tensor_3d(dw2, dt, G, H, F));
    a.glu = moex_glu_params_default(MOEX_GLU_SWIGLU);
    a.splits = moex_tensor_1d(dsplits, MOEX_DTYPE_I64, G);
    a.h = moex_tensor_2d(dh, dt, T, 2 * F);
    a.z = moex_tensor_2d(dz, dt, T, F);
    a.y = moex_tensor_2d(dyy, dt, T, H);
    size_t bytes = 0;
    CHECK_STATUS(ctx, moex_grouped_mlp_forward_workspace_size(ctx, &a, &bytes), MOEX_OK);
    cm_mirror m = {0};
    CHECK_STATUS(ctx, moex_grouped_mlp_forward(ctx, &a, cm_workspace(&m, bytes), bytes, NULL), MOEX_OK);
    CHECK_STATUS(ctx, moex_context_check_splits(ctx, NULL), MOEX_ERR_BAD_SPLITS);
    CHECK_MSG_HAS(ctx, "moex_grouped_mlp_forward");
    cm_finish(&m, ctx, MOEX_OK);
    void *hh = host_of(dt, dh, (T + GUARD_ROWS) * 2 * F), *hz = host_of(dt, dz, (T + GUARD_ROWS) * F);
    void *hy = host_of(dt, dyy, (T + GUARD_ROWS) * H);
    CHECK_FINITE("bad splits mlp: h inside T", dt, hh, T * 2 * F);
    CHECK_FINITE("bad splits mlp: y inside T", dt, hy, T * H);
    CHECK_POISONED("bad splits mlp: h guard rows", dt, hh, T * 2 * F, (T + GUARD_ROWS) * 2 * F);
    CHECK_POISONED("bad splits mlp: z guard rows", dt, hz, T * F, (T + GUARD_ROWS) * F);
    CHECK_POISONED("bad splits mlp: y guard rows", dt, hy, T * H, (T + GUARD_ROWS) * H);
    free(x); free(w1); free(w2); free(h1); free(h2); free(hh); free(hz); free(hy);
    cudaFree(dxin); cudaFree(dw1); cudaFree(dw2); cudaFree(dsplits); cudaFree(dh); cudaFree(dz); cudaFree(dyy);
}

/* permute with ids outside [0, E): the valid entries are permuted, the report names the op. */
static void test_bad_ids(moex_context *ctx) {
    const int64_t T = 5, H = 3, k = 2, E = 4;
    float x[15], xp[10 * 3], probs[10], probs_p[10];
    int32_t ids[10] = {0, 1, 2, -1, 3, 0, 4, 1, 2, 3}, row_map[10];
    int64_t splits[4];
    for (int i = 0; i < 15; i++) x[i] = (float)i;
    for (int i = 0; i < 10; i++) probs[i] = 0.1f * (float)i;
    moex_permute_args a = {0};
    a.x = moex_tensor_2d(x, MOEX_DTYPE_F32, T, H);
    a.ids = moex_tensor_2d(ids, MOEX_DTYPE_I32, T, k);
    a.probs = moex_tensor_2d(probs, MOEX_DTYPE_F32, T, k);
    a.num_experts = (int32_t)E;
    a.xp = moex_tensor_2d(xp, MOEX_DTYPE_F32, T * k, H);
    a.probs_p = moex_tensor_1d(probs_p, MOEX_DTYPE_F32, T * k);
    a.splits = moex_tensor_1d(splits, MOEX_DTYPE_I64, E);
    a.row_map = moex_tensor_1d(row_map, MOEX_DTYPE_I32, T * k);
    tu_poison(xp, sizeof xp);
    CHECK_STATUS(ctx, gpu_permute_forward(ctx, &a), MOEX_ERR_INVALID_ARG);
    CHECK_MSG_HAS(ctx, "moex_permute_forward");
    CHECK_STATUS(ctx, moex_context_check_splits(ctx, NULL), MOEX_OK);
    int64_t want[4] = {2, 2, 2, 2};
    CHECK_MSG(memcmp(splits, want, sizeof want) == 0, "bad ids: splits %lld %lld %lld %lld, want 2 2 2 2",
              (long long)splits[0], (long long)splits[1], (long long)splits[2], (long long)splits[3]);
    CHECK_MSG(row_map[3] == -1 && row_map[6] == -1, "bad ids: skipped entries get row -1");
    CHECK_MSG(row_map[0] == 0 && row_map[5] == 1 && row_map[1] == 2 && xp[3 * 1] == x[3 * 2],
              "bad ids: valid entries keep the (expert, token) order");
}

/* An offset past INT32_MAX in an I32 output: stored truncated, flagged, and reported by
 * moex_context_check_splits (the CPU backend refuses the call instead). */
static void test_offsets_overflow(moex_context *ctx) {
    int64_t splits[2] = {(int64_t)1 << 30, (int64_t)1 << 30};
    int32_t out[3] = {-7, -7, -7};
    moex_splits_to_offsets_args a = {0};
    a.splits = moex_tensor_1d(splits, MOEX_DTYPE_I64, 2);
    a.num_outputs = 1;
    a.outputs[0].out = moex_tensor_1d(out, MOEX_DTYPE_I32, 3);
    a.outputs[0].stride = 1;
    a.outputs[0].start = MOEX_OFFSETS_LEADING_ZERO;
    CHECK_STATUS(ctx, gpu_splits_to_offsets(ctx, &a), MOEX_ERR_BAD_SPLITS);
    CHECK_MSG_HAS(ctx, "I32");
    CHECK_MSG(out[0] == 0 && out[1] == (int32_t)1 << 30, "I32 overflow: the offsets that fit are stored");
    CHECK_STATUS(ctx, moex_context_check_splits(ctx, NULL), MOEX_OK);   /* cleared */
}

/* Two runs of the same backward give the same bits. */
static void test_determinism(moex_context *ctx, tu_rng *r) {
    const moex_dtype dt = MOEX_DTYPE_BF16;
    const int64_t G = 8, T = 3000, K = 96, N = 200;
    int64_t splits[8];
    tu_make_splits(r, TU_SPLITS_SKEWED, G, T - 11, splits);
    double *dy = tu_doubles(T * N), *w = tu_doubles(G * N * K), *b = tu_doubles(G * N), *p = tu_doubles(T);
    tu_fill_uniform(r, dy, T * N, -1, 1, dt);
    tu_fill_uniform(r, w, G * N * K, -1, 1, dt);
    tu_fill_uniform(r, b, G * N, -1, 1, MOEX_DTYPE_F32);
    tu_fill_uniform(r, p, T, 0, 1, MOEX_DTYPE_F32);
    void *hdy = tu_buffer(dt, dy, T * N), *hw = tu_buffer(dt, w, G * N * K), *hb = tu_buffer(MOEX_DTYPE_F32, b, G * N);
    void *hp = tu_buffer(MOEX_DTYPE_F32, p, T);
    void *out[2][3];
    for (int run = 0; run < 2; run++) {
        out[run][0] = tu_poisoned(dt, T * K);
        out[run][1] = tu_poisoned(MOEX_DTYPE_F32, G * N);
        out[run][2] = tu_buffer(MOEX_DTYPE_F32, p, T);
        moex_grouped_linear_dgrad_args a = {0};
        a.dy = moex_tensor_2d(hdy, dt, T, N);
        a.w = moex_weight_packed(moex_tensor_3d(hw, dt, G, N, K));
        a.bias_mode = MOEX_BIAS_SCALED;
        a.bias = moex_tensor_2d(hb, MOEX_DTYPE_F32, G, N);
        a.probs = moex_tensor_1d(hp, MOEX_DTYPE_F32, T);
        a.splits = moex_tensor_1d(splits, MOEX_DTYPE_I64, G);
        a.dx = moex_tensor_2d(out[run][0], dt, T, K);
        a.dbias = moex_tensor_2d(out[run][1], MOEX_DTYPE_F32, G, N);
        a.dprobs = moex_tensor_1d(out[run][2], MOEX_DTYPE_F32, T);
        CHECK_STATUS(ctx, gpu_gl_dgrad(ctx, &a), MOEX_OK);
    }
    CHECK_MSG(memcmp(out[0][0], out[1][0], (size_t)(T * K) * 2) == 0, "determinism: dx differs between runs");
    CHECK_MSG(memcmp(out[0][1], out[1][1], (size_t)(G * N) * 4) == 0, "determinism: dbias differs between runs");
    CHECK_MSG(memcmp(out[0][2], out[1][2], (size_t)T * 4) == 0, "determinism: dprobs differs between runs");
    for (int run = 0; run < 2; run++)
        for (int i = 0; i < 3; i++) free(out[run][i]);
    free(dy); free(w); free(b); free(p); free(hdy); free(hw); free(hb); free(hp);
}

/* zero_tail on the GPU past the CPU suite: G beyond one block of the kernel (each block sums
 * every split itself), and bad splits: the rows from the clamped end E on are zero, the rows
 * before it kept, and moex_context_check_splits reports BAD_SPLITS naming zero_tail, once. */
static void test_zero_tail_gpu(moex_context *ctx, tu_rng *r) {
    static const int64_t Gs[] = {255, 257, 1000, 3000};
    const int64_t inner[3] = {24, 1, 1};
    for (int gi = 0; gi < 4; gi++)
        for (int kind = 0; kind < TU_SPLITS_NUM_KINDS; kind++) {
            const int64_t T = Gs[gi] + 1 + tu_randint(r, 2 * Gs[gi]);
            run_zero_tail(ctx, r, MOEX_DTYPE_BF16, 2, T, inner, Gs[gi], (tu_splits_kind)kind, tu_randint(r, T + 1));
        }
    const int64_t T = 100, C = 24, G = 4;
    const int64_t bad[3][4] = {{30, -5, 20, 10}, {60, 30, 40, 10}, {INT64_MAX, INT64_MAX, 2, 0}};
    const int64_t end[3] = {60, 100, 100};
    float *h = (float *)tu_alloc((size_t)(T * C) * sizeof(float));
    for (int c = 0; c < 3; c++) {
        for (int64_t i = 0; i < T * C; i++) h[i] = 1.0f + (float)(i % 7);
        void *dx = cm_to_dev(h, (size_t)(T * C) * sizeof(float));
        void *dsplits = cm_to_dev(bad[c], (size_t)G * sizeof(int64_t));
        moex_zero_tail_args a = {0};
        a.x = moex_tensor_2d(dx, MOEX_DTYPE_F32, T, C);
        a.splits = moex_tensor_1d(dsplits, MOEX_DTYPE_I64, G);
        size_t bytes = 0;
        cm_mirror m = {0};
        CHECK_STATUS(ctx, moex_zero_tail_workspace_size(ctx, &a, &bytes), MOEX_OK);
        /* (the function, not this file's macro that mirrors host buffers) */
        CHECK_STATUS(ctx, (moex_zero_tail)(ctx, &a, cm_workspace(&m, bytes), bytes, NULL), MOEX_OK);
        CHECK_STATUS(ctx, moex_context_check_splits(ctx, NULL), MOEX_ERR_BAD_SPLITS);
        CHECK_MSG_HAS(ctx, "moex_zero_tail");
        CHECK_STATUS(ctx, moex_context_check_splits(ctx, NULL), MOEX_OK);   /* cleared */
        cm_finish(&m, ctx, MOEX_OK);
        cm_to_host(h, dx, (size_t)(T * C) * sizeof(float));
        int64_t wrong = -1;
        for (int64_t i = 0; i < T * C && wrong < 0; i++)
            if (h[i] != (i < end[c] * C ? 1.0f + (float)(i % 7) : 0.0f)) wrong = i;
        CHECK_MSG(wrong < 0, "zero_tail with bad splits %d: element %lld (row %lld) is %g, the clamped end is row %lld",
                  c, (long long)wrong, (long long)(wrong / C), wrong < 0 ? 0.0 : (double)h[wrong], (long long)end[c]);
        cudaFree(dx);
        cudaFree(dsplits);
    }
    free(h);
}

int main(void) {
    moex_context *ctx = cm_context();
    tu_rng r = tu_rng_seed(7);
    static const int64_t Gs[] = {1, 5, 128, 3000};
    for (int gi = 0; gi < 4; gi++) {
        int64_t G = Gs[gi];
        int64_t *splits = (int64_t *)tu_alloc((size_t)G * sizeof(int64_t));
        for (int kind = 0; kind < TU_SPLITS_NUM_KINDS; kind++) {
            tu_make_splits(&r, (tu_splits_kind)kind, G, 3 * G + 17, splits);
            run_case(ctx, &r, G, splits, 1 + kind % MOEX_MAX_OFFSETS, tu_splits_name((tu_splits_kind)kind));
            run_case(ctx, &r, G, splits, MOEX_MAX_OFFSETS, tu_splits_name((tu_splits_kind)kind));
        }
        memset(splits, 0, (size_t)G * sizeof(int64_t));
        run_case(ctx, &r, G, splits, 3, "all-empty");
        free(splits);
    }
    static const moex_dtype dts[3] = {MOEX_DTYPE_F32, MOEX_DTYPE_BF16, MOEX_DTYPE_F16};
    for (int d = 0; d < 3; d++) {
        const int64_t neg[4] = {30, -5, 50, 40}, neg_c[4] = {30, 0, 50, 20};
        const int64_t over[4] = {60, 30, 40, 10}, over_c[4] = {60, 30, 10, 0};
        test_bad_splits_linear(ctx, &r, dts[d], neg, neg_c, "negative");
        test_bad_splits_linear(ctx, &r, dts[d], over, over_c, "sum past T");
        /* a sum that wraps int64 back to a small value */
        const int64_t wrap[4] = {INT64_MAX, INT64_MAX, 2, 0}, wrap_c[4] = {100, 0, 0, 0};
        test_bad_splits_linear(ctx, &r, dts[d], wrap, wrap_c, "wrapping sum");
    }
    test_bad_splits_mlp(ctx, &r);
    test_bad_ids(ctx);
    test_offsets_overflow(ctx);
    test_determinism(ctx, &r);
    zero_tail_suite(ctx, &r);
    test_zero_tail_gpu(ctx, &r);
    moex_context_destroy(ctx);
    return tu_finish();
}
