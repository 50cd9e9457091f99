"""Preference oracles: env reward, the pairwise model (symmetry, training), the LLM judge, win rates."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from test_cli import one_line_error, run

from turnrl.collect import run_policy
from turnrl.data.schema import Message, Trajectory
from turnrl.errors import TurnRLError
from turnrl.oracles import (
    EnvRewardOracle,
    Oracle,
    OracleConfig,
    comparisons_from_trajectories,
    complement,
    make_oracle,
    preference_matrices,
    read_comparisons,
    render_task,
    render_trajectory,
    score_samples,
    select_samples,
    win_rates,
    write_comparisons,
)
from turnrl.rollout import ExpertPolicy, RandomPolicy


def _traj(task: str, ret: float, tag: str = "") -> Trajectory:
    msgs = [Message("system", "play"), Message("user", "Board: start"),
            Message("assistant", f"Thought: {tag}\nAction: 1", action="1", valid=True)]
    return Trajectory(id=f"{task}-{tag}-{ret}", env="tictactoe", task_id=task, messages=msgs, rewards=[ret],
                      return_=ret, success=ret > 0, meta={"final_observation": f"result {ret}"})


s = lambda x: 1.0 / (1.0 + math.exp(-x))  # noqa: E731


# ------------------------------------------------------------------------ env reward


def test_env_reward_oracle_hand_cases() -> None:
    o = EnvRewardOracle(tau=1.0)
    win, draw, loss = _traj("t", 1.0), _traj("t", 0.0), _traj("t", -1.0)
    assert o("t", win, loss) == pytest.approx(s(2.0))  # 0.8808
    assert o("t", win, loss) == pytest.approx(0.8807970779778823)
    assert o("t", loss, win) == pytest.approx(s(-2.0))
    assert o("t", draw, _traj("t", 0.0, "other")) == 0.5  # ties are exactly 1/2
    assert o("t", win, loss) + o("t", loss, win) == 1.0  # exactly
    half = EnvRewardOracle(tau=0.5)
    assert half("t", win, draw) == pytest.approx(s(2.0))  # (1 - 0) / 0.5
    assert EnvRewardOracle(tau=1e-3)("t", win, draw) == 1.0  # a hard oracle in the limit
    with pytest.raises(TurnRLError, match="tau"):
        EnvRewardOracle(tau=0.0)


def test_complement_is_exact() -> None:
    rng = np.random.default_rng(0)
    for p in list(rng.random(2000)) + [0.0, 1.0, 0.5, 1e-300, 1 - 1e-16]:
        a, b = complement(float(p))
        assert a + b == 1.0
        assert a == pytest.approx(p, abs=1e-15)


def test_win_rates_by_hand() -> None:
    # three samples of one task with returns 1, 0, -1 and tau = 1
    samples = [_traj("t", 1.0), _traj("t", 0.0), _traj("t", -1.0)]
    m = preference_matrices(EnvRewardOracle(1.0), {"t": samples})["t"]
    expected = np.array([[0.5, s(1), s(2)], [s(-1), 0.5, s(1)], [s(-2), s(-1), 0.5]])
    assert np.allclose(m, expected)
    assert (m + m.T == 1.0).all() and (np.diag(m) == 0.5).all()
    rates = win_rates(m)
    assert rates[0] == pytest.approx((0.5 + s(1) + s(2)) / 3)
    assert rates[1] == pytest.approx(0.5)  # the middle sample: symmetric around it
    assert rates.mean() == pytest.approx(0.5)  # win rates of a group always average 1/2
    with pytest.raises(ValueError):
        win_rates(np.zeros((2, 3)))


class CountingOracle(Oracle):
    """Records its calls; prefers the first argument with a position bias of 0.1."""

    name = "counting"

    def __init__(self) -> None:
        self.calls: list[int] = []

    def probs(self, queries):  # type: ignore[no-untyped-def]
        self.calls.append(len(queries))
        return [min(1.0, s(a.return_ - b.return_) + 0.1) for _, a, b in queries]


def test_queries_are_batched_and_position_bias_cancels() -> None:
    groups = {t: [_traj(t, float(r), str(i)) for i, r in enumerate([1, 0, -1, 0, 1])] for t in ("a", "b", "c")}
    o = CountingOracle()
    mats = preference_matrices(o, groups)
    assert o.calls == [3 * 5 * 4]  # one call, K(K-1) ordered queries a task for a non-symmetric oracle
    for m in mats.values():
        assert (m + m.T == 1.0).all()
        assert m[0, 2] == pytest.approx(s(2))  # (p + 0.1 + 1 - (1 - p + 0.1)) / 2 = p: the bias is gone
    sym = EnvRewardOracle(1.0)
    calls: list[int] = []
    orig = sym.probs
    sym.probs = lambda q: (calls.append(len(q)), orig(q))[1]  # type: ignore[method-assign]
    preference_matrices(sym, groups)
    assert calls == [3 * 10]  # K(K-1)/2 for a symmetric oracle


def test_score_samples_and_selection() -> None:
    samples = [_traj("a", 1.0, "x"), _traj("a", 0.0, "y"), _traj("a", -1.0, "z"), _traj("b", 0.0, "x"),
               _traj("b", 0.0, "y")]
    scored = score_samples(samples, EnvRewardOracle(1.0))
    assert len(scored) == 5 and all(t.meta["oracle"] == "env_reward" and "win_rate" in t.meta for t in scored)
    best_worst = select_samples(scored, "best_worst")
    assert [t.return_ for t in best_worst] == [1.0, -1.0]  # task b ties everywhere: dropped
    with pytest.raises(TurnRLError, match="selection"):
        select_samples(scored, "top")  # type: ignore[arg-type]


def test_comparisons_roundtrip_and_bad_lines(tmp_path: Path) -> None:
    samples = [_traj("a", 1.0, "x"), _traj("a", 0.0, "y"), _traj("a", 0.0, "z")]
    comps = comparisons_from_trajectories(samples, hard=True, seed=1)
    assert len(comps) == 3
    for c in comps:  # labels follow returns whichever order A/B came in
        assert c.label == (0.5 if c.a.return_ == c.b.return_ else float(c.a.return_ > c.b.return_))
    assert len(comparisons_from_trajectories(samples, skip_ties=True)) == 2
    path = tmp_path / "c.jsonl"
    write_comparisons(path, comps)
    back = read_comparisons(path)
    assert [c.label for c in back] == [c.label for c in comps]
    lines = path.read_text().splitlines()
    bad = json.loads(lines[1])
    bad["label"] = 2
    path.write_text("\n".join([lines[0], json.dumps(bad)]) + "\n")
    with pytest.raises(TurnRLError, match=r"c.jsonl:2: label"):
        read_comparisons(path)
    for key, value, needle in (("meta", [1], "meta must be a JSON object (got [1])"),
                               ("meta", "ab", 'meta must be a JSON object (got "ab")'),
                               ("task_id", None, "task_id must be a string (got null)"),
                               # a misspelt key passed; 1e400 in meta read as infinity; sides of another task
                               ("lable_soft", 1.0, "unknown key 'lable_soft' (did you mean 'label'?)"),
                               ("meta", {"x": "1e400"}, "meta.x is not a finite number (got inf)"),
                               ("task_id", "b", 'a.task_id "a" is not the comparison\'s task_id "b"')):
        bad = {**json.loads(lines[1]), key: value}
        path.write_text(json.dumps(bad).replace('"1e400"', "1e400") + "\n")
        with pytest.raises(TurnRLError, match=r"c.jsonl:1: ") as exc:  # not a TypeError traceback
            read_comparisons(path)
        assert needle in str(exc.value)


def test_read_comparisons_names_a_directory(tmp_path: Path) -> None:
    with pytest.raises(TurnRLError, match=r": is a directory$"):
        read_comparisons(tmp_path)
    with pytest.raises(TurnRLError, match=r"missing.jsonl: no such file$"):
        read_comparisons(tmp_path / "missing.jsonl")


def test_split_by_task_holds_out_at_least_one_task_and_trains_on_one() -> None:
    from turnrl.train.preference_model import _split_by_task

    def comps(n: int) -> list:
        return comparisons_from_trajectories([_traj(f"t{k}", r, tag) for k in range(n)
                                              for r, tag in ((1.0, "x"), (0.0, "y"))], seed=0)

    def tasks(cs: list) -> set[str]:
        return {c.task_id for c in cs}

    for n, fraction, held in ((2, 0.75, 1), (4, 0.1, 1), (4, 0.5, 2), (10, 0.99, 9), (3, 0.0, 0)):
        train, ev = _split_by_task(comps(n), fraction)
        assert len(tasks(ev)) == held and len(tasks(train)) == n - held, (n, fraction)
        assert not tasks(train) & tasks(ev)
    with pytest.raises(TurnRLError, match=r"eval_fraction=0.5 .* 1 task\(s\)") as exc:
        _split_by_task(comps(1), 0.5)
    assert "\n" not in str(exc.value)


def test_comparisons_cli_without_any_pair_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    from turnrl.data.io import write_jsonl

    single = tmp_path / "single.jsonl"  # one trajectory a task: nothing to compare
    write_jsonl(single, [_traj("a", 1.0, "x"), _traj("b", 0.0, "y")])
    out = tmp_path / "c.jsonl"
    code, _, err = run(["comparisons", "--trajectories", str(single), "--out", str(out)], capsys)
    assert "single.jsonl: no comparisons" in one_line_error(code, err)
    assert not out.exists()  # no empty file that looks like a finished output
    tied = tmp_path / "tied.jsonl"
    write_jsonl(tied, [_traj("a", 1.0, "x"), _traj("a", 1.0, "y")])
    code, _, err = run(["comparisons", "--trajectories", str(tied), "--out", str(out), "--skip-ties"], capsys)
    assert "different returns" in one_line_error(code, err) and not out.exists()
    code, out_text, err = run(["comparisons", "--trajectories", str(tied), "--out", str(out)], capsys)
    assert code == 0 and "wrote 1 comparisons" in out_text and len(read_comparisons(out)) == 1
    # the command's own output passes `turnrl data validate` (it was "unknown schema 'turnrl.comparison/v1'")
    code, out_text, _ = run(["data", "validate", str(out)], capsys)
    assert code == 0 and json.loads(out_text) == {"path": str(out), "records": 1, "comparisons": 1, "tasks": 1,
                                                  "avg_label": 0.5}


def test_comparisons_cli_refuses_a_tau_its_hard_labels_would_ignore(tmp_path: Path, capsys) -> None:
    """Hard labels are 1, 0 or 1/2 by the returns' order: ``--tau`` changed nothing without ``--soft``."""
    from turnrl.data.io import write_jsonl

    games = tmp_path / "games.jsonl"
    write_jsonl(games, [_traj("a", 1.0, "x"), _traj("a", 0.0, "y")])
    out = tmp_path / "c.jsonl"
    code, _, err = run(["comparisons", "--trajectories", str(games), "--out", str(out), "--tau", "0.5"], capsys)
    assert one_line_error(code, err) == ("error: --tau 0.5: the oracle temperature of --soft labels; hard labels "
                                         "have none (it would be ignored): add --soft or leave --tau out")
    assert not out.exists()
    for tau, label in (("0.5", s(2.0)), ("2", s(0.5))):
        code, _, _ = run(["comparisons", "--trajectories", str(games), "--out", str(out), "--tau", tau, "--soft"],
                         capsys)
        (comp,) = read_comparisons(out)  # the winner's side is drawn: P(winner > loser) either way round
        assert code == 0 and max(comp.label, 1 - comp.label) == pytest.approx(label)


# ------------------------------------------------------------------------ pairwise model


def _ttt_trajectories(n: int) -> list[Trajectory]:
    opts = {"opponent": "random"}
    return (run_policy(RandomPolicy(), "tictactoe", episodes=n, env_opts=opts, seed=0)
            + run_policy(ExpertPolicy(), "tictactoe", episodes=n, env_opts=opts, seed=0))


@pytest.fixture(scope="module")
def small_pairwise(tiny_dir: Path):
    from turnrl.oracles.pairwise import PairwiseModelOracle, PairwiseSettings, build_pairwise_model

    settings = PairwiseSettings(backbone=str(tiny_dir), layers=1, max_side_tokens=96)
    model, tok = build_pairwise_model(settings, seed=3)
    with torch.no_grad():  # a non-trivial head so that margins are far from 0
        model.head.weight.normal_(std=1.0)
    return PairwiseModelOracle(model, tokenizer=tok, batch_size=8)


def test_pairwise_model_is_symmetric(small_pairwise) -> None:
    trajs = _ttt_trajectories(6)
    groups = {"g": trajs}  # 12 trajectories: 66 pairs
    m = preference_matrices(small_pairwise, groups)["g"]
    assert (m + m.T == 1.0).all()  # exactly, by construction
    assert (np.diag(m) == 0.5).all()
    assert np.abs(m - 0.5).max() > 1e-3  # not trivially 1/2
    # each order asked separately, in other batches: P(i,j) + P(j,i) == 1 up to float noise
    a, b, c = trajs[0], trajs[7], trajs[3]
    p_ab, p_ba = small_pairwise.probs([("g", a, b), ("g", b, a)])
    p_ab2 = small_pairwise.probs([("g", c, a), ("g", a, b)])[1]
    assert p_ab + p_ba == 1.0
    assert p_ab2 == pytest.approx(p_ab, abs=1e-6)
    # the margin is antisymmetric in the model itself: f(a,b) - f(b,a) = -(f(b,a) - f(a,b))
    d = small_pairwise.margins([("g", a, b), ("g", b, a)])
    assert d[0] == -d[1]


def test_the_pairwise_model_reads_the_tasks_first_observation(small_pairwise) -> None:
    """The task part kept the first ``max_task_tokens`` tokens of instruction + first observation, and every
    env's instruction is longer than that: a shop's goal (and a tic-tac-toe opening) never reached the model.
    It keeps the end now, the first observation whole."""
    enc = small_pairwise.encoder
    (shop,) = run_policy(RandomPolicy(), "shop", episodes=1)
    goal = next(m.content for m in shop.messages if m.role == "user")
    assert len(enc._ids(render_task(shop))) > enc.s.max_task_tokens
    assert len(enc.task_ids(shop)) == enc.s.max_task_tokens
    task = " ".join(enc.tok.decode(enc.task_ids(shop)).split())  # the shop's pages repeat the goal: the task part
    assert " ".join(goal.split()[:12]) in task                    # itself must hold it
    assert enc.encode(shop, shop)[0][:len(enc.task_ids(shop))] == enc.task_ids(shop)


def test_pairwise_model_save_load_roundtrip(small_pairwise, tmp_path: Path) -> None:
    from turnrl.oracles.pairwise import PairwiseModelOracle

    small_pairwise.model.save_pretrained(tmp_path / "pm")
    small_pairwise.encoder.tok.save_pretrained(tmp_path / "pm")
    trajs = _ttt_trajectories(2)
    q = [("g", trajs[0], trajs[2]), ("g", trajs[1], trajs[3])]
    # on the fixture's device: on a GPU the default would load it there, and CUDA's float32 kernels
    # give other roundings (2e-6 off on an H100) than the CPU's
    again = make_oracle(OracleConfig(kind="pairwise_model", model=str(tmp_path / "pm"), device="cpu"))
    assert isinstance(again, PairwiseModelOracle)
    assert again.probs(q) == pytest.approx(small_pairwise.probs(q), abs=1e-6)
    with pytest.raises(TurnRLError, match="not a pairwise preference model"):
        PairwiseModelOracle(tmp_path)
    # the SPPO pipeline's up-front check takes the saved folder (it has no config.json of a causal LM)
    from turnrl.pipelines.sppo import SPPOConfig

    SPPOConfig(oracle=OracleConfig(kind="pairwise_model", model=str(tmp_path / "pm"))).check()
    with pytest.raises(TurnRLError, match=r"^oracle\.model: .*: not a pairwise preference model \(no pairwise_config"):
        SPPOConfig(oracle=OracleConfig(kind="pairwise_model", model=str(tmp_path))).check()
    with pytest.raises(TurnRLError, match=r"^oracle\.model: .*nowhere: not a pairwise preference model \(no such folder"):
        SPPOConfig(oracle=OracleConfig(kind="pairwise_model", model=str(tmp_path / "nowhere"))).check()
    # a broken folder is refused up front too: it failed with a traceback once the pipeline had sampled
    import shutil

    weights, config = tmp_path / "pm" / "model.safetensors", tmp_path / "pm" / "pairwise_config.json"
    for broken, match in ((lambda: weights.write_bytes(weights.read_bytes()[:1000]), r"model\.safetensors: unreadable"),
                          (lambda: weights.unlink(), r"no model\.safetensors \(the pairwise model's weights\)"),
                          (lambda: config.write_text("{settings"), r"pairwise_config\.json: unreadable")):
        shutil.copytree(tmp_path / "pm", tmp_path / "pm0", dirs_exist_ok=True)
        broken()
        with pytest.raises(TurnRLError, match=r"^oracle\.model: .*" + match):
            SPPOConfig(oracle=OracleConfig(kind="pairwise_model", model=str(tmp_path / "pm"))).check()
        with pytest.raises(TurnRLError, match=match):
            PairwiseModelOracle(tmp_path / "pm")
        shutil.copytree(tmp_path / "pm0", tmp_path / "pm", dirs_exist_ok=True)


def test_render_trajectory_shows_turns_and_outcome() -> None:
    t = _ttt_trajectories(1)[0]
    text = render_trajectory(t)
    assert text.startswith("Agent: Thought:") and "Env: Opponent played" in text
    assert text.endswith(t.meta["final_observation"])
    assert t.meta["final_observation"] not in render_trajectory(t, final_observation=False)


@pytest.mark.slow
def test_train_preference_model_cli_learns_and_resumes(tiny_dir: Path, tmp_path: Path, capsys) -> None:
    trajs = run_policy(RandomPolicy(), "tictactoe", episodes=120, env_opts={"opponent": "random"}, seed=0)
    # group random games into pseudo-tasks of 6 so that pairs have different outcomes
    trajs = [replace(t, task_id=f"g{i // 6}") for i, t in enumerate(trajs)]
    comps = comparisons_from_trajectories(trajs, skip_ties=True, pairs_per_task=10, seed=0)
    write_comparisons(tmp_path / "train.jsonl", [c for c in comps if int(c.task_id[1:]) < 16])
    write_comparisons(tmp_path / "held.jsonl", [c for c in comps if int(c.task_id[1:]) >= 16])
    args = ["train", "preference-model", "--data", str(tmp_path / "train.jsonl"), "--out", str(tmp_path / "pm"),
            "--eval-data", str(tmp_path / "held.jsonl"), f"model.backbone={tiny_dir}", "model.layers=1",
            "model.max_side_tokens=64", "model.max_task_tokens=16", "lr=2e-3", "batch_size=8", "save_every=10",
            "max_steps=30"]
    code, _, err = run(args, capsys)
    assert code == 0, err
    ev = json.loads((tmp_path / "pm" / "eval.json").read_text())
    assert ev["final"]["loss"] < ev["start"]["loss"]
    assert ev["final"]["accuracy"] > 0.7
    # the trained directory is an oracle
    oracle = make_oracle(OracleConfig(kind="pairwise_model", model=str(tmp_path / "pm" / "model")))
    held = read_comparisons(tmp_path / "held.jsonl")
    p = oracle.probs([(c.task_id, c.a, c.b) for c in held])
    agree = np.mean([(pi > 0.5) == (c.label > 0.5) for pi, c in zip(p, held, strict=True)])
    assert agree == pytest.approx(ev["final"]["accuracy"], abs=1e-9)
    # the same directory again without --resume is refused; with --resume it is a no-op
    code, _, err = run(args, capsys)
    one_line_error(code, err)
    assert run([*args, "--resume"], capsys)[0] == 0
    code, _, err = run(["train", "preference-model", "--data", str(tmp_path / "train.jsonl"), "--out",
                        str(tmp_path / "x"), "model.pooling=max"], capsys)
    one_line_error(code, err)


# ------------------------------------------------------------------------------- judge


def test_judge_runs_end_to_end_on_tiny(tiny_dir: Path) -> None:
    from turnrl.oracles.judge import JudgeOracle, parse_verdict

    judge = make_oracle(OracleConfig(kind="judge", model=str(tiny_dir), batch_size=4, max_tokens=4000))
    assert isinstance(judge, JudgeOracle) and not judge.symmetric
    trajs = _ttt_trajectories(2)
    m = preference_matrices(judge, {"g": trajs})["g"]
    assert m.shape == (4, 4) and (m + m.T == 1.0).all() and ((m >= 0) & (m <= 1)).all()
    # each probability is P(A) of the model's next token after the prompt, read by a plain forward pass
    assert [judge.tok.decode([i]).strip() for i in (judge.token_a, judge.token_b)] == ["A", "B"]
    queries = [("g", trajs[0], trajs[1]), ("g", trajs[1], trajs[0]), ("g", trajs[2], trajs[0])]
    assert len({len(judge.prompt(*q)) for q in queries}) > 1  # one batch with padding, read at each last real token
    want = []
    for t, a, b in queries:
        with torch.no_grad():
            last = judge.model(input_ids=torch.tensor([judge.prompt(t, a, b)])).logits[0, -1].float()
        want.append(float(torch.softmax(last[[judge.token_a, judge.token_b]], 0)[0]))
    assert judge.probs(queries) == pytest.approx(want, abs=1e-5)
    assert m[0, 1] == pytest.approx((want[0] + 1 - want[1]) / 2, abs=1e-5)  # both orders averaged
    assert parse_verdict("Answer: B, because") == 0.0 and parse_verdict("A") == 1.0 and parse_verdict("none") is None


def test_judge_prompts_keep_to_max_tokens(tiny_dir: Path) -> None:
    """max_tokens bounds the prompt: the task and both attempts share what the fixed prompt leaves (64
    gave 187-token prompts, each part kept at least 16 tokens past a guessed 160-token overhead); a
    max_tokens too small for that is refused up front."""
    from turnrl.oracles.judge import JudgeOracle

    trajs = _ttt_trajectories(2)
    fixed = len(JudgeOracle(tiny_dir, max_tokens=4000)._assemble("", "", ""))
    for limit in (fixed + 48, fixed + 150, 1024):
        judge = JudgeOracle(tiny_dir, max_tokens=limit)
        lengths = [len(judge.prompt("g", a, b)) for a in trajs for b in trajs if a is not b]
        assert max(lengths) <= limit + 6, (limit, lengths)  # a cut's re-tokenization may move a few tokens
    with pytest.raises(TurnRLError, match=rf"^judge max_tokens=64: the judge's fixed prompt takes {fixed} tokens.*"
                                          rf"use at least {fixed + 48}$"):
        JudgeOracle(tiny_dir, max_tokens=64)
    # and by `turnrl sppo` before any stage, not once SFT and sampling have run
    from turnrl.oracles import OracleConfig
    from turnrl.pipelines.sppo import SPPOConfig

    SPPOConfig(oracle=OracleConfig(kind="judge", model=str(tiny_dir), max_tokens=fixed + 48)).check()
    with pytest.raises(TurnRLError, match=rf"^judge max_tokens=64: the judge's fixed prompt takes {fixed} tokens"):
        SPPOConfig(oracle=OracleConfig(kind="judge", model=str(tiny_dir), max_tokens=64)).check()


def test_make_oracle_errors() -> None:
    assert isinstance(make_oracle(OracleConfig()), EnvRewardOracle)
    with pytest.raises(TurnRLError, match="oracle.model"):
        make_oracle(OracleConfig(kind="pairwise_model"))


@pytest.mark.parametrize(("key", "value", "message"), [
    ("tau", 0.0, "must be a finite number > 0"), ("tau", float("inf"), "must be a finite number > 0"),
    ("batch_size", 0, "must be >= 1"), ("max_tokens", 0, "must be >= 1")])
def test_oracle_settings_out_of_range_are_refused_where_they_are_set(key: str, value: float, message: str) -> None:
    """A zero tau used to pass until the oracle stage (after SFT and sampling); a zero batch size
    became 1 without a word."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=rf"{key}[\s\S]*{message}"):
        OracleConfig.model_validate({key: value})


@pytest.mark.parametrize("key", ["layers", "max_task_tokens", "max_side_tokens"])
def test_pairwise_settings_below_one_are_refused(key: str) -> None:
    """``layers=0`` used to build the preset's 4 layers and ``max_side_tokens=0`` to cut nothing."""
    from pydantic import ValidationError

    from turnrl.oracles.pairwise import PairwiseSettings

    for bad in (0, -1):
        with pytest.raises(ValidationError, match=rf"{key}[\s\S]*must be >= 1"):
            PairwiseSettings.model_validate({key: bad})
    assert PairwiseSettings.model_validate({key: 1}).model_dump()[key] == 1


def _sentencepiece_tokenizer(vocab: dict[str, int], merges: list[tuple[str, str]]):
    """A tokenizer built like Llama-2's / Mistral-v0.1's tokenizer.json: a ``▁`` is prepended
    and spaces become ``▁``; without a ``▁▁A`` token, ``" A"`` alone is ``["▁", "▁A"]``."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    t.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    t.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def test_judge_letters_are_the_tokens_written_after_the_answer_prefix() -> None:
    """On a SentencePiece tokenizer the first token of " A" and of " B" is the same "▁": the
    letters are read where the model writes them, after "Answer:", as two distinct tokens."""
    from turnrl.oracles.judge import JudgeOracle

    chars = "Answer:"
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "▁": 3, "A": 4, "B": 5, "▁A": 6, "▁B": 7,
             **{c: 8 + i for i, c in enumerate(sorted(set(chars) - {"A"}))}}
    merges = [("▁", "A"), ("▁", "B")]
    tok = _sentencepiece_tokenizer(vocab, merges)
    assert tok(" A", add_special_tokens=False)["input_ids"][0] == tok(" B", add_special_tokens=False)["input_ids"][0]
    judge = JudgeOracle.__new__(JudgeOracle)
    judge.tok = tok
    a, b = judge._letter_ids()
    assert tok.convert_ids_to_tokens([a, b]) == ["▁A", "▁B"]
    # the verdict read off logits that clearly prefer the letter A is A, not 1/2
    from types import SimpleNamespace

    class PrefersA(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SimpleNamespace:
            logits = torch.zeros(*input_ids.shape, len(vocab))
            logits[..., a] = 5.0
            return SimpleNamespace(logits=logits)

    stub = PrefersA()
    stub.register_parameter("w", torch.nn.Parameter(torch.zeros(1)))  # probs() reads the device off a parameter
    judge.model, judge.batch_size, judge.token_a, judge.token_b = stub, 4, a, b
    judge.prompt = lambda t, x, y: [1, 3, 4]  # type: ignore[method-assign]
    assert judge.probs([("t", None, None)])[0] > 0.99
    # a tokenizer that cannot write the letters: a one-line error, not probabilities of 1/2
    judge.tok = _sentencepiece_tokenizer({"<unk>": 0, "<s>": 1, "</s>": 2, "▁": 3}, [])
    with pytest.raises(TurnRLError, match="distinct tokens"):
        judge._letter_ids()


def test_preference_model_settings_that_broke_training(tiny_dir: Path, tmp_path: Path, capsys) -> None:
    """``gradient_checkpointing=true`` was a 48-line AttributeError (the pairwise model forwards it to its
    backbone: the same losses); ``model.pooling=first`` on the causal backbone trained a model whose every
    margin is 0 (both orders of a pair begin with the task) and exited 0."""
    trajs = run_policy(RandomPolicy(), "tictactoe", episodes=24, env_opts={"opponent": "random"}, seed=0)
    trajs = [replace(t, task_id=f"g{i // 6}") for i, t in enumerate(trajs)]
    write_comparisons(tmp_path / "c.jsonl", comparisons_from_trajectories(trajs, skip_ties=True, pairs_per_task=4,
                                                                          seed=0))
    base = ["train", "preference-model", "--data", str(tmp_path / "c.jsonl"), f"model.backbone={tiny_dir}",
            "model.layers=1", "model.max_side_tokens=48", "model.max_task_tokens=16", "batch_size=4", "max_steps=3",
            "eval_fraction=0", "dropout=false"]
    losses = {}
    for gc in ("false", "true"):
        code, _, err = run([*base, "--out", str(tmp_path / gc), f"gradient_checkpointing={gc}"], capsys)
        assert code == 0, err
        losses[gc] = [json.loads(x)["loss"] for x in (tmp_path / gc / "metrics.jsonl").read_text().splitlines()
                      if "loss" in json.loads(x)]
    assert len(losses["true"]) == 3 and losses["true"] == pytest.approx(losses["false"], rel=1e-5)
    code, _, err = run([*base, "--out", str(tmp_path / "first"), "model.pooling=first"], capsys)
    assert one_line_error(code, err).startswith("error: model.pooling=first: the backbone") and "is causal" in err
    assert not (tmp_path / "first").exists()
    code, _, err = run([*base[:-2], "--out", str(tmp_path / "both"), "--eval-data", str(tmp_path / "c.jsonl"),
                        "eval_fraction=0.5"], capsys)  # the fraction went unread: nothing was held out of --data
    assert one_line_error(code, err).startswith("error: eval_fraction=0.5 holds out tasks of --data, and --eval-data")


def test_the_judge_prompt_keeps_the_space_before_its_answer() -> None:
    """Under a template that writes ``"Assistant: "`` before a reply, the prompt leaves that space to the
    reply (docs/tokenization.md): the judge's ``Answer:`` must bring it, or its prompt reads
    ``Assistant:Answer:``."""
    from test_tokenization import DEEPSEEK_LLM, _bytelevel_tokenizer  # tests/ is on sys.path

    from turnrl.oracles.judge import _answer_prefix_ids, _assemble
    from turnrl.tokenization import ChatFormat

    tok = _bytelevel_tokenizer()
    tok.chat_template = DEEPSEEK_LLM
    chat = ChatFormat(tok)
    ids = _assemble(chat, _answer_prefix_ids(chat), "the task", "attempt a", "attempt b")
    assert tok.decode(ids).endswith("\n\nAssistant: Answer:")
    assert ids == tok(tok.decode(ids), add_special_tokens=False)["input_ids"]  # as the whole text tokenizes
