/*
 * moex.c - main of the `moex` command-line tool: --version, --help, and the dispatch to
 * the subcommands (check, bench, train; one file each). Exit status: 0 success, 1 a
 * failed check or library error, 2 a bad command line.
 */
#include "cli_util.h"

#include <stdio.h>
#include <string.h>

typedef struct cli_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
} cli_command;

static const cli_command commands[] = {
    {"check", "run every operation on every backend against the fp64 reference", cli_cmd_check},
    {"bench", "time grouped linear and grouped MLP on named configurations", cli_cmd_bench},
    {"train", "train a student MoE layer to match a random teacher (demo)", cli_cmd_train},
};
#define NUM_COMMANDS ((int)(sizeof commands / sizeof commands[0]))

static void usage(FILE *out) {
    fprintf(out,
            "usage: moex <command> [options]\n"
            "       moex --version | --help\n"
            "\n"
            "moex %s: expert layers of Mixture-of-Experts models (grouped linear, grouped MLP,\n"
            "routing) on the CPU and on NVIDIA GPUs.\n"
            "\n"
            "commands:\n",
            moex_version_string());
    for (int i = 0; i < NUM_COMMANDS; i++) fprintf(out, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n'moex <command> --help' describes the options of a command.\n");
}

static void print_version(void) {
    printf("moex %s (backends: cpu%s", moex_version_string(),
#ifdef MOEX_HAVE_CUDA
           ", cuda"
#else
           ""
#endif
    );
#ifdef MOEX_HAVE_OPENBLAS
    printf("; bench baseline: OpenBLAS cblas_sgemm");
#endif
    printf(")\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0) {
        if (argc > 2) {
            fprintf(stderr, "moex: --version takes no arguments\n");
            return CLI_EXIT_USAGE;
        }
        print_version();
        return CLI_EXIT_OK;
    }
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        if (argc > 2) {   /* `moex help <command>` */
            for (int i = 0; i < NUM_COMMANDS; i++) {
                if (strcmp(argv[2], commands[i].name) == 0) {
                    char *sub[] = {argv[2], (char *)"--help", NULL};
                    return commands[i].run(2, sub);
                }
            }
            fprintf(stderr, "moex: unknown command '%s' (see 'moex --help')\n", argv[2]);
            return CLI_EXIT_USAGE;
        }
        usage(stdout);
        return CLI_EXIT_OK;
    }
    for (int i = 0; i < NUM_COMMANDS; i++) {
        if (strcmp(cmd, commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    }
    if (cmd[0] == '-')
        fprintf(stderr, "moex: unknown option '%s' (see 'moex --help')\n", cmd);
    else
        fprintf(stderr, "moex: unknown command '%s' (see 'moex --help')\n", cmd);
    return CLI_EXIT_USAGE;
}
