/*
 * moex.h - the moex C API: expert layers of Mixture-of-Experts models.
 *
 * This header is the manual of the stable API. It is C11, includes no CUDA header, and
 * compiles as C++. docs/ops.md gives the math of every operation, forward and backward.
 *
 * What is where
 *   moex.h      stable: the context, tensors, and the operations splits_to_offsets,
 *               zero_tail, weight_maps_write, grouped linear, scaled GLU, grouped MLP,
 *               router, permute, unpermute and the MoE layer.
 *   moex_fp8.h  experimental: FP8 training. The recipe a layer's GEMMs run in (the `fp8`
 *               field of the grouped linear, grouped MLP and MoE layer arguments), the scaled
 *               GLU's quantized output (its zq_* fields), grouped and weight quantize and
 *               dequantize, the FP8 grouped linear.
 *   moex_ep.h   experimental: expert parallelism. An EP context over an MPI or NCCL
 *               communicator, dispatch and combine, the EP MoE layer.
 * Experimental means tested like the rest, but the declarations may still change. The
 * experimental fields of the stable structs (fp8, zq_*) are off when zero-initialised.
 * This header includes both, so `#include "moex.h"` declares the whole API: moex_fp8.h
 * after the shared types below (the stable argument structs carry its types as fields),
 * moex_ep.h at the end. Either may be included alone: it includes this header.
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
 * the caller's to align, and on Hopper 16-byte aligned, as cudaMalloc gives them, where K and
 * N are multiples of 8: the Hopper GEMMs read them by TMA, and a matrix that is not makes the
 * call's outputs unspecified and moex_context_check_splits report MOEX_ERR_INVALID_ARG).
 * The workspace, `saved` and the EP dispatch handle have no alignment requirement. (Some
 * fast paths want more, e.g. 16 bytes for the Hopper GEMMs, and fall back to another kernel
 * without it: docs/conventions.md 10.)
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
 *   packed:   t.data points to the [G, R, C] tensor and ptrs and maps are NULL;
 *   discrete: t.data is NULL, t describes dtype and shape [G, R, C], and ptrs points to an
 *             array of G pointers, each to a dense [R, C] matrix. The array and the
 *             matrices live in the backend's memory (device memory for CUDA). maps
 *             (optional) holds the matrices' tensor maps as moex_weight_maps_write wrote
 *             them from this array (see there); NULL: a call that needs them writes them
 *             into its workspace first.                                                 */
typedef struct moex_weight {
    moex_tensor t;
    void *const *ptrs;
    const void *maps;
} moex_weight;

static inline moex_weight moex_weight_packed(moex_tensor t) {
    moex_weight w = {t, NULL, NULL};
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

#ifdef __cplusplus
}
#endif

/* ---- FP8 (experimental): moex_fp8.h ---------------------------------------------------- *
 * Included here, before the operations: the grouped linear, grouped MLP and MoE layer
 * arguments carry its FP8 recipe (`fp8`; zero: off, the GEMMs run in the activation dtype),
 * the scaled GLU's arguments its quantized output (zq_*; absent when zero).                */
#include "moex_fp8.h"

#ifdef __cplusplus
extern "C" {
#endif

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

/* ---- weight_maps_write ----------------------------------------------------------------
 * A discrete weight's tensor maps, kept by the caller. The CUDA backend's Hopper GEMMs read
 * each matrix of a discrete weight through tensor maps that hold its address; a call given
 * a discrete weight without maps writes them into its workspace (one more launch per call).
 * A caller whose matrices keep their addresses across calls (a framework's parameters)
 * writes them once into memory it keeps, moex_weight_maps_size bytes, and passes them as
 * w.maps to the grouped linear forward and backward-data calls. The maps hold the pointers
 * that w.ptrs holds when this call runs (stream order), and w's dtype and shape: the caller
 * writes them again whenever either changes, before the next call that reads them (a call
 * given stale maps reads the old matrices). Writing them is graph-safe; a graph that
 * captured it rewrites them from the array at each replay.
 * A matrix that is not 16-byte aligned sets the device flag (moex_context_check_splits:
 * MOEX_ERR_INVALID_ARG naming this op), and the GEMMs reading its maps give results that
 * are not meaningful. Backends and devices whose GEMMs read no maps (the CPU, CUDA before
 * Hopper) and weights the Hopper GEMMs do not read (not bf16 or f16, R or C not a multiple
 * of 8) need 0 bytes: the write then writes nothing, and the calls do not read w.maps (which
 * must still be NULL or 128-byte aligned). */

/* The bytes of the maps of a discrete weight described by w->t (dtype and [G, R, C], G >= 1;
 * w->ptrs and w->maps are not read). */
MOEX_API moex_status moex_weight_maps_size(moex_context *ctx, const moex_weight *w, size_t *bytes);

typedef struct moex_weight_maps_write_args {
    moex_weight w;                  /* discrete [G, R, C] (its maps ignored)                */
    void *maps;                     /* =, moex_weight_maps_size bytes of backend memory,
                                       128-byte aligned (NULL when that is 0)               */
    size_t maps_bytes;              /* the bytes at maps, at least moex_weight_maps_size    */
} moex_weight_maps_write_args;

MOEX_API moex_status moex_weight_maps_write_workspace_size(moex_context *ctx,
        const moex_weight_maps_write_args *args, size_t *bytes);
MOEX_API moex_status moex_weight_maps_write(moex_context *ctx, const moex_weight_maps_write_args *args,
        void *workspace, size_t workspace_bytes, moex_stream stream);

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
    moex_fp8_recipe fp8;        /* experimental (moex_fp8.h); zero: off                   */
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
    moex_fp8_recipe fp8;        /* experimental (moex_fp8.h); zero: off                   */
} moex_grouped_linear_dgrad_args;

typedef struct moex_grouped_linear_wgrad_args {
    moex_tensor x;              /* [T, K]                                   in            */
    moex_tensor dy;             /* [T, N], dtype of x                       in            */
    moex_tensor splits;         /* [G] I64                                  in            */
    moex_grad_mode dw_mode;
    moex_weight dw;             /* [G, N, K]: WRITE f32 or dtype of x (=); ACCUMULATE f32 (+=) */
    moex_fp8_recipe fp8;        /* experimental (moex_fp8.h); zero: off                   */
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


typedef struct moex_scaled_glu_args {
    moex_glu_params glu;
    moex_tensor h;              /* [T, 2F]                                  in            */
    moex_tensor probs;          /* [T] f32; optional (absent: p = 1)        in            */
    moex_tensor splits;         /* [G] I64; optional: only rows < sum(splits) (else all T) */
    moex_tensor z;              /* [T, F], dtype of h; optional when a zq copy is present =  */
    /* Optional (experimental, moex_fp8.h): z quantized to FP8 as it leaves the GLU, exactly what
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
    moex_fp8_recipe fp8;        /* experimental (moex_fp8.h); zero: off                   */
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
    moex_fp8_recipe fp8;        /* experimental (moex_fp8.h); zero: off                   */
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
    moex_fp8_recipe fp8;        /* experimental (moex_fp8.h); zero: off                   */
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

#ifdef __cplusplus
}
#endif

/* ---- Expert parallelism (experimental): moex_ep.h --------------------------------------- */
#include "moex_ep.h"

#endif /* MOEX_H */
