"""Tables and plots of a narrow-gap reading on the 500 instances (issue 8; docs/rlft.md).

    python docs/img/rlft/narrow-gap/report.py STUDY_DIR DOCS_DIR

Reads ``STUDY_DIR/eval-500/`` (written by ``run.py rl``): the start and whichever RLFT rows and seeds were
read there. Writes the study's own report into DOCS_DIR (``rlft-tables.md``, ``rlft-bandit-regret.png``,
``rlft-bandit-coverage.png``: CIs over seeds, ``Low.`` acted on, each row minus the start) and copies the
evaluation files to ``DOCS_DIR/eval-500/``.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "knowing-doing"))

from eval_more_instances import eval_tasks  # noqa: E402

from turnrl import greedy_study as gs  # noqa: E402
from turnrl.errors import TurnRLError, run_script  # noqa: E402

ROWS = {"greedy-like SFT": "sft-greedy", "RLFT": "rlft-s", "RLFT + bonus": "rlft-bonus-s"}


def main(args: list[str]) -> None:
    if len(args) != 2:
        raise ValueError("missing or extra arguments")
    study, docs = Path(args[0]), Path(args[1])
    parts = study / "eval-500"
    if not (parts / "sft-greedy.json").is_file():
        raise TurnRLError(f"{parts / 'sft-greedy.json'}: no reading of the start (run run.py rl first)")
    models = {label: sorted(p.stem for p in parts.glob(f"{prefix}*.json")) for label, prefix in ROWS.items()}
    models = {label: ms for label, ms in models.items() if ms}
    seeds = max(len(ms) for ms in models.values())
    tasks = {label: eval_tasks(study, parts, ms, []) for label, ms in models.items()}
    cfg: dict[str, Any] = {**gs.NARROW_GAP, "instances": 500}
    gs.report({"bandit": gs.aggregate_bandit(parts, seeds, cfg, tasks)}, docs)
    (docs / "eval-500").mkdir(parents=True, exist_ok=True)
    for ms in models.values():
        for m in ms:
            shutil.copyfile(parts / f"{m}.json", docs / "eval-500" / f"{m}.json")
    print((docs / "rlft-tables.md").read_text())


if __name__ == "__main__":
    run_script(main, "report.py STUDY_DIR DOCS_DIR")
