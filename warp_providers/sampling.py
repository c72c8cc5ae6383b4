"""Token sampling over the logits of one position.

Owns: `SamplingParams` (the knobs every surface exposes) and `Sampler`, a composition of
small filters: penalties -> logit processors (constrained decoding hooks) -> temperature
-> top-k -> top-p -> min-p -> draw. Temperature 0 is greedy (argmax, first index on ties).
Refuses nothing silently: out-of-range knobs raise ValueError at construction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["LogitsProcessor", "Sampler", "SamplingParams"]

#: A hook that may modify the logits in place (e.g. mask tokens a grammar forbids).
#: It gets the ids generated so far and the float32 logits of the next position.
LogitsProcessor = Callable[[Sequence[int], np.ndarray], None]


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen.

    Attributes:
        temperature: 0 means greedy; otherwise logits are divided by it.
        top_p: nucleus mass kept (1.0 = off).
        top_k: tokens kept by rank (0 = off).
        min_p: tokens below min_p * p(max) are dropped (0 = off).
        seed: RNG seed for reproducible sampling (None = random).
        presence_penalty: subtracted once from every token already generated.
        frequency_penalty: subtracted per occurrence of a generated token.
        repetition_penalty: divides positive / multiplies negative logits of tokens seen
            in the prompt or the output (1.0 = off).
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not (0.0 <= self.min_p <= 1.0):
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not (-2.0 <= self.presence_penalty <= 2.0):
            raise ValueError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if not (-2.0 <= self.frequency_penalty <= 2.0):
            raise ValueError(
                f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}"
            )
        if not (self.repetition_penalty > 0.0):
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")


class Sampler:
    """Chooses tokens from logits according to `SamplingParams`."""

    def __init__(
        self,
        params: SamplingParams,
        processors: Sequence[LogitsProcessor] = (),
        prompt_ids: Sequence[int] = (),
    ) -> None:
        """Creates a sampler.

        Args:
            params: the sampling knobs.
            processors: logit hooks applied in order before the filters.
            prompt_ids: the prompt, seen by the repetition penalty.
        """
        self.params = params
        self.processors = list(processors)
        self._rng = np.random.default_rng(params.seed)
        self._prompt = np.asarray(prompt_ids, dtype=np.int64)

    def sample(self, logits: np.ndarray, generated: Sequence[int]) -> tuple[int, float]:
        """Picks the next token.

        Args:
            logits: float32 logits of the next position (modified in place).
            generated: ids generated so far in this reply.

        Returns:
            (token id, log-probability of that token under the final distribution).

        Raises:
            ValueError: every token was masked out by a processor.
        """
        p = self.params
        self._penalize(logits, generated)
        for proc in self.processors:
            proc(generated, logits)
        if not np.isfinite(logits).any():
            raise ValueError("every token was masked: nothing can be sampled")
        if p.temperature == 0.0:
            tok = int(np.argmax(logits))
            return tok, float(_log_softmax_at(logits, tok))
        x = logits.astype(np.float64) / p.temperature
        neg = -x
        order, vals = _ranked(neg, p.top_k)
        probs = np.exp(vals - vals[0])
        probs /= probs.sum()
        keep = int(np.count_nonzero(probs > 0.0))  # masked ids (-inf) carry no mass
        if p.top_p < 1.0:
            keep = min(keep, int(np.searchsorted(np.cumsum(probs), p.top_p) + 1))
        if p.min_p > 0.0:
            keep = min(keep, int(np.count_nonzero(probs >= p.min_p * probs[0])))
        keep = max(keep, 1)
        probs = probs[:keep] / probs[:keep].sum()
        # Scale the coin instead of normalising the cumulative sum twice.
        idx = int(np.searchsorted(np.cumsum(probs), self._rng.random() * 0.999999999))
        idx = min(idx, keep - 1)
        tok = int(order[idx]) if order is not None else _id_at_rank(neg, -vals[idx], idx)
        return tok, float(np.log(probs[idx]))

    def _penalize(self, logits: np.ndarray, generated: Sequence[int]) -> None:
        p = self.params
        if p.presence_penalty or p.frequency_penalty:
            if generated:
                ids, counts = np.unique(np.asarray(generated, dtype=np.int64), return_counts=True)
                logits[ids] -= p.presence_penalty + p.frequency_penalty * counts
        if p.repetition_penalty != 1.0:
            seen = np.unique(np.concatenate([self._prompt, np.asarray(generated, np.int64)]))
            if seen.size:
                vals = logits[seen]
                logits[seen] = np.where(
                    vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty
                )


def _ranked(neg: np.ndarray, top_k: int) -> tuple[np.ndarray | None, np.ndarray]:
    """The candidates by rank: ids and values of -neg in descending order, ties to the
    lower id (the order of a stable argsort of neg), the first top_k of them (0: all).

    Without a full argsort: top_k candidates come from a partition (the ties at the k-th
    value taken by lowest id, as the stable sort takes them), then only they are sorted;
    every id (top_k 0 or >= the vocabulary) is only a sort of the values, ids None, the
    drawn rank mapped back to its id by `_id_at_rank`.
    """
    n = neg.size
    if top_k <= 0 or top_k >= n:
        return None, -np.sort(neg)
    kth = np.partition(neg, top_k - 1)[top_k - 1]
    better = np.flatnonzero(neg < kth)
    tied = np.flatnonzero(neg == kth)[: top_k - better.size]
    cand = np.sort(np.concatenate([better, tied]))
    if cand.size != top_k:  # NaN among the k best: no order to reproduce cheaply
        order = np.argsort(neg, kind="stable")[:top_k]
    else:
        order = cand[np.argsort(neg[cand], kind="stable")]
    return order, -neg[order]


def _id_at_rank(neg: np.ndarray, value: float, rank: int) -> int:
    """The id at `rank` of a stable argsort of neg, whose value there is `value`: the ids
    before it are those below value, then the tied ids in id order."""
    tied = np.flatnonzero(neg == value)
    at = rank - int(np.count_nonzero(neg < value))
    if 0 <= at < tied.size:
        return int(tied[at])
    return int(np.argsort(neg, kind="stable")[rank])  # NaN: as the stable sort puts it


def _log_softmax_at(logits: np.ndarray, tok: int) -> float:
    """log softmax(logits)[tok] in float64 over the finite logits (masked ids: -inf)."""
    x = logits.astype(np.float64)
    m = x.max()  # NaN if any is NaN
    if np.isfinite(m):  # no NaN, no +inf: exp(-inf - m) is 0, so no mask is needed
        at = x[tok]
        np.subtract(x, m, out=x)
        np.exp(x, out=x)
        return float(at - m - np.log(x.sum()))
    x = x[np.isfinite(x)]
    m = x.max()
    return float(logits[tok] - m - np.log(np.exp(x - m).sum()))
