/*
 * cuda_grouped_mlp.cu - the grouped MLP on the GPU, forward and backward, composed from
 * the grouped-linear building blocks and the GLU kernels on one device schedule.
 *
 * forward:   h = x W1_g^T (+ b1_g)                  h [T, 2F]  =
 *            z = p * glu(h)                         z [T, F]   = (args->z or workspace)
 *            (on Hopper both in one launch: the GLU fused into FC1's epilogue)
 *            y = z W2_g^T (+ b2_g | + p b2_g)       y [T, H]   =
 * backward:  dz = dy W2_g, db2 = sum dy (or sum p dy), dprobs += dy . b2_g (SCALED)
 *            dW2 = dy^T z          (z recomputed into the workspace when not saved)
 *            dh = glu'(h) dz, dprobs += sum_j dz act g
 *            dx = dh W1_g, db1 = sum dh, dW1 = dh^T x
 * Only what the present outputs need is computed, in the CPU backend's order (dprobs gets
 * the scaled-bias term first, then the GLU term). z, dz and dh live in the workspace in the
 * activation dtype. Workspace size depends on shapes and present tensors only.
 */
#include "cuda_ops.h"

static const moex_tensor absent_tensor = {};

/* ---- forward ------------------------------------------------------------------------ */

static size_t fwd_layout(const moex_grouped_mlp_args *a, const moex_mlp_dims *d, char *base, moex_cuda_sched *s,
                         void **z) {
    moex_cuda_carver c = {base, 0};
    moex_cuda_sched_take(&c, s, d->G, d->T);
    *z = moex_present(&a->z) ? a->z.data
                             : moex_cuda_take(&c, moex_sz_bytes(d->T, d->F, moex_dtype_size(d->dt)));
    return c.used;
}

extern "C" size_t moex_cuda_grouped_mlp_forward_ws(moex_context *ctx, const moex_grouped_mlp_args *a,
                                                   const moex_mlp_dims *d) {
    moex_cuda_sched s;
    void *z;
    return fwd_layout(a, d, NULL, &s, &z);
}

static moex_status fwd_run(moex_context *ctx, const moex_grouped_mlp_args *a, const moex_mlp_dims *d, void *ws,
                           cudaStream_t stream) {
    const char *op = "moex_grouped_mlp_forward";
    MOEX_TRY(moex_cuda_check_grid(ctx, op, d->T, d->G));
    moex_cuda_sched s;
    void *z;
    fwd_layout(a, d, (char *)ws, &s, &z);
    MOEX_TRY(moex_cuda_sched_build(ctx, op, MOEX_CUDA_OP_MLP_FORWARD, &s, (const int64_t *)a->splits.data, stream));
    const float *probs = moex_present(&a->probs) ? (const float *)a->probs.data : NULL;
    bool fused;
    MOEX_TRY(moex_cuda_linear_fwd_glu(ctx, op, &s, d->dt, d->H, d->F, a->x.data, &a->w1, &a->b1, &a->glu, probs,
                                      a->h.data, z, stream, &fused));
    if (!fused) {
        MOEX_TRY(moex_cuda_linear_fwd(ctx, op, &s, d->dt, d->H, 2 * d->F, a->x.data, &a->w1,
                                      moex_present(&a->b1) ? MOEX_BIAS_ADD : MOEX_BIAS_NONE, &a->b1, NULL,
                                      a->h.data, stream));
        MOEX_TRY(moex_cuda_glu_fwd(ctx, op, &a->glu, s.off + d->G, d->T, d->F, d->dt, a->h.data, probs, z, stream));
    }
    return moex_cuda_linear_fwd(ctx, op, &s, d->dt, d->F, d->H, z, &a->w2, a->b2_mode, &a->b2,
                                a->b2_mode == MOEX_BIAS_SCALED ? probs : NULL, a->y.data, stream);
}

extern "C" moex_status moex_cuda_grouped_mlp_forward(moex_context *ctx, const moex_grouped_mlp_args *a,
                                                     const moex_mlp_dims *d, void *ws, size_t ws_bytes,
                                                     moex_stream stream) {
    MOEX_CUDA_GUARDED(ctx, "moex_grouped_mlp_forward", fwd_run(ctx, a, d, ws, (cudaStream_t)stream));
}

/* ---- backward ----------------------------------------------------------------------- */

typedef struct bwd_plan {
    bool dprobs_bias;           /* dprobs gets the scaled-b2 term */
    bool db2, db1;
    bool need_dh;               /* dx, dw1 or db1 asked */
    bool need_dz;               /* dh or the GLU dprobs term asked */
    bool fc2_dgrad;             /* dz, db2 or the scaled-b2 dprobs term */
    bool recompute_z;           /* dw2 asked and z not saved */
} bwd_plan;

static bwd_plan plan_of(const moex_grouped_mlp_grad_args *a) {
    bwd_plan p;
    const bool dprobs = moex_present(&a->dprobs);
    p.db2 = moex_present(&a->db2) && a->b2_mode != MOEX_BIAS_NONE;
    p.db1 = moex_present(&a->db1);
    p.dprobs_bias = dprobs && a->b2_mode == MOEX_BIAS_SCALED;
    p.need_dh = moex_present(&a->dx) || moex_weight_present(&a->dw1) || p.db1;
    p.need_dz = p.need_dh || dprobs;
    p.fc2_dgrad = p.need_dz || p.db2 || p.dprobs_bias;
    p.recompute_z = moex_weight_present(&a->dw2) && !moex_present(&a->z);
    return p;
}

typedef struct bwd_bufs {
    moex_cuda_sched s;
    void *z, *dz, *dh;
    float *partial;
} bwd_bufs;

static size_t bwd_layout(const moex_grouped_mlp_grad_args *a, const moex_mlp_dims *d, const bwd_plan *p,
                         char *base, bwd_bufs *b) {
    moex_cuda_carver c = {base, 0};
    size_t es = moex_dtype_size(d->dt);
    moex_cuda_sched_take(&c, &b->s, d->G, d->T);
    b->z = p->recompute_z ? moex_cuda_take(&c, moex_sz_bytes(d->T, d->F, es)) : a->z.data;
    b->dz = p->need_dz ? moex_cuda_take(&c, moex_sz_bytes(d->T, d->F, es)) : NULL;
    b->dh = p->need_dh ? moex_cuda_take(&c, moex_sz_bytes(d->T, 2 * d->F, es)) : NULL;
    int64_t ncols = 0;
    if (p->db2) ncols = d->H;
    if (p->db1 && 2 * d->F > ncols) ncols = 2 * d->F;
    b->partial = ncols ? (float *)moex_cuda_take(&c, moex_cuda_colsum_partial_bytes(d->T, d->G, ncols)) : NULL;
    return c.used;
}

extern "C" size_t moex_cuda_grouped_mlp_backward_ws(moex_context *ctx, const moex_grouped_mlp_grad_args *a,
                                                    const moex_mlp_dims *d) {
    bwd_plan p = plan_of(a);
    bwd_bufs b;
    return bwd_layout(a, d, &p, NULL, &b);
}

static moex_status bwd_run(moex_context *ctx, const moex_grouped_mlp_grad_args *a, const moex_mlp_dims *d,
                           void *ws, cudaStream_t stream) {
    const char *op = "moex_grouped_mlp_backward";
    MOEX_TRY(moex_cuda_check_grid(ctx, op, d->T, d->G));
    bwd_plan p = plan_of(a);
    bwd_bufs b;
    bwd_layout(a, d, &p, (char *)ws, &b);
    MOEX_TRY(moex_cuda_sched_build(ctx, op, MOEX_CUDA_OP_MLP_BACKWARD, &b.s, (const int64_t *)a->splits.data,
                                   stream));
    const moex_cuda_sched *s = &b.s;
    const float *probs = moex_present(&a->probs) ? (const float *)a->probs.data : NULL;
    float *dprobs = moex_present(&a->dprobs) ? (float *)a->dprobs.data : NULL;
    const int64_t *total = s->off + d->G;

    /* FC2: dz, db2, the scaled-b2 dprobs term; then dW2. */
    if (p.fc2_dgrad)
        MOEX_TRY(moex_cuda_linear_dgrad(ctx, op, s, d->dt, d->F, d->H, a->dy.data, &a->w2, b.dz,
                                        a->b2_mode == MOEX_BIAS_SCALED ? probs : NULL,
                                        p.db2 ? (float *)a->db2.data : NULL, b.partial, &a->b2,
                                        p.dprobs_bias ? dprobs : NULL, stream));
    if (moex_weight_present(&a->dw2)) {
        if (p.recompute_z)
            MOEX_TRY(moex_cuda_glu_fwd(ctx, op, &a->glu, total, d->T, d->F, d->dt, a->h.data, probs, b.z, stream));
        MOEX_TRY(moex_cuda_linear_wgrad(ctx, op, s, d->dt, d->F, d->H, b.z, a->dy.data, &a->dw2, a->dw_mode,
                                        stream));
    }
    /* GLU: dh and the GLU dprobs term. */
    if (p.need_dz)
        MOEX_TRY(moex_cuda_glu_bwd(ctx, op, &a->glu, total, d->T, d->F, d->dt, a->h.data, probs, b.dz, b.dh,
                                   dprobs, stream));
    /* FC1: dx and db1, then dW1. */
    if (moex_present(&a->dx) || p.db1)
        MOEX_TRY(moex_cuda_linear_dgrad(ctx, op, s, d->dt, d->H, 2 * d->F, b.dh, &a->w1,
                                        moex_present(&a->dx) ? a->dx.data : NULL, NULL,
                                        p.db1 ? (float *)a->db1.data : NULL, b.partial, &absent_tensor, NULL,
                                        stream));
    if (moex_weight_present(&a->dw1))
        MOEX_TRY(moex_cuda_linear_wgrad(ctx, op, s, d->dt, d->H, 2 * d->F, a->x.data, b.dh, &a->dw1, a->dw_mode,
                                        stream));
    return MOEX_OK;
}

extern "C" moex_status moex_cuda_grouped_mlp_backward(moex_context *ctx, const moex_grouped_mlp_grad_args *a,
                                                      const moex_mlp_dims *d, void *ws, size_t ws_bytes,
                                                      moex_stream stream) {
    MOEX_CUDA_GUARDED(ctx, "moex_grouped_mlp_backward", bwd_run(ctx, a, d, ws, (cudaStream_t)stream));
}
