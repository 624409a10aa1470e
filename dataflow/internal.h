/* Declarations shared by the files of dataflow/ (not a public header). */
#ifndef FF_DATAFLOW_INTERNAL_H
#define FF_DATAFLOW_INTERNAL_H

#include "fuseflow/registry.h"

/* builtins.c: advantage estimators, policy losses, KL estimators; then the rewards. */
int ff_builtins_register(ff_registry *r);
/* reward.c: rule-based rewards. */
int ff_rewards_register(ff_registry *r);

/* graph.c: attach a YAML node's map (its parameters) and its location to a node. */
#include "fuseflow/graph.h"
void ff_graph_node_attach(ff_graph *g, int node, ff_cnode *params, const char *where);
/* graph.c: whether an op may run at a granularity (see the table in docs/graphs.md). */
bool ff_op_allows_granularity(ff_op op, ff_granularity g);

#endif
