/*
 * fuzz_ops_ep.c - argument builders of the moex API fuzzer for expert parallelism
 * (include/moex.h "Expert parallelism", docs/ops.md 10) on the CPU backend over MPI: the
 * dispatch forward (plain or FP8 rows), the dispatch backward, the combine forward and the
 * combine backward, with their size queries. Compiled only in builds with MPI
 * (MOEX_FUZZ_HAVE_MPI); seven op bytes pick these ops there (fz_op_of_byte).
 *
 * MPI: initialised lazily by the first EP case (MPI_Init(NULL, NULL): a singleton, world 1),
 * never finalized. Each case creates its EP context (moex_ep_create on the harness's
 * context, MPI_COMM_WORLD, transfer AUTO) from small drawn E, k, H, dtype, max_tokens and
 * max_recv_rows, and destroys it at the end of the case. --backend cuda never draws these
 * ops (the builders note "skipped: CPU only" and return).
 *
 * The dispatch handle is a harness tensor ("handle", 1-byte elements, FZ_NOFAULT): an output
 * of the dispatch forward, an input of the other calls. The combine and the backwards first
 * run a valid dispatch forward (judged like any call) to fill the handle; its tensors are
 * then kept (FZ_KEEP: they must not change).
 *
 * Faults (besides the generic ones on every tensor; x_scales and xr_scales are G7's forbidden
 * tensors of a plain dispatch; dprobs_r and dprobs G6-required together, or dprobs alone
 * G7-forbidden: given together they are a valid call, so dprobs_r is then never faulted):
 *   ep NULL, ep of another moex_context                                       STRUCT
 *   T past max_tokens (every [T, ...] tensor of the call)                     STRUCT
 *   FP8 dispatch with H % 16 != 0 (drawn with the EP context)                  STRUCT
 *   handle NULL, handle_bytes short (the size queries read no handle)         RUNONLY
 *   handle overlapping a tensor (an output, or any tensor for the dispatch)    RUNONLY
 *   ids outside [0, E) (CPU: refused before anything is written)               IDS
 *   combine / backwards: a handle that holds no dispatch (zeroed), or one of
 *   another T (the call's T changed, <= max_tokens)                            RUNONLY
 *   combine / backwards: bytes of the handle past its header flipped (cpu; no
 *   tail oracle)                                                              CHAOS
 * Oracles added: "ep value" after an OK dispatch without faults (world 1): splits and dropped
 * as counted from ids (rows past max_recv_rows dropped, the last experts' first), each xr row
 * (and its xr_scales row) the bytes of its token's x row and probs_r its prob, in (expert,
 * token, slot) order; a dispatch that drops rows makes moex_context_check_splits give
 * MOEX_ERR_BAD_SPLITS once (then MOEX_OK). Rows of xr, probs_r, xr_scales, dyr past
 * sum(splits) are tails (never written), of yr, dxr, dprobs_r tails never read (ASan).
 */
#include "fuzz.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the EP context of a case ---------------------------------------------------------- */

static MPI_Comm ep_comm;
static int ep_comm_set;
static moex_context *ep_ctx2;   /* another CPU context (fault "ep of another moex_context") */

static struct {
    moex_ep *ep, *other;
    moex_ep_config cfg;
    int64_t E, k, H, Tm, R, El, T, S, drop;
    moex_dtype dt;
    size_t hb;               /* handle_bytes (moex_ep_get_info)                              */
    int fp8;                 /* the dispatch moves FP8 rows                                  */
    /* the handle of the call being built */
    int th;                  /* the handle tensor                                            */
    moex_tensor handle_t;
    void **handle;           /* the call's args fields                                       */
    size_t *handle_bytes;
    moex_ep **ep_field;
    int hfault;              /* 0, 1 NULL, 2 short                                           */
    uint64_t hparam;
    int tok[4], ntok;        /* the call's [T, ...] tensors                                  */
    int dispatch;            /* the call is the dispatch forward (the handle an output)      */
    int32_t *ids;
} ep_s;

static void ep_free(void) {
    moex_ep_destroy(ep_s.ep);
    moex_ep_destroy(ep_s.other);
    ep_s.ep = ep_s.other = NULL;
}

static bool ep_mpi_up(fz_case *c) {
    int up = 0;
    if (MPI_Initialized(&up) != MPI_SUCCESS) fz_fail(c, "harness", "MPI_Initialized failed");
    if (!up) {
        if (MPI_Init(NULL, NULL) != MPI_SUCCESS) fz_fail(c, "harness", "MPI_Init failed");
    }
    /* a copy of MPI_COMM_WORLD that returns errors (the default handler aborts the process:
     * a corrupted handle's counts make MPI_Alltoallv fail with MPI_ERR_TRUNCATE) */
    if (!ep_comm_set) {
        if (MPI_Comm_dup(MPI_COMM_WORLD, &ep_comm) != MPI_SUCCESS ||
            MPI_Comm_set_errhandler(ep_comm, MPI_ERRORS_RETURN) != MPI_SUCCESS)
            fz_fail(c, "harness", "MPI_Comm_dup / MPI_Comm_set_errhandler failed");
        ep_comm_set = 1;
    }
    return true;
}

/* Draws the EP config and creates the context (must succeed). False: nothing to do here. */
static bool ep_setup(fz_case *c) {
    ep_free();   /* a case left by a keep-going failure */
    memset(&ep_s, 0, sizeof ep_s);
    ep_s.th = -1;
    if (c->cuda) {
        fz_note(c, "skipped: the EP ops are fuzzed on the CPU backend only");
        return false;
    }
    c->huge = 0;   /* the EP context's buffers are real: small shapes only */
    ep_mpi_up(c);
    const uint8_t b = fz_u8(c);
    ep_s.fp8 = (b & 3) == 3;
    ep_s.E = 1 + fz_pick(c, 8);
    ep_s.k = 1 + fz_pick(c, (int)(ep_s.E < 4 ? ep_s.E : 4));
    ep_s.Tm = 1 + fz_pick(c, 16);
    const uint8_t rb = fz_u8(c);
    ep_s.R = rb < 160 ? ep_s.Tm * ep_s.k + (rb % 8) : 1 + rb % (ep_s.Tm * ep_s.k);   /* drops when R < T k */
    ep_s.dt = fz_act_dtype(c);
    const uint8_t hb = fz_u8(c);
    bool h16_fault = false;
    if (ep_s.fp8) {
        ep_s.H = 16 * (1 + hb % 10);   /* 16 .. 160: one or two 128-blocks */
        if (fz_chance(c, 24)) ep_s.H += 1 + hb % 15, h16_fault = true;
    } else {
        ep_s.H = 1 + hb % 40;
    }
    ep_s.T = fz_pick(c, (int)ep_s.Tm + 1);
    moex_ep_config *cfg = &ep_s.cfg;
    cfg->comm_kind = MOEX_EP_COMM_MPI;
    cfg->comm = &ep_comm;
    cfg->num_experts = (int32_t)ep_s.E;
    cfg->topk = (int32_t)ep_s.k;
    cfg->hidden = ep_s.H;
    cfg->dtype = ep_s.dt;
    cfg->max_tokens = ep_s.Tm;
    cfg->max_recv_rows = ep_s.R;
    cfg->transfer = MOEX_EP_TRANSFER_AUTO;
    fz_note(c, "EP E=%lld k=%lld H=%lld %s max_tokens=%lld max_recv_rows=%lld T=%lld%s", (long long)ep_s.E,
            (long long)ep_s.k, (long long)ep_s.H, moex_dtype_name(ep_s.dt), (long long)ep_s.Tm, (long long)ep_s.R,
            (long long)ep_s.T, ep_s.fp8 ? " fp8-dispatch" : "");
    fz_call_begin(c, "moex_ep_create", FZ_K_CTX, FZ_V_NORMAL);
    fz_call_end(c, moex_ep_create(&ep_s.ep, fz_g.ctx, cfg), NULL, FZ_BIT(MOEX_OK));
    moex_ep_info info;
    memset(&info, 0, sizeof info);
    if (moex_ep_get_info(ep_s.ep, &info) != MOEX_OK || info.world != 1 || info.rank != 0 ||
        info.local_experts != ep_s.E || info.transfer != MOEX_EP_TRANSFER_CAPACITY || info.handle_bytes == 0)
        fz_fail(c, "ep info", "moex_ep_get_info: world %d rank %d local_experts %d transfer %d handle_bytes %zu",
                (int)info.world, (int)info.rank, (int)info.local_experts, (int)info.transfer, info.handle_bytes);
    ep_s.El = info.local_experts;
    ep_s.hb = info.handle_bytes;
    const int64_t slots = ep_s.T * ep_s.k;
    ep_s.S = slots < ep_s.R ? slots : ep_s.R;
    ep_s.drop = slots - ep_s.S;
    if (h16_fault) fz_fault(c, FZ_STRUCT, "FP8 dispatch with H = %lld, not a multiple of 16", (long long)ep_s.H);
    return true;
}

/* ---- the handle ------------------------------------------------------------------------ */

/* Registers the handle tensor (dispatch: an output) and remembers the call's fields. */
static void handle_reg(fz_case *c, void **field, size_t *bytes, moex_ep **ep, bool dispatch) {
    ep_s.handle = field;
    ep_s.handle_bytes = bytes;
    ep_s.ep_field = ep;
    ep_s.dispatch = dispatch;
    ep_s.hfault = 0;
    if (ep_s.th < 0) {
        const int64_t extra = (fz_rand(c) & 3) == 0 ? (int64_t)(fz_rand(c) % 40) : 0;
        ep_s.handle_t = moex_tensor_1d(NULL, MOEX_DTYPE_E4M3, (int64_t)ep_s.hb + extra);
        ep_s.th = fz_tensor_reg(c, "handle", &ep_s.handle_t, FZ_OUT, FZ_NOFAULT, DT(MOEX_DTYPE_E4M3));
        c->tens[ep_s.th].null_empty = 0;
    } else {
        fz_role_set(c, ep_s.th, dispatch ? FZ_OUT : FZ_IN, 0);
    }
}

/* The call's handle fields as the case has them now (after every materialize). */
static void handle_sync(fz_case *c) {
    *ep_s.handle = ep_s.handle_t.data;
    *ep_s.handle_bytes = ep_s.hb;
    if (ep_s.hfault == 1) {
        *ep_s.handle = NULL;
        if (ep_s.hparam & 1) *ep_s.handle_bytes = 0;
    } else if (ep_s.hfault == 2) {
        *ep_s.handle_bytes = ep_s.hb - 1 - (size_t)(ep_s.hparam >> 8) % ep_s.hb;
    }
    (void)c;
}

/* ---- faults shared by the four calls ----------------------------------------------------- */

static bool ep_other(fz_case *c) {
    if (!ep_ctx2 && moex_context_create(&ep_ctx2, MOEX_BACKEND_CPU, 0) != MOEX_OK)
        fz_fail(c, "harness", "a second CPU context: %s", moex_last_error(NULL));
    if (!ep_s.other && moex_ep_create(&ep_s.other, ep_ctx2, &ep_s.cfg) != MOEX_OK)
        fz_fail(c, "harness", "an EP context on the second CPU context: %s", moex_last_error(ep_ctx2));
    *ep_s.ep_field = ep_s.other;
    fz_fault(c, FZ_STRUCT, "ep of another moex_context");
    return true;
}

/* Every [T, ...] tensor of the call gets T' rows (untouched ones only). */
static bool ep_retoken(fz_case *c, int64_t T2) {
    if (ep_s.ntok == 0) return false;
    for (int i = 0; i < ep_s.ntok; i++) {
        const fz_tensor *X = &c->tens[ep_s.tok[i]];
        if (X->touched || X->t->ndim < 1 || X->t->ndim > MOEX_MAX_DIMS) return false;
    }
    for (int i = 0; i < ep_s.ntok; i++) {
        fz_tensor *X = &c->tens[ep_s.tok[i]];
        X->t->shape[0] = T2;
        X->touched = 1;
        X->i32 = NULL, X->i64 = NULL, X->nints = 0;   /* ids: contents of a refused call */
    }
    return true;
}

/* An overlap of the handle with a tensor the call validates (the dispatch: any; the others:
 * an output, the handle being an input there). */
static bool ep_handle_overlap(fz_case *c, unsigned sel, uint64_t p) {
    if (c->alias.active || ep_s.hfault) return false;
    int cand[FZ_MAX_TENSORS], n = 0;
    for (int i = 0; i < c->ntens; i++) {
        const fz_tensor *X = &c->tens[i];
        if (i == ep_s.th || (X->flags & FZ_NOFAULT) || X->touched || X->t->ndim == 0 || X->fixed || X->discrete ||
            !X->t->data || X->buf < 0)
            continue;
        if (!ep_s.dispatch && X->role != FZ_OUT) continue;
        int64_t ne = 1;
        for (int d = 0; d < X->t->ndim; d++) ne = fz_mul_sat(ne, X->t->shape[d]);
        if (ne <= 0) continue;
        cand[n++] = i;
    }
    if (!n) return false;
    const int m = cand[sel % (unsigned)n];
    c->alias = (fz_alias){.active = 1, .mover = m, .mover_g = -1, .tkind = FZ_REG_DATA, .target = ep_s.th,
                          .target_g = -1, .sel = p >> 8};
    c->tens[m].touched = 1;
    fz_fault(c, FZ_RUNONLY, "handle overlaps %s (%s)", c->tens[m].name,
             c->tens[m].role == FZ_OUT ? "output" : "input");
    return true;
}

/* The faults of any EP call: kinds 0..4; -1 when `kind` is not one of them. */
static int ep_common_fault(fz_case *c, unsigned kind, uint64_t p) {
    switch (kind) {
    case 0:
        *ep_s.ep_field = NULL;
        fz_fault(c, FZ_STRUCT, "ep NULL");
        return 1;
    case 1: return ep_other(c);
    case 2:
        if (!ep_retoken(c, ep_s.Tm + 1 + (int64_t)(p % 3))) return 0;
        fz_fault(c, FZ_STRUCT, "T past max_tokens: T = %lld > %lld", (long long)(ep_s.Tm + 1 + (int64_t)(p % 3)),
                 (long long)ep_s.Tm);
        return 1;
    case 3:
    case 4:
        if (ep_s.hfault || (c->alias.active && c->alias.target == ep_s.th)) return 0;
        ep_s.hfault = kind == 3 ? 1 : 2;
        ep_s.hparam = p;
        fz_fault(c, FZ_RUNONLY, "handle %s (moex_ep_get_info: handle_bytes %zu)", kind == 3 ? "NULL" : "short",
                 ep_s.hb);
        return 1;
    default: return -1;
    }
}

/* The faults of the combine and the backwards (the handle an input). */
static bool ep_handle_fault(fz_case *c, void *args, unsigned kind, uint64_t p) {
    (void)args;
    const int r = ep_common_fault(c, kind % 8, p);
    if (r >= 0) return r != 0;
    fz_tensor *Hd = &c->tens[ep_s.th];
    switch (kind % 8) {
    case 5: {   /* the call's T != the dispatch's T */
        int64_t T2 = (int64_t)(p % (uint64_t)(ep_s.Tm + 1));
        if (T2 == ep_s.T) T2 = ep_s.T == 0 ? 1 : ep_s.T - 1;
        if (!ep_retoken(c, T2)) return false;
        fz_fault(c, FZ_RUNONLY, "handle of a dispatch of %lld tokens, the call has %lld", (long long)ep_s.T,
                 (long long)T2);
        return true;
    }
    case 6: {   /* zeroed: no dispatch */
        if (Hd->touched || ep_s.hfault || c->alias.active) return false;
        unsigned char *z = (unsigned char *)fz_alloc(c, ep_s.handle_t.shape[0]);
        fz_mem_put(0, ep_s.handle_t.data, z, (size_t)ep_s.handle_t.shape[0]);
        Hd->touched = 1;
        fz_fault(c, FZ_RUNONLY, "handle zeroed: it holds no dispatch");
        return true;
    }
    case 7: {   /* bytes past the header flipped: validity unknown */
        if (Hd->touched || ep_s.hfault || c->alias.active || ep_s.hb <= 256 + 64) return false;
        unsigned char *base = (unsigned char *)ep_s.handle_t.data;
        const uintptr_t al = ((uintptr_t)base + 255) / 256 * 256;
        const size_t from = (size_t)(al - (uintptr_t)base) + 56, to = (size_t)(al - (uintptr_t)base) + ep_s.hb - 256;
        if (to <= from + 4) return false;
        const int n = 1 + (int)((p >> 8) % 4);
        char what[96] = "";
        for (int i = 0; i < n; i++) {
            const size_t at = from + (size_t)(fz_rand(c) % (to - from - 3));
            const uint32_t v = (p >> 10) & 1 ? (uint32_t)fz_rand(c) : (uint32_t)1 << (fz_rand(c) % 32);
            for (int j = 0; j < 4; j++) base[at + (size_t)j] ^= (unsigned char)(v >> (8 * j));
            size_t len = strlen(what);
            snprintf(what + len, sizeof what - len, "%s%zu", i ? "," : "", at - (size_t)(al - (uintptr_t)base));
        }
        Hd->touched = 1;
        c->split_faults = 1;   /* rows past sum(splits) may be read or written now */
        fz_fault(c, FZ_CHAOS, "handle bytes flipped at offsets %s past the aligned start (cpu)", what);
        return true;
    }
    default: return ep_handle_overlap(c, kind >> 8, p);
    }
}

static bool ep_dispatch_fault(fz_case *c, void *args, unsigned kind, uint64_t p) {
    const int r = ep_common_fault(c, kind % 7, p);
    if (r >= 0) return r != 0;
    if (kind % 7 == 5) return fz_fault_ids(c, fz_find(c, "ids"), ep_s.E, "ids", p);
    (void)args;
    return ep_handle_overlap(c, kind >> 8, p);
}

/* ---- the flow ------------------------------------------------------------------------------ */

/* Valid query, faults, faulted query, workspace, run (the handle synced after each step). */
static moex_status ep_flow(fz_case *c, const fz_opfns *f, void *args, fz_fault_fn faults, bool with_faults) {
    fz_materialize(c);
    if (with_faults && c->legal_alias) fz_legal_alias(c);
    handle_sync(c);
    size_t need = 0;
    moex_status st = fz_query(c, f->qname, f->query, args, &need);
    if (st != MOEX_OK) return st;
    c->ws_need = need;
    if (with_faults) {
        fz_faults(c, faults, args);
        handle_sync(c);
        if (c->nfaults) {
            size_t n2 = 0;
            fz_query(c, f->qname, f->query, args, &n2);
        }
    }
    fz_workspace(c);
    if (fz_g.verbose) fz_print_current_case(stderr);   /* before the run: an MPI abort prints nothing after */
    c->want_deferred = ep_s.dispatch && ep_s.drop > 0 ? FZ_BIT(MOEX_ERR_BAD_SPLITS) : 0;
    st = fz_run(c, f->rname, f->run, args);
    c->want_deferred = 0;
    return st;
}

/* ---- the dispatch forward ----------------------------------------------------------------- */

FZ_OPFNS(df_fns, ep_dispatch_forward, moex_ep_dispatch_args);
FZ_OPFNS(db_fns, ep_dispatch_backward, moex_ep_dispatch_grad_args);
FZ_OPFNS(cf_fns, ep_combine_forward, moex_ep_combine_args);
FZ_OPFNS(cb_fns, ep_combine_backward, moex_ep_combine_grad_args);

/* Registers a dispatch's arguments (valid). */
static void dispatch_build(fz_case *c, moex_ep_dispatch_args *a) {
    const int64_t T = ep_s.T, H = ep_s.H, k = ep_s.k, R = ep_s.R, nb = (H + 127) / 128;
    const uint8_t o = fz_u8(c);
    const bool probs_r = o & 1, dropped = o & 2;
    const moex_dtype xdt = ep_s.fp8 ? ((o & 4) ? MOEX_DTYPE_E5M2 : MOEX_DTYPE_E4M3) : ep_s.dt;
    a->ep = ep_s.ep;
    int32_t *ids = fz_i32s(c, T * k);
    for (int64_t i = 0; i < T * k; i++) ids[i] = (int32_t)(fz_rand(c) % (uint64_t)ep_s.E);
    if ((o & 8) && T * k > 0) ids[fz_rand(c) % (uint64_t)(T * k)] = (int32_t)(ep_s.E - 1);
    ep_s.ids = ids;
    ep_s.ntok = 0;
    a->x = moex_tensor_2d(NULL, xdt, T, H);
    ep_s.tok[ep_s.ntok++] = fz_tensor_reg(c, "x", &a->x, FZ_IN, FZ_REQUIRED, DT(xdt));
    a->ids = moex_tensor_2d(NULL, I32, T, k);
    const int ti = fz_tensor_reg(c, "ids", &a->ids, FZ_IN, FZ_REQUIRED, DT(I32));
    fz_set_i32(c, ti, ids, T * k);
    ep_s.tok[ep_s.ntok++] = ti;
    a->probs = moex_tensor_2d(NULL, F32, T, k);
    ep_s.tok[ep_s.ntok++] = fz_tensor_reg(c, "probs", &a->probs, FZ_IN, FZ_REQUIRED, DT(F32));
    a->x_scales = moex_tensor_2d(NULL, F32, T, nb);
    const int txs = fz_tensor_reg(c, "x_scales", &a->x_scales, FZ_IN, ep_s.fp8 ? FZ_REQUIRED : FZ_FORBIDDEN, DT(F32));
    if (ep_s.fp8) ep_s.tok[ep_s.ntok++] = txs;
    a->xr = moex_tensor_2d(NULL, xdt, R, H);
    fz_tail(c, fz_tensor_reg(c, "xr", &a->xr, FZ_OUT, FZ_REQUIRED, DT(xdt)), ep_s.S);
    a->xr_scales = moex_tensor_2d(NULL, F32, R, nb);
    fz_tail(c, fz_tensor_reg(c, "xr_scales", &a->xr_scales, FZ_OUT, ep_s.fp8 ? FZ_REQUIRED : FZ_FORBIDDEN, DT(F32)),
            ep_s.S);
    a->probs_r = moex_tensor_1d(NULL, F32, R);
    if (!probs_r) a->probs_r.ndim = 0;
    fz_tail(c, fz_tensor_reg(c, "probs_r", &a->probs_r, FZ_OUT, 0, DT(F32)), ep_s.S);
    a->splits = moex_tensor_1d(NULL, I64, ep_s.El);
    fz_tensor_reg(c, "splits", &a->splits, FZ_OUT, FZ_REQUIRED, DT(I64));
    a->dropped = moex_tensor_1d(NULL, I64, 1);
    if (!dropped) a->dropped.ndim = 0;
    fz_tensor_reg(c, "dropped", &a->dropped, FZ_OUT, 0, DT(I64));
    handle_reg(c, &a->handle, &a->handle_bytes, &a->ep, true);
    fz_note(c, " | dispatch %s probs_r=%d dropped=%d (S=%lld, %lld dropped)", moex_dtype_name(xdt), probs_r, dropped,
            (long long)ep_s.S, (long long)ep_s.drop);
}

/* "ep value": after an OK dispatch without faults, what world 1 gives. */
static void dispatch_check(fz_case *c, const moex_ep_dispatch_args *a) {
    const int64_t T = ep_s.T, k = ep_s.k, E = ep_s.E, R = ep_s.R, H = ep_s.H;
    int64_t *want = fz_i64s(c, E), got_d = -1;
    int64_t *got = fz_i64s(c, E);
    fz_mem_get(0, got, a->splits.data, (size_t)E * 8);
    int64_t m = 0;
    const size_t xrow = (size_t)H * moex_dtype_size(a->x.dtype), srow = (size_t)((H + 127) / 128) * 4;
    for (int64_t e = 0; e < E; e++) {
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < k; j++) {
                if (ep_s.ids[t * k + j] != e || m >= R) continue;
                const char *xr = (const char *)a->xr.data + (size_t)m * xrow, *x = (const char *)a->x.data + (size_t)t * xrow;
                if (memcmp(xr, x, xrow) != 0)
                    fz_fail(c, "ep value", "xr row %lld is not x row %lld (expert %lld, slot %lld)", (long long)m,
                            (long long)t, (long long)e, (long long)j);
                if (ep_s.fp8 && memcmp((const char *)a->xr_scales.data + (size_t)m * srow,
                                       (const char *)a->x_scales.data + (size_t)t * srow, srow) != 0)
                    fz_fail(c, "ep value", "xr_scales row %lld is not x_scales row %lld", (long long)m, (long long)t);
                if (a->probs_r.ndim && memcmp((const float *)a->probs_r.data + m, (const float *)a->probs.data + t * k + j, 4))
                    fz_fail(c, "ep value", "probs_r[%lld] is not probs[%lld, %lld]", (long long)m, (long long)t,
                            (long long)j);
                want[e]++;
                m++;
            }
    }
    for (int64_t e = 0; e < E; e++)
        if (got[e] != want[e])
            fz_fail(c, "ep value", "splits[%lld] = %lld, want %lld", (long long)e, (long long)got[e], (long long)want[e]);
    if (a->dropped.ndim) {
        fz_mem_get(0, &got_d, a->dropped.data, 8);
        if (got_d != ep_s.drop)
            fz_fail(c, "ep value", "dropped = %lld, want %lld", (long long)got_d, (long long)ep_s.drop);
    }
}

/* Runs the case's dispatch forward: with faults (the dispatch op) or valid (the others).
 * Returns its status. */
static moex_status dispatch_run(fz_case *c, moex_ep_dispatch_args *a, bool with_faults) {
    dispatch_build(c, a);
    const moex_status st = ep_flow(c, &df_fns, a, ep_dispatch_fault, with_faults);
    if (st == MOEX_OK && !c->nfaults) {
        dispatch_check(c, a);
        if (ep_s.drop > 0) {   /* BAD_SPLITS once (fz_call_end saw it): then MOEX_OK */
            const char *call = c->call;
            fz_call_begin(c, "moex_context_check_splits (the second after a dropping dispatch)", FZ_K_CTX,
                          FZ_V_NORMAL);
            fz_call_end(c, moex_context_check_splits(fz_g.ctx, NULL), NULL, FZ_BIT(MOEX_OK));
            c->call = call;
        }
    }
    return st;
}

/* The dispatch's tensors, kept unchanged by the later call. */
static void dispatch_keep(fz_case *c) {
    for (int i = 0; i < c->ntens; i++)
        if (i != ep_s.th) fz_role_set(c, i, FZ_KEEP, FZ_NOFAULT);
    for (int i = 0; i < c->ntens; i++) c->tens[i].tail_row = -1;
    ep_s.ntok = 0;
}

void fz_op_ep_dispatch(fz_case *c) {
    if (!ep_setup(c)) return;
    moex_ep_dispatch_args *a = (moex_ep_dispatch_args *)fz_alloc(c, sizeof *a);
    dispatch_run(c, a, true);
    ep_free();
}

/* ---- the combine and the backwards ---------------------------------------------------------- */

/* Runs a valid dispatch for the handle; false when it did not succeed. */
static bool ep_prelude(fz_case *c) {
    if (!ep_setup(c)) return false;
    moex_ep_dispatch_args *d = (moex_ep_dispatch_args *)fz_alloc(c, sizeof *d);
    if (c->nfaults || dispatch_run(c, d, false) != MOEX_OK) {
        ep_free();
        return false;
    }
    dispatch_keep(c);
    return true;
}

void fz_op_ep_combine(fz_case *c) {
    if (!ep_prelude(c)) return;
    moex_ep_combine_args *a = (moex_ep_combine_args *)fz_alloc(c, sizeof *a);
    a->ep = ep_s.ep;
    handle_reg(c, (void **)&a->handle, &a->handle_bytes, &a->ep, false);
    a->yr = moex_tensor_2d(NULL, ep_s.dt, ep_s.R, ep_s.H);
    fz_tail(c, fz_tensor_reg(c, "yr", &a->yr, FZ_IN, FZ_REQUIRED, DT(ep_s.dt)), ep_s.S);
    a->y = moex_tensor_2d(NULL, ep_s.dt, ep_s.T, ep_s.H);
    ep_s.tok[ep_s.ntok++] = fz_tensor_reg(c, "y", &a->y, FZ_OUT, FZ_REQUIRED | FZ_FREE0, DT(ep_s.dt));
    fz_note(c, " | combine");
    ep_flow(c, &cf_fns, a, ep_handle_fault, true);
    ep_free();
}

void fz_op_ep_combine_bwd(fz_case *c) {
    if (!ep_prelude(c)) return;
    moex_ep_combine_grad_args *a = (moex_ep_combine_grad_args *)fz_alloc(c, sizeof *a);
    a->ep = ep_s.ep;
    handle_reg(c, (void **)&a->handle, &a->handle_bytes, &a->ep, false);
    a->dy = moex_tensor_2d(NULL, ep_s.dt, ep_s.T, ep_s.H);
    ep_s.tok[ep_s.ntok++] = fz_tensor_reg(c, "dy", &a->dy, FZ_IN, FZ_REQUIRED | FZ_FREE0, DT(ep_s.dt));
    a->dyr = moex_tensor_2d(NULL, ep_s.dt, ep_s.R, ep_s.H);
    fz_tail(c, fz_tensor_reg(c, "dyr", &a->dyr, FZ_OUT, FZ_REQUIRED, DT(ep_s.dt)), ep_s.S);
    fz_note(c, " | combine backward");
    ep_flow(c, &cb_fns, a, ep_handle_fault, true);
    ep_free();
}

void fz_op_ep_dispatch_bwd(fz_case *c) {
    if (!ep_prelude(c)) return;
    moex_ep_dispatch_grad_args *a = (moex_ep_dispatch_grad_args *)fz_alloc(c, sizeof *a);
    a->ep = ep_s.ep;
    const bool dp = fz_chance(c, 128);
    handle_reg(c, (void **)&a->handle, &a->handle_bytes, &a->ep, false);
    a->dxr = moex_tensor_2d(NULL, ep_s.dt, ep_s.R, ep_s.H);
    fz_tail(c, fz_tensor_reg(c, "dxr", &a->dxr, FZ_IN, FZ_REQUIRED, DT(ep_s.dt)), ep_s.S);
    a->dprobs_r = moex_tensor_1d(NULL, F32, ep_s.R);
    if (!dp) a->dprobs_r.ndim = 0;
    fz_tail(c, fz_tensor_reg(c, "dprobs_r", &a->dprobs_r, FZ_IN, dp ? FZ_REQUIRED : FZ_NOFAULT, DT(F32)), ep_s.S);
    a->dx = moex_tensor_2d(NULL, ep_s.dt, ep_s.T, ep_s.H);
    ep_s.tok[ep_s.ntok++] = fz_tensor_reg(c, "dx", &a->dx, FZ_OUT, FZ_REQUIRED | FZ_FREE0, DT(ep_s.dt));
    a->dprobs = moex_tensor_2d(NULL, F32, ep_s.T, ep_s.k);
    const int tdp = fz_tensor_reg(c, "dprobs", &a->dprobs, FZ_OUT, (dp ? FZ_REQUIRED : FZ_FORBIDDEN) | FZ_FREE0, DT(F32));
    if (dp) ep_s.tok[ep_s.ntok++] = tdp;
    fz_note(c, " | dispatch backward dprobs=%d", dp);
    ep_flow(c, &db_fns, a, ep_handle_fault, true);
    ep_free();
}
