"""Hugging Face checkpoint importer: config.json + safetensors + tokenizer -> a Plan.

Owns only the entry point: reading ``config.json`` and ``generation_config.json`` and
handing the checkpoint to the module of its ``model_type`` (``registry.py``; each
``arch/<model_type>.py`` owns its config keys, checks and tensor map, on top of
``base.py``, ``decoder.py`` and ``blocks.py``).

Refuses, with a ``ConvertError`` naming the file: a directory without config.json, and a
``model_type`` no module reads (listing those that are). Called by ``convert()``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import registry
from .base import load_json
from .plan import Plan
from .quant import ConvertError

__all__ = ["load_hf"]


def load_hf(src: Path, tensors: Any = None) -> Plan:
    """Read an HF checkpoint directory into a :class:`Plan` (no tensor data is read yet).

    ``tensors``: the tensors in place of the directory's shards (generated ones,
    ``warp_providers.synth``); the architecture must be one of the shared decoders.

    Raises:
        ConvertError: naming the file, key or tensor at fault.

    """
    cfg_path = src / "config.json"
    if not cfg_path.is_file():
        raise ConvertError(f"{src}: no config.json (not an HF checkpoint directory)")
    cfg = load_json(cfg_path)
    try:
        arch = registry.module(registry.detect(cfg))
    except ConvertError as e:
        raise ConvertError(f"{cfg_path}: {e}") from None
    gen_path = src / "generation_config.json"
    gen = load_json(gen_path) if gen_path.is_file() else {}
    if tensors is None:
        plan: Plan = arch.load(src, cfg, gen)
        return plan
    decoder = getattr(arch, "ARCH", None)
    if decoder is None:
        raise ConvertError(f"{cfg_path}: {mt!r} reads only tensors stored in safetensors")
    plan = decoder.load(src, cfg, gen, st=tensors)
    return plan
