/*
 * test_alignment.c - the alignment rule of moex.h ("Tensors"): the data of every tensor with
 * elements is aligned to its dtype's size (4 bytes for f32 and i32, 8 for i64, 2 for bf16 and
 * f16, 1 for the FP8 dtypes and E8M0), and so is every matrix of a discrete weight (its
 * pointer array to a pointer's size). A tensor that breaks it is refused with the arguments,
 * MOEX_ERR_INVALID_ARG naming it, by the size query and the run, and nothing is written
 * (issue 32: the CPU group quantize read an i64 splits and stored an f32 amax at odd
 * addresses, and the grouped linear accepted misaligned f32 tensors).
 *
 * Each case builds valid arguments in buffers placed at a chosen byte offset from a 64-byte
 * boundary, checks that they run, then moves one tensor off its alignment and checks the
 * refusal: status, a message naming the tensor and "aligned", and every output buffer still
 * poison. Offsets that keep the natural alignment (a bf16 tensor 2 bytes past a 4-byte
 * boundary, FP8 data at an odd address) are accepted, and so is an empty tensor anywhere.
 */
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define F32 MOEX_DTYPE_F32
#define BF16 MOEX_DTYPE_BF16
#define I32 MOEX_DTYPE_I32
#define I64 MOEX_DTYPE_I64
#define E4M3 MOEX_DTYPE_E4M3

#define PAD 64
#define MAXBUF 16

/* ---- buffers at chosen offsets ----------------------------------------------------------- */

/* One allocation per tensor: PAD bytes, the tensor at PAD + off, slack after. Outputs are
 * poisoned as a whole and checked as a whole after a refused call. */
typedef struct buf {
    unsigned char *mem;
    size_t cap;
    int out;
} buf;

static buf bufs[MAXBUF];
static int nbufs;

static void *place(size_t bytes, size_t off, int out, const void *src) {
    buf *b = &bufs[nbufs++];
    b->cap = (bytes + 2 * PAD + 63) / 64 * 64;
    b->mem = (unsigned char *)aligned_alloc(64, b->cap);
    b->out = out;
    tu_poison(b->mem, b->cap);
    void *p = b->mem + PAD + off;
    if (src) memcpy(p, src, bytes);
    return p;
}

static void free_bufs(void) {
    for (int i = 0; i < nbufs; i++) free(bufs[i].mem);
    nbufs = 0;
}

static int outputs_untouched(void) {
    for (int i = 0; i < nbufs; i++)
        if (bufs[i].out && tu_first_unpoisoned(bufs[i].mem, bufs[i].cap) >= 0) return 0;
    return 1;
}

/* A valid input of n elements of dt (values in [-1, 1)), at `off`. */
static void *input(tu_rng *r, moex_dtype dt, int64_t n, size_t off) {
    double *v = tu_doubles(n);
    tu_fill_uniform(r, v, n, -1, 1, dt);
    void *src = tu_buffer(dt, v, n);
    void *p = place((size_t)n * moex_dtype_size(dt), off, 0, src);
    free(src);
    free(v);
    return p;
}

static void *output(moex_dtype dt, int64_t n, size_t off) { return place((size_t)n * moex_dtype_size(dt), off, 1, NULL); }

/* Runs the size query and the call; with `name` NULL both must succeed, else both must be
 * refused naming `name` and its alignment, writing nothing. */
#define RUN(ctx, fn, a, name)                                                                  \
    do {                                                                                       \
        size_t bytes_ = 0;                                                                     \
        moex_status q_ = fn##_workspace_size((ctx), &(a), &bytes_);                            \
        if (!(name)) {                                                                         \
            CHECK_STATUS(ctx, q_, MOEX_OK);                                                    \
            void *ws_ = bytes_ ? tu_workspace(bytes_) : NULL;                                  \
            CHECK_STATUS(ctx, fn((ctx), &(a), ws_, bytes_, NULL), MOEX_OK);                    \
            free(ws_);                                                                         \
        } else {                                                                               \
            CHECK_REFUSED(ctx, q_, name, "aligned");                                           \
            void *ws_ = tu_workspace(1u << 20);                                                \
            CHECK_REFUSED(ctx, fn((ctx), &(a), ws_, 1u << 20, NULL), name, "aligned");        \
            free(ws_);                                                                         \
            CHECK_MSG(outputs_untouched(), "%s: an output was written by a refused call", #fn); \
        }                                                                                      \
    } while (0)

/* ---- the grouped linear: f32, bf16, discrete weights -------------------------------------- */

enum { G = 2, T = 6, K = 4, N = 3 };
static int64_t splits_v[G] = {2, 3};

/* Offsets of x, w, bias, probs, splits, y in one grouped linear forward (SCALED bias). */
typedef struct gl_offs { size_t x, w, bias, probs, splits, y; } gl_offs;

static void linear_case(moex_context *ctx, moex_dtype dt, gl_offs o, const char *refused) {
    tu_rng r = tu_rng_seed(32);
    moex_grouped_linear_args a = {
        .x = moex_tensor_2d(input(&r, dt, T * K, o.x), dt, T, K),
        .w = moex_weight_packed(moex_tensor_3d(input(&r, dt, G * N * K, o.w), dt, G, N, K)),
        .bias_mode = MOEX_BIAS_SCALED,
        .bias = moex_tensor_2d(input(&r, F32, G * N, o.bias), F32, G, N),
        .probs = moex_tensor_1d(input(&r, F32, T, o.probs), F32, T),
        .splits = moex_tensor_1d(place(sizeof splits_v, o.splits, 0, splits_v), I64, G),
        .y = moex_tensor_2d(output(dt, T * N, o.y), dt, T, N),
    };
    RUN(ctx, moex_grouped_linear_forward, a, refused);
    if (!refused) CHECK_MSG(tu_first_unpoisoned(a.y.data, (size_t)(5 * N) * moex_dtype_size(dt)) == 0,
                            "the aligned forward wrote y");
    free_bufs();
}

static void linear_cases(moex_context *ctx) {
    const gl_offs ok = {0};   /* every offset 0: aligned */
    linear_case(ctx, F32, ok, NULL);
    linear_case(ctx, F32, (gl_offs){.x = 2}, "x.data");
    linear_case(ctx, F32, (gl_offs){.x = 1}, "x.data");
    linear_case(ctx, F32, (gl_offs){.w = 2}, "w.data");
    linear_case(ctx, F32, (gl_offs){.bias = 1}, "bias.data");
    linear_case(ctx, F32, (gl_offs){.probs = 3}, "probs.data");
    linear_case(ctx, F32, (gl_offs){.splits = 4}, "splits.data");
    linear_case(ctx, F32, (gl_offs){.splits = 1}, "splits.data");
    linear_case(ctx, F32, (gl_offs){.y = 2}, "y.data");
    /* natural alignment, not more: f32 at 4 past 8, i64 at 8 past 16, bf16 at 2 past 4 */
    linear_case(ctx, F32, (gl_offs){.x = 4, .w = 4, .bias = 4, .probs = 4, .splits = 8, .y = 4}, NULL);
    linear_case(ctx, BF16, (gl_offs){.x = 2, .w = 2, .bias = 4, .probs = 4, .splits = 8, .y = 2}, NULL);
    linear_case(ctx, BF16, (gl_offs){.x = 1}, "x.data");
    linear_case(ctx, BF16, (gl_offs){.y = 3}, "y.data");

    /* an empty tensor has nothing to align: T = 0 rows at an odd address run */
    {
        int64_t zero[G] = {0, 0};
        float w[G * N * K] = {0};
        moex_grouped_linear_args a = {
            .x = moex_tensor_2d(place(16, 1, 0, NULL), F32, 0, K),
            .w = moex_weight_packed(moex_tensor_3d(place(sizeof w, 0, 0, w), F32, G, N, K)),
            .splits = moex_tensor_1d(place(sizeof zero, 0, 0, zero), I64, G),
            .y = moex_tensor_2d(place(16, 3, 1, NULL), F32, 0, N),
        };
        RUN(ctx, moex_grouped_linear_forward, a, NULL);
        free_bufs();
    }
}

/* Discrete weights: each matrix aligned to the dtype (checked where the pointer array is host
 * memory, the CPU backend), the pointer array to a pointer's size. */
static void discrete_case(moex_context *ctx, size_t mat1_off, size_t ptrs_off, const char *refused) {
    tu_rng r = tu_rng_seed(7);
    void *mats[G] = {input(&r, F32, N * K, 0), input(&r, F32, N * K, mat1_off)};
    void **ptrs = (void **)place(sizeof mats, ptrs_off, 0, mats);
    moex_grouped_linear_args a = {
        .x = moex_tensor_2d(input(&r, F32, T * K, 0), F32, T, K),
        .w = {.t = moex_tensor_3d(NULL, F32, G, N, K), .ptrs = (void *const *)ptrs},
        .splits = moex_tensor_1d(place(sizeof splits_v, 0, 0, splits_v), I64, G),
        .y = moex_tensor_2d(output(F32, T * N, 0), F32, T, N),
    };
    RUN(ctx, moex_grouped_linear_forward, a, refused);
    free_bufs();
}

/* ---- the grouped quantize: i64 splits, f32 amax and scales, FP8 data ---------------------- */

enum { QK = 32 };

typedef struct q_offs { size_t x, splits, data, scales, amax; } q_offs;

static void quantize_case(moex_context *ctx, q_offs o, const char *refused) {
    tu_rng r = tu_rng_seed(5);
    moex_group_quantize_args a = {
        .x = moex_tensor_2d(input(&r, BF16, T * QK, o.x), BF16, T, QK),
        .splits = moex_tensor_1d(place(sizeof splits_v, o.splits, 0, splits_v), I64, G),
        .params = {.recipe = MOEX_QUANT_TENSOR, .fp8 = E4M3, .amax_epsilon = 0.0f, .rounding = MOEX_SCALE_EXACT,
                   .scale_layout = MOEX_SCALES_PLAIN},
        .rowwise = {.data = moex_tensor_2d(output(E4M3, T * QK, o.data), E4M3, T, QK),
                    .scales = moex_tensor_1d(output(F32, 1, o.scales), F32, 1)},
        .amax = moex_tensor_1d(output(F32, 1, o.amax), F32, 1),
    };
    RUN(ctx, moex_group_quantize, a, refused);
    free_bufs();
}

static void quantize_cases(moex_context *ctx) {
    quantize_case(ctx, (q_offs){0}, NULL);
    quantize_case(ctx, (q_offs){.data = 1}, NULL);          /* FP8 data: 1-byte elements */
    quantize_case(ctx, (q_offs){.x = 2, .splits = 8, .scales = 4, .amax = 4}, NULL);
    quantize_case(ctx, (q_offs){.splits = 3}, "splits.data");   /* issue 32: read at an odd address */
    quantize_case(ctx, (q_offs){.splits = 4}, "splits.data");
    quantize_case(ctx, (q_offs){.amax = 1}, "amax.data");       /* issue 32: stored at an odd address */
    quantize_case(ctx, (q_offs){.scales = 2}, "rowwise.scales");
    quantize_case(ctx, (q_offs){.x = 1}, "x.data");
}

/* ---- routing and offsets: i32 and i64 outputs --------------------------------------------- */

static void router_case(moex_context *ctx, size_t ids_off, const char *refused) {
    enum { E = 4, k = 2 };
    tu_rng r = tu_rng_seed(3);
    moex_router_args a = {
        .logits = moex_tensor_2d(input(&r, F32, T * E, 0), F32, T, E),
        .topk = k,
        .probs = moex_tensor_2d(output(F32, T * k, 0), F32, T, k),
        .ids = moex_tensor_2d(output(I32, T * k, ids_off), I32, T, k),
    };
    RUN(ctx, moex_router_forward, a, refused);
    free_bufs();
}

static void offsets_case(moex_context *ctx, size_t out_off, const char *refused) {
    moex_splits_to_offsets_args a = {
        .splits = moex_tensor_1d(place(sizeof splits_v, 0, 0, splits_v), I64, G),
        .num_outputs = 1,
        .outputs = {{.out = moex_tensor_1d(output(I64, G + 1, out_off), I64, G + 1), .stride = 1,
                     .start = MOEX_OFFSETS_LEADING_ZERO}},
    };
    RUN(ctx, moex_splits_to_offsets, a, refused);
    free_bufs();
}

int main(void) {
    moex_context *ctx = tu_cpu_context();
    if (!ctx) return 1;
    linear_cases(ctx);
    discrete_case(ctx, 0, 0, NULL);
    discrete_case(ctx, 4, 8, NULL);
    discrete_case(ctx, 2, 0, "w.ptrs[1]");
    discrete_case(ctx, 0, 4, "w.ptrs");
    quantize_cases(ctx);
    router_case(ctx, 0, NULL);
    router_case(ctx, 2, "ids.data");
    offsets_case(ctx, 0, NULL);
    offsets_case(ctx, 8, NULL);
    offsets_case(ctx, 4, "outputs[0].out.data");
    moex_context_destroy(ctx);
    return tu_finish();
}
