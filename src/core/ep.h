/*
 * ep.h - private: expert parallelism (include/moex_ep.h). The EP context, the
 * layout of its transfer buffers and of a dispatch handle, what a backend provides (the local
 * kernels, moex_ep_kernels) and what a transport provides (moving rows between ranks,
 * moex_ep_transport). The operations are composed once, in src/core/ep.c and ep_layer.c.
 *
 * Wire rows. Rows travel as fixed-size "wire rows" of `wire` bytes (a multiple of 16): the H
 * elements of the row in the EP dtype (or an FP8 payload, below), then from byte `meta` (H
 * elements' bytes rounded up to 16) k 4-byte meta words:
 *   to the experts (dispatch forward):  k i32 local expert ids (-1: the slot's expert is not
 *                                       the receiver's) then k f32 probs;
 *   back (dispatch backward):           k f32 dprobs (0 where the slot is not the sender's);
 *   combine and its backward carry no meta.
 * The receive buffer is [W, Tm] wire rows ("regions": region s holds what rank s sent). The
 * kernels that produce outgoing rows (pack, gather_local) write region r's rows through
 * ep->out[r] (a table of W region bases in backend memory, each 16-byte aligned, fixed at
 * creation): a send buffer's region r that the exchange then moves (CAPACITY, MPI), or region
 * `rank` of rank r's receive buffer itself (PEER: the kernels write into the peer).
 *
 * Routing (the handle, in backend memory; every index checked by its readers):
 *   slot_row [Tm, k] i32   token t's slot j went to outgoing row r Tm + pos (row pos of region r),
 *                          r = ids[t, j] / El, pos = the number of tokens t' < t sent to r
 *                          (all slots of t to the same rank share it); -1: a bad id
 *   send_counts [W] i64    tokens sent to each rank
 *   recv_counts [W] i64    rows received from each rank
 *   recv_map [W Tm, k] i32 received wire row i's slot j sits at expert row recv_map (of xr);
 *                          -1: not a local slot, or dropped (past R)
 * A slot j of token t is its rank's first when no j' < j has the same slot_row: the combine
 * sums the rows of first slots, in slot order.
 */
#ifndef MOEX_EP_H
#define MOEX_EP_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The handle's arrays (backend memory), carved from the caller's handle buffer. */
typedef struct moex_ep_routing {
    int32_t *slot_row;              /* [Tm, k] */
    int64_t *send_counts;           /* [W] */
    int64_t *recv_counts;           /* [W] */
    int32_t *recv_map;              /* [W Tm, k] */
} moex_ep_routing;

/* The rows a dispatch moves (pack's source, expand_rows' destination): each wire row's
 * payload is a row of `a` (a_bytes) then, when b is not NULL, a row of `b` (b_bytes) at byte
 * a_bytes: the EP dtype's H elements, or FP8 data (H bytes, H a multiple of 16) and its 1x128
 * scales. The meta words stay at g->meta (the FP8 payload fits before them). */
typedef struct moex_ep_rows {
    void *a;
    size_t a_bytes;
    void *b;
    size_t b_bytes;
} moex_ep_rows;

/* The local kernels of EP (a backend's; ctx->ops->ep). Rows are wire rows of g->wire bytes: of
 * the receive buffer (rcv, [W Tm]) or of the outgoing regions (out). Every kernel reads only
 * the rows below the counts, and never writes past R expert rows or T tokens, whatever the
 * counts, maps and ids hold (CUDA: bad values are skipped and flagged).
 *   route        ids [T, k] -> r->slot_row, r->send_counts (=)
 *   pack         out row slot_row[t, j] (row p of region r: out[r] + p wire bytes) = row t of
 *                src (moex_ep_rows) for each token's slots;
 *                with ids and probs: the dispatch meta (above), else none
 *   expand_plan  from rcv's meta and r->recv_counts: r->recv_map, splits [El] (=), and
 *                the number of expert rows dropped into *dropped (device: an i64, may be
 *                NULL), flagging a drop (moex_context_check_splits)
 *   expand_rows  row recv_map[i, j] of dst (moex_ep_rows, R rows) = rcv[i]'s payload; with
 *                probs_r: probs_r[..] = rcv[i]'s prob j (dispatch forward)
 *   gather_local out row i (rows i of region s below recv_counts[s]) = sum over j, in slot
 *                order, of src[recv_map[i, j]] (rows [R, H], f32 sum rounded to dt; zero when
 *                none); with dsrc (f32 [R]): its meta j = dsrc[recv_map[i, j]] (0 for -1)
 *   reduce       dst[t] = round(sum over t's first slots j of rcv[slot_row[t, j]]) in
 *                dst_dt (f32 or dt; zero when none); with dprobs: dprobs[t, j] =
 *                rcv[slot_row[t, j]]'s meta j (0 for -1)                                  */
typedef struct moex_ep_kernels {
    moex_status (*route)(moex_context *ctx, const moex_call *c, const moex_ep_geom *g, const int32_t *ids,
                         const moex_ep_routing *r);
    moex_status (*pack)(moex_context *ctx, const moex_call *c, const moex_ep_geom *g, const moex_ep_routing *r,
                        const moex_ep_rows *src, const int32_t *ids, const float *probs, void *const *out);
    moex_status (*expand_plan)(moex_context *ctx, const moex_call *c, const moex_ep_geom *g,
                               const moex_ep_routing *r, const void *rcv, int64_t *splits, int64_t *dropped);
    moex_status (*expand_rows)(moex_context *ctx, const moex_call *c, const moex_ep_geom *g,
                               const moex_ep_routing *r, const void *rcv, const moex_ep_rows *dst, float *probs_r);
    moex_status (*gather_local)(moex_context *ctx, const moex_call *c, const moex_ep_geom *g,
                                const moex_ep_routing *r, const void *src, const float *dsrc, void *const *out);
    moex_status (*reduce)(moex_context *ctx, const moex_call *c, const moex_ep_geom *g, const moex_ep_routing *r,
                          const void *rcv, void *dst, moex_dtype dst_dt, float *dprobs);
} moex_ep_kernels;

/* One exchange, in two steps around the kernels that write the outgoing rows through ep->out:
 *   open      before they write (PEER: every rank's receive buffer is free: the previous
 *             exchange's readers are done); NULL: nothing to do
 *   exchange  after: region r's send_counts[r] rows reach region `rank` of rank r's receive
 *             buffer (CAPACITY, MPI: moved now; PEER: already there, made visible), and
 *             recv_counts is known (the reverse of an earlier exchange) or, with learn_counts,
 *             written by the exchange. */
typedef struct moex_ep_exchange {
    const int64_t *send_counts;
    int64_t *recv_counts;
    bool learn_counts;
} moex_ep_exchange;

/* A transport: its state lives in ep->transport_state. */
typedef struct moex_ep_transport {
    const char *name;
    moex_ep_transfer transfer;
    moex_status (*open)(moex_ep *ep, const moex_call *c);
    moex_status (*exchange)(moex_ep *ep, const moex_call *c, const moex_ep_exchange *x);
    void (*destroy)(moex_ep *ep);
} moex_ep_transport;

struct moex_ep {
    moex_context *ctx;
    moex_ep_config cfg;
    moex_ep_geom geom;              /* T = Tm; each call sets its own */
    void *rcv;                      /* the receive buffer: [W Tm] wire rows, backend memory */
    void *const *out;               /* [W] the outgoing regions' bases (above), backend memory */
    const moex_ep_transport *transport;
    void *transport_state;
};

/* Transports (each returns MOEX_ERR_UNSUPPORTED when the build lacks it), in two steps:
 *   *_init    learns rank and world (ep->geom.rank, ep->geom.world) from ep->cfg.comm and
 *             checks the communicator against ep->ctx;
 *   *_alloc   allocates ep->rcv of `bytes` (backend memory), the outgoing regions and their
 *             table ep->out, and sets ep->transport (whose destroy frees them).
 * The core computes the rest of ep->geom between the two. */
moex_status moex_ep_mpi_init(moex_ep *ep);
moex_status moex_ep_mpi_alloc(moex_ep *ep, size_t bytes);
/* After moex_ep_mpi_init: every rank's `bytes` bytes at mine, in rank order, into all
 * (world * bytes); collective. (The NCCL transport has none: its handles are device memory,
 * which the host does not check.) */
moex_status moex_ep_mpi_allgather(moex_ep *ep, const char *op, const void *mine, void *all, size_t bytes);
moex_status moex_ep_nccl_init(moex_ep *ep);
moex_status moex_ep_nccl_alloc(moex_ep *ep, size_t bytes);

/* The steps of ep.c that the EP MoE layer (ep_layer.c) composes; d->g and d->handle set.
 *   moex_ep_check        the EP context of a call: present and on ctx; sets d->g (T: the
 *                        call's, at most max_tokens)
 *   moex_ep_dispatch_run the dispatch forward (writes the handle)
 *   moex_ep_combine_run  rows src [R, H] (and dsrc [R] f32) back to their tokens: dst [T, H]
 *                        in dst_dt (f32 or the EP dtype), dprobs [T, k] (combine forward,
 *                        dispatch backward)
 *   moex_ep_scatter_run  token rows src [T, H] to their expert rows dst [R, H] (combine
 *                        backward)                                                          */
moex_status moex_ep_check(moex_context *ctx, const char *op, const moex_ep *ep, int64_t T, moex_ep_dims *d);
moex_status moex_ep_dispatch_run(moex_context *ctx, const moex_call *c, const moex_ep_dispatch_args *a,
                                 const moex_ep_dims *d);
moex_status moex_ep_combine_run(moex_context *ctx, const moex_call *c, const moex_ep *ep, const moex_ep_dims *d,
                                const void *src, const float *dsrc, void *dst, moex_dtype dst_dt, float *dprobs);
moex_status moex_ep_scatter_run(moex_context *ctx, const moex_call *c, const moex_ep *ep, const moex_ep_dims *d,
                                const void *src, void *dst);

/* Bytes of a handle, and its arrays in a buffer at `base` (aligned; NULL: shapes only). */
size_t moex_ep_routing_layout(const moex_ep_geom *g, void *base, moex_ep_routing *r);

#ifdef __cplusplus
}
#endif

#endif /* MOEX_EP_H */
