/* Private to ff_modelio: files and folders that appear under their final name only when
 * complete. A file is written to PATH.tmp.PID, fsync'd and renamed over PATH; a folder is
 * filled under DIR.tmp-PID and then swapped in (renameat2 RENAME_EXCHANGE where the
 * filesystem has it), so a reader sees the old folder or the new one, never a half. */
#ifndef FF_MODELIO_ATOMIC_FILE_H
#define FF_MODELIO_ATOMIC_FILE_H

#include <stddef.h>

typedef struct ff_atomic_file {
    int fd;
    char path[4096];
    char tmp[4096 + 32];
} ff_atomic_file;

int ff_atomic_file_begin(ff_atomic_file *f, const char *path);
int ff_atomic_file_write(ff_atomic_file *f, const void *data, size_t len);
/* fsync, close, rename, fsync the folder. On failure the temporary file is removed. */
int ff_atomic_file_commit(ff_atomic_file *f);
void ff_atomic_file_abort(ff_atomic_file *f);

/* Make the staging folder for DIR ("DIR.tmp-PID", emptied first) and write its path to tmp
 * (cap bytes). 0 or -1 + error. */
int ff_atomic_dir_begin(const char *dir, char *tmp, size_t cap);
/* Put the staged folder in place of DIR (which may exist: it is replaced as a whole, and the
 * old contents removed). 0 or -1 + error (the staging folder is then removed). */
int ff_atomic_dir_commit(const char *tmp, const char *dir);
/* Remove the staging folder and everything in it. */
void ff_atomic_dir_abort(const char *tmp);
/* rm -r PATH (no symlinks followed). 0 or -1 + error. */
int ff_remove_tree(const char *path);

#endif
