"""Start B and the fifth design's RLFT models on more greedy games (pre-registered in B-MORE-GAMES.txt).

    python docs/img/rlft/ttt-mc/more_games.py QUICKSTART_OUT RUN_DIR GAMES ENV_SEED SEED [SEED ...]

Plays GAMES greedy games on the seen split against the random opponent, env seed ENV_SEED (the same games for
every model), with the start (``QUICKSTART_OUT/sft/model``) and each ``RUN_DIR/ppo-sSEED/model``, prints each
model and the seeds' CI and by-game gain as ``run.py`` does, and writes
``RUN_DIR/results-GAMESgames-seedENV_SEED.json``.
"""

import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ttt-quickstart-start"))  # run.py (workers too)

from run import play_all, summarize_rows  # noqa: E402

from turnrl.errors import run_script  # noqa: E402


def main(args: list[str]) -> None:
    if len(args) < 5:
        raise ValueError("missing arguments")
    start, run_dir = str(Path(args[0]) / "sft" / "model"), Path(args[1])
    games, env_seed, seeds = int(args[2]), int(args[3]), [int(s) for s in args[4:]]
    named = {"start": start, **{f"rlft-s{s}": str(run_dir / f"ppo-s{s}" / "model") for s in seeds}}
    for path in named.values():
        if not Path(path).is_dir():
            raise ValueError(f"{path}: no model there")
    with ProcessPoolExecutor(2) as ex:
        res = {"greedy": play_all(ex, named, 0.0, games, env_seed)}
    summarize_rows(res, seeds)
    (run_dir / f"results-{games}games-seed{env_seed}.json").write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    run_script(main, "more_games.py QUICKSTART_OUT RUN_DIR GAMES ENV_SEED SEED [SEED ...]")
