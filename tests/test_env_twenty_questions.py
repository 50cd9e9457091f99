"""twenty_questions and guess_my_city: the oracle's table, rewards, splits, expert, free text."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from turnrl import envs
from turnrl.agent.parsing import parse_action
from turnrl.collect import run_policy
from turnrl.envs.checker import check_env
from turnrl.envs.twenty_questions import GuessMyCity, QAGame, TwentyQuestions
from turnrl.errors import TurnRLError
from turnrl.rollout import ExpertPolicy

NAMES = ("twenty_questions", "guess_my_city")


def play_expert(env: QAGame, task_id: str, seed: int = 0) -> tuple[float, bool, int]:
    _, info = env.reset(options={"task_id": task_id})
    rng = random.Random(seed)
    total = 0.0
    for _ in range(env.max_turns):
        step = env.expert(rng)
        assert step.action in info["valid_actions"] and step.thought
        _, r, term, trunc, info = env.step(step.action)
        total += r
        if term or trunc:
            return total, bool(info["success"]), info["turn"]
    raise AssertionError("expert did not finish")


@pytest.mark.parametrize("cls", [TwentyQuestions, GuessMyCity])
def test_every_secret_has_a_distinct_answer_pattern(cls: type[QAGame]) -> None:
    env = cls()
    yes_no = [q for q in env.questions if q.yes is not None]
    for pool in ("in", "all"):
        groups: dict[tuple[bool, ...], list[str]] = defaultdict(list)
        for item in env._pool[pool]:
            groups[tuple(q.yes(item) for q in yes_no)].append(item.name)
        assert [g for g in groups.values() if len(g) > 1] == []


@pytest.mark.parametrize("cls", [TwentyQuestions, GuessMyCity])
def test_expert_always_wins_in_about_log2_n_questions(cls: type[QAGame]) -> None:
    env = cls()
    for split in ("train", "seen", "unseen"):
        results = [play_expert(env, t) for t in env.task_ids(split)]
        assert all(success for _, success, _ in results)
        assert max(turns for _, _, turns in results) <= 10
        for ret, _, turns in results:
            assert ret == -(turns - 1)


@pytest.mark.parametrize("name", NAMES)
def test_checker_passes_in_both_modes(name: str) -> None:
    assert check_env(name, episodes=4, seed=3) == []
    assert check_env(name, episodes=2, free_text=True, show_candidates=False) == []


def test_splits_hold_out_categories() -> None:
    env = TwentyQuestions()
    ids = {s: env.task_ids(s) for s in ("train", "seen", "unseen")}
    assert (len(ids["train"]), len(ids["seen"]), len(ids["unseen"])) == (54, 18, 24)
    assert not set(ids["train"]) & set(ids["seen"]) and not set(ids["train"]) & set(ids["unseen"])
    env.reset(options={"task_id": "20q-whale"})
    assert "seahorse" in env.instruction and len(env.valid_actions() or []) == 72 + 96
    env.reset(options={"task_id": "20q-dog"})
    assert "seahorse" not in env.instruction and len(env.valid_actions() or []) == 72 + 72
    groups = {it.name: it.group for it in env.items}
    assert {groups[t[4:]] for t in ids["unseen"]} == {"vehicles", "musical instruments", "sea creatures"}
    city = GuessMyCity()
    assert {it.group for it in city.items if city.task_id_of(it) in city.task_ids("unseen")} == {"Africa", "Oceania"}


def test_rewards_minus_one_per_question_zero_on_correct_guess() -> None:
    env = envs.make("twenty_questions")
    obs, info = env.reset(options={"task_id": "20q-dog"})
    assert "first question" in obs and info["questions_left"] == 20
    assert env.step("Is it an animal?")[:4] == ("Yes. 19 questions left.", -1.0, False, False)
    obs, r, term, _, info = env.step("Is it a cat?")
    assert (obs, r, term, info["kind"]) == ("No, it is not a cat. 18 questions left.", -1.0, False, "guess")
    obs, r, term, trunc, info = env.step("Is it a dog?")
    assert (r, term, trunc, info["success"], info["won"]) == (0.0, True, False, True, True)
    assert info["valid_actions"] == []
    with pytest.raises(TurnRLError, match="episode is over"):
        env.step("Is it a dog?")


def test_twenty_questions_without_the_answer_is_a_loss() -> None:
    env = envs.make("twenty_questions")
    env.reset(options={"task_id": "20q-dog"})
    total = 0.0
    for k in range(20):
        obs, r, term, trunc, info = env.step("Is it a mammal?")
        total += r
        assert term == (k == 19) and not trunc
    assert total == -20.0 and info["success"] is False and info["outcome"] == "out_of_questions"
    assert "it was a dog" in obs


def test_free_text_questions_are_understood_or_refused() -> None:
    env = envs.make("twenty_questions", free_text=True)
    _, info = env.reset(options={"task_id": "20q-shark"})
    assert "valid_actions" not in info and env.valid_actions() is None
    answers = {
        "Is it an animal?": "Yes.",
        "is it a kind of animal": "Yes.",  # loose match: every content word of "Is it an animal?"
        "Does it live in the ocean?": "Yes.",  # alias
        "Do sharks have wheels": "I can't answer that",  # "sharks" asks about another thing than "it"
        "Does it have wheels": "No.",
        "Is it a sea animal?": "I can't answer that",  # not "Is it an animal?" (answered Yes for a dog too)
        "Is it really some kind of animal?": "Yes.",  # words that qualify no question
        "Is it a mammal or a fish?": "Please ask one question at a time.",
        "What is your favourite colour?": "I can't answer that",
        "Is it a whale?": "No, it is not a whale.",
    }
    for question, start in answers.items():
        obs, r, *_ = env.step(question)
        assert obs.startswith(start) and r == -1.0, (question, obs)
    assert env.step("It is a shark.")[1:3] == (0.0, True)
    env.reset(options={"task_id": "20q-shark"})
    assert env.step("It is a shark.")[0].endswith("You found it in 1 question.")


def test_city_open_questions_and_aliases() -> None:
    env = envs.make("guess_my_city")
    env.reset(options={"task_id": "city-new-york"})
    assert env.step("What country is the city in?")[0].startswith("It is in the United States.")
    assert env.step("How many people live there?")[0].startswith("About 20 million people")
    assert env.step("Is the city in North America?")[0].startswith("Yes.")
    assert env.step("Do most people there speak Spanish?")[0].startswith("No.")
    _, r, term, _, info = env.step("Is it NYC?")
    assert (r, term, info["success"]) == (0.0, True, True)


def test_open_answers_narrow_the_expert_candidates() -> None:
    env = envs.make("guess_my_city")
    env.reset(options={"task_id": "city-lima"})
    env.step("What country is the city in?")  # Peru has one city in the table
    step = env.expert(random.Random(0))
    assert step.action == "Is it Lima?" and "Only Lima" in step.thought


def test_unknown_task_split_and_options_are_one_line_errors() -> None:
    env = envs.make("twenty_questions")
    with pytest.raises(TurnRLError, match=r"unknown task id '20q-dgo' \(did you mean '20q-dog'\?\)") as e:
        env.reset(options={"task_id": "20q-dgo"})
    assert "\n" not in str(e.value)
    with pytest.raises(TurnRLError, match="unknown split 'test'"):
        envs.make("guess_my_city").task_ids("test")
    with pytest.raises(TurnRLError, match="free_text must be true or false"):
        envs.make("guess_my_city", free_text="yes")
    with pytest.raises(TurnRLError, match="unknown option 'show_candidate'"):
        envs.make("twenty_questions", show_candidate=False)
    with pytest.raises(TurnRLError, match="call reset"):
        envs.make("twenty_questions").step("Is it a dog?")


def test_expert_replies_parse_back_to_their_actions() -> None:
    env = envs.make("twenty_questions")
    _, info = env.reset(seed=5, options={"split": "unseen"})
    step = env.expert(random.Random(1))
    reply = f"Thought: {step.thought}\nAction: {step.action}"
    assert parse_action(reply, info["valid_actions"]).action == step.action
    assert parse_action("Thought: x\nAction: is it a pair of scissors?", info["valid_actions"]).valid


@pytest.mark.parametrize("name", NAMES)
def test_expert_collection_through_the_sampler(name: str) -> None:
    for split in ("seen", "unseen"):
        trajs = run_policy(ExpertPolicy(), name, split=split, episodes=12, num_envs=4)
        assert all(t.success and t.terminated for t in trajs)
        assert all(t.return_ == -(t.num_turns - 1) for t in trajs)


@pytest.mark.parametrize(("env_name", "question", "secrets"), [
    ("twenty_questions", "Is it red or round?", ["20q-apple", "20q-orange", "20q-banana", "20q-grape"]),
    ("twenty_questions", "Is it red but not round?", ["20q-apple", "20q-banana"]),
    ("guess_my_city", "Is it on the coast or in Europe?", ["city-london", "city-paris", "city-dublin", "city-tokyo"]),
    ("guess_my_city", "Is it on the coast of the United States?", ["city-chicago", "city-new-york", "city-paris"]),
    ("guess_my_city", "Is the city in the United States and on the coast?", ["city-chicago", "city-new-york"]),
    ("guess_my_city", "Is it not in Europe?", ["city-paris", "city-tokyo"]),
    ("twenty_questions", "Is it not an animal?", ["20q-dog", "20q-apple"]),
    # "or" is a listed question's own word ("Do you eat or drink with it?"), not these questions': they were
    # answered as their one listed part ("Is it a farm animal?": No, for a dog)
    ("twenty_questions", "Is it a pet or a farm animal?", ["20q-dog", "20q-cow", "20q-apple"]),
    ("twenty_questions", "Is it an animal or a plant?", ["20q-apple", "20q-dog"]),
    ("twenty_questions", "Can it fly or swim?", ["20q-shark", "20q-apple"]),
])
def test_a_compound_question_is_refused_whatever_the_secret(env_name: str, question: str, secrets: list[str]) -> None:
    """Whether a free-text question is two questions in one is read from its words: the refusal does
    not depend on the secret (it told which part was true) and no part's answer is given for it."""
    env = envs.make(env_name, free_text=True)
    replies = set()
    for secret in secrets:
        env.reset(options={"task_id": secret})
        obs, _, _, _, info = env.step(question)
        replies.add((obs.split(".")[0], info["invalid"]))
    assert replies == {("Please ask one question at a time", True)}



@pytest.mark.parametrize(("secret", "guess"), [("city-cape-town", "Is it Cape Town, South Africa?"),
                                               ("city-paris", "Is it Paris in France?"),
                                               ("city-chicago", "Is it Chicago, United States?")])
def test_a_guess_may_name_the_citys_country(secret: str, guess: str) -> None:
    env = envs.make("guess_my_city", free_text=True)
    env.reset(options={"task_id": secret})
    _, reward, terminated, _, info = env.step(guess)
    assert terminated and reward == 0.0 and info["success"]
    env.reset(options={"task_id": "city-tokyo"})  # a wrong guess is a wrong guess, not a question
    assert env.step(guess)[0].startswith("No, it is not")


@pytest.mark.parametrize(("secret", "question"), [("20q-apple", "Is it green in color?"),
                                                  ("20q-apple", "Is it something you wear on your feet?"),
                                                  ("20q-spoon", "Do you usually eat or drink with it?")])
def test_a_paraphrase_with_a_words_of_an_alias_is_still_one_question(secret: str, question: str) -> None:
    env = envs.make("twenty_questions", free_text=True)
    env.reset(options={"task_id": secret})
    obs, _, _, _, info = env.step(question)
    assert obs.split(".")[0] in ("Yes", "No") and not info["invalid"], obs


def test_hidden_candidates_stay_hidden_after_an_invalid_reply() -> None:
    """With show_candidates=false, the error observation of an invalid reply lists the questions and the
    guess's form, not one guess per candidate (which named the secret among them)."""
    from turnrl.agent.prompting import PromptConfig
    from turnrl.collect import run_policy
    from turnrl.rollout.policies import Reply

    class Nonsense:
        name = "nonsense"

        def act(self, requests):
            return [Reply("Thought: hm.\nAction: what is it") for _ in requests]

    for shown in (False, True):
        (t,) = run_policy(Nonsense(), "twenty_questions", split="seen", episodes=1,
                          env_opts={"show_candidates": shown}, prompt=PromptConfig(invalid_action="error"))
        error = t.messages[3].content
        assert error.startswith("Invalid action: 'what is it'. Valid actions: Is it an animal?")
        assert ("Is it a <object>?" in error) is not shown
        assert (f"is it a {t.task_id.removeprefix('20q-').replace('_', ' ')}?" in error.lower()) is shown
