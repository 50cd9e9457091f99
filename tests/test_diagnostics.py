"""Bandit diagnostics: metrics by hand, the batched frequency-bias scorer, end-to-end runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from turnrl import envs
from turnrl.bandits.algorithms import Setting
from turnrl.bandits.simulate import Instances, Run, coverage, cumulative_regret
from turnrl.cli import main
from turnrl.diagnostics.bandit import (
    DiagnoseConfig,
    FBContext,
    ModelScorer,
    PolicyRun,
    classify_context,
    diagnose,
    entropy,
    fb_contexts,
    frequency_bias,
    knowing_doing,
)

INF = math.inf
NAN = math.nan


def hand_run() -> PolicyRun:
    """One 3-arm episode of 4 steps with stated UCB values (c = 1):

    t=0: nothing tried; states all inf (correct); pulls arm 0 (optimal, all are inf)
    t=1: truth [1.0, inf, inf]; states only arm 0 (incorrect); pulls arm 0 (greedy)
    t=2: truth [1.09, inf, inf]; states arm 1 highest (correct); pulls arm 1 (optimal)
    t=3: truth [1.24, 3.05, inf]; states nothing (incorrect); pulls arm 0 (other)
    """
    mu = np.broadcast_to(np.array([0.1, 0.5, 0.9]), (1, 4, 3)).copy()
    inst = Instances(["x"], mu, mu.copy(), None, Setting(arms=3))
    reported = np.array([[[INF, INF, INF], [1.0, NAN, NAN], [1.09, INF, 0.3], [NAN, NAN, NAN]]])
    run = Run(inst, np.array([[0, 0, 1, 0]]), np.array([[1.0, 0.0, 2.0, 0.5]]), reported)
    return PolicyRun("hand", "model", run, 1)


def test_regret_and_coverage_by_hand() -> None:
    run = hand_run().run
    assert cumulative_regret(run)[0].tolist() == pytest.approx([0.8, 1.6, 2.0, 2.8])
    assert coverage(run)[0].tolist() == pytest.approx([1 / 3, 1 / 3, 2 / 3, 2 / 3])


def test_knowing_doing_by_hand() -> None:
    kd = knowing_doing(hand_run(), c=1.0)
    assert kd["table_pct"] == {
        "correct": {"optimal": 50.0, "greedy": 0.0, "other": 0.0},
        "incorrect": {"optimal": 0.0, "greedy": 25.0, "other": 25.0},
    }
    assert kd["rationale_correct_pct"] == 50.0 and kd["values_stated_pct"] == 75.0
    assert kd["actions_pct"] == {"optimal": 50.0, "greedy": 25.0, "other": 25.0} and kd["steps"] == 4


def test_frequency_bias_shares_by_hand() -> None:
    assert classify_context([(0, 1.0), (1, 0.0), (1, 0.0)], 3) == (1, (0,))
    assert classify_context([(0, 1.0), (0, 1.0), (2, 0.0), (2, 0.0), (1, 5.0)], 3) == (0, (1,))
    assert classify_context([(0, 1.0), (0, 1.0), (0, 1.0)], 3) == (0, ())  # the frequent arm is the best
    # 0/1 rewards: arms 0 and 2 tie for the best mean, so a greedy policy's mass on either is greedy
    tied = ((0, 1.0), (2, 1.0), (1, 0.0), (1, 0.0))
    assert classify_context(tied, 3) == (1, (0, 2))
    greedy = frequency_bias([FBContext(0, 1, tied)], np.array([[0.5, 0.0, 0.5]]), 3, max_repeats=1)
    assert greedy["shares"] == {"1": [0.0, 1.0, 0.0]}
    p = np.array([0.2, 0.7, 0.1])
    assert entropy(p) == pytest.approx(-(0.2 * math.log(0.2) + 0.7 * math.log(0.7) + 0.1 * math.log(0.1)))
    ctxs = [FBContext(0, 0, ((0, 1.0), (1, 0.0), (1, 0.0))), FBContext(0, 10, ((0, 1.0),) + ((1, 0.0),) * 11)]
    fb = frequency_bias(ctxs, np.array([p, [0.0, 1.0, 0.0]]), 3, max_repeats=10)
    assert fb["repetitions"] == [0, 10]
    assert fb["shares"] == {"0": [0.7, 0.2, 0.1], "10": [1.0, 0.0, 0.0]}
    assert fb["buckets"]["0-1"] == {"frequent": 0.7, "greedy": 0.2, "other": 0.1, "contexts": 1}
    assert fb["entropy"][1] == 0.0 and fb["uniform_entropy"] == pytest.approx(math.log(3), abs=1e-4)
    # a small max_repeats narrows the buckets to the counts within 0-10%, 45-55%, 90-100% of it: no count in
    # two buckets (they used to round outward: 0-1, 1-3, 3-4 for 4, counting a context twice)
    hist = ((0, 1.0), (1, 0.0), (1, 0.0))
    few = [FBContext(0, r, hist) for r in range(5)]
    fb = frequency_bias(few, np.array([p] * 5), 3, max_repeats=4)
    assert {k: v["contexts"] for k, v in fb["buckets"].items()} == {"0-0": 1, "2-2": 1, "4-4": 1}
    wide = frequency_bias([FBContext(0, r, hist) for r in range(0, 101, 5)], np.array([p] * 21), 3, max_repeats=100)
    assert list(wide["buckets"]) == ["0-10", "45-55", "90-100"]
    assert [v["contexts"] for v in wide["buckets"].values()] == [3, 3, 3]


def test_frequency_bias_contexts() -> None:
    env = envs.make("bandit", arms=4)
    ctxs = fb_contexts(env, env.task_ids("seen")[:3], prefixes=5, max_repeats=20, step=10, seed=1)
    assert len(ctxs) == 5 * 3 and sorted({c.repeats for c in ctxs}) == [0, 10, 20]
    for j in range(5):
        group = [c for c in ctxs if c.prefix == j]
        base = group[0].history
        assert 2 <= len(base) <= 10
        inst = env.instance(env.task_ids("seen")[j % 3], horizon=30)
        for t, (a, r) in enumerate(group[-1].history):
            assert r == inst.rewards[t, a]
        for c in group:
            assert c.history[: len(base)] == base and len(c.history) == len(base) + c.repeats
            assert all(a == base[-1][0] for a, _ in c.history[len(base) :])


def test_scorer_scores_all_actions_in_one_forward_pass(tiny_model, tiny_tokenizer) -> None:
    import torch

    env = envs.make("bandit", arms=3, horizon=12)
    scorer = ModelScorer(tiny_model, tiny_tokenizer, env)
    ctxs = fb_contexts(env, env.task_ids("seen")[:2], prefixes=2, max_repeats=2, step=1, seed=0)
    calls = []
    hook = tiny_model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        probs = scorer(ctxs)
    finally:
        hook.remove()
    assert len(calls) == len(ctxs) == 6 and scorer.calls == 6
    assert probs.shape == (6, 3) and np.allclose(probs.sum(axis=1), 1.0)
    # the batched, padded pass equals scoring each action alone
    c = ctxs[-1]
    prompt = scorer.prompt(c.history)
    alone = []
    for lab in env.labels:
        cont = scorer.chat.tokenize_text(f"ACTION={lab}")
        with torch.no_grad():
            logits = tiny_model(input_ids=torch.tensor([prompt + cont])).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        alone.append(sum(float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(cont)))
    s = np.array(alone)
    want = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    assert np.allclose(probs[-1], want, atol=1e-4)
    # other braces in the template are text, not format fields
    braces = ModelScorer(tiny_model, tiny_tokenizer, env, template="ACTION={action} {t}")(ctxs[:1])
    assert braces.shape == (1, 3) and np.allclose(braces.sum(), 1.0)


class FakeEngine:
    """Writes a fixed reply (its tokens, then a stop token) for every prompt."""

    def __init__(self, chat, text: str):
        self.ids = chat.tokenize_text(text) + [chat.stop_token_ids[0]]
        self.prompts: list[list[int]] = []

    def generate(self, prompts, sampling, seeds=None):
        from turnrl.rollout.engine import Generation

        self.prompts.extend(list(p) for p in prompts)
        return [Generation(list(self.ids), [0.0] * len(self.ids), True) for _ in prompts]


@pytest.mark.parametrize("reply", ["UCB values: blue=inf. blue is untried.\nACTION=red", "no marker at all",
                                   "Greedy would say ACTION=blue, but red is untried.\nACTION=red"])
def test_scorer_after_the_rationale(tiny_model, tiny_tokenizer, reply: str) -> None:
    import torch

    env = envs.make("bandit", arms=3, horizon=20)
    probe = ModelScorer(tiny_model, tiny_tokenizer, env)
    engine = FakeEngine(probe.chat, reply)
    scorer = ModelScorer(tiny_model, tiny_tokenizer, env, engine=engine)
    ctxs = fb_contexts(env, env.task_ids("seen")[:1], prefixes=1, max_repeats=4, step=4, seed=0)
    calls = []
    hook = tiny_model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        probs = scorer(ctxs)
    finally:
        hook.remove()
    assert len(calls) == scorer.calls == 2 and len(engine.prompts) == 2  # generation is the engine's
    assert scorer.forced == (0 if "ACTION=" in reply else 2)
    prefix = reply[: reply.rindex("ACTION=") + 7] if "ACTION=" in reply else None  # the last: the one acted on
    prompt = scorer.prompt(ctxs[0].history)
    if prefix is not None:
        head = prompt + probe.chat.tokenize_text(prefix)
    else:
        head = prompt + probe.chat.tokenize_text(reply) + probe.chat.tokenize_text("\nACTION=")
    alone = []
    for lab in env.labels:
        cont = probe.chat.tokenize_text(lab)
        with torch.no_grad():
            logp = torch.log_softmax(tiny_model(input_ids=torch.tensor([head + cont])).logits[0].float(), dim=-1)
        alone.append(sum(float(logp[len(head) - 1 + i, t]) for i, t in enumerate(cont)))
    s = np.array(alone)
    assert np.allclose(probs[0], np.exp(s - s.max()) / np.exp(s - s.max()).sum(), atol=1e-4)


def check_outputs(out: Path, n_policies: int) -> dict:
    data = json.loads((out / "diagnostics.json").read_text())
    assert data["schema"] == "turnrl.diagnostics/v1" and len(data["policies"]) == n_policies
    for png in ("regret.png", "coverage.png", "frequency_bias.png", "knowing_doing.png"):
        assert (out / png).is_file() and 5_000 < (out / png).stat().st_size < 100_000
    for rec in data["policies"]:
        kd = rec["knowing_doing"]["table_pct"]
        assert sum(kd[r][a] for r in kd for a in kd[r]) == pytest.approx(100.0, abs=0.05)
        assert len(rec["regret"]["mean"]) == data["horizon"]
    return data


def test_diagnose_runs_end_to_end_on_the_untrained_tiny_model(tiny_dir: Path, tmp_path: Path) -> None:
    cfg = DiagnoseConfig(env_opts={"arms": 3, "horizon": 3}, instances=2, max_new_tokens=8, fb_prefixes=2,
                         fb_max_repeats=10, fb_step=5)
    data = diagnose([str(tiny_dir), "ucb"], tmp_path / "d", cfg)
    check_outputs(tmp_path / "d", 2)
    model, ucb = data["policies"]
    assert model["kind"] == "model" and ucb["kind"] == "scripted" and ucb["runs"] == 8
    fb = model["frequency_bias"]
    assert fb["forward_calls"] == fb["contexts"] == 6  # one batched forward per context
    assert ucb["knowing_doing"]["table_pct"]["correct"]["optimal"] == 100.0
    assert 0.0 <= model["invalid_action_rate"] <= 1.0


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
        raise SystemExit(0)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_cli_on_scripted_policies(tmp_path: Path, capsys) -> None:
    out_dir = tmp_path / ("deep-" * 30) / "d"  # a path longer than any console width
    code, out, err = run_cli(["diagnose", "bandit", "--policy", "ucb", "--policy", "greedy", "--out",
                              str(out_dir), "--instances", "8", "--fb-prefixes", "2",
                              "--fb-max-repeats", "10"], capsys)
    assert code == 0, err
    assert "ucb" in out and f"wrote {out_dir / 'diagnostics.json'} and" in out  # the path is not wrapped
    data = check_outputs(out_dir, 2)
    assert data["comparisons"][0]["a"] == "ucb" and data["comparisons"][0]["b"] == "greedy"


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--env-opt", "arms=0"], "bandit: arms must be an integer from 2 to 20 (got 0)"),
        (["--env-opt", "noise=extreme"], "bandit: noise must be one of low, medium, high (got 'extreme')"),
        (["--policy", "ucb:c=-1"], "c must be >= 0"),
        (["--skip", "regret"], "unknown --skip 'regret'"),
        (["--aid", "bogus"], "unknown aid 'bogus'"),
        (["--split", "test"], "unknown split 'test'"),
        (["--instances", "0"], "--instances must be >= 1"),
        (["--env", "tictactoe"], "--env must be bandit or contextual_bandit"),
        (["--fb-step", "0"], "--fb-step must be >= 1 (got 0)"),
        (["--fb-max-repeats", "-1"], "--fb-max-repeats must be >= 0 (got -1)"),
        (["--fb-template", "ACTION"], "--fb-template must contain '{action}' once (got 'ACTION')"),
        (["--fb-max-repeats", "990"], "--fb-max-repeats must be <= 989 (got 990)"),
        (["--seed", "-1"], "Invalid value for '--seed': Input should be greater than or equal to 0"),
        (["--aid", "epsilon-greedy:eps=2"], "aid 'epsilon-greedy': eps must be in [0, 1] (got 2.0)"),
        (["--aid", "self-consistency:k=0"], "aid 'self-consistency': k must be an integer >= 1 (got 0.0)"),
        (["--aid", "epsilon-greedy:eps"], "aid 'epsilon-greedy': expected key=value, got 'eps'"),
        (["--aid", "try-all"], "--aid wraps model policies; every --policy here is scripted (ucb)"),
    ],
)
def test_cli_errors_are_one_line(extra: list[str], needle: str, tmp_path: Path, capsys) -> None:
    args = ["diagnose", "bandit", "--policy", "ucb", "--out", str(tmp_path / "d"), *extra]
    code, _, err = run_cli(args, capsys)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and needle in lines[0], err
    assert not (tmp_path / "d" / "diagnostics.json").exists()


def test_contextual_diagnosis_has_regret_and_coverage_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = diagnose(["linucb", "random"], tmp_path / "cb", DiagnoseConfig(env="contextual_bandit", instances=8,
                                                                        env_opts={"horizon": 20}))
    assert data["plots"] == ["regret.png", "coverage.png"]
    assert all("knowing_doing" not in r and "frequency_bias" not in r for r in data["policies"])
    # a rerun into a folder an earlier diagnosis drew more plots in leaves only its own
    (tmp_path / "cb" / "knowing_doing.png").write_bytes(b"an earlier run's plot")
    diagnose(["linucb"], tmp_path / "cb", DiagnoseConfig(env="contextual_bandit", instances=2, env_opts={"horizon": 5}))
    assert sorted(p.name for p in (tmp_path / "cb").glob("*.png")) == ["coverage.png", "regret.png"]
    # a rerun killed among its plots leaves no diagnostics.json beside a mix of two runs' PNGs
    import turnrl.diagnostics.plots as plots

    def killed(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(plots, "plot_coverage", killed)
    with pytest.raises(KeyboardInterrupt):
        diagnose(["random"], tmp_path / "cb", DiagnoseConfig(env="contextual_bandit", instances=2,
                                                             env_opts={"horizon": 5}))
    assert not (tmp_path / "cb" / "diagnostics.json").exists()


@pytest.mark.slow  # about 2 minutes of one core; CI runs it (smoke tests are run by hand)
def test_sft_on_ucb_data_then_diagnose(tiny_dir: Path, tmp_path: Path) -> None:
    """Collect UCB thought-cloning data, SFT the tiny model on it, diagnose both models: the one
    end-to-end check that diagnose tells a trained model from an untrained one."""
    from turnrl.agent.prompting import PromptConfig
    from turnrl.collect import run_policy
    from turnrl.data.io import write_jsonl
    from turnrl.rollout import load_policy
    from turnrl.train.sft import SFTConfig, train_sft

    opts = {"arms": 3, "horizon": 8}
    data = tmp_path / "ucb.jsonl"
    # the prompt diagnose plays in: it asks for the UCB values (``rationale=ucb``, its default on
    # plain bandits), so the thought-cloning data is collected under that instruction
    write_jsonl(data, run_policy(load_policy("ucb"), "bandit", split="train", episodes=96,
                                 env_opts={**opts, "rationale": "ucb"}, prompt=PromptConfig(history=0)))
    res = train_sft(str(tiny_dir), data, tmp_path / "sft",
                    SFTConfig(history=0, max_steps=100, batch_size=16, lr=3e-3, row_tokens=1024, warmup_ratio=0.05))
    cfg = DiagnoseConfig(env_opts=opts, instances=8, max_new_tokens=48, fb_prefixes=2, fb_max_repeats=20,
                         fb_step=10)
    out = diagnose([str(tiny_dir), str(res.model_dir), "ucb"], tmp_path / "d", cfg)
    check_outputs(tmp_path / "d", 3)
    untrained, sft, _ = out["policies"]
    assert sft["ucb_block_rate"] > 0.5 > untrained["ucb_block_rate"]
    assert sft["invalid_action_rate"] < untrained["invalid_action_rate"]


class InvalidPolicy:
    """Always names an arm that does not exist."""

    name = "invalid"

    def act(self, requests):  # type: ignore[no-untyped-def]
        from turnrl.rollout.policies import Reply

        return [Reply("ACTION=purple-elephant") for _ in requests]


def test_knowing_doing_does_not_credit_random_stand_ins_for_invalid_replies() -> None:
    """Every reply is invalid, so the sampler plays a random arm each step: those pulls count
    for regret and coverage (they happened) but are not the policy's actions -- all 'other'."""
    from turnrl.diagnostics.bandit import model_run

    env = envs.make("bandit", arms=3, horizon=6)
    pr = model_run(InvalidPolicy(), "bandit", {"arms": 3, "horizon": 6}, env.task_ids("seen")[:4])
    assert pr.extra["invalid_action_rate"] == 1.0 and (pr.run.arms >= 0).all()
    kd = knowing_doing(pr, c=1.0)
    assert kd["steps"] == 24
    assert kd["actions_pct"] == {"optimal": 0.0, "greedy": 0.0, "other": 100.0}


class _Chat:
    """The two things :func:`_ended` reads of a chat format."""

    def __init__(self, eot_text: str, stop_token_ids: list[int]) -> None:
        self.eot_text, self.stop_token_ids = eot_text, stop_token_ids

    def tokenize_text(self, text: str) -> list[int]:
        return {"<eot>": [99], "\n<eot>": [10, 99]}[text]


def test_frequency_bias_ends_labels_that_begin_other_labels() -> None:
    """With digits tokenized one by one, ``ACTION=1`` ([1]) begins ``ACTION=13`` ([1, 3]): scored alone, it
    took the probability of every reply beginning with it. Each label then ends with the end of turn."""
    from turnrl.diagnostics.bandit import _ended
    from turnrl.errors import TurnRLError

    conts, labels = [[7, 1], [7, 1, 3], [7, 2]], ["1", "13", "2"]
    assert _ended(conts, labels, _Chat("<eot>", [99, 0])) == [[7, 1, 99], [7, 1, 3, 99], [7, 2, 99]]
    assert _ended(conts, labels, _Chat("\n<eot>", [99])) == [[7, 1, 10, 99], [7, 1, 3, 10, 99], [7, 2, 10, 99]]
    assert _ended(conts, labels, _Chat("", [0])) == [[7, 1, 0], [7, 1, 3, 0], [7, 2, 0]]  # the EOS, no marker
    assert _ended([[7, 1], [7, 3]], ["1", "3"], _Chat("<eot>", [99])) == [[7, 1], [7, 3]]  # no prefix: unchanged
    with pytest.raises(TurnRLError, match="'1' tokenizes as the start of '13'"):
        _ended(conts, labels, _Chat("", []))


def test_one_instance_claims_no_separation_and_one_model_keeps_its_band() -> None:
    """A CI of one instance is a point: two such points never overlap, which is no evidence. And a row of
    one model in the greedy study keeps its CI across instances instead of a band of zero width."""
    from turnrl.diagnostics.bandit import _comparisons
    from turnrl.greedy_study import _mean_curve

    recs = [{"policy": p, "regret": {"final": f, "final_ci95": [f, f]}} for p, f in (("ucb", 6.5), ("random", 10.0))]
    assert _comparisons(recs, 1)[0]["ci_overlap"] is None
    assert _comparisons(recs, 2)[0]["ci_overlap"] is False
    one = {"mean": [1.0, 2.0], "lo": [0.5, 1.0], "hi": [1.5, 3.0]}
    assert _mean_curve([one]) == one
    two = _mean_curve([one, {"mean": [3.0, 2.0], "lo": [0, 0], "hi": [9, 9]}])
    assert two["mean"] == [2.0, 2.0] and two["lo"][1] == two["hi"][1] == 2.0 and two["lo"][0] < 2.0 < two["hi"][0]


def test_scripted_policies_take_the_envs_ucb_constant(tmp_path: Path) -> None:
    """With ``ucb_c=2`` the env's knowing-doing truth is UCB with c = 2; a scripted ``ucb`` row acted on
    c = 1 and was scored 43% correct. It now takes the env's constant unless its spec gives one."""
    from turnrl.bandits.algorithms import with_env_c

    assert with_env_c("ucb", 2.0) == "ucb:c=2.0"
    assert with_env_c("linucb", 2.0) == "linucb:c=2.0" and with_env_c("ts", 2.0, contextual=True) == "ts:c=2.0"
    assert with_env_c("linucb:lam=2", 0.5, contextual=True) == "linucb:lam=2,c=0.5,alpha=0.5"
    assert with_env_c("linucb:alpha=1", 0.5, contextual=True) == "linucb:alpha=1,c=0.5"
    assert with_env_c("egreedy:eps=0.1", 2.0) == "egreedy:eps=0.1,c=2.0"
    assert with_env_c("ucb:c=3", 2.0) == "ucb:c=3"
    cfg = DiagnoseConfig(env="bandit", env_opts={"arms": 3, "horizon": 8, "ucb_c": 2.0}, instances=4, runs=2)
    data = diagnose(["ucb", "ucb:c=1"], tmp_path, cfg)
    kd = {r["policy"]: r["knowing_doing"] for r in data["policies"]}
    assert set(kd) == {"ucb:c=2", "ucb"}  # canonical specs: c = 1 is the algorithm's default
    assert kd["ucb:c=2"]["actions_pct"]["optimal"] == 100.0
    assert kd["ucb"]["actions_pct"]["optimal"] < 100.0
    # on the contextual bandit ucb_c is LinUCB's alpha (the env's expert's): a linucb row took it as c only,
    # which LinUCB does not read there, so the row did not change with it
    rows = {c: diagnose(["linucb"], tmp_path / f"cb{c}", DiagnoseConfig(
        env="contextual_bandit", env_opts={"items": 4, "horizon": 12, "ucb_c": c}, instances=4, runs=2))["policies"][0]
        for c in (0.01, 5.0)}
    assert rows[5.0]["policy"] == "linucb:alpha=5,c=5"
    assert rows[0.01]["regret"] != rows[5.0]["regret"]


def test_scorer_scores_the_reply_as_the_model_writes_it_after_a_spaced_template(tiny_model, tiny_tokenizer) -> None:
    """Under a template that writes a space before the reply (the fallback of base models, ``Agent: ``),
    the prompt leaves that space to the reply: the scored continuation must bring it, as a trained
    reply has it, not score ``Agent:ACTION=blue``."""
    import copy

    import torch

    from turnrl.data.schema import Message

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = None  # the fallback template
    env = envs.make("bandit", arms=3, horizon=12)
    scorer = ModelScorer(tiny_model, tok, env)
    assert scorer.chat.reply_lead == " "
    ctx = fb_contexts(env, env.task_ids("seen")[:1], prefixes=1, max_repeats=0, step=1, seed=0)[0]
    prompt = scorer.prompt(ctx.history)
    obs = env.render_history(list(ctx.history), env.labels, horizon=12, context=None)
    scores = []
    for lab in env.labels:
        enc = scorer.chat.encode([Message("system", env.instruction), Message("user", obs),
                                  Message("assistant", f"ACTION={lab}")])
        assert enc is not None and enc.input_ids[: len(prompt)] == prompt
        cont = [i for i, m in zip(enc.input_ids, enc.action_mask, strict=True) if m]  # the reply as trained
        eot = scorer.chat.tokenize_text(scorer.chat.eot_text)
        cont = cont[: len(cont) - len(eot)] if eot and cont[-len(eot):] == eot else cont  # scored without it
        with torch.no_grad():
            logits = tiny_model(input_ids=torch.tensor([prompt + cont])).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        scores.append(sum(float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(cont)))
    want = np.exp(np.array(scores) - max(scores))
    assert np.allclose(scorer([ctx])[0], want / want.sum(), atol=1e-4)


def test_frequency_bias_prompts_state_the_horizon_the_model_played(tiny_model, tiny_tokenizer) -> None:
    """A context shorter than the played horizon is shown with it ("Step 4 of 12", the instruction's 12
    steps); only a context that long or longer gets a horizon of one step more than itself. Before, every
    context said 11 + fb_max_repeats (111 steps), a number a model trained at 12 never saw."""
    env = envs.make("bandit", arms=3, horizon=12)
    scorer = ModelScorer(tiny_model, tiny_tokenizer, env,
                         env_at=lambda h: envs.make("bandit", arms=3, horizon=h))

    def text(n: int) -> str:
        return scorer.chat.tokenizer.decode(scorer.prompt([(0, 0.5)] * n))

    assert "Step 4 of 12." in text(3) and "12" in env.instruction and "12" in text(3).split("Step")[0]
    long = text(30)
    assert "Step 31 of 31." in long and "All 12 steps are done" not in long
    plain = ModelScorer(tiny_model, tiny_tokenizer, env)  # no env_at: the played env for every context
    assert "All 12 steps are done" in plain.chat.tokenizer.decode(plain.prompt([(0, 0.5)] * 30))
