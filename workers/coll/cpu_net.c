/* The cpu backend's connections: the unique id, the rendezvous thread that the process
 * making the id runs, the full mesh of TCP connections between the ranks (built at init
 * and again for every split), and the goodbye/abort notices at the end. Blocking I/O with
 * deadlines here; the collectives' own traffic goes through cpu_engine.c.
 *
 * Rendezvous protocol (all integers little-endian):
 *   rank -> root   HELLO  128 bytes: "FFCR", version 1, token[16], nranks, rank,
 *                  listen port, pid, listen address (64 bytes, NUL-padded text)
 *   root -> rank   REPLY  12 bytes: "FFCT", status (0 ok, 1 error), payload bytes; then
 *                  ok: nranks entries of 72 bytes (port, pid, address[64]); error: the text
 *   mesh: rank i connects to every rank j < i and sends "FFCM", token[16], i, j, nranks
 *         (32 bytes); j answers "FFCA", j (8 bytes). */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "workers/coll/coll_internal.h"

#define HELLO_MAGIC 0x52434646u /* "FFCR" */
#define REPLY_MAGIC 0x54434646u /* "FFCT" */
#define MESH_MAGIC 0x4d434646u  /* "FFCM" */
#define ACK_MAGIC 0x41434646u   /* "FFCA" */
#define PROTO_VERSION 1u
#define HELLO_BYTES 128
#define ENTRY_BYTES 72
#define MESH_BYTES 32

void coll_hex_encode(const uint8_t *in, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = '\0';
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int coll_hex_decode(const char *hex, size_t nhex, uint8_t *out) {
    if (nhex % 2) return -1;
    for (size_t i = 0; i < nhex / 2; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

/* ---- sockets with deadlines --------------------------------------------------------- */

static int ms_left(int64_t deadline) {
    int64_t ms = (deadline - ff_now_ns()) / 1000000;
    return ms < 0 ? 0 : ms > 1000000 ? 1000000 : (int)ms;
}

/* Wait for `events` on fd until the deadline: 1 ready, 0 timed out, -1 error (errno). */
static int wait_fd(int fd, short events, int64_t deadline) {
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, ms_left(deadline));
        if (r > 0) return 1;
        if (r == 0) return ff_now_ns() >= deadline ? 0 : wait_fd(fd, events, deadline);
        if (errno != EINTR) return -1;
    }
}

/* Contracts in coll_internal.h (the rendezvous, the mesh and cpu_shm.c use these). */
int coll_write_all(int fd, const void *buf, size_t n, int64_t deadline) {
    const uint8_t *p = buf;
    while (n) {
        ssize_t r = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
        int w = wait_fd(fd, POLLOUT, deadline);
        if (w == 0) errno = ETIMEDOUT;
        if (w <= 0) return -1;
    }
    return 0;
}

int coll_read_all(int fd, void *buf, size_t n, int64_t deadline) {
    uint8_t *p = buf;
    while (n) {
        ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0) {
            errno = EPIPE;
            return -1;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
        int w = wait_fd(fd, POLLIN, deadline);
        if (w == 0) errno = ETIMEDOUT;
        if (w <= 0) return -1;
    }
    return 0;
}

static const char *io_what(int err) {
    return err == EPIPE ? "the other side closed the connection" : strerror(err);
}

static int fill_addr(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len) {
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        *len = sizeof *a4;
        return 0;
    }
    if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        *len = sizeof *a6;
        return 0;
    }
    return -1;
}

static void addr_text(const struct sockaddr_storage *ss, char *host, int *port) {
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &a6->sin6_addr, host, COLL_HOST_MAX);
        if (port) *port = ntohs(a6->sin6_port);
    } else {
        const struct sockaddr_in *a4 = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &a4->sin_addr, host, COLL_HOST_MAX);
        if (port) *port = ntohs(a4->sin_port);
    }
}

/* A peer connection's options: no Nagle delay, and a peer whose host vanished (its link cut,
 * its machine off: no reset ever comes) noticed by the kernel within about PEER_LOST_S
 * seconds, by keepalive probes on an idle connection and by TCP_USER_TIMEOUT on unacked
 * data, so a collective blocked on it fails then instead of at its (long) timeout. */
#define PEER_LOST_S 10
static void peer_opts(int fd) {
    int one = 1, idle = PEER_LOST_S / 2, intvl = 1, cnt = PEER_LOST_S / 2;
    unsigned user_ms = PEER_LOST_S * 1000;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof user_ms);
}

/* Connect to host:port before the deadline; the socket is non-blocking. -1 + errno. */
static int connect_to(const char *host, int port, int64_t deadline) {
    struct sockaddr_storage ss;
    socklen_t len;
    if (fill_addr(host, port, &ss, &len)) {
        errno = EINVAL;
        return -1;
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&ss, len) < 0) {
        if (errno != EINPROGRESS) goto fail;
        int w = wait_fd(fd, POLLOUT, deadline);
        if (w <= 0) {
            if (w == 0) errno = ETIMEDOUT;
            goto fail;
        }
        int err = 0;
        socklen_t el = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
        if (err) {
            errno = err;
            goto fail;
        }
    }
    peer_opts(fd);
    return fd;
fail:;
    int e = errno;
    close(fd);
    errno = e;
    return -1;
}

/* Listen on host, port 0 (any free port): fd, or -1 + error. */
static int listen_on(const char *host, int *port) {
    struct sockaddr_storage ss;
    socklen_t len;
    if (fill_addr(host, 0, &ss, &len))
        return ff_error_set(host, "give a numeric IPv4 or IPv6 address", "not a numeric address");
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return ff_error_set(host, NULL, "socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, len) < 0 || listen(fd, SOMAXCONN) < 0) {
        int e = errno;
        close(fd);
        return ff_error_set(host, "pick an address of this host (options.host, FF_COLL_HOST or FF_COLL_IFNAME)",
                            "cannot listen: %s", strerror(e));
    }
    len = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &len);
    addr_text(&ss, (char[COLL_HOST_MAX]){0}, port);
    return fd;
}

/* ---- the address to listen on ------------------------------------------------------- */

static int pick_host(const ff_coll_options *opt, char host[COLL_HOST_MAX]) {
    const char *want = opt && opt->host ? opt->host : getenv("FF_COLL_HOST");
    if (want && *want) {
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
        int rc = getaddrinfo(want, NULL, &hints, &res);
        if (rc || !res)
            return ff_error_set(want, "give an address or host name of this machine (options.host / FF_COLL_HOST)",
                                "cannot resolve: %s", gai_strerror(rc));
        addr_text((struct sockaddr_storage *)res->ai_addr, host, NULL);
        freeaddrinfo(res);
        return 0;
    }
    const char *ifname = getenv("FF_COLL_IFNAME");
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) == 0) {
        for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
            if (ifname && *ifname ? strcmp(i->ifa_name, ifname) != 0 : (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
            addr_text((struct sockaddr_storage *)i->ifa_addr, host, NULL);
            freeifaddrs(ifs);
            return 0;
        }
        freeifaddrs(ifs);
    }
    if (ifname && *ifname)
        return ff_error_set("FF_COLL_IFNAME", "name an interface that is up and has an IPv4 address (ip addr)",
                            "interface '%s' has no IPv4 address that is up", ifname);
    snprintf(host, COLL_HOST_MAX, "127.0.0.1");
    return 0;
}

/* ---- the rendezvous thread ---------------------------------------------------------- */

typedef struct root_client {
    int fd;
    uint8_t buf[HELLO_BYTES];
    size_t got;
    int rank;   /* -1 until its hello was accepted */
    uint32_t port, pid;
    char host[COLL_HOST_MAX];
} root_client;

typedef struct root_state {
    int lfd;
    uint8_t token[COLL_TOKEN_BYTES];
    double timeout_s;
    char where[COLL_HOST_MAX + 32];
    root_client *cl;
    size_t ncl, cap;
    int nranks, joined;
    int *by_rank; /* [nranks] index into cl, -1 until joined */
    struct pollfd *pf; /* the thread's poll set (here so a forked child frees its copy) */
    size_t pf_cap;
    struct root_state *next;
} root_state;

/* Live rendezvous of this process. A child forked while one runs inherits its sockets but
 * not its thread: the child closes and frees its copies (so the parent's listener really
 * closes when the parent is done, and late joiners get "connection refused" instead of
 * hanging in a backlog nobody serves). The thread holds the lock except while it polls. */
static pthread_mutex_t g_roots_mu = PTHREAD_MUTEX_INITIALIZER;
static root_state *g_roots;
static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;

static void root_free(root_state *st) {
    for (size_t i = 0; i < st->ncl; i++)
        if (st->cl[i].fd >= 0) close(st->cl[i].fd);
    if (st->lfd >= 0) close(st->lfd);
    free(st->cl);
    free(st->by_rank);
    free(st->pf);
    free(st);
}

static void atfork_prepare(void) { pthread_mutex_lock(&g_roots_mu); }
static void atfork_parent(void) { pthread_mutex_unlock(&g_roots_mu); }
static void atfork_child(void) {
    while (g_roots) {
        root_state *st = g_roots;
        g_roots = st->next;
        root_free(st);
    }
    pthread_mutex_unlock(&g_roots_mu);
}
static void register_atfork(void) { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); }

static void reply(int fd, uint32_t status, const void *payload, size_t len, int64_t deadline) {
    uint8_t h[12];
    put32(h, REPLY_MAGIC);
    put32(h + 4, status);
    put32(h + 8, (uint32_t)len);
    if (coll_write_all(fd, h, sizeof h, deadline) == 0 && len) coll_write_all(fd, payload, len, deadline);
}

/* Answer with an error and close, reading what the client sent first so that the close
 * does not reset the connection (which could destroy the answer before it is read). */
static void reject(root_client *c, const char *msg) {
    reply(c->fd, 1, msg, strlen(msg), ff_now_ns() + 1000000000);
    shutdown(c->fd, SHUT_WR);
    uint8_t sink[256];
    int64_t dl = ff_now_ns() + 200000000;
    while (wait_fd(c->fd, POLLIN, dl) > 0 && recv(c->fd, sink, sizeof sink, MSG_DONTWAIT) > 0) {
    }
    close(c->fd);
    c->fd = -1;
}

/* A complete hello from client i: 0 accepted (or rejected alone), -1 the rendezvous fails
 * with msg. */
static int root_hello(root_state *st, size_t i, char *msg, size_t cap) {
    root_client *c = &st->cl[i];
    const uint8_t *b = c->buf;
    if (get32(b) != HELLO_MAGIC || get32(b + 4) != PROTO_VERSION) {
        reject(c, "not a fuseflow collectives hello (wrong magic or protocol version)");
        return 0;
    }
    if (memcmp(b + 8, st->token, COLL_TOKEN_BYTES) != 0) {
        reject(c, "wrong token: this rendezvous belongs to another communicator (a stale or foreign unique "
                  "id); use the id made for this group");
        return 0;
    }
    int n = (int)get32(b + 24), rank = (int)get32(b + 28);
    c->port = get32(b + 32);
    c->pid = get32(b + 36);
    memcpy(c->host, b + 40, COLL_HOST_MAX);
    c->host[COLL_HOST_MAX - 1] = '\0';
    if (n <= 0 || n > 65536) {
        snprintf(msg, cap, "a rank (pid %u on %s) joined with nranks=%d", c->pid, c->host, n);
        return -1;
    }
    if (st->nranks < 0) {
        st->by_rank = malloc((size_t)n * sizeof *st->by_rank);
        if (!st->by_rank) {
            snprintf(msg, cap, "out of memory");
            return -1;
        }
        for (int r = 0; r < n; r++) st->by_rank[r] = -1;
        st->nranks = n;
    } else if (n != st->nranks) {
        snprintf(msg, cap, "ranks disagree on nranks: one joined with %d, another with %d", st->nranks, n);
        return -1;
    }
    if (rank < 0 || rank >= st->nranks) {
        snprintf(msg, cap, "a rank joined as rank %d but nranks is %d", rank, st->nranks);
        return -1;
    }
    if (st->by_rank[rank] >= 0) {
        const root_client *o = &st->cl[st->by_rank[rank]];
        snprintf(msg, cap, "rank %d joined twice (pid %u on %s and pid %u on %s)", rank, o->pid, o->host, c->pid,
                 c->host);
        return -1;
    }
    c->rank = rank;
    st->by_rank[rank] = (int)i;
    st->joined++;
    return 0;
}

static void *root_main(void *arg) {
    root_state *st = arg;
    int64_t deadline = ff_now_ns() + (int64_t)(st->timeout_s * 1e9);
    char msg[512] = "";
    bool ok = false;
    pthread_mutex_lock(&g_roots_mu);
    for (;;) {
        if (st->nranks > 0 && st->joined == st->nranks) {
            ok = true;
            break;
        }
        int ms = ms_left(deadline);
        if (ms == 0) {
            if (st->nranks < 0) {
                snprintf(msg, sizeof msg, "no rank joined within %.0f s", st->timeout_s);
            } else {
                size_t len = (size_t)snprintf(msg, sizeof msg, "timed out after %.0f s: rank(s) ", st->timeout_s);
                int shown = 0;
                for (int r = 0; r < st->nranks && len < sizeof msg - 64; r++)
                    if (st->by_rank[r] < 0)
                        len += (size_t)snprintf(msg + len, sizeof msg - len, "%s%d", shown++ ? ", " : "", r);
                snprintf(msg + len, sizeof msg - len, " of %d never joined", st->nranks);
            }
            break;
        }
        if (st->pf_cap < st->ncl + 1) {
            struct pollfd *np = realloc(st->pf, (st->ncl + 16) * sizeof *np);
            if (!np) {
                snprintf(msg, sizeof msg, "out of memory");
                break;
            }
            st->pf = np;
            st->pf_cap = st->ncl + 16;
        }
        struct pollfd *pf = st->pf;
        pf[0] = (struct pollfd){.fd = st->lfd, .events = POLLIN};
        for (size_t i = 0; i < st->ncl; i++)
            pf[i + 1] = (struct pollfd){.fd = st->cl[i].rank < 0 ? st->cl[i].fd : -1, .events = POLLIN};
        size_t npf = st->ncl + 1;
        pthread_mutex_unlock(&g_roots_mu);
        int pr = poll(pf, npf, ms > 200 ? 200 : ms);
        pthread_mutex_lock(&g_roots_mu);
        bool failed = false;
        for (size_t i = 0; pr > 0 && i + 1 < npf && !failed; i++) {
            root_client *c = &st->cl[i];
            if (!pf[i + 1].revents || c->fd < 0 || c->rank >= 0) continue;
            ssize_t r = recv(c->fd, c->buf + c->got, HELLO_BYTES - c->got, MSG_DONTWAIT);
            if (r <= 0) {
                if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
                close(c->fd); /* went away before saying hello */
                c->fd = -1;
                continue;
            }
            c->got += (size_t)r;
            if (c->got == HELLO_BYTES && root_hello(st, i, msg, sizeof msg)) failed = true;
        }
        if (failed) break;
        if (pf[0].revents & POLLIN) {
            int fd = accept4(st->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (fd >= 0) {
                if (st->ncl == st->cap) {
                    size_t nc = st->cap ? st->cap * 2 : 16;
                    root_client *ncl = realloc(st->cl, nc * sizeof *ncl);
                    if (!ncl) {
                        close(fd);
                        snprintf(msg, sizeof msg, "out of memory");
                        break;
                    }
                    st->cl = ncl;
                    st->cap = nc;
                }
                st->cl[st->ncl++] = (root_client){.fd = fd, .rank = -1};
            }
        }
    }
    /* leave the registry first: from here on only this thread owns st */
    for (root_state **pp = &g_roots; *pp; pp = &(*pp)->next)
        if (*pp == st) {
            *pp = st->next;
            break;
        }
    pthread_mutex_unlock(&g_roots_mu);
    /* connections waiting in the backlog get an answer too; later ones are refused */
    for (;;) {
        int fd = accept4(st->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) break;
        if (st->ncl == st->cap) {
            root_client *ncl = realloc(st->cl, (st->cap + 16) * sizeof *ncl);
            if (!ncl) {
                close(fd);
                break;
            }
            st->cl = ncl;
            st->cap += 16;
        }
        st->cl[st->ncl++] = (root_client){.fd = fd, .rank = -1};
    }
    close(st->lfd);
    st->lfd = -1;
    if (ok) {
        /* everyone is here: send each rank the table */
        size_t plen = (size_t)st->nranks * ENTRY_BYTES;
        uint8_t *table = calloc(1, plen);
        if (table) {
            for (int r = 0; r < st->nranks; r++) {
                const root_client *c = &st->cl[st->by_rank[r]];
                uint8_t *e = table + (size_t)r * ENTRY_BYTES;
                put32(e, c->port);
                put32(e + 4, c->pid);
                memcpy(e + 8, c->host, COLL_HOST_MAX);
            }
            int64_t dl = ff_now_ns() + (int64_t)(st->timeout_s * 1e9);
            for (int r = 0; r < st->nranks; r++) reply(st->cl[st->by_rank[r]].fd, 0, table, plen, dl);
            free(table);
        } else {
            ok = false;
            snprintf(msg, sizeof msg, "out of memory");
        }
    }
    if (!ok) ff_warn("ff_coll rendezvous %s failed: %s", st->where, msg);
    for (size_t i = 0; i < st->ncl; i++) {
        root_client *c = &st->cl[i];
        if (c->fd < 0) continue;
        if (!ok)
            reject(c, msg);
        else if (c->rank < 0)
            reject(c, "this rendezvous is complete: all ranks of its communicator have joined, and this process "
                      "is not one of them (a stale id?)");
    }
    root_free(st);
    return NULL;
}

int coll_cpu_make_id(ff_coll_id *id, const ff_coll_options *opt) {
    char host[COLL_HOST_MAX];
    if (pick_host(opt, host)) return ff_error_wrap("ff_coll_get_unique_id");
    root_state *st = ff_calloc(1, sizeof *st);
    if (!st) return -1;
    st->nranks = -1;
    if (getrandom(st->token, COLL_TOKEN_BYTES, 0) != COLL_TOKEN_BYTES) {
        free(st);
        return ff_error_set("ff_coll_get_unique_id", NULL, "getrandom failed: %s", strerror(errno));
    }
    int port = 0;
    st->lfd = listen_on(host, &port);
    if (st->lfd < 0) {
        free(st);
        return ff_error_wrap("ff_coll_get_unique_id");
    }
    st->timeout_s = coll_resolve_timeout(opt);
    snprintf(st->where, sizeof st->where, "%s port %d", host, port);
    char tok[2 * COLL_TOKEN_BYTES + 1];
    coll_hex_encode(st->token, COLL_TOKEN_BYTES, tok);
    snprintf(id->text, sizeof id->text, COLL_ID_PREFIX "cpu/tcp/%s/%d/%s", host, port, tok);
    pthread_once(&g_atfork_once, register_atfork);
    pthread_mutex_lock(&g_roots_mu);
    st->next = g_roots;
    g_roots = st;
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&th, &attr, root_main, st);
    pthread_attr_destroy(&attr);
    if (rc) {
        g_roots = st->next;
        pthread_mutex_unlock(&g_roots_mu);
        root_free(st);
        return ff_error_set("ff_coll_get_unique_id", NULL, "cannot start the rendezvous thread: %s", strerror(rc));
    }
    pthread_mutex_unlock(&g_roots_mu);
    return 0;
}

int coll_cpu_parse_id(const char *text, char *host, int *port, uint8_t token[COLL_TOKEN_BYTES]) {
    const char *p = text + strlen(COLL_ID_PREFIX "cpu/");
    if (strncmp(p, "tcp/", 4) != 0)
        return ff_error_set("unique id", "make ids with ff_coll_get_unique_id", "unknown transport in '%s'", text);
    p += 4;
    const char *slash = strchr(p, '/');
    if (!slash || slash == p || (size_t)(slash - p) >= COLL_HOST_MAX) goto bad;
    memcpy(host, p, (size_t)(slash - p));
    host[slash - p] = '\0';
    char *end;
    long pv = strtol(slash + 1, &end, 10);
    if (end == slash + 1 || *end != '/' || pv <= 0 || pv > 65535) goto bad;
    *port = (int)pv;
    const char *tok = end + 1;
    if (strlen(tok) != 2 * COLL_TOKEN_BYTES || coll_hex_decode(tok, 2 * COLL_TOKEN_BYTES, token)) goto bad;
    struct sockaddr_storage ss;
    socklen_t len;
    if (fill_addr(host, *port, &ss, &len)) goto bad;
    return 0;
bad:
    return ff_error_set("unique id", "pass the id text exactly as ff_coll_get_unique_id made it",
                        "malformed cpu id '%s' (expected ffcoll1/cpu/tcp/HOST/PORT/TOKEN32HEX)", text);
}

/* ---- the mesh --------------------------------------------------------------------- */

typedef struct peer_addr {
    char host[COLL_HOST_MAX];
    int port;
    uint32_t pid;
} peer_addr;

/* Connect every pair of ranks once: lower ranks accept, higher ranks connect. lfd is this
 * rank's listener (closed here). Fills c->cpu.conns. */
static int build_mesh(ff_coll_comm *c, const peer_addr *addrs, int lfd, int64_t deadline) {
    const char *where = "ff_coll_comm_init";
    int n = c->nranks, me = c->rank;
    for (int j = 0; j < n; j++) c->cpu.conns[j] = (coll_conn){.fd = -1, .peer = j};
    int rc = -1;
    for (int j = 0; j < me; j++) {
        int fd = connect_to(addrs[j].host, addrs[j].port, deadline);
        if (fd < 0) {
            ff_error_set(where, "check that the ranks can reach each other (firewall, FF_COLL_IFNAME)",
                         "cannot connect to rank %d at %s port %d: %s", j, addrs[j].host, addrs[j].port,
                         strerror(errno));
            goto out;
        }
        c->cpu.conns[j].fd = fd;
        uint8_t m[MESH_BYTES] = {0};
        put32(m, MESH_MAGIC);
        memcpy(m + 4, c->cpu.token, COLL_TOKEN_BYTES);
        put32(m + 20, (uint32_t)me);
        put32(m + 24, (uint32_t)j);
        put32(m + 28, (uint32_t)n);
        if (coll_write_all(fd, m, sizeof m, deadline)) {
            ff_error_set(where, NULL, "cannot greet rank %d: %s", j, io_what(errno));
            goto out;
        }
    }
    for (int want = n - 1 - me; want > 0;) {
        int w = wait_fd(lfd, POLLIN, deadline);
        if (w <= 0) {
            char missing[256] = "";
            size_t len = 0;
            for (int j = me + 1; j < n && len < sizeof missing - 16; j++)
                if (c->cpu.conns[j].fd < 0) len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d", len ? ", " : "", j);
            ff_error_set(where, "those ranks may have died or be unable to reach this host",
                         "timed out waiting for rank(s) %s to connect", missing);
            goto out;
        }
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) continue;
        uint8_t m[MESH_BYTES];
        int64_t dl = ff_now_ns() + 5000000000LL < deadline ? ff_now_ns() + 5000000000LL : deadline;
        if (coll_read_all(fd, m, sizeof m, dl) || get32(m) != MESH_MAGIC ||
            memcmp(m + 4, c->cpu.token, COLL_TOKEN_BYTES) != 0 || get32(m + 24) != (uint32_t)me ||
            get32(m + 28) != (uint32_t)n) {
            ff_warn("ff_coll: rank %d refused a connection that is not from this communicator", me);
            close(fd);
            continue;
        }
        int from = (int)get32(m + 20);
        if (from <= me || from >= n || c->cpu.conns[from].fd >= 0) {
            ff_warn("ff_coll: rank %d refused a duplicate or misdirected connection from rank %d", me, from);
            close(fd);
            continue;
        }
        uint8_t ack[8];
        put32(ack, ACK_MAGIC);
        put32(ack + 4, (uint32_t)me);
        if (coll_write_all(fd, ack, sizeof ack, deadline)) {
            close(fd);
            ff_error_set(where, NULL, "cannot answer rank %d: %s", from, io_what(errno));
            goto out;
        }
        peer_opts(fd);
        c->cpu.conns[from].fd = fd;
        want--;
    }
    for (int j = 0; j < me; j++) {
        uint8_t ack[8];
        if (coll_read_all(c->cpu.conns[j].fd, ack, sizeof ack, deadline) || get32(ack) != ACK_MAGIC ||
            get32(ack + 4) != (uint32_t)j) {
            ff_error_set(where, "that rank may have died or refused this rank's token", "no answer from rank %d: %s",
                         j, errno ? io_what(errno) : "bad answer");
            goto out;
        }
    }
    rc = coll_shm_setup(c, deadline);
out:
    close(lfd);
    if (rc)
        for (int j = 0; j < n; j++) {
            coll_shm_free(&c->cpu.conns[j]);
            if (c->cpu.conns[j].fd >= 0) {
                close(c->cpu.conns[j].fd);
                c->cpu.conns[j].fd = -1;
            }
        }
    return rc;
}

/* Tuning knobs for experiments (docs/collectives.md); every rank must see the same values,
 * and a difference shows up as a mismatched call. */
static size_t env_size(const char *name, size_t lo, size_t hi, size_t dflt) {
    const char *s = getenv(name);
    long long v = s ? strtoll(s, NULL, 10) : -1;
    return v >= (long long)lo && v <= (long long)hi && v % 64 == 0 ? (size_t)v : dflt;
}

static void set_tuning(coll_cpu *cpu) {
    cpu->slice = env_size("FF_COLL_SLICE_BYTES", 4096, 64u << 20, 256u * 1024);
    cpu->direct_max = env_size("FF_COLL_DIRECT_MAX", 0, (size_t)1 << 40, 256u * 1024);
    cpu->star_max = env_size("FF_COLL_STAR_MAX", 0, (size_t)1 << 40, 1024u * 1024);
}

int coll_cpu_comm_init(ff_coll_comm *c, const ff_coll_id *id) {
    const char *where = "ff_coll_comm_init";
    char host[COLL_HOST_MAX];
    int port;
    if (coll_cpu_parse_id(id->text, host, &port, c->cpu.token)) return ff_error_wrap("%s", where);
    set_tuning(&c->cpu);
    c->cpu.conns = ff_calloc((size_t)c->nranks, sizeof *c->cpu.conns);
    if (!c->cpu.conns || coll_work_alloc(c)) return -1;
    for (int j = 0; j < c->nranks; j++) c->cpu.conns[j] = (coll_conn){.fd = -1, .peer = j};
    /* The rendezvous gives up after its own timeout and then names the missing ranks: wait a
     * little longer than it so that message arrives. */
    int64_t deadline = ff_now_ns() + (int64_t)((c->timeout_s + 5.0) * 1e9);
    int fd = connect_to(host, port, deadline);
    if (fd < 0)
        return ff_error_set(where,
                            "the process that made the id must stay alive until every rank joined; an id serves "
                            "one communicator: make a new one",
                            "cannot reach the rendezvous at %s port %d: %s", host, port, strerror(errno));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    addr_text(&ss, c->cpu.local_host, NULL);
    c->cpu.family = ss.ss_family;
    int lport = 0;
    int lfd = listen_on(c->cpu.local_host, &lport);
    if (lfd < 0) {
        close(fd);
        return ff_error_wrap("%s", where);
    }
    uint8_t hello[HELLO_BYTES] = {0};
    put32(hello, HELLO_MAGIC);
    put32(hello + 4, PROTO_VERSION);
    memcpy(hello + 8, c->cpu.token, COLL_TOKEN_BYTES);
    put32(hello + 24, (uint32_t)c->nranks);
    put32(hello + 28, (uint32_t)c->rank);
    put32(hello + 32, (uint32_t)lport);
    put32(hello + 36, (uint32_t)getpid());
    memcpy(hello + 40, c->cpu.local_host, strlen(c->cpu.local_host));
    uint8_t rh[12];
    int rc = -1;
    peer_addr *addrs = NULL;
    char *payload = NULL;
    if (coll_write_all(fd, hello, sizeof hello, deadline) || coll_read_all(fd, rh, sizeof rh, deadline)) {
        if (errno == ETIMEDOUT)
            ff_error_set(where, "check that all nranks ranks call comm_init with this id",
                         "rendezvous at %s port %d: timed out waiting for the other ranks to join", host, port);
        else
            ff_error_set(where, "it failed or finished without this rank: see the other ranks' errors",
                         "the rendezvous at %s port %d closed the connection (%s)", host, port, io_what(errno));
        goto out;
    }
    uint32_t status = get32(rh + 4), plen = get32(rh + 8);
    if (get32(rh) != REPLY_MAGIC || plen > (1u << 24)) {
        ff_error_set(where, "the id may be stale: another program now uses that port",
                     "rendezvous at %s port %d answered with something that is not a fuseflow reply", host, port);
        goto out;
    }
    payload = ff_malloc((size_t)plen + 1);
    if (!payload) goto out;
    if (coll_read_all(fd, payload, plen, deadline)) {
        ff_error_set(where, NULL, "rendezvous at %s port %d: %s", host, port, io_what(errno));
        goto out;
    }
    payload[plen] = '\0';
    if (status != 0) {
        ff_error_set(where, NULL, "rendezvous at %s port %d refused: %s", host, port, payload);
        goto out;
    }
    if (plen != (uint32_t)c->nranks * ENTRY_BYTES) {
        ff_error_set(where, NULL, "rendezvous sent a table of %u bytes for %d ranks", plen, c->nranks);
        goto out;
    }
    addrs = ff_calloc((size_t)c->nranks, sizeof *addrs);
    if (!addrs) goto out;
    for (int r = 0; r < c->nranks; r++) {
        const uint8_t *e = (const uint8_t *)payload + (size_t)r * ENTRY_BYTES;
        addrs[r].port = (int)get32(e);
        addrs[r].pid = get32(e + 4);
        memcpy(addrs[r].host, e + 8, COLL_HOST_MAX);
        addrs[r].host[COLL_HOST_MAX - 1] = '\0';
    }
    close(fd);
    fd = -1;
    rc = build_mesh(c, addrs, lfd, deadline);
    lfd = -1;
out:
    if (fd >= 0) close(fd);
    if (lfd >= 0) close(lfd);
    free(addrs);
    free(payload);
    return rc;
}

/* ---- split ------------------------------------------------------------------------ */

#define SPLIT_REC 96 /* color, key, port, pid, token[16], host[64] */

typedef struct split_member {
    int parent_rank, key;
} split_member;

static int member_cmp(const void *a, const void *b) {
    const split_member *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return x->parent_rank < y->parent_rank ? -1 : x->parent_rank > y->parent_rank;
}

int coll_cpu_comm_split(ff_coll_comm *c, int color, int key, ff_coll_comm **out) {
    const char *where = "ff_coll_comm_split";
    *out = NULL;
    int n = c->nranks;
    uint8_t mine[SPLIT_REC] = {0};
    uint8_t *all = ff_malloc((size_t)n * SPLIT_REC);
    if (!all) return -1;
    int lfd = -1, lport = 0;
    if (color != FF_COLL_SPLIT_NOCOLOR) {
        lfd = listen_on(c->cpu.local_host, &lport);
        if (lfd < 0) {
            free(all);
            return ff_error_wrap("%s", where);
        }
        if (getrandom(mine + 16, COLL_TOKEN_BYTES, 0) != COLL_TOKEN_BYTES) memset(mine + 16, 0x5a, COLL_TOKEN_BYTES);
    }
    put32(mine, (uint32_t)color);
    put32(mine + 4, (uint32_t)key);
    put32(mine + 8, (uint32_t)lport);
    put32(mine + 12, (uint32_t)getpid());
    memcpy(mine + 32, c->cpu.local_host, strlen(c->cpu.local_host));
    coll_call call = {.op = OP_SPLIT, .sendbuf = mine, .recvbuf = all, .count = SPLIT_REC, .dtype = FF_DTYPE_U8};
    if (coll_cpu_run(c, &call)) {
        /* the parent's connections are mid-call: it is broken too */
        ff_error_wrap("%s", where);
        coll_break(c);
        if (lfd >= 0) close(lfd);
        free(all);
        return -1;
    }
    if (color == FF_COLL_SPLIT_NOCOLOR) {
        free(all);
        return 0;
    }
    split_member *mem = ff_malloc((size_t)n * sizeof *mem);
    peer_addr *addrs = ff_calloc((size_t)n, sizeof *addrs);
    int m = 0, rc = -1, newrank = -1;
    if (!mem || !addrs) goto out;
    for (int r = 0; r < n; r++) {
        const uint8_t *rec = all + (size_t)r * SPLIT_REC;
        if ((int)get32(rec) == color) mem[m++] = (split_member){r, (int)get32(rec + 4)};
    }
    qsort(mem, (size_t)m, sizeof *mem, member_cmp);
    for (int i = 0; i < m; i++) {
        const uint8_t *rec = all + (size_t)mem[i].parent_rank * SPLIT_REC;
        addrs[i].port = (int)get32(rec + 8);
        addrs[i].pid = get32(rec + 12);
        memcpy(addrs[i].host, rec + 32, COLL_HOST_MAX);
        addrs[i].host[COLL_HOST_MAX - 1] = '\0';
        if (mem[i].parent_rank == c->rank) newrank = i;
    }
    ff_coll_options o = {.timeout_s = c->timeout_s, .algo = c->algo};
    ff_coll_comm *child = coll_comm_alloc(COLL_BACKEND_CPU, m, newrank, &o);
    if (!child) goto out;
    memcpy(child->cpu.token, all + (size_t)mem[0].parent_rank * SPLIT_REC + 16, COLL_TOKEN_BYTES);
    memcpy(child->cpu.local_host, c->cpu.local_host, COLL_HOST_MAX);
    child->cpu.family = c->cpu.family;
    child->cpu.slice = c->cpu.slice;
    child->cpu.direct_max = c->cpu.direct_max;
    child->cpu.star_max = c->cpu.star_max;
    child->cpu.conns = ff_calloc((size_t)m, sizeof *child->cpu.conns);
    if (!child->cpu.conns || coll_work_alloc(child)) {
        free(child->cpu.conns);
        coll_comm_free_shell(child);
        goto out;
    }
    int64_t deadline = ff_now_ns() + (int64_t)(c->timeout_s * 1e9);
    rc = build_mesh(child, addrs, lfd, deadline);
    lfd = -1;
    if (rc) {
        ff_error_wrap("%s (color %d)", where, color);
        coll_cpu_comm_free(child);
        coll_work_free(child);
        coll_comm_free_shell(child);
        goto out;
    }
    *out = child;
out:
    if (lfd >= 0) close(lfd);
    free(all);
    free(mem);
    free(addrs);
    return rc;
}

/* ---- goodbye and abort ------------------------------------------------------------- */

static void send_control(coll_conn *cn, int type, const char *text, int64_t deadline) {
    size_t tl = text ? strlen(text) : 0;
    if (tl > COLL_ABORT_MAX) tl = COLL_ABORT_MAX;
    coll_hdr h = {.magic = COLL_FRAME_MAGIC, .type = (uint8_t)type, .len = (uint32_t)tl};
    uint8_t buf[COLL_HDR_BYTES + COLL_ABORT_MAX];
    coll_hdr_encode(&h, buf);
    if (tl) memcpy(buf + COLL_HDR_BYTES, text, tl);
    coll_write_all(cn->fd, buf, COLL_HDR_BYTES + tl, deadline);
}

void coll_cpu_notify_abort(ff_coll_comm *c, const char *reason) {
    if (!c->cpu.conns) return;
    int64_t deadline = ff_now_ns() + 1000000000; /* 1 s for everyone together */
    char text[COLL_ABORT_MAX];
    snprintf(text, sizeof text, "%s", reason && *reason ? reason : "no reason given");
    for (int j = 0; j < c->nranks; j++) {
        coll_conn *cn = &c->cpu.conns[j];
        if (cn->fd < 0 || cn->state == PEER_LEFT || cn->state == PEER_DEAD || cn->state == PEER_ABORTED) continue;
        bool boundary = true;
        if (cn->tx_frame_left) { /* finish the frame we were sending, so the notice parses */
            static const uint8_t zeros[4096];
            size_t left = cn->tx_frame_left;
            while (left && boundary) {
                size_t k = left < sizeof zeros ? left : sizeof zeros;
                if (coll_write_all(cn->fd, zeros, k, deadline))
                    boundary = false;
                else
                    left -= k;
            }
            cn->tx_frame_left = 0;
        }
        if (boundary) send_control(cn, FRAME_ABORT, text, deadline);
        shutdown(cn->fd, SHUT_WR);
    }
}

/* A broken communicator's last words (ABORT notices) must leave before close(): closing
 * with unread input resets the connection and drops whatever is still queued to send.
 * Wait, within a bound, until every queue is empty, reading (and dropping) input. */
static void flush_before_close(ff_coll_comm *c, int64_t deadline) {
    uint8_t sink[4096];
    for (;;) {
        bool pending = false;
        for (int j = 0; j < c->nranks; j++) {
            coll_conn *cn = &c->cpu.conns[j];
            if (cn->fd < 0) continue;
            while (recv(cn->fd, sink, sizeof sink, MSG_DONTWAIT) > 0) {
            }
            if (cn->state != PEER_LIVE) continue; /* left, dead or aborted: nobody reads */
            /* a reset connection keeps a stale SIOCOUTQ: only open ones can still deliver */
            struct tcp_info ti;
            socklen_t tl = sizeof ti;
            if (getsockopt(cn->fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) == 0 && ti.tcpi_state == TCP_CLOSE) continue;
            int q = 0;
            if (ioctl(cn->fd, SIOCOUTQ, &q) == 0 && q > 0) pending = true;
        }
        if (!pending || ff_now_ns() > deadline) return;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

void coll_cpu_comm_free(ff_coll_comm *c) {
    if (c->cpu.conns) {
        int64_t deadline = ff_now_ns() + 1000000000;
        if (c->error) flush_before_close(c, deadline);
        for (int j = 0; j < c->nranks; j++) {
            coll_conn *cn = &c->cpu.conns[j];
            if (cn->fd < 0) continue;
            if (!c->error && cn->state != PEER_LEFT && cn->tx_frame_left == 0) {
                send_control(cn, FRAME_BYE, NULL, deadline);
                shutdown(cn->fd, SHUT_WR);
            }
            /* Read what is left so close() does not answer with a reset that could
             * destroy our goodbye before the peer reads it. */
            uint8_t sink[4096];
            while (recv(cn->fd, sink, sizeof sink, MSG_DONTWAIT) > 0) {
            }
            close(cn->fd);
            cn->fd = -1;
            coll_shm_free(cn);
            free(cn->abort_reason);
            cn->abort_reason = NULL;
        }
        free(c->cpu.conns);
        c->cpu.conns = NULL;
    }
    free(c->cpu.scratch);
    c->cpu.scratch = NULL;
    c->cpu.scratch_cap = 0;
    free(c->cpu.pend); /* posted sends not done are dropped (ff_coll_sends_done waits for them) */
    free(c->cpu.run);
    c->cpu.pend = c->cpu.run = NULL;
    c->cpu.n_pend = c->cpu.cap_pend = c->cpu.cap_run = 0;
}
