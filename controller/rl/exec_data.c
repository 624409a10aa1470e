/* Datasets of a run (JSONL, one object per line: the prompt key, the answer key, anything
 * else as metadata) with their prompts tokenized the way SFT encodes them, and responses
 * decoded back to text.
 *
 * Not here: what a sample becomes (exec_iter.c), the order in which training prompts are
 * drawn (ff_data_order, fuseflow/train_dir.h: the same as `fuseflow sft`'s). */
#include <stdlib.h>
#include <string.h>

#include "controller/rl/exec_internal.h"
#include "fuseflow/error.h"
#include "fuseflow/jsonl.h"
#include "fuseflow/util.h"

/* Room for cap rows in every per-row array (the arrays already grown stay valid on failure). */
static int grow(ex_dataset *d, int64_t cap) {
    json_t **rows = ff_realloc(d->rows, (size_t)cap * sizeof *rows);
    if (!rows) return -1;
    d->rows = rows;
    const char **pr = ff_realloc(d->prompt, (size_t)cap * sizeof *pr);
    if (!pr) return -1;
    d->prompt = pr;
    const char **an = ff_realloc(d->answer, (size_t)cap * sizeof *an);
    if (!an) return -1;
    d->answer = an;
    char **me = ff_realloc(d->meta, (size_t)cap * sizeof *me);
    if (!me) return -1;
    d->meta = me;
    int32_t **id = ff_realloc(d->ids, (size_t)cap * sizeof *id);
    if (!id) return -1;
    d->ids = id;
    int32_t *ln = ff_realloc(d->len, (size_t)cap * sizeof *ln);
    if (!ln) return -1;
    d->len = ln;
    return 0;
}

int ex_dataset_load(ex_dataset *d, const char *path, const ff_run_config *run, const ff_tokenizer *tok, bool need_answer) {
    memset(d, 0, sizeof *d);
    ff_jsonl *r = ff_jsonl_open(path);
    if (!r) return -1;
    const char *pk = run->data.prompt_key, *ak = run->data.answer_key;
    int64_t cap = 0;
    json_t *o;
    int rc;
    while ((rc = ff_jsonl_next(r, &o)) == 1) {
        char where[FF_PATH_MAX];
        snprintf(where, sizeof where, "%s:%d", path, ff_jsonl_line(r));
        json_t *p = json_object_get(o, pk), *a = json_object_get(o, ak);
        if (!json_is_string(p)) {
            ff_error_set(where, "set data.prompt_key to the key that holds the prompt text", "no string '%s' (the prompt) in this line",
                         pk);
            goto fail;
        }
        if (a && !json_is_string(a)) {
            ff_error_set(where, NULL, "'%s' (the answer) must be a string", ak);
            goto fail;
        }
        if (!a && need_answer) {
            ff_error_set(where, "the graph reads the answer column; set data.answer_key", "no '%s' (the answer) in this line", ak);
            goto fail;
        }
        int32_t *ids = NULL, n = 0;
        ff_encode_opts eo = {true, true}; /* as SFT encodes prompts: the template's BOS, if any */
        if (ff_tokenizer_encode(tok, json_string_value(p), json_string_length(p), &eo, &ids, &n) != 0) {
            ff_error_wrap("%s", where);
            goto fail;
        }
        if (n < 1 || n > run->data.max_prompt_length) {
            free(ids);
            json_decref(o);
            d->skipped++;
            continue;
        }
        if (d->n == cap) {
            cap = cap ? 2 * cap : 1024;
            if (grow(d, cap) != 0) {
                free(ids);
                goto fail;
            }
        }
        d->rows[d->n] = o;
        d->prompt[d->n] = json_string_value(p);
        d->answer[d->n] = a ? json_string_value(a) : NULL;
        d->meta[d->n] = NULL;
        d->ids[d->n] = ids;
        d->len[d->n] = n;
        d->n++;
    }
    ff_jsonl_close(&r);
    if (rc < 0) return -1;
    if (d->n == 0 && d->skipped)
        return ff_error_set(path, "raise data.max_prompt_length", "every prompt is longer than data.max_prompt_length (%lld tokens)",
                            (long long)run->data.max_prompt_length);
    if (d->n == 0)
        return ff_error_set(path, NULL, "no examples: the file is empty or holds only blank lines (hint: one JSON object per line, "
                            "the prompt under '%s' (data.prompt_key) and the answer under '%s' (data.answer_key), e.g. "
                            "{\"%s\": \"12+34=\", \"%s\": \"46\"}; `fuseflow dataset arith` writes such files)", pk, ak, pk, ak);
    return 0;
fail:
    json_decref(o);
    ff_jsonl_close(&r);
    return -1;
}

void ex_dataset_free(ex_dataset *d) {
    for (int64_t i = 0; i < d->n; i++) {
        json_decref(d->rows[i]);
        free(d->meta[i]);
        free(d->ids[i]);
    }
    free(d->rows), free(d->prompt), free(d->answer), free(d->meta), free(d->ids), free(d->len);
    memset(d, 0, sizeof *d);
}

const char *ex_dataset_meta(ex_dataset *d, int64_t row, const char *prompt_key, const char *answer_key) {
    if (d->meta[row]) return d->meta[row];
    json_t *copy = json_copy(d->rows[row]);
    if (!copy) return NULL;
    json_object_del(copy, prompt_key);
    json_object_del(copy, answer_key);
    d->meta[row] = json_dumps(copy, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(copy);
    return d->meta[row];
}

/* A model's vocabulary is often larger than its tokenizer's (config.json's vocab_size padded
 * to a multiple of 64 or 128, or so that tensor parallelism divides it), and it may sample
 * the ids no token has: they decode to nothing, as Hugging Face's tokenizers decode them. */
int ex_decode(const ff_tokenizer *tok, const int32_t *ids, int32_t n, char **text, size_t *len) {
    int32_t *kept = ff_malloc((size_t)(n > 0 ? n : 1) * sizeof *kept), k = 0;
    if (!kept) return -1;
    for (int32_t i = 0; i < n; i++)
        if (ff_tokenizer_token(tok, ids[i])) kept[k++] = ids[i];
    int rc = ff_tokenizer_decode(tok, kept, k, true, text, len);
    free(kept);
    return rc;
}
