/* fuseflow: TensorBoard event files, written by fuseflow itself (no TensorFlow, no protobuf
 * library): the scalars of `fuseflow run` and `fuseflow sft` (`logger: [..., tensorboard]`),
 * so `tensorboard --logdir OUT` shows them.
 *
 * The format is TFRecord: records of
 *     uint64 length (little-endian) | uint32 masked CRC32C of those 8 bytes | data |
 *     uint32 masked CRC32C of data            (masked: ((c >> 15) | (c << 17)) + 0xa282ead8)
 * where each data is a serialized tensorflow.Event protobuf. The first is
 * {wall_time, file_version: "brain.Event:2"}; then one per metrics line,
 * {wall_time, step, summary {value {tag, simple_value}}...}; a resumed run first writes
 * {wall_time, step, session_log {status: START}}, on which TensorBoard drops the events it
 * had from that step on (the steps the resumed run writes again). Only these fields are
 * encoded (by hand: varints, fixed64 doubles, fixed32 floats, length-delimited strings).
 *
 * Not here: histograms, images, text; reading event files (the tests do that on their own). */
#ifndef FUSEFLOW_TFEVENTS_H
#define FUSEFLOW_TFEVENTS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

typedef struct ff_tfevents ff_tfevents;

/* A new event file in dir (which must exist): dir/events.out.tfevents.<unix seconds>.<host>
 * (".N" appended when that name is taken), holding the file_version record. NULL + error
 * naming the file. */
ff_tfevents *ff_tfevents_open(const char *dir);
/* The file's path. */
const char *ff_tfevents_path(const ff_tfevents *w);

/* One event at step: n scalars, tags[i] = values[i] (n may be 0). Flushed to the file before
 * it returns, so TensorBoard sees it live and a crash loses nothing written. wall_time in
 * seconds since the epoch (< 0: now). 0 or -1 + error naming the file. */
int ff_tfevents_scalars(ff_tfevents *w, int64_t step, double wall_time, size_t n, const char *const *tags, const float *values);
/* A metrics line as one event: its step is the integer line[step_key]; every other number
 * is a scalar tagged by its key, and the numbers in nested objects by their paths joined with
 * '/' ("time/iteration"); strings, arrays, null and booleans are skipped. A line without an
 * integer step_key is -1 + error. */
int ff_tfevents_json(ff_tfevents *w, const json_t *line, const char *step_key);
/* session_log START at step: TensorBoard forgets the events it read with step >= this one
 * (a resume rewrites them). 0 or -1 + error. */
int ff_tfevents_restart(ff_tfevents *w, int64_t step);

/* Close the file and NULL *w; -1 + error when the last write-back fails. */
int ff_tfevents_close(ff_tfevents **w);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif
