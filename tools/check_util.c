/*
 * check_util.c - the `moex check` harness (see check.h): backend buffers with host copies,
 * comparison with the fp64 reference under its tolerance model, untouched-tail checks,
 * the table rows, and random data and splits.
 */
#include "check.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>

/* ---- buffers ------------------------------------------------------------------------ */

static int cb_alloc(checker *c, cbuf *b, moex_dtype dt, int64_t n) {
    size_t bytes = (size_t)n * moex_dtype_size(dt);
    b->dt = dt;
    b->n = n;
    b->host = malloc(bytes ? bytes : 1);
    b->dev = cli_mem_alloc(c->be, bytes);
    if (!b->host || (bytes && !b->dev)) {
        fprintf(stderr, "moex check: out of memory (%zu bytes)\n", bytes);
        return -1;
    }
    return 0;
}

/* Allocates b and uploads its host copy: v[0..n) rounded to dt IN PLACE, or, when v is
 * NULL, every byte set to `byte`. */
static int cb_upload(checker *c, cbuf *b, moex_dtype dt, double *v, int64_t n, int byte) {
    if (cb_alloc(c, b, dt, n)) return -1;
    if (v) {
        ref_round_array(dt, v, n);
        ref_fill(dt, b->host, v, n);
    } else {
        memset(b->host, byte, (size_t)n * moex_dtype_size(dt));
    }
    return cli_mem_upload(c->be, b->dev, b->host, (size_t)n * moex_dtype_size(dt));
}

int cb_in(checker *c, cbuf *b, moex_dtype dt, double *v, int64_t n) { return cb_upload(c, b, dt, v, n, 0); }

int cb_out(checker *c, cbuf *b, moex_dtype dt, int64_t n, double *init) {
    return cb_upload(c, b, dt, init, n, 0xFF);   /* poison: NaN in float dtypes, -1 in integers */
}

int cb_get(checker *c, cbuf *b) {
    return cli_mem_download(c->be, b->host, b->dev, (size_t)b->n * moex_dtype_size(b->dt));
}

void cb_free(checker *c, cbuf *b) {
    free(b->host);
    cli_mem_free(c->be, b->dev);
    memset(b, 0, sizeof *b);
}

moex_tensor cb_1d(const cbuf *b, int64_t d0) { return moex_tensor_1d(b->dev, b->dt, d0); }
moex_tensor cb_2d(const cbuf *b, int64_t d0, int64_t d1) { return moex_tensor_2d(b->dev, b->dt, d0, d1); }
moex_tensor cb_3d(const cbuf *b, int64_t d0, int64_t d1, int64_t d2) {
    return moex_tensor_3d(b->dev, b->dt, d0, d1, d2);
}

/* ---- comparison ---------------------------------------------------------------------- */

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void note(crow *r, const char *fmt, ...) {
    if (r->note[0]) return;   /* keep the first problem */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->note, sizeof r->note, fmt, ap);
    va_end(ap);
}

void c_compare(checker *c, crow *r, const char *name, cbuf *got, const double *ref, const double *bound,
               int64_t nvalid, const ref_tol_model *m) {
    if (cb_get(c, got)) {
        r->bad++;
        note(r, "%s: copy back failed", name);
        return;
    }
    int64_t bad = 0, worst_i = -1;
    double worst = 0.0;
    for (int64_t i = 0; i < nvalid; i++) {
        double v = ref_load(got->dt, got->host, i);
        double tol = ref_tol(m, ref[i], bound ? bound[i] : fabs(ref[i]));
        double err = fabs(v - ref[i]);
        double q = tol > 0 ? err / tol : (err > 0 ? INFINITY : 0.0);
        if (!isfinite(v) || !(q <= 1.0)) bad++;
        if (!isfinite(v)) q = INFINITY;
        if (q > worst || worst_i < 0) {
            worst = q;
            worst_i = i;
        }
    }
    if (worst > r->worst) r->worst = worst;
    if (bad) {
        double v = ref_load(got->dt, got->host, worst_i);
        note(r, "%s: %lld of %lld elements out of tolerance, worst [%lld] got %.9g want %.9g (tol %.3g)", name,
             (long long)bad, (long long)nvalid, (long long)worst_i, v, ref[worst_i],
             ref_tol(m, ref[worst_i], bound ? bound[worst_i] : fabs(ref[worst_i])));
        r->bad += (int)(bad < 1000000 ? bad : 1000000);
    }
    /* the tail [nvalid, n) must still be poison */
    size_t es = moex_dtype_size(got->dt);
    const unsigned char *p = (const unsigned char *)got->host;
    for (size_t i = (size_t)nvalid * es; i < (size_t)got->n * es; i++) {
        if (p[i] != 0xFF) {
            r->bad++;
            note(r, "%s: element %lld past the valid rows was written", name, (long long)(i / es));
            break;
        }
    }
}

void c_compare_from(checker *c, crow *r, const char *name, cbuf *got, const double *init, const double *ref,
                    const double *bound, int64_t valid, const ref_tol_model *m) {
    if (!init) {
        c_compare(c, r, name, got, ref, bound, valid, m);
        return;
    }
    const int64_t n = got->n;
    double *want = c_doubles(n), *want_b = c_doubles(n);
    for (int64_t i = 0; i < n; i++) {
        want[i] = init[i] + (i < valid ? ref[i] : 0.0);
        want_b[i] = fabs(init[i]) + (i < valid && bound ? bound[i] : 0.0);
    }
    c_compare(c, r, name, got, want, want_b, n, m);
    free(want);
    free(want_b);
}

void c_call_failed(checker *c, crow *r, const char *what, moex_status st) {
    r->bad++;
    if (st == MOEX_OK)
        note(r, "%s: a copy to or from the backend failed", what);
    else
        note(r, "%s: %s (%s)", what, moex_last_error(c->ctx), moex_status_string(st));
}

void c_row(checker *c, const char *op, moex_dtype dt, const char *shape, const crow *r) {
    int ok = r->bad == 0;
    c->rows++;
    if (!ok) c->failed++;
    printf("%-24s %-7s %-5s %-40s %9.3g  %s\n", op, cli_backend_name(c->be), moex_dtype_name(dt), shape, r->worst,
           ok ? "PASS" : "FAIL");
    if (!ok) printf("    %s\n", r->note);
    fflush(stdout);
}

/* ---- data --------------------------------------------------------------------------- */

double *c_doubles(int64_t n) {
    double *v = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    if (!v) {
        fprintf(stderr, "moex check: out of memory\n");
        exit(CLI_EXIT_FAIL);
    }
    return v;
}

void c_uniform(checker *c, double *v, int64_t n, double lo, double hi) {
    for (int64_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * cli_rng_uniform(&c->rng);
}

double *c_random(checker *c, int64_t n, double lo, double hi) {
    double *v = c_doubles(n);
    c_uniform(c, v, n, lo, hi);
    return v;
}

moex_glu_params c_glu(moex_glu_kind kind, moex_glu_layout layout) {
    moex_glu_params glu = moex_glu_params_default(kind);
    glu.layout = layout;
    return glu;
}

const char *c_glu_name(moex_glu_kind kind) { return kind == MOEX_GLU_SWIGLU ? "swiglu" : "clamped-i32"; }

const char *c_splits_name(c_splits_kind k) {
    switch (k) {
    case C_SPLITS_BALANCED: return "balanced";
    case C_SPLITS_SKEWED: return "skewed";
    case C_SPLITS_EMPTY_ENDS: return "empty-ends";
    case C_SPLITS_ONE_GROUP: return "one-group";
    }
    return "?";
}

static void make_splits(checker *c, c_splits_kind k, int64_t G, int64_t S, int64_t *splits) {
    for (int64_t g = 0; g < G; g++) splits[g] = 0;
    switch (k) {
    case C_SPLITS_BALANCED:
        for (int64_t g = 0; g < G; g++) splits[g] = S / G + (g < S % G ? 1 : 0);
        return;
    case C_SPLITS_ONE_GROUP:
        splits[G / 2] = S;
        return;
    case C_SPLITS_SKEWED:
    case C_SPLITS_EMPTY_ENDS: {
        /* squared-Gaussian shares (Dirichlet(0.5)-like) over the groups that may be
         * non-empty, each row placed by its cumulative share */
        int64_t lo = 0, hi = G, empty = -1;
        if (k == C_SPLITS_EMPTY_ENDS && G > 2) { lo = 1; hi = G - 1; }
        if (k == C_SPLITS_SKEWED && G > 1) empty = cli_rng_below(&c->rng, G);
        double share[4096], total = 0.0;
        for (int64_t g = 0; g < G && g < 4096; g++) {
            double n = cli_rng_normal(&c->rng);
            share[g] = (g < lo || g >= hi || g == empty) ? 0.0 : n * n + 0.05;
            total += share[g];
        }
        double cum = 0.0;
        int64_t prev = 0;
        for (int64_t g = 0; g < G; g++) {
            cum += share[g];
            int64_t end = (int64_t)floor((double)S * cum / total + 0.5);
            if (share[g] == 0.0) end = prev;
            if (end > S) end = S;
            splits[g] = end - prev;
            prev = end;
        }
        /* rounding leftovers go to the last group that may hold rows */
        for (int64_t g = G - 1; g >= 0; g--) {
            if (share[g] > 0.0) {
                splits[g] += S - prev;
                break;
            }
        }
        return;
    }
    }
}

void c_make_splits(checker *c, c_splits_kind k, int64_t G, int64_t S, int64_t *splits, double *sd) {
    make_splits(c, k, G, S, splits);
    for (int64_t g = 0; g < G; g++) sd[g] = (double)splits[g];
}
