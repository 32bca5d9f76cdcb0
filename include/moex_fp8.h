/*
 * moex_fp8.h - the moex C API, experimental: FP8 training.
 *
 * Part of the API of moex.h, which includes this header after its shared types (the stable
 * argument structs carry the types below as fields): `#include "moex.h"` is enough, and
 * this header included alone includes moex.h. Experimental: tested like the stable API,
 * but the declarations may still change. docs/ops.md section 9 gives the math.
 *
 * Contents
 *   - the quantization types: moex_quant_params and moex_quant_tensor, also the scaled
 *     GLU's optional quantized output (its zq_* fields)
 *   - the layers' FP8 recipe: moex_fp8_recipe, the `fp8` field of the grouped linear,
 *     grouped MLP and MoE layer arguments, with the weights' FP8 copies a caller keeps
 *     (moex_fp8_weight, moex_fp8_weight_params)
 *   - grouped quantize and dequantize; weight quantize and dequantize
 *   - the FP8 grouped linear: forward (and backward data through it) and backward weight
 * moex.h's conventions hold here too: tensors and the alignment rule, the "=" / "+="
 * output contract, the calling sequence and workspace, errors, bad splits, the overlap rule.
 */
#include "moex.h"   /* first, outside the guard: included alone, this header then lets moex.h
                       include it where moex.h needs its types */

/* the guard is MOEX_FP8_API_H, as moex_ep.h's is MOEX_EP_API_H (MOEX_EP_H is src/core/ep.h's) */
#ifndef MOEX_FP8_API_H
#define MOEX_FP8_API_H

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Quantization types ------------------------------------------------------------ *
 * Used by the grouped and weight quantization below, which describe the recipes, by the
 * FP8 grouped linear, and by the scaled GLU's quantized output (moex.h, "Scaled GLU").      */
typedef enum moex_quant_recipe {
    MOEX_QUANT_TENSOR = 0,
    MOEX_QUANT_GROUP = 1,
    MOEX_QUANT_BLOCK = 2,
    MOEX_QUANT_MXFP8 = 3
} moex_quant_recipe;

typedef enum moex_scale_rounding {
    MOEX_SCALE_EXACT = 0,       /* s = fp8_max / amax in f32                                */
    MOEX_SCALE_POW2 = 1         /* s rounded down to a power of 2 (TENSOR, GROUP, BLOCK)     */
} moex_scale_rounding;

/* Where the scales of BLOCK and MXFP8 are: as the recipes above (the default), or, for
 * MXFP8, in the 128x4-tiled ("swizzled") layout that cuBLAS and Transformer Engine consume
 * for MX GEMMs, each group (or expert) padded to whole tiles: one E8M0 vector per copy,
 * sized by docs/ops.md 9.8. */
typedef enum moex_scale_layout {
    MOEX_SCALES_PLAIN = 0,
    MOEX_SCALES_MX_SWIZZLED = 1
} moex_scale_layout;

typedef struct moex_quant_params {
    moex_quant_recipe recipe;
    moex_dtype fp8;             /* MOEX_DTYPE_E4M3 or MOEX_DTYPE_E5M2                        */
    float amax_epsilon;         /* >= 0: amax = max(amax, epsilon) (not MXFP8)               */
    moex_scale_rounding rounding;
    moex_scale_layout scale_layout; /* MOEX_SCALES_MX_SWIZZLED: MXFP8 only                  */
} moex_quant_params;

/* One orientation of a quantized tensor: the FP8 data and its scales. */
typedef struct moex_quant_tensor {
    moex_tensor data;           /* rowwise [T, K], columnwise [K, T]; params.fp8           */
    moex_tensor scales;         /* its recipe's shape (docs/ops.md 9.4); f32 (MXFP8: E8M0) */
} moex_quant_tensor;

/* ---- The layers' FP8 recipe ---------------------------------------------------------- *
 * FP8 training: the recipe a layer's GEMMs run in, as the `fp8` field of the
 * grouped linear, grouped MLP and MoE layer arguments (zero-initialised: off, the GEMMs run
 * in the activation dtype). With a recipe, each GEMM quantizes its operands as it needs them
 * (moex_group_quantize, moex_weight_quantize; weights from their bf16/f16/f32 master copy on
 * every call, unless the caller keeps their copies: below) and runs moex_grouped_linear_fp8_*; the outputs and the gradients keep the
 * dtypes and the "=" / "+=" contracts of the plain call, and the main grads stay f32. Bias
 * gradients and dprobs are the plain call's sums; the MLP keeps h, z, dz and dh in the
 * activation dtype as the plain path does (its workspace holds dz, dh and the FP8 copies:
 * MOEX_H_OVERWRITE and the memory reuse of the plain backward do not apply). Discrete weights
 * (and discrete bf16/f16 dW) are handled one expert at a time through their pointer array,
 * which must then be host memory: on CUDA they are MOEX_ERR_UNSUPPORTED. Every field is
 * validated, also with MOEX_FP8_OFF (which then ignores them: the plain path, bitwise; the
 * weights' copies are then not read). docs/ops.md 9.11 says which operand gets which recipe
 * and orientation. The modes:
 *   BLOCK    DeepSeek-V3's: 1x128 activations and gradients, 128x128 weight blocks (the
 *            recipe to pick on Hopper)
 *   CURRENT  current scaling, one scale per group (activations, gradients) or expert (weights)
 *   MXFP8    1x32 blocks with E8M0 scales (correct on Hopper, not its fast recipe)
 * Weights quantized once: `weights` points to the FP8 copies of the layer's weights that the
 * caller keeps between calls (moex_fp8_weight, below), refreshed when the caller says (once
 * per optimizer step, say); a call reads a present copy instead of quantizing that weight. On
 * CUDA the array itself is host memory read during the call, the copies device memory read
 * by the kernels: a call captured in a CUDA graph reads the copies' current values at replay.
 * The copies of a call are not in its workspace.                                            */
typedef enum moex_fp8_mode {
    MOEX_FP8_OFF = 0,
    MOEX_FP8_BLOCK = 1,
    MOEX_FP8_CURRENT = 2,
    MOEX_FP8_MXFP8 = 3
} moex_fp8_mode;

typedef enum moex_fp8_dtypes {
    MOEX_FP8_E4M3_ALL = 0,      /* every operand E4M3                                      */
    MOEX_FP8_HYBRID = 1         /* activations and weights E4M3, gradients E5M2             */
} moex_fp8_dtypes;

/* A weight's FP8 copies kept by the caller: what moex_weight_quantize writes from the weight
 * [G, N, K] with the params moex_fp8_weight_params gives for the layer's recipe. A layer
 * reads the rowwise copy in its forward, the columnwise one in its backward data; an absent
 * copy (data with ndim 0) is quantized in the call, as without this struct. The call checks
 * the copies' shapes and dtypes, not their values: copies of another weight give the result
 * of that weight. */
typedef struct moex_fp8_weight {
    moex_quant_tensor rowwise;  /* data [G, N, K], scales                   in (optional)  */
    moex_quant_tensor columnwise; /* data [G, K, N], scales                 in (optional)  */
} moex_fp8_weight;

typedef struct moex_fp8_recipe {
    moex_fp8_mode mode;
    moex_fp8_dtypes dtypes;
    int32_t pow2_scales;        /* nonzero: scales rounded down to powers of 2 (MOEX_SCALE_POW2);
                                   BLOCK and CURRENT only                                  */
    float amax_epsilon;         /* >= 0, as moex_quant_params.amax_epsilon (not MXFP8)      */
    const moex_fp8_weight *weights; /* optional (NULL: every weight quantized in the call): one
                                   entry per weight of the layer, in the order of its
                                   arguments (grouped linear: w; grouped MLP, MoE layer and
                                   EP MoE layer: w1, w2); see moex_fp8_weight               */
} moex_fp8_recipe;

/* The quantization of a layer's weights under `recipe` (mode not OFF): BLOCK -> BLOCK 128x128,
 * CURRENT -> GROUP, MXFP8 -> MXFP8; E4M3; the recipe's amax_epsilon (MXFP8: 0) and pow2_scales
 * (MOEX_SCALE_POW2); plain scale layout. Give it to moex_weight_quantize to make the copies of
 * moex_fp8_weight. */
MOEX_API moex_quant_params moex_fp8_weight_params(const moex_fp8_recipe *recipe);

/* One buffer for a weight's two copies: w describes the weight [G, N, K] (its data is not
 * read), recipe a mode not OFF. *bytes = the buffer's size; with base non-NULL (aligned to
 * 256 bytes, *bytes of it) and copies non-NULL, *copies = the rowwise and columnwise copies
 * (data and scales, each piece 256-byte aligned) laid out in it, ready for
 * moex_weight_quantize to write and a layer to read. */
MOEX_API moex_status moex_fp8_weight_layout(moex_context *ctx, const moex_fp8_recipe *recipe, const moex_weight *w,
        void *base, moex_fp8_weight *copies, size_t *bytes);

/* ---- Grouped quantization (experimental) -------------------------------------------- *
 * FP8 quantization of the rows of G groups (x [T, K], the rows of group g after those of
 * g - 1, rows >= sum(splits) neither read nor written), computed on the device from the data
 * and the device splits: no host synchronisation, capturable in a CUDA graph. One call
 * writes a rowwise copy (data [T, K]) and/or a columnwise one (data [K, T]: the transpose,
 * for GEMMs that reduce over the rows), each with its scales. Scales are dequantization
 * factors: x ~= data * scale. The recipes (docs/ops.md section 9 has the exact rules):
 *   TENSOR  current scaling, one scale for all rows < sum(splits): scales [1] f32
 *   GROUP   current scaling, one scale per group: scales [G] f32
 *   BLOCK   1x128 blocks (DeepSeek-V3's activations and gradients), f32 scales:
 *           rowwise: 128 consecutive columns of one row, scales [T, ceil(K/128)];
 *           columnwise: 128 consecutive rows of one group in one column, the tiles of group g
 *           starting at its first row, scales [K, ceil(T/128) + G] (group g's tiles at
 *           columns b_g, b_g + 1, ... with b_g = sum over h < g of ceil(m_h/128))
 *   MXFP8   1x32 blocks, E8M0 scales (the OCP MX rule), laid out as BLOCK with 32 for 128
 * Current and block scaling take an amax epsilon and optionally round scales to powers of
 * 2; MXFP8 scales are powers of 2 by nature.                                              */

typedef struct moex_group_quantize_args {
    moex_tensor x;              /* [T, K] f32, bf16 or f16                  in            */
    moex_tensor splits;         /* [G] i64, sum <= T                        in            */
    moex_quant_params params;
    /* outputs: at least one of rowwise and columnwise (absent: data with ndim 0) */
    moex_quant_tensor rowwise;  /* data [T, K], scales                      =             */
    moex_quant_tensor columnwise; /* data [K, T], scales                    =             */
    moex_tensor amax;           /* TENSOR [1], GROUP [G] f32; optional      =             */
    moex_tensor dbias;          /* [G, K] f32, optional: the bias gradient  =
                                 * of a quantized output gradient, dbias[g, k] = the sum
                                 * of x[t, k] over group g's rows (deterministic)          */
} moex_group_quantize_args;

typedef enum moex_quant_orientation {
    MOEX_QUANT_ROWWISE = 0,
    MOEX_QUANT_COLUMNWISE = 1
} moex_quant_orientation;

/* y = data * scale, back to [T, K] from either orientation (rows < sum(splits)). */
typedef struct moex_group_dequantize_args {
    moex_quant_params params;   /* as the quantize used                                   */
    moex_quant_orientation orientation;
    moex_quant_tensor src;      /* rowwise or columnwise, as quantized      in            */
    moex_tensor splits;         /* [G] i64                                  in            */
    moex_tensor y;              /* [T, K] f32, bf16 or f16                  =             */
} moex_group_dequantize_args;

/* Grouped weights w [G, N, K] (moex_weight_packed's layout) quantized per expert, for the
 * FP8 GEMMs: the rowwise copy [G, N, K] feeds the forward (y = x W^T reduces over K), the
 * columnwise copy [G, K, N] (each W_g transposed) the backward data (dx = dy W reduces over
 * N). The recipes (docs/ops.md 9.7):
 *   GROUP   one current scale per expert: scales [G] f32 (both copies)
 *   BLOCK   128x128 blocks of each W_g (DeepSeek-V3's weights), f32 scales: rowwise
 *           [G, ceil(N/128), ceil(K/128)], columnwise [G, ceil(K/128), ceil(N/128)]; a block
 *           has one scale, so the columnwise copy is the transpose of the rowwise one
 *   MXFP8   1x32 blocks along each copy's reduction dimension, E8M0 scales: rowwise
 *           [G, N, ceil(K/32)], columnwise [G, K, ceil(N/32)]
 * (TENSOR: use GROUP with G = 1.) The weights are dense: nothing depends on split values. */
typedef struct moex_weight_quantize_args {
    moex_tensor w;              /* [G, N, K] f32, bf16 or f16               in            */
    moex_quant_params params;   /* recipe GROUP, BLOCK or MXFP8                           */
    /* outputs: at least one of rowwise and columnwise (absent: data with ndim 0) */
    moex_quant_tensor rowwise;  /* data [G, N, K], scales                   =             */
    moex_quant_tensor columnwise; /* data [G, K, N], scales                 =             */
    moex_tensor amax;           /* GROUP: [G] f32; optional                 =             */
} moex_weight_quantize_args;

/* w = data * scale, back to [G, N, K] from either copy. */
typedef struct moex_weight_dequantize_args {
    moex_quant_params params;   /* as the quantize used                                   */
    moex_quant_orientation orientation;
    moex_quant_tensor src;      /* rowwise or columnwise, as quantized      in            */
    moex_tensor w;              /* [G, N, K] f32, bf16 or f16               =             */
} moex_weight_dequantize_args;

MOEX_API moex_status moex_group_quantize_workspace_size(moex_context *ctx,
        const moex_group_quantize_args *args, size_t *bytes);
MOEX_API moex_status moex_group_quantize(moex_context *ctx, const moex_group_quantize_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);
MOEX_API moex_status moex_group_dequantize_workspace_size(moex_context *ctx,
        const moex_group_dequantize_args *args, size_t *bytes);
MOEX_API moex_status moex_group_dequantize(moex_context *ctx, const moex_group_dequantize_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);
MOEX_API moex_status moex_weight_quantize_workspace_size(moex_context *ctx,
        const moex_weight_quantize_args *args, size_t *bytes);
MOEX_API moex_status moex_weight_quantize(moex_context *ctx, const moex_weight_quantize_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);
MOEX_API moex_status moex_weight_dequantize_workspace_size(moex_context *ctx,
        const moex_weight_dequantize_args *args, size_t *bytes);
MOEX_API moex_status moex_weight_dequantize(moex_context *ctx, const moex_weight_dequantize_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);

/* ---- FP8 grouped linear (experimental) ------------------------------------------------ *
 * The grouped linear's GEMMs on FP8 operands as moex_group_quantize and moex_weight_quantize
 * write them. Each operand stands for its dequantized value (data * scale, docs/ops.md 9.5);
 * the products are summed in f32 and the result is rounded once:
 *   forward          y_g = x_g W_g^T (+ b_g | + p_i b_g): x a rowwise copy, data [T, K];
 *                    w data [G, N, K] with its scales as a rowwise weight copy has them
 *   backward data    dx_g = dy_g W_g is the forward's call with dy's rowwise copy as x and
 *                    the weights' columnwise copy (data [G, K, N]) as w, and no bias (its
 *                    dbias comes with dy's quantize)
 *   backward weight  dW_g = dy_g^T x_g: dy's and x's columnwise copies, data [N, T], [K, T]
 * The recipes pair as DeepSeek-V3's BLOCK (1x128 rows with 128x128 weight blocks), current
 * scaling (TENSOR or GROUP rows with GROUP weights), or MXFP8 with MXFP8; either operand E4M3
 * or E5M2. Rows >= sum(splits) are neither read nor written.
 * On Hopper the forward of current-scaled or BLOCK operands, y bf16 or f16, K a multiple of
 * 16 and N of 8, runs on the FP8 tensor cores (x.data, w.data and y 16-byte aligned), and so
 * does the backward weight of such copies with K and N multiples of 8 and T of 16 (dy.data,
 * x.data and dw 16-byte aligned); everything else (MXFP8 included: Hopper has no MX
 * instruction) runs through the dequantized operands in f32 (workspace: f32 copies of both
 * operands and, unless y (dw) is f32, of y (dw)). The backward weight's sums are f32: a bf16
 * or f16 dw (MOEX_GRAD_WRITE) gets them rounded once; empty groups give zeros (=) or leave
 * dW_g as it was (+=). docs/ops.md 9.10. */
typedef struct moex_grouped_linear_fp8_args {
    moex_quant_params x_params;
    moex_quant_tensor x;        /* rowwise: data [T, K], scales             in            */
    moex_quant_params w_params; /* GROUP, BLOCK or MXFP8                                  */
    moex_quant_tensor w;        /* data [G, N, K], scales                   in            */
    moex_tensor splits;         /* [G] I64                                  in            */
    moex_bias_mode bias_mode;
    moex_tensor bias;           /* [G, N], dtype of y or f32; ADD/SCALED    in            */
    moex_tensor probs;          /* [T] f32; SCALED only                     in            */
    moex_tensor y;              /* [T, N] f32, bf16 or f16                  =             */
} moex_grouped_linear_fp8_args;

typedef struct moex_grouped_linear_fp8_wgrad_args {
    moex_quant_params dy_params;
    moex_quant_tensor dy;       /* columnwise: data [N, T], scales          in            */
    moex_quant_params x_params;
    moex_quant_tensor x;        /* columnwise: data [K, T], scales          in            */
    moex_tensor splits;         /* [G] I64                                  in            */
    moex_grad_mode dw_mode;
    moex_weight dw;             /* [G, N, K] f32 (= or +=) or bf16/f16 (=)  = or +=       */
} moex_grouped_linear_fp8_wgrad_args;

MOEX_API moex_status moex_grouped_linear_fp8_forward_workspace_size(moex_context *ctx,
        const moex_grouped_linear_fp8_args *args, size_t *bytes);
MOEX_API moex_status moex_grouped_linear_fp8_forward(moex_context *ctx, const moex_grouped_linear_fp8_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);
MOEX_API moex_status moex_grouped_linear_fp8_backward_weight_workspace_size(moex_context *ctx,
        const moex_grouped_linear_fp8_wgrad_args *args, size_t *bytes);
MOEX_API moex_status moex_grouped_linear_fp8_backward_weight(moex_context *ctx,
        const moex_grouped_linear_fp8_wgrad_args *args, void *workspace, size_t workspace_bytes,
        moex_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* MOEX_FP8_API_H */
