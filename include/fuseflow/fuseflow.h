/* fuseflow: the public C API, one include for embedding programs and plugins. */
#ifndef FUSEFLOW_H
#define FUSEFLOW_H

#include "fuseflow/config.h"
#include "fuseflow/error.h"
#include "fuseflow/jsonl.h"
#include "fuseflow/util.h"

#define FF_VERSION_STRING "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif

/* The library's version, "MAJOR.MINOR.PATCH". */
const char *ff_version(void);

#ifdef __cplusplus
}
#endif
#endif
