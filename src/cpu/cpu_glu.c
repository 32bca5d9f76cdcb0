/*
 * cpu_glu.c - the CPU scaled GLU, forward and backward (math in src/core/glu_math.h).
 *
 *   forward:  z[i, j] = p_i * act(a_ij) g(b_ij)                       z  [T, F]   =
 *   backward: (da_ij, db_ij) = d z[i, j] / d(a_ij, b_ij) * dz_ij       dh [T, 2F]  =
 *             dprobs_i += sum_j dz_ij act(a_ij) g(b_ij)                dprobs [T]  +=
 * with p_i = probs[i] (1 when probs is absent). The rows done are [0, off[G]) of the
 * prepared groups when given, else all T; the rest are neither read nor written. Everything is
 * computed in f32 and rounded once when stored; the dprobs sum of a row runs over j in
 * increasing order, so results do not depend on the number of threads.
 *
 * Inside the backend the backward also accepts an absent dh (the grouped MLP asks only
 * for dprobs that way); the public API always passes one.
 *
 * Workspace: none.
 */
#include "glu_math.h"
#include "cpu_ops.h"
#include "cpu_convert.h"

/* Elements per thread chunk worth the hand-off, and per f32 staging block of a row. */
#define GLU_GRAIN_ELEMS 16384
#define GLU_BLOCK 256

/* What a range of rows needs: the tensors as raw pointers (NULL when absent). */
typedef struct glu_job {
    moex_glu_consts c;
    int64_t F, L;               /* F, and the half-segment length (glu_math.h) */
    moex_dtype dt;
    const void *h;              /* [T, 2F] */
    const float *probs;         /* [T] or NULL */
    void *z;                    /* forward: [T, F] */
    const void *dz;             /* backward: [T, F] */
    void *dh;                   /* backward: [T, 2F] or NULL */
    float *dprobs;              /* backward: [T] or NULL */
} glu_job;

/* Rows [begin, end): each segment of a row is staged in f32 blocks of GLU_BLOCK columns. */
static void glu_forward_rows(void *arg, int64_t begin, int64_t end) {
    const glu_job *jb = (const glu_job *)arg;
    const int64_t F = jb->F, L = jb->L;
    float a[GLU_BLOCK], b[GLU_BLOCK], z[GLU_BLOCK];
    for (int64_t i = begin; i < end; i++) {
        const float p = jb->probs ? jb->probs[i] : 1.0f;
        for (int64_t s = 0; s < F; s += L) {            /* segment: a at 2s, b at 2s + L */
            for (int64_t j0 = 0; j0 < L; j0 += GLU_BLOCK) {
                const int64_t n = L - j0 < GLU_BLOCK ? L - j0 : GLU_BLOCK;
                const int64_t ha = i * 2 * F + 2 * s + j0;
                moex_cpu_load_f32(a, moex_cpu_cat(jb->h, jb->dt, ha), jb->dt, n);
                moex_cpu_load_f32(b, moex_cpu_cat(jb->h, jb->dt, ha + L), jb->dt, n);
                for (int64_t j = 0; j < n; j++) z[j] = moex_glu_forward(jb->c, a[j], b[j], p);
                moex_cpu_store_f32(moex_cpu_at(jb->z, jb->dt, i * F + s + j0), jb->dt, z, n);
            }
        }
    }
}

static void glu_backward_rows(void *arg, int64_t begin, int64_t end) {
    const glu_job *jb = (const glu_job *)arg;
    const int64_t F = jb->F, L = jb->L;
    float a[GLU_BLOCK], b[GLU_BLOCK], dz[GLU_BLOCK], da[GLU_BLOCK], db[GLU_BLOCK];
    for (int64_t i = begin; i < end; i++) {
        const float p = jb->probs ? jb->probs[i] : 1.0f;
        float dp = 0.0f;                                /* this row's dprobs, j increasing */
        for (int64_t s = 0; s < F; s += L) {
            for (int64_t j0 = 0; j0 < L; j0 += GLU_BLOCK) {
                const int64_t n = L - j0 < GLU_BLOCK ? L - j0 : GLU_BLOCK;
                const int64_t ha = i * 2 * F + 2 * s + j0;
                moex_cpu_load_f32(a, moex_cpu_cat(jb->h, jb->dt, ha), jb->dt, n);
                moex_cpu_load_f32(b, moex_cpu_cat(jb->h, jb->dt, ha + L), jb->dt, n);
                moex_cpu_load_f32(dz, moex_cpu_cat(jb->dz, jb->dt, i * F + s + j0), jb->dt, n);
                for (int64_t j = 0; j < n; j++) {
                    float term;
                    moex_glu_backward(jb->c, a[j], b[j], p, dz[j], &da[j], &db[j], &term);
                    dp += term;
                }
                if (jb->dh) {
                    moex_cpu_store_f32(moex_cpu_at(jb->dh, jb->dt, ha), jb->dt, da, n);
                    moex_cpu_store_f32(moex_cpu_at(jb->dh, jb->dt, ha + L), jb->dt, db, n);
                }
            }
        }
        if (jb->dprobs) jb->dprobs[i] += dp;
    }
}

static glu_job glu_job_of(const moex_glu_params *glu, const moex_glu_dims *d, const void *h,
                          const moex_tensor *probs) {
    glu_job jb = {0};
    jb.c = moex_glu_consts_of(glu);
    jb.F = d->F;
    jb.L = moex_glu_segment(glu->layout, d->F);
    jb.dt = d->dt;
    jb.h = h;
    jb.probs = moex_present(probs) ? (const float *)probs->data : NULL;
    return jb;
}

static int64_t glu_grain(int64_t F) {
    return F >= GLU_GRAIN_ELEMS ? 1 : GLU_GRAIN_ELEMS / (F > 0 ? F : 1);
}

/* Runs fn over the rows done: [0, off[G]) of the prepared groups when given, else all T. */
static moex_status glu_run(moex_context *ctx, const moex_groups *grp, const moex_glu_dims *d, moex_cpu_range_fn fn,
                           glu_job *jb) {
    const int64_t rows = grp ? grp->off[grp->G] : d->T;
    if (rows > 0 && d->F > 0) moex_cpu_parallel_for(ctx, rows, glu_grain(d->F), fn, jb);
    return MOEX_OK;
}

/* The GLU needs no workspace. */
size_t moex_cpu_glu_fwd_ws(moex_context *ctx, const moex_scaled_glu_args *a, const moex_glu_dims *d) {
    return 0;
}

size_t moex_cpu_glu_bwd_ws(moex_context *ctx, const moex_scaled_glu_grad_args *a, const moex_glu_dims *d) {
    return 0;
}

moex_status moex_cpu_glu_fwd(moex_context *ctx, const moex_call *c, const moex_groups *grp,
                                        const moex_scaled_glu_args *a, const moex_glu_dims *d, void *ws) {
    glu_job jb = glu_job_of(&a->glu, d, a->h.data, &a->probs);
    jb.z = a->z.data;
    return glu_run(ctx, grp, d, glu_forward_rows, &jb);
}

moex_status moex_cpu_glu_bwd(moex_context *ctx, const moex_call *c, const moex_groups *grp,
                                         const moex_scaled_glu_grad_args *a, const moex_glu_dims *d, void *ws) {
    glu_job jb = glu_job_of(&a->glu, d, a->h.data, &a->probs);
    jb.dz = a->dz.data;
    jb.dh = moex_present(&a->dh) ? a->dh.data : NULL;
    jb.dprobs = moex_present(&a->dprobs) ? (float *)a->dprobs.data : NULL;
    if (!jb.dh && !jb.dprobs) return MOEX_OK;   /* nothing asked */
    return glu_run(ctx, grp, d, glu_backward_rows, &jb);
}
