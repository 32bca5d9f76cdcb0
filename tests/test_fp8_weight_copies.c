/*
 * test_fp8_weight_copies.c - the layers' FP8 recipe with the weights' copies a caller keeps
 * (moex_fp8_recipe.weights, moex_fp8_weight, moex_fp8_weight_params, moex_fp8_weight_layout;
 * docs/ops.md 9.11), on the CPU backend.
 *
 * How results are judged. A kept copy is what moex_weight_quantize writes with
 * moex_fp8_weight_params, so a call that reads it must give, bitwise, what the same call gives
 * quantizing the weight itself (the reference here: the call without kept copies). To show
 * that the copies are read (not the master weight), calls are also given the copies of
 * another weight w': they must equal, bitwise, the calls on master w' and differ from those
 * on w. Covered: the grouped linear's forward and backward data (BLOCK, CURRENT, MXFP8; a
 * rowwise copy alone: the backward data quantizes the columnwise one itself), the grouped
 * MLP's forward and backward and the MoE layer's (BLOCK, CURRENT); G = 3 with an empty group,
 * sizes not multiples of 128. Refused, naming the field, with the output untouched: a copy
 * of the wrong shape, data of the wrong FP8 dtype, scales of the wrong shape. With
 * MOEX_FP8_OFF the copies are not read (bitwise the plain call). The copies live in one
 * buffer laid out by moex_fp8_weight_layout (its refusals: OFF, a zero dimension, a base
 * not 256-byte aligned, w or bytes NULL).
 */
#include "test_quant.h"

#include <stdlib.h>
#include <string.h>

#define G 3
static const int64_t SPLITS[G] = {37, 0, 60};   /* S = 97 of T = 100 rows */
#define T 100
static const moex_dtype DT = MOEX_DTYPE_BF16;

static moex_fp8_recipe recipe_of(moex_fp8_mode mode) {
    moex_fp8_recipe r = {.mode = mode, .dtypes = MOEX_FP8_HYBRID, .pow2_scales = mode == MOEX_FP8_CURRENT};
    return r;
}

static const char *mode_name(moex_fp8_mode m) {
    return m == MOEX_FP8_BLOCK ? "BLOCK" : m == MOEX_FP8_CURRENT ? "CURRENT" : "MXFP8";
}

/* A weight's copies kept by the caller (tq_kept_copies) of w [G, N, K] (bf16 values wb). */
typedef struct kept {
    moex_fp8_weight fw;
    void *buf;
} kept;

static kept kept_make(moex_context *ctx, const moex_fp8_recipe *r, const void *wb, int64_t N, int64_t K) {
    const moex_weight w = moex_weight_packed(moex_tensor_3d((void *)wb, DT, G, N, K));
    kept k;
    k.fw = tq_kept_copies(ctx, r, &w, &k.buf);
    return k;
}

static void kept_free(kept *k) { free(k->buf); }

/* moex_fp8_weight_layout's refusals: a recipe OFF, w or bytes NULL, a weight shape with a zero,
 * a base not 256-byte aligned; nothing written. */
static void check_layout_refusals(moex_context *ctx) {
    const moex_fp8_recipe on = recipe_of(MOEX_FP8_BLOCK), off = {0};
    moex_weight w = moex_weight_packed(moex_tensor_3d(NULL, DT, G, 8, 8));
    size_t bytes = 7;
    CHECK_REFUSED(ctx, moex_fp8_weight_layout(ctx, &off, &w, NULL, NULL, &bytes), "OFF", NULL);
    CHECK(bytes == 7);
    CHECK_REFUSED(ctx, moex_fp8_weight_layout(ctx, &on, &w, NULL, NULL, NULL), "bytes is NULL", NULL);
    CHECK_REFUSED(ctx, moex_fp8_weight_layout(ctx, &on, NULL, NULL, NULL, &bytes), "w is NULL", NULL);
    CHECK(bytes == 7);
    w.t.shape[1] = 0;
    CHECK_REFUSED(ctx, moex_fp8_weight_layout(ctx, &on, &w, NULL, NULL, &bytes), "[G, N, K]", NULL);
    w.t.shape[1] = 8;
    static unsigned char room[4096 + 512];
    unsigned char *misaligned = room + (256 - (uintptr_t)room % 256) % 256 + 16;
    moex_fp8_weight fw;
    memset(&fw, 0, sizeof fw);
    CHECK_REFUSED(ctx, moex_fp8_weight_layout(ctx, &on, &w, misaligned, &fw, &bytes), "aligned", NULL);
    CHECK(fw.rowwise.data.data == NULL);
}

static void *random_buffer(tu_rng *rng, int64_t n, double lo, double hi) {
    double *v = tu_doubles(n);
    tu_fill_uniform(rng, v, n, lo, hi, DT);
    void *b = tu_buffer(DT, v, n);
    free(v);
    return b;
}

static int same(const void *a, const void *b, int64_t n) { return memcmp(a, b, (size_t)n * 2) == 0; }

/* ---- the grouped linear ------------------------------------------------------------------- */

enum { KEEP_NONE, KEEP_BOTH, KEEP_ROWWISE };

/* y = forward and dx = backward data of x, dy with master weight wb and recipe r (its
 * weights field as given); returns the status of the first call that is not OK. */
static moex_status linear_calls(moex_context *ctx, const moex_fp8_recipe *r, const void *xb, const void *dyb,
                                const void *wb, int64_t K, int64_t N, void *yb, void *dxb) {
    const moex_tensor splits = moex_tensor_1d((void *)SPLITS, MOEX_DTYPE_I64, G);
    moex_grouped_linear_args f;
    memset(&f, 0, sizeof f);
    f.x = moex_tensor_2d((void *)xb, DT, T, K), f.w = moex_weight_packed(moex_tensor_3d((void *)wb, DT, G, N, K));
    f.splits = splits, f.y = moex_tensor_2d(yb, DT, T, N), f.fp8 = *r;
    size_t bytes = 0;
    moex_status st = moex_grouped_linear_forward_workspace_size(ctx, &f, &bytes);
    if (st != MOEX_OK) return st;
    void *ws = tu_workspace(bytes);
    st = moex_grouped_linear_forward(ctx, &f, ws, bytes, NULL);
    free(ws);
    if (st != MOEX_OK) return st;
    moex_grouped_linear_dgrad_args d;
    memset(&d, 0, sizeof d);
    d.dy = moex_tensor_2d((void *)dyb, DT, T, N), d.w = f.w, d.splits = splits, d.dx = moex_tensor_2d(dxb, DT, T, K);
    d.fp8 = *r;
    st = moex_grouped_linear_backward_data_workspace_size(ctx, &d, &bytes);
    if (st != MOEX_OK) return st;
    ws = tu_workspace(bytes);
    st = moex_grouped_linear_backward_data(ctx, &d, ws, bytes, NULL);
    free(ws);
    return st;
}

static void check_linear(moex_context *ctx, tu_rng *rng, moex_fp8_mode mode) {
    const int64_t K = 200, N = 72;
    const moex_fp8_recipe r = recipe_of(mode);
    void *xb = random_buffer(rng, T * K, -2, 2), *dyb = random_buffer(rng, T * N, -1, 1);
    void *wb = random_buffer(rng, G * N * K, -0.5, 0.5), *w2b = random_buffer(rng, G * N * K, -0.5, 0.5);
    void *y0 = tu_poisoned(DT, T * N), *dx0 = tu_poisoned(DT, T * K), *y2 = tu_poisoned(DT, T * N);
    void *dx2 = tu_poisoned(DT, T * K);
    CHECK_STATUS(ctx, linear_calls(ctx, &r, xb, dyb, wb, K, N, y0, dx0), MOEX_OK);    /* quantized in the calls */
    CHECK_STATUS(ctx, linear_calls(ctx, &r, xb, dyb, w2b, K, N, y2, dx2), MOEX_OK);   /* on master w' */
    kept kw = kept_make(ctx, &r, wb, N, K), kw2 = kept_make(ctx, &r, w2b, N, K);
    for (int keep = KEEP_BOTH; keep <= KEEP_ROWWISE; keep++)
        for (int other = 0; other < 2; other++) {
            moex_fp8_weight fw = other ? kw2.fw : kw.fw;
            if (keep == KEEP_ROWWISE) memset(&fw.columnwise, 0, sizeof fw.columnwise);
            moex_fp8_recipe rk = r;
            rk.weights = &fw;
            void *y = tu_poisoned(DT, T * N), *dx = tu_poisoned(DT, T * K);
            CHECK_STATUS(ctx, linear_calls(ctx, &rk, xb, dyb, wb, K, N, y, dx), MOEX_OK);
            /* the forward reads the kept rowwise copy; the backward data the columnwise one,
             * or, kept rowwise only, quantizes master w */
            const void *want_dx = keep == KEEP_BOTH && other ? dx2 : dx0;
            CHECK_MSG(same(y, other ? y2 : y0, SPLITS[0] * N + SPLITS[2] * N),
                      "linear %s, kept %s copies of %s: y is not bitwise the call on master %s", mode_name(mode),
                      keep == KEEP_BOTH ? "both" : "the rowwise", other ? "w'" : "w", other ? "w'" : "w");
            CHECK_MSG(same(dx, want_dx, (SPLITS[0] + SPLITS[2]) * K),
                      "linear %s, kept %s copies of %s: dx is not bitwise the expected call", mode_name(mode),
                      keep == KEEP_BOTH ? "both" : "the rowwise", other ? "w'" : "w");
            CHECK_POISONED("linear, kept copies: y tail rows", DT, y, 97 * N, T * N);
            CHECK_POISONED("linear, kept copies: dx tail rows", DT, dx, 97 * K, T * K);
            free(y), free(dx);
        }
    CHECK_MSG(!same(y0, y2, 97 * N), "linear %s: w and w' give the same y (the test cannot tell them apart)",
              mode_name(mode));

    /* refused, nothing written: each bad copy in turn */
    for (int bad = 0; bad < 3; bad++) {
        moex_fp8_weight fw = kw.fw;
        const char *field = "fp8.weights[0].rowwise.data (w)";
        if (bad == 0) fw.rowwise.data.shape[1] = N - 1;                        /* wrong shape */
        if (bad == 1) fw.columnwise.data.dtype = MOEX_DTYPE_E5M2, field = "fp8.weights[0].columnwise.data (w)";
        if (bad == 2) fw.rowwise.scales.shape[0] = G + 1, field = "fp8.weights[0].rowwise.scales (w)";
        moex_fp8_recipe rk = r;
        rk.weights = &fw;
        void *y = tu_poisoned(DT, T * N), *dx = tu_poisoned(DT, T * K);
        CHECK_STATUS(ctx, linear_calls(ctx, &rk, xb, dyb, wb, K, N, y, dx), MOEX_ERR_INVALID_ARG);
        CHECK_MSG_HAS(ctx, field);
        CHECK_POISONED("linear, refused copies: y untouched", DT, y, 0, T * N);
        CHECK_POISONED("linear, refused copies: dx untouched", DT, dx, 0, T * K);
        free(y), free(dx);
    }

    /* OFF: the copies are not read, even bad ones (bitwise the plain call) */
    moex_fp8_weight junk = kw2.fw;
    junk.rowwise.data.shape[1] = 1;
    moex_fp8_recipe off = {.weights = &junk}, plain = {0};
    void *ya = tu_poisoned(DT, T * N), *dxa = tu_poisoned(DT, T * K), *yb = tu_poisoned(DT, T * N);
    void *dxb = tu_poisoned(DT, T * K);
    CHECK_STATUS(ctx, linear_calls(ctx, &off, xb, dyb, wb, K, N, ya, dxa), MOEX_OK);
    CHECK_STATUS(ctx, linear_calls(ctx, &plain, xb, dyb, wb, K, N, yb, dxb), MOEX_OK);
    CHECK_MSG(same(ya, yb, T * N) && same(dxa, dxb, T * K), "linear: OFF with kept copies is not the plain call");
    free(ya), free(dxa), free(yb), free(dxb);
    kept_free(&kw), kept_free(&kw2);
    free(xb), free(dyb), free(wb), free(w2b), free(y0), free(dx0), free(y2), free(dx2);
}

/* ---- the grouped MLP and the MoE layer ------------------------------------------------------- */

#define H 72
#define F 40
#define E G

typedef struct mlp_out {
    void *y, *dx, *dw1, *dw2;
} mlp_out;

static void mlp_out_free(mlp_out *o) { free(o->y), free(o->dx), free(o->dw1), free(o->dw2); }

/* The grouped MLP's forward and backward (probs-scaled GLU, dW in f32) on master w1b, w2b. */
static mlp_out mlp_run(moex_context *ctx, const moex_fp8_recipe *r, const void *xb, const void *pb, const void *dyb,
                       const void *w1b, const void *w2b) {
    const moex_tensor splits = moex_tensor_1d((void *)SPLITS, MOEX_DTYPE_I64, G);
    mlp_out o = {tu_poisoned(DT, T * H), tu_poisoned(DT, T * H), tu_poisoned(MOEX_DTYPE_F32, G * 2 * F * H),
                 tu_poisoned(MOEX_DTYPE_F32, G * H * F)};
    void *h = tu_poisoned(DT, T * 2 * F);
    moex_grouped_mlp_args a;
    memset(&a, 0, sizeof a);
    a.x = moex_tensor_2d((void *)xb, DT, T, H);
    a.w1 = moex_weight_packed(moex_tensor_3d((void *)w1b, DT, G, 2 * F, H));
    a.w2 = moex_weight_packed(moex_tensor_3d((void *)w2b, DT, G, H, F));
    a.probs = moex_tensor_1d((void *)pb, MOEX_DTYPE_F32, T), a.splits = splits;
    a.glu = moex_glu_params_default(MOEX_GLU_SWIGLU);
    a.h = moex_tensor_2d(h, DT, T, 2 * F), a.y = moex_tensor_2d(o.y, DT, T, H), a.fp8 = *r;
    size_t bytes = 0;
    CHECK_STATUS(ctx, moex_grouped_mlp_forward_workspace_size(ctx, &a, &bytes), MOEX_OK);
    void *ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_grouped_mlp_forward(ctx, &a, ws, bytes, NULL), MOEX_OK);
    free(ws);
    moex_grouped_mlp_grad_args b;
    memset(&b, 0, sizeof b);
    b.x = a.x, b.w1 = a.w1, b.w2 = a.w2, b.probs = a.probs, b.splits = splits, b.glu = a.glu, b.h = a.h;
    b.dy = moex_tensor_2d((void *)dyb, DT, T, H), b.dx = moex_tensor_2d(o.dx, DT, T, H);
    b.dw1 = moex_weight_packed(moex_tensor_3d(o.dw1, MOEX_DTYPE_F32, G, 2 * F, H));
    b.dw2 = moex_weight_packed(moex_tensor_3d(o.dw2, MOEX_DTYPE_F32, G, H, F)), b.fp8 = *r;
    CHECK_STATUS(ctx, moex_grouped_mlp_backward_workspace_size(ctx, &b, &bytes), MOEX_OK);
    ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_grouped_mlp_backward(ctx, &b, ws, bytes, NULL), MOEX_OK);
    free(ws), free(h);
    return o;
}

/* The MoE layer's forward and backward (E = G experts, top-2) on master w1b, w2b. */
static mlp_out moe_run(moex_context *ctx, const moex_fp8_recipe *r, const void *xb, const void *rwb, const void *dyb,
                       const void *w1b, const void *w2b) {
    mlp_out o = {tu_poisoned(DT, T * H), tu_poisoned(DT, T * H), tu_poisoned(MOEX_DTYPE_F32, E * 2 * F * H),
                 tu_poisoned(MOEX_DTYPE_F32, E * H * F)};
    void *drw = tu_poisoned(MOEX_DTYPE_F32, E * H);
    moex_moe_layer_args a;
    memset(&a, 0, sizeof a);
    a.x = moex_tensor_2d((void *)xb, DT, T, H), a.router_w = moex_tensor_2d((void *)rwb, DT, E, H), a.topk = 2;
    a.w1 = moex_weight_packed(moex_tensor_3d((void *)w1b, DT, E, 2 * F, H));
    a.w2 = moex_weight_packed(moex_tensor_3d((void *)w2b, DT, E, H, F));
    a.glu = moex_glu_params_default(MOEX_GLU_SWIGLU), a.y = moex_tensor_2d(o.y, DT, T, H), a.fp8 = *r;
    size_t sb = 0, bytes = 0;
    CHECK_STATUS(ctx, moex_moe_layer_saved_size(ctx, &a, &sb), MOEX_OK);
    a.saved = tu_alloc(sb), a.saved_bytes = sb;
    CHECK_STATUS(ctx, moex_moe_layer_forward_workspace_size(ctx, &a, &bytes), MOEX_OK);
    void *ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_moe_layer_forward(ctx, &a, ws, bytes, NULL), MOEX_OK);
    free(ws);
    moex_moe_layer_grad_args b;
    memset(&b, 0, sizeof b);
    b.fwd = a, b.dy = moex_tensor_2d((void *)dyb, DT, T, H), b.dx = moex_tensor_2d(o.dx, DT, T, H);
    b.drouter_w = moex_tensor_2d(drw, MOEX_DTYPE_F32, E, H);
    b.dw1 = moex_weight_packed(moex_tensor_3d(o.dw1, MOEX_DTYPE_F32, E, 2 * F, H));
    b.dw2 = moex_weight_packed(moex_tensor_3d(o.dw2, MOEX_DTYPE_F32, E, H, F));
    CHECK_STATUS(ctx, moex_moe_layer_backward_workspace_size(ctx, &b, &bytes), MOEX_OK);
    ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_moe_layer_backward(ctx, &b, ws, bytes, NULL), MOEX_OK);
    free(ws), free(a.saved), free(drw);
    return o;
}

static int outs_same(const mlp_out *a, const mlp_out *b) {
    return memcmp(a->y, b->y, (size_t)T * H * 2) == 0 && memcmp(a->dx, b->dx, (size_t)T * H * 2) == 0 &&
           memcmp(a->dw1, b->dw1, (size_t)G * 2 * F * H * 4) == 0 && memcmp(a->dw2, b->dw2, (size_t)G * H * F * 4) == 0;
}

/* layer 0: the grouped MLP, 1: the MoE layer. Kept copies of (w1, w2) and of (w1', w2'). */
static void check_layer(moex_context *ctx, tu_rng *rng, int layer, moex_fp8_mode mode) {
    const moex_fp8_recipe r = recipe_of(mode);
    const char *name = layer ? "moe layer" : "grouped mlp";
    void *xb = random_buffer(rng, T * H, -1, 1), *dyb = random_buffer(rng, T * H, -1, 1);
    void *w1 = random_buffer(rng, G * 2 * F * H, -0.3, 0.3), *w2 = random_buffer(rng, G * H * F, -0.3, 0.3);
    void *v1 = random_buffer(rng, G * 2 * F * H, -0.3, 0.3), *v2 = random_buffer(rng, G * H * F, -0.3, 0.3);
    void *aux = layer ? random_buffer(rng, E * H, -1, 1) : NULL;   /* the router's weights */
    float *pv = (float *)tu_alloc(T * sizeof(float));
    for (int64_t t = 0; t < T; t++) pv[t] = (float)tu_uniform_range(rng, 0.05, 1.0);
    const void *second = layer ? aux : (const void *)pv;
#define RUN(rr, a1, a2) (layer ? moe_run(ctx, (rr), xb, second, dyb, (a1), (a2)) : mlp_run(ctx, (rr), xb, second, dyb, (a1), (a2)))
    mlp_out ref = RUN(&r, w1, w2), ref_v = RUN(&r, v1, v2);
    kept k1 = kept_make(ctx, &r, w1, 2 * F, H), k2 = kept_make(ctx, &r, w2, H, F);
    kept q1 = kept_make(ctx, &r, v1, 2 * F, H), q2 = kept_make(ctx, &r, v2, H, F);
    for (int other = 0; other < 2; other++) {
        const moex_fp8_weight fw[2] = {other ? q1.fw : k1.fw, other ? q2.fw : k2.fw};
        moex_fp8_recipe rk = r;
        rk.weights = fw;
        mlp_out got = RUN(&rk, w1, w2);
        CHECK_MSG(outs_same(&got, other ? &ref_v : &ref),
                  "%s %s, kept copies of %s: y, dx, dW1, dW2 not bitwise the call on master %s", name,
                  mode_name(mode), other ? "(w1', w2')" : "(w1, w2)", other ? "(w1', w2')" : "(w1, w2)");
        mlp_out_free(&got);
    }
    CHECK_MSG(!outs_same(&ref, &ref_v), "%s %s: the two weight pairs give the same outputs", name, mode_name(mode));
#undef RUN
    kept_free(&k1), kept_free(&k2), kept_free(&q1), kept_free(&q2);
    mlp_out_free(&ref), mlp_out_free(&ref_v);
    free(xb), free(dyb), free(w1), free(w2), free(v1), free(v2), free(aux), free(pv);
}

int main(void) {
    moex_context *ctx = tu_cpu_context();
    tu_rng rng = tu_rng_seed(3407);
    static const moex_fp8_mode modes[3] = {MOEX_FP8_BLOCK, MOEX_FP8_CURRENT, MOEX_FP8_MXFP8};
    check_layout_refusals(ctx);
    for (int m = 0; m < 3; m++) check_linear(ctx, &rng, modes[m]);
    for (int layer = 0; layer < 2; layer++)
        for (int m = 0; m < 2; m++) check_layer(ctx, &rng, layer, modes[m]);
    moex_context_destroy(ctx);
    return tu_finish();
}
