/* Internals of the worker process (library ff_worker): group communicators and the
 * built-in kinds. Not public API; the controller never sees these. */
#ifndef FF_WORKERS_WORKER_INTERNAL_H
#define FF_WORKERS_WORKER_INTERNAL_H

#include <stdint.h>

#include "fuseflow/coll.h"
#include "fuseflow/msgs.h"

/* ---- workers: group communicators (workers/group.c) ------------------------------------- */
typedef struct rt_group {
    char name[FF_MSG_NAME_MAX];
    int index, size;
    int32_t *members;
    ff_coll_comm *comm; /* NULL for backend "none" */
} rt_group;

/* Join (or rebuild) a group from a setup message; runs on the compute thread, blocks until
 * every member joined. 0 or -1 + error. */
int rt_group_join(rt_group *g, const ff_msg_group_setup *s);
void rt_group_leave(rt_group *g);
/* Capability strings for the hello ("coll:cpu", "coll:nccl"): how many were written. */
int rt_coll_caps(char (*caps)[FF_MSG_NAME_MAX], int room);

/* Built-in generic kinds (workers/kinds.c). */
typedef struct ff_worker ff_worker;
int rt_register_builtin_kinds(ff_worker *w);
int rt_register_group_kinds(ff_worker *w); /* group.c: "collective", "coll.unique_id" */

#endif
