/* Internals shared by the controller and the worker (library ff_runtime): the libev pattern
 * for ZeroMQ's edge-triggered ZMQ_FD, CURVE key files, socket options. Not public API. */
#ifndef FF_RT_INTERNAL_H
#define FF_RT_INTERNAL_H

#include <ev.h>
#include <stdbool.h>
#include <stdint.h>

#include "fuseflow/coll.h"
#include "fuseflow/msgs.h"

/* ---- ZeroMQ socket in a libev loop ----------------------------------------------------
 * ZMQ_FD only says "something changed" (edge-triggered) and receiving or sending can
 * consume that edge. So: an ev_io on ZMQ_FD only wakes the loop; an ev_prepare reads
 * ZMQ_EVENTS before every block and, when a message waits, starts an ev_idle so the loop
 * polls without blocking; the ev_check after the poll calls on_readable, which handles at
 * most a bounded batch so timers and compute-thread wake-ups keep their turn. */
typedef struct rt_zwatch {
    struct ev_loop *loop;
    void *sock;
    ev_io io;
    ev_prepare prepare;
    ev_check check;
    ev_idle idle;
    void (*on_readable)(struct rt_zwatch *zw);
    void *ud;
} rt_zwatch;

int rt_zwatch_start(rt_zwatch *zw, struct ev_loop *loop, void *sock, void (*on_readable)(rt_zwatch *), void *ud);
void rt_zwatch_stop(rt_zwatch *zw);
bool rt_zsock_readable(void *sock); /* ZMQ_EVENTS & ZMQ_POLLIN */

/* Messages handled per wake-up before yielding to the loop's other watchers. */
#define RT_RECV_BATCH 256

/* ---- CURVE key files (written by ff_curve_keygen) ----------------------------------------- */
typedef struct rt_curve_keys {
    bool controller;              /* role = controller (else worker) */
    char server_public[41];       /* Z85, 40 characters */
    char server_secret[41];       /* controller only */
    char client_public[41];       /* both: the workers' key (the controller authorises it) */
    char client_secret[41];       /* worker only */
} rt_curve_keys;

/* Read a key file; checks the role and every key. 0 or -1 + error naming the file. */
int rt_curve_load(const char *path, bool want_controller, rt_curve_keys *out);

/* Common socket options: no linger, no high-water marks (backpressure is ours), optional
 * inbound size cap. 0 or -1 + error. */
int rt_socket_setup(void *sock, size_t max_msg_bytes);

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
