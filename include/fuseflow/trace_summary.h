/* fuseflow: summarising a timeline file (`fuseflow trace summary FILE [--json]`).
 *
 * Reads a Chrome Trace Event JSON file as ff_controller_trace_write writes it (and any file
 * with the same events) and reports: the span (first start to last end of jobs' slices);
 * per worker (a process with subtask slices) its subtasks, busy time (the union of its
 * slices) and idle time (span minus busy); per group its members, busy (the sum over
 * members of their busy time on the group's subtasks) and idle (members x span - busy);
 * the controller-side jobs per track; and the longest chain of dependent jobs: edges from
 * the `after` lists of job slices (args job, kind, after), a job's weight the time from its
 * first start to its last end, the chain with the largest total. The chain is reported link
 * by link (job, name, kind, start, end, the wait since the link before) and by kind.
 *
 * Not here: recording or writing traces (fuseflow/controller.h). */
#ifndef FUSEFLOW_TRACE_SUMMARY_H
#define FUSEFLOW_TRACE_SUMMARY_H

#include <stdbool.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

/* Summarise the trace at path onto out (as JSON with json=true). 0, or -1 + error (not a
 * file, not JSON, no traceEvents, no subtask slices). */
int ff_trace_summary(const char *path, FILE *out, bool json);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif
