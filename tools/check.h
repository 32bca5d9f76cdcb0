/*
 * check.h - the harness of `moex check`: buffers that live in backend memory with a host
 * copy, comparison of a library output with the fp64 reference (tools/ref/ref.h) under
 * its tolerance model, untouched-tail checks, and one table row per (op, backend, dtype,
 * shape). The op families are in check_ops.c (splits, grouped linear, GLU, grouped MLP)
 * and check_routing.c (router, permute, unpermute, MoE layer).
 */
#ifndef MOEX_CLI_CHECK_H
#define MOEX_CLI_CHECK_H

#include "cli_util.h"
#include "ref.h"

typedef struct checker {
    moex_context *ctx;
    moex_backend be;
    cli_rng rng;
    int verbose;
    int rows, failed;          /* table rows printed, rows that failed */
} checker;

/* One buffer: n elements of dt, a host copy and its backend twin. */
typedef struct cbuf {
    moex_dtype dt;
    int64_t n;
    void *host;
    void *dev;
} cbuf;

/* The result of one table row, accumulated over its outputs. */
typedef struct crow {
    double worst;       /* largest |got - ref| / tol over every compared element */
    int bad;            /* elements out of tolerance, non-finite, or a written tail */
    char note[200];     /* the first problem, for the FAIL line */
} crow;

/* ---- buffers ------------------------------------------------------------------------ */

/* Input: v[0..n) is rounded to dt IN PLACE (the reference then computes on exactly what
 * the library reads) and copied to the backend. v may be NULL: zeros. Returns 0 or -1. */
int  cb_in(checker *c, cbuf *b, moex_dtype dt, double *v, int64_t n);
/* Output: poisoned (every byte 0xFF: NaN in float dtypes, -1 in integers), or set to
 * init[0..n) rounded to dt when init is not NULL (for "+=" outputs). */
int  cb_out(checker *c, cbuf *b, moex_dtype dt, int64_t n, double *init);
/* Copies the backend buffer to the host copy. */
int  cb_get(checker *c, cbuf *b);
void cb_free(checker *c, cbuf *b);

moex_tensor cb_1d(const cbuf *b, int64_t d0);
moex_tensor cb_2d(const cbuf *b, int64_t d0, int64_t d1);
moex_tensor cb_3d(const cbuf *b, int64_t d0, int64_t d1, int64_t d2);

/* ---- comparison ---------------------------------------------------------------------- */

/* Downloads `got` and compares elements [0, nvalid) with ref[i] within ref_tol(m, ref[i],
 * bound[i]) (bound NULL: |ref|); elements [nvalid, n) must still hold their poison bytes.
 * Updates r. `name` names the output in the note. */
void c_compare(checker *c, crow *r, const char *name, cbuf *got, const double *ref, const double *bound,
               int64_t nvalid, const ref_tol_model *m);

/* c_compare of an output that started from init[0..got->n) (a "+=" output): the expected
 * values are init + ref on the first `valid` elements and init after, the bound grows by
 * |init|, and every element is compared. With init NULL (a "=" output): c_compare. */
void c_compare_from(checker *c, crow *r, const char *name, cbuf *got, const double *init, const double *ref,
                    const double *bound, int64_t valid, const ref_tol_model *m);

/* Records a failed library call (or a failed copy when st == MOEX_OK) in r. */
void c_call_failed(checker *c, crow *r, const char *what, moex_status st);

/* Prints the table row and counts it. */
void c_row(checker *c, const char *op, moex_dtype dt, const char *shape, const crow *r);

/* Runs one operation: its workspace query `wsfn`, a backend workspace, then `fn` on the
 * args pointer `a`. Sets `done` to 1 on success; otherwise records the failure in r under
 * the name of fn (`ok` == 0: an earlier setup step failed, the op is not run). C_RUN_AS:
 * the same, the failure recorded under `name`. */
#define C_RUN(c, r, ok, wsfn, fn, a, done) C_RUN_AS(c, r, ok, #fn, wsfn, fn, a, done)
#define C_RUN_AS(c, r, ok, name, wsfn, fn, a, done)                                         \
    do {                                                                                    \
        size_t wsb_ = 0;                                                                    \
        void *ws_ = NULL;                                                                   \
        moex_status st_ = MOEX_OK;                                                          \
        int ok_ = (ok);                                                                     \
        if (ok_) st_ = wsfn((c)->ctx, (a), &wsb_);                                          \
        if (ok_ && st_ == MOEX_OK && wsb_) {                                                \
            ws_ = cli_mem_alloc((c)->be, wsb_);                                             \
            if (!ws_) ok_ = 0;                                                              \
        }                                                                                   \
        if (ok_ && st_ == MOEX_OK) st_ = fn((c)->ctx, (a), ws_, wsb_, NULL);                 \
        if (ok_ && st_ == MOEX_OK && cli_mem_sync((c)->be) != 0) ok_ = 0;                   \
        cli_mem_free((c)->be, ws_);                                                         \
        (done) = ok_ && st_ == MOEX_OK;                                                     \
        if (!(done)) c_call_failed((c), (r), (name), st_);                                  \
    } while (0)

/* Every check is a block of the same steps: outputs from cb_out, the op's argument struct,
 * C_RUN or C_RUN_AS, the fp64 reference, c_compare (c_compare_from for "+="), c_row, the
 * frees; and every case function starts with its sizes, splits and shape string. So the
 * blocks and case functions of different ops look alike line by line (`duplicates` pairs
 * some of them, shape only), but each names its own argument struct type, buffers and
 * reference function, which a C helper could take only through a macro hiding what the
 * check passes. What they share is in the helpers here; the rest stays written out, one
 * block per op, so that each check reads on its own. */

/* ---- data --------------------------------------------------------------------------- */

double *c_doubles(int64_t n);                                  /* zeroed, exits on OOM */
void    c_uniform(checker *c, double *v, int64_t n, double lo, double hi);
double *c_random(checker *c, int64_t n, double lo, double hi); /* c_doubles, then c_uniform */

/* The GLU parameters of a case (kind's defaults, the layout) and the kind's name in shapes. */
moex_glu_params c_glu(moex_glu_kind kind, moex_glu_layout layout);
const char *c_glu_name(moex_glu_kind kind);   /* "swiglu", "clamped-i32" */

typedef enum c_splits_kind {
    C_SPLITS_BALANCED = 0,   /* as equal as possible               */
    C_SPLITS_SKEWED,         /* random shares, one group empty      */
    C_SPLITS_EMPTY_ENDS,     /* first and last groups empty         */
    C_SPLITS_ONE_GROUP       /* everything in the middle group      */
} c_splits_kind;

const char *c_splits_name(c_splits_kind k);
/* splits[0..G) >= 0 summing to S, and the same values in sd[0..G) (for cb_in). */
void c_make_splits(checker *c, c_splits_kind k, int64_t G, int64_t S, int64_t *splits, double *sd);

/* The op families (each prints its rows). */
void check_splits_to_offsets(checker *c);
void check_grouped_linear(checker *c);
void check_scaled_glu(checker *c);
void check_grouped_mlp(checker *c);
void check_routing(checker *c);
void check_moe_layer(checker *c);

#endif /* MOEX_CLI_CHECK_H */
