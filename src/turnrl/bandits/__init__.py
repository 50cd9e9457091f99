"""Decision-making on bandits (seed 004): scripted algorithms, fast simulation, rationales.

- :mod:`turnrl.bandits.algorithms`: UCB, LinUCB, Thompson sampling, epsilon-greedy,
  greedy and random, vectorised over instances; ``make_algorithm("ucb:c=2")``;
- :mod:`turnrl.bandits.simulate`: instances as arrays, :func:`simulate`, regret, coverage;
- :mod:`turnrl.bandits.rationale`: the templated rationales and their UCB-value block;
- :mod:`turnrl.bandits.scripted`: an algorithm acting in a bandit env;
- :mod:`turnrl.bandits.policies`: scripted sampler policies (``load_policy("ucb")``);
- :mod:`turnrl.bandits.aids`: inference-time exploration aids for model policies.

This package's ``__init__`` stays light (numpy only): the envs import it at registration.
"""

from turnrl.bandits.algorithms import (
    ALGORITHMS,
    Algorithm,
    Setting,
    is_algorithm_spec,
    make_algorithm,
    ucb_values,
)
from turnrl.bandits.simulate import Instance, Instances, Run, coverage, cumulative_regret, simulate

__all__ = [
    "ALGORITHMS", "Algorithm", "Instance", "Instances", "Run", "Setting", "coverage", "cumulative_regret",
    "is_algorithm_spec", "make_algorithm", "simulate", "ucb_values",
]
