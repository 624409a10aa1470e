/* fuseflow_emu: the `fuseflow` command built with the CUDA emulator (kernels/cuda/emu/) behind
 * ff_backend_new("cuda[:N]") and an NCCL stand-in behind ff_coll's "nccl" backend, for tests that
 * run GPU roles end to end on machines without a GPU (tests/exec/test_run_cuda_gpu.sh with
 * FF_CUDA_EMU_BIN). cli/main.c is compiled into it with its `main` renamed to ff_cli_main; the
 * workers the controller starts are this same program (through FF_BIN), so they compute on the
 * emulated devices and their NCCL twins are the stand-in's.
 *
 * The NCCL stand-in: a "nccl" communicator wraps a cpu one (its id carries the cpu id), and
 * each call runs the cpu collective on the emulated device buffers (host memory) at once
 * (ff_emu_stream_run_host: its stream's queued work first, and what that waits for), so that
 * peers never wait on work an emulated stream has not been asked for, into a scratch copy of
 * its output; the copy into the real output is queued on the stream (ff_emu_stream_defer) and
 * lands only when something waits for that stream. So the workers' events around their
 * collectives take part both ways: a collective whose stream does not wait for the kernels that
 * wrote its input reads stale data, and kernels that read its output without waiting for its
 * stream read what was there before. Grouped calls run as one cpu group at the group's end.
 * Not NCCL: nothing of nccl_backend.c runs here, nor NCCL's own behaviour (its kernels, its
 * asynchronous errors). Not installed: a test tool only. */
#undef main
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/coll.h"
#include "fuseflow/dtype.h"
#include "fuseflow/error.h"
#include "kernels/backend_impl.h"
#include "kernels/cuda/emu/cuda_emu.h"
#include "workers/coll/coll_internal.h"

int ff_cli_main(int argc, char **argv);

enum { RAW = 128 }; /* bytes of an nccl id: a cpu id's text, zero-padded */

static ff_coll_comm *inner(const ff_coll_comm *c) { return (ff_coll_comm *)c->nccl; }

static bool enccl_available(const char **why) {
    (void)why;
    return true;
}

static int enccl_make_id(ff_coll_id *id) {
    ff_coll_id cpu;
    if (ff_coll_get_unique_id(&cpu, "cpu", NULL)) return -1;
    size_t n = strlen(cpu.text);
    if (n >= RAW) return ff_error_set("nccl stand-in", NULL, "a cpu id of %zu bytes does not fit in %d", n, RAW);
    int k = snprintf(id->text, sizeof id->text, COLL_ID_PREFIX "nccl/");
    for (size_t i = 0; i < RAW; i++)
        snprintf(id->text + k + 2 * i, sizeof id->text - (size_t)k - 2 * i, "%02x",
                 i < n ? (unsigned)(unsigned char)cpu.text[i] : 0u);
    return 0;
}

static int enccl_comm_init(ff_coll_comm *c, const ff_coll_id *id) {
    const char *hex = id->text + strlen(COLL_ID_PREFIX "nccl/");
    ff_coll_id cpu;
    memset(&cpu, 0, sizeof cpu);
    for (size_t i = 0; i < RAW; i++) {
        unsigned v = 0;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) return ff_error_set("nccl stand-in", NULL, "malformed id");
        cpu.text[i] = (char)v;
    }
    ff_coll_options o = {.timeout_s = c->timeout_s};
    ff_coll_comm *in = NULL;
    if (ff_coll_comm_init(&in, c->nranks, &cpu, c->rank, &o)) return -1;
    c->nccl = in;
    return 0;
}

static int enccl_comm_split(ff_coll_comm *c, int color, int key, ff_coll_comm *child) {
    ff_coll_comm *in = NULL;
    if (ff_coll_comm_split(inner(c), color, key, &in)) return -1;
    child->nccl = in;
    if (in) {
        child->rank = ff_coll_comm_rank(in);
        child->nranks = ff_coll_comm_size(in);
    }
    return 0;
}

static void enccl_comm_free(ff_coll_comm *c) {
    ff_coll_comm *in = inner(c);
    ff_coll_comm_destroy(&in);
    c->nccl = NULL;
}

static void enccl_abort(ff_coll_comm *c) {
    if (inner(c)) ff_coll_comm_abort(inner(c), c->error ? c->error : "the nccl communicator broke");
}

/* one call on the cpu communicator, its counts copied (the caller's array may go), its output
 * written to `scratch` and moved to `out` when the stream gets there */
typedef struct call {
    ff_coll_comm *comm;
    coll_call call;
    size_t counts[64];
    void *out, *scratch;
    size_t out_bytes;
} call;

static int run_call(const call *k) {
    const coll_call *c = &k->call;
    ff_coll_comm *in = inner(k->comm);
    void *o = k->scratch;
    switch (c->op) {
    case OP_ALL_REDUCE: return ff_coll_all_reduce(c->sendbuf, o, c->count, c->dtype, c->redop, in, NULL);
    case OP_BROADCAST: return ff_coll_broadcast(c->sendbuf, o, c->count, c->dtype, c->root, in, NULL);
    case OP_ALL_GATHER: return ff_coll_all_gather(c->sendbuf, o, c->count, c->dtype, in, NULL);
    case OP_REDUCE_SCATTER: return ff_coll_reduce_scatter(c->sendbuf, o, c->count, c->dtype, c->redop, in, NULL);
    case OP_ALL_GATHER_V: return ff_coll_all_gather_v(c->sendbuf, o, k->counts, c->dtype, in, NULL);
    case OP_REDUCE_SCATTER_V: return ff_coll_reduce_scatter_v(c->sendbuf, o, k->counts, c->dtype, c->redop, in, NULL);
    case OP_SEND:
        return c->is_recv ? ff_coll_recv(o, c->count, c->dtype, c->root, in, NULL)
                          : ff_coll_send(c->sendbuf, c->count, c->dtype, c->root, in, NULL);
    default: return ff_error_set("nccl stand-in", NULL, "call %d is not one NCCL makes", c->op);
    }
}

/* a reduce-scatter_v's input elements: every rank's part */
static size_t out_count_v(const call *k) {
    size_t n = 0;
    for (int r = 0; r < k->comm->nranks; r++) n += k->counts[r];
    return n;
}

/* the output's elements */
static size_t out_count(const call *k) {
    const coll_call *c = &k->call;
    size_t n = 0;
    switch (c->op) {
    case OP_ALL_GATHER: return c->count * (size_t)k->comm->nranks;
    case OP_ALL_GATHER_V:
        for (int r = 0; r < k->comm->nranks; r++) n += k->counts[r];
        return n;
    case OP_REDUCE_SCATTER_V: return k->counts[k->comm->rank];
    case OP_SEND: return c->is_recv ? c->count : 0;
    default: return c->count;
    }
}

typedef struct landing {
    void *out, *scratch;
    size_t bytes;
} landing;
static void land(void *ctx) {
    landing *l = ctx;
    memcpy(l->out, l->scratch, l->bytes);
    free(l->scratch);
    free(l);
}
/* After the call ran: its output lands when the stream gets there; or, failed, nothing does. */
static void finish(call *k, ff_coll_stream stream, bool ok) {
    if (!k->scratch) return;
    landing *l = ok ? malloc(sizeof *l) : NULL;
    if (!l) {
        free(k->scratch);
        k->scratch = NULL;
        return;
    }
    *l = (landing){k->out, k->scratch, k->out_bytes};
    k->scratch = NULL;
    ff_emu_stream_defer(stream, land, l);
}

static struct {
    bool open, failed; /* failed: a call was refused; the group then runs nothing */
    call *calls;
    size_t n, cap;
    ff_coll_stream stream;
} group;

static int set_call(call *k, ff_coll_comm *c, const coll_call *cc) {
    k->comm = c;
    k->call = *cc;
    k->scratch = k->out = NULL;
    if (cc->counts) {
        if (c->nranks > 64) return ff_error_set("nccl stand-in", NULL, "groups of more than 64 ranks");
        memcpy(k->counts, cc->counts, (size_t)c->nranks * sizeof k->counts[0]);
        k->call.counts = k->counts;
    }
    /* NCCL moves device memory only: a host pointer here would fault on a GPU */
    const size_t esz = ff_dtype_size(cc->dtype), in_count = cc->op == OP_ALL_GATHER || cc->op == OP_SEND ? cc->count
                                                           : cc->op == OP_ALL_GATHER_V ? k->counts[c->rank]
                                                           : cc->op == OP_REDUCE_SCATTER ? cc->count * (size_t)c->nranks
                                                           : cc->op == OP_REDUCE_SCATTER_V ? out_count_v(k) : cc->count;
    if (cc->sendbuf && in_count && !ff_emu_is_device(cc->sendbuf, in_count * esz))
        return ff_error_set("nccl stand-in", "NCCL moves device memory only (a GPU would fault here)",
                            "%s of %zu elements from %p: not device memory", coll_op_name(cc->op), in_count, cc->sendbuf);
    k->out_bytes = out_count(k) * esz;
    if (k->out_bytes && !ff_emu_is_device(cc->recvbuf, k->out_bytes))
        return ff_error_set("nccl stand-in", "NCCL moves device memory only (a GPU would fault here)",
                            "%s of %zu bytes into %p: not device memory", cc->is_recv ? "recv" : coll_op_name(cc->op),
                            k->out_bytes, cc->recvbuf);
    if (k->out_bytes) {
        k->out = cc->recvbuf;
        if (!(k->scratch = malloc(k->out_bytes))) return ff_error_set("nccl stand-in", NULL, "out of memory");
    }
    return 0;
}

static int run_one(void *ctx) { return run_call((const call *)ctx); }

static int enccl_run(ff_coll_comm *c, const coll_call *cc, ff_coll_stream stream) {
    if (!group.open) {
        call k;
        if (set_call(&k, c, cc)) return -1;
        int rc = ff_emu_stream_run_host(stream, run_one, &k);
        finish(&k, stream, rc == 0);
        return rc;
    }
    if (group.n && stream != group.stream)
        return ff_error_set("nccl stand-in", "put a group's calls on one stream", "a group on two streams");
    if (group.n == group.cap) {
        size_t nc = group.cap ? 2 * group.cap : 8;
        call *p = realloc(group.calls, nc * sizeof *p);
        if (!p) return ff_error_set("nccl stand-in", NULL, "out of memory");
        group.calls = p;
        group.cap = nc;
    }
    group.stream = stream;
    if (set_call(&group.calls[group.n], c, cc)) {
        group.failed = true;
        return -1;
    }
    group.n++;
    return 0;
}

static int enccl_group_start(void) {
    group.open = true;
    group.failed = false;
    group.n = 0;
    return 0;
}

static int run_group(void *ctx) {
    (void)ctx;
    ff_coll_group_start();
    int rc = 0;
    for (size_t i = 0; i < group.n; i++)
        if (run_call(&group.calls[i]) && !rc) rc = -1;
    return ff_coll_group_end() || rc ? -1 : 0;
}

static int enccl_group_end(void) {
    group.open = false;
    int rc = group.failed ? -1 : group.n ? ff_emu_stream_run_host(group.stream, run_group, NULL) : 0;
    for (size_t i = 0; i < group.n; i++) finish(&group.calls[i], group.stream, rc == 0);
    group.n = 0;
    return rc;
}

static int enccl_synchronize(ff_coll_comm *c, ff_coll_stream stream) {
    (void)c;
    return ff_emu_stream_run_host(stream, NULL, NULL);
}

static const coll_nccl_ops emu_nccl = {enccl_available, enccl_make_id,     enccl_comm_init,  enccl_comm_split,
                                       enccl_comm_free, enccl_abort,       enccl_run,        enccl_group_start,
                                       enccl_group_end, enccl_synchronize};

int main(int argc, char **argv) {
    ff_backend_cuda_ctor = ff_backend_cuda_emu_new;
    coll_nccl = &emu_nccl;
    int rc = ff_cli_main(argc, argv);
    free(group.calls);
    return rc;
}
