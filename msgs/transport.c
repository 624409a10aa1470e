/* Pieces the controller and the worker share: the libev/ZMQ_FD watcher, socket options,
 * CURVE key files (reading them, and writing them for `fuseflow keygen`). Not here: the
 * messages (msg.c, decode.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zmq.h>

#include "fuseflow/msgs.h"
#include "msgs/transport.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"

bool rt_zsock_readable(void *sock) {
    int events = 0;
    size_t len = sizeof events;
    if (zmq_getsockopt(sock, ZMQ_EVENTS, &events, &len) != 0) return false;
    return (events & ZMQ_POLLIN) != 0;
}

static void zw_io_cb(struct ev_loop *loop, ev_io *w, int revents) {
    (void)loop;
    (void)w;
    (void)revents; /* only wakes the loop; ev_check does the work */
}

static void zw_idle_cb(struct ev_loop *loop, ev_idle *w, int revents) {
    (void)loop;
    (void)w;
    (void)revents;
}

static void zw_prepare_cb(struct ev_loop *loop, ev_prepare *w, int revents) {
    (void)revents;
    rt_zwatch *zw = w->data;
    if (rt_zsock_readable(zw->sock)) {
        if (!ev_is_active(&zw->idle)) ev_idle_start(loop, &zw->idle);
    } else if (ev_is_active(&zw->idle)) {
        ev_idle_stop(loop, &zw->idle);
    }
}

static void zw_check_cb(struct ev_loop *loop, ev_check *w, int revents) {
    (void)loop;
    (void)revents;
    rt_zwatch *zw = w->data;
    if (rt_zsock_readable(zw->sock)) zw->on_readable(zw);
}

int rt_zwatch_start(rt_zwatch *zw, struct ev_loop *loop, void *sock, void (*on_readable)(rt_zwatch *), void *ud) {
    int fd;
    size_t len = sizeof fd;
    if (zmq_getsockopt(sock, ZMQ_FD, &fd, &len) != 0)
        return ff_error_set("zmq", NULL, "ZMQ_FD: %s", zmq_strerror(errno));
    zw->loop = loop;
    zw->sock = sock;
    zw->on_readable = on_readable;
    zw->ud = ud;
    ev_io_init(&zw->io, zw_io_cb, fd, EV_READ);
    ev_prepare_init(&zw->prepare, zw_prepare_cb);
    ev_check_init(&zw->check, zw_check_cb);
    ev_idle_init(&zw->idle, zw_idle_cb);
    zw->io.data = zw->prepare.data = zw->check.data = zw->idle.data = zw;
    ev_io_start(loop, &zw->io);
    ev_prepare_start(loop, &zw->prepare);
    ev_check_start(loop, &zw->check);
    return 0;
}

void rt_zwatch_stop(rt_zwatch *zw) {
    if (!zw->loop) return;
    ev_io_stop(zw->loop, &zw->io);
    ev_prepare_stop(zw->loop, &zw->prepare);
    ev_check_stop(zw->loop, &zw->check);
    ev_idle_stop(zw->loop, &zw->idle);
    zw->loop = NULL;
}

int rt_socket_setup(void *sock, size_t max_msg_bytes) {
    int zero = 0;
    if (zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero) || zmq_setsockopt(sock, ZMQ_SNDHWM, &zero, sizeof zero) ||
        zmq_setsockopt(sock, ZMQ_RCVHWM, &zero, sizeof zero))
        return ff_error_set("zmq", NULL, "socket options: %s", zmq_strerror(errno));
    if (max_msg_bytes) {
        int64_t cap = (int64_t)max_msg_bytes;
        if (zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &cap, sizeof cap))
            return ff_error_set("zmq", NULL, "ZMQ_MAXMSGSIZE: %s", zmq_strerror(errno));
    }
    return 0;
}

/* ---- CURVE key files ------------------------------------------------------------------- */
static int valid_z85_key(const char *s) {
    uint8_t bin[32];
    return strlen(s) == 40 && zmq_z85_decode(bin, s) != NULL;
}

int rt_curve_load(const char *path, bool want_controller, rt_curve_keys *out) {
    memset(out, 0, sizeof *out);
    size_t len;
    char *text = ff_read_file(path, &len);
    if (!text) return ff_error_wrap("CURVE key file");
    char role[32] = "";
    int lineno = 0, rc = 0;
    for (char *line = text, *next; line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        lineno++;
        while (*line == ' ' || *line == '\t') line++;
        if (!*line || *line == '#') continue;
        char key[64], val[128];
        if (sscanf(line, "%63[^ =] = %127s", key, val) != 2) {
            rc = ff_error_set(path, "make a new one with `fuseflow keygen`", "line %d is not 'key = value'", lineno);
            break;
        }
        char *dst = NULL;
        size_t cap = 41;
        if (!strcmp(key, "role")) dst = role, cap = sizeof role;
        else if (!strcmp(key, "server-public")) dst = out->server_public;
        else if (!strcmp(key, "server-secret")) dst = out->server_secret;
        else if (!strcmp(key, "client-public")) dst = out->client_public;
        else if (!strcmp(key, "client-secret")) dst = out->client_secret;
        else {
            rc = ff_error_set(path, NULL, "line %d: unknown key '%s'", lineno, key);
            break;
        }
        if (strlen(val) >= cap) {
            rc = ff_error_set(path, NULL, "line %d: value of '%s' too long", lineno, key);
            break;
        }
        snprintf(dst, cap, "%s", val);
    }
    free(text);
    if (rc) return rc;
    const char *want = want_controller ? "controller" : "worker";
    if (strcmp(role, want) != 0)
        return ff_error_set(path, want_controller ? "pass controller.key to the controller, worker.key to workers"
                                                  : "pass worker.key to workers, controller.key to the controller",
                            "this is a %s key file, expected a %s one", role[0] ? role : "role-less", want);
    out->controller = want_controller;
    const char *need[3][2] = {{"server-public", out->server_public},
                              {want_controller ? "server-secret" : "client-secret",
                               want_controller ? out->server_secret : out->client_secret},
                              {"client-public", out->client_public}};
    for (int i = 0; i < 3; i++)
        if (!valid_z85_key(need[i][1]))
            return ff_error_set(path, "make a new one with `fuseflow keygen`", "'%s' is missing or not a Z85 key",
                                need[i][0]);
    return 0;
}

static int write_key_file(const char *path, const char *text) {
    if (ff_write_file_atomic(path, text, strlen(text)) != 0) return -1;
    if (chmod(path, 0600) != 0) return ff_error_set(path, NULL, "chmod 600: %s", strerror(errno));
    return 0;
}

int ff_curve_keygen(const char *dir) {
    char spub[41], ssec[41], cpub[41], csec[41];
    if (zmq_curve_keypair(spub, ssec) != 0 || zmq_curve_keypair(cpub, csec) != 0)
        return ff_error_set("keygen", "install a libzmq built with libsodium", "zmq_curve_keypair: %s",
                            zmq_strerror(errno));
    if (ff_mkdirs(dir) != 0) return -1;
    char path[FF_PATH_MAX], text[1024];
    snprintf(path, sizeof path, "%s/controller.key", dir);
    snprintf(text, sizeof text,
             "# fuseflow CURVE keys, controller side. Secret: keep it on the controller's host only.\n"
             "# Workers get worker.key from the same `fuseflow keygen` run.\n"
             "role = controller\nserver-public = %s\nserver-secret = %s\nclient-public = %s\n",
             spub, ssec, cpub);
    if (write_key_file(path, text) != 0) return -1;
    snprintf(path, sizeof path, "%s/worker.key", dir);
    snprintf(text, sizeof text,
             "# fuseflow CURVE keys, worker side. Secret: whoever holds it can join the controller.\n"
             "role = worker\nserver-public = %s\nclient-public = %s\nclient-secret = %s\n",
             spub, cpub, csec);
    return write_key_file(path, text);
}
