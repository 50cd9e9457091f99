"""Preference data and training: shared-prefix packing, pair builders, DPO/DMPO/SPPO end to end."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from test_cli import one_line_error, run

from turnrl.collect import run_policy
from turnrl.data import pairs as P
from turnrl.data.io import read_pairs, write_jsonl
from turnrl.data.schema import Message, Pair, Trajectory
from turnrl.errors import TurnRLError
from turnrl.rollout import ExpertPolicy, RandomPolicy
from turnrl.rollout.sampler import EpisodeSpec, Sampler
from turnrl.train.forward import common_prefix_length, pack, pack_shared, token_logps


@dataclass
class Seq:
    input_ids: list[int]
    action_mask: list[int]
    turn_index: list[int]


def _seq(prefix: list[int], n: int, g: torch.Generator, vocab: int) -> Seq:
    tail = torch.randint(5, vocab, (n,), generator=g).tolist()
    mask = [0] * len(prefix) + [1] * n
    return Seq(prefix + tail, mask, [0 if m else -1 for m in mask])


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_shared_prefix_packing_equals_separate_sequences(tiny_model, impl: str) -> None:
    g = torch.Generator().manual_seed(0)
    vocab = tiny_model.config.vocab_size
    p1 = torch.randint(5, vocab, (30,), generator=g).tolist()
    p2 = torch.randint(5, vocab, (17,), generator=g).tolist()
    units = [[_seq(p1, 12, g, vocab), _seq(p1, 7, g, vocab)],
             [_seq(p2, 9, g, vocab), _seq(p2, 20, g, vocab), _seq(p2, 3, g, vocab)]]
    flat = [s for u in units for s in u]
    old = tiny_model.config._attn_implementation
    tiny_model.config._attn_implementation = impl

    def seq_logps(batch) -> torch.Tensor:
        with torch.no_grad():
            return torch.zeros(len(flat)).index_add_(0, batch.seq_index, token_logps(tiny_model, batch))

    try:
        # both units (49 tokens each once their prefixes are shared) fit one row of 100
        shared = pack_shared(units, row_tokens=100)
        plain = pack(flat, row_tokens=100)
        a, b = seq_logps(shared), seq_logps(plain)
        assert torch.allclose(a, b, atol=1e-5)
        # the [R, 1, W, W] mask is built only for attention that reads it: segment attention does not
        assert (shared.attention_mask is None) == (impl == "sdpa") and plain.attention_mask is None
        # under sdpa attention runs segment by segment; the 4-D mask alone gives the same
        assert shared.segments == [[(0, 30, [(30, 12), (42, 7)]), (49, 17, [(66, 9), (75, 20), (95, 3)])]]
        layout, shared.segments = shared.segments, None
        assert torch.allclose(seq_logps(shared), b, atol=1e-5) and shared.attention_mask is not None
        # and the mask matters: without it the suffixes see each other and log-probs change
        mask, shared.attention_mask = shared.attention_mask, torch.tril(torch.ones_like(shared.attention_mask))
        assert not torch.allclose(seq_logps(shared), b, atol=1e-3)
        # as does the layout: a wrong one (no shared prefix) changes them too
        shared.attention_mask, shared.segments = mask, [[(0, 0, [(0, 42), (42, 7)]), layout[0][1]]]
        if impl == "sdpa":
            assert not torch.allclose(seq_logps(shared), b, atol=1e-3)
    finally:
        tiny_model.config._attn_implementation = old
    # each prefix computed once: 30 + 17 fewer... times (branches - 1)
    assert shared.real_tokens == plain.real_tokens - 30 - 2 * 17


def _windowed_model(kind: str, impl: str) -> Any:
    """A small random model whose attention window (4) is shorter than the test's sequences:
    Mistral (every layer windowed) or Gemma-3 (a windowed layer, then a full one)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    size = {"vocab_size": 97, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "attn_implementation": impl}
    if kind == "mistral":
        return MistralForCausalLM(MistralConfig(**size, sliding_window=4)).eval()
    return Gemma3ForCausalLM(Gemma3TextConfig(**size, head_dim=8, sliding_window=4,
                                              layer_types=["sliding_attention", "full_attention"])).eval()


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("kind", ["mistral", "gemma3"])
def test_packing_keeps_a_sliding_attention_window(kind: str, impl: str) -> None:
    """Each packed token's log-prob equals that of its sequence's own forward pass when sequences are
    longer than the model's window, in plain and shared-prefix packing, segment by segment (sdpa) and
    on the 4-D mask (eager; sdpa with the segments off, as under gradient checkpointing). Without the
    window's band both paths attended past the window (differences of 0.1-0.3)."""
    from turnrl.train.forward import sliding_window

    model = _windowed_model(kind, impl)
    assert sliding_window(model.config) == (4, kind == "gemma3")
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(5, 97, (12,), generator=g).tolist()
    units = [[_seq(prefix, 8, g, 97), _seq(prefix, 6, g, 97)], [_seq(prefix[:3], 9, g, 97)]]
    flat = [s for u in units for s in u]
    with torch.no_grad():
        want = []
        for s in flat:
            lp = model(input_ids=torch.tensor([s.input_ids])).logits[0].float().log_softmax(-1)
            want += [lp[j - 1, s.input_ids[j]].item() for j in range(1, len(s.input_ids)) if s.action_mask[j]]
        for batch in (pack(flat, row_tokens=64), pack_shared(units, row_tokens=64)):
            order = torch.argsort(batch.seq_index, stable=True)
            assert torch.allclose(token_logps(model, batch)[order], torch.tensor(want), atol=1e-5)
            batch.segments = None  # the 4-D mask (or, plain, transformers' own) alone
            assert torch.allclose(token_logps(model, batch)[order], torch.tensor(want), atol=1e-5)


class _Wrapped(torch.nn.Module):
    """What DistributedDataParallel looks like from outside: no ``config``, the model in ``.module``."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def test_shared_prefix_packing_looks_through_a_ddp_wrapper(tiny_model) -> None:
    """The 4-D mask takes the form of the wrapped model's attention (eager: additive 0/-inf). A
    wrapper used to be taken for sdpa, so an eager model got a bool mask and added it as 0/1."""
    g = torch.Generator().manual_seed(1)
    vocab = tiny_model.config.vocab_size
    prefix = torch.randint(5, vocab, (20,), generator=g).tolist()
    units = [[_seq(prefix, 8, g, vocab), _seq(prefix, 6, g, vocab)], [_seq(prefix[:5], 9, g, vocab)]]
    shared, plain = pack_shared(units, row_tokens=200), pack([s for u in units for s in u], row_tokens=200)
    old = tiny_model.config._attn_implementation
    tiny_model.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            want = token_logps(tiny_model, plain)
            assert torch.allclose(token_logps(tiny_model, shared), want, atol=1e-5)
            assert torch.allclose(token_logps(_Wrapped(tiny_model), shared), want, atol=1e-5)
    finally:
        tiny_model.config._attn_implementation = old


def test_preference_training_runs_without_dropout_by_default(ttt_pairs, tiny_dir: Path, tmp_path: Path,
                                                             monkeypatch) -> None:
    """The reference log-probs are taken without dropout, so the policy trains without it too
    (``dropout: false``, the preference trainer's default): step 1 (policy == reference) has loss
    log 2 for a model with attention dropout; with ``dropout=true`` it does not."""
    import shutil

    from turnrl.train import preference
    from turnrl.train.core import disable_dropout, dropout_modules

    monkeypatch.setenv("TURNRL_HOME", str(tmp_path / "home"))
    drop = tmp_path / "tiny-dropout"
    shutil.copytree(tiny_dir, drop)
    config = json.loads((drop / "config.json").read_text())
    (drop / "config.json").write_text(json.dumps({**config, "attention_dropout": 0.3}))
    from turnrl.models.loading import load_model

    model = load_model(str(drop))
    assert dropout_modules(load_model(str(tiny_dir))) == [] and len(dropout_modules(model)) == config["num_hidden_layers"]
    disable_dropout(model)
    assert dropout_modules(model) == []
    losses = {}
    for keep in (False, True):
        cfg = preference.PreferenceConfig(loss="dpo", lr=1e-4, max_steps=1, batch_size=4,
                                          **({"dropout": True} if keep else {}))
        preference.train_preference(str(drop), ttt_pairs[0], tmp_path / f"run-{keep}", cfg)
        losses[keep] = json.loads((tmp_path / f"run-{keep}" / "metrics.jsonl").read_text().splitlines()[0])["loss"]
    assert losses[False] == pytest.approx(math.log(2), abs=1e-5)
    assert abs(losses[True] - math.log(2)) > 1e-3


def test_per_turn_views_too_long_are_counted_not_dropped_silently(ttt_pairs, tiny_dir: Path) -> None:
    """With ``history`` each agent turn is its own sequence; one longer than ``max_length`` is left out
    of its unit and counted in ``dropped_turns`` (as whole-trajectory encoding counts cut turns)."""
    from turnrl.models.loading import load_tokenizer
    from turnrl.tokenization import ChatFormat
    from turnrl.train import preference

    chat = ChatFormat(load_tokenizer(str(tiny_dir)))
    full, stats = preference.load_units(ttt_pairs[0], chat, preference.PreferenceConfig(history=0))
    lengths = sorted({len(s.input_ids) for u in full for s in u.seqs})
    assert stats["dropped_turns"] == 0 and len(lengths) > 2
    cut = lengths[len(lengths) // 2]  # every view longer than this one is left out
    units, stats = preference.load_units(ttt_pairs[0], chat, preference.PreferenceConfig(history=0, max_length=cut))
    kept = sum(len(u.seqs) for u in units)
    longer = sum(len(s.input_ids) > cut for u in full for s in u.seqs)
    def side_fits(u: Any, side: int) -> bool:
        return any(len(s.input_ids) <= cut for s, sd in zip(u.seqs, u.sides, strict=True) if sd == side)

    skipped = [u for u in full if not (side_fits(u, 0) and side_fits(u, 1))]
    assert len(units) + stats["skipped_too_long"] == len(full) and stats["skipped_too_long"] == len(skipped)
    assert stats["dropped_turns"] > 0
    assert kept + stats["dropped_turns"] == sum(len(u.seqs) for u in full if u not in skipped)
    assert longer >= stats["dropped_turns"]


def test_packed_batches_train_under_gradient_checkpointing(tiny_dir) -> None:
    """Segment attention is not used under gradient checkpointing (its recomputation runs outside the
    layout): plain and shared-prefix batches give the same log-probs and gradients with it as without."""
    from turnrl.models.loading import load_model

    g = torch.Generator().manual_seed(1)
    model = load_model(str(tiny_dir), dtype="float32").train()
    vocab = model.config.vocab_size
    prefix = torch.randint(5, vocab, (20,), generator=g).tolist()
    units = [[_seq(prefix, 8, g, vocab), _seq(prefix, 5, g, vocab)], [_seq(prefix[:7], 11, g, vocab)]]
    for batch in (pack_shared(units, row_tokens=100), pack([s for u in units for s in u], row_tokens=100)):
        grads = []
        for checkpointing in (False, True):
            if checkpointing:
                model.gradient_checkpointing_enable()
            model.zero_grad()
            lp = token_logps(model, batch)
            lp.sum().backward()
            grads.append((lp.detach(), model.model.embed_tokens.weight.grad.clone()))
            model.gradient_checkpointing_disable()
        assert torch.allclose(grads[0][0], grads[1][0], atol=1e-5)
        assert torch.allclose(grads[0][1], grads[1][1], atol=1e-5)


def test_common_prefix_length() -> None:
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_length([[1, 2], [1, 2]]) == 2
    assert common_prefix_length([[3], [1]]) == 0


# ------------------------------------------------------------------------- builders


def _traj(task: str, actions: list[str], ret: float, *, source: str = "policy", valid: bool = True,
          meta: dict | None = None) -> Trajectory:
    msgs = [Message("system", "play"), Message("user", "start")]
    for i, a in enumerate(actions):
        msgs.append(Message("assistant", f"Thought: go.\nAction: {a}", action=a, valid=valid))
        msgs.append(Message("user", f"obs {i}"))
    rewards = [0.0] * (len(actions) - 1) + [ret]
    return Trajectory(id=f"{task}-{source}-{'-'.join(actions)}", env="e", task_id=task, messages=msgs,
                      rewards=rewards, return_=ret, success=ret > 0, source=source, meta=meta or {})


def test_eto_trajectory_pairs_rule_truncation_and_clean_losers() -> None:
    experts = [_traj("a", ["1", "2"], 1.0, source="expert"), _traj("b", ["1"], 0.0, source="expert"),
               _traj("c", ["1"], 1.0, source="expert")]
    explored = [_traj("a", ["3", "4", "5", "6", "7"], -1.0),  # expert wins
                _traj("b", ["2", "5"], 1.0),                    # the agent wins over the expert
                _traj("c", ["9"], 1.0),                         # same return: no pair
                _traj("d", ["9"], 1.0)]                         # no expert for this task
    stats: dict[str, int] = {}
    pairs = P.trajectory_pairs(experts, explored, truncate_k=1, stats=stats)
    assert [(p.task_id, p.chosen.source, p.rejected.source) for p in pairs] == [
        ("a", "expert", "policy"), ("b", "policy", "expert")]
    assert pairs[0].rejected.num_turns == 3  # winner's 2 turns + k=1
    assert pairs[0].meta["rejected_return"] == -1.0  # what the loser scored, not its cut part's sum
    assert pairs[1].rejected.num_turns == 1  # shorter than 2 + 1 already: untouched
    assert stats == {"same_return": 1, "no_expert": 1, "pairs": 2}
    bad = [_traj("a", ["3", "3", "3"], -1.0), _traj("c", ["x"], 0.0, valid=False)]
    stats = {}
    assert P.trajectory_pairs(experts, bad, losers="clean", stats=stats) == []
    assert stats["dropped_repeated_action"] == 1 and stats["dropped_invalid_action"] == 1
    assert len(P.trajectory_pairs(experts, bad, losers="noisy")) == 2
    # clean drops degenerate explorations, never the expert's game: here the agent won and the expert,
    # who played one cell three times (as a bandit's UCB plays its best arm), lost
    stats = {}
    for source in ("expert", "import", "policy"):  # `turnrl data import-eto` writes ETO's demos as "import"
        beaten = [_traj("a", ["5", "5", "5"], 0.0, source=source)]
        assert len(P.trajectory_pairs(beaten, [_traj("a", ["1", "2"], 1.0)], losers="clean", stats=stats)) == 1
    # ... and it drops a degenerate exploration whatever its source: ETO's explorations imported with
    # `import-eto` (source "import") were kept as if they were demos
    for source in ("policy", "import"):
        stats = {}
        looping = [_traj("a", ["3", "3", "3"], -1.0, source=source)]
        assert P.trajectory_pairs(experts, looping, losers="clean", stats=stats) == []
        assert stats["dropped_repeated_action"] == 1


def test_a_bandit_game_that_repeats_its_best_arm_is_not_degenerate() -> None:
    """UCB's bandit games pull the best arm again and again: ``losers=clean`` dropped every one of them
    (and every competent agent game) as a "repeated action"; elsewhere a run of one action is a loop."""
    for env, why in (("bandit", None), ("contextual_bandit", None), ("e", "repeated action")):
        t = replace(_traj("a", ["red", "red", "red", "red"], 3.0), env=env)
        assert P.degenerate_reason(t) == why
    bandit_loser = replace(_traj("a", ["red", "red", "red"], 0.5), env="bandit")
    bandit_expert = replace(_traj("a", ["blue", "blue", "blue"], 2.0, source="expert"), env="bandit")
    assert len(P.trajectory_pairs([bandit_expert], [bandit_loser], losers="clean")) == 1


def test_diverge_turn_is_the_first_agent_turn_whose_context_or_reply_differs() -> None:
    expert = _traj("a", ["1", "2", "3"], 1.0, source="expert")
    assert P.diverge_turn(expert, _traj("a", ["4", "2", "3"], 0.0)) == 0
    assert P.diverge_turn(expert, _traj("a", ["1", "5", "6"], 0.0)) == 1
    assert P.diverge_turn(expert, _traj("a", ["1", "2"], 0.0)) == 2  # the shorter one's whole game
    assert P.diverge_turn(expert, expert) == 3
    same_cell = _traj("a", ["1", "2", "3"], 0.0)
    same_cell.messages[4] = replace(same_cell.messages[4], content="Thought: other.\nAction: 2")
    assert P.diverge_turn(expert, same_cell) == 1  # the same action, other words
    other_obs = _traj("a", ["1", "2", "3"], 0.0)
    other_obs.messages[3] = replace(other_obs.messages[3], content="the opponent played elsewhere")
    assert P.diverge_turn(expert, other_obs) == 1  # turn 1's context differs
    pairs = P.trajectory_pairs([expert], [_traj("a", ["1", "5"], -1.0), _traj("b", ["1"], 0.0)])
    assert [p.meta["diverge_turn"] for p in pairs] == [1]
    sp = P.self_play_pairs([_traj("b", ["1", "2"], 1.0), _traj("b", ["1", "7"], -1.0)])
    assert sp[0].meta["diverge_turn"] == 1


def test_degenerate_reasons() -> None:
    assert P.degenerate_reason(_traj("a", ["1", "2"], 0)) is None
    t = _traj("a", ["1"], 0)
    t.messages[2] = replace(t.messages[2], content="#### $$$ ### %%% ^^^ &&&")
    assert P.degenerate_reason(t) == "gibberish"
    t.messages[2] = replace(t.messages[2], action=None, content="I think so")
    assert P.degenerate_reason(t) == "no action"


def test_step_pairs_share_the_expert_prefix_and_train_one_turn() -> None:
    expert = _traj("a", ["1", "2", "3"], 1.0, source="expert")
    branch = _traj("a", ["1", "5", "6"], -1.0, meta={"expert_turns": 1})
    other = _traj("a", ["4", "5", "6"], -1.0, meta={"expert_turns": 1})  # not the expert's prefix
    stats: dict[str, int] = {}
    pairs = P.step_pairs([expert], [branch, other], stats=stats)
    assert len(pairs) == 1 and stats["prefix_mismatch"] == 1
    p = pairs[0]
    assert p.meta["train_from_turn"] == 1
    assert p.chosen.actions == ["1", "2"] and p.rejected.actions == ["1", "5"]
    # a trajectory pair builder ignores step-wise explorations
    assert P.trajectory_pairs([expert], [branch]) == []
    # the same move as the expert's at the trained turn: both sides would be one text there, no preference
    same = _traj("a", ["1", "2", "6"], -1.0, meta={"expert_turns": 1})
    stats = {}
    assert P.step_pairs([expert], [same], stats=stats) == [] and stats == {"same_action": 1, "pairs": 0}  # not same_return
    # clean losers: a loser invalid at the trained turn is dropped; one invalid only after the cut is kept
    bad = _traj("a", ["1", "5", "6"], -1.0, meta={"expert_turns": 1})
    bad.messages[4] = replace(bad.messages[4], valid=False)  # turn 1, the trained one
    late = _traj("a", ["1", "5", "6"], -1.0, meta={"expert_turns": 1})
    late.messages[6] = replace(late.messages[6], valid=False)  # turn 2, cut away
    stats = {}
    assert len(P.step_pairs([expert], [bad], losers="noisy")) == 1
    assert P.step_pairs([expert], [bad], losers="clean", stats=stats) == [] and stats["dropped_invalid_action"] == 1
    assert len(P.step_pairs([expert], [late], losers="clean")) == 1


def test_self_play_pairs_and_scored_win_rates() -> None:
    samples = [_traj("a", ["1"], 1.0), _traj("a", ["2"], 0.0), _traj("a", ["3"], -1.0), _traj("b", ["1"], 0.0),
               _traj("b", ["2"], 0.0)]
    pairs = P.self_play_pairs(samples)
    assert len(pairs) == 1 and pairs[0].chosen.return_ == 1.0 and pairs[0].rejected.return_ == -1.0
    scored = {(t.task_id, t.return_): t.meta["win_rate"] for t in P.scored_samples(samples, tau=1.0)}
    s = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    assert scored[("a", 1.0)] == pytest.approx((0.5 + s(1) + s(2)) / 3)
    assert scored[("a", -1.0)] == pytest.approx((0.5 + s(-1) + s(-2)) / 3)
    assert scored[("b", 0.0)] == 0.5  # ties are exactly 1/2
    oracle = P.RewardOracle(tau=0.5)
    a, b = samples[0], samples[1]
    assert oracle("a", a, b) + oracle("a", b, a) == pytest.approx(1.0)


def test_sampler_replays_an_expert_prefix() -> None:
    from turnrl.collect import make_env_factory

    sampler = Sampler(make_env_factory("tictactoe", {"opponent": "random"}), RandomPolicy(), env_name="tictactoe",
                      num_envs=2)
    specs = [EpisodeSpec(0, "train", "ttt-s3", 11, expert_turns=2), EpisodeSpec(1, "train", "ttt-s3", 11)]
    branch, plain = sampler.run(specs)
    (expert,) = run_policy(ExpertPolicy(), "tictactoe", env_opts={"opponent": "random"},
                           specs=[EpisodeSpec(0, "train", "ttt-s3", 11)])  # the expert's own game of the spec
    assert branch.meta["expert_turns"] == 2 and "expert_turns" not in plain.meta
    assert branch.actions[:2] == expert.actions[:2]  # the prefix is the expert's moves, replies included
    assert [m.content for m in branch.messages[:5]] == [m.content for m in expert.messages[:5]]
    assert all("random" not in m.content for m in branch.messages[:6] if m.role == "assistant")
    assert any("random" in m.content for m in branch.messages if m.role == "assistant") or branch.num_turns <= 2


# ----------------------------------------------------------------------- training


@pytest.fixture(scope="module")
def ttt_pairs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Expert (minimax) against random play on the same tic-tac-toe tasks: clear preferences."""
    d = tmp_path_factory.mktemp("pairs")
    opts = {"opponent": "random"}
    expert = run_policy(ExpertPolicy(), "tictactoe", episodes=60, env_opts=opts, seed=0)
    rand = run_policy(RandomPolicy(), "tictactoe", episodes=60, env_opts=opts, seed=0)
    pairs = P.trajectory_pairs(expert, rand)
    assert len(pairs) >= 20
    write_jsonl(d / "train.jsonl", pairs[:-8])
    write_jsonl(d / "heldout.jsonl", pairs[-8:])
    return d / "train.jsonl", d / "heldout.jsonl"


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["dpo", "dmpo"])
def test_training_raises_heldout_preference_accuracy(loss: str, ttt_pairs, tiny_dir: Path, tmp_path: Path,
                                                     monkeypatch) -> None:
    from turnrl.train import preference

    monkeypatch.setenv("TURNRL_HOME", str(tmp_path / "home"))
    train, heldout = ttt_pairs
    cfg = preference.PreferenceConfig(loss=loss, lr=3e-3, epochs=3, batch_size=8, beta=0.1, gamma=0.9,
                                      eval_every=100, seed=0)
    preference.train_preference(str(tiny_dir), train, tmp_path / "run", cfg, eval_data=heldout)
    start = json.loads((tmp_path / "run" / "eval_start.json").read_text())
    end = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][-1]
    assert start["eval_loss"] == pytest.approx(math.log(2), abs=1e-4)  # policy == reference
    assert end["eval/eval_loss"] < start["eval_loss"] - 0.05
    assert end["eval/eval_accuracy"] > 0.6
    caches = sorted((tmp_path / "home" / "ref_logps").iterdir())
    assert len(caches) == 2  # training and held-out pairs

    # a second run with the same reference and data reuses the cache: no reference pass
    calls = []
    real = preference.compute_reference
    monkeypatch.setattr(preference, "compute_reference", lambda *a, **k: calls.append(1) or real(*a, **k))
    preference.train_preference(str(tiny_dir), train, tmp_path / "run2",
                                cfg.model_copy(update={"max_steps": 1, "eval_every": 0}))  # no held-out pairs here
    assert calls == []


def test_the_reference_cache_is_keyed_by_the_tokens_it_was_computed_on(ttt_pairs, tiny_dir: Path, tmp_path: Path,
                                                                         monkeypatch) -> None:
    """A policy whose tokenizer splits the same text otherwise (its merges cut; vocabulary and template
    unchanged), on the same pairs file and reference, gets a reference pass of its own: the cache of
    the first policy's tokens made its first loss 51 instead of log 2."""
    import shutil

    from turnrl.train import preference

    monkeypatch.setenv("TURNRL_HOME", str(tmp_path / "home"))
    other = tmp_path / "other"
    shutil.copytree(tiny_dir, other)
    tok_file = other / "tokenizer.json"
    spec = json.loads(tok_file.read_text())
    spec["model"]["merges"] = spec["model"]["merges"][:300]
    tok_file.write_text(json.dumps(spec))
    train, _ = ttt_pairs
    cfg = preference.PreferenceConfig(loss="dpo", lr=0.0, max_steps=1, batch_size=4, ref_model=str(tiny_dir))
    calls = []
    real = preference.compute_reference
    monkeypatch.setattr(preference, "compute_reference", lambda *a, **k: calls.append(1) or real(*a, **k))
    for policy in (tiny_dir, other):
        preference.train_preference(str(policy), train, tmp_path / policy.name, cfg)
        first = json.loads((tmp_path / policy.name / "metrics.jsonl").read_text().splitlines()[0])
        assert first["loss"] == pytest.approx(math.log(2), abs=1e-5)  # policy == reference on its own tokens
    assert len(calls) == 2 and len(list((tmp_path / "home" / "ref_logps").iterdir())) == 2


def test_sft_weight_adds_alpha_times_chosen_token_nll(ttt_pairs, tiny_dir: Path) -> None:
    """RPO's term: the objective with sft_weight alpha is the DPO/DMPO loss plus alpha x the
    chosen side's log-prob over its agent-turn tokens, computed here independently."""
    from turnrl.models.loading import load_model, load_tokenizer
    from turnrl.tokenization import ChatFormat
    from turnrl.train import preference

    tok = load_tokenizer(str(tiny_dir))
    model = load_model(str(tiny_dir))
    for loss, history in (("dpo", 0), ("dmpo", None)):  # per-turn views and whole trajectories
        base = preference.PreferenceConfig(loss=loss, history=history)
        units = preference.load_units(ttt_pairs[0], ChatFormat(tok), base)[0][:3]
        refs = [torch.zeros(len(u.num_turns), max(u.num_turns)) for u in units]
        preference.attach_reference(units, refs)
        with torch.no_grad():
            plain, _ = preference.PreferenceObjective(base, tok.pad_token_id).losses(model, units)
            cfg = base.model_copy(update={"sft_weight": 0.5})
            with_nll, metrics = preference.PreferenceObjective(cfg, tok.pad_token_id).losses(model, units)
            logps = preference.unit_turn_logps(model, units, base, tok.pad_token_id)
        tokens = [sum(sum(e.action_mask) for e, s in zip(u.seqs, u.sides or [0, 1], strict=True) if s == 0)
                  for u in units]
        nll = torch.tensor([-float(lp[0].sum()) / n for lp, n in zip(logps, tokens, strict=True)])
        assert metrics["chosen_nll"].tolist() == pytest.approx(nll.tolist(), rel=1e-5)
        assert with_nll.tolist() == pytest.approx((plain + 0.5 * nll).tolist(), rel=1e-5)


@pytest.mark.slow
def test_sppo_trains_on_scored_samples(tiny_dir: Path, tmp_path: Path, monkeypatch) -> None:
    from turnrl.train import preference

    monkeypatch.setenv("TURNRL_HOME", str(tmp_path / "home"))
    samples = run_policy(RandomPolicy(), "tictactoe", episodes=24, env_opts={"opponent": "random"}, seed=0)
    samples = [replace(t, task_id=f"g{i % 4}") for i, t in enumerate(samples)]  # 4 tasks x 6 samples
    data = tmp_path / "scored.jsonl"
    write_jsonl(data, P.scored_samples(samples))
    for variant in ("soft", "hard"):
        cfg = preference.PreferenceConfig(loss="sppo", sppo_variant=variant, eta=10.0, lr=1e-5, max_steps=6,
                                          batch_size=24)  # every step sees all 24 samples
        result = preference.train_preference(str(tiny_dir), data, tmp_path / variant, cfg)
        rows = [json.loads(x) for x in (tmp_path / variant / "metrics.jsonl").read_text().splitlines()]
        assert math.isfinite(result.final_loss) and rows[-1]["loss"] < rows[0]["loss"]


@pytest.mark.slow
def test_shared_prefix_and_plain_packing_train_the_same(ttt_pairs, tiny_dir: Path, tmp_path: Path,
                                                       monkeypatch) -> None:
    from turnrl.train import preference

    monkeypatch.setenv("TURNRL_HOME", str(tmp_path / "home"))
    losses = []
    for shared in (True, False):
        cfg = preference.PreferenceConfig(loss="dmpo", lr=1e-3, max_steps=3, batch_size=4, shared_prefix=shared)
        preference.train_preference(str(tiny_dir), ttt_pairs[0], tmp_path / f"s{shared}", cfg)
        rows = (tmp_path / f"s{shared}" / "metrics.jsonl").read_text().splitlines()
        losses.append([json.loads(x)["loss"] for x in rows])
    assert losses[0] == pytest.approx(losses[1], abs=1e-4)


def test_an_unwritable_reference_cache_is_skipped_in_one_process(ttt_pairs, tiny_dir: Path, tmp_path: Path,
                                                                 monkeypatch, caplog) -> None:
    """The reference log-probs' cache is optional: when TURNRL_HOME cannot be written, one process
    trains on the log-probs it computed (step 1 at log 2), with a warning."""
    from turnrl.train import preference

    home = tmp_path / "home-file"
    home.write_text("not a folder")  # no cache folder can be made under it
    monkeypatch.setenv("TURNRL_HOME", str(home))
    cfg = preference.PreferenceConfig(loss="dpo", lr=1e-4, max_steps=1, batch_size=4)
    preference.train_preference(str(tiny_dir), ttt_pairs[0], tmp_path / "run", cfg)
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["loss"] == pytest.approx(math.log(2), abs=1e-5) and "not cached" in caplog.text


def test_lora_under_sharded_training_is_refused_before_the_reference_pass(ttt_pairs, tiny_dir: Path,
                                                                          tmp_path: Path, monkeypatch) -> None:
    """The trainer refuses LoRA under ZeRO-3 and FSDP; a preference run met that refusal only after its
    reference pass, which on a large model takes minutes."""
    from turnrl.train import preference

    real = preference.check_lora_sharding
    monkeypatch.setattr(preference, "_zero_stage", lambda acc: 3)  # as under deepspeed_zero3.yaml
    monkeypatch.setattr(preference, "check_lora_sharding",
                        lambda kind, stage, lora: real("DistributedType.DEEPSPEED", stage, lora))
    monkeypatch.setattr(preference, "compute_reference", lambda *a, **k: pytest.fail("the reference pass ran"))
    cfg = preference.PreferenceConfig(loss="dpo", max_steps=1, batch_size=4, lora={"r": 4, "alpha": 8})
    with pytest.raises(TurnRLError, match="lora under DeepSpeed ZeRO-3"):
        preference.train_preference(str(tiny_dir), ttt_pairs[0], tmp_path / "run", cfg)
    assert not (tmp_path / "run").exists()


def test_bf16_reference_is_computed_at_the_policy_precision(ttt_pairs, tiny_dir: Path, tmp_path: Path,
                                                            monkeypatch) -> None:
    """Under mixed precision (CPU bf16 autocast here) the reference pass runs under the same
    autocast as the policy's step, so step 1 (policy == reference) has loss log 2; a float32
    reference put it about 5e-4 off."""
    from turnrl.train import preference

    monkeypatch.setenv("TURNRL_HOME", str(tmp_path / "home"))
    cfg = preference.PreferenceConfig(loss="dpo", lr=1e-4, max_steps=1, batch_size=4, mixed_precision="bf16")
    preference.train_preference(str(tiny_dir), ttt_pairs[0], tmp_path / "run", cfg)
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["loss"] == pytest.approx(math.log(2), abs=1e-5)


def test_cli_pairs_and_bad_pairs_file(tmp_path: Path, tiny_dir: Path, capsys) -> None:
    opts = ["--env-opt", "opponent=random"]
    assert run(["collect", "--env", "tictactoe", "--policy", "expert", "--episodes", "20", "--out",
                str(tmp_path / "e.jsonl"), *opts], capsys)[0] == 0
    assert run(["collect", "--env", "tictactoe", "--policy", "random", "--episodes", "20", "--out",
                str(tmp_path / "x.jsonl"), *opts], capsys)[0] == 0
    code, out, _ = run(["pairs", "--expert", str(tmp_path / "e.jsonl"), "--explored", str(tmp_path / "x.jsonl"),
                        "--out", str(tmp_path / "p.jsonl"), "--losers", "clean"], capsys)
    assert code == 0 and "pairs" in out
    pairs = read_pairs(tmp_path / "p.jsonl")
    assert pairs and all(p.chosen.return_ > p.rejected.return_ for p in pairs)
    for extra in ([], ["--expert", str(tmp_path / "e.jsonl")]):
        code, _, err = run(["pairs", "--explored", str(tmp_path / "x.jsonl"), "--out", str(tmp_path / "q.jsonl"),
                            "--mode", "stepwise", *extra], capsys)
        assert "unknown pairs mode 'stepwise'" in one_line_error(code, err) and "did you mean 'step'" in err

    lines = (tmp_path / "p.jsonl").read_text().splitlines()
    lines[1] = lines[1].replace('"chosen"', '"winner"', 1)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    code, _, err = run(["train", "dpo", "--model", str(tiny_dir), "--pairs", str(bad), "--out",
                        str(tmp_path / "o")], capsys)
    assert f"{bad}:2:" in one_line_error(code, err)
    code, _, err = run(["train", "dmpo", "--model", str(tiny_dir), "--pairs", str(tmp_path / "p.jsonl"), "--out",
                        str(tmp_path / "o"), "gama=0.5"], capsys)
    assert "gamma" in one_line_error(code, err)


def test_cli_non_finite_loss_stops_with_an_intact_checkpoint(tmp_path: Path, tiny_dir: Path, capsys,
                                                            monkeypatch) -> None:
    from turnrl.train import preference

    monkeypatch.setenv("TURNRL_HOME", str(tmp_path / "home"))
    pairs = [Pair(t, _traj(t, ["1", "2"], 1.0, source="expert"), _traj(t, ["3"], -1.0)) for t in "abcd"]
    write_jsonl(tmp_path / "p.jsonl", pairs)
    real, calls = preference.dpo_loss, []

    def nan_on_second_call(*args, **kwargs):
        calls.append(1)
        losses, metrics = real(*args, **kwargs)
        return (losses * float("nan") if len(calls) == 2 else losses), metrics

    monkeypatch.setattr(preference, "dpo_loss", nan_on_second_call)
    cmd = ["train", "dpo", "--model", str(tiny_dir), "--pairs", str(tmp_path / "p.jsonl"), "--out",
           str(tmp_path / "o"), "max_steps=3", "save_every=1", "batch_size=2"]
    code, _, err = run(cmd, capsys)
    assert one_line_error(code, err).endswith("non-finite loss at step 2; the last checkpoint (step-000001) is intact")
    assert [p.name for p in (tmp_path / "o" / "checkpoints").iterdir()] == ["step-000001"]
    assert not (tmp_path / "o" / "summary.json").exists()
    # the checkpoint is intact: the run resumes from it and finishes
    code, out, _ = run([*cmd, "--resume"], capsys)
    assert code == 0 and "DPO finished: 3 steps" in out
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["steps"] == 3


def test_model_fingerprint_reads_past_the_first_bytes_of_a_weight_file(tmp_path: Path) -> None:
    """A LoRA fine-tune changes tensors past the embeddings, which safetensors stores first: two
    models that differ only there must not share reference log-probs."""
    from turnrl.models.loading import model_fingerprint

    weights = bytearray(6 << 20)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    (tmp_path / "a" / "model.safetensors").write_bytes(bytes(weights))
    weights[(5 << 20) + 3] = 1  # one byte, deep in the file
    (tmp_path / "b" / "model.safetensors").write_bytes(bytes(weights))
    assert model_fingerprint(tmp_path / "a") != model_fingerprint(tmp_path / "b")
    assert model_fingerprint(tmp_path / "a") == model_fingerprint(tmp_path / "a")


def test_model_fingerprint_counts_every_tensor_and_the_chat_template(tiny_dir: Path, tmp_path: Path) -> None:
    """Every tensor of a safetensors file is sampled (the tiny model's layer norms lay outside the 64
    samples of its 8 MB file), and every small file is read whole, the chat template included."""
    import shutil

    from safetensors.torch import load_file, save_file

    from turnrl.models.loading import model_fingerprint

    base = model_fingerprint(tiny_dir)
    norm, template = tmp_path / "norm", tmp_path / "template"
    for d in (norm, template):
        shutil.copytree(tiny_dir, d)
    tensors = load_file(str(norm / "model.safetensors"))
    name = sorted(k for k in tensors if k.endswith("input_layernorm.weight"))[-1]
    tensors[name][0] += 1.0
    save_file(tensors, str(norm / "model.safetensors"), metadata={"format": "pt"})
    text = (template / "chat_template.jinja").read_text()
    assert "assistant" in text
    (template / "chat_template.jinja").write_text(text.replace("assistant", "ASSISTANT"))  # the same size
    assert len({base, model_fingerprint(norm), model_fingerprint(template)}) == 3
    assert model_fingerprint(tiny_dir) == base


@pytest.mark.parametrize(("meta", "message"), [
    ({"win_rate": None}, r"scored.jsonl:1: meta.win_rate must be a number in \[0, 1\] \(got None\)"),
    ({"win_rate": "high"}, r"scored.jsonl:1: meta.win_rate must be a number in \[0, 1\] \(got 'high'\)"),
    ({"win_rate": 0.5, "train_from_turn": -1}, r"scored.jsonl:1: meta.train_from_turn must be an integer >= 0 \(got -1\)"),
    # past the last turn: nothing would train (it was counted as too long for max_length)
    ({"win_rate": 0.5, "train_from_turn": 10}, r"scored.jsonl:1: meta.train_from_turn=10 is past the last agent turn "
                                               r"of a side with 1 turn\(s\)"),
])
def test_bad_scored_sample_meta_is_a_file_line_error(tiny_dir: Path, tmp_path: Path, meta: dict, message: str) -> None:
    from turnrl.errors import TurnRLError
    from turnrl.models.loading import load_tokenizer
    from turnrl.tokenization import ChatFormat
    from turnrl.train.preference import PreferenceConfig, load_units

    t = _traj("t0", ["4"], 1.0)
    path = tmp_path / "scored.jsonl"
    write_jsonl(path, [replace(t, meta={**t.meta, **meta})])
    with pytest.raises(TurnRLError, match=message):
        load_units(path, ChatFormat(load_tokenizer(str(tiny_dir))), PreferenceConfig(loss="sppo"))


def test_sppo_refuses_samples_that_are_each_their_tasks_only_one(tiny_dir: Path, tmp_path: Path) -> None:
    """Scored alone, a sample's win rate is 1/2 and SPPO's target 0: a run on such a file trained nothing
    (loss 0, gradient 0) and wrote its start as the result."""
    from turnrl.errors import TurnRLError
    from turnrl.models.loading import load_tokenizer
    from turnrl.tokenization import ChatFormat
    from turnrl.train.preference import PreferenceConfig, load_units

    path = tmp_path / "scored.jsonl"
    alone = [_traj(f"t{i}", ["4"], 1.0, meta={"win_rate": 0.5, "group_size": 1}) for i in range(3)]
    write_jsonl(path, alone)
    chat = ChatFormat(load_tokenizer(str(tiny_dir)))
    with pytest.raises(TurnRLError, match=r"scored.jsonl: every sample is its task's only one"):
        load_units(path, chat, PreferenceConfig(loss="sppo"))
    write_jsonl(path, [*alone, _traj("t3", ["4"], 0.0, meta={"win_rate": 0.25, "group_size": 2})])
    assert len(load_units(path, chat, PreferenceConfig(loss="sppo"))[0]) == 4
    pairs = tmp_path / "pairs.jsonl"  # the other losses' file: named as such
    write_jsonl(pairs, [Pair("t0", alone[0], _traj("t1", ["5"], 0.0), {})])
    with pytest.raises(TurnRLError, match=r"pairs.jsonl:1: .*sppo trains on scored samples \(turnrl pairs --scored\)"):
        load_units(pairs, chat, PreferenceConfig(loss="sppo"))


@pytest.mark.parametrize("eta", ["0", "-1", ".inf"])
def test_cli_sppo_eta_must_be_positive_and_finite(tmp_path: Path, tiny_dir: Path, capsys, monkeypatch,
                                                   eta: str) -> None:
    """SPPO's eta scales the target eta (P - 1/2): a non-positive or infinite one is a config error
    naming the key, not a traceback from the loss after the reference pass."""
    monkeypatch.setenv("TURNRL_HOME", str(tmp_path / "home"))
    write_jsonl(tmp_path / "s.jsonl", [_traj("a", ["1"], 1.0, meta={"win_rate": 0.7})])
    code, _, err = run(["train", "sppo", "--model", str(tiny_dir), "--pairs", str(tmp_path / "s.jsonl"),
                        "--out", str(tmp_path / "o"), f"eta={eta}", "max_steps=1"], capsys)
    assert "eta" in one_line_error(code, err)
    assert not (tmp_path / "o").exists()


def test_a_pair_cut_to_the_same_tokens_on_both_sides_is_skipped_and_counted(tiny_tokenizer, tmp_path: Path) -> None:
    """max_length may cut both sides before the turn where they part: no preference is left in
    the pair (a DPO margin of 0 whatever the model), so it is not trained on and says so."""
    from turnrl.tokenization import ChatFormat
    from turnrl.train.preference import PreferenceConfig, load_units

    chat = ChatFormat(tiny_tokenizer)

    def traj(last: str, ret: float) -> Trajectory:
        msgs = [Message("system", "Play tic-tac-toe."), Message("user", "Board: empty. " * 10),
                Message("assistant", "Action: 4", action="4"), Message("user", "Opponent played 0. " * 10),
                Message("assistant", "Action: 8", action="8"), Message("user", "Opponent played 2. " * 10),
                Message("assistant", f"Action: {last}", action=last)]
        return Trajectory(id=f"t{last}", env="tictactoe", task_id="g", messages=msgs, rewards=[0, 0, ret], return_=ret)

    win, loss = traj("1", 1.0), traj("5", -1.0)
    write_jsonl(tmp_path / "pairs.jsonl", [Pair("g", win, loss, {}), Pair("g", win, loss, {})])
    full = chat.encode(win.messages)
    assert full is not None
    end1 = max(i for i, t in enumerate(full.turn_index) if t == 1) + 1
    units, stats = load_units(tmp_path / "pairs.jsonl", chat, PreferenceConfig(max_length=len(full.input_ids)))
    assert len(units) == 2 and stats["skipped_identical"] == 0
    with pytest.raises(Exception, match=r"no usable pairs \(2 with the same tokens on both sides \(as written, or "
                                         r"once cut by max_length\)\)"):
        load_units(tmp_path / "pairs.jsonl", chat, PreferenceConfig(max_length=end1 + 5))
    # under a history window too: a pair whose sides are the same game gives the same views (it was
    # trained at loss log 2, its float noise made into full AdamW steps)
    write_jsonl(tmp_path / "same.jsonl", [Pair("g", win, win, {}), Pair("g", win, loss, {})])
    units, stats = load_units(tmp_path / "same.jsonl", chat, PreferenceConfig(history=0))
    assert len(units) == 1 and stats["skipped_identical"] == 1


def test_trainers_keep_replies_that_stopped_on_the_generation_configs_eos(tiny_dir: Path, tiny_tokenizer) -> None:
    """A reply that stopped on an EOS id of the generation config (not the tokenizer's) keeps its
    sampled ids in SFT and preference training, as the sampler saw them: later turns are trained
    on the context they were sampled in."""
    from transformers import GenerationConfig

    from turnrl.rollout.policies import training_chat

    chat = training_chat(str(tiny_dir), tiny_tokenizer)
    gen_eos = GenerationConfig.from_pretrained(tiny_dir).eos_token_id
    extra = [e for e in ([gen_eos] if isinstance(gen_eos, int) else gen_eos) if e != tiny_tokenizer.eos_token_id]
    assert extra and set(extra) <= set(chat.stop_token_ids)
    content = "Action: 4"
    odd = [t for ch in content for t in tiny_tokenizer(ch, add_special_tokens=False)["input_ids"]]
    assert odd != chat.tokenize_text(content)  # a tokenization the re-encoding would not give
    ids, reencoded = chat.agent_ids(content, chat.eot_text, [*odd, extra[0]])
    assert not reencoded and ids[: len(odd)] == odd


def test_dmpo_keeps_each_trajectorys_own_T_when_max_length_cuts_turns(tiny_tokenizer, tmp_path: Path) -> None:
    """phi(t, T) with the trajectory's T: a cut side keeps its kept turns' weights."""
    from turnrl.tokenization import ChatFormat
    from turnrl.train.preference import PreferenceConfig, load_units

    chat = ChatFormat(tiny_tokenizer)

    def traj(n: int, word: str) -> Trajectory:
        msgs = [Message("system", "play"), Message("user", "board start")]
        for k in range(n):  # the last observation before the last move is long
            msgs += [Message("assistant", f"{word} move {k} " * 3),
                     Message("user", f"observation {k} " * (40 if k == n - 2 else 3))]
        return Trajectory(id=word, env="x", task_id="t", messages=msgs[:-1], rewards=[0.0] * n,
                          return_=float(word == "good"))

    pair = Pair("t", traj(5, "good"), traj(2, "bad"), {})
    write_jsonl(tmp_path / "p.jsonl", [pair])
    full = chat.encode(pair.chosen.messages)
    assert full is not None
    # the whole chosen sequence cut after its 4th turn; with history=0, the 5th turn's view too long
    for history, max_length in ((None, len(full.input_ids) - 10), (0, 100)):
        units, stats = load_units(tmp_path / "p.jsonl", chat, PreferenceConfig(
            loss="dmpo", max_length=max_length, history=history))
        assert stats["dropped_turns"] >= 1 and units[0].num_turns == [5, 2], (history, stats)


def test_hard_sppo_holds_a_sample_that_ties_with_its_group() -> None:
    """Under sppo_variant=hard a win rate of 1/2 has target 0 (as under soft), not -eta/2; so has one a
    rounding step off it, as the row mean of a balanced group gives (a draw among 4 losses, 2 draws and
    4 wins, tau 1: 0.4999999999999999)."""
    import turnrl.train.preference as P
    from turnrl.data.schema import Message, Trajectory
    from turnrl.oracles import EnvRewardOracle, preference_matrices, win_rates

    def sample(i: int, ret: float) -> Trajectory:
        msgs = [Message("system", "play"), Message("user", "Board"), Message("assistant", "Action: 1", action="1")]
        return Trajectory(id=f"t-{i}", env="tictactoe", task_id="t", messages=msgs, rewards=[ret], return_=ret)

    group = [sample(i, r) for i, r in enumerate([-1.0] * 4 + [0.0] * 2 + [1.0] * 4)]
    rates = win_rates(preference_matrices(EnvRewardOracle(1.0), {"t": group})["t"])
    assert rates[4] != 0.5 and abs(rates[4] - 0.5) < 1e-15  # the rounding this test is about
    units = [P.Unit(seqs=[], num_turns=[1], win_rate=w, ref=torch.zeros(1, 1)) for w in (0.5, 0.9, 0.1, rates[4])]
    policy = [torch.zeros(1, 1) for _ in units]  # the policy is the reference: every log-ratio is 0
    obj = P.PreferenceObjective(P.PreferenceConfig(loss="sppo", sppo_variant="hard", eta=5.0))
    orig = P.unit_turn_logps
    try:
        P.unit_turn_logps = lambda model, us, cfg, pad: policy  # type: ignore[assignment]
        losses, m = obj.losses(None, units)
    finally:
        P.unit_turn_logps = orig
    assert m["target"].tolist() == pytest.approx([0.0, 2.5, -2.5, 0.0])
    assert losses.tolist() == pytest.approx([0.0, 6.25, 6.25, 0.0])


@pytest.mark.parametrize(("setting", "loss"), [("sft_weight", "sppo"), ("label_smoothing", "ipo"),
                                               ("label_smoothing", "dmpo")])
def test_a_setting_of_another_loss_is_refused_not_ignored(setting: str, loss: str, tmp_path: Path) -> None:
    from turnrl.errors import TurnRLError
    from turnrl.train import preference

    cfg = preference.PreferenceConfig(loss=loss, **{setting: 0.1})
    with pytest.raises(TurnRLError, match=f"^{setting} applies to"):
        preference.train_preference("tiny", tmp_path / "none.jsonl", tmp_path / "run", cfg)


@pytest.mark.parametrize(("command", "setting", "said"), [
    ("dpo", "gamma=0.5", "gamma=0.5: read by loss=dmpo only, and this command trains with loss=dpo"),
    ("ipo", "eta=3", "eta=3.0: read by loss=sppo only, and this command trains with loss=ipo"),
    ("dmpo", "sppo_variant=hard", "sppo_variant=hard: read by loss=sppo only, and this command trains with loss=dmpo"),
    ("sppo", "beta=0.5", "beta=0.5: read by loss=dpo/ipo/dmpo only, and this command trains with loss=sppo"),
    # a default value given is refused too (the README's DMPO line, gamma=0.7, run as dpo)
    ("dpo", "gamma=0.7", "gamma=0.7: read by loss=dmpo only, and this command trains with loss=dpo"),
    ("sppo", "beta=0.1", "beta=0.1: read by loss=dpo/ipo/dmpo only, and this command trains with loss=sppo"),
])
def test_train_refuses_a_setting_its_loss_does_not_read(command: str, setting: str, said: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """``turnrl train dpo gamma=0.5`` exited 0 with the discount unread; the check is the command's, not
    the trainer's: pipelines train one section under several losses (compare's DPO rows carry DMPO's gamma)."""
    code, _, err = run(["train", command, "--model", "tiny", "--pairs", str(tmp_path / "none.jsonl"),
                        "--out", str(tmp_path / "run"), setting], capsys)
    assert one_line_error(code, err) == f"error: {said}: remove it" and not (tmp_path / "run").exists()


def test_train_dpo_says_what_its_data_left_out(tiny_dir: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    """Pairs skipped for the same tokens on both sides, and turns past max_length, were only counted in
    data_stats.json: the command says so on the console, as train sft does."""
    monkeypatch.setenv("TURNRL_HOME", str(tmp_path / "home"))
    win, loss = _traj("a", ["1", "2"], 1.0, source="expert"), _traj("a", ["3"], -1.0)
    write_jsonl(tmp_path / "p.jsonl", [Pair("a", win, loss, {}), Pair("a", win, win, {})])
    code, out, _ = run(["train", "dpo", "--model", str(tiny_dir), "--pairs", str(tmp_path / "p.jsonl"),
                        "--out", str(tmp_path / "o"), "max_steps=1"], capsys)
    assert code == 0 and "1 pair(s) with the same tokens on both sides were skipped" in " ".join(out.split())


def test_a_wrong_out_is_refused_before_the_reference_pass(tiny_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """An --out that holds a run was refused only after the reference pass (minutes on a real model)."""
    from turnrl.errors import TurnRLError
    from turnrl.train import preference

    monkeypatch.setenv("TURNRL_HOME", str(tmp_path / "home"))
    win, loss = _traj("a", ["1", "2"], 1.0, source="expert"), _traj("a", ["3"], -1.0)
    write_jsonl(tmp_path / "p.jsonl", [Pair("a", win, loss, {})])
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "summary.json").write_text("{}")
    monkeypatch.setattr(preference, "compute_reference", lambda *a, **k: pytest.fail("reference pass ran"))
    with pytest.raises(TurnRLError, match=r"already holds a run; pass --resume"):
        preference.train_preference(str(tiny_dir), tmp_path / "p.jsonl", tmp_path / "o",
                                    preference.PreferenceConfig(max_steps=1))


def test_an_empty_pairs_file_and_a_cut_reference_cache_are_named(tiny_dir: Path, tmp_path: Path,
                                                                  monkeypatch) -> None:
    """An empty file was blamed on max_length; a cut cache file was a torch traceback."""
    from turnrl.errors import TurnRLError
    from turnrl.train import preference

    monkeypatch.setenv("TURNRL_HOME", str(tmp_path / "home"))
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(TurnRLError, match=r"empty.jsonl: holds no pairs$"):
        preference.train_preference(str(tiny_dir), tmp_path / "empty.jsonl", tmp_path / "o0",
                                    preference.PreferenceConfig(max_steps=1))
    win, loss = _traj("a", ["1", "2"], 1.0, source="expert"), _traj("a", ["3"], -1.0)
    write_jsonl(tmp_path / "p.jsonl", [Pair("a", win, loss, {})])
    preference.train_preference(str(tiny_dir), tmp_path / "p.jsonl", tmp_path / "o1",
                                preference.PreferenceConfig(max_steps=1))
    (cache,) = (tmp_path / "home" / "ref_logps").iterdir()
    whole = cache.read_bytes()
    for k, cut in enumerate((whole[:20], whole[:2], b"not a torch file")):  # cut anywhere (pickle's errors too)
        cache.write_bytes(cut)
        with pytest.raises(TurnRLError, match=rf"^{re.escape(str(cache))}: the cached reference log-probs cannot be"):
            preference.train_preference(str(tiny_dir), tmp_path / "p.jsonl", tmp_path / f"o{k + 2}",
                                        preference.PreferenceConfig(max_steps=1))
