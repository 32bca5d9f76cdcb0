/*
 * ref.h - the fp64 reference of moex: plain double arrays in, double arrays out, written
 * from the math in docs/ops.md and moex.h and sharing no code with the library. The tests
 * and `moex check` compare every backend with it. Also here: dtype rounding helpers
 * (independent of src/core/moex_half.h) and the tolerance model.
 *
 * Conventions
 *   - Shapes as in moex.h: x [T,K], w [G,N,K] (packed, row-major), bias [G,N], probs [T],
 *     y [T,N]; h [T,2F], z [T,F]. Group g owns rows [off[g], off[g+1]).
 *   - Every output is "=": it is the value (or gradient) itself. Where the library does
 *     "+=" (dprobs, ACCUMULATE weight grads) the caller adds its initial value.
 *   - Only rows < sum(splits) are read or written; the rest of every [T,...] output array
 *     is left as the caller set it.
 *   - Each output comes with a magnitude bound M (same shape, may be NULL when not
 *     wanted): the first-order bound of how far an f32-accumulating implementation can
 *     drift per unit of relative error, e.g. for a dot product M = sum_k |x_k w_k| plus the
 *     bias term's magnitude. Bounds propagate through chains (the grouped MLP): every
 *     intermediate the library stores (h, z, dz, dh) carries its own M, and the next
 *     stage's M sums |derivative| * M_in over its inputs. For the GLU the derivative
 *     magnitudes ignore the clamp (a clamp is 1-Lipschitz, so the unclamped slope bounds
 *     any point between the reference and the library's value).
 *
 * Tolerance model (ref_tol)
 *   |got - ref| <= c * ( u_out * |ref| + (u_mid + k * u_acc) * M ) + floor
 *     u_out  unit roundoff of the output dtype (f32 2^-24, bf16 2^-8, f16 2^-11): the
 *            final rounding;
 *     u_mid  unit roundoff of intermediates the library rounds on the way (the activation
 *            dtype for the grouped MLP's h, z, dz, dh; 0 for a single GEMM whose inputs are
 *            exact in their dtype); with M propagated as above, each intermediate's
 *            rounding error u_mid * |v| <= u_mid * M_v reaches the output;
 *     u_acc  2^-24: f32 accumulation; k the longest reduction (K, N, F, H or rows of a
 *            group) on the output's path, the worst-case f32 summation bound k * u_acc;
 *     c      a small safety constant (REF_TOL_C);
 *     floor  the smallest subnormal spacing of the output dtype (outputs that underflow).
 *   Inputs are first rounded to their dtype (ref_round_array) and the reference computes on
 *   the rounded values, so input rounding is not an error term.
 */
#ifndef MOEX_REF_H
#define MOEX_REF_H

#include "moex.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- dtypes --------------------------------------------------------------------------- */

/* Round to nearest even, in fp64 arithmetic (not via float). NaN stays NaN, overflow gives
 * +-inf, subnormals are handled. */
uint16_t ref_double_to_bf16(double v);
uint16_t ref_double_to_f16(double v);
double   ref_bf16_to_double(uint16_t h);
double   ref_f16_to_double(uint16_t h);

/* v rounded to dtype dt (F32: (float)v; I32/I64: unchanged). */
double ref_round(moex_dtype dt, double v);
void   ref_round_array(moex_dtype dt, double *v, int64_t n);

/* Unit roundoff: F32 2^-24, BF16 2^-8, F16 2^-11 (0 for integer dtypes). */
double ref_unit_roundoff(moex_dtype dt);

/* Element i of a buffer of dtype dt: store (rounded) and load. Integer dtypes round
 * toward zero on store. */
void   ref_store(moex_dtype dt, void *buf, int64_t i, double v);
double ref_load(moex_dtype dt, const void *buf, int64_t i);

/* n elements: buf[i] = round(src[i]); dst[i] = buf[i]. */
void ref_fill(moex_dtype dt, void *buf, const double *src, int64_t n);
void ref_read(moex_dtype dt, const void *buf, double *dst, int64_t n);

/* ---- tolerance model (see the top of this file) ------------------------------------ */

#define REF_TOL_C 2.0

typedef struct ref_tol_model {
    double u_out;   /* output dtype's unit roundoff                  */
    double u_mid;   /* intermediates' unit roundoff (0: none)        */
    double u_acc;   /* accumulation unit roundoff (f32: 2^-24)       */
    double k;       /* longest reduction on the path                 */
    double c;       /* safety constant                               */
    double floor;   /* absolute floor: output dtype's subnormal step */
} ref_tol_model;

/* Output dtype `out`, intermediates rounded to `mid` (pass MOEX_DTYPE_F32 with
 * mid_rounded = 0 when nothing is rounded on the way), longest reduction k. */
ref_tol_model ref_tol_for(moex_dtype out, moex_dtype mid, int mid_rounded, int64_t k);

/* The allowed |got - ref| of one element with reference `ref` and bound M. */
double ref_tol(const ref_tol_model *m, double ref, double bound);

/* ---- splits_to_offsets ------------------------------------------------------------- */

/* off[0] = 0, off[g+1] = off[g] + splits[g] (G+1 values). Returns the sum. */
int64_t ref_offsets(const int64_t *splits, int64_t G, int64_t *off);

/* One moex_offsets_output: LEADING_ZERO (leading_zero = 1): G+1 values stride*off[0..G];
 * INCLUSIVE (0): G values stride*off[1..G]. */
void ref_splits_to_offsets(const int64_t *splits, int64_t G, int64_t stride, int leading_zero,
                           int64_t *out);

/* ---- grouped linear ---------------------------------------------------------------- */

/* y_i = x_i W_g^T (+ b_g | + p_i b_g) for rows of group g.
 *   x [T,K], w [G,N,K], bias [G,N] (ADD/SCALED), probs [T] (SCALED) -> y [T,N], yb [T,N].
 *   yb = sum_k |x_ik w_gnk| + |bias term|. */
void ref_grouped_linear_forward(int64_t G, int64_t T, int64_t K, int64_t N, const int64_t *splits,
                                const double *x, const double *w, moex_bias_mode bias_mode,
                                const double *bias, const double *probs, double *y, double *yb);

/* dx_i = dy_i W_g [T,K]; dbias_g = sum_i dy_i (ADD) or sum_i p_i dy_i (SCALED) [G,N];
 * dprobs_i = sum_n dy_in b_gn (SCALED) [T]. Any output (and its bound) may be NULL.
 * dbias of an empty group is 0. */
void ref_grouped_linear_backward_data(int64_t G, int64_t T, int64_t K, int64_t N,
                                      const int64_t *splits, const double *dy, const double *w,
                                      moex_bias_mode bias_mode, const double *bias,
                                      const double *probs, double *dx, double *dxb, double *dbias,
                                      double *dbiasb, double *dprobs, double *dprobsb);

/* dW_g = dy_g^T x_g [G,N,K] (empty group: 0); dwb = sum_i |dy_in x_ik|. */
void ref_grouped_linear_backward_weight(int64_t G, int64_t T, int64_t K, int64_t N,
                                        const int64_t *splits, const double *x, const double *dy,
                                        double *dw, double *dwb);

/* ---- scaled GLU -------------------------------------------------------------------- */

/* Column of a[j] and b[j] (j < F) in a row of 2F for the layout. */
void ref_glu_columns(moex_glu_layout layout, int64_t F, int64_t j, int64_t *ja, int64_t *jb);

/* Pointwise pieces at (a, b): act(a), g(b) and their derivatives (0 past a clamp), plus
 * magnitudes for bounds that ignore the clamp and avoid cancellation:
 *   slope_mag >= |d act / d a'| and act2_mag >= |d^2 act / d a'^2| (sums of |terms|). */
typedef struct ref_glu_point {
    double act, dact, act2;        /* act(a), d/da, d2/da2                 */
    double g, dg;                  /* g(b), d/db (1, or 0 past the clamp)  */
    double slope_mag, act2_mag;
} ref_glu_point;
ref_glu_point ref_glu_eval(const moex_glu_params *glu, double a, double b);

/* z_ij = p_i act(a_ij) g(b_ij) for rows [0, rows); h [rows,2F], probs [rows] or NULL (p = 1).
 * hb [rows,2F] is the bound of h (NULL: |h|, which also covers the f32 evaluation of
 * the pointwise functions); zb = |p| (slope_mag |g| hb_a + |act| hb_b) + |z|. */
void ref_scaled_glu_forward(const moex_glu_params *glu, int64_t rows, int64_t F, const double *h,
                            const double *hb, const double *probs, double *z, double *zb);

/* dh = d z / d h applied to dz; dprobs_i = sum_j dz_ij act(a_ij) g(b_ij) (when dprobs
 * is not NULL; probs NULL means p = 1). hb and dzb are bounds of the inputs h and dz
 * (NULL: |h| and |dz|). dhb, dprobsb are the output bounds (may be NULL). */
void ref_scaled_glu_backward(const moex_glu_params *glu, int64_t rows, int64_t F, const double *h,
                             const double *hb, const double *probs, const double *dz,
                             const double *dzb, double *dh, double *dhb, double *dprobs,
                             double *dprobsb);

/* ---- grouped MLP ------------------------------------------------------------------- */

/* Problem description shared by forward and backward. x [T,H], w1 [G,2F,H], b1 [G,2F] or
 * NULL, w2 [G,H,F], b2 [G,H] (ADD/SCALED), probs [T] or NULL (p = 1; needed for SCALED).
 * h_saved [T,2F] and z_saved [T,F] (backward only, each may be NULL) are the tensors the
 * forward saved, as the library's backward gets them: when given, the backward uses
 * h_saved for the GLU (and to recompute z when z_saved is NULL) and z_saved for dW2,
 * instead of its own exact h and z, so that a saved h that rounded across a clamp kink
 * gives the same branch as the library's. */
typedef struct ref_mlp {
    int64_t G, T, H, F;
    const int64_t *splits;
    const double *x, *w1, *b1, *w2, *b2, *probs;
    moex_bias_mode b2_mode;
    moex_glu_params glu;
    const double *h_saved, *z_saved;
} ref_mlp;

/* h [T,2F], z [T,F], y [T,H] with bounds hb, zb, yb (bounds may be NULL). */
void ref_grouped_mlp_forward(const ref_mlp *p, double *h, double *hb, double *z, double *zb,
                             double *y, double *yb);

/* Gradients of sum(dy * y) (each output and bound may be NULL):
 *   dx [T,H], dw1 [G,2F,H], dw2 [G,H,F], db1 [G,2F], db2 [G,H] (ADD/SCALED),
 *   dprobs [T] (GLU term + scaled-bias term; needs probs). Empty groups give 0. */
typedef struct ref_mlp_grads {
    double *dx, *dxb;
    double *dw1, *dw1b;
    double *dw2, *dw2b;
    double *db1, *db1b;
    double *db2, *db2b;
    double *dprobs, *dprobsb;
} ref_mlp_grads;
void ref_grouped_mlp_backward(const ref_mlp *p, const double *dy, ref_mlp_grads *out);

#ifdef __cplusplus
}
#endif

#endif /* MOEX_REF_H */
