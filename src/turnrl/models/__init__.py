"""Models: the embedded ``tiny`` model and loading of any model directory or hub id."""

from turnrl.models.loading import load_model, load_tokenizer, resolve_model_path

__all__ = ["load_model", "load_tokenizer", "resolve_model_path"]
