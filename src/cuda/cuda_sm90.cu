/*
 * cuda_sm90.cu - the CUDA backend's glue to the Hopper grouped GEMMs
 * (sm90_grouped_gemm.h): the per-context state they read (made once, at context creation),
 * whether they run a product, their launch, and their workspace.
 */
#include "cuda_ops.h"
#include "sm90_grouped_gemm.h"

/* w's kept maps (moex_weight_maps_write's) where the Hopper kernels read them, else NULL. */
static const void *kept_maps(const moex_sm90_context *sc, const moex_weight *w) {
    if (w->ptrs == NULL || w->maps == NULL) return NULL;
    const moex_tensor *t = &w->t;
    return moex_sm90_kept_maps_bytes(sc, t->dtype, t->shape[0], t->shape[1], t->shape[2]) > 0 ? w->maps : NULL;
}

/* Runs y = x W_g^T with the epilogue e (NULL: none; dgrad: dx = dy W_g, e NULL) on the
 * Hopper kernel when the context allows it and the kernel supports the arguments; *ran says
 * whether it did. */
moex_status moex_cuda_sm90_rows(moex_context *ctx, const char *op, const moex_cuda_sched *s, moex_dtype dt,
                                int64_t K, int64_t N, const void *x, const moex_weight *w, void *w_maps, void *y,
                                const moex_sm90_epilogue *e, bool dgrad, cudaStream_t stream, bool *ran) {
    *ran = false;
    const moex_sm90_context *sc = moex_cuda_st(ctx)->sm90_ctx;
    /* T == 0 launches nothing here: the portable path then checks the splits */
    const void *kept = kept_maps(sc, w);
    if (sc == NULL || !s->splits || (w->ptrs && !w_maps && !kept) || s->T == 0) return MOEX_OK;
    moex_sm90_gemm_args a = {dt, s->G, s->T, K, N, x, w->t.data, y, s->splits, NULL, 0, s->gemm_ws};
    a.w_ptrs = w->ptrs;
    a.w_maps = w->ptrs ? w_maps : NULL;
    a.w_maps_kept = kept;
    if (!moex_sm90_epilogue_supported(sc, &a, e)) return MOEX_OK;
    a.bad_flag = moex_cuda_bad_splits_flag(ctx, s, &a.bad_value);   /* the kernel clamps as the schedule does */
    a.bad_align_value = (a.bad_value & ~15) | MOEX_CUDA_BAD_ALIGN;
    const char *why = "";
    moex_status st = dgrad ? moex_sm90_grouped_gemm_dgrad(sc, &a, e, (moex_stream)stream, &why)
                           : moex_sm90_grouped_gemm_fwd(sc, &a, e, (moex_stream)stream, &why);
    if (st != MOEX_OK) return moex_fail(ctx, st, "%s: Hopper grouped GEMM: %s", op, why);
    *ran = true;
    return MOEX_OK;
}

/* Runs dW_g = dy_g^T x_g (= or +=) on the Hopper kernel under the same conditions as
 * moex_cuda_sm90_rows (packed dW, device splits, supported args); *ran says whether it did. */
moex_status moex_cuda_sm90_wgrad(moex_context *ctx, const char *op, const moex_cuda_sched *s, moex_dtype dt,
                                 int64_t K, int64_t N, const void *x, const void *dy, const moex_weight *dw,
                                 moex_grad_mode mode, cudaStream_t stream, bool *ran) {
    *ran = false;
    const moex_sm90_context *sc = moex_cuda_st(ctx)->sm90_ctx;
    if (sc == NULL || !s->splits || dw->ptrs || s->T == 0) return MOEX_OK;
    moex_sm90_wgrad_args a = {dt, s->G, s->T, K, N, dy, x, dw->t.data, dw->t.dtype,
                              mode == MOEX_GRAD_ACCUMULATE, s->splits, NULL, 0};
    if (!moex_sm90_wgrad_supported(sc, &a)) return MOEX_OK;
    a.bad_flag = moex_cuda_bad_splits_flag(ctx, s, &a.bad_value);
    const char *why = "";
    moex_status st = moex_sm90_grouped_gemm_wgrad(sc, &a, (moex_stream)stream, &why);
    if (st != MOEX_OK) return moex_fail(ctx, st, "%s: Hopper grouped GEMM: %s", op, why);
    *ran = true;
    return MOEX_OK;
}

void *moex_cuda_gemm_ws_take(moex_context *ctx, moex_carver *c, const moex_grouped_linear_args *fwd) {
    const moex_sm90_context *sc = moex_cuda_st(ctx)->sm90_ctx;
    if (sc == NULL) return NULL;
    /* The plan depends on the shapes and the epilogue's kind, not on where the tensors are:
     * a placeholder stands for the bias and probs, so that the size never depends on pointers. */
    alignas(16) static const float placeholder[4] = {0};
    const moex_sm90_gemm_args a = {fwd->x.dtype, fwd->splits.shape[0], fwd->x.shape[0], fwd->x.shape[1],
                                   fwd->y.shape[1], placeholder, placeholder, NULL, NULL, NULL, 0, NULL};
    moex_sm90_epilogue e = {};
    e.bias_mode = fwd->bias_mode;
    if (fwd->bias_mode != MOEX_BIAS_NONE) {
        e.bias = placeholder;
        e.bias_dtype = fwd->bias.dtype;
        e.probs = placeholder;
    }
    const size_t bytes = moex_sm90_gemm_workspace_bytes(sc, &a, &e);
    return bytes > 0 ? moex_take(c, bytes) : NULL;
}

void *moex_cuda_weight_maps_take(moex_context *ctx, moex_carver *c, const moex_weight *w) {
    const moex_sm90_context *sc = moex_cuda_st(ctx)->sm90_ctx;
    if (sc == NULL || w->ptrs == NULL || kept_maps(sc, w) != NULL) return NULL;
    return moex_take(c, moex_sm90_weight_maps_bytes(w->t.shape[0]));
}

size_t moex_cuda_weight_maps_size(moex_context *ctx, const moex_gl_dims *d) {
    return moex_sm90_kept_maps_bytes(moex_cuda_st(ctx)->sm90_ctx, d->dt, d->G, d->N, d->K);
}

moex_status moex_cuda_weight_maps_write(moex_context *ctx, const moex_call *c, const moex_weight_maps_write_args *a,
                                        const moex_gl_dims *d) {
    moex_cuda_state *st = moex_cuda_st(ctx);
    const int bad_value = ((int)c->id << 4) | MOEX_CUDA_BAD_ALIGN;
    const char *why = "";
    const moex_status s = moex_sm90_kept_maps_write(st->sm90_ctx, d->dt, d->G, d->N, d->K, a->w.ptrs, a->maps,
                                                    st->flag, bad_value, c->stream, &why);
    return s == MOEX_OK ? MOEX_OK : moex_fail(ctx, s, "%s: %s", c->op, why);
}

/* The Hopper state of a context whose device may run the kernels (st->sm90): kernel
 * attributes and resident clusters, found once. A device or binary without them leaves
 * sm90_ctx NULL, and every product runs on the portable kernel. */
moex_status moex_cuda_sm90_prepare(moex_context *ctx) {
    moex_cuda_state *st = moex_cuda_st(ctx);
    st->sm90_ctx = NULL;
    if (!st->sm90) return MOEX_OK;
    const char *why = "";
    const moex_status s = moex_sm90_context_create(ctx->device, &st->sm90_ctx, &why);
    if (s == MOEX_ERR_UNSUPPORTED) return MOEX_OK;
    if (s != MOEX_OK) return moex_fail(ctx, s, "moex_context_create: %s", why);
    return MOEX_OK;
}

void moex_cuda_sm90_release(moex_context *ctx) {
    moex_cuda_state *st = moex_cuda_st(ctx);
    if (st == NULL) return;
    moex_sm90_context_destroy(st->sm90_ctx);
    st->sm90_ctx = NULL;
}
