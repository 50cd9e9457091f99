"""Rollout: engines that sample tokens, policies, and the lock-step sampler."""

from turnrl.rollout.engine import Generation, HFEngine, SamplingConfig
from turnrl.rollout.policies import (
    ExpertPolicy,
    ModelPolicy,
    Policy,
    RandomPolicy,
    Reply,
    Request,
    load_policy,
)
from turnrl.rollout.sampler import EpisodeSpec, Sampler, cut_rate, invalid_rate, plan_episodes

__all__ = [
    "EpisodeSpec", "ExpertPolicy", "Generation", "HFEngine", "ModelPolicy", "Policy", "RandomPolicy",
    "Reply", "Request", "Sampler", "SamplingConfig", "cut_rate", "invalid_rate", "load_policy", "plan_episodes",
]
