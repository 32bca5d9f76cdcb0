/*
 * fuzz.h - the moex API fuzzer (tests/fuzz): what the harness shares between its files.
 *
 * Files
 *   fuzz.h               this header: the case model, the fault list, the oracles
 *   fuzz_core.c          decoding, memory of a case, fault injection, the call judge
 *   fuzz_mem.c           backend memory: host (CPU) or cudaMalloc'd device memory (CUDA)
 *   fuzz_ops_linear.c    argument builders: splits_to_offsets, zero_tail, grouped linear (3 ops)
 *   fuzz_ops_mlp.c       argument builders: scaled GLU (2), grouped MLP (2)
 *   fuzz_ops_routing.c   argument builders: router (2), permute (2), unpermute (2)
 *   fuzz_ops_moe.c       argument builders: MoE layer (saved size, forward, backward), context calls
 *   fuzz_ops_quant.c     argument builders: grouped quantize, dequantize (experimental), and
 *                        their oracles "amax", "scale", "dbias", "workspace"
 *   fuzz_ops_fp8.c       argument builders: the FP8 grouped linear forward and backward weight
 *                        (experimental), operands from fuzz bytes or real quantize calls, and
 *                        their oracles "value", "workspace"
 *   fuzz_ops_ep.c        argument builders: expert parallelism on the CPU over MPI (dispatch
 *                        forward / backward, combine forward / backward; MPI builds only,
 *                        MOEX_FUZZ_HAVE_MPI), its faults and its oracle "ep value"
 *   fuzz_libfuzzer.c     LLVMFuzzerTestOneInput (target moex_fuzz, clang + MOEX_FUZZ=ON)
 *   fuzz_run.c           standalone driver moex_fuzz_run (any compiler; corpus replay,
 *                        pseudo-random inputs, seed-corpus generator)
 *   corpus/              the seed corpus (moex_fuzz_run --generate); README.md: how to run it all
 *
 * How an input is used
 *   An input is a sequence of up to FZ_MAX_CASES cases. A case reads an operation (every
 *   public operation and size query of moex.h is reachable but moex_weight_quantize and
 *   moex_weight_dequantize, not yet covered: called only to make FP8 linear operands), a mode (run mode: small shapes
 *   backed by real buffers; huge mode, one case in eight: huge shapes, size queries, and
 *   runs only where the harness knows the call must be refused), a seed for tensor contents,
 *   then a VALID argument set (dims, dtypes, enums, optional tensors, packed or discrete
 *   weights, split values, routing ids, GLU constants), then 0..3 FAULTS. It calls the size
 *   query on the valid arguments, applies the faults, calls the size query again (when there
 *   are faults) and runs the operation; the MoE layer case runs the forward, then the
 *   backward from the forward's `saved`, faulting one of the two. Every call is also made,
 *   now and then, with ctx, args or bytes NULL.
 *
 *   Every tensor has its own allocation with guard bytes on both sides (ASan-poisoned on the
 *   CPU, so that ASan reports any overrun at once); rows past sum(splits) of every [T, ...]
 *   tensor of an op with splits (and the column tails: columns past sum(splits) of a
 *   columnwise [K, T] copy, past b_G of its block scales) are ASan-poisoned during the run
 *   (CPU); during a size query every tensor's data is poisoned (a query reads no data; the
 *   CPU reads the discrete weights' pointer arrays, which stay readable). Workspace and
 *   `saved` are allocated at exactly the size asked, at a random misalignment. Empty tensors
 *   get NULL or a real pointer. CUDA: the same buffers in device memory (guards checked by
 *   comparison, no poisoning), the discrete weights' pointer arrays in device memory.
 *
 * THE FAULT LIST: each fault is known to make the call invalid. Class (what is expected):
 *   STRUCT   every call with it, size queries and runs, fails with MOEX_ERR_INVALID_ARG
 *   RUNONLY  runs fail with MOEX_ERR_INVALID_ARG; size queries may succeed (they have no
 *            workspace and check no overlap)
 *   SPLITS   bad split values: a CPU run fails with MOEX_ERR_BAD_SPLITS; a CUDA run returns
 *            MOEX_OK and moex_context_check_splits then gives MOEX_ERR_BAD_SPLITS
 *   IDS      routing ids / row_map values out of range: CPU run MOEX_ERR_INVALID_ARG; CUDA run
 *            MOEX_OK, then moex_context_check_splits MOEX_ERR_INVALID_ARG
 *   OFFSFIT  splits_to_offsets values that do not fit the output dtype: CPU run
 *            MOEX_ERR_INVALID_ARG; CUDA run MOEX_OK, then check_splits MOEX_ERR_BAD_SPLITS
 *   CHAOS    validity unknown (random bytes of `saved` flipped): no status expected, every
 *            other oracle applies
 *   (cpu) marks faults injected on the CPU backend only (CUDA cannot see them).
 * Generic faults (fuzz_core.c), on any tensor the operation validates:
 *   G0  ndim          a present tensor gets another ndim (1..4, or -1, 5, 100, INT32_MIN)  STRUCT
 *   G1  negative dim  a dimension becomes negative (-1, -2^40, INT64_MIN)                 STRUCT
 *   G2  mismatch      a dimension tied to another tensor's changes (+-1, +2, +64, ...)     STRUCT
 *   G3  dtype         a dtype outside the valid set: another moex_dtype, or 8, 99, -1     STRUCT
 *   G4  NULL data     data NULL with elements (discrete weight: ptrs NULL too)             STRUCT
 *   G5  overflow      dims whose product passes 2^60 elements (2^32 x 2^32, INT64_MAX)    STRUCT
 *   G6  absent        a required tensor absent (ndim 0)                                    STRUCT
 *   G7  present       a tensor the options forbid is given (bias with NONE, dprobs
 *                     without probs, probs_p without probs, db2 with NONE, scales of an
 *                     absent copy, amax with BLOCK/MXFP8, ...)                            STRUCT
 *   G8  overlap       an output overlaps another tensor, the workspace, `saved` or a
 *                     discrete weight's pointer array or (cpu) matrix; or the workspace
 *                     (an output) overlaps an input                                        RUNONLY
 *   G9  NULL matrix   a discrete weight's ptrs[g] NULL (cpu)                               STRUCT
 *   G10 both forms    a discrete weight with t.data set too                                STRUCT
 *   G11 workspace     NULL though the query asked for bytes                                RUNONLY
 *   G12 workspace     shorter than asked (by 1 byte up to all of it)                       RUNONLY
 *   G13 wrap          a data pointer whose byte range wraps around the address space       STRUCT
 * Operation faults (fuzz_ops_*.c):
 *   enums         unknown bias_mode, dw_mode, glu.kind, glu.layout, score, norm,
 *                 offsets start (values 2..9, -1, INT32_MIN/MAX)                          STRUCT
 *   glu           CLAMPED_SWIGLU with a NaN/Inf constant or limit <= 0;
 *                 INTERLEAVED_32 with F % 32 != 0                                           STRUCT
 *   counts        topk 0, < 0 or > E; num_experts < 1 or != len(splits); num_outputs
 *                 0, > 8 or < 0; offsets stride < 1; T*k > INT32_MAX (huge mode)            STRUCT
 *   huge sizes    an MoE intermediate (logits [T,E], xp [T*k,H], h [T*k,2F]) past 2^60
 *                 elements (huge mode)                                                      STRUCT
 *   weight maps   grouped linear: w.maps on a packed weight or not 128-byte aligned,
 *                 dw.maps at all (kept maps, include/moex.h weight_maps_write)             STRUCT
 *   split values  a negative split (-1, INT64_MIN), a sum past T (+1, INT64_MAX)           SPLITS
 *                 splits_to_offsets: negative, or a sum past INT64_MAX                      SPLITS
 *   offsets fit   stride * sum(splits) past INT32_MAX / INT64_MAX                          OFFSFIT
 *   ids, row_map  a value outside [0, E) or [0, T*k) (E, E+n, -1, INT32_MIN/MAX)           IDS
 *   row_map dup   unpermute_backward with a repeated row (cpu)                             IDS
 *   saved         MoE: saved NULL or short (fwd, bwd); saved never written by a forward
 *                 (cpu); a forward with other score/norm (cpu)                              RUNONLY
 *   saved bytes   MoE: bytes of `saved` flipped between forward and backward (cpu)         CHAOS
 *   quant enums   quantize, dequantize: unknown params.recipe, params.rounding,
 *                 orientation; FP8 linear: unknown recipe, rounding, scale_layout of
 *                 either operand's params                                                   STRUCT
 *   fp8           params.fp8 not E4M3/E5M2 (f32 .. i64, E8M0, 8, 99, -1, INT32_MIN)        STRUCT
 *   epsilon       params.amax_epsilon negative (-1, -1e-30, -1e-45, -FLT_MAX), NaN, +-Inf  STRUCT
 *   swap          (first fault only) a valid recipe, fp8 format or orientation (FP8 linear:
 *                 scale layout) that the tensors built for the old one do not fit (TENSOR ->
 *                 GROUP only with G != 1, ...); it freezes every tensor: no later fault
 *                 undoes it                                                                 STRUCT
 *   layout        FP8 linear: an operand's scale_layout MX_SWIZZLED with a recipe other
 *                 than MXFP8                                                                STRUCT
 *   fp8 recipe    layers (grouped linear, MLP, MoE): the `fp8` field's mode or dtypes
 *                 unknown, amax_epsilon negative / NaN / +-Inf (with any mode, OFF too),
 *                 pow2_scales with MXFP8                                                    STRUCT
 *   ep            EP ops (fuzz_ops_ep.c, CPU): ep NULL or of another moex_context, T past
 *                 max_tokens, FP8 dispatch with H % 16 != 0                                 STRUCT
 *                 handle NULL / short / overlapping a tensor; combine, backwards: handle
 *                 zeroed (no dispatch) or of another T                                      RUNONLY
 *                 dispatch ids outside [0, E)                                               IDS
 *                 handle bytes past its header flipped (cpu; no tail oracle)                CHAOS
 *   pairing       FP8 linear: one operand gets a recipe (its scales rebuilt to fit it) that
 *                 does not pair with the other's (ops.md 9.10: BLOCK with BLOCK, MXFP8 with
 *                 MXFP8, TENSOR / GROUP rows with GROUP weights), or TENSOR weights         STRUCT
 *
 * THE ORACLES (fz_fail aborts naming the call and the oracle):
 *   - no crash, no ASan/UBSan report (the build's sanitizers);
 *   - "status": every status is a known moex_status; a call with faults gets the class's
 *     status (MOEX_OK for known-invalid input fails); a call without faults gets MOEX_OK
 *     (or MOEX_ERR_UNSUPPORTED) in run mode; huge mode without faults may also be refused;
 *   - "message": moex_last_error is non-empty after a failure and "" after a success;
 *   - "no write on failure": a failed call changed no byte of any tensor, of `saved`, or
 *     of any guard (the workspace's own bytes excepted);
 *   - "inputs": an OK call changed no input (nor any tensor the call ignores);
 *   - "tail": an OK call wrote no row past sum(splits) of an output, nor a column past its
 *     column tail (quantization: columnwise copies) (CPU: nor read one: ASan);
 *   - "guard": no call wrote outside the buffers it was given;
 *   - "query": a size query changed nothing; its size is <= PTRDIFF_MAX, and in run mode
 *     at most 1 GiB; moex_moe_layer_saved_size is at least the bytes docs/ops.md 8.1 says
 *     `saved` holds (logits, probs, ids, splits, row_map, probs_p, h);
 *   - "check_splits": after every run moex_context_check_splits gives MOEX_OK, or on CUDA
 *     the deferred status of the SPLITS/IDS/OFFSFIT faults; CUDA: no runtime error;
 *   - quantize, dequantize, after an OK run without faults (run mode): "amax" and "scale"
 *     (TENSOR, GROUP): amax[g] is max |x| over the set's rows (NaN if any is NaN, 0 when
 *     empty) and every scale is 1/s of docs/ops.md 9.2, bit for bit; "dbias" (any recipe):
 *     dbias[g, k] is 0 for an empty group, else the sum of x[t, k] over the group's rows
 *     within an f32 sum's error (n 2^-23 sum |x|; columns with a non-finite or huge value
 *     skipped); "workspace": the call again with a fresh workspace (other bytes, another
 *     misalignment) writes bitwise the same outputs (the workspace's contents never affect
 *     results);
 *   - FP8 grouped linear, after an OK run without faults (run mode, no input overlap):
 *     "value": every y row < S (forward) and every dw element (backward weight) is the sum of
 *     the products of the dequantized operands (ops.md 9.5, 9.10: data * scale in f32, from
 *     the recipe's and layout's scale, 9.4 / 9.7 / 9.8), plus the bias, within an f32 sum's
 *     error and y's rounding (elements with a non-finite or huge term skipped; dw WRITE of an
 *     empty group 0, ACCUMULATE unchanged); "workspace" as above (not for ACCUMULATE);
 *   - the layers' fp8 recipe, after a run without faults (run mode): "fp8" (a valid recipe on
 *     the CPU gives MOEX_OK), "workspace" with a recipe on (every "=" output, discrete
 *     matrices too), "fp8 off" (OFF with other fields set writes bitwise what the zero
 *     recipe writes). No value check: FP8 is not bitwise the plain path.
 */
#ifndef MOEX_FUZZ_H
#define MOEX_FUZZ_H

#include "moex.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FZ_MAX_TENSORS 40
#define FZ_MAX_BUFS 320
#define FZ_MAX_FAULTS (FZ_MAX_TENSORS + 8)   /* a big-tensor flag per tensor, and more */
#define FZ_MAX_G 64                       /* discrete weights: at most this many matrices   */
#define FZ_MAX_CASES 4                    /* cases per input                                */
#define FZ_HUGE_REAL 4096                 /* huge mode: tensors up to this size are real    */
#define FZ_MAX_REAL ((size_t)64 << 20)    /* no buffer is ever bigger                       */
#define FZ_MAX_INTS ((int64_t)1 << 16)    /* integer contents (splits, ids) up to this many */
#define FZ_MAX_ELEMS ((int64_t)1 << 60)   /* moex.h: more elements than this is refused     */

/* Dtype shorthands of the argument builders: a dtype, and the bit of one in a valid set. */
#define F32 MOEX_DTYPE_F32
#define BF16 MOEX_DTYPE_BF16
#define I32 MOEX_DTYPE_I32
#define I64 MOEX_DTYPE_I64
#define DT(d) (1u << (unsigned)(d))


/* ---- the global harness state -------------------------------------------------------- */

typedef struct fz_stats {
    uint64_t inputs, cases, calls, faults, failed_calls;
} fz_stats;

typedef struct fz_global {
    moex_context *ctx;
    moex_backend backend;
    int cuda;                 /* backend is CUDA: buffers in device memory            */
    int keep_going;           /* standalone driver --keep-going: report, don't abort  */
    int verbose;
    int failures;             /* with keep_going                                       */
    fz_stats stats;
    void (*on_failure)(void); /* the driver's hook: save the input, print its name     */
} fz_global;

extern fz_global fz_g;

/* Creates the context (CUDA: device 0). Returns 0, or 77 when the backend is unavailable
 * (message printed), or 1 on another error. */
int fz_init(moex_backend backend);
void fz_shutdown(void);

/* Runs one fuzz input (any bytes). */
void fz_run_input(const uint8_t *data, size_t size);

/* A short description of the case running now (for crash reports), "" when none, and
 * the same with its faults and the call in progress, printed. */
const char *fz_current_case(void);
void fz_print_current_case(FILE *f);

/* The operations a case can pick; fz_op_names[i] names them. */
enum {
    FZ_OP_SPLITS_TO_OFFSETS, FZ_OP_GL_FWD, FZ_OP_GL_DGRAD, FZ_OP_GL_WGRAD, FZ_OP_GLU_FWD, FZ_OP_GLU_BWD,
    FZ_OP_MLP_FWD, FZ_OP_MLP_BWD, FZ_OP_ROUTER_FWD, FZ_OP_ROUTER_BWD, FZ_OP_PERMUTE_FWD, FZ_OP_PERMUTE_BWD,
    FZ_OP_UNPERMUTE_FWD, FZ_OP_UNPERMUTE_BWD, FZ_OP_MOE, FZ_OP_CONTEXT, FZ_OP_QUANTIZE, FZ_OP_DEQUANTIZE,
    FZ_OP_FP8_FWD, FZ_OP_FP8_WGRAD, FZ_NUM_BASE_OPS,
    /* ops that came later, on op bytes of their own (fz_op_of_byte) */
    FZ_OP_ZERO_TAIL = FZ_NUM_BASE_OPS, FZ_NUM_PLAIN_OPS,
    /* expert parallelism (fuzz_ops_ep.c, CPU + MPI builds only) */
    FZ_OP_EP_DISPATCH = FZ_NUM_PLAIN_OPS, FZ_OP_EP_DISPATCH_BWD, FZ_OP_EP_COMBINE, FZ_OP_EP_COMBINE_BWD,
    FZ_NUM_ALL_OPS
};
#ifdef MOEX_FUZZ_HAVE_MPI
#define FZ_NUM_OPS ((int)FZ_NUM_ALL_OPS)
#else
#define FZ_NUM_OPS ((int)FZ_NUM_PLAIN_OPS)
#endif
extern const char *const fz_op_names[FZ_NUM_OPS];
/* The op a case's op byte picks: byte % 20 (the first 20 ops), but for the bytes that no
 * input of corpus/ used when the later ops came (every seed keeps its meaning): 253 picks
 * zero_tail, and 240, 241, 246, 247, 248 and 249 the EP ops in MPI builds (fuzz_core.c has
 * the table). */
int fz_op_of_byte(uint8_t b);

/* What the last fz_run_input did, for the seed-corpus generator: a bit per op, per
 * (op, huge), per fault tag, per status. */
typedef struct fz_features {
    uint32_t ops, huge_ops, faulted_ops;
    uint64_t fault_tags;      /* bit i: a fault whose tag hashes to i               */
    uint32_t statuses;        /* bit s: a run returned status s                     */
    uint32_t fp8_ops;         /* bit op: a layer op ran OK with an FP8 recipe on     */
} fz_features;
extern fz_features fz_last_features;

/* ---- one case: tensors, buffers, faults ------------------------------------------------ */

typedef enum fz_role {
    FZ_IN,     /* read                                                     */
    FZ_OUT,    /* "=" output                                               */
    FZ_ACC,    /* "+=" output                                              */
    FZ_KEEP    /* passed but ignored by the call: must stay as it is      */
} fz_role;

/* Registration flags of a tensor. */
enum {
    FZ_REQUIRED = 1u << 0,    /* present; absent is a fault (G6)                             */
    FZ_FORBIDDEN = 1u << 1,   /* absent; present is a fault (G7)                             */
    FZ_FREE0 = 1u << 4,       /* dim i may change without making the call invalid: G2 skips it */
    FZ_FREE1 = 1u << 5,
    FZ_FREE2 = 1u << 6,
    FZ_FREE_ALL = FZ_FREE0 | FZ_FREE1 | FZ_FREE2,
    FZ_ANY_NDIM = 1u << 7,    /* any ndim in 1..4 is valid: G0 picks only invalid ones         */
    FZ_NOFAULT = 1u << 8,     /* not validated by the call (ignored fields): never faulted   */
    FZ_DISCRETE_OK = 1u << 9  /* weights: may be discrete                                    */
};
/* (neither REQUIRED nor FORBIDDEN: optional, present or absent as the builder set it) */

typedef enum fz_fclass { FZ_STRUCT, FZ_RUNONLY, FZ_SPLITS, FZ_IDS, FZ_OFFSFIT, FZ_CHAOS } fz_fclass;

typedef struct fz_fault_rec {
    fz_fclass cls;
    int ti;                   /* the tensor it broke (-1: none in particular)              */
    int dim;                  /* G2: the dimension it changed, else -1                     */
    int blind;                /* the current size query cannot see it (set by a builder)   */
    char what[120];
} fz_fault_rec;

typedef struct fz_buf {
    char name[40];
    void *mem;                /* the allocation (host or device)                           */
    size_t total;             /* its bytes: lead + payload + FZ_GUARD                       */
    size_t lead;              /* bytes before the payload: FZ_GUARD + misalignment pad     */
    size_t bytes;             /* payload                                                   */
    int kind;                 /* FZ_B_*                                                    */
    int owner;                /* tensor index, -1 for the workspace / saved                 */
    int shared;               /* holds more than one region: no tail poisoning              */
    int written;              /* contents were filled                                       */
    unsigned char *snap, *now; /* host copies around a call                                */
} fz_buf;

enum { FZ_B_DATA, FZ_B_MATRIX, FZ_B_PTRS, FZ_B_WS, FZ_B_SAVED, FZ_B_DUMMY, FZ_B_OLD };

typedef struct fz_tensor {
    const char *name;
    moex_tensor *t;           /* the field of the argument struct (weights: &w->t)         */
    moex_weight *w;           /* weights only                                              */
    fz_role role;
    unsigned flags;
    unsigned dtypes_ok;       /* dtypes (MOEX_DT bits) that keep the call valid            */
    int64_t tail_row;         /* rows >= tail_row of dim 0 are the tail; -1: none          */
    int64_t tail_col;         /* 2-D: columns >= tail_col of every row are the tail; -1: none */
    int64_t *i64;             /* integer contents (case-owned), or NULL: random contents   */
    int32_t *i32;
    int64_t nints;
    int touched;              /* already faulted (or aliased): no second fault              */
    int big_flagged;          /* its "more than 2^60 elements" fault is recorded            */
    moex_tensor shadow;       /* FORBIDDEN: the shape it gets when a fault makes it present */
    /* memory */
    int buf;                  /* the buffer holding the data; -1: none (absent, NULL)       */
    size_t at;                /* offset of the data in that buffer's payload                */
    int fixed;                /* data set by a fault (NULL, wrap, alias): keep it           */
    int refill;               /* integer contents changed by a fault: write them again      */
    int null_empty;           /* empty tensor given NULL data (legal)                       */
    /* discrete weights */
    int discrete;
    int64_t G;
    size_t mat_bytes;
    int mat_buf[FZ_MAX_G];    /* -1: placed by an overlap fault (no buffer of its own)     */
    void *mat_ptr[FZ_MAX_G];
    int ptrs_buf;
    int null_g;               /* G9: ptrs[null_g] = NULL; -1: none                          */
    int share_g;              /* legal: ptrs[share_g] = ptrs[0] (inputs); -1: none          */
    int both_forms;           /* G10                                                        */
} fz_tensor;

/* An overlap (G8): the mover (a tensor's data, or matrix `mover_g` of a discrete weight) is
 * placed over the target region. */
enum { FZ_REG_DATA, FZ_REG_MATRIX, FZ_REG_PTRS, FZ_REG_WS, FZ_REG_SAVED };
typedef struct fz_alias {
    int active;
    int mover, mover_g;       /* tensor, matrix index (-1: the data)                         */
    int tkind, target, target_g;
    uint64_t sel;
    int legal;                /* inputs overlapping inputs: valid                            */
} fz_alias;

typedef struct fz_case fz_case;
/* An operation's own faults: applies fault number `kind` (any value: take it modulo the
 * count) with parameter `p`, records it with fz_fault, and returns whether it did. */
typedef bool (*fz_fault_fn)(fz_case *c, void *args, unsigned kind, uint64_t p);

struct fz_case {
    const uint8_t *data;
    size_t size, pos;
    uint64_t rng;             /* contents PRNG                                              */
    int op;
    int huge;                 /* huge mode                                                  */
    int cuda;
    char desc[512];           /* the case, for messages                                     */
    fz_tensor tens[FZ_MAX_TENSORS];
    int ntens;
    fz_buf bufs[FZ_MAX_BUFS];
    int nbufs;
    fz_fault_rec faults[FZ_MAX_FAULTS];
    int nfaults;
    int used_mismatch, used_dtype;   /* at most one of each per case (they could cancel)   */
    int fault_ti, fault_dim;  /* tensor, dimension of the fault being recorded (generic)    */
    fz_alias alias;
    /* workspace and saved */
    size_t ws_need;           /* the valid query's answer                                   */
    int ws_buf;               /* current workspace buffer, -1: none                         */
    void *ws;
    size_t ws_bytes;
    int ws_fault;             /* 0, 1 NULL, 2 short                                         */
    uint64_t ws_param;
    int has_saved;            /* an MoE case                                                */
    int saved_out;            /* `saved` is an output of the current call (the forward)    */
    size_t saved_need;
    int saved_buf;
    int saved_fault;          /* 0, 1 NULL, 2 short                                         */
    uint64_t saved_param;
    /* the call in progress */
    const char *call;
    int call_kind, call_variant;
    int split_faults;         /* SPLITS/IDS/OFFSFIT faults present: no tail checks         */
    int null_variants;        /* make the ctx/args/bytes NULL variants of calls            */
    int specials;             /* NaN, Inf, denormals among float contents                  */
    int legal_alias;          /* place a float input inside another (legal)                */
    size_t saved_at;          /* offset of `saved` in its buffer's payload                 */
    void *saved;
    size_t saved_bytes;
    size_t ws_at;
    unsigned want_deferred;   /* a valid run's moex_context_check_splits statuses (FZ_BIT),
                                 0: MOEX_OK (an EP dispatch that drops rows: BAD_SPLITS)    */
    const moex_weight *fp8_w[2]; /* the layer's weights, for the "kept copies" oracle (NULL: none) */
    void *heap[64];           /* case-owned host arrays                                    */
    int nheap;
    jmp_buf *jb;              /* keep-going: where fz_fail returns                          */
};

/* ---- decoding ---------------------------------------------------------------------------- */

uint8_t fz_u8(fz_case *c);
uint64_t fz_u64(fz_case *c);
int fz_pick(fz_case *c, int n);             /* 0..n-1 from one byte                        */
bool fz_chance(fz_case *c, int in256);      /* one byte < in256                            */
uint64_t fz_rand(fz_case *c);               /* contents PRNG (no input bytes)              */
/* A dimension: run mode lo..small_hi (rarely lo..big_hi); huge mode anything >= lo up to
 * INT64_MAX. */
int64_t fz_dim(fz_case *c, int64_t lo, int64_t small_hi, int64_t big_hi);
moex_dtype fz_act_dtype(fz_case *c);
/* A value for an enum field that is none of its `count` valid values (0..count-1). */
int32_t fz_bad_enum(fz_case *c, uint64_t p, int count);
void fz_note(fz_case *c, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Case-owned host arrays (NULL when n > FZ_MAX_INTS: huge mode, contents irrelevant). */
int64_t *fz_i64s(fz_case *c, int64_t n);
int32_t *fz_i32s(fz_case *c, int64_t n);

/* Valid split values of G groups over T rows into s (when s is not NULL); returns S. */
int64_t fz_make_splits(fz_case *c, int64_t *s, int64_t G, int64_t T);
/* a*b (a, b >= 0) saturated at INT64_MAX. */
int64_t fz_mul_sat(int64_t a, int64_t b);

/* ---- tensors --------------------------------------------------------------------------- */

int fz_tensor_reg(fz_case *c, const char *name, moex_tensor *t, fz_role role, unsigned flags, unsigned dtypes_ok);
int fz_weight_reg(fz_case *c, const char *name, moex_weight *w, fz_role role, unsigned flags, unsigned dtypes_ok);
void fz_set_i64(fz_case *c, int ti, int64_t *v, int64_t n);   /* contents (case-owned)  */
void fz_set_i32(fz_case *c, int ti, int32_t *v, int64_t n);
void fz_tail(fz_case *c, int ti, int64_t S);                  /* rows >= S are the tail */
void fz_tail_cols(fz_case *c, int ti, int64_t S);             /* 2-D: columns >= S too  */
void fz_role_set(fz_case *c, int ti, fz_role role, unsigned flags_add);
int fz_find(fz_case *c, const char *name);

/* Allocates (or re-allocates) and fills the buffers of every tensor as it is now. */
void fz_materialize(fz_case *c);

/* ---- faults ---------------------------------------------------------------------------- */

void fz_fault(fz_case *c, fz_fclass cls, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Reads 0..3 faults from the input and applies them (generic ones here, the operation's
 * through fn), then re-materializes. */
void fz_faults(fz_case *c, fz_fault_fn fn, void *args);
bool fz_has_class(const fz_case *c, fz_fclass cls);
/* Shared operation faults. */
bool fz_fault_split_values(fz_case *c, int ts, int64_t T, uint64_t p);   /* SPLITS  */
bool fz_fault_ids(fz_case *c, int ti, int64_t bound, const char *what, uint64_t p); /* IDS */

/* ---- workspace, saved, calls ---------------------------------------------------------- */

/* Allocates the workspace for the next run: ws_need bytes, at a random misalignment, or as
 * the workspace fault says. */
void fz_workspace(fz_case *c);
/* MoE: allocates `saved` (saved_need bytes, or as the saved fault says) into *saved, *bytes. */
void fz_saved(fz_case *c, void **saved, size_t *bytes);

enum { FZ_K_QUERY, FZ_K_RUN, FZ_K_CTX };
enum { FZ_V_NORMAL, FZ_V_NULL_CTX, FZ_V_NULL_ARGS, FZ_V_NULL_BYTES };

void fz_call_begin(fz_case *c, const char *fn, int kind, int variant);
/* Judges the call that returned st (bytes: a size query's answer, or NULL); returns st.
 * `want` (MOEX status bits, 0: from the faults) overrides the expected statuses. */
moex_status fz_call_end(fz_case *c, moex_status st, const size_t *bytes, unsigned want);
#define FZ_BIT(s) (1u << (unsigned)(s))

/* Reports a failed oracle: prints it with the case and aborts (or, with keep_going,
 * returns to the end of the case). */
#if defined(__GNUC__)
__attribute__((noreturn, format(printf, 3, 4)))
#endif
void fz_fail(fz_case *c, const char *oracle, const char *fmt, ...);

/* An operation's size query and run, with untyped arguments (FZ_OPFNS defines them). */
typedef moex_status (*fz_query_fn)(moex_context *ctx, const void *args, size_t *bytes);
typedef moex_status (*fz_run_fn)(moex_context *ctx, const void *args, void *ws, size_t ws_bytes,
                                 moex_stream stream);
typedef struct fz_opfns {
    const char *qname, *rname;
    fz_query_fn query;
    fz_run_fn run;
} fz_opfns;

#define FZ_OPFNS(var, name, args_t)                                                           \
    static moex_status var##_q(moex_context *x, const void *a, size_t *b) {                    \
        return moex_##name##_workspace_size(x, (const args_t *)a, b);                         \
    }                                                                                         \
    static moex_status var##_r(moex_context *x, const void *a, void *w, size_t n, moex_stream s) { \
        return moex_##name(x, (const args_t *)a, w, n, s);                                    \
    }                                                                                         \
    static const fz_opfns var = {.qname = "moex_" #name "_workspace_size", .rname = "moex_" #name, \
                                 .query = var##_q, .run = var##_r}

/* A size query (and, now and then, its ctx/args/bytes NULL variants), judged; returns its
 * status and leaves the size in *bytes. */
moex_status fz_query(fz_case *c, const char *name, fz_query_fn q, const void *args, size_t *bytes);
/* A run with the case's workspace (and its ctx/args NULL variants), judged. */
moex_status fz_run(fz_case *c, const char *name, fz_run_fn r, const void *args);
/* The usual flow: materialize, valid size query, faults, faulted size query, workspace,
 * run (huge mode: only when the faults make it fail for sure). */
void fz_flow(fz_case *c, const fz_opfns *f, void *args, fz_fault_fn faults);
/* Now and then (the case's mode byte): places one float input inside another (legal). */
void fz_legal_alias(fz_case *c);
/* True when a run must fail whatever the backend (a STRUCT or RUNONLY fault). */
bool fz_must_fail(const fz_case *c);
/* Zeroed case-owned memory (argument structs: their address must not move). */
void *fz_alloc(fz_case *c, size_t bytes);

/* ---- the builders (fuzz_ops_*.c) ------------------------------------------------------- */

void fz_op_splits_to_offsets(fz_case *c);
void fz_op_zero_tail(fz_case *c);
void fz_op_gl_fwd(fz_case *c);
void fz_op_gl_dgrad(fz_case *c);
void fz_op_gl_wgrad(fz_case *c);
void fz_op_glu_fwd(fz_case *c);
void fz_op_glu_bwd(fz_case *c);
void fz_op_mlp_fwd(fz_case *c);
void fz_op_mlp_bwd(fz_case *c);
void fz_op_router_fwd(fz_case *c);
void fz_op_router_bwd(fz_case *c);
void fz_op_permute_fwd(fz_case *c);
void fz_op_permute_bwd(fz_case *c);
void fz_op_unpermute_fwd(fz_case *c);
void fz_op_unpermute_bwd(fz_case *c);
void fz_op_moe(fz_case *c);
void fz_op_context(fz_case *c);
void fz_op_quantize(fz_case *c);
void fz_op_dequantize(fz_case *c);
void fz_op_fp8_fwd(fz_case *c);
void fz_op_fp8_wgrad(fz_case *c);
#ifdef MOEX_FUZZ_HAVE_MPI
void fz_op_ep_dispatch(fz_case *c);
void fz_op_ep_dispatch_bwd(fz_case *c);
void fz_op_ep_combine(fz_case *c);
void fz_op_ep_combine_bwd(fz_case *c);
#endif

/* Shared by the quantization builders (fuzz_ops_quant.c): element i of an f32 / bf16 / f16
 * host array, and the "workspace" oracle (the call again with a fresh workspace of other
 * bytes and another misalignment writes bitwise the same "=" outputs). */
float fz_load_float(const unsigned char *p, moex_dtype dt, int64_t i);
void fz_check_rerun(fz_case *c, const fz_opfns *f, const void *args);

/* Shared by the layer builders (fuzz_ops_linear.c): the `fp8` recipe of the grouped linear,
 * grouped MLP and MoE layer arguments (docs/ops.md 9.11). fz_fp8_recipe reads a valid one:
 * one byte (9 in 16 MOEX_FP8_OFF, 1 in 16 OFF with the other fields set: validated, ignored),
 * a second when it is BLOCK / CURRENT / MXFP8 (3 in 8). fz_fp8_on: the recipe is not OFF.
 * fz_fp8_cap (run mode, recipe on): shrinks the largest of dims[0..n-1] (each >= lo[i])
 * until the product of them times `mul` is at most 2^17 (the CPU runs FP8 through f32
 * dequantized copies under ASan). fz_fault_fp8: an out-of-range mode or dtypes, a negative /
 * NaN / infinite amax_epsilon (whatever the mode), pow2_scales with MXFP8 (STRUCT).
 * fz_layer_flow: fz_flow, then fz_fp8_after_run. fz_fp8_after_run (after a run without faults
 * in run mode): a valid recipe on the CPU must give MOEX_OK ("fp8"); with a recipe on,
 * the "workspace" oracle (fz_check_rerun), then on the CPU "kept copies": the call with the
 * layer's packed weights (c->fp8_w, set by the builder) quantized here with
 * moex_fp8_weight_params and given as fp8.weights writes bitwise the same; with OFF and other
 * fields set, "fp8 off": the call with the recipe zeroed (its own size query, a fresh
 * workspace) writes bitwise the same. */
moex_fp8_recipe fz_fp8_recipe(fz_case *c);
bool fz_fp8_on(const moex_fp8_recipe *r);
void fz_fp8_cap(fz_case *c, const moex_fp8_recipe *r, int64_t *const dims[], const int64_t lo[], int n, int64_t mul);
bool fz_fault_fp8(fz_case *c, moex_fp8_recipe *r, uint64_t p);
void fz_layer_flow(fz_case *c, const fz_opfns *f, void *args, fz_fault_fn faults, moex_fp8_recipe *r);
void fz_fp8_after_run(fz_case *c, const fz_opfns *f, void *args, moex_fp8_recipe *r, moex_status st);

/* Shared by the builders: GLU parameters (valid for F), and their faults. */
moex_glu_params fz_glu_params(fz_case *c, int64_t *F);
bool fz_fault_glu(fz_case *c, moex_glu_params *glu, int64_t F, unsigned kind, uint64_t p);

/* ---- backend memory (fuzz_mem.c) -------------------------------------------------------- */

void *fz_mem_alloc(int cuda, size_t bytes);
void fz_mem_free(int cuda, void *p);
void fz_mem_put(int cuda, void *dst, const void *src, size_t n);
void fz_mem_get(int cuda, void *dst, const void *src, size_t n);
const char *fz_mem_error(int cuda);   /* CUDA: synchronises; a runtime error, or NULL */
int fz_mem_have_cuda(void);           /* compiled with CUDA support                   */

#ifdef __cplusplus
}
#endif

#endif /* MOEX_FUZZ_H */
