"""The one table of Hugging Face architectures the converter reads.

Owns ``ARCHES`` (checkpoint ``model_type`` -> its module under ``arch/``, imported on
first use), ``ALIASES`` (other ``model_type`` spellings whose keys and weights are one of
those types'; the container gets the canonical name), ``ARCHITECTURES`` (outer
``architectures`` names that decide the type, :func:`detect`), :func:`available`,
:func:`canonical` and :func:`module`. Adding an architecture is one file in ``arch/`` and
one line here.

Refuses: an unknown ``model_type``, with a ``ConvertError`` listing every accepted one.
Called by :func:`hf.load_hf`.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Final

from .quant import ConvertError

__all__ = ["ALIASES", "ARCHES", "ARCHITECTURES", "available", "canonical", "detect", "module"]

ARCHES: Final[dict[str, str]] = {
    "llama": "warp_providers.convert.arch.llama",
    "mixtral": "warp_providers.convert.arch.mixtral",
    "olmoe": "warp_providers.convert.arch.olmoe",
    "qwen2_moe": "warp_providers.convert.arch.qwen2_moe",
    "qwen3_moe": "warp_providers.convert.arch.qwen3_moe",
    "deepseek_v3": "warp_providers.convert.arch.deepseek_v3",
    "glm4_moe": "warp_providers.convert.arch.glm4_moe",
    "gpt_oss": "warp_providers.convert.arch.gpt_oss",
    "kimi_linear": "warp_providers.convert.arch.kimi_linear",
    "deepseek_v4": "warp_providers.convert.arch.deepseek_v4",
    "glm5_next": "warp_providers.convert.arch.glm5_next",
    "kimi_k3": "warp_providers.convert.arch.kimi_k3",
    "kimi_k25": "warp_providers.convert.arch.kimi_k25",
}
"""``model_type`` -> module exposing ``MODEL_TYPE`` and ``load(src, cfg, gen) -> Plan``."""

ALIASES: Final[dict[str, str]] = {
    "kimi_k2": "deepseek_v3",  # Kimi-K2 ships DeepseekV3ForCausalLM as kimi_k2
    "glm5_next_text": "glm5_next",  # the text config of glm5_next on its own
}
"""Other ``model_type`` spellings -> the canonical one."""

ARCHITECTURES: Final[dict[str, str]] = {
    # the outer model_type of the release is not public; its inner one reads kimi_linear
    "KimiK3ForConditionalGeneration": "kimi_k3",
}
"""Outer ``architectures`` names that decide the ``model_type`` whatever the config's says."""


def detect(cfg: dict) -> str:
    """The ``model_type`` a ``config.json`` is read as: by :data:`ARCHITECTURES`, else its own
    ``model_type`` (repr'd when not a string, so the refusal names it)."""
    archs = cfg.get("architectures")
    for a in archs if isinstance(archs, list) else []:
        if isinstance(a, str) and a in ARCHITECTURES:
            return ARCHITECTURES[a]
    mt = cfg.get("model_type")
    return mt if isinstance(mt, str) else repr(mt)


def available() -> list[str]:
    """Every accepted ``model_type`` (aliases included), sorted."""
    return sorted([*ARCHES, *ALIASES])


def canonical(model_type: str) -> str:
    """Return the canonical name of ``model_type`` (itself unless an alias).

    Raises:
        ConvertError: not an accepted ``model_type``.

    """
    name = ALIASES.get(model_type, model_type)
    if name not in ARCHES:
        raise ConvertError(
            f"model_type {model_type!r} is not supported; supported: {', '.join(available())}"
        )
    return name


def module(model_type: str) -> ModuleType:
    """Return the ``arch/`` module of ``model_type`` (or of the type it aliases)."""
    return importlib.import_module(ARCHES[canonical(model_type)])
