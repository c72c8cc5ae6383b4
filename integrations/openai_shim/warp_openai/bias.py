"""`logit_bias` for chat completions, completions and responses: validation and the hook.

Owns: reading the request field (an object mapping token ids, as strings or integers, to
numbers in [-100, 100]) and the logits processor that adds each bias to its token's logit
before sampling, -100 banning the token outright (its logit becomes -inf).
Refuses: anything else in the field, with a 400 whose `param` is `logit_bias` (a bias is
never dropped silently).
Called by `api.py` and `completions.py`; the processor runs in `warp_providers.sampling`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from warp_openai.api import APIError

__all__ = ["LogitBias", "logit_bias"]

BAN = -100.0
"""A bias at or below this bans the token (OpenAI: "-100 should result in a ban")."""


class LogitBias:
    """A logits processor adding fixed biases to chosen token ids."""

    def __init__(self, biases: Mapping[int, float]) -> None:
        """Bias `biases` (token id -> bias in [-100, 100])."""
        self.ids = np.fromiter(biases.keys(), dtype=np.int64, count=len(biases))
        vals = np.fromiter(biases.values(), dtype=np.float64, count=len(biases))
        self.values = np.where(vals <= BAN, -np.inf, vals).astype(np.float32)

    def __call__(self, generated: Sequence[int], logits: np.ndarray) -> None:
        """Adds the biases in place."""
        logits[self.ids] += self.values


def logit_bias(req: Mapping[str, Any], vocab_size: int) -> LogitBias | None:
    """The request's `logit_bias` as a processor (None when absent or empty).

    Raises:
        APIError: 400 naming `logit_bias` for a malformed key, value or token id.

    """
    raw = req.get("logit_bias")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise APIError(400, "'logit_bias' must be an object mapping token ids to numbers",
                       param="logit_bias")
    biases: dict[int, float] = {}
    for key, value in raw.items():
        try:
            tok = int(key, 10) if isinstance(key, str) else None
        except ValueError:
            tok = None
        if tok is None or not 0 <= tok < vocab_size:
            raise APIError(400, f"'logit_bias' key {key!r} is not a token id of this model "
                           f"(0 to {vocab_size - 1})", param="logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            -100 <= value <= 100
        ):
            raise APIError(400, f"'logit_bias' value for token {tok} must be a number between "
                           "-100 and 100", param="logit_bias")
        biases[tok] = float(value)
    return LogitBias(biases) if biases else None
