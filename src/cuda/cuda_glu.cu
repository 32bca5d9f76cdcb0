/*
 * cuda_glu.cu - the scaled GLU on the GPU, forward and backward, and the scaled_glu ops.
 * The element math is src/core/glu_math.h (shared with the CPU, __host__ __device__).
 *   forward:  z[r, j] = p_r act(a_rj) g(b_rj)                               (=)
 *   backward: dh = d z / d(a, b) * dz (=), dprobs[r] += sum_j dz act g      (+=)
 * One block per row (grid-stride over rows); the rows done are r < off[G] (read on the
 * device) when splits are given, else all T. The dprobs sum of a row is a fixed-order
 * block reduction, so it is bitwise reproducible.
 */
#include "glu_math.h"
#include "cuda_common.cuh"
#include "cuda_ops.h"

#define GLU_THREADS 256
#define GLU_MAX_BLOCKS (1 << 20)

template <typename T>
static __global__ void __launch_bounds__(GLU_THREADS)
glu_fwd_kernel(moex_glu_consts c, int64_t L, const int64_t *total_rows, int64_t T_rows, int64_t F,
               const T *h, const float *probs, T *z) {
    int64_t rows = total_rows ? min(*total_rows, T_rows) : T_rows;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *hr = h + r * 2 * F;
        T *zr = z + r * F;
        float p = probs ? probs[r] : 1.0f;
        for (int64_t j = threadIdx.x; j < F; j += GLU_THREADS) {
            int64_t ca = j + (j / L) * L;          /* a column of z column j */
            zr[j] = from_f32<T>(moex_glu_forward(c, to_f32(hr[ca]), to_f32(hr[ca + L]), p));
        }
    }
}

template <typename T>
static __global__ void __launch_bounds__(GLU_THREADS)
glu_bwd_kernel(moex_glu_consts c, int64_t L, const int64_t *total_rows, int64_t T_rows, int64_t F,
               const T *h, const float *probs, const T *dz, T *dh, float *dprobs) {
    __shared__ float red[32];
    int64_t rows = total_rows ? min(*total_rows, T_rows) : T_rows;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *hr = h + r * 2 * F;
        const T *dzr = dz + r * F;
        float p = probs ? probs[r] : 1.0f;
        float dp = 0.0f;
        for (int64_t j = threadIdx.x; j < F; j += GLU_THREADS) {
            int64_t ca = j + (j / L) * L;
            float da, db, term;
            moex_glu_backward(c, to_f32(hr[ca]), to_f32(hr[ca + L]), p, to_f32(dzr[j]), &da, &db, &term);
            if (dh) {
                dh[r * 2 * F + ca] = from_f32<T>(da);
                dh[r * 2 * F + ca + L] = from_f32<T>(db);
            }
            dp += term;
        }
        if (dprobs) {
            dp = block_sum(dp, red);
            if (threadIdx.x == 0) dprobs[r] += dp;
        }
    }
}

static unsigned glu_blocks(int64_t T) {
    return (unsigned)(T < GLU_MAX_BLOCKS ? T : GLU_MAX_BLOCKS);
}

moex_status moex_cuda_glu_fwd_run(moex_context *ctx, const char *op, const moex_glu_params *glu,
                              const int64_t *total_rows, int64_t T, int64_t F, moex_dtype dt,
                              const void *h, const float *probs, void *z, cudaStream_t stream) {
    if (T == 0 || F == 0) return MOEX_OK;
    moex_glu_consts c = moex_glu_consts_of(glu);
    int64_t L = moex_glu_segment(glu->layout, F);
    unsigned nb = glu_blocks(T);
    if (dt == MOEX_DTYPE_F32)
        glu_fwd_kernel<float><<<nb, GLU_THREADS, 0, stream>>>(c, L, total_rows, T, F, (const float *)h, probs, (float *)z);
    else if (dt == MOEX_DTYPE_BF16)
        glu_fwd_kernel<bf16><<<nb, GLU_THREADS, 0, stream>>>(c, L, total_rows, T, F, (const bf16 *)h, probs, (bf16 *)z);
    else
        glu_fwd_kernel<f16><<<nb, GLU_THREADS, 0, stream>>>(c, L, total_rows, T, F, (const f16 *)h, probs, (f16 *)z);
    CUDA_TRY_LAUNCH(ctx, op);
    return MOEX_OK;
}

moex_status moex_cuda_glu_bwd_run(moex_context *ctx, const char *op, const moex_glu_params *glu,
                              const int64_t *total_rows, int64_t T, int64_t F, moex_dtype dt,
                              const void *h, const float *probs, const void *dz, void *dh,
                              float *dprobs, cudaStream_t stream) {
    if (T == 0 || F == 0 || (!dh && !dprobs)) return MOEX_OK;
    moex_glu_consts c = moex_glu_consts_of(glu);
    int64_t L = moex_glu_segment(glu->layout, F);
    unsigned nb = glu_blocks(T);
    if (dt == MOEX_DTYPE_F32)
        glu_bwd_kernel<float><<<nb, GLU_THREADS, 0, stream>>>(c, L, total_rows, T, F, (const float *)h, probs,
                                                             (const float *)dz, (float *)dh, dprobs);
    else if (dt == MOEX_DTYPE_BF16)
        glu_bwd_kernel<bf16><<<nb, GLU_THREADS, 0, stream>>>(c, L, total_rows, T, F, (const bf16 *)h, probs,
                                                            (const bf16 *)dz, (bf16 *)dh, dprobs);
    else
        glu_bwd_kernel<f16><<<nb, GLU_THREADS, 0, stream>>>(c, L, total_rows, T, F, (const f16 *)h, probs,
                                                           (const f16 *)dz, (f16 *)dh, dprobs);
    CUDA_TRY_LAUNCH(ctx, op);
    return MOEX_OK;
}

/* ---- the GLU primitives: the rows [0, off[G]) of the groups, or all T rows ----------- */

size_t moex_cuda_glu_fwd_ws(moex_context *ctx, const moex_scaled_glu_args *a, const moex_glu_dims *d) { return 0; }

moex_status moex_cuda_glu_fwd(moex_context *ctx, const moex_call *c, const moex_groups *g,
                              const moex_scaled_glu_args *a, const moex_glu_dims *d, void *ws) {
    const float *probs = moex_present(&a->probs) ? (const float *)a->probs.data : NULL;
    if (g) MOEX_TRY(moex_cuda_sched_ready(ctx, c->op, g));
    return moex_cuda_glu_fwd_run(ctx, c->op, &a->glu, g ? g->off + g->G : NULL, d->T, d->F, d->dt, a->h.data, probs,
                                 a->z.data, (cudaStream_t)c->stream);
}

size_t moex_cuda_glu_bwd_ws(moex_context *ctx, const moex_scaled_glu_grad_args *a, const moex_glu_dims *d) {
    return 0;
}

moex_status moex_cuda_glu_bwd(moex_context *ctx, const moex_call *c, const moex_groups *g,
                              const moex_scaled_glu_grad_args *a, const moex_glu_dims *d, void *ws) {
    const float *probs = moex_present(&a->probs) ? (const float *)a->probs.data : NULL;
    float *dprobs = moex_present(&a->dprobs) ? (float *)a->dprobs.data : NULL;
    void *dh = moex_present(&a->dh) ? a->dh.data : NULL;
    if (g) MOEX_TRY(moex_cuda_sched_ready(ctx, c->op, g));
    return moex_cuda_glu_bwd_run(ctx, c->op, &a->glu, g ? g->off + g->G : NULL, d->T, d->F, d->dt, a->h.data, probs,
                                 a->dz.data, dh, dprobs, (cudaStream_t)c->stream);
}
