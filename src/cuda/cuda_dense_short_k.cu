/*
 * cuda_dense_short_k.cu - C = round(R + A B) for a dense GEMM whose reduction is short (K <=
 * MOEX_CUDA_SHORT_K): the MoE router's dx = dx_perm + dlogits Wr, K = E. Its T x H output has
 * plenty of tiles but too few k steps to pay for a GEMM's pipeline, so its time is its
 * memory: R read once, C written once.
 *
 * SIMT, f32 sums in k order (deterministic): a block of 256 threads makes SK_BM x SK_BN outputs,
 * each thread SK_ROWS rows of 4 adjacent columns (a warp: one row block, 128 columns). A (f32,
 * rounded to B's dtype on the way in, as the GEMM rounds it: products of two B-precision values
 * are exact in f32) and B step through shared memory SK_BK along k at a time.
 */
#include "cuda_common.cuh"
#include "cuda_ops.h"

#define SK_THREADS 256
#define SK_ROWS 8
#define SK_BM (SK_ROWS * SK_THREADS / 32)
#define SK_BN 128
#define SK_BK 32
static_assert((int64_t)65535 * SK_BM == MOEX_CUDA_SHORT_K_ROWS, "the grid's rows: 65535 blocks of SK_BM");

template <typename T>
static __global__ void __launch_bounds__(SK_THREADS)
    dense_short_k_kernel(const float *A, const T *B, const float *R, T *C, int64_t M, int64_t N, int64_t K) {
    __shared__ float As[SK_BM][SK_BK + 1];
    __shared__ __align__(16) float Bs[SK_BK][SK_BN];
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    const int64_t row0 = (int64_t)blockIdx.y * SK_BM, col0 = (int64_t)blockIdx.x * SK_BN;
    float acc[SK_ROWS][4];
    for (int i = 0; i < SK_ROWS; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int64_t k0 = 0; k0 < K; k0 += SK_BK) {
        for (int i = threadIdx.x; i < SK_BM * SK_BK; i += SK_THREADS) {
            const int r = i / SK_BK, k = i % SK_BK;
            const int64_t gr = row0 + r, gk = k0 + k;
            As[r][k] = gr < M && gk < K ? to_f32(from_f32<T>(A[gr * K + gk])) : 0.0f;
        }
        for (int i = threadIdx.x; i < SK_BK * SK_BN; i += SK_THREADS) {
            const int k = i / SK_BN, c = i % SK_BN;
            const int64_t gk = k0 + k, gc = col0 + c;
            Bs[k][c] = gk < K && gc < N ? to_f32(B[gk * N + gc]) : 0.0f;
        }
        __syncthreads();
#pragma unroll 4
        for (int k = 0; k < SK_BK; k++) {
            const float4 b = *(const float4 *)&Bs[k][tx * 4];
#pragma unroll
            for (int i = 0; i < SK_ROWS; i++) {
                const float a = As[ty * SK_ROWS + i][k];
                acc[i][0] = fmaf(a, b.x, acc[i][0]);
                acc[i][1] = fmaf(a, b.y, acc[i][1]);
                acc[i][2] = fmaf(a, b.z, acc[i][2]);
                acc[i][3] = fmaf(a, b.w, acc[i][3]);
            }
        }
        __syncthreads();
    }
    const int64_t c0 = col0 + tx * 4;
    for (int i = 0; i < SK_ROWS; i++) {
        const int64_t r = row0 + ty * SK_ROWS + i;
        if (r >= M) break;
        for (int j = 0; j < 4; j++)
            if (c0 + j < N) C[r * N + c0 + j] = from_f32<T>(R[r * N + c0 + j] + acc[i][j]);
    }
}

moex_status moex_cuda_dense_short_k(moex_context *ctx, const char *op, const float *A, const void *B,
                                    moex_dtype dt, const float *R, void *C, int64_t M, int64_t N, int64_t K,
                                    cudaStream_t stream) {
    if (M == 0 || N == 0) return MOEX_OK;
    const int64_t by = (M + SK_BM - 1) / SK_BM, bx = (N + SK_BN - 1) / SK_BN;
    if (M > MOEX_CUDA_SHORT_K_ROWS || bx > 2147483647)
        return moex_fail(ctx, MOEX_ERR_INTERNAL, "%s: %lld x %lld exceeds the short-K GEMM's grid", op, (long long)M,
                         (long long)N);
    const dim3 grid((unsigned)bx, (unsigned)by);
    by_dtype(dt, [&](auto e) {
        using T = typename decltype(e)::type;
        dense_short_k_kernel<T><<<grid, SK_THREADS, 0, stream>>>(A, (const T *)B, R, (T *)C, M, N, K);
    });
    CUDA_TRY_LAUNCH(ctx, op);
    return MOEX_OK;
}
