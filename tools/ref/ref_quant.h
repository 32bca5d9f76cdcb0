/*
 * ref_quant.h - the reference of grouped FP8 quantization (docs/ops.md section 9):
 * moex_group_quantize and moex_group_dequantize, written from the doc's rules and sharing no
 * code with the library (src/core/quant_math.h is not used).
 *
 * How it is written (deliberately unlike a kernel):
 *   - FP8 values are decoded code by code in fp64 (sign, exponent field, mantissa field); a
 *     value is encoded by searching the table of the format's decoded codes for the nearest
 *     one (ties to the even code, which on one side of zero is the even mantissa), not by bit
 *     manipulation. Past max (Inf included) the nearest finite code is +-max: saturation.
 *   - Where the doc computes in f32 (s = fp8_max / a, 1 / s, x * s, float(q) * scale) the
 *     operation is done once in fp64 and rounded with a (float) cast: for one division or
 *     one product of two f32 values that is the correctly rounded f32 result (the product is
 *     exact in fp64; a quotient rounded to 53 then to 24 bits is rounded correctly because
 *     53 >= 2 * 24 + 2), overflow to +-Inf and f32 subnormals included.
 *   - Sets are walked with plain loops: one set at a time, its amax, its scale, its codes.
 *
 * Conventions
 *   - x [T, K] as doubles holding the f32 / bf16 / f16 input values (each exactly an f32
 *     value); group g owns rows [off[g], off[g+1]), S = off[G]. Rows >= S are not read.
 *   - Outputs are written in the library's storage form (so tests can compare bits):
 *     data as uint8 codes, scales as float (TENSOR, GROUP, BLOCK) or E8M0 bytes (MXFP8).
 *     Only what docs/ops.md 9.4 says is written is written (rowwise rows < S, columnwise
 *     columns < S, BLOCK/MXFP8 rowwise scale rows < S and columnwise scale columns < b_G;
 *     TENSOR/GROUP scales and amax entirely); the rest of each buffer is left as it was.
 */
#ifndef MOEX_REF_QUANT_H
#define MOEX_REF_QUANT_H

#include "moex.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- formats ------------------------------------------------------------------------ */

/* Largest finite value: E4M3 448, E5M2 57344 (0 for any other dtype). */
double ref_fp8_max(moex_dtype fmt);
/* The MX emax of the format: E4M3 8, E5M2 15. */
int ref_fp8_emax(moex_dtype fmt);

/* The value of one code, fp64 (NaN codes give NaN, E5M2's Inf codes +-Inf). */
double ref_fp8_decode(moex_dtype fmt, uint8_t code);

/* docs/ops.md 9.1 for any double v: NaN -> 0x7F; else the nearest finite code of v's sign
 * (ties to the even code), so that |v| past max (Inf included) gives +-max; the sign of a
 * zero result is v's sign (-0.0 and tiny negatives give 0x80). */
uint8_t ref_fp8_encode(moex_dtype fmt, double v);

/* E8M0: 2^(b - 127); 0xFF is NaN. */
double ref_e8m0_decode(uint8_t b);

/* ---- the scale rules ------------------------------------------------------------------ */

/* 9.2: the quantization factor s (an f32 value) of a set whose amax (f32 value, NaN when
 * the set holds a NaN, 0 when empty) is `amax`, for p->amax_epsilon and p->rounding. */
double ref_quant_factor(const moex_quant_params *p, double amax);
/* 9.2: the stored scale 1 / s rounded to f32. */
double ref_quant_dequant_scale(double s);

/* 9.3: the MX exponent E in [-127, 127] for a block's amax over its non-NaN elements
 * (pass 0 for a block of zeros or of NaNs only; Inf gives 127). */
int ref_mx_exponent(moex_dtype fmt, double amax);

/* ---- layouts (9.4) -------------------------------------------------------------------- */

/* Block length of the recipe: BLOCK 128, MXFP8 32, TENSOR and GROUP 0. */
int64_t ref_quant_block(moex_quant_recipe recipe);

/* The shape of the scales of one orientation (columnwise != 0: the [K, T] copy); returns
 * ndim (1 or 2) and fills shape[0..ndim). */
int ref_quant_scales_shape(moex_quant_recipe recipe, int columnwise, int64_t G, int64_t T, int64_t K,
                           int64_t shape[2]);

/* b_g: the first columnwise tile column of group g (g may be G: b_G, the number of tile
 * columns written), for block length B. */
int64_t ref_quant_tile_base(const int64_t *splits, int64_t g, int64_t B);

/* ---- quantize and dequantize --------------------------------------------------------- */

typedef struct ref_quant_out {
    uint8_t *row_data;      /* [T, K] codes, or NULL: no rowwise copy                       */
    void *row_scales;       /* the rowwise scales: float, or uint8_t E8M0 (MXFP8)          */
    uint8_t *col_data;      /* [K, T] codes, or NULL: no columnwise copy                    */
    void *col_scales;       /* the columnwise scales                                        */
    double *amax;           /* TENSOR [1], GROUP [G] (f32 values before the epsilon), or NULL */
} ref_quant_out;

/* moex_group_quantize: x [T, K] (rows < S read), splits [G]. */
void ref_group_quantize(const moex_quant_params *p, int64_t G, int64_t T, int64_t K, const int64_t *splits,
                        const double *x, ref_quant_out *out);

/* moex_group_dequantize: y[t, k] for t < S (other rows not written) = round_ydt(float(q) *
 * scale), the product rounded to f32 first; data [T, K] (ROWWISE) or [K, T] (COLUMNWISE)
 * codes, scales in the storage form above. y holds the values of the ydt results. */
void ref_group_dequantize(const moex_quant_params *p, moex_quant_orientation orientation, int64_t G, int64_t T,
                          int64_t K, const int64_t *splits, const uint8_t *data, const void *scales,
                          moex_dtype ydt, double *y);

/* ---- grouped weights (docs/ops.md 9.7) ----------------------------------------------- *
 * w [G, N, K] as doubles (each exactly an f32 value), W_g = w[g] an [N, K] matrix. Sets:
 *   GROUP   all of W_g (scales [G], amax [G]);
 *   BLOCK   the 128x128 block (i, j) of W_g, rows [128i, 128i+128) x columns [128j, 128j+128)
 *           cut at the edges: rowwise scale [g, i, j] of [G, ceil(N/128), ceil(K/128)],
 *           columnwise scale [g, j, i] of [G, ceil(K/128), ceil(N/128)] (the same value);
 *   MXFP8   rowwise: columns [32j, 32j+32) of row n, scale [g, n, j] of [G, N, ceil(K/32)];
 *           columnwise: rows [32i, 32i+32) of column k, scale [g, k, i] of [G, K, ceil(N/32)].
 * columnwise data [g, k, n] is the code of w[g, n, k] with its columnwise set's scale. Every
 * element of every present output is written (there are no splits). TENSOR is not a weight
 * recipe (the functions abort on it). ref_quant_out is reused: row_data [G, N, K], col_data
 * [G, K, N], amax [G] (GROUP only). */

/* The shape of the scales of one copy (columnwise != 0: the [G, K, N] copy); returns ndim
 * (1 for GROUP, 3 for BLOCK and MXFP8) and fills shape[0..ndim). */
int ref_weight_scales_shape(moex_quant_recipe recipe, int columnwise, int64_t G, int64_t N, int64_t K,
                            int64_t shape[3]);

/* The index into one copy's scales of the set that holds w[g, n, k]. */
int64_t ref_weight_scale_index(moex_quant_recipe recipe, int columnwise, int64_t G, int64_t N, int64_t K, int64_t g,
                               int64_t n, int64_t k);

/* moex_weight_quantize. */
void ref_weight_quantize(const moex_quant_params *p, int64_t G, int64_t N, int64_t K, const double *w,
                         ref_quant_out *out);

/* moex_weight_dequantize: w[g, n, k] = round_wdt(float(q) * scale), the product rounded to
 * f32 first, from data [G, N, K] (ROWWISE) or [G, K, N] (COLUMNWISE) and its scales in the
 * storage form. w holds the values of the wdt results. */
void ref_weight_dequantize(const moex_quant_params *p, moex_quant_orientation orientation, int64_t G, int64_t N,
                           int64_t K, const uint8_t *data, const void *scales, moex_dtype wdt, double *w);

#ifdef __cplusplus
}
#endif

/* The 128x4-tiled ("swizzled") layout of MX scales (docs/ops.md 9.8), written from its
 * description rather than from the library's index formula: a plain [R, C] matrix of E8M0
 * bytes (row stride ld) padded to [R', C'] = [roundup(R, 128), roundup(C, 4)] and viewed as
 * [R'/128][4][32][C'/4][4] (row = 128 rb + 32 r4 + r32, column = 4 cb + c4) is stored as
 * [R'/128][C'/4][32][4][4] at out (R' C' bytes, every one written; padding 0). */
void ref_mx_swizzle(const uint8_t *plain, int64_t ld, int64_t R, int64_t C, uint8_t *out);

#endif /* MOEX_REF_QUANT_H */
