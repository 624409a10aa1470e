/* The cpu backend's same-host fast path: for ranks that can map the same memory, each
 * direction of a connection becomes a byte FIFO in a shared-memory segment, so frames move
 * with two memcpys instead of a trip through the kernel's socket stack. The frames (and so
 * every check) are the same; the TCP connection stays, carrying only control frames: KICK
 * (wake up, I moved bytes while you were waiting), BYE and ABORT, and its end of stream
 * still tells that the peer died.
 *
 * Setup, after the mesh: the lower rank of each pair creates a segment (shm_open with a
 * random name, posix_fallocate so a full /dev/shm fails here rather than with SIGBUS
 * later), and offers its name and a random nonce over TCP; the higher rank maps it and
 * checks the nonce, which proves both see the same memory (same host, same /dev/shm);
 * then the name is unlinked. Anything failing leaves that pair on TCP. FF_COLL_SHM=0
 * turns the fast path off; FF_COLL_SHM_BYTES sets each FIFO's size.
 *
 * Waking: a reader that finds its FIFO empty raises reader_waiting, checks again, and
 * sleeps in poll() on the socket; a writer that publishes bytes and sees the flag clears it
 * and sends a KICK. Both sides use sequentially consistent atomics, so one of them always
 * sees the other (no lost wake-up). The same for a writer waiting for room. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "workers/coll/coll_internal.h"

#define SHM_MAGIC 0x4d48534c4c4f4346ull /* "FCOLLSHM" */
#define OFFER_MAGIC 0x4f434646u         /* "FFCO" */
#define ANSWER_MAGIC 0x59434646u        /* "FFCY" */
#define OFFER_BYTES 96
#define NAME_MAX_ 64
#define SHM_BYTES_MIN 4096LL        /* FF_COLL_SHM_BYTES: a page ... */
#define SHM_BYTES_MAX (256LL << 20) /* ... to 256 MiB per FIFO (two per pair of ranks) */

struct coll_fifo {
    _Atomic uint64_t head; /* bytes consumed */
    char pad0[56];
    _Atomic uint64_t tail; /* bytes produced */
    char pad1[56];
    _Atomic uint32_t reader_waiting;
    char pad2[60];
    _Atomic uint32_t writer_waiting;
    char pad3[60];
    uint8_t data[]; /* cap bytes */
};

typedef struct shm_head {
    uint64_t magic, nonce, cap;
    char pad[40];
} shm_head;

static size_t seg_bytes(size_t cap) { return sizeof(shm_head) + 2 * (sizeof(coll_fifo) + cap); }
static coll_fifo *fifo_at(void *seg, size_t cap, int i) {
    return (coll_fifo *)((uint8_t *)seg + sizeof(shm_head) + (size_t)i * (sizeof(coll_fifo) + cap));
}

/* Each FIFO's bytes: FF_COLL_SHM_BYTES rounded up to pages, else the default. 0, or -1 +
 * error for a value that is no byte count in range (a typo must not fall back silently). */
static int fifo_cap(int nranks, size_t *out) {
    const char *e = getenv("FF_COLL_SHM_BYTES");
    if (e && *e) {
        char *end;
        errno = 0;
        long long v = strtoll(e, &end, 10);
        if (errno || end == e || *end || v < SHM_BYTES_MIN || v > SHM_BYTES_MAX)
            return ff_error_set("FF_COLL_SHM_BYTES", "unset it for the default (1 MiB, less above 16 ranks on a host)",
                                "'%s' is not a byte count in [%lld, %lld]", e, (long long)SHM_BYTES_MIN,
                                (long long)SHM_BYTES_MAX);
        *out = ((size_t)v + 4095) & ~(size_t)4095;
        return 0;
    }
    /* 1 MiB per direction, less when many ranks share the host (16 MiB per process) */
    size_t cap = (16u << 20) / (size_t)(nranks > 1 ? nranks - 1 : 1);
    if (cap > (1u << 20)) cap = 1u << 20;
    if (cap < (64u << 10)) cap = 64u << 10;
    *out = cap & ~(size_t)4095;
    return 0;
}

static bool shm_enabled(void) {
    const char *e = getenv("FF_COLL_SHM");
    return !(e && (!strcmp(e, "0") || !strcmp(e, "off") || !strcmp(e, "no")));
}

/* Create a segment; NULL when this host cannot (then the pair stays on TCP). */
static void *create_segment(size_t cap, char name[NAME_MAX_], uint64_t *nonce) {
    uint64_t rnd[2];
    if (getrandom(rnd, sizeof rnd, 0) != sizeof rnd) return NULL;
    snprintf(name, NAME_MAX_, "/ffcoll-%d-%016llx", (int)getpid(), (unsigned long long)rnd[0]);
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return NULL;
    size_t len = seg_bytes(cap);
    void *seg = MAP_FAILED;
    if (posix_fallocate(fd, 0, (off_t)len) == 0) seg = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (seg == MAP_FAILED) {
        shm_unlink(name);
        return NULL;
    }
    shm_head *h = seg;
    h->magic = SHM_MAGIC;
    h->nonce = *nonce = rnd[1];
    h->cap = cap;
    return seg;
}

static void *open_segment(const char *name, size_t cap, uint64_t nonce) {
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) return NULL;
    size_t len = seg_bytes(cap);
    struct stat st;
    void *seg = MAP_FAILED;
    if (fstat(fd, &st) == 0 && (size_t)st.st_size == len)
        seg = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (seg == MAP_FAILED) return NULL;
    const shm_head *h = seg;
    if (h->magic != SHM_MAGIC || h->nonce != nonce || h->cap != cap) { /* not the same memory */
        munmap(seg, len);
        return NULL;
    }
    return seg;
}

static void attach(coll_conn *cn, void *seg, size_t cap, bool lower) {
    cn->shm = seg;
    cn->shm_len = seg_bytes(cap);
    cn->fifo_cap = cap;
    /* fifo 0 carries lower -> higher rank, fifo 1 the other way */
    cn->tx_fifo = fifo_at(seg, cap, lower ? 0 : 1);
    cn->rx_fifo = fifo_at(seg, cap, lower ? 1 : 0);
}

int coll_shm_setup(ff_coll_comm *c, int64_t deadline) {
    const char *where = "ff_coll_comm_init (shared memory)";
    int n = c->nranks, me = c->rank;
    bool on = shm_enabled();
    size_t cap = 0;
    if (fifo_cap(n, &cap) != 0) return ff_error_wrap("%s", where);
    char (*names)[NAME_MAX_] = ff_calloc((size_t)n, NAME_MAX_);
    if (!names) return -1;
    int rc = -1;
    /* 1. offer a segment to every higher rank */
    for (int j = me + 1; j < n; j++) {
        coll_conn *cn = &c->cpu.conns[j];
        uint8_t m[OFFER_BYTES] = {0};
        uint64_t nonce = 0;
        void *seg = on ? create_segment(cap, names[j], &nonce) : NULL;
        put32(m, OFFER_MAGIC);
        put32(m + 4, seg != NULL);
        put64(m + 8, cap);
        put64(m + 16, nonce);
        memcpy(m + 24, names[j], strlen(names[j]));
        if (seg) attach(cn, seg, cap, true);
        if (coll_write_all(cn->fd, m, sizeof m, deadline)) {
            ff_error_set(where, NULL, "cannot send to rank %d: %s", j, strerror(errno));
            goto out;
        }
    }
    /* 2. answer the offers of lower ranks */
    for (int j = 0; j < me; j++) {
        coll_conn *cn = &c->cpu.conns[j];
        uint8_t m[OFFER_BYTES], a[8];
        if (coll_read_all(cn->fd, m, sizeof m, deadline) || get32(m) != OFFER_MAGIC) {
            ff_error_set(where, NULL, "no offer from rank %d: %s", j, errno ? strerror(errno) : "bad message");
            goto out;
        }
        char name[NAME_MAX_ + 1];
        memcpy(name, m + 24, NAME_MAX_);
        name[NAME_MAX_] = '\0';
        void *seg = on && get32(m + 4) ? open_segment(name, (size_t)get64(m + 8), get64(m + 16)) : NULL;
        if (seg) attach(cn, seg, (size_t)get64(m + 8), false);
        put32(a, ANSWER_MAGIC);
        put32(a + 4, seg != NULL);
        if (coll_write_all(cn->fd, a, sizeof a, deadline)) {
            ff_error_set(where, NULL, "cannot answer rank %d: %s", j, strerror(errno));
            goto out;
        }
    }
    /* 3. collect the answers; the name is no longer needed either way */
    for (int j = me + 1; j < n; j++) {
        coll_conn *cn = &c->cpu.conns[j];
        uint8_t a[8];
        int io = coll_read_all(cn->fd, a, sizeof a, deadline);
        if (names[j][0]) shm_unlink(names[j]);
        if (io || get32(a) != ANSWER_MAGIC) {
            ff_error_set(where, NULL, "no answer from rank %d: %s", j, errno ? strerror(errno) : "bad message");
            goto out;
        }
        if (!get32(a + 4)) coll_shm_free(cn); /* rank j cannot map it: TCP for this pair */
    }
    rc = 0;
    int shared = 0;
    for (int j = 0; j < n; j++) shared += c->cpu.conns[j].tx_fifo != NULL;
    ff_debug("ff_coll: rank %d of %d listens on %s; %d peer(s) over shared memory (%zu-byte FIFOs), %d over TCP",
             me, n, c->cpu.local_host, shared, cap, n - 1 - shared);
out:
    if (rc)
        for (int j = me + 1; j < n; j++)
            if (names[j][0]) shm_unlink(names[j]);
    free(names);
    return rc;
}

void coll_shm_free(coll_conn *cn) {
    if (cn->shm) munmap(cn->shm, cn->shm_len);
    cn->shm = NULL;
    cn->tx_fifo = cn->rx_fifo = NULL;
}

/* Wake the peer: a KICK control frame on the socket. When the socket is full of earlier
 * kicks the peer is awake anyway. */
static void kick(coll_conn *cn) {
    coll_hdr h = {.magic = COLL_FRAME_MAGIC, .type = FRAME_KICK};
    uint8_t b[COLL_HDR_BYTES];
    coll_hdr_encode(&h, b);
    ssize_t r = send(cn->fd, b, sizeof b, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r > 0 && r < (ssize_t)sizeof b) /* never leave half a frame on the socket */
        coll_write_all(cn->fd, b + r, sizeof b - (size_t)r, ff_now_ns() + 100000000);
}

ssize_t coll_shm_write(coll_conn *cn, const struct iovec *iov, int niov) {
    coll_fifo *f = cn->tx_fifo;
    size_t cap = cn->fifo_cap;
    uint64_t tail = atomic_load_explicit(&f->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&f->head, memory_order_acquire);
    if (tail - head == cap) {
        atomic_store(&f->writer_waiting, 1);
        head = atomic_load(&f->head);
        if (tail - head == cap) return 0;
        atomic_store(&f->writer_waiting, 0);
    }
    size_t room = cap - (size_t)(tail - head), moved = 0;
    for (int i = 0; i < niov && room; i++) {
        const uint8_t *src = iov[i].iov_base;
        size_t len = iov[i].iov_len < room ? iov[i].iov_len : room;
        size_t pos = (size_t)((tail + moved) % cap), first = cap - pos < len ? cap - pos : len;
        memcpy(f->data + pos, src, first);
        memcpy(f->data, src + first, len - first);
        moved += len;
        room -= len;
    }
    atomic_store(&f->tail, tail + moved); /* seq_cst: pairs with the reader's flag */
    if (atomic_load(&f->reader_waiting) && atomic_exchange(&f->reader_waiting, 0)) kick(cn);
    return (ssize_t)moved;
}

ssize_t coll_shm_read(coll_conn *cn, uint8_t *buf, size_t len) {
    coll_fifo *f = cn->rx_fifo;
    size_t cap = cn->fifo_cap;
    uint64_t head = atomic_load_explicit(&f->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&f->tail, memory_order_acquire);
    if (tail == head) {
        atomic_store(&f->reader_waiting, 1);
        tail = atomic_load(&f->tail);
        if (tail == head) return 0;
        atomic_store(&f->reader_waiting, 0);
    }
    size_t avail = (size_t)(tail - head), n = len < avail ? len : avail;
    size_t pos = (size_t)(head % cap), first = cap - pos < n ? cap - pos : n;
    memcpy(buf, f->data + pos, first);
    memcpy(buf + first, f->data, n - first);
    atomic_store(&f->head, head + n);
    if (atomic_load(&f->writer_waiting) && atomic_exchange(&f->writer_waiting, 0)) kick(cn);
    return (ssize_t)n;
}

bool coll_shm_rx_empty(const coll_conn *cn) {
    return atomic_load(&cn->rx_fifo->tail) == atomic_load(&cn->rx_fifo->head);
}
