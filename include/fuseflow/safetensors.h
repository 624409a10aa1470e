/* fuseflow: safetensors checkpoint files (Hugging Face's format), read and written.
 *
 * A file is: 8 bytes little-endian N, N bytes of JSON header, then the data. The header maps
 * each tensor name to {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]} (offsets
 * relative to the start of the data), plus an optional "__metadata__" map of strings.
 *
 * Reading maps the file (mmap) and checks the whole header before anything is used: the
 * length fits the file, the JSON is an object, every entry has a known dtype, a shape of
 * non-negative integers, offsets with begin <= end inside the data, end - begin equal to
 * numel * dtype size, and no two tensors overlap. Every error names the file and the tensor.
 *
 * Writing goes to PATH.tmp.PID, is fsync'd and renamed over PATH: nothing partial is ever
 * visible under PATH. Tensors are written as F32, BF16 or F16 from host fp32 tensor sets.
 *
 * Sharded checkpoints (model.safetensors.index.json with a "weight_map" from tensor name to
 * shard file) load through ff_safetensors_load_index(), and ff_safetensors_load_dir() picks
 * whichever of the two a model folder has.
 *
 * A reader may take only a block of a tensor (ff_safetensors_read_block): since the file is
 * mapped, only the pages of that block are read from disk, which is how a tensor-parallel
 * rank loads its shard of a whole checkpoint (ff_model_tp_read_weights).
 *
 * Not here: big-endian hosts (the format is little-endian; we assume the host is too), lazy
 * loading into device memory (the model copies host tensors to its backend).
 */
#ifndef FUSEFLOW_SAFETENSORS_H
#define FUSEFLOW_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "fuseflow/dtype.h"
#include "fuseflow/tensor_set.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

/* Headers larger than this are refused (Hugging Face's own limit is 100 MB). */
#define FF_SAFETENSORS_MAX_HEADER (100u * 1024u * 1024u)

typedef struct ff_st_entry {
    const char *name;
    ff_dtype dtype;
    int ndim;
    int64_t shape[FF_MAX_DIMS];
    uint64_t begin, end; /* byte offsets in the data section, end - begin = numel * size */
} ff_st_entry;

/* An open (mapped) safetensors file, or a parsed in-memory buffer. */
typedef struct ff_safetensors ff_safetensors;

/* Open and validate a file. NULL + error ("PATH: ...") on any problem. */
ff_safetensors *ff_safetensors_open(const char *path);
/* Validate a buffer already in memory (not copied: it must outlive the handle). name is used
 * in messages. NULL + error. */
ff_safetensors *ff_safetensors_parse(const void *data, size_t len, const char *name);
void ff_safetensors_close(ff_safetensors **f);

const char *ff_safetensors_name(const ff_safetensors *f);
size_t ff_safetensors_count(const ff_safetensors *f);
/* Entries in the order of their data offsets. */
const ff_st_entry *ff_safetensors_entry(const ff_safetensors *f, size_t i);
const ff_st_entry *ff_safetensors_find(const ff_safetensors *f, const char *name);
/* Raw little-endian bytes of a tensor (end - begin of them). */
const void *ff_safetensors_bytes(const ff_safetensors *f, const ff_st_entry *e);
/* A "__metadata__" value, or NULL. */
const char *ff_safetensors_metadata(const ff_safetensors *f, const char *key);

/* Convert one tensor to fp32 and add it to `out` under its name (or `as` when not NULL).
 * Integer and F64 tensors convert too; -1 + error for dtypes that do not (none today). The
 * tensor's mapped pages then leave this process's resident memory (read again, they are
 * mapped again), so loading a checkpoint holds its fp32 copy and one tensor of the file,
 * not the whole file as well. */
int ff_safetensors_read(const ff_safetensors *f, const ff_st_entry *e, ff_tensor_set *out, const char *as);

/* Convert rows [r0, r0 + nr) x columns [c0, c0 + nc) of a tensor seen as 2-D (a vector is
 * one column) to fp32 and add it to `out` under its name (or `as`) with the block's shape
 * ([nr] for a vector). Reads only those bytes of the mapping: one range for whole rows, one
 * per row otherwise. -1 + error for a block outside the tensor or a tensor of more than 2
 * dimensions. */
int ff_safetensors_read_block(const ff_safetensors *f, const ff_st_entry *e, int64_t r0, int64_t nr, int64_t c0,
                              int64_t nc, ff_tensor_set *out, const char *as);

/* The same block into out [nr, nc] (caller memory, fp32), the mapped pages it read then
 * dropped from this process's resident memory (as ff_safetensors_read does). 0 or -1 + error. */
int ff_safetensors_read_rows(const ff_safetensors *f, const ff_st_entry *e, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                             float *out);

/* A model folder's checkpoint open as a whole, read nothing yet: DIR/model.safetensors, or
 * DIR/model.safetensors.index.json and every shard it names (each mapped and its header
 * checked, every listed tensor found in its shard). For a reader that takes the tensors it
 * wants, when it wants them (ff_model_load_dir: a block at a time, straight into a model),
 * so that no whole fp32 copy of the checkpoint is ever held. NULL + error. */
typedef struct ff_st_dir ff_st_dir;
ff_st_dir *ff_st_dir_open(const char *dir);
void ff_st_dir_close(ff_st_dir **d);
size_t ff_st_dir_count(const ff_st_dir *d);
/* Tensor i (0 <= i < count), and in *file the open file that holds it. */
const ff_st_entry *ff_st_dir_entry(const ff_st_dir *d, size_t i, const ff_safetensors **file);
/* Tensor `name`, and its file, or NULL (no error set). */
const ff_st_entry *ff_st_dir_find(const ff_st_dir *d, const char *name, const ff_safetensors **file);

/* Which block of tensor e a reader wants: *r0, *nr, *c0, *nc come preset to the whole tensor
 * (as 2-D, a vector one column) and may be narrowed; *nr -1: the tensor is not read at all.
 * Called for tensors of 1 or 2 dims. */
typedef void (*ff_st_block_fn)(void *ctx, const ff_st_entry *e, int64_t *r0, int64_t *nr, int64_t *c0, int64_t *nc);

/* Load every tensor of a file into `out` as fp32. 0 or -1 + error. */
int ff_safetensors_load(const char *path, ff_tensor_set *out);
/* Load a sharded checkpoint from its index file: every tensor of the weight map, from its
 * shard (a file name in the index's folder). 0 or -1 + error. */
int ff_safetensors_load_index(const char *index_path, ff_tensor_set *out);
/* DIR/model.safetensors, else DIR/model.safetensors.index.json. 0 or -1 + error. */
int ff_safetensors_load_dir(const char *dir, ff_tensor_set *out);
/* The same, each tensor as the block fn chooses (NULL: whole). 0 or -1 + error. */
int ff_safetensors_load_dir_blocks(const char *dir, ff_st_block_fn fn, void *ctx, ff_tensor_set *out);

/* Write every tensor of `set` to PATH as `dtype` (F32, BF16 or F16), atomically. metadata is
 * NULL or a NULL-terminated list of key, value strings for "__metadata__". 0 or -1 + error. */
int ff_safetensors_save(const char *path, const ff_tensor_set *set, ff_dtype dtype, const char *const *metadata);
/* Write a sharded checkpoint into DIR: model-0000I-of-0000N.safetensors files of at most
 * max_shard_bytes of data each (a tensor larger than that gets a shard of its own) and
 * model.safetensors.index.json. With one shard, writes DIR/model.safetensors and no index.
 * Each file is written atomically; the index last. 0 or -1 + error. */
int ff_safetensors_save_sharded(const char *dir, const ff_tensor_set *set, ff_dtype dtype, uint64_t max_shard_bytes);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif
