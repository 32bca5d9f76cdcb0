/*
 * cpu_gemm.c - the CPU GEMM (contract in cpu_gemm.h):
 *   C[M, N] (= or +=) op(A)[M, K] op(B)[K, N], A and B f32/bf16/f16, C f32.
 *
 * Two engines:
 *   - OpenBLAS: one cblas_sgemm / cblas_sbgemm call when the dtypes allow it, else
 *     blocks whose non-f32 operands are converted into f32 panels first;
 *   - a plain C loop nest: blocks of A (MC x KC) and B (KC x NC) packed into f32, then
 *     4 x 16 register tiles, with the tiles of a block shared out among threads.
 */
#include "cpu_gemm.h"

#include "cpu_convert.h"
#include "cpu_ops.h"

#include <limits.h>
#include <string.h>

#ifdef MOEX_HAVE_OPENBLAS
#include <cblas.h>
#endif

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t round_up64(int64_t a, int64_t m) { return (a + m - 1) / m * m; }
static inline size_t bytes64(int64_t floats) { return moex_sz_align(moex_sz_bytes(floats, 1, sizeof(float)), 64); }

/* ---- the C loop nest ------------------------------------------------------------------ */

#define MR 4            /* rows of a register tile    */
#define NR 16           /* columns of a register tile */
#define C_MC 128        /* rows of a packed A block (a multiple of MR)     */
#define C_KC 256        /* depth of the packed blocks                      */
#define C_NC 512        /* columns of a packed B block (a multiple of NR)  */
#define TASK_TILES 16   /* register-tile rows (of MR) per compute task     */

static size_t c_scratch_bytes(int64_t M, int64_t N, int64_t K) {
    if (M <= 0 || N <= 0 || K <= 0) return 0;
    const int64_t mc = round_up64(min64(M, C_MC), MR), kc = min64(K, C_KC), nc = round_up64(min64(N, C_NC), NR);
    return bytes64(mc * kc) + bytes64(kc * nc);
}

/* A packed block: tile q holds op(A) rows m0 + MR q ..  as ap[(q kc + k) MR + r];
 * B packed block: panel p holds op(B) columns n0 + NR p .. as bp[(p kc + k) NR + j];
 * rows and columns past the block are zeros. */
typedef struct c_block {
    moex_cpu_matrix a, b;
    float *ap, *bp;
    int64_t m0, mc, n0, nc, k0, kc;
    float *c;
    int64_t ldc;
    int write;              /* C = tile (first K-block of a WRITE) rather than C += tile */
} c_block;

/* Packs panels p0..p1 of width W (MR for A, NR for B) of the block of op(X) whose lines
 * (rows of op(A), columns of op(B)) start at x0 (len of them) and whose depth starts at
 * k0 (kc of it): panel p holds lines x0 + W p .. as dst[(p kc + k) W + l], zeros past len.
 * by_line: each line is a stored row (contiguous in k), else each depth k is a stored row.
 * Both operands pack alike: A's rows and B's columns play the same part. */
static inline void pack_panels(const moex_cpu_matrix *x, int by_line, int64_t x0, int64_t len, int64_t k0,
                               int64_t kc, int64_t W, float *dst, int64_t p0, int64_t p1) {
    float line[C_KC];
    for (int64_t p = p0; p < p1; p++) {
        float *d = dst + p * kc * W;
        const int64_t lines = min64(W, len - p * W);
        if (by_line) {
            for (int64_t l = 0; l < W; l++) {
                if (l < lines) {
                    const int64_t i = x0 + p * W + l;
                    moex_cpu_load_f32(line, moex_cpu_cat(x->data, x->dtype, i * x->ld + k0), x->dtype, kc);
                    for (int64_t k = 0; k < kc; k++) d[k * W + l] = line[k];
                } else {
                    for (int64_t k = 0; k < kc; k++) d[k * W + l] = 0.0f;
                }
            }
        } else {
            for (int64_t k = 0; k < kc; k++) {
                const int64_t src = (k0 + k) * x->ld + x0 + p * W;
                moex_cpu_load_f32(d + k * W, moex_cpu_cat(x->data, x->dtype, src), x->dtype, lines);
                for (int64_t l = lines; l < W; l++) d[k * W + l] = 0.0f;
            }
        }
    }
}

/* A: op(A) row i is stored row i unless A is transposed. */
static void pack_a_tiles(void *arg, int64_t q0, int64_t q1) {
    const c_block *blk = (const c_block *)arg;
    pack_panels(&blk->a, blk->a.trans == MOEX_CPU_NOTRANS, blk->m0, blk->mc, blk->k0, blk->kc, MR, blk->ap, q0, q1);
}

/* B: op(B) column n is stored row n when B is transposed. */
static void pack_b_panels(void *arg, int64_t p0, int64_t p1) {
    const c_block *blk = (const c_block *)arg;
    pack_panels(&blk->b, blk->b.trans == MOEX_CPU_TRANS, blk->n0, blk->nc, blk->k0, blk->kc, NR, blk->bp, p0, p1);
}

/* One register tile: c[r, j] (= or +=) sum_k a[k MR + r] b[k NR + j], for r < rows, j < cols.
 * Four named accumulator rows (not a 2-D array) let the compiler keep them in vector
 * registers. */
static void tile_4x16(int64_t kc, const float *restrict a, const float *restrict b, float *restrict c,
                      int64_t ldc, int64_t rows, int64_t cols, int write) {
    float c0[NR], c1[NR], c2[NR], c3[NR];
    for (int j = 0; j < NR; j++) c0[j] = c1[j] = c2[j] = c3[j] = 0.0f;
    for (int64_t k = 0; k < kc; k++) {
        const float *bk = b + k * NR;
        const float a0 = a[k * MR], a1 = a[k * MR + 1], a2 = a[k * MR + 2], a3 = a[k * MR + 3];
        for (int j = 0; j < NR; j++) {
            c0[j] += a0 * bk[j];
            c1[j] += a1 * bk[j];
            c2[j] += a2 * bk[j];
            c3[j] += a3 * bk[j];
        }
    }
    const float *acc[MR] = {c0, c1, c2, c3};
    for (int64_t r = 0; r < rows; r++) {
        float *cr = c + r * ldc;
        if (write)
            for (int64_t j = 0; j < cols; j++) cr[j] = acc[r][j];
        else
            for (int64_t j = 0; j < cols; j++) cr[j] += acc[r][j];
    }
}

/* Task t covers TASK_TILES register-tile rows of one B panel. */
static void compute_tasks(void *arg, int64_t t0, int64_t t1) {
    const c_block *blk = (const c_block *)arg;
    const int64_t panels = (blk->nc + NR - 1) / NR, tiles = (blk->mc + MR - 1) / MR;
    for (int64_t t = t0; t < t1; t++) {
        const int64_t p = t % panels, q0 = (t / panels) * TASK_TILES, q1 = min64(q0 + TASK_TILES, tiles);
        const float *b = blk->bp + p * blk->kc * NR;
        const int64_t cols = min64(NR, blk->nc - p * NR);
        for (int64_t q = q0; q < q1; q++) {
            float *c = blk->c + (blk->m0 + q * MR) * blk->ldc + blk->n0 + p * NR;
            tile_4x16(blk->kc, blk->ap + q * blk->kc * MR, b, c, blk->ldc, min64(MR, blk->mc - q * MR), cols,
                      blk->write);
        }
    }
}

static void gemm_c(moex_context *ctx, int64_t M, int64_t N, int64_t K, moex_cpu_matrix a, moex_cpu_matrix b,
                   float *c, int64_t ldc, moex_cpu_gemm_mode mode, void *scratch) {
    c_block blk;
    blk.a = a;
    blk.b = b;
    blk.c = c;
    blk.ldc = ldc;
    blk.ap = (float *)scratch;
    blk.bp = (float *)((char *)scratch + bytes64(round_up64(min64(M, C_MC), MR) * min64(K, C_KC)));
    for (blk.n0 = 0; blk.n0 < N; blk.n0 += C_NC) {
        blk.nc = min64(C_NC, N - blk.n0);
        const int64_t panels = (blk.nc + NR - 1) / NR;
        for (blk.k0 = 0; blk.k0 < K; blk.k0 += C_KC) {
            blk.kc = min64(C_KC, K - blk.k0);
            blk.write = blk.k0 == 0 && mode == MOEX_CPU_GEMM_WRITE;
            moex_cpu_parallel_for(ctx, panels, 2, pack_b_panels, &blk);
            for (blk.m0 = 0; blk.m0 < M; blk.m0 += C_MC) {
                blk.mc = min64(C_MC, M - blk.m0);
                const int64_t tiles = (blk.mc + MR - 1) / MR;
                moex_cpu_parallel_for(ctx, tiles, 8, pack_a_tiles, &blk);
                const int64_t tasks = panels * ((tiles + TASK_TILES - 1) / TASK_TILES);
                moex_cpu_parallel_for(ctx, tasks, 1, compute_tasks, &blk);
            }
        }
    }
}

/* ---- OpenBLAS ------------------------------------------------------------------------ */

#ifdef MOEX_HAVE_OPENBLAS

#define B_MC 512
#define B_KC 512
#define B_NC 2048

/* Converting a stored block to f32, in parallel over its rows. */
typedef struct tile_job {
    float *dst;
    int64_t ldd;
    const void *src;        /* the block's first element */
    moex_dtype dt;
    int64_t lds, cols;
} tile_job;

static void load_tile_rows(void *arg, int64_t r0, int64_t r1) {
    const tile_job *j = (const tile_job *)arg;
    moex_cpu_load_tile_f32(j->dst + r0 * j->ldd, j->ldd, moex_cpu_cat(j->src, j->dt, r0 * j->lds), j->dt, j->lds,
                           r1 - r0, j->cols);
}

/* dst[r * ldd + c] = f32(X[r0 + r, c0 + c]) for the stored matrix X. */
static void load_block(moex_context *ctx, float *dst, int64_t ldd, const moex_cpu_matrix *x, int64_t r0,
                       int64_t c0, int64_t rows, int64_t cols) {
    tile_job j = {dst, ldd, moex_cpu_cat(x->data, x->dtype, r0 * x->ld + c0), x->dtype, x->ld, cols};
    moex_cpu_parallel_for(ctx, rows, 1 + 16384 / (cols > 0 ? cols : 1), load_tile_rows, &j);
}

/* Bytes of the f32 panels for the operands OpenBLAS cannot take as they are. */
static size_t blas_scratch_bytes(int64_t M, int64_t N, int64_t K, moex_dtype adt, moex_dtype bdt) {
    if (M <= 0 || N <= 0 || K <= 0) return 0;
    if (adt == MOEX_DTYPE_F32 && bdt == MOEX_DTYPE_F32) return 0;
#ifdef MOEX_HAVE_SBGEMM
    if (adt == MOEX_DTYPE_BF16 && bdt == MOEX_DTYPE_BF16) return 0;
#endif
    const int64_t mc = min64(M, B_MC), kc = min64(K, B_KC), nc = min64(N, B_NC);
    return (adt != MOEX_DTYPE_F32 ? bytes64(mc * kc) : 0) + (bdt != MOEX_DTYPE_F32 ? bytes64(kc * nc) : 0);
}

static int fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

static void blas_threads(moex_context *ctx) {
    if (openblas_get_num_threads() != ctx->num_threads) openblas_set_num_threads(ctx->num_threads);
}

static enum CBLAS_TRANSPOSE cblas_trans(moex_cpu_trans t) { return t == MOEX_CPU_TRANS ? CblasTrans : CblasNoTrans; }

/* The f32 view of block (r0.., c0..) of op(X): X itself when f32, else the block
 * converted into `buf`. Returns the pointer, sets *ld. */
static const float *blas_block(moex_context *ctx, const moex_cpu_matrix *x, int64_t op_r0, int64_t op_c0,
                               int64_t op_rows, int64_t op_cols, float *buf, int64_t *ld) {
    /* block of the stored matrix */
    const int64_t r0 = x->trans == MOEX_CPU_TRANS ? op_c0 : op_r0, c0 = x->trans == MOEX_CPU_TRANS ? op_r0 : op_c0;
    const int64_t rows = x->trans == MOEX_CPU_TRANS ? op_cols : op_rows;
    const int64_t cols = x->trans == MOEX_CPU_TRANS ? op_rows : op_cols;
    if (x->dtype == MOEX_DTYPE_F32) {
        *ld = x->ld;
        return (const float *)x->data + r0 * x->ld + c0;
    }
    load_block(ctx, buf, cols, x, r0, c0, rows, cols);
    *ld = cols;
    return buf;
}

static void gemm_blas_blocked(moex_context *ctx, int64_t M, int64_t N, int64_t K, moex_cpu_matrix a,
                              moex_cpu_matrix b, float *c, int64_t ldc, moex_cpu_gemm_mode mode, void *scratch) {
    float *abuf = (float *)scratch;
    float *bbuf = (float *)((char *)scratch +
                            (a.dtype != MOEX_DTYPE_F32 ? bytes64(min64(M, B_MC) * min64(K, B_KC)) : 0));
    for (int64_t n0 = 0; n0 < N; n0 += B_NC) {
        const int64_t nc = min64(B_NC, N - n0);
        for (int64_t m0 = 0; m0 < M; m0 += B_MC) {
            const int64_t mc = min64(B_MC, M - m0);
            for (int64_t k0 = 0; k0 < K; k0 += B_KC) {
                const int64_t kc = min64(B_KC, K - k0);
                int64_t lda, ldb;
                const float *ab = blas_block(ctx, &a, m0, k0, mc, kc, abuf, &lda);
                const float *bb = blas_block(ctx, &b, k0, n0, kc, nc, bbuf, &ldb);
                const float beta = k0 == 0 && mode == MOEX_CPU_GEMM_WRITE ? 0.0f : 1.0f;
                blas_threads(ctx);
                cblas_sgemm(CblasRowMajor, cblas_trans(a.trans), cblas_trans(b.trans), (int)mc, (int)nc, (int)kc,
                            1.0f, ab, (int)lda, bb, (int)ldb, beta, c + m0 * ldc + n0, (int)ldc);
            }
        }
    }
}

#endif /* MOEX_HAVE_OPENBLAS */

/* ---- entry points -------------------------------------------------------------------- */

size_t moex_cpu_gemm_scratch_bytes(int64_t M, int64_t N, int64_t K, moex_dtype a_dtype, moex_dtype b_dtype) {
#ifdef MOEX_HAVE_OPENBLAS
    /* The C loop nest stays available for sizes BLAS cannot take; its scratch is small. */
    const size_t blas = blas_scratch_bytes(M, N, K, a_dtype, b_dtype), loop = c_scratch_bytes(M, N, K);
    return blas > loop ? blas : loop;
#else
    return c_scratch_bytes(M, N, K);
#endif
}

void moex_cpu_gemm(moex_context *ctx, int64_t M, int64_t N, int64_t K, moex_cpu_matrix a, moex_cpu_matrix b,
                   float *c, int64_t ldc, moex_cpu_gemm_mode mode, void *scratch) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (mode == MOEX_CPU_GEMM_WRITE)
            for (int64_t m = 0; m < M; m++) memset(c + m * ldc, 0, (size_t)N * sizeof(float));
        return;
    }
#ifdef MOEX_HAVE_OPENBLAS
    if (fits_int(M) && fits_int(N) && fits_int(K) && fits_int(a.ld) && fits_int(b.ld) && fits_int(ldc)) {
        const float beta = mode == MOEX_CPU_GEMM_WRITE ? 0.0f : 1.0f;
        if (a.dtype == MOEX_DTYPE_F32 && b.dtype == MOEX_DTYPE_F32) {
            blas_threads(ctx);
            cblas_sgemm(CblasRowMajor, cblas_trans(a.trans), cblas_trans(b.trans), (int)M, (int)N, (int)K, 1.0f,
                        (const float *)a.data, (int)a.ld, (const float *)b.data, (int)b.ld, beta, c, (int)ldc);
            return;
        }
#ifdef MOEX_HAVE_SBGEMM
        if (a.dtype == MOEX_DTYPE_BF16 && b.dtype == MOEX_DTYPE_BF16) {
            blas_threads(ctx);
            cblas_sbgemm(CblasRowMajor, cblas_trans(a.trans), cblas_trans(b.trans), (int)M, (int)N, (int)K, 1.0f,
                         (const bfloat16 *)a.data, (int)a.ld, (const bfloat16 *)b.data, (int)b.ld, beta, c,
                         (int)ldc);
            return;
        }
#endif
        gemm_blas_blocked(ctx, M, N, K, a, b, c, ldc, mode, scratch);
        return;
    }
#endif
    gemm_c(ctx, M, N, K, a, b, c, ldc, mode, scratch);
}
