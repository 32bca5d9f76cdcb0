/*
 * app.c - a program of a moex user, built against an installed moex (test_install.sh):
 * a CPU context, one grouped linear forward through the public API with its workspace
 * query, and the result checked against values worked out by hand. Prints the version;
 * exits non-zero on any failure.
 */
#include <moex.h>

#include <stdio.h>
#include <stdlib.h>

#define T 4 /* buffer rows; the groups cover 3, row 3 is the tail */
#define K 2
#define N 2
#define G 2

int main(void) {
    printf("moex %s (header %d.%d.%d)\n", moex_version_string(), MOEX_VERSION_MAJOR,
           MOEX_VERSION_MINOR, MOEX_VERSION_PATCH);
    if (moex_version() != MOEX_VERSION_NUMBER) {
        fprintf(stderr, "app: library version %u, header %d\n", moex_version(), MOEX_VERSION_NUMBER);
        return 1;
    }

    moex_context *ctx = NULL;
    if (moex_context_create(&ctx, MOEX_BACKEND_CPU, 0) != MOEX_OK) {
        fprintf(stderr, "app: moex_context_create: %s\n", moex_last_error(NULL));
        return 1;
    }

    /* rows 0-1 are expert 0's, row 2 is expert 1's */
    float x[T * K] = {1, 2, 3, 4, 5, 6, 7, 8};
    float w[G * N * K] = {1, 0, 0, 1,     /* W_0 = I                */
                          1, 1, 2, -1};   /* W_1 = [[1, 1], [2, -1]] */
    float b[G * N] = {10, 20, -1, 1};
    int64_t splits[G] = {2, 1};
    float y[T * N];
    for (int i = 0; i < T * N; i++) y[i] = -99.0f;   /* row 3 must keep it */

    moex_grouped_linear_args a = {
        .x = moex_tensor_2d(x, MOEX_DTYPE_F32, T, K),
        .w = moex_weight_packed(moex_tensor_3d(w, MOEX_DTYPE_F32, G, N, K)),
        .bias_mode = MOEX_BIAS_ADD,
        .bias = moex_tensor_2d(b, MOEX_DTYPE_F32, G, N),
        .splits = moex_tensor_1d(splits, MOEX_DTYPE_I64, G),
        .y = moex_tensor_2d(y, MOEX_DTYPE_F32, T, N),
    };
    size_t bytes = 0;
    moex_status st = moex_grouped_linear_forward_workspace_size(ctx, &a, &bytes);
    void *ws = NULL;
    if (st == MOEX_OK && bytes > 0 && !(ws = malloc(bytes))) {
        fprintf(stderr, "app: out of memory\n");
        return 1;
    }
    if (st == MOEX_OK) st = moex_grouped_linear_forward(ctx, &a, ws, bytes, NULL);
    if (st != MOEX_OK) {
        fprintf(stderr, "app: %s: %s\n", moex_status_string(st), moex_last_error(ctx));
        return 1;
    }
    free(ws);
    moex_context_destroy(ctx);

    /* y_i = x_i W_g^T + b_g: [1, 2] + [10, 20]; [3, 4] + [10, 20]; [5+6, 10-6] + [-1, 1] */
    const float want[T * N] = {11, 22, 13, 24, 10, 5, -99, -99};
    int bad = 0;
    for (int i = 0; i < T * N; i++)
        if (y[i] != want[i]) {
            fprintf(stderr, "app: y[%d][%d] = %g, want %g\n", i / N, i % N, y[i], want[i]);
            bad = 1;
        }
    if (bad) return 1;
    printf("grouped linear forward: OK (workspace %zu bytes)\n", bytes);
    return 0;
}
