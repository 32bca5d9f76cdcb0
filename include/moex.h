/*
 * moex.h - the moex C API: expert layers of Mixture-of-Experts models.
 *
 * This header is the manual. It is C11, includes no CUDA header, and compiles as C++.
 * docs/ops.md gives the math of every operation, forward and backward.
 *
 * ---------------------------------------------------------------------------------------
 * Vocabulary
 *   G  groups (experts)            T  buffer rows (capacity)
 *   K  in-features                 N  out-features
 *   H  hidden size                 F  FFN size of one GLU half
 *   E  experts of the router       k  experts per token (top-k)
 *
 * Rows are sorted by group: group g owns rows [off[g], off[g+1]) with
 * off = [0, s0, s0+s1, ...], where s = splits, an int64 [G] tensor that lives in the same
 * memory as the data (host memory for the CPU backend, device memory for CUDA).
 * Zero-size groups are legal everywhere. sum(splits) <= T, and rows past sum(splits) are
 * never read or written.
 *
 * Every tensor is a dense, row-major, non-owning view (moex_tensor). Activations and weights
 * are f32, bf16 or f16; accumulation is always f32. probs, dprobs and accumulated weight
 * gradients (main grads) are f32; bias gradients f32 or the activation dtype (summed in f32,
 * rounded once), as biases are.
 *
 * Alignment: the data of every tensor with elements is aligned to its dtype's size (natural
 * alignment: f32 and i32 4 bytes, i64 8, bf16 and f16 2, the FP8 dtypes and E8M0 1), and so
 * is each matrix of a discrete weight, whose pointer array is aligned to a pointer. A tensor
 * that breaks it is MOEX_ERR_INVALID_ARG naming it, from the size queries and the runs, on
 * every backend (CUDA cannot see the matrices behind a device pointer array: there they are
 * the caller's to align). The workspace, `saved` and the EP dispatch handle have no
 * alignment requirement. (Some fast paths want more, e.g. 16 bytes for the Hopper GEMMs, and
 * fall back to another kernel without it: docs/conventions.md 10.)
 *
 * Output contracts: each output field below says "=" (overwritten) or "+=" (accumulated).
 * An optional tensor is absent when it is zero-initialised (ndim == 0); an absent optional
 * output is not computed.
 *
 * Calls
 *   - Every operation takes a context, an argument struct, a workspace and a stream:
 *         moex_<op>_workspace_size(ctx, &args, &bytes);
 *         moex_<op>(ctx, &args, workspace, bytes, stream);
 *     The workspace is caller-owned scratch of at least `bytes` bytes (NULL when 0), in the
 *     backend's memory (device memory for CUDA), with no alignment requirement, and must
 *     not be used by anything else until the operation has finished on its stream. Its
 *     size depends on shapes, dtypes and options, never on split values.
 *   - CPU backend: calls run to completion before they return; the stream is ignored.
 *     CUDA backend: calls enqueue work on `stream` (NULL is the legacy default stream),
 *     do not synchronise, do not allocate, and are capturable in a CUDA graph.
 *   - Errors: every entry point validates shapes, dtypes, pointers and options and returns
 *     a status; moex_last_error(ctx) names the problem. When a call fails nothing has
 *     been written. The library never exits, aborts or throws.
 *   - Bad split values (a negative split, or a sum past T) and routing ids outside [0, E):
 *     the CPU backend reads them and fails (MOEX_ERR_BAD_SPLITS, MOEX_ERR_INVALID_ARG)
 *     before writing. The CUDA backend cannot read them without a synchronisation, so its
 *     kernels clamp to the T rows, skip bad ids, and set a device flag that
 *     moex_context_check_splits() reports.
 *   - Overlap: an output (a "=" or "+=" field, the workspace, and `saved` in the MoE
 *     layer forward) may not overlap any other tensor, the workspace or `saved`; inputs
 *     may overlap each other. Breaking this is MOEX_ERR_INVALID_ARG naming the two, on
 *     both backends (docs/conventions.md, "The overlap rule").
 *   - Sizes never wrap: a tensor, or an intermediate an operation keeps, of 2^60 or more
 *     elements, and a workspace or `saved` size past PTRDIFF_MAX, are MOEX_ERR_INVALID_ARG,
 *     from the size queries too.
 *   - Determinism: the same inputs give bitwise the same outputs, run after run.
 *   - Thread safety: a context may be used by one thread at a time.
 * ---------------------------------------------------------------------------------------
 */
#ifndef MOEX_H
#define MOEX_H

#include <stddef.h>
#include <stdint.h>

/* MOEX_API marks the public functions: the only symbols libmoex.so exports (the library
 * is compiled with hidden visibility). With GCC and Clang it is visibility("default"),
 * for building and for using the shared library; elsewhere, or when MOEX_STATIC is
 * defined before this header, it is empty. A build may define MOEX_API itself. */
#ifndef MOEX_API
#  if defined(MOEX_STATIC)
#    define MOEX_API
#  elif defined(__GNUC__) && __GNUC__ >= 4
#    define MOEX_API __attribute__((visibility("default")))
#  else
#    define MOEX_API
#  endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Version ------------------------------------------------------------------------- */

#define MOEX_VERSION_MAJOR 0
#define MOEX_VERSION_MINOR 1
#define MOEX_VERSION_PATCH 0
#define MOEX_VERSION_NUMBER (MOEX_VERSION_MAJOR * 10000 + MOEX_VERSION_MINOR * 100 + MOEX_VERSION_PATCH)

/* The version of the library that is loaded, as MOEX_VERSION_NUMBER and as "0.1.0".
 * A program can compare moex_version() with the MOEX_VERSION_NUMBER it was built with. */
MOEX_API unsigned    moex_version(void);
MOEX_API const char *moex_version_string(void);

/* ---- Status -------------------------------------------------------------------------- */

typedef enum moex_status {
    MOEX_OK = 0,
    MOEX_ERR_INVALID_ARG = 1,   /* a shape, dtype, pointer or option is wrong            */
    MOEX_ERR_UNSUPPORTED = 2,   /* valid, but not implemented for this backend or dtype  */
    MOEX_ERR_OUT_OF_MEMORY = 3, /* a host or device allocation failed (context creation) */
    MOEX_ERR_CUDA = 4,          /* the CUDA runtime reported an error                    */
    MOEX_ERR_BAD_SPLITS = 5,    /* split values are negative or sum past T               */
    MOEX_ERR_INTERNAL = 6       /* a bug in moex: please report it                       */
} moex_status;

/* A static string naming the status, e.g. "MOEX_ERR_INVALID_ARG". */
MOEX_API const char *moex_status_string(moex_status status);

/* ---- Context ------------------------------------------------------------------------- */

typedef enum moex_backend {
    MOEX_BACKEND_CPU = 0,
    MOEX_BACKEND_CUDA = 1
} moex_backend;

typedef struct moex_context moex_context;   /* opaque: one per backend and device  */
typedef struct CUstream_st *moex_stream;    /* the same type as cudaStream_t        */

/* Creates a context. `device` is the CUDA device ordinal (0 for the CPU backend).
 * The CPU backend uses as many threads as the machine has cores, or MOEX_NUM_THREADS
 * from the environment. On failure *out is NULL; there is no context to hold the
 * message, so moex_last_error(NULL) returns it (per thread). */
MOEX_API moex_status moex_context_create(moex_context **out, moex_backend backend, int device);
MOEX_API void        moex_context_destroy(moex_context *ctx);      /* accepts NULL */

/* The message of the last failed call on ctx ("" when none), valid until the next call.
 * With ctx == NULL: the message of the last call on this thread that failed without a
 * context to keep it (moex_context_create, or any call given ctx == NULL). */
MOEX_API const char *moex_last_error(const moex_context *ctx);

MOEX_API moex_backend moex_context_backend(const moex_context *ctx);

/* CPU backend: the number of threads element-wise work and GEMMs may use (n >= 1). */
MOEX_API moex_status moex_context_set_num_threads(moex_context *ctx, int n);

/* Reports device-side values that kernels found bad since the last call and clears the
 * record: split values (a negative split, or a sum past T) give MOEX_ERR_BAD_SPLITS,
 * routing ids or row maps out of range MOEX_ERR_INVALID_ARG, with a message naming them.
 * CUDA: synchronises `stream`. CPU: such values are reported by the call itself, so this
 * returns MOEX_OK. */
MOEX_API moex_status moex_context_check_splits(moex_context *ctx, moex_stream stream);

/* ---- Tensors ------------------------------------------------------------------------- */

typedef enum moex_dtype {       /* values are stable: append only */
    MOEX_DTYPE_F32 = 0,
    MOEX_DTYPE_BF16 = 1,
    MOEX_DTYPE_F16 = 2,
    MOEX_DTYPE_I32 = 3,
    MOEX_DTYPE_I64 = 4,
    MOEX_DTYPE_E4M3 = 5,        /* OCP FP8 E4M3 (torch.float8_e4m3fn): max 448, no Inf      */
    MOEX_DTYPE_E5M2 = 6,        /* OCP FP8 E5M2 (torch.float8_e5m2): max 57344              */
    MOEX_DTYPE_E8M0 = 7         /* OCP MX scale byte: 2^(b - 127), 0xFF NaN                  */
} moex_dtype;

/* Bytes per element (0 for an unknown dtype). */
MOEX_API size_t moex_dtype_size(moex_dtype dtype);
/* "f32", "bf16", "f16", "i32", "i64", "e4m3", "e5m2", "e8m0"; "unknown" for any other value. */
MOEX_API const char *moex_dtype_name(moex_dtype dtype);

#define MOEX_MAX_DIMS 4

/* A dense row-major view; shape[0] is the outermost dimension. ndim == 0: absent.
 * `data` may be NULL only when the tensor has no elements; with elements it is aligned to
 * moex_dtype_size(dtype) (the alignment rule above). */
typedef struct moex_tensor {
    void      *data;
    moex_dtype dtype;
    int32_t    ndim;
    int64_t    shape[MOEX_MAX_DIMS];
} moex_tensor;

static inline moex_tensor moex_tensor_1d(void *data, moex_dtype dtype, int64_t d0) {
    moex_tensor t = {data, dtype, 1, {d0, 0, 0, 0}};
    return t;
}
static inline moex_tensor moex_tensor_2d(void *data, moex_dtype dtype, int64_t d0, int64_t d1) {
    moex_tensor t = {data, dtype, 2, {d0, d1, 0, 0}};
    return t;
}
static inline moex_tensor moex_tensor_3d(void *data, moex_dtype dtype, int64_t d0, int64_t d1,
                                         int64_t d2) {
    moex_tensor t = {data, dtype, 3, {d0, d1, d2, 0}};
    return t;
}

/* Grouped weights [G, R, C], in one of two forms:
 *   packed:   t.data points to the [G, R, C] tensor and ptrs is NULL;
 *   discrete: t.data is NULL, t describes dtype and shape [G, R, C], and ptrs points to an
 *             array of G pointers, each to a dense [R, C] matrix. The array and the
 *             matrices live in the backend's memory (device memory for CUDA).          */
typedef struct moex_weight {
    moex_tensor t;
    void *const *ptrs;
} moex_weight;

static inline moex_weight moex_weight_packed(moex_tensor t) {
    moex_weight w = {t, NULL};
    return w;
}

/* ---- Shared options ------------------------------------------------------------------ */

typedef enum moex_bias_mode {
    MOEX_BIAS_NONE = 0,      /* y = x W^T                                           */
    MOEX_BIAS_ADD = 1,       /* y = x W^T + b_g                                     */
    MOEX_BIAS_SCALED = 2     /* y_i = x_i W^T + p_i b_g   (p = per-row probs, f32)  */
} moex_bias_mode;

typedef enum moex_grad_mode {
    MOEX_GRAD_WRITE = 0,      /* dW  = ...  (empty groups give zeros); f32 or the input dtype */
    MOEX_GRAD_ACCUMULATE = 1  /* dW += ...  into an f32 main grad (empty groups unchanged)    */
} moex_grad_mode;

/* FP8 training (experimental): the recipe a layer's GEMMs run in, as the `fp8` field of the
 * grouped linear, grouped MLP and MoE layer arguments (zero-initialised: off, the GEMMs run
 * in the activation dtype). With a recipe, each GEMM quantizes its operands as it needs them
 * (moex_group_quantize, moex_weight_quantize; weights from their bf16/f16/f32 master copy on
 * every call) and runs moex_grouped_linear_fp8_*; the outputs and the gradients keep the
 * dtypes and the "=" / "+=" contracts of the plain call, and the main grads stay f32. Bias
 * gradients and dprobs are the plain call's sums; the MLP keeps h, z, dz and dh in the
 * activation dtype as the plain path does (its workspace holds dz, dh and the FP8 copies:
 * MOEX_H_OVERWRITE and the memory reuse of the plain backward do not apply). Discrete weights
 * (and discrete bf16/f16 dW) are handled one expert at a time through their pointer array,
 * which must then be host memory: on CUDA they are MOEX_ERR_UNSUPPORTED. Every field is
 * validated, also with MOEX_FP8_OFF (which then ignores them: the plain path, bitwise).
 * docs/ops.md 9.11 says which operand gets which recipe and orientation.
 *   BLOCK    DeepSeek-V3's: 1x128 activations and gradients, 128x128 weight blocks (the
 *            recipe to pick on Hopper)
 *   CURRENT  current scaling, one scale per group (activations, gradients) or expert (weights)
 *   MXFP8    1x32 blocks with E8M0 scales (correct on Hopper, not its fast recipe)        */
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

typedef struct moex_fp8_recipe {
    moex_fp8_mode mode;
    moex_fp8_dtypes dtypes;
    int32_t pow2_scales;        /* nonzero: scales rounded down to powers of 2 (MOEX_SCALE_POW2);
                                   BLOCK and CURRENT only                                  */
    float amax_epsilon;         /* >= 0, as moex_quant_params.amax_epsilon (not MXFP8)      */
} moex_fp8_recipe;

/* ---- splits_to_offsets --------------------------------------------------------------- */

#define MOEX_MAX_OFFSETS 8

typedef enum moex_offsets_start {
    MOEX_OFFSETS_LEADING_ZERO = 0,  /* G+1 values: out[0] = 0, out[g+1] = stride * (s0+..+sg) */
    MOEX_OFFSETS_INCLUSIVE = 1      /* G values:   out[g]   = stride * (s0+..+sg)             */
} moex_offsets_start;

typedef struct moex_offsets_output {
    moex_tensor out;                /* [G+1] or [G], I32 or I64, =; values must fit the
                                       dtype (CPU: INVALID_ARG; CUDA: the device flag)    */
    int64_t stride;                 /* multiplier >= 1 (1: rows; K: elements of [T,K])    */
    moex_offsets_start start;
} moex_offsets_output;

typedef struct moex_splits_to_offsets_args {
    moex_tensor splits;             /* [G] I64                                            */
    int32_t num_outputs;            /* 1 .. MOEX_MAX_OFFSETS                              */
    moex_offsets_output outputs[MOEX_MAX_OFFSETS];
} moex_splits_to_offsets_args;

MOEX_API moex_status moex_splits_to_offsets_workspace_size(moex_context *ctx,
        const moex_splits_to_offsets_args *args, size_t *bytes);
MOEX_API moex_status moex_splits_to_offsets(moex_context *ctx, const moex_splits_to_offsets_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);

/* ---- zero_tail ------------------------------------------------------------------------
 * The rows past the groups made zero: x [T, ...] (any dtype, 1 to 4 dimensions) gets every
 * byte of its rows r >= min(sum(splits), T) set to 0 (the value 0 of every moex dtype); rows
 * before are not touched. The ops of this header leave those rows unwritten; a caller that
 * hands outputs on (a framework's autograd) zeroes them with this call, at the cost of those
 * rows only, without reading split values on the host (graph-safe). Bad split values: a
 * negative split or a sum past T is clamped as every op clamps it (the CPU backend refuses it,
 * MOEX_ERR_BAD_SPLITS; CUDA flags it for moex_context_check_splits). Its workspace holds the
 * prepared groups (a few bytes per group). */

typedef struct moex_zero_tail_args {
    moex_tensor x;                  /* [T, ...], any dtype, rows past the groups = 0        */
    moex_tensor splits;             /* [G] I64, G >= 1                                     */
} moex_zero_tail_args;

MOEX_API moex_status moex_zero_tail_workspace_size(moex_context *ctx, const moex_zero_tail_args *args,
        size_t *bytes);
MOEX_API moex_status moex_zero_tail(moex_context *ctx, const moex_zero_tail_args *args, void *workspace,
        size_t workspace_bytes, moex_stream stream);

/* ---- Grouped linear ------------------------------------------------------------------ *
 * forward:         y_g = x_g W_g^T (+ b_g | + p_i b_g)
 * backward_data:   dx_g = dy_g W_g,  dbias_g = sum_i dy_i (or sum_i p_i dy_i),
 *                  dprobs_i += sum_j dy_ij b_gj   (scaled bias only)
 * backward_weight: dW_g = dy_g^T x_g   (written, or accumulated into an f32 main grad)
 * The weight gradient is a separate call so that a pipeline schedule can delay it.       */

typedef struct moex_grouped_linear_args {
    moex_tensor x;              /* [T, K]                                   in            */
    moex_weight w;              /* [G, N, K], dtype of x                    in            */
    moex_bias_mode bias_mode;
    moex_tensor bias;           /* [G, N], dtype of x or f32; ADD/SCALED    in            */
    moex_tensor probs;          /* [T] f32; SCALED only                     in            */
    moex_tensor splits;         /* [G] I64                                  in            */
    moex_tensor y;              /* [T, N], dtype of x                       =             */
    moex_fp8_recipe fp8;        /* experimental; zero: off                                */
} moex_grouped_linear_args;

typedef struct moex_grouped_linear_dgrad_args {
    moex_tensor dy;             /* [T, N]                                   in            */
    moex_weight w;              /* [G, N, K], dtype of dy                   in            */
    moex_bias_mode bias_mode;   /* the forward's                                          */
    moex_tensor bias;           /* [G, N], dtype of dy or f32; SCALED with dprobs only    */
    moex_tensor probs;          /* [T] f32; SCALED only                     in            */
    moex_tensor splits;         /* [G] I64                                  in            */
    moex_tensor dx;             /* [T, K], dtype of dy; optional            =             */
    moex_tensor dbias;          /* [G, N] f32 or dtype of dy; ADD/SCALED    =             */
    moex_tensor dprobs;         /* [T] f32; optional, SCALED only           +=            */
    moex_fp8_recipe fp8;        /* experimental; zero: off                                */
} moex_grouped_linear_dgrad_args;

typedef struct moex_grouped_linear_wgrad_args {
    moex_tensor x;              /* [T, K]                                   in            */
    moex_tensor dy;             /* [T, N], dtype of x                       in            */
    moex_tensor splits;         /* [G] I64                                  in            */
    moex_grad_mode dw_mode;
    moex_weight dw;             /* [G, N, K]: WRITE f32 or dtype of x (=); ACCUMULATE f32 (+=) */
    moex_fp8_recipe fp8;        /* experimental; zero: off                                */
} moex_grouped_linear_wgrad_args;

MOEX_API moex_status moex_grouped_linear_forward_workspace_size(moex_context *ctx,
        const moex_grouped_linear_args *args, size_t *bytes);
MOEX_API moex_status moex_grouped_linear_forward(moex_context *ctx, const moex_grouped_linear_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);

MOEX_API moex_status moex_grouped_linear_backward_data_workspace_size(moex_context *ctx,
        const moex_grouped_linear_dgrad_args *args, size_t *bytes);
MOEX_API moex_status moex_grouped_linear_backward_data(moex_context *ctx,
        const moex_grouped_linear_dgrad_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);

MOEX_API moex_status moex_grouped_linear_backward_weight_workspace_size(moex_context *ctx,
        const moex_grouped_linear_wgrad_args *args, size_t *bytes);
MOEX_API moex_status moex_grouped_linear_backward_weight(moex_context *ctx,
        const moex_grouped_linear_wgrad_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);

/* ---- Scaled GLU ---------------------------------------------------------------------- *
 * A row h of [2F] holds two halves (a, b); z = p * act(a) * g(b), in f32, stored once.
 *   SWIGLU:          act(a) = a sigmoid(a),  g(b) = b         (a: HF gate_proj, b: up_proj)
 *   CLAMPED_SWIGLU:  a' = min(a, limit), b' = clamp(b, -limit, limit) + offset,
 *                    z = p * a' sigmoid(alpha a') * b'        (GPT-OSS)
 * Layout of the halves in a row: CONTIGUOUS [a(F) | b(F)], or INTERLEAVED_32
 * [a(32) | b(32) | a(32) | ...] (F a multiple of 32).
 * backward: dh = d(z)/d(h) applied to dz, dprobs_i += sum_j dz_ij act(a_ij) g(b_ij).    */

typedef enum moex_glu_kind {
    MOEX_GLU_SWIGLU = 0,
    MOEX_GLU_CLAMPED_SWIGLU = 1
} moex_glu_kind;

typedef enum moex_glu_layout {
    MOEX_GLU_CONTIGUOUS = 0,
    MOEX_GLU_INTERLEAVED_32 = 1
} moex_glu_layout;

typedef struct moex_glu_params {
    moex_glu_kind kind;
    moex_glu_layout layout;
    float limit;               /* CLAMPED_SWIGLU only; see moex_glu_params_default */
    float alpha;
    float offset;
} moex_glu_params;

/* {kind, CONTIGUOUS, limit 7, alpha 1.702, offset 1}: the GPT-OSS constants. */
MOEX_API moex_glu_params moex_glu_params_default(moex_glu_kind kind);

/* FP8 quantization's types (experimental), used by the GLU's quantized output below and by
 * the grouped quantization section, which describes the recipes. */
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

typedef struct moex_scaled_glu_args {
    moex_glu_params glu;
    moex_tensor h;              /* [T, 2F]                                  in            */
    moex_tensor probs;          /* [T] f32; optional (absent: p = 1)        in            */
    moex_tensor splits;         /* [G] I64; optional: only rows < sum(splits) (else all T) */
    moex_tensor z;              /* [T, F], dtype of h; optional when a zq copy is present =  */
    /* Optional (experimental): z quantized to FP8 as it leaves the GLU, exactly what
     * moex_group_quantize of z (as stored in h's dtype) with these splits writes (no splits:
     * one group of all T rows); docs/ops.md 9.9. Absent when both zq data are absent. */
    moex_quant_params zq_params;
    moex_quant_tensor zq_rowwise;   /* data [T, F], scales                  =             */
    moex_quant_tensor zq_columnwise; /* data [F, T], scales                 =             */
    moex_tensor zq_amax;        /* TENSOR [1], GROUP [G] f32; optional      =             */
} moex_scaled_glu_args;

typedef struct moex_scaled_glu_grad_args {
    moex_glu_params glu;
    moex_tensor h;              /* [T, 2F]                                  in            */
    moex_tensor probs;          /* [T] f32; optional                        in            */
    moex_tensor splits;         /* [G] I64; optional, as in the forward     in            */
    moex_tensor dz;             /* [T, F], dtype of h                       in            */
    moex_tensor dh;             /* [T, 2F], dtype of h                      =             */
    moex_tensor dprobs;         /* [T] f32; optional, needs probs           +=            */
} moex_scaled_glu_grad_args;

MOEX_API moex_status moex_scaled_glu_forward_workspace_size(moex_context *ctx,
        const moex_scaled_glu_args *args, size_t *bytes);
MOEX_API moex_status moex_scaled_glu_forward(moex_context *ctx, const moex_scaled_glu_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);
MOEX_API moex_status moex_scaled_glu_backward_workspace_size(moex_context *ctx,
        const moex_scaled_glu_grad_args *args, size_t *bytes);
MOEX_API moex_status moex_scaled_glu_backward(moex_context *ctx, const moex_scaled_glu_grad_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);

/* ---- Grouped MLP --------------------------------------------------------------------- *
 * forward:  h = x W1_g^T (+ b1_g)           [T, 2F]
 *           z = p * glu(h)                  [T, F]
 *           y = z W2_g^T (+ b2_g | + p b2_g) [T, H]
 * backward: dz = dy W2_g, dh = p * glu'(h) dz, dx = dh W1_g, dW2 = dy^T z, dW1 = dh^T x,
 *           db1 = sum dh, db2 = sum dy (or sum p dy),
 *           dprobs += (GLU term) + (scaled-bias term).
 * Intermediates kept in the workspace (z when not saved, dz, dh) are stored in the
 * activation dtype, as the saved h and z are; the GLU always reads h as stored, so a
 * recomputed z is bitwise the saved one. A recomputed z lives in dx's memory when dx is
 * asked and F <= H (dx is written last), and dh in h's with MOEX_H_OVERWRITE: then the
 * workspace holds neither.                                                                */

typedef struct moex_grouped_mlp_args {
    moex_tensor x;              /* [T, H]                                   in            */
    moex_weight w1;             /* [G, 2F, H], dtype of x                   in            */
    moex_tensor b1;             /* [G, 2F], dtype of x or f32; optional     in            */
    moex_weight w2;             /* [G, H, F], dtype of x                    in            */
    moex_bias_mode b2_mode;
    moex_tensor b2;             /* [G, H], dtype of x or f32; ADD/SCALED    in            */
    moex_tensor probs;          /* [T] f32; optional (absent: p = 1), needed for SCALED    */
    moex_glu_params glu;
    moex_tensor splits;         /* [G] I64                                  in            */
    moex_tensor h;              /* [T, 2F], dtype of x; saved for backward  =             */
    moex_tensor z;              /* [T, F], dtype of x; optional: absent asks the backward
                                   to recompute z from h                    =             */
    moex_tensor y;              /* [T, H], dtype of x                       =             */
    moex_fp8_recipe fp8;        /* experimental; zero: off                                */
} moex_grouped_mlp_args;

/* What the grouped MLP backward may do with the saved h. */
typedef enum moex_h_mode {
    MOEX_H_KEEP = 0,            /* h is read only                                         */
    MOEX_H_OVERWRITE = 1        /* the backward writes dh over h: h holds no meaning after the
                                   call, and the workspace holds no dh [T, 2F]            */
} moex_h_mode;

typedef struct moex_grouped_mlp_grad_args {
    /* the forward's inputs and saved tensors */
    moex_tensor x;              /* [T, H]                                                 */
    moex_weight w1;             /* [G, 2F, H]                                             */
    moex_weight w2;             /* [G, H, F]                                              */
    moex_bias_mode b2_mode;
    moex_tensor b2;             /* [G, H]; SCALED with dprobs only                        */
    moex_tensor probs;          /* [T] f32; optional                                      */
    moex_glu_params glu;
    moex_tensor splits;         /* [G] I64                                                */
    moex_tensor h;              /* [T, 2F] from the forward                               */
    moex_tensor z;              /* [T, F] from the forward; optional (absent: recomputed) */
    moex_tensor dy;             /* [T, H]                                                 */
    /* gradients: each optional; absent ones are not computed */
    moex_tensor dx;             /* [T, H], dtype of x                       =             */
    moex_grad_mode dw_mode;     /* for dw1 and dw2                                        */
    moex_weight dw1;            /* [G, 2F, H]; with WRITE, packed: scratch  = or +=
                                   for the earlier steps before it is written             */
    moex_weight dw2;            /* [G, H, F]                                = or +=       */
    moex_tensor db1;            /* [G, 2F] f32 or dtype of x                =             */
    moex_tensor db2;            /* [G, H] f32 or dtype of x; ADD/SCALED     =             */
    moex_tensor dprobs;         /* [T] f32; needs probs                     +=            */
    moex_h_mode h_mode;         /* MOEX_H_KEEP (0) unless h may be consumed               */
    moex_fp8_recipe fp8;        /* experimental; zero: off                                */
} moex_grouped_mlp_grad_args;

MOEX_API moex_status moex_grouped_mlp_forward_workspace_size(moex_context *ctx,
        const moex_grouped_mlp_args *args, size_t *bytes);
MOEX_API moex_status moex_grouped_mlp_forward(moex_context *ctx, const moex_grouped_mlp_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);
MOEX_API moex_status moex_grouped_mlp_backward_workspace_size(moex_context *ctx,
        const moex_grouped_mlp_grad_args *args, size_t *bytes);
MOEX_API moex_status moex_grouped_mlp_backward(moex_context *ctx, const moex_grouped_mlp_grad_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);

/* ---- Routing ------------------------------------------------------------------------- *
 * router:    s = softmax(logits) or sigmoid(logits) per token; the k largest scores
 *            (ties to the lower expert index) give ids and probs = s[ids], divided by
 *            their sum when renormalised.
 * permute:   token t's copy for its j-th expert goes to row_map[t*k + j], rows sorted by
 *            expert and, within an expert, by token (stable); splits[e] counts them.
 * unpermute: y_t = sum_j yp[row_map[t*k + j]]  (probs are applied by the grouped MLP).   */

typedef enum moex_router_score {
    MOEX_ROUTER_SOFTMAX = 0,
    MOEX_ROUTER_SIGMOID = 1
} moex_router_score;

typedef enum moex_router_norm {
    MOEX_ROUTER_NO_RENORM = 0,
    MOEX_ROUTER_RENORM = 1      /* probs of a token sum to 1 */
} moex_router_norm;

typedef struct moex_router_args {
    moex_tensor logits;         /* [T, E] f32 or bf16                       in            */
    int32_t topk;               /* 1 .. E                                                 */
    moex_router_score score;
    moex_router_norm norm;
    moex_tensor probs;          /* [T, k] f32                               =             */
    moex_tensor ids;            /* [T, k] I32, best first                   =             */
} moex_router_args;

typedef struct moex_router_grad_args {
    moex_tensor logits;         /* [T, E] from the forward                  in            */
    int32_t topk;
    moex_router_score score;
    moex_router_norm norm;
    moex_tensor ids;            /* [T, k] I32 from the forward              in            */
    moex_tensor dprobs;         /* [T, k] f32                               in            */
    moex_tensor dlogits;        /* [T, E], dtype of logits                  =             */
} moex_router_grad_args;

typedef struct moex_permute_args {
    moex_tensor x;              /* [T, H]                                   in            */
    moex_tensor ids;            /* [T, k] I32 expert ids in [0, E)          in            */
    moex_tensor probs;          /* [T, k] f32; optional                     in            */
    int32_t num_experts;        /* E                                                      */
    moex_tensor xp;             /* [T*k, H], dtype of x                     =             */
    moex_tensor probs_p;        /* [T*k] f32; with probs                    =             */
    moex_tensor splits;         /* [E] I64                                  =             */
    moex_tensor row_map;        /* [T*k] I32                                =             */
} moex_permute_args;

typedef struct moex_permute_grad_args {
    moex_tensor row_map;        /* [T*k] I32 from the forward               in            */
    moex_tensor dxp;            /* [T*k, H]                                 in            */
    moex_tensor dprobs_p;       /* [T*k] f32; optional                      in            */
    moex_tensor dx;             /* [T, H], dtype of dxp: sum of its k rows  =             */
    moex_tensor dprobs;         /* [T, k] f32; with dprobs_p                =             */
} moex_permute_grad_args;

typedef struct moex_unpermute_args {
    moex_tensor row_map;        /* [T*k] I32                                in            */
    moex_tensor yp;             /* [T*k, H]                                 in            */
    moex_tensor y;              /* [T, H], dtype of yp                      =             */
} moex_unpermute_args;

typedef struct moex_unpermute_grad_args {
    moex_tensor row_map;        /* [T*k] I32, a permutation as permute wrote it (the CPU
                                   refuses repeated rows; CUDA does not check)   in       */
    moex_tensor dy;             /* [T, H]                                   in            */
    moex_tensor dyp;            /* [T*k, H], dtype of dy                    =             */
} moex_unpermute_grad_args;

MOEX_API moex_status moex_router_forward_workspace_size(moex_context *ctx,
        const moex_router_args *args, size_t *bytes);
MOEX_API moex_status moex_router_forward(moex_context *ctx, const moex_router_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);
MOEX_API moex_status moex_router_backward_workspace_size(moex_context *ctx,
        const moex_router_grad_args *args, size_t *bytes);
MOEX_API moex_status moex_router_backward(moex_context *ctx, const moex_router_grad_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);

MOEX_API moex_status moex_permute_forward_workspace_size(moex_context *ctx,
        const moex_permute_args *args, size_t *bytes);
MOEX_API moex_status moex_permute_forward(moex_context *ctx, const moex_permute_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);
MOEX_API moex_status moex_permute_backward_workspace_size(moex_context *ctx,
        const moex_permute_grad_args *args, size_t *bytes);
MOEX_API moex_status moex_permute_backward(moex_context *ctx, const moex_permute_grad_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);

MOEX_API moex_status moex_unpermute_forward_workspace_size(moex_context *ctx,
        const moex_unpermute_args *args, size_t *bytes);
MOEX_API moex_status moex_unpermute_forward(moex_context *ctx, const moex_unpermute_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);
MOEX_API moex_status moex_unpermute_backward_workspace_size(moex_context *ctx,
        const moex_unpermute_grad_args *args, size_t *bytes);
MOEX_API moex_status moex_unpermute_backward(moex_context *ctx, const moex_unpermute_grad_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);

/* ---- MoE layer ----------------------------------------------------------------------- *
 * y = unpermute(grouped_mlp(permute(x, router(x Wr^T)))), with the router's probs applied
 * in the scaled GLU (and to b2 when b2_mode is SCALED). The router's logits and dlogits
 * are f32 whatever the activation dtype (the CUDA backend rounds dlogits to the
 * activation dtype on its way into the tensor-core GEMMs of the backward). The forward
 * writes everything the backward needs into `saved`, a caller-owned buffer of
 * moex_moe_layer_saved_size bytes (backend memory, no alignment requirement) that must be
 * kept, at the same address, until the backward.                                          */

typedef struct moex_moe_layer_args {
    moex_tensor x;              /* [T, H]                                   in            */
    moex_tensor router_w;       /* [E, H], dtype of x                       in            */
    int32_t topk;
    moex_router_score score;
    moex_router_norm norm;
    moex_weight w1;             /* [E, 2F, H]                               in            */
    moex_tensor b1;             /* [E, 2F], dtype of x or f32; optional     in            */
    moex_weight w2;             /* [E, H, F]                                in            */
    moex_bias_mode b2_mode;
    moex_tensor b2;             /* [E, H], dtype of x or f32; ADD/SCALED    in            */
    moex_glu_params glu;
    void *saved;                /* forward: =; backward: in                               */
    size_t saved_bytes;
    moex_tensor y;              /* [T, H], dtype of x; forward only         =             */
    moex_fp8_recipe fp8;        /* experimental; zero: off                                */
} moex_moe_layer_args;

typedef struct moex_moe_layer_grad_args {
    moex_moe_layer_args fwd;    /* the forward's arguments, `saved` as it left it         */
    moex_tensor dy;             /* [T, H]                                   in            */
    /* gradients: each optional */
    moex_tensor dx;             /* [T, H]                                   =             */
    moex_grad_mode dw_mode;     /* for drouter_w, dw1, dw2                                */
    moex_tensor drouter_w;      /* [E, H]: WRITE f32 or dtype of x; ACCUMULATE f32        */
    moex_weight dw1;            /* [E, 2F, H]                               = or +=       */
    moex_weight dw2;            /* [E, H, F]                                = or +=       */
    moex_tensor db1;            /* [E, 2F] f32 or dtype of x                =             */
    moex_tensor db2;            /* [E, H] f32 or dtype of x                 =             */
} moex_moe_layer_grad_args;

MOEX_API moex_status moex_moe_layer_saved_size(moex_context *ctx, const moex_moe_layer_args *args,
        size_t *bytes);
MOEX_API moex_status moex_moe_layer_forward_workspace_size(moex_context *ctx,
        const moex_moe_layer_args *args, size_t *bytes);
MOEX_API moex_status moex_moe_layer_forward(moex_context *ctx, const moex_moe_layer_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);
MOEX_API moex_status moex_moe_layer_backward_workspace_size(moex_context *ctx,
        const moex_moe_layer_grad_args *args, size_t *bytes);
MOEX_API moex_status moex_moe_layer_backward(moex_context *ctx, const moex_moe_layer_grad_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);

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
 * operands and, unless y is f32, of y). docs/ops.md 9.10. */
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
    moex_weight dw;             /* [G, N, K] f32 (empty groups: WRITE 0)    = or +=       */
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

/* ---- Expert parallelism (experimental) ----------------------------------------------- *
 * The experts of a layer spread over the W ranks of a communicator (expert parallelism, EP):
 * rank r holds the E / W experts [r E/W, (r+1) E/W) ("local experts", El = E / W). Each rank
 * routes its own T tokens; dispatch sends every token's row once to each rank that holds at
 * least one of its k experts, and that rank sorts the rows it receives by local expert (as
 * the permute does: expert e's rows in the order of (source rank, source token, slot));
 * combine sums each token's expert outputs back on the token's rank:
 *   dispatch forward   x [T, H], ids, probs [T, k]   ->  xr [R, H], probs_r [R], splits [El]
 *   combine forward    yr [R, H]                     ->  y [T, H] = sum over the token's k rows
 *   combine backward   dy [T, H]                     ->  dyr [R, H] (each row: dy of its token)
 *   dispatch backward  dxr [R, H], dprobs_r [R]      ->  dx [T, H] = sum over the k rows,
 *                                                        dprobs [T, k]
 * Sums are in f32, in a fixed order (deterministic): each rank first sums its rows of a token
 * in slot order and rounds the partial sum to the activation dtype (what travels back), and
 * the token's rank sums the partial sums in slot order of their first slots, rounded once.
 *
 * Capacity. An EP context has static capacities: T <= max_tokens tokens per call, and at most
 * R = max_recv_rows expert rows received per rank. Expert rows past R (in the sorted order:
 * the last experts' last rows first) are dropped: they are not computed, contribute zero to y
 * and get zero gradients; the call reports how many (the `dropped` output, and
 * moex_context_check_splits: MOEX_ERR_BAD_SPLITS naming the dispatch). Never a write past R.
 *
 * The communicator and the mechanism (moex_ep_transfer):
 *   CPU backend, MPI: comm is the address of an MPI_Comm; rows move with MPI_Alltoallv
 *   (only the real rows; the calls block).
 *   CUDA backend, NCCL: comm is the address of an ncclComm_t; the calls enqueue on the stream
 *   and are capturable in a CUDA graph (counts stay on the device). PEER (one node) moves
 *   only the real rows, written by kernels into the peers' mapped receive buffers; CAPACITY
 *   moves capacity-sized messages (max_tokens rows to each peer) with grouped
 *   ncclSend/ncclRecv. A PEER call waits on the device for every rank's same call: a rank
 *   that stops making them leaves the others' kernels spinning.
 * The caller creates and destroys the communicator (MPI_Init, ncclCommInitRank, torchrun);
 * it must outlive the EP context. moex_ep_create is collective: every rank of the
 * communicator calls it with the same config (comm aside), and so are the EP calls: every
 * rank makes the same sequence of them. One EP context serves one call at a time, in order
 * on one stream (its transfer buffers are shared by its calls). Thread safety: as a context.
 * A build without MPI (or NCCL) returns MOEX_ERR_UNSUPPORTED from moex_ep_create.          */

typedef struct moex_ep moex_ep;   /* opaque: an EP context, bound to a moex_context */

typedef enum moex_ep_comm_kind {
    MOEX_EP_COMM_MPI = 0,         /* CPU backend: comm points to an MPI_Comm                  */
    MOEX_EP_COMM_NCCL = 1         /* CUDA backend: comm points to an ncclComm_t               */
} moex_ep_comm_kind;

typedef enum moex_ep_transfer {
    MOEX_EP_TRANSFER_AUTO = 0,    /* PEER where every rank can map every peer, else CAPACITY  */
    MOEX_EP_TRANSFER_CAPACITY = 1,/* NCCL: grouped send/recv of max_tokens rows per peer;
                                     MPI: MPI_Alltoallv of the real rows                   */
    MOEX_EP_TRANSFER_PEER = 2     /* NCCL ranks on one node with peer access (NVLink): the
                                     kernels write only the real rows into the peers' receive
                                     buffers (mapped with CUDA IPC at creation), with
                                     device-side barriers; MOEX_ERR_UNSUPPORTED elsewhere  */
} moex_ep_transfer;

typedef struct moex_ep_config {
    moex_ep_comm_kind comm_kind;
    const void *comm;             /* the address of the caller's MPI_Comm or ncclComm_t       */
    int32_t num_experts;          /* E >= 1, a multiple of the world size                     */
    int32_t topk;                 /* k, 1 <= k <= E                                           */
    int64_t hidden;               /* H >= 1                                                   */
    moex_dtype dtype;             /* of the rows: f32, bf16 or f16                            */
    int64_t max_tokens;           /* >= 1: T of any call, at most                             */
    int64_t max_recv_rows;        /* R >= 1: the expert rows a rank receives per call, at most */
    moex_ep_transfer transfer;
} moex_ep_config;

typedef struct moex_ep_info {
    int32_t rank, world;
    int32_t local_experts;        /* El = E / world; this rank's are [rank El, (rank+1) El)   */
    moex_ep_transfer transfer;    /* the mechanism in use (never AUTO)                        */
    size_t handle_bytes;          /* the size of a dispatch handle (see below)                */
} moex_ep_info;

/* Creates an EP context on ctx (collective over the communicator): validates the config,
 * allocates every buffer its calls use (backend memory) and learns rank and world. On
 * failure *out is NULL and moex_last_error(ctx) says why. */
MOEX_API moex_status moex_ep_create(moex_ep **out, moex_context *ctx, const moex_ep_config *config);
/* Frees the context's buffers (not the communicator); accepts NULL. Not collective. */
MOEX_API void        moex_ep_destroy(moex_ep *ep);
MOEX_API moex_status moex_ep_get_info(const moex_ep *ep, moex_ep_info *info);

/* The dispatch handle: a caller-owned buffer of handle_bytes bytes (backend memory, no
 * alignment requirement) that the dispatch forward writes (the routing: where each token's
 * row went and where each received row sits among the expert rows) and that the combine
 * and both backwards read; keep it, at the same address, until the last of them. A layer
 * needs one per dispatch it keeps (e.g. one per MoE layer of a model). */
typedef struct moex_ep_dispatch_args {
    moex_ep *ep;
    moex_tensor x;                /* [T, H], T <= max_tokens, the EP dtype    in            */
    moex_tensor ids;              /* [T, k] i32 global expert ids in [0, E)   in            */
    moex_tensor probs;            /* [T, k] f32                               in            */
    void *handle;                 /* handle_bytes                             =             */
    size_t handle_bytes;
    moex_tensor xr;               /* [R, H]: the received rows by local expert =; rows past
                                     sum(splits) are not written                           */
    moex_tensor probs_r;          /* [R] f32: each row's prob; optional       =             */
    moex_tensor splits;           /* [El] i64: rows per local expert          =             */
    moex_tensor dropped;          /* [1] i64: expert rows dropped; optional   =             */
    /* FP8 dispatch (experimental): x in E4M3 or E5M2 instead of the EP dtype (a rowwise BLOCK
     * copy, as moex_group_quantize writes it; H a multiple of 16) travels with its 1x128
     * scales, half the bytes of bf16; xr is then of x's dtype, with its scales (the rowwise
     * copy the FP8 grouped linear reads). The combine and the backwards stay in the EP dtype. */
    moex_tensor x_scales;         /* [T, ceil(H/128)] f32; FP8 x only         in            */
    moex_tensor xr_scales;        /* [R, ceil(H/128)] f32; FP8 x only         =             */
} moex_ep_dispatch_args;

typedef struct moex_ep_dispatch_grad_args {
    moex_ep *ep;
    const void *handle;           /* the dispatch forward's                   in            */
    size_t handle_bytes;
    moex_tensor dxr;              /* [R, H]                                   in            */
    moex_tensor dprobs_r;         /* [R] f32; optional (with dprobs)          in            */
    moex_tensor dx;               /* [T, H], the forward's T: sum of the token's rows' dxr =  */
    moex_tensor dprobs;           /* [T, k] f32: slot j's row's dprobs_r (0 when dropped); = */
} moex_ep_dispatch_grad_args;

typedef struct moex_ep_combine_args {
    moex_ep *ep;
    const void *handle;           /* the dispatch forward's                   in            */
    size_t handle_bytes;
    moex_tensor yr;               /* [R, H], rows as the dispatch sorted them in            */
    moex_tensor y;                /* [T, H], the dispatch's T: sum over the token's rows  =  */
} moex_ep_combine_args;

typedef struct moex_ep_combine_grad_args {
    moex_ep *ep;
    const void *handle;           /* the dispatch forward's                   in            */
    size_t handle_bytes;
    moex_tensor dy;               /* [T, H], the dispatch's T                 in            */
    moex_tensor dyr;              /* [R, H]: each row dy of its token; rows past
                                     sum(splits) not written                  =             */
} moex_ep_combine_grad_args;

MOEX_API moex_status moex_ep_dispatch_forward_workspace_size(moex_context *ctx,
        const moex_ep_dispatch_args *args, size_t *bytes);
MOEX_API moex_status moex_ep_dispatch_forward(moex_context *ctx, const moex_ep_dispatch_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);
MOEX_API moex_status moex_ep_dispatch_backward_workspace_size(moex_context *ctx,
        const moex_ep_dispatch_grad_args *args, size_t *bytes);
MOEX_API moex_status moex_ep_dispatch_backward(moex_context *ctx, const moex_ep_dispatch_grad_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);
MOEX_API moex_status moex_ep_combine_forward_workspace_size(moex_context *ctx,
        const moex_ep_combine_args *args, size_t *bytes);
MOEX_API moex_status moex_ep_combine_forward(moex_context *ctx, const moex_ep_combine_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);
MOEX_API moex_status moex_ep_combine_backward_workspace_size(moex_context *ctx,
        const moex_ep_combine_grad_args *args, size_t *bytes);
MOEX_API moex_status moex_ep_combine_backward(moex_context *ctx, const moex_ep_combine_grad_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);

/* The EP MoE layer: the MoE layer above with its experts spread over the EP context's ranks.
 *   forward:  logits, probs, ids = router(x Wr^T)                 (this rank's T tokens)
 *             xr, probs_r, splits = dispatch(x, ids, probs)
 *             yr = grouped_mlp(xr, probs_r, splits)               (the El local experts)
 *             y = combine(yr)
 *   backward: the reverse: combine backward, the grouped MLP's backward, dispatch backward,
 *             the router's backward; dx = (dispatch's dx) + dlogits Wr, rounded once.
 * `layer` is moex_moe_layer_args with the local experts' weights (w1 [El, 2F, H], b1 [El, 2F],
 * w2 [El, H, F], b2 [El, H]) and the full router (router_w [E, H]); topk, H and the dtype as
 * the EP context's, T <= max_tokens. Its `saved` (moex_ep_moe_layer_saved_size) holds the
 * dispatch handle. The weight gradients are this rank's: dw1, dw2, db1, db2 of its local
 * experts (summed over the tokens of every rank), drouter_w of its own tokens (a data-parallel
 * all-reduce is the caller's). */
typedef struct moex_ep_moe_layer_args {
    moex_ep *ep;
    moex_moe_layer_args layer;
} moex_ep_moe_layer_args;

typedef struct moex_ep_moe_layer_grad_args {
    moex_ep *ep;
    moex_moe_layer_grad_args layer;   /* its fwd: the forward's layer arguments            */
} moex_ep_moe_layer_grad_args;

MOEX_API moex_status moex_ep_moe_layer_saved_size(moex_context *ctx, const moex_ep_moe_layer_args *args,
        size_t *bytes);
MOEX_API moex_status moex_ep_moe_layer_forward_workspace_size(moex_context *ctx,
        const moex_ep_moe_layer_args *args, size_t *bytes);
MOEX_API moex_status moex_ep_moe_layer_forward(moex_context *ctx, const moex_ep_moe_layer_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);
MOEX_API moex_status moex_ep_moe_layer_backward_workspace_size(moex_context *ctx,
        const moex_ep_moe_layer_grad_args *args, size_t *bytes);
MOEX_API moex_status moex_ep_moe_layer_backward(moex_context *ctx, const moex_ep_moe_layer_grad_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* MOEX_H */
