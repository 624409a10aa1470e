/* fuseflow: Hugging Face model folders: config.json <-> ff_model_config, weights checked
 * against the config, and whole folders read and written atomically.
 *
 * A model folder holds config.json, model.safetensors (or model.safetensors.index.json and
 * its shards), and usually tokenizer.json + tokenizer_config.json (include/fuseflow/
 * tokenizer.h). docs/model-files.md lists the rules and what is not supported.
 *
 * config.json: LlamaForCausalLM, Qwen2ForCausalLM and MistralForCausalLM (and the
 * *ForSequenceClassification variants with one label, read as a value head). Missing keys
 * take Hugging Face's defaults for that model type. Refused with a message naming the key:
 * another architecture, an activation other than silu, rope scaling other than none/llama3,
 * a sliding window smaller than the context, MLP biases, Llama's o_proj bias, quantised
 * checkpoints, sizes that do not divide.
 *
 * Writing: files through ff_atomic_file (PATH.tmp.PID, fsync, rename); folders through
 * ff_atomic_dir (fill DIR.tmp-PID, then swap it in), so no reader ever sees half of one.
 */
#ifndef FUSEFLOW_MODELIO_H
#define FUSEFLOW_MODELIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fuseflow/dtype.h"
#include "fuseflow/model_config.h"
#include "fuseflow/tensor_set.h"
#include "fuseflow/util.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

struct ff_tokenizer;

/* ---- config.json ------------------------------------------------------------------------ */

/* Hugging Face's defaults for a model type ("llama", "qwen2", "mistral"). 0 or -1 + error. */
int ff_hf_config_defaults(const char *model_type, ff_model_config *cfg);
/* Parse config.json text; name is used in messages. 0 or -1 + error naming the key. */
int ff_hf_config_parse(const char *text, size_t len, const char *name, ff_model_config *cfg);
int ff_hf_config_load(const char *path, ff_model_config *cfg);
/* config.json text for cfg (malloc'd, NUL-terminated; NULL + error). torch_dtype: "float32",
 * "bfloat16", ... as the weights are stored. */
char *ff_hf_config_dump(const ff_model_config *cfg, const char *torch_dtype);

/* ---- weights ---------------------------------------------------------------------------- */

/* Add a zero tensor for every name and shape the config implies (model_config.h's list, in
 * its order; lm_head.weight unless tied; score.weight with a value head) to `out`. 0 or -1. */
int ff_hf_expected_tensors(const ff_model_config *cfg, ff_tensor_set *out);

/* Check a loaded tensor set against the config: every expected tensor (model_config.h) is
 * there with its shape, nothing else is. Harmless extras are dropped from `w`: rotary
 * inv_freq buffers, and lm_head.weight beside tied embeddings when it equals the embedding
 * (some exporters save both). lm_head may be absent for a value-head model (a critic or
 * reward model). 0, or -1 + error "WHERE: missing tensor '...'" / "... has shape [..],
 * expected [..]" / "unexpected tensor '...'". */
int ff_hf_check_weights(const ff_model_config *cfg, ff_tensor_set *w, const char *where);

/* The same checks on an open checkpoint's headers alone (names, shapes; a tied checkpoint's
 * own lm_head.weight is accepted when its bytes are the embedding's, and is then not used),
 * before anything is read: what ff_model_load_dir checks. 0 or -1 + the same errors. */
struct ff_st_dir;
int ff_hf_check_dir(const ff_model_config *cfg, const struct ff_st_dir *d, const char *where);

/* ---- model folders ------------------------------------------------------------------------ */

/* Read DIR/config.json and the weights (model.safetensors or the sharded index), checked
 * with ff_hf_check_weights. *weights is a new set the caller destroys. 0 or -1 + error. */
int ff_model_dir_load(const char *dir, ff_model_config *cfg, ff_tensor_set **weights);

/* Write config.json, the weights as `dtype` (F32, BF16 or F16; shards of up to 5 GB), and,
 * when tok is not NULL, tokenizer.json and tokenizer_config.json into the existing folder
 * DIR (not atomic as a whole: use it on a staging folder). 0 or -1 + error. */
int ff_model_files_write(const char *dir, const ff_model_config *cfg, const ff_tensor_set *weights,
                         const struct ff_tokenizer *tok, ff_dtype dtype);
/* The same into a fresh folder that replaces DIR as a whole (ff_atomic_dir). 0 or -1. */
int ff_model_dir_save(const char *dir, const ff_model_config *cfg, const ff_tensor_set *weights,
                      const struct ff_tokenizer *tok, ff_dtype dtype);

/* ---- atomic files and folders --------------------------------------------------------------- */

typedef struct ff_atomic_file {
    int fd;
    char path[FF_PATH_MAX];
    char tmp[FF_PATH_MAX + 32];
} ff_atomic_file;

/* Create PATH.tmp.PID for writing. 0 or -1 + error. */
int ff_atomic_file_begin(ff_atomic_file *f, const char *path);
int ff_atomic_file_write(ff_atomic_file *f, const void *data, size_t len);
/* fsync, close, rename over PATH, fsync the folder. On failure the temporary is removed. */
int ff_atomic_file_commit(ff_atomic_file *f);
/* Close and remove the temporary (PATH is untouched). */
void ff_atomic_file_abort(ff_atomic_file *f);

/* Make the staging folder "DIR.tmp-PID" (emptied first; parents created) and write its path
 * to tmp (cap bytes). 0 or -1 + error. */
int ff_atomic_dir_begin(const char *dir, char *tmp, size_t cap);
/* Put the staged folder in place of DIR. An existing DIR is replaced as a whole (swapped
 * with renameat2(RENAME_EXCHANGE), then removed). 0, or -1 + error and the staging folder
 * removed. */
int ff_atomic_dir_commit(const char *tmp, const char *dir);
/* Remove the staging folder; the current error message is kept. */
void ff_atomic_dir_abort(const char *tmp);
/* rm -r PATH (symlinks are removed, not followed). 0 or -1 + error. */
int ff_remove_tree(const char *path);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif
