/* The transport plumbing both sides of the wire share (library ff_msgs): the libev pattern
 * for ZeroMQ's edge-triggered ZMQ_FD, CURVE key files, socket options. The controller
 * (controller/) and the worker (workers/) include it; it is not installed and not part of
 * the public API. Not here: messages themselves (fuseflow/msgs.h), who talks to whom. */
#ifndef FF_MSGS_TRANSPORT_H
#define FF_MSGS_TRANSPORT_H

#include <ev.h>
#include <stdbool.h>
#include <stdint.h>

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

#endif
