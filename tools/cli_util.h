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
    CLI_OPT_INT,      /* value: int64_t*, a decimal integer within [imin, imax]            */
    CLI_OPT_BYTES,    /* value: int64_t*, a byte count within [imin, imax]: a decimal
                         integer with an optional K, M, G or T suffix (KiB ... TiB)       */
    CLI_OPT_DOUBLE,   /* value: double*, within [min, max], finite                         */
    CLI_OPT_STRING,   /* value: const char ** (points into argv)                           */
    CLI_OPT_CHOICE,   /* value: int*, the index of the word in `choices`                   */
    CLI_OPT_FLAG      /* value: int*, set to 1                                              */
} cli_opt_kind;

/* Integers are parsed exactly (strtoll, the whole value, no round trip through a double):
 * a value outside [imin, imax], or past int64, is refused with a message naming the
 * option and the range. Fields after `kind` are given by name:
 *     {"seed", CLI_OPT_INT, &seed, .imin = 0, .imax = INT64_C(1) << 53}
 *     {"lr", CLI_OPT_DOUBLE, &lr, .min = 1e-12, .max = 10.0}
 *     {"dtype", CLI_OPT_CHOICE, &dtype, .choices = dtype_words}
 *     {"json", CLI_OPT_FLAG, .value = &json}                                              */
typedef struct cli_option {
    const char *name;              /* without the leading "--"                    */
    cli_opt_kind kind;
    void *value;
    const char *const *choices;    /* CLI_OPT_CHOICE: NULL-terminated             */
    int64_t imin, imax;            /* CLI_OPT_INT, CLI_OPT_BYTES                   */
    double min, max;               /* CLI_OPT_DOUBLE                               */
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

/* Bytes that can be allocated now: host memory for the CPU backend (MemAvailable from
 * /proc/meminfo, else the available pages from sysconf), the device's free memory for
 * CUDA (cudaMemGetInfo). SIZE_MAX when it cannot be told. */
size_t cli_mem_available(moex_backend b);

/* True when a CUDA context can be created (a CUDA build with a usable GPU). */
int cli_cuda_available(void);

/* Creates a context, printing the library's message on failure. Returns NULL then. */
moex_context *cli_context(const char *cmd, moex_backend b);

/* ---- memory budget (cli_budget.c) -----------------------------------------------------
 * `train` and `bench` add up the bytes a run will allocate before they allocate any, and
 * refuse a run that needs more than is available. The arithmetic saturates at SIZE_MAX
 * instead of wrapping, so a size that overflows exceeds every limit.                     */

size_t cli_size_add(size_t a, size_t b);
size_t cli_size_mul(size_t a, size_t b);
/* Bytes of a d0 x d1 x d2 array of `elem`-byte elements (each d >= 0; 1 for no dim). */
size_t cli_array_bytes(size_t elem, int64_t d0, int64_t d1, int64_t d2);

typedef struct cli_budget {
    moex_backend backend;
    size_t host;     /* host memory: malloc, and cli_mem_alloc on the CPU backend */
    size_t device;   /* device memory: cli_mem_alloc on the CUDA backend          */
} cli_budget;

cli_budget cli_budget_make(moex_backend b);                   /* nothing yet      */
void cli_budget_host(cli_budget *b, size_t bytes);            /* adds host bytes  */
void cli_budget_backend(cli_budget *b, size_t bytes);         /* adds what cli_mem_alloc(b->backend) takes */
void cli_budget_max(cli_budget *b, const cli_budget *other);  /* each kind: the larger (runs in turn) */

/* 0 when `need` fits, in host memory and (CUDA) in device memory: each within max_bytes
 * when max_bytes > 0 (--max-memory), else within cli_mem_available. Otherwise prints
 * "moex <cmd>: this run needs about X of host memory, but Y is available (--max-memory to
 * change the limit)" and returns -1. */
int cli_budget_check(const char *cmd, const cli_budget *need, int64_t max_bytes);

/* A non-NULL stand-in for tensor data in the workspace- and saved-size queries, which read
 * shapes, dtypes and options, never data: the sizes can be known before any allocation. */
void *cli_no_data(void);

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
