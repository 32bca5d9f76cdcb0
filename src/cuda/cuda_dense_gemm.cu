/*
 * cuda_dense_gemm.cu - the CUDA `gemm` primitive (src/core/backend.h, moex_dense_gemm): the
 * MoE layer's router GEMMs on the portable grouped GEMM (sm80_grouped_gemm.cu) with one
 * group of all rows, its reduction split where the output has few tiles; the NN with a short
 * reduction (dx, K = E) on cuda_dense_short_k.cu. The product runs in B's dtype (A is rounded
 * to it on the way in; f32 inputs: exact f32).
 */
#include "cuda_ops.h"

/* The router's GEMMs have few output tiles (T x E logits; E x H for dWr) and a
 * long reduction: below DENSE_FULL_TILES tiles the reduction is split (split-K, workspace: the
 * splits' f32 sums) so that tiles x splits reaches DENSE_CTAS, each split DENSE_MIN_K long at
 * least. */
#define DENSE_FULL_TILES 128
#define DENSE_CTAS 256
#define DENSE_MIN_K 256

static int dense_ksplit(const moex_dense_gemm *p) {
    const int64_t t = MOEX_CUDA_GEMM_TILE, tiles = ((p->M + t - 1) / t) * ((p->N + t - 1) / t);
    if (tiles == 0 || tiles >= DENSE_FULL_TILES) return 1;
    int64_t s = DENSE_CTAS / tiles;
    if (s > p->K / DENSE_MIN_K) s = p->K / DENSE_MIN_K;
    return s > 1 ? (int)s : 1;
}

size_t moex_cuda_dense_gemm_ws(moex_context *ctx, const moex_dense_gemm *p) {
    return moex_cuda_gemm_part_bytes(dense_ksplit(p), p->M, p->N);
}

/* The NN with a short reduction (the router's dx, K = E) on its own kernel. */
static bool dense_short_k(const moex_dense_gemm *p) {
    return p->kind == MOEX_GEMM_NN && p->K <= MOEX_CUDA_SHORT_K && p->M <= MOEX_CUDA_SHORT_K_ROWS &&
           p->ta == MOEX_DTYPE_F32 && p->tc == p->tb && p->r != NULL;
}

moex_status moex_cuda_dense_gemm(moex_context *ctx, const moex_call *c, const moex_groups *rows,
                                 const moex_dense_gemm *p, void *ws) {
    if (dense_short_k(p))
        return moex_cuda_dense_short_k(ctx, c->op, (const float *)p->a, p->b, p->tb, p->r, p->c, p->M, p->N, p->K,
                                       (cudaStream_t)c->stream);
    moex_cuda_gemm g = {};
    g.sched = rows;
    g.ta = p->ta;
    g.tb = g.tc = p->tb;
    g.to = p->tc;
    g.a = p->a;
    g.b = p->b;
    g.c = p->c;
    g.n_dim = p->N;
    g.ldc = p->N;
    g.ksplit = dense_ksplit(p);
    g.part = (float *)ws;
    switch (p->kind) {
    case MOEX_GEMM_NT:   /* C[m, n] = sum_k A[m, k] B[n, k] */
        g.kind = MOEX_CUDA_GEMM_ROWS;
        g.k_dim = p->K;
        g.lda = p->K;
        g.ldb = p->K;
        g.b_kc = 1;
        break;
    case MOEX_GEMM_TN:   /* C[m, n] = sum_k A[k, m] B[k, n] */
        g.kind = MOEX_CUDA_GEMM_WGRAD;
        g.m_dim = p->M;
        g.lda = p->M;
        g.ldb = p->N;
        g.accumulate = p->mode == MOEX_GRAD_ACCUMULATE;
        break;
    case MOEX_GEMM_NN:   /* C[m, n] = R[m, n] + sum_k A[m, k] B[k, n] */
        g.kind = MOEX_CUDA_GEMM_ROWS;
        g.k_dim = p->K;
        g.lda = p->K;
        g.ldb = p->N;
        g.b_kc = 0;
        g.residual = p->r;
        g.ldr = p->N;
        break;
    }
    return moex_cuda_gemm_run(ctx, c->op, &g, (cudaStream_t)c->stream);
}
