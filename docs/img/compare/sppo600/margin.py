"""Does SPPO move the states where greedy play loses? (exploratory, after the test)

For every state where a seed's SFT agent wrote an invalid greedy reply in its evaluation games, the
margin, in nats, of that reply's log-prob over the best of the same reply naming a legal cell
instead ("... I take 7.\\nAction: 7"), under the SFT agent and each SPPO iteration. Greedy decoding
flips to a legal move only once the margin falls below 0. The agent sees one board (history 0).

    python docs/img/compare/sppo600/margin.py OUT SEED [SEED ...]
"""

import json
import re
import sys
from pathlib import Path

import torch

from turnrl.errors import TurnRLError, run_script
from turnrl.tokenization import ChatFormat

USAGE = "margin.py OUT SEED [SEED ...]"


def _states(path: Path) -> list[tuple[list[dict], str, list[str]]]:
    """(system + observation, invalid reply, the reply with each legal cell instead)."""
    out = []
    with path.open() as f:
        for line in f:
            msgs = json.loads(line)["messages"]
            for i, m in enumerate(msgs):
                if m["role"] == "assistant" and not m.get("valid", True):
                    legal = re.search(r"Legal moves: ([\d, ]+)", msgs[i - 1]["content"])
                    act = m["content"].rsplit("Action: ", 1)[-1].strip()
                    if legal is None or not act.isdigit():
                        continue  # not a cell: no legal twin
                    cells = legal.group(1).replace(" ", "").split(",")
                    twins = [m["content"].replace(f"take {act}", f"take {c}").replace(f"Action: {act}", f"Action: {c}")
                             for c in cells]
                    out.append(([msgs[0], msgs[i - 1]], m["content"], twins))
    return out


def _reply_logp(model: torch.nn.Module, fmt: ChatFormat, context: list[dict], reply: str) -> float:
    enc = fmt.encode([*context, {"role": "assistant", "content": reply}])
    assert enc is not None
    ids = torch.tensor([enc.input_ids])
    with torch.no_grad():
        logp = model(ids).logits[0, :-1].log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
    mask = torch.tensor(enc.action_mask[1:], dtype=torch.bool)
    return float(logp[mask].sum())


def main(argv: list[str]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if len(argv) < 2 or not all(s.isdigit() for s in argv[1:]):
        raise ValueError("give OUT and at least one SEED")
    out = Path(argv[0])
    for seed in argv[1:]:
        run = out / f"seed-{seed}"
        if not (run / "sft-eval-seen.jsonl").is_file():
            raise TurnRLError(f"{run}/sft-eval-seen.jsonl: missing; run the compare command for seed {seed} first")
        states = _states(run / "sft-eval-seen.jsonl")
        models = {"SFT": run / "sft" / "model"}
        models.update({f"SPPO {i}": run / "sppo" / f"iter-{i}" / "train" / "model" for i in (1, 2, 3)})
        print(f"seed {seed}: {len(states)} states with an invalid greedy SFT reply")
        for name, path in models.items():
            if not path.is_dir():
                raise TurnRLError(f"{path}: missing")
            model = AutoModelForCausalLM.from_pretrained(path).eval()
            fmt = ChatFormat(AutoTokenizer.from_pretrained(path))
            margins = sorted(_reply_logp(model, fmt, ctx, bad) - max(_reply_logp(model, fmt, ctx, t) for t in twins)
                             for ctx, bad, twins in states)
            print(f"  {name:7s} margin mean {sum(margins) / len(margins):+.2f}, median "
                  f"{margins[len(margins) // 2]:+.2f} nats; a legal twin preferred in "
                  f"{sum(m < 0 for m in margins)} of {len(margins)}")


if __name__ == "__main__":
    run_script(main, USAGE, sys.argv[1:])
