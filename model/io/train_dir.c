/* The run folder and the data order shared by `fuseflow sft` and `fuseflow run` (see
 * include/fuseflow/train_dir.h).
 *
 * Not here: the contents of a checkpoint, when to save, what a metrics line holds. */
#include "fuseflow/train_dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuseflow/error.h"
#include "fuseflow/modelio.h"
#include "fuseflow/tfevents.h"
#include "fuseflow/util.h"

/* ---- the data order ------------------------------------------------------------------------ */

static void permute(ff_data_order *o) {
    for (int64_t i = 0; i < o->n; i++) o->perm[i] = i;
    if (!o->shuffle) return;
    ff_rng r;
    ff_rng_seed(&r, o->seed * FF_SPLITMIX64_GAMMA + (uint64_t)o->epoch);
    for (int64_t i = o->n - 1; i > 0; i--) { /* Fisher-Yates */
        int64_t j = (int64_t)ff_rng_below(&r, (uint64_t)i + 1), t = o->perm[i];
        o->perm[i] = o->perm[j];
        o->perm[j] = t;
    }
}

int ff_data_order_init(ff_data_order *o, int64_t n, uint64_t seed, bool shuffle, int64_t epoch, int64_t cursor) {
    memset(o, 0, sizeof *o);
    if (n <= 0 || epoch < 0 || cursor < 0 || cursor > n)
        return ff_error_set("data order", NULL, "position (epoch %lld, cursor %lld) over %lld examples is not valid", (long long)epoch,
                            (long long)cursor, (long long)n);
    o->n = n, o->seed = seed, o->shuffle = shuffle, o->epoch = epoch, o->cursor = cursor;
    if (!(o->perm = ff_malloc((size_t)n * sizeof *o->perm))) return -1;
    permute(o);
    return 0;
}

void ff_data_order_seek(ff_data_order *o, int64_t epoch, int64_t cursor) {
    bool again = epoch != o->epoch;
    o->epoch = epoch;
    o->cursor = cursor;
    if (again) permute(o);
}

int64_t ff_data_order_next(ff_data_order *o) {
    if (o->cursor >= o->n) {
        o->epoch++;
        o->cursor = 0;
        permute(o);
    }
    return o->perm[o->cursor++];
}

void ff_data_order_free(ff_data_order *o) {
    free(o->perm);
    o->perm = NULL;
}

/* ---- checkpoints ------------------------------------------------------------------------------ */

int ff_checkpoint_steps(const char *out_dir, int64_t **steps) {
    char dir[FF_PATH_MAX];
    snprintf(dir, sizeof dir, "%s/checkpoints", out_dir);
    *steps = NULL;
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long v;
        char tail;
        if (sscanf(e->d_name, "step-%lld%c", &v, &tail) != 1) continue; /* skips step-N.tmp-PID */
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *a = realloc(*steps, (size_t)cap * sizeof *a);
            if (!a) break;
            *steps = a;
        }
        (*steps)[n++] = v;
    }
    closedir(d);
    for (int i = 1; i < n; i++) /* insertion sort: a handful of entries */
        for (int k = i; k > 0 && (*steps)[k - 1] > (*steps)[k]; k--) {
            int64_t t = (*steps)[k];
            (*steps)[k] = (*steps)[k - 1];
            (*steps)[k - 1] = t;
        }
    if (n == 0) {
        free(*steps);
        *steps = NULL;
    }
    return n;
}

void ff_checkpoint_path(const char *out_dir, int64_t step, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/checkpoints/step-%08" PRId64, out_dir, step);
}

/* ---- opening the folder --------------------------------------------------------------------- */

static const char *const own_files[] = {"config.yaml", "config_changes.jsonl", "metrics.jsonl", NULL};

/* A file can be created in dir: what mkdir and stat cannot tell. */
static int probe_folder(const ff_train_dir_spec *s, const char *dir) {
    char path[FF_PATH_MAX];
    snprintf(path, sizeof path, "%s/.write-test", dir);
    return ff_check_writable(path) == 0 ? 0 : ff_error_wrap("the output folder (%s)", s->out_key);
}

/* A path the command will write must be absent or of its kind (and writable). */
static int check_path(const ff_train_dir_spec *s, const char *name, bool folder) {
    char path[FF_PATH_MAX], hint[512];
    snprintf(path, sizeof path, "%s/%s", s->out, name);
    struct stat st;
    if (stat(path, &st) != 0) return errno == ENOENT ? 0 : ff_error_set(path, NULL, "cannot inspect: %s", strerror(errno));
    snprintf(hint, sizeof hint, "remove it, or choose another %s", s->out_key);
    if (folder ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode))
        return ff_error_set(path, hint, "`fuseflow %s` writes this %s, but it is %s", s->cmd, folder ? "folder" : "file",
                            S_ISDIR(st.st_mode)   ? "a folder"
                            : S_ISREG(st.st_mode) ? "a file"
                                                  : "neither a file nor a folder");
    if (access(path, W_OK) != 0) return ff_error_set(path, hint, "cannot be written: %s", strerror(errno));
    return 0;
}

/* The PID in a leftover's name (NAME.tmp-PID, NAME.old-PID: folders of ff_atomic_dir;
 * NAME.tmp.PID: files of ff_write_file_atomic and ff_atomic_file), 0 when it is none. */
static int leftover_pid(const char *name) {
    const char *dot = strrchr(name, '.'), *p = NULL;
    if (!dot || dot == name) return 0;
    if (!strncmp(dot, ".tmp-", 5) || !strncmp(dot, ".old-", 5)) p = dot + 5;
    else if (dot - name >= 4 && !strncmp(dot - 4, ".tmp", 4)) p = dot + 1;
    if (!p || !*p || p[strspn(p, "0123456789")]) return 0;
    long v = strtol(p, NULL, 10);
    return v > 0 && v <= INT_MAX ? (int)v : 0;
}

/* Staging folders and temporary files of processes that are gone: removed (and logged). A
 * live process (or one of another user, EPERM) keeps its own. */
static void remove_leftovers(const ff_train_dir_spec *s, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        int pid = leftover_pid(e->d_name);
        if (pid <= 0 || pid == (int)getpid() || kill(pid, 0) == 0 || errno != ESRCH) continue;
        char path[4600];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (ff_remove_tree(path) == 0) ff_info("%s: removed %s, left by process %d, which is gone", s->cmd, path, pid);
        else ff_warn("%s: cannot remove the leftover %s: %s", s->cmd, path, ff_error_message());
    }
    closedir(d);
}

int ff_train_dir_open(ff_train_dir *d, const ff_train_dir_spec *spec) {
    memset(d, 0, sizeof *d);
    d->spec = *spec;
    d->checkpoint_step = -1;
    const ff_train_dir_spec *s = &d->spec;
    char ck[FF_PATH_MAX], hint[512];
    snprintf(ck, sizeof ck, "%s/checkpoints", s->out);
    snprintf(hint, sizeof hint, "choose another %s", s->out_key);
    struct stat st;
    if (s->resume && stat(s->out, &st) != 0) /* nothing to resume: make no folder */
        return ff_error_set(s->out, "run without --resume to start", "--resume: no checkpoint in %s/checkpoints", s->out);
    if (ff_mkdirs(s->out) != 0) return ff_error_wrap("the output folder (%s)", s->out_key);
    /* checkpoints/ is made by the first save; until then OUT's probe covers it */
    if (probe_folder(s, s->out) != 0 || check_path(s, "checkpoints", true) != 0 || (stat(ck, &st) == 0 && probe_folder(s, ck) != 0)) return -1;
    for (const char *const *f = own_files; *f; f++)
        if (check_path(s, *f, false) != 0) return -1;
    for (const char *const *f = s->files; f && *f; f++)
        if (check_path(s, *f, false) != 0) return -1;
    for (const char *const *f = s->folders; f && *f; f++)
        if (check_path(s, *f, true) != 0) return -1;
    remove_leftovers(s, s->out);
    remove_leftovers(s, ck);
    int64_t *steps;
    int n = ff_checkpoint_steps(s->out, &steps);
    if (n > 0) {
        d->checkpoint_step = steps[n - 1];
        ff_checkpoint_path(s->out, steps[n - 1], d->checkpoint, sizeof d->checkpoint);
    }
    free(steps);
    if (s->resume && n == 0)
        return ff_error_set(s->out, "run without --resume to start", "--resume: no checkpoint in %s/checkpoints", s->out);
    if (!s->resume && n > 0) {
        snprintf(hint, sizeof hint, "pass --resume to continue that run, or choose another %s (or delete it)", s->out_key);
        return ff_error_set(s->out, hint, "the output folder holds checkpoints of an earlier run (%s)", d->checkpoint);
    }
    return 0;
}

/* ---- the config record ------------------------------------------------------------------------ */

static char *config_text(const ff_config *cfg, const char *cmd) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return ff_error_set(NULL, NULL, "out of memory"), NULL;
    fprintf(f, "# the effective config of `fuseflow %s` (the YAML with its overrides)\n", cmd);
    int rc = ff_config_write(cfg, f);
    if (fclose(f) != 0 || rc != 0) {
        free(buf);
        return rc ? NULL : (ff_error_set(NULL, NULL, "out of memory"), NULL);
    }
    return buf;
}

static int write_config(const char *path, const ff_config *cfg, const char *cmd) {
    char *text = config_text(cfg, cmd);
    if (!text) return ff_error_wrap("%s", path);
    int rc = ff_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

/* pattern "a.*.c" against key "a.b.c.d": segment by segment, '*' any one; the key may go on. */
static bool key_matches(const char *pat, const char *key) {
    while (*pat) {
        size_t pl = strcspn(pat, "."), kl = strcspn(key, ".");
        if (!(pl == 1 && *pat == '*') && (pl != kl || strncmp(pat, key, pl))) return false;
        if (!key[kl] && pat[pl]) return false;
        pat += pl + (pat[pl] == '.');
        key += kl + (key[kl] == '.');
    }
    return true;
}

static bool harmless(const ff_train_dir_spec *s, const char *key) {
    for (const char *const *p = s->harmless; p && *p; p++)
        if (key_matches(*p, key)) return true;
    return false;
}

static int append_line(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return ff_error_set(path, "check that the output folder is writable", "cannot open for appending: %s", strerror(errno));
    struct stat st;
    size_t len = strlen(text), off = 0;
    int e = fstat(fd, &st) != 0 ? errno : 0;
    while (!e && off < len) {
        ssize_t w = write(fd, text + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            e = w < 0 ? errno : EIO;
            break;
        }
        off += (size_t)w;
    }
    /* no half line left behind (a reader would skip it, but a resumed run appends after it) */
    if (e && off > 0 && ftruncate(fd, st.st_size) != 0) ff_warn("%s: a partial line is left at the end", path);
    if (close(fd) != 0 && !e) e = errno;
    if (e) return ff_error_set(path, e == ENOSPC ? "the disk is full" : NULL, "cannot append: %s", strerror(e));
    return 0;
}

int ff_train_dir_check_config(ff_train_dir *d, const ff_config *now, bool accept_changes) {
    const ff_train_dir_spec *s = &d->spec;
    char path[FF_PATH_MAX];
    snprintf(path, sizeof path, "%s/config.yaml", d->checkpoint);
    if (access(path, F_OK) != 0) snprintf(path, sizeof path, "%s/config.yaml", s->out); /* checkpoints before the record */
    ff_config *was = access(path, F_OK) == 0 ? ff_config_load(path) : NULL;
    if (!was && access(path, F_OK) == 0) return ff_error_wrap("the config the checkpoint was made with");
    if (!was && !accept_changes)
        return ff_error_set(d->checkpoint, "pass --resume-with-changes to resume anyway", "the checkpoint does not record its config, so --resume cannot check that this run is the same");
    ff_config_change *ch = NULL;
    bool recorded = was != NULL;
    int n = was ? ff_config_diff(was, now, &ch) : 0;
    ff_config_destroy(&was);
    if (n < 0) return -1;
    /* the list stays short enough for the message to keep its hint (errors hold 2 KiB) */
    char list[1400] = "";
    size_t off = 0;
    int meaningful = 0, listed = 0;
    for (int i = 0; i < n; i++) {
        if (harmless(s, ch[i].key)) continue;
        meaningful++;
        char one[600];
        int w = snprintf(one, sizeof one, "%s%s: %s -> %s", off ? ", " : "", ch[i].key, ch[i].was ? ch[i].was : "(absent)", ch[i].now ? ch[i].now : "(absent)");
        if (listed < 12 && w > 0 && off + (size_t)w < sizeof list - 32) {
            memcpy(list + off, one, (size_t)w + 1);
            off += (size_t)w;
            listed++;
        }
    }
    if (meaningful > listed) snprintf(list + off, sizeof list - off, " and %d more", meaningful - listed);
    if (meaningful && !accept_changes) {
        ff_config_changes_free(&ch, n);
        char hint[4600];
        snprintf(hint, sizeof hint,
                 "resume with the config and overrides of that run, or pass --resume-with-changes to continue with these "
                 "(recorded in %s/config_changes.jsonl)", s->out);
        return ff_error_set(d->checkpoint, hint, "--resume: this config changes the run: %s", list);
    }
    int rc = 0;
    if (n > 0 || !recorded) {
        json_t *arr = json_array(), *rec = json_pack("{s:I, s:s, s:o}", s->step_key, (json_int_t)d->checkpoint_step, "checkpoint", d->checkpoint,
                                                    "changes", arr);
        for (int i = 0; rec && i < n; i++) {
            bool h = harmless(s, ch[i].key);
            json_array_append_new(arr, json_pack("{s:s, s:s?, s:s?, s:b}", "key", ch[i].key, "was", ch[i].was, "now", ch[i].now, "harmless", h));
            ff_info("%s: resuming with %s changed%s: %s -> %s", s->cmd, ch[i].key, h ? " (harmless)" : "", ch[i].was ? ch[i].was : "(absent)",
                    ch[i].now ? ch[i].now : "(absent)");
        }
        if (rec && !recorded) json_object_set_new(rec, "unrecorded", json_true());
        free(d->pending);
        d->pending = rec ? json_dumps(rec, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(rec);
        if (!d->pending) rc = ff_error_set(s->out, NULL, "out of memory");
    }
    d->changes = meaningful;
    ff_config_changes_free(&ch, n);
    return rc;
}

void ff_train_dir_close(ff_train_dir *d) {
    free(d->pending);
    d->pending = NULL;
    /* every event was flushed when written: a failure here loses nothing */
    if (ff_tfevents_close(&d->tb) != 0) ff_warn("%s: %s", d->spec.cmd, ff_error_message());
}

/* ---- writing ------------------------------------------------------------------------------------- */

/* Keep the lines of metrics.jsonl whose step is <= step (a resumed run rewrites the rest). */
static int truncate_metrics(const char *path, const char *key, int64_t step) {
    size_t len;
    char *text = ff_read_file(path, &len);
    if (!text) {
        if (access(path, F_OK) != 0) {
            ff_error_clear();
            return 0;
        }
        return -1;
    }
    char *keep = ff_malloc(len + 1);
    if (!keep) {
        free(text);
        return -1;
    }
    size_t kn = 0;
    for (char *line = text; *line;) {
        char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line + 1) : strlen(line);
        json_t *o = json_loadb(line, n, 0, NULL);
        if (o && json_integer_value(json_object_get(o, key)) <= step) {
            memcpy(keep + kn, line, n);
            kn += n;
        }
        json_decref(o);
        line += n;
    }
    int rc = ff_write_file_atomic(path, keep, kn);
    free(text);
    free(keep);
    return rc;
}

/* text + "\n" appended to OUT/name. */
static int append_record(const char *out, const char *name, const char *text) {
    char path[FF_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", out, name);
    size_t n = strlen(text);
    char *t = ff_malloc(n + 2);
    if (!t) return ff_error_wrap("%s", path);
    memcpy(t, text, n);
    memcpy(t + n, "\n", 2);
    int rc = append_line(path, t);
    free(t);
    return rc;
}

static unsigned loggers(const ff_train_dir *d) { return d->spec.loggers ? d->spec.loggers : FF_LOGGERS_DEFAULT; }

/* A fresh run's event file is the only one: TensorBoard would show earlier runs' beside it. */
static int remove_event_files(const ff_train_dir_spec *s) {
    DIR *dir = opendir(s->out);
    if (!dir) return ff_error_set(s->out, NULL, "cannot list: %s", strerror(errno));
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(dir)) && rc == 0) {
        if (strncmp(e->d_name, "events.out.tfevents.", 20) != 0) continue;
        char path[FF_PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", s->out, e->d_name);
        if (unlink(path) != 0)
            rc = ff_error_set(path, "remove it, or choose another folder", "cannot remove an earlier run's event file: %s", strerror(errno));
        else ff_info("%s: removed %s, an earlier run's TensorBoard events", s->cmd, path);
    }
    closedir(dir);
    return rc;
}

int ff_train_dir_start(ff_train_dir *d, const ff_config *cfg) {
    const ff_train_dir_spec *s = &d->spec;
    char path[FF_PATH_MAX];
    snprintf(path, sizeof path, "%s/config.yaml", s->out);
    if ((!s->resume || access(path, F_OK) != 0) && write_config(path, cfg, s->cmd) != 0) return -1;
    if (d->pending && append_record(s->out, "config_changes.jsonl", d->pending) != 0) return -1;
    snprintf(path, sizeof path, "%s/metrics.jsonl", s->out);
    if (s->resume ? truncate_metrics(path, s->step_key, d->checkpoint_step) != 0
                  : ff_write_file_atomic(path, "", 0) != 0 || remove_event_files(s) != 0)
        return -1;
    if (!(loggers(d) & FF_LOGGER_TENSORBOARD)) return 0;
    if (!(d->tb = ff_tfevents_open(s->out))) return -1;
    return s->resume ? ff_tfevents_restart(d->tb, d->checkpoint_step + 1) : 0;
}

int ff_train_dir_metrics(ff_train_dir *d, const json_t *line) {
    if (d->tb && ff_tfevents_json(d->tb, line, d->spec.step_key) != 0) return -1;
    if (!(loggers(d) & FF_LOGGER_JSONL)) return 0;
    char *text = json_dumps(line, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    if (!text) return ff_error_set(d->spec.out, NULL, "metrics.jsonl: out of memory");
    int rc = append_record(d->spec.out, "metrics.jsonl", text);
    free(text);
    return rc;
}

int ff_train_dir_stage(ff_train_dir *d, int64_t step, char *tmp, size_t cap) {
    char abs_out[PATH_MAX], dir[FF_PATH_MAX];
    if (!realpath(d->spec.out, abs_out)) return ff_error_set(d->spec.out, NULL, "the output folder is gone: %s", strerror(errno));
    ff_checkpoint_path(abs_out, step, dir, sizeof dir);
    return ff_atomic_dir_begin(dir, tmp, cap);
}

int ff_train_dir_commit(ff_train_dir *d, int64_t step, const char *tmp, const ff_config *cfg, int keep) {
    char abs_out[PATH_MAX], dir[FF_PATH_MAX], path[FF_PATH_MAX];
    if (!realpath(d->spec.out, abs_out)) {
        ff_error_set(d->spec.out, NULL, "the output folder is gone: %s", strerror(errno));
        ff_atomic_dir_abort(tmp);
        return -1;
    }
    ff_checkpoint_path(abs_out, step, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/config.yaml", tmp);
    if (write_config(path, cfg, d->spec.cmd) != 0) {
        ff_atomic_dir_abort(tmp);
        return ff_error_wrap("checkpoint %s", dir);
    }
    if (ff_atomic_dir_commit(tmp, dir) != 0) return ff_error_wrap("checkpoint %s", dir);
    ff_checkpoint_path(d->spec.out, step, d->checkpoint, sizeof d->checkpoint);
    d->checkpoint_step = step;
    int64_t *steps;
    int n = ff_checkpoint_steps(abs_out, &steps);
    for (int i = 0; i + keep < n; i++) {
        char old[FF_PATH_MAX];
        ff_checkpoint_path(abs_out, steps[i], old, sizeof old);
        if (ff_remove_tree(old) != 0) ff_warn("%s: %s", d->spec.cmd, ff_error_message());
    }
    free(steps);
    return 0;
}

const char *ff_train_dir_resume_note(const ff_train_dir *d, char *buf, size_t cap) {
    if (d->checkpoint[0])
        snprintf(buf, cap, "continue from %s (%s %" PRId64 ") with --resume", d->checkpoint, d->spec.step_key, d->checkpoint_step);
    else
        snprintf(buf, cap, "no checkpoint was saved, so nothing can be resumed: the run starts over");
    return buf;
}

/* ---- damaged checkpoints ------------------------------------------------------------------ */
/* The OUT/checkpoints/step-N prefix of path: its length, the step, and where OUT ends; -1
 * when path is not inside one (the last such component counts). */
static long checkpoint_prefix(const char *path, int64_t *step, size_t *out_len) {
    long found = -1;
    for (const char *p = path; (p = strstr(p, "checkpoints/step-")); p++) {
        if (p != path && p[-1] != '/') continue;
        const char *q = p + strlen("checkpoints/step-"), *d = q;
        while (*d >= '0' && *d <= '9') d++;
        if (d == q || (*d && *d != '/')) continue;
        *step = strtoll(q, NULL, 10);
        *out_len = p == path ? 0 : (size_t)(p - path - 1);
        found = (long)(d - path);
    }
    return found;
}

int ff_checkpoint_hint(const char *path, char *buf, size_t cap) {
    int64_t step = 0;
    size_t out_len = 0;
    long end = checkpoint_prefix(path, &step, &out_len);
    if (end < 0) return -1;
    char out[FF_PATH_MAX], ck[FF_PATH_MAX];
    if (out_len) snprintf(out, sizeof out, "%.*s", (int)out_len, path);
    else snprintf(out, sizeof out, ".");
    snprintf(ck, sizeof ck, "%.*s", (int)end, path);
    int64_t *steps, prev = -1;
    int n = ff_checkpoint_steps(out, &steps);
    for (int i = 0; i < n; i++)
        if (steps[i] < step) prev = steps[i];
    free(steps);
    if (prev >= 0)
        snprintf(buf, cap, "the checkpoint %s is damaged; the one before it is %s/checkpoints/step-%08lld: move the damaged "
                 "one away (mv %s %s.damaged) and run the same command with --resume (it takes the newest)",
                 ck, out, (long long)prev, ck, ck);
    else
        snprintf(buf, cap, "the checkpoint %s is damaged and %s/checkpoints holds none before it: move it away (mv %s "
                 "%s.damaged) and start again without --resume", ck, out, ck, ck);
    return 0;
}

int ff_checkpoint_error(const char *path) {
    char hint[16384];
    if (ff_checkpoint_hint(path, hint, sizeof hint) != 0 || strstr(ff_error_message(), hint)) return -1;
    char msg[8192];
    snprintf(msg, sizeof msg, "%s", ff_error_message());
    return ff_error_set(NULL, hint, "%s", msg);
}
