/*
 * test_sm90_epilogue.c - the Hopper forward's fused epilogues and its 64-row tiles
 * (moex_sm90_grouped_gemm_fwd and _fwd_tuned, src/cuda/sm90_tuning.h) against the fp64
 * reference (tools/ref):
 *   - bias ADD (bias in the input dtype and in f32) and the probs-scaled bias;
 *   - FC1 of the grouped MLP with the scaled GLU: CONTIGUOUS and INTERLEAVED_32, SwiGLU and
 *     clamped SwiGLU, with and without b1 and probs: h against the reference product, z
 *     against the reference GLU of the h the kernel stored (the contract: the GLU reads h
 *     as stored, so the two checks separate the product's error from the GLU's);
 *   - the plain forward and the dgrad with tile_rows 64 next to 128;
 * for tile_rows 64 and 128, bf16 and f16, group sizes 0, 1, 63, 64, 65, 129, G = 1 and 256,
 * widths that are multiples of 8 but not of the tiles. Every output is poisoned first
 * (including GUARD rows past T); rows past the groups' end must come back untouched. One
 * GLU launch is captured in a CUDA graph and replayed after the split values changed, and
 * epilogues the kernels cannot run are refused (MOEX_ERR_UNSUPPORTED, nothing written).
 * Every launch gets a workspace full of garbage; the cases with a grid of 7 CTAs leave a
 * last round that runs stream-K, forced (k-split f32 partials added before the epilogue),
 * and the test fails if none of them did.
 * Exits 77 (skipped) where the Hopper kernels cannot run.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/cuda/sm90_tuning.h"
#include "moex.h"
#include "ref.h"
#include "test_util.h"

#define GUARD 72

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

typedef enum { E_PLAIN, E_DGRAD, E_BIAS, E_SBIAS, E_GLU } ekind;
static const char *ekind_name[] = {"plain", "dgrad", "bias", "sbias", "glu"};

typedef struct ecase {
    ekind kind;
    moex_dtype dt, bias_dt;
    int has_bias, has_probs;          /* GLU: b1 and p present                          */
    moex_glu_kind glu_kind;
    moex_glu_layout layout;
    int64_t G, T, K, N;               /* GLU: N = 2F; dgrad: y [T, K] = x [T, N] W_g    */
    const int64_t *splits;
    int tile_rows;
    int grid;                         /* CTAs (0: one per SM)                            */
} ecase;

static moex_sm90_context *g_ctx;      /* the device state every launch reads              */
static void *g_ws;                    /* the forward's workspace (stream-K)              */
static size_t g_ws_bytes;
static long g_sk_pieces;              /* stream-K partials handed over, over all cases    */

static void *dev_copy(const void *h, size_t bytes) {
    void *d = NULL;
    CK(cudaMalloc(&d, bytes ? bytes : 16));
    if (bytes) CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

/* A poisoned device buffer of rows x cols 16-bit elements (0xFFFF: NaN in bf16 and f16). */
static void *dev_poisoned(int64_t rows, int64_t cols) {
    void *d = NULL;
    CK(cudaMalloc(&d, (size_t)(rows * cols * 2)));
    CK(cudaMemset(d, 0xFF, (size_t)(rows * cols * 2)));
    return d;
}

static uint16_t *host_of(const void *d, int64_t n) {
    uint16_t *h = tu_alloc((size_t)n * 2);
    CK(cudaMemcpy(h, d, (size_t)n * 2, cudaMemcpyDeviceToHost));
    return h;
}

/* Rows [r0, rows) of an [rows, cols] 16-bit host buffer still hold the poison. */
static void check_untouched(const char *what, const uint16_t *h, int64_t r0, int64_t rows, int64_t cols) {
    int64_t touched = 0;
    for (int64_t i = r0 * cols; i < rows * cols; i++) touched += h[i] != 0xFFFFu;
    CHECK_MSG(touched == 0, "%s: %lld elements written past the groups' end", what, (long long)touched);
}

static void run_case(tu_rng *r, const ecase *c) {
    const moex_dtype dt = c->dt;
    const int64_t G = c->G, T = c->T, K = c->K, N = c->N, F = N / 2;
    const int dgrad = c->kind == E_DGRAD, glu = c->kind == E_GLU, failures0 = tu_failures();
    const int64_t in_w = dgrad ? N : K, out_w = dgrad ? K : N;
    char what[160];
    snprintf(what, sizeof what, "%s %s rows%d G=%lld T=%lld K=%lld N=%lld%s%s%s", ekind_name[c->kind],
             dt == MOEX_DTYPE_BF16 ? "bf16" : "f16", c->tile_rows, (long long)G, (long long)T, (long long)K,
             (long long)N, glu ? (c->layout == MOEX_GLU_CONTIGUOUS ? " contiguous" : " interleaved") : "",
             glu && c->glu_kind == MOEX_GLU_CLAMPED_SWIGLU ? " clamped" : "",
             c->bias_dt == MOEX_DTYPE_F32 && c->has_bias ? " f32-bias" : "");

    int64_t *off = tu_alloc((size_t)(G + 1) * 8);
    const int64_t rows = ref_offsets(c->splits, G, off);
    double *x = tu_doubles(T * in_w), *w = tu_doubles(G * N * K), *b = tu_doubles(G * N), *p = tu_doubles(T);
    tu_fill_uniform(r, x, rows * in_w, -1, 1, dt);
    for (int64_t i = rows * in_w; i < T * in_w; i++) x[i] = NAN;   /* never read */
    tu_fill_uniform(r, w, G * N * K, -0.25, 0.25, dt);
    tu_fill_uniform(r, b, G * N, -1, 1, c->has_bias ? c->bias_dt : dt);
    tu_fill_uniform(r, p, T, 0, 1, MOEX_DTYPE_F32);

    void *hx = tu_buffer(dt, x, T * in_w), *hw = tu_buffer(dt, w, G * N * K);
    void *hb = tu_buffer(c->bias_dt, b, G * N), *hp = tu_buffer(MOEX_DTYPE_F32, p, T);
    void *dx = dev_copy(hx, (size_t)(T * in_w * 2)), *dw = dev_copy(hw, (size_t)(G * N * K * 2));
    void *db = dev_copy(hb, (size_t)(G * N) * moex_dtype_size(c->bias_dt));
    float *dp = dev_copy(hp, (size_t)T * 4);
    int64_t *ds = dev_copy(c->splits, (size_t)G * 8);
    void *dy = dev_poisoned(T + GUARD, out_w), *dz = glu ? dev_poisoned(T + GUARD, F) : NULL;

    moex_sm90_gemm_args a = {.dtype = dt, .G = G, .T = T, .K = K, .N = N, .x = dx, .w = dw, .y = dy, .splits = ds,
                             .workspace = g_ws};
    CK(cudaMemset(g_ws, 0x5A, g_ws_bytes));   /* garbage: flags nonzero, partials huge */
    moex_glu_params gp = moex_glu_params_default(c->glu_kind);
    gp.layout = c->layout;
    moex_sm90_epilogue e;
    memset(&e, 0, sizeof e);
    if (c->kind == E_BIAS || c->kind == E_SBIAS || (glu && c->has_bias)) {
        e.bias_mode = c->kind == E_SBIAS ? MOEX_BIAS_SCALED : MOEX_BIAS_ADD;
        e.bias = db;
        e.bias_dtype = c->bias_dt;
    }
    if (c->kind == E_SBIAS || (glu && c->has_probs)) e.probs = dp;
    if (glu) {
        e.glu = &gp;
        e.z = dz;
    }
    moex_sm90_tuning tune;
    memset(&tune, 0, sizeof tune);
    tune.epilogue_tma = 1;
    tune.tile_rows = c->tile_rows;
    tune.grid = c->grid;
    tune.stream_k = c->grid > 0 ? 2 : 0;   /* forced: whenever a last round is left */
    const char *why = "";
    moex_status st = dgrad ? moex_sm90_grouped_gemm_dgrad_tuned(g_ctx, &a, &tune, NULL, &why)
                           : moex_sm90_grouped_gemm_fwd_tuned(g_ctx, &a, &e, &tune, NULL, &why);
    CK(cudaDeviceSynchronize());
    CHECK_MSG(st == MOEX_OK, "%s: status %d (%s)", what, (int)st, why);
    int flags[2 * 1024], pieces = 0;   /* the workspace's first 2 ints per CTA: stream-K flags */
    const int nflags = tune.stream_k != 2 ? 0 : 2 * tune.grid_used < 2 * 1024 ? 2 * tune.grid_used : 2 * 1024;
    CK(cudaMemcpy(flags, g_ws, (size_t)nflags * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < nflags; i++) pieces += flags[i] == 1;
    g_sk_pieces += pieces;

    /* the reference product (y, or h for the GLU; dgrad through the transposed weight) */
    double *yref = tu_doubles(T * out_w), *ybnd = tu_doubles(T * out_w);
    if (dgrad) {
        ref_grouped_linear_backward_data(G, T, K, N, c->splits, x, w, MOEX_BIAS_NONE, NULL, NULL, yref, ybnd, NULL,
                                         NULL, NULL, NULL);
    } else {
        ref_grouped_linear_forward(G, T, K, N, c->splits, x, w, e.bias_mode, b, p, yref, ybnd);
    }
    uint16_t *hy = host_of(dy, (T + GUARD) * out_w);
    ref_tol_model m = ref_tol_for(dt, MOEX_DTYPE_F32, 0, in_w);
    double worst = CHECK_CLOSE(what, dt, hy, yref, ybnd, rows * out_w, out_w, &m);
    check_untouched(what, hy, rows, T + GUARD, out_w);
    double zworst = 0;
    if (glu) {
        /* z against the reference GLU of the h the kernel stored */
        double *hd = tu_read(dt, hy, rows * N), *zref = tu_doubles(T * F), *zbnd = tu_doubles(T * F);
        ref_scaled_glu_forward(&gp, rows, F, hd, NULL, c->has_probs ? p : NULL, zref, zbnd);
        uint16_t *hz = host_of(dz, (T + GUARD) * F);
        ref_tol_model mz = ref_tol_for(dt, dt, 0, 8);
        zworst = CHECK_CLOSE(what, dt, hz, zref, zbnd, rows * F, F, &mz);
        check_untouched(what, hz, rows, T + GUARD, F);
        free(hd);
        free(zref);
        free(zbnd);
        free(hz);
    }
    printf("%-4s %-80s rows=%-5lld worst/tol %.3f", tu_failures() > failures0 ? "FAIL" : "ok", what, (long long)rows, worst);
    if (glu) printf(" z worst/tol %.3f", zworst);
    if (pieces) printf(" stream-K partials %d", pieces);
    printf("\n");

    CK(cudaFree(dx));
    CK(cudaFree(dw));
    CK(cudaFree(db));
    CK(cudaFree(dp));
    CK(cudaFree(ds));
    CK(cudaFree(dy));
    if (dz) CK(cudaFree(dz));
    free(off);
    free(x);
    free(w);
    free(b);
    free(p);
    free(hx);
    free(hw);
    free(hb);
    free(hp);
    free(yref);
    free(ybnd);
    free(hy);
}

/* A GLU launch (contiguous, b1, probs) captured once and replayed with other split values:
 * the replay's h and z equal a fresh launch's bitwise, and rows past the new end stay poisoned. */
static void graph_case(tu_rng *r, moex_dtype dt) {
    const int64_t G = 5, T = 400, K = 136, N = 2 * 200, F = N / 2;
    int64_t s1[5] = {100, 0, 77, 130, 93}, s2[5] = {1, 129, 0, 64, 65};
    double *x = tu_doubles(T * K), *w = tu_doubles(G * N * K), *b = tu_doubles(G * N), *p = tu_doubles(T);
    tu_fill_uniform(r, x, T * K, -1, 1, dt);
    tu_fill_uniform(r, w, G * N * K, -0.25, 0.25, dt);
    tu_fill_uniform(r, b, G * N, -1, 1, dt);
    tu_fill_uniform(r, p, T, 0, 1, MOEX_DTYPE_F32);
    void *hx = tu_buffer(dt, x, T * K), *hw = tu_buffer(dt, w, G * N * K), *hb = tu_buffer(dt, b, G * N);
    void *hp = tu_buffer(MOEX_DTYPE_F32, p, T);
    void *dx = dev_copy(hx, (size_t)(T * K * 2)), *dw = dev_copy(hw, (size_t)(G * N * K * 2));
    void *db = dev_copy(hb, (size_t)(G * N * 2));
    float *dp = dev_copy(hp, (size_t)T * 4);
    int64_t *ds = dev_copy(s1, sizeof s1);
    void *h1 = dev_poisoned(T, N), *z1 = dev_poisoned(T, F), *h2 = dev_poisoned(T, N), *z2 = dev_poisoned(T, F);
    moex_glu_params gp = moex_glu_params_default(MOEX_GLU_SWIGLU);
    moex_sm90_epilogue e = {.bias_mode = MOEX_BIAS_ADD, .bias = db, .bias_dtype = dt, .probs = dp, .glu = &gp,
                            .z = z1};
    moex_sm90_gemm_args a = {.dtype = dt, .G = G, .T = T, .K = K, .N = N, .x = dx, .w = dw, .y = h1, .splits = ds};
    cudaStream_t s;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamCreate(&s));
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    const char *why = "";
    moex_status st = moex_sm90_grouped_gemm_fwd(g_ctx, &a, &e, (moex_stream)s, &why);
    CK(cudaStreamEndCapture(s, &graph));
    CHECK_MSG(st == MOEX_OK, "graph capture: status %d (%s)", (int)st, why);
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaMemcpy(ds, s2, sizeof s2, cudaMemcpyHostToDevice));
    CK(cudaGraphLaunch(exec, s));
    CK(cudaStreamSynchronize(s));
    a.y = h2;
    e.z = z2;
    st = moex_sm90_grouped_gemm_fwd(g_ctx, &a, &e, NULL, &why);
    CK(cudaDeviceSynchronize());
    CHECK_MSG(st == MOEX_OK, "graph reference launch: status %d (%s)", (int)st, why);
    uint16_t *a1 = host_of(h1, T * N), *a2 = host_of(h2, T * N), *b1 = host_of(z1, T * F), *b2 = host_of(z2, T * F);
    int64_t rows = 1 + 129 + 0 + 64 + 65;
    CHECK_MSG(memcmp(a1, a2, (size_t)(T * N * 2)) == 0 && memcmp(b1, b2, (size_t)(T * F * 2)) == 0,
          "graph replay with new splits: h or z differs from a fresh launch");
    check_untouched("graph replay h", a1, rows, T, N);
    check_untouched("graph replay z", b1, rows, T, F);
    printf("graph replay (%s): new split values, %lld rows, compared with a fresh launch\n",
           dt == MOEX_DTYPE_BF16 ? "bf16" : "f16", (long long)rows);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaStreamDestroy(s));
    void *bufs[] = {dx, dw, db, dp, ds, h1, z1, h2, z2};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) CK(cudaFree(bufs[i]));
    void *hbufs[] = {x, w, b, p, hx, hw, hb, hp, a1, a2, b1, b2};
    for (size_t i = 0; i < sizeof hbufs / sizeof hbufs[0]; i++) free(hbufs[i]);
}

/* Epilogues the kernels cannot run are refused with MOEX_ERR_UNSUPPORTED (the dispatcher
 * then takes the portable path) and nothing is written: a GLU with F not a multiple of 8, an
 * INTERLEAVED_32 GLU with F not a multiple of 32, a scaled bias without probs, a bias of a
 * third dtype, a GLU with a scaled bias. */
static void refusal_cases(void) {
    const int64_t G = 2, T = 64, K = 64, N = 48, F = N / 2;
    const int64_t splits[2] = {30, 34};
    void *dx = dev_poisoned(T, K), *dw = dev_poisoned(G * N, K), *dy = dev_poisoned(T, N), *dz = dev_poisoned(T, F);
    void *db = dev_poisoned(G, N);
    float *dp = NULL;
    CK(cudaMalloc((void **)&dp, (size_t)T * 4));
    int64_t *ds = dev_copy(splits, sizeof splits);
    moex_glu_params contig = moex_glu_params_default(MOEX_GLU_SWIGLU), inter = contig;
    inter.layout = MOEX_GLU_INTERLEAVED_32;
    struct {
        const char *what;
        int64_t n;
        moex_sm90_epilogue e;
    } bad[] = {
        {.what = "GLU with F = 12", .n = 24,
         .e = {.bias_mode = MOEX_BIAS_NONE, .bias_dtype = MOEX_DTYPE_BF16, .glu = &contig, .z = dz}},
        {.what = "INTERLEAVED_32 GLU with F = 24", .n = N,
         .e = {.bias_mode = MOEX_BIAS_NONE, .bias_dtype = MOEX_DTYPE_BF16, .glu = &inter, .z = dz}},
        {.what = "scaled bias without probs", .n = N,
         .e = {.bias_mode = MOEX_BIAS_SCALED, .bias = db, .bias_dtype = MOEX_DTYPE_BF16}},
        {.what = "f16 bias with bf16 inputs", .n = N,
         .e = {.bias_mode = MOEX_BIAS_ADD, .bias = db, .bias_dtype = MOEX_DTYPE_F16}},
        {.what = "GLU with a scaled bias", .n = N,
         .e = {.bias_mode = MOEX_BIAS_SCALED, .bias = db, .bias_dtype = MOEX_DTYPE_BF16, .probs = dp, .glu = &contig,
               .z = dz}},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        moex_sm90_gemm_args a = {.dtype = MOEX_DTYPE_BF16, .G = G, .T = T, .K = K, .N = bad[i].n, .x = dx, .w = dw,
                                 .y = dy, .splits = ds};
        const char *why = NULL;
        CHECK_MSG(!moex_sm90_epilogue_supported(g_ctx, &a, &bad[i].e), "%s: reported supported", bad[i].what);
        moex_status st = moex_sm90_grouped_gemm_fwd(g_ctx, &a, &bad[i].e, NULL, &why);
        CK(cudaDeviceSynchronize());
        CHECK_MSG(st == MOEX_ERR_UNSUPPORTED && why != NULL, "%s: status %d, want MOEX_ERR_UNSUPPORTED", bad[i].what,
                  (int)st);
        uint16_t *hy = host_of(dy, T * N), *hz = host_of(dz, T * F);
        check_untouched(bad[i].what, hy, 0, T, N);
        check_untouched(bad[i].what, hz, 0, T, F);
        free(hy);
        free(hz);
    }
    printf("refused: %d unsupported epilogues, nothing written\n", (int)(sizeof bad / sizeof bad[0]));
    void *bufs[] = {dx, dw, dy, dz, db, dp, ds};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) CK(cudaFree(bufs[i]));
}

/* Makes g_ctx; 0 where the Hopper kernels cannot run (no GPU, not sm_90, no sm_90a build). */
static int hopper_available(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return 0;
    const char *why = "";
    const moex_status st = moex_sm90_context_create(0, &g_ctx, &why);
    CHECK_MSG(st == MOEX_OK || st == MOEX_ERR_UNSUPPORTED, "moex_sm90_context_create: status %d (%s)", (int)st, why);
    return st == MOEX_OK;
}

int main(void) {
    if (!hopper_available()) {
        printf("no Hopper (sm_90a) GPU: skipped\n");
        return 77;
    }
    g_ws_bytes = moex_sm90_gemm_workspace_bytes(g_ctx, NULL, NULL);   /* stream-K is forced below */
    CHECK_MSG(g_ws_bytes > 0, "moex_sm90_gemm_workspace_bytes is 0");
    CK(cudaMalloc(&g_ws, g_ws_bytes ? g_ws_bytes : 16));
    tu_rng r = tu_rng_seed(7);
    static const int64_t s_awk[6] = {0, 1, 63, 64, 65, 129};        /* T = 322 + 11 tail rows */
    static const int64_t s_one[1] = {300};
    int64_t s_many[256];
    for (int g = 0; g < 256; g++) s_many[g] = (g * 7) % 5 == 0 ? 0 : (g % 9) * 3 + 1;
    int64_t many_rows = 0;
    for (int g = 0; g < 256; g++) many_rows += s_many[g];

    const moex_dtype dts[2] = {MOEX_DTYPE_BF16, MOEX_DTYPE_F16};
    const int rows_of[2] = {128, 64};
    for (int di = 0; di < 2; di++) {
        const moex_dtype dt = dts[di];
        for (int ri = 0; ri < 2; ri++) {
            const int tr = rows_of[ri];
            /* the plain forward and the dgrad: 64-row tiles next to 128 */
            run_case(&r, &(ecase){.kind = E_PLAIN, .dt = dt, .bias_dt = dt, .G = 6, .T = 333, .K = 136, .N = 264,
                                  .splits = s_awk, .tile_rows = tr});
            run_case(&r, &(ecase){.kind = E_DGRAD, .dt = dt, .bias_dt = dt, .G = 6, .T = 333, .K = 136, .N = 264,
                                  .splits = s_awk, .tile_rows = tr});
            run_case(&r, &(ecase){.kind = E_PLAIN, .dt = dt, .bias_dt = dt, .G = 256, .T = many_rows + 5, .K = 72,
                                  .N = 520, .splits = s_many, .tile_rows = tr});
            /* bias: input-dtype and f32, and the probs-scaled bias */
            run_case(&r, &(ecase){.kind = E_BIAS, .dt = dt, .bias_dt = dt, .has_bias = 1, .G = 6, .T = 333, .K = 136,
                                  .N = 264, .splits = s_awk, .tile_rows = tr});
            run_case(&r, &(ecase){.kind = E_BIAS, .dt = dt, .bias_dt = MOEX_DTYPE_F32, .has_bias = 1, .G = 1,
                                  .T = 300, .K = 200, .N = 520, .splits = s_one, .tile_rows = tr});
            run_case(&r, &(ecase){.kind = E_SBIAS, .dt = dt, .bias_dt = dt, .has_bias = 1, .has_probs = 1, .G = 6,
                                  .T = 333, .K = 136, .N = 264, .splits = s_awk, .tile_rows = tr});
            run_case(&r, &(ecase){.kind = E_SBIAS, .dt = dt, .bias_dt = MOEX_DTYPE_F32, .has_bias = 1, .has_probs = 1,
                                  .G = 256, .T = many_rows, .K = 64, .N = 256, .splits = s_many, .tile_rows = tr});
            /* FC1 + GLU: F = 200 (not a multiple of 64 or 128), 256 and 96 */
            for (int l = 0; l < 2; l++) {
                const moex_glu_layout lay = l ? MOEX_GLU_INTERLEAVED_32 : MOEX_GLU_CONTIGUOUS;
                run_case(&r, &(ecase){.kind = E_GLU, .dt = dt, .bias_dt = dt, .has_bias = 1, .has_probs = 1,
                                      .glu_kind = MOEX_GLU_SWIGLU, .layout = lay, .G = 6, .T = 333, .K = 136,
                                      .N = 2 * 224, .splits = s_awk, .tile_rows = tr});
                run_case(&r, &(ecase){.kind = E_GLU, .dt = dt, .bias_dt = MOEX_DTYPE_F32, .has_bias = 1,
                                      .glu_kind = MOEX_GLU_CLAMPED_SWIGLU, .layout = lay, .G = 1, .T = 300, .K = 72,
                                      .N = 2 * 256, .splits = s_one, .tile_rows = tr});
                run_case(&r, &(ecase){.kind = E_GLU, .dt = dt, .bias_dt = dt, .has_probs = 1,
                                      .glu_kind = MOEX_GLU_SWIGLU, .layout = lay, .G = 256, .T = many_rows, .K = 64,
                                      .N = 2 * 96, .splits = s_many, .tile_rows = tr});
            }
            run_case(&r, &(ecase){.kind = E_GLU, .dt = dt, .bias_dt = dt, .has_bias = 1, .has_probs = 1,
                                  .glu_kind = MOEX_GLU_CLAMPED_SWIGLU, .layout = MOEX_GLU_CONTIGUOUS, .G = 6,
                                  .T = 333, .K = 136, .N = 2 * 200, .splits = s_awk, .tile_rows = tr});
            /* 7 CTAs and 16 k steps: the last round runs stream-K (its partials added before
             * each epilogue) */
            run_case(&r, &(ecase){.kind = E_PLAIN, .dt = dt, .bias_dt = dt, .G = 6, .T = 333, .K = 1000, .N = 520,
                                  .splits = s_awk, .tile_rows = tr, .grid = 7});
            run_case(&r, &(ecase){.kind = E_BIAS, .dt = dt, .bias_dt = MOEX_DTYPE_F32, .has_bias = 1, .G = 6,
                                  .T = 333, .K = 1000, .N = 520, .splits = s_awk, .tile_rows = tr, .grid = 7});
            run_case(&r, &(ecase){.kind = E_SBIAS, .dt = dt, .bias_dt = dt, .has_bias = 1, .has_probs = 1, .G = 6,
                                  .T = 333, .K = 1000, .N = 520, .splits = s_awk, .tile_rows = tr, .grid = 7});
            for (int l = 0; l < 2; l++)
                run_case(&r, &(ecase){.kind = E_GLU, .dt = dt, .bias_dt = dt, .has_bias = 1, .has_probs = 1,
                                      .glu_kind = MOEX_GLU_SWIGLU,
                                      .layout = l ? MOEX_GLU_INTERLEAVED_32 : MOEX_GLU_CONTIGUOUS, .G = 6, .T = 333,
                                      .K = 1000, .N = 2 * 224, .splits = s_awk, .tile_rows = tr, .grid = 7});
        }
        graph_case(&r, dt);
    }
    refusal_cases();
    CHECK_MSG(g_sk_pieces > 0, "the 7-CTA cases never ran stream-K");
    printf("stream-K partials over all cases: %ld\n", g_sk_pieces);
    CK(cudaFree(g_ws));
    moex_sm90_context_destroy(g_ctx);
    return tu_finish();
}
