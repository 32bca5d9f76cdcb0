/*
 * host_time.c - host time per call of the CUDA backend's grouped linear forward and grouped
 * MLP forward and backward, from C, on shapes so small that the host's time is what a call
 * costs (the GPU finishes each in a few microseconds).
 *
 * Host time = the wall time of CALLS calls in a row over CALLS, the workspace queried and
 * allocated once beforehand (as a C caller does). Before each repetition a large grouped
 * linear forward keeps the GPU busy for about a millisecond, so that no timed call waits
 * for the device; CALLS launches stay far under the launch queue's depth. REPS repetitions,
 * the calls interleaved within each (a slower spell of the host costs every row alike);
 * prints microseconds per call, the minimum (the call's own cost) and the median. The
 * workspace-size queries are timed the same way, as rows of their own.
 *
 * Usage: host_time [--json]   (a CUDA GPU; built with the CUDA backend as bench/moex_host_time)
 */
#include "moex.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { REPS = 21, CALLS = 20 };

/* The small problem: G groups over T rows, grouped linear [K -> N], MLP [H -> 2F -> H]. */
enum { G = 8, T = 256, K = 128, N = 256, H = 128, F = 128 };
/* The GPU-busy problem, about a millisecond of one grouped linear forward on an H100/H200. */
enum { BUSY_T = 16384, BUSY_K = 4096, BUSY_N = 4096 };

#define CHECK_CUDA(x)                                                                             \
    do {                                                                                          \
        cudaError_t e_ = (x);                                                                     \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "host_time: %s: %s\n", #x, cudaGetErrorString(e_));                   \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)
#define CHECK_MOEX(x)                                                                             \
    do {                                                                                          \
        moex_status s_ = (x);                                                                     \
        if (s_ != MOEX_OK) {                                                                      \
            fprintf(stderr, "host_time: %s: %s\n", #x, moex_last_error(NULL));                    \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* Every device allocation, freed at the end. */
static void *allocs[64];
static int nallocs;

static void *dev_alloc(size_t bytes) {
    if (nallocs == (int)(sizeof allocs / sizeof allocs[0])) {
        fprintf(stderr, "host_time: too many allocations\n");
        exit(1);
    }
    void *d = NULL;
    CHECK_CUDA(cudaMalloc(&d, bytes));
    return allocs[nallocs++] = d;
}

/* Device memory of `elems` small random bf16 values (or f32 for f32 = 1): nothing is timed
 * on zeros. */
static void *dev_random(size_t elems, int f32, unsigned *seed) {
    const size_t es = f32 ? 4 : 2;
    unsigned char *h = malloc(elems * es);
    if (!h) {
        fprintf(stderr, "host_time: out of host memory\n");
        exit(1);
    }
    for (size_t i = 0; i < elems; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        const float v = ((float)(*seed >> 8) / 16777216.0f - 0.5f) * 0.5f;
        if (f32) {
            memcpy(h + 4 * i, &v, 4);
        } else {
            uint32_t u;
            memcpy(&u, &v, 4);
            const uint16_t b = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
            memcpy(h + 2 * i, &b, 2);
        }
    }
    void *d = dev_alloc(elems * es);
    CHECK_CUDA(cudaMemcpy(d, h, elems * es, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

/* One timed row: a call on prepared arguments. */
typedef struct row {
    const char *name;
    moex_status (*fn)(moex_context *ctx, void *state);
    void *state;
    double us[REPS];
} row;

typedef struct problem {
    moex_grouped_linear_args gl;
    moex_grouped_mlp_args fwd;
    moex_grouped_mlp_grad_args bwd;
    void *ws;
    size_t ws_bytes;
} problem;

static moex_status call_gl(moex_context *ctx, void *s) {
    problem *p = s;
    return moex_grouped_linear_forward(ctx, &p->gl, p->ws, p->ws_bytes, NULL);
}
static moex_status call_mlp_fwd(moex_context *ctx, void *s) {
    problem *p = s;
    return moex_grouped_mlp_forward(ctx, &p->fwd, p->ws, p->ws_bytes, NULL);
}
static moex_status call_mlp_bwd(moex_context *ctx, void *s) {
    problem *p = s;
    return moex_grouped_mlp_backward(ctx, &p->bwd, p->ws, p->ws_bytes, NULL);
}
static moex_status query_gl(moex_context *ctx, void *s) {
    size_t b;
    return moex_grouped_linear_forward_workspace_size(ctx, &((problem *)s)->gl, &b);
}
static moex_status query_mlp_fwd(moex_context *ctx, void *s) {
    size_t b;
    return moex_grouped_mlp_forward_workspace_size(ctx, &((problem *)s)->fwd, &b);
}
static moex_status query_mlp_bwd(moex_context *ctx, void *s) {
    size_t b;
    return moex_grouped_mlp_backward_workspace_size(ctx, &((problem *)s)->bwd, &b);
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const int json = argc > 1 && strcmp(argv[1], "--json") == 0;
    moex_context *ctx = NULL;
    CHECK_MOEX(moex_context_create(&ctx, MOEX_BACKEND_CUDA, 0));
    unsigned seed = 1;
    const moex_dtype bf = MOEX_DTYPE_BF16;

    int64_t hsplits[G];
    for (int g = 0; g < G; g++) hsplits[g] = T / G + (g == 1 ? 8 : 0) - (g == 2 ? 8 : 0);
    int64_t *splits = dev_alloc(sizeof hsplits);
    CHECK_CUDA(cudaMemcpy(splits, hsplits, sizeof hsplits, cudaMemcpyHostToDevice));
    const moex_tensor sp = moex_tensor_1d(splits, MOEX_DTYPE_I64, G);

    problem p;
    memset(&p, 0, sizeof p);
    p.gl.x = moex_tensor_2d(dev_random((size_t)T * K, 0, &seed), bf, T, K);
    p.gl.w = moex_weight_packed(moex_tensor_3d(dev_random((size_t)G * N * K, 0, &seed), bf, G, N, K));
    p.gl.splits = sp;
    p.gl.y = moex_tensor_2d(dev_random((size_t)T * N, 0, &seed), bf, T, N);

    moex_grouped_mlp_args *f = &p.fwd;
    f->x = moex_tensor_2d(dev_random((size_t)T * H, 0, &seed), bf, T, H);
    f->w1 = moex_weight_packed(moex_tensor_3d(dev_random((size_t)G * 2 * F * H, 0, &seed), bf, G, 2 * F, H));
    f->w2 = moex_weight_packed(moex_tensor_3d(dev_random((size_t)G * H * F, 0, &seed), bf, G, H, F));
    f->b2_mode = MOEX_BIAS_SCALED;
    f->b2 = moex_tensor_2d(dev_random((size_t)G * H, 0, &seed), bf, G, H);
    f->probs = moex_tensor_1d(dev_random(T, 1, &seed), MOEX_DTYPE_F32, T);
    f->glu = moex_glu_params_default(MOEX_GLU_SWIGLU);
    f->splits = sp;
    f->h = moex_tensor_2d(dev_random((size_t)T * 2 * F, 0, &seed), bf, T, 2 * F);
    f->z = moex_tensor_2d(dev_random((size_t)T * F, 0, &seed), bf, T, F);
    f->y = moex_tensor_2d(dev_random((size_t)T * H, 0, &seed), bf, T, H);

    moex_grouped_mlp_grad_args *b = &p.bwd;
    b->x = f->x, b->w1 = f->w1, b->w2 = f->w2, b->b2_mode = f->b2_mode, b->b2 = f->b2, b->probs = f->probs;
    b->glu = f->glu, b->splits = sp, b->h = f->h, b->z = f->z;
    b->dy = moex_tensor_2d(dev_random((size_t)T * H, 0, &seed), bf, T, H);
    b->dx = moex_tensor_2d(dev_random((size_t)T * H, 0, &seed), bf, T, H);
    b->dw_mode = MOEX_GRAD_WRITE;
    b->dw1 = moex_weight_packed(moex_tensor_3d(dev_random((size_t)G * 2 * F * H, 0, &seed), bf, G, 2 * F, H));
    b->dw2 = moex_weight_packed(moex_tensor_3d(dev_random((size_t)G * H * F, 0, &seed), bf, G, H, F));
    b->db2 = moex_tensor_2d(dev_random((size_t)G * H, 1, &seed), MOEX_DTYPE_F32, G, H);
    b->dprobs = moex_tensor_1d(dev_random(T, 1, &seed), MOEX_DTYPE_F32, T);

    /* the busy problem: one group of BUSY_T rows */
    moex_grouped_linear_args busy;
    memset(&busy, 0, sizeof busy);
    const int64_t busy_split = BUSY_T;
    int64_t *busy_splits = dev_alloc(sizeof busy_split);
    CHECK_CUDA(cudaMemcpy(busy_splits, &busy_split, sizeof busy_split, cudaMemcpyHostToDevice));
    busy.x = moex_tensor_2d(dev_random((size_t)BUSY_T * BUSY_K, 0, &seed), bf, BUSY_T, BUSY_K);
    busy.w = moex_weight_packed(moex_tensor_3d(dev_random((size_t)BUSY_N * BUSY_K, 0, &seed), bf, 1, BUSY_N, BUSY_K));
    busy.splits = moex_tensor_1d(busy_splits, MOEX_DTYPE_I64, 1);
    busy.y = moex_tensor_2d(dev_random((size_t)BUSY_T * BUSY_N, 0, &seed), bf, BUSY_T, BUSY_N);

    size_t w[4];
    CHECK_MOEX(moex_grouped_linear_forward_workspace_size(ctx, &p.gl, &w[0]));
    CHECK_MOEX(moex_grouped_mlp_forward_workspace_size(ctx, &p.fwd, &w[1]));
    CHECK_MOEX(moex_grouped_mlp_backward_workspace_size(ctx, &p.bwd, &w[2]));
    CHECK_MOEX(moex_grouped_linear_forward_workspace_size(ctx, &busy, &w[3]));
    for (int i = 0; i < 4; i++) p.ws_bytes = w[i] > p.ws_bytes ? w[i] : p.ws_bytes;
    if (p.ws_bytes) p.ws = dev_alloc(p.ws_bytes);

    row rows[] = {{"grouped_linear_forward", call_gl, &p, {0}},
                  {"grouped_mlp_forward", call_mlp_fwd, &p, {0}},
                  {"grouped_mlp_backward", call_mlp_bwd, &p, {0}},
                  {"grouped_linear_forward_workspace_size", query_gl, &p, {0}},
                  {"grouped_mlp_forward_workspace_size", query_mlp_fwd, &p, {0}},
                  {"grouped_mlp_backward_workspace_size", query_mlp_bwd, &p, {0}}};
    const int nrows = (int)(sizeof rows / sizeof rows[0]);

    for (int i = 0; i < nrows; i++) CHECK_MOEX(rows[i].fn(ctx, rows[i].state));   /* warm-up */
    CHECK_CUDA(cudaDeviceSynchronize());
    for (int r = 0; r < REPS; r++) {
        for (int i = 0; i < nrows; i++) {
            CHECK_MOEX(moex_grouped_linear_forward(ctx, &busy, p.ws, p.ws_bytes, NULL));
            const double t0 = now_us();
            for (int c = 0; c < CALLS; c++) CHECK_MOEX(rows[i].fn(ctx, rows[i].state));
            rows[i].us[r] = (now_us() - t0) / CALLS;
            CHECK_CUDA(cudaDeviceSynchronize());
        }
    }
    CHECK_MOEX(moex_context_check_splits(ctx, NULL));

    if (!json) printf("host time per call, us (G=%d T=%d; linear K=%d N=%d; MLP H=%d F=%d, bf16)\n", G, T, K, N, H, F);
    for (int i = 0; i < nrows; i++) {
        qsort(rows[i].us, REPS, sizeof(double), cmp_double);
        if (json)
            printf("{\"op\": \"%s\", \"min_us\": %.2f, \"median_us\": %.2f}\n", rows[i].name, rows[i].us[0],
                   rows[i].us[REPS / 2]);
        else
            printf("  %-40s min %7.2f  median %7.2f\n", rows[i].name, rows[i].us[0], rows[i].us[REPS / 2]);
    }
    moex_context_destroy(ctx);
    for (int i = 0; i < nallocs; i++) CHECK_CUDA(cudaFree(allocs[i]));
    return 0;
}
