"""Helpers shared by the oracle tests (numpy only; torch stays behind each test's fixture)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def mean_kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """Mean over positions of KL(softmax(p) || softmax(q)), in float64."""

    def logsm(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        m = x.max(-1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))

    lp, lq = logsm(p_logits), logsm(q_logits)
    return float((np.exp(lp) * (lp - lq)).sum(-1).mean())


def convert_to(src: Path, out: Path, **kw: str) -> Path:
    """`warp convert` of an HF directory (imported late: the converter is under test)."""
    from warp_providers.convert import convert

    return convert(src, out, **kw)
