/*
 * test_util.c - the test harness (see test_util.h): counters, RNG, poison, splits
 * generators, reference comparison.
 */
#include "test_util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int n_passed, n_failed;

int tu_record(int ok, const char *file, int line, const char *fmt, ...) {
    if (ok) {
        n_passed++;
        return 1;
    }
    n_failed++;
    printf("%s:%d: FAIL: ", file, line); /* stdout only: keeps the order of the log */
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
    return 0;
}

int tu_finish(void) {
    printf("%d passed, %d failed\n", n_passed, n_failed);
    fflush(stdout);
    return n_failed ? 1 : 0;
}

int tu_failures(void) { return n_failed; }

int tu_check_status(const moex_context *ctx, moex_status got, moex_status want, const char *file,
                    int line, const char *expr) {
    return tu_record(got == want, file, line, "%s: got %s, want %s (message: \"%s\")", expr,
                     moex_status_string(got), moex_status_string(want), moex_last_error(ctx));
}

int tu_check_refused(const moex_context *ctx, moex_status got, const char *n1, const char *n2, const char *file,
                     int line, const char *expr) {
    const char *msg = moex_last_error(ctx);
    int ok = tu_record(got == MOEX_ERR_INVALID_ARG, file, line, "%s: got %s, want MOEX_ERR_INVALID_ARG (\"%s\")",
                       expr, moex_status_string(got), msg);
    ok &= tu_record(!n1 || strstr(msg, n1), file, line, "%s: message \"%s\" does not name \"%s\"", expr, msg, n1);
    ok &= tu_record(!n2 || strstr(msg, n2), file, line, "%s: message \"%s\" does not name \"%s\"", expr, msg, n2);
    return ok;
}

/* ---- RNG ------------------------------------------------------------------------------ */

tu_rng tu_rng_seed(uint64_t seed) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ull; /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    tu_rng r = {z ? z : 0x2545f4914f6cdd1dull};
    return r;
}

uint64_t tu_next(tu_rng *r) { /* xorshift64* */
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    return x * 0x2545f4914f6cdd1dull;
}

double tu_uniform(tu_rng *r) { return (double)(tu_next(r) >> 11) * (1.0 / 9007199254740992.0); }

double tu_uniform_range(tu_rng *r, double lo, double hi) { return lo + (hi - lo) * tu_uniform(r); }

double tu_normal(tu_rng *r) {
    double u1 = tu_uniform(r), u2 = tu_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int64_t tu_randint(tu_rng *r, int64_t n) { return (int64_t)(tu_next(r) % (uint64_t)n); }

void tu_fill_uniform(tu_rng *r, double *v, int64_t n, double lo, double hi, moex_dtype dt) {
    for (int64_t i = 0; i < n; i++) v[i] = ref_round(dt, tu_uniform_range(r, lo, hi));
}

/* ---- memory, poison ------------------------------------------------------------------- */

void *tu_alloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "test: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

void *tu_zalloc(size_t bytes) {
    void *p = tu_alloc(bytes);
    memset(p, 0, bytes ? bytes : 1);
    return p;
}

double *tu_doubles(int64_t n) { return (double *)tu_zalloc((size_t)(n > 0 ? n : 1) * sizeof(double)); }

void tu_poison(void *p, size_t bytes) {
    if (bytes) memset(p, TU_POISON_BYTE, bytes);
}

int64_t tu_first_unpoisoned(const void *p, size_t bytes) {
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < bytes; i++)
        if (b[i] != TU_POISON_BYTE) return (int64_t)i;
    return -1;
}

int tu_check_poisoned(const char *name, moex_dtype dt, const void *buf, int64_t from, int64_t to,
                      const char *file, int line) {
    size_t es = moex_dtype_size(dt);
    if (to <= from) return tu_record(1, file, line, "%s", name);
    int64_t bad = tu_first_unpoisoned((const char *)buf + (size_t)from * es, (size_t)(to - from) * es);
    if (bad < 0) return tu_record(1, file, line, "%s", name);
    int64_t e = from + bad / (int64_t)es;
    return tu_record(0, file, line, "%s: element %lld (of poisoned [%lld, %lld)) was written: %g", name,
                     (long long)e, (long long)from, (long long)to, ref_load(dt, buf, e));
}

void *tu_buffer(moex_dtype dt, const double *v, int64_t n) {
    void *p = tu_zalloc((size_t)(n > 0 ? n : 1) * moex_dtype_size(dt));
    if (v) ref_fill(dt, p, v, n);
    return p;
}

double *tu_read(moex_dtype dt, const void *buf, int64_t n) {
    double *d = tu_doubles(n);
    ref_read(dt, buf, d, n);
    return d;
}

void *tu_buffer_rows(moex_dtype dt, const double *v, int64_t rows, int64_t T, int64_t cols) {
    size_t es = moex_dtype_size(dt);
    char *p = (char *)tu_alloc((size_t)(T * cols > 0 ? T * cols : 1) * es);
    if (v)
        ref_fill(dt, p, v, rows * cols);
    else
        memset(p, 0, (size_t)(rows * cols) * es);
    tu_poison(p + (size_t)(rows * cols) * es, (size_t)((T - rows) * cols) * es);
    return p;
}

void *tu_poisoned(moex_dtype dt, int64_t n) {
    size_t bytes = (size_t)(n > 0 ? n : 1) * moex_dtype_size(dt);
    void *p = tu_alloc(bytes);
    tu_poison(p, bytes);
    return p;
}

tu_weight tu_weight_make(moex_dtype dt, int64_t G, int64_t R, int64_t C, const double *v, int discrete) {
    tu_weight w;
    memset(&w, 0, sizeof w);
    w.dt = dt, w.G = G, w.R = R, w.C = C;
    const int64_t m = R * C;
    moex_tensor t = moex_tensor_3d(NULL, dt, G, R, C);
    if (!discrete) {
        w.packed = v ? tu_buffer(dt, v, G * m) : tu_poisoned(dt, G * m);
        t.data = w.packed;
        w.w = moex_weight_packed(t);
    } else {
        w.ptrs = (void **)tu_alloc((size_t)G * sizeof(void *));
        for (int64_t g = 0; g < G; g++)
            w.ptrs[g] = v ? tu_buffer(dt, v + g * m, m) : tu_poisoned(dt, m);
        w.w.t = t;
        w.w.ptrs = (void *const *)w.ptrs;
    }
    return w;
}

void tu_weight_read(const tu_weight *w, double *out) {
    const int64_t m = w->R * w->C;
    if (w->packed) {
        ref_read(w->dt, w->packed, out, w->G * m);
    } else {
        for (int64_t g = 0; g < w->G; g++) ref_read(w->dt, w->ptrs[g], out + g * m, m);
    }
}

void tu_weight_free(tu_weight *w) {
    free(w->packed);
    if (w->ptrs) {
        for (int64_t g = 0; g < w->G; g++) free(w->ptrs[g]);
        free(w->ptrs);
    }
    memset(w, 0, sizeof *w);
}

void *tu_workspace(size_t bytes) { return bytes ? tu_alloc(bytes) : NULL; }

/* ---- splits --------------------------------------------------------------------------- */

const char *tu_splits_name(tu_splits_kind kind) {
    switch (kind) {
    case TU_SPLITS_BALANCED: return "balanced";
    case TU_SPLITS_SKEWED: return "skewed";
    case TU_SPLITS_EMPTY_FIRST: return "empty-first";
    case TU_SPLITS_EMPTY_MIDDLE: return "empty-middle";
    case TU_SPLITS_EMPTY_LAST: return "empty-last";
    case TU_SPLITS_ONE_GROUP: return "one-group";
    case TU_SPLITS_RANDOM: return "random";
    default: return "unknown";
    }
}

/* Gamma(0.5)-like weight: the square of a normal sample (chi-square with 1 dof = 2 Gamma(0.5)). */
static double skew_weight(tu_rng *r) {
    double n = tu_normal(r);
    return n * n;
}

/* Distributes `total` over the groups with mask[g] != 0 in proportion to weights wt[g]
 * (largest remainders; ties to the lower group). */
static void distribute(int64_t G, int64_t total, const double *wt, const int *mask, int64_t *splits) {
    double sum = 0;
    int64_t live = 0;
    for (int64_t g = 0; g < G; g++) {
        splits[g] = 0;
        if (mask[g]) {
            sum += wt[g];
            live++;
        }
    }
    if (live == 0 || total == 0) return;
    int64_t given = 0;
    double *rem = (double *)tu_alloc((size_t)G * sizeof(double));
    for (int64_t g = 0; g < G; g++) {
        rem[g] = -1;
        if (!mask[g]) continue;
        double share = sum > 0 ? (double)total * wt[g] / sum : (double)total / (double)live;
        splits[g] = (int64_t)floor(share);
        rem[g] = share - (double)splits[g];
        given += splits[g];
    }
    while (given < total) { /* largest remainders first; start over when all are used */
        int64_t best = -1;
        for (int64_t g = 0; g < G; g++)
            if (mask[g] && rem[g] >= 0 && (best < 0 || rem[g] > rem[best])) best = g;
        if (best < 0) {
            for (int64_t g = 0; g < G; g++)
                if (mask[g]) rem[g] = 0;
            continue;
        }
        splits[best]++;
        rem[best] = -1;
        given++;
    }
    free(rem);
}

void tu_make_splits(tu_rng *r, tu_splits_kind kind, int64_t G, int64_t total, int64_t *splits) {
    if (G == 1) {
        splits[0] = total;
        return;
    }
    double *wt = (double *)tu_alloc((size_t)G * sizeof(double));
    int *mask = (int *)tu_alloc((size_t)G * sizeof(int));
    for (int64_t g = 0; g < G; g++) {
        wt[g] = 0.05 + tu_uniform(r);
        mask[g] = 1;
    }
    switch (kind) {
    case TU_SPLITS_BALANCED:
        for (int64_t g = 0; g < G; g++) wt[g] = 1.0;
        break;
    case TU_SPLITS_SKEWED:
        for (int64_t g = 0; g < G; g++) wt[g] = skew_weight(r) + 1e-12;
        mask[tu_randint(r, G)] = 0;
        break;
    case TU_SPLITS_EMPTY_FIRST: mask[0] = 0; break;
    case TU_SPLITS_EMPTY_MIDDLE:
        mask[G / 2] = 0;
        if (G > 3) mask[G / 2 + 1] = 0;
        break;
    case TU_SPLITS_EMPTY_LAST: mask[G - 1] = 0; break;
    case TU_SPLITS_ONE_GROUP: {
        int64_t only = tu_randint(r, G);
        for (int64_t g = 0; g < G; g++) mask[g] = g == only;
        break;
    }
    default: break;
    }
    distribute(G, total, wt, mask, splits);
    free(wt);
    free(mask);
}

/* ---- comparison ----------------------------------------------------------------------- */

double tu_check_close(const char *what, moex_dtype dt, const void *got, const double *ref,
                      const double *bound, int64_t n, int64_t cols, const ref_tol_model *m,
                      const char *file, int line) {
    int64_t bad = 0, worst = -1;
    double worst_ratio = 0;
    if (cols < 1) cols = 1;
    for (int64_t i = 0; i < n; i++) {
        double g = ref_load(dt, got, i);
        double b = bound ? bound[i] : fabs(ref[i]);
        double tol = ref_tol(m, ref[i], b);
        double err = fabs(g - ref[i]);
        double ratio = isfinite(g) ? err / tol : INFINITY;
        if (!(ratio <= 1.0)) bad++;
        if (worst < 0 || ratio > worst_ratio || ratio != ratio) {
            worst_ratio = ratio == ratio ? ratio : INFINITY;
            worst = i;
        }
    }
    if (bad == 0) {
        tu_log("  %s: %lld elements, worst err/tol %.3g\n", what, (long long)n, worst_ratio);
        tu_record(1, file, line, "%s", what);
        return worst_ratio;
    }
    double g = ref_load(dt, got, worst), b = bound ? bound[worst] : fabs(ref[worst]);
    tu_record(0, file, line,
              "%s: %lld of %lld elements out of tolerance; worst [%lld, %lld]: got %.9g, ref %.9g, "
              "err %.3g, tol %.3g (bound %.3g, err/tol %.3g)",
              what, (long long)bad, (long long)n, (long long)(worst / cols), (long long)(worst % cols), g,
              ref[worst], fabs(g - ref[worst]), ref_tol(m, ref[worst], b), b, worst_ratio);
    return worst_ratio;
}

int tu_check_finite(const char *what, moex_dtype dt, const void *buf, int64_t n, const char *file,
                    int line) {
    for (int64_t i = 0; i < n; i++) {
        double v = ref_load(dt, buf, i);
        if (!isfinite(v)) return tu_record(0, file, line, "%s: element %lld is %g", what, (long long)i, v);
    }
    return tu_record(1, file, line, "%s", what);
}

int tu_check_msg_has(const moex_context *ctx, const char *needle, const char *file, int line) {
    const char *msg = moex_last_error(ctx);
    return tu_record(msg && strstr(msg, needle) != NULL, file, line,
                     "message \"%s\" does not mention \"%s\"", msg ? msg : "(null)", needle);
}

moex_context *tu_cpu_context(void) {
    moex_context *ctx = NULL;
    moex_status st = moex_context_create(&ctx, MOEX_BACKEND_CPU, 0);
    if (st != MOEX_OK) {
        fprintf(stderr, "test: moex_context_create(CPU) failed: %s: %s\n", moex_status_string(st),
                moex_last_error(NULL));
        exit(1);
    }
    return ctx;
}

int tu_verbose(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("TU_VERBOSE");
        v = e && atoi(e) > 0;
    }
    return v;
}

void tu_log(const char *fmt, ...) {
    if (!tu_verbose()) return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
}
