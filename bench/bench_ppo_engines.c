/* Benchmark: one PPO iteration of the bundled arithmetic setting with fuseflow's in-worker
 * engines (workers/roles/, in one process, no runtime) beside a straightforward PyTorch
 * implementation of the same iteration (bench/ppo_torch.py), same model folder, same
 * prompts, same settings, same thread count, in the same run.
 *
 * One iteration: rollout (B prompts x n samples, continuous batching, one prefill per
 * prompt), exact-match reward, reference log-probs and critic values, token rewards with the
 * KL penalty, GAE (whitened), critic then actor training over shuffled mini-batches and
 * micro-batches, weight sync into the generating model.
 *
 * Settings come from a run config (default examples/ppo.yaml): data.train_batch_size,
 * the generate node's n / temperature / max tokens, the advantage node's gamma / lam /
 * kl_penalty (kl), the train nodes' mini/micro batch sizes, epochs, clip ratios and value
 * clip, the roles' learning rates and gradient clip. The model is --model DIR, or a fresh
 * tiny model (`fuseflow init --preset tiny`'s architecture) written to a temporary folder.
 * Prompts are 2-digit additions drawn with a fixed seed. A filter node (dynamic sampling),
 * if the config has one, is left out of the timed iteration: both sides train on every group.
 *
 * usage: bench_ppo_engines [--config FILE] [--model DIR] [--threads N] [--reps R] [--quick]
 *                          [--no-torch] [key=value overrides of the config ...]
 * Last line: ppo_iteration: <ms> ms (target: faster than PyTorch; <ratio>x PyTorch's <ms> ms) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuseflow/backend.h"
#include "fuseflow/graph.h"
#include "fuseflow/model.h"
#include "fuseflow/modelio.h"
#include "fuseflow/registry.h"
#include "fuseflow/roles.h"
#include "fuseflow/tokenizer.h"
#include "fuseflow/util.h"

static int die(const char *what) {
    fprintf(stderr, "bench_ppo_engines: %s: %s\n", what, ff_error_message());
    return 1;
}

enum { N_PROMPTS = 4096 };

typedef struct prompt {
    int32_t ids[16];
    int32_t n;
    char text[16], answer[8];
} prompt;

typedef struct stage_times {
    double generate, score, advantage, train_critic, train_actor, sync, total;
} stage_times;

typedef struct bench {
    const ff_run_config *run;
    ff_node *gen, *rew, *adv;
    const ff_node *ta, *tc;
    ff_model *actor, *gen_model, *ref, *critic;
    ff_trainer *tra, *trc;
    ff_rollout *ro;
    ff_sampling sp;
    const ff_tokenizer *tok;
    prompt *prompts;
    int64_t B, n;
} bench;

/* One PPO iteration over prompts [first, first + B). */
static int iteration(bench *b, int64_t first, uint64_t seed, stage_times *st, double *reward, double *len) {
    int64_t t0 = ff_now_ns();
    const int64_t B = b->B, N = b->n, S = B * N;
    for (int64_t i = 0; i < B; i++) {
        const prompt *p = &b->prompts[(first + i) % N_PROMPTS];
        ff_rollout_request q = {.id = (uint64_t)((first + i) % N_PROMPTS), .prompt = p->ids, .prompt_len = p->n,
                                .n = (int32_t)N, .sampling = b->sp, .seed = ff_seed_stream(seed, (uint64_t)first, (uint64_t)i)};
        if (ff_rollout_add(b->ro, &q)) return -1;
    }
    ff_gen_output *outs;
    int32_t n_outs;
    if (ff_rollout_run(b->ro, &outs, &n_outs)) return -1;
    int64_t t1 = ff_now_ns();
    int rc = -1;
    ff_reward_item *items = ff_calloc((size_t)S, sizeof *items);
    char **texts = ff_calloc((size_t)S, sizeof *texts);
    float *score = ff_calloc((size_t)S, sizeof *score);
    int32_t *off = ff_calloc((size_t)S + 1, sizeof *off), *group = ff_calloc((size_t)S, sizeof *group);
    ff_rl_sample *smp = ff_calloc((size_t)S, sizeof *smp);
    float **p_ref = ff_calloc((size_t)S, sizeof *p_ref), **p_val = ff_calloc((size_t)S, sizeof *p_val);
    float *old = NULL, *reflp = NULL, *vals = NULL, *advs = NULL, *rets = NULL;
    if (!items || !texts || !score || !off || !group || !smp || !p_ref || !p_val) goto out;
    double rsum = 0;
    for (int64_t i = 0; i < S; i++) {
        size_t tl;
        if (ff_tokenizer_decode(b->tok, outs[i].tokens, outs[i].n_tokens, true, &texts[i], &tl)) goto out;
        const prompt *p = &b->prompts[outs[i].id];
        items[i] = (ff_reward_item){p->text, texts[i], p->answer, NULL};
        off[i + 1] = off[i] + outs[i].n_tokens;
        group[i] = (int32_t)(i / N);
    }
    if (ff_node_reward(b->rew, items, (size_t)S, score)) goto out;
    size_t T = (size_t)off[S] + 1;
    old = ff_malloc(T * 4), reflp = ff_malloc(T * 4), vals = ff_malloc(T * 4), advs = ff_malloc(T * 4), rets = ff_malloc(T * 4);
    if (!old || !reflp || !vals || !advs || !rets) goto out;
    for (int64_t i = 0; i < S; i++) {
        const prompt *p = &b->prompts[outs[i].id];
        memcpy(old + off[i], outs[i].logprobs, (size_t)outs[i].n_tokens * 4);
        smp[i] = (ff_rl_sample){.prompt = p->ids, .prompt_len = p->n, .response = outs[i].tokens, .response_len = outs[i].n_tokens,
                                .old_logprob = old + off[i], .ref_logprob = reflp + off[i], .old_values = vals + off[i],
                                .advantages = advs + off[i], .returns = rets + off[i]};
        p_ref[i] = reflp + off[i];
        p_val[i] = vals + off[i];
        rsum += score[i];
    }
    ff_score_opts so = {.micro_batch_size = (int32_t)b->ta->train.micro_batch_size, .temperature = b->sp.temperature};
    if (ff_score_logprobs(b->ref, smp, (int32_t)S, &so, p_ref, NULL)) goto out;
    so.temperature = 0;
    if (ff_score_values(b->critic, smp, (int32_t)S, &so, p_val)) goto out;
    int64_t t2 = ff_now_ns();
    ff_node_adv_in ai = {.seqs = {(int32_t)S, off, NULL}, .scores = score, .values = vals, .old_logp = old, .ref_logp = reflp,
                         .group = group};
    double mean_kl = 0;
    if (ff_node_advantage(b->adv, &ai, advs, rets, &mean_kl)) goto out;
    int64_t t3 = ff_now_ns();
    ff_train_batch_opts co = {(int32_t)(b->tc->train.mini_batch_size * N), (int32_t)b->tc->train.micro_batch_size, 0,
                              (int32_t)b->tc->train.epochs, b->tc->train.shuffle, seed + 1};
    if (ff_trainer_train_batch(b->trc, smp, (int32_t)S, &co, NULL)) goto out;
    int64_t t4 = ff_now_ns();
    ff_train_batch_opts ao = {(int32_t)(b->ta->train.mini_batch_size * N), (int32_t)b->ta->train.micro_batch_size, 0,
                              (int32_t)b->ta->train.epochs, b->ta->train.shuffle, seed + 2};
    if (ff_trainer_train_batch(b->tra, smp, (int32_t)S, &ao, NULL)) goto out;
    int64_t t5 = ff_now_ns();
    if (ff_rollout_sync_weights(b->ro, b->actor)) goto out;
    int64_t t6 = ff_now_ns();
    *st = (stage_times){(t1 - t0) * 1e-9, (t2 - t1) * 1e-9, (t3 - t2) * 1e-9, (t4 - t3) * 1e-9, (t5 - t4) * 1e-9,
                        (t6 - t5) * 1e-9, (t6 - t0) * 1e-9};
    *reward = rsum / (double)S;
    *len = (double)off[S] / (double)S;
    rc = 0;
out:
    for (int64_t i = 0; i < n_outs; i++) {
        if (texts && texts[i]) free(texts[i]);
        ff_gen_output_free(&outs[i]);
    }
    free(outs), free(items), free(texts), free(score), free(off), free(group), free(smp), free(p_ref), free(p_val);
    free(old), free(reflp), free(vals), free(advs), free(rets);
    return rc;
}

static const ff_node *find_node(const ff_graph *g, ff_op op, ff_role role) {
    for (size_t i = 0; i < ff_graph_n_nodes(g); i++) {
        const ff_node *n = ff_graph_node(g, i);
        if (n->op == op && (role == FF_ROLE_NONE || n->role == role)) return n;
    }
    return NULL;
}

static double cnode_double(ff_cnode *params, const char *key, double dflt) {
    double v = dflt;
    if (params && ff_cnode_get_double(params, key, dflt, &v) < 0) v = dflt;
    return v;
}

/* A fresh tiny model (fuseflow init --preset tiny) in dir. */
static int write_tiny(const char *dir) {
    ff_model_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.model_type, sizeof c.model_type, "llama");
    c.vocab_size = FF_BYTES_VOCAB;
    c.hidden_size = 128;
    c.intermediate_size = 512;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 32;
    c.max_position_embeddings = 256;
    c.rope_theta = 10000;
    c.rms_norm_eps = 1e-5;
    c.tie_word_embeddings = true;
    c.bos_token_id = FF_BYTES_BOS;
    c.pad_token_id = FF_BYTES_PAD;
    c.eos_token_ids[0] = FF_BYTES_EOS;
    c.n_eos = 1;
    ff_tensor_set *w = ff_tensor_set_new();
    ff_tokenizer *tok = ff_tokenizer_new_bytes();
    int rc = (!w || !tok || ff_model_init_weights(&c, 1, 0.02, w) || ff_model_dir_save(dir, &c, w, tok, FF_DTYPE_F32)) ? -1 : 0;
    ff_tensor_set_destroy(&w);
    ff_tokenizer_destroy(&tok);
    return rc;
}

static ff_model *load(ff_backend *be, const char *dir, bool critic) {
    ff_model_config c;
    ff_tensor_set *w;
    if (ff_model_dir_load(dir, &c, &w)) return NULL;
    if (critic && ff_roles_add_value_head(&c, w, 0.0, 1)) {
        ff_tensor_set_destroy(&w);
        return NULL;
    }
    ff_model *m = ff_model_new(be, &c, w);
    ff_tensor_set_destroy(&w);
    return m;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Run ppo_torch.py; returns its median iteration seconds (or -1). */
static double run_torch(const char *env, const char *src, const char *model, const char *prompts_path, const bench *b, int threads,
                        int reps, double kl_coef, double gamma, double lam, bool whiten, double clip_value, char *stages,
                        size_t cap) {
    const ff_run_config *run = b->run;
    char cmd[4096];
    ff_cnode *ap = b->ta->params;
    double clip = cnode_double(ap, "clip_ratio", 0.2), clip_c = cnode_double(ap, "clip_ratio_c", 3.0);
    snprintf(cmd, sizeof cmd,
             "%s /usr/bin/python3 %s/bench/ppo_torch.py --model '%s' --prompts '%s' --threads %d --reps %d --batch %lld --n %lld "
             "--max-new %d --temperature %g --mini %lld --micro %lld --epochs %lld --lr %g --critic-lr %g --kl-coef %g --gamma %g "
             "--lam %g --clip %g --clip-c %g --clip-value %g --grad-clip %g --critic-mini %lld --critic-micro %lld %s",
             env, src, model, prompts_path, threads, reps, (long long)b->B, (long long)b->n, b->sp.max_new_tokens,
             (double)b->sp.temperature, (long long)(b->ta->train.mini_batch_size * b->n), (long long)b->ta->train.micro_batch_size,
             (long long)b->ta->train.epochs, run->roles[FF_ROLE_ACTOR].optim.lr, run->roles[FF_ROLE_CRITIC].optim.lr, kl_coef, gamma,
             lam, clip, clip_c, clip_value, run->roles[FF_ROLE_ACTOR].optim.grad_clip, (long long)(b->tc->train.mini_batch_size * b->n),
             (long long)b->tc->train.micro_batch_size, whiten ? "" : "--no-whiten");
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    char line[4096];
    double iter_s = -1;
    while (fgets(line, sizeof line, p)) {
        if (!strncmp(line, "{\"iter_s\":", 10)) {
            iter_s = atof(line + 10);
            snprintf(stages, cap, "%s", line);
        } else {
            printf("  %s", line);
        }
    }
    if (pclose(p) != 0) return -1;
    return iter_s;
}

int main(int argc, char **argv) {
    const char *cfg_path = "examples/ppo.yaml", *model_dir = NULL;
    int threads = 2, reps = 3;
    bool torch = true;
    char **over = ff_calloc((size_t)argc + 1, sizeof *over);
    int n_over = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc) cfg_path = argv[++i];
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) model_dir = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) reps = 1;
        else if (!strcmp(argv[i], "--no-torch")) torch = false;
        else if (strchr(argv[i], '=') && argv[i][0] != '-') over[n_over++] = argv[i];
        else {
            fprintf(stderr, "usage: bench_ppo_engines [--config FILE] [--model DIR] [--threads N] [--reps R] [--quick] [--no-torch] "
                            "[key=value ...]\n");
            return 2;
        }
    }
    if (threads < 1 || reps < 1) return fprintf(stderr, "bench_ppo_engines: --threads and --reps must be >= 1\n"), 2;
    const char *src = getenv("FF_SOURCE_DIR");
    if (!src || !*src) src = ".";
    ff_registry *reg = ff_registry_new();
    ff_run_config *run = reg ? ff_run_config_load(cfg_path, n_over, over, reg) : NULL;
    if (!run) return die(cfg_path);
    bench b = {.run = run};
    b.gen = (ff_node *)find_node(run->graph, FF_OP_GENERATE, FF_ROLE_ACTOR);
    b.rew = (ff_node *)find_node(run->graph, FF_OP_REWARD_FN, FF_ROLE_NONE);
    b.adv = (ff_node *)find_node(run->graph, FF_OP_ADVANTAGE, FF_ROLE_NONE);
    b.ta = find_node(run->graph, FF_OP_TRAIN, FF_ROLE_ACTOR);
    b.tc = find_node(run->graph, FF_OP_TRAIN, FF_ROLE_CRITIC);
    if (!b.gen || !b.rew || !b.adv || !b.ta || !b.tc || !find_node(run->graph, FF_OP_LOGPROB, FF_ROLE_REF) ||
        strcmp(ff_advantage_def_of(b.adv->adv)->name, "gae") != 0)
        return fprintf(stderr, "bench_ppo_engines: %s is not a PPO graph (generate, reward_fn, ref logprob, gae advantage, "
                               "critic and actor train nodes)\n", cfg_path), 2;
    if (b.adv->kl_penalty && strcmp(b.adv->kl_penalty->name, "kl") != 0)
        return fprintf(stderr, "bench_ppo_engines: the PyTorch side implements the k1 ('kl') KL penalty only\n"), 2;
    if (b.ta->train.kl_loss || b.ta->train.entropy_coeff != 0)
        return fprintf(stderr, "bench_ppo_engines: the PyTorch side implements no KL loss and no entropy bonus\n"), 2;
    double kl_coef = b.adv->kl_penalty ? b.adv->kl_ctl.coef : 0;
    double gamma = cnode_double(b.adv->params, "gamma", 1.0), lam = cnode_double(b.adv->params, "lam", 1.0);
    bool whiten = true;
    if (b.adv->params) ff_cnode_get_bool(b.adv->params, "whiten", true, &whiten);
    double clip_value = b.tc->train.value.clip;

    char tmp[] = "/tmp/ff_bench_ppo_XXXXXX";
    if (!mkdtemp(tmp)) return fprintf(stderr, "bench_ppo_engines: cannot make a temporary folder\n"), 1;
    char model_tmp[FF_PATH_MAX], prompts_path[FF_PATH_MAX];
    snprintf(model_tmp, sizeof model_tmp, "%s/model", tmp);
    snprintf(prompts_path, sizeof prompts_path, "%s/prompts.jsonl", tmp);
    if (!model_dir) {
        if (write_tiny(model_tmp)) return die("tiny model");
        model_dir = model_tmp;
    }
    char be_name[32];
    snprintf(be_name, sizeof be_name, "cpu:%d", threads);
    ff_backend *be = ff_backend_new(be_name);
    if (!be) return die("backend");
    b.actor = load(be, model_dir, false);
    b.gen_model = load(be, model_dir, false);
    b.ref = load(be, model_dir, false);
    b.critic = load(be, model_dir, true);
    ff_tokenizer *tok = ff_tokenizer_load_dir(model_dir);
    if (!b.actor || !b.gen_model || !b.ref || !b.critic || !tok) return die(model_dir);
    b.tok = tok;
    if (ff_tokenizer_vocab_size(tok) != FF_BYTES_VOCAB)
        return fprintf(stderr, "bench_ppo_engines: the model must use the byte tokenizer of the bundled task\n"), 2;

    /* prompts: 2-digit additions, as byte ids (the byte tokenizer adds nothing) */
    b.prompts = ff_calloc(N_PROMPTS, sizeof *b.prompts);
    FILE *pf = fopen(prompts_path, "w");
    if (!b.prompts || !pf) return die("prompts");
    ff_rng rng;
    ff_rng_seed(&rng, 12345);
    for (int i = 0; i < N_PROMPTS; i++) {
        prompt *p = &b.prompts[i];
        int x = 10 + (int)ff_rng_below(&rng, 90), y = 10 + (int)ff_rng_below(&rng, 90);
        snprintf(p->text, sizeof p->text, "%d+%d=", x, y);
        snprintf(p->answer, sizeof p->answer, "%d", x + y);
        p->n = (int32_t)strlen(p->text);
        fprintf(pf, "{\"ids\": [");
        for (int32_t k = 0; k < p->n; k++) {
            p->ids[k] = (unsigned char)p->text[k];
            fprintf(pf, "%s%d", k ? ", " : "", p->ids[k]);
        }
        fprintf(pf, "], \"answer\": \"%s\"}\n", p->answer);
    }
    fclose(pf);

    b.B = run->data.train_batch_size;
    b.n = b.gen->gen.n;
    ff_roles_sampling_from_node(run, b.gen, &b.sp);
    int64_t steps = run->trainer.steps;
    ff_trainer_config ac, cc;
    if (ff_roles_trainer_config_from_node(run, b.ta, steps, &ac) || ff_roles_trainer_config_from_node(run, b.tc, steps, &cc))
        return die("trainer settings");
    b.tra = ff_trainer_new(b.actor, &ac);
    b.trc = ff_trainer_new(b.critic, &cc);
    ff_rollout_config rc;
    ff_rollout_config_default(&rc);
    rc.max_slots = (int32_t)(b.B * b.n);
    rc.max_seq_len = 32 + b.sp.max_new_tokens;
    b.ro = ff_rollout_new(b.gen_model, &rc);
    if (!b.tra || !b.trc || !b.ro) return die("engines");

    printf("bench_ppo_engines: %s, model %s, %lld prompts x %lld samples, %d new tokens max, %d threads\n", cfg_path,
           model_dir == model_tmp ? "fresh tiny (random weights)" : model_dir, (long long)b.B, (long long)b.n, b.sp.max_new_tokens,
           threads);
    double *times = ff_calloc((size_t)reps, sizeof *times);
    stage_times med = {0}, *all = ff_calloc((size_t)reps, sizeof *all);
    if (!times || !all) return die("alloc");
    for (int r = 0; r <= reps; r++) { /* iteration 0 warms up */
        stage_times st;
        double reward, len;
        if (iteration(&b, (int64_t)r * b.B, 1 + (uint64_t)r, &st, &reward, &len)) return die("iteration");
        printf("fuseflow iteration %d: %.3f s (reward %.3f, mean response %.2f tokens)%s\n", r, st.total, reward, len,
               r == 0 ? "  [warm-up]" : "");
        if (r > 0) {
            times[r - 1] = st.total;
            all[r - 1] = st;
        }
    }
    qsort(times, (size_t)reps, sizeof *times, cmp_double);
    double ff_s = times[reps / 2];
    for (int r = 0; r < reps; r++)
        if (all[r].total == ff_s) med = all[r];
    printf("fuseflow stages (median iteration): generate %.3f, score %.3f, advantage %.4f, train critic %.3f, train actor %.3f, "
           "sync %.4f s\n", med.generate, med.score, med.advantage, med.train_critic, med.train_actor, med.sync);

    double torch_s = -1;
    if (torch) {
        char stages[4096] = "", st2[4096] = "";
        /* Debian's PyTorch runs the pthreads OpenBLAS beside its OpenMP threads; both settings
         * run and PyTorch is credited with the faster (bench_model does the same) */
        double a = run_torch("", src, model_dir, prompts_path, &b, threads, reps, kl_coef, gamma, lam, whiten, clip_value, stages,
                             sizeof stages);
        double c = run_torch("OPENBLAS_NUM_THREADS=1", src, model_dir, prompts_path, &b, threads, reps, kl_coef, gamma, lam, whiten,
                             clip_value, st2, sizeof st2);
        if (a < 0 && c < 0) {
            fprintf(stderr, "bench_ppo_engines: the PyTorch side failed (is python3-torch installed? scripts/deps.sh --bench)\n");
        } else {
            torch_s = a < 0 ? c : c < 0 ? a : fmin(a, c);
            printf("pytorch stages (median iteration): %s", torch_s == a ? stages : st2);
        }
    }
    char rmcmd[FF_PATH_MAX];
    snprintf(rmcmd, sizeof rmcmd, "rm -rf '%s'", tmp);
    if (system(rmcmd) != 0) fprintf(stderr, "bench_ppo_engines: could not remove %s\n", tmp);
    if (torch_s > 0)
        printf("ppo_iteration: %.1f ms (target: faster than PyTorch; %.2fx PyTorch's %.1f ms)\n", ff_s * 1e3, torch_s / ff_s,
               torch_s * 1e3);
    else
        printf("ppo_iteration: %.1f ms (target: faster than PyTorch; PyTorch not run)\n", ff_s * 1e3);
    ff_rollout_destroy(&b.ro);
    ff_trainer_destroy(&b.tra);
    ff_trainer_destroy(&b.trc);
    ff_model_destroy(&b.actor);
    ff_model_destroy(&b.gen_model);
    ff_model_destroy(&b.ref);
    ff_model_destroy(&b.critic);
    ff_tokenizer_destroy(&tok);
    ff_backend_destroy(&be);
    ff_run_config_destroy(&run);
    ff_registry_destroy(&reg);
    free(b.prompts), free(times), free(all), free(over);
    return 0;
}
