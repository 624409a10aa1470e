/* `fuseflow tokenize`: a model folder's tokenizer (or a tokenizer.json) on text or JSONL, and
 * back. Encoding: the whole input is one text and the ids come out on one line, or with
 * --jsonl each line {"text": "..."} gives {"ids": [...]}; --pieces adds the token strings.
 * Decoding (--decode): ids separated by spaces or newlines give the bytes they stand for, or
 * with --jsonl each {"ids": [...]} gives {"text": "..."} (invalid UTF-8 as U+FFFD, since JSON
 * holds text). Input from FILE or stdin; output to stdout.
 *
 * Not here: offsets, truncation, padding, chat templates. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/io_util.h"
#include "fuseflow/jsonl.h"
#include "fuseflow/tokenizer.h"
#include "fuseflow/util.h"

static const char *CMD = "tokenize";

static void help(void) {
    printf("usage: fuseflow tokenize (--model DIR | --tokenizer FILE) [--decode] [--jsonl] [--pieces] [options] [INPUT]\n\n"
           "Encode text to token ids, or (--decode) ids to text. INPUT is a file, or stdin when absent or '-'.\n\n"
           "  text in, ids out:     the whole input is one text; prints its ids on one line (--pieces: 'id<TAB>piece' lines)\n"
           "  --jsonl:              each line {\"text\": \"...\"} gives {\"ids\": [...]} (--pieces: and \"pieces\": [...])\n"
           "  --decode:             ids (separated by spaces or newlines) in, their bytes out\n"
           "  --decode --jsonl:     each line {\"ids\": [...]} gives {\"text\": \"...\"}\n\n"
           "options:\n"
           "  --model DIR          model folder: DIR/tokenizer.json (and tokenizer_config.json)\n"
           "  --tokenizer FILE     a tokenizer.json\n"
           "  --add-special        apply the tokenizer's template (e.g. Llama 3's BOS)\n"
           "  --plain-special      special tokens written in the text are plain text, not their ids\n"
           "  --skip-special       when decoding, drop special tokens\n\n"
           "examples:\n"
           "  echo -n 'Hello world' | fuseflow tokenize --model runs/sft\n"
           "  fuseflow tokenize --tokenizer tokenizer.json --jsonl --pieces prompts.jsonl\n"
           "  echo '9906 1917' | fuseflow tokenize --model runs/sft --decode\n");
}

typedef struct opts {
    bool decode, jsonl, pieces, add_special, plain_special, skip_special;
} opts;

/* all of f; NULL + error */
static char *read_all(FILE *f, const char *name, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = ff_malloc(cap);
    if (!buf) return NULL;
    for (;;) {
        if (n + 1 >= cap) {
            char *b = ff_realloc(buf, cap *= 2);
            if (!b) {
                free(buf);
                return NULL;
            }
            buf = b;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        free(buf);
        ff_error_set(name, NULL, "read error: %s", strerror(errno));
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static int put(const char *s, size_t n) {
    if (fwrite(s, 1, n, stdout) != n) return ff_error_set("stdout", NULL, "write failed");
    return 0;
}

static int print_ids(const ff_tokenizer *t, const int32_t *ids, int32_t n, bool pieces) {
    for (int32_t i = 0; i < n; i++) {
        if (pieces)
            printf("%d\t%s\n", ids[i], ff_tokenizer_token(t, ids[i]));
        else
            printf("%s%d", i ? " " : "", ids[i]);
    }
    if (!pieces) putchar('\n');
    return ferror(stdout) ? ff_error_set("stdout", NULL, "write failed") : 0;
}

static int encode_text(const ff_tokenizer *t, FILE *in, const char *name, const opts *o) {
    size_t len;
    char *text = read_all(in, name, &len);
    if (!text) return -1;
    int32_t *ids, n;
    ff_encode_opts eo = {o->add_special, !o->plain_special};
    int rc = ff_tokenizer_encode(t, text, len, &eo, &ids, &n);
    free(text);
    if (rc != 0) return ff_error_wrap("%s", name);
    rc = print_ids(t, ids, n, o->pieces);
    free(ids);
    return rc;
}

static int decode_text(const ff_tokenizer *t, FILE *in, const char *name, const opts *o) {
    size_t len;
    char *text = read_all(in, name, &len);
    if (!text) return -1;
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    int rc = -1;
    for (char *p = text;;) {
        p += strspn(p, " \t\r\n,");
        if (!*p) break;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        size_t word = strcspn(p, " \t\r\n,");
        if (end != p + word || errno || v < 0 || v > INT32_MAX) {
            ff_error_set(name, "give token ids: non-negative integers separated by spaces or newlines", "token %zu '%.*s' is not a token id", n,
                         (int)(word < 40 ? word : 40), p);
            goto out;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 1024;
            int32_t *b = ff_realloc(ids, cap * sizeof *b);
            if (!b) goto out;
            ids = b;
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    char *dec;
    size_t dl;
    if (n > INT32_MAX || ff_tokenizer_decode(t, ids, (int32_t)n, o->skip_special, &dec, &dl) != 0) {
        ff_error_wrap("%s", name);
        goto out;
    }
    rc = put(dec, dl);
    free(dec);
out:
    free(ids);
    free(text);
    return rc;
}

/* one JSONL line: {"text"} -> {"ids", "pieces"?} or {"ids"} -> {"text"} */
static int jsonl_line(const ff_tokenizer *t, json_t *in, const char *where, const opts *o) {
    json_t *out = NULL;
    int32_t *ids = NULL, n = 0;
    int rc = -1;
    if (!o->decode) {
        json_t *text = json_object_get(in, "text");
        if (!json_is_string(text)) return ff_error_set(where, "each line is {\"text\": \"...\"}", "expected a string field \"text\"");
        ff_encode_opts eo = {o->add_special, !o->plain_special};
        if (ff_tokenizer_encode(t, json_string_value(text), json_string_length(text), &eo, &ids, &n) != 0) return ff_error_wrap("%s", where);
        json_t *jids = json_array(), *jp = o->pieces ? json_array() : NULL;
        out = json_object();
        if (!out || !jids || (o->pieces && !jp)) {
            json_decref(jids);
            json_decref(jp);
            ff_error_set(where, NULL, "out of memory");
            goto out;
        }
        json_object_set_new(out, "ids", jids);
        if (jp) json_object_set_new(out, "pieces", jp);
        for (int32_t i = 0; i < n; i++) {
            json_array_append_new(jids, json_integer(ids[i]));
            if (jp) json_array_append_new(jp, json_string(ff_tokenizer_token(t, ids[i])));
        }
    } else {
        json_t *jids = json_object_get(in, "ids");
        if (!json_is_array(jids)) return ff_error_set(where, "each line is {\"ids\": [...]}", "expected a list field \"ids\"");
        size_t m = json_array_size(jids);
        if (!(ids = ff_malloc((m ? m : 1) * sizeof *ids))) return -1;
        for (size_t i = 0; i < m; i++) {
            json_t *x = json_array_get(jids, i);
            if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX) {
                ff_error_set(where, NULL, "ids[%zu] is not a token id (a non-negative integer)", i);
                goto out;
            }
            ids[i] = (int32_t)json_integer_value(x);
        }
        char *dec, *lossy;
        size_t dl;
        if (ff_tokenizer_decode(t, ids, (int32_t)m, o->skip_special, &dec, &dl) != 0) {
            ff_error_wrap("%s", where);
            goto out;
        }
        lossy = ff_utf8_lossy(dec, dl, &dl);
        free(dec);
        if (!lossy || !(out = json_pack("{s:s%}", "text", lossy, dl))) {
            free(lossy);
            ff_error_set(where, NULL, "out of memory");
            goto out;
        }
        free(lossy);
    }
    char *s = json_dumps(out, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!s) {
        ff_error_set(where, NULL, "cannot write the JSON line");
        goto out;
    }
    rc = put(s, strlen(s));
    free(s);
    if (rc == 0) rc = put("\n", 1);
out:
    json_decref(out);
    free(ids);
    return rc;
}

static int run_jsonl(const ff_tokenizer *t, FILE *in, const char *name, const opts *o) {
    ff_jsonl *r = ff_jsonl_open_stream(in, name);
    if (!r) return -1;
    json_t *line;
    int got, rc = 0;
    char where[FF_PATH_MAX];
    while (rc == 0 && (got = ff_jsonl_next(r, &line)) == 1) {
        snprintf(where, sizeof where, "%s:%d", name, ff_jsonl_line(r));
        rc = jsonl_line(t, line, where, o);
        json_decref(line);
    }
    if (rc == 0 && got < 0) rc = -1;
    ff_jsonl_close(&r);
    return rc;
}

int ff_cmd_tokenize(int argc, char **argv) {
    const char *model_dir = NULL, *tok_file = NULL;
    opts o = {0};
    const ffio_opt table[] = {
        {"model", FFIO_STR, &model_dir, 0, 0},           {"tokenizer", FFIO_STR, &tok_file, 0, 0},
        {"decode", FFIO_FLAG, &o.decode, 0, 0},          {"jsonl", FFIO_FLAG, &o.jsonl, 0, 0},
        {"pieces", FFIO_FLAG, &o.pieces, 0, 0},          {"add-special", FFIO_FLAG, &o.add_special, 0, 0},
        {"plain-special", FFIO_FLAG, &o.plain_special, 0, 0}, {"skip-special", FFIO_FLAG, &o.skip_special, 0, 0},
    };
    char *pos[1];
    int n_pos;
    int pr = ffio_parse(CMD, argc, argv, table, (int)(sizeof table / sizeof table[0]), pos, 1, &n_pos);
    if (pr == 1) help();
    if (pr) return pr == 1 ? 0 : pr;
    if (!model_dir == !tok_file) return ffio_usage(CMD, "give one of --model DIR or --tokenizer FILE");
    if (o.decode && (o.pieces || o.add_special || o.plain_special)) return ffio_usage(CMD, "--pieces, --add-special and --plain-special are for encoding");
    if (!o.decode && o.skip_special) return ffio_usage(CMD, "--skip-special is for --decode");
    const char *name = n_pos && strcmp(pos[0], "-") != 0 ? pos[0] : "stdin";
    FILE *in = stdin;
    if (n_pos && strcmp(pos[0], "-") != 0 && !(in = fopen(pos[0], "r"))) {
        ff_error_set(pos[0], errno == ENOENT ? "check the path" : NULL, "cannot open: %s", strerror(errno));
        return ffio_fail(CMD);
    }
    ff_tokenizer *t = model_dir ? ff_tokenizer_load_dir(model_dir) : ff_tokenizer_load(tok_file);
    int rc = -1;
    if (t) {
        if (o.jsonl)
            rc = run_jsonl(t, in, name, &o);
        else
            rc = o.decode ? decode_text(t, in, name, &o) : encode_text(t, in, name, &o);
    }
    if (rc == 0 && fflush(stdout) != 0) rc = ff_error_set("stdout", NULL, "write failed");
    if (in != stdin) fclose(in);
    ff_tokenizer_destroy(&t);
    return rc == 0 ? 0 : ffio_fail(CMD);
}
