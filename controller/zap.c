/* CURVE authentication: a ZAP handler (ZeroMQ's authentication protocol, RFC 27) on its own
 * thread, accepting exactly the client public key of the controller's key file. Without it,
 * libzmq's CURVE server would let in anyone who knows the server's public key. */
#include <errno.h>
#include <string.h>
#include <zmq.h>

#include "controller/ctl_internal.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"

#define ZAP_FRAMES 7 /* version, request id, domain, address, routing id, mechanism, credentials */

static void *zap_main(void *arg) {
    ff_controller *c = arg;
    zmq_pollitem_t item = {c->zap_sock, 0, ZMQ_POLLIN, 0};
    while (!atomic_load(&c->zap_stop)) {
        if (zmq_poll(&item, 1, 100) <= 0) continue;
        zmq_msg_t f[ZAP_FRAMES + 1];
        int n = 0, more = 1;
        while (more) {
            zmq_msg_t part;
            zmq_msg_init(&part);
            if (zmq_msg_recv(&part, c->zap_sock, 0) < 0) {
                zmq_msg_close(&part);
                break;
            }
            more = zmq_msg_more(&part);
            if (n < ZAP_FRAMES + 1) {
                zmq_msg_init(&f[n]);
                zmq_msg_move(&f[n], &part);
                n++;
            }
            zmq_msg_close(&part);
        }
        if (n < 2) {
            for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
            continue;
        }
        bool ok = n == ZAP_FRAMES && zmq_msg_size(&f[5]) == 5 && !memcmp(zmq_msg_data(&f[5]), "CURVE", 5) &&
                  zmq_msg_size(&f[6]) == 32 && !memcmp(zmq_msg_data(&f[6]), c->client_key, 32);
        if (!ok) atomic_fetch_add(&c->auth_rejected, 1);
        /* reply: version, request id, status code, status text, user id, metadata */
        zmq_send(c->zap_sock, "1.0", 3, ZMQ_SNDMORE);
        zmq_send(c->zap_sock, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
        zmq_send(c->zap_sock, ok ? "200" : "400", 3, ZMQ_SNDMORE);
        const char *text = ok ? "OK" : "client key not authorised";
        zmq_send(c->zap_sock, text, strlen(text), ZMQ_SNDMORE);
        zmq_send(c->zap_sock, ok ? "worker" : "", ok ? 6 : 0, ZMQ_SNDMORE);
        zmq_send(c->zap_sock, "", 0, 0);
        for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
    }
    zmq_close(c->zap_sock);
    return NULL;
}

int zap_start(ff_controller *c) {
    c->zap_sock = zmq_socket(c->ctx, ZMQ_REP);
    if (!c->zap_sock) return ff_error_set("CURVE", NULL, "ZAP socket: %s", zmq_strerror(errno));
    int zero = 0;
    zmq_setsockopt(c->zap_sock, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_bind(c->zap_sock, "inproc://zeromq.zap.01") != 0) {
        ff_error_set("CURVE", "one CURVE controller per process", "ZAP handler: %s", zmq_strerror(errno));
        zmq_close(c->zap_sock);
        c->zap_sock = NULL;
        return -1;
    }
    atomic_store(&c->zap_stop, false);
    if (pthread_create(&c->zap_thread, NULL, zap_main, c) != 0) {
        zmq_close(c->zap_sock);
        c->zap_sock = NULL;
        return ff_error_set("CURVE", NULL, "cannot start the ZAP thread");
    }
    c->zap_started = true;
    return 0;
}

void zap_stop(ff_controller *c) {
    if (!c->zap_started) return;
    atomic_store(&c->zap_stop, true);
    pthread_join(c->zap_thread, NULL);
    c->zap_started = false;
}
