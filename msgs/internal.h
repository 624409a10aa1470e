/* Helpers shared by the files of ff_msgs; not part of the public API. */
#ifndef FF_MSGS_INTERNAL_H
#define FF_MSGS_INTERNAL_H

#include "fuseflow/msgs.h"

/* Room for n tensors in m (frames moved with zmq_msg_move). 0 or -1 + error. */
int msgs_reserve(ff_msg *m, int n);

#endif
