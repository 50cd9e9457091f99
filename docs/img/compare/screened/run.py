"""Issue 9 from screened SFT starts (29 Nov 2026; PREREGISTERED.txt beside this script).

    python docs/img/compare/screened/run.py run CONFIG OUT LO HI CUT SEED [SEED ...] [key=value ...] [--accept N]
    python docs/img/compare/screened/run.py list OUT [--accept N]

``run`` takes the candidate SEEDs in the order given. For each: it trains the seed's SFT agent as
``turnrl compare`` does (CONFIG and the overrides, OUT as its ``out``), reads it greedily on the 400
validation games ``ttt-s300000`` .. ``ttt-s300399`` (empty board, random-opponent seeds that no split
holds: not the ``seen`` games of the test), and writes ``OUT/screen/seed-S.json``. A start whose
validation avg reward lies in [LO, HI) is *accepted*, and the seed's ``turnrl compare`` stages run
(the config's methods on the ``seen`` games: SFT and SPPO for issue 9, SFT, ETO and DMPO for issue 5
in ../eto-screened/PREREGISTERED.txt). A seed is not begun after CUT (UTC, HH:MM,
the next such time from the start). Each stage resumes: a screened seed is not screened again.

``--accept N`` (the second run, ../screened2/PREREGISTERED.txt) caps the test at the N accepted seeds
with the lowest numbers: a candidate is not begun, and an accepted seed's SPPO is not run, once N seeds
below it have been accepted. With two processes taking alternate seeds this keeps the test's seeds
fixed by the screen alone, whichever process is faster.

``list`` prints every screened seed with its validation reward and whether it was accepted and
finished (every method stage of the config done; the screen record keeps the methods), then the
accepted and finished seeds on one line (with ``--accept N``, only the first N accepted), to pass
to ``sppo600/paired.py`` or as the ``seeds`` of the aggregating ``turnrl compare``.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from turnrl.errors import TurnRLError, run_script

if TYPE_CHECKING:
    from turnrl.pipelines.eto import EtoConfig

USAGE = "run.py run CONFIG OUT LO HI CUT SEED [SEED ...] [key=value ...] [--accept N] | run.py list OUT [--accept N]"
FIRST, GAMES = 300000, 400  # the validation games: ttt-s300000 .. ttt-s300399


def validation_reward(pipe: EtoConfig, model: str, out: Path) -> float:
    """Greedy avg reward of ``model`` on the validation games, under the pipeline's prompt and rules."""
    from turnrl.collect import run_policy
    from turnrl.rollout import SamplingConfig, load_policy
    from turnrl.rollout.sampler import EpisodeSpec

    policy = load_policy(model, sampling=SamplingConfig(temperature=0.0, max_new_tokens=pipe.max_new_tokens),
                         history=pipe.history)
    specs = [EpisodeSpec(i, "seen", f"ttt-s{FIRST + i}", i) for i in range(GAMES)]
    trajs = run_policy(policy, pipe.env, split="seen", env_opts=pipe.env_opts, num_envs=pipe.num_envs,
                       prompt=pipe.prompt(), out=out, specs=specs)
    if len(trajs) != GAMES:
        raise TurnRLError(f"{out}: {len(trajs)} validation games, expected {GAMES}")
    return sum(t.return_ for t in trajs) / GAMES


def _accept_cap(argv: list[str]) -> tuple[list[str], int | None]:
    """``argv`` without ``--accept N``, and N (None when not given)."""
    if "--accept" not in argv:
        return argv, None
    i = argv.index("--accept")
    try:
        cap = int(argv[i + 1])
    except (IndexError, ValueError):
        raise ValueError("--accept takes a positive integer") from None
    if cap < 1:
        raise ValueError(f"--accept takes a positive integer, not {cap}")
    return argv[:i] + argv[i + 2:], cap


def _screens(out: Path) -> list[dict]:
    """Every screened seed's record, by seed number."""
    return sorted((json.loads(p.read_text()) for p in (out / "screen").glob("seed-*.json")), key=lambda s: s["seed"])


def _accepted_below(out: Path, seed: int) -> int:
    return sum(s["accepted"] and s["seed"] < seed for s in _screens(out))


def run(argv: list[str]) -> None:
    from turnrl.config import load_config
    from turnrl.pipelines.compare import CompareConfig, _check, compare_settings, run_compare, seed_run
    from turnrl.pipelines.iterative import check_settings
    from turnrl.train.core import atomic_write_json

    argv, cap = _accept_cap(argv)
    overrides = [a for a in argv if "=" in a]
    rest = [a for a in argv if "=" not in a]
    if len(rest) < 6:
        raise ValueError("give CONFIG, OUT, LO, HI, CUT and at least one SEED")
    config, out = rest[0], Path(rest[1])
    lo, hi = float(rest[2]), float(rest[3])
    now = dt.datetime.now(dt.UTC)
    cut = dt.datetime.combine(now.date(), dt.time.fromisoformat(rest[4]), dt.UTC)
    if cut < now:  # the next such time: a run begun before midnight with a CUT after it
        cut += dt.timedelta(days=1)
    seeds = [int(s) for s in rest[5:]]
    cfg = load_config(CompareConfig, config, [*overrides, f"out={out}"])
    _check(cfg)  # what turnrl compare checks before it writes anything
    check_settings(cfg.out, compare_settings(cfg))
    (out / "screen").mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        path = out / "screen" / f"seed-{seed}.json"
        if cap is not None and _accepted_below(out, seed) >= cap:
            print(f"{seed}: not run ({cap} seeds below it accepted)", flush=True)
            continue
        if not path.is_file():
            if dt.datetime.now(dt.UTC) > cut:
                print(f"{seed}: not begun (past {rest[4]} UTC)", flush=True)
                continue
            run = seed_run(cfg, seed)  # the seed's demos and SFT agent, as turnrl compare makes them
            reward = validation_reward(run.pipe, run.sft, out / "screen" / f"seed-{seed}-games.jsonl")
            atomic_write_json(path, {"seed": seed, "validation": reward, "lo": lo, "hi": hi,
                                     "accepted": lo <= reward < hi, "methods": list(cfg.methods)})
        screen = json.loads(path.read_text())
        if (screen["lo"], screen["hi"]) != (lo, hi):  # its decision was another band's
            raise TurnRLError(f"{path}: screened with the band [{screen['lo']}, {screen['hi']}), this run gives "
                              f"[{lo}, {hi}); give that band or another OUT")
        print(f"{seed}: validation {screen['validation']:.4f}, {'accepted' if screen['accepted'] else 'screened out'}",
              flush=True)
        if screen["accepted"] and cap is not None and _accepted_below(out, seed) >= cap:
            print(f"{seed}: accepted, not run ({cap} seeds below it accepted meanwhile)", flush=True)
        elif screen["accepted"]:
            run_compare(cfg.model_copy(update={"seeds": [seed]}))


def list_seeds(argv: list[str]) -> None:
    argv, cap = _accept_cap(argv)
    if len(argv) != 1:
        raise ValueError("give OUT")
    out = Path(argv[0])
    finished, accepted = [], 0
    bands = {(s["lo"], s["hi"]) for s in _screens(out)}
    if len(bands) > 1:  # one run's seeds were screened with one band
        raise TurnRLError(f"{out}/screen: seeds screened with several bands {sorted(bands)}")
    for s in _screens(out):
        in_test = s["accepted"] and (cap is None or accepted < cap)
        accepted += s["accepted"]
        # finished: every method stage of the run is done (a record from before "methods" was kept ran SPPO)
        done = all((out / f"seed-{s['seed']}" / f"{m}.json.done.json").is_file() for m in s.get("methods", ["sppo"]))
        print(f"{s['seed']}  {s['validation']:.4f}  {'accepted' if s['accepted'] else '-'}"
              f"{'  (beyond the first ' + str(cap) + ')' if s['accepted'] and not in_test else ''}"
              f"{'  finished' if done and in_test else ''}")
        if in_test and done:
            finished.append(s["seed"])
    print("accepted and finished:", " ".join(map(str, finished)))


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in ("run", "list"):
        raise ValueError("the first argument is run or list")
    (run if argv[0] == "run" else list_seeds)(argv[1:])


if __name__ == "__main__":
    run_script(main, USAGE, sys.argv[1:])
