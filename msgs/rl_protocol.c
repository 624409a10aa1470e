/* The names of the rl.* contract that need storage (include/fuseflow/rl_protocol.h). */
#include "fuseflow/rl_protocol.h"

const char *const ff_rl_col_names[FF_RL_NCOL] = {"old_logprob", "advantages", "ref_logprob", "old_values", "returns"};
const char *const ff_rl_role_names[FF_RL_NROLES] = {"actor", "gen", "critic", "ref", "reward"};
