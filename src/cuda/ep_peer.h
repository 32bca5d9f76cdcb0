/*
 * ep_peer.h - private: the PEER exchange of expert parallelism (ep_peer.cu's kernels; set up
 * by ep_nccl.cu, which maps every rank's receive memory into every other rank's process).
 */
#ifndef MOEX_EP_PEER_H
#define MOEX_EP_PEER_H

#include "ep.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One rank's receive memory as this process maps it: its receive buffer ([W Tm] wire rows),
 * the counts its senders write (inbox [W] i64) and its barrier flags ([W] u64, one per
 * sender). */
typedef struct moex_ep_peer {
    char *rcv;
    int64_t *inbox;
    uint64_t *flags;
} moex_ep_peer;

/* The device side of the PEER exchange: peers [W] (device memory) and the exchange counter. */
typedef struct moex_ep_peer_state {
    const moex_ep_peer *peers;
    uint64_t *epoch;
} moex_ep_peer_state;

/* The two steps of an exchange (ep.h's open and exchange) through the peers' mapped receive
 * buffers, which the writing kernels fill directly (ep->out[r] = region `rank` of
 * peers[r].rcv). */
moex_status moex_ep_peer_open(moex_context *ctx, const moex_call *c, const moex_ep_peer_state *p,
                              const moex_ep_geom *g);
moex_status moex_ep_peer_exchange(moex_context *ctx, const moex_call *c, const moex_ep_peer_state *p,
                                  const moex_ep_geom *g, const moex_ep_exchange *x);

#ifdef __cplusplus
}
#endif

#endif /* MOEX_EP_PEER_H */
