/*
 * moex_ep.h - the moex C API, experimental: expert parallelism.
 *
 * Part of the API of moex.h, which includes this header at its end: `#include "moex.h"` is
 * enough, and this header included alone includes moex.h (the EP MoE layer's arguments are
 * the MoE layer's). Experimental: tested like the stable API, but the declarations may still
 * change. docs/ops.md section 10 gives the math and the transports.
 * moex.h's conventions hold here too: tensors and the alignment rule, the "=" / "+="
 * output contract, the calling sequence and workspace, errors, the overlap rule.
 */
#include "moex.h"   /* first, outside the guard, as moex_fp8.h does */

/* the guard is *_API_H: MOEX_EP_H is the private src/core/ep.h's */
#ifndef MOEX_EP_API_H
#define MOEX_EP_API_H

#ifdef __cplusplus
extern "C" {
#endif

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
 * rank makes the same sequence of them. Over MPI the ranks check that they agree: a config
 * that differs across ranks, or that one rank refuses, fails moex_ep_create on every rank;
 * a dispatch whose ids one rank refuses, and a call on a handle that one rank finds is not
 * its dispatch's or whose counts do not pair with the peers', are refused on every rank
 * before any exchange, all with MOEX_ERR_INVALID_ARG (an allgather of a few words per
 * call). Other argument errors (shapes, dtypes, T past max_tokens) are each rank's own, and
 * over NCCL all are: make the same calls on every rank. One EP context serves one call at a
 * time, in order on one stream (its transfer buffers are shared by its calls). Thread
 * safety: as a context.
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
    moex_tensor dropped;          /* [1] i64: the expert rows this rank received past
                                     max_recv_rows and dropped (their tokens get nothing
                                     from those experts; the dispatch's `dropped`);
                                     optional                                 =             */
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

#endif /* MOEX_EP_API_H */
