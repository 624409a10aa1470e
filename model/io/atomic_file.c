/* Atomic files and folders for checkpoints (see include/fuseflow/modelio.h). */
#include "fuseflow/modelio.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuseflow/util.h"

static void fsync_parent(const char *path) {
    char d[FF_PATH_MAX];
    snprintf(d, sizeof d, "%s", path);
    char *slash = strrchr(d, '/');
    if (slash == d)
        d[1] = '\0';
    else if (slash)
        *slash = '\0';
    else
        snprintf(d, sizeof d, ".");
    int fd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd); /* best effort: some filesystems refuse fsync on folders */
        close(fd);
    }
}

int ff_atomic_file_begin(ff_atomic_file *f, const char *path) {
    f->fd = -1;
    if (strlen(path) >= sizeof f->path) return ff_error_set(path, NULL, "path too long");
    snprintf(f->path, sizeof f->path, "%s", path);
    snprintf(f->tmp, sizeof f->tmp, "%s.tmp.%d", path, (int)getpid());
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) return ff_error_set(f->tmp, "check that the folder exists and is writable", "cannot create: %s", strerror(errno));
    return 0;
}

int ff_atomic_file_write(ff_atomic_file *f, const void *data, size_t len) {
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(f->fd, p, len);
        if (w < 0) {
            if (errno == EINTR) continue;
            return ff_error_set(f->tmp, errno == ENOSPC ? "the disk is full" : NULL, "write failed: %s", strerror(errno));
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

void ff_atomic_file_abort(ff_atomic_file *f) {
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    unlink(f->tmp);
}

int ff_atomic_file_commit(ff_atomic_file *f) {
    if (fsync(f->fd) != 0) {
        int e = errno;
        ff_atomic_file_abort(f);
        return ff_error_set(f->tmp, NULL, "fsync failed: %s", strerror(e));
    }
    int rc = close(f->fd);
    f->fd = -1;
    if (rc != 0) {
        int e = errno;
        unlink(f->tmp);
        return ff_error_set(f->tmp, NULL, "close failed: %s", strerror(e));
    }
    if (rename(f->tmp, f->path) != 0) {
        int e = errno;
        unlink(f->tmp);
        return ff_error_set(f->path, NULL, "rename from %s failed: %s", f->tmp, strerror(e));
    }
    fsync_parent(f->path);
    return 0;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)ftw;
    int rc = (flag == FTW_DP) ? rmdir(path) : unlink(path);
    if (rc != 0 && errno != ENOENT) {
        ff_error_set(path, NULL, "cannot remove: %s", strerror(errno));
        return -1;
    }
    return 0;
}

int ff_remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : ff_error_set(path, NULL, "cannot stat: %s", strerror(errno));
    return nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS) == 0 ? 0 : -1;
}

int ff_atomic_dir_begin(const char *dir, char *tmp, size_t cap) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--; /* "out/" and "out" are the same folder */
    if (n + 32 >= cap) return ff_error_set(dir, NULL, "path too long");
    snprintf(tmp, cap, "%.*s.tmp-%d", (int)n, dir, (int)getpid());
    if (ff_remove_tree(tmp) != 0) return -1;
    char parent[FF_PATH_MAX];
    snprintf(parent, sizeof parent, "%.*s", (int)n, dir);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = '\0';
        if (ff_mkdirs(parent) != 0) return -1;
    }
    if (mkdir(tmp, 0755) != 0) return ff_error_set(tmp, "check that the folder is writable", "cannot create: %s", strerror(errno));
    return 0;
}

void ff_atomic_dir_abort(const char *tmp) {
    char saved[2048];
    snprintf(saved, sizeof saved, "%s", ff_error_message()); /* keep the error that made us abort */
    ff_remove_tree(tmp);
    ff_error_set(NULL, NULL, "%s", saved);
}

int ff_atomic_dir_commit(const char *tmp, const char *dir_in) {
    char dir[FF_PATH_MAX];
    size_t n = strlen(dir_in);
    while (n > 1 && dir_in[n - 1] == '/') n--;
    snprintf(dir, sizeof dir, "%.*s", (int)n, dir_in);
    /* make the files durable before the folder appears */
    int tfd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (tfd >= 0) {
        fsync(tfd);
        close(tfd);
    }
    if (rename(tmp, dir) == 0) { /* DIR did not exist, or was an empty folder */
        fsync_parent(dir);
        return 0;
    }
    if (errno != ENOTEMPTY && errno != EEXIST) {
        int e = errno;
        ff_atomic_dir_abort(tmp);
        return ff_error_set(dir, NULL, "cannot rename %s into place: %s", tmp, strerror(e));
    }
    struct stat st;
    if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        ff_atomic_dir_abort(tmp);
        return ff_error_set(dir, "remove it or choose another path", "exists and is not a folder");
    }
    /* swap the two folders in one step, then remove the old one (now under tmp) */
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) == 0) {
        fsync_parent(dir);
        return ff_remove_tree(tmp);
    }
    /* filesystems without RENAME_EXCHANGE: move the old folder aside first. DIR is briefly
     * absent, but never half written. */
    char old[FF_PATH_MAX];
    snprintf(old, sizeof old, "%s.old-%d", dir, (int)getpid());
    ff_remove_tree(old);
    if (rename(dir, old) != 0) {
        int e = errno;
        ff_atomic_dir_abort(tmp);
        return ff_error_set(dir, NULL, "cannot replace the folder: %s", strerror(e));
    }
    if (rename(tmp, dir) != 0) {
        int e = errno;
        rename(old, dir); /* put the old folder back */
        ff_atomic_dir_abort(tmp);
        return ff_error_set(dir, NULL, "cannot replace the folder: %s", strerror(e));
    }
    fsync_parent(dir);
    return ff_remove_tree(old);
}
