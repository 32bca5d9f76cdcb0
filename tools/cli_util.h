/*
 * cli_util.h - what the `moex` subcommands share: exit statuses, the long-option parser,
 * the wall clock, a seeded RNG, bf16 conversion, backend memory (host or CUDA device)
 * and the choice of backend.
 */
#ifndef MOEX_CLI_UTIL_H
#define MOEX_CLI_UTIL_H

#include "moex.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* ---- exit statuses ------------------------------------------------------------------ */

#define CLI_EXIT_OK 0      /* success                                       */
#define CLI_EXIT_FAIL 1    /* a check failed, or the library reported an error */
#define CLI_EXIT_USAGE 2   /* bad command line                              */

/* ---- subcommands (one file each) ---------------------------------------------------- */

int cli_cmd_check(int argc, char **argv);   /* cmd_check.c */
int cli_cmd_bench(int argc, char **argv);   /* cmd_bench.c */
int cli_cmd_train(int argc, char **argv);   /* cmd_train.c */

/* ---- long options ------------------------------------------------------------------- *
 * Options are `--name value` or `--name=value`; flags are `--name`. `-h`/`--help` prints
 * the usage. No positional arguments are accepted.                                       */

typedef enum cli_opt_kind {
    CLI_OPT_INT,      /* value: int64_t*, within [min, max]                        */
    CLI_OPT_DOUBLE,   /* value: double*, within [min, max], finite                 */
    CLI_OPT_STRING,   /* value: const char ** (points into argv)                   */
    CLI_OPT_CHOICE,   /* value: int*, the index of the word in `choices`           */
    CLI_OPT_FLAG      /* value: int*, set to 1                                      */
} cli_opt_kind;

typedef struct cli_option {
    const char *name;              /* without the leading "--"                    */
    cli_opt_kind kind;
    void *value;
    const char *const *choices;    /* CLI_OPT_CHOICE: NULL-terminated             */
    double min, max;               /* CLI_OPT_INT, CLI_OPT_DOUBLE                  */
} cli_option;

#define CLI_PARSE_OK 0     /* run the command                                */
#define CLI_PARSE_HELP 1   /* the usage was printed to stdout: exit 0        */
#define CLI_PARSE_ERROR 2  /* a message was printed to stderr: exit 2        */

/* Parses argv[1..argc) (argv[0] is the subcommand name `cmd`). `usage` prints the
 * subcommand's help to the given stream. */
int cli_parse(const char *cmd, int argc, char **argv, const cli_option *opts, int num_opts,
              void (*usage)(FILE *out));

/* Prints "moex <cmd>: <message>" to stderr (printf-style). */
void cli_error(const char *cmd, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ---- time --------------------------------------------------------------------------- */

double cli_now(void);   /* seconds from a monotonic clock */

/* ---- RNG: splitmix64, with Gaussian draws (Box-Muller) -------------------------------- */

typedef struct cli_rng {
    uint64_t state;
} cli_rng;

cli_rng  cli_rng_make(uint64_t seed);
uint64_t cli_rng_u64(cli_rng *r);
double   cli_rng_uniform(cli_rng *r);            /* [0, 1)          */
double   cli_rng_normal(cli_rng *r);             /* N(0, 1)         */
int64_t  cli_rng_below(cli_rng *r, int64_t n);   /* [0, n), n >= 1  */

/* ---- bf16 (round to nearest even; NaN stays NaN) ----------------------------------- */

static inline float cli_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t cli_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Converts n f32 values to `dt` (F32 or BF16) into dst, and back. */
void cli_from_f32(void *dst, moex_dtype dt, const float *src, size_t n);
void cli_to_f32(float *dst, const void *src, moex_dtype dt, size_t n);

const char *cli_dtype_name(moex_dtype dt);       /* "f32", "bf16", ... */
const char *cli_backend_name(moex_backend b);    /* "cpu", "cuda"      */

/* ---- backend memory ------------------------------------------------------------------
 * Host memory for the CPU backend, device memory for CUDA (only in MOEX_HAVE_CUDA builds).
 * Allocation returns NULL on failure (and for 0 bytes); copies and sync return 0 on
 * success, -1 with a message on stderr.                                               */

void *cli_mem_alloc(moex_backend b, size_t bytes);
void  cli_mem_free(moex_backend b, void *p);
int   cli_mem_upload(moex_backend b, void *dst, const void *src, size_t bytes);
int   cli_mem_download(moex_backend b, void *dst, const void *src, size_t bytes);
int   cli_mem_zero(moex_backend b, void *dst, size_t bytes);
int   cli_mem_sync(moex_backend b);

/* True when a CUDA context can be created (a CUDA build with a usable GPU). */
int cli_cuda_available(void);

/* Creates a context, printing the library's message on failure. Returns NULL then. */
moex_context *cli_context(const char *cmd, moex_backend b);

/* ---- CUDA event timing (CUDA builds) --------------------------------------------------
 * cli_timer_* measure seconds between two points on the legacy default stream with CUDA
 * events for the CUDA backend, and with the wall clock for the CPU.                    */

typedef struct cli_timer {
    moex_backend backend;
    double t0;
    void *ev0, *ev1;   /* cudaEvent_t, CUDA only */
} cli_timer;

int    cli_timer_init(cli_timer *t, moex_backend b);
void   cli_timer_start(cli_timer *t);
double cli_timer_stop(cli_timer *t);   /* seconds since start (synchronises) */
void   cli_timer_destroy(cli_timer *t);

#endif /* MOEX_CLI_UTIL_H */
