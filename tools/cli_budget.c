/*
 * cli_budget.c - the memory budget of a `moex train` or `moex bench` run (see cli_util.h):
 * saturating size arithmetic, the sums of host and device bytes, and the check against
 * the available memory or --max-memory, made before anything is allocated.
 */
#include "cli_util.h"

#include <stdalign.h>

/* ---- sizes -------------------------------------------------------------------------- */

size_t cli_size_add(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }

size_t cli_size_mul(size_t a, size_t b) { return b != 0 && a > SIZE_MAX / b ? SIZE_MAX : a * b; }

/* A dimension as a size_t; negative ones (never passed) count as 0. */
static size_t dim(int64_t d) {
    if (d <= 0) return 0;
    return (uint64_t)d > SIZE_MAX ? SIZE_MAX : (size_t)d;
}

size_t cli_array_bytes(size_t elem, int64_t d0, int64_t d1, int64_t d2) {
    return cli_size_mul(cli_size_mul(cli_size_mul(elem, dim(d0)), dim(d1)), dim(d2));
}

/* ---- the budget --------------------------------------------------------------------- */

cli_budget cli_budget_make(moex_backend b) {
    cli_budget r = {b, 0, 0};
    return r;
}

void cli_budget_host(cli_budget *b, size_t bytes) { b->host = cli_size_add(b->host, bytes); }

void cli_budget_backend(cli_budget *b, size_t bytes) {
    if (b->backend == MOEX_BACKEND_CUDA)
        b->device = cli_size_add(b->device, bytes);
    else
        b->host = cli_size_add(b->host, bytes);
}

void cli_budget_max(cli_budget *b, const cli_budget *other) {
    if (other->host > b->host) b->host = other->host;
    if (other->device > b->device) b->device = other->device;
}

/* "12.3 GiB", "512 bytes" */
static void format_bytes(char *out, size_t len, size_t bytes) {
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) {
        snprintf(out, len, "%zu bytes", bytes);
        return;
    }
    double v = (double)bytes / 1024.0;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    snprintf(out, len, "%.1f %s", v, units[u]);
}

/* Checks `need` bytes of one kind of memory (`what`: "host", "device") against the limit. */
static int check_one(const char *cmd, const char *what, size_t need, moex_backend avail_of, int64_t max_bytes) {
    size_t limit = max_bytes > 0 ? ((uint64_t)max_bytes > SIZE_MAX ? SIZE_MAX : (size_t)max_bytes)
                                 : cli_mem_available(avail_of);
    if (need <= limit) return 0;
    char n[32], l[32];
    format_bytes(n, sizeof n, need);
    format_bytes(l, sizeof l, limit);
    const char *about = need == SIZE_MAX ? "more than" : "about";
    if (max_bytes > 0)
        cli_error(cmd, "this run needs %s %s of %s memory, but --max-memory allows %s", about, n, what, l);
    else
        cli_error(cmd, "this run needs %s %s of %s memory, but %s is available (--max-memory to change the limit)",
                  about, n, what, l);
    return -1;
}

int cli_budget_check(const char *cmd, const cli_budget *need, int64_t max_bytes) {
    if (check_one(cmd, "host", need->host, MOEX_BACKEND_CPU, max_bytes) != 0) return -1;
    if (need->backend == MOEX_BACKEND_CUDA &&
        check_one(cmd, "device", need->device, MOEX_BACKEND_CUDA, max_bytes) != 0)
        return -1;
    return 0;
}

/* ---- size queries ------------------------------------------------------------------- */

void *cli_no_data(void) {
    static alignas(256) unsigned char placeholder[256];
    return placeholder;
}
