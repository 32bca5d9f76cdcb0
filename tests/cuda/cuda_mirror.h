/*
 * cuda_mirror.h - GPU test helper: runs a moex operation on the CUDA backend for argument
 * structs that hold HOST buffers (as built by tests/util), so that the GPU tests reuse the
 * host-side harness and the fp64 reference unchanged.
 *
 * A mirror copies every tensor of the struct (and each matrix of a discrete weight, with a
 * device array of device pointers) to fresh device memory at the host address's offset from
 * 16-byte alignment (a tensor placed off alignment on the host is so on the device), runs the op with a workspace
 * poisoned with 0xFF bytes (so reading scratch nothing wrote shows up as NaN/garbage),
 * synchronises, checks moex_context_check_splits, and copies the output tensors back over
 * the host buffers (whole tensors, so poisoned tail rows must come back still poisoned).
 * With MOEX_TEST_FRESH_THREAD=1 in the environment, each moex call of a runner (the workspace
 * query, then the op) runs on a new thread whose first CUDA work it is, as on an autograd
 * worker or a thread pool's thread; the copies around it stay on the calling thread.
 * Header-only (static functions): each tests/cuda/test_*.c is its own program.
 */
#ifndef MOEX_CUDA_MIRROR_H
#define MOEX_CUDA_MIRROR_H

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#define CM_MAX 1024

typedef struct cm_buf {
    void *host, *dev;
    void *base;             /* the device allocation dev lies in (dev - base = host % 16) */
    size_t bytes;
    int out;
    void *init;             /* out: the device copy's bytes before the op (host memory) */
} cm_buf;

typedef struct cm_mirror {
    cm_buf b[CM_MAX];
    int n;
    void *extra[CM_MAX];    /* device pointer arrays, workspace */
    int nextra;
    moex_fp8_weight fw[2];  /* an FP8 recipe's kept weight copies, on the device (cm_fp8_weights) */
} cm_mirror;

static void cm_die(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return;
    fprintf(stderr, "test: %s failed: %s\n", what, cudaGetErrorString(e));
    exit(1);
}

/* A CUDA context on device 0, or exit 77 (skipped) when there is no usable GPU. */
static moex_context *cm_context(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("no CUDA device: skipped\n");
        exit(77);
    }
    moex_context *ctx = NULL;
    moex_status st = moex_context_create(&ctx, MOEX_BACKEND_CUDA, 0);
    if (st != MOEX_OK) {
        printf("moex_context_create(CUDA) failed: %s: %s: skipped\n", moex_status_string(st), moex_last_error(NULL));
        exit(77);
    }
    return ctx;
}

static void *cm_malloc(size_t bytes) {
    void *p = NULL;
    cm_die(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
    return p;
}

static void *cm_to_dev(const void *host, size_t bytes) {
    void *d = cm_malloc(bytes);
    if (bytes) cm_die(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    return d;
}

static void cm_to_host(void *host, const void *dev, size_t bytes) {
    if (bytes) cm_die(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

static size_t cm_bytes(const moex_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return (size_t)n * moex_dtype_size(t->dtype);
}

static void *cm_add(cm_mirror *m, void *host, size_t bytes, int out) {
    if (m->n == CM_MAX) {
        fprintf(stderr, "test: cuda_mirror: too many buffers\n");
        exit(1);
    }
    cm_buf *b = &m->b[m->n++];
    b->host = host;
    b->bytes = bytes;
    b->out = out;
    b->base = cm_malloc(bytes + 16);
    b->dev = (char *)b->base + (uintptr_t)host % 16;
    if (bytes) cm_die(cudaMemcpy(b->dev, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    b->init = NULL;
    if (out) {
        b->init = tu_alloc(bytes ? bytes : 1);
        cm_to_host(b->init, b->dev, bytes);
    }
    return b->dev;
}

/* Replaces t->data by a device copy (absent or empty tensors are left alone). */
static void cm_tensor(cm_mirror *m, moex_tensor *t, int out) {
    if (t->ndim == 0 || !t->data) return;
    t->data = cm_add(m, t->data, cm_bytes(t), out);
}

static void cm_weight(cm_mirror *m, moex_weight *w, int out) {
    if (!w->ptrs) {
        cm_tensor(m, &w->t, out);
        return;
    }
    int64_t G = w->t.shape[0];
    size_t mb = (size_t)(w->t.shape[1] * w->t.shape[2]) * moex_dtype_size(w->t.dtype);
    void **dptrs = (void **)tu_alloc((size_t)G * sizeof(void *));
    for (int64_t g = 0; g < G; g++) dptrs[g] = cm_add(m, w->ptrs[g], mb, out);
    void *darr = cm_to_dev(dptrs, (size_t)G * sizeof(void *));
    free(dptrs);
    m->extra[m->nextra++] = darr;
    w->ptrs = (void *const *)darr;
}

/* An FP8 recipe's kept weight copies (r->weights, n entries: the layer's weights) mirrored as
 * inputs; the host array becomes the mirror's, pointing at the device copies. */
static void cm_fp8_weights(cm_mirror *m, moex_fp8_recipe *r, int n) {
    if (!r->weights) return;
    for (int i = 0; i < n; i++) {
        m->fw[i] = r->weights[i];
        cm_tensor(m, &m->fw[i].rowwise.data, 0), cm_tensor(m, &m->fw[i].rowwise.scales, 0);
        cm_tensor(m, &m->fw[i].columnwise.data, 0), cm_tensor(m, &m->fw[i].columnwise.scales, 0);
    }
    r->weights = m->fw;
}

/* A device workspace of `bytes`, every byte 0xFF. */
static void *cm_workspace(cm_mirror *m, size_t bytes) {
    if (!bytes) return NULL;
    void *p = cm_malloc(bytes);
    cm_die(cudaMemset(p, 0xFF, bytes), "cudaMemset");
    m->extra[m->nextra++] = p;
    return p;
}

/* Synchronises, copies outputs back when the op ran (returned MOEX_OK), frees everything.
 * A refused op's outputs are not copied back but checked on the device: unchanged, or a test
 * failure. (A test of a refusal may describe an output larger than its host buffer: copying
 * that back would write past the buffer.) Returns `st`, or the status of
 * moex_context_check_splits when the op itself succeeded and the flag was set. */
static moex_status cm_finish(cm_mirror *m, moex_context *ctx, moex_status st) {
    cm_die(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the op");
    const int ran = st == MOEX_OK;
    if (ran) st = moex_context_check_splits(ctx, NULL);
    for (int i = 0; i < m->n; i++) {
        cm_buf *b = &m->b[i];
        if (b->out && ran) {
            cm_to_host(b->host, b->dev, b->bytes);
        } else if (b->out) {
            void *now = tu_alloc(b->bytes ? b->bytes : 1);
            cm_to_host(now, b->dev, b->bytes);
            tu_record(memcmp(now, b->init, b->bytes) == 0, __FILE__, __LINE__,
                      "cuda_mirror: a refused call (%s) wrote output buffer %d", moex_status_string(st), i);
            free(now);
        }
        free(b->init);
        cudaFree(b->base);
    }
    for (int i = 0; i < m->nextra; i++) cudaFree(m->extra[i]);
    m->n = m->nextra = 0;
    return st;
}

/* ---- the call itself: on this thread, or on a fresh one (MOEX_TEST_FRESH_THREAD=1) ------ */

typedef struct cm_call {
    moex_status (*fn)(void *);
    void *arg;
    moex_status st;
} cm_call;

static void *cm_call_main(void *p) {
    cm_call *c = (cm_call *)p;
    c->st = c->fn(c->arg);
    return NULL;
}

static moex_status cm_call_on_thread(moex_status (*fn)(void *), void *arg) {
    static int fresh = -1;
    if (fresh < 0) {
        const char *e = getenv("MOEX_TEST_FRESH_THREAD");
        fresh = e != NULL && strcmp(e, "1") == 0;
    }
    if (!fresh) return fn(arg);
    cm_call c = {fn, arg, MOEX_ERR_INTERNAL};
    pthread_t t;
    if (pthread_create(&t, NULL, cm_call_main, &c) != 0 || pthread_join(t, NULL) != 0) {
        fprintf(stderr, "test: cuda_mirror: could not run a call on a new thread\n");
        exit(1);
    }
    return c.st;
}

/* fn's workspace query and fn itself as functions of one pointer, for cm_call_on_thread. */
#define CM_THUNKS(fn, args_t)                                                           \
    typedef struct fn##_cm {                                                             \
        moex_context *ctx;                                                               \
        const args_t *a;                                                                 \
        void *ws;                                                                        \
        size_t bytes;                                                                    \
    } fn##_cm;                                                                           \
    static moex_status fn##_cm_query(void *p) {                                          \
        fn##_cm *c = (fn##_cm *)p;                                                       \
        return fn##_workspace_size(c->ctx, c->a, &c->bytes);                             \
    }                                                                                    \
    static moex_status fn##_cm_run(void *p) {                                            \
        fn##_cm *c = (fn##_cm *)p;                                                       \
        return fn(c->ctx, c->a, c->ws, c->bytes, NULL);                                  \
    }

CM_THUNKS(moex_splits_to_offsets, moex_splits_to_offsets_args)
CM_THUNKS(moex_zero_tail, moex_zero_tail_args)
CM_THUNKS(moex_grouped_linear_forward, moex_grouped_linear_args)
CM_THUNKS(moex_grouped_linear_backward_data, moex_grouped_linear_dgrad_args)
CM_THUNKS(moex_grouped_linear_backward_weight, moex_grouped_linear_wgrad_args)
CM_THUNKS(moex_scaled_glu_forward, moex_scaled_glu_args)
CM_THUNKS(moex_scaled_glu_backward, moex_scaled_glu_grad_args)
CM_THUNKS(moex_grouped_mlp_forward, moex_grouped_mlp_args)
CM_THUNKS(moex_grouped_mlp_backward, moex_grouped_mlp_grad_args)
CM_THUNKS(moex_router_forward, moex_router_args)
CM_THUNKS(moex_router_backward, moex_router_grad_args)
CM_THUNKS(moex_permute_forward, moex_permute_args)
CM_THUNKS(moex_permute_backward, moex_permute_grad_args)
CM_THUNKS(moex_unpermute_forward, moex_unpermute_args)
CM_THUNKS(moex_unpermute_backward, moex_unpermute_grad_args)
CM_THUNKS(moex_group_quantize, moex_group_quantize_args)
CM_THUNKS(moex_group_dequantize, moex_group_dequantize_args)
CM_THUNKS(moex_weight_quantize, moex_weight_quantize_args)
CM_THUNKS(moex_weight_dequantize, moex_weight_dequantize_args)
CM_THUNKS(moex_grouped_linear_fp8_forward, moex_grouped_linear_fp8_args)
CM_THUNKS(moex_grouped_linear_fp8_backward_weight, moex_grouped_linear_fp8_wgrad_args)
CM_THUNKS(moex_moe_layer_forward, moex_moe_layer_args)
CM_THUNKS(moex_moe_layer_backward, moex_moe_layer_grad_args)

/* st = fn's workspace query, then fn on a workspace of that size (poisoned), each through
 * cm_call_on_thread. */
#define CM_CALL(ctx_, m, fn, a_, st)                                   \
    do {                                                               \
        fn##_cm c_ = {.ctx = (ctx_), .a = (a_)};                       \
        (st) = cm_call_on_thread(fn##_cm_query, &c_);                  \
        if ((st) == MOEX_OK) {                                         \
            c_.ws = cm_workspace((m), c_.bytes);                       \
            (st) = cm_call_on_thread(fn##_cm_run, &c_);                \
        }                                                              \
    } while (0)

/* ---- one runner per operation: host args in, host outputs updated ----------------------- */

#define CM_RUN(ctx, m, fn, a)                  \
    do {                                       \
        moex_status st_;                       \
        CM_CALL(ctx, m, fn, a, st_);           \
        return cm_finish((m), (ctx), st_);     \
    } while (0)

static moex_status gpu_splits_to_offsets(moex_context *ctx, const moex_splits_to_offsets_args *h) {
    cm_mirror m = {0};
    moex_splits_to_offsets_args a = *h;
    cm_tensor(&m, &a.splits, 0);
    for (int i = 0; i < a.num_outputs && i < MOEX_MAX_OFFSETS; i++) cm_tensor(&m, &a.outputs[i].out, 1);
    CM_RUN(ctx, &m, moex_splits_to_offsets, &a);
}

static moex_status gpu_zero_tail(moex_context *ctx, const moex_zero_tail_args *h) {
    cm_mirror m = {0};
    moex_zero_tail_args a = *h;
    cm_tensor(&m, &a.splits, 0), cm_tensor(&m, &a.x, 1);
    CM_RUN(ctx, &m, moex_zero_tail, &a);
}

static moex_status gpu_gl_forward(moex_context *ctx, const moex_grouped_linear_args *h) {
    cm_mirror m = {0};
    moex_grouped_linear_args a = *h;
    cm_tensor(&m, &a.x, 0), cm_weight(&m, &a.w, 0), cm_tensor(&m, &a.bias, 0), cm_tensor(&m, &a.probs, 0);
    cm_tensor(&m, &a.splits, 0), cm_tensor(&m, &a.y, 1);
    cm_fp8_weights(&m, &a.fp8, 1);
    CM_RUN(ctx, &m, moex_grouped_linear_forward, &a);
}

static moex_status gpu_gl_dgrad(moex_context *ctx, const moex_grouped_linear_dgrad_args *h) {
    cm_mirror m = {0};
    moex_grouped_linear_dgrad_args a = *h;
    cm_tensor(&m, &a.dy, 0), cm_weight(&m, &a.w, 0), cm_tensor(&m, &a.bias, 0), cm_tensor(&m, &a.probs, 0);
    cm_tensor(&m, &a.splits, 0), cm_tensor(&m, &a.dx, 1), cm_tensor(&m, &a.dbias, 1), cm_tensor(&m, &a.dprobs, 1);
    cm_fp8_weights(&m, &a.fp8, 1);
    CM_RUN(ctx, &m, moex_grouped_linear_backward_data, &a);
}

static moex_status gpu_gl_wgrad(moex_context *ctx, const moex_grouped_linear_wgrad_args *h) {
    cm_mirror m = {0};
    moex_grouped_linear_wgrad_args a = *h;
    cm_tensor(&m, &a.x, 0), cm_tensor(&m, &a.dy, 0), cm_tensor(&m, &a.splits, 0), cm_weight(&m, &a.dw, 1);
    CM_RUN(ctx, &m, moex_grouped_linear_backward_weight, &a);
}

static moex_status gpu_glu_forward(moex_context *ctx, const moex_scaled_glu_args *h) {
    cm_mirror m = {0};
    moex_scaled_glu_args a = *h;
    cm_tensor(&m, &a.h, 0), cm_tensor(&m, &a.probs, 0), cm_tensor(&m, &a.splits, 0), cm_tensor(&m, &a.z, 1);
    cm_tensor(&m, &a.zq_rowwise.data, 1), cm_tensor(&m, &a.zq_rowwise.scales, 1);
    cm_tensor(&m, &a.zq_columnwise.data, 1), cm_tensor(&m, &a.zq_columnwise.scales, 1), cm_tensor(&m, &a.zq_amax, 1);
    CM_RUN(ctx, &m, moex_scaled_glu_forward, &a);
}

static moex_status gpu_glu_backward(moex_context *ctx, const moex_scaled_glu_grad_args *h) {
    cm_mirror m = {0};
    moex_scaled_glu_grad_args a = *h;
    cm_tensor(&m, &a.h, 0), cm_tensor(&m, &a.probs, 0), cm_tensor(&m, &a.splits, 0), cm_tensor(&m, &a.dz, 0);
    cm_tensor(&m, &a.dh, 1), cm_tensor(&m, &a.dprobs, 1);
    CM_RUN(ctx, &m, moex_scaled_glu_backward, &a);
}

static moex_status gpu_mlp_forward(moex_context *ctx, const moex_grouped_mlp_args *h) {
    cm_mirror m = {0};
    moex_grouped_mlp_args a = *h;
    cm_tensor(&m, &a.x, 0), cm_weight(&m, &a.w1, 0), cm_tensor(&m, &a.b1, 0), cm_weight(&m, &a.w2, 0);
    cm_tensor(&m, &a.b2, 0), cm_tensor(&m, &a.probs, 0), cm_tensor(&m, &a.splits, 0);
    cm_tensor(&m, &a.h, 1), cm_tensor(&m, &a.z, 1), cm_tensor(&m, &a.y, 1);
    cm_fp8_weights(&m, &a.fp8, 2);
    CM_RUN(ctx, &m, moex_grouped_mlp_forward, &a);
}

static moex_status gpu_mlp_backward(moex_context *ctx, const moex_grouped_mlp_grad_args *h) {
    cm_mirror m = {0};
    moex_grouped_mlp_grad_args a = *h;
    cm_tensor(&m, &a.x, 0), cm_weight(&m, &a.w1, 0), cm_weight(&m, &a.w2, 0), cm_tensor(&m, &a.b2, 0);
    cm_tensor(&m, &a.probs, 0), cm_tensor(&m, &a.splits, 0), cm_tensor(&m, &a.z, 0);
    cm_tensor(&m, &a.h, a.h_mode == MOEX_H_OVERWRITE);   /* an h overwritten comes back as the CPU's does */
    cm_tensor(&m, &a.dy, 0), cm_tensor(&m, &a.dx, 1), cm_weight(&m, &a.dw1, 1), cm_weight(&m, &a.dw2, 1);
    cm_tensor(&m, &a.db1, 1), cm_tensor(&m, &a.db2, 1), cm_tensor(&m, &a.dprobs, 1);
    cm_fp8_weights(&m, &a.fp8, 2);
    CM_RUN(ctx, &m, moex_grouped_mlp_backward, &a);
}

static moex_status gpu_router_forward(moex_context *ctx, const moex_router_args *h) {
    cm_mirror m = {0};
    moex_router_args a = *h;
    cm_tensor(&m, &a.logits, 0), cm_tensor(&m, &a.probs, 1), cm_tensor(&m, &a.ids, 1);
    CM_RUN(ctx, &m, moex_router_forward, &a);
}

static moex_status gpu_router_backward(moex_context *ctx, const moex_router_grad_args *h) {
    cm_mirror m = {0};
    moex_router_grad_args a = *h;
    cm_tensor(&m, &a.logits, 0), cm_tensor(&m, &a.ids, 0), cm_tensor(&m, &a.dprobs, 0), cm_tensor(&m, &a.dlogits, 1);
    CM_RUN(ctx, &m, moex_router_backward, &a);
}

static moex_status gpu_permute_forward(moex_context *ctx, const moex_permute_args *h) {
    cm_mirror m = {0};
    moex_permute_args a = *h;
    cm_tensor(&m, &a.x, 0), cm_tensor(&m, &a.ids, 0), cm_tensor(&m, &a.probs, 0), cm_tensor(&m, &a.xp, 1);
    cm_tensor(&m, &a.probs_p, 1), cm_tensor(&m, &a.splits, 1), cm_tensor(&m, &a.row_map, 1);
    CM_RUN(ctx, &m, moex_permute_forward, &a);
}

static moex_status gpu_permute_backward(moex_context *ctx, const moex_permute_grad_args *h) {
    cm_mirror m = {0};
    moex_permute_grad_args a = *h;
    cm_tensor(&m, &a.row_map, 0), cm_tensor(&m, &a.dxp, 0), cm_tensor(&m, &a.dprobs_p, 0), cm_tensor(&m, &a.dx, 1);
    cm_tensor(&m, &a.dprobs, 1);
    CM_RUN(ctx, &m, moex_permute_backward, &a);
}

static moex_status gpu_unpermute_forward(moex_context *ctx, const moex_unpermute_args *h) {
    cm_mirror m = {0};
    moex_unpermute_args a = *h;
    cm_tensor(&m, &a.row_map, 0), cm_tensor(&m, &a.yp, 0), cm_tensor(&m, &a.y, 1);
    CM_RUN(ctx, &m, moex_unpermute_forward, &a);
}

static moex_status gpu_unpermute_backward(moex_context *ctx, const moex_unpermute_grad_args *h) {
    cm_mirror m = {0};
    moex_unpermute_grad_args a = *h;
    cm_tensor(&m, &a.row_map, 0), cm_tensor(&m, &a.dy, 0), cm_tensor(&m, &a.dyp, 1);
    CM_RUN(ctx, &m, moex_unpermute_backward, &a);
}

static moex_status gpu_group_quantize(moex_context *ctx, const moex_group_quantize_args *h) {
    cm_mirror m = {0};
    moex_group_quantize_args a = *h;
    cm_tensor(&m, &a.x, 0), cm_tensor(&m, &a.splits, 0), cm_tensor(&m, &a.rowwise.data, 1);
    cm_tensor(&m, &a.rowwise.scales, 1), cm_tensor(&m, &a.columnwise.data, 1), cm_tensor(&m, &a.columnwise.scales, 1);
    cm_tensor(&m, &a.amax, 1), cm_tensor(&m, &a.dbias, 1);
    CM_RUN(ctx, &m, moex_group_quantize, &a);
}

static moex_status gpu_group_dequantize(moex_context *ctx, const moex_group_dequantize_args *h) {
    cm_mirror m = {0};
    moex_group_dequantize_args a = *h;
    cm_tensor(&m, &a.src.data, 0), cm_tensor(&m, &a.src.scales, 0), cm_tensor(&m, &a.splits, 0), cm_tensor(&m, &a.y, 1);
    CM_RUN(ctx, &m, moex_group_dequantize, &a);
}

static moex_status gpu_weight_quantize(moex_context *ctx, const moex_weight_quantize_args *h) {
    cm_mirror m = {0};
    moex_weight_quantize_args a = *h;
    cm_tensor(&m, &a.w, 0), cm_tensor(&m, &a.rowwise.data, 1), cm_tensor(&m, &a.rowwise.scales, 1);
    cm_tensor(&m, &a.columnwise.data, 1), cm_tensor(&m, &a.columnwise.scales, 1), cm_tensor(&m, &a.amax, 1);
    CM_RUN(ctx, &m, moex_weight_quantize, &a);
}

static moex_status gpu_weight_dequantize(moex_context *ctx, const moex_weight_dequantize_args *h) {
    cm_mirror m = {0};
    moex_weight_dequantize_args a = *h;
    cm_tensor(&m, &a.src.data, 0), cm_tensor(&m, &a.src.scales, 0), cm_tensor(&m, &a.w, 1);
    CM_RUN(ctx, &m, moex_weight_dequantize, &a);
}

static moex_status gpu_fp8_forward(moex_context *ctx, const moex_grouped_linear_fp8_args *h) {
    cm_mirror m = {0};
    moex_grouped_linear_fp8_args a = *h;
    cm_tensor(&m, &a.x.data, 0), cm_tensor(&m, &a.x.scales, 0), cm_tensor(&m, &a.w.data, 0);
    cm_tensor(&m, &a.w.scales, 0), cm_tensor(&m, &a.splits, 0), cm_tensor(&m, &a.bias, 0), cm_tensor(&m, &a.probs, 0);
    cm_tensor(&m, &a.y, 1);
    CM_RUN(ctx, &m, moex_grouped_linear_fp8_forward, &a);
}

static moex_status gpu_fp8_wgrad(moex_context *ctx, const moex_grouped_linear_fp8_wgrad_args *h) {
    cm_mirror m = {0};
    moex_grouped_linear_fp8_wgrad_args a = *h;
    cm_tensor(&m, &a.dy.data, 0), cm_tensor(&m, &a.dy.scales, 0), cm_tensor(&m, &a.x.data, 0);
    cm_tensor(&m, &a.x.scales, 0), cm_tensor(&m, &a.splits, 0), cm_weight(&m, &a.dw, 1);
    CM_RUN(ctx, &m, moex_grouped_linear_fp8_backward_weight, &a);
}

/* The MoE layer's `saved` must outlive one call: each host `saved` pointer gets one device
 * buffer, kept for the life of the test (the forward also copies it back to the host). */
typedef struct cm_saved {
    const void *host;
    void *dev;
    size_t bytes;
} cm_saved;
static cm_saved cm_saved_tab[64];
static int cm_nsaved;

static void *cm_saved_dev(const void *host, size_t bytes, int upload) {
    for (int i = 0; i < cm_nsaved; i++)
        if (cm_saved_tab[i].host == host && cm_saved_tab[i].bytes >= bytes) {
            if (upload) cm_die(cudaMemcpy(cm_saved_tab[i].dev, host, bytes, cudaMemcpyHostToDevice), "saved H2D");
            return cm_saved_tab[i].dev;
        }
    if (cm_nsaved == 64) {
        fprintf(stderr, "test: cuda_mirror: too many saved buffers\n");
        exit(1);
    }
    cm_saved *s = &cm_saved_tab[cm_nsaved++];
    s->host = host;
    s->bytes = bytes;
    s->dev = cm_to_dev(host, bytes);
    return s->dev;
}

static void cm_moe_args(cm_mirror *m, moex_moe_layer_args *a, int fwd) {
    cm_tensor(m, &a->x, 0), cm_tensor(m, &a->router_w, 0), cm_weight(m, &a->w1, 0), cm_tensor(m, &a->b1, 0);
    cm_weight(m, &a->w2, 0), cm_tensor(m, &a->b2, 0);
    cm_fp8_weights(m, &a->fp8, 2);
    if (fwd) cm_tensor(m, &a->y, 1);
    if (a->saved) a->saved = cm_saved_dev(a->saved, a->saved_bytes, !fwd);
}

static moex_status gpu_moe_forward(moex_context *ctx, const moex_moe_layer_args *h) {
    if (!h || !h->saved) return moex_moe_layer_forward(ctx, h, NULL, 0, NULL);
    cm_mirror m = {0};
    moex_moe_layer_args a = *h;
    cm_moe_args(&m, &a, 1);
    moex_status st;
    CM_CALL(ctx, &m, moex_moe_layer_forward, &a, st);
    st = cm_finish(&m, ctx, st);
    cm_to_host(h->saved, a.saved, h->saved_bytes);
    return st;
}

static moex_status gpu_moe_backward(moex_context *ctx, const moex_moe_layer_grad_args *h) {
    if (!h || !h->fwd.saved) return moex_moe_layer_backward(ctx, h, NULL, 0, NULL);
    cm_mirror m = {0};
    moex_moe_layer_grad_args a = *h;
    cm_moe_args(&m, &a.fwd, 0);
    cm_tensor(&m, &a.dy, 0), cm_tensor(&m, &a.dx, 1), cm_tensor(&m, &a.drouter_w, 1), cm_weight(&m, &a.dw1, 1);
    cm_weight(&m, &a.dw2, 1), cm_tensor(&m, &a.db1, 1), cm_tensor(&m, &a.db2, 1);
    CM_RUN(ctx, &m, moex_moe_layer_backward, &a);
}

#endif /* MOEX_CUDA_MIRROR_H */
