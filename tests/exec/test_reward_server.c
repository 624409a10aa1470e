/* The external reward-server protocol end to end: starts examples/reward_server.py (pyzmq),
 * scores through the `remote` reward function and the client, and compares with the built-in
 * rule. Skipped, with the reason, when python3-zmq is missing. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fuseflow/config.h"
#include "fuseflow/error.h"
#include "fuseflow/registry.h"
#include "fuseflow/reward.h"
#include "fuseflow/reward_client.h"
#include "tests/test_util.h"

/* ---- the Python example server ---------------------------------------------------------------- */

static const char *python(void) {
    const char *p = getenv("FF_PYTHON");
    if (p) return p;
    return access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
}

static void test_python_server(ff_registry *reg) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s -c 'import zmq' > /dev/null 2>&1", python());
    if (system(cmd) != 0) {
        SKIP("%s cannot import zmq: install python3-zmq (scripts/deps.sh) to run the reward-server test", python());
    }
    const char *src = getenv("FF_SOURCE_DIR");
    char script_path[1024], endpoint[256];
    snprintf(script_path, sizeof script_path, "%s/examples/reward_server.py", src ? src : ".");
    snprintf(endpoint, sizeof endpoint, "ipc:///tmp/ff_test_reward_py_%d", (int)getpid());
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        execlp(python(), python(), script_path, "--bind", endpoint, "--max-requests", "50", (char *)NULL);
        _exit(127);
    }
    /* the remote reward through the registry; creation pings (retry while Python starts) */
    char text[512];
    snprintf(text, sizeof text, "endpoint: %s\nserver_function: arith\ntimeout_ms: 1000\nretries: 4\nbatch_size: 2\n", endpoint);
    ff_config *c = ff_config_parse(text, strlen(text), "remote.yaml");
    ff_reward *w = ff_reward_new(reg, "remote", ff_config_root(c));
    if (!w) fprintf(stderr, "%s\n", ff_error_message());
    CHECK(w != NULL);
    if (w) {
        ff_reward_item items[5] = {{"1+2=", "3", "3", NULL},          {"1+2=", "4", "3", NULL},
                                   {"9*9=", "so 81", "81", "{\"k\": 1}"}, {"x", "", "1", NULL},
                                   {"big", "98765432109876543210", "98765432109876543210", NULL}};
        float sc[5];
        if (ff_reward_score(w, items, 5, sc) != 0) fprintf(stderr, "%s\n", ff_error_message());
        CHECK(sc[0] == 1 && sc[1] == 0 && sc[2] == 1 && sc[3] == 0 && sc[4] == 1);
        /* the same answers as the built-in rule */
        ff_reward *rule = ff_reward_new(reg, "arith_exact_match", NULL);
        float sr[5];
        REQUIRE(rule && ff_reward_score(rule, items, 5, sr) == 0);
        for (int i = 0; i < 5; i++) CHECK(sr[i] == sc[i]);
        ff_reward_destroy(&rule);
        ff_reward_destroy(&w);
    }
    ff_config_destroy(&c);
    /* an unknown server function: the server's error reaches the caller */
    ff_reward_client_opts o = {endpoint, "nope", 2000, 0, 0};
    ff_reward_client *cl = ff_reward_client_new(&o);
    REQUIRE(cl);
    ff_reward_item it = {"p", "r", "a", NULL};
    float s1;
    CHECK_EQ_INT(ff_reward_client_score(cl, &it, 1, &s1), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "unknown function 'nope'");
    ff_reward_client_destroy(&cl);
    kill(pid, SIGTERM);
    int status;
    waitpid(pid, &status, 0);
}

int main(void) {
    ff_registry *reg = ff_registry_new();
    REQUIRE(reg && ff_reward_remote_register(reg) == 0);
    test_python_server(reg);
    ff_registry_destroy(&reg);
    TEST_MAIN_END();
}
