/*
 * ep_mpi.c - the MPI transport of expert parallelism on the CPU backend (src/core/ep.h):
 * the caller's MPI_Comm (cfg.comm points to it), host transfer buffers, and each exchange as
 * MPI_Alltoall of the counts (when they are learnt) and MPI_Alltoallv of the real rows
 * (wire rows as one contiguous MPI datatype); and the allgather with which the core makes the
 * ranks agree before a step (ep.c). Compiled only when the build found MPI.
 *
 * MPI is reached only through the table of ep_mpi_lib.h, resolved when moex_ep_create first
 * runs over MPI (the process's MPI, loaded by the caller who made the communicator): libmoex
 * has no link dependency on libmpi, and this file names no MPI function or predefined handle
 * directly (MPI_SUCCESS and MPI_MAX_ERROR_STRING are integer constants).
 */
#include "ep.h"
#include "ep_mpi_lib.h"

#include <stdlib.h>

typedef struct mpi_state {
    const moex_mpi_api *api;
    MPI_Comm comm;
    char *snd;                   /* the send buffer: [W Tm] wire rows */
    void **out;                  /* [W]: its regions (ep->out) */
    MPI_Datatype row;            /* one wire row (when row_made) */
    bool row_made;
    int *sc, *sd, *rc, *rd;      /* counts and displacements [world], in rows */
} mpi_state;

static moex_status mpi_fail(moex_ep *ep, const moex_mpi_api *api, const char *op, const char *what, int err) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (api->Error_string(err, text, &len) != MPI_SUCCESS || len < 0 || len >= MPI_MAX_ERROR_STRING) len = 0;
    text[len] = '\0';
    return moex_fail(ep->ctx, MOEX_ERR_INTERNAL, "%s: %s failed (%d: %s)", op, what, err, text);
}

/* call: an expression of the table `api` in scope, e.g. api->Comm_rank(comm, &rank) */
#define MPI_TRY(ep, op, call)                                          \
    do {                                                               \
        const int e_ = (call);                                         \
        if (e_ != MPI_SUCCESS) return mpi_fail(ep, api, op, #call, e_); \
    } while (0)

static moex_status mpi_exchange(moex_ep *ep, const moex_call *c, const moex_ep_exchange *x) {
    mpi_state *m = (mpi_state *)ep->transport_state;
    const moex_mpi_api *api = m->api;
    const moex_ep_geom *g = &ep->geom;
    if (x->learn_counts)
        MPI_TRY(ep, c->op, api->Alltoall(x->send_counts, 1, api->int64, x->recv_counts, 1, api->int64, m->comm));
    for (int r = 0; r < g->world; r++) {
        const int64_t s = x->send_counts[r], v = x->recv_counts[r];
        m->sc[r] = (int)(s < 0 ? 0 : s > g->Tm ? g->Tm : s);
        m->rc[r] = (int)(v < 0 ? 0 : v > g->Tm ? g->Tm : v);
        m->sd[r] = m->rd[r] = (int)(r * g->Tm);   /* W Tm rows fit an int32 (ep.c) */
    }
    MPI_TRY(ep, c->op, api->Alltoallv(m->snd, m->sc, m->sd, m->row, ep->rcv, m->rc, m->rd, m->row, m->comm));
    return MOEX_OK;
}

static void mpi_destroy(moex_ep *ep) {
    mpi_state *m = (mpi_state *)ep->transport_state;
    if (m) {
        if (m->row_made) m->api->Type_free(&m->row);
        free(m->sc);
        free(m->snd);
        free(m->out);
        free(m);
    }
    free(ep->rcv);
    ep->transport_state = ep->rcv = NULL;
    ep->out = NULL;
}

static const moex_ep_transport mpi_transport = {"mpi", MOEX_EP_TRANSFER_CAPACITY, NULL, mpi_exchange, mpi_destroy};

/* The process's MPI (ep_mpi_lib.h); MOEX_ERR_UNSUPPORTED naming the library and dlerror()
 * when it cannot be loaded. */
static moex_status mpi_api(moex_ep *ep, const char *op, const moex_mpi_api **out) {
    char why[1536];
    *out = moex_mpi_api_load(why, sizeof why);
    if (*out) return MOEX_OK;
    return moex_fail(ep->ctx, MOEX_ERR_UNSUPPORTED,
                     "%s: EP over MPI needs the MPI this moex was built against (%s), opened when the first MPI "
                     "EP context is made: %s (run under that MPI, or name its library in $MOEX_EP_MPI_LIBRARY)",
                     op, moex_mpi_api_soname(), why);
}

moex_status moex_ep_mpi_init(moex_ep *ep) {
    const char *op = "moex_ep_create";
    const moex_mpi_api *api = NULL;
    MOEX_TRY(mpi_api(ep, op, &api));
    int up = 0, rank = 0, world = 0;
    MPI_TRY(ep, op, api->Initialized(&up));
    if (!up)
        return moex_fail(ep->ctx, MOEX_ERR_INVALID_ARG, "%s: MPI (%s) is not initialised (call MPI_Init first)", op,
                         api->path);
    const MPI_Comm comm = *(const MPI_Comm *)ep->cfg.comm;
    if (comm == api->comm_null) return moex_fail(ep->ctx, MOEX_ERR_INVALID_ARG, "%s: comm is MPI_COMM_NULL", op);
    MPI_TRY(ep, op, api->Comm_rank(comm, &rank));
    MPI_TRY(ep, op, api->Comm_size(comm, &world));
    ep->geom.rank = rank, ep->geom.world = world;
    return MOEX_OK;
}

moex_status moex_ep_mpi_allgather(moex_ep *ep, const char *op, const void *mine, void *all, size_t bytes) {
    const moex_mpi_api *api = NULL;
    MOEX_TRY(mpi_api(ep, op, &api));   /* loaded by moex_ep_mpi_init: the same table */
    if (bytes > (size_t)INT32_MAX)
        return moex_fail(ep->ctx, MOEX_ERR_INTERNAL, "%s: an allgather of %zu bytes", op, bytes);
    const MPI_Comm comm = *(const MPI_Comm *)ep->cfg.comm;
    MPI_TRY(ep, op, api->Allgather(mine, (int)bytes, api->byte, all, (int)bytes, api->byte, comm));
    return MOEX_OK;
}

moex_status moex_ep_mpi_alloc(moex_ep *ep, size_t bytes) {
    const char *op = "moex_ep_create";
    const int W = ep->geom.world;
    const moex_mpi_api *api = NULL;
    MOEX_TRY(mpi_api(ep, op, &api));   /* loaded by moex_ep_mpi_init: the same table */
    mpi_state *m = (mpi_state *)calloc(1, sizeof *m);
    if (!m) return moex_fail(ep->ctx, MOEX_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    m->api = api;
    m->comm = *(const MPI_Comm *)ep->cfg.comm;
    ep->transport_state = m;
    ep->transport = &mpi_transport;   /* its destroy frees what follows */
    m->sc = (int *)calloc(4 * (size_t)W, sizeof(int));
    m->snd = (char *)malloc(bytes ? bytes : 1);
    m->out = (void **)malloc((size_t)W * sizeof(void *));
    ep->rcv = malloc(bytes ? bytes : 1);
    if (!m->sc || !m->snd || !m->out || !ep->rcv)
        return moex_fail(ep->ctx, MOEX_ERR_OUT_OF_MEMORY, "%s: %zu bytes of transfer buffers", op, 2 * bytes);
    for (int r = 0; r < W; r++) m->out[r] = m->snd + (size_t)r * (size_t)ep->geom.Tm * ep->geom.wire;
    ep->out = m->out;
    m->sd = m->sc + W, m->rc = m->sc + 2 * W, m->rd = m->sc + 3 * W;
    if (ep->geom.wire > (size_t)INT32_MAX)
        return moex_fail(ep->ctx, MOEX_ERR_INVALID_ARG, "%s: a row of %zu bytes is too large for MPI", op,
                         ep->geom.wire);
    MPI_TRY(ep, op, api->Type_contiguous((int)ep->geom.wire, api->byte, &m->row));
    m->row_made = true;   /* freed by mpi_destroy, committed or not */
    MPI_TRY(ep, op, api->Type_commit(&m->row));
    return MOEX_OK;
}
