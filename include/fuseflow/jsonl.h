/* fuseflow: reading JSON Lines files (one JSON object per line) with errors that name the
 * file and line. Blank lines are skipped. Uses jansson; the objects returned are the
 * caller's (json_decref them). Strings may hold U+0000 ("\u0000" is valid JSON): take their
 * length from json_string_length, not strlen. */
#ifndef FUSEFLOW_JSONL_H
#define FUSEFLOW_JSONL_H

#include <jansson.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

typedef struct ff_jsonl ff_jsonl;

ff_jsonl *ff_jsonl_open(const char *path);          /* NULL + error */
/* Read an open stream (e.g. stdin), named `name` in messages; closing the reader leaves f
 * open. NULL + error only when out of memory. */
ff_jsonl *ff_jsonl_open_stream(FILE *f, const char *name);
void ff_jsonl_close(ff_jsonl **r);
/* Next object: 1 and *out set, 0 at the end, -1 + error ("data.jsonl:7: malformed JSON:
 * ..." or "...: expected a JSON object"). */
int ff_jsonl_next(ff_jsonl *r, json_t **out);
int ff_jsonl_line(const ff_jsonl *r);               /* line of the last object returned */
const char *ff_jsonl_path(const ff_jsonl *r);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif
