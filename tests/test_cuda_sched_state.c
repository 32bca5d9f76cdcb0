/*
 * test_cuda_sched_state.c - the CUDA backend's deferred schedule launch
 * (src/cuda/cuda_sched_state.h), a plain-C state machine, checked without a GPU: every row of
 * its transition table, as the sequences the grouped calls make (a forward of Hopper GEMMs
 * only; a portable kernel that reads the offsets; a call of two handles; a failed call; a
 * call whose handle a Hopper GEMM checked and a kernel also read), and that each call leaves
 * the state idle for the next.
 */
#include "../src/cuda/cuda_sched_state.h"
#include "test_util.h"

static int64_t off_a[3], off_b[3];

static moex_groups handle(int64_t *off, int64_t G) {
    moex_groups g = {.G = G, .T = 10, .splits = NULL, .off = off};
    return g;
}

static int idle(const moex_sched_state *s) { return !s->is_pending && !s->checked; }

int main(void) {
    moex_sched_state s = {0};
    moex_sched_launch l;
    const moex_groups a = handle(off_a, 2), b = handle(off_b, 1);
    void *stream1 = (void *)&s, *stream2 = (void *)&l;

    /* IDLE: need, checked and finish launch nothing and stay IDLE */
    CHECK(!moex_sched_need(&s, &a, &l));
    moex_sched_checked(&s, &a);
    CHECK(idle(&s));
    CHECK(!moex_sched_finish(&s, true, &l) && idle(&s));

    /* prepare(a) from IDLE: nothing to launch; then a portable kernel reads a's offsets:
     * launched once, with the stream and op of the call that prepared it */
    CHECK(!moex_sched_prepare(&s, &a, stream1, 7, &l));
    CHECK(s.is_pending && !s.checked);
    CHECK(!moex_sched_need(&s, &b, &l));   /* need of another handle: nothing */
    CHECK(moex_sched_need(&s, &a, &l));
    CHECK(l.groups.off == off_a && l.groups.G == 2 && l.stream == stream1 && l.op_id == 7);
    CHECK(!moex_sched_need(&s, &a, &l));   /* once */
    CHECK(!moex_sched_finish(&s, true, &l) && idle(&s));

    /* a call of Hopper GEMMs only: checked, then finish launches nothing */
    CHECK(!moex_sched_prepare(&s, &a, stream1, 3, &l));
    moex_sched_checked(&s, &b);   /* another handle's check does not count */
    CHECK(!s.checked);
    moex_sched_checked(&s, &a);
    CHECK(s.checked);
    CHECK(!moex_sched_finish(&s, true, &l) && idle(&s));

    /* a call whose handle nothing read nor checked: finish launches it (its kernel checks the
     * splits) */
    CHECK(!moex_sched_prepare(&s, &a, stream2, 4, &l));
    CHECK(moex_sched_finish(&s, true, &l));
    CHECK(l.groups.off == off_a && l.stream == stream2 && l.op_id == 4 && idle(&s));

    /* the same call failed: nothing is launched, and the state is IDLE for the next call */
    CHECK(!moex_sched_prepare(&s, &a, stream2, 4, &l));
    CHECK(!moex_sched_finish(&s, false, &l) && idle(&s));

    /* checked, and also read by a kernel: launched once, at the read */
    CHECK(!moex_sched_prepare(&s, &a, stream1, 5, &l));
    moex_sched_checked(&s, &a);
    CHECK(moex_sched_need(&s, &a, &l) && l.groups.off == off_a);
    CHECK(!moex_sched_finish(&s, true, &l) && idle(&s));

    /* two handles in one call: preparing b launches a first (its kernels may still read it),
     * and the check state starts over for b */
    CHECK(!moex_sched_prepare(&s, &a, stream1, 6, &l));
    moex_sched_checked(&s, &a);
    CHECK(moex_sched_prepare(&s, &b, stream1, 6, &l));
    CHECK(l.groups.off == off_a && l.op_id == 6);
    CHECK(s.is_pending && !s.checked && s.pending.groups.off == off_b);
    CHECK(!moex_sched_need(&s, &a, &l));   /* a is launched already */
    CHECK(moex_sched_finish(&s, true, &l) && l.groups.off == off_b && idle(&s));
    return tu_finish();
}
