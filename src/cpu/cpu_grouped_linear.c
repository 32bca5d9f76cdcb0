/*
 * cpu_grouped_linear.c - the CPU grouped linear layer. Group g owns rows [off[g], off[g+1]).
 *
 *   forward:          y_g  = x_g W_g^T (+ b_g | + p_i b_g)                y      [T, N]  =
 *   backward_data:    dx_g = dy_g W_g                                     dx     [T, K]  =
 *                     dbias_g = sum_i dy_i  (SCALED: sum_i p_i dy_i)      dbias  [G, N]  =  (f32 sum)
 *                     dprobs_i += sum_j dy_ij b_gj   (SCALED)             dprobs [T]     += (f32)
 *   backward_weight:  dW_g = dy_g^T x_g                                   dw  [G, N, K]  = or +=
 *
 * Every GEMM runs once per group on the group's contiguous rows (cpu_gemm.h), in f32.
 * When the output is f32 the GEMM writes it directly; otherwise it writes an f32 row tile
 * of the workspace, which is then finished (bias, probs) and rounded once into the output.
 * Rows past sum(splits) are neither read nor written. The groups come prepared (their
 * offsets read and checked by moex_cpu_groups_prepare before anything is written).
 *
 * Determinism: dbias sums the rows of a group in increasing order, column by column;
 * dprobs sums a row's products in eight fixed lanes; neither depends on the thread count.
 *
 * Workspace (from shapes and dtypes only): an f32 row tile when the output is not f32; the
 * GEMM's scratch.
 */
#include "cpu_convert.h"
#include "cpu_gemm.h"
#include "cpu_ops.h"

#include <string.h>

#define TILE_ELEMS (1 << 20)     /* f32 elements of an output row tile (4 MiB) */
#define TILE_MIN_ROWS 64
#define TILE_MAX_ROWS 1024
#define ELEM_GRAIN 16384         /* elements of element-wise work worth a thread */
#define CHUNK 256                /* columns converted at a time in element-wise loops */

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Rows of an f32 output tile whose rows hold `cols` values. */
static int64_t tile_rows(int64_t cols) {
    int64_t r = TILE_ELEMS / cols;
    if (r < TILE_MIN_ROWS) r = TILE_MIN_ROWS;
    if (r > TILE_MAX_ROWS) r = TILE_MAX_ROWS;
    return r;
}

static int64_t row_grain(int64_t cols) { return 1 + ELEM_GRAIN / cols; }

/* n values at src as f32: src itself when f32, else converted into buf. */
static const float *as_f32(float *buf, const void *src, moex_dtype dt, int64_t n) {
    if (dt == MOEX_DTYPE_F32) return (const float *)src;
    moex_cpu_load_f32(buf, src, dt, n);
    return buf;
}

/* ---- workspace ------------------------------------------------------------------------ */

typedef struct gl_ws {
    const int64_t *off;     /* [G+1], the prepared groups' */
    float *tile;            /* [tile_rows, cols] f32, or NULL */
    void *gemm;             /* GEMM scratch, or NULL */
} gl_ws;

/* Lays the workspace out (when ws != NULL) and returns its size. */
static size_t gl_ws_layout(int64_t tile_floats, size_t gemm_bytes, void *ws, gl_ws *out) {
    const size_t tile_bytes = moex_sz_align(moex_sz_bytes(tile_floats, 1, sizeof(float)), 64);
    if (ws) {
        char *p = (char *)ws;
        out->tile = tile_floats > 0 ? (float *)p : NULL;
        out->gemm = gemm_bytes > 0 ? (void *)(p + tile_bytes) : NULL;
    }
    return moex_sz_add(tile_bytes, gemm_bytes);
}

/* The workspace of the products C[M, cols] (= A B over `depth`, operands of dtype dt) of a
 * direction: through the f32 row tile unless the output is f32 (f32_out). */
static size_t product_ws(int f32_out, int64_t M, int64_t cols, int64_t depth, moex_dtype dt, void *ws,
                         gl_ws *out) {
    const int64_t rows = f32_out ? M : min64(M, tile_rows(cols));
    return gl_ws_layout(f32_out ? 0 : rows * cols, moex_cpu_gemm_scratch_bytes(rows, cols, depth, dt, dt), ws, out);
}

/* ---- finishing output rows: bias, probs, rounding ------------------------------------- */

/* dst row r = round(src row r (+ b_g | + p_r b_g)) for the rows [row0, row0 + rows) of
 * the output; src is f32 (a tile, or dst itself when dst is f32). */
typedef struct finish_job {
    const float *src;
    int64_t row0;           /* output row of src's row 0 */
    void *dst;              /* the output [T, cols] */
    moex_dtype dt;
    int64_t cols;
    moex_bias_mode bias_mode;
    const void *bias;       /* [G, cols] */
    moex_dtype bias_dt;
    const float *probs;     /* [T]; SCALED */
    const int64_t *off;
    int64_t G;
} finish_job;

static void finish_rows(void *arg, int64_t begin, int64_t end) {
    const finish_job *j = (const finish_job *)arg;
    const int64_t cols = j->cols;
    float bbuf[CHUNK], out[CHUNK];
    int64_t g = j->bias_mode != MOEX_BIAS_NONE ? moex_cpu_group_of(j->off, j->G, j->row0 + begin) : 0;
    for (int64_t r = begin; r < end; r++) {
        const int64_t row = j->row0 + r;
        const float *s = j->src + r * cols;
        void *d = moex_cpu_at(j->dst, j->dt, row * cols);
        if (j->bias_mode == MOEX_BIAS_NONE) {
            if ((const void *)s != d) moex_cpu_store_f32(d, j->dt, s, cols);
            continue;
        }
        while (row >= j->off[g + 1]) g++;
        const float p = j->bias_mode == MOEX_BIAS_SCALED ? j->probs[row] : 1.0f;
        for (int64_t c0 = 0; c0 < cols; c0 += CHUNK) {
            const int64_t n = min64(CHUNK, cols - c0);
            const float *b = as_f32(bbuf, moex_cpu_cat(j->bias, j->bias_dt, g * cols + c0), j->bias_dt, n);
            if (j->bias_mode == MOEX_BIAS_ADD)
                for (int64_t c = 0; c < n; c++) out[c] = s[c0 + c] + b[c];
            else
                for (int64_t c = 0; c < n; c++) out[c] = s[c0 + c] + p * b[c];
            moex_cpu_store_f32(moex_cpu_at(d, j->dt, c0), j->dt, out, n);
        }
    }
}

static void finish(moex_context *ctx, finish_job *j, int64_t rows) {
    moex_cpu_parallel_for(ctx, rows, row_grain(j->cols), finish_rows, j);
}

/* The per-group products of the forward and the backward data: out_g = in_g op(W_g) for
 * every group g, with in [T, depth] of the output's dtype, op(W_g) [depth, cols] the stored
 * W_g (ld w_ld) transposed or not (w_trans), and the output out [T, cols] of dtype dt as fj
 * gives them (fj->dst, fj->cols, fj->dt). An f32 output is written in place (its bias is the
 * caller's); any other goes through the workspace's f32 row tile, each tile finished by fj
 * (bias, probs; fj->src and fj->row0 are set here) and rounded into out. */
static void group_products(moex_context *ctx, const gl_ws *w, const void *in, int64_t depth, const moex_weight *wt,
                           int64_t w_ld, moex_cpu_trans w_trans, finish_job *fj) {
    const int64_t cols = fj->cols, tr = tile_rows(cols);
    const moex_dtype dt = fj->dt;
    float *const out = (float *)fj->dst;   /* read as f32 only when dt is f32 */
    for (int64_t g = 0; g < fj->G; g++) {
        const int64_t m = w->off[g + 1] - w->off[g];
        if (m == 0) continue;
        const moex_cpu_matrix wg = moex_cpu_matrix_of(moex_weight_ptr(wt, g), dt, w_ld, w_trans);
        if (dt == MOEX_DTYPE_F32) {
            const moex_cpu_matrix ing = moex_cpu_matrix_of(moex_cpu_cat(in, dt, w->off[g] * depth), dt, depth,
                                                           MOEX_CPU_NOTRANS);
            moex_cpu_gemm(ctx, m, cols, depth, ing, wg, out + w->off[g] * cols, cols, MOEX_CPU_GEMM_WRITE,
                          w->gemm);
            continue;
        }
        for (int64_t r0 = 0; r0 < m; r0 += tr) {
            const int64_t row0 = w->off[g] + r0, n = min64(tr, m - r0);
            const moex_cpu_matrix it = moex_cpu_matrix_of(moex_cpu_cat(in, dt, row0 * depth), dt, depth,
                                                          MOEX_CPU_NOTRANS);
            moex_cpu_gemm(ctx, n, cols, depth, it, wg, w->tile, cols, MOEX_CPU_GEMM_WRITE, w->gemm);
            fj->src = w->tile;
            fj->row0 = row0;
            finish(ctx, fj, n);
        }
    }
}

/* ---- forward -------------------------------------------------------------------------- */

static size_t fwd_ws(const moex_gl_dims *d, void *ws, gl_ws *out) {
    return product_ws(d->dt == MOEX_DTYPE_F32, d->T, d->N, d->K, d->dt, ws, out);
}

size_t moex_cpu_linear_fwd_ws(moex_context *ctx, const moex_grouped_linear_args *a,
                                          const moex_gl_dims *d) {
    return fwd_ws(d, NULL, NULL);
}

moex_status moex_cpu_linear_fwd(moex_context *ctx, const moex_call *c, const moex_groups *grp,
                                            const moex_grouped_linear_args *a, const moex_gl_dims *d, void *ws) {
    gl_ws w = {NULL, NULL, NULL};
    fwd_ws(d, ws, &w);
    w.off = grp->off;
    const int64_t G = d->G, K = d->K, N = d->N, rows = w.off[G];
    const moex_dtype dt = d->dt;
    finish_job fj = {NULL, 0, a->y.data, dt, N, a->bias_mode,
                     a->bias_mode != MOEX_BIAS_NONE ? a->bias.data : NULL, a->bias.dtype,
                     a->bias_mode == MOEX_BIAS_SCALED ? (const float *)a->probs.data : NULL, w.off, G};
    group_products(ctx, &w, a->x.data, K, &a->w, K, MOEX_CPU_TRANS, &fj);   /* y_g = x_g W_g^T */
    if (dt == MOEX_DTYPE_F32 && a->bias_mode != MOEX_BIAS_NONE) { /* the bias, in place, in one pass */
        fj.src = (const float *)a->y.data;
        fj.row0 = 0;
        finish(ctx, &fj, rows);
    }
    return MOEX_OK;
}

/* ---- backward data -------------------------------------------------------------------- */

/* dprobs[i] += sum_j dy[i, j] b[g(i), j], in 8 lanes (lane l takes j = l mod 8) added in a
 * fixed order. */
typedef struct dprobs_job {
    const void *dy;
    moex_dtype dt;
    int64_t N, G;
    const void *bias;
    moex_dtype bias_dt;
    const int64_t *off;
    float *dprobs;
} dprobs_job;

static void dprobs_rows(void *arg, int64_t begin, int64_t end) {
    const dprobs_job *j = (const dprobs_job *)arg;
    float ybuf[CHUNK], bbuf[CHUNK];
    int64_t g = moex_cpu_group_of(j->off, j->G, begin);
    for (int64_t i = begin; i < end; i++) {
        while (i >= j->off[g + 1]) g++;
        float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t c0 = 0; c0 < j->N; c0 += CHUNK) {
            const int64_t n = min64(CHUNK, j->N - c0);
            const float *y = as_f32(ybuf, moex_cpu_cat(j->dy, j->dt, i * j->N + c0), j->dt, n);
            const float *b = as_f32(bbuf, moex_cpu_cat(j->bias, j->bias_dt, g * j->N + c0), j->bias_dt, n);
            int64_t c = 0;
            for (; c + 8 <= n; c += 8)
                for (int l = 0; l < 8; l++) lane[l] += y[c + l] * b[c + l];
            for (; c < n; c++) lane[c % 8] += y[c] * b[c];   /* n % 8 != 0 only in the last chunk */
        }
        j->dprobs[i] += ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    }
}

static size_t dgrad_ws(const moex_grouped_linear_dgrad_args *a, const moex_gl_dims *d, void *ws, gl_ws *out) {
    if (!moex_present(&a->dx)) return gl_ws_layout(0, 0, ws, out);
    return product_ws(d->dt == MOEX_DTYPE_F32, d->T, d->K, d->N, d->dt, ws, out);
}

size_t moex_cpu_linear_dgrad_ws(moex_context *ctx, const moex_grouped_linear_dgrad_args *a,
                                                const moex_gl_dims *d) {
    return dgrad_ws(a, d, NULL, NULL);
}

moex_status moex_cpu_linear_dgrad(moex_context *ctx, const moex_call *c, const moex_groups *grp,
                                                  const moex_grouped_linear_dgrad_args *a,
                                                  const moex_gl_dims *d, void *ws) {
    gl_ws w = {NULL, NULL, NULL};
    dgrad_ws(a, d, ws, &w);
    w.off = grp->off;
    const int64_t G = d->G, K = d->K, N = d->N, rows = w.off[G];
    const moex_dtype dt = d->dt;

    if (moex_present(&a->dx)) { /* dx_g = dy_g W_g */
        finish_job fj = {NULL, 0, a->dx.data, dt, K, MOEX_BIAS_NONE, NULL, dt, NULL, w.off, G};
        group_products(ctx, &w, a->dy.data, N, &a->w, K, MOEX_CPU_NOTRANS, &fj);
    }

    if (moex_present(&a->dbias))
        moex_cpu_group_colsum(ctx, w.off, G, a->dy.data, dt, N,
                              a->bias_mode == MOEX_BIAS_SCALED ? (const float *)a->probs.data : NULL,
                              a->dbias.data, a->dbias.dtype);

    if (moex_present(&a->dprobs) && rows > 0) {
        dprobs_job j = {a->dy.data, dt, N, G, a->bias.data, a->bias.dtype, w.off, (float *)a->dprobs.data};
        moex_cpu_parallel_for(ctx, rows, row_grain(N), dprobs_rows, &j);
    }
    return MOEX_OK;
}

/* ---- backward weight ------------------------------------------------------------------ */

static size_t wgrad_ws(const moex_grouped_linear_wgrad_args *a, const moex_gl_dims *d, void *ws, gl_ws *out) {
    return product_ws(a->dw.t.dtype == MOEX_DTYPE_F32, d->N, d->K, d->T, d->dt, ws, out);
}

size_t moex_cpu_linear_wgrad_ws(moex_context *ctx, const moex_grouped_linear_wgrad_args *a,
                                                  const moex_gl_dims *d) {
    return wgrad_ws(a, d, NULL, NULL);
}

moex_status moex_cpu_linear_wgrad(moex_context *ctx, const moex_call *c,
                                                    const moex_groups *grp,
                                                    const moex_grouped_linear_wgrad_args *a,
                                                    const moex_gl_dims *d, void *ws) {
    gl_ws w = {NULL, NULL, NULL};
    wgrad_ws(a, d, ws, &w);
    w.off = grp->off;
    const int64_t G = d->G, K = d->K, N = d->N;
    const moex_dtype dt = d->dt, dw_dt = a->dw.t.dtype;
    const moex_cpu_gemm_mode mode =
        a->dw_mode == MOEX_GRAD_ACCUMULATE ? MOEX_CPU_GEMM_ACCUMULATE : MOEX_CPU_GEMM_WRITE;
    const int64_t tr = tile_rows(K);
    for (int64_t g = 0; g < G; g++) {
        const int64_t m = w.off[g + 1] - w.off[g]; /* the GEMM's depth; 0 gives zeros or leaves dW */
        const moex_cpu_matrix xg = moex_cpu_matrix_of(moex_cpu_cat(a->x.data, dt, w.off[g] * K), dt, K,
                                                      MOEX_CPU_NOTRANS);
        void *dwg = moex_weight_ptr(&a->dw, g);
        if (dw_dt == MOEX_DTYPE_F32) {
            const moex_cpu_matrix dyg = moex_cpu_matrix_of(moex_cpu_cat(a->dy.data, dt, w.off[g] * N), dt, N,
                                                           MOEX_CPU_TRANS);
            moex_cpu_gemm(ctx, N, K, m, dyg, xg, (float *)dwg, K, mode, w.gemm);
            continue;
        }
        for (int64_t n0 = 0; n0 < N; n0 += tr) { /* rows n0.. of dW_g: columns n0.. of dy_g */
            const int64_t n = min64(tr, N - n0);
            const moex_cpu_matrix dyt = moex_cpu_matrix_of(moex_cpu_cat(a->dy.data, dt, w.off[g] * N + n0), dt, N,
                                                           MOEX_CPU_TRANS);
            moex_cpu_gemm(ctx, n, K, m, dyt, xg, w.tile, K, MOEX_CPU_GEMM_WRITE, w.gemm);
            moex_cpu_store_f32_rows(ctx, moex_cpu_at(dwg, dw_dt, n0 * K), dw_dt, w.tile, n, K);
        }
    }
    return MOEX_OK;
}
