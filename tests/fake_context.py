"""A multi-sequence Context double for the scheduler, in numpy.

`FakeContext` has the binding's API for N sequences per context (`max_sequences`,
`seq_open`, `eval_batch`, `Sequence.truncate/reset/copy_from/...`) plus the single-state
`eval`/`reset`/`truncate` of sequence 0. The logits after a token are a deterministic
function of the sequence's whole token history (a rolling hash seeds them), so a sequence
evaluated in a batch must give exactly what it gives alone, and one that saw another's
tokens gives something else. Every evaluation is recorded in `calls`, so a test can
assert that batching happened and which tokens each sequence prefilled.

With `vision=` it also has the image API of the binding (`vision_info`, `encode_image`,
`push_embeds`): the fake tower's rows are a deterministic function of the pixels, and a
placeholder token consumes the next queued row, which enters the history it hashes; a
placeholder with an empty queue is refused before anything changes, as the engine does.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from warp_providers.engine import Engine
from warp_providers.errors import ContextOverflowError, MemoryBudgetError, StateMismatchError

MOD = (1 << 61) - 1


def logits_after(history: list[int], vocab: int) -> np.ndarray:
    """The logits a history of tokens gives (what a sequence holding it returns)."""
    h = 7
    for t in history:
        h = (h * 1_000_003 + t + 1) % MOD
    return np.random.default_rng(h).standard_normal(vocab).astype(np.float32)


def row_mark(row: np.ndarray) -> int:
    """What an image row adds to a placeholder position's history entry."""
    import hashlib

    digest = hashlib.sha256(np.ascontiguousarray(row, dtype=np.float32).tobytes()).digest()
    return 1 + int.from_bytes(digest[:6], "little")


def fake_tower_rows(pixel_values: np.ndarray, grid_thw: tuple[int, int, int], merge: int,
                    hidden: int) -> np.ndarray:
    """The fake tower: rows derived from the pixels (one per merged patch)."""
    import hashlib

    t, h, w = grid_thw
    n = t * h * w // (merge * merge)
    seed = int.from_bytes(hashlib.sha256(pixel_values.tobytes()).digest()[:8], "little")
    return np.random.default_rng(seed).standard_normal((n, hidden)).astype(np.float32)


VISION = {
    "arch": "kimi_k25",
    "preprocessor": {"patch_size": 14, "merge_size": 2, "max_patches": 1024,
                     "size": {"max_height": 512, "max_width": 512},
                     "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                     "resample": 3},
    "patch_size": 14, "merge_size": 2, "temporal_patch_size": 1, "hidden_size": 8,
    "image_start_token_id": None, "image_end_token_id": None,
    "tower_bytes": 1 << 20, "reserve_bytes": 1 << 20,
}
"""A fake tower's metadata (placeholder_token_id is set by whoever builds the context)."""


class FakeSequence:
    """One sequence's state: the tokens it holds."""

    def __init__(self, owner: FakeContext, index: int) -> None:
        self.owner, self.index = owner, index
        self.ids: list[int] = []
        self.marks: list[int] = []  # per position: 0, or the image row it consumed
        self.queue: list[np.ndarray] = []  # rows pushed, not yet consumed
        self.closed = False

    @property
    def position(self) -> int:
        return len(self.ids)

    @property
    def pending_embeds(self) -> int:
        return len(self.queue)

    def push_embeds(self, rows: np.ndarray) -> None:
        info = self.owner.vision
        if info is None:
            raise ValueError("no vision tower is loaded")
        if rows.ndim != 2 or rows.shape[1] != info["hidden_size"] or rows.dtype != np.float32:
            raise ValueError(f"push_embeds: rows must be float32 (n, {info['hidden_size']})")
        self.owner.pushed.append((self.index, rows.shape[0]))
        self.queue.extend(np.array(r) for r in rows)

    def history(self) -> list[int]:
        return [t if m == 0 else (t + m) % MOD for t, m in zip(self.ids, self.marks)]

    def take(self, toks: list[int]) -> None:
        """Appends evaluated tokens, each placeholder consuming its queued row."""
        ph = self.owner.placeholder
        for t in toks:
            self.ids.append(t)
            self.marks.append(row_mark(self.queue.pop(0)) if t == ph else 0)

    def reset(self) -> None:
        self.ids = []
        self.marks = []
        self.queue = []

    def truncate(self, pos: int) -> None:
        if self.owner.recurrent and pos != len(self.ids):
            raise StateMismatchError("a recurrent state cannot be truncated")
        if not 0 <= pos <= len(self.ids):
            raise ValueError(f"cannot truncate to {pos}")
        del self.ids[pos:]
        del self.marks[pos:]
        self.queue = []

    def copy_from(self, other: FakeSequence) -> None:
        self.ids = list(other.ids)
        self.marks = list(other.marks)
        self.queue = []

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.owner.free.append(self)


class FakeContext:
    """N sequences, their logits a function of their histories; see the module docstring.

    Args:
        vocab: logits per row.
        ctx_tokens: tokens one sequence holds at most.
        max_sequences: sequences allocated at open (sequence 0 is the context's own).
        recurrent: truncating to anything but the current position raises.
        step_seconds: each evaluation sleeps this long (lets concurrent callers pile up).
        refuse: token ids a prompt chunk (2 tokens or more) may not hold: the evaluation
            refuses it (ValueError) before any sequence changes.
    """

    def __init__(self, vocab: int, ctx_tokens: int = 4096, max_sequences: int = 4, *,
                 recurrent: bool = False, step_seconds: float = 0.0,
                 refuse: frozenset[int] = frozenset(),
                 vision: dict[str, Any] | None = None) -> None:
        self.vocab, self.ctx_tokens, self.recurrent = vocab, ctx_tokens, recurrent
        self.vision = vision
        self.placeholder = None if vision is None else vision["placeholder_token_id"]
        self.pushed: list[tuple[int, int]] = []
        """Every push_embeds: (sequence index, rows)."""
        self.encoded: list[tuple[int, int, int]] = []
        """Every encode_image: its grid."""
        self.step_seconds, self.refuse = step_seconds, refuse
        self.closed = False
        self.max_sequences = max_sequences
        self.seq0 = FakeSequence(self, 0)
        self.free = [FakeSequence(self, i) for i in range(1, self.max_sequences)]
        self.calls: list[list[tuple[int, list[int]]]] = []
        """Every evaluation: [(sequence index, tokens evaluated)] per call."""
        self._busy = threading.Lock()
        self._tokens = 0

    # -- the binding's API ----------------------------------------------------------
    def info(self) -> dict[str, Any]:
        return {"vocab_size": self.vocab, "ctx_tokens": self.ctx_tokens, "model_type": "fake"}

    def stats(self) -> dict[str, Any]:
        from warp_providers.generation import COUNTERS

        out: dict[str, Any] = dict.fromkeys(COUNTERS, 0)
        out.update(tokens=self._tokens, expert_lookups=2 * self._tokens,
                   expert_hits=self._tokens, expert_misses=self._tokens,
                   direct_io=0, cache_bytes=0, peak_bytes=0)
        return out

    @property
    def position(self) -> int:
        return self.seq0.position

    def vision_info(self) -> dict[str, Any] | None:
        return None if self.vision is None else dict(self.vision)

    def encode_image(self, pixel_values: np.ndarray, grid_thw: tuple[int, int, int]) -> np.ndarray:
        if self.vision is None:
            raise ValueError("no vision tower is loaded (open with vision=True)")
        if (pixel_values.dtype != np.float32 or pixel_values.ndim != 2
                or not pixel_values.flags.c_contiguous):
            raise ValueError("encode_image: pixel_values must be 2-D C-contiguous float32")
        t, h, w = grid_thw
        if pixel_values.shape[0] != t * h * w:
            raise ValueError("encode_image: pixel rows do not match grid_thw")
        self.encoded.append(tuple(grid_thw))
        return fake_tower_rows(pixel_values, grid_thw, self.vision["merge_size"],
                               self.vision["hidden_size"])

    @property
    def pending_embeds(self) -> int:
        return self.seq0.pending_embeds

    def push_embeds(self, rows: np.ndarray) -> None:
        self.seq0.push_embeds(rows)

    def seq_open(self) -> FakeSequence:
        if not self.free:
            raise MemoryBudgetError("every sequence is in use")
        seq = self.free.pop(0)
        seq.closed = False
        seq.reset()
        return seq

    def eval(self, tokens: np.ndarray, logits: np.ndarray, all_logits: bool) -> None:
        toks = [int(t) for t in tokens]
        self._check(self.seq0, toks)
        with self._entered():
            self.calls.append([(0, toks)])
            n0 = len(self.seq0.ids)
            self.seq0.take(toks)
            self._tokens += len(toks)
            hist = self.seq0.history()
            if all_logits:
                rows = [logits_after(hist[:n0 + i + 1], self.vocab) for i in range(len(toks))]
                logits[:] = np.concatenate(rows)
            else:
                logits[:self.vocab] = logits_after(hist, self.vocab)

    def _eval_batch(self, seqs: list[FakeSequence | None], tokens: list[np.ndarray],
                   logits: np.ndarray) -> None:
        resolved = [self.seq0 if s is None else s for s in seqs]
        lists = [[int(t) for t in arr] for arr in tokens]
        if len(resolved) != len(lists) or logits.shape != (len(lists), self.vocab):
            raise ValueError("eval_batch: mismatched shapes")
        if len({id(s) for s in resolved}) != len(resolved):
            raise ValueError("eval_batch: a sequence appears twice")
        for s, toks in zip(resolved, lists):
            self._check(s, toks)
        with self._entered():
            self.calls.append([(s.index, list(t)) for s, t in zip(resolved, lists)])
            for i, (s, toks) in enumerate(zip(resolved, lists)):
                s.take(toks)
                self._tokens += len(toks)
                logits[i] = logits_after(s.history(), self.vocab)

    def reset(self) -> None:
        self.seq0.reset()

    def truncate(self, pos: int) -> None:
        self.seq0.truncate(pos)

    def close(self) -> None:
        self.closed = True

    # -- checks and records ---------------------------------------------------------
    def _check(self, seq: FakeSequence, toks: list[int]) -> None:
        if self.closed or seq.closed:
            raise ValueError("the engine is closed")
        if not toks or min(toks) < 0 or max(toks) >= self.vocab:
            raise ValueError("token id out of range")
        if len(toks) > 1 and self.refuse.intersection(toks):
            raise ValueError(f"refused token in {toks}")
        if len(seq.ids) + len(toks) > self.ctx_tokens:
            raise ContextOverflowError("the sequence is full")
        if self.placeholder is not None and toks.count(self.placeholder) > len(seq.queue):
            raise ValueError("a placeholder token with no queued image row")

    def _entered(self) -> Any:
        ctx = self

        class _Guard:
            def __enter__(self) -> None:
                if not ctx._busy.acquire(blocking=False):
                    raise AssertionError("two evaluations ran at once")
                if ctx.step_seconds:
                    time.sleep(ctx.step_seconds)

            def __exit__(self, *exc: object) -> None:
                ctx._busy.release()

        return _Guard()

    def batch_sizes(self) -> list[int]:
        """Sequences per recorded evaluation."""
        return [len(c) for c in self.calls]

    def prefilled(self, seq_index: int) -> list[list[int]]:
        """Token lists evaluated for one sequence, in order."""
        return [t for call in self.calls for i, t in call if i == seq_index]


class FakeBatchContext(FakeContext):
    """`FakeContext` with the batched API (`eval_batch`) the scheduler batches through."""

    eval_batch = FakeContext._eval_batch


class FakeSingleContext(FakeContext):
    """`FakeContext` as the single-state binding has it: no sequences, no `eval_batch`."""

    def __init__(self, vocab: int, ctx_tokens: int = 4096, **kw: Any) -> None:
        super().__init__(vocab, ctx_tokens, max_sequences=1, **kw)
        del self.max_sequences

    seq_open = None  # type: ignore[assignment]


def engine_on(ctx: FakeContext, **kw: Any) -> Engine:
    """An `Engine` over a Context double, with the byte-level test tokenizer and ChatML."""
    from fake_engine import CHATML_TEMPLATE, make_tokenizer

    eng = Engine(ctx, "fake.warp", make_tokenizer(), **kw)
    eng.chat_metadata = lambda: {"format": None, "template": CHATML_TEMPLATE}  # type: ignore
    return eng
