/*
 * validate.h - private: argument checks shared by the public entry points.
 * Each check returns MOEX_OK, or records "<op>: <name> ..." in ctx and returns
 * MOEX_ERR_INVALID_ARG. Shapes are given as arrays of ndim values; -1 matches any size.
 *
 * The tensor checks also record the tensor's byte range in ctx->spans, as read (the
 * moex_check_tensor family) or written (the *_output family), and MOEX_DISPATCH adds the
 * workspace and runs the overlap rule (moex_check_overlap) before the backend runs: an
 * output may overlap no other tensor, the workspace or `saved`; inputs may alias.
 */
#ifndef MOEX_VALIDATE_H
#define MOEX_VALIDATE_H

#include "moex_impl.h"

#define MOEX_DT(d) (1u << (unsigned)(d))
#define MOEX_DT_FLOAT (MOEX_DT(MOEX_DTYPE_F32) | MOEX_DT(MOEX_DTYPE_BF16) | MOEX_DT(MOEX_DTYPE_F16))
#define MOEX_DT_OFFSETS (MOEX_DT(MOEX_DTYPE_I32) | MOEX_DT(MOEX_DTYPE_I64))
#define MOEX_DT_F32 MOEX_DT(MOEX_DTYPE_F32)
#define MOEX_DT_I32 MOEX_DT(MOEX_DTYPE_I32)
#define MOEX_DT_I64 MOEX_DT(MOEX_DTYPE_I64)
#define MOEX_DT_BIAS(dt) (MOEX_DT(dt) | MOEX_DT_F32)   /* a bias: the activation dtype or f32 */

/* A required input: ndim and shape match, at most MOEX_MAX_ELEMS elements, dtype in
 * `dtypes`, data non-NULL and aligned to the dtype's size unless empty (moex.h's alignment
 * rule), and its bytes do not wrap the address space. */
moex_status moex_check_tensor(moex_context *ctx, const char *op, const char *name, const moex_tensor *t,
                              int ndim, const int64_t *shape, unsigned dtypes);

/* The same, but an absent tensor (ndim == 0) passes. */
moex_status moex_check_optional(moex_context *ctx, const char *op, const char *name,
                                const moex_tensor *t, int ndim, const int64_t *shape, unsigned dtypes);

/* A grouped weight [G, R, C], packed or discrete (see moex_weight), read. Discrete: the
 * pointer array aligned to a pointer; on the CPU backend (host pointer array) each matrix
 * non-NULL and aligned to the dtype's size. */
moex_status moex_check_weight(moex_context *ctx, const char *op, const char *name, const moex_weight *w,
                              int64_t G, int64_t R, int64_t C, unsigned dtypes);

/* The same three for outputs (written: "=" or "+="): the same checks, recorded as written,
 * so the two declaration groups repeat by design. */
moex_status moex_check_output(moex_context *ctx, const char *op, const char *name, const moex_tensor *t,
                              int ndim, const int64_t *shape, unsigned dtypes);
moex_status moex_check_optional_output(moex_context *ctx, const char *op, const char *name,
                                       const moex_tensor *t, int ndim, const int64_t *shape, unsigned dtypes);
moex_status moex_check_weight_output(moex_context *ctx, const char *op, const char *name, const moex_weight *w,
                                     int64_t G, int64_t R, int64_t C, unsigned dtypes);

/* An intermediate [rows, cols] that the call keeps in its workspace or `saved` (the MoE
 * layer's logits, xp, h, z): at most MOEX_MAX_ELEMS elements, like a caller's tensor. */
moex_status moex_check_internal(moex_context *ctx, const char *op, const char *name, int64_t rows, int64_t cols);

/* Records [p, p + bytes) (the workspace, `saved`) as read or written by the call. */
typedef enum moex_span_role { MOEX_SPAN_IN = 0, MOEX_SPAN_OUT = 1 } moex_span_role;
moex_status moex_record_span(moex_context *ctx, const char *op, const char *name, const void *p, size_t bytes,
                             moex_span_role role);

/* The overlap rule over the recorded spans: MOEX_ERR_INVALID_ARG naming the first output
 * found overlapping another span. Discrete weight matrices are checked on the CPU backend
 * (on CUDA the pointer array is device memory: only the array itself is checked). */
moex_status moex_check_overlap(moex_context *ctx, const char *op);

/* True when a weight is present (packed data, discrete pointers, or a described shape). */
static inline bool moex_weight_present(const moex_weight *w) { return w->t.ndim != 0 || w->ptrs; }

/* splits: [G] I64 with G >= 1; sets *G. */
moex_status moex_check_splits_arg(moex_context *ctx, const char *op, const moex_tensor *splits, int64_t *G);

/* Checks the glu options (kind, layout, F a multiple of 32 when interleaved, finite
 * clamp constants with limit > 0). */
moex_status moex_check_glu(moex_context *ctx, const char *op, const moex_glu_params *glu, int64_t F);

/* Checks that `mode` is a known moex_bias_mode / moex_grad_mode. */
moex_status moex_check_bias_mode(moex_context *ctx, const char *op, moex_bias_mode mode);
moex_status moex_check_grad_mode(moex_context *ctx, const char *op, moex_grad_mode mode);

/* An FP8 recipe (the layers' `fp8` field, named `name` in messages): a known mode and dtypes,
 * amax_epsilon finite and >= 0, pow2_scales only with BLOCK or CURRENT. MOEX_FP8_OFF with the
 * other fields in range passes. */
moex_status moex_check_fp8_recipe(moex_context *ctx, const char *op, const char *name, const moex_fp8_recipe *r);

/* A caller buffer sized by a query (the workspace, `saved`): the public size is the
 * backend's plus alignment slack, and fails (INVALID_ARG) when the backend's size saturated
 * (MOEX_SIZE_OVERFLOW) or passes PTRDIFF_MAX. `prepare` fails when the caller's buffer is
 * NULL or smaller than the public size, else gives the aligned pointer and records the
 * caller's whole buffer [buf, buf + buf_bytes) as a span of `role`. `name` is "workspace"
 * or "saved". */
moex_status moex_buffer_public_size(moex_context *ctx, const char *op, const char *name, size_t backend_bytes,
                                    size_t *bytes);
moex_status moex_buffer_prepare(moex_context *ctx, const char *op, const char *name, size_t backend_bytes,
                                void *buf, size_t buf_bytes, moex_span_role role, void **aligned);

/* Feature dimensions in and out must be >= 1 (row counts may be 0). */
moex_status moex_check_features(moex_context *ctx, const char *op, int64_t in, int64_t out);

/* A grouped linear's probs scale its bias only: given with another bias mode, refused. */
moex_status moex_check_probs_scaled(moex_context *ctx, const char *op, moex_bias_mode mode, const moex_tensor *probs);

/* The bias and probs a bias mode needs: ADD/SCALED need bias [G, N] (the activation dtype
 * or f32; optional when !bias_needed); SCALED needs probs [T] f32; NONE takes no bias. */
moex_status moex_check_bias(moex_context *ctx, const char *op, moex_bias_mode mode, const moex_tensor *bias,
                            const char *bias_name, const moex_tensor *probs, int64_t G, int64_t T, int64_t N,
                            moex_dtype dt, bool bias_needed);

/* A weight gradient [G, R, C] written: WRITE into f32 or dt, ACCUMULATE into f32 only. */
moex_status moex_check_dw(moex_context *ctx, const char *op, const char *name, moex_grad_mode mode,
                          const moex_weight *dw, int64_t G, int64_t R, int64_t C, moex_dtype dt);

/* T*k rows are addressed by I32 row_map values: T*k must fit. */
moex_status moex_check_rows_fit_i32(moex_context *ctx, const char *op, int64_t T, int64_t k);

/* The hidden size H must be >= 1. */
moex_status moex_check_hidden(moex_context *ctx, const char *op, int64_t H);

/* A [T, H] float tensor of tokens, an input (role MOEX_SPAN_IN) or an output (MOEX_SPAN_OUT),
 * whose H passes moex_check_hidden: sets *T, *H and *dt. */
moex_status moex_check_tokens(moex_context *ctx, const char *op, const char *name, const moex_tensor *t,
                              moex_span_role role, int64_t *T, int64_t *H, moex_dtype *dt);

/* A grouped op's rows: splits [G] I64 (G >= 1) and the [T, cols] f32/bf16/f16 input `name`
 * that sets T, cols and the activation dtype. */
moex_status moex_check_grouped_rows(moex_context *ctx, const char *op, const moex_tensor *splits, const char *name,
                                    const moex_tensor *t, int64_t *G, int64_t *T, int64_t *cols, moex_dtype *dt);

/* The router's options: topk 1..E, a known score and norm. */
moex_status moex_check_router_options(moex_context *ctx, const char *op, int32_t topk, int64_t E,
                                      moex_router_score score, moex_router_norm norm);

/* Common entry checks: ctx and args non-NULL; clears the message. */
moex_status moex_enter(moex_context *ctx, const char *op, const void *args);

#endif /* MOEX_VALIDATE_H */
