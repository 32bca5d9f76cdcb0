/*
 * test_fp8_linear.c - moex_grouped_linear_fp8_forward / _backward_weight (docs/ops.md 9.10)
 * on the CPU backend against the fp64 reference computed from the dequantized operands: the
 * operands are quantized by the reference (tools/ref/ref_quant.h), and the reference product
 * reads their dequantized values (rounded to f32 as moex_*_dequantize gives them), so the
 * tolerance is that of the accumulation alone (fp8_tol).
 *
 * Coverage (every case through the forward, the backward data and the backward weight): the
 * recipe pairs BLOCK/BLOCK, GROUP/GROUP, TENSOR/GROUP, MXFP8/MXFP8 (E4M3
 * operands; gradients E5M2); y in f32, bf16, f16; bias NONE, ADD (f32), SCALED (y's dtype);
 * groups of 0, 1, 63, 64, 65 and 129 rows, G = 1 and G = 256 (mostly empty), K and N not
 * multiples of 128 or 32; rows past sum(splits) (FP8 NaN codes in the inputs; y's and dx's
 * tails poisoned and checked untouched); the backward data as the forward with dy's rowwise
 * copy and the weights' columnwise copy; the backward weight written (empty groups 0) and
 * accumulated into f32 main grads, and written into bf16 / f16, packed and discrete (bitwise
 * the f32 dW rounded once); current and block scaling at K and N multiples of 16
 * with and without a bias (on Hopper: the FP8 kernels, the forward's and, with T a multiple
 * of 16, the weight gradient's, each checked to run by its workspace; several 128-deep
 * stages and tails). Refusals: recipes that do not pair, TENSOR weights, an FP8 tensor of another dtype,
 * shapes that disagree, a 16-bit dW accumulated, a dW of another dtype.
 * tests/cuda/test_gpu_fp8_linear.c runs this file on the GPU.
 */
#include "ref_quant.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double worst_seen;

static void note(double ratio) {
    if (ratio > worst_seen && isfinite(ratio)) worst_seen = ratio;
}

static const char *dt_name(moex_dtype dt) {
    return dt == MOEX_DTYPE_F32 ? "f32" : dt == MOEX_DTYPE_BF16 ? "bf16" : "f16";
}

static moex_quant_params params_of(moex_quant_recipe recipe, moex_dtype fp8) {
    moex_quant_params p;
    memset(&p, 0, sizeof p);
    p.recipe = recipe;
    p.fp8 = fp8;
    return p;
}

/* The bytes of one element of a recipe's scales (f32, or E8M0 for MXFP8). */
static size_t scale_size(moex_quant_recipe r) { return r == MOEX_QUANT_MXFP8 ? 1 : sizeof(float); }

/* One quantized copy in host memory, as the library takes it. */
typedef struct qcopy {
    uint8_t *data;
    void *scales;
    int64_t dshape[3], sshape[3];
    int dnd, snd;
} qcopy;

static moex_quant_tensor qtensor(const qcopy *q, const moex_quant_params *p) {
    moex_quant_tensor t;
    memset(&t, 0, sizeof t);
    t.data.data = q->data, t.data.dtype = p->fp8, t.data.ndim = q->dnd;
    t.scales.data = q->scales, t.scales.dtype = p->recipe == MOEX_QUANT_MXFP8 ? MOEX_DTYPE_E8M0 : MOEX_DTYPE_F32;
    t.scales.ndim = q->snd;
    memcpy(t.data.shape, q->dshape, sizeof q->dshape);
    memcpy(t.scales.shape, q->sshape, sizeof q->sshape);
    return t;
}

static int64_t numel(int nd, const int64_t *s) {
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= s[i];
    return n;
}

/* Rows [T, K] quantized both ways (codes of rows >= S: 0xFF, NaN in both formats), and their
 * dequantized values (rows < S; f32 values) of each orientation, back as [T, K]. */
typedef struct qrows {
    qcopy row, col;
    double *row_vals, *col_vals;
} qrows;

static qrows quantize_rows(const moex_quant_params *p, int64_t G, int64_t T, int64_t K, const int64_t *splits,
                           const double *x) {
    qrows q;
    memset(&q, 0, sizeof q);
    q.row.dnd = q.col.dnd = 2;
    q.row.dshape[0] = T, q.row.dshape[1] = K, q.col.dshape[0] = K, q.col.dshape[1] = T;
    q.row.snd = ref_quant_scales_shape(p->recipe, 0, G, T, K, q.row.sshape);
    q.col.snd = ref_quant_scales_shape(p->recipe, 1, G, T, K, q.col.sshape);
    q.row.data = (uint8_t *)tu_alloc((size_t)(T * K) + 1), q.col.data = (uint8_t *)tu_alloc((size_t)(T * K) + 1);
    memset(q.row.data, 0xFF, (size_t)(T * K) + 1), memset(q.col.data, 0xFF, (size_t)(T * K) + 1);
    q.row.scales = tu_zalloc((size_t)numel(q.row.snd, q.row.sshape) * scale_size(p->recipe) + 4);
    q.col.scales = tu_zalloc((size_t)numel(q.col.snd, q.col.sshape) * scale_size(p->recipe) + 4);
    ref_quant_out out = {.row_data = q.row.data, .row_scales = q.row.scales, .col_data = q.col.data,
                         .col_scales = q.col.scales};
    ref_group_quantize(p, G, T, K, splits, x, &out);
    q.row_vals = tu_doubles(T * K), q.col_vals = tu_doubles(T * K);
    ref_group_dequantize(p, MOEX_QUANT_ROWWISE, G, T, K, splits, q.row.data, q.row.scales, MOEX_DTYPE_F32,
                         q.row_vals);
    ref_group_dequantize(p, MOEX_QUANT_COLUMNWISE, G, T, K, splits, q.col.data, q.col.scales, MOEX_DTYPE_F32,
                         q.col_vals);
    return q;
}

/* Weights [G, N, K] quantized both ways, and each copy's dequantized values as [G, N, K]. */
static qrows quantize_weights(const moex_quant_params *p, int64_t G, int64_t N, int64_t K, const double *w) {
    qrows q;
    memset(&q, 0, sizeof q);
    q.row.dnd = q.col.dnd = 3;
    q.row.dshape[0] = q.col.dshape[0] = G;
    q.row.dshape[1] = N, q.row.dshape[2] = K, q.col.dshape[1] = K, q.col.dshape[2] = N;
    q.row.snd = ref_weight_scales_shape(p->recipe, 0, G, N, K, q.row.sshape);
    q.col.snd = ref_weight_scales_shape(p->recipe, 1, G, N, K, q.col.sshape);
    q.row.data = (uint8_t *)tu_alloc((size_t)(G * N * K) + 1), q.col.data = (uint8_t *)tu_alloc((size_t)(G * N * K) + 1);
    q.row.scales = tu_zalloc((size_t)numel(q.row.snd, q.row.sshape) * scale_size(p->recipe) + 4);
    q.col.scales = tu_zalloc((size_t)numel(q.col.snd, q.col.sshape) * scale_size(p->recipe) + 4);
    ref_quant_out out = {.row_data = q.row.data, .row_scales = q.row.scales, .col_data = q.col.data,
                         .col_scales = q.col.scales};
    ref_weight_quantize(p, G, N, K, w, &out);
    q.row_vals = tu_doubles(G * N * K), q.col_vals = tu_doubles(G * N * K);
    ref_weight_dequantize(p, MOEX_QUANT_ROWWISE, G, N, K, q.row.data, q.row.scales, MOEX_DTYPE_F32, q.row_vals);
    ref_weight_dequantize(p, MOEX_QUANT_COLUMNWISE, G, N, K, q.col.data, q.col.scales, MOEX_DTYPE_F32, q.col_vals);
    return q;
}

static void qrows_free(qrows *q) {
    free(q->row.data); free(q->row.scales); free(q->col.data); free(q->col.scales);
    free(q->row_vals); free(q->col_vals);
}

/* The tolerance of a product reducing over k on the FP8 path: f32 sums; on the GPU also the
 * Hopper tensor cores' FP8 accumulation, which keeps about 14 bits (DeepSeek-V3's
 * measurement) within each 128-deep partial sum before it is added in f32: 2^-13 of the
 * magnitude bound. */
static ref_tol_model fp8_tol(moex_dtype out, int64_t k) {
    ref_tol_model m = ref_tol_for(out, MOEX_DTYPE_F32, 0, k + 1);
#ifdef TFP8_GPU
    m.u_mid = ldexp(1.0, -13);
#endif
    return m;
}

typedef struct fp8_case {
    int64_t G, T, K, N;
    const int64_t *splits;      /* NULL: tu_make_splits(kind, rows) */
    tu_splits_kind kind;
    int64_t rows;
    moex_quant_recipe xr, wr;   /* the rows' and the weights' recipes */
    moex_dtype ydt;
    moex_bias_mode mode;
    moex_grad_mode dw_mode;
    moex_dtype dwdt;            /* dW's dtype: f32 (the default), or bf16 / f16 (WRITE) */
    int bias_off;               /* the bias this many elements into its buffer: off 16-byte alignment */
} fp8_case;

static void run_case(moex_context *ctx, tu_rng *r, const fp8_case *c) {
    const int64_t G = c->G, T = c->T, K = c->K, N = c->N;
    int64_t *splits = (int64_t *)tu_alloc((size_t)G * sizeof(int64_t));
    if (c->splits) memcpy(splits, c->splits, (size_t)G * sizeof(int64_t));
    else tu_make_splits(r, c->kind, G, c->rows, splits);
    int64_t S = 0;
    for (int64_t g = 0; g < G; g++) S += splits[g];
    char label[200];
    snprintf(label, sizeof label, "G=%lld T=%lld S=%lld K=%lld N=%lld recipes %d/%d y %s bias %d (+%d) dw %s %s",
             (long long)G, (long long)T, (long long)S, (long long)K, (long long)N, (int)c->xr, (int)c->wr,
             dt_name(c->ydt), (int)c->mode, c->bias_off, c->dw_mode == MOEX_GRAD_ACCUMULATE ? "acc" : "write",
             dt_name(c->dwdt));
    tu_log("case %s\n", label);
    const int failures_before = tu_failures();

    double *x = tu_doubles(T * K), *w = tu_doubles(G * N * K), *dy = tu_doubles(T * N);
    double *bias = tu_doubles(G * N), *probs = tu_doubles(T);
    tu_fill_uniform(r, x, S * K, -2, 2, MOEX_DTYPE_F32);
    tu_fill_uniform(r, w, G * N * K, -0.5, 0.5, MOEX_DTYPE_F32);
    tu_fill_uniform(r, dy, S * N, -1, 1, MOEX_DTYPE_F32);
    const moex_dtype bdt = c->mode == MOEX_BIAS_SCALED ? c->ydt : MOEX_DTYPE_F32;
    tu_fill_uniform(r, bias, G * N, -1, 1, bdt);
    tu_fill_uniform(r, probs, S, 0.05, 1, MOEX_DTYPE_F32);
    const moex_quant_params xp = params_of(c->xr, MOEX_DTYPE_E4M3), wp = params_of(c->wr, MOEX_DTYPE_E4M3);
    const moex_quant_params gp = params_of(c->xr, MOEX_DTYPE_E5M2);   /* the gradient dy */
    qrows xq = quantize_rows(&xp, G, T, K, splits, x), dyq = quantize_rows(&gp, G, T, N, splits, dy);
    qrows wq = quantize_weights(&wp, G, N, K, w);
    const size_t bes = moex_dtype_size(bdt), boff = (size_t)c->bias_off * bes;
    void *bias_buf = tu_alloc((size_t)(G * N) * bes + boff), *bias_vals = tu_buffer(bdt, bias, G * N);
    memcpy((char *)bias_buf + boff, bias_vals, (size_t)(G * N) * bes);
    free(bias_vals);
    void *bb = (char *)bias_buf + boff, *pb = tu_buffer_rows(MOEX_DTYPE_F32, probs, S, T, 1);
    const moex_tensor splits_t = moex_tensor_1d(splits, MOEX_DTYPE_I64, G);
    char what[300];
    size_t bytes = 0;
    void *ws;

    /* ---- forward: y = x W^T (+ bias) ---- */
    void *yb = tu_poisoned(c->ydt, T * N);
    moex_grouped_linear_fp8_args fa;
    memset(&fa, 0, sizeof fa);
    fa.x_params = xp, fa.x = qtensor(&xq.row, &xp);
    fa.w_params = wp, fa.w = qtensor(&wq.row, &wp);
    fa.splits = splits_t;
    fa.bias_mode = c->mode;
    if (c->mode != MOEX_BIAS_NONE) fa.bias = moex_tensor_2d(bb, bdt, G, N);
    if (c->mode == MOEX_BIAS_SCALED) fa.probs = moex_tensor_1d(pb, MOEX_DTYPE_F32, T);
    fa.y = moex_tensor_2d(yb, c->ydt, T, N);
    CHECK_STATUS(ctx, moex_grouped_linear_fp8_forward_workspace_size(ctx, &fa, &bytes), MOEX_OK);
#ifdef TFP8_GPU   /* the Hopper kernel's cases run it: no f32 copies of the operands */
    const int hopper = (c->wr == MOEX_QUANT_GROUP || c->wr == MOEX_QUANT_BLOCK) && K % 16 == 0 && N % 8 == 0 &&
                       c->ydt != MOEX_DTYPE_F32;
    CHECK_MSG(!hopper || bytes < (size_t)(T * K * 4), "fp8 forward: %zu bytes of workspace: not the FP8 kernel [%s]",
              bytes, label);
#endif
    ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_grouped_linear_fp8_forward(ctx, &fa, ws, bytes, NULL), MOEX_OK);
    free(ws);
    double *y = tu_doubles(T * N), *yd = tu_doubles(T * N);
    ref_grouped_linear_forward(G, T, K, N, splits, xq.row_vals, wq.row_vals, c->mode, bias, probs, y, yd);
    ref_tol_model m = fp8_tol(c->ydt, K);
    snprintf(what, sizeof what, "fp8 forward y [%s]", label);
    note(CHECK_CLOSE(what, c->ydt, yb, y, yd, S * N, N, &m));
    CHECK_POISONED("fp8 forward: y tail rows", c->ydt, yb, S * N, T * N);

    /* ---- backward data: dx = dy W, the forward with the weights' columnwise copy ---- */
    void *dxb = tu_poisoned(c->ydt, T * K);
    moex_grouped_linear_fp8_args da;
    memset(&da, 0, sizeof da);
    da.x_params = gp, da.x = qtensor(&dyq.row, &gp);
    da.w_params = wp, da.w = qtensor(&wq.col, &wp);
    da.splits = splits_t;
    da.y = moex_tensor_2d(dxb, c->ydt, T, K);
    CHECK_STATUS(ctx, moex_grouped_linear_fp8_forward_workspace_size(ctx, &da, &bytes), MOEX_OK);
    ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_grouped_linear_fp8_forward(ctx, &da, ws, bytes, NULL), MOEX_OK);
    free(ws);
    double *dx = tu_doubles(T * K), *dxd = tu_doubles(T * K);
    ref_grouped_linear_backward_data(G, T, K, N, splits, dyq.row_vals, wq.col_vals, MOEX_BIAS_NONE, NULL, NULL, dx,
                                     dxd, NULL, NULL, NULL, NULL);
    m = fp8_tol(c->ydt, N);
    snprintf(what, sizeof what, "fp8 backward data dx [%s]", label);
    note(CHECK_CLOSE(what, c->ydt, dxb, dx, dxd, S * K, K, &m));
    CHECK_POISONED("fp8 backward data: dx tail rows", c->ydt, dxb, S * K, T * K);

    /* ---- backward weight: dW = dy^T x from the columnwise copies ---- */
    const int acc = c->dw_mode == MOEX_GRAD_ACCUMULATE;
    double *dw0 = tu_doubles(G * N * K);
    tu_fill_uniform(r, dw0, G * N * K, -1, 1, MOEX_DTYPE_F32);
    void *dwb = acc ? tu_buffer(MOEX_DTYPE_F32, dw0, G * N * K) : tu_poisoned(MOEX_DTYPE_F32, G * N * K);
    moex_grouped_linear_fp8_wgrad_args wa;
    memset(&wa, 0, sizeof wa);
    wa.dy_params = gp, wa.dy = qtensor(&dyq.col, &gp);
    wa.x_params = xp, wa.x = qtensor(&xq.col, &xp);
    wa.splits = splits_t;
    wa.dw_mode = c->dw_mode;
    wa.dw = moex_weight_packed(moex_tensor_3d(dwb, MOEX_DTYPE_F32, G, N, K));
    CHECK_STATUS(ctx, moex_grouped_linear_fp8_backward_weight_workspace_size(ctx, &wa, &bytes), MOEX_OK);
#ifdef TFP8_GPU   /* the Hopper kernel's cases run it: no f32 copies of the operands */
    const int hopper_w = c->xr != MOEX_QUANT_MXFP8 && K % 8 == 0 && N % 8 == 0 && T % 16 == 0;
    CHECK_MSG(!hopper_w || bytes < (size_t)(T * K * 4),
              "fp8 backward weight: %zu bytes of workspace: not the FP8 kernel [%s]", bytes, label);
#endif
    ws = tu_workspace(bytes);
    CHECK_STATUS(ctx, moex_grouped_linear_fp8_backward_weight(ctx, &wa, ws, bytes, NULL), MOEX_OK);
    free(ws);
    double *dw = tu_doubles(G * N * K), *dwd = tu_doubles(G * N * K);
    ref_grouped_linear_backward_weight(G, T, K, N, splits, xq.col_vals, dyq.col_vals, dw, dwd);
    for (int64_t i = 0; acc && i < G * N * K; i++) dw[i] += dw0[i], dwd[i] += fabs(dw0[i]);
    m = fp8_tol(MOEX_DTYPE_F32, S);
    snprintf(what, sizeof what, "fp8 backward weight dW [%s]", label);
    note(CHECK_CLOSE(what, MOEX_DTYPE_F32, dwb, dw, dwd, G * N * K, K, &m));
    if (c->dwdt != MOEX_DTYPE_F32) {
        /* a 16-bit dW (WRITE): the f32 dW above rounded once, bit for bit, and no f32 copy of
         * dW in the workspace where the FP8 kernel runs */
        void *dwh = tu_poisoned(c->dwdt, G * N * K);
        wa.dw = moex_weight_packed(moex_tensor_3d(dwh, c->dwdt, G, N, K));
        CHECK_STATUS(ctx, moex_grouped_linear_fp8_backward_weight_workspace_size(ctx, &wa, &bytes), MOEX_OK);
#ifdef TFP8_GPU
        CHECK_MSG(!hopper_w || bytes < (size_t)(G * N * K * 4),
                  "fp8 backward weight into %s: %zu bytes of workspace: an f32 dW copy [%s]", dt_name(c->dwdt), bytes,
                  label);
#endif
        ws = tu_workspace(bytes);
        CHECK_STATUS(ctx, moex_grouped_linear_fp8_backward_weight(ctx, &wa, ws, bytes, NULL), MOEX_OK);
        free(ws);
        double *f = tu_read(MOEX_DTYPE_F32, dwb, G * N * K);
        void *want = tu_buffer(c->dwdt, f, G * N * K);
        CHECK_MSG(memcmp(dwh, want, (size_t)(G * N * K) * 2) == 0,
                  "fp8 backward weight into %s: not the f32 dW rounded once [%s]", dt_name(c->dwdt), label);
        /* the same into a discrete dW (G matrices; on Hopper the FP8 kernel's sums go through
         * an f32 copy in the workspace, then the copy kernel) */
        tu_weight dd = tu_weight_make(c->dwdt, G, N, K, NULL, 1);
        wa.dw = dd.w;
        CHECK_STATUS(ctx, moex_grouped_linear_fp8_backward_weight_workspace_size(ctx, &wa, &bytes), MOEX_OK);
        ws = tu_workspace(bytes);
        CHECK_STATUS(ctx, moex_grouped_linear_fp8_backward_weight(ctx, &wa, ws, bytes, NULL), MOEX_OK);
        free(ws);
        double *got = tu_doubles(G * N * K), *wantd = tu_read(c->dwdt, want, G * N * K);
        tu_weight_read(&dd, got);
        CHECK_MSG(memcmp(got, wantd, (size_t)(G * N * K) * sizeof(double)) == 0,
                  "fp8 backward weight into a discrete %s dW: not the f32 dW rounded once [%s]", dt_name(c->dwdt),
                  label);
        tu_weight_free(&dd);
        free(f), free(want), free(dwh), free(got), free(wantd);
    }
    if (tu_failures() != failures_before) printf("  (failures above: case %s)\n", label);

    qrows_free(&xq), qrows_free(&dyq), qrows_free(&wq);
    free(splits); free(x); free(w); free(dy); free(bias); free(probs); free(bias_buf); free(pb);
    free(yb); free(y); free(yd); free(dxb); free(dx); free(dxd); free(dw0); free(dwb); free(dw); free(dwd);
}

/* Bad arguments: each refused with a message naming the culprit. */
static void check_refusals(moex_context *ctx, tu_rng *r) {
    const int64_t G = 2, T = 40, K = 48, N = 24, splits[2] = {20, 17};
    double *x = tu_doubles(T * K), *w = tu_doubles(G * N * K);
    tu_fill_uniform(r, x, T * K, -1, 1, MOEX_DTYPE_F32);
    tu_fill_uniform(r, w, G * N * K, -1, 1, MOEX_DTYPE_F32);
    const moex_quant_params bp = params_of(MOEX_QUANT_BLOCK, MOEX_DTYPE_E4M3);
    const moex_quant_params gp = params_of(MOEX_QUANT_GROUP, MOEX_DTYPE_E4M3);
    qrows xb = quantize_rows(&bp, G, T, K, splits, x), wb = quantize_weights(&bp, G, N, K, w);
    qrows wg = quantize_weights(&gp, G, N, K, w);
    void *yb = tu_poisoned(MOEX_DTYPE_BF16, T * N), *dwb = tu_poisoned(MOEX_DTYPE_BF16, G * N * K);
    char ws[256];
    moex_grouped_linear_fp8_args base, a;
    memset(&base, 0, sizeof base);
    base.x_params = bp, base.x = qtensor(&xb.row, &bp);
    base.w_params = bp, base.w = qtensor(&wb.row, &bp);
    base.splits = moex_tensor_1d((void *)splits, MOEX_DTYPE_I64, G);
    base.y = moex_tensor_2d(yb, MOEX_DTYPE_BF16, T, N);
#ifndef TFP8_GPU   /* (the GPU mirror brings its own workspace) */
    a = base;
    CHECK_STATUS(ctx, moex_grouped_linear_fp8_forward(ctx, &a, ws, 0, NULL), MOEX_ERR_INVALID_ARG);   /* workspace */
#endif
    a = base, a.w_params = gp, a.w = qtensor(&wg.row, &gp);
    CHECK_REFUSED(ctx, moex_grouped_linear_fp8_forward(ctx, &a, ws, sizeof ws, NULL), "recipe", "pair");
    a = base, a.w_params.recipe = MOEX_QUANT_TENSOR;
    CHECK_REFUSED(ctx, moex_grouped_linear_fp8_forward(ctx, &a, ws, sizeof ws, NULL), "TENSOR", NULL);
    a = base, a.x.data.dtype = MOEX_DTYPE_E5M2;
    CHECK_REFUSED(ctx, moex_grouped_linear_fp8_forward(ctx, &a, ws, sizeof ws, NULL), "x.data", NULL);
    a = base, a.x.data.dtype = MOEX_DTYPE_BF16;
    CHECK_REFUSED(ctx, moex_grouped_linear_fp8_forward(ctx, &a, ws, sizeof ws, NULL), "x.data", NULL);
    a = base, a.y.shape[1] = N + 1;
    CHECK_REFUSED(ctx, moex_grouped_linear_fp8_forward(ctx, &a, ws, sizeof ws, NULL), "y", NULL);
    a = base, a.w.data.shape[2] = K - 1;
    CHECK_REFUSED(ctx, moex_grouped_linear_fp8_forward(ctx, &a, ws, sizeof ws, NULL), "w.data", NULL);
    a = base, a.w.scales.shape[1] += 1;
    CHECK_REFUSED(ctx, moex_grouped_linear_fp8_forward(ctx, &a, ws, sizeof ws, NULL), "w.scales", NULL);
    float probs[40] = {0};   /* probs without the scaled bias (tests/fuzz finding fp8-1) */
    a = base, a.probs = moex_tensor_1d(probs, MOEX_DTYPE_F32, T);
    CHECK_REFUSED(ctx, moex_grouped_linear_fp8_forward(ctx, &a, ws, sizeof ws, NULL), "probs", "SCALED");
    size_t qbytes = 0;
    CHECK_STATUS(ctx, moex_grouped_linear_fp8_forward_workspace_size(ctx, &a, &qbytes), MOEX_ERR_INVALID_ARG);
    CHECK_POISONED("refused fp8 forwards: y untouched", MOEX_DTYPE_BF16, yb, 0, T * N);

    moex_grouped_linear_fp8_wgrad_args wa;
    memset(&wa, 0, sizeof wa);
    wa.dy_params = bp, wa.x_params = bp;
    qrows dyb = quantize_rows(&bp, G, T, N, splits, w);   /* any values of T x N */
    wa.dy = qtensor(&dyb.col, &bp), wa.x = qtensor(&xb.col, &bp);
    wa.splits = base.splits;
    wa.dw = moex_weight_packed(moex_tensor_3d(dwb, MOEX_DTYPE_BF16, G, N, K));
    wa.dw_mode = MOEX_GRAD_ACCUMULATE;   /* += into 16 bits */
    CHECK_REFUSED(ctx, moex_grouped_linear_fp8_backward_weight(ctx, &wa, ws, sizeof ws, NULL), "dw", "f32");
    wa.dw_mode = MOEX_GRAD_WRITE, wa.dw.t.dtype = MOEX_DTYPE_I32;
    CHECK_REFUSED(ctx, moex_grouped_linear_fp8_backward_weight(ctx, &wa, ws, sizeof ws, NULL), "dw", NULL);
    wa.dw.t.dtype = MOEX_DTYPE_BF16;
    const moex_weight dw_given = wa.dw;
    memset(&wa.dw, 0, sizeof wa.dw);   /* absent */
    CHECK_REFUSED(ctx, moex_grouped_linear_fp8_backward_weight(ctx, &wa, ws, sizeof ws, NULL), "dw is required", NULL);
    wa.dw = dw_given;
    wa.dw.t.dtype = MOEX_DTYPE_F32, wa.x_params = gp;
    CHECK_REFUSED(ctx, moex_grouped_linear_fp8_backward_weight(ctx, &wa, ws, sizeof ws, NULL), "x.scales", NULL);
    CHECK_POISONED("refused fp8 backward weights: dw untouched", MOEX_DTYPE_BF16, dwb, 0, G * N * K);

    qrows_free(&xb), qrows_free(&wb), qrows_free(&wg), qrows_free(&dyb);
    free(x); free(w); free(yb); free(dwb);
}

int main(void) {
    moex_context *ctx = tu_cpu_context();
    tu_rng r = tu_rng_seed(4242);
    static const int64_t classes[6] = {0, 1, 63, 64, 65, 129};   /* sum 322 */
    static const moex_quant_recipe xr[4] = {MOEX_QUANT_BLOCK, MOEX_QUANT_GROUP, MOEX_QUANT_TENSOR, MOEX_QUANT_MXFP8};
    static const moex_quant_recipe wr[4] = {MOEX_QUANT_BLOCK, MOEX_QUANT_GROUP, MOEX_QUANT_GROUP, MOEX_QUANT_MXFP8};
    static const moex_dtype ydts[3] = {MOEX_DTYPE_BF16, MOEX_DTYPE_F32, MOEX_DTYPE_F16};
    int n = 0;
    for (int i = 0; i < 4; i++) {
        const moex_bias_mode mode = (moex_bias_mode)(i % 3);
        const moex_grad_mode acc = (moex_grad_mode)(i % 2);
        /* the row classes, K and N past one 128 block and not multiples of 32 */
        const fp8_case a = {.G = 6, .T = 330, .K = 200, .N = 136, .splits = classes, .xr = xr[i], .wr = wr[i],
                            .ydt = ydts[i % 3], .mode = mode, .dw_mode = acc};
        /* one group, small odd sizes */
        const fp8_case b = {.G = 1, .T = 77, .K = 33, .N = 40, .kind = TU_SPLITS_BALANCED, .rows = 70, .xr = xr[i],
                            .wr = wr[i], .ydt = ydts[(i + 1) % 3], .mode = (moex_bias_mode)((i + 1) % 3),
                            .dw_mode = (moex_grad_mode)!acc,
                            .dwdt = !acc ? MOEX_DTYPE_F32 : i < 2 ? MOEX_DTYPE_BF16 : MOEX_DTYPE_F16};
        /* G = 256, most groups empty or tiny */
        const fp8_case e = {.G = 256, .T = 304, .K = 64, .N = 48, .kind = TU_SPLITS_SKEWED, .rows = 290, .xr = xr[i],
                            .wr = wr[i], .ydt = ydts[(i + 2) % 3], .mode = (moex_bias_mode)((i + 2) % 3),
                            .dw_mode = acc};
        run_case(ctx, &r, &a), run_case(ctx, &r, &b), run_case(ctx, &r, &e);
        n += 3;
    }
    /* current scaling, K and N multiples of 16 (both products), bias ADD (f32), SCALED (y's
     * dtype) and none: on Hopper the FP8 kernel (128 x 128 tiles, 128-deep stages, clusters
     * from K 2560 on); several stages and a k tail */
    {
        const fp8_case a = {.G = 6, .T = 336, .K = 272, .N = 208, .splits = classes, .xr = MOEX_QUANT_GROUP,
                            .wr = MOEX_QUANT_GROUP, .ydt = MOEX_DTYPE_BF16, .mode = MOEX_BIAS_ADD,
                            .dw_mode = MOEX_GRAD_WRITE, .dwdt = MOEX_DTYPE_BF16};
        const fp8_case b = {.G = 6, .T = 336, .K = 1040, .N = 400, .splits = classes, .xr = MOEX_QUANT_TENSOR,
                            .wr = MOEX_QUANT_GROUP, .ydt = MOEX_DTYPE_F16, .mode = MOEX_BIAS_SCALED,
                            .dw_mode = MOEX_GRAD_ACCUMULATE};
        const fp8_case e = {.G = 3, .T = 1008, .K = 512, .N = 256, .kind = TU_SPLITS_RANDOM, .rows = 990,
                            .xr = MOEX_QUANT_GROUP, .wr = MOEX_QUANT_GROUP, .ydt = MOEX_DTYPE_BF16,
                            .mode = MOEX_BIAS_NONE, .dw_mode = MOEX_GRAD_WRITE, .dwdt = MOEX_DTYPE_F16};
        /* K >= 2560: 2-CTA clusters (row pairs; odd last row tiles as column pairs) */
        const fp8_case f = {.G = 3, .T = 704, .K = 2704, .N = 264, .kind = TU_SPLITS_RANDOM, .rows = 690,
                            .xr = MOEX_QUANT_GROUP, .wr = MOEX_QUANT_GROUP, .ydt = MOEX_DTYPE_BF16,
                            .mode = MOEX_BIAS_NONE, .dw_mode = MOEX_GRAD_WRITE};
        run_case(ctx, &r, &a), run_case(ctx, &r, &b), run_case(ctx, &r, &e), run_case(ctx, &r, &f);
        /* biases one element off 16-byte alignment (f32 ADD: off its pairs' 8 bytes; bf16 SCALED:
         * off 4), on Hopper fetched by plain loads */
        fp8_case ao = a, bo = b;
        ao.bias_off = 1, bo.bias_off = 1, bo.ydt = MOEX_DTYPE_BF16, bo.xr = bo.wr = MOEX_QUANT_BLOCK;
        run_case(ctx, &r, &ao), run_case(ctx, &r, &bo);
        n += 2;
        /* clusters, the last group's odd last row tile as a column pair whose second tile lies
         * past N (its BLOCK weight scales must not be read past the last group's) */
        static const int64_t two[2] = {256, 100};
        const fp8_case h = {.G = 2, .T = 368, .K = 2576, .N = 264, .splits = two, .xr = MOEX_QUANT_BLOCK,
                            .wr = MOEX_QUANT_BLOCK, .ydt = MOEX_DTYPE_BF16, .mode = MOEX_BIAS_NONE,
                            .dw_mode = MOEX_GRAD_WRITE};
        run_case(ctx, &r, &h);
        n += 1;
        /* the same with BLOCK scaling (1x128 rows, 128x128 weight blocks) */
        fp8_case ab = a, bb = b, eb = e, fb = f;
        ab.xr = ab.wr = bb.xr = bb.wr = eb.xr = eb.wr = fb.xr = fb.wr = MOEX_QUANT_BLOCK;
        run_case(ctx, &r, &ab), run_case(ctx, &r, &bb), run_case(ctx, &r, &eb), run_case(ctx, &r, &fb);
        n += 8;
    }
    check_refusals(ctx, &r);
    printf("%d cases, worst err/tol %.3g\n", n, worst_seen);
    moex_context_destroy(ctx);
    return tu_finish();
}
