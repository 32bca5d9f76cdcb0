/*
 * cuda_sched_state.h - private: the one state the CUDA backend keeps between the steps of a
 * call, as a plain-C state machine (no CUDA in it: tests/test_cuda_sched_state.c checks every
 * transition without a GPU). cuda_splits.cu owns the state (moex_cuda_state.sched) and is
 * its only user.
 *
 * A grouped call prepares its groups (moex_cuda_groups_prepare), but the schedule kernel that
 * turns the split values into clamped row offsets and row-tile offsets is launched only when a
 * kernel of the call first reads them (moex_cuda_sched_ready), and not at all when every
 * kernel that used them was a Hopper GEMM, which reads and checks the split values itself
 * (moex_cuda_bad_splits_flag): on the calls a training step makes most, that saves a launch.
 * The state is the prepared handle whose schedule is not launched yet, if any:
 *
 *   state          event                                   launches       next state
 *   IDLE           prepare(h)                              -              PENDING(h)
 *   PENDING(h)     prepare(h') (a call's second handle)    h              PENDING(h')
 *   PENDING(h)     need(h) (a kernel reads h's offsets)    h              IDLE
 *   PENDING(h)     need(h'), h' != h                       -              PENDING(h)
 *   PENDING(h)     checked(h) (a Hopper GEMM checks h)     -              PENDING(h), checked
 *   PENDING(h)     finish(ok), h not checked               h (its check)  IDLE
 *   PENDING(h)     finish(ok), h checked                   -              IDLE
 *   any            finish(failed)                          -              IDLE
 *   IDLE           need, checked, finish                   -              IDLE
 *
 * A handle is named by its offsets array (moex_groups.off), unique among a call's handles.
 * Every call ends in finish (the backend's leave), so no call sees another's state.
 */
#ifndef MOEX_CUDA_SCHED_STATE_H
#define MOEX_CUDA_SCHED_STATE_H

#include <stdbool.h>

#include "backend.h"

/* A schedule to launch: the groups, and the stream and op of the call that prepared them. */
typedef struct moex_sched_launch {
    moex_groups groups;
    void *stream;
    int op_id;
} moex_sched_launch;

typedef struct moex_sched_state {
    moex_sched_launch pending;  /* valid while is_pending                                    */
    bool is_pending;
    bool checked;               /* a Hopper GEMM checked pending's splits                    */
} moex_sched_state;

/* prepare(g): true with *launch set when a handle was pending (launch it first). */
static inline bool moex_sched_prepare(moex_sched_state *s, const moex_groups *g, void *stream, int op_id,
                                      moex_sched_launch *launch) {
    const bool had = s->is_pending;
    if (had) *launch = s->pending;
    s->pending.groups = *g;
    s->pending.stream = stream;
    s->pending.op_id = op_id;
    s->is_pending = true;
    s->checked = false;
    return had;
}

/* need(g): true with *launch set when g is the pending handle (launch it now). */
static inline bool moex_sched_need(moex_sched_state *s, const moex_groups *g, moex_sched_launch *launch) {
    if (!s->is_pending || s->pending.groups.off != g->off) return false;
    *launch = s->pending;
    s->is_pending = false;
    return true;
}

/* checked(g): a Hopper GEMM reads and checks g's split values itself. */
static inline void moex_sched_checked(moex_sched_state *s, const moex_groups *g) {
    if (s->is_pending && s->pending.groups.off == g->off) s->checked = true;
}

/* finish(ok) at the call's end: true with *launch set when the pending handle's splits were
 * never checked (launch it: its kernel checks them); the state is IDLE afterwards. */
static inline bool moex_sched_finish(moex_sched_state *s, bool ok, moex_sched_launch *launch) {
    const bool go = ok && s->is_pending && !s->checked;
    if (go) *launch = s->pending;
    s->is_pending = false;
    s->checked = false;
    return go;
}

#endif /* MOEX_CUDA_SCHED_STATE_H */
