/*
 * fuzz_run.c - moex_fuzz_run, the standalone driver of the moex API fuzzer: the same
 * harness as the libFuzzer target without libFuzzer (any C compiler; CTest fuzz_corpus).
 *
 *   moex_fuzz_run [--backend cpu|cuda] [--runs N] [--seed S] [--max-len L] [--keep-going]
 *                 [--verbose] [files or dirs...]
 *       replays the files (a directory: every file in it), then runs N inputs of
 *       pseudo-random bytes (lengths 1..L, a fixed-seed PRNG), and prints the number of
 *       inputs and API calls and the time. Exit 0; 1 on a failed oracle (the input is saved
 *       as moex_fuzz_failure.bin, or $MOEX_FUZZ_ARTIFACT); 77 when the backend is missing
 *       (CUDA: no GPU, or a build without CUDA). --skip K starts the random inputs at number K
 *       (a report names "random input K of seed S": --seed S --skip K --runs 1 replays it).
 *   moex_fuzz_run --generate DIR [--runs N] [--seed S] [--max-len L] [--max-files M]
 *       the seed-corpus generator: runs N random candidates, each in a child process, and
 *       writes to DIR (at most M files) those that reach something no earlier one did (an
 *       operation, huge mode, a fault kind, a status).
 *
 * Without sanitizers only the harness's own oracles run; build with MOEX_SANITIZE=ON (or
 * MOEX_FUZZ=ON) for ASan and UBSan.
 */
#include "fuzz.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FZ_RUN_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(FZ_RUN_SANITIZED)
#define FZ_RUN_SANITIZED 1
#endif
#ifdef FZ_RUN_SANITIZED
#include <sanitizer/common_interface_defs.h>
#endif

/* The input running now, for failure reports. */
static const uint8_t *cur_data;
static size_t cur_size;
static char cur_name[512];

static void save_current(void) {
    const char *path = getenv("MOEX_FUZZ_ARTIFACT");
    if (!path || !*path) path = "moex_fuzz_failure.bin";
    FILE *f = fopen(path, "wb");
    if (f) {
        if (cur_size) fwrite(cur_data, 1, cur_size, f);
        fclose(f);
    }
    fprintf(stderr, "moex_fuzz_run: the failing input is %s (%zu bytes), saved as %s\n", cur_name, cur_size,
            f ? path : "(could not write it)");
    fprintf(stderr, "moex_fuzz_run: replay it with: moex_fuzz_run --verbose %s\n", f ? path : "FILE");
}

#ifdef FZ_RUN_SANITIZED
static void on_death(void) {
    fprintf(stderr, "moex_fuzz_run: a sanitizer report in this case:\n");
    fz_print_current_case(stderr);
    save_current();
}
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t mix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Random input number i of the run with seed `seed`: `len` bytes, or (len 0) 1..max_len. */
static size_t random_input(uint64_t seed, uint64_t i, size_t len, size_t max_len, uint8_t *buf) {
    uint64_t s = seed * 0x2545F4914F6CDD1Dull ^ (i + 1) * 0x9E3779B97F4A7C15ull;
    const uint64_t r = mix(&s);
    if (!len) len = 1 + (size_t)(r % max_len);
    for (size_t k = 0; k < len; k += 8) {
        uint64_t v = mix(&s);
        for (size_t j = 0; j < 8 && k + j < len; j++) buf[k + j] = (uint8_t)(v >> (8 * j));
    }
    return len;
}

static void run_one(const uint8_t *data, size_t size, const char *name) {
    cur_data = data;
    cur_size = size;
    snprintf(cur_name, sizeof cur_name, "%s", name);
    fz_run_input(data, size);
    cur_data = NULL;
    cur_size = 0;
}

static int replay_file(const char *path, size_t *count) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "moex_fuzz_run: cannot read %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, n = 0;
    uint8_t *buf = (uint8_t *)malloc(cap);
    for (;;) {
        if (n == cap) buf = (uint8_t *)realloc(buf, cap *= 2);
        size_t got = fread(buf + n, 1, cap - n, f);
        if (got == 0) break;
        n += got;
    }
    fclose(f);
    run_one(buf, n, path);
    free(buf);
    (*count)++;
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A file, or every regular file of a directory (sorted). */
static int replay_path(const char *path, size_t *count) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "moex_fuzz_run: %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) return replay_file(path, count);
    DIR *d = opendir(path);
    if (!d) return -1;
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) names = (char **)realloc(names, (cap = cap ? 2 * cap : 64) * sizeof *names);
        size_t len = strlen(path) + strlen(e->d_name) + 2;
        names[n] = (char *)malloc(len);
        snprintf(names[n], len, "%s/%s", path, e->d_name);
        n++;
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode) && replay_file(names[i], count) != 0) rc = -1;
        free(names[i]);
    }
    free(names);
    return rc;
}

/* ---- the seed-corpus generator ------------------------------------------------------------ */

static int new_bits(const fz_features *have, const fz_features *f) {
    return (f->ops & ~have->ops) || (f->huge_ops & ~have->huge_ops) || (f->faulted_ops & ~have->faulted_ops) ||
           (f->fault_tags & ~have->fault_tags) || (f->statuses & ~have->statuses) ||
           (f->fp8_ops & ~have->fp8_ops);
}

/* Hand-made inputs: the MoE layer shapes of issue 13's findings 1 and 2 (huge mode, no
 * fault but the intermediates past 2^60 elements that fuzz_ops_moe.c flags itself). Byte
 * by byte: op 14 (moe_layer), mode 15 (huge, no NULL variants), 4 seed bytes, T, H, E, F
 * (fz_dim's huge classes: 64 + e is 2^e, 128 + e then a signed byte is 2^e + that byte, a
 * byte below 32 is itself), topk (8 bytes: 1 + v % E), glu kind/layout and constants,
 * dtype (0 f32, 1 bf16), b1 and b2 dtypes, options, packed w1 and w2, no faults. */
static const struct {
    const char *name;
    uint8_t bytes[40];
    size_t len;
} crafted[] = {
    {"regress-issue13-1-moe-saved-size-wraps",   /* x [2^22, 1] f32, w1 [1, 2^41, 1], w2 [1, 1, 2^40], topk 1 */
     {14, 15, 0x11, 0x22, 0x33, 0x44, 86, 1, 1, 104, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 0, 255, 255, 0}, 27},
    {"regress-issue13-2-moe-ws-signed-overflow",  /* x [64, 1] bf16, w1 [1, 2^58, 1], w2 [1, 1, 2^57], topk 1 */
     {14, 15, 0x11, 0x22, 0x33, 0x44, 70, 1, 1, 121, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 255, 255, 0, 255, 255, 0}, 27},
    {"regress-issue13-2-moe-TkH-overflow",        /* T 1023, H 2^37, E = topk = 2^21, F 1, bf16 */
     {14, 15, 0x11, 0x22, 0x33, 0x44, 138, 0xFF, 101, 85, 1, 0xFF, 0xFF, 0x1F, 0, 0, 0, 0, 0, 0, 0, 1, 255, 255, 0,
      255, 255, 0}, 28},
    /* grouped quantization (fuzz_ops_quant.c), byte by byte: op 16 (group_quantize) or 17
     * (group_dequantize), mode 8 (run) or 15 (huge), 4 seed bytes, G (fz_dim), T, K (a byte
     * below 64 picks 0, 1, 31, 32, ...; huge mode 0xC0 is INT64_MAX), dtype (0 f32), params
     * (recipe + 4 fp8 + 8 rounding), epsilon (0: 0), options (quantize: 1 rowwise, 2
     * columnwise, 8 amax; dequantize: orientation), splits (0: sum = T), no faults */
    {"regress-quant-1-k0-amax-from-workspace",   /* x [1, 0] f32, TENSOR, amax: amax is not 0 */
     {16, 8, 1, 2, 3, 4, 0, 1, 0, 0, 0, 0, 9, 0, 0}, 15},
    {"regress-quant-2-block-scale-columns-overflow",   /* x [0, INT64_MAX], BLOCK: K + 127 (UBSan) */
     {16, 15, 1, 2, 3, 4, 1, 0, 0xC0, 0, 2, 0, 1, 0, 0}, 15},
    {"regress-quant-2-dequantize-block-overflow",      /* y [0, INT64_MAX], BLOCK rowwise (UBSan) */
     {17, 15, 1, 2, 3, 4, 1, 0, 0xC0, 0, 2, 0, 0, 0, 0}, 15},
    /* the FP8 grouped linear (fuzz_ops_fp8.c), byte by byte: op 18 (forward) or 19 (backward
     * weight), mode 8 (run), 4 seed bytes, G (fz_dim: 1 + b % 6), T, K, N (a byte below 64 picks
     * 0, 1, 16, 31, 32, 33, 127, 128, 129, 160, 256, 257), forward: y dtype (0 f32, 1 bf16),
     * bias dtype (< 128 f32); recipes (b % 3: 0 current, bit 2 GROUP rows, 1 BLOCK, 2 MXFP8),
     * each operand's params (1 E5M2, 2 POW2, 0x20 swizzled), bias_mode / dw_mode, operands
     * (0: quantized for real, 1: fuzz bytes), splits (fz_make_splits), backward weight: dw
     * (< 80 discrete), then the faults (0: none; 150: one, kind byte, sel, 5 parameter bytes) */
    {"fp8-1-forward-mxfp8-swizzled-quantized",   /* G 3, x [33, 128] e4m3, w [3, 31, 128] e5m2, y bf16, SCALED */
     {18, 8, 1, 2, 3, 4, 2, 5, 7, 3, 1, 200, 2, 0x20, 0x21, 2, 0, 12, 0}, 19},
    {"fp8-2-wgrad-block-quantized-accumulate-discrete",   /* G 4, T 129, S 89, K 16, N 33, dw += */
     {19, 8, 5, 6, 7, 8, 3, 8, 2, 5, 1, 1, 2, 1, 0, 10, 40, 0, 0, 0, 0, 0, 0, 0, 10, 0}, 26},
    {"fp8-3-forward-pairing-fault",                /* x TENSOR -> MXFP8 (scales rebuilt), w GROUP */
     {18, 8, 9, 9, 9, 9, 1, 10, 2, 3, 0, 0, 0, 0, 1, 1, 1, 4, 150, 7, 0, 1, 0, 0, 0, 0}, 26},
    {"fp8-4-wgrad-layout-swap",                    /* dy MXFP8 swizzled -> plain */
     {19, 8, 1, 1, 1, 1, 0, 4, 1, 9, 2, 0x20, 0, 0, 0, 0, 200, 150, 5, 0, 2, 0, 0, 0, 0}, 25},
};

static int generate(const char *dir, uint64_t seed, uint64_t runs, size_t max_len, int max_files) {
    mkdir(dir, 0755);
    for (size_t i = 0; i < sizeof crafted / sizeof crafted[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, crafted[i].name);
        FILE *out = fopen(path, "wb");
        if (!out) {
            fprintf(stderr, "moex_fuzz_run: cannot write %s\n", path);
            return 1;
        }
        fwrite(crafted[i].bytes, 1, crafted[i].len, out);
        fclose(out);
    }
    fz_features have;
    memset(&have, 0, sizeof have);
    uint8_t *buf = (uint8_t *)malloc(max_len);
    int files = 0;
    uint64_t crashed = 0;
    for (uint64_t i = 0; i < runs && files < max_files; i++) {
        uint64_t ls = seed ^ (i * 0x9E3779B97F4A7C15ull);
        const size_t len = random_input(seed, i, 16 + (size_t)(mix(&ls) % (max_len - 15)), max_len, buf);
        int fd[2];
        if (pipe(fd) != 0) return 1;
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {   /* the child runs it and reports what it reached */
            close(fd[0]);
            if (!freopen("/dev/null", "w", stderr)) _exit(4);   /* failures only count here */
            fz_g.on_failure = NULL;
            fz_run_input(buf, len);
            ssize_t w = write(fd[1], &fz_last_features, sizeof fz_last_features);
            _exit(w == (ssize_t)sizeof fz_last_features ? 0 : 3);
        }
        close(fd[1]);
        fz_features f;
        ssize_t got = read(fd[0], &f, sizeof f);
        close(fd[0]);
        int status = 0;
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || got != (ssize_t)sizeof f) {
            crashed++;
            continue;
        }
        if (!new_bits(&have, &f)) continue;
        have.ops |= f.ops, have.huge_ops |= f.huge_ops, have.faulted_ops |= f.faulted_ops;
        have.fault_tags |= f.fault_tags, have.statuses |= f.statuses, have.fp8_ops |= f.fp8_ops;
        char path[1024];
        snprintf(path, sizeof path, "%s/seed-%03d-%s", dir, files, fz_op_names[fz_op_of_byte(buf[0])]);
        FILE *out = fopen(path, "wb");
        if (!out) {
            fprintf(stderr, "moex_fuzz_run: cannot write %s\n", path);
            return 1;
        }
        fwrite(buf, 1, len, out);
        fclose(out);
        files++;
    }
    printf("moex_fuzz_run: wrote %d seed files to %s (candidates that failed an oracle: %llu)\n", files, dir,
           (unsigned long long)crashed);
    free(buf);
    return 0;
}

/* ---- main -------------------------------------------------------------------------------- */

static const char **paths;   /* file scope: still reachable at exit (no leak report) */

static void usage(void) {
    fprintf(stderr, "usage: moex_fuzz_run [--backend cpu|cuda] [--runs N] [--seed S] [--skip K] [--max-len L] [--keep-going]\n"
                    "                     [--verbose] [files or dirs...]\n"
                    "       moex_fuzz_run --generate DIR [--runs N] [--seed S] [--max-len L] [--max-files M]\n");
}

int main(int argc, char **argv) {
    moex_backend backend = MOEX_BACKEND_CPU;
    uint64_t runs = 0, seed = 1, skip = 0;
    size_t max_len = 512;
    int max_files = 48;
    const char *gen_dir = NULL;
    paths = (const char **)calloc((size_t)argc, sizeof *paths);
    int npaths = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--backend") && i + 1 < argc) {
            const char *b = argv[++i];
            if (!strcmp(b, "cpu")) backend = MOEX_BACKEND_CPU;
            else if (!strcmp(b, "cuda")) backend = MOEX_BACKEND_CUDA;
            else return usage(), 2;
        } else if (!strcmp(a, "--runs") && i + 1 < argc) {
            runs = strtoull(argv[++i], NULL, 0);
        } else if (!strcmp(a, "--skip") && i + 1 < argc) {
            skip = strtoull(argv[++i], NULL, 0);
        } else if (!strcmp(a, "--seed") && i + 1 < argc) {
            seed = strtoull(argv[++i], NULL, 0);
        } else if (!strcmp(a, "--max-len") && i + 1 < argc) {
            max_len = (size_t)strtoull(argv[++i], NULL, 0);
            if (max_len < 1) max_len = 1;
        } else if (!strcmp(a, "--max-files") && i + 1 < argc) {
            max_files = atoi(argv[++i]);
        } else if (!strcmp(a, "--generate") && i + 1 < argc) {
            gen_dir = argv[++i];
        } else if (!strcmp(a, "--keep-going")) {
            fz_g.keep_going = 1;
        } else if (!strcmp(a, "--verbose") || !strcmp(a, "-v")) {
            fz_g.verbose = 1;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage();
            return 0;
        } else if (a[0] == '-' && a[1] == '-') {
            usage();
            return 2;
        } else {
            paths[npaths++] = a;
        }
    }
    if (gen_dir && backend != MOEX_BACKEND_CPU) {
        fprintf(stderr, "moex_fuzz_run: --generate runs on the CPU backend (it forks)\n");
        free(paths);
        return 2;
    }
    const int rc0 = fz_init(backend);
    if (rc0 != 0) {
        free(paths);
        return rc0;
    }
    if (gen_dir) {
        int rc = generate(gen_dir, seed, runs ? runs : 4000, max_len < 32 ? 32 : max_len, max_files);
        fz_shutdown();
        free(paths);
        return rc;
    }
    fz_g.on_failure = save_current;
#ifdef FZ_RUN_SANITIZED
    __sanitizer_set_death_callback(on_death);
#endif
    const double t0 = now_s();
    size_t files = 0;
    int rc = 0;
    for (int i = 0; i < npaths; i++)
        if (replay_path(paths[i], &files) != 0) rc = 1;
    uint8_t *buf = (uint8_t *)malloc(max_len);
    for (uint64_t i = skip; i < skip + runs; i++) {
        const size_t len = random_input(seed, i, 0, max_len, buf);
        char name[96];
        snprintf(name, sizeof name, "random input %llu of seed %llu (--max-len %zu)", (unsigned long long)i,
                 (unsigned long long)seed, max_len);
        run_one(buf, len, name);
    }
    free(buf);
    const double dt = now_s() - t0;
    const fz_stats *s = &fz_g.stats;
    printf("moex_fuzz_run: backend %s: %llu inputs (%zu files, %llu random), %llu cases, %llu API calls "
           "(%llu refused), %llu faults injected, in %.2f s (%.0f inputs/s, %.0f calls/s)\n",
           backend == MOEX_BACKEND_CUDA ? "cuda" : "cpu", (unsigned long long)s->inputs, files,
           (unsigned long long)runs, (unsigned long long)s->cases, (unsigned long long)s->calls,
           (unsigned long long)s->failed_calls, (unsigned long long)s->faults, dt, dt > 0 ? (double)s->inputs / dt : 0.0,
           dt > 0 ? (double)s->calls / dt : 0.0);
    if (fz_g.failures) {
        printf("moex_fuzz_run: %d failed oracles\n", fz_g.failures);
        rc = 1;
    }
    fz_shutdown();
    free(paths);
    return rc;
}
