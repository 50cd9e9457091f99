"""One PPO iteration's compute on per-turn samples: turnrl's packed forward with each episode's
prefix computed once, against padded batches (how TRL's GRPO and PPO trainers compute
per-token log-probs) and against turnrl's own plain packing.

PPO with ``history=0`` trains every agent turn as its own sequence (instruction + the
observation + the reply), so the turns of an episode repeat the instruction. The data is the
narrow-gap bandit design's rollout shape (docs/rlft.md): 10 arms, one history line, the
study's instruction, 16 episodes of 20 steps, one-word rationale + ``ACTION=X`` replies (the
``lose-shift`` script's). An iteration is what ``turnrl train ppo`` computes after the
rollout: the old-policy pass and the reference pass (no grad), then ``--epochs`` x
``--minibatches`` forward + backward passes of the clipped PPO loss with the k3 KL.

* ``turnrl``: ``PPOObjective`` with ``shared_prefix`` (the default): ``forward.pack_runs``, each
  episode's run of turns one unit whose common prefix is computed once, attention segment by
  segment, the LM head at agent tokens only;
* ``turnrl-plain``: the same with ``shared_prefix=false`` (packed rows, no padding inside a row);
* ``padded``: each minibatch left-padded (prompts) and right-padded (replies) to its longest
  sequence with an attention mask, the LM head on the reply span (``logits_to_keep``), as TRL's
  GRPO trainer computes per-token log-probs; the same loss.

All three compute the same log-probs and take the same optimizer steps (plain SGD, so that the
three start each round from the same weights; checked: per-sequence log-prob sums and every update's
loss, each taken after the steps before it, agree to 1e-4).
Time is the process's CPU time on a CPU (run with ``OMP_NUM_THREADS=1``) and wall time on a
GPU; the best of ``--repeats`` rounds after an untimed warm-up. The last line is one JSON object
with ``ratio`` = padded time / turnrl time (above 1: turnrl is faster) and ``ratio_plain``.

    OMP_NUM_THREADS=1 python benchmarks/ppo_update.py [--model DIR] [--episodes 16] [--steps 20]
                                                      [--minibatches 2] [--epochs 2] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np
import torch
from _common import padded_logps, positive, run_main, time_rounds, training_model  # beside this script

from turnrl import greedy_study as gs
from turnrl.agent.prompting import PromptConfig, agent_view
from turnrl.collect import run_policy
from turnrl.losses import ppo_loss
from turnrl.tokenization import ChatFormat
from turnrl.train.ppo import PPOConfig, PPOObjective, TurnSample, policy_forward


def rollout(chat: ChatFormat, episodes: int, steps: int) -> list[list[TurnSample]]:
    """The narrow-gap start's script played on ``episodes`` train tasks, every turn tokenized as
    PPO tokenizes it (``history=0``)."""
    opts = {**gs.NARROW_GAP["bandit_env"], "horizon": steps}
    policy = gs.CompactBanditPolicy(gs.NARROW_GAP["greedy_policy"])
    trajs = run_policy(policy, "bandit", episodes=episodes, env_opts=opts, num_envs=episodes,
                       prompt=PromptConfig(history=0, instruction=gs.BANDIT_INSTRUCTION))
    rng = np.random.default_rng(0)
    out = []
    for e, traj in enumerate(trajs):
        turns = []
        n = sum(m.role == "assistant" for m in traj.messages)
        for t in range(n):
            view, local = agent_view(traj.messages, t, 0)
            enc = chat.encode(view, trainable_turns=[local])
            assert enc is not None
            turns.append(TurnSample(enc, e, t, advantage=float(rng.standard_normal())))
        out.append(turns)
    return out


def padded_flat(model: Any, samples: list[TurnSample], pad_id: int) -> torch.Tensor:
    """The samples' agent-token log-probs from one padded batch, flat in sample order."""
    logps, keep = padded_logps(model, [s.enc for s in samples], pad_id)
    return logps[keep]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model directory (default: a fresh tiny model)")
    ap.add_argument("--episodes", type=positive, default=16)
    ap.add_argument("--steps", type=positive, default=20)
    ap.add_argument("--minibatches", type=positive, default=2)
    ap.add_argument("--epochs", type=positive, default=2)
    ap.add_argument("--repeats", type=positive, default=2)
    args = ap.parse_args()
    start, chat, pad_id, cuda = training_model(args.model)
    episodes = rollout(chat, args.episodes, args.steps)
    samples = [s for ep in episodes for s in ep]
    per_mb = -(-len(episodes) // args.minibatches)
    minibatches = [[s for ep in episodes[i : i + per_mb] for s in ep] for i in range(0, len(episodes), per_mb)]
    lengths = [len(s.enc.input_ids) for s in samples]

    def iteration(name: str, model: Any, ref: Any) -> list[float]:
        """Old and reference passes, then the updates; returns each sample's summed old log-prob and
        each update's loss (the later ones are taken after earlier steps: the same steps, the same losses)."""
        obj = PPOObjective(PPOConfig(shared_prefix=name == "turnrl", beta_kl=0.1), pad_id)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        sums = []
        for mb in minibatches:
            with torch.no_grad():
                if name == "padded":
                    old, reflp = padded_flat(model, mb, pad_id), padded_flat(ref, mb, pad_id)
                else:
                    batch = obj.pack(mb)
                    order = torch.argsort(batch.seq_index, stable=True)  # tokens back in sample order
                    old = policy_forward(model, batch).logps[order]
                    reflp = policy_forward(ref, batch).logps[order]
            at = 0
            for s in mb:
                s.old_logps, s.ref_logps = old[at : at + s.tokens].cpu(), reflp[at : at + s.tokens].cpu()
                sums.append(float(s.old_logps.sum()))
                at += s.tokens
        for _ in range(args.epochs):
            for mb in minibatches:
                opt.zero_grad()
                if name == "padded":
                    logps = padded_flat(model, mb, pad_id)
                    counts = torch.tensor([s.tokens for s in mb])
                    adv = torch.repeat_interleave(torch.tensor([s.advantage for s in mb]), counts).to(logps.device)
                    old = torch.cat([s.old_logps for s in mb]).to(logps.device)  # type: ignore[misc]
                    ref_l = torch.cat([s.ref_logps for s in mb]).to(logps.device)  # type: ignore[misc]
                    losses, _ = ppo_loss(logps, old, adv, clip_eps=0.2, beta_kl=0.1, ref_logps=ref_l,
                                         kl_estimator="k3")
                    loss = losses.sum()
                else:
                    loss, _ = obj(model, [mb])
                sums.append(float(loss))
                loss.backward()
                opt.step()
        return sums

    timing, same = time_rounds(lambda name, model: iteration(name, model, start), start, cuda, args.repeats)
    print(f"{len(samples)} turn sequences, {sum(lengths)} tokens ({np.mean(lengths):.0f} a turn), "
          f"{sum(s.tokens for s in samples)} agent tokens; {args.epochs} epochs x {len(minibatches)} minibatches")
    result = {"benchmark": "ppo_update", "episodes": len(episodes), "turns": len(samples), "tokens": sum(lengths),
              **timing, "same_logps_and_losses": same}
    print(json.dumps(result))


if __name__ == "__main__":
    run_main(main)
