"""DMPO's turn weights on pairs that share a prefix: count turns from the start of the game
(the paper's phi(t, T)) or from the turn where the two sides part.

    turnrl quickstart --out runs/quickstart
    python scripts/dmpo_divergence.py --run runs/quickstart --out runs/dmpo_divergence --lr 3e-5 --epochs 2

On a finished quickstart run (its SFT agent and the pairs of its ETO iteration), for each
variant: train from the SFT agent (also the reference) on the pairs, then evaluate greedily on
the quickstart's ``seen`` games. Variants (``--variants``): ``dmpo-G-start`` (DMPO with
gamma G, turns counted from the first turn of the game, as the paper and ``turnrl train dmpo``
do), ``dmpo-G-div`` (turns counted from each pair's ``diverge_turn``: the replayed prefix both
sides share becomes part of the state, as in ETO's step-wise pairs) and ``dpo-start`` (DPO,
whose value is the same either way: the shared turns cancel). Writes ``OUT/results.json`` and
prints a table. Every stage is skipped when its output is complete, so a killed run resumes.
The measured table is in docs/methods/dmpo.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from turnrl.errors import TurnRLError

DEFAULT_VARIANTS = ["dmpo-0.1-start", "dmpo-0.1-div", "dmpo-0.9-div", "dpo-start"]


def main(argv: list[str] | None = None) -> int:
    """Run the study; bad input (a malformed pairs file, say) is a one-line error and exit code 2."""
    try:
        _main(argv)
    except TurnRLError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _main(argv: list[str] | None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, required=True, help="a finished `turnrl quickstart` output directory")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--episodes", type=int, default=200, help="seen-split evaluation games (>= 1)")
    ap.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, metavar="LOSS-GAMMA-FROM|dpo-start")
    args = ap.parse_args(argv)
    for path in (args.run / "sft" / "model", args.run / "iter-1" / "pairs.jsonl"):
        if not path.exists():
            ap.error(f"{path}: missing; --run must be a finished `turnrl quickstart` output directory")
    variants = [_parse(ap, v) for v in args.variants]
    if args.episodes < 1 or not args.lr >= 0 or not args.epochs > 0:
        ap.error(f"--episodes must be >= 1, --lr >= 0 and --epochs > 0 (got {args.episodes}, {args.lr:g}, "
                 f"{args.epochs:g})")

    from turnrl.data.io import read_pairs, write_jsonl
    from turnrl.data.pairs import diverge_turn
    from turnrl.pipelines.eto import evaluate_model, train_pairs
    from turnrl.pipelines.iterative import check_settings, run_stage
    from turnrl.quickstart import FULL, eto_config

    out: Path = args.out
    # every stage is reused when done: a rerun with other settings would report the first run's numbers
    # under the new ones. The variants are stages of their own, free to change
    check_settings(out, {"run": str(args.run.resolve()), "lr": args.lr, "epochs": args.epochs,
                         "episodes": args.episodes}, command="dmpo_divergence", what="--out")
    out.mkdir(parents=True, exist_ok=True)
    pairs = read_pairs(args.run / "iter-1" / "pairs.jsonl")
    files = {"start": out / "pairs-start.jsonl", "div": out / "pairs-div.jsonl"}
    write_jsonl(files["start"], pairs)
    write_jsonl(files["div"], [replace(p, meta={**p.meta, "train_from_turn": diverge_turn(p.chosen, p.rejected)})
                               for p in pairs])
    base = eto_config(FULL).model_copy(update={"eval_splits": ["seen"], "eval_episodes": args.episodes})
    sft = str(args.run / "sft" / "model")
    results = {"sft": run_stage(out / "sft-eval.json", lambda p: evaluate_model(base, sft, p, "sft"))[0]}
    for name, loss, gamma, start in variants:
        train = base.train.model_copy(update={"gamma": gamma, "lr": args.lr, "epochs": args.epochs})
        cfg = base.model_copy(update={"loss": loss, "train": train})
        model = run_stage(out / f"{name}-train", lambda p, c=cfg, s=start: train_pairs(c, sft, files[s], p, 1))
        results[name] = run_stage(out / f"{name}-eval.json",
                                  lambda p, c=cfg, m=model, n=name: evaluate_model(c, m, p, n))[0]
    (out / "results.json").write_text(json.dumps({"lr": args.lr, "epochs": args.epochs, "pairs": len(pairs),
                                                  "results": results}, indent=1))
    print(f"{len(pairs)} pairs; DMPO/DPO at lr {args.lr:g}, {args.epochs:g} epochs; seen split, {args.episodes} games")
    for name, r in results.items():
        lo, hi = r["ci95"]
        print(f"{name:16s} {r['avg_reward']:.3f} [{lo:.3f}, {hi:.3f}]  invalid {r['invalid_action_rate']:.3f}")


def _parse(ap: argparse.ArgumentParser, v: str) -> tuple[str, str, float, str]:
    """``dmpo-0.1-div`` -> (name, loss, gamma, where turns count from)."""
    parts = v.split("-")
    if parts == ["dpo", "start"]:
        return v, "dpo", 0.7, "start"
    try:
        loss, gamma, start = parts
        g = float(gamma)
    except ValueError:
        loss, g, start = "", 0.0, ""
    if loss != "dmpo" or start not in ("start", "div") or not 0 < g < 1:
        ap.error(f"--variants: bad variant {v!r}; expected dmpo-GAMMA-start, dmpo-GAMMA-div or dpo-start")
    return v, loss, g, start


if __name__ == "__main__":
    sys.exit(main())
