/*
 * cpu_dense_gemm.c - the CPU `gemm` primitive (src/core/backend.h, moex_dense_gemm): the MoE
 * layer's router GEMMs on moex_cpu_gemm (cpu_gemm.h), in f32.
 *   NT:  C = A B^T, written into C when C is f32, else through an f32 buffer and rounded once
 *   TN:  C = A^T B (= or +=; "+=" only into f32), likewise
 *   NN:  R += A B in place, then C = round(R)
 * Workspace: the f32 buffer [M, N] when C is not f32 (NT, TN), then the GEMM's scratch.
 */
#include "cpu_gemm.h"
#include "cpu_ops.h"

typedef struct dense_ws {
    float *tmp;                 /* [M, N] f32, or NULL */
    void *scratch;
    size_t total;
} dense_ws;

static bool needs_tmp(const moex_dense_gemm *p) { return p->kind != MOEX_GEMM_NN && p->tc != MOEX_DTYPE_F32; }

static dense_ws layout_of(const moex_dense_gemm *p, void *ws) {
    moex_carver c = {(char *)ws, 0};
    dense_ws l;
    l.tmp = needs_tmp(p) ? (float *)moex_take(&c, moex_sz_bytes(p->M, p->N, sizeof(float))) : NULL;
    l.scratch = moex_take(&c, moex_cpu_gemm_scratch_bytes(p->M, p->N, p->K, p->ta, p->tb));
    l.total = c.used;
    return l;
}

size_t moex_cpu_dense_gemm_ws(moex_context *ctx, const moex_dense_gemm *p) { return layout_of(p, NULL).total; }

moex_status moex_cpu_dense_gemm(moex_context *ctx, const moex_call *c, const moex_groups *rows,
                                const moex_dense_gemm *p, void *ws) {
    const dense_ws l = layout_of(p, ws);
    const int64_t M = p->M, N = p->N, K = p->K;
    float *out = l.tmp ? l.tmp : (float *)p->c;
    switch (p->kind) {
    case MOEX_GEMM_NT:
        moex_cpu_gemm(ctx, M, N, K, moex_cpu_matrix_of(p->a, p->ta, K, MOEX_CPU_NOTRANS),
                      moex_cpu_matrix_of(p->b, p->tb, K, MOEX_CPU_TRANS), out, N, MOEX_CPU_GEMM_WRITE, l.scratch);
        break;
    case MOEX_GEMM_TN:
        moex_cpu_gemm(ctx, M, N, K, moex_cpu_matrix_of(p->a, p->ta, M, MOEX_CPU_TRANS),
                      moex_cpu_matrix_of(p->b, p->tb, N, MOEX_CPU_NOTRANS), out, N,
                      p->mode == MOEX_GRAD_ACCUMULATE ? MOEX_CPU_GEMM_ACCUMULATE : MOEX_CPU_GEMM_WRITE, l.scratch);
        break;
    case MOEX_GEMM_NN:
        moex_cpu_gemm(ctx, M, N, K, moex_cpu_matrix_of(p->a, p->ta, K, MOEX_CPU_NOTRANS),
                      moex_cpu_matrix_of(p->b, p->tb, N, MOEX_CPU_NOTRANS), p->r, N, MOEX_CPU_GEMM_ACCUMULATE,
                      l.scratch);
        moex_cpu_store_f32_rows(ctx, p->c, p->tc, p->r, M, N);
        return MOEX_OK;
    }
    if (l.tmp) moex_cpu_store_f32_rows(ctx, p->c, p->tc, l.tmp, M, N);
    return MOEX_OK;
}
