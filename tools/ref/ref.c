/*
 * ref.c - the fp64 reference of every foundation op (see ref.h): splits_to_offsets,
 * grouped linear forward/dgrad/wgrad, scaled GLU forward/backward, grouped MLP
 * forward/backward, each with its magnitude bounds. Plain loops, written for clarity.
 */
#include "ref.h"

#include <math.h>
#include <stdlib.h>

/* Optional-output helpers: write only when the array is not NULL. */
#define PUT(arr, i, v)                \
    do {                              \
        if (arr) (arr)[i] = (v);      \
    } while (0)

int64_t ref_offsets(const int64_t *splits, int64_t G, int64_t *off) {
    off[0] = 0;
    for (int64_t g = 0; g < G; g++) off[g + 1] = off[g] + splits[g];
    return off[G];
}

void ref_splits_to_offsets(const int64_t *splits, int64_t G, int64_t stride, int leading_zero,
                           int64_t *out) {
    int64_t sum = 0, j = 0;
    if (leading_zero) out[j++] = 0;
    for (int64_t g = 0; g < G; g++) {
        sum += splits[g];
        out[j++] = stride * sum;
    }
}

static int64_t *offsets_of(const int64_t *splits, int64_t G) {
    int64_t *off = (int64_t *)malloc((size_t)(G + 1) * sizeof *off);
    if (!off) abort();
    ref_offsets(splits, G, off);
    return off;
}

/* sum over j < n of a[j * as] b[j * bs], in increasing j, and the sum of the products'
 * magnitudes in *mag (the bound the tolerance model scales). */
static double dot_mag(const double *a, int64_t as, const double *b, int64_t bs, int64_t n, double *mag) {
    double s = 0, m = 0;
    for (int64_t j = 0; j < n; j++) {
        const double t = a[j * as] * b[j * bs];
        s += t;
        m += fabs(t);
    }
    *mag = m;
    return s;
}

/* ---- grouped linear ---------------------------------------------------------------- */

void ref_grouped_linear_forward(int64_t G, int64_t T, int64_t K, int64_t N, const int64_t *splits,
                                const double *x, const double *w, moex_bias_mode bias_mode,
                                const double *bias, const double *probs, double *y, double *yb) {
    (void)T;
    int64_t *off = offsets_of(splits, G);
    for (int64_t g = 0; g < G; g++) {
        const double *wg = w + g * N * K;
        for (int64_t i = off[g]; i < off[g + 1]; i++) {
            for (int64_t n = 0; n < N; n++) {
                double m;
                const double s = dot_mag(x + i * K, 1, wg + n * K, 1, K, &m);
                double b = 0;
                if (bias_mode == MOEX_BIAS_ADD) b = bias[g * N + n];
                if (bias_mode == MOEX_BIAS_SCALED) b = probs[i] * bias[g * N + n];
                y[i * N + n] = s + b;
                PUT(yb, i * N + n, m + fabs(b));
            }
        }
    }
    free(off);
}

void ref_grouped_linear_backward_data(int64_t G, int64_t T, int64_t K, int64_t N,
                                      const int64_t *splits, const double *dy, const double *w,
                                      moex_bias_mode bias_mode, const double *bias,
                                      const double *probs, double *dx, double *dxb, double *dbias,
                                      double *dbiasb, double *dprobs, double *dprobsb) {
    (void)T;
    int64_t *off = offsets_of(splits, G);
    for (int64_t g = 0; g < G; g++) {
        const double *wg = w + g * N * K;
        if (dx) {
            for (int64_t i = off[g]; i < off[g + 1]; i++) {
                for (int64_t k = 0; k < K; k++) {
                    double m;
                    const double s = dot_mag(dy + i * N, 1, wg + k, K, N, &m);
                    dx[i * K + k] = s;
                    PUT(dxb, i * K + k, m);
                }
            }
        }
        if (dbias && bias_mode != MOEX_BIAS_NONE) {
            for (int64_t n = 0; n < N; n++) {
                double s = 0, m = 0;
                for (int64_t i = off[g]; i < off[g + 1]; i++) {
                    double p = bias_mode == MOEX_BIAS_SCALED ? probs[i] : 1.0;
                    s += p * dy[i * N + n];
                    m += fabs(p * dy[i * N + n]);
                }
                dbias[g * N + n] = s;
                PUT(dbiasb, g * N + n, m);
            }
        }
        if (dprobs && bias_mode == MOEX_BIAS_SCALED) {
            for (int64_t i = off[g]; i < off[g + 1]; i++) {
                double m;
                const double s = dot_mag(dy + i * N, 1, bias + g * N, 1, N, &m);
                dprobs[i] = s;
                PUT(dprobsb, i, m);
            }
        }
    }
    free(off);
}

void ref_grouped_linear_backward_weight(int64_t G, int64_t T, int64_t K, int64_t N,
                                        const int64_t *splits, const double *x, const double *dy,
                                        double *dw, double *dwb) {
    (void)T;
    int64_t *off = offsets_of(splits, G);
    for (int64_t g = 0; g < G; g++) {
        for (int64_t n = 0; n < N; n++) {
            for (int64_t k = 0; k < K; k++) {
                double m;
                const double s = dot_mag(dy + off[g] * N + n, N, x + off[g] * K + k, K, off[g + 1] - off[g], &m);
                dw[(g * N + n) * K + k] = s;
                PUT(dwb, (g * N + n) * K + k, m);
            }
        }
    }
    free(off);
}

/* ---- scaled GLU -------------------------------------------------------------------- */

void ref_glu_columns(moex_glu_layout layout, int64_t F, int64_t j, int64_t *ja, int64_t *jb) {
    if (layout == MOEX_GLU_INTERLEAVED_32) {
        int64_t blk = j / 32, r = j % 32;
        *ja = blk * 64 + r;
        *jb = blk * 64 + 32 + r;
    } else {
        *ja = j;
        *jb = F + j;
    }
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

ref_glu_point ref_glu_eval(const moex_glu_params *glu, double a, double b) {
    ref_glu_point p;
    if (glu->kind == MOEX_GLU_CLAMPED_SWIGLU) {
        double L = glu->limit, al = glu->alpha, off = glu->offset;
        double ac = a < L ? a : L;      /* min(a, limit); slope 0 at a == limit, as torch.clamp */
        double s = sigmoid(al * ac);
        p.act = ac * s;
        p.slope_mag = s + al * fabs(ac) * s * (1 - s);
        double d = s * (1 + al * ac * (1 - s));
        double d2 = al * s * (1 - s) * (2 + al * ac * (1 - 2 * s));
        p.act2_mag = al * s * (1 - s) * (2 + al * fabs(ac) * fabs(1 - 2 * s));
        p.dact = a < L ? d : 0.0;
        p.act2 = a < L ? d2 : 0.0;
        double bc = b < -L ? -L : (b > L ? L : b);
        p.g = bc + off;
        p.dg = (b > -L && b < L) ? 1.0 : 0.0;
    } else {
        double s = sigmoid(a);
        p.act = a * s;
        p.dact = s * (1 + a * (1 - s));
        p.act2 = s * (1 - s) * (2 + a * (1 - 2 * s));
        p.slope_mag = s + fabs(a) * s * (1 - s);
        p.act2_mag = s * (1 - s) * (2 + fabs(a) * fabs(1 - 2 * s));
        p.g = b;
        p.dg = 1.0;
    }
    return p;
}

void ref_scaled_glu_forward(const moex_glu_params *glu, int64_t rows, int64_t F, const double *h,
                            const double *hb, const double *probs, double *z, double *zb) {
    for (int64_t i = 0; i < rows; i++) {
        double p = probs ? probs[i] : 1.0;
        for (int64_t j = 0; j < F; j++) {
            int64_t ja, jb;
            ref_glu_columns(glu->layout, F, j, &ja, &jb);
            double a = h[i * 2 * F + ja], b = h[i * 2 * F + jb];
            double ba = hb ? hb[i * 2 * F + ja] : fabs(a), bb = hb ? hb[i * 2 * F + jb] : fabs(b);
            ref_glu_point q = ref_glu_eval(glu, a, b);
            double v = p * q.act * q.g;
            z[i * F + j] = v;
            PUT(zb, i * F + j, fabs(p) * (q.slope_mag * fabs(q.g) * ba + fabs(q.act) * bb) + fabs(v));
        }
    }
}

void ref_scaled_glu_backward(const moex_glu_params *glu, int64_t rows, int64_t F, const double *h,
                             const double *hb, const double *probs, const double *dz,
                             const double *dzb, double *dh, double *dhb, double *dprobs,
                             double *dprobsb) {
    for (int64_t i = 0; i < rows; i++) {
        double p = probs ? probs[i] : 1.0, ap = fabs(p);
        double dp = 0, dpm = 0;
        for (int64_t j = 0; j < F; j++) {
            int64_t ja, jb;
            ref_glu_columns(glu->layout, F, j, &ja, &jb);
            double a = h[i * 2 * F + ja], b = h[i * 2 * F + jb];
            double ba = hb ? hb[i * 2 * F + ja] : fabs(a), bb = hb ? hb[i * 2 * F + jb] : fabs(b);
            double d = dz[i * F + j], db = dzb ? dzb[i * F + j] : fabs(d), ad = fabs(d);
            ref_glu_point q = ref_glu_eval(glu, a, b);
            dh[i * 2 * F + ja] = p * d * q.dact * q.g;
            dh[i * 2 * F + jb] = p * d * q.act * q.dg;
            PUT(dhb, i * 2 * F + ja,
                ap * (db * q.slope_mag * fabs(q.g) + ad * q.act2_mag * ba * fabs(q.g) +
                      ad * q.slope_mag * bb));
            PUT(dhb, i * 2 * F + jb, ap * (db * fabs(q.act) + ad * q.slope_mag * ba));
            dp += d * q.act * q.g;
            dpm += db * fabs(q.act * q.g) + ad * (q.slope_mag * ba * fabs(q.g) + fabs(q.act) * bb);
        }
        if (dprobs) dprobs[i] = dp;
        PUT(dprobsb, i, dpm);
    }
}

/* ---- grouped MLP ------------------------------------------------------------------- */

void ref_grouped_mlp_forward(const ref_mlp *p, double *h, double *hb, double *z, double *zb,
                             double *y, double *yb) {
    const int64_t G = p->G, H = p->H, F = p->F;
    int64_t *off = offsets_of(p->splits, G);
    const int64_t rows = off[G];
    double *hb_own = hb ? NULL : (double *)malloc((size_t)(rows * 2 * F + 1) * sizeof(double));
    double *zb_own = zb ? NULL : (double *)malloc((size_t)(rows * F + 1) * sizeof(double));
    double *hbv = hb ? hb : hb_own, *zbv = zb ? zb : zb_own;
    if (!hbv || !zbv) abort();

    /* h = x W1_g^T (+ b1_g) */
    for (int64_t g = 0; g < G; g++) {
        const double *w1 = p->w1 + g * 2 * F * H;
        for (int64_t i = off[g]; i < off[g + 1]; i++) {
            for (int64_t j = 0; j < 2 * F; j++) {
                double m;
                const double s = dot_mag(p->x + i * H, 1, w1 + j * H, 1, H, &m);
                double b = p->b1 ? p->b1[g * 2 * F + j] : 0.0;
                h[i * 2 * F + j] = s + b;
                hbv[i * 2 * F + j] = m + fabs(b);
            }
        }
    }
    /* z = p * glu(h) */
    ref_scaled_glu_forward(&p->glu, rows, F, h, hbv, p->probs, z, zbv);
    /* y = z W2_g^T (+ b2_g | + p b2_g) */
    for (int64_t g = 0; g < G; g++) {
        const double *w2 = p->w2 + g * H * F;
        for (int64_t i = off[g]; i < off[g + 1]; i++) {
            for (int64_t n = 0; n < H; n++) {
                double s = 0, m = 0;
                for (int64_t j = 0; j < F; j++) {
                    s += z[i * F + j] * w2[n * F + j];
                    m += zbv[i * F + j] * fabs(w2[n * F + j]);
                }
                double b = 0;
                if (p->b2_mode == MOEX_BIAS_ADD) b = p->b2[g * H + n];
                if (p->b2_mode == MOEX_BIAS_SCALED) b = p->probs[i] * p->b2[g * H + n];
                y[i * H + n] = s + b;
                PUT(yb, i * H + n, m + fabs(b));
            }
        }
    }
    free(hb_own);
    free(zb_own);
    free(off);
}

void ref_grouped_mlp_backward(const ref_mlp *p, const double *dy, ref_mlp_grads *o) {
    const int64_t G = p->G, T = p->T, H = p->H, F = p->F;
    int64_t *off = offsets_of(p->splits, G);
    const int64_t rows = off[G];
    const size_t n2f = (size_t)(T * 2 * F + 1), nf = (size_t)(T * F + 1);
    double *h = calloc(n2f, sizeof(double)), *hb = calloc(n2f, sizeof(double));
    double *z = calloc(nf, sizeof(double)), *zb = calloc(nf, sizeof(double));
    double *y = calloc((size_t)(T * H + 1), sizeof(double));
    double *dz = calloc(nf, sizeof(double)), *dzb = calloc(nf, sizeof(double));
    double *dh = calloc(n2f, sizeof(double)), *dhb = calloc(n2f, sizeof(double));
    double *dpg = calloc((size_t)T + 1, sizeof(double)), *dpgb = calloc((size_t)T + 1, sizeof(double));
    if (!h || !hb || !z || !zb || !y || !dz || !dzb || !dh || !dhb || !dpg || !dpgb) abort();

    ref_grouped_mlp_forward(p, h, hb, z, zb, y, NULL);
    if (p->h_saved) { /* the saved h (and z) replace the exact ones; the bounds stay */
        for (int64_t i = 0; i < rows * 2 * F; i++) h[i] = p->h_saved[i];
        ref_scaled_glu_forward(&p->glu, rows, F, h, hb, p->probs, z, zb);
    }
    if (p->z_saved)
        for (int64_t i = 0; i < rows * F; i++) z[i] = p->z_saved[i];

    /* dz = dy W2_g */
    for (int64_t g = 0; g < G; g++) {
        const double *w2 = p->w2 + g * H * F;
        for (int64_t i = off[g]; i < off[g + 1]; i++) {
            for (int64_t j = 0; j < F; j++) {
                double m;
                const double s = dot_mag(dy + i * H, 1, w2 + j, F, H, &m);
                dz[i * F + j] = s;
                dzb[i * F + j] = m;
            }
        }
    }
    /* dh = glu'(h) dz, and the GLU's dprobs term */
    ref_scaled_glu_backward(&p->glu, rows, F, h, hb, p->probs, dz, dzb, dh, dhb,
                            p->probs ? dpg : NULL, p->probs ? dpgb : NULL);

    for (int64_t g = 0; g < G; g++) {
        const double *w1 = p->w1 + g * 2 * F * H;
        const int64_t r0 = off[g], r1 = off[g + 1];
        if (o->dx) { /* dx = dh W1_g */
            for (int64_t i = r0; i < r1; i++) {
                for (int64_t k = 0; k < H; k++) {
                    double s = 0, m = 0;
                    for (int64_t j = 0; j < 2 * F; j++) {
                        s += dh[i * 2 * F + j] * w1[j * H + k];
                        m += dhb[i * 2 * F + j] * fabs(w1[j * H + k]);
                    }
                    o->dx[i * H + k] = s;
                    PUT(o->dxb, i * H + k, m);
                }
            }
        }
        if (o->dw1) { /* dW1_g = dh_g^T x_g */
            for (int64_t j = 0; j < 2 * F; j++) {
                for (int64_t k = 0; k < H; k++) {
                    double s = 0, m = 0;
                    for (int64_t i = r0; i < r1; i++) {
                        s += dh[i * 2 * F + j] * p->x[i * H + k];
                        m += dhb[i * 2 * F + j] * fabs(p->x[i * H + k]);
                    }
                    o->dw1[(g * 2 * F + j) * H + k] = s;
                    PUT(o->dw1b, (g * 2 * F + j) * H + k, m);
                }
            }
        }
        if (o->dw2) { /* dW2_g = dy_g^T z_g */
            for (int64_t n = 0; n < H; n++) {
                for (int64_t j = 0; j < F; j++) {
                    double s = 0, m = 0;
                    for (int64_t i = r0; i < r1; i++) {
                        s += dy[i * H + n] * z[i * F + j];
                        m += fabs(dy[i * H + n]) * zb[i * F + j];
                    }
                    o->dw2[(g * H + n) * F + j] = s;
                    PUT(o->dw2b, (g * H + n) * F + j, m);
                }
            }
        }
        if (o->db1) { /* db1_g = sum_i dh_i */
            for (int64_t j = 0; j < 2 * F; j++) {
                double s = 0, m = 0;
                for (int64_t i = r0; i < r1; i++) {
                    s += dh[i * 2 * F + j];
                    m += dhb[i * 2 * F + j];
                }
                o->db1[g * 2 * F + j] = s;
                PUT(o->db1b, g * 2 * F + j, m);
            }
        }
        if (o->db2 && p->b2_mode != MOEX_BIAS_NONE) { /* db2_g = sum_i dy_i (or p_i dy_i) */
            for (int64_t n = 0; n < H; n++) {
                double s = 0, m = 0;
                for (int64_t i = r0; i < r1; i++) {
                    double pi = p->b2_mode == MOEX_BIAS_SCALED ? p->probs[i] : 1.0;
                    s += pi * dy[i * H + n];
                    m += fabs(pi * dy[i * H + n]);
                }
                o->db2[g * H + n] = s;
                PUT(o->db2b, g * H + n, m);
            }
        }
        if (o->dprobs && p->probs) { /* GLU term + scaled-bias term */
            for (int64_t i = r0; i < r1; i++) {
                double s = dpg[i], m = dpgb[i];
                if (p->b2_mode == MOEX_BIAS_SCALED) {
                    for (int64_t n = 0; n < H; n++) {
                        double t = dy[i * H + n] * p->b2[g * H + n];
                        s += t;
                        m += fabs(t);
                    }
                }
                o->dprobs[i] = s;
                PUT(o->dprobsb, i, m);
            }
        }
    }
    free(h); free(hb); free(z); free(zb); free(y); free(dz); free(dzb);
    free(dh); free(dhb); free(dpg); free(dpgb); free(off);
}
