/*
 * cpu_gemm.h - private: the one GEMM every CPU operation uses.
 *
 *     C[M, N]  =  or  +=   sum_k op(A)[m, k] * op(B)[k, n]          (k < K)
 *
 * A and B are row-major matrices of dtype f32, bf16 or f16 (they may differ), each with
 * its own leading dimension and an optional transpose; C is always f32. Products are
 * accumulated in f32. Callers whose output is bf16/f16 run the GEMM on a row tile of an
 * f32 buffer and round it into the output once (cpu_convert.h).
 *
 * How it runs:
 *   - with OpenBLAS (MOEX_HAVE_OPENBLAS): f32 x f32 is one cblas_sgemm on the caller's
 *     matrices; bf16 x bf16 is one cblas_sbgemm when the library has it
 *     (MOEX_HAVE_SBGEMM); any other mix is cut into blocks (at most 512 x 2048 x 512)
 *     whose non-f32 operands are converted into f32 panels of the scratch and multiplied
 *     by cblas_sgemm. OpenBLAS threads itself: before each call its thread count is set to
 *     ctx->num_threads (openblas_set_num_threads, a process-wide setting of OpenBLAS).
 *   - otherwise (or when a size or leading dimension is past INT32_MAX, which BLAS cannot
 *     take): a plain C loop nest, cache-blocked (128 x 512 x 256 blocks packed into f32 in
 *     the scratch) with a 4 x 16 register tile, multithreaded with moex_cpu_parallel_for.
 *
 * Determinism: for the same inputs, sizes and thread count the result is bitwise the
 * same run after run. The C loop nest sums k in increasing order within each K-block of
 * 256 and the blocks in order, whatever the thread count.
 *
 * Calling rules:
 *   - call from the operation's own thread, not from inside a moex_cpu_parallel_for
 *     chunk (the GEMM parallelises itself; nested, it would run single-threaded or, with
 *     OpenBLAS, contend for its threads);
 *   - `scratch` holds at least moex_cpu_gemm_scratch_bytes(M', N', K', ...) bytes for
 *     some M' >= M, N' >= N, K' >= K (so a buffer sized for the largest group serves
 *     every group), aligned for float (64 bytes is best); it may be NULL when that size is 0. Its size
 *     depends on sizes and dtypes only. It must not overlap A, B or C;
 *   - C must not overlap A or B;
 *   - M, N or K may be 0: with K == 0, WRITE sets C to zeros and ACCUMULATE leaves C as
 *     it is (an empty group's weight gradient).
 */
#ifndef MOEX_CPU_GEMM_H
#define MOEX_CPU_GEMM_H

#include "moex_impl.h"

typedef enum moex_cpu_trans {
    MOEX_CPU_NOTRANS = 0,   /* op(X) = X:   X is stored [rows of op, cols of op] */
    MOEX_CPU_TRANS = 1      /* op(X) = X^T: X is stored [cols of op, rows of op] */
} moex_cpu_trans;

typedef enum moex_cpu_gemm_mode {
    MOEX_CPU_GEMM_WRITE = 0,       /* C  = op(A) op(B) */
    MOEX_CPU_GEMM_ACCUMULATE = 1   /* C += op(A) op(B) */
} moex_cpu_gemm_mode;

/* An operand: element (r, c) of the stored matrix is at data + (r * ld + c) elements. */
typedef struct moex_cpu_matrix {
    const void *data;
    moex_dtype dtype;       /* F32, BF16 or F16 */
    int64_t ld;             /* >= the stored matrix's column count */
    moex_cpu_trans trans;
} moex_cpu_matrix;

static inline moex_cpu_matrix moex_cpu_matrix_of(const void *data, moex_dtype dtype, int64_t ld,
                                                 moex_cpu_trans trans) {
    moex_cpu_matrix m = {data, dtype, ld, trans};
    return m;
}

/* Scratch bytes moex_cpu_gemm needs for these sizes (upper bounds) and dtypes; a
 * multiple of 64. Non-decreasing in M, N and K. */
size_t moex_cpu_gemm_scratch_bytes(int64_t M, int64_t N, int64_t K, moex_dtype a_dtype, moex_dtype b_dtype);

/* C[M, N] (= or +=) op(A)[M, K] op(B)[K, N]; `ldc` >= N. See the rules above. */
void moex_cpu_gemm(moex_context *ctx, int64_t M, int64_t N, int64_t K, moex_cpu_matrix a, moex_cpu_matrix b,
                   float *c, int64_t ldc, moex_cpu_gemm_mode mode, void *scratch);

#endif /* MOEX_CPU_GEMM_H */
