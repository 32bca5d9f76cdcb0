/*
 * fuzz_libfuzzer.c - the libFuzzer entry of the moex API fuzzer (target moex_fuzz, built
 * with clang and MOEX_FUZZ=ON; scripts/fuzz.sh runs it). The CPU backend; every input goes
 * to fz_run_input (fuzz_core.c). To see what a crashing input does:
 *   build/tests/fuzz/moex_fuzz_run --verbose crash-<sha1>
 */
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>

static void report(void) {
    fprintf(stderr, "moex_fuzz: %llu inputs, %llu cases, %llu API calls (%llu refused), %llu faults injected\n",
            (unsigned long long)fz_g.stats.inputs, (unsigned long long)fz_g.stats.cases,
            (unsigned long long)fz_g.stats.calls, (unsigned long long)fz_g.stats.failed_calls,
            (unsigned long long)fz_g.stats.faults);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    if (fz_init(MOEX_BACKEND_CPU) != 0) abort();
    atexit(report);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_run_input(data, size);
    return 0;
}
