"""``llama``: dense SwiGLU decoder (also the plain transformer of most small checkpoints).

Config: the standard keys of :class:`~..decoder.Decoder`, every rope type. Tensors:
attention with optional q/k/v/o biases (``attention_bias``), the dense MLP with optional
biases (``mlp_bias``). Refuses other ``hidden_act`` values and unknown tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from ..decoder import ATTENTION, DENSE_MLP, MLP_BIAS, NORMS, Decoder
from ..plan import Plan

MODEL_TYPE: Final[str] = "llama"


class Llama(Decoder):
    """No experts; every layer dense."""

    model_type = MODEL_TYPE
    tensors = {**NORMS, **ATTENTION, **DENSE_MLP, **MLP_BIAS}


ARCH: Final[Llama] = Llama()


def load(src: Path, cfg: dict[str, Any], gen: Mapping[str, Any]) -> Plan:
    """Plan of a ``llama`` checkpoint directory."""
    return ARCH.load(src, cfg, gen)
