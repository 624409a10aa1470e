/* Rewards: the rule-based helpers and functions (the reward-server client is the RL
 * controller's: tests/exec/test_reward_client.c). */
#include <stdlib.h>
#include <string.h>

#include "fuseflow/config.h"
#include "fuseflow/error.h"
#include "fuseflow/registry.h"
#include "fuseflow/reward.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

static void test_rules(ff_registry *reg) {
    char out[64];
    CHECK_EQ_INT(ff_reward_normalize_number("+0,012.50", 9, out, sizeof out), 0);
    CHECK(!strcmp(out, "12.5"));
    CHECK_EQ_INT(ff_reward_normalize_number("-000", 4, out, sizeof out), 0);
    CHECK(!strcmp(out, "0"));
    CHECK_EQ_INT(ff_reward_normalize_number("12a", 3, out, sizeof out), -1);
    CHECK_EQ_INT(ff_reward_extract_answer("12 + 30 = 42", NULL, true, out, sizeof out), 1);
    CHECK(!strcmp(out, "42"));
    CHECK_EQ_INT(ff_reward_extract_answer("357\n12+3=15", NULL, false, out, sizeof out), 1);
    CHECK(!strcmp(out, "357")); /* the first number: what the bundled task's answer is */
    CHECK_EQ_INT(ff_reward_extract_answer("so 7-3 is 4, not -5", NULL, true, out, sizeof out), 1);
    CHECK(!strcmp(out, "-5"));
    CHECK_EQ_INT(ff_reward_extract_answer("-12 is it", NULL, false, out, sizeof out), 1);
    CHECK(!strcmp(out, "-12"));
    CHECK_EQ_INT(ff_reward_extract_answer("98765432109876543210", NULL, false, out, sizeof out), 1);
    CHECK(!strcmp(out, "98765432109876543210")); /* beyond double precision, compared as text */
    CHECK_EQ_INT(ff_reward_extract_answer("no digits here", NULL, false, out, sizeof out), 0);
    CHECK_EQ_INT(ff_reward_extract_answer("work 3 #### 1,234 then 5", "####", false, out, sizeof out), 1);
    CHECK(!strcmp(out, "1234"));
    CHECK_EQ_INT(ff_reward_extract_answer("42", "####", false, out, sizeof out), 0);
    CHECK(ff_reward_well_formed(" 42 \n", NULL));
    CHECK(ff_reward_well_formed("#### -3", "####"));
    CHECK(!ff_reward_well_formed("42 apples", NULL));
    CHECK(!ff_reward_well_formed("", NULL));

    /* arith_exact_match with format_score, through the registry */
    ff_config *c = ff_config_parse("format_score: 0.25\n", 19, "p.yaml");
    REQUIRE(c);
    ff_reward *w = ff_reward_new(reg, "arith_exact_match", ff_config_root(c));
    REQUIRE(w);
    ff_reward_item items[5] = {{"1+2=", "3", "3", NULL}, {"1+2=", "4", "3", NULL}, {"1+2=", "it is 3", "3", NULL},
                               {"1+2=", "what?", "3", NULL}, {"1+2=", "3\n4+4=8", "3", NULL}};
    float sc[5];
    REQUIRE(ff_reward_score(w, items, 5, sc) == 0);
    CHECK(sc[0] == 1.0f && sc[1] == 0.25f && sc[2] == 1.0f && sc[3] == 0.0f && sc[4] == 1.0f);
    ff_reward_item no_answer = {"q", "3", NULL, NULL};
    CHECK_EQ_INT(ff_reward_score(w, &no_answer, 1, sc), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "no reference answer");
    ff_reward_destroy(&w);
    ff_config_destroy(&c);
    w = ff_reward_new(reg, "format", NULL);
    REQUIRE(w);
    REQUIRE(ff_reward_score(w, items, 4, sc) == 0);
    CHECK(sc[0] == 1 && sc[1] == 1 && sc[2] == 0 && sc[3] == 0);
    ff_reward_destroy(&w);

    /* repeat_match: exact, short, long, trailing junk, the wrong letter, whitespace */
    w = ff_reward_new(reg, "repeat_match", NULL);
    REQUIRE(w);
    ff_reward_item rep[6] = {{"4*q=", "qqqq", "qqqq", NULL}, {"4*q=", "qqq", "qqqq", NULL}, {"4*q=", "qqqqqq", "qqqq", NULL},
                             {"4*q=", "qqqqab", "qqqq", NULL}, {"4*q=", "pppp", "qqqq", NULL}, {"4*q=", "qqqq \n", "qqqq", NULL}};
    float rs[6];
    REQUIRE(ff_reward_score(w, rep, 6, rs) == 0);
    CHECK(rs[0] == 1.0f && rs[1] == 0.75f && rs[2] == 0.5f && rs[3] == 0.5f && rs[4] == 0.0f && rs[5] == 1.0f);
    ff_reward_item mixed = {"2*q=", "qq", "qp", NULL};
    CHECK_EQ_INT(ff_reward_score(w, &mixed, 1, rs), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "not one character repeated");
    CHECK_EQ_INT(ff_reward_score(w, &no_answer, 1, rs), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "no reference answer");
    ff_reward_destroy(&w);
}

int main(void) {
    ff_registry *reg = ff_registry_new();
    REQUIRE(reg);
    test_rules(reg);
    ff_registry_destroy(&reg);
    TEST_MAIN_END();
}
