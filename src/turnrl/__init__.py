"""turnrl: train LLM agents on multi-turn tasks with preference optimization and RL."""

from turnrl.errors import TurnRLError

__version__ = "0.1.0"
__all__ = ["TurnRLError", "__version__"]
