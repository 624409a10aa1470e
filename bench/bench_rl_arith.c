/* Benchmark: the RL recipe of the bundled arithmetic task in one process, with the roles
 * engines (workers/roles/) and no runtime: how far a run config's algorithm lifts held-out
 * exact match, and how long it takes. It is the in-process baseline of `fuseflow run` (which
 * adds the controller, the workers and their messages) and the source of the numbers in
 * docs/rl-recipe.md.
 *
 * Each iteration runs the graph's stages in order: generate (B prompts x n samples, the
 * rollout engine) -> reward_fn -> logprob (ref, when the graph has one) -> value (critic, when
 * it has one) -> advantage (the node's estimator and KL penalty) -> train critic -> train
 * actor (shuffled mini-batches, balanced micro-batches) -> sync weights. Greedy held-out exact
 * match (the arith_exact_match reward on data.val_files) before the first iteration, every
 * trainer.test_freq iterations and at the end. Evaluation time is not counted in the wall
 * time. Prompt order and sampling seeds follow trainer.seed.
 *
 * Needs the data and the SFT model the config names (examples/grpo_arith.yaml says how).
 * Graphs with a filter node (dynamic sampling, as in examples/grpo_arith.yaml) are refused:
 * `fuseflow run` executes those.
 *
 * usage: bench_rl_arith CONFIG [--minutes M] [--eval-n N] [--threads T] [--log FILE] [key=value ...]
 * Last line: rl_arith: <acc>% held-out exact match after <k> iterations in <min> min
 *            (target: > 80% within 15 min; start <acc0>%) */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/backend.h"
#include "fuseflow/graph.h"
#include "fuseflow/jsonl.h"
#include "fuseflow/model.h"
#include "fuseflow/modelio.h"
#include "fuseflow/registry.h"
#include "fuseflow/roles.h"
#include "fuseflow/tokenizer.h"
#include "fuseflow/util.h"

/* The ff_train_batch_opts seeds of the two trained roles (ff_seed_stream's b, a: iteration):
 * their own streams, apart from the prompts' sampling seeds (b: the prompt's index). */
#define SEED_TAG_CRITIC_TRAIN (1u << 30)
#define SEED_TAG_ACTOR_TRAIN (1u << 31)

static void die(const char *what) {
    fprintf(stderr, "bench_rl_arith: %s: %s\n", what, ff_error_message());
    exit(1);
}

typedef struct example {
    char *prompt, *answer;
    int32_t *ids;
    int32_t n;
} example;

static example *load_data(const ff_run_config *run, const char *path, const ff_tokenizer *tok, int64_t *n_out) {
    ff_jsonl *r = ff_jsonl_open(path);
    if (!r) die(path);
    example *v = NULL;
    int64_t n = 0, cap = 0;
    json_t *o;
    int got;
    while ((got = ff_jsonl_next(r, &o)) == 1) {
        if (n == cap) {
            cap = cap ? 2 * cap : 1024;
            example *nv = ff_realloc(v, (size_t)cap * sizeof *v);
            if (!nv) die("data");
            v = nv;
        }
        const char *p = json_string_value(json_object_get(o, run->data.prompt_key));
        const char *a = json_string_value(json_object_get(o, run->data.answer_key));
        if (!p || !a) {
            ff_error_set(path, NULL, "line %d has no string '%s' and '%s'", ff_jsonl_line(r), run->data.prompt_key, run->data.answer_key);
            die("data");
        }
        ff_encode_opts eo = {true, true};
        v[n].prompt = ff_strdup(p);
        v[n].answer = ff_strdup(a);
        if (!v[n].prompt || !v[n].answer || ff_tokenizer_encode(tok, p, strlen(p), &eo, &v[n].ids, &v[n].n)) die(path);
        n++;
        json_decref(o);
    }
    if (got < 0 || n == 0) die(path);
    ff_jsonl_close(&r);
    *n_out = n;
    return v;
}

static void free_data(example *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) free(v[i].prompt), free(v[i].answer), free(v[i].ids);
    free(v);
}

static ff_model *load_model(ff_backend *be, const char *dir, bool critic) {
    ff_model_config cfg;
    ff_tensor_set *w;
    if (ff_model_dir_load(dir, &cfg, &w)) die(dir);
    if (critic && ff_roles_add_value_head(&cfg, w, 0.0, 1)) die("value head");
    ff_model *m = ff_model_new(be, &cfg, w);
    if (!m) die(dir);
    ff_tensor_set_destroy(&w);
    return m;
}

/* Greedy held-out exact match over the first n examples. */
static double evaluate(ff_model *m, const ff_tokenizer *tok, ff_reward *exact, const example *d, int64_t n, int32_t max_new) {
    ff_rollout_config rc;
    ff_rollout_config_default(&rc);
    rc.max_slots = 256;
    rc.max_seq_len = 64 + max_new;
    ff_rollout *r = ff_rollout_new(m, &rc);
    if (!r) die("eval rollout");
    for (int64_t i = 0; i < n; i++) {
        ff_rollout_request q = {.id = (uint64_t)i, .prompt = d[i].ids, .prompt_len = d[i].n, .n = 1, .seed = 1};
        ff_sampling_default(&q.sampling);
        q.sampling.temperature = 0;
        q.sampling.max_new_tokens = max_new;
        if (ff_rollout_add(r, &q)) die("eval request");
    }
    ff_gen_output *outs;
    int32_t no;
    if (ff_rollout_run(r, &outs, &no)) die("eval");
    double hits = 0;
    for (int32_t i = 0; i < no; i++) {
        char *text;
        size_t tl;
        if (ff_tokenizer_decode(tok, outs[i].tokens, outs[i].n_tokens, true, &text, &tl)) die("decode");
        ff_reward_item it = {d[outs[i].id].prompt, text, d[outs[i].id].answer, NULL};
        float s;
        if (ff_reward_score(exact, &it, 1, &s)) die("eval reward");
        hits += s > 0.5f;
        free(text);
        ff_gen_output_free(&outs[i]);
    }
    free(outs);
    ff_rollout_destroy(&r);
    return hits / (double)no;
}

static ff_node *find_node(const ff_graph *g, ff_op op, ff_role role) {
    for (size_t i = 0; i < ff_graph_n_nodes(g); i++) {
        const ff_node *n = ff_graph_node(g, i);
        if (n->op == op && (role == FF_ROLE_NONE || n->role == role)) return ff_graph_node_mut((ff_graph *)g, i);
    }
    return NULL;
}

/* optimizer steps per iteration of a train node */
static int64_t updates_per_iter(const ff_node *t, int64_t prompts) {
    int64_t mb = t->train.mini_batch_size > 0 ? t->train.mini_batch_size : prompts;
    return (prompts + mb - 1) / mb * (t->train.epochs > 0 ? t->train.epochs : 1);
}

int main(int argc, char **argv) {
    if (argc < 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: bench_rl_arith CONFIG [--minutes M] [--eval-n N] [--threads T] [--log FILE] [key=value ...]\n");
        return 2;
    }
    const char *path = argv[1], *log_path = NULL;
    int64_t eval_n = 0;
    int threads = 0;
    double minutes = 15;
    char **over = ff_calloc((size_t)argc, sizeof *over);
    int n_over = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--eval-n") && i + 1 < argc) eval_n = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--minutes") && i + 1 < argc) minutes = atof(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--log") && i + 1 < argc) log_path = argv[++i];
        else if (strchr(argv[i], '=') && argv[i][0] != '-') over[n_over++] = argv[i];
        else {
            fprintf(stderr, "bench_rl_arith: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    ff_registry *reg = ff_registry_new();
    ff_run_config *run = reg ? ff_run_config_load(path, n_over, over, reg) : NULL;
    if (!run) die(path);
    const ff_graph *g = run->graph;
    ff_node *gen = find_node(g, FF_OP_GENERATE, FF_ROLE_ACTOR), *rew = find_node(g, FF_OP_REWARD_FN, FF_ROLE_NONE);
    ff_node *adv = find_node(g, FF_OP_ADVANTAGE, FF_ROLE_NONE), *ta = find_node(g, FF_OP_TRAIN, FF_ROLE_ACTOR);
    ff_node *tc = find_node(g, FF_OP_TRAIN, FF_ROLE_CRITIC), *refn = find_node(g, FF_OP_LOGPROB, FF_ROLE_REF);
    ff_node *valn = find_node(g, FF_OP_VALUE, FF_ROLE_CRITIC);
    if (find_node(g, FF_OP_FILTER, FF_ROLE_NONE)) { /* silently training on unfiltered groups would be another algorithm */
        fprintf(stderr, "bench_rl_arith: %s: the graph filters groups (dynamic sampling), which this in-process driver does not "
                        "implement; run it with `fuseflow run`, or remove the filter node to measure the plain algorithm\n", path);
        return 2;
    }
    if (!gen || !rew || !adv || !ta || gen->gen.greedy || (tc && !valn) || (valn && !tc)) {
        fprintf(stderr, "bench_rl_arith: %s: this driver runs graphs of generate -> reward_fn -> [ref logprob] -> [critic value] "
                        "-> advantage -> [train critic] -> train actor (PPO, GRPO, RLOO, REINFORCE++ style)\n", path);
        return 2;
    }
    char be_name[32] = "cpu";
    if (threads > 0) snprintf(be_name, sizeof be_name, "cpu:%d", threads);
    ff_backend *be = ff_backend_new(be_name);
    if (!be) die("backend");
    const char *actor_dir = run->roles[FF_ROLE_ACTOR].model;
    ff_model *actor = load_model(be, actor_dir, false), *gen_m = load_model(be, actor_dir, false);
    ff_model *ref = refn ? load_model(be, run->roles[FF_ROLE_REF].model, false) : NULL;
    ff_model *critic = tc ? load_model(be, run->roles[FF_ROLE_CRITIC].model, true) : NULL;
    ff_tokenizer *tok = ff_tokenizer_load_dir(actor_dir);
    if (!tok) die(actor_dir);
    int64_t n_train, n_val;
    example *train = load_data(run, run->data.train_files, tok, &n_train);
    example *val = load_data(run, run->data.val_files, tok, &n_val);
    if (eval_n <= 0) eval_n = run->data.val_batch_size > 0 ? run->data.val_batch_size : n_val;
    if (eval_n > n_val) eval_n = n_val;
    ff_reward *exact = ff_reward_new(reg, "arith_exact_match", NULL);
    if (!exact) die("reward");

    const int64_t B = run->data.train_batch_size, N = gen->gen.n, steps = run->trainer.steps, S = B * N;
    ff_trainer_config tac, tcc;
    if (ff_roles_trainer_config_from_node(run, ta, steps * updates_per_iter(ta, B), &tac)) die("actor settings");
    ff_trainer *tra = ff_trainer_new(actor, &tac), *trc = NULL;
    if (!tra) die("actor trainer");
    if (tc) {
        if (ff_roles_trainer_config_from_node(run, tc, steps * updates_per_iter(tc, B), &tcc)) die("critic settings");
        if (!(trc = ff_trainer_new(critic, &tcc))) die("critic trainer");
    }
    ff_sampling sp;
    ff_roles_sampling_from_node(run, gen, &sp);
    ff_rollout_config rc;
    ff_rollout_config_default(&rc);
    rc.max_slots = (int32_t)(S < 1024 ? S : 1024);
    rc.max_seq_len = (int32_t)(run->data.max_prompt_length + sp.max_new_tokens);
    ff_rollout *ro = ff_rollout_new(gen_m, &rc);
    if (!ro) die("rollout");
    FILE *lg = log_path ? fopen(log_path, "w") : NULL;
    if (log_path && !lg) {
        ff_error_set(log_path, NULL, "cannot open for writing");
        die("log");
    }

    const uint64_t seed = (uint64_t)run->trainer.seed;
    int64_t *order = ff_malloc((size_t)n_train * sizeof *order), *pidx = ff_malloc((size_t)B * sizeof *pidx);
    ff_reward_item *items = ff_calloc((size_t)S, sizeof *items);
    char **texts = ff_calloc((size_t)S, sizeof *texts);
    float *score = ff_calloc((size_t)S, sizeof *score);
    int32_t *off = ff_calloc((size_t)S + 1, sizeof *off), *group = ff_calloc((size_t)S, sizeof *group);
    ff_rl_sample *smp = ff_calloc((size_t)S, sizeof *smp);
    float **p_ref = ff_calloc((size_t)S, sizeof *p_ref), **p_val = ff_calloc((size_t)S, sizeof *p_val);
    size_t Tcap = (size_t)S * (size_t)sp.max_new_tokens + 1;
    float *old = ff_malloc(Tcap * 4), *reflp = ff_malloc(Tcap * 4), *vals = ff_malloc(Tcap * 4), *advs = ff_malloc(Tcap * 4),
          *rets = ff_malloc(Tcap * 4);
    if (!order || !pidx || !items || !texts || !score || !off || !group || !smp || !p_ref || !p_val || !old || !reflp || !vals ||
        !advs || !rets)
        die("alloc");
    for (int64_t i = 0; i < n_train; i++) order[i] = i;
    ff_rng rng;
    ff_rng_seed(&rng, seed);
    int64_t cursor = n_train;

    printf("bench_rl_arith: %s: %lld prompts x %lld samples per iteration, %lld iterations at most, %.1f min budget, "
           "held-out %lld examples\n", path, (long long)B, (long long)N, (long long)steps, minutes, (long long)eval_n);
    double acc0 = evaluate(gen_m, tok, exact, val, eval_n, sp.max_new_tokens), acc = acc0;
    printf("iter 0: held-out exact match %.1f%%\n", 100 * acc0);
    if (lg) fprintf(lg, "{\"iter\": 0, \"time_s\": 0, \"acc\": %.4f}\n", acc0);
    double wall = 0, t_gen = 0, t_score = 0, t_train = 0;
    int64_t it;
    for (it = 1; it <= steps; it++) {
        int64_t t0 = ff_now_ns();
        for (int64_t b = 0; b < B; b++) {
            if (cursor == n_train) { /* a new epoch of prompts in a seeded order */
                for (int64_t i = n_train - 1; i > 0; i--) {
                    int64_t j = (int64_t)ff_rng_below(&rng, (uint64_t)i + 1), x = order[i];
                    order[i] = order[j];
                    order[j] = x;
                }
                cursor = 0;
            }
            pidx[b] = order[cursor++];
            const example *e = &train[pidx[b]];
            ff_rollout_request q = {.id = (uint64_t)b, .prompt = e->ids, .prompt_len = e->n, .n = (int32_t)N, .sampling = sp,
                                    .seed = ff_seed_stream(seed, (uint64_t)it, (uint64_t)b)};
            if (ff_rollout_add(ro, &q)) die("rollout request");
        }
        ff_gen_output *outs;
        int32_t no;
        if (ff_rollout_run(ro, &outs, &no) || no != S) die("rollout");
        int64_t t1 = ff_now_ns();
        double rsum = 0;
        for (int64_t i = 0; i < S; i++) {
            const example *e = &train[pidx[outs[i].id]];
            size_t tl;
            if (ff_tokenizer_decode(tok, outs[i].tokens, outs[i].n_tokens, true, &texts[i], &tl)) die("decode");
            items[i] = (ff_reward_item){e->prompt, texts[i], e->answer, NULL};
            off[i + 1] = off[i] + outs[i].n_tokens;
            group[i] = (int32_t)(i / N);
            memcpy(old + off[i], outs[i].logprobs, (size_t)outs[i].n_tokens * 4);
            smp[i] = (ff_rl_sample){.prompt = e->ids, .prompt_len = e->n, .response = outs[i].tokens, .response_len = outs[i].n_tokens,
                                    .old_logprob = old + off[i], .ref_logprob = ref ? reflp + off[i] : NULL,
                                    .old_values = vals + off[i], .advantages = advs + off[i], .returns = rets + off[i]};
            p_ref[i] = reflp + off[i];
            p_val[i] = vals + off[i];
        }
        if (ff_node_reward(rew, items, (size_t)S, score)) die("reward");
        for (int64_t i = 0; i < S; i++) rsum += score[i];
        if (ref) {
            ff_score_opts so = {.micro_batch_size = (int32_t)refn->micro_batch_size, .temperature = sp.temperature};
            if (ff_score_logprobs(ref, smp, (int32_t)S, &so, p_ref, NULL)) die("ref log-probs");
        }
        if (critic) {
            ff_score_opts so = {.micro_batch_size = (int32_t)valn->micro_batch_size};
            if (ff_score_values(critic, smp, (int32_t)S, &so, p_val)) die("values");
        }
        int64_t t2 = ff_now_ns();
        ff_node_adv_in ai = {.seqs = {(int32_t)S, off, NULL}, .scores = score, .values = critic ? vals : NULL, .old_logp = old,
                             .ref_logp = ref ? reflp : NULL, .group = group};
        double mean_kl = 0;
        if (ff_node_advantage(adv, &ai, advs, rets, &mean_kl)) die("advantage");
        if (adv->kl_penalty) ff_node_kl_ctl_update(adv, mean_kl, S);
        ff_train_metrics cm = {0}, am = {0};
        if (trc) {
            ff_train_batch_opts o = {(int32_t)(tc->train.mini_batch_size * N), (int32_t)tc->train.micro_batch_size, 0,
                                     (int32_t)tc->train.epochs, tc->train.shuffle, ff_seed_stream(seed, (uint64_t)it, SEED_TAG_CRITIC_TRAIN)};
            if (ff_trainer_train_batch(trc, smp, (int32_t)S, &o, &cm)) die("critic training");
        }
        ff_train_batch_opts o = {(int32_t)(ta->train.mini_batch_size * N), (int32_t)ta->train.micro_batch_size, 0,
                                 (int32_t)ta->train.epochs, ta->train.shuffle, ff_seed_stream(seed, (uint64_t)it, SEED_TAG_ACTOR_TRAIN)};
        if (ff_trainer_train_batch(tra, smp, (int32_t)S, &o, &am)) die("actor training");
        if (ff_rollout_sync_weights(ro, actor)) die("weight sync");
        int64_t t3 = ff_now_ns();
        t_gen += (double)(t1 - t0) * 1e-9;
        t_score += (double)(t2 - t1) * 1e-9;
        t_train += (double)(t3 - t2) * 1e-9;
        wall += (double)(t3 - t0) * 1e-9;
        bool last = it == steps || wall > minutes * 60;
        bool eval = last || (run->trainer.test_freq > 0 && it % run->trainer.test_freq == 0);
        if (eval) acc = evaluate(gen_m, tok, exact, val, eval_n, sp.max_new_tokens);
        if (eval)
            printf("iter %lld: %.1f s, reward %.3f, held-out exact match %.1f%%, entropy %.3f, grad norm %.2f\n", (long long)it, wall,
                   rsum / (double)S, 100 * acc, am.entropy_mean, am.grad_norm);
        if (lg) {
            fprintf(lg,
                    "{\"iter\": %lld, \"time_s\": %.2f, \"reward\": %.4f, \"response_len\": %.3f, \"entropy\": %.4f, "
                    "\"clipfrac\": %.4f, \"approx_kl\": %.5f, \"kl_loss\": %.5f, \"grad_norm\": %.4f, \"lr\": %.3g, "
                    "\"value_loss\": %.5f, \"t_generate\": %.3f, \"t_score\": %.3f, \"t_train\": %.3f",
                    (long long)it, wall, rsum / (double)S, (double)off[S] / (double)S, am.entropy_mean, am.clipfrac, am.approx_kl,
                    am.kl_loss, am.grad_norm, am.lr, cm.value_loss, (double)(t1 - t0) * 1e-9, (double)(t2 - t1) * 1e-9,
                    (double)(t3 - t2) * 1e-9);
            if (eval) fprintf(lg, ", \"acc\": %.4f", acc);
            fprintf(lg, "}\n");
            fflush(lg);
        }
        fflush(stdout);
        for (int64_t i = 0; i < S; i++) {
            free(texts[i]);
            texts[i] = NULL;
            ff_gen_output_free(&outs[i]);
        }
        free(outs);
        if (last) break;
    }
    if (it > steps) it = steps;
    printf("time per iteration: generate %.3f s, reward + scoring %.3f s, advantage + training + sync %.3f s\n", t_gen / (double)it,
           t_score / (double)it, t_train / (double)it);
    printf("rl_arith: %.1f%% held-out exact match after %lld iterations in %.1f min (target: > 80%% within 15 min; start %.1f%%)\n",
           100 * acc, (long long)it, wall / 60, 100 * acc0);
    if (lg) fclose(lg);
    free(order), free(pidx), free(items), free(texts), free(score), free(off), free(group), free(smp), free(p_ref), free(p_val);
    free(old), free(reflp), free(vals), free(advs), free(rets), free(over);
    free_data(train, n_train);
    free_data(val, n_val);
    ff_rollout_destroy(&ro);
    ff_trainer_destroy(&tra);
    ff_trainer_destroy(&trc);
    ff_model_destroy(&actor);
    ff_model_destroy(&gen_m);
    ff_model_destroy(&ref);
    ff_model_destroy(&critic);
    ff_reward_destroy(&exact);
    ff_run_config_destroy(&run);
    ff_registry_destroy(&reg);
    ff_tokenizer_destroy(&tok);
    ff_backend_destroy(&be);
    return 0;
}
