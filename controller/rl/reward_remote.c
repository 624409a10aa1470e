/* The reward-server client (protocol in include/fuseflow/reward_client.h) and the `remote` reward
 * function that uses it.
 *
 * REQ socket with the "lazy pirate" pattern: every request waits timeout_ms for its reply;
 * on a timeout the socket is closed (linger 0, so nothing queued survives) and a fresh one
 * retries; after the last try the error names the endpoint and how to start a server.
 * ZMQ_REQ_CORRELATE drops late replies to abandoned requests; ids are checked as well.
 *
 * Not here: the server (examples/reward_server.py), rule-based rewards (reward.c). */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "fuseflow/error.h"
#include "fuseflow/registry.h"
#include "fuseflow/reward.h"
#include "fuseflow/reward_client.h"
#include "fuseflow/util.h"

struct ff_reward_client {
    void *ctx, *sock;
    char *endpoint, *function;
    int timeout_ms, retries;
    size_t batch_size;
    uint64_t next_id;
};

static const char *start_hint = "is the reward server running? start one with: python3 examples/reward_server.py --bind ENDPOINT";

static void close_socket(ff_reward_client *c) {
    if (c->sock) zmq_close(c->sock);
    c->sock = NULL;
}

static int open_socket(ff_reward_client *c) {
    close_socket(c);
    c->sock = zmq_socket(c->ctx, ZMQ_REQ);
    if (!c->sock) return ff_error_set(c->endpoint, NULL, "cannot create a ZeroMQ socket: %s", zmq_strerror(errno));
    int zero = 0, one = 1;
    int64_t max_msg = 256ll << 20; /* a reply larger than this is garbage, not scores */
    if (zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof zero) || zmq_setsockopt(c->sock, ZMQ_REQ_RELAXED, &one, sizeof one) ||
        zmq_setsockopt(c->sock, ZMQ_REQ_CORRELATE, &one, sizeof one) ||
        zmq_setsockopt(c->sock, ZMQ_RCVTIMEO, &c->timeout_ms, sizeof c->timeout_ms) ||
        zmq_setsockopt(c->sock, ZMQ_SNDTIMEO, &c->timeout_ms, sizeof c->timeout_ms) ||
        zmq_setsockopt(c->sock, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg)) {
        int e = errno;
        close_socket(c);
        return ff_error_set(c->endpoint, NULL, "cannot set socket options: %s", zmq_strerror(e));
    }
    if (zmq_connect(c->sock, c->endpoint) != 0) {
        int e = errno;
        close_socket(c);
        return ff_error_set(c->endpoint, "write it as tcp://HOST:PORT or ipc:///path", "cannot connect to the reward server: %s",
                            zmq_strerror(e));
    }
    return 0;
}

ff_reward_client *ff_reward_client_new(const ff_reward_client_opts *o) {
    if (!o->endpoint || !o->endpoint[0]) {
        ff_error_set("reward server", "set endpoint, e.g. tcp://127.0.0.1:5555", "no endpoint given");
        return NULL;
    }
    ff_reward_client *c = ff_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->endpoint = ff_strdup(o->endpoint);
    c->function = o->function ? ff_strdup(o->function) : NULL;
    c->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 10000;
    c->retries = o->retries > 0 ? o->retries : 0;
    c->batch_size = o->batch_size;
    c->ctx = zmq_ctx_new();
    if (!c->endpoint || (o->function && !c->function) || !c->ctx) {
        if (!c->ctx) ff_error_set(o->endpoint, NULL, "cannot create a ZeroMQ context: %s", zmq_strerror(errno));
        ff_reward_client_destroy(&c);
        return NULL;
    }
    if (open_socket(c) != 0) {
        ff_reward_client_destroy(&c);
        return NULL;
    }
    return c;
}

void ff_reward_client_destroy(ff_reward_client **pc) {
    if (!pc || !*pc) return;
    ff_reward_client *c = *pc;
    close_socket(c);
    if (c->ctx) zmq_ctx_term(c->ctx);
    free(c->endpoint);
    free(c->function);
    free(c);
    *pc = NULL;
}

/* Send req (its "version" and "id" are set here) and receive the checked reply object. */
static int roundtrip(ff_reward_client *c, json_t *req, json_t **out) {
    for (int attempt = 0;; attempt++) {
        if (!c->sock && open_socket(c) != 0) return -1;
        uint64_t id = ++c->next_id;
        json_object_set_new(req, "version", json_integer(FF_REWARD_PROTOCOL_VERSION));
        json_object_set_new(req, "id", json_integer((json_int_t)id));
        char *text = json_dumps(req, JSON_COMPACT);
        if (!text) return ff_error_set(c->endpoint, NULL, "cannot encode the request (is every text valid UTF-8?)");
        int rc = zmq_send(c->sock, text, strlen(text), 0);
        free(text);
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (rc >= 0) rc = zmq_msg_recv(&msg, c->sock, 0);
        if (rc < 0) {
            int e = errno;
            zmq_msg_close(&msg);
            close_socket(c); /* a REQ socket that lost its reply is reopened, not reused */
            if (e == EAGAIN && attempt < c->retries) continue;
            if (e == EAGAIN)
                return ff_error_set(c->endpoint, start_hint, "reward server did not answer within %d ms (%d tries)", c->timeout_ms,
                                    attempt + 1);
            return ff_error_set(c->endpoint, NULL, "reward server exchange failed: %s", zmq_strerror(e));
        }
        bool more = zmq_msg_more(&msg);
        json_error_t jerr;
        json_t *rep = json_loadb(zmq_msg_data(&msg), zmq_msg_size(&msg), 0, &jerr);
        zmq_msg_close(&msg);
        if (more) {
            json_decref(rep);
            close_socket(c);
            return ff_error_set(c->endpoint, "answer with one frame holding one JSON object", "reply has more than one frame");
        }
        if (!rep) return ff_error_set(c->endpoint, "the server must answer with one JSON object", "reply is not JSON: %s", jerr.text);
        json_t *ver = json_object_get(rep, "version"), *rid = json_object_get(rep, "id");
        const char *err = NULL;
        if (!json_is_object(rep))
            err = "reply is not a JSON object";
        else if (!json_is_integer(ver) || json_integer_value(ver) != FF_REWARD_PROTOCOL_VERSION)
            err = "reply has no \"version\": 1";
        else if (!json_is_integer(rid) || (uint64_t)json_integer_value(rid) != id)
            err = "reply's \"id\" does not match the request's";
        if (err) {
            json_decref(rep);
            return ff_error_set(c->endpoint, "see the protocol in docs/graphs.md", "%s", err);
        }
        json_t *e = json_object_get(rep, "error");
        if (e) {
            int r = ff_error_set(c->endpoint, NULL, "reward server error: %s", json_is_string(e) ? json_string_value(e) : "(not a string)");
            json_decref(rep);
            return r;
        }
        *out = rep;
        return 0;
    }
}

int ff_reward_client_ping(ff_reward_client *c) {
    json_t *req = json_object(), *rep = NULL;
    if (!req) return ff_error_set(c->endpoint, NULL, "out of memory");
    json_object_set_new(req, "ping", json_true());
    int rc = roundtrip(c, req, &rep);
    json_decref(req);
    if (rc != 0) return -1;
    bool ok = json_is_true(json_object_get(rep, "pong"));
    json_decref(rep);
    return ok ? 0 : ff_error_set(c->endpoint, "answer a ping with {\"pong\": true}", "reply to a ping has no \"pong\": true");
}

static json_t *item_json(const ff_reward_item *it) {
    json_t *o = json_object();
    if (!o) return NULL;
    json_object_set_new(o, "prompt", it->prompt ? json_string(it->prompt) : json_null());
    json_object_set_new(o, "response", it->response ? json_string(it->response) : json_null());
    json_object_set_new(o, "answer", it->answer ? json_string(it->answer) : json_null());
    json_t *meta = json_null();
    if (it->metadata) {
        json_decref(meta);
        meta = json_loads(it->metadata, JSON_DECODE_ANY, NULL);
        if (!meta) meta = json_string(it->metadata);
    }
    json_object_set_new(o, "metadata", meta);
    /* json_string returns NULL for invalid UTF-8: the item is then rejected as a whole */
    if (!json_object_get(o, "prompt") || !json_object_get(o, "response") || !json_object_get(o, "answer")) {
        json_decref(o);
        return NULL;
    }
    return o;
}

int ff_reward_client_score(ff_reward_client *c, const ff_reward_item *items, size_t n, float *scores) {
    float *tmp = ff_malloc(sizeof(float) * (n ? n : 1));
    if (!tmp) return -1;
    size_t step = c->batch_size ? c->batch_size : (n ? n : 1);
    for (size_t b = 0; b < n; b += step) {
        size_t k = n - b < step ? n - b : step;
        json_t *req = json_object(), *arr = json_array();
        if (!req || !arr) {
            json_decref(req), json_decref(arr), free(tmp);
            return ff_error_set(c->endpoint, NULL, "out of memory");
        }
        json_object_set_new(req, "function", c->function ? json_string(c->function) : json_null());
        json_object_set_new(req, "items", arr);
        for (size_t i = 0; i < k; i++) {
            json_t *it = item_json(&items[b + i]);
            if (!it) {
                json_decref(req), free(tmp);
                return ff_error_set(c->endpoint, "texts must be valid UTF-8", "cannot encode item %zu", b + i);
            }
            json_array_append_new(arr, it);
        }
        json_t *rep = NULL;
        int rc = roundtrip(c, req, &rep);
        json_decref(req);
        if (rc != 0) {
            free(tmp);
            return -1;
        }
        json_t *sc = json_object_get(rep, "scores");
        const char *err = NULL;
        size_t bad = 0;
        if (!json_is_array(sc))
            err = "reply has no \"scores\" list";
        else if (json_array_size(sc) != k)
            err = "reply has the wrong number of scores";
        else
            for (size_t i = 0; i < k && !err; i++) {
                json_t *v = json_array_get(sc, i);
                double x = json_number_value(v);
                if (!json_is_number(v) || !isfinite(x))
                    err = "a score is not a finite number", bad = i;
                else
                    tmp[b + i] = (float)x;
            }
        if (err) {
            size_t got = json_is_array(sc) ? json_array_size(sc) : 0;
            ff_error_set(c->endpoint, "answer {\"scores\": [one number per item]} (see docs/graphs.md)", "%s (%zu items sent, %zu scores, item %zu)",
                         err, k, got, b + bad);
            json_decref(rep);
            free(tmp);
            return -1;
        }
        json_decref(rep);
    }
    memcpy(scores, tmp, sizeof(float) * n);
    free(tmp);
    return 0;
}

/* ---- the `remote` reward function ---------------------------------------------------------- */

static int remote_create(ff_cnode *p, void **state) {
    ff_reward_client_opts o = {0};
    int64_t timeout = 10000, retries = 1, batch = 0;
    bool check = true;
    char w[256];
    if (!p) return ff_error_set("remote", "set endpoint: tcp://HOST:PORT", "the remote reward needs an endpoint");
    if (ff_cnode_get_str(p, "endpoint", NULL, &o.endpoint) < 0 || ff_cnode_get_str(p, "server_function", NULL, &o.function) < 0 ||
        ff_cnode_get_int(p, "timeout_ms", 10000, &timeout) < 0 || ff_cnode_get_int(p, "retries", 1, &retries) < 0 ||
        ff_cnode_get_int(p, "batch_size", 0, &batch) < 0 || ff_cnode_get_bool(p, "check_on_start", true, &check) < 0)
        return -1;
    if (!o.endpoint)
        return ff_error_set(ff_cnode_where(p, w, sizeof w), "add endpoint: tcp://127.0.0.1:5555 (where the server listens)",
                            "the remote reward needs an endpoint");
    if (timeout <= 0 || timeout > 3600000 || retries < 0 || retries > 100 || batch < 0)
        return ff_error_set(ff_cnode_where(p, w, sizeof w), NULL,
                            "timeout_ms must be in (0, 3600000], retries in [0, 100], batch_size >= 0");
    o.timeout_ms = (int)timeout, o.retries = (int)retries, o.batch_size = (size_t)batch;
    ff_reward_client *c = ff_reward_client_new(&o);
    if (!c) return -1;
    if (check && ff_reward_client_ping(c) != 0) {
        ff_reward_client_destroy(&c);
        return -1;
    }
    *state = c;
    return 0;
}

static int remote_score(void *state, const ff_reward_item *items, size_t n, float *scores) {
    return ff_reward_client_score(state, items, n, scores);
}

static void remote_destroy(void *state) {
    ff_reward_client *c = state;
    ff_reward_client_destroy(&c);
}

int ff_reward_remote_register(ff_registry *r) {
    ff_reward_def d = {"remote", "scores from an external reward server over ZeroMQ (endpoint, server_function, timeout_ms, retries, batch_size, check_on_start)",
                       remote_create, remote_score, remote_destroy};
    return ff_registry_add_reward(r, &d);
}
