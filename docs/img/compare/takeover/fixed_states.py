"""Does one takeover-pair iteration fix the agent's own mistakes, in the states it trained on?

usage: python docs/img/compare/takeover/fixed_states.py OUT SEED [SEED ...]

For each seed of a ``turnrl compare`` run with ``pipeline.pairs=takeover`` (OUT/seed-S/), every
takeover pair of ETO's iteration 1 (``train_from_turn`` t >= 1) gives one state: the agent's own game
up to its turn t, where the SFT agent played the rejected side's move and the expert the chosen side's.
Both the SFT agent and ETO's iteration-1 agent play that state greedily; the script counts how many
of those states the trained agent now plays as the expert did, as the SFT agent did, another legal
move, or an invalid one (an occupied cell, or no action). The states' legal moves come from replaying
the game's executed moves in the env (tic-tac-toe against the random opponent, as the run played).
"""

from __future__ import annotations

from pathlib import Path

from turnrl.errors import run_script


def main(argv: list[str]) -> None:
    from turnrl import envs
    from turnrl.agent.parsing import parse_action
    from turnrl.data.io import read_pairs
    from turnrl.rollout import SamplingConfig, load_policy
    from turnrl.rollout.policies import Request

    if len(argv) < 2:
        raise ValueError("give OUT and at least one SEED")
    out, seeds = Path(argv[0]), [int(s) for s in argv[1:]]
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=48)
    total = {"states": 0, "sft_as_rejected": 0, "expert": 0, "as_before": 0, "other_legal": 0, "invalid": 0}
    env = envs.make("tictactoe", opponent="random", expert_ties="ordered")
    for seed in seeds:
        d = out / f"seed-{seed}"
        pairs = [p for p in read_pairs(d / "eto" / "iter-1" / "pairs.jsonl") if p.meta.get("train_from_turn", 0) >= 1]
        requests = []
        for p in pairs:
            t = p.meta["train_from_turn"]
            turns = [i for i, m in enumerate(p.rejected.messages) if m.role == "assistant"]
            requests.append(Request(None, p.rejected.messages[: turns[t]], t, None, None))  # type: ignore[arg-type]
        counts = dict.fromkeys(total, 0)
        counts["states"] = len(pairs)
        replies = {}
        for name, model in (("sft", d / "sft" / "model"), ("eto1", d / "eto" / "iter-1" / "train" / "model")):
            policy = load_policy(str(model), sampling=greedy, history=0)
            replies[name] = [parse_action(r.content, None).action for r in policy.act(requests)]
        for p, req, before, after in zip(pairs, requests, replies["sft"], replies["eto1"], strict=True):
            t = p.meta["train_from_turn"]
            written = [m for m in p.rejected.messages if m.role == "assistant"][t]  # the SFT agent's reply there
            counts["sft_as_rejected"] += before == parse_action(written.content, None).action
            expert = p.chosen.actions[t]
            x = p.rejected
            obs, _ = env.reset(seed=x.meta["seed"], options={"task_id": x.task_id, "split": x.split})
            for m in [m for m in x.messages if m.role == "assistant"][:t]:
                obs = env.step(m.action)[0]  # the executed move (a random legal one for an invalid reply)
            if obs != req.messages[-1].content:
                raise ValueError(f"seed {seed}, {x.id}: the replayed game is not the recorded one")
            legal = env.valid_actions() or []
            counts["expert" if after == expert else "as_before" if after == before
                   else "other_legal" if after in legal else "invalid"] += 1
        print(f"seed {seed}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
        for k in total:
            total[k] += counts[k]
    print("all: " + ", ".join(f"{k} {v}" for k, v in total.items()))


if __name__ == "__main__":
    run_script(main, "fixed_states.py OUT SEED [SEED ...]")
