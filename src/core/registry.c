/*
 * registry.c - the backends this build has, by moex_backend: the one place that names them.
 */
#include "backend.h"

moex_status moex_backend_init(moex_context *ctx) {
    switch (ctx->backend) {
    case MOEX_BACKEND_CPU: return moex_cpu_backend_init(ctx);
    case MOEX_BACKEND_CUDA:
#ifdef MOEX_HAVE_CUDA
        return moex_cuda_backend_init(ctx);
#else
        return moex_fail(ctx, MOEX_ERR_UNSUPPORTED,
                         "moex_context_create: this moex was built without the CUDA backend "
                         "(configure with a CUDA compiler and -DMOEX_CUDA=ON)");
#endif
    }
    return moex_fail(ctx, MOEX_ERR_INVALID_ARG, "moex_context_create: unknown backend %d", (int)ctx->backend);
}
