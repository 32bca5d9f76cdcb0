/*
 * test_robustness.c - hostile inputs that once broke the library (issue 13), each a case
 * that failed before its fix: size arithmetic that wrapped (the MoE layer's saved and
 * workspace sizes, signed overflow in size queries), outputs overlapping inputs, the
 * workspace or `saved`, pointer arithmetic on the NULL data of empty tensors; and the
 * other refusals of the size and overlap rules (a saved size past PTRDIFF_MAX, a byte
 * range that wraps the address space).
 *
 * Every refused call must return MOEX_ERR_INVALID_ARG with a message naming the problem
 * and leave every buffer as it was (poison). Huge shapes are given to size queries and
 * runs with small real buffers behind them: a run that got past validation would read or
 * write out of bounds (ASan in scripts/test.sh's sanitizer suite reports it; without ASan
 * it usually crashes). Run it under UBSan too: the NULL cases are undefined behaviour that
 * only UBSan sees.
 */
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define F32 MOEX_DTYPE_F32
#define BF16 MOEX_DTYPE_BF16
#define F16 MOEX_DTYPE_F16
#define I32 MOEX_DTYPE_I32
#define I64 MOEX_DTYPE_I64
#define P2(e) ((int64_t)1 << (e))

/* A small real buffer standing in for a huge tensor: never read by a correct library. */
static unsigned char stand_in[4096];

/* A poisoned buffer, and a check that it still is. */
static void *poisoned(size_t bytes) {
    void *p = tu_alloc(bytes);
    tu_poison(p, bytes);
    return p;
}
#define UNTOUCHED(p, bytes)                                                                    \
    CHECK_MSG(tu_first_unpoisoned((p), (bytes)) < 0, "%s was written (byte %lld)", #p,       \
              (long long)tu_first_unpoisoned((p), (bytes)))

/* ---- 1, 2: size arithmetic ------------------------------------------------------------ */

/* An MoE layer whose h [T*k, 2F] (and z) are far past 2^63 bytes though every caller tensor is
 * small enough: the saved size and the forward workspace wrapped and the forward then wrote
 * out of bounds. x is real ([T, 1] f32), the weights are stand-ins. */
static void moe_saved_wraps(moex_context *ctx, int64_t T, int64_t F) {
    const size_t xbytes = (size_t)T * sizeof(float);
    float *x = (float *)tu_zalloc(xbytes);
    void *y = poisoned(xbytes);
    moex_moe_layer_args a = {
        .x = moex_tensor_2d(x, F32, T, 1),
        .router_w = moex_tensor_2d(stand_in, F32, 1, 1),
        .topk = 1,
        .w1 = moex_weight_packed(moex_tensor_3d(stand_in, F32, 1, 2 * F, 1)),
        .w2 = moex_weight_packed(moex_tensor_3d(stand_in, F32, 1, 1, F)),
        .glu = moex_glu_params_default(MOEX_GLU_SWIGLU),
        .y = moex_tensor_2d(y, F32, T, 1),
    };
    size_t bytes = 12345;
    CHECK_REFUSED(ctx, moex_moe_layer_saved_size(ctx, &a, &bytes), "h", "too many elements");
    CHECK_REFUSED(ctx, moex_moe_layer_forward_workspace_size(ctx, &a, &bytes), "h", "too many elements");
    CHECK_EQ_I64(bytes, 12345);
    void *saved = poisoned(1 << 20), *ws = poisoned(1 << 20);
    a.saved = saved;
    a.saved_bytes = 1 << 20;
    CHECK_REFUSED(ctx, moex_moe_layer_forward(ctx, &a, ws, 1 << 20, NULL), "h", "too many elements");
    UNTOUCHED(y, xbytes);
    UNTOUCHED(saved, 1 << 20);
    UNTOUCHED(ws, 1 << 20);
    free(x), free(y), free(saved), free(ws);
}

/* Size queries read no data: stand-ins everywhere. Each product overflowed an int64. */
static void size_queries_overflow(moex_context *ctx) {
    size_t bytes;
    /* rows * 2F = 64 * 2^58 in the grouped linear workspace reached from the MoE layer */
    moex_moe_layer_args a = {
        .x = moex_tensor_2d(stand_in, BF16, 64, 1),
        .router_w = moex_tensor_2d(stand_in, BF16, 1, 1),
        .topk = 1,
        .w1 = moex_weight_packed(moex_tensor_3d(stand_in, BF16, 1, P2(58), 1)),
        .w2 = moex_weight_packed(moex_tensor_3d(stand_in, BF16, 1, 1, P2(57))),
        .glu = moex_glu_params_default(MOEX_GLU_SWIGLU),
        .y = moex_tensor_2d(stand_in, BF16, 64, 1),
    };
    CHECK_REFUSED(ctx, moex_moe_layer_forward_workspace_size(ctx, &a, &bytes), "h", "too many elements");
    CHECK_REFUSED(ctx, moex_moe_layer_saved_size(ctx, &a, &bytes), "h", "too many elements");
    /* T * k * H = 1023 * 2^21 * 2^37 */
    const int64_t T = 1023, H = P2(37), E = P2(21);
    moex_moe_layer_args b = {
        .x = moex_tensor_2d(stand_in, BF16, T, H),
        .router_w = moex_tensor_2d(stand_in, BF16, E, H),
        .topk = (int32_t)E,
        .w1 = moex_weight_packed(moex_tensor_3d(stand_in, BF16, E, 2, H)),
        .w2 = moex_weight_packed(moex_tensor_3d(stand_in, BF16, E, H, 1)),
        .glu = moex_glu_params_default(MOEX_GLU_SWIGLU),
        .y = moex_tensor_2d(stand_in, BF16, T, H),
    };
    CHECK_REFUSED(ctx, moex_moe_layer_saved_size(ctx, &b, &bytes), "xp", "too many elements");
    CHECK_REFUSED(ctx, moex_moe_layer_forward_workspace_size(ctx, &b, &bytes), "xp", "too many elements");
    moex_moe_layer_grad_args g = {.fwd = b, .dy = b.y};
    CHECK_REFUSED(ctx, moex_moe_layer_backward_workspace_size(ctx, &g, &bytes), "xp", "too many elements");
    /* A caller tensor whose element count overflows: [2^32, 2^32] */
    moex_grouped_linear_args l = {
        .x = moex_tensor_2d(stand_in, F32, P2(32), P2(32)),
        .w = moex_weight_packed(moex_tensor_3d(stand_in, F32, 1, 1, P2(32))),
        .splits = moex_tensor_1d(stand_in, I64, 1),
        .y = moex_tensor_2d(stand_in, F32, P2(32), 1),
    };
    CHECK_REFUSED(ctx, moex_grouped_linear_forward_workspace_size(ctx, &l, &bytes), "x", "too many elements");
    /* The MoE layer's logits [T, E] = [2^30, 2^31 - 1], every caller tensor small enough */
    const int64_t T2 = P2(30), E2 = INT32_MAX;
    moex_moe_layer_args c = {
        .x = moex_tensor_2d(stand_in, F32, T2, 1), .router_w = moex_tensor_2d(stand_in, F32, E2, 1), .topk = 1,
        .w1 = moex_weight_packed(moex_tensor_3d(stand_in, F32, E2, 2, 1)),
        .w2 = moex_weight_packed(moex_tensor_3d(stand_in, F32, E2, 1, 1)),
        .glu = moex_glu_params_default(MOEX_GLU_SWIGLU), .y = moex_tensor_2d(stand_in, F32, T2, 1)};
    CHECK_REFUSED(ctx, moex_moe_layer_saved_size(ctx, &c, &bytes), "logits", "too many elements");
    /* Every tensor and intermediate under 2^60 elements, but xp, h and z together need about
     * 1.25 * 2^63 bytes of `saved`: past PTRDIFF_MAX, short of wrapping a size_t. */
    const int64_t H3 = P2(30) - 1, F3 = P2(29) - 1;
    moex_moe_layer_args s = {
        .x = moex_tensor_2d(stand_in, F32, T2, H3), .router_w = moex_tensor_2d(stand_in, F32, 1, H3), .topk = 1,
        .w1 = moex_weight_packed(moex_tensor_3d(stand_in, F32, 1, 2 * F3, H3)),
        .w2 = moex_weight_packed(moex_tensor_3d(stand_in, F32, 1, H3, F3)),
        .glu = moex_glu_params_default(MOEX_GLU_SWIGLU), .y = moex_tensor_2d(stand_in, F32, T2, H3)};
    bytes = 12345;
    CHECK_REFUSED(ctx, moex_moe_layer_saved_size(ctx, &s, &bytes), "saved", "PTRDIFF_MAX");
    CHECK_EQ_I64(bytes, 12345);
}

/* Tensors whose byte range would wrap around the address space: a packed tensor, and a
 * matrix of a discrete weight (checked on the CPU). Refused by the size queries too. */
static void address_wraps(moex_context *ctx) {
    enum { G = 2, T = 8, K = 4, N = 4 };
    int64_t splits[G] = {3, 4};
    float x[T * K] = {0}, w[G * N * K] = {0}, y[T * N];
    void *top = (void *)(UINTPTR_MAX - 63);   /* 64 bytes below the top: y needs 128 */
    moex_grouped_linear_args a = {
        .x = moex_tensor_2d(x, F32, T, K), .w = moex_weight_packed(moex_tensor_3d(w, F32, G, N, K)),
        .splits = moex_tensor_1d(splits, I64, G), .y = moex_tensor_2d(top, F32, T, N)};
    size_t bytes;
    CHECK_REFUSED(ctx, moex_grouped_linear_forward_workspace_size(ctx, &a, &bytes), "y", "wraps around");
    a.y.data = y;
    void *ptrs[G] = {w, top};
    a.w = (moex_weight){.t = moex_tensor_3d(NULL, F32, G, N, K), .ptrs = ptrs};
    CHECK_REFUSED(ctx, moex_grouped_linear_forward_workspace_size(ctx, &a, &bytes), "w.ptrs[1]", "wraps around");
    ptrs[1] = w + N * K;
    CHECK_STATUS(ctx, moex_grouped_linear_forward_workspace_size(ctx, &a, &bytes), MOEX_OK);
}

/* ---- 3: overlap ----------------------------------------------------------------------- */

/* y starting 4 bytes into row_map (T = 6, k = 1, H = 1, f16) read out of bounds and
 * returned MOEX_OK. */
static void unpermute_overlap(moex_context *ctx) {
    unsigned char *buf = (unsigned char *)poisoned(64);
    int32_t rm[6] = {0, 1, 2, 3, 4, 5};
    memcpy(buf, rm, sizeof rm);
    unsigned char before[64];
    memcpy(before, buf, 64);
    void *yp = poisoned(12);
    moex_unpermute_args a = {.row_map = moex_tensor_1d(buf, I32, 6), .yp = moex_tensor_2d(yp, F16, 6, 1),
                             .y = moex_tensor_2d(buf + 4, F16, 6, 1)};
    CHECK_REFUSED(ctx, moex_unpermute_forward(ctx, &a, NULL, 0, NULL), "y overlaps row_map", NULL);
    CHECK(memcmp(before, buf, 64) == 0);
    free(buf), free(yp);
}

/* probs_p and row_map in one buffer (T = 7, k = 4, E = 6, H = 14, f16) crashed. */
static void permute_overlap(moex_context *ctx) {
    enum { T = 7, k = 4, E = 6, H = 14 };
    void *x = tu_zalloc(T * H * 2), *probs = tu_zalloc(T * k * 4), *xp = poisoned(T * k * H * 2);
    int32_t ids[T * k];
    for (int i = 0; i < T * k; i++) ids[i] = i % E;
    void *shared = poisoned(T * k * 4), *splits = poisoned(E * 8);
    moex_permute_args a = {
        .x = moex_tensor_2d(x, F16, T, H), .ids = moex_tensor_2d(ids, I32, T, k),
        .probs = moex_tensor_2d(probs, F32, T, k), .num_experts = E,
        .xp = moex_tensor_2d(xp, F16, T * k, H), .probs_p = moex_tensor_1d(shared, F32, T * k),
        .splits = moex_tensor_1d(splits, I64, E), .row_map = moex_tensor_1d(shared, I32, T * k)};
    size_t bytes;
    CHECK_STATUS(ctx, moex_permute_forward_workspace_size(ctx, &a, &bytes), MOEX_OK);
    void *ws = poisoned(bytes + 1);
    CHECK_REFUSED(ctx, moex_permute_forward(ctx, &a, ws, bytes, NULL), "probs_p", "row_map");
    UNTOUCHED(shared, T * k * 4);
    UNTOUCHED(xp, T * k * H * 2);
    UNTOUCHED(splits, E * 8);
    /* an output overlapping the workspace */
    a.probs_p = moex_tensor_1d(poisoned(T * k * 4), F32, T * k);
    a.row_map = moex_tensor_1d((char *)ws + 200, I32, T * k);
    CHECK_REFUSED(ctx, moex_permute_forward(ctx, &a, ws, bytes, NULL), "row_map", "workspace");
    UNTOUCHED(a.probs_p.data, T * k * 4);
    free(a.probs_p.data);
    free(x), free(probs), free(xp), free(shared), free(splits), free(ws);
}

/* Every tensor of a grouped linear forward against its output, and inputs aliasing each
 * other (legal). */
static void grouped_linear_overlap(moex_context *ctx) {
    enum { G = 2, T = 8, K = 4, N = 4 };
    /* One arena holds every tensor, so that any of them can be placed onto y. */
    float *arena = (float *)tu_zalloc(4096 * sizeof(float));
    int64_t *splits = (int64_t *)(arena + 3000);
    splits[0] = 3, splits[1] = 4;
    float *x = arena, *w = arena + 100, *bias = arena + 200, *probs = arena + 300, *y = arena + 400;
    float *ws = arena + 1000;
    moex_grouped_linear_args a = {
        .x = moex_tensor_2d(x, F32, T, K), .w = moex_weight_packed(moex_tensor_3d(w, F32, G, N, K)),
        .bias_mode = MOEX_BIAS_SCALED, .bias = moex_tensor_2d(bias, F32, G, N),
        .probs = moex_tensor_1d(probs, F32, T), .splits = moex_tensor_1d(splits, I64, G),
        .y = moex_tensor_2d(y, F32, T, N)};
    size_t bytes;
    CHECK_STATUS(ctx, moex_grouped_linear_forward_workspace_size(ctx, &a, &bytes), MOEX_OK);
    CHECK(bytes < 1500 * sizeof(float));
    CHECK_STATUS(ctx, moex_grouped_linear_forward(ctx, &a, ws, bytes, NULL), MOEX_OK);
    struct { const char *name; void *at; } onto[] = {
        {"x", x + 5}, {"w", w + 31}, {"bias", bias}, {"probs", probs + 7}, {"splits", splits},
        {"workspace", ws + 100}};
    for (size_t i = 0; i < sizeof onto / sizeof onto[0]; i++) {
        moex_grouped_linear_args b = a;
        b.y.data = onto[i].at;
        unsigned char *before = (unsigned char *)malloc(4096 * sizeof(float));
        memcpy(before, arena, 4096 * sizeof(float));
        CHECK_REFUSED(ctx, moex_grouped_linear_forward(ctx, &b, ws, bytes, NULL), "y overlaps", onto[i].name);
        CHECK_MSG(memcmp(before, arena, 4096 * sizeof(float)) == 0, "y onto %s: the arena was written",
                  onto[i].name);
        free(before);
    }
    /* inputs may alias: x is w's first rows, probs is the bias */
    moex_grouped_linear_args c = a;
    c.x.data = w;
    c.probs = moex_tensor_1d(bias, F32, T);
    CHECK_STATUS(ctx, moex_grouped_linear_forward(ctx, &c, ws, bytes, NULL), MOEX_OK);

    /* Discrete weight gradients (CPU: the matrices are checked): two matrices on one
     * buffer, and a matrix on x. */
    float *m0 = (float *)poisoned(N * K * 4), *m1 = (float *)poisoned(N * K * 4);
    void *ptrs[G] = {m0, m0 + 3};
    moex_grouped_linear_wgrad_args wg = {
        .x = moex_tensor_2d(x, F32, T, K), .dy = moex_tensor_2d(y, F32, T, N),
        .splits = moex_tensor_1d(splits, I64, G), .dw_mode = MOEX_GRAD_WRITE,
        .dw = {.t = moex_tensor_3d(NULL, F32, G, N, K), .ptrs = ptrs}};
    CHECK_STATUS(ctx, moex_grouped_linear_backward_weight_workspace_size(ctx, &wg, &bytes), MOEX_OK);
    CHECK_REFUSED(ctx, moex_grouped_linear_backward_weight(ctx, &wg, ws, bytes, NULL), "dw.ptrs[0] overlaps dw.ptrs[1]",
            NULL);
    ptrs[1] = x + 2;
    CHECK_REFUSED(ctx, moex_grouped_linear_backward_weight(ctx, &wg, ws, bytes, NULL), "dw.ptrs[1]", "x");
    UNTOUCHED(m0, N * K * 4);
    ptrs[1] = m1;
    CHECK_STATUS(ctx, moex_grouped_linear_backward_weight(ctx, &wg, ws, bytes, NULL), MOEX_OK);
    free(m0), free(m1), free(arena);
}

/* The MoE layer's saved buffer against its output and workspace. */
static void moe_saved_overlap(moex_context *ctx) {
    enum { T = 5, H = 8, E = 3, F = 4 };
    tu_rng r = tu_rng_seed(7);
    double v[E * 2 * F * H];
    tu_fill_uniform(&r, v, E * 2 * F * H, -1, 1, F32);
    void *x = tu_buffer(F32, v, T * H), *rw = tu_buffer(F32, v, E * H);
    void *w1 = tu_buffer(F32, v, E * 2 * F * H), *w2 = tu_buffer(F32, v, E * H * F);
    moex_moe_layer_args a = {
        .x = moex_tensor_2d(x, F32, T, H), .router_w = moex_tensor_2d(rw, F32, E, H), .topk = 2,
        .w1 = moex_weight_packed(moex_tensor_3d(w1, F32, E, 2 * F, H)),
        .w2 = moex_weight_packed(moex_tensor_3d(w2, F32, E, H, F)),
        .glu = moex_glu_params_default(MOEX_GLU_SWIGLU)};
    size_t saved_bytes, ws_bytes;
    CHECK_STATUS(ctx, moex_moe_layer_saved_size(ctx, &a, &saved_bytes), MOEX_OK);
    a.y = moex_tensor_2d(stand_in, F32, T, H);
    CHECK_STATUS(ctx, moex_moe_layer_forward_workspace_size(ctx, &a, &ws_bytes), MOEX_OK);
    const size_t total = saved_bytes + ws_bytes + T * H * 4;
    unsigned char *arena = (unsigned char *)poisoned(total);
    unsigned char *saved = arena, *ws = arena + saved_bytes;
    a.saved = saved;
    a.saved_bytes = saved_bytes;
    a.y.data = ws + ws_bytes;   /* right after: legal */
    CHECK_STATUS(ctx, moex_moe_layer_forward(ctx, &a, ws, ws_bytes, NULL), MOEX_OK);
    unsigned char *before = (unsigned char *)tu_alloc(total);
    memcpy(before, arena, total);
    moex_moe_layer_args b = a;
    b.y.data = saved + saved_bytes / 2;
    CHECK_REFUSED(ctx, moex_moe_layer_forward(ctx, &b, ws, ws_bytes, NULL), "y", "saved");
    b = a;
    CHECK_REFUSED(ctx, moex_moe_layer_forward(ctx, &b, saved + saved_bytes / 2, ws_bytes, NULL), "workspace", "saved");
    /* the backward reads saved: a gradient on it is refused */
    moex_moe_layer_grad_args g = {.fwd = a, .dy = a.y, .dx = moex_tensor_2d(saved + 256, F32, T, H)};
    size_t gws;
    CHECK_STATUS(ctx, moex_moe_layer_backward_workspace_size(ctx, &g, &gws), MOEX_OK);
    void *gw = poisoned(gws);
    CHECK_REFUSED(ctx, moex_moe_layer_backward(ctx, &g, gw, gws, NULL), "dx", "saved");
    CHECK(memcmp(before, arena, total) == 0);
    UNTOUCHED(gw, gws);
    free(before), free(gw), free(arena), free(x), free(rw), free(w1), free(w2);
}

/* ---- 4: empty tensors with NULL data --------------------------------------------------- */

static void empty_null_tensors(moex_context *ctx) {
    enum { G = 2, K = 4, N = 4 };
    int64_t splits[G] = {0, 0};
    float dw[G * N * K];
    tu_poison(dw, sizeof dw);
    moex_grouped_linear_wgrad_args wg = {
        .x = moex_tensor_2d(NULL, F32, 0, K), .dy = moex_tensor_2d(NULL, F32, 0, N),
        .splits = moex_tensor_1d(splits, I64, G), .dw_mode = MOEX_GRAD_WRITE,
        .dw = moex_weight_packed(moex_tensor_3d(dw, F32, G, N, K))};
    size_t bytes;
    CHECK_STATUS(ctx, moex_grouped_linear_backward_weight_workspace_size(ctx, &wg, &bytes), MOEX_OK);
    void *ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_grouped_linear_backward_weight(ctx, &wg, ws, bytes, NULL), MOEX_OK);
    for (int i = 0; i < G * N * K; i++) CHECK_MSG(dw[i] == 0.0f, "dw[%d] = %g, want 0 (empty groups)", i, dw[i]);
    free(ws);
    /* the forward and the data gradient on zero rows, every tensor with rows NULL */
    float w[G * N * K] = {0}, bias[G * N] = {0};
    moex_grouped_linear_args f = {
        .x = moex_tensor_2d(NULL, BF16, 0, K), .w = moex_weight_packed(moex_tensor_3d(w, F32, G, N, K)),
        .splits = moex_tensor_1d(splits, I64, G), .y = moex_tensor_2d(NULL, BF16, 0, N)};
    f.w.t.dtype = BF16;
    f.bias_mode = MOEX_BIAS_ADD;
    f.bias = moex_tensor_2d(bias, F32, G, N);
    CHECK_STATUS(ctx, moex_grouped_linear_forward_workspace_size(ctx, &f, &bytes), MOEX_OK);
    ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_grouped_linear_forward(ctx, &f, ws, bytes, NULL), MOEX_OK);
    free(ws);
    float db[G * N];
    tu_poison(db, sizeof db);
    moex_grouped_linear_dgrad_args d = {
        .dy = moex_tensor_2d(NULL, BF16, 0, N), .w = f.w, .bias_mode = MOEX_BIAS_ADD,
        .splits = f.splits, .dx = moex_tensor_2d(NULL, BF16, 0, K), .dbias = moex_tensor_2d(db, F32, G, N)};
    CHECK_STATUS(ctx, moex_grouped_linear_backward_data_workspace_size(ctx, &d, &bytes), MOEX_OK);
    ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_grouped_linear_backward_data(ctx, &d, ws, bytes, NULL), MOEX_OK);
    for (int i = 0; i < G * N; i++) CHECK_MSG(db[i] == 0.0f, "dbias[%d] = %g, want 0", i, db[i]);
    free(ws);
}

int main(void) {
    moex_context *ctx;
    if (moex_context_create(&ctx, MOEX_BACKEND_CPU, 0) != MOEX_OK) {
        fprintf(stderr, "context: %s\n", moex_last_error(NULL));
        return 1;
    }
    moe_saved_wraps(ctx, P2(22), P2(40));
    moe_saved_wraps(ctx, P2(20), P2(42));
    size_queries_overflow(ctx);
    address_wraps(ctx);
    unpermute_overlap(ctx);
    permute_overlap(ctx);
    grouped_linear_overlap(ctx);
    moe_saved_overlap(ctx);
    empty_null_tensors(ctx);
    moex_context_destroy(ctx);
    return tu_finish();
}
