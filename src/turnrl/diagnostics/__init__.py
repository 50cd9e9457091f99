"""Diagnostics of decision making (DESIGN 5, seed 004): regret, action coverage, frequency
bias and the knowing-doing gap, for scripted bandit policies and any model.

See :mod:`turnrl.diagnostics.bandit` (computations, ``diagnose``) and
:mod:`turnrl.diagnostics.plots` (PNGs); the command line is ``turnrl diagnose bandit``.
"""

from turnrl.diagnostics.bandit import DiagnoseConfig, diagnose

__all__ = ["DiagnoseConfig", "diagnose"]
