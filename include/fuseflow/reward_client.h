/* fuseflow: the client of the external reward-server protocol and the `remote` reward
 * function built on it (library ff_exec: the RL controller scores rewards, so it is the one
 * that talks to reward servers; workers never do).
 *
 * ## The reward-server protocol (version 1)
 * ZeroMQ REQ (fuseflow) -> REP (the server), one JSON object per single-frame message, UTF-8:
 *
 *   request  {"version": 1, "id": 7, "function": "arith" | null,
 *             "items": [{"prompt": "...", "response": "...", "answer": "..." | null,
 *                        "metadata": {...} | null}, ...]}
 *   reply    {"version": 1, "id": 7, "scores": [1.0, 0.0, ...]}      one number per item
 *   or       {"version": 1, "id": 7, "error": "what went wrong"}
 *   ping     {"version": 1, "id": 8, "ping": true}  ->  {"version": 1, "id": 8, "pong": true}
 *
 * The client pings when it is created (so a server that is down stops the run before it
 * starts), waits timeout_ms for each reply, retries a timed-out request `retries` times on a
 * fresh socket, and rejects a reply that is not JSON, has another id or version, or has the
 * wrong number of scores or a non-finite one, with an error that names the endpoint.
 * examples/reward_server.py is a runnable server (pyzmq); docs/graphs.md documents it.
 */
#ifndef FUSEFLOW_REWARD_CLIENT_H
#define FUSEFLOW_REWARD_CLIENT_H

#include <stddef.h>

#include "fuseflow/registry.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

#define FF_REWARD_PROTOCOL_VERSION 1

/* ---- the reward-server client ------------------------------------------------------------ */
typedef struct ff_reward_client ff_reward_client;

typedef struct ff_reward_client_opts {
    const char *endpoint; /* "tcp://127.0.0.1:5555", "ipc:///tmp/rw.sock" */
    const char *function; /* passed to the server as "function", or NULL */
    int timeout_ms;       /* per try; default 10000 when 0 */
    int retries;          /* extra tries after a timeout (default 0 when negative) */
    size_t batch_size;    /* items per request; 0 = all in one */
} ff_reward_client_opts;

/* Connects (ZeroMQ connects lazily; nothing is sent yet). NULL + error. */
ff_reward_client *ff_reward_client_new(const ff_reward_client_opts *opts);
void ff_reward_client_destroy(ff_reward_client **c);
/* Round-trip a ping. 0, or -1 + error (timeout: is the server running?). */
int ff_reward_client_ping(ff_reward_client *c);
/* Score items into scores [n]. 0, or -1 + error; scores are untouched on error. */
int ff_reward_client_score(ff_reward_client *c, const ff_reward_item *items, size_t n, float *scores);

/* Add the `remote` reward function (params endpoint, server_function, timeout_ms, retries,
 * batch_size, check_on_start) to a registry. 0 / -1 + error. */
int ff_reward_remote_register(ff_registry *r);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif
