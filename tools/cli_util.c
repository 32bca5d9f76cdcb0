/*
 * cli_util.c - the long-option parser, error messages, the clock, the RNG and dtype
 * helpers shared by the `moex` subcommands (see cli_util.h).
 */
#include "cli_util.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <time.h>

/* ---- messages ----------------------------------------------------------------------- */

void cli_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "moex %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* ---- option parsing ----------------------------------------------------------------- */

/* The multiplier of a byte-count suffix (K, M, G, T: powers of 1024, either case), or 0. */
static int64_t byte_suffix(const char *s) {
    if (s[0] == '\0') return 1;
    if (s[1] != '\0') return 0;
    switch (toupper((unsigned char)s[0])) {
    case 'K': return INT64_C(1) << 10;
    case 'M': return INT64_C(1) << 20;
    case 'G': return INT64_C(1) << 30;
    case 'T': return INT64_C(1) << 40;
    }
    return 0;
}

/* CLI_OPT_INT and CLI_OPT_BYTES: an optional sign, decimal digits, and (bytes) a suffix,
 * nothing else (no spaces); the value exactly, within [o->imin, o->imax]. */
static int parse_int(const char *cmd, const cli_option *o, const char *text) {
    const int bytes = o->kind == CLI_OPT_BYTES;
    const char *digits = text + (text[0] == '-' || text[0] == '+');
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    int64_t scale = 0;   /* the suffix's multiplier; 0: not an integer (with a suffix we know) */
    if (isdigit((unsigned char)digits[0])) scale = bytes ? byte_suffix(end) : *end == '\0';
    if (scale == 0) {
        cli_error(cmd, "--%s expects %s, got '%s'", o->name,
                  bytes ? "a byte count (an integer, optionally with a K, M, G or T suffix)" : "an integer", text);
        return CLI_PARSE_ERROR;
    }
    int in_range = errno != ERANGE;
    if (in_range && scale > 1) {   /* v * scale, checked (scale is a power of two) */
        in_range = v <= INT64_MAX / scale && v >= INT64_MIN / scale;
        if (in_range) v *= scale;
    }
    if (!in_range || v < o->imin || v > o->imax) {
        cli_error(cmd, "--%s %s is out of range [%lld, %lld]", o->name, text, (long long)o->imin,
                  (long long)o->imax);
        return CLI_PARSE_ERROR;
    }
    *(int64_t *)o->value = (int64_t)v;
    return CLI_PARSE_OK;
}

static int parse_value(const char *cmd, const cli_option *o, const char *text) {
    char *end = NULL;
    errno = 0;
    switch (o->kind) {
    case CLI_OPT_INT:
    case CLI_OPT_BYTES:
        return parse_int(cmd, o, text);
    case CLI_OPT_DOUBLE: {
        double v = strtod(text, &end);
        if (errno || end == text || *end != '\0' || !isfinite(v)) {
            cli_error(cmd, "--%s expects a number, got '%s'", o->name, text);
            return CLI_PARSE_ERROR;
        }
        if (v < o->min || v > o->max) {
            cli_error(cmd, "--%s %g is out of range [%g, %g]", o->name, v, o->min, o->max);
            return CLI_PARSE_ERROR;
        }
        *(double *)o->value = v;
        return CLI_PARSE_OK;
    }
    case CLI_OPT_STRING:
        if (text[0] == '\0') {
            cli_error(cmd, "--%s expects a non-empty value", o->name);
            return CLI_PARSE_ERROR;
        }
        *(const char **)o->value = text;
        return CLI_PARSE_OK;
    case CLI_OPT_CHOICE:
        for (int i = 0; o->choices[i]; i++) {
            if (strcmp(o->choices[i], text) == 0) {
                *(int *)o->value = i;
                return CLI_PARSE_OK;
            }
        }
        fprintf(stderr, "moex %s: --%s must be one of", cmd, o->name);
        for (int i = 0; o->choices[i]; i++) fprintf(stderr, "%s %s", i ? "," : "", o->choices[i]);
        fprintf(stderr, "; got '%s'\n", text);
        return CLI_PARSE_ERROR;
    case CLI_OPT_FLAG:
        break;
    }
    return CLI_PARSE_ERROR;
}

int cli_parse(const char *cmd, int argc, char **argv, const cli_option *opts, int num_opts,
              void (*usage)(FILE *out)) {
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            usage(stdout);
            return CLI_PARSE_HELP;
        }
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
            cli_error(cmd, "unexpected argument '%s' (see 'moex %s --help')", arg, cmd);
            return CLI_PARSE_ERROR;
        }
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const cli_option *o = NULL;
        for (int j = 0; j < num_opts; j++) {
            if (strlen(opts[j].name) == len && strncmp(opts[j].name, name, len) == 0) o = &opts[j];
        }
        if (!o) {
            cli_error(cmd, "unknown option '--%.*s' (see 'moex %s --help')", (int)len, name, cmd);
            return CLI_PARSE_ERROR;
        }
        if (o->kind == CLI_OPT_FLAG) {
            if (eq) {
                cli_error(cmd, "--%s takes no value", o->name);
                return CLI_PARSE_ERROR;
            }
            *(int *)o->value = 1;
            continue;
        }
        const char *text = eq ? eq + 1 : NULL;
        if (!text) {
            if (i + 1 >= argc) {
                cli_error(cmd, "--%s needs a value", o->name);
                return CLI_PARSE_ERROR;
            }
            text = argv[++i];
        }
        int st = parse_value(cmd, o, text);
        if (st != CLI_PARSE_OK) return st;
    }
    return CLI_PARSE_OK;
}

/* ---- time --------------------------------------------------------------------------- */

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- RNG ---------------------------------------------------------------------------- */

cli_rng cli_rng_make(uint64_t seed) {
    cli_rng r = {seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull};
    return r;
}

uint64_t cli_rng_u64(cli_rng *r) {
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double cli_rng_uniform(cli_rng *r) { return (double)(cli_rng_u64(r) >> 11) * 0x1.0p-53; }

double cli_rng_normal(cli_rng *r) {
    double u1 = 1.0 - cli_rng_uniform(r);   /* (0, 1] */
    double u2 = cli_rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int64_t cli_rng_below(cli_rng *r, int64_t n) { return (int64_t)(cli_rng_u64(r) % (uint64_t)n); }

/* ---- dtypes ------------------------------------------------------------------------- */

void cli_from_f32(void *dst, moex_dtype dt, const float *src, size_t n) {
    if (dt == MOEX_DTYPE_F32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    uint16_t *d = (uint16_t *)dst;
    for (size_t i = 0; i < n; i++) d[i] = cli_f32_to_bf16(src[i]);
}

void cli_to_f32(float *dst, const void *src, moex_dtype dt, size_t n) {
    if (dt == MOEX_DTYPE_F32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    const uint16_t *s = (const uint16_t *)src;
    for (size_t i = 0; i < n; i++) dst[i] = cli_bf16_to_f32(s[i]);
}

const char *cli_backend_name(moex_backend b) { return b == MOEX_BACKEND_CUDA ? "cuda" : "cpu"; }

moex_context *cli_context(const char *cmd, moex_backend b) {
    moex_context *ctx = NULL;
    moex_status st = moex_context_create(&ctx, b, 0);
    if (st != MOEX_OK) {
        cli_error(cmd, "cannot create a %s context: %s (%s)", cli_backend_name(b),
                  moex_last_error(NULL), moex_status_string(st));
        return NULL;
    }
    return ctx;
}

int cli_cuda_available(void) {
    moex_context *ctx = NULL;
    if (moex_context_create(&ctx, MOEX_BACKEND_CUDA, 0) != MOEX_OK) return 0;
    moex_context_destroy(ctx);
    return 1;
}
