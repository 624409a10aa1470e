/* The one symbol libfuseflow.so defines itself; everything else comes from the subsystem
 * archives linked in whole. */
#include "fuseflow/fuseflow.h"

const char *ff_version(void) { return FF_VERSION_STRING; }
