"""ArCHer's actor steps on replay states: turnrl's packed forward with the samples' common prefix
computed once, against padded batches (how TRL's trainers compute per-token log-probs) and
against turnrl's own plain packing.

The actor trains on ``batch`` states drawn from the replay buffer, each with a fresh reply
``a_hat``: one sequence of (system message, instruction, the state's history, the reply) per
sample. Samples of one environment share at least the system message and the instruction. The
replay buffer here is ``--episodes`` episodes of ``--policy`` on ``--env`` (the scripted expert,
so that no model is sampled), the prompt as ``turnrl train archer``'s with ``prompt.history``
``--history`` (default: the whole game, as the twenty-questions runs of docs/archer.md), and the
reply of each drawn state is the one the episode played (it stands in for ``a_hat``). One round is
``--steps`` actor steps, each forward + backward of ArCHer's actor loss
``-(Q - V) * sum_h log pi`` on ``--batch`` states drawn at random:

* ``turnrl``: ``ActorObjective`` with ``shared_prefix`` (the default): the samples sorted by their
  tokens and packed by ``forward.pack_runs``, each unit's common prefix computed once, attention
  segment by segment, the LM head at agent tokens only;
* ``turnrl-plain``: the same with ``shared_prefix=false`` (packed rows, one attention call per
  sequence);
* ``padded``: each batch left-padded (states) and right-padded (replies) to its longest sample with
  an attention mask, the LM head on the reply span (``logits_to_keep``); the same loss.

All three compute the same loss (checked: per-step losses agree to 1e-4) and take the same
optimizer steps (plain SGD, so that the three start each round from the same weights). Time is the
process's CPU time on a CPU (run with ``OMP_NUM_THREADS=1``) and wall time on a GPU; the best of
``--repeats`` rounds after an untimed warm-up. The last line is one JSON object with ``ratio`` =
padded time / turnrl time (above 1: turnrl is faster) and ``ratio_plain``.

    OMP_NUM_THREADS=1 python benchmarks/archer_actor.py [--model DIR] [--env twenty_questions]
        [--history N] [--episodes 32] [--batch 16] [--steps 3] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np
import torch
from _common import padded_logps, positive, run_main, time_rounds, training_model  # beside this script

from turnrl.agent.prompting import PromptConfig
from turnrl.collect import run_policy
from turnrl.data.schema import Message
from turnrl.losses import archer_actor_loss
from turnrl.rollout import load_policy
from turnrl.tokenization import ChatFormat
from turnrl.train.archer import ActorExample, ActorObjective, transitions


def replay(chat: ChatFormat, env: str, policy: str, episodes: int, history: int | None) -> list[ActorExample]:
    """Every turn of ``episodes`` train episodes, encoded as the actor encodes a sample."""
    trajs = run_policy(load_policy(policy), env, episodes=episodes, num_envs=16, prompt=PromptConfig(history=history))
    rng = np.random.default_rng(0)
    out = []
    for traj in trajs:
        for tr in transitions(traj, history):
            view = [Message(m["role"], m["content"]) for m in tr["view"]]
            n_asst = sum(m.role == "assistant" for m in view)
            enc = chat.encode([*view, Message("assistant", tr["a"])], trainable_turns=[n_asst])
            if enc is not None and enc.num_turns:
                value = float(rng.standard_normal())
                out.append(ActorExample(enc, value, value - float(rng.standard_normal())))
    return out


def padded_loss(model: Any, examples: list[ActorExample], pad_id: int) -> torch.Tensor:
    logps, keep = padded_logps(model, [e.enc for e in examples], pad_id)
    value = torch.tensor([e.value for e in examples], device=logps.device)
    base = torch.tensor([e.baseline for e in examples], device=logps.device)
    losses, _ = archer_actor_loss(logps * keep, keep.float(), value, base)
    return losses.sum()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model directory (default: a fresh tiny model)")
    ap.add_argument("--env", default="twenty_questions")
    ap.add_argument("--policy", default="expert")
    ap.add_argument("--history", type=int, default=None, help="prompt.history (default: the whole game)")
    ap.add_argument("--episodes", type=positive, default=32)
    ap.add_argument("--batch", type=positive, default=16)
    ap.add_argument("--steps", type=positive, default=3)
    ap.add_argument("--repeats", type=positive, default=2)
    args = ap.parse_args()
    start, chat, pad_id, cuda = training_model(args.model)
    buffer = replay(chat, args.env, args.policy, args.episodes, args.history)
    rng = np.random.default_rng(1)
    batches = [[buffer[i] for i in rng.choice(len(buffer), size=min(args.batch, len(buffer)), replace=False)]
               for _ in range(args.steps)]

    def one_round(name: str, model: Any) -> list[float]:
        obj = ActorObjective(4096, pad_id, shared_prefix=name == "turnrl")
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        losses = []
        for batch in batches:
            opt.zero_grad()
            loss = padded_loss(model, batch, pad_id) if name == "padded" else obj(model, batch)[0]
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        return losses

    timing, same = time_rounds(one_round, start, cuda, args.repeats, rtol=1e-4)
    samples = [e for b in batches for e in b]
    tokens = sum(len(e.enc.input_ids) for e in samples)
    computed = sum(ActorObjective(4096, pad_id).pack(b)[1].real_tokens for b in batches)
    print(f"{len(buffer)} replay states of {args.env}; {args.steps} steps x {args.batch} samples: {tokens} tokens "
          f"({tokens / len(samples):.0f} a sample), of which turnrl computes {computed}")
    result = {"benchmark": "archer_actor", "env": args.env, "states": len(buffer), "samples": len(samples),
              "tokens": tokens, "computed_tokens": computed, **timing, "same_loss": same}
    print(json.dumps(result))


if __name__ == "__main__":
    run_main(main)
