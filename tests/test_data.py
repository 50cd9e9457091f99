"""Tests of the data files: round trips, crash safety, validation messages, ETO import."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from turnrl.data import (
    PAIR_SCHEMA,
    TRAJECTORY_SCHEMA,
    JsonlWriter,
    Message,
    Pair,
    Trajectory,
    convert_eto,
    import_eto,
    iter_jsonl,
    iter_trajectories,
    pair_from_dict,
    parse_action,
    read_pairs,
    read_records,
    read_trajectories,
    summarize,
    trajectory_from_dict,
    write_jsonl,
)
from turnrl.errors import TurnRLError


def make_traj(
    i: int = 0, *, success: bool = True, env: str = "tictactoe", split: str = "train", task: str | None = None
) -> Trajectory:
    return Trajectory(
        id=f"t{i}",
        env=env,
        task_id=task if task is not None else f"task-{i}",
        messages=[
            Message("system", "Play tic-tac-toe. Answer 'Action: N'."),
            Message("user", "board 1"),
            Message(
                "assistant",
                "Thought: centre.\nAction: 5",
                action="5",
                valid=True,
                token_ids=[7, 8, 9],
                logprobs=[-0.5, -1.0, 0.0],
            ),
            Message("user", "board 2"),
            Message("assistant", "Action: 1", action="1", valid=False, note="random action 3"),
        ],
        rewards=[0.0, 1.0 if success else -1.0],
        return_=1.0 if success else -1.0,
        success=success,
        terminated=True,
        split=split,
        source="policy",
        meta={"seed": i, "nested": {"anything": [1, "x"]}},
    )


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- round trips


def test_trajectory_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "traj.jsonl"  # parent folders are created
    trajs = [make_traj(i, success=i % 2 == 0) for i in range(3)]
    with JsonlWriter(path) as out:
        for t in trajs:
            out.write(t)
    assert out.count == 3 and out.closed
    assert read_trajectories(path) == trajs
    assert list(iter_trajectories(path)) == trajs
    first = json.loads(path.read_text().splitlines()[0])
    assert first["schema"] == TRAJECTORY_SCHEMA and first["return"] == 1.0 and first["num_turns"] == 2


def test_writer_accepts_dicts_and_truncates_without_append(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with JsonlWriter(path) as out:
        out.write(make_traj(0).to_dict())
    with JsonlWriter(path, append=False, durable=True) as out:
        out.write(make_traj(1))
    assert [t.id for t in read_trajectories(path)] == ["t1"]
    with pytest.raises(ValueError, match="not open"):
        out.write(make_traj(2))


def test_writer_flushes_each_record(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with JsonlWriter(path) as out:
        out.write(make_traj(0))
        assert [t.id for t in read_trajectories(path)] == ["t0"]  # visible before close


def test_writer_rejects_non_finite_numbers(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    bad = make_traj(0)
    bad.return_ = float("nan")
    with JsonlWriter(path) as out, pytest.raises(ValueError, match="non-finite"):
        out.write(bad)
    assert path.read_bytes() == b""


def test_pairs_round_trip_and_mixed_records(tmp_path: Path) -> None:
    pair = Pair(
        task_id="task-0", chosen=make_traj(0), rejected=make_traj(1, success=False, task="task-0"), meta={"kind": "eto"}
    )
    path = tmp_path / "pairs.jsonl"
    assert write_jsonl(path, [pair, pair]) == 2
    assert read_pairs(path) == [pair, pair]
    assert json.loads(path.read_text().splitlines()[0])["schema"] == PAIR_SCHEMA

    mixed = tmp_path / "mixed.jsonl"
    with JsonlWriter(mixed) as out:
        out.write(make_traj(0))
        out.write(pair)
    records = read_records(mixed)
    assert isinstance(records[0], Trajectory) and isinstance(records[1], Pair)
    with pytest.raises(TurnRLError, match=r"mixed\.jsonl:2: expected a 'turnrl\.trajectory/v1' record"):
        read_trajectories(mixed)


def test_defaults_for_optional_keys() -> None:
    t = trajectory_from_dict(
        {
            "schema": TRAJECTORY_SCHEMA,
            "id": "x",
            "env": "e",
            "task_id": "1",
            "messages": [{"role": "assistant", "content": "a"}],
            "rewards": [0.5],
        }
    )
    assert t.return_ == 0.5 and t.split == "train" and t.source == "policy" and not t.success
    assert t.messages[0].action is None and t.meta == {}


def test_iter_jsonl_skips_blank_lines(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "x.jsonl", ['{"a": 1}', "", "   ", '{"b": 2}'])
    assert list(iter_jsonl(path)) == [(1, {"a": 1}), (4, {"b": 2})]


# --------------------------------------------------------------------------- crash safety


def test_append_after_crash_drops_partial_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with JsonlWriter(path) as out:
        out.write(make_traj(0))
        out.write(make_traj(1))
    partial = json.dumps(make_traj(2).to_dict())[:57]  # the writer died mid-line
    with open(path, "a", encoding="utf-8") as f:
        f.write(partial)
    with pytest.raises(TurnRLError, match=r"t\.jsonl:3: invalid JSON: .*last line is incomplete"):
        read_trajectories(path)

    with JsonlWriter(path) as out:
        assert out.dropped_bytes == len(partial.encode())
        out.write(make_traj(3))
    assert [t.id for t in read_trajectories(path)] == ["t0", "t1", "t3"]


def test_append_keeps_complete_last_line_without_newline(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(make_traj(0).to_dict()))  # hand-written, no final newline
    with JsonlWriter(path) as out:
        assert out.dropped_bytes == 0
        out.write(make_traj(1))
    assert [t.id for t in read_trajectories(path)] == ["t0", "t1"]


def test_append_when_only_line_is_partial(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"schema": "turnrl.traj')
    with JsonlWriter(path) as out:
        assert out.dropped_bytes == len('{"schema": "turnrl.traj')
        out.write(make_traj(0))
    assert [t.id for t in read_trajectories(path)] == ["t0"]


class Exploding:
    def to_dict(self) -> dict[str, Any]:
        raise RuntimeError("boom")


def test_write_jsonl_is_atomic(tmp_path: Path) -> None:
    target = tmp_path / "pairs.jsonl"
    with pytest.raises(RuntimeError, match="boom"):
        write_jsonl(target, [make_traj(0), Exploding(), make_traj(1)])
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind

    write_jsonl(target, [make_traj(0)])
    with pytest.raises(RuntimeError):
        write_jsonl(target, [make_traj(5), Exploding()])
    assert [t.id for t in read_trajectories(target)] == ["t0"]  # old content untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pairs.jsonl"]


# --------------------------------------------------------------------------- validation


def good() -> dict[str, Any]:
    return make_traj(0).to_dict()


def with_changes(**changes: Any) -> dict[str, Any]:
    d = good()
    for key, value in changes.items():
        if value is ...:
            del d[key]
        else:
            d[key] = value
    return d


def with_message(i: int, **changes: Any) -> dict[str, Any]:
    d = good()
    for key, value in changes.items():
        if value is ...:
            del d["messages"][i][key]
        else:
            d["messages"][i][key] = value
    return d


BAD_LINES: list[tuple[str, str, str]] = [
    ("bad json", '{"schema": "turnrl.trajectory/v1", "id": }', "invalid JSON: Expecting value (column 42)"),
    ("not an object", "[1, 2]", "expected a JSON object, got list [1, 2]"),
    ("missing task_id", json.dumps(with_changes(task_id=...)), "missing key 'task_id'"),
    ("missing schema", json.dumps(with_changes(schema=...)), "missing key 'schema'"),
    ("unknown schema", json.dumps(with_changes(schema="x")), "unknown schema 'x'"),
    ("unknown key", json.dumps(with_changes(tsk_id="1")), "unknown key 'tsk_id' (did you mean 'task_id'?)"),
    (
        "wrong role",
        json.dumps(with_message(3, role="bot")),
        "messages[3].role must be one of system, user, assistant (got 'bot')",
    ),
    ("unknown message key", json.dumps(with_message(1, text="x")), "unknown key 'messages[1].text'"),
    ("missing content", json.dumps(with_message(1, content=...)), "missing key 'messages[1].content'"),
    (
        "action on user",
        json.dumps(with_message(1, action="5")),
        "messages[1].action is only allowed on assistant messages",
    ),
    (
        "bad token_ids",
        json.dumps(with_message(2, token_ids=[1, "2", 3])),
        "messages[2].token_ids must be a list of integers (item 1 is '2')",
    ),
    (
        "float token_ids",
        json.dumps(with_message(2, token_ids=[1.5, 2, 3])),
        "messages[2].token_ids must be a list of integers",
    ),
    (
        "negative token id",
        json.dumps(with_message(2, token_ids=[1, -2, 3])),
        "messages[2].token_ids[1] must be a token id in [0, 2**31) (got -2)",
    ),
    (
        "token id past 32 bits",  # passed validation, then training crashed with an OverflowError
        json.dumps(with_message(2, token_ids=[1, 2, 2**32])),
        "messages[2].token_ids[2] must be a token id in [0, 2**31) (got 4294967296)",
    ),
    (
        "logprobs length",
        json.dumps(with_message(2, logprobs=[-1.0])),
        "messages[2].logprobs has 1 entries but token_ids has 3",
    ),
    (
        "logprobs not numbers",
        json.dumps(with_message(2, logprobs=["a", 0, 0])),
        "messages[2].logprobs must be a list of numbers",
    ),
    (
        "bad valid",
        json.dumps(with_message(4, valid="yes")),
        "'messages[4].valid' must be true, false or null",
    ),
    ("bad cut", json.dumps(with_message(4, cut=1)), "'messages[4].cut' must be true, false or null (got 1)"),
    ("cut on user", json.dumps(with_message(1, cut=True)), "messages[1].cut is only allowed on assistant messages"),
    ("rewards not numbers", json.dumps(with_changes(rewards=[0, "1"])), "rewards must be a list of numbers"),
    ("rewards not a list", json.dumps(with_changes(rewards=1.0)), "rewards must be a list of numbers"),
    ("rewards length", json.dumps(with_changes(rewards=[1.0])), "rewards has 1 entries but there are 2"),
    ("return not a number", json.dumps(with_changes(**{"return": "1"})), "'return' is not a number"),
    # Python's reader takes NaN and Infinity, which no writer here can write back: refused where read
    ("return nan", json.dumps(with_changes(**{"return": float("nan")})), "invalid JSON: NaN is not a JSON number"),
    ("meta infinity", json.dumps(with_changes(meta={"score": -float("inf")})),
     "invalid JSON: -Infinity is not a JSON number"),
    # integers too large for a float, or for Python to read at all, and nesting too deep to parse
    ("return too large", json.dumps(with_changes(**{"return": 10**400})), "'return' is not a number (got 1000"),
    ("reward too large", json.dumps(with_changes(rewards=[0.0, 10**400])), "rewards must be a list of numbers"),
    ("too many digits", '{"return": 1' + "0" * 5000 + "}", "invalid JSON: Exceeds the limit"),
    ("nested too deeply", "[" * 100_000, "invalid JSON: nested too deeply"),
    # Python's reader keeps a repeated key's last value in silence: "return": 1, ..., "return": -1 read as -1
    ("key twice", json.dumps(good())[:-1] + ', "return": -1.0}', "invalid JSON: key 'return' given twice in one object"),
    ("meta key twice", json.dumps(with_changes(meta={}))[:-1].replace('"meta": {}', '"meta": {"x": 1, "x": 2}') + "}",
     "invalid JSON: key 'x' given twice"),
    ("num_turns", json.dumps(with_changes(num_turns=3)), "num_turns is 3 but there are 2 assistant messages"),
    ("success not bool", json.dumps(with_changes(success=1)), "'success' must be true or false (got 1)"),
    ("task_id not str", json.dumps(with_changes(task_id=3)), "'task_id' must be a string (got 3)"),
    ("bad source", json.dumps(with_changes(source="human")), "source must be one of expert, policy, import"),
    ("messages not a list", json.dumps(with_changes(messages="hi")), "messages must be a list of messages"),
    ("meta not object", json.dumps(with_changes(meta=[1])), "meta must be a JSON object"),
]


@pytest.mark.parametrize(("line", "message"), [c[1:] for c in BAD_LINES], ids=[c[0] for c in BAD_LINES])
def test_validation_errors_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = write_lines(tmp_path / "x.jsonl", [json.dumps(good()), "", line])
    with pytest.raises(TurnRLError) as err:
        read_trajectories(path)
    assert str(err.value).startswith(f"{path}:3: "), str(err.value)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_schema_in_mixed_reader(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "x.jsonl", [json.dumps(with_changes(schema="turnrl.trajectory/v2"))])
    with pytest.raises(TurnRLError, match=r"x\.jsonl:1: unknown schema 'turnrl\.trajectory/v2'.*choose from"):
        read_records(path)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(TurnRLError, match=r"nope\.jsonl: no such file"):
        read_trajectories(tmp_path / "nope.jsonl")
    with pytest.raises(TurnRLError, match="is a directory"):
        read_trajectories(tmp_path)


def test_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(json.dumps(good()).encode() + b"\n" + b'{"a": "\xff"}\n')
    with pytest.raises(TurnRLError, match=r"x\.jsonl:2: invalid JSON: not UTF-8"):
        read_trajectories(path)


def test_pair_errors_name_the_side() -> None:
    pair = Pair(task_id="1", chosen=make_traj(0, task="1"), rejected=make_traj(1, task="1")).to_dict()
    pair["rejected"]["messages"][3]["role"] = "bot"
    with pytest.raises(TurnRLError, match=r"^p\.jsonl:4: rejected\.messages\[3\]\.role must be one of"):
        pair_from_dict(pair, "p.jsonl:4")
    pair = Pair(task_id="1", chosen=make_traj(0, task="1"), rejected=make_traj(1, task="1")).to_dict()
    del pair["chosen"]["env"]
    with pytest.raises(TurnRLError, match=r"missing key 'chosen\.env'"):
        pair_from_dict(pair, "p.jsonl:4")
    pair = Pair(task_id="1", chosen=make_traj(0, task="1"), rejected=make_traj(1, task="1")).to_dict()
    pair["chosen"]["shema"] = TRAJECTORY_SCHEMA
    with pytest.raises(TurnRLError, match=r"unknown key 'chosen\.shema' \(did you mean 'schema'\?\)"):
        pair_from_dict(pair, "p.jsonl:4")
    del pair["chosen"]["shema"], pair["chosen"]["schema"]  # nested schema tags are optional
    assert pair_from_dict(pair, "p.jsonl:4").chosen == make_traj(0, task="1")
    pair["rejected"]["task_id"] = "2"  # sides of two tasks: a preference between two prompts is none
    with pytest.raises(TurnRLError, match=r"^p\.jsonl:4: rejected\.task_id '2' is not the pair's task_id '1'$"):
        pair_from_dict(pair, "p.jsonl:4")
    pair["rejected"]["task_id"], pair["rejected"]["env"] = "1", "bandit"
    with pytest.raises(TurnRLError, match=r"^p\.jsonl:4: chosen\.env 'tictactoe' and rejected\.env 'bandit' differ$"):
        pair_from_dict(pair, "p.jsonl:4")
    pair["rejected"]["env"] = "unknown"  # an import's default env matches any
    assert pair_from_dict(pair, "p.jsonl:4").rejected.env == "unknown"


# --------------------------------------------------------------------------- summary


def test_summarize(tmp_path: Path) -> None:
    from dataclasses import replace

    path = tmp_path / "x.jsonl"
    with JsonlWriter(path) as out:
        out.write(make_traj(0, success=True, env="tictactoe"))
        out.write(make_traj(1, success=False, env="tictactoe", split="seen"))
        out.write(make_traj(2, success=True, env="bandit"))
        out.write(Pair(task_id="t", chosen=make_traj(0, task="t"), rejected=make_traj(1, success=False, task="t")))
    s = summarize(path)
    assert s["trajectories"] == 3 and s["pairs"] == 1 and s["records"] == 4
    assert s["by_env"] == {"bandit": 1, "tictactoe": 2}
    assert s["by_split"] == {"seen": 1, "train": 2}
    assert s["by_source"] == {"policy": 3}
    assert s["success_rate"] == pytest.approx(2 / 3)
    assert s["avg_return"] == pytest.approx(1 / 3)
    assert s["avg_turns"] == 2.0
    assert s["pairs_by_env"] == {"tictactoe": 1} and s["avg_return_margin"] == 2.0
    json.dumps(s)  # JSON-ready
    # a side cut after a turn (step pairs, --truncate-k) keeps its kept turns' rewards: the margin is the
    # returns that decided the pair, which the builders record
    cut = [replace(make_traj(i, task="t"), rewards=[0.0, 0.0], return_=0.0) for i in (0, 1)]
    write_jsonl(path, [Pair("t", *cut, {"chosen_return": 1.0, "rejected_return": -1.0}), Pair("t", *cut, {})])
    assert summarize(path)["avg_return_margin"] == 1.0  # (2 + 0) / 2


def test_summarize_empty(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    s = summarize(path)
    assert s["records"] == 0 and s["success_rate"] is None and s["avg_return"] is None


# --------------------------------------------------------------------------- ETO import

INSTRUCTION = (
    "You are web shopping.\nYour response should use the following format:\nThought: ...\nAction: ..."
)
ETO_ITEMS: list[dict[str, Any]] = [
    {
        "id": 0,
        "conversations": [
            {"from": "human", "value": INSTRUCTION},
            {"from": "gpt", "value": "OK"},
            {"from": "human", "value": "Observation:\nWebShop [SEP] Instruction: buy a red mug"},
            {"from": "gpt", "value": "Thought: I should search.\nAction: search[red mug]"},
            {"from": "human", "value": "Observation:\n[Back to Search] ... B01 ..."},
            {"from": "gpt", "value": "Thought: Action: is a word here.\nAction:  click[B01] \n"},
        ],
        "reward": 1.0,
    },
    {
        "id": "pick_and_place-12",
        "conversations": [
            {"from": "human", "value": INSTRUCTION},
            {"from": "gpt", "value": "OK"},
            {"from": "human", "value": "You are in a room."},
            {"from": "gpt", "value": "Thought: look.\nAction: look"},
        ],
        "reward": 0.5,
        "game_file": "json_2.1.1/train/pick_and_place-12/game.tw-pddl",
    },
    {"id": 7, "conversations": [{"from": "system", "value": "sys"}, {"from": "human", "value": "hi"},
                                {"from": "gpt", "value": "OK"}]},
]


def check_eto(trajs: list[Trajectory]) -> None:
    assert len(trajs) == 3
    t0, t1, t2 = trajs
    assert t0.task_id == "0" and t0.env == "webshop" and t0.source == "import"
    assert [m.role for m in t0.messages] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert t0.messages[0].content == INSTRUCTION
    assert t0.actions == [None, "search[red mug]", "click[B01]"]  # "OK" has no action
    assert t0.num_turns == 3 and t0.rewards == []
    assert t0.return_ == 1.0 and t0.success
    assert t1.task_id == "pick_and_place-12" and t1.return_ == 0.5 and not t1.success
    assert t1.meta["game_file"].endswith("game.tw-pddl") and t1.meta["eto_index"] == 1
    assert [m.role for m in t2.messages] == ["system", "user", "assistant"]
    assert t2.return_ == 0.0 and not t2.success and t2.meta["reward_missing"] is True
    assert len({t.id for t in trajs}) == 3


def test_clean_losers_keep_an_imported_trajectorys_ok_acknowledgement(tmp_path: Path) -> None:
    """ETO's leading "OK" (no action) made every imported trajectory degenerate, so ``--losers clean``
    dropped every imported loser; a reply without an action later in the game still counts."""
    from dataclasses import replace

    from turnrl.data.eto import import_eto
    from turnrl.data.pairs import degenerate_reason, trajectory_pairs

    src = tmp_path / "eto.json"
    src.write_text(json.dumps(ETO_ITEMS))
    for source in ("import", "policy"):
        t0 = import_eto(src, env="webshop", source=source)[0]
        assert t0.actions[0] is None and degenerate_reason(t0) is None
        expert = replace(t0, id="e", return_=1.0, source="expert")
        loser = replace(t0, id="l", return_=0.2)
        assert len(trajectory_pairs([expert], [loser], losers="clean")) == 1
    late = replace(loser, messages=[*loser.messages[:-1], replace(loser.messages[-1], action=None)])
    assert degenerate_reason(late) == "no action"
    sampled = replace(t0, messages=[replace(m, valid=False if m.action is None else True) for m in t0.messages])
    assert degenerate_reason(sampled) == "invalid action"  # a reply turnrl sampled records its validity
    only = replace(t0, messages=t0.messages[:2])  # "OK" and nothing after it: no agent turn at all
    assert degenerate_reason(only) == "no action"


def test_a_seed_that_is_a_json_list_keys_its_game(tmp_path: Path) -> None:
    """``meta.seed`` is free-form: a list read and validated, then ``turnrl pairs`` crashed (unhashable)."""
    from dataclasses import replace

    from turnrl.data.eto import import_eto
    from turnrl.data.pairs import trajectory_pairs

    src = tmp_path / "eto.json"
    src.write_text(json.dumps(ETO_ITEMS))
    t0 = import_eto(src, env="webshop")[0]
    expert = replace(t0, id="e", return_=1.0, meta={"seed": [1, 2]})
    losers = [replace(t0, id="l", return_=0.0, meta={"seed": [1, 2]}),
              replace(t0, id="m", return_=0.0, meta={"seed": [2, 1]})]  # another game: the task's expert
    assert expert.game == ("0", "[1, 2]") and losers[1].game == ("0", "[2, 1]")
    assert [p.rejected.id for p in trajectory_pairs([expert], losers)] == ["l", "m"]


def test_pair_builders_refuse_games_of_two_envs() -> None:
    """Task ids repeat across envs (``task-0``): an expert file of one env and explorations of another
    made pairs of two envs' games, and ``data validate`` passed them."""
    from turnrl.data.pairs import self_play_pairs, step_pairs, takeover_pairs, trajectory_pairs

    expert, explored = make_traj(0), make_traj(0, success=False, env="bandit")
    for build in (trajectory_pairs, step_pairs, lambda e, x: takeover_pairs(e, x, [])):
        with pytest.raises(TurnRLError, match=r"^the trajectories are of 2 envs \(bandit, tictactoe\)"):
            build([expert], [explored])
    with pytest.raises(TurnRLError, match=r"of 2 envs"):
        self_play_pairs([expert, explored])
    assert len(trajectory_pairs([expert], [make_traj(0, success=False, env="unknown")])) == 1  # an import's default


def test_pair_builders_refuse_games_of_two_env_settings() -> None:
    """An expert's draws against minimax and the agent's games against the random opponent share task
    ids: paired, the agent's wins were "preferred" to the expert's draws. Options are compared with the
    env's defaults filled in; a game that records none matches any."""
    from dataclasses import replace

    from turnrl.data.pairs import self_play_pairs, takeover_pairs, trajectory_pairs

    def played(opts: dict[str, Any] | None, **kw: Any) -> Trajectory:
        t = make_traj(0, **kw)
        return replace(t, meta={**t.meta, **({} if opts is None else {"env_opts": opts})})

    expert, agent = played({"opponent": "minimax"}), played({}, success=False)
    for build in (trajectory_pairs, lambda e, x: takeover_pairs(e, x, [])):
        with pytest.raises(TurnRLError, match=r"^the trajectories were played under 2 settings of the env's options "
                                              r'\(\{"opponent": "minimax"\}; \{\}\)'):
            build([expert], [agent])
    with pytest.raises(TurnRLError, match="2 settings"):
        self_play_pairs([expert, agent])
    same = played({"opponent": "random"})  # the default, given: the same setting as none given
    assert len(trajectory_pairs([same], [agent])) == 1
    assert len(trajectory_pairs([played(None)], [agent])) == 1
    # one value written as an int and as a float is one setting (noise=1 and noise 1.0)
    assert len(trajectory_pairs([played({"noise": 1})], [played({"noise": 1.0}, success=False)])) == 1
    # SPPO's scores compare a task's samples as self-play pairs do
    from turnrl.data.pairs import scored_samples

    with pytest.raises(TurnRLError, match=r"2 settings .*collect the samples with the same --env-opt"):
        scored_samples([expert, agent])


def test_a_history_window_keeps_an_imported_trajectorys_instruction(tmp_path: Path) -> None:
    """ETO's instruction is its first user message, answered "OK": with ``history=k`` it fell out of the
    window from turn k + 2 on, so SFT trained later turns without the task. It is kept as the head; a
    trajectory turnrl played (no such exchange) is windowed as before."""
    from dataclasses import replace

    from turnrl.agent.prompting import agent_view
    from turnrl.data.eto import import_eto

    turns = [{"from": "human", "value": INSTRUCTION}, {"from": "gpt", "value": "OK"}]
    for k in range(5):
        turns += [{"from": "human", "value": f"obs {k}"}, {"from": "gpt", "value": f"Thought: t{k}\nAction: a{k}"}]
    src = tmp_path / "eto.json"
    src.write_text(json.dumps([{"id": 0, "conversations": turns, "reward": 1.0}]))
    (t,) = import_eto(src, env="webshop")
    for turn in range(t.num_turns):
        view, local = agent_view(t.messages, turn, 1)
        if turn:
            assert [m.content for m in view[:2]] == [INSTRUCTION, "OK"]
        replies = [m for m in view if m.role == "assistant"]
        assert replies[local] is [m for m in t.messages if m.role == "assistant"][turn]
        if turn >= 2:  # the instruction exchange, the one exchange before, the observation and the turn
            assert [m.content for m in view[2:]] == [f"obs {turn - 2}", f"Thought: t{turn - 2}\nAction: a{turn - 2}",
                                                     f"obs {turn - 1}", f"Thought: t{turn - 1}\nAction: a{turn - 1}"]
    other = replace(t, messages=[t.messages[0], replace(t.messages[1], content="Thought: no action"), *t.messages[2:]])
    assert agent_view(other.messages, 3, 0)[0][0].content == "obs 2"  # only ETO's "OK" opens such an exchange
    played = make_traj(0)  # turnrl's sampler records every reply's validity: no instruction exchange
    assert [m.content for m in agent_view(played.messages, 1, 0)[0]] == [played.messages[0].content, "board 2",
                                                                         "Action: 1"]


def test_eto_import_json_list(tmp_path: Path) -> None:
    path = tmp_path / "webshop_sft.json"
    path.write_text(json.dumps(ETO_ITEMS, indent=4))
    trajs = import_eto(path, env="webshop")
    check_eto(trajs)
    assert trajs[0].id == "webshop_sft-0"


def test_eto_import_jsonl_and_convert(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "eto.jsonl", [json.dumps(item) for item in ETO_ITEMS])
    check_eto(import_eto(path, env="webshop"))

    out = tmp_path / "out" / "trajectories.jsonl"
    assert convert_eto(path, out, env="webshop", source="expert", default_reward=1.0) == 3
    back = read_trajectories(out)
    assert [t.source for t in back] == ["expert"] * 3
    assert back[2].success and back[2].return_ == 1.0 and "reward_missing" not in back[2].meta


def test_eto_import_single_exploration_output(tmp_path: Path) -> None:
    path = tmp_path / "42.json"  # ETO's outputs/<run>/<task>/<id>.json: no "id", reward in meta
    path.write_text(
        json.dumps({"meta": {"reward": True}, "conversations": ETO_ITEMS[1]["conversations"]}, indent=2)
    )
    (t,) = import_eto(path, env="alfworld")
    assert t.task_id == "42" and t.return_ == 1.0 and t.success
    path.write_text(json.dumps({"meta": {"reward": True}, "conversations": ETO_ITEMS[1]["conversations"]}))
    (t,) = import_eto(path, env="alfworld")  # the same object on one line
    assert t.task_id == "42" and t.success


def test_eto_import_keeps_a_null_reward_missing_and_refuses_overflowing_numbers(tmp_path: Path) -> None:
    """ETO writes meta.reward null for an episode that errored: it is no success even with a
    default_reward (which is for items without a reward key); 1e400 is refused where it is read."""
    path = tmp_path / "7.json"
    path.write_text(json.dumps({"meta": {"reward": None}, "conversations": ETO_ITEMS[1]["conversations"]}))
    (t,) = import_eto(path, env="alfworld", default_reward=1.0)
    assert t.return_ == 0.0 and not t.success and t.meta["reward_missing"]
    path.write_text('{"meta": {"reward": 1e400}, "conversations": []}')
    with pytest.raises(TurnRLError, match=r"7\.json:1: invalid JSON: 1e400 is too large for a float"):
        import_eto(path, env="alfworld")
    lines = tmp_path / "eto.jsonl"  # JSONL: an item's extra key, kept in meta, is checked where it is read
    item = {"id": 1, "score": 2.5, "conversations": ETO_ITEMS[1]["conversations"]}
    lines.write_text(json.dumps(item) + "\n" + json.dumps(item).replace("2.5", "1e400") + "\n")
    with pytest.raises(TurnRLError, match=r"eto\.jsonl:2: the item's other keys\.score is not a finite number"):
        import_eto(lines, env="alfworld")


def test_a_number_too_large_and_a_line_of_control_characters_are_invalid_json(tmp_path: Path) -> None:
    big = json.dumps(with_changes(meta={"score": [1.0, 2.5]})).replace("2.5", "1e400")
    for line, message in ((big, r"meta\.score\[1\] is not a finite number \(got inf\)"),
                          ("\x1c\x1d", "invalid JSON"), ("\u3000", "invalid JSON")):
        path = write_lines(tmp_path / "x.jsonl", [json.dumps(good()), line])
        with pytest.raises(TurnRLError, match=rf"x\.jsonl:2: .*{message}"):
            read_trajectories(path)


def test_a_second_writer_of_a_file_is_refused_before_it_touches_it(tmp_path: Path) -> None:
    """Repairing the tail under a running writer cut its finished records: a second writer (here in
    the same process; another process alike) is refused, one line, and the first writes on."""
    path = tmp_path / "x.jsonl"
    with JsonlWriter(path) as first:
        first.write(good())
        for append in (True, False):  # appending would repair the tail; starting afresh, truncate it
            with pytest.raises(TurnRLError, match=r"x\.jsonl: another writer has it open"):
                JsonlWriter(path, append=append).open()
        first.write(good())
    assert len(read_trajectories(path)) == 2
    with JsonlWriter(path) as again:  # the first closed: the next writer appends
        again.write(good())
    assert len(read_trajectories(path)) == 3


def test_a_file_system_without_locks_is_written_unlocked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """NFS without a lock daemon answers flock with ENOLCK: the writer warns and writes, as before the
    lock; writing afresh to a pipe (nothing to truncate) works too."""
    import errno
    import fcntl
    import os

    def no_locks(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with JsonlWriter(tmp_path / "x.jsonl") as w:
        w.write(good())
    assert len(read_trajectories(tmp_path / "x.jsonl")) == 1 and "cannot be locked" in caplog.text
    monkeypatch.undo()
    r, wfd = os.pipe()
    with JsonlWriter(f"/dev/fd/{wfd}", append=False) as w:
        w.write({"a": 1})
    os.close(wfd)
    assert os.read(r, 100) == b'{"a": 1}\n'
    os.close(r)
    with JsonlWriter("/dev/null") as a, JsonlWriter("/dev/null") as b:  # a device is not locked
        a.write({"a": 1})
        b.write({"b": 2})


def test_parse_action() -> None:
    assert parse_action("Thought: x\nAction: go north") == "go north"
    assert parse_action("no action here") is None
    assert parse_action("Action:") == ""


ETO_BAD: list[tuple[str, Any, str]] = [
    ("missing id", {"conversations": []}, "missing key 'id'"),
    ("missing conversations", {"id": 1}, "missing key 'conversations'"),
    (
        "bad from",
        {"id": 1, "conversations": [{"from": "bot", "value": "x"}]},
        "conversations[0].from must be one of human, gpt, system (got 'bot')",
    ),
    ("missing value", {"id": 1, "conversations": [{"from": "gpt"}]}, "missing key 'conversations[0].value'"),
    (
        "value not str",
        {"id": 1, "conversations": [{"from": "gpt", "value": 3}]},
        "'conversations[0].value' must be a string (got 3)",
    ),
    (
        "bad reward",
        {"id": 1, "conversations": [{"from": "gpt", "value": "OK"}], "reward": "high"},
        "'reward' is not a number (got 'high')",
    ),
    (
        "no agent turn",
        {"id": 1, "conversations": [{"from": "human", "value": "Put a mug in the sink."}]},
        "no 'gpt' entry in 'conversations': a trajectory without an agent turn has nothing to train on",
    ),
    (
        "reward too large",
        {"id": 1, "conversations": [{"from": "gpt", "value": "OK"}], "reward": 10**400},
        "'reward' is not a number (got 1000",
    ),
    ("bad id", {"id": [1], "conversations": []}, "'id' must be a string or an integer"),
    ("not an object", [1], "expected a JSON object, got list"),
]


@pytest.mark.parametrize(("item", "message"), [c[1:] for c in ETO_BAD], ids=[c[0] for c in ETO_BAD])
def test_eto_errors(tmp_path: Path, item: Any, message: str) -> None:
    as_list = tmp_path / "eto.json"
    as_list.write_text(json.dumps([ETO_ITEMS[0], item], indent=2))
    with pytest.raises(TurnRLError) as err:
        import_eto(as_list)
    assert str(err.value).startswith(f"{as_list}: item 1: {message}")

    as_lines = write_lines(tmp_path / "eto.jsonl", [json.dumps(ETO_ITEMS[0]), json.dumps(item)])
    with pytest.raises(TurnRLError) as err:
        import_eto(as_lines)
    assert str(err.value).startswith(f"{as_lines}:2: {message}")


def test_eto_invalid_json_and_no_partial_output(tmp_path: Path) -> None:
    bad = tmp_path / "eto.json"
    bad.write_text('[{"id": 1, "conversations": []},\n {"id": 2 "conversations": []}]')
    out = tmp_path / "out.jsonl"
    with pytest.raises(TurnRLError, match=r"eto\.json:2: invalid JSON: Expecting ',' delimiter"):
        convert_eto(bad, out)
    assert not out.exists()
    with pytest.raises(TurnRLError, match=r"missing\.json: no such file"):
        import_eto(tmp_path / "missing.json")
    with pytest.raises(TurnRLError, match="source must be one of"):
        import_eto(bad, source="human")
    bad.write_text('[{"id": 1, "reward": Infinity, "conversations": []}]')
    with pytest.raises(TurnRLError, match=r"eto\.json:1: invalid JSON: Infinity is not a JSON number"):
        convert_eto(bad, out)
    assert not out.exists()
    # in a pretty-printed list the error names the literal's line, not a string that spells it
    bad.write_text('[\n {"id": "Infinity", "note": "x NaN 1e400",\n  "conversations": [],\n  "reward": -Infinity}]')
    with pytest.raises(TurnRLError, match=r"eto\.json:4: invalid JSON: -Infinity is not a JSON number"):
        convert_eto(bad, out)
    bad.write_text('[\n {"id": 1, "note": "1e400",\n  "conversations": [],\n  "score": [0.5,\n   1e400]}]')
    with pytest.raises(TurnRLError, match=r"eto\.json:5: invalid JSON: 1e400 is too large for a float"):
        convert_eto(bad, out)
    assert not out.exists()
    for empty in ("", "[]", "\n"):  # a download cut short: an empty output would look complete
        bad.write_text(empty)
        with pytest.raises(TurnRLError, match=r"eto\.json: holds no ETO items \(an empty file or list\); nothing written"):
            convert_eto(bad, out)
        assert not out.exists()


def test_eto_import_reads_a_jsonl_file_of_one_line_as_json_lines(tmp_path: Path) -> None:
    """A ``.jsonl`` file is JSON lines even with one line: its item needs its own "id" (where a
    ``.json`` file of one object, ETO's exploration output, takes the file name)."""
    item = {"conversations": ETO_ITEMS[1]["conversations"], "reward": 1.0}
    one = tmp_path / "7.jsonl"
    one.write_text(json.dumps(item) + "\n")
    with pytest.raises(TurnRLError, match=r"7\.jsonl:1: missing key 'id'"):
        import_eto(one, env="alfworld")
    one.write_text(json.dumps({"id": "t3", **item}) + "\n")
    (t,) = import_eto(one, env="alfworld")
    assert t.task_id == "t3" and t.success
    single = tmp_path / "7.json"
    single.write_text(json.dumps(item))
    (t,) = import_eto(single, env="alfworld")
    assert t.task_id == "7"


# --------------------------------------------------------------------------- pair builders


def _sample(task: str, actions: list[str], ret: float, *, valid: bool = True) -> Trajectory:
    msgs = [Message("system", "play"), Message("user", "start")]
    for i, a in enumerate(actions):
        msgs += [Message("assistant", f"Thought: go.\nAction: {a}", action=a, valid=valid), Message("user", f"o{i}")]
    return Trajectory(id=f"{task}-{'-'.join(actions)}-{ret}", env="e", task_id=task, messages=msgs,
                      rewards=[0.0] * (len(actions) - 1) + [ret], return_=ret)


def test_clean_self_play_pairs_the_best_with_the_worst_non_degenerate_sample() -> None:
    """"clean" removes degenerate losers, not the task: the next worst sample below the best is the loser."""
    from turnrl.data.pairs import self_play_pairs

    samples = [_sample("a", ["1"], 1.0), _sample("a", ["2"], 0.0), _sample("a", ["3", "3", "3"], -1.0),
               _sample("b", ["1"], 1.0), _sample("b", ["x"], -1.0, valid=False)]
    noisy = self_play_pairs(samples)
    assert [(p.task_id, p.rejected.return_) for p in noisy] == [("a", -1.0), ("b", -1.0)]
    stats: dict[str, int] = {}
    clean = self_play_pairs(samples, losers="clean", stats=stats)
    assert [(p.task_id, p.chosen.return_, p.rejected.return_) for p in clean] == [("a", 1.0, 0.0)]
    assert stats == {"dropped_repeated_action": 1, "dropped_invalid_action": 1, "pairs": 1}
