/* Config trees: parsing with lines, typed getters, dotted overrides, unknown-key detection
 * with suggestions, and the error paths (syntax, wrong types, aliases). */
#include <stdbool.h>
#include <stdint.h>
#include <unistd.h>

#include "fuseflow/config.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

static const char *doc =
    "model:\n"
    "  path: /models/tiny\n"
    "  layers: 4\n"
    "optim:\n"
    "  lr: 1.0e-5\n"
    "  warmup: 1_000\n"
    "  fused: yes\n"
    "nodes:\n"
    "  - name: gen\n"
    "    role: actor\n"
    "  - name: score\n"
    "    role: reward\n"
    "empty: ~\n"
    "quoted: \"null\"\n";

static void test_getters(void) {
    ff_config *c = ff_config_parse(doc, strlen(doc), "run.yaml");
    REQUIRE(c);
    const char *s;
    int64_t i;
    double d;
    bool b;
    CHECK_EQ_INT(ff_config_get_str(c, "model.path", NULL, &s), 0);
    CHECK(!strcmp(s, "/models/tiny"));
    CHECK_EQ_INT(ff_config_get_int(c, "model.layers", 0, &i), 0);
    CHECK_EQ_INT(i, 4);
    CHECK_EQ_INT(ff_config_get_double(c, "optim.lr", 0, &d), 0);
    CHECK_CLOSE(d, 1e-5, 0, 1e-12);
    CHECK_EQ_INT(ff_config_get_int(c, "optim.warmup", 0, &i), 0);
    CHECK_EQ_INT(i, 1000);
    CHECK_EQ_INT(ff_config_get_bool(c, "optim.fused", false, &b), 0);
    CHECK(b);
    CHECK_EQ_INT(ff_config_get_int(c, "optim.absent", 7, &i), 1);
    CHECK_EQ_INT(i, 7);
    CHECK_EQ_INT(ff_config_get_str(c, "empty", "dflt", &s), 1);
    CHECK(!strcmp(s, "dflt"));
    CHECK_EQ_INT(ff_config_get_str(c, "quoted", NULL, &s), 0);
    CHECK(!strcmp(s, "null"));
    ff_cnode *nodes = ff_cnode_find(ff_config_root(c), "nodes");
    REQUIRE(nodes);
    CHECK_EQ_INT(ff_cnode_kind_of(nodes), FF_CNODE_SEQ);
    CHECK_EQ_INT(ff_cnode_len(nodes), 2);
    for (size_t k = 0; k < ff_cnode_len(nodes); k++) {
        ff_cnode *n = ff_cnode_at(nodes, k);
        CHECK_EQ_INT(ff_cnode_get_str(n, "name", NULL, &s), 0);
        CHECK_EQ_INT(ff_cnode_get_str(n, "role", NULL, &s), 0);
    }
    static const char *const roles[] = {"actor", "critic", "ref", "reward"};
    int r;
    CHECK_EQ_INT(ff_config_get_enum(c, "nodes.1.role", roles, 4, 0, &r), 0);
    CHECK_EQ_INT(r, 3);
    char where[256];
    CHECK(!strcmp(ff_cnode_where(ff_cnode_find(ff_config_root(c), "nodes.1.name"), where, sizeof where), "run.yaml:11"));
    CHECK_EQ_INT(ff_config_check_unused(c), 0);
    ff_config_destroy(&c);
    CHECK(c == NULL);
}

static void test_bad_values(void) {
    ff_config *c = ff_config_parse(doc, strlen(doc), "run.yaml");
    REQUIRE(c);
    int64_t i;
    bool b;
    CHECK_EQ_INT(ff_config_get_int(c, "model.path", 0, &i), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "run.yaml:2");
    CHECK_STR_CONTAINS(ff_error_message(), "'model.path' must be an integer");
    CHECK_EQ_INT(ff_config_get_bool(c, "model.layers", false, &b), -1);
    CHECK_EQ_INT(ff_config_get_int(c, "model", 0, &i), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "not a map");
    static const char *const roles[] = {"actor", "critic"};
    int r;
    CHECK_EQ_INT(ff_config_get_enum(c, "nodes.1.role", roles, 2, 0, &r), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "one of: actor, critic");
    CHECK_STR_CONTAINS(ff_error_message(), "run.yaml:12");
    ff_config_destroy(&c);
}

static void test_unknown_key(void) {
    const char *t = "optim:\n  lr: 1\n  lr_sheduler: cosine\n";
    ff_config *c = ff_config_parse(t, strlen(t), "x.yaml");
    REQUIRE(c);
    double d;
    const char *s;
    ff_config_get_double(c, "optim.lr", 0, &d);
    ff_config_get_str(c, "optim.lr_scheduler", "constant", &s);
    CHECK_EQ_INT(ff_config_check_unused(c), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "x.yaml:3: unknown key 'optim.lr_sheduler'");
    CHECK_STR_CONTAINS(ff_error_message(), "did you mean 'optim.lr_scheduler'");
    ff_config_destroy(&c);
}

static void test_overrides(void) {
    ff_config *c = ff_config_parse(doc, strlen(doc), "run.yaml");
    REQUIRE(c);
    char *ov[] = {"model.path=/other", "optim.lr=3e-4", "trainer.steps=20", "nodes.0.role=critic", "model.extra=[1, 2, 3]"};
    REQUIRE(ff_config_apply_overrides(c, 5, ov) == 0);
    const char *s;
    double d;
    int64_t i;
    CHECK_EQ_INT(ff_config_get_str(c, "model.path", NULL, &s), 0);
    CHECK(!strcmp(s, "/other"));
    CHECK_EQ_INT(ff_config_get_double(c, "optim.lr", 0, &d), 0);
    CHECK_CLOSE(d, 3e-4, 0, 1e-12);
    CHECK_EQ_INT(ff_config_get_int(c, "trainer.steps", 0, &i), 0);
    CHECK_EQ_INT(i, 20);
    CHECK_EQ_INT(ff_config_get_str(c, "nodes.0.role", NULL, &s), 0);
    CHECK(!strcmp(s, "critic"));
    ff_cnode *extra = ff_cnode_find(ff_config_root(c), "model.extra");
    REQUIRE(extra);
    CHECK_EQ_INT(ff_cnode_kind_of(extra), FF_CNODE_SEQ);
    CHECK_EQ_INT(ff_cnode_len(extra), 3);
    ff_cnode_mark_used(ff_config_root(c));
    CHECK_EQ_INT(ff_config_check_unused(c), 0);
    /* an override nobody reads is an unknown key, named as an override */
    char *bad[] = {"model.pth=/x"};
    REQUIRE(ff_config_apply_overrides(c, 1, bad) == 0);
    CHECK_EQ_INT(ff_config_check_unused(c), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "override 'model.pth=/x': unknown key 'model.pth'");
    CHECK_STR_CONTAINS(ff_error_message(), "did you mean 'model.path'");
    /* malformed overrides */
    CHECK_EQ_INT(ff_config_set(c, "novalue"), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "key.sub=value");
    CHECK_EQ_INT(ff_config_set(c, "nodes.9.role=x"), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "not an index");
    CHECK_EQ_INT(ff_config_set(c, "model.path.deeper=1"), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "'model.path' holds the plain value '/other' (override 'model.path=/other'), not a map, so it has no key 'deeper'");
    CHECK_EQ_INT(ff_config_set(c, "a.b=[1, 2"), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "YAML syntax error");
    ff_config_destroy(&c);
}

static void test_syntax_errors(void) {
    const char *t1 = "a: 1\nb: [1, 2\n";
    CHECK(ff_config_parse(t1, strlen(t1), "bad.yaml") == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "bad.yaml:");
    CHECK_STR_CONTAINS(ff_error_message(), "YAML syntax error");
    const char *t2 = "a: &x 1\nb: *x\n";
    CHECK(ff_config_parse(t2, strlen(t2), "alias.yaml") == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "not supported");
    const char *t3 = "a: 1\na: 2\n";
    CHECK(ff_config_parse(t3, strlen(t3), "dup.yaml") == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "dup.yaml:2: duplicate key 'a'");
    const char *t4 = "- 1\n- 2\n";
    CHECK(ff_config_parse(t4, strlen(t4), "list.yaml") == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "not a map");
    CHECK(ff_config_load("/nonexistent/x.yaml") == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "/nonexistent/x.yaml: cannot open");
    ff_config *e = ff_config_parse("", 0, "empty.yaml");
    REQUIRE(e);
    CHECK_EQ_INT(ff_config_check_unused(e), 0);
    ff_config_destroy(&e);
}

static void test_write_roundtrip(void) {
    ff_config *c = ff_config_parse(doc, strlen(doc), "run.yaml");
    REQUIRE(c);
    char *ov[] = {"model.path=/with: colon"};
    REQUIRE(ff_config_apply_overrides(c, 1, ov) == 0);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    REQUIRE(ff_config_write(c, f) == 0);
    fclose(f);
    ff_config *d = ff_config_parse(buf, len, "written.yaml");
    REQUIRE(d);
    const char *s;
    CHECK_EQ_INT(ff_config_get_str(d, "model.path", NULL, &s), 0);
    CHECK(!strcmp(s, "/with: colon"));
    CHECK_EQ_INT(ff_config_get_str(d, "quoted", NULL, &s), 0);
    CHECK(!strcmp(s, "null"));
    CHECK_EQ_INT(ff_config_get_str(d, "nodes.1.name", NULL, &s), 0);
    CHECK(!strcmp(s, "score"));
    free(buf);
    ff_config_destroy(&c);
    ff_config_destroy(&d);
}

/* Sections are typed: a section written as a plain value or a list, in the file or by an
 * override, is an error naming its line (it used to read as absent: every key a default). */
static void test_typed_sections(void) {
    static const char *text = "trainer: fast\n"
                              "data:\n"
                              "  - 1\n"
                              "optim:\n"
                              "list: [a, b]\n"
                              "model:\n"
                              "  path: /m\n";
    ff_config *c = ff_config_parse(text, strlen(text), "run.yaml");
    REQUIRE(c);
    int64_t i;
    const char *s;
    CHECK_EQ_INT(ff_config_get_int(c, "trainer.steps", 100, &i), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "run.yaml:1: 'trainer' is a section (a map of keys such as 'steps'), not the plain value 'fast'");
    CHECK_STR_CONTAINS(ff_error_message(), "hint: give it keys, e.g. trainer: {steps: ...}");
    CHECK_EQ_INT(ff_config_get_str(c, "data.train_files", NULL, &s), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "run.yaml:2: 'data' is a section (a map of keys such as 'train_files'), not a list");
    /* a null section is an empty one: defaults */
    CHECK_EQ_INT(ff_config_get_int(c, "optim.warmup", 5, &i), 1);
    CHECK_EQ_INT(i, 5);
    /* lists take indexes, not keys */
    CHECK_EQ_INT(ff_config_get_str(c, "list.1", NULL, &s), 0);
    CHECK(!strcmp(s, "b"));
    CHECK_EQ_INT(ff_config_get_str(c, "list.7", "none", &s), 1);
    CHECK_EQ_INT(ff_config_get_str(c, "list.name", NULL, &s), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "run.yaml:5: 'list' is a section");
    /* ff_cnode_find below a plain value finds nothing, and the unknown-key check names it
     * (before any unknown key) */
    char *over[] = {"model.pth=/x"};
    REQUIRE(ff_config_apply_overrides(c, 1, over) == 0);
    CHECK(ff_cnode_find(ff_config_root(c), "trainer.plugins") == NULL);
    CHECK_EQ_INT(ff_config_get_str(c, "model.path", NULL, &s), 0);
    CHECK_EQ_INT(ff_config_check_unused(c), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "run.yaml:1: 'trainer' is a section (a map of keys such as 'plugins')");
    ff_config_destroy(&c);

    /* overrides: a map replaced by a plain value or a list is refused by its reader, naming
     * the override; an override into an empty section starts it */
    c = ff_config_parse(text + 14, strlen(text + 14), "run.yaml"); /* from "data:" on */
    REQUIRE(c);
    char *o1[] = {"model=5"};
    REQUIRE(ff_config_apply_overrides(c, 1, o1) == 0);
    CHECK_EQ_INT(ff_config_get_str(c, "model.path", NULL, &s), -1);
    CHECK_STR_CONTAINS(ff_error_message(),
                       "override 'model=5': 'model' is a section (a map of keys such as 'path'), not the plain value '5' "
                       "(hint: an override sets one key of a section: model.path=VALUE)");
    char *o2[] = {"model=[1, 2]"};
    REQUIRE(ff_config_apply_overrides(c, 1, o2) == 0);
    CHECK_EQ_INT(ff_config_get_str(c, "model.path", NULL, &s), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "override 'model=[1, 2]': 'model' is a section (a map of keys such as 'path'), not a list");
    char *o3[] = {"optim.warmup=7"};
    REQUIRE(ff_config_apply_overrides(c, 1, o3) == 0);
    CHECK_EQ_INT(ff_config_get_int(c, "optim.warmup", 5, &i), 0);
    CHECK_EQ_INT(i, 7);
    ff_config_destroy(&c);
}

/* Range-checked integers, and numbers that are not written as integers. */
static void test_int_range(void) {
    static const char *text = "data:\n  max_response_length: 3000000000\n  a: 3e9\n  b: 4294967400\n  c: 99999999999999999999\n  d: 16\n";
    ff_config *c = ff_config_parse(text, strlen(text), "run.yaml");
    REQUIRE(c);
    int64_t i;
    CHECK_EQ_INT(ff_config_get_int_in(c, "data.max_response_length", 512, 1, INT32_MAX, &i), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "run.yaml:2: 'data.max_response_length' must be in [1, 2147483647], got 3000000000");
    CHECK_EQ_INT(ff_config_get_int_in(c, "data.b", 512, 1, INT32_MAX, &i), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "got 4294967400");
    CHECK_EQ_INT(ff_config_get_int_in(c, "data.a", 512, 1, INT32_MAX, &i), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "run.yaml:3: 'data.a' must be an integer, got '3e9' (hint: write the digits: 3000000000)");
    CHECK_EQ_INT(ff_config_get_int(c, "data.c", 0, &i), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "past the 64-bit integer range");
    CHECK_EQ_INT(ff_config_get_int_in(c, "data.d", 512, 1, 16, &i), 0);
    CHECK_EQ_INT(i, 16);
    CHECK_EQ_INT(ff_config_get_int_in(c, "data.e", 512, 1, 16, &i), 1); /* absent: the default, unchecked */
    CHECK_EQ_INT(i, 512);
    ff_config_destroy(&c);
}

/* ff_config_diff: leaves by dotted path, numbers by value, null = absent, lists by index. */
static void test_diff(void) {
    const char *a_text = "optim: {lr: 1.0e-3, beta: 0.9}\nsteps: 10\nname: run\ngone: 1\nnull_here: ~\nnodes: [{n: a}, {n: b}]\n";
    const char *b_text = "optim: {lr: 0.001, beta: 0.95}\nsteps: 10\nname: \"10\"\nnew: {k: v}\nnodes: [{n: a}, {n: c}]\n";
    ff_config *a = ff_config_parse(a_text, strlen(a_text), "a.yaml"), *b = ff_config_parse(b_text, strlen(b_text), "b.yaml");
    REQUIRE(a && b);
    ff_config_change *ch;
    int n = ff_config_diff(a, b, &ch);
    REQUIRE(n == 5);
    const char *want[5][3] = {{"gone", "1", NULL}, {"name", "run", "10"}, {"new.k", NULL, "v"}, {"nodes.1.n", "b", "c"}, {"optim.beta", "0.9", "0.95"}};
    for (int i = 0; i < n; i++) {
        CHECK(!strcmp(ch[i].key, want[i][0]));
        CHECK(want[i][1] ? ch[i].was && !strcmp(ch[i].was, want[i][1]) : ch[i].was == NULL);
        CHECK(want[i][2] ? ch[i].now && !strcmp(ch[i].now, want[i][2]) : ch[i].now == NULL);
    }
    ff_config_changes_free(&ch, n);
    CHECK(ch == NULL);
    CHECK_EQ_INT(ff_config_diff(a, a, &ch), 0);
    CHECK(ch == NULL);
    /* the diff marks nothing as read: the unknown-key check still sees every key */
    CHECK_EQ_INT(ff_config_check_unused(a), -1);
    ff_config_destroy(&a);
    ff_config_destroy(&b);
}

static void test_bounded(void) {
    ff_config *c = ff_config_parse("n: 5\nx: 0.5\n", 11, "r.yaml");
    REQUIRE(c);
    int64_t i;
    double d;
    CHECK_EQ_INT(ff_config_get_int_in(c, "n", 1, 0, 10, &i), 0);
    CHECK_EQ_INT(i, 5);
    CHECK_EQ_INT(ff_config_get_int_in(c, "absent", 7, 0, 10, &i), 1); /* absent: the default */
    CHECK_EQ_INT(i, 7);
    CHECK_EQ_INT(ff_config_get_int_in(c, "n", 1, 6, 10, &i), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "r.yaml:1: 'n' must be in [6, 10], got 5");
    CHECK_EQ_INT(ff_config_get_double_in(c, "x", 0, 0, 1, &d), 0);
    CHECK_EQ_INT(ff_config_get_double_in(c, "x", 0, 0.75, 1, &d), -1);
    CHECK_EQ_INT(ff_config_get_double_in(c, "absent", 0.25, 0.75, 1, &d), 1); /* the default, unchecked */
    CHECK_STR_CONTAINS(ff_error_message(), "r.yaml:2: 'x' must be in [0.75, 1], got 0.5");
    ff_config_destroy(&c);
}

/* The logger key: a list of names, one name alone, the empty list, the default; a wrong
 * name, a map and a nested list are errors naming the line and the choices, and the key
 * counts as read (no "unknown key" besides). */
static void test_loggers(void) {
    const char *t = "a: [console, tensorboard]\nb: jsonl\nc: []\nd: [console, wandb]\ne: {x: 1}\nf: [[console]]\n";
    ff_config *c = ff_config_parse(t, strlen(t), "l.yaml");
    REQUIRE(c);
    unsigned m = 99;
    CHECK_EQ_INT(ff_config_get_loggers(c, "a", &m), 0);
    CHECK_EQ_INT(m, FF_LOGGER_CONSOLE | FF_LOGGER_TENSORBOARD);
    CHECK_EQ_INT(ff_config_get_loggers(c, "b", &m), 0);
    CHECK_EQ_INT(m, FF_LOGGER_JSONL);
    CHECK_EQ_INT(ff_config_get_loggers(c, "c", &m), 0);
    CHECK_EQ_INT(m, 0);
    CHECK_EQ_INT(ff_config_get_loggers(c, "absent", &m), 1);
    CHECK_EQ_INT(m, FF_LOGGERS_DEFAULT);
    CHECK_EQ_INT(ff_config_get_loggers(c, "d", &m), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "l.yaml:4: 'd.1' must be one of: console, jsonl, tensorboard, got 'wandb'");
    CHECK_EQ_INT(ff_config_get_loggers(c, "e", &m), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "'e' must be a list of names");
    CHECK_EQ_INT(ff_config_get_loggers(c, "f", &m), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "not a list");
    CHECK_EQ_INT(ff_config_check_unused(c), 0);
    ff_config_destroy(&c);
    /* an override sets it too */
    c = ff_config_parse("x: 1\n", 5, "o.yaml");
    REQUIRE(c);
    int64_t x;
    CHECK_EQ_INT(ff_config_get_int(c, "x", 0, &x), 0);
    DIE_IF(ff_config_set(c, "trainer.logger=[tensorboard,jsonl]") != 0);
    CHECK_EQ_INT(ff_config_get_loggers(c, "trainer.logger", &m), 0);
    CHECK_EQ_INT(m, FF_LOGGER_TENSORBOARD | FF_LOGGER_JSONL);
    ff_config_destroy(&c);
}

int main(void) {
    test_loggers();
    test_diff();
    test_bounded();
    test_getters();
    test_bad_values();
    test_unknown_key();
    test_overrides();
    test_syntax_errors();
    test_write_roundtrip();
    test_typed_sections();
    test_int_range();
    TEST_MAIN_END();
}
