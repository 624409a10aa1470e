/* fuseflow roles: what the engines share inside workers/roles (not a public header).
 *
 * rl_pack packs samples (prompt + response each) into one ff_batch and remembers, for every
 * response token, the packed position that predicts it, so per-token columns move between
 * the response layout ([Tr], rlhf.h's packed sequences) and the model's ([T]). Buffers grow
 * and are reused: a trainer or a scoring call allocates only when a batch is larger than any
 * before. */
#ifndef FF_ROLES_INTERNAL_H
#define FF_ROLES_INTERNAL_H

#include "fuseflow/roles.h"

typedef struct rl_pack {
    int32_t T, S, Tr;
    bool has_targets;
    int32_t *tokens, *starts, *targets; /* [T], [S + 1], [T] */
    int32_t *resp_off;                  /* [S + 1] response offsets: sample s owns [resp_off[s], resp_off[s+1]) */
    int32_t *resp_pos;                  /* [Tr] packed position predicting each response token */
    float *t_a, *t_b, *t_c;             /* [T] model outputs (log-probs, entropy, values) */
    float *t_da, *t_db, *t_dc;          /* [T] their gradients */
    float *r[12];                       /* [Tr] response-layout scratch columns */
    size_t cap_t, cap_s, cap_r;
} rl_pack;

/* Pack samples[idx[0..n)] (idx NULL: samples[0..n)). with_targets: fill targets (log-probs).
 * 0 or -1 + error (a sample with an empty prompt, allocation). */
int rl_pack_build(rl_pack *p, const ff_rl_sample *samples, const int32_t *idx, int32_t n, bool with_targets);
void rl_pack_free(rl_pack *p);
/* The ff_batch of the last build. */
ff_batch rl_pack_batch(const rl_pack *p);
/* dst [Tr] <- src [T] at the response positions. */
void rl_pack_gather(const rl_pack *p, const float *src, float *dst);
/* dst [T] <- 0 everywhere, then src [Tr] at the response positions. */
void rl_pack_scatter(const rl_pack *p, const float *src, float *dst);
typedef enum { RL_COL_MASK = 0, RL_COL_OLD_LOGPROB, RL_COL_ADVANTAGES, RL_COL_REF_LOGPROB, RL_COL_OLD_VALUES, RL_COL_RETURNS } rl_col;
const char *rl_col_name(rl_col c);
/* dst [Tr] <- column c of each packed sample. A sample without it: `fill` when allowed
 * (allow_missing), else -1 + error naming the sample and the column. */
int rl_pack_column(const rl_pack *p, const ff_rl_sample *samples, const int32_t *idx, rl_col c, bool allow_missing, float fill,
                   float *dst);

/* ---- pipelines (pipe.c) ---- */

/* p given, with a transport of more than one rank. */
bool rl_pipe_on(const ff_roles_pipe *p);
int32_t rl_pipe_vpp(const ff_roles_pipe *p); /* 0 means 1 */
/* m against p: a stage model needs a pipeline and a whole model takes none; a stage's chunks
 * are the layers ff_roles_pipe_stage places on the transport's rank. 0 or -1 + error naming
 * `where` and the mismatch. */
int rl_pipe_check(const ff_model *m, const ff_roles_pipe *p, const char *where);
/* A sample of one prompt token and no response: the micro-batch that fills a schedule (the
 * smallest forward; its outputs are dropped, its gradients zero). */
const ff_rl_sample *rl_pipe_pad(void);
/* The schedule of p's placement for n_micro micro-batches of m (training or forward-only). */
int rl_pipe_schedule(const ff_model *m, const ff_roles_pipe *p, int32_t n_micro, bool forward_only, ff_pipe_schedule *out);

#endif
