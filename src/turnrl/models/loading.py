"""Load a causal LM and its tokenizer from a directory or a hub id, with one-line errors.

``tiny`` names the embedded default model: it is built on first use into the cache
directory (``$TURNRL_HOME`` or ``~/.cache/turnrl``) and loaded from there like any other
model directory.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from turnrl.errors import TurnRLError

TINY = "tiny"


def turnrl_home() -> Path:
    return Path(os.environ.get("TURNRL_HOME", Path.home() / ".cache" / "turnrl"))


def _looks_local(text: str, p: Path) -> bool:
    """Whether ``text`` names a local path rather than a hub id: it starts with ``.``, ``/`` or
    ``~``, exists, has more than one ``/``, or its first component exists here (``models/nope``
    with a ``./models`` folder: a mistyped path, not the hub's ``models`` organisation; unless
    the hub cache holds ``text``, an id that happens to share a local folder's name)."""
    if text.startswith((".", "/", "~")) or p.exists() or os.sep in text and text.count("/") > 1:
        return True
    parts = Path(text).parts
    return len(parts) > 1 and Path(parts[0]).exists() and _hub_snapshot(text) is None


def _local_dir(text: str) -> Path | None:
    """The model folder ``text`` names when it looks like a path (:func:`_looks_local`), checked
    to hold a ``config.json``; None for a hub id."""
    p = Path(text).expanduser()
    if not _looks_local(text, p):
        return None
    if p.exists() and not p.is_dir():
        raise TurnRLError(f"{text}: is a file, not a model folder")
    if not p.is_dir():
        parts = Path(text).parts
        hint = ""
        if len(parts) == 2 and not text.startswith((".", "/", "~")) and Path(parts[0]).is_dir():
            hint = (f" (read as a local path because ./{parts[0]} exists; for the hub id, download it first "
                    f"with `huggingface-cli download {text}` or run from another folder)")
        raise TurnRLError(f"model path not found: {text}{hint}")
    if not (p / "config.json").is_file():
        merged, hint = p.parent / "model", ""
        if (merged / "config.json").is_file() and (p / "adapter_config.json").is_file():
            hint = f"; it is a LoRA adapter: the merged model is {merged}"
        elif (p / "adapter_config.json").is_file():
            try:
                base = json.loads((p / "adapter_config.json").read_text()).get("base_model_name_or_path")
            except (OSError, ValueError, AttributeError):
                base = None
            hint = (f"; it is a LoRA adapter{f' of {base}' if base else ''}: merge it into its base model first "
                    "(peft's merge_and_unload)")
        raise TurnRLError(f"{text}: not a model directory (no config.json){hint}")
    return p


#: Bytes read from each of :data:`_FINGERPRINT_CHUNKS` places spread over a weight file
_FINGERPRINT_BYTES = 1 << 16
_FINGERPRINT_CHUNKS = 64


def _hub_snapshot(name: str) -> Path | None:
    """The hub-cache folder of ``name``'s current revision (where its ``config.json`` is), or None."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(name, "config.json")
    except Exception:  # not a valid repo id, or no hub library: no snapshot to read
        return None
    return Path(found).parent if isinstance(found, str) else None


def model_files(name: str | Path) -> Path | None:
    """Where ``name``'s files are: the folder, or a hub id's snapshot in the hub cache; None for a
    hub id not downloaded yet (whose fingerprint is then its name's, until it is)."""
    p = Path(name)
    return p if p.is_dir() else _hub_snapshot(str(name))


def name_fingerprint(name: str | Path) -> str:
    """The fingerprint of a model known only by its name (a hub id not in the cache; before 28 Nov
    2026, every hub id)."""
    return hashlib.sha256(str(name).encode()).hexdigest()[:16]


def model_fingerprint(path: str | Path) -> str:
    """A cheap fingerprint of a model directory: file names and sizes, every file of up to 4 MiB
    whole (configs, tokenizer files, ``chat_template.jinja``), and of each larger file 64 KiB at
    each of 64 places spread from its start to its end, plus, in a safetensors file, the first
    and last 256 bytes of every tensor, so that every tensor counts (hashing a 7B checkpoint whole
    would take longer than the precomputation). A file's first bytes alone would not do:
    safetensors sorts tensors by name, so they hold the embeddings, which a LoRA fine-tune leaves
    as they were. A hub id is fingerprinted by the snapshot of it in the hub cache (the revision
    ``main`` points at), so an update under the same id is another model; an id not in the cache
    by its name alone. :func:`model_fingerprints` also gives the form used before 29 Nov 2026 (files
    of other suffixes than weights, JSON and text, such as a chat template, by name and size alone;
    a large weight file by its 64 samples alone), which episodes and checkpoints of that time record."""
    return model_fingerprints(path)[0]


def model_fingerprints(path: str | Path) -> tuple[str, str]:
    """``(model_fingerprint, the form before 29 Nov 2026)`` of ``path``, in one pass over its files."""
    p = Path(path)
    if not p.is_dir():
        snapshot = _hub_snapshot(str(path))
        if snapshot is None:
            return name_fingerprint(path), name_fingerprint(path)
        p = snapshot
    h, old = hashlib.sha256(), hashlib.sha256()
    span = _FINGERPRINT_BYTES * _FINGERPRINT_CHUNKS
    for f in sorted(p.rglob("*")):
        if not f.is_file() or f.name.startswith("."):
            continue
        # files in hidden folders are no weights: `huggingface-cli download --local-dir` keeps a
        # .cache/ there whose metadata it rewrites (a time) on every download of unchanged files.
        # The form before 29 Nov 2026 read them, as the records it made did.
        hidden = any(part.startswith(".") for part in f.relative_to(p).parts)
        size = f.stat().st_size
        for x in (old,) if hidden else (h, old):
            x.update(f"{f.relative_to(p)}:{size}".encode())
        counted_before = f.suffix in {".safetensors", ".bin", ".json", ".model", ".pt", ".txt"}
        with f.open("rb") as fh:
            if size <= span:
                data = fh.read()
                if not hidden:
                    h.update(data)
                if counted_before:
                    old.update(data)
                continue
            for k in range(_FINGERPRINT_CHUNKS):
                fh.seek((size - _FINGERPRINT_BYTES) * k // (_FINGERPRINT_CHUNKS - 1))
                data = fh.read(_FINGERPRINT_BYTES)
                if not hidden:
                    h.update(data)
                if counted_before:
                    old.update(data)
            if f.suffix == ".safetensors" and not hidden:
                for sample in _tensor_samples(fh, size):
                    h.update(sample)
    return h.hexdigest()[:16], old.hexdigest()[:16]


def _tensor_samples(fh: Any, size: int, n: int = 256) -> list[bytes]:
    """The first and last ``n`` bytes of every tensor of an open safetensors file (its header: an
    8-byte length, then JSON with each tensor's ``data_offsets``); none for a file that is not one."""
    import json

    fh.seek(0)
    length = int.from_bytes(fh.read(8), "little")
    if not 0 < length <= size - 8:
        return []
    try:
        header = json.loads(fh.read(length))
    except ValueError:
        return []
    out = []
    for name in sorted(k for k in header if k != "__metadata__"):
        offsets = header[name].get("data_offsets") if isinstance(header[name], dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2):
            continue
        start, end = 8 + length + int(offsets[0]), 8 + length + int(offsets[1])
        for at in (start, max(start, end - n)):
            fh.seek(at)
            out.append(fh.read(min(n, end - at)))
    return out


def check_model_name(name: str | Path, key: str = "model") -> None:
    """Fail early (one line naming ``key``) when ``name`` is a local path but no model folder, or,
    offline (``HF_HUB_OFFLINE``), a hub id that is not in the hub cache; ``tiny`` and other hub ids
    pass (they are resolved when loaded: checking one here would cost the hub's retries twice)."""
    if str(name) == TINY:
        try:
            _check_tiny_unambiguous()
        except TurnRLError as e:
            raise TurnRLError(f"{key}: {e}") from None
    else:
        try:
            local = _local_dir(str(name))
        except TurnRLError as e:
            raise TurnRLError(f"{key}: {e}") from None
        if local is None and model_files(name) is None and (hint := _hub_hint(name)):
            raise TurnRLError(f"{key}: cannot load '{name}'{hint}; download it first or give a model folder")


def resolve_model_path(name: str | Path) -> str:
    """A local directory, ``tiny`` (built on demand), or a hub id (validated by loading).

    A value that looks like a path (starts with ``.``, ``/`` or ``~``, exists, or its first
    component exists: ``models/nope`` where ``./models`` is a folder) must be a
    directory holding a ``config.json``; anything else is passed to transformers as a hub id.
    """
    text = str(name)
    if text == TINY:
        from turnrl.models.tiny import ensure_tiny

        _check_tiny_unambiguous()
        return str(ensure_tiny())
    p = _local_dir(text)
    return text if p is None else str(p)


def model_ref(path: str | Path) -> str:
    """A model folder's path as a model name: ``./tiny`` for a folder ``tiny`` in the working folder
    (a run's ``OUT/tiny`` with ``OUT`` = ``.``), as ``tiny`` alone names the embedded model."""
    text = str(path)
    return f"./{TINY}" if text == TINY else text


def _check_tiny_unambiguous() -> None:
    """``tiny`` names the embedded model; a ``./tiny`` here (``turnrl model init-tiny --out tiny``, a
    pipeline's ``OUT/tiny`` when run from OUT) would be silently passed over for it: one line instead."""
    if Path(TINY).exists():
        raise TurnRLError(f"'{TINY}' names the embedded model, and there is a ./{TINY} here too: write ./{TINY} for "
                          "that folder, or run from another folder for the embedded model")


def _load_hint(name: str | Path) -> str:
    """What a failed load adds: where an offline hub id was looked for, or for a hub id with the hub
    online, that a machine without network fails only after the hub's retries."""
    hint = _hub_hint(name)
    if hint or str(name) == TINY or _looks_local(str(name), Path(str(name)).expanduser()):
        return hint
    return f" (hub id '{name}': without network this fails after the hub's retries; set HF_HUB_OFFLINE=1 to fail at once)"


def _message(e: BaseException, limit: int = 300) -> str:
    """An exception's message on one line (its lines joined by "; "), cut at ``limit`` characters."""
    text = "; ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _hub_hint(name: str | Path) -> str:
    """Where an offline hub id was looked for (the usual cause of a failed load without network)."""
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - a transformers dependency
        return ""
    if not constants.HF_HUB_OFFLINE or str(name) == TINY or Path(str(name)).expanduser().exists():
        return ""
    return f" (offline: hub id '{name}' is not in the hub cache {constants.HF_HUB_CACHE})"


def load_tokenizer(name: str | Path) -> Any:
    from transformers import AutoTokenizer

    path = resolve_model_path(name)
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except _config_errors() as e:
        raise TurnRLError(f"cannot load tokenizer '{name}': {_message(e)}{_load_hint(name)}") from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.unk_token
    return tok


def training_dtype(mixed_precision: str, lora: bool) -> str:
    """The dtype to load a model in for training under ``mixed_precision`` (``no``, ``bf16``, ``fp16``).

    Full fine-tuning keeps float32 master weights and lets accelerate's autocast run the
    matrix products in half precision (the usual AMP recipe): weights stored in bf16 would
    round an AdamW update of about ``lr`` away wherever ``|w| * 2**-9 > lr`` -- with lr 1e-5,
    every weight above 0.005. With LoRA only the adapters train (peft keeps them in float32),
    so on a GPU the frozen base loads in half precision to save memory. Under DeepSpeed
    (``ACCELERATE_USE_DEEPSPEED``), whose engine keeps its own float32 master copy and runs the
    model in half precision without autocast, the model loads in half precision too, so that
    a reference computed before the engine wraps it matches the policy's precision."""
    import os

    import torch

    half = {"bf16": "bfloat16", "fp16": "float16"}.get(mixed_precision)
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true")
    return half if half is not None and (deepspeed or lora and torch.cuda.is_available()) else "float32"


def _config_errors() -> tuple[type[BaseException], ...]:
    """What loading raises for a folder it cannot read: OSError and ValueError, and huggingface_hub's
    validation error of a config whose values do not fit together (``hidden_size`` not a multiple
    of the heads), which is neither."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # an older huggingface_hub: its checks raise ValueError
        return (OSError, ValueError)
    return (OSError, ValueError, StrictDataclassError)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def load_model(name: str | Path, *, dtype: str = "auto", device: str | None = None) -> Any:
    """``AutoModelForCausalLM`` in ``dtype`` on ``device`` (``None``: left on the CPU for a
    trainer to place). ``auto``: bf16 when ``device`` is a bf16-capable GPU, else float32 --
    never bf16 on the CPU, where it is slow and only rounds."""
    import torch
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(name)
    if dtype == "auto":
        on_gpu = device is not None and str(device).startswith("cuda") and torch.cuda.is_available()
        torch_dtype = torch.bfloat16 if on_gpu and torch.cuda.is_bf16_supported() else torch.float32
    else:
        dtypes = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                  "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
        if dtype not in dtypes:
            raise TurnRLError(f"unknown dtype '{dtype}'; choose from: auto, {', '.join(dtypes)}")
        torch_dtype = dtypes[dtype]
    from safetensors import SafetensorError

    gen = Path(path) / "generation_config.json"
    if gen.is_file():  # transformers drops a broken one with a warning, and with it the stop ids it names
        try:
            json.loads(gen.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise TurnRLError(f"cannot load model '{name}': {gen}: not valid JSON ({_first_line(e)})") from None
    try:
        loaded: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, output_loading_info=True)
        model, info = loaded
    except _config_errors() as e:
        raise TurnRLError(f"cannot load model '{name}': {_first_line(e)}{_load_hint(name)}") from None
    except (SafetensorError, RuntimeError) as e:  # a cut weight file; a config.json the weights do not fit
        if isinstance(e, getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)):  # torch < 2.5: cuda's
            raise
        raise TurnRLError(f"cannot load model '{name}': {_first_line(e)} (is the folder complete?)") from None
    # transformers fills weights the files lack with random values and only warns (which the CLI silences)
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise TurnRLError(f"cannot load model '{name}': its weight files lack {len(missing)} tensor(s) ({shown}), "
                          "which would start random; is the folder complete?")
    if device is not None:
        from turnrl.devices import check_device

        model.to(check_device(device))
    return model


def first_position_is_blind(backbone: Any, tokenizer: Any) -> bool:
    """Whether ``backbone``'s first position does not read the rest of a text (a causal model: the
    ``tiny`` one, any causal LM), so that pooling it would encode every text of the same first token
    alike. Tried on two texts that share their first token (a role prefix, or a [CLS] / <s>), not read
    from the config; False when the tokenizer gives no such pair."""
    import torch

    a, b = ([int(i) for i in tokenizer(t, add_special_tokens=True)["input_ids"]]
            for t in ("user: the first of two texts, X . O", "user: another one, . . . / . X ."))
    if len(a) < 2 or len(b) < 2 or a[0] != b[0] or a == b:
        return False
    device = next(backbone.parameters()).device
    was = backbone.training
    backbone.eval()  # no dropout: the same first position gives the same vector
    try:
        with torch.no_grad():
            first = [backbone(input_ids=torch.tensor([ids], device=device),
                              attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=device)
                              ).last_hidden_state[0, 0].float() for ids in (a, b)]
    finally:
        backbone.train(was)
    return bool(torch.allclose(first[0], first[1], rtol=1e-5, atol=1e-6))
