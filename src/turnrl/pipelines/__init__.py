"""Iterative pipelines (ETO, DMPO, RFT, self-play, SPPO) and the method comparison.

:mod:`turnrl.pipelines.iterative` is the resumable skeleton: a stage is a function whose
output is a file or a directory, skipped when its completion marker exists.
"""

from turnrl.pipelines.iterative import Stage, is_done, iter_dir, mark_done, run_stage

__all__ = ["Stage", "is_done", "iter_dir", "mark_done", "run_stage"]
