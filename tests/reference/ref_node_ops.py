#!/usr/bin/python3
"""Expected values for tests/dataflow/test_node_ops.c: what the graph's node math
(dataflow/node_ops.c on the examples' configs) must produce on one small packed batch.

Written from verl's formulas (ref_rlhf.py, PyTorch in float64), composed the way the nodes
are specified in include/fuseflow/graph.h: token rewards = the sequence score on its last
counted token minus coef * KL (k1) on counted tokens, then the estimator; the actor loss =
PPO surrogate + kl_loss_coef * k3 - entropy_coeff * entropy, all aggregated by
seq-mean-token-mean, d/dlogp by autograd; the critic loss = 0.5 * token-mean of the clipped
squared error. Nothing here calls fuseflow. Inputs are exact binary fractions, so both sides
read the same numbers.

Usage: /usr/bin/python3 tests/reference/ref_node_ops.py    (prints the C literals)
The values are committed in test_node_ops.c; CI does not run this.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_rlhf import agg_loss, gae, discounted, grpo, kl_penalty, masked_mean, masked_whiten, ppo_loss, rloo, \
    to_packed, to_padded, value_loss  # noqa: E402

t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731

# the batch: 3 sequences, T = 9; a hole at t = 5, and the last token of sequence 2 masked
OFF = [0, 3, 7, 9]
MASK = t([1, 1, 1, 1, 1, 0, 1, 1, 0])
SCORES = t([1.0, 0.0, 0.5])
GROUP = [0, 0, 2]  # a group of two and a group of one
VALUES = t([0.5, -0.25, 0.125, 0.25, 0.75, -1.0, 0.375, -0.5, 2.0])
OLD = t([-1.0, -0.5, -2.0, -1.5, -0.25, -3.0, -1.0, -0.75, -4.0])
REF = t([-1.25, -0.5, -1.5, -1.0, -0.5, -1.0, -1.5, -0.25, -2.0])
BASELINE = t([0.25, 0.5, 1.0])


def token_rewards(coef):
    """Score on the last counted token of each sequence, minus coef * k1 on counted tokens."""
    r = torch.zeros(OFF[-1])
    for s in range(len(OFF) - 1):
        last = max(i for i in range(OFF[s], OFF[s + 1]) if MASK[i] > 0)
        r[last] = SCORES[s]
    return r - coef * kl_penalty(OLD, REF, "kl") * MASK


def pad(x):
    return to_padded(x, OFF)


def c_array(name, x):
    return f"static const double {name}[T] = {{" + ", ".join(f"{float(v):.9g}" for v in x) + "};"


def main():
    out = []
    # PPO: GAE(gamma 0.5, lam 0.95) whitened, KL coef 0.02; then the returns at coef 0.0204
    out.append(f"mean_kl = {float(masked_mean(kl_penalty(OLD, REF, 'kl'), MASK)):.9g}")
    for coef, tag in ((0.02, ""), (0.0204, "_0204")):
        a, ret = gae(pad(token_rewards(coef)), pad(VALUES), pad(MASK), 0.5, 0.95)
        a, ret = to_packed(a, OFF), to_packed(ret, OFF)
        if not tag:
            out.append(c_array("gae_adv", masked_whiten(a, MASK)))
        out.append(c_array("gae_ret" + tag, ret))
    # outcome estimators broadcast over tokens, times the mask
    ids = torch.tensor([s for s in range(3) for _ in range(OFF[s], OFF[s + 1])])
    out.append(c_array("grpo_adv", grpo(SCORES, GROUP, True, 1e-6)[ids] * MASK))
    out.append(c_array("drgrpo_adv", grpo(SCORES, GROUP, False, 1e-6)[ids] * MASK))
    out.append(c_array("rloo_adv", rloo(SCORES, GROUP)[ids] * MASK))
    # REINFORCE++: gamma 0.5, KL coef 0.01
    ret = to_packed(discounted(pad(token_rewards(0.01)), pad(MASK), 0.5), OFF)
    out.append(c_array("rpp_ret", ret))
    out.append(c_array("rpp_adv", masked_whiten(ret, MASK) * MASK))
    # ReMax: verl's reverse cumsum of masked rewards minus the baseline
    rp, mp = pad(token_rewards(0.0)), pad(MASK)
    ret = (rp * mp).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    out.append(c_array("remax_ret", to_packed(ret, OFF)))
    out.append(c_array("remax_adv", to_packed((ret - BASELINE.unsqueeze(-1)) * mp, OFF)))

    # critic: clip 0.5, token-mean
    v = t([0.5, 1.5, -0.25, 2.0, 2.0, 9.0, 0.25, -1.5, 7.0]).requires_grad_(True)
    old_v = t([0.25, 0.5, 0.0, 0.5, 1.0, 0.0, 0.25, -0.5, 0.0])
    R = t([1.0, 0.0, -1.0, 2.0, 1.25, 0.0, 0.5, -1.0, 0.0])
    loss, clipfrac = value_loss(v, old_v, R, MASK, OFF, 0.5, "token-mean", 0.0)
    (g,) = torch.autograd.grad(loss, v)
    out.append(f"critic loss = {float(loss):.9g}, clipfrac = {clipfrac:.9g}")
    out.append(c_array("critic_dv", g))

    # actor: PPO (0.2 / 0.28, dual clip 3) + 0.5 k3 - 0.01 entropy, seq-mean-token-mean
    old = t([-2.0] * 9)
    logp = t([-2.0, -1.5, -2.5, -2.5, -0.5, -2.0, -1.875, -1.8125, -2.0]).requires_grad_(True)
    adv = t([1.0, 1.0, 1.0, -1.0, -1.0, 5.0, -0.5, 2.0, 5.0])
    ref = t([-2.25, -1.5, -2.0, -3.0, -1.0, -2.0, -1.5, -2.0, -2.0])
    ent = t([0.5, 1.0, 1.5, 2.0, 0.25, 9.0, 0.75, 1.25, 9.0])
    mode = "seq-mean-token-mean"
    pg, stats = ppo_loss(logp, old, adv, MASK, OFF, 0.2, 0.28, 3.0, mode, 0.0)
    kl = agg_loss(kl_penalty(logp, ref, "low_var_kl"), MASK, OFF, mode)
    e = agg_loss(ent, MASK, OFF, mode)
    total = pg + 0.5 * kl - 0.01 * e
    (g,) = torch.autograd.grad(total, logp)
    out.append(f"actor pg = {float(pg):.9g}, kl = {float(kl):.9g}, entropy = {float(e):.9g}, loss = {float(total):.9g}")
    out.append(f"actor clipfrac = {stats['clipfrac']:.9g}, clipfrac_lower = {stats['clipfrac_lower']:.9g}, "
               f"approx_kl = {stats['approx_kl']:.9g}, ratio_max = {stats['ratio_max']:.9g}")
    out.append(c_array("actor_dlogp", g))
    print("\n".join(out))


if __name__ == "__main__":
    main()
