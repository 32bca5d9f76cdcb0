/*
 * cuda_grouped_linear.cu - the grouped linear primitives on the GPU (linear_fwd,
 * linear_dgrad, linear_wgrad and the MLP's fused fc1_glu; src/core/backend.h), on a prepared
 * device schedule: the grouped GEMM (with the bias fused in its epilogue), and the
 * deterministic dbias / dprobs reductions.
 *   forward:         y_g = x_g W_g^T (+ b_g | + p_i b_g)                       (=)
 *   backward_data:   dx_g = dy_g W_g (=), dbias_g = sum (p_i) dy_i (=),
 *                    dprobs_i += dy_i . b_g (scaled bias only)
 *   backward_weight: dW_g = dy_g^T x_g   (= or += into f32)
 * On Hopper the forward (with its bias, and for the MLP's FC1 with the scaled GLU fused), the
 * backward-data product dx = dy W and the weight gradient run on the sm_90a kernels
 * (sm90_grouped_gemm.h) when they support the shapes (discrete weights through their
 * per-group tensor maps, the caller's kept ones or in the primitive's workspace:
 * moex_cuda_weight_maps_take; the weight gradient into a packed dW); everything else runs on
 * the portable kernel
 * (sm80_grouped_gemm.cu).
 */
#include "cuda_ops.h"
#include "sm90_grouped_gemm.h"   /* moex_sm90_epilogue */

/* The workspace queries (_ws) decide on shapes, dtypes and which tensors are present, not on
 * where they are: this stands for every pointer of their args (16-byte aligned; the launches
 * check the real pointers' alignment). */
alignas(16) static const float ws_placeholder[4] = {0};

/* A workspace query's groups: G groups over T rows, the splits a stand-in. */
static moex_groups ws_groups(int64_t G, int64_t T) {
    const moex_groups g = {G, T, (const int64_t *)ws_placeholder, NULL, NULL, NULL};
    return g;
}

/* The portable kernel's product of the rows with the weights W_g [N, K] (packed or
 * discrete), in dt throughout: with b_kc, y = x W_g^T ([T, N] from x [T, K], the forward);
 * without, dx = dy W_g ([T, K] from dy [T, N], the backward data). */
static moex_cuda_gemm rows_gemm(const moex_cuda_sched *s, moex_dtype dt, int64_t K, int64_t N, const void *a,
                                const moex_weight *w, void *c, int b_kc) {
    moex_cuda_gemm g = {};
    g.kind = MOEX_CUDA_GEMM_ROWS;
    g.sched = s;
    g.ta = g.tb = g.tc = g.to = dt;
    g.n_dim = b_kc ? N : K;
    g.k_dim = b_kc ? K : N;
    g.a = a;
    g.lda = g.k_dim;
    g.b = w->t.data;
    g.b_ptrs = w->ptrs;
    g.b_gstride = N * K;
    g.ldb = K;
    g.b_kc = b_kc;
    g.c = c;
    g.ldc = g.n_dim;
    return g;
}

moex_status moex_cuda_linear_fwd_run(moex_context *ctx, const char *op, const moex_cuda_sched *s, moex_dtype dt,
                                 int64_t K, int64_t N, const void *x, const moex_weight *w, void *w_maps,
                                 moex_bias_mode bias_mode, const moex_tensor *bias, const float *probs, void *y,
                                 cudaStream_t stream) {
    moex_sm90_epilogue e = {};
    e.bias_mode = bias_mode;
    if (bias_mode != MOEX_BIAS_NONE) {
        e.bias = bias->data;
        e.bias_dtype = bias->dtype;
        e.probs = bias_mode == MOEX_BIAS_SCALED ? probs : NULL;
    }
    bool ran;
    MOEX_TRY(moex_cuda_sm90_rows(ctx, op, s, dt, K, N, x, w, w_maps, y, &e, false, stream, &ran));
    if (ran) return MOEX_OK;
    moex_cuda_gemm g = rows_gemm(s, dt, K, N, x, w, y, 1);
    if (bias_mode != MOEX_BIAS_NONE) {
        g.bias = bias->data;
        g.bias_dt = bias->dtype;
        g.bias_gstride = N;
        g.bias_scaled = bias_mode == MOEX_BIAS_SCALED;
        g.probs = probs;
    }
    return moex_cuda_gemm_run(ctx, op, &g, stream);
}

moex_status moex_cuda_linear_fwd_glu(moex_context *ctx, const char *op, const moex_cuda_sched *s, moex_dtype dt,
                                     int64_t K, int64_t F, const void *x, const moex_weight *w, const moex_tensor *bias,
                                     const moex_glu_params *glu, const float *probs, void *h, void *z,
                                     cudaStream_t stream, bool *ran) {
    moex_sm90_epilogue e = {};
    if (moex_present(bias)) {
        e.bias_mode = MOEX_BIAS_ADD;
        e.bias = bias->data;
        e.bias_dtype = bias->dtype;
    }
    e.probs = probs;
    e.glu = glu;
    e.z = z;
    return moex_cuda_sm90_rows(ctx, op, s, dt, K, 2 * F, x, w, NULL, h, &e, false, stream, ran);
}

moex_status moex_cuda_linear_dgrad_run(moex_context *ctx, const char *op, const moex_cuda_sched *s, moex_dtype dt,
                                       int64_t K, int64_t N, const void *dy, const moex_weight *w, void *w_maps,
                                       void *dx, const moex_cuda_row_grads *r, cudaStream_t stream) {
    bool ran = false;
    if (dx) MOEX_TRY(moex_cuda_sm90_rows(ctx, op, s, dt, K, N, dy, w, w_maps, dx, NULL, true, stream, &ran));
    if (dx && !ran) {
        const moex_cuda_gemm g = rows_gemm(s, dt, K, N, dy, w, dx, 0);
        MOEX_TRY(moex_cuda_gemm_run(ctx, op, &g, stream));
    }
    return moex_cuda_row_grads_run(ctx, op, s, r, stream);
}

moex_status moex_cuda_linear_wgrad_run(moex_context *ctx, const char *op, const moex_cuda_sched *s, moex_dtype dt,
                                   int64_t K, int64_t N, const void *x, const void *dy, const moex_weight *dw,
                                   moex_grad_mode mode, cudaStream_t stream) {
    bool ran;
    MOEX_TRY(moex_cuda_sm90_wgrad(ctx, op, s, dt, K, N, x, dy, dw, mode, stream, &ran));
    if (ran) return MOEX_OK;
    moex_cuda_gemm g = {};
    g.kind = MOEX_CUDA_GEMM_WGRAD;
    g.sched = s;
    g.ta = g.tb = g.tc = dt;
    g.to = dw->t.dtype;
    g.m_dim = N;
    g.n_dim = K;
    g.a = dy;
    g.lda = N;
    g.b = x;
    g.ldb = K;
    g.c = dw->t.data;
    g.c_ptrs = dw->ptrs;
    g.c_gstride = N * K;
    g.ldc = K;
    g.accumulate = mode == MOEX_GRAD_ACCUMULATE;
    return moex_cuda_gemm_run(ctx, op, &g, stream);
}

/* ---- the primitives: the building blocks above on prepared groups ------------------- */

/* Workspace: a discrete weight's tensor maps (moex_cuda_weight_maps_take). */
size_t moex_cuda_linear_fwd_ws(moex_context *ctx, const moex_grouped_linear_args *a, const moex_gl_dims *d) {
    moex_carver c = {NULL, 0};
    moex_cuda_weight_maps_take(ctx, &c, &a->w);
    return c.used;
}

moex_status moex_cuda_linear_fwd(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                 const moex_grouped_linear_args *a, const moex_gl_dims *d, void *ws) {
    moex_carver wc = {(char *)ws, 0};
    void *w_maps = moex_cuda_weight_maps_take(ctx, &wc, &a->w);
    return moex_cuda_linear_fwd_run(ctx, c->op, g, d->dt, d->K, d->N, a->x.data, &a->w, w_maps, a->bias_mode,
                                    &a->bias, (const float *)a->probs.data, a->y.data, (cudaStream_t)c->stream);
}

moex_status moex_cuda_fc1_glu(moex_context *ctx, const moex_call *c, const moex_groups *g, const moex_fc1_glu_args *a,
                              const moex_gl_dims *d, bool *ran) {
    const float *probs = moex_present(&a->probs) ? (const float *)a->probs.data : NULL;
    return moex_cuda_linear_fwd_glu(ctx, c->op, g, d->dt, d->K, d->N / 2, a->fc1.x.data, &a->fc1.w, &a->fc1.bias,
                                    &a->glu, probs, a->fc1.y.data, a->z.data, (cudaStream_t)c->stream, ran);
}

/* The bias gradients of a's dy, their workspace taken from c (base NULL: only counted; the
 * size follows which tensors are present, never their pointers, which a size query may not
 * have). */
static moex_cuda_row_grads dgrad_row_grads(const moex_grouped_linear_dgrad_args *a, const moex_gl_dims *d,
                                           moex_carver *c) {
    const bool scaled = a->bias_mode == MOEX_BIAS_SCALED;
    const bool dbias = moex_present(&a->dbias) && a->bias_mode != MOEX_BIAS_NONE;
    const bool dprobs = moex_present(&a->dprobs) && scaled;
    moex_cuda_row_grads r = {};
    r.src = a->dy.data, r.dt = d->dt, r.N = d->N;
    if (dbias) {
        r.dbias = a->dbias.data, r.dbias_dt = a->dbias.dtype;
        r.probs = scaled ? (const float *)a->probs.data : NULL;
    }
    if (dprobs) r.bias = a->bias.data, r.bias_dt = a->bias.dtype, r.dprobs = (float *)a->dprobs.data;
    moex_cuda_row_grads_take(c, d->T, d->G, d->N, dbias, dprobs, &r);
    return r;
}

/* Workspace: the bias gradients' partial sums, then a discrete weight's tensor maps. */
size_t moex_cuda_linear_dgrad_ws(moex_context *ctx, const moex_grouped_linear_dgrad_args *a, const moex_gl_dims *d) {
    moex_carver c = {NULL, 0};
    dgrad_row_grads(a, d, &c);
    moex_cuda_weight_maps_take(ctx, &c, &a->w);
    return c.used;
}

moex_status moex_cuda_linear_dgrad(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                   const moex_grouped_linear_dgrad_args *a, const moex_gl_dims *d, void *ws) {
    moex_carver wc = {(char *)ws, 0};
    const moex_cuda_row_grads r = dgrad_row_grads(a, d, &wc);
    void *w_maps = moex_cuda_weight_maps_take(ctx, &wc, &a->w);
    void *dx = moex_present(&a->dx) ? a->dx.data : NULL;
    return moex_cuda_linear_dgrad_run(ctx, c->op, g, d->dt, d->K, d->N, a->dy.data, &a->w, w_maps, dx, &r,
                                      (cudaStream_t)c->stream);
}

/* ---- the grouped MLP's FC2 backward-data with the GLU's backward ------------------- */

/* The Hopper epilogue of a (the dgrad's DGLU), dprobs partials at part. */
static moex_sm90_epilogue fc2_glu_epilogue(const moex_fc2_glu_grad_args *a, float *part) {
    moex_sm90_epilogue e = {};
    e.glu = &a->glu;
    e.probs = moex_present(&a->probs) ? (const float *)a->probs.data : NULL;
    e.h = a->h.data;
    e.dh = a->dh.data;
    e.dprobs_part = part;
    e.z = moex_present(&a->z) ? a->z.data : NULL;
    return e;
}

/* The kernel's args: x = dy [T, H], W2 [G, H, F], y: dh's memory (not written as dz). */
static moex_sm90_gemm_args fc2_glu_gemm(const moex_groups *g, const moex_fc2_glu_grad_args *a,
                                        const moex_gl_dims *d) {
    const moex_sm90_gemm_args s = {d->dt, d->G, d->T, d->K, d->N, a->fc2.dy.data, a->fc2.w.t.data, a->dh.data,
                                   g->splits, NULL, 0, NULL};
    return s;
}

/* The bias gradients of a's dy, as dgrad_row_grads with the scaled bias's dprobs term into
 * a's dprobs, then the GLU's dprobs partials [T, ceil(F / 128)] (when dprobs is asked). */
static moex_cuda_row_grads fc2_glu_row_grads(const moex_fc2_glu_grad_args *a, const moex_gl_dims *d,
                                             moex_carver *c) {
    moex_grouped_linear_dgrad_args fc2 = a->fc2;
    fc2.dprobs = a->dprobs;
    moex_cuda_row_grads r = dgrad_row_grads(&fc2, d, c);
    if (moex_present(&a->dprobs)) {
        r.part_ld = (d->K + 127) / 128;
        r.part = (float *)moex_take(c, moex_sz_bytes(d->T, r.part_ld, sizeof(float)));
        r.dprobs = (float *)a->dprobs.data;
    }
    return r;
}

/* Workspace: that of fc2_glu_row_grads; SIZE_MAX where the Hopper kernel cannot run the
 * args. */
size_t moex_cuda_fc2_glu_grad_ws(moex_context *ctx, const moex_fc2_glu_grad_args *a, const moex_gl_dims *d) {
    const moex_sm90_context *sc = moex_cuda_st(ctx)->sm90_ctx;
    if (sc == NULL || a->fc2.w.ptrs) return SIZE_MAX;
    moex_fc2_glu_grad_args p = *a;
    p.fc2.dy.data = p.fc2.w.t.data = p.h.data = p.dh.data = (void *)ws_placeholder;
    if (moex_present(&p.z)) p.z.data = (void *)ws_placeholder;
    const moex_groups g = ws_groups(d->G, d->T);
    const moex_sm90_gemm_args s = fc2_glu_gemm(&g, &p, d);
    const moex_sm90_epilogue e = fc2_glu_epilogue(&p, (float *)ws_placeholder);
    if (!moex_sm90_epilogue_supported(sc, &s, &e)) return SIZE_MAX;
    moex_carver c = {NULL, 0};
    fc2_glu_row_grads(a, d, &c);
    return c.used;
}

moex_status moex_cuda_fc2_glu_grad(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                   const moex_fc2_glu_grad_args *a, const moex_gl_dims *d, void *ws) {
    const cudaStream_t stream = (cudaStream_t)c->stream;
    const moex_sm90_context *sc = moex_cuda_st(ctx)->sm90_ctx;
    moex_carver wc = {(char *)ws, 0};
    const moex_cuda_row_grads r = fc2_glu_row_grads(a, d, &wc);
    moex_sm90_gemm_args s = fc2_glu_gemm(g, a, d);
    moex_sm90_epilogue e = fc2_glu_epilogue(a, (float *)r.part);
    if (d->T > 0) {   /* (empty tensors may have no memory; the bias terms still write zeros) */
        moex_sm90_epilogue no_z = e;
        no_z.z = NULL;
        if (e.z != NULL && !moex_sm90_epilogue_supported(sc, &s, &e) && moex_sm90_epilogue_supported(sc, &s, &no_z)) {
            e.z = NULL;   /* a misaligned z: by the GLU kernel, before h may be overwritten */
            const float *probs = moex_present(&a->probs) ? (const float *)a->probs.data : NULL;
            MOEX_TRY(moex_cuda_sched_ready(ctx, c->op, g));
            MOEX_TRY(moex_cuda_glu_fwd_run(ctx, c->op, &a->glu, g->off + g->G, d->T, d->K, d->dt, a->h.data, probs,
                                           a->z.data, stream));
        }
        if (!moex_sm90_epilogue_supported(sc, &s, &e)) {   /* the plan held for aligned pointers */
            const char *name = (uintptr_t)s.x % 16 ? "dy" : (uintptr_t)s.w % 16 ? "w2" : "h";
            return moex_fail(ctx, MOEX_ERR_UNSUPPORTED,
                             "%s: %s is not 16-byte aligned: on Hopper the backward fuses FC2's GEMM with the "
                             "GLU and needs dy, w2 and h 16-byte aligned (docs/ops.md 4.2)", c->op, name);
        }
        s.bad_flag = moex_cuda_bad_splits_flag(ctx, g, &s.bad_value);
        const char *why = "";
        const moex_status st = moex_sm90_grouped_gemm_dgrad(sc, &s, &e, c->stream, &why);
        if (st != MOEX_OK) return moex_fail(ctx, st, "%s: Hopper grouped GEMM: %s", c->op, why);
    }
    /* dbias; dprobs: the scaled bias's term, then the GLU's */
    return moex_cuda_row_grads_run(ctx, c->op, g, &r, stream);
}

/* ---- the FP8 grouped linear's forward (current or block scaling) -------------------------- */
/* The FP8 primitives below have backend.h's signatures, one plain definition each (grep finds
 * each), so they look alike by design; what they share is written once: the args
 * (linear_fp8_args), the launch and its message (run_fp8_gemm). */

/* The Hopper FP8 kernel's args for a (the scales: x TENSOR [1] or GROUP [G] with w GROUP [G];
 * or both BLOCK). */
static moex_sm90_fp8_args linear_fp8_args(const moex_groups *g, const moex_grouped_linear_fp8_args *a,
                                          const moex_fp8_dims *d) {
    const moex_gl_dims *l = &d->gl;
    const bool bias = a->bias_mode != MOEX_BIAS_NONE;
    const moex_sm90_fp8_args s = {a->x_params.fp8, a->w_params.fp8, l->dt, l->G, l->T, l->K, l->N,
                                  a->x.data.data, a->w.data.data, a->y.data, g->splits,
                                  a->w_params.recipe == MOEX_QUANT_BLOCK, (const float *)a->x.scales.data,
                                  a->x_params.recipe == MOEX_QUANT_GROUP, (const float *)a->w.scales.data,
                                  bias ? a->bias.data : NULL, a->bias.dtype == MOEX_DTYPE_F32,
                                  a->bias_mode == MOEX_BIAS_SCALED, (const float *)a->probs.data, NULL, 0};
    return s;
}

/* Workspace: none; SIZE_MAX unless the recipes are current scaling or BLOCK and the kernel
 * takes the shapes and dtypes (pointers stand in: alignment is checked at run time). */
size_t moex_cuda_linear_fp8_ws(moex_context *ctx, const moex_grouped_linear_fp8_args *a, const moex_fp8_dims *d) {
    const moex_sm90_context *sc = moex_cuda_st(ctx)->sm90_ctx;
    const moex_quant_recipe xr = a->x_params.recipe, wr = a->w_params.recipe;
    const bool current = (xr == MOEX_QUANT_TENSOR || xr == MOEX_QUANT_GROUP) && wr == MOEX_QUANT_GROUP;
    const bool block = xr == MOEX_QUANT_BLOCK && wr == MOEX_QUANT_BLOCK;
    if (sc == NULL || !(current || block)) return SIZE_MAX;
    const moex_groups g = ws_groups(d->gl.G, d->gl.T);
    moex_grouped_linear_fp8_args p = *a;
    p.x.data.data = p.w.data.data = p.y.data = p.x.scales.data = p.w.scales.data = (void *)ws_placeholder;
    p.bias.data = p.probs.data = (void *)ws_placeholder;
    const moex_sm90_fp8_args s = linear_fp8_args(&g, &p, d);
    return moex_sm90_fp8_supported(sc, &s) ? 0 : SIZE_MAX;
}

/* Launches the FP8 kernel on s, whose shapes the plan took (what: the pointers it needs
 * aligned, for the message when they are not). */
static moex_status run_fp8_gemm(moex_context *ctx, const moex_call *c, const moex_groups *g, moex_sm90_fp8_args *s,
                                const char *what) {
    const moex_sm90_context *sc = moex_cuda_st(ctx)->sm90_ctx;
    if (!moex_sm90_fp8_supported(sc, s))   /* the plan held for aligned pointers */
        return moex_fail(ctx, MOEX_ERR_UNSUPPORTED, "%s: on Hopper the FP8 kernel needs %s 16-byte aligned (docs/ops.md 9.10)",
                         c->op, what);
    s->bad_flag = moex_cuda_bad_splits_flag(ctx, g, &s->bad_value);
    const char *why = "";
    const moex_status st = moex_sm90_fp8_gemm(sc, s, c->stream, &why);
    return st == MOEX_OK ? MOEX_OK : moex_fail(ctx, st, "%s: Hopper FP8 GEMM: %s", c->op, why);
}

moex_status moex_cuda_linear_fp8(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                 const moex_grouped_linear_fp8_args *a, const moex_fp8_dims *d, void *ws) {
    moex_sm90_fp8_args s = linear_fp8_args(g, a, d);
    return run_fp8_gemm(ctx, c, g, &s, "x.data, w.data and y");
}

/* ---- the grouped MLP's FP8 FC1 with the scaled GLU fused ------------------------------------ */

static moex_sm90_fp8_args fc1_glu_fp8_args(const moex_groups *g, const moex_fc1_glu_fp8_args *a,
                                          const moex_fp8_dims *d) {
    moex_sm90_fp8_args s = linear_fp8_args(g, &a->fc1, d);
    s.glu = a->glu.layout == MOEX_GLU_INTERLEAVED_32 ? 2 : 1;
    s.z = a->z.data;
    s.F = d->gl.N / 2;
    s.glu_consts = moex_glu_consts_of(&a->glu);
    s.glu_probs = moex_present(&a->probs) ? (const float *)a->probs.data : NULL;
    return s;
}

/* Workspace: none; SIZE_MAX unless the FP8 forward's recipes and the kernel's GLU shapes hold
 * (pointers stand in: alignment is checked at run time). */
size_t moex_cuda_fc1_glu_fp8_ws(moex_context *ctx, const moex_fc1_glu_fp8_args *a, const moex_fp8_dims *d) {
    if (moex_cuda_linear_fp8_ws(ctx, &a->fc1, d) == SIZE_MAX) return SIZE_MAX;
    const moex_groups g = ws_groups(d->gl.G, d->gl.T);
    moex_fc1_glu_fp8_args p = *a;
    p.fc1.x.data.data = p.fc1.w.data.data = p.fc1.y.data = p.fc1.x.scales.data = p.fc1.w.scales.data =
        (void *)ws_placeholder;
    p.fc1.bias.data = p.z.data = (void *)ws_placeholder;
    if (moex_present(&p.probs)) p.probs.data = (void *)ws_placeholder;
    const moex_sm90_fp8_args s = fc1_glu_fp8_args(&g, &p, d);
    return moex_sm90_fp8_supported(moex_cuda_st(ctx)->sm90_ctx, &s) ? 0 : SIZE_MAX;
}

moex_status moex_cuda_fc1_glu_fp8(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                  const moex_fc1_glu_fp8_args *a, const moex_fp8_dims *d, void *ws) {
    moex_sm90_fp8_args s = fc1_glu_fp8_args(g, a, d);
    return run_fp8_gemm(ctx, c, g, &s, "h, z and the FP8 data");
}

/* ---- the FP8 grouped linear's backward weight (current or block scaling) ------------------ */

/* The Hopper FP8 weight gradient's args for a (the scales as linear_fp8_args pairs them). */
static moex_sm90_fp8_wgrad_args linear_fp8_wgrad_args(const moex_groups *g, const moex_grouped_linear_fp8_wgrad_args *a,
                                                      const moex_fp8_dims *d) {
    const moex_gl_dims *l = &d->gl;
    const moex_sm90_fp8_wgrad_args s = {a->dy_params.fp8, a->x_params.fp8, l->G, l->T, l->K, l->N,
                                        a->dy.data.data, a->x.data.data, a->dw.t.data, a->dw.t.dtype,
                                        a->dw_mode == MOEX_GRAD_ACCUMULATE, g->splits,
                                        a->x_params.recipe == MOEX_QUANT_BLOCK, (const float *)a->dy.scales.data,
                                        a->dy_params.recipe == MOEX_QUANT_GROUP, (const float *)a->x.scales.data,
                                        a->x_params.recipe == MOEX_QUANT_GROUP, NULL, 0};
    return s;
}

/* Workspace: none; SIZE_MAX unless both recipes are current scaling or both BLOCK, dw is
 * packed and the kernel takes the shapes (pointers stand in: alignment is checked at run
 * time). */
size_t moex_cuda_linear_fp8_wgrad_ws(moex_context *ctx, const moex_grouped_linear_fp8_wgrad_args *a,
                                     const moex_fp8_dims *d) {
    const moex_sm90_context *sc = moex_cuda_st(ctx)->sm90_ctx;
    const moex_quant_recipe yr = a->dy_params.recipe, xr = a->x_params.recipe;
    const bool current = (yr == MOEX_QUANT_TENSOR || yr == MOEX_QUANT_GROUP) &&
                         (xr == MOEX_QUANT_TENSOR || xr == MOEX_QUANT_GROUP);
    const bool block = yr == MOEX_QUANT_BLOCK && xr == MOEX_QUANT_BLOCK;
    if (sc == NULL || !(current || block) || a->dw.ptrs != NULL) return SIZE_MAX;
    const moex_groups g = ws_groups(d->gl.G, d->gl.T);
    moex_grouped_linear_fp8_wgrad_args p = *a;
    p.dy.data.data = p.x.data.data = p.dw.t.data = p.dy.scales.data = p.x.scales.data = (void *)ws_placeholder;
    const moex_sm90_fp8_wgrad_args s = linear_fp8_wgrad_args(&g, &p, d);
    return moex_sm90_fp8_wgrad_supported(sc, &s) ? 0 : SIZE_MAX;
}

moex_status moex_cuda_linear_fp8_wgrad(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                       const moex_grouped_linear_fp8_wgrad_args *a, const moex_fp8_dims *d, void *ws) {
    const moex_sm90_context *sc = moex_cuda_st(ctx)->sm90_ctx;
    moex_sm90_fp8_wgrad_args s = linear_fp8_wgrad_args(g, a, d);
    if (!moex_sm90_fp8_wgrad_supported(sc, &s))   /* the plan held for aligned pointers */
        return moex_fail(ctx, MOEX_ERR_UNSUPPORTED,
                         "%s: on Hopper the FP8 backward weight needs dy.data, x.data and dw 16-byte aligned "
                         "(docs/ops.md 9.10)",
                         c->op);
    s.bad_flag = moex_cuda_bad_splits_flag(ctx, g, &s.bad_value);
    const char *why = "";
    const moex_status st = moex_sm90_fp8_wgrad(sc, &s, c->stream, &why);
    return st == MOEX_OK ? MOEX_OK : moex_fail(ctx, st, "%s: Hopper FP8 weight gradient: %s", c->op, why);
}

size_t moex_cuda_linear_wgrad_ws(moex_context *ctx, const moex_grouped_linear_wgrad_args *a, const moex_gl_dims *d) {
    return 0;
}

moex_status moex_cuda_linear_wgrad(moex_context *ctx, const moex_call *c, const moex_groups *g,
                                   const moex_grouped_linear_wgrad_args *a, const moex_gl_dims *d, void *ws) {
    return moex_cuda_linear_wgrad_run(ctx, c->op, g, d->dt, d->K, d->N, a->x.data, a->dy.data, &a->dw, a->dw_mode,
                                      (cudaStream_t)c->stream);
}
