/* The reward-server client against scripted in-process servers that answer garbage, the
 * wrong count, an error, a wrong id, or nothing; the `remote` reward's parameter errors. The
 * round trip through examples/reward_server.py is test_reward_server.c. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "fuseflow/config.h"
#include "fuseflow/error.h"
#include "fuseflow/registry.h"
#include "fuseflow/reward_client.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

/* ---- scripted servers ------------------------------------------------------------------------ */

typedef struct script {
    char endpoint[256];
    const char *reply; /* "%llu" is replaced by the request's id; NULL: never answer */
    int requests;
    void *ctx;
    volatile int ready;
} script;

static void *serve(void *arg) {
    script *s = arg;
    void *sock = zmq_socket(s->ctx, ZMQ_REP);
    int linger = 0, timeout = 3000;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    REQUIRE(zmq_bind(sock, s->endpoint) == 0);
    s->ready = 1;
    for (int k = 0; k < s->requests; k++) {
        char buf[65536];
        int n = zmq_recv(sock, buf, sizeof buf - 1, 0);
        if (n < 0) break;
        buf[n < (int)sizeof buf - 1 ? n : (int)sizeof buf - 1] = '\0';
        if (!s->reply) continue; /* a dead server: take the request, never answer */
        const char *idp = strstr(buf, "\"id\":");
        unsigned long long id = idp ? strtoull(idp + 5, NULL, 10) : 0;
        char rep[1024];
        snprintf(rep, sizeof rep, s->reply, id);
        zmq_send(sock, rep, strlen(rep), 0);
    }
    zmq_close(sock);
    return NULL;
}

/* Score two items against a server that answers `reply`; returns the client's status. */
static int against(const char *reply, int timeout_ms, int retries, float *scores) {
    static int k;
    script s = {.reply = reply, .requests = retries + 1};
    snprintf(s.endpoint, sizeof s.endpoint, "ipc:///tmp/ff_test_reward_%d_%d", (int)getpid(), k++);
    s.ctx = zmq_ctx_new();
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, serve, &s) == 0);
    while (!s.ready) usleep(1000);
    ff_reward_client_opts o = {s.endpoint, "arith", timeout_ms, retries, 0};
    ff_reward_client *c = ff_reward_client_new(&o);
    REQUIRE(c);
    ff_reward_item items[2] = {{"1+1=", "2", "2", "{\"level\": 1}"}, {"2+2=", "5", "4", NULL}};
    int rc = ff_reward_client_score(c, items, 2, scores);
    ff_reward_client_destroy(&c);
    pthread_join(th, NULL);
    zmq_ctx_term(s.ctx);
    return rc;
}

static void test_client_errors(void) {
    float sc[2] = {-7, -7};
    CHECK_EQ_INT(against("{\"version\": 1, \"id\": %llu, \"scores\": [1, 0.5]}", 3000, 0, sc), 0);
    CHECK(sc[0] == 1 && sc[1] == 0.5f);
    sc[0] = sc[1] = -7;
    CHECK_EQ_INT(against("this is not json %llu", 3000, 0, sc), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "reply is not JSON");
    CHECK(sc[0] == -7 && sc[1] == -7); /* untouched on error */
    CHECK_EQ_INT(against("{\"version\": 1, \"id\": %llu, \"scores\": [1]}", 3000, 0, sc), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "wrong number of scores (2 items sent, 1 scores");
    CHECK_EQ_INT(against("{\"version\": 1, \"id\": %llu, \"scores\": [1, \"high\"]}", 3000, 0, sc), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "not a finite number");
    CHECK_EQ_INT(against("{\"version\": 1, \"id\": %llu, \"error\": \"model crashed\"}", 3000, 0, sc), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "reward server error: model crashed");
    CHECK_EQ_INT(against("{\"version\": 1, \"id\": 99999%llu, \"scores\": [1, 1]}", 3000, 0, sc), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "does not match");
    CHECK_EQ_INT(against("{\"version\": 2, \"id\": %llu, \"scores\": [1, 1]}", 3000, 0, sc), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "\"version\": 1");
    /* a server that takes requests and never answers: timeout, one retry on a fresh socket */
    CHECK_EQ_INT(against(NULL, 150, 1, sc), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "did not answer within 150 ms (2 tries)");
    CHECK_STR_CONTAINS(ff_error_message(), "examples/reward_server.py");

    /* nobody listening, through the registry: the ping at creation fails before a run starts */
    ff_registry *reg = ff_registry_new();
    REQUIRE(reg && ff_reward_remote_register(reg) == 0);
    char text[256];
    snprintf(text, sizeof text, "endpoint: ipc:///tmp/ff_test_reward_nobody_%d\ntimeout_ms: 100\nretries: 0\n", (int)getpid());
    ff_config *c = ff_config_parse(text, strlen(text), "n.yaml");
    CHECK(ff_reward_new(reg, "remote", ff_config_root(c)) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "did not answer within 100 ms");
    ff_config_destroy(&c);
    /* no endpoint, a bad endpoint */
    c = ff_config_parse("timeout_ms: 100\n", 16, "n.yaml");
    CHECK(ff_reward_new(reg, "remote", ff_config_root(c)) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "needs an endpoint");
    ff_config_destroy(&c);
    c = ff_config_parse("endpoint: nonsense\n", 19, "n.yaml");
    CHECK(ff_reward_new(reg, "remote", ff_config_root(c)) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "cannot connect");
    ff_config_destroy(&c);
    ff_registry_destroy(&reg);
}

int main(void) {
    test_client_errors();
    TEST_MAIN_END();
}
