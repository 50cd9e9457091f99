"""Collect and evaluate: run a policy on an env's split through the lock-step sampler.

Collections append to a JSONL file one finished episode at a time; running the same
collection again after a kill skips the episodes already in the file and plays the rest.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from turnrl import envs
from turnrl.agent.prompting import PromptConfig
from turnrl.data.io import JsonlWriter, iter_jsonl, trajectory_from_dict, write_jsonl
from turnrl.data.schema import TRAJECTORY_SCHEMA, Trajectory
from turnrl.errors import TurnRLError
from turnrl.evaluation import summarize
from turnrl.rollout.policies import Policy
from turnrl.rollout.sampler import EpisodeSpec, Sampler, finish_order, plan_episodes


def make_env_factory(env_name: str, env_opts: dict[str, Any] | None = None) -> Callable[[], envs.TextEnv]:
    """A factory for ``env_name`` with ``env_opts``; builds one env now to validate them."""
    opts = dict(env_opts or {})
    envs.make(env_name, **opts).close()
    return lambda: envs.make(env_name, **opts)


WORKER_BACKENDS = ("process", "ray")


def check_workers(workers: int, worker_backend: str = "process") -> None:
    """Refuse a bad ``workers`` / ``worker_backend`` pair (and the ray backend without ray)."""
    if workers < 0:
        raise TurnRLError(f"workers must be >= 0 (got {workers})")
    if worker_backend not in WORKER_BACKENDS:
        raise TurnRLError(f"unknown worker backend '{worker_backend}'; choose from: {', '.join(WORKER_BACKENDS)}")
    if worker_backend == "ray":
        if workers < 1:
            raise TurnRLError("the ray worker backend runs the envs in --workers N actors: give N >= 1")
        from turnrl.envs.ray_workers import import_ray

        import_ray()


def run_policy(
    policy: Policy,
    env_name: str,
    *,
    split: str = "train",
    episodes: int = 100,
    env_opts: dict[str, Any] | None = None,
    num_envs: int = 32,
    seed: int = 0,
    prompt: PromptConfig | None = None,
    out: str | Path | None = None,
    source: str | None = None,
    progress: Callable[[int], None] | None = None,
    workers: int = 0,
    specs: Sequence[EpisodeSpec] | None = None,
    worker_backend: str = "process",
    ray_address: str | None = None,
) -> list[Trajectory]:
    """Play ``episodes`` episodes; with ``out``, append each to it and skip those already there.

    ``workers`` > 0 runs the ``num_envs`` environments in that many worker processes (assigned
    round-robin) and steps them from threads (:mod:`turnrl.envs.workers`); the episodes are
    the same as with ``workers=0`` (in-process envs), only the wall time differs.
    ``worker_backend="ray"`` puts them in ``workers`` Ray actors instead
    (:mod:`turnrl.envs.ray_workers`; ``ray_address`` as for ``ray.init``: None starts a
    local Ray or joins ``RAY_ADDRESS``, ``"auto"`` joins this machine's cluster). ``specs``
    plays these planned episodes instead of the split's first ``episodes`` (several samples of
    a task, expert-prefix replays); their indices must be distinct."""
    check_workers(workers, worker_backend)
    if workers > 0 and getattr(policy, "reads_env", False):
        raise TurnRLError(f"policy '{policy.name}' reads the env's state in this process: run it without workers "
                          "(--workers)")
    factory = make_env_factory(env_name, env_opts)
    probe = factory()
    try:
        if split not in ("train", "seen", "unseen"):
            raise TurnRLError(f"unknown split '{split}'; choose from: train, seen, unseen")
        if specs is None:
            specs = plan_episodes(probe, split, episodes, seed)
        check_env = getattr(policy, "check_env", None)  # a policy that cannot play this env: before any file
        if check_env is not None:
            check_env(probe)
    finally:
        probe.close()
    src = source or ("expert" if policy.name == "expert" else "policy")
    done: dict[str, Trajectory] = {}
    if out is not None and Path(out).exists():
        done = _read_episodes(Path(out))
        _check_resumable(Path(out), done, specs, env_name, policy, env_opts or {}, prompt)
        JsonlWriter(out, append=True).open().close()  # drops a line a kill left half-written
    todo = [s for s in specs if s.episode_id(env_name) not in done]
    if progress is not None and len(specs) - len(todo):
        progress(len(specs) - len(todo))
    sampler: Sampler
    if workers > 0:
        from turnrl.envs.workers import ThreadedSampler, worker_pool_factory

        if worker_backend == "ray":
            from turnrl.envs.ray_workers import ray_pool_factory

            make_env = ray_pool_factory(env_name, env_opts, workers=workers, address=ray_address)
        else:
            make_env = worker_pool_factory(env_name, env_opts, workers=workers)
        sampler = ThreadedSampler(make_env, policy, env_name=env_name, num_envs=num_envs, prompt=prompt, source=src)
    else:
        sampler = Sampler(factory, policy, env_name=env_name, num_envs=num_envs, prompt=prompt, source=src)
    opts = dict(env_opts or {})

    def keep(t: Trajectory, writer: JsonlWriter | None = None) -> None:
        t.meta["env_opts"] = dict(opts)  # what the env was built with: a resume must match it
        if writer is not None:
            writer.write(t)
        if progress is not None:
            progress(1)

    try:
        if out is not None:
            with JsonlWriter(out, append=True) as w:
                new = sampler.run(todo, on_episode=lambda t: keep(t, w))
        else:
            new = sampler.run(todo, on_episode=keep)
    finally:
        sampler.close()
    by_id = {**done, **{t.id: t for t in new}}
    trajs = [by_id[s.episode_id(env_name)] for s in specs]
    ids = [t.id for t in trajs]
    if out is not None and done and set(done) <= set(ids):
        # resumed: the file holds the episodes in the order they finished across the runs; it is rewritten
        # in the order one uninterrupted run writes, which what reads it back (pairs, training data) keeps.
        # Also when nothing was left to play: a resumed run killed before its rewrite left that order behind.
        # A file that also holds episodes of another plan (a longer collection's) is left as it is
        order = finish_order(ids, {t.id: t.num_turns for t in trajs}, num_envs)
        if [*done, *(t.id for t in new)] != order:
            write_jsonl(out, [by_id[i] for i in order])
    return trajs


#: how every line :class:`JsonlWriter` writes for a trajectory starts
_LINE_HEAD = json.dumps({"schema": TRAJECTORY_SCHEMA}, ensure_ascii=False)[:-1].encode()


def _read_episodes(out: Path) -> dict[str, Trajectory]:
    """The episodes already in ``out`` by id, read without changing the file. A last line without its
    newline that is no JSON object is one a kill cut short (the writer drops it on opening): it is
    skipped when it is the start of a trajectory line, and anything else is an error, so that a file
    that is no collection of this tool's (whose last line the writer would cut off) is left whole."""
    lines, last = 0, b""
    with out.open("rb") as f:
        for raw in f:
            lines, last = lines + 1, raw
    cut = bool(last) and not last.endswith(b"\n")
    if cut:
        try:
            cut = not isinstance(json.loads(last.decode("utf-8")), dict)
        except (UnicodeDecodeError, ValueError):
            pass
    if cut and not (last.startswith(_LINE_HEAD) or _LINE_HEAD.startswith(last)):
        raise TurnRLError(f"{out}:{lines}: not a trajectory file of turnrl's (its last line is no episode); "
                          "choose another --out or remove it")
    done: dict[str, Trajectory] = {}
    try:
        for lineno, obj in iter_jsonl(out):
            t = trajectory_from_dict(obj, f"{out}:{lineno}")
            done[t.id] = t
    except TurnRLError as e:
        if not (cut and str(e).startswith(f"{out}:{lines}:")):
            raise
    return done


def _check_resumable(out: Path, done: dict[str, Trajectory], specs: Sequence[EpisodeSpec], env_name: str,
                     policy: Policy, env_opts: dict[str, Any], prompt: PromptConfig | None = None) -> None:
    """The episodes already in ``out`` must be this run's: same env, env options, split, policy (a model
    folder by its path, or by its weights' fingerprint when it moved since), model weights, sampling
    settings, invalid-reply rules and system-message settings (``instruction``, ``example``), and an
    episode of a planned id must be that plan's (task, seed). Anything else is another run's file, which resuming would mix into this one's. Env options are
    compared with the env's defaults filled in (``opponent=random`` given = left unset); episodes
    written before env options, sampling settings, rules or the prompt were recorded pass those checks."""
    from turnrl.rollout.sampler import invalid_rules, policy_settings, prompt_text

    policy_name = policy.name
    settings = policy_settings(policy)
    rules = invalid_rules(prompt or PromptConfig())
    text = prompt_text(prompt or PromptConfig())
    sampling, fingerprint = settings.get("sampling"), settings.get("model_fingerprint")
    splits = {s.split for s in specs}
    planned = {s.episode_id(env_name): s for s in specs}
    ours = envs.resolved_options(env_name, env_opts)
    for t in done.values():
        theirs = t.meta.get("policy")
        # a model folder moved or copied since (a moved run's folder) is the same policy: same weights
        moved = fingerprint is not None and t.meta.get("model_fingerprint") == fingerprint
        if t.env != env_name or (theirs is not None and not moved and not _same_policy(str(theirs), policy_name)):
            raise TurnRLError(f"{out}: holds episodes of another run (env '{t.env}', policy '{theirs or '?'}'; this "
                              f"run: env '{env_name}', policy '{policy_name}'); choose another --out or remove it")
        recorded = t.meta.get("env_opts", env_opts)
        if not isinstance(recorded, dict) or envs.resolved_options(env_name, recorded) != ours:
            raise TurnRLError(f"{out}: holds episodes played with other env options ({json.dumps(t.meta['env_opts'])}; "
                              f"this run: {json.dumps(env_opts)}); choose another --out or remove it")
        if splits and t.split not in splits:
            raise TurnRLError(f"{out}: holds episodes of the {t.split} split; this run plays {', '.join(sorted(splits))}: "
                              "choose another --out or remove it")
        theirs_sampling = t.meta.get("sampling")
        if sampling is not None and theirs_sampling is not None and theirs_sampling != sampling:
            raise TurnRLError(f"{out}: holds episodes sampled with other settings ({json.dumps(theirs_sampling)}; "
                              f"this run: {json.dumps(sampling)}); choose another --out or remove it")
        theirs_rules = t.meta.get("invalid_rules")
        if theirs_rules is not None and theirs_rules != rules:
            raise TurnRLError(f"{out}: holds episodes played with other invalid-reply rules ({json.dumps(theirs_rules)}; "
                              f"this run: {json.dumps(rules)}); choose another --out or remove it")
        theirs_text = t.meta.get("prompt")
        if theirs_text is not None and theirs_text != text:
            changed = ", ".join(k for k in text if theirs_text.get(k) != text[k]) if isinstance(theirs_text, dict) else "prompt"
            raise TurnRLError(f"{out}: holds episodes played with another {changed} in the system message; "
                              "choose another --out or remove it")
        theirs_fp = t.meta.get("model_fingerprint")
        if (fingerprint is not None and theirs_fp is not None
                and theirs_fp not in (fingerprint, getattr(policy, "legacy_fingerprint", None))):
            raise TurnRLError(f"{out}: holds episodes of other weights at '{policy_name}' (model fingerprint "
                              f"{theirs_fp}; this model: {fingerprint}); choose another --out or remove it")
        spec = planned.get(t.id)
        if spec is not None and (t.split != spec.split or t.task_id != spec.task_id
                                 or t.meta.get("seed", spec.seed) != spec.seed
                                 or int(t.meta.get("expert_turns", 0) or 0) != spec.expert_turns
                                 or int(t.meta.get("replayed_turns", 0) or 0) != len(spec.replay or ())):
            raise TurnRLError(f"{out}: episode {t.id} was played with other settings (task '{t.task_id}', "
                              f"seed {t.meta.get('seed')}) than this run plans (task '{spec.task_id}', seed "
                              f"{spec.seed}); choose another --out or remove it")


def _same_policy(a: str, b: str) -> bool:
    """The same policy name, or two spellings of one model folder (``runs/m/``, ``./runs/m``)."""
    return a == b or os.path.isdir(a) and os.path.isdir(b) and os.path.realpath(a) == os.path.realpath(b)


def evaluate(policy: Policy, env_name: str, *, split: str, episodes: int, policy_label: str | None = None,
             **kwargs: Any) -> tuple[dict[str, Any], list[Trajectory]]:
    """Play and summarize; returns the result record and the trajectories."""
    trajs = run_policy(policy, env_name, split=split, episodes=episodes, **kwargs)
    return summarize(trajs, policy=policy_label or policy.name, env=env_name, split=split), trajs
