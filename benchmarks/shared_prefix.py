"""k samples per prompt: turnrl's HF engine (each prompt prefilled once, its KV cache
repeated k times) vs ``transformers``' ``generate`` on the prompts expanded k times (what
``num_return_sequences=k`` does: each prompt prefilled k times).

This is the sampling of CHAI (k candidate replies per state), Best-of-N and SPPO (K samples
per task). Both sides run the same model on the same prompts with the same sampling
settings; HF expands the prompts the same way (each prompt's copies next to each other), and
both draw row i from the same seeded stream (turnrl's ``RowDraws`` logits processor, which the
engine uses, is passed to the peer's ``generate``), so both sample the same tokens, which the
script checks. A middle side, the engine with ``preallocate=False`` (its KV caches growing by
concatenation, as the peer's do), tells the shared prefill's gain from the preallocated caches'
(:mod:`turn_cache` measures the latter on its own).

    python benchmarks/shared_prefix.py [--model DIR] [--prompts 16] [--k 5] [--prompt-tokens 600]
                                       [--new-tokens 48] [--repeats 3]

Time is the process's CPU time on a CPU (run with ``OMP_NUM_THREADS=1``: on a shared machine
wall time mostly measures the other jobs) and wall time on a GPU. The last line is one JSON
object with ``ratio`` = peer time / turnrl time (above 1: turnrl is faster) and
``ratio_shared_prefill`` = peer time / the middle side's time (the shared prefill alone).
"""

from __future__ import annotations

import argparse
import json

import torch
from _common import clock, model_or_tiny, positive, run_main  # beside this script

from turnrl.models.loading import load_model, load_tokenizer
from turnrl.rollout.engine import HFEngine, RowDraws, SamplingConfig, _left_pad, row_uniforms
from turnrl.tokenization import ChatFormat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model directory (default: a fresh tiny model)")
    ap.add_argument("--prompts", type=positive, default=16)
    ap.add_argument("--k", type=positive, default=5)
    ap.add_argument("--prompt-tokens", type=positive, default=600,
                    help="the longest prompt; the others are up to 49 tokens shorter (at least 1)")
    ap.add_argument("--new-tokens", type=positive, default=48)
    ap.add_argument("--repeats", type=positive, default=3)
    args = ap.parse_args()
    model_dir = model_or_tiny(args.model)
    cuda = torch.cuda.is_available()
    model = load_model(model_dir, device="cuda" if cuda else "cpu").eval()  # bf16 on a GPU
    tok = load_tokenizer(model_dir)
    chat = ChatFormat(tok)
    gen = torch.Generator().manual_seed(0)
    special = set(tok.all_special_ids)
    vocab = [i for i in range(len(tok)) if i not in special]
    # prompts of slightly different lengths, so that left padding is exercised
    prompts = [[vocab[int(j)] for j in torch.randint(len(vocab), (max(1, args.prompt_tokens - 7 * i % 50),),
                                                     generator=gen)]
               for i in range(args.prompts)]
    # no stop token: every row generates ``new_tokens``, on both sides
    engine = HFEngine(model, tok, stop_token_ids=[], share_prefix=True)
    engine.pad_id = int(tok.pad_token_id if tok.pad_token_id is not None else chat.stop_token_ids[0])
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.new_tokens)
    width = max(len(p) for p in prompts)
    ids, attn = _left_pad(prompts, width, engine.pad_id)
    device = next(model.parameters()).device

    seeds = list(range(len(prompts) * args.k))  # row i of both sides: prompt i // k, stream i

    def turnrl_side(preallocate: bool = True) -> list[list[int]]:
        engine.preallocate = preallocate
        expanded = [p for p in prompts for _ in range(args.k)]
        return [g.token_ids for g in engine.generate(expanded, sampling, seeds=seeds)]

    @torch.inference_mode()
    def hf_side() -> list[list[int]]:
        draws = RowDraws(row_uniforms(seeds, args.new_tokens), width, sampling)
        # the prompts expanded k times, as num_return_sequences=k does (which greedy generate, the mode
        # the row draws ride on, refuses)
        out = model.generate(input_ids=ids.repeat_interleave(args.k, 0).to(device),
                             attention_mask=attn.repeat_interleave(args.k, 0).to(device), do_sample=False,
                             temperature=None, top_p=None, top_k=None, max_new_tokens=args.new_tokens,
                             min_new_tokens=args.new_tokens, pad_token_id=engine.pad_id, eos_token_id=None,
                             logits_processor=[draws])
        return out[:, width:].tolist()

    sides = (("turnrl", turnrl_side), ("turnrl-grow", lambda: turnrl_side(preallocate=False)), ("hf", hf_side))
    times: dict[str, list[float]] = {name: [] for name, _ in sides}
    same = True
    for rep in range(args.repeats + 1):  # the first round warms up and is not timed
        samples = {}
        for name, fn in sides:
            torch.manual_seed(rep)
            t0 = clock(cuda)
            samples[name] = fn()
            dt = clock(cuda) - t0
            if rep:
                times[name].append(dt)
        same = same and samples["turnrl"] == samples["hf"] == samples["turnrl-grow"]
    best = {name: min(ts) for name, ts in times.items()}
    rows = len(prompts) * args.k
    for name in best:
        print(f"{name:11s} {best[name]:8.3f} s  {rows * args.new_tokens / best[name]:9.1f} generated tokens/s")
    result = {"benchmark": "shared_prefix", "device": "cuda" if cuda else "cpu",
              "clock": "wall" if cuda else "cpu", "prompts": len(prompts), "k": args.k,
              "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
              "turnrl_s": round(best["turnrl"], 3), "hf_s": round(best["hf"], 3),
              "turnrl_grow_s": round(best["turnrl-grow"], 3), "ratio": round(best["hf"] / best["turnrl"], 3),
              "ratio_shared_prefill": round(best["hf"] / best["turnrl-grow"], 3), "same_samples": same}
    print(json.dumps(result))


if __name__ == "__main__":
    run_main(main)
