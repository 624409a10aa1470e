/* `fuseflow plan`: the memory, traffic, bubbles and iteration time of a parallel layout on a
 * cluster (the planner of dataflow/plan), and `fuseflow plan search` to rank layouts. Flags become
 * dotted overrides of one configuration tree (a YAML file when given), so a file and flags mean
 * the same keys. Not here: any of the model (include/fuseflow/plan.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "fuseflow/config.h"
#include "fuseflow/error.h"
#include "fuseflow/plan.h"
#include "fuseflow/util.h"

typedef struct flag {
    const char *name;  /* --name */
    const char *key;   /* config key; NULL: handled by the command */
    const char *fixed; /* value for a flag without argument */
} flag;

static const flag flags[] = {
    {"model", "model.preset", NULL},
    {"config", "model.config", NULL},
    {"layers", "model.layers", NULL},
    {"hidden", "model.hidden", NULL},
    {"heads", "model.heads", NULL},
    {"kv-heads", "model.kv_heads", NULL},
    {"head-dim", "model.head_dim", NULL},
    {"ffn", "model.ffn", NULL},
    {"vocab", "model.vocab", NULL},
    {"tied", "model.tied_embeddings", "true"},
    {"untied", "model.tied_embeddings", "false"},
    {"experts", "model.experts", NULL},
    {"top-k", "model.experts_per_token", NULL},
    {"moe-layers", "model.moe_layers", NULL},
    {"expert-ffn", "model.expert_ffn", NULL},
    {"seq", "workload.seq", NULL},
    {"mbs", "workload.micro_batch", NULL},
    {"micro-batch", "workload.micro_batch", NULL},
    {"micro-batches", "workload.micro_batches", NULL},
    {"global-batch", "workload.global_batch", NULL},
    {"grad-reduce", "workload.grad_reduce", NULL},
    {"grad-accum", "workload.grad_accum", NULL},
    {"layout", "layout.degrees", NULL},
    {"tp", "layout.tp", NULL},
    {"cp", "layout.cp", NULL},
    {"pp", "layout.pp", NULL},
    {"dp", "layout.dp", NULL},
    {"ep", "layout.ep", NULL},
    {"vpp", "layout.vpp", NULL},
    {"sp", "layout.sp", "true"},
    {"no-sp", "layout.sp", "false"},
    {"zero", "layout.zero", NULL},
    {"zero-schedule", "layout.zero_schedule", NULL},
    {"schedule", "layout.schedule", NULL},
    {"checkpoint", "layout.checkpoint", "true"},
    {"order", "layout.order", NULL},
    {"layers-first", "layout.layers_first", NULL},
    {"layers-last", "layout.layers_last", NULL},
    {"cluster", "cluster.preset", NULL},
    {"gpus", "cluster.gpus", NULL},
    {"gpus-per-domain", "cluster.gpus_per_domain", NULL},
    {"hbm", "cluster.hbm", NULL},
    {"nvlink", "cluster.nvlink", NULL},
    {"nic", "cluster.nic", NULL},
    {"flops", "cluster.flops", NULL},
    {"nvlink-latency-us", "cluster.nvlink_latency_us", NULL},
    {"nic-latency-us", "cluster.nic_latency_us", NULL},
    {"topology", "cluster.topology", NULL},
    {"oversubscription", "cluster.oversubscription", NULL},
    {"radix", "cluster.radix", NULL},
    /* handled here */
    {"json", NULL, "1"},
    {"matrix", NULL, NULL},
    {"matrix-limit", NULL, NULL},
    {"top", NULL, NULL},
    {"max-tp", NULL, NULL},
    {"max-cp", NULL, NULL},
    {"max-pp", NULL, NULL},
    {"max-vpp", NULL, NULL},
    {"max-mbs", NULL, NULL},
    {"max-ep", NULL, NULL},
    {"zeros", NULL, NULL},
    {"min-tokens", NULL, NULL},
    {"try-checkpoint", NULL, "1"},
    {"naive", NULL, "1"},
};
#define NFLAGS (sizeof flags / sizeof flags[0])

static void usage(FILE *out) {
    fprintf(out,
            "usage: fuseflow plan [FILE.yaml] [options] [key=value ...]\n"
            "       fuseflow plan search [FILE.yaml] --gpus N --global-batch SEQS [options]\n"
            "       fuseflow plan network --gpus N [--gpus-per-domain X] [--radix K] [--json]\n"
            "       fuseflow plan reshard --model NAME --train TP8-PP4[-DP2] --gen TP4[-PP1] [--gpus N]\n"
            "                             [--cluster NAME] [--dtype bf16|fp32] [--gen-workers N] [--json]\n"
            "       fuseflow plan rollout --model NAME --gpus N [--gen-tp T] [--infer NAME,...] [--samples N]\n"
            "                             [--prompt N] [--max-len N] [--median N --p99 R | --lengths FILE]\n"
            "                             [--migrate off|auto|R_T] [--cluster NAME] [--hbm-bw 3.35TB/s] [--seed N] [--json]\n"
            "\n"
            "Memory per GPU, traffic per parallel dimension and link, pipeline bubbles and the iteration\n"
            "time of one training layout on a cluster; `search` ranks the layouts that fit; `network`\n"
            "counts the switches and transceivers of a non-blocking Clos and of rail-only; `reshard` gives the\n"
            "bytes per rank and the time of the actor's train -> generate transition (3D-HybridEngine beside\n"
            "the naive full gather and a gather to rank 0 with broadcast; --gen-workers N: a separate\n"
            "generation pool of N GPUs); `rollout` simulates one iteration's generation + inference stage\n"
            "serial, overlapped per sample, and with RLHFuse's long-tail migration (--infer: the reference,\n"
            "reward and critic models, presets or 'actor'; default actor,actor,actor; lengths log-normal with\n"
            "that median and p99/median ratio, or one per line from FILE; --migrate R_t: move the tail once\n"
            "at most that fraction of the samples still decode; auto: the best of a sweep). Formulas and\n"
            "assumptions: docs/planner.md. A YAML file holds the sections model, workload, layout, cluster\n"
            "(examples/plan/); flags and key=value overrides (layout.tp=8) change it.\n"
            "\n"
            "model\n"
            "  --model NAME          llama3-8b, llama3-70b, llama3-405b, gpt3-175b, mixtral-8x7b,\n"
            "                        llama-13b, llama-33b, llama-65b (LLaMA 1, RLHFuse's models)\n"
            "  --config PATH         a Hugging Face config.json instead\n"
            "  --layers --hidden --heads --kv-heads --head-dim --ffn --vocab N, --tied | --untied\n"
            "  --experts N --top-k K --moe-layers N --expert-ffn N   mixture of experts\n"
            "workload\n"
            "  --seq N               tokens per sequence (4096)\n"
            "  --mbs N               sequences per micro-batch (1)\n"
            "  --micro-batches N     micro-batches per step per replica, G (1), or\n"
            "  --global-batch N      sequences per step (G = N / (mbs x DP))\n"
            "  --grad-reduce fp32|bf16   gradients on the wire (fp32, as Llama 3)\n"
            "  --grad-accum bf16|fp32    gradients in memory (bf16: the 16 bytes per parameter)\n"
            "layout\n"
            "  --layout TP8-CP1-PP16-DP128   degrees at once (also EP4, VPP2), or\n"
            "  --tp --cp --pp --dp --ep N    (DP defaults to GPUs / (TP CP PP))\n"
            "  --vpp N               interleaved chunks per stage (implies --schedule interleaved)\n"
            "  --schedule S          1f1b (default), gpipe, interleaved, afab\n"
            "  --zero N              0..3 (1); --zero-schedule: allreduce-once, rs-once, rs-each,\n"
            "                        afab-once, local-once, gather-each, keep-fwd-bwd, keep-step\n"
            "  --sp | --no-sp        sequence parallelism (on)\n"
            "  --checkpoint          full activation recomputation\n"
            "  --order tp,cp,pp,dp   rank order, innermost first (ep may be listed)\n"
            "  --layers-first N --layers-last N   uneven first/last stage (else balanced: the\n"
            "                        stages with a layer fewer sit at both ends)\n"
            "cluster\n"
            "  --cluster NAME        dgx-h100 (default), dgx-h200, dgx-h100-rail, dgx-h200-rail\n"
            "  --gpus N              cluster size (default: the product of the degrees)\n"
            "  --gpus-per-domain N   HB domain (server) size\n"
            "  --hbm 80GB  --nvlink 450GB/s  --nic 400Gb/s  --flops 400T   (per GPU; NVLink per direction)\n"
            "  --nvlink-latency-us 1 --nic-latency-us 5   per collective step (0: bandwidth only)\n"
            "  --topology clos|rail-only, --oversubscription R, --radix K (switch ports)\n"
            "output\n"
            "  --json                one JSON object instead of the report\n"
            "  --matrix PREFIX       write PREFIX.gpu.csv, .server.csv, .ranks.csv (server, local rank and\n"
            "                        rail of each GPU), and heatmaps .gpu.svg, .server.svg\n"
            "  --matrix-limit N      draw at most the first N GPUs / servers (1024)\n"
            "search\n"
            "  --global-batch N      sequences per step (required)\n"
            "  --top N               layouts to show (10)\n"
            "  --max-tp --max-cp --max-pp --max-vpp --max-mbs --max-ep N   bounds\n"
            "  --zeros 0,1,2,3       ZeRO stages to try; --try-checkpoint also tries recomputation\n"
            "  --min-tokens N        skip layouts with fewer tokens per GPU per micro-batch (b s / CP):\n"
            "                        the model's FLOP/s does not drop for small GEMMs, real GPUs do\n"
            "  --naive               evaluate every candidate from scratch (the benchmark's baseline)\n"
            "\n"
            "examples\n"
            "  fuseflow plan --model llama3-405b --gpus 16384 --layout TP8-PP16-DP128 --seq 8192 --micro-batches 16\n"
            "  fuseflow plan examples/plan/llama3-405b-128k.yaml --json\n"
            "  fuseflow plan --model gpt3-175b --layout TP8-PP4-DP4 --seq 2048 --micro-batches 16 --matrix /tmp/gpt3\n"
            "  fuseflow plan search --model llama3-70b --gpus 1024 --seq 8192 --global-batch 512 --min-tokens 4096\n"
            "  fuseflow plan network --gpus 32768 --gpus-per-domain 256\n"
            "  fuseflow plan reshard --model llama3-70b --train TP8-PP4 --gen TP4 --cluster dgx-h100\n"
            "  fuseflow plan rollout --model llama-65b --infer llama-65b,llama-33b,llama-33b --gpus 64 --gen-tp 8 --max-len 1024\n");
}

static size_t edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b), row[64];
    if (lb >= 63) return 99;
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t prev = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t cur = row[j], sub = prev + (a[i - 1] != b[j - 1]);
            size_t del = row[j] + 1, ins = row[j - 1] + 1;
            row[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
            prev = cur;
        }
    }
    return row[lb];
}

static const flag *find_flag(const char *name) {
    for (size_t i = 0; i < NFLAGS; i++)
        if (!strcmp(flags[i].name, name)) return &flags[i];
    return NULL;
}

static int unknown_option(const char *arg, const char *name) {
    const char *best = NULL;
    size_t bd = 3;
    for (size_t k = 0; k < NFLAGS; k++) {
        size_t d = edit_distance(name, flags[k].name);
        if (d < bd) bd = d, best = flags[k].name;
    }
    fprintf(stderr, "fuseflow plan: unknown option '%s'", arg);
    if (best) fprintf(stderr, " (hint: did you mean --%s?)", best);
    fprintf(stderr, "; run 'fuseflow plan --help'\n");
    return 2;
}

static int bad_usage(const char *fmt, const char *arg) {
    fprintf(stderr, "fuseflow plan: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (run 'fuseflow plan --help')\n");
    return 2;
}

typedef struct opts {
    bool json, naive, try_ckpt;
    const char *matrix;
    int64_t matrix_limit, top, max_tp, max_cp, max_pp, max_vpp, max_mbs, max_ep, min_tokens;
    unsigned zeros;
} opts;

static int parse_int(const char *name, const char *v, int64_t *out) {
    char *end;
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || x < 1) {
        fprintf(stderr, "fuseflow plan: --%s needs a positive integer, got '%s'\n", name, v);
        return -1;
    }
    *out = x;
    return 0;
}

static int local_option(const flag *f, const char *v, opts *o) {
    if (!strcmp(f->name, "json")) o->json = true;
    else if (!strcmp(f->name, "naive")) o->naive = true;
    else if (!strcmp(f->name, "try-checkpoint")) o->try_ckpt = true;
    else if (!strcmp(f->name, "matrix")) o->matrix = v;
    else if (!strcmp(f->name, "matrix-limit")) return parse_int(f->name, v, &o->matrix_limit);
    else if (!strcmp(f->name, "top")) return parse_int(f->name, v, &o->top);
    else if (!strcmp(f->name, "max-tp")) return parse_int(f->name, v, &o->max_tp);
    else if (!strcmp(f->name, "max-cp")) return parse_int(f->name, v, &o->max_cp);
    else if (!strcmp(f->name, "max-pp")) return parse_int(f->name, v, &o->max_pp);
    else if (!strcmp(f->name, "max-vpp")) return parse_int(f->name, v, &o->max_vpp);
    else if (!strcmp(f->name, "max-mbs")) return parse_int(f->name, v, &o->max_mbs);
    else if (!strcmp(f->name, "max-ep")) return parse_int(f->name, v, &o->max_ep);
    else if (!strcmp(f->name, "min-tokens")) return parse_int(f->name, v, &o->min_tokens);
    else if (!strcmp(f->name, "zeros")) {
        o->zeros = 0;
        for (const char *p = v; *p; p++) {
            if (*p >= '0' && *p <= '3') o->zeros |= 1u << (*p - '0');
            else if (*p != ',' && *p != ' ') {
                fprintf(stderr, "fuseflow plan: --zeros takes stages 0..3 like 1,2, got '%s'\n", v);
                return -1;
            }
        }
        if (!o->zeros) {
            fprintf(stderr, "fuseflow plan: --zeros lists no stage\n");
            return -1;
        }
    }
    return 0;
}

static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return ff_strdup(".");
    size_t n = (size_t)(slash - path);
    char *d = ff_malloc(n + 2);
    if (!d) return NULL;
    memcpy(d, path, n ? n : 1);
    d[n ? n : 1] = '\0';
    return d;
}

/* The subcommands' own flags: argv[*i] among valued[n] (each taking the next argument, into
 * *v, *i moved past it). Returns its index, or -1 after saying why (an unknown flag, listing
 * the known ones and --json; a missing value). */
static int valued_option(const char *cmd, int argc, char **argv, int *i, const char *const *valued, int n, const char **v) {
    const char *a = argv[*i];
    for (int j = 0; j < n; j++) {
        if (strcmp(a, valued[j])) continue;
        if (*i + 1 >= argc) {
            fprintf(stderr, "fuseflow plan %s: %s needs a value (run 'fuseflow plan --help')\n", cmd, a);
            return -1;
        }
        *v = argv[++*i];
        return j;
    }
    fprintf(stderr, "fuseflow plan %s: unknown option '%s' (takes", cmd, a);
    for (int j = 0; j < n; j++) fprintf(stderr, " %s,", valued[j]);
    fprintf(stderr, " --json)\n");
    return -1;
}

/* `fuseflow plan reshard`: its own few flags (no configuration tree: the transition has no
 * workload or schedule). */
static int plan_reshard(int argc, char **argv) {
    ff_plan_reshard_input in;
    ff_plan_reshard_input_defaults(&in);
    const char *model = NULL, *config = NULL, *train = NULL, *gen = NULL, *cluster = "dgx-h100", *dtype = "bf16";
    int64_t gpus = 0;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--json")) {
            json = true;
            continue;
        }
        static const char *const valued[] = {"--model", "--config", "--train", "--gen", "--gpus", "--cluster", "--dtype",
                                             "--gen-workers"};
        const char *v;
        int k = valued_option("reshard", argc, argv, &i, valued, (int)(sizeof valued / sizeof valued[0]), &v);
        if (k < 0) return 2;
        switch (k) {
        case 0: model = v; break;
        case 1: config = v; break;
        case 2: train = v; break;
        case 3: gen = v; break;
        case 4: if (parse_int("gpus", v, &gpus)) return 2; break;
        case 5: cluster = v; break;
        case 6: dtype = v; break;
        default: if (parse_int("gen-workers", v, &in.gen_workers)) return 2; break;
        }
    }
    if (!train || !gen || (!model == !config)) {
        fprintf(stderr, "fuseflow plan reshard: give --model NAME or --config config.json, --train TP8-PP4 and --gen TP4 "
                        "(run 'fuseflow plan --help')\n");
        return 2;
    }
    ff_plan_layout g = {0};
    g.tp = g.pp = 1;
    in.train.tp = in.train.pp = 1;
    if ((model ? ff_plan_model_preset(model, &in.model) : ff_plan_model_from_hf_config(config, &in.model)) ||
        ff_plan_cluster_preset(cluster, &in.cluster) || ff_plan_parse_layout(train, &in.train) ||
        ff_plan_parse_layout(gen, &g)) {
        fprintf(stderr, "fuseflow plan reshard: %s\n", ff_error_message());
        return 2;
    }
    if (g.dp || g.cp || g.ep || g.vpp) {
        fprintf(stderr, "fuseflow plan reshard: --gen '%s': generation's layout is TP and PP (its DP follows from the GPUs)\n", gen);
        return 2;
    }
    in.gen_tp = g.tp, in.gen_pp = g.pp;
    in.cluster.gpus = gpus;
    if (!strcmp(dtype, "bf16")) in.dtype_bytes = 2;
    else if (!strcmp(dtype, "fp32")) in.dtype_bytes = 4;
    else {
        fprintf(stderr, "fuseflow plan reshard: --dtype '%s': use bf16 or fp32\n", dtype);
        return 2;
    }
    ff_plan_reshard r;
    if (ff_plan_reshard_evaluate(&in, &r)) {
        fprintf(stderr, "fuseflow plan reshard: %s\n", ff_error_message());
        return 1;
    }
    if (json) {
        char *s = ff_plan_reshard_json(&in, &r);
        if (!s) {
            fprintf(stderr, "fuseflow plan reshard: %s\n", ff_error_message());
            return 1;
        }
        puts(s);
        free(s);
    } else {
        ff_plan_reshard_write(&in, &r, stdout);
    }
    return 0;
}

static int parse_real(const char *name, const char *v, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x)) {
        fprintf(stderr, "fuseflow plan rollout: --%s '%s' is not a number\n", name, v);
        return -1;
    }
    *out = x;
    return 0;
}

/* Response lengths, one integer per line ('#' comments and blank lines skipped), into *out. */
static int read_lengths(const char *path, int64_t **out, int64_t *n) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "fuseflow plan rollout: --lengths %s: %s (one response length per line)\n", path, strerror(errno));
        return -1;
    }
    int64_t cap = 0, line = 0;
    *n = 0;
    char buf[128];
    int rc = 0;
    while (rc == 0 && fgets(buf, sizeof buf, f)) {
        line++;
        char *p = buf;
        while (*p == ' ' || *p == '\t') p++;
        if (*p == '#' || *p == '\n' || *p == 0) continue;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        while (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n') end++;
        if (errno || end == p || *end) {
            fprintf(stderr, "fuseflow plan rollout: %s:%lld: '%.*s' is not a length (one integer per line)\n", path, (long long)line,
                    (int)strcspn(p, "\r\n"), p);
            rc = -1;
            break;
        }
        if (*n == cap) {
            cap = cap ? 2 * cap : 1024;
            int64_t *g = realloc(*out, (size_t)cap * sizeof **out);
            if (!g) {
                fprintf(stderr, "fuseflow plan rollout: out of memory reading %s\n", path);
                rc = -1;
                break;
            }
            *out = g;
        }
        (*out)[(*n)++] = v;
    }
    fclose(f);
    if (rc == 0 && *n == 0) {
        fprintf(stderr, "fuseflow plan rollout: %s holds no lengths\n", path);
        rc = -1;
    }
    return rc;
}

/* `fuseflow plan rollout`: generation + inference serial, overlapped and with migration. */
static int plan_rollout(int argc, char **argv) {
    ff_plan_rollout_input in;
    ff_plan_rollout_input_defaults(&in);
    const char *model = NULL, *config = NULL, *infer = NULL, *cluster = "dgx-h100", *lengths = NULL, *migrate = "auto";
    int64_t gpus = 0;
    double hbm_bw = 0;
    bool json = false;
    static const char *const valued[] = {"--model", "--config", "--infer",  "--cluster", "--gpus",    "--gen-tp", "--samples",
                                         "--prompt", "--max-len", "--median", "--p99",    "--lengths", "--migrate", "--seed",
                                         "--hbm-bw"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--json")) {
            json = true;
            continue;
        }
        const char *v;
        int k = valued_option("rollout", argc, argv, &i, valued, (int)(sizeof valued / sizeof valued[0]), &v);
        if (k < 0) return 2;
        int64_t seed = 0;
        int bad = 0;
        switch (k) {
        case 0: model = v; break;
        case 1: config = v; break;
        case 2: infer = v; break;
        case 3: cluster = v; break;
        case 4: bad = parse_int("gpus", v, &gpus); break;
        case 5: bad = parse_int("gen-tp", v, &in.gen_tp); break;
        case 6: bad = parse_int("samples", v, &in.samples); break;
        case 7: bad = parse_int("prompt", v, &in.prompt_len); break;
        case 8: bad = parse_int("max-len", v, &in.max_len); break;
        case 9: bad = parse_real("median", v, &in.median_len); break;
        case 10: bad = parse_real("p99", v, &in.p99_ratio); break;
        case 11: lengths = v; break;
        case 12: migrate = v; break;
        case 13: bad = parse_int("seed", v, &seed), in.seed = (uint64_t)seed; break;
        default: bad = ff_plan_parse_quantity(v, "GB/s", &hbm_bw); break;
        }
        if (bad) {
            if (k == 14) fprintf(stderr, "fuseflow plan rollout: --hbm-bw: %s\n", ff_error_message());
            return 2;
        }
    }
    if (!model == !config || gpus < 1) {
        fprintf(stderr, "fuseflow plan rollout: give --model NAME (or --config config.json) and --gpus N (run 'fuseflow plan --help')\n");
        return 2;
    }
    if ((model ? ff_plan_model_preset(model, &in.actor) : ff_plan_model_from_hf_config(config, &in.actor)) ||
        ff_plan_cluster_preset(cluster, &in.cluster)) {
        fprintf(stderr, "fuseflow plan rollout: %s\n", ff_error_message());
        return 2;
    }
    in.cluster.gpus = gpus;
    if (hbm_bw > 0) in.cluster.hbm_bps = hbm_bw;
    /* the inference models: a list of presets, "actor" for the actor's own size */
    char list[256];
    snprintf(list, sizeof list, "%s", infer ? infer : "actor,actor,actor");
    in.n_infer = 0;
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (in.n_infer == FF_PLAN_ROLLOUT_MAX_INFER) {
            fprintf(stderr, "fuseflow plan rollout: --infer lists at most %d models (reference, reward, critic)\n", FF_PLAN_ROLLOUT_MAX_INFER);
            return 2;
        }
        ff_plan_model *m = &in.infer[in.n_infer++];
        if (!strcmp(t, "actor")) *m = in.actor;
        else if (ff_plan_model_preset(t, m)) {
            fprintf(stderr, "fuseflow plan rollout: --infer: %s\n", ff_error_message());
            return 2;
        }
    }
    if (!strcmp(migrate, "auto")) in.migrate = -1;
    else if (!strcmp(migrate, "off")) in.migrate = 0;
    else if (parse_real("migrate", migrate, &in.migrate) || !(in.migrate > 0 && in.migrate <= 1)) {
        fprintf(stderr, "fuseflow plan rollout: --migrate '%s': use off, auto, or R_t, a fraction in (0, 1]\n", migrate);
        return 2;
    }
    int64_t *lens = NULL, n = 0;
    if (lengths) {
        if (read_lengths(lengths, &lens, &n)) {
            free(lens);
            return 2;
        }
        in.lengths = lens;
        in.samples = n;
    }
    ff_plan_rollout r;
    int rc = 0;
    if (ff_plan_rollout_simulate(&in, &r)) {
        fprintf(stderr, "fuseflow plan rollout: %s\n", ff_error_message());
        rc = 1;
    } else if (json) {
        char *s = ff_plan_rollout_json(&in, &r);
        if (s) puts(s);
        else fprintf(stderr, "fuseflow plan rollout: %s\n", ff_error_message()), rc = 1;
        free(s);
    } else {
        ff_plan_rollout_write(&in, &r, stdout);
    }
    free(lens);
    return rc;
}

int ff_cmd_plan(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "rollout")) return plan_rollout(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "reshard")) return plan_reshard(argc - 1, argv + 1);
    bool search = argc > 1 && !strcmp(argv[1], "search");
    bool network = argc > 1 && !strcmp(argv[1], "network");
    int first = search || network ? 2 : 1;
    if (argc <= 1) { /* nothing to plan: say how */
        usage(stderr);
        return 2;
    }
    const char *file = NULL;
    opts o = {0};
    o.matrix_limit = 1024;
    /* first pass: help and the file */
    for (int i = first; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (argv[i][0] == '-') {
            const char *name = argv[i][1] == '-' ? argv[i] + 2 : argv[i] + 1;
            char nbuf[64];
            const char *eq = strchr(name, '=');
            if (eq && (size_t)(eq - name) < sizeof nbuf) {
                memcpy(nbuf, name, (size_t)(eq - name));
                nbuf[eq - name] = '\0';
                name = nbuf;
            }
            const flag *f = find_flag(name);
            if (!f) return unknown_option(argv[i], name);
            if (!f->fixed && !eq) i++; /* skip its value */
            continue;
        }
        if (strchr(argv[i], '=')) continue;
        if (file) return bad_usage("more than one file: '%s'", argv[i]);
        file = argv[i];
    }
    ff_config *cfg = file ? ff_config_load(file) : ff_config_new();
    if (!cfg) {
        fprintf(stderr, "fuseflow plan: %s\n", ff_error_message());
        return 2;
    }
    bool gpus_given = false;
    int rc = 0;
    for (int i = first; i < argc && !rc; i++) {
        const char *a = argv[i];
        if (a == file) continue;
        if (a[0] != '-') { /* key=value */
            if (ff_config_set(cfg, a)) {
                fprintf(stderr, "fuseflow plan: %s\n", ff_error_message());
                rc = 2;
            }
            if (!strncmp(a, "cluster.gpus=", 13)) gpus_given = true;
            continue;
        }
        const char *name = a[1] == '-' ? a + 2 : a + 1;
        const char *eq = strchr(name, '=');
        char nbuf[64];
        const char *val = NULL;
        if (eq && (size_t)(eq - name) < sizeof nbuf) { /* --tp=8 */
            memcpy(nbuf, name, (size_t)(eq - name));
            nbuf[eq - name] = '\0';
            name = nbuf;
            val = eq + 1;
        }
        const flag *f = find_flag(name);
        if (!f) {
            rc = unknown_option(a, name);
            break;
        }
        if (f->fixed) {
            if (val) {
                fprintf(stderr, "fuseflow plan: --%s takes no value\n", f->name);
                rc = 2;
                break;
            }
            val = f->fixed;
        } else if (!val) {
            if (i + 1 >= argc) {
                fprintf(stderr, "fuseflow plan: --%s needs a value (run 'fuseflow plan --help')\n", f->name);
                rc = 2;
                break;
            }
            val = argv[++i];
        }
        if (!f->key) {
            if (local_option(f, val, &o)) rc = 2;
            continue;
        }
        if (!strcmp(f->key, "cluster.gpus")) gpus_given = true;
        size_t need = strlen(f->key) + strlen(val) + 4;
        char *assign = ff_malloc(need);
        if (!assign) {
            rc = 1;
            break;
        }
        snprintf(assign, need, "%s=%s", f->key, val);
        if (ff_config_set(cfg, assign)) {
            fprintf(stderr, "fuseflow plan: --%s: %s\n", f->name, ff_error_message());
            rc = 2;
        }
        free(assign);
    }
    if (!gpus_given && file) {
        int64_t g;
        gpus_given = ff_config_get_int(cfg, "cluster.gpus", 0, &g) == 0;
    }
    ff_plan_input in;
    char *base_dir = file ? dir_of(file) : NULL;
    if (!rc && (ff_plan_input_from_config(cfg, base_dir, &in) || ff_config_check_unused(cfg))) {
        fprintf(stderr, "fuseflow plan: %s\n", ff_error_message());
        rc = 2;
    }
    free(base_dir);
    ff_config_destroy(&cfg);
    if (rc) return rc;

    if (network) {
        if (!gpus_given) {
            fprintf(stderr, "fuseflow plan network: give the cluster size with --gpus N\n");
            return 2;
        }
        if (o.json) {
            char *s = ff_plan_network_json(&in.cluster);
            if (!s) {
                fprintf(stderr, "fuseflow plan network: %s\n", ff_error_message());
                return 2;
            }
            puts(s);
            free(s);
        } else if (ff_plan_network_write(&in.cluster, stdout)) {
            fprintf(stderr, "fuseflow plan network: %s\n", ff_error_message());
            return 2;
        }
        return 0;
    }
    if (search) {
        if (!gpus_given) {
            fprintf(stderr, "fuseflow plan search: give the cluster size with --gpus N\n");
            return 2;
        }
        ff_plan_search_opts so = {0};
        so.global_batch = in.workload.global_batch;
        so.max_tp = o.max_tp, so.max_cp = o.max_cp, so.max_pp = o.max_pp, so.max_vpp = o.max_vpp;
        so.max_mbs = o.max_mbs, so.max_ep = o.max_ep, so.min_tokens = o.min_tokens;
        so.try_checkpoint = o.try_ckpt;
        so.zero_mask = o.zeros;
        so.top = o.top > 0 ? (size_t)o.top : 10;
        so.naive = o.naive;
        ff_plan_search_result sr;
        if (ff_plan_search(&in, &so, &sr)) {
            fprintf(stderr, "fuseflow plan search: %s\n", ff_error_message());
            return 1;
        }
        if (o.json) {
            char *s = ff_plan_search_json(&in, &sr);
            if (s) puts(s);
            free(s);
        } else {
            ff_plan_search_write(&in, &sr, stdout);
        }
        ff_plan_search_result_clear(&sr);
        return 0;
    }

    ff_plan_result r;
    if (ff_plan_evaluate(&in, &r)) {
        fprintf(stderr, "fuseflow plan: %s\n", ff_error_message());
        return 1;
    }
    if (o.json) {
        char *s = ff_plan_report_json(&in, &r);
        if (!s) {
            fprintf(stderr, "fuseflow plan: %s\n", ff_error_message());
            ff_plan_result_clear(&r);
            return 1;
        }
        puts(s);
        free(s);
    } else {
        ff_plan_report_write(&in, &r, stdout);
    }
    if (o.matrix) {
        if (!o.json) printf("\n");
        if (ff_plan_write_matrices(&in, &r, o.matrix, o.matrix_limit, o.json ? stderr : stdout)) {
            fprintf(stderr, "fuseflow plan: %s\n", ff_error_message());
            ff_plan_result_clear(&r);
            return 1;
        }
    }
    ff_plan_result_clear(&r);
    return 0;
}
