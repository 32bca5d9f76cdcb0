/*
 * test_util.h - the tiny test harness shared by every moex test: CHECK macros that count
 * passes and failures, a seeded RNG, poison fills and untouched checks, split generators,
 * and comparison of a library output with the fp64 reference (tools/ref/ref.h) under its
 * tolerance model. Each test's main ends with `return tu_finish();`, which prints
 * "N passed, N failed" on its own line and returns 1 when anything failed.
 */
#ifndef MOEX_TEST_UTIL_H
#define MOEX_TEST_UTIL_H

#include "moex.h"
#include "ref.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- counting checks --------------------------------------------------------------- */

/* Records one check; on failure prints "file:line: FAIL: <msg>" (printf-style). Returns ok. */
int tu_record(int ok, const char *file, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* Prints "N passed, N failed" and returns the exit status (0, or 1 on any failure). */
int tu_finish(void);
int tu_failures(void);

#define CHECK(cond) tu_record(!!(cond), __FILE__, __LINE__, "%s", #cond)
#define CHECK_MSG(cond, ...) tu_record(!!(cond), __FILE__, __LINE__, __VA_ARGS__)
#define CHECK_EQ_I64(a, b)                                                                     \
    do {                                                                                       \
        long long a_ = (long long)(a), b_ = (long long)(b);                                    \
        tu_record(a_ == b_, __FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b, a_, b_);      \
    } while (0)
/* A call returned `want`; on failure prints both status names and moex_last_error(ctx). */
#define CHECK_STATUS(ctx, st, want) tu_check_status((ctx), (st), (want), __FILE__, __LINE__, #st)
int tu_check_status(const moex_context *ctx, moex_status got, moex_status want, const char *file,
                    int line, const char *expr);
/* A call was refused: MOEX_ERR_INVALID_ARG, and its message contains n1 and n2 (each may be
 * NULL: not checked). */
#define CHECK_REFUSED(ctx, st, n1, n2) tu_check_refused((ctx), (st), (n1), (n2), __FILE__, __LINE__, #st)
int tu_check_refused(const moex_context *ctx, moex_status got, const char *n1, const char *n2, const char *file,
                     int line, const char *expr);

/* ---- RNG (splitmix64 seeding an xorshift64*) ---------------------------------------- */

typedef struct tu_rng { uint64_t s; } tu_rng;
tu_rng   tu_rng_seed(uint64_t seed);
uint64_t tu_next(tu_rng *r);
double   tu_uniform(tu_rng *r);                       /* [0, 1)           */
double   tu_uniform_range(tu_rng *r, double lo, double hi);
double   tu_normal(tu_rng *r);                        /* N(0, 1)          */
int64_t  tu_randint(tu_rng *r, int64_t n);            /* [0, n), n >= 1   */
/* v[i] = uniform in [lo, hi), rounded to dt so it is exact in the library's buffer. */
void tu_fill_uniform(tu_rng *r, double *v, int64_t n, double lo, double hi, moex_dtype dt);

/* ---- memory, poison ---------------------------------------------------------------- */

/* malloc/calloc that exit the test on failure. tu_alloc(0) returns a valid pointer. */
void *tu_alloc(size_t bytes);
void *tu_zalloc(size_t bytes);
double *tu_doubles(int64_t n);                      /* zeroed */

/* Poison bytes are 0xFF: a NaN in f32, bf16 and f16, -1 in integer dtypes. */
#define TU_POISON_BYTE 0xFF
void tu_poison(void *p, size_t bytes);
/* Index of the first byte in [p, p+bytes) that is not poison, or -1. */
int64_t tu_first_unpoisoned(const void *p, size_t bytes);
/* CHECK that elements [from, to) of a dtype-dt buffer are still poison. */
#define CHECK_POISONED(name, dt, buf, from, to)                                                \
    tu_check_poisoned((name), (dt), (buf), (from), (to), __FILE__, __LINE__)
int tu_check_poisoned(const char *name, moex_dtype dt, const void *buf, int64_t from, int64_t to,
                      const char *file, int line);

/* Buffer of n elements of dt holding round(v[i]) (v may be NULL: zeros). */
void *tu_buffer(moex_dtype dt, const double *v, int64_t n);
/* n elements of dt read as doubles (caller frees). */
double *tu_read(moex_dtype dt, const void *buf, int64_t n);

/* [T, cols] activation buffer: rows [0, rows) hold round(v[r*cols + c]) (v may be NULL:
 * zeros), rows [rows, T) are poison (NaN), so a library that reads them makes NaNs. */
void *tu_buffer_rows(moex_dtype dt, const double *v, int64_t rows, int64_t T, int64_t cols);
/* A fully poisoned buffer of n elements. */
void *tu_poisoned(moex_dtype dt, int64_t n);

/* A grouped weight [G, R, C] in packed or discrete form (separate allocations). */
typedef struct tu_weight {
    moex_weight w;              /* what the library is given */
    void *packed;               /* packed: the [G,R,C] buffer */
    void **ptrs;                /* discrete: G matrices       */
    moex_dtype dt;
    int64_t G, R, C;
} tu_weight;
/* Values round(v) (v NULL: poison). */
tu_weight tu_weight_make(moex_dtype dt, int64_t G, int64_t R, int64_t C, const double *v, int discrete);
void tu_weight_read(const tu_weight *w, double *out);    /* G*R*C doubles */
void tu_weight_free(tu_weight *w);

/* A workspace of `bytes` (NULL when 0); free with free(). */
void *tu_workspace(size_t bytes);

/* ---- splits ------------------------------------------------------------------------ */

typedef enum tu_splits_kind {
    TU_SPLITS_BALANCED = 0,     /* as equal as possible                              */
    TU_SPLITS_SKEWED,           /* Dirichlet(0.5)-like, one random group empty        */
    TU_SPLITS_EMPTY_FIRST,      /* group 0 empty, the rest random                     */
    TU_SPLITS_EMPTY_MIDDLE,     /* group G/2 empty (and G/2+1 when G > 3)             */
    TU_SPLITS_EMPTY_LAST,       /* group G-1 empty                                    */
    TU_SPLITS_ONE_GROUP,        /* everything in one random group                     */
    TU_SPLITS_RANDOM,           /* uniform random composition                         */
    TU_SPLITS_NUM_KINDS
} tu_splits_kind;

const char *tu_splits_name(tu_splits_kind kind);

/* splits[0..G) >= 0 with sum == total (the empty groups stay empty when total > 0 and
 * the kind leaves others to fill; with G == 1 every kind gives {total}). */
void tu_make_splits(tu_rng *r, tu_splits_kind kind, int64_t G, int64_t total, int64_t *splits);

/* ---- comparison with the reference ------------------------------------------------- */

/* Compares n elements of `got` (dtype dt) with ref[i] (+- ref_tol(m, ref[i], bound[i]));
 * bound may be NULL (then |ref| is used). Element i is printed as [i / cols, i % cols].
 * Counts one check; on failure prints the count of bad elements and the worst one
 * (largest err / tol). Non-finite output is always a failure. Returns the worst
 * err / tol ratio (for reporting margins). */
#define CHECK_CLOSE(what, dt, got, ref, bound, n, cols, m)                                     \
    tu_check_close((what), (dt), (got), (ref), (bound), (n), (cols), (m), __FILE__, __LINE__)
double tu_check_close(const char *what, moex_dtype dt, const void *got, const double *ref,
                      const double *bound, int64_t n, int64_t cols, const ref_tol_model *m,
                      const char *file, int line);

/* CHECK that every element of a dtype-dt buffer is finite. */
#define CHECK_FINITE(what, dt, buf, n) tu_check_finite((what), (dt), (buf), (n), __FILE__, __LINE__)
int tu_check_finite(const char *what, moex_dtype dt, const void *buf, int64_t n, const char *file,
                    int line);

/* CHECK that moex_last_error(ctx) contains `needle` (case-sensitive). */
#define CHECK_MSG_HAS(ctx, needle) tu_check_msg_has((ctx), (needle), __FILE__, __LINE__)
int tu_check_msg_has(const moex_context *ctx, const char *needle, const char *file, int line);

/* A CPU context (exits the test when creation fails); threads from MOEX_NUM_THREADS or
 * the library default. */
moex_context *tu_cpu_context(void);

/* Verbose output (TU_VERBOSE=1 in the environment): tu_log prints only then. */
int  tu_verbose(void);
void tu_log(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

#ifdef __cplusplus
}
#endif

#endif /* MOEX_TEST_UTIL_H */
