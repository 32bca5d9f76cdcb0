/*
 * fp8_linear.c - the grouped linear on FP8 operands (experimental): validation and its
 * composition from the backend primitives (the math: docs/ops.md section 9.10).
 *
 * forward:          the backend's FP8 kernels where it has them for the args (linear_fp8:
 *                   on Hopper, current or block scaling), else
 *                   xf = dequantize(x) [T, K] f32, wf = weight_dequantize(w) [G, N, K] f32,
 *                   y = xf wf_g^T (+ b_g | + p_i b_g) by linear_fwd in f32, into y when y
 *                   is f32, else into yf [T, N] f32 and then cast_rows into y
 * backward weight:  the backend's FP8 kernels where it has them for the args
 *                   (linear_fp8_wgrad: on Hopper, current or block scaling), else
 *                   dyf [T, N], xf [T, K] = the columnwise copies dequantized (back to rows),
 *                   dW = dyf_g^T xf_g by linear_wgrad in f32, into dW when it is f32, else
 *                   into dwf [G, N, K] f32 and then weight_copy into dW (WRITE); a dW the
 *                   FP8 kernels cannot write (discrete, 16-bit where they write f32 only)
 *                   takes their f32 sums through dwf too (wgrad_layout)
 * Every operand value is its dequantization, so the result is the product of those values
 * up to f32 rounding: the reference the FP8 GEMM kernels keep. The groups are prepared once;
 * rows >= sum(splits) are neither read nor written (the dequantize writes rows < S only, and
 * nothing reads past them).
 *
 * Workspace: the prepared handle, the f32 operands (and yf, dwf), one region shared by the
 * steps.
 * The two runs open alike (their layout, the groups, the backend's FP8 kernels where it has
 * them), each a plain definition of its op (op.h): their shapes repeat by design.
 *
 * The grouped linear's and the grouped MLP's plans in FP8 precision run these two ops (their
 * ws and run, on validated args) as their FP8 GEMMs: grouped_linear.c's moex_gl_fwd,
 * moex_gl_dgrad and moex_gl_wgrad.
 */
#include "op.h"

#define MOEX_DT_FP8 (MOEX_DT(MOEX_DTYPE_E4M3) | MOEX_DT(MOEX_DTYPE_E5M2))

/* The recipes of the two operands pair as block with block (BLOCK: 1x128 rows, 128x128
 * weights; MXFP8 with MXFP8) or current scaling with current scaling (TENSOR or GROUP). */
static moex_status check_pairing(moex_context *ctx, const char *op, const char *an, moex_quant_recipe a,
                                 const char *bn, moex_quant_recipe b) {
    const bool current_a = a == MOEX_QUANT_TENSOR || a == MOEX_QUANT_GROUP;
    const bool current_b = b == MOEX_QUANT_TENSOR || b == MOEX_QUANT_GROUP;
    if (current_a && current_b) return MOEX_OK;
    if (a == b) return MOEX_OK;
    return moex_fail(ctx, MOEX_ERR_INVALID_ARG,
                     "%s: %s.recipe %d does not pair with %s.recipe %d (BLOCK with BLOCK, MXFP8 with MXFP8, "
                     "TENSOR or GROUP with GROUP)",
                     op, an, (int)a, bn, (int)b);
}

static moex_quant_dims quant_dims(int64_t G, int64_t T, int64_t K) {
    moex_quant_dims q = {G, T, K, MOEX_DTYPE_F32, 0, 0, 0};
    return q;
}

/* The splits (*G groups), then the FP8 data of the two operands: a [., .] and b of nb dims. */
static moex_status check_operands(moex_context *ctx, const char *op, const moex_tensor *splits, const char *an,
                                  const moex_tensor *a, const char *bn, const moex_tensor *b, int nb, int64_t *G) {
    const int64_t any[3] = {-1, -1, -1};
    MOEX_TRY(moex_check_splits_arg(ctx, op, splits, G));
    MOEX_TRY(moex_check_tensor(ctx, op, an, a, 2, any, MOEX_DT_FP8));
    return moex_check_tensor(ctx, op, bn, b, nb, any, MOEX_DT_FP8);
}

/* ---- forward ------------------------------------------------------------------------- */

moex_status moex_op_grouped_linear_fp8_forward_validate(moex_context *ctx, const char *op,
                                                        const moex_grouped_linear_fp8_args *a, moex_purpose p,
                                                        moex_fp8_dims *d) {
    int64_t G;
    MOEX_TRY(check_operands(ctx, op, &a->splits, "x.data", &a->x.data, "w.data", &a->w.data, 3, &G));
    const int64_t T = a->x.data.shape[0], K = a->x.data.shape[1], N = a->w.data.shape[1];
    MOEX_TRY(moex_check_features(ctx, op, K, N));
    d->a = quant_dims(G, T, K);
    MOEX_TRY(moex_quant_check_rows_input(ctx, op, "x.data", "x.scales", &a->x_params, &a->x, MOEX_QUANT_ROWWISE,
                                         &d->a));
    d->b = quant_dims(G, N, K);
    MOEX_TRY(moex_quant_check_weight_input(ctx, op, "w.data", "w.scales", &a->w_params, &a->w, &d->b));
    MOEX_TRY(check_pairing(ctx, op, "x_params", a->x_params.recipe, "w_params", a->w_params.recipe));
    const int64_t yshape[2] = {T, N};
    MOEX_TRY(moex_check_output(ctx, op, "y", &a->y, 2, yshape, MOEX_DT_FLOAT));
    const moex_gl_dims gl = {G, T, K, N, a->y.dtype};
    d->gl = gl;
    MOEX_TRY(moex_check_probs_scaled(ctx, op, a->bias_mode, &a->probs));
    return moex_check_bias(ctx, op, a->bias_mode, &a->bias, "bias", &a->probs, G, T, N, a->y.dtype, true);
}

/* The steps' arguments, given the f32 buffers (NULL when only sizes matter). */
typedef struct fwd_calls {
    moex_group_dequantize_args x;
    moex_weight_dequantize_args w;
    moex_grouped_linear_args linear;
    moex_gl_dims linear_dims;      /* the f32 product */
    moex_cast_rows_args cast;
} fwd_calls;

static void fwd_calls_of(const moex_grouped_linear_fp8_args *a, const moex_fp8_dims *d, void *xf, void *wf,
                         void *yf, fwd_calls *c) {
    const moex_gl_dims *g = &d->gl;
    const moex_tensor xt = moex_tensor_2d(xf, MOEX_DTYPE_F32, g->T, g->K);
    const moex_tensor wt = moex_tensor_3d(wf, MOEX_DTYPE_F32, g->G, g->N, g->K);
    c->x = (moex_group_dequantize_args){.params = a->x_params, .orientation = MOEX_QUANT_ROWWISE, .src = a->x,
                                        .splits = a->splits, .y = xt};
    c->w = (moex_weight_dequantize_args){.params = a->w_params, .orientation = MOEX_QUANT_ROWWISE, .src = a->w,
                                         .w = wt};
    c->linear = (moex_grouped_linear_args){
        .x = xt, .w = moex_weight_packed(wt), .bias_mode = a->bias_mode, .bias = a->bias, .probs = a->probs,
        .splits = a->splits,
        .y = g->dt == MOEX_DTYPE_F32 ? a->y : moex_tensor_2d(yf, MOEX_DTYPE_F32, g->T, g->N)};
    c->linear_dims = *g;
    c->linear_dims.dt = MOEX_DTYPE_F32;
    c->cast = (moex_cast_rows_args){.src = (const float *)yf, .dst = a->y};
}

/* The workspace: the handle, the f32 operands where the composition dequantizes (forward:
 * xf, wf, and yf when y is not f32; backward weight: dyf, xf, and dwf when dW is not f32;
 * bytes 0: none), the steps' region; fast: the backend's FP8 kernels run the op (no
 * buffers). */
typedef struct fp8_layout {
    void *groups, *buf[3], *sub;
    size_t total;
    bool fast;
    bool copy;   /* backward weight: the sums go to buf[2] (dwf), then weight_copy into dW */
} fp8_layout;

static fp8_layout layout_of(moex_context *ctx, int64_t G, int64_t T, bool fast, const size_t bytes[3], size_t sub,
                            void *ws) {
    moex_carver c = {(char *)ws, 0};
    fp8_layout l;
    l.groups = moex_take(&c, moex_ops(ctx)->groups_ws(ctx, G, T, NULL));
    for (int k = 0; k < 3; k++) l.buf[k] = bytes[k] ? moex_take(&c, bytes[k]) : NULL;
    l.sub = moex_take(&c, sub);
    l.total = c.used;
    l.fast = fast;
    l.copy = false;
    return l;
}

static const size_t no_buffers[3] = {0, 0, 0};

static fp8_layout fwd_layout(moex_context *ctx, const moex_grouped_linear_fp8_args *a, const moex_fp8_dims *d,
                             void *ws) {
    const moex_backend_ops *ops = moex_ops(ctx);
    const moex_gl_dims *g = &d->gl;
    const size_t fast = ops->linear_fp8_ws ? ops->linear_fp8_ws(ctx, a, d) : SIZE_MAX;   /* its own kernels */
    if (fast != SIZE_MAX) return layout_of(ctx, g->G, g->T, true, no_buffers, fast, ws);
    fwd_calls c;
    fwd_calls_of(a, d, NULL, NULL, NULL, &c);
    size_t sub = ops->dequantize_ws(ctx, &c.x, &d->a);
    sub = moex_sz_max(sub, ops->weight_dequantize_ws(ctx, &c.w, &d->b));
    sub = moex_sz_max(sub, ops->linear_fwd_ws(ctx, &c.linear, &c.linear_dims));
    sub = moex_sz_max(sub, ops->cast_rows_ws(ctx, &c.cast, g));
    const size_t bytes[3] = {moex_sz_bytes(g->T, g->K, sizeof(float)),
                             moex_sz_mul(moex_sz_bytes(g->G, g->N, sizeof(float)), (size_t)g->K),
                             g->dt == MOEX_DTYPE_F32 ? 0 : moex_sz_bytes(g->T, g->N, sizeof(float))};
    return layout_of(ctx, g->G, g->T, false, bytes, sub, ws);
}

size_t moex_op_grouped_linear_fp8_forward_ws(moex_context *ctx, const moex_grouped_linear_fp8_args *a,
                                             const moex_fp8_dims *d) {
    return fwd_layout(ctx, a, d, NULL).total;
}

moex_status moex_op_grouped_linear_fp8_forward_run(moex_context *ctx, const moex_call *c,
                                                   const moex_grouped_linear_fp8_args *a, const moex_fp8_dims *d,
                                                   void *ws) {
    const moex_backend_ops *ops = moex_ops(ctx);
    const fp8_layout l = fwd_layout(ctx, a, d, ws);
    moex_groups g;
    MOEX_TRY(moex_begin_groups(ctx, c, &a->splits, d->gl.T, NULL, l.groups, &g));
    if (l.fast) return ops->linear_fp8(ctx, c, &g, a, d, l.sub);
    fwd_calls k;
    fwd_calls_of(a, d, l.buf[0], l.buf[1], l.buf[2], &k);
    MOEX_TRY(ops->dequantize(ctx, c, &g, &k.x, &d->a, l.sub));
    MOEX_TRY(ops->weight_dequantize(ctx, c, &k.w, &d->b, l.sub));
    MOEX_TRY(ops->linear_fwd(ctx, c, &g, &k.linear, &k.linear_dims, l.sub));
    return d->gl.dt == MOEX_DTYPE_F32 ? MOEX_OK : ops->cast_rows(ctx, c, &g, &k.cast, &d->gl, l.sub);
}

/* ---- backward weight ----------------------------------------------------------------- */

moex_status moex_op_grouped_linear_fp8_backward_weight_validate(moex_context *ctx, const char *op,
                                                                const moex_grouped_linear_fp8_wgrad_args *a,
                                                                moex_purpose p, moex_fp8_dims *d) {
    int64_t G;
    MOEX_TRY(check_operands(ctx, op, &a->splits, "dy.data", &a->dy.data, "x.data", &a->x.data, 2, &G));
    const int64_t N = a->dy.data.shape[0], T = a->dy.data.shape[1], K = a->x.data.shape[0];
    MOEX_TRY(moex_check_features(ctx, op, K, N));
    d->a = quant_dims(G, T, N);
    MOEX_TRY(moex_quant_check_rows_input(ctx, op, "dy.data", "dy.scales", &a->dy_params, &a->dy,
                                         MOEX_QUANT_COLUMNWISE, &d->a));
    d->b = quant_dims(G, T, K);
    MOEX_TRY(moex_quant_check_rows_input(ctx, op, "x.data", "x.scales", &a->x_params, &a->x, MOEX_QUANT_COLUMNWISE,
                                         &d->b));
    MOEX_TRY(check_pairing(ctx, op, "dy_params", a->dy_params.recipe, "x_params", a->x_params.recipe));
    MOEX_TRY(moex_check_grad_mode(ctx, op, a->dw_mode));
    if (!moex_weight_present(&a->dw)) return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "%s: dw is required", op);
    /* f32 (= or +=), or bf16 / f16 written (moex_check_dw refuses += into 16 bits) */
    const moex_dtype half = a->dw.t.dtype == MOEX_DTYPE_F16 ? MOEX_DTYPE_F16 : MOEX_DTYPE_BF16;
    MOEX_TRY(moex_check_dw(ctx, op, "dw", a->dw_mode, &a->dw, G, N, K, half));
    const moex_gl_dims gl = {G, T, K, N, MOEX_DTYPE_F32};
    d->gl = gl;
    return MOEX_OK;
}

/* The steps' arguments, given the f32 buffers; dwf: a packed f32 copy of dW, where the sums go
 * first (use_dwf) and weight_copy rounds (or copies) them into dW. */
typedef struct wgrad_calls {
    moex_grouped_linear_fp8_wgrad_args fast;   /* the backend's FP8 kernels into dwf */
    moex_group_dequantize_args dy, x;
    moex_grouped_linear_wgrad_args wgrad;
    moex_weight_copy_args copy;                /* dwf into dW */
    moex_gl_dims copy_dims;                    /* weight_copy's: G, T = N, K */
} wgrad_calls;

static void wgrad_calls_of(const moex_grouped_linear_fp8_wgrad_args *a, const moex_fp8_dims *d, void *dyf, void *xf,
                           void *dwf, bool use_dwf, wgrad_calls *c) {
    const moex_gl_dims *g = &d->gl;
    const moex_tensor dyt = moex_tensor_2d(dyf, MOEX_DTYPE_F32, g->T, g->N);
    const moex_tensor xt = moex_tensor_2d(xf, MOEX_DTYPE_F32, g->T, g->K);
    const moex_weight dw = use_dwf ? moex_weight_packed(moex_tensor_3d(dwf, MOEX_DTYPE_F32, g->G, g->N, g->K)) : a->dw;
    c->fast = *a;
    c->fast.dw = dw;
    c->dy = (moex_group_dequantize_args){.params = a->dy_params, .orientation = MOEX_QUANT_COLUMNWISE, .src = a->dy,
                                         .splits = a->splits, .y = dyt};
    c->x = (moex_group_dequantize_args){.params = a->x_params, .orientation = MOEX_QUANT_COLUMNWISE, .src = a->x,
                                        .splits = a->splits, .y = xt};
    c->wgrad = (moex_grouped_linear_wgrad_args){.x = xt, .dy = dyt, .splits = a->splits, .dw_mode = a->dw_mode,
                                                .dw = dw};
    c->copy = (moex_weight_copy_args){dw, a->dw};
    c->copy_dims = (moex_gl_dims){g->G, g->N, g->K, 0, a->dw.t.dtype};
}

/* The backward weight's route: the backend's FP8 kernels into dW (fast); else, for a dW they
 * cannot write (discrete, or 16-bit where they write f32 only) and WRITE, those kernels into
 * dwf, then weight_copy (fast and copy); else the dequantized operands' f32 product, into dW
 * when it is f32, else into dwf, then weight_copy (copy). bytes: dyf, xf, dwf. */
static fp8_layout wgrad_layout(moex_context *ctx, const moex_grouped_linear_fp8_wgrad_args *a,
                               const moex_fp8_dims *d, void *ws) {
    const moex_backend_ops *ops = moex_ops(ctx);
    const moex_gl_dims *g = &d->gl;
    const size_t dwf = moex_sz_mul(moex_sz_bytes(g->G, g->N, sizeof(float)), (size_t)g->K);
    wgrad_calls c;
    size_t fast = ops->linear_fp8_wgrad_ws ? ops->linear_fp8_wgrad_ws(ctx, a, d) : SIZE_MAX;
    if (fast != SIZE_MAX) return layout_of(ctx, g->G, g->T, true, no_buffers, fast, ws);   /* its own kernels */
    const bool packed_f32 = a->dw.ptrs == NULL && a->dw.t.dtype == MOEX_DTYPE_F32;
    if (!packed_f32 && a->dw_mode == MOEX_GRAD_WRITE && ops->linear_fp8_wgrad_ws) {
        wgrad_calls_of(a, d, NULL, NULL, NULL, true, &c);
        fast = ops->linear_fp8_wgrad_ws(ctx, &c.fast, d);
        if (fast != SIZE_MAX) {
            const size_t bytes[3] = {0, 0, dwf};
            fp8_layout l = layout_of(ctx, g->G, g->T, true, bytes,
                                     moex_sz_max(fast, ops->weight_copy_ws(ctx, &c.copy, &c.copy_dims)), ws);
            l.copy = true;
            return l;
        }
    }
    const bool use_dwf = a->dw.t.dtype != MOEX_DTYPE_F32;
    wgrad_calls_of(a, d, NULL, NULL, NULL, use_dwf, &c);
    size_t sub = ops->dequantize_ws(ctx, &c.dy, &d->a);
    sub = moex_sz_max(sub, ops->dequantize_ws(ctx, &c.x, &d->b));
    sub = moex_sz_max(sub, ops->linear_wgrad_ws(ctx, &c.wgrad, g));
    if (use_dwf) sub = moex_sz_max(sub, ops->weight_copy_ws(ctx, &c.copy, &c.copy_dims));
    const size_t bytes[3] = {moex_sz_bytes(g->T, g->N, sizeof(float)), moex_sz_bytes(g->T, g->K, sizeof(float)),
                             use_dwf ? dwf : 0};
    fp8_layout l = layout_of(ctx, g->G, g->T, false, bytes, sub, ws);
    l.copy = use_dwf;
    return l;
}

size_t moex_op_grouped_linear_fp8_backward_weight_ws(moex_context *ctx, const moex_grouped_linear_fp8_wgrad_args *a,
                                                     const moex_fp8_dims *d) {
    return wgrad_layout(ctx, a, d, NULL).total;
}

moex_status moex_op_grouped_linear_fp8_backward_weight_run(moex_context *ctx, const moex_call *c,
                                                           const moex_grouped_linear_fp8_wgrad_args *a,
                                                           const moex_fp8_dims *d, void *ws) {
    const moex_backend_ops *ops = moex_ops(ctx);
    const fp8_layout l = wgrad_layout(ctx, a, d, ws);
    moex_groups g;
    MOEX_TRY(moex_begin_groups(ctx, c, &a->splits, d->gl.T, NULL, l.groups, &g));
    if (l.fast && !l.copy) return ops->linear_fp8_wgrad(ctx, c, &g, a, d, l.sub);
    wgrad_calls k;
    wgrad_calls_of(a, d, l.buf[0], l.buf[1], l.buf[2], l.copy, &k);
    if (l.fast) {
        MOEX_TRY(ops->linear_fp8_wgrad(ctx, c, &g, &k.fast, d, l.sub));
    } else {
        MOEX_TRY(ops->dequantize(ctx, c, &g, &k.dy, &d->a, l.sub));
        MOEX_TRY(ops->dequantize(ctx, c, &g, &k.x, &d->b, l.sub));
        MOEX_TRY(ops->linear_wgrad(ctx, c, &g, &k.wgrad, &d->gl, l.sub));
    }
    return l.copy ? ops->weight_copy(ctx, c, &k.copy, &k.copy_dims, l.sub) : MOEX_OK;
}
