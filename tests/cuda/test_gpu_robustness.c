/*
 * test_gpu_robustness.c - issue 13's rules on the CUDA backend (tests/test_robustness.c
 * holds the CPU cases): the overlap rule with device pointers (an output on an input, on
 * another output, on the workspace, on `saved`), sizes that would wrap (the MoE layer's
 * saved and workspace queries), the aligned-pointer rules of the grouped MLP backward and the
 * FP8 grouped linear on Hopper and of the layers' FP8 recipe, a discrete weight's alignment and
 * kept maps, and empty tensors with NULL data. Every tensor lives in one
 * device arena poisoned with 0xFF; each refused call must leave the arena bitwise as it was.
 */
#include "cuda_mirror.h"

#define F32 MOEX_DTYPE_F32
#define F16 MOEX_DTYPE_F16
#define I32 MOEX_DTYPE_I32
#define I64 MOEX_DTYPE_I64
#define P2(e) ((int64_t)1 << (e))
#define ARENA (64u << 20)          /* room for the Hopper GEMMs' workspace */
#define SPLITS_AT (ARENA - 4096)    /* the grouped linear's splits, past every workspace */

static unsigned char *arena;        /* device */
static unsigned char *snapshot;     /* host copy taken before a refused call */

static void take_snapshot(void) { cm_to_host(snapshot, arena, ARENA); }

static void check_arena(const char *label, int line) {
    unsigned char *now = (unsigned char *)tu_alloc(ARENA);
    cm_die(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    cm_to_host(now, arena, ARENA);
    tu_record(memcmp(now, snapshot, ARENA) == 0, __FILE__, line, "%s: the arena was written", label);
    free(now);
}

/* Refused (CHECK_REFUSED), and the arena is as it was before the call. */
#define REFUSED(ctx, call, n1, n2)                                                             \
    do {                                                                                       \
        take_snapshot();                                                                       \
        CHECK_REFUSED((ctx), (call), (n1), (n2));                                              \
        check_arena(#call, __LINE__);                                                          \
    } while (0)

static void overlap_cases(moex_context *ctx) {
    enum { G = 2, T = 8, K = 4, N = 4 };
    const int64_t splits[G] = {3, 4};
    cm_die(cudaMemcpy(arena + SPLITS_AT, splits, sizeof splits, cudaMemcpyHostToDevice), "cudaMemcpy");
    float *x = (float *)arena, *w = x + 100, *bias = x + 200, *y = x + 400, *ws = x + 1000;
    moex_grouped_linear_args a = {
        .x = moex_tensor_2d(x, F32, T, K), .w = moex_weight_packed(moex_tensor_3d(w, F32, G, N, K)),
        .bias_mode = MOEX_BIAS_ADD, .bias = moex_tensor_2d(bias, F32, G, N),
        .splits = moex_tensor_1d(arena + SPLITS_AT, I64, G), .y = moex_tensor_2d(y, F32, T, N)};
    size_t bytes;
    CHECK_STATUS(ctx, moex_grouped_linear_forward_workspace_size(ctx, &a, &bytes), MOEX_OK);
    CHECK(4000 + bytes < SPLITS_AT - 4096);
    moex_grouped_linear_args b = a;
    b.y.data = x + 3;
    REFUSED(ctx, moex_grouped_linear_forward(ctx, &b, ws, bytes, NULL), "y overlaps x", NULL);
    b.y.data = arena + SPLITS_AT - 8;
    REFUSED(ctx, moex_grouped_linear_forward(ctx, &b, ws, bytes, NULL), "y overlaps splits", NULL);
    b = a;
    REFUSED(ctx, moex_grouped_linear_forward(ctx, &b, y + 4, bytes, NULL), "workspace", "y");

    /* permute: probs_p and row_map on one buffer */
    enum { PT = 7, Pk = 4, PE = 6, PH = 14 };
    unsigned char *p = arena + 100000;
    moex_permute_args pa = {
        .x = moex_tensor_2d(p, F16, PT, PH), .ids = moex_tensor_2d(p + 4096, I32, PT, Pk),
        .probs = moex_tensor_2d(p + 8192, F32, PT, Pk), .num_experts = PE,
        .xp = moex_tensor_2d(p + 12288, F16, PT * Pk, PH), .probs_p = moex_tensor_1d(p + 32768, F32, PT * Pk),
        .splits = moex_tensor_1d(p + 36864, I64, PE), .row_map = moex_tensor_1d(p + 32768, I32, PT * Pk)};
    CHECK_STATUS(ctx, moex_permute_forward_workspace_size(ctx, &pa, &bytes), MOEX_OK);
    REFUSED(ctx, moex_permute_forward(ctx, &pa, p + 65536, bytes, NULL), "probs_p", "row_map");
}

static void size_cases(moex_context *ctx) {
    static unsigned char stand_in[64];   /* size queries read no data */
    moex_moe_layer_args a = {
        .x = moex_tensor_2d(stand_in, F32, P2(22), 1), .router_w = moex_tensor_2d(stand_in, F32, 1, 1), .topk = 1,
        .w1 = moex_weight_packed(moex_tensor_3d(stand_in, F32, 1, P2(41), 1)),
        .w2 = moex_weight_packed(moex_tensor_3d(stand_in, F32, 1, 1, P2(40))),
        .glu = moex_glu_params_default(MOEX_GLU_SWIGLU), .y = moex_tensor_2d(stand_in, F32, P2(22), 1)};
    size_t bytes;
    REFUSED(ctx, moex_moe_layer_saved_size(ctx, &a, &bytes), "h", "too many elements");
    REFUSED(ctx, moex_moe_layer_forward_workspace_size(ctx, &a, &bytes), "h", "too many elements");
}

/* The MoE layer's saved buffer against its output. */
static void moe_saved_case(moex_context *ctx) {
    enum { T = 5, H = 8, E = 3, F = 4 };
    unsigned char *base = arena + 200000;
    moex_moe_layer_args a = {
        .x = moex_tensor_2d(base, F32, T, H), .router_w = moex_tensor_2d(base + 1024, F32, E, H), .topk = 2,
        .w1 = moex_weight_packed(moex_tensor_3d(base + 2048, F32, E, 2 * F, H)),
        .w2 = moex_weight_packed(moex_tensor_3d(base + 8192, F32, E, H, F)),
        .glu = moex_glu_params_default(MOEX_GLU_SWIGLU), .y = moex_tensor_2d(base + 12288, F32, T, H)};
    size_t saved_bytes, ws_bytes;
    CHECK_STATUS(ctx, moex_moe_layer_saved_size(ctx, &a, &saved_bytes), MOEX_OK);
    CHECK_STATUS(ctx, moex_moe_layer_forward_workspace_size(ctx, &a, &ws_bytes), MOEX_OK);
    CHECK(saved_bytes + ws_bytes < 600000);
    a.saved = base + 16384;
    a.saved_bytes = saved_bytes;
    a.y.data = base + 16384 + saved_bytes / 2;
    REFUSED(ctx, moex_moe_layer_forward(ctx, &a, base + 16384 + saved_bytes + 256, ws_bytes, NULL), "y", "saved");
}

/* Whether this context's device runs the Hopper kernels (a 9.0 GPU, not forced portable). */
static int on_hopper(void) {
    int dev, major, minor;
    cm_die(cudaGetDevice(&dev), "cudaGetDevice");
    cm_die(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute");
    cm_die(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), "cudaDeviceGetAttribute");
    const char *env = getenv("MOEX_CUDA_GEMM");
    return major == 9 && minor == 0 && !(env && strcmp(env, "portable") == 0);
}

/* The grouped MLP backward with h one element past 16-byte alignment: on Hopper (its FC2 and
 * GLU fused, which needs dy, w2 and h aligned) MOEX_ERR_UNSUPPORTED naming h, nothing written
 * (the workspace lies outside the arena); elsewhere (no fused path) it runs. */
static void mlp_misaligned_case(moex_context *ctx) {
    enum { G = 2, T = 16, H = 32, F = 32 };
    const moex_dtype BF = MOEX_DTYPE_BF16;
    const int64_t splits[G] = {7, 9};
    unsigned char *base = arena + 300000;
    cm_die(cudaMemcpy(base, splits, sizeof splits, cudaMemcpyHostToDevice), "cudaMemcpy");
    cm_die(cudaMemset(base + 4096, 0, 65536), "cudaMemset");   /* finite inputs, for the non-Hopper run */
    moex_grouped_mlp_grad_args a = {
        .x = moex_tensor_2d(base + 4096, BF, T, H),
        .w1 = moex_weight_packed(moex_tensor_3d(base + 8192, BF, G, 2 * F, H)),
        .w2 = moex_weight_packed(moex_tensor_3d(base + 20480, BF, G, H, F)),
        .glu = moex_glu_params_default(MOEX_GLU_SWIGLU), .splits = moex_tensor_1d(base, I64, G),
        .h = moex_tensor_2d(base + 32768 + 2, BF, T, 2 * F), .dy = moex_tensor_2d(base + 36864, BF, T, H),
        .dx = moex_tensor_2d(base + 40960, BF, T, H), .dw_mode = MOEX_GRAD_WRITE,
        .dw1 = moex_weight_packed(moex_tensor_3d(base + 45056, BF, G, 2 * F, H))};
    size_t bytes;
    CHECK_STATUS(ctx, moex_grouped_mlp_backward_workspace_size(ctx, &a, &bytes), MOEX_OK);
    void *ws = cm_malloc(bytes);
    const int hopper = on_hopper();
    take_snapshot();
    const moex_status st = moex_grouped_mlp_backward(ctx, &a, ws, bytes, NULL);
    if (hopper) {
        CHECK_STATUS(ctx, st, MOEX_ERR_UNSUPPORTED);
        CHECK_MSG(strstr(moex_last_error(ctx), "h is not 16-byte aligned") != NULL, "message \"%s\"",
                  moex_last_error(ctx));
        check_arena("misaligned h", __LINE__);
    } else {
        CHECK_STATUS(ctx, st, MOEX_OK);
    }
    cudaFree(ws);
}

/* The FP8 grouped linear forward with y one element past 16-byte alignment: on Hopper (its FP8
 * kernel, which needs x.data, w.data and y aligned) MOEX_ERR_UNSUPPORTED, nothing written;
 * elsewhere (the dequantizing path) it runs. */
static void fp8_misaligned_case(moex_context *ctx) {
    enum { G = 2, T = 16, K = 32, N = 16 };
    const int64_t splits[G] = {7, 9};
    const float scales[G] = {1.0f, 0.5f};
    unsigned char *base = arena + 400000;
    cm_die(cudaMemcpy(base, splits, sizeof splits, cudaMemcpyHostToDevice), "cudaMemcpy");
    cm_die(cudaMemset(base + 4096, 0, 4096), "cudaMemset");   /* FP8 zeros (x, w) */
    cm_die(cudaMemcpy(base + 8192, scales, sizeof scales, cudaMemcpyHostToDevice), "cudaMemcpy");
    cm_die(cudaMemcpy(base + 8448, scales, sizeof scales, cudaMemcpyHostToDevice), "cudaMemcpy");
    moex_quant_params q;
    memset(&q, 0, sizeof q);
    q.recipe = MOEX_QUANT_GROUP, q.fp8 = MOEX_DTYPE_E4M3;
    moex_grouped_linear_fp8_args a;
    memset(&a, 0, sizeof a);
    a.x_params = a.w_params = q;
    a.x.data = moex_tensor_2d(base + 4096, MOEX_DTYPE_E4M3, T, K);
    a.x.scales = moex_tensor_1d(base + 8192, F32, G);
    a.w.data = moex_tensor_3d(base + 5120, MOEX_DTYPE_E4M3, G, N, K);
    a.w.scales = moex_tensor_1d(base + 8448, F32, G);
    a.splits = moex_tensor_1d(base, I64, G);
    a.y = moex_tensor_2d(base + 12288 + 2, MOEX_DTYPE_BF16, T, N);
    size_t bytes;
    CHECK_STATUS(ctx, moex_grouped_linear_fp8_forward_workspace_size(ctx, &a, &bytes), MOEX_OK);
    void *ws = cm_malloc(bytes);
    const int hopper = on_hopper();
    take_snapshot();
    const moex_status st = moex_grouped_linear_fp8_forward(ctx, &a, ws, bytes, NULL);
    if (hopper) {
        CHECK_STATUS(ctx, st, MOEX_ERR_UNSUPPORTED);
        CHECK_MSG(strstr(moex_last_error(ctx), "16-byte aligned") != NULL, "message \"%s\"", moex_last_error(ctx));
        check_arena("misaligned FP8 y", __LINE__);
    } else {
        CHECK_STATUS(ctx, st, MOEX_OK);
    }
    cudaFree(ws);
}

/* The grouped MLP forward with an FP8 recipe and y (FC2's output, written after h) one
 * element past 16-byte alignment: refused with the arguments, before FC1 writes h (the FP8
 * GEMM kernels write y), on any device; nothing written. Aligned, it runs. */
static void fp8_recipe_misaligned_case(moex_context *ctx) {
    enum { G = 2, T = 16, H = 32, F = 32 };
    const moex_dtype BF = MOEX_DTYPE_BF16;
    const int64_t splits[G] = {7, 9};
    unsigned char *base = arena + 500000;
    cm_die(cudaMemcpy(base, splits, sizeof splits, cudaMemcpyHostToDevice), "cudaMemcpy");
    cm_die(cudaMemset(base + 4096, 0, 65536), "cudaMemset");   /* finite inputs */
    moex_grouped_mlp_args a = {
        .x = moex_tensor_2d(base + 4096, BF, T, H),
        .w1 = moex_weight_packed(moex_tensor_3d(base + 8192, BF, G, 2 * F, H)),
        .w2 = moex_weight_packed(moex_tensor_3d(base + 20480, BF, G, H, F)),
        .glu = moex_glu_params_default(MOEX_GLU_SWIGLU), .splits = moex_tensor_1d(base, I64, G),
        .h = moex_tensor_2d(base + 32768, BF, T, 2 * F), .y = moex_tensor_2d(base + 40960 + 2, BF, T, H)};
    a.fp8.mode = MOEX_FP8_BLOCK;
    size_t bytes;
    CHECK_STATUS(ctx, moex_grouped_mlp_forward_workspace_size(ctx, &a, &bytes), MOEX_OK);
    void *ws = cm_malloc(bytes);
    take_snapshot();
    CHECK_STATUS(ctx, moex_grouped_mlp_forward(ctx, &a, ws, bytes, NULL), MOEX_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(moex_last_error(ctx), "y must be 16-byte aligned") != NULL, "message \"%s\"",
              moex_last_error(ctx));
    check_arena("FP8 recipe, misaligned y", __LINE__);
    a.y.data = base + 40960;
    CHECK_STATUS(ctx, moex_grouped_mlp_forward(ctx, &a, ws, bytes, NULL), MOEX_OK);
    cudaFree(ws);
}

/* Empty tensors with NULL data: OK, and dW of empty groups is zeros. */
/* A discrete weight whose second matrix is one element past 16-byte alignment (naturally
 * aligned: the core accepts it), forward and backward data: on Hopper the kernels read the
 * matrices by TMA, which needs 16 bytes, and cannot see the pointers on the host: the call
 * runs without a fault and moex_context_check_splits reports MOEX_ERR_INVALID_ARG naming the
 * op, once; elsewhere (the portable kernel) it runs and reports nothing. Then an aligned call
 * is clean again. */
static void discrete_misaligned_case(moex_context *ctx) {
    enum { G = 2, T = 16, K = 32, N = 16 };
    const moex_dtype BF = MOEX_DTYPE_BF16;
    const int64_t splits[G] = {7, 9};
    unsigned char *base = arena + 500000;
    cm_die(cudaMemcpy(base, splits, sizeof splits, cudaMemcpyHostToDevice), "cudaMemcpy");
    cm_die(cudaMemset(base + 4096, 0, 16384), "cudaMemset");   /* x, dy and the matrices: zeros */
    for (int skew = 2; skew >= 0; skew -= 2) {
        void *mats[G] = {base + 8192, base + 12288 + skew};
        void *ptrs = cm_to_dev(mats, sizeof mats);
        const moex_weight w = {moex_tensor_3d(NULL, BF, G, N, K), (void *const *)ptrs};
        moex_grouped_linear_args f = {.x = moex_tensor_2d(base + 4096, BF, T, K), .w = w,
                                      .splits = moex_tensor_1d(base, I64, G),
                                      .y = moex_tensor_2d(base + 16384, BF, T, N)};
        moex_grouped_linear_dgrad_args d = {.dy = moex_tensor_2d(base + 4096, BF, T, N), .w = w,
                                            .splits = moex_tensor_1d(base, I64, G),
                                            .dx = moex_tensor_2d(base + 16384, BF, T, K)};
        size_t fb, db;
        CHECK_STATUS(ctx, moex_grouped_linear_forward_workspace_size(ctx, &f, &fb), MOEX_OK);
        CHECK_STATUS(ctx, moex_grouped_linear_backward_data_workspace_size(ctx, &d, &db), MOEX_OK);
        void *ws = cm_malloc(fb > db ? fb : db);
        CHECK_STATUS(ctx, moex_grouped_linear_forward(ctx, &f, ws, fb, NULL), MOEX_OK);
        const moex_status st = moex_context_check_splits(ctx, NULL);
        CHECK_STATUS(ctx, moex_grouped_linear_backward_data(ctx, &d, ws, db, NULL), MOEX_OK);
        const moex_status st2 = moex_context_check_splits(ctx, NULL);
        if (skew && on_hopper()) {
            CHECK_MSG(st == MOEX_ERR_INVALID_ARG && st2 == MOEX_ERR_INVALID_ARG, "check_splits: %d, %d", (int)st,
                      (int)st2);
            CHECK_MSG(strstr(moex_last_error(ctx), "moex_grouped_linear_backward_data read a discrete weight with "
                                                   "a matrix that is not 16-byte aligned") != NULL,
                      "message \"%s\"", moex_last_error(ctx));
        } else {
            CHECK_MSG(st == MOEX_OK && st2 == MOEX_OK, "check_splits: %d, %d", (int)st, (int)st2);
        }
        CHECK_STATUS(ctx, moex_context_check_splits(ctx, NULL), MOEX_OK);   /* reported once */
        cudaFree(ptrs), cudaFree(ws);
    }
}

/* A discrete weight's kept maps (moex_weight_maps_write) through the public calls: 3 * 128
 * bytes per matrix on Hopper, none elsewhere. The forward and backward data given them equal
 * the same calls without them bitwise; after two matrices swap places in the pointer array and
 * the maps are written again, both calls follow (the swapped weight's result); too few bytes
 * or misaligned maps are refused with nothing written; a matrix off 16-byte alignment is
 * reported once by moex_context_check_splits, naming moex_weight_maps_write. */
static void kept_maps_case(moex_context *ctx) {
    enum { G = 3, T = 300, K = 64, N = 96 };
    const moex_dtype BF = MOEX_DTYPE_BF16;
    const int64_t splits[G] = {100, 0, 170};   /* rows 270.. past the groups */
    tu_rng r = tu_rng_seed(91);
    double *v = tu_doubles(T * N > G * N * K ? T * N : G * N * K);
    unsigned char *base = arena + (1u << 20);   /* splits, x, dy, y, dx, the matrices, the maps, workspace */
    unsigned char *dsplits = base, *x = base + 4096, *dy = x + 65536, *y = dy + 65536, *dx = y + 65536;
    unsigned char *mats = dx + 65536, *maps = mats + 4 * 16384, *ws = maps + 65536;
    cm_die(cudaMemcpy(dsplits, splits, sizeof splits, cudaMemcpyHostToDevice), "cudaMemcpy");
    struct { void *dev; int64_t n; } fills[] = {{x, T * K}, {dy, T * N}, {mats, G * N * K}};
    for (int i = 0; i < 3; i++) {
        tu_fill_uniform(&r, v, fills[i].n, -1, 1, BF);
        void *h = tu_buffer(BF, v, fills[i].n);
        cm_die(cudaMemcpy(fills[i].dev, h, (size_t)fills[i].n * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
        free(h);
    }
    void *order[2][G];
    for (int g = 0; g < G; g++) order[0][g] = mats + (size_t)g * N * K * 2;
    for (int g = 0; g < G; g++) order[1][g] = order[0][(g + 1) % G];
    void **ptrs = (void **)cm_malloc(sizeof order[0]);
    moex_weight w = {moex_tensor_3d(NULL, BF, G, N, K), (void *const *)ptrs, NULL};
    size_t need = 1;
    CHECK_STATUS(ctx, moex_weight_maps_size(ctx, &w, &need), MOEX_OK);
    CHECK_MSG(need == (on_hopper() ? (size_t)G * 3 * 128 : 0), "maps: %zu bytes", need);
    moex_grouped_linear_args f = {.x = moex_tensor_2d(x, BF, T, K), .w = w, .splits = moex_tensor_1d(dsplits, I64, G),
                                  .y = moex_tensor_2d(y, BF, T, N)};
    moex_grouped_linear_dgrad_args d = {.dy = moex_tensor_2d(dy, BF, T, N), .w = w,
                                        .splits = moex_tensor_1d(dsplits, I64, G), .dx = moex_tensor_2d(dx, BF, T, K)};
    size_t fb, db;
    CHECK_STATUS(ctx, moex_grouped_linear_forward_workspace_size(ctx, &f, &fb), MOEX_OK);
    CHECK_STATUS(ctx, moex_grouped_linear_backward_data_workspace_size(ctx, &d, &db), MOEX_OK);
    CHECK(fb <= 8u << 20 && db <= 8u << 20);
    const size_t yb = (size_t)T * N * 2, xb = (size_t)T * K * 2;
    unsigned char *want_y = tu_alloc(yb), *want_dx = tu_alloc(xb), *got_y = tu_alloc(yb), *got_dx = tu_alloc(xb);
    for (int o = 0; o < 2; o++) {
        cm_die(cudaMemcpy(ptrs, order[o], sizeof order[o], cudaMemcpyHostToDevice), "cudaMemcpy");
        f.w.maps = d.w.maps = NULL;   /* the calls write the maps into their workspace */
        CHECK_STATUS(ctx, moex_grouped_linear_forward(ctx, &f, ws, fb, NULL), MOEX_OK);
        CHECK_STATUS(ctx, moex_grouped_linear_backward_data(ctx, &d, ws, db, NULL), MOEX_OK);
        cm_to_host(want_y, y, yb), cm_to_host(want_dx, dx, xb);
        cm_die(cudaMemset(y, 0xFF, yb), "cudaMemset"), cm_die(cudaMemset(dx, 0xFF, xb), "cudaMemset");
        const moex_weight_maps_write_args m = {w, maps, need};
        CHECK_STATUS(ctx, moex_weight_maps_write(ctx, &m, NULL, 0, NULL), MOEX_OK);
        f.w.maps = d.w.maps = maps;
        CHECK_STATUS(ctx, moex_grouped_linear_forward(ctx, &f, ws, fb, NULL), MOEX_OK);
        CHECK_STATUS(ctx, moex_grouped_linear_backward_data(ctx, &d, ws, db, NULL), MOEX_OK);
        cm_to_host(got_y, y, yb), cm_to_host(got_dx, dx, xb);
        /* rows past the groups are left alone: compare the groups' rows */
        CHECK_MSG(memcmp(got_y, want_y, 270u * N * 2) == 0, "order %d: y with kept maps differs", o);
        CHECK_MSG(memcmp(got_dx, want_dx, 270u * K * 2) == 0, "order %d: dx with kept maps differs", o);
    }
    CHECK_STATUS(ctx, moex_context_check_splits(ctx, NULL), MOEX_OK);
    if (need > 0) {
        moex_weight_maps_write_args m = {w, maps, need - 1};
        REFUSED(ctx, moex_weight_maps_write(ctx, &m, NULL, 0, NULL), "maps_bytes", NULL);
        m.maps_bytes = need, m.maps = maps + 64;
        REFUSED(ctx, moex_weight_maps_write(ctx, &m, NULL, 0, NULL), "maps", "aligned");
        void *skewed[G] = {order[0][0], (unsigned char *)order[0][1] + 2, order[0][2]};
        cm_die(cudaMemcpy(ptrs, skewed, sizeof skewed, cudaMemcpyHostToDevice), "cudaMemcpy");
        m.maps = maps;
        CHECK_STATUS(ctx, moex_weight_maps_write(ctx, &m, NULL, 0, NULL), MOEX_OK);
        CHECK_STATUS(ctx, moex_context_check_splits(ctx, NULL), MOEX_ERR_INVALID_ARG);
        CHECK_MSG(strstr(moex_last_error(ctx), "moex_weight_maps_write read a discrete weight with a matrix that "
                                               "is not 16-byte aligned") != NULL,
                  "message \"%s\"", moex_last_error(ctx));
        CHECK_STATUS(ctx, moex_context_check_splits(ctx, NULL), MOEX_OK);   /* reported once */
    }
    free(want_y), free(want_dx), free(got_y), free(got_dx), free(v);
    cudaFree(ptrs);
}

static void empty_case(moex_context *ctx) {
    enum { G = 2, K = 4, N = 4 };
    const int64_t splits[G] = {0, 0};
    int64_t *ds = (int64_t *)cm_to_dev(splits, sizeof splits);
    float *dw = (float *)cm_malloc(G * N * K * sizeof(float));
    cm_die(cudaMemset(dw, 0xFF, G * N * K * sizeof(float)), "cudaMemset");
    moex_grouped_linear_wgrad_args wg = {
        .x = moex_tensor_2d(NULL, F32, 0, K), .dy = moex_tensor_2d(NULL, F32, 0, N),
        .splits = moex_tensor_1d(ds, I64, G), .dw_mode = MOEX_GRAD_WRITE,
        .dw = moex_weight_packed(moex_tensor_3d(dw, F32, G, N, K))};
    size_t bytes;
    CHECK_STATUS(ctx, moex_grouped_linear_backward_weight_workspace_size(ctx, &wg, &bytes), MOEX_OK);
    void *ws = cm_malloc(bytes);
    CHECK_STATUS(ctx, moex_grouped_linear_backward_weight(ctx, &wg, ws, bytes, NULL), MOEX_OK);
    CHECK_STATUS(ctx, moex_context_check_splits(ctx, NULL), MOEX_OK);
    float host[G * N * K];
    cm_to_host(host, dw, sizeof host);
    for (int i = 0; i < G * N * K; i++) CHECK_MSG(host[i] == 0.0f, "dw[%d] = %g, want 0", i, host[i]);
    cudaFree(ds), cudaFree(dw), cudaFree(ws);
}

int main(void) {
    moex_context *ctx = cm_context();
    arena = (unsigned char *)cm_malloc(ARENA);
    cm_die(cudaMemset(arena, 0xFF, ARENA), "cudaMemset");
    snapshot = (unsigned char *)tu_alloc(ARENA);
    overlap_cases(ctx);
    size_cases(ctx);
    moe_saved_case(ctx);
    mlp_misaligned_case(ctx);
    fp8_misaligned_case(ctx);
    fp8_recipe_misaligned_case(ctx);
    discrete_misaligned_case(ctx);
    kept_maps_case(ctx);
    empty_case(ctx);
    cudaFree(arena);
    free(snapshot);
    moex_context_destroy(ctx);
    return tu_finish();
}
