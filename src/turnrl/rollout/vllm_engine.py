"""The vLLM generation engine: the :class:`~turnrl.rollout.engine.Engine` interface on GPUs.

Same contract as :class:`~turnrl.rollout.engine.HFEngine`: prompts go in as token id lists
(built by :class:`~turnrl.tokenization.ChatFormat`), and for each one the sampled token ids
come back up to and including the first stop token, with the log-probability of every
sampled token under the model's own distribution (temperature 1, no top-p: vLLM's
``logprobs_mode="raw_logprobs"``), which is what training computes. Temperature 0 is greedy.
Prefix caching is on, so the growing conversations of a multi-turn rollout reuse the
KV cache of their earlier turns.

Weights follow the trainer between iterations in one of two ways:

- :meth:`VLLMEngine.load_weights` loads a state dict (or a saved model directory, e.g. the
  trainer's ``out_dir/model``) into the running engine in place, then drops the prefix cache;
- :meth:`VLLMEngine.set_lora` serves a LoRA adapter directory (the trainer's
  ``out_dir/adapter``) through a ``LoRARequest``; the base weights stay, each new adapter
  gets a fresh id so no stale cache is reused.

vLLM is an optional extra (``pip install 'turnrl[vllm]'``, Linux + CUDA); it is imported
when an engine is built, and a missing install is a one-line error.

With temperature > 0 each request gets its own seed: ``generate``'s ``seeds`` (the sampler's
per-episode, per-turn seeds) or, without them, the next of a counter started at ``seed``.

Departures from :class:`HFEngine`: sampling draws from vLLM's kernels, so with temperature
> 0 the samples differ from HF's for the same seed (greedy decoding agrees up to
floating-point ties); a request stopped by ``max_new_tokens`` reports ``finished=False``
exactly as HF does.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from turnrl.errors import TurnRLError
from turnrl.rollout.engine import Generation, SamplingConfig, cut_at_stop, row_seeds

ENGINES = ("hf", "vllm")


def import_vllm() -> Any:
    """The ``vllm`` module, or a one-line :class:`TurnRLError` saying how to get it."""
    mod = sys.modules.get("vllm")
    if mod is not None:
        return mod
    try:
        import vllm
    except ImportError as e:
        raise TurnRLError(
            f"engine=vllm needs the vllm package ({e}); install it with `pip install 'turnrl[vllm]'` "
            "on a Linux machine with a CUDA GPU, or use engine=hf"
        ) from None
    return vllm


def sampling_params(vllm: Any, sampling: SamplingConfig, stop_token_ids: Sequence[int], *,
                    seed: int | None = None) -> Any:
    """vLLM ``SamplingParams`` for ``sampling``: one sample, the chosen token's log-prob only
    (``logprobs=0``), stop at ``stop_token_ids``, no detokenization (the policy decodes)."""
    greedy = sampling.temperature <= 0
    kwargs: dict[str, Any] = {
        "n": 1,
        "temperature": 0.0 if greedy else float(sampling.temperature),
        "top_p": 1.0 if greedy else float(sampling.top_p),
        "max_tokens": int(sampling.max_new_tokens),
        "stop_token_ids": list(stop_token_ids),
        "logprobs": 0,
        "detokenize": False,
        "skip_special_tokens": False,
    }
    if seed is not None and not greedy:
        kwargs["seed"] = int(seed)
    return vllm.SamplingParams(**kwargs)


def _logprob_value(entry: Any) -> float:
    """A ``Logprob`` object (``.logprob``) or a bare float."""
    value = getattr(entry, "logprob", entry)
    return float(value)


def to_generation(output: Any, stop_token_ids: Iterable[int]) -> Generation:
    """One vLLM ``RequestOutput`` (its first completion) as a :class:`Generation`.

    The tokens are cut after the first stop token (inclusive; vLLM keeps a stop token id in
    ``token_ids`` and trims only the text), as :class:`HFEngine` does; ``finished`` is True
    when a stop token ended the sample, False when ``max_tokens`` ran out."""
    completion = output.outputs[0]
    ids = [int(t) for t in completion.token_ids]
    per_token = completion.logprobs
    if per_token is None:
        raise TurnRLError("vLLM returned no log-probs: the engine must request logprobs=0")
    logps: list[float] = []
    for tok, entry in zip(ids, per_token, strict=False):
        if isinstance(entry, Mapping):
            chosen = entry.get(tok)
            if chosen is None:  # only top-k alternatives came back: should not happen with logprobs=0
                raise TurnRLError(f"vLLM returned no log-prob for the sampled token {tok}")
            logps.append(_logprob_value(chosen))
        else:
            logps.append(_logprob_value(entry))
    if len(logps) != len(ids):
        raise TurnRLError(f"vLLM returned {len(logps)} log-probs for {len(ids)} tokens")
    return cut_at_stop(ids, logps, stop_token_ids)


class VLLMEngine:
    """Batched sampling with vLLM (``LLM.generate`` on token-id prompts); see the module doc.

    ``llm`` may be given (tests pass a fake; callers may share one engine); otherwise one is
    built from ``model`` with prefix caching on and ``llm_kwargs`` passed through
    (``gpu_memory_utilization``, ``max_model_len``, ``tensor_parallel_size``, ...). ``lora``
    enables adapter serving with adapters of rank up to ``max_lora_rank``.
    """

    def __init__(self, model: str, stop_token_ids: Sequence[int], *, llm: Any = None, lora: bool = False,
                 max_lora_rank: int = 64, dtype: str = "auto", seed: int = 0,
                 llm_kwargs: dict[str, Any] | None = None):
        self.vllm = import_vllm()
        self.model = str(model)
        self.stop_token_ids = list(stop_token_ids)
        self.seed = seed
        self.calls = 0
        self._lora_request: Any = None
        self._lora_ids = itertools.count(1)
        self._request_seeds = itertools.count(seed * 1_000_003)
        if llm is None:
            # in-process weight reload reaches into the engine's model: keep it in this process
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            kwargs: dict[str, Any] = {"model": self.model, "dtype": dtype, "seed": seed,
                                      "enable_prefix_caching": True, "logprobs_mode": "raw_logprobs"}
            if lora:
                kwargs.update(enable_lora=True, max_lora_rank=max_lora_rank)
            kwargs.update(llm_kwargs or {})
            try:
                llm = self.vllm.LLM(**kwargs)
            except TypeError as e:
                if "logprobs_mode" not in str(e):
                    raise
                kwargs.pop("logprobs_mode")  # older vLLM has no such option (its log-probs may be processed ones)
                llm = self.vllm.LLM(**kwargs)
        self.llm = llm

    # ---------------------------------------------------------------------------- generate

    def sampling_params(self, sampling: SamplingConfig) -> Any:
        return sampling_params(self.vllm, sampling, self.stop_token_ids, seed=None)

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig,
                 seeds: Sequence[int] | None = None) -> list[Generation]:
        if not prompts:
            return []
        self.calls += 1
        if sampling.temperature > 0:  # one seed per request: reproducible, independent of batching
            keyed = row_seeds(seeds, len(prompts)) if seeds is not None else [next(self._request_seeds) for _ in prompts]
            params = [sampling_params(self.vllm, sampling, self.stop_token_ids, seed=s) for s in keyed]
        else:
            params = self.sampling_params(sampling)
        inputs = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts]
        kwargs: dict[str, Any] = {"use_tqdm": False}
        if self._lora_request is not None:
            kwargs["lora_request"] = self._lora_request
        outputs = self.llm.generate(inputs, params, **kwargs)
        return [to_generation(o, self.stop_token_ids) for o in outputs]

    # ---------------------------------------------------------------------------- weights

    def load_weights(self, weights: str | Path | Mapping[str, Any] | Iterable[tuple[str, Any]]) -> int:
        """Load new weights in place: a state dict, ``(name, tensor)`` pairs, or a saved model
        directory (``*.safetensors``). Drops the prefix cache. Returns the number of tensors."""
        if isinstance(weights, (str, Path)):
            pairs = list(_read_model_dir(Path(weights)))
        elif isinstance(weights, Mapping):
            pairs = list(weights.items())
        else:
            pairs = list(weights)
        model = _inner_model(self.llm)
        if model is not None:
            model.load_weights(pairs)
        else:  # no in-process handle (multiprocessing engine): run it on the workers
            self.llm.collective_rpc(_load_weights_on_worker, args=(pairs,))
        self.reset_prefix_cache()
        return len(pairs)

    def set_lora(self, adapter_dir: str | Path | None, name: str | None = None) -> None:
        """Serve the LoRA adapter in ``adapter_dir`` (``None``: the base model). The engine must
        have been built with ``lora=True``."""
        if adapter_dir is None:
            self._lora_request = None
            return
        path = Path(adapter_dir)
        if not (path / "adapter_config.json").is_file():
            raise TurnRLError(f"{path}: not a LoRA adapter directory (no adapter_config.json)")
        from vllm.lora.request import LoRARequest

        lora_id = next(self._lora_ids)
        self._lora_request = LoRARequest(name or f"adapter-{lora_id}", lora_id, str(path.resolve()))
        self.reset_prefix_cache()

    def reset_prefix_cache(self) -> None:
        reset = getattr(self.llm, "reset_prefix_cache", None)
        if reset is not None:
            reset()


def _inner_model(llm: Any) -> Any:
    """The torch model inside an in-process vLLM engine, or None."""
    try:
        return llm.llm_engine.model_executor.driver_worker.model_runner.model
    except AttributeError:
        return None


def _load_weights_on_worker(worker: Any, pairs: list[tuple[str, Any]]) -> None:  # pragma: no cover - GPU
    worker.model_runner.model.load_weights(pairs)


def _read_model_dir(path: Path) -> Iterable[tuple[str, Any]]:
    """The weights of a ``save_pretrained`` folder: the files its index names, else ``model*.safetensors``
    (a PPO model of before 30 Nov 2026 keeps its value head beside them, in ``value_head.safetensors``)."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted({path / f for f in json.loads(index.read_text())["weight_map"].values()})
    else:
        files = sorted(path.glob("model*.safetensors"))
    if not files:
        raise TurnRLError(f"{path}: no *.safetensors weights to load into the vLLM engine")
    from safetensors.torch import load_file

    for f in files:
        yield from load_file(str(f)).items()
