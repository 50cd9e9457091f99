"""The vLLM engine: configuration and the vLLM <-> turnrl mapping on CPU with a fake ``vllm``
module; the real engine against the HF engine under the ``gpu`` marker."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from turnrl.cli import main
from turnrl.collect import run_policy
from turnrl.errors import TurnRLError
from turnrl.rollout import HFEngine, SamplingConfig, load_policy
from turnrl.rollout.vllm_engine import VLLMEngine, import_vllm, sampling_params, to_generation

# ------------------------------------------------------------------------- a fake vllm


class FakeSamplingParams:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


@dataclass
class FakeLogprob:
    logprob: float
    rank: int = 1


@dataclass
class FakeCompletion:
    token_ids: list[int]
    logprobs: list[dict[int, FakeLogprob]] | None
    finish_reason: str = "stop"


@dataclass
class FakeOutput:
    outputs: list[FakeCompletion]


@dataclass
class FakeLoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str


@dataclass
class FakeModel:
    loaded: list[tuple[str, Any]] = field(default_factory=list)

    def load_weights(self, weights: Any) -> None:
        self.loaded.extend(weights)


class FakeLLM:
    """Answers like vLLM, computing greedy completions with an HF engine (the tiny model)."""

    instances: list[FakeLLM] = []
    hf: HFEngine | None = None

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.calls: list[dict[str, Any]] = []
        self.resets = 0
        self.inner = FakeModel()
        self.llm_engine = types.SimpleNamespace(model_executor=types.SimpleNamespace(
            driver_worker=types.SimpleNamespace(model_runner=types.SimpleNamespace(model=self.inner))))
        FakeLLM.instances.append(self)

    def generate(self, inputs: list[dict], params: Any, use_tqdm: bool = True, lora_request: Any = None) -> list:
        self.calls.append({"inputs": inputs, "params": params, "lora_request": lora_request})
        assert FakeLLM.hf is not None
        first = params[0] if isinstance(params, list) else params
        cfg = SamplingConfig(temperature=first.kwargs["temperature"], max_new_tokens=first.kwargs["max_tokens"])
        gens = FakeLLM.hf.generate([x["prompt_token_ids"] for x in inputs], cfg)
        outs = []
        for g in gens:
            # vLLM's shape: a dict per token holding (at least) the chosen token's Logprob
            logprobs = [{t: FakeLogprob(lp)} for t, lp in zip(g.token_ids, g.logprobs, strict=True)]
            outs.append(FakeOutput([FakeCompletion(list(g.token_ids), logprobs,
                                                   "stop" if g.finished else "length")]))
        return outs

    def reset_prefix_cache(self) -> None:
        self.resets += 1


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    mod = types.ModuleType("vllm")
    mod.LLM = FakeLLM  # type: ignore[attr-defined]
    mod.SamplingParams = FakeSamplingParams  # type: ignore[attr-defined]
    lora = types.ModuleType("vllm.lora")
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = FakeLoRARequest  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", mod)
    monkeypatch.setitem(sys.modules, "vllm.lora", lora)
    monkeypatch.setitem(sys.modules, "vllm.lora.request", request)
    FakeLLM.instances = []
    return mod


# ------------------------------------------------------------------------- CPU tests


def test_missing_vllm_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch, tiny_dir: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(TurnRLError, match=r"engine=vllm needs the vllm package.*pip install 'turnrl\[vllm\]'"):
        import_vllm()
    with pytest.raises(TurnRLError, match="needs the vllm package"):
        load_policy(str(tiny_dir), engine="vllm")
    with pytest.raises(SystemExit) as e:
        main(["collect", "--env", "tictactoe", "--policy", str(tiny_dir), "--out", str(tmp_path / "x.jsonl"),
              "--engine", "vllm", "--episodes", "1"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: engine=vllm needs the vllm package") and "Traceback" not in err
    assert not (tmp_path / "x.jsonl").exists()


def test_unknown_engine_is_an_error(tiny_dir: Path) -> None:
    with pytest.raises(TurnRLError, match="unknown engine 'vlm' \\(did you mean 'vllm'\\?\\)"):
        load_policy(str(tiny_dir), engine="vlm")
    assert load_policy("expert", engine="vllm").name == "expert"  # scripted policies have no engine
    # only the hf engine reads ``device``: vLLM ran on its own default GPU whatever was asked
    with pytest.raises(TurnRLError, match=r"^device=cuda:1 is read by engine=hf only; engine=vllm places the model"):
        load_policy(str(tiny_dir), engine="vllm", device="cuda:1")


def test_sampling_config_becomes_sampling_params(fake_vllm: types.ModuleType) -> None:
    greedy = sampling_params(fake_vllm, SamplingConfig(temperature=0.0, top_p=0.5, max_new_tokens=7), [3, 9],
                             seed=11)
    assert greedy.kwargs == {"n": 1, "temperature": 0.0, "top_p": 1.0, "max_tokens": 7, "stop_token_ids": [3, 9],
                             "logprobs": 0, "detokenize": False, "skip_special_tokens": False}
    sampled = sampling_params(fake_vllm, SamplingConfig(temperature=0.7, top_p=0.9, max_new_tokens=32), [3],
                              seed=11)
    assert sampled.kwargs["temperature"] == 0.7 and sampled.kwargs["top_p"] == 0.9
    assert sampled.kwargs["max_tokens"] == 32 and sampled.kwargs["seed"] == 11 and sampled.kwargs["logprobs"] == 0


def test_vllm_outputs_become_generations() -> None:
    stops = [2, 5]
    lp = [-0.1, -0.2, -0.3, -0.4]
    stopped = FakeOutput([FakeCompletion([7, 8, 5, 9], [{t: FakeLogprob(x), 1: FakeLogprob(-9.0)}
                                                         for t, x in zip([7, 8, 5, 9], lp, strict=True)])])
    g = to_generation(stopped, stops)
    assert (g.token_ids, g.logprobs, g.finished) == ([7, 8, 5], [-0.1, -0.2, -0.3], True)
    ran_out = FakeOutput([FakeCompletion([7, 8, 9], [{7: FakeLogprob(-1.0)}, {8: FakeLogprob(-2.0)},
                                                     {9: FakeLogprob(-3.0)}], "length")])
    g = to_generation(ran_out, stops)
    assert (g.token_ids, g.logprobs, g.finished) == ([7, 8, 9], [-1.0, -2.0, -3.0], False)
    assert to_generation(FakeOutput([FakeCompletion([4], [{4: -0.5}])]), stops).logprobs == [-0.5]  # type: ignore[dict-item]
    with pytest.raises(TurnRLError, match="no log-probs"):
        to_generation(FakeOutput([FakeCompletion([4], None)]), stops)
    with pytest.raises(TurnRLError, match="no log-prob for the sampled token 4"):
        to_generation(FakeOutput([FakeCompletion([4], [{6: FakeLogprob(-1.0)}])]), stops)


def test_engine_vllm_gives_the_hf_engine_trajectories(fake_vllm: types.ModuleType, tiny_dir: Path) -> None:
    """With the fake vllm answering from the same model, `engine=vllm` rollouts (prompt ids,
    stop handling, log-probs, decoding) match `engine=hf` exactly."""
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=24)
    # on the CPU: the comparison is to the bit, and on a GPU the same tokens computed in other
    # batches come out with other roundings (one H100 run in two differed)
    hf = load_policy(str(tiny_dir), sampling=sampling, device="cpu")
    # the fake answers each call with a full prefill; the hf rollout's turns would reuse their last
    # turn's cache, which rounds the same logits otherwise in the last bits
    hf.engine.reuse_turns = False  # type: ignore[attr-defined]
    FakeLLM.hf = hf.engine  # type: ignore[attr-defined]
    vl = load_policy(str(tiny_dir), sampling=sampling, engine="vllm", engine_opts={"llm_kwargs": {"max_model_len": 512}})
    assert isinstance(vl.engine, VLLMEngine)  # type: ignore[attr-defined]
    llm = FakeLLM.instances[-1]
    assert llm.kwargs["model"] == str(tiny_dir) and llm.kwargs["enable_prefix_caching"] is True
    assert llm.kwargs["logprobs_mode"] == "raw_logprobs" and llm.kwargs["max_model_len"] == 512
    assert set(vl.engine.stop_token_ids) == set(hf.engine.stop_token_ids)  # type: ignore[attr-defined]
    a = run_policy(hf, "tictactoe", episodes=4, num_envs=4, seed=3)
    b = run_policy(vl, "tictactoe", episodes=4, num_envs=4, seed=3)
    assert [t.to_dict() for t in a] == [t.to_dict() for t in b]
    assert any(m.token_ids for m in b[0].messages if m.role == "assistant")
    params = llm.calls[0]["params"]
    assert params.kwargs["temperature"] == 0.0 and params.kwargs["stop_token_ids"] == vl.engine.stop_token_ids  # type: ignore[attr-defined]


def test_weight_sync_reload_and_lora_swap(fake_vllm: types.ModuleType, tiny_dir: Path, tmp_path: Path) -> None:
    engine = VLLMEngine(str(tiny_dir), [2])
    llm = FakeLLM.instances[-1]
    n = engine.load_weights(tiny_dir)  # a saved model directory
    from safetensors.torch import load_file

    saved = load_file(str(tiny_dir / "model.safetensors"))
    assert n == len(saved) and dict(llm.inner.loaded).keys() == saved.keys() and llm.resets == 1
    # a PPO model of before 30 Nov 2026 keeps its value head beside the weights: not a weight of the model
    import shutil

    from safetensors.torch import save_file

    old_ppo = tmp_path / "old-ppo"
    shutil.copytree(tiny_dir, old_ppo)
    save_file({"weight": torch.zeros(1, 4), "bias": torch.zeros(1)}, str(old_ppo / "value_head.safetensors"))
    llm.inner.loaded.clear()
    assert engine.load_weights(old_ppo) == len(saved) and dict(llm.inner.loaded).keys() == saved.keys()
    llm.inner.loaded.clear()
    engine.load_weights({"lm_head.weight": torch.zeros(2)})  # a state dict
    assert [k for k, _ in llm.inner.loaded] == ["lm_head.weight"] and llm.resets == 3

    with pytest.raises(TurnRLError, match="not a LoRA adapter directory"):
        engine.set_lora(tmp_path)
    FakeLLM.hf = HFEngine(*_model_and_tok(tiny_dir), [2])
    ids = []
    for k in range(2):
        adapter = tmp_path / f"adapter{k}"
        adapter.mkdir()
        (adapter / "adapter_config.json").write_text(json.dumps({"r": 8}))
        engine.set_lora(adapter)
        engine.generate([[5, 6, 7]], SamplingConfig(temperature=0.0, max_new_tokens=2))
        req = llm.calls[-1]["lora_request"]
        assert req.lora_path == str(adapter.resolve())
        ids.append(req.lora_int_id)
    assert ids == [1, 2]  # a new adapter, a new id: no stale cached adapter is served
    engine.set_lora(None)
    engine.generate([[5, 6, 7]], SamplingConfig(temperature=1.0, max_new_tokens=2))
    assert llm.calls[-1]["lora_request"] is None
    seeds = [p.kwargs["seed"] for p in llm.calls[-1]["params"]]
    assert len(seeds) == 1  # sampling: one seeded SamplingParams per prompt
    engine.generate([[5, 6, 7], [5, 6]], SamplingConfig(temperature=1.0, max_new_tokens=2), seeds=[11, 12])
    assert [p.kwargs["seed"] for p in llm.calls[-1]["params"]] == [11, 12]  # the sampler's keyed seeds
    with pytest.raises(ValueError, match="1 seeds for 2 prompts"):
        engine.generate([[5, 6, 7], [5, 6]], SamplingConfig(temperature=1.0, max_new_tokens=2), seeds=[11])


def _model_and_tok(tiny_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_dir), AutoTokenizer.from_pretrained(tiny_dir)


# ------------------------------------------------------------------------- GPU test

_HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and _HAS_VLLM), reason="needs a CUDA GPU and vllm")
def test_real_vllm_engine_matches_hf_greedy(tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from turnrl.tokenization import ChatFormat

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).to("cuda")  # type: ignore[arg-type]
    chat = ChatFormat(tok)
    hf = HFEngine(model, tok, chat.stop_token_ids)
    vl = VLLMEngine(str(tiny_dir), chat.stop_token_ids, dtype="float32",
                    llm_kwargs={"gpu_memory_utilization": 0.2, "max_model_len": 1024, "enforce_eager": True})
    from turnrl.data.schema import Message

    prompts = [chat.prompt_ids([Message("system", "You play tic-tac-toe."), Message("user", f"Board {i}")])
               for i in range(6)]
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=16)
    a, b = hf.generate(prompts, greedy), vl.generate(prompts, greedy)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.finished for g in a] == [g.finished for g in b]
    for x, y in zip(a, b, strict=True):
        assert all(math.isclose(p, q, abs_tol=2e-2) for p, q in zip(x.logprobs, y.logprobs, strict=True))
    # weight sync: zero the (tied) embeddings in place; every token then has log-prob -log(V)
    state = {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    state["model.embed_tokens.weight"] = torch.zeros_like(state["model.embed_tokens.weight"])
    vl.load_weights(state)
    out = vl.generate(prompts[:1], greedy)[0]
    assert out.logprobs[0] == pytest.approx(-math.log(model.config.vocab_size), abs=1e-3)
