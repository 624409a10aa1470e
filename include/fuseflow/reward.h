/* fuseflow: rewards: the rule-based helpers behind the built-in reward functions.
 *
 * Reward functions are used through the registry (registry.h: ff_reward_new(reg, name,
 * params) then ff_reward_score). Built-ins: `arith_exact_match`, `format` (rule-based, see
 * dataflow/reward.c); the RL controller adds `remote`, a reward server
 * (fuseflow/reward_client.h).
 */
#ifndef FUSEFLOW_REWARD_H
#define FUSEFLOW_REWARD_H

#include <stdbool.h>
#include <stddef.h>

#include "fuseflow/registry.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

/* ---- rule-based helpers ------------------------------------------------------------------ */
/* Normalise a number's text ("+0,012.50" -> "12.5", "-0" -> "0") into out. 0, or -1 when it
 * is not a number or does not fit. */
int ff_reward_normalize_number(const char *s, size_t len, char *out, size_t cap);
/* The answer in a response, normalised: the number after the last `marker` (when marker is
 * non-empty), else the first number (or the last, when last). 1 found, 0 not found. */
int ff_reward_extract_answer(const char *response, const char *marker, bool last, char *out, size_t cap);
/* The response is exactly one number, preceded by the marker when there is one. */
bool ff_reward_well_formed(const char *response, const char *marker);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif
