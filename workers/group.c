/* Worker groups on the worker side: membership from the controller's group-setup message,
 * the group's communicator (fuseflow/coll.h), and the two kinds that use it:
 *   coll.unique_id  member 0 makes the communicator's unique id (the controller sends it to
 *                   every member in the group setup); output "id" (U8, the id's text);
 *   collective      runs one collective on the subtask's group: args op = all_reduce |
 *                   broadcast | all_gather | reduce_scatter, redop = sum | avg | max | min |
 *                   prod (default sum), root (broadcast, default 0); input 0 -> output "out".
 *                   all_gather concatenates along dimension 0 and takes uneven row counts;
 *                   reduce_scatter gives member i rows [start_i, start_i + rows_i) of the
 *                   reduced input, the rows split as evenly as possible.
 * Everything here runs on the compute thread, which owns the communicators. */
#include <stdlib.h>
#include <string.h>

#include "msgs/transport.h"
#include "workers/worker_internal.h"
#include "fuseflow/coll.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "fuseflow/worker.h"

int rt_group_join(rt_group *g, const ff_msg_group_setup *s) {
    rt_group_leave(g); /* a rebuild replaces the old communicator */
    snprintf(g->name, sizeof g->name, "%s", s->name);
    g->members = ff_malloc(sizeof *g->members * (size_t)s->nmembers);
    if (!g->members) return -1;
    memcpy(g->members, s->members, sizeof *g->members * (size_t)s->nmembers);
    g->size = s->nmembers;
    g->index = s->index;
    if (!strcmp(s->backend, "none")) return 0;
    ff_coll_id id;
    if (ff_coll_id_from_string(&id, (const char *)s->unique_id, s->unique_id_len) != 0)
        return ff_error_wrap("group '%s'", s->name);
    const char *backend = ff_coll_id_backend(&id);
    if (!backend || strcmp(backend, s->backend) != 0)
        return ff_error_set(s->name, NULL, "the unique id is for backend '%s', the group asks for '%s'",
                            backend ? backend : "?", s->backend);
    ff_coll_options opt = {0};
    opt.timeout_s = s->timeout_ms / 1000.0;
    if (ff_coll_comm_init(&g->comm, s->nmembers, &id, s->index, &opt) != 0)
        return ff_error_wrap("group '%s' (member %d of %d)", s->name, s->index, s->nmembers);
    return 0;
}

void rt_group_leave(rt_group *g) {
    if (g->comm) ff_coll_comm_destroy(&g->comm);
    free(g->members);
    g->members = NULL;
    g->size = 0;
    g->index = -1;
}

int rt_coll_caps(char (*caps)[FF_MSG_NAME_MAX], int room) {
    int n = 0;
    const char *why;
    if (n < room && ff_coll_backend_available("cpu", &why)) snprintf(caps[n++], FF_MSG_NAME_MAX, "coll:cpu");
    if (n < room && ff_coll_backend_available("nccl", &why)) snprintf(caps[n++], FF_MSG_NAME_MAX, "coll:nccl");
    return n;
}

static int kind_unique_id(ff_task *t, void *ud) {
    (void)ud;
    const char *b;
    size_t bl;
    char backend[16];
    if (ff_msg_arg_str(ff_task_subtask(t), "backend", &b, &bl) != 0 || bl >= sizeof backend)
        return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "coll.unique_id: args backend (cpu or nccl) is required");
    memcpy(backend, b, bl);
    backend[bl] = 0;
    ff_coll_options opt = {0};
    double timeout;
    if (ff_msg_arg_float(ff_task_subtask(t), "timeout_s", &timeout) == 0 && timeout > 0) opt.timeout_s = timeout;
    ff_coll_id id;
    if (ff_coll_get_unique_id(&id, backend, &opt) != 0) return -1;
    int64_t n = (int64_t)strlen(id.text);
    uint8_t *out = ff_task_output(t, "id", FF_DTYPE_U8, 1, &n);
    if (!out) return -1;
    memcpy(out, id.text, (size_t)n);
    return 0;
}

static int parse_redop(const char *s, size_t n, ff_coll_redop *op) {
    for (int i = 0; i < FF_COLL_REDOP_COUNT; i++) {
        const char *name = ff_coll_redop_name((ff_coll_redop)i);
        if (strlen(name) == n && !memcmp(name, s, n)) {
            *op = (ff_coll_redop)i;
            return 0;
        }
    }
    return -1;
}

static bool arg_is(const char *p, size_t n, const char *want) { return strlen(want) == n && !memcmp(p, want, n); }

static int kind_collective(ff_task *t, void *ud) {
    (void)ud;
    const ff_msg_subtask *st = ff_task_subtask(t);
    ff_coll_comm *comm = ff_task_comm(t);
    if (!comm)
        return ff_task_fail(t, FF_STATUS_BAD_REQUEST,
                            "collective: worker %d has no communicator for group '%s' (hint: create the group with "
                            "a collectives backend, and dispatch to the whole group)",
                            ff_task_rank(t), ff_task_group(t));
    const char *op;
    size_t opn;
    if (ff_msg_arg_str(st, "op", &op, &opn) != 0) return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "%s", ff_error_message());
    ff_coll_redop redop = FF_COLL_SUM;
    const char *rp;
    size_t rn;
    if (ff_msg_arg_str(st, "redop", &rp, &rn) == 0 && parse_redop(rp, rn, &redop) != 0)
        return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "collective: unknown redop '%.*s' (sum, prod, max, min, avg)",
                            (int)rn, rp);
    if (ff_task_ninputs(t) != 1) return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "collective: needs exactly one input");
    const ff_tensor *x = ff_task_input(t, 0);
    int nranks = ff_coll_comm_size(comm), me = ff_coll_comm_rank(comm);
    size_t numel = (size_t)ff_tensor_numel(x);
    if (arg_is(op, opn, "all_reduce") || arg_is(op, opn, "broadcast")) {
        void *out = ff_task_output(t, "out", x->dtype, x->ndim, x->shape);
        if (!out) return -1;
        if (arg_is(op, opn, "all_reduce")) return ff_coll_all_reduce(x->data, out, numel, x->dtype, redop, comm, NULL);
        int64_t root = 0;
        if (ff_msg_find_arg(st, "root") && ff_msg_arg_int(st, "root", &root) != 0) return -1;
        if (root < 0 || root >= nranks)
            return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "collective: root %lld outside [0, %d)", (long long)root,
                                nranks);
        return ff_coll_broadcast(x->data, out, numel, x->dtype, (int)root, comm, NULL);
    }
    if (x->ndim < 1) return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "collective: %.*s needs a first dimension", (int)opn, op);
    size_t row = 1; /* elements per row */
    for (int d = 1; d < x->ndim; d++) row *= (size_t)x->shape[d];
    size_t *counts = ff_malloc(sizeof *counts * (size_t)nranks);
    if (!counts) return -1;
    int rc;
    int64_t shape[FF_MSG_MAX_DIMS];
    memcpy(shape, x->shape, sizeof *shape * (size_t)x->ndim);
    if (arg_is(op, opn, "all_gather")) {
        /* members may hold different row counts: share them first */
        int64_t mine = x->shape[0], *all = ff_malloc(sizeof *all * (size_t)nranks);
        if (!all) {
            free(counts);
            return -1;
        }
        rc = ff_coll_all_gather(&mine, all, 1, FF_DTYPE_I64, comm, NULL);
        int64_t rows = 0;
        for (int r = 0; r < nranks && rc == 0; r++) {
            counts[r] = (size_t)all[r] * row;
            rows += all[r];
        }
        free(all);
        if (rc == 0) {
            shape[0] = rows;
            void *out = ff_task_output(t, "out", x->dtype, x->ndim, shape);
            rc = out ? ff_coll_all_gather_v(x->data, out, counts, x->dtype, comm, NULL) : -1;
        }
    } else if (arg_is(op, opn, "reduce_scatter")) {
        int64_t rows = x->shape[0], base = rows / nranks, rem = rows % nranks;
        for (int r = 0; r < nranks; r++) counts[r] = (size_t)(base + (r < rem)) * row;
        shape[0] = base + (me < rem);
        void *out = ff_task_output(t, "out", x->dtype, x->ndim, shape);
        rc = out ? ff_coll_reduce_scatter_v(x->data, out, counts, x->dtype, redop, comm, NULL) : -1;
    } else {
        rc = ff_task_fail(t, FF_STATUS_BAD_REQUEST,
                          "collective: unknown op '%.*s' (all_reduce, broadcast, all_gather, reduce_scatter)", (int)opn, op);
    }
    free(counts);
    return rc;
}

int rt_register_group_kinds(ff_worker *w) {
    if (ff_worker_register(w, "coll.unique_id", kind_unique_id, NULL, 0) ||
        ff_worker_register(w, "collective", kind_collective, NULL, 0))
        return -1;
    return 0;
}
