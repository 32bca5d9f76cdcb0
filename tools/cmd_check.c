/*
 * cmd_check.c - `moex check`: runs every operation on each available backend against the
 * fp64 reference and prints one table row per (op, backend, dtype, shape) with the worst
 * error / tolerance ratio and PASS or FAIL. Exit status 1 when any row fails. The cases
 * are in check_ops.c and check_routing.c; the harness in check_util.c.
 */
#include "check.h"

#include <stdlib.h>

#define CMD "check"

static const char *const backend_words[] = {"all", "cpu", "cuda", NULL};

static void usage(FILE *out) {
    fprintf(out,
            "usage: moex check [options]\n"
            "\n"
            "Runs every operation (splits_to_offsets, grouped linear forward/dgrad/wgrad, scaled\n"
            "GLU forward/backward, grouped MLP forward/backward, router, permute, unpermute, MoE\n"
            "layer forward/backward) on small shapes (empty groups, skewed splits, f32 and bf16)\n"
            "and compares each output with the fp64 reference under its tolerance model\n"
            "(tools/ref/ref.h). Outputs start poisoned; rows past sum(splits) must stay so.\n"
            "A row shows the worst |error| / tolerance (PASS when <= 1). Exit status 1 on any FAIL.\n"
            "\n"
            "options:\n"
            "  --backend B      all | cpu | cuda (default all: the CPU, and CUDA when a CUDA\n"
            "                   context can be created)\n"
            "  --threads N      CPU threads of the library (default: MOEX_NUM_THREADS or all)\n"
            "  --seed S         seed of the random data, 0..2^53 (default 1)\n"
            "  -h, --help       this help\n");
}

static int run_backend(moex_backend be, int64_t threads, uint64_t seed, int *rows, int *failed) {
    checker c;
    memset(&c, 0, sizeof c);
    c.be = be;
    c.rng = cli_rng_make(seed);
    c.ctx = cli_context(CMD, be);
    if (!c.ctx) return -1;
    if (threads > 0 && be == MOEX_BACKEND_CPU) {
        moex_status st = moex_context_set_num_threads(c.ctx, (int)threads);
        if (st != MOEX_OK) {
            cli_error(CMD, "%s", moex_last_error(c.ctx));
            moex_context_destroy(c.ctx);
            return -1;
        }
    }
    check_splits_to_offsets(&c);
    check_grouped_linear(&c);
    check_scaled_glu(&c);
    check_grouped_mlp(&c);
    check_routing(&c);
    check_moe_layer(&c);
    moex_context_destroy(c.ctx);
    *rows += c.rows;
    *failed += c.failed;
    return 0;
}

int cli_cmd_check(int argc, char **argv) {
    int backend = 0;
    int64_t threads = 0, seed = 1;
    const cli_option opts[] = {
        {"backend", CLI_OPT_CHOICE, &backend, .choices = backend_words},
        {"threads", CLI_OPT_INT, &threads, .imin = 1, .imax = 1024},
        {"seed", CLI_OPT_INT, &seed, .imin = 0, .imax = INT64_C(1) << 53},
    };
    int pr = cli_parse(CMD, argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), usage);
    if (pr == CLI_PARSE_HELP) return CLI_EXIT_OK;
    if (pr != CLI_PARSE_OK) return CLI_EXIT_USAGE;

    int run_cpu = backend != 2, run_cuda = backend == 2;
    if (backend == 2) {   /* asked for by name: say why not before printing anything else */
        moex_context *probe = cli_context(CMD, MOEX_BACKEND_CUDA);
        if (!probe) return CLI_EXIT_FAIL;
        moex_context_destroy(probe);
    }
    if (backend == 0) {
        run_cuda = cli_cuda_available();
        if (!run_cuda) printf("moex check: no CUDA context can be created; checking the CPU backend only\n");
    }
    printf("%-24s %-7s %-5s %-40s %9s  %s\n", "op", "backend", "dtype", "shape", "err/tol", "result");
    double t0 = cli_now();
    int rows = 0, failed = 0, broken = 0;
    if (run_cpu && run_backend(MOEX_BACKEND_CPU, threads, (uint64_t)seed, &rows, &failed) != 0) broken = 1;
    if (run_cuda && run_backend(MOEX_BACKEND_CUDA, threads, (uint64_t)seed, &rows, &failed) != 0) broken = 1;
    printf("%d checks, %d passed, %d failed (%.1f s)\n", rows, rows - failed, failed, cli_now() - t0);
    return (failed || broken) ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
