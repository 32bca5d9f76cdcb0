/*
 * test_errors.c - every bad input of the foundation entry points gets the right status,
 * a message naming the problem, and writes nothing.
 *
 * A fixture holds valid arguments for every op (bf16 activations, G = 3, splits {3, 0, 5}
 * of T = 10 rows, F = 32) and poisoned outputs. Each case copies the valid arguments,
 * breaks one thing, calls, and checks: the status; that moex_last_error names the problem
 * (a substring); that every output of the fixture is still poison. Covered: NULL ctx,
 * args, data and bytes for every entry point; wrong ndim, shape and dtype of every tensor;
 * G = 0; negative splits and sum(splits) > T (MOEX_ERR_BAD_SPLITS, naming the group);
 * unknown enums; SCALED without probs; bias / dbias / dprobs against the bias mode;
 * ACCUMULATE into a bf16 dW; a too-small or NULL workspace; interleaved GLU with
 * F % 32 != 0; clamp constants; discrete weights with both forms; and the context calls
 * (a CUDA context on a CPU-only build is MOEX_ERR_UNSUPPORTED).
 */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef MOEX_TEST_HAVE_CUDA
#define MOEX_TEST_HAVE_CUDA 0
#endif

enum { G = 3, T = 10, K = 5, N = 6, H = 7, F = 32 };
#define DT MOEX_DTYPE_BF16
#define F32 MOEX_DTYPE_F32
#define WS_BYTES (1u << 22)

/* ---- fixture ----------------------------------------------------------------------- */

typedef struct out_buf { const char *name; void *p; size_t bytes; } out_buf;

static struct {
    int64_t splits[G], neg_splits[G], big_splits[G], zero_splits[1], zero3[G];
    void *x, *w, *bias, *probs, *dy, *h, *dz, *mx, *w1, *b1, *w2, *b2, *mdy, *mz;
    void *wptr[G];
    out_buf out[32];
    void *dw_bf16, *dw1_bf16;   /* bf16 gradient buffers for the ACCUMULATE cases */
    int nout;
    void *ws;
} fx;

static moex_splits_to_offsets_args base_so;
static moex_grouped_linear_args base_fw;
static moex_grouped_linear_dgrad_args base_dg;
static moex_grouped_linear_wgrad_args base_wg;
static moex_scaled_glu_args base_gf;
static moex_scaled_glu_grad_args base_gb;
static moex_grouped_mlp_args base_mf;
static moex_grouped_mlp_grad_args base_mb;

static void *input(tu_rng *r, moex_dtype dt, int64_t n) {
    double *v = tu_doubles(n);
    tu_fill_uniform(r, v, n, -1, 1, dt);
    void *b = tu_buffer(dt, v, n);
    free(v);
    return b;
}

static void *output(const char *name, moex_dtype dt, int64_t n) {
    out_buf *o = &fx.out[fx.nout++];
    o->name = name;
    o->bytes = (size_t)n * moex_dtype_size(dt);
    o->p = tu_poisoned(dt, n);
    return o->p;
}

static void poison_outputs(void) {
    for (int i = 0; i < fx.nout; i++) tu_poison(fx.out[i].p, fx.out[i].bytes);
}

/* CHECK that every fixture output is still poison. */
static void check_untouched(const char *label, int line) {
    for (int i = 0; i < fx.nout; i++) {
        int64_t b = tu_first_unpoisoned(fx.out[i].p, fx.out[i].bytes);
        tu_record(b < 0, __FILE__, line, "%s: output %s was written (byte %lld)", label, fx.out[i].name,
                  (long long)b);
    }
}

static moex_tensor t1(void *p, moex_dtype dt, int64_t a) { return moex_tensor_1d(p, dt, a); }
static moex_tensor t2(void *p, moex_dtype dt, int64_t a, int64_t b) { return moex_tensor_2d(p, dt, a, b); }
static moex_weight wp(void *p, moex_dtype dt, int64_t a, int64_t b, int64_t c) {
    return moex_weight_packed(moex_tensor_3d(p, dt, a, b, c));
}

static void fixture_make(void) {
    tu_rng r = tu_rng_seed(5);
    const int64_t s[G] = {3, 0, 5}, ns[G] = {3, -1, 5}, bs[G] = {3, 4, 5};
    memcpy(fx.splits, s, sizeof s);
    memcpy(fx.neg_splits, ns, sizeof ns);
    memcpy(fx.big_splits, bs, sizeof bs);
    fx.x = input(&r, DT, T * K), fx.w = input(&r, DT, G * N * K), fx.bias = input(&r, DT, G * N);
    fx.probs = input(&r, F32, T), fx.dy = input(&r, DT, T * N), fx.h = input(&r, DT, T * 2 * F);
    fx.dz = input(&r, DT, T * F), fx.mx = input(&r, DT, T * H), fx.w1 = input(&r, DT, G * 2 * F * H);
    fx.b1 = input(&r, DT, G * 2 * F), fx.w2 = input(&r, DT, G * H * F), fx.b2 = input(&r, DT, G * H);
    fx.mdy = input(&r, DT, T * H), fx.mz = input(&r, DT, T * F);
    for (int g = 0; g < G; g++) fx.wptr[g] = input(&r, DT, N * K);
    fx.ws = tu_alloc(WS_BYTES);
    moex_tensor splits = t1(fx.splits, MOEX_DTYPE_I64, G);

    base_so.splits = splits;
    base_so.num_outputs = 2;
    base_so.outputs[0] = (moex_offsets_output){
        .out = t1(output("offsets i64", MOEX_DTYPE_I64, G + 1), MOEX_DTYPE_I64, G + 1), .stride = 1,
        .start = MOEX_OFFSETS_LEADING_ZERO};
    base_so.outputs[1] = (moex_offsets_output){.out = t1(output("offsets i32", MOEX_DTYPE_I32, G), MOEX_DTYPE_I32, G),
                                               .stride = K, .start = MOEX_OFFSETS_INCLUSIVE};

    base_fw.x = t2(fx.x, DT, T, K);
    base_fw.w = wp(fx.w, DT, G, N, K);
    base_fw.bias_mode = MOEX_BIAS_SCALED;
    base_fw.bias = t2(fx.bias, DT, G, N);
    base_fw.probs = t1(fx.probs, F32, T);
    base_fw.splits = splits;
    base_fw.y = t2(output("gl y", DT, T * N), DT, T, N);

    base_dg.dy = t2(fx.dy, DT, T, N);
    base_dg.w = base_fw.w;
    base_dg.bias_mode = MOEX_BIAS_SCALED;
    base_dg.bias = base_fw.bias;
    base_dg.probs = base_fw.probs;
    base_dg.splits = splits;
    base_dg.dx = t2(output("gl dx", DT, T * K), DT, T, K);
    base_dg.dbias = t2(output("gl dbias", F32, G * N), F32, G, N);
    base_dg.dprobs = t1(output("gl dprobs", F32, T), F32, T);

    base_wg.x = base_fw.x;
    base_wg.dy = base_dg.dy;
    base_wg.splits = splits;
    base_wg.dw_mode = MOEX_GRAD_ACCUMULATE;
    base_wg.dw = wp(output("gl dw f32", F32, G * N * K), F32, G, N, K);
    fx.dw_bf16 = output("gl dw bf16", DT, G * N * K);

    base_gf.glu = moex_glu_params_default(MOEX_GLU_CLAMPED_SWIGLU);
    base_gf.glu.layout = MOEX_GLU_INTERLEAVED_32;
    base_gf.h = t2(fx.h, DT, T, 2 * F);
    base_gf.probs = base_fw.probs;
    base_gf.splits = splits;
    base_gf.z = t2(output("glu z", DT, T * F), DT, T, F);

    base_gb.glu = base_gf.glu;
    base_gb.h = base_gf.h;
    base_gb.probs = base_gf.probs;
    base_gb.splits = splits;
    base_gb.dz = t2(fx.dz, DT, T, F);
    base_gb.dh = t2(output("glu dh", DT, T * 2 * F), DT, T, 2 * F);
    base_gb.dprobs = t1(output("glu dprobs", F32, T), F32, T);

    base_mf.x = t2(fx.mx, DT, T, H);
    base_mf.w1 = wp(fx.w1, DT, G, 2 * F, H);
    base_mf.b1 = t2(fx.b1, DT, G, 2 * F);
    base_mf.w2 = wp(fx.w2, DT, G, H, F);
    base_mf.b2_mode = MOEX_BIAS_SCALED;
    base_mf.b2 = t2(fx.b2, DT, G, H);
    base_mf.probs = base_fw.probs;
    base_mf.glu = moex_glu_params_default(MOEX_GLU_SWIGLU);
    base_mf.splits = splits;
    base_mf.h = t2(output("mlp h", DT, T * 2 * F), DT, T, 2 * F);
    base_mf.z = t2(output("mlp z", DT, T * F), DT, T, F);
    base_mf.y = t2(output("mlp y", DT, T * H), DT, T, H);

    base_mb.x = base_mf.x;
    base_mb.w1 = base_mf.w1;
    base_mb.w2 = base_mf.w2;
    base_mb.b2_mode = MOEX_BIAS_SCALED;
    base_mb.b2 = base_mf.b2;
    base_mb.probs = base_mf.probs;
    base_mb.glu = base_mf.glu;
    base_mb.splits = splits;
    base_mb.h = t2(fx.h, DT, T, 2 * F);
    base_mb.z = t2(fx.mz, DT, T, F);
    base_mb.dy = t2(fx.mdy, DT, T, H);
    base_mb.dx = t2(output("mlp dx", DT, T * H), DT, T, H);
    base_mb.dw_mode = MOEX_GRAD_ACCUMULATE;
    base_mb.dw1 = wp(output("mlp dw1", F32, G * 2 * F * H), F32, G, 2 * F, H);
    base_mb.dw2 = wp(output("mlp dw2", F32, G * H * F), F32, G, H, F);
    base_mb.db1 = t2(output("mlp db1", F32, G * 2 * F), F32, G, 2 * F);
    base_mb.db2 = t2(output("mlp db2", F32, G * H), F32, G, H);
    base_mb.dprobs = t1(output("mlp dprobs", F32, T), F32, T);
    fx.dw1_bf16 = output("mlp dw1 bf16", DT, G * 2 * F * H);
}

static void fixture_free(void) {
    void *in[] = {fx.x, fx.w, fx.bias, fx.probs, fx.dy, fx.h, fx.dz, fx.mx, fx.w1, fx.b1, fx.w2, fx.b2, fx.mdy,
                  fx.mz, fx.ws};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) free(in[i]);
    for (int g = 0; g < G; g++) free(fx.wptr[g]);
    for (int i = 0; i < fx.nout; i++) free(fx.out[i].p);
}

/* ---- expectations ------------------------------------------------------------------ */

/* The call returned `want`, the message (of ctx, or of NULL when ctx is NULL) contains
 * `needle`, and no output was written. Outputs are re-poisoned for the next case. */
static void expect(const moex_context *ctx, moex_status got, moex_status want, const char *needle,
                   const char *label, int line) {
    const char *msg = moex_last_error(ctx);
    tu_record(got == want, __FILE__, line, "%s: got %s, want %s (message \"%s\")", label,
              moex_status_string(got), moex_status_string(want), msg);
    tu_record(needle == NULL || strstr(msg, needle) != NULL, __FILE__, line,
              "%s: message \"%s\" does not name \"%s\"", label, msg, needle ? needle : "");
    check_untouched(label, line);
    poison_outputs();
}

#define EXPECT(ctx, call, want, needle) expect((ctx), (call), (want), (needle), #call, __LINE__)
#define BAD(ctx, call, needle) EXPECT(ctx, call, MOEX_ERR_INVALID_ARG, needle)

/* Valid arguments succeed (the fixture is right); then re-poison. */
#define OK(ctx, call)                                                                          \
    do {                                                                                       \
        CHECK_STATUS(ctx, (call), MOEX_OK);                                                    \
        CHECK_MSG(moex_last_error(ctx)[0] == '\0', "message cleared after success: \"%s\"",   \
                  moex_last_error(ctx));                                                       \
        poison_outputs();                                                                      \
    } while (0)

/* Runs every entry point of one op family with ctx == NULL, args == NULL, bytes == NULL. */
#define NULL_CASES(ctx, fn, base)                                                              \
    do {                                                                                       \
        size_t b_ = 0;                                                                         \
        EXPECT(NULL, fn(NULL, &base, fx.ws, WS_BYTES, NULL), MOEX_ERR_INVALID_ARG, "ctx");      \
        EXPECT(NULL, fn##_workspace_size(NULL, &base, &b_), MOEX_ERR_INVALID_ARG, "ctx");       \
        BAD(ctx, fn(ctx, NULL, fx.ws, WS_BYTES, NULL), "args");                                \
        BAD(ctx, fn##_workspace_size(ctx, NULL, &b_), "args");                                 \
        BAD(ctx, fn##_workspace_size(ctx, &base, NULL), "bytes");                              \
    } while (0)

/* A too-small and a NULL workspace fail when the op needs one. Returns its size. */
#define WORKSPACE_CASES(ctx, fn, a)                                                            \
    do {                                                                                       \
        size_t need_ = 0;                                                                      \
        CHECK_STATUS(ctx, fn##_workspace_size(ctx, &a, &need_), MOEX_OK);                      \
        if (need_ > 0) {                                                                       \
            BAD(ctx, fn(ctx, &a, fx.ws, need_ - 1, NULL), "workspace");                        \
            BAD(ctx, fn(ctx, &a, NULL, need_, NULL), "workspace");                             \
            CHECK_MSG(need_ <= WS_BYTES, "workspace of %zu bytes fits the fixture", need_);    \
        }                                                                                      \
        ws_need = need_;                                                                       \
    } while (0)

static size_t ws_need;

/* ---- cases ------------------------------------------------------------------------- */

static void context_cases(void) {
    moex_context *c = (moex_context *)&fx; /* any non-NULL value: must be set to NULL */
    EXPECT(NULL, moex_context_create(NULL, MOEX_BACKEND_CPU, 0), MOEX_ERR_INVALID_ARG, "out");
    EXPECT(NULL, moex_context_create(&c, (moex_backend)7, 0), MOEX_ERR_INVALID_ARG, "backend");
    CHECK(c == NULL);
    c = (moex_context *)&fx;
    EXPECT(NULL, moex_context_create(&c, MOEX_BACKEND_CPU, 1), MOEX_ERR_INVALID_ARG, "device");
    CHECK(c == NULL);
    c = (moex_context *)&fx;
    moex_status st = moex_context_create(&c, MOEX_BACKEND_CUDA, 0);
    if (!MOEX_TEST_HAVE_CUDA) {
        EXPECT(NULL, st, MOEX_ERR_UNSUPPORTED, "CUDA");
        CHECK(c == NULL);
    } else {
        CHECK_MSG(st == MOEX_OK || st == MOEX_ERR_CUDA, "CUDA build: create gives %s", moex_status_string(st));
        CHECK(st == MOEX_OK ? c != NULL : c == NULL);
        moex_context_destroy(st == MOEX_OK ? c : NULL);
    }
    moex_context_destroy(NULL); /* accepted */
    CHECK_MSG(strcmp(moex_status_string(MOEX_ERR_BAD_SPLITS), "MOEX_ERR_BAD_SPLITS") == 0, "status string");
    CHECK_MSG(moex_status_string((moex_status)99) != NULL, "unknown status has a string");
    CHECK(moex_dtype_size((moex_dtype)42) == 0);
    {
        static const char *const names[] = {"f32", "bf16", "f16", "i32", "i64", "e4m3", "e5m2", "e8m0"};
        static const size_t sizes[] = {4, 2, 2, 4, 8, 1, 1, 1};
        const moex_dtype dts[] = {MOEX_DTYPE_F32, MOEX_DTYPE_BF16, MOEX_DTYPE_F16, MOEX_DTYPE_I32,
                                  MOEX_DTYPE_I64, MOEX_DTYPE_E4M3, MOEX_DTYPE_E5M2, MOEX_DTYPE_E8M0};
        for (int i = 0; i < 8; i++) CHECK_MSG(moex_dtype_size(dts[i]) == sizes[i], "moex_dtype_size(%d)", (int)dts[i]);
        for (int i = 0; i < 8; i++)
            CHECK_MSG(strcmp(moex_dtype_name(dts[i]), names[i]) == 0, "moex_dtype_name(%d) = \"%s\"", (int)dts[i],
                      moex_dtype_name(dts[i]));
        CHECK(strcmp(moex_dtype_name((moex_dtype)42), "unknown") == 0);
    }
}

static void offsets_cases(moex_context *ctx) {
    moex_splits_to_offsets_args a = base_so;
    OK(ctx, moex_splits_to_offsets(ctx, &a, fx.ws, WS_BYTES, NULL));
    NULL_CASES(ctx, moex_splits_to_offsets, base_so);
    WORKSPACE_CASES(ctx, moex_splits_to_offsets, a);
    a = base_so, a.num_outputs = 0;
    BAD(ctx, moex_splits_to_offsets(ctx, &a, fx.ws, WS_BYTES, NULL), "num_outputs");
    a = base_so, a.num_outputs = MOEX_MAX_OFFSETS + 1;
    BAD(ctx, moex_splits_to_offsets(ctx, &a, fx.ws, WS_BYTES, NULL), "num_outputs");
    a = base_so, a.outputs[1].stride = 0;
    BAD(ctx, moex_splits_to_offsets(ctx, &a, fx.ws, WS_BYTES, NULL), "stride");
    a = base_so, a.outputs[0].start = (moex_offsets_start)5;
    BAD(ctx, moex_splits_to_offsets(ctx, &a, fx.ws, WS_BYTES, NULL), "start");
    a = base_so, a.outputs[0].out.shape[0] = G; /* leading zero needs G+1 */
    BAD(ctx, moex_splits_to_offsets(ctx, &a, fx.ws, WS_BYTES, NULL), "outputs[0]");
    a = base_so, a.outputs[1].out.dtype = F32;
    BAD(ctx, moex_splits_to_offsets(ctx, &a, fx.ws, WS_BYTES, NULL), "outputs[1]");
    a = base_so, a.outputs[1].out.data = NULL;
    BAD(ctx, moex_splits_to_offsets(ctx, &a, fx.ws, WS_BYTES, NULL), "outputs[1]");
    a = base_so, a.splits = t1(fx.zero_splits, MOEX_DTYPE_I64, 0);
    BAD(ctx, moex_splits_to_offsets(ctx, &a, fx.ws, WS_BYTES, NULL), "splits");
    a = base_so, a.splits.dtype = MOEX_DTYPE_I32;
    BAD(ctx, moex_splits_to_offsets(ctx, &a, fx.ws, WS_BYTES, NULL), "splits");
    a = base_so, a.splits.ndim = 2, a.splits.shape[1] = 1;
    BAD(ctx, moex_splits_to_offsets(ctx, &a, fx.ws, WS_BYTES, NULL), "splits");
    a = base_so, a.splits.data = NULL;
    BAD(ctx, moex_splits_to_offsets(ctx, &a, fx.ws, WS_BYTES, NULL), "splits");
    a = base_so, a.splits.data = fx.neg_splits;
    EXPECT(ctx, moex_splits_to_offsets(ctx, &a, fx.ws, WS_BYTES, NULL), MOEX_ERR_BAD_SPLITS, "splits[1]");
    a = base_so, a.outputs[1].stride = 300000000; /* 8 * 3e8 does not fit an i32 offset */
    BAD(ctx, moex_splits_to_offsets(ctx, &a, fx.ws, WS_BYTES, NULL), "outputs[1]");
}

/* Bad split values for an op (args type `type`): negative (splits[1] = -1) and a sum
 * past T (passing it at group 2). Both MOEX_ERR_BAD_SPLITS, naming the op and the group. */
#define BAD_SPLITS_CASES(ctx, fn, type, base, opname)                                           \
    do {                                                                                        \
        type b_ = base;                                                                         \
        b_.splits.data = fx.neg_splits;                                                         \
        EXPECT(ctx, fn(ctx, &b_, fx.ws, WS_BYTES, NULL), MOEX_ERR_BAD_SPLITS, "splits[1]");     \
        EXPECT(ctx, fn(ctx, &b_, fx.ws, WS_BYTES, NULL), MOEX_ERR_BAD_SPLITS, opname);          \
        b_.splits.data = fx.big_splits;                                                         \
        EXPECT(ctx, fn(ctx, &b_, fx.ws, WS_BYTES, NULL), MOEX_ERR_BAD_SPLITS, "splits[2]");     \
    } while (0)

/* A pointer into the workspace fixture at `off` bytes past a 128-byte boundary. */
static void *maps_at(size_t off) {
    const uintptr_t p = (uintptr_t)fx.ws;
    return (void *)((p + 127u) / 128u * 128u + off);
}

/* A discrete weight's kept maps (moex_weight_maps_size, moex_weight_maps_write): the CPU
 * backend's GEMMs read none, so they take 0 bytes and their write writes nothing. */
static void weight_maps_cases(moex_context *ctx) {
    const moex_weight packed = base_fw.w;
    moex_weight discrete = packed;
    discrete.t.data = NULL, discrete.ptrs = fx.wptr;
    size_t bytes = 1;
    OK(ctx, moex_weight_maps_size(ctx, &discrete, &bytes));
    CHECK_MSG(bytes == 0, "the CPU backend's maps take 0 bytes, got %zu", bytes);
    EXPECT(NULL, moex_weight_maps_size(NULL, &discrete, &bytes), MOEX_ERR_INVALID_ARG, "ctx");
    BAD(ctx, moex_weight_maps_size(ctx, NULL, &bytes), "args");
    BAD(ctx, moex_weight_maps_size(ctx, &discrete, NULL), "bytes");
    moex_weight bad = discrete;
    bad.t.dtype = MOEX_DTYPE_I32;
    BAD(ctx, moex_weight_maps_size(ctx, &bad, &bytes), "w.t");
    bad = discrete, bad.t.shape[0] = 0;
    BAD(ctx, moex_weight_maps_size(ctx, &bad, &bytes), "G >= 1");
    bad = discrete, bad.t.shape[1] = bad.t.shape[2] = (int64_t)1 << 31;
    BAD(ctx, moex_weight_maps_size(ctx, &bad, &bytes), "too many elements");

    const moex_weight_maps_write_args base = {discrete, NULL, 0};
    moex_weight_maps_write_args a = base;
    OK(ctx, moex_weight_maps_write(ctx, &a, NULL, 0, NULL));
    a.w.maps = maps_at(64);   /* w's own maps are ignored */
    OK(ctx, moex_weight_maps_write(ctx, &a, NULL, 0, NULL));
    NULL_CASES(ctx, moex_weight_maps_write, base);
    WORKSPACE_CASES(ctx, moex_weight_maps_write, a);
    a = base, a.w = packed;                           BAD(ctx, moex_weight_maps_write(ctx, &a, NULL, 0, NULL), "discrete");
    a = base, a.w.t.shape[1] = -1;                    BAD(ctx, moex_weight_maps_write(ctx, &a, NULL, 0, NULL), "w");
    a = base, a.w.ptrs = (void *const *)maps_at(1);   BAD(ctx, moex_weight_maps_write(ctx, &a, NULL, 0, NULL), "w.ptrs");
}

static void grouped_linear_cases(moex_context *ctx) {
    moex_grouped_linear_args a = base_fw;
    OK(ctx, moex_grouped_linear_forward(ctx, &a, fx.ws, WS_BYTES, NULL));
    NULL_CASES(ctx, moex_grouped_linear_forward, base_fw);
    WORKSPACE_CASES(ctx, moex_grouped_linear_forward, a);
#define FW(needle) BAD(ctx, moex_grouped_linear_forward(ctx, &a, fx.ws, WS_BYTES, NULL), needle)
    a = base_fw, a.x.data = NULL;                      FW("x");
    a = base_fw, a.x.ndim = 3, a.x.shape[2] = 1;       FW("x");
    a = base_fw, a.x.ndim = 0;                         FW("x");
    a = base_fw, a.x.dtype = MOEX_DTYPE_I32;           FW("x");
    a = base_fw, a.x.shape[0] = -1;                    FW("x");
    /* a shape whose element count overflows: refused before any pointer is used */
    a = base_fw, a.x.shape[0] = a.x.shape[1] = (int64_t)1 << 32; FW("too many elements");
    a = base_fw, a.w.t.shape[2] = K + 1;               FW("w");
    a = base_fw, a.w.t.shape[0] = G + 1;               FW("w");
    a = base_fw, a.w.t.dtype = MOEX_DTYPE_F16;         FW("w");
    a = base_fw, a.w.t.ndim = 2;                       FW("w");
    a = base_fw, a.w.t.data = NULL;                    FW("w");
    a = base_fw, a.w.ptrs = fx.wptr;                   FW("ptrs");  /* both forms at once */
    a = base_fw, a.w.maps = maps_at(0);                FW("maps");  /* maps of a packed weight */
    a = base_fw, a.y.shape[1] = N + 1;                 FW("y");
    a = base_fw, a.y.shape[0] = T - 1;                 FW("y");
    a = base_fw, a.y.dtype = F32;                      FW("y");
    a = base_fw, a.y.ndim = 0;                         FW("y");
    a = base_fw, a.y.data = NULL;                      FW("y");
    a = base_fw, a.splits = t1(fx.zero_splits, MOEX_DTYPE_I64, 0); FW("splits");
    a = base_fw, a.splits.dtype = MOEX_DTYPE_I32;      FW("splits");
    a = base_fw, a.splits.ndim = 0;                    FW("splits");
    a = base_fw, a.bias_mode = (moex_bias_mode)9;      FW("bias mode");
    a = base_fw, a.probs.ndim = 0;                     FW("probs");  /* SCALED without probs */
    a = base_fw, a.probs.dtype = DT;                   FW("probs");
    a = base_fw, a.probs.shape[0] = T + 1;             FW("probs");
    a = base_fw, a.bias.ndim = 0;                      FW("bias");
    a = base_fw, a.bias.shape[1] = N - 1;              FW("bias");
    a = base_fw, a.bias.dtype = MOEX_DTYPE_F16;        FW("bias");
    a = base_fw, a.bias_mode = MOEX_BIAS_ADD, a.probs.ndim = 0, a.bias.ndim = 0; FW("bias");
    a = base_fw, a.bias_mode = MOEX_BIAS_NONE, a.probs.ndim = 0; FW("bias"); /* bias given with NONE */
    a = base_fw, a.bias_mode = MOEX_BIAS_ADD;          FW("probs");          /* probs given without SCALED */
    /* the FP8 recipe (docs/ops.md 9.11) */
    a = base_fw, a.fp8.mode = (moex_fp8_mode)7;        FW("fp8.mode");
    a = base_fw, a.fp8.mode = MOEX_FP8_BLOCK, a.fp8.dtypes = (moex_fp8_dtypes)2; FW("fp8.dtypes");
    a = base_fw, a.fp8.mode = MOEX_FP8_CURRENT, a.fp8.amax_epsilon = -1.0f; FW("fp8.amax_epsilon");
    a = base_fw, a.fp8.mode = MOEX_FP8_BLOCK, a.fp8.amax_epsilon = NAN; FW("fp8.amax_epsilon");
    a = base_fw, a.fp8.mode = MOEX_FP8_OFF, a.fp8.amax_epsilon = INFINITY; FW("fp8.amax_epsilon");
    a = base_fw, a.fp8.mode = MOEX_FP8_MXFP8, a.fp8.pow2_scales = 1; FW("fp8.pow2_scales");
#undef FW
    BAD_SPLITS_CASES(ctx, moex_grouped_linear_forward, moex_grouped_linear_args, base_fw, "grouped_linear_forward");
    /* T = 0: tensors without elements may have NULL data (valid) */
    a = base_fw, a.x = t2(NULL, DT, 0, K), a.y = t2(NULL, DT, 0, N), a.probs = t1(NULL, F32, 0);
    a.splits.data = fx.zero3;
    OK(ctx, moex_grouped_linear_forward(ctx, &a, fx.ws, WS_BYTES, NULL));
    /* discrete weights work (valid) */
    a = base_fw, a.w.t.data = NULL, a.w.ptrs = fx.wptr;
    OK(ctx, moex_grouped_linear_forward(ctx, &a, fx.ws, WS_BYTES, NULL));
    a.fp8.mode = MOEX_FP8_BLOCK;   /* with the FP8 recipe too (host-memory pointers) */
    {
        size_t need = 0;
        CHECK_STATUS(ctx, moex_grouped_linear_forward_workspace_size(ctx, &a, &need), MOEX_OK);
        CHECK_MSG(need <= WS_BYTES, "FP8 forward workspace of %zu bytes fits the fixture", need);
        if (need <= WS_BYTES) OK(ctx, moex_grouped_linear_forward(ctx, &a, fx.ws, WS_BYTES, NULL));
        BAD(ctx, moex_grouped_linear_forward(ctx, &a, fx.ws, need - 1, NULL), "workspace");
    }
    /* kept maps: not read by the CPU GEMMs (valid), but 128-byte aligned */
    a = base_fw, a.w.t.data = NULL, a.w.ptrs = fx.wptr, a.w.maps = maps_at(0);
    OK(ctx, moex_grouped_linear_forward(ctx, &a, fx.ws, WS_BYTES, NULL));
    a.w.maps = maps_at(64);                            BAD(ctx, moex_grouped_linear_forward(ctx, &a, fx.ws, WS_BYTES, NULL), "w.maps");
    a = base_fw, a.w.t.data = NULL, a.w.ptrs = fx.wptr;
    {   /* ... but not with a NULL matrix pointer */
        void *saved_ptr = fx.wptr[1];
        fx.wptr[1] = NULL;
        BAD(ctx, moex_grouped_linear_forward(ctx, &a, fx.ws, WS_BYTES, NULL), "w.ptrs[1]");
        fx.wptr[1] = saved_ptr;
    }

    moex_grouped_linear_dgrad_args d = base_dg;
    OK(ctx, moex_grouped_linear_backward_data(ctx, &d, fx.ws, WS_BYTES, NULL));
    NULL_CASES(ctx, moex_grouped_linear_backward_data, base_dg);
    WORKSPACE_CASES(ctx, moex_grouped_linear_backward_data, d);
#define DG(needle) BAD(ctx, moex_grouped_linear_backward_data(ctx, &d, fx.ws, WS_BYTES, NULL), needle)
    d = base_dg, d.dy.data = NULL;                     DG("dy");
    d = base_dg, d.dy.dtype = MOEX_DTYPE_I64;          DG("dy");
    d = base_dg, d.w.t.shape[1] = N + 1;               DG("w");
    d = base_dg, d.w.t.dtype = F32;                    DG("w");
    d = base_dg, d.dx.dtype = F32;                     DG("dx");
    d = base_dg, d.dx.shape[1] = K + 1;                DG("dx");
    d = base_dg, d.dbias.dtype = MOEX_DTYPE_F16;       DG("dbias"); /* neither dy's dtype nor f32 */
    d = base_dg, d.dbias.shape[0] = G + 1;             DG("dbias");
    d = base_dg, d.dprobs.shape[0] = T - 1;            DG("dprobs");
    d = base_dg, d.dprobs.dtype = DT;                  DG("dprobs");
    d = base_dg, d.bias.ndim = 0;                      DG("bias");   /* SCALED dprobs needs the bias */
    d = base_dg, d.probs.ndim = 0;                     DG("probs");
    d = base_dg, d.bias_mode = MOEX_BIAS_NONE, d.bias.ndim = 0, d.probs.ndim = 0, d.dprobs.ndim = 0; DG("dbias");
    d = base_dg, d.bias_mode = MOEX_BIAS_ADD, d.probs.ndim = 0; DG("dprobs");
    d = base_dg, d.bias_mode = MOEX_BIAS_ADD, d.dprobs.ndim = 0; DG("probs");   /* probs given without SCALED */
    d = base_dg, d.bias_mode = (moex_bias_mode)-1;     DG("bias mode");
    d = base_dg, d.fp8.mode = (moex_fp8_mode)-1;       DG("fp8.mode");
    d = base_dg, d.fp8.mode = MOEX_FP8_BLOCK, d.fp8.amax_epsilon = -0.5f; DG("fp8.amax_epsilon");
#undef DG
    BAD_SPLITS_CASES(ctx, moex_grouped_linear_backward_data, moex_grouped_linear_dgrad_args, base_dg, "grouped_linear_backward_data");

    moex_grouped_linear_wgrad_args w = base_wg;
    OK(ctx, moex_grouped_linear_backward_weight(ctx, &w, fx.ws, WS_BYTES, NULL));
    NULL_CASES(ctx, moex_grouped_linear_backward_weight, base_wg);
    WORKSPACE_CASES(ctx, moex_grouped_linear_backward_weight, w);
#define WG(needle) BAD(ctx, moex_grouped_linear_backward_weight(ctx, &w, fx.ws, WS_BYTES, NULL), needle)
    w = base_wg, w.dw = wp(fx.dw_bf16, DT, G, N, K);  WG("dw");      /* ACCUMULATE into a bf16 dW */
    w = base_wg, w.dw_mode = MOEX_GRAD_WRITE, w.dw.t.dtype = MOEX_DTYPE_F16; WG("dw");
    w = base_wg, w.dw.t.shape[2] = K - 1;              WG("dw");
    w = base_wg, w.dw.t.data = NULL;                   WG("dw");
    w = base_wg, w.dw_mode = (moex_grad_mode)3;        WG("grad mode");
    w = base_wg, w.dw.maps = maps_at(0);               WG("maps");    /* maps of an output */
    w = base_wg, w.dy.shape[0] = T + 1;                WG("dy");
    w = base_wg, w.dy.dtype = F32;                     WG("dy");
    w = base_wg, w.x.ndim = 1;                         WG("x");
    w = base_wg, w.fp8.mode = MOEX_FP8_MXFP8, w.fp8.dtypes = (moex_fp8_dtypes)9; WG("fp8.dtypes");
    w = base_wg, w.fp8.mode = (moex_fp8_mode)4;        WG("fp8.mode");
#undef WG
    BAD_SPLITS_CASES(ctx, moex_grouped_linear_backward_weight, moex_grouped_linear_wgrad_args, base_wg, "grouped_linear_backward_weight");
    w = base_wg, w.dw_mode = MOEX_GRAD_WRITE, w.dw = wp(fx.dw_bf16, DT, G, N, K); /* WRITE bf16 is valid */
    OK(ctx, moex_grouped_linear_backward_weight(ctx, &w, fx.ws, WS_BYTES, NULL));
}

static void glu_cases(moex_context *ctx) {
    moex_scaled_glu_args a = base_gf;
    OK(ctx, moex_scaled_glu_forward(ctx, &a, fx.ws, WS_BYTES, NULL));
    NULL_CASES(ctx, moex_scaled_glu_forward, base_gf);
    WORKSPACE_CASES(ctx, moex_scaled_glu_forward, a);
#define GF(needle) BAD(ctx, moex_scaled_glu_forward(ctx, &a, fx.ws, WS_BYTES, NULL), needle)
    a = base_gf, a.h.shape[1] = 2 * F - 1;             GF("h");
    a = base_gf, a.h.data = NULL;                      GF("h");
    a = base_gf, a.h.dtype = MOEX_DTYPE_I32;           GF("h");
    a = base_gf, a.z.shape[1] = F + 1;                 GF("z");
    a = base_gf, a.z.dtype = F32;                      GF("z");
    a = base_gf, a.z.ndim = 0;                         GF("z");
    a = base_gf, a.probs.dtype = DT;                   GF("probs");
    a = base_gf, a.probs.shape[0] = 1;                 GF("probs");
    a = base_gf, a.splits.dtype = MOEX_DTYPE_I32;      GF("splits");
    a = base_gf, a.splits = t1(fx.zero_splits, MOEX_DTYPE_I64, 0); GF("splits");
    a = base_gf, a.glu.kind = (moex_glu_kind)4;        GF("kind");
    a = base_gf, a.glu.layout = (moex_glu_layout)4;    GF("layout");
    a = base_gf, a.glu.limit = 0.0f;                   GF("limit");
    a = base_gf, a.glu.limit = NAN;                    GF("limit");
    a = base_gf, a.glu.alpha = INFINITY;               GF("alpha");
    /* interleaved with F % 32 != 0: h [T, 2*40] */
    a = base_gf, a.h.shape[1] = 80, a.z.shape[1] = 40; GF("32");
#undef GF
    BAD_SPLITS_CASES(ctx, moex_scaled_glu_forward, moex_scaled_glu_args, base_gf, "scaled_glu_forward");

    moex_scaled_glu_grad_args b = base_gb;
    OK(ctx, moex_scaled_glu_backward(ctx, &b, fx.ws, WS_BYTES, NULL));
    NULL_CASES(ctx, moex_scaled_glu_backward, base_gb);
    WORKSPACE_CASES(ctx, moex_scaled_glu_backward, b);
#define GB(needle) BAD(ctx, moex_scaled_glu_backward(ctx, &b, fx.ws, WS_BYTES, NULL), needle)
    b = base_gb, b.probs.ndim = 0;                     GB("probs");   /* dprobs without probs */
    b = base_gb, b.dh.dtype = F32;                     GB("dh");
    b = base_gb, b.dh.shape[1] = F;                    GB("dh");
    b = base_gb, b.dh.ndim = 0;                        GB("dh");
    b = base_gb, b.dz.shape[0] = T + 1;                GB("dz");
    b = base_gb, b.dz.data = NULL;                     GB("dz");
    b = base_gb, b.dprobs.dtype = DT;                  GB("dprobs");
    b = base_gb, b.h.shape[1] = 80, b.dz.shape[1] = 40, b.dh.shape[1] = 80; GB("32");
#undef GB
    BAD_SPLITS_CASES(ctx, moex_scaled_glu_backward, moex_scaled_glu_grad_args, base_gb, "scaled_glu_backward");
}

static void mlp_cases(moex_context *ctx) {
    moex_grouped_mlp_args a = base_mf;
    OK(ctx, moex_grouped_mlp_forward(ctx, &a, fx.ws, WS_BYTES, NULL));
    NULL_CASES(ctx, moex_grouped_mlp_forward, base_mf);
    WORKSPACE_CASES(ctx, moex_grouped_mlp_forward, a);
    a = base_mf, a.z.ndim = 0; /* z recomputed later: the forward keeps it in the workspace */
    WORKSPACE_CASES(ctx, moex_grouped_mlp_forward, a);
#define MF(needle) BAD(ctx, moex_grouped_mlp_forward(ctx, &a, fx.ws, WS_BYTES, NULL), needle)
    a = base_mf, a.x.shape[1] = H + 1;                 MF("w1");
    a = base_mf, a.x.dtype = F32;                      MF("w1");
    a = base_mf, a.w1.t.shape[1] = 2 * F - 1;          MF("w1");     /* odd 2F */
    a = base_mf, a.w2.t.shape[2] = F + 1;              MF("w2");
    a = base_mf, a.w2.t.shape[0] = G - 1;              MF("w2");
    a = base_mf, a.b1.shape[1] = F;                    MF("b1");
    a = base_mf, a.b1.dtype = MOEX_DTYPE_F16;          MF("b1");
    a = base_mf, a.b2.ndim = 0;                        MF("b2");
    a = base_mf, a.probs.ndim = 0;                     MF("probs");  /* SCALED b2 without probs */
    a = base_mf, a.h.ndim = 0;                         MF("h");
    a = base_mf, a.h.shape[1] = F;                     MF("h");
    a = base_mf, a.z.dtype = F32;                      MF("z");
    a = base_mf, a.y.shape[1] = H - 1;                 MF("y");
    a = base_mf, a.y.data = NULL;                      MF("y");
    a = base_mf, a.b2_mode = (moex_bias_mode)3;        MF("bias mode");
    a = base_mf, a.b2_mode = MOEX_BIAS_NONE;           MF("b2");     /* b2 given with NONE */
    a = base_mf, a.glu.layout = MOEX_GLU_INTERLEAVED_32, a.w1.t.shape[1] = 2 * 20, a.h.shape[1] = 40,
    a.b1.shape[1] = 40, a.w2.t.shape[2] = 20, a.z.shape[1] = 20; MF("32");
    a = base_mf, a.glu.kind = MOEX_GLU_CLAMPED_SWIGLU, a.glu.limit = -1.0f; MF("limit");
    a = base_mf, a.fp8.mode = (moex_fp8_mode)5;        MF("fp8.mode");
    a = base_mf, a.fp8.mode = MOEX_FP8_CURRENT, a.fp8.dtypes = (moex_fp8_dtypes)-1; MF("fp8.dtypes");
    a = base_mf, a.fp8.mode = MOEX_FP8_BLOCK, a.fp8.amax_epsilon = -INFINITY; MF("fp8.amax_epsilon");
#undef MF
    BAD_SPLITS_CASES(ctx, moex_grouped_mlp_forward, moex_grouped_mlp_args, base_mf, "grouped_mlp_forward");

    moex_grouped_mlp_grad_args b = base_mb;
    OK(ctx, moex_grouped_mlp_backward(ctx, &b, fx.ws, WS_BYTES, NULL));
    NULL_CASES(ctx, moex_grouped_mlp_backward, base_mb);
    WORKSPACE_CASES(ctx, moex_grouped_mlp_backward, b);
    CHECK_MSG(ws_need > 0, "the MLP backward keeps dz and dh in its workspace (size %zu)", ws_need);
#define MB(needle) BAD(ctx, moex_grouped_mlp_backward(ctx, &b, fx.ws, WS_BYTES, NULL), needle)
    b = base_mb, b.dw1 = wp(fx.dw1_bf16, DT, G, 2 * F, H); MB("dw1"); /* ACCUMULATE into bf16 */
    b = base_mb, b.dw2.t.shape[1] = H + 1;             MB("dw2");
    b = base_mb, b.dw_mode = (moex_grad_mode)2;        MB("grad mode");
    b = base_mb, b.db1.dtype = MOEX_DTYPE_F16;         MB("db1");
    b = base_mb, b.db2.shape[1] = H + 1;               MB("db2");
    b = base_mb, b.b2_mode = MOEX_BIAS_NONE, b.b2.ndim = 0; MB("db2"); /* db2 with NONE */
    b = base_mb, b.probs.ndim = 0;                     MB("probs");   /* dprobs / SCALED without probs */
    b = base_mb, b.b2.ndim = 0;                        MB("b2");      /* SCALED dprobs needs b2 */
    b = base_mb, b.dprobs.shape[0] = 2;                MB("dprobs");
    b = base_mb, b.dx.dtype = F32;                     MB("dx");
    b = base_mb, b.dy.shape[0] = T - 1;                MB("dy");
    b = base_mb, b.dy.ndim = 0;                        MB("dy");
    b = base_mb, b.h.ndim = 0;                         MB("h");
    b = base_mb, b.z.shape[1] = 2 * F;                 MB("z");
    b = base_mb, b.h_mode = (moex_h_mode)2;            MB("h_mode");
    /* an h the call overwrites is an output: it may not overlap an input */
    b = base_mb, b.h_mode = MOEX_H_OVERWRITE, b.x.data = b.h.data; MB("overlaps");
    b = base_mb, b.fp8.mode = (moex_fp8_mode)99;       MB("fp8.mode");
    b = base_mb, b.fp8.mode = MOEX_FP8_MXFP8, b.fp8.pow2_scales = -1; MB("fp8.pow2_scales");
    b = base_mb, b.fp8.mode = MOEX_FP8_BLOCK, b.dw1 = wp(fx.dw1_bf16, DT, G, 2 * F, H); MB("dw1"); /* still */
#undef MB
    BAD_SPLITS_CASES(ctx, moex_grouped_mlp_backward, moex_grouped_mlp_grad_args, base_mb, "grouped_mlp_backward");
    b = base_mb, b.z.ndim = 0; /* recompute z: still valid */
    OK(ctx, moex_grouped_mlp_backward(ctx, &b, fx.ws, WS_BYTES, NULL));
}

int main(void) {
    fixture_make();
    context_cases();
    moex_context *ctx = tu_cpu_context();
    BAD(ctx, moex_context_set_num_threads(ctx, 0), "n = 0");
    CHECK_STATUS(ctx, moex_context_set_num_threads(NULL, 2), MOEX_ERR_INVALID_ARG);
    CHECK_STATUS(ctx, moex_context_check_splits(ctx, NULL), MOEX_OK);
    CHECK(moex_context_backend(ctx) == MOEX_BACKEND_CPU);
    offsets_cases(ctx);
    weight_maps_cases(ctx);
    grouped_linear_cases(ctx);
    glu_cases(ctx);
    mlp_cases(ctx);
    moex_context_destroy(ctx);
    fixture_free();
    return tu_finish();
}
