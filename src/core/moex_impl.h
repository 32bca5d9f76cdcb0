/*
 * moex_impl.h - private: the context, error reporting, the op list, validated dimensions,
 * checked size arithmetic and workspace carving. Never installed.
 *
 * Flow of every public call (src/core/op.c, moex_op_run):
 *   1. validate the argument struct (the op's validate function in src/core/<op>.c, with
 *      the checks of src/core/validate.c): shapes, dtypes, pointers, options; on failure
 *      set the message and return without touching anything;
 *   2. size the workspace, check the caller's, and check that no output overlaps anything;
 *   3. run the op's composition of backend primitives (src/core/backend.h).
 * Backends may therefore assume well-formed arguments; they still own the checks of
 * split values (only they can read them) and must write nothing when those fail.
 */
#ifndef MOEX_IMPL_H
#define MOEX_IMPL_H

#include "moex.h"
#include "op_list.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MOEX_MSG_LEN 1024
#define MOEX_WS_ALIGN 256   /* the core hands backends workspaces aligned to this */
#define MOEX_WEIGHT_MAPS_ALIGN 128   /* a discrete weight's maps (include/moex.h: weight_maps_write) */

/* ---- Validated dimensions, one struct per operation family ------------------------- */

typedef struct moex_gl_dims {        /* grouped linear */
    int64_t G, T, K, N;
    moex_dtype dt;                   /* activation dtype (x, w, y, dy, dx) */
} moex_gl_dims;


typedef struct moex_mlp_dims {       /* grouped MLP */
    int64_t G, T, H, F;
    moex_dtype dt;
} moex_mlp_dims;

typedef struct moex_router_dims {
    int64_t T, E, k;
    moex_dtype dt;                   /* logits dtype */
} moex_router_dims;

typedef struct moex_perm_dims {      /* permute and unpermute */
    int64_t T, H, k;
    int64_t E;                       /* permute forward only; 0 otherwise */
    moex_dtype dt;
} moex_perm_dims;

typedef struct moex_moe_dims {       /* MoE layer */
    int64_t T, H, E, F, k;
    int64_t G;                       /* experts of w1, w2: E (the EP MoE layer: its local ones) */
    moex_dtype dt;
    void *saved;                     /* the caller's `saved`, aligned (set when running) */
} moex_moe_dims;

typedef struct moex_splits_dims { int64_t G; } moex_splits_dims;

typedef struct moex_tail_dims {      /* zero_tail: x's T rows of row_bytes bytes */
    int64_t G, T, row_bytes;
} moex_tail_dims;

typedef struct moex_quant_dims {     /* grouped quantize and dequantize; weights: T = N */
    int64_t G, T, K;
    moex_dtype dt;                   /* x (quantize) or y (dequantize): f32, bf16, f16 */
    int64_t block;                   /* BLOCK 128, MXFP8 32, TENSOR and GROUP 0 */
    int64_t row_blocks;              /* rowwise scale columns: ceil(K / block) (0: none) */
    int64_t col_tiles;               /* columnwise scale columns: ceil(T / block) + G (0: none) */
} moex_quant_dims;

typedef struct moex_fp8_dims {       /* FP8 grouped linear: the product's dims (gl.dt: y's dtype; f32 in the
                                        backward weight), and those of its operands' dequantize */
    moex_gl_dims gl;
    moex_quant_dims a, b;            /* forward: x, w (T = N); backward weight: dy, x */
} moex_fp8_dims;

typedef struct moex_glu_dims {       /* scaled GLU */
    int64_t T, F;
    int64_t G;                       /* 0 when no splits were given: all T rows */
    moex_dtype dt;
    bool zq;                         /* forward: z quantized (a zq copy present) */
    moex_quant_dims q;               /* then: the quantize of z [T, F] (G >= 1) */
} moex_glu_dims;

/* Expert parallelism: the shapes every EP step needs (src/core/ep.h). */
typedef struct moex_ep_geom {
    int32_t world, rank, El;         /* El = E / world local experts */
    int64_t E, k, H;
    int64_t Tm, R;                   /* max_tokens, max_recv_rows */
    int64_t T;                       /* this call's tokens (<= Tm) */
    moex_dtype dt;
    size_t meta;                     /* byte of a wire row where its meta words start (16-aligned) */
    size_t wire;                     /* bytes of one wire row */
} moex_ep_geom;

typedef struct moex_ep_dims {        /* the EP operations and the EP MoE layer */
    moex_ep_geom g;
    void *handle;                    /* the caller's handle, aligned (set when running) */
    moex_moe_dims moe;               /* the EP MoE layer: its T, H, E (all experts), F, k */
} moex_ep_dims;

/* The dims of any operation (the op table handles them as one type). */
typedef union moex_dims {
    moex_splits_dims splits;
    moex_tail_dims tail;
    moex_gl_dims gl;
    moex_glu_dims glu;
    moex_mlp_dims mlp;
    moex_router_dims router;
    moex_perm_dims perm;
    moex_moe_dims moe;
    moex_quant_dims quant;
    moex_fp8_dims fp8;
    moex_ep_dims ep;
} moex_dims;

/* ---- Context ------------------------------------------------------------------------ */

/* A byte range that the call in progress reads (in) or writes (out), recorded by the
 * argument checks (validate.h) for the overlap rule: an output may overlap nothing else.
 * A discrete weight is its pointer array plus, on the CPU backend (where the array is host
 * memory), its G matrices of mat_bytes each. */
typedef struct moex_span {
    char name[24];
    uintptr_t lo, hi;                /* [lo, hi); empty when lo == hi */
    void *const *mats;               /* discrete weight matrices (CPU), else NULL */
    int64_t nmats;
    size_t mat_bytes;
    bool out;
} moex_span;

#define MOEX_MAX_SPANS 24            /* more tensors than any argument struct has */

struct moex_context {
    moex_backend backend;
    int device;
    int num_threads;                 /* CPU backend */
    const struct moex_backend_ops *ops;   /* backend.h */
    void *backend_state;             /* owned by the backend */
    char msg[MOEX_MSG_LEN];          /* last error, "" when none */
    moex_span spans[MOEX_MAX_SPANS]; /* the call in progress: its tensors, workspace, saved */
    int nspans;
    int64_t ep_dropped;              /* host-memory backends: expert rows an EP dispatch dropped
                                        since the last moex_context_check_splits */
    moex_op_id ep_dropped_op;
};

/* Records a printf-style message in ctx (if not NULL) and returns `status`. */
moex_status moex_fail(moex_context *ctx, moex_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Try a step; return its status on failure. */
#define MOEX_TRY(expr)                        \
    do {                                      \
        moex_status st_ = (expr);             \
        if (st_ != MOEX_OK) return st_;       \
    } while (0)

/* ---- Checked size arithmetic (docs/conventions.md, "Sizes never wrap") ----------------
 * Validation bounds every tensor a call touches, the caller's and the internal ones (the
 * MoE layer's h and z), to MOEX_MAX_ELEMS elements, with moex_i64_mul; a product of
 * validated dimensions that is such a tensor's size therefore fits an int64. Byte sizes of
 * workspaces and `saved` saturate instead: moex_sz_* give MOEX_SIZE_OVERFLOW on overflow and
 * keep it through further moex_sz_* steps, and the core refuses a backend size of
 * MOEX_SIZE_OVERFLOW (or anything past PTRDIFF_MAX) with MOEX_ERR_INVALID_ARG.            */

#define MOEX_MAX_ELEMS (INT64_MAX / 8)   /* 2^60 - 1: every byte offset of such a tensor fits an int64 */
#define MOEX_SIZE_OVERFLOW SIZE_MAX

/* *out = a * b for a, b >= 0; false (and *out untouched) when it would pass INT64_MAX. */
static inline bool moex_i64_mul(int64_t a, int64_t b, int64_t *out) {
    if (a < 0 || b < 0 || (b != 0 && a > INT64_MAX / b)) return false;
    *out = a * b;
    return true;
}

/* ceil(a / b) for a >= 0, b > 0, without the overflow of (a + b - 1) / b. */
static inline int64_t moex_i64_cdiv(int64_t a, int64_t b) { return a / b + (a % b != 0); }

static inline size_t moex_sz_add(size_t a, size_t b) { return a > SIZE_MAX - b ? MOEX_SIZE_OVERFLOW : a + b; }
static inline size_t moex_sz_mul(size_t a, size_t b) {
    return b != 0 && a > SIZE_MAX / b ? MOEX_SIZE_OVERFLOW : a * b;
}
/* n rounded up to a multiple of a (a power of two); saturates. */
static inline size_t moex_sz_align(size_t n, size_t a) {
    size_t m = moex_sz_add(n, a - 1);
    return m == MOEX_SIZE_OVERFLOW ? m : m & ~(a - 1);
}
/* Bytes of a [rows, cols] array of `elem`-byte elements; negative counts saturate. */
static inline size_t moex_sz_bytes(int64_t rows, int64_t cols, size_t elem) {
    if (rows < 0 || cols < 0) return MOEX_SIZE_OVERFLOW;
    return moex_sz_mul(moex_sz_mul((size_t)rows, (size_t)cols), elem);
}
static inline size_t moex_sz_max(size_t a, size_t b) { return a > b ? a : b; }

/* ---- Small helpers shared by backends ---------------------------------------------- */

static inline bool moex_present(const moex_tensor *t) { return t->ndim != 0; }

/* Elements of a validated tensor (at most MOEX_MAX_ELEMS, so the product fits). */
static inline int64_t moex_numel(const moex_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/* Reserves `bytes` at *pos rounded up to MOEX_WS_ALIGN and returns where it starts: the
 * carving step of every workspace and `saved` layout (saturating). */
static inline size_t moex_sz_take(size_t *pos, size_t bytes) {
    size_t at = *pos;
    *pos = moex_sz_add(at, moex_sz_align(bytes, MOEX_WS_ALIGN));
    return at;
}

/* ---- Workspace carving ---------------------------------------------------------------
 * The same code computes a layout's size (base == NULL) and its pointers (base != NULL),
 * so a size query and the run can never disagree. Every piece is aligned to MOEX_WS_ALIGN. */

typedef struct moex_carver {
    char *base;
    size_t used;
} moex_carver;

static inline void *moex_take(moex_carver *c, size_t bytes) {
    const size_t at = moex_sz_take(&c->used, bytes);   /* saturates: the core refuses it */
    return c->base ? (void *)(c->base + at) : NULL;
}

/* Weight matrix g of a grouped weight (packed or discrete), as a byte pointer (packed
 * data may be NULL when the matrices are empty: then it is returned as it is). */
static inline void *moex_weight_ptr(const moex_weight *w, int64_t g) {
    if (w->ptrs) return w->ptrs[g];
    const size_t off = (size_t)g * (size_t)(w->t.shape[1] * w->t.shape[2]) * moex_dtype_size(w->t.dtype);
    return off == 0 ? w->t.data : (char *)w->t.data + off;
}

#ifdef __cplusplus
}
#endif

#endif /* MOEX_IMPL_H */
