"""One request's token loop, driven step by step by the scheduler.

Owns: `Request`, the state of one generation (prompt ids still to evaluate, its sampler,
logit processors, stop ids and stop strings, incremental decoder, should_stop, per-request
timings and its share of the engine counters), the `TokenEvent`s it hands to its consumer
through its own bounded queue, and the `GenerationResult` it ends with (however it ends:
finished, cancelled, failed, or closed early by its consumer).
Refuses: nothing itself; `Engine.stream` validates before a request is built.
Called by: `scheduler.py` (the worker side: `feed`, `finish`, `fail`) and `engine.py`
(the consumer side: `events`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from warp_providers.sampling import LogitsProcessor, Sampler, SamplingParams
from warp_providers.tokenizer import Tokenizer

__all__ = ["COUNTERS", "GenerationResult", "Request", "TokenEvent"]

COUNTERS = (
    "tokens", "expert_lookups", "expert_hits", "expert_misses", "prefetch_issued",
    "prefetch_hits", "prefetch_cancelled", "bytes_read", "other_bytes_read", "read_seconds",
    "eval_seconds",
)
"""Engine counters a result reports as this request's share of the steps it was in."""

AHEAD = 1
"""Events a request may have queued unread: its next token is evaluated while its consumer
handles the current one, and a consumer that stops reading stops its sequence."""


@dataclass
class TokenEvent:
    """One generated token, as `Engine.stream` yields it.

    Attributes:
        index: 0-based position in the reply.
        token_id: the sampled id.
        text: the text this token completed (may be "" while UTF-8 or a possible stop
            string is held back); the texts of all events concatenate to the reply.
        logprob: log-probability of the token under the sampling distribution.
    """

    index: int
    token_id: int
    text: str
    logprob: float


@dataclass
class GenerationResult:
    """A finished generation.

    Attributes:
        text: the reply text (a matched stop string excluded).
        token_ids: generated ids (an end-of-sequence id excluded).
        finish_reason: "stop" (EOS or a stop string), "length", or "cancelled".
        prompt_tokens: tokens of the prompt; cached_tokens of them were reused.
        stats: engine counters of this generation plus timings and tok/s.
    """

    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int = 0
    stats: dict[str, Any] = field(default_factory=dict)


class Request:
    """One generation: the worker feeds it logits rows, its consumer iterates `events()`."""

    def __init__(
        self,
        ids: list[int],
        limit: int,
        params: SamplingParams,
        stop: list[str],
        stop_ids: set[int],
        processors: Sequence[LogitsProcessor],
        should_stop: Callable[[], bool] | None,
        tokenizer: Tokenizer,
        prefixes: Sequence[int] = (),
    ) -> None:
        """A request for `limit` tokens at most after the prompt `ids` (not yet queued).

        `prefixes`: lengths of prompt prefixes worth a snapshot (the scheduler's prefix
        cache); the prefill stops at each one not already reused.
        """
        self.ids = ids
        self.key: list[Any] = ids
        """What prefix reuse compares: `ids`, each image position replaced by its image's
        pixel digest and index, so different images never share a cached prefix."""
        self.embeds: list[tuple[int, np.ndarray]] = []
        """(start position, rows) of each image's placeholder run in `ids`."""
        self.prefixes = tuple(prefixes)
        self.marks: list[int] = []  # prefix lengths still to reach in this prefill
        self.limit = limit
        self._params, self._processors = params, processors
        self.stop, self.stop_ids, self.should_stop = stop, stop_ids, should_stop
        self._tokenizer = tokenizer
        self.slot: Any = None  # the scheduler's sequence slot while active
        self.cached = 0
        self.todo: list[int] = []  # tokens to evaluate next (prompt rest, or the last token)
        self.prefilling = True
        self.generated: list[int] = []
        self.text = ""
        self._emitted = 0
        self._hold = max((len(s) for s in stop), default=0)
        self.share = dict.fromkeys(COUNTERS, 0.0)
        self.queued_at = time.perf_counter()
        self._t_start = self._t_first = 0.0
        self._items: deque[Any] = deque()
        self._cond = threading.Condition()
        self.pending = 0  # events queued and not yet taken by the consumer
        self.cancelled = False  # the consumer closed its stream
        self.done = False
        self.result: GenerationResult | None = None
        self._sampler: Sampler | None = None
        self._decoder: Any = None

    # -- worker side ----------------------------------------------------------------
    def start(self, cached: int) -> None:
        """Admitted on a sequence that already holds `cached` tokens of the prompt."""
        self.cached = cached
        self.todo = self.ids[cached:]
        self.marks = sorted({int(b) for b in self.prefixes if cached < b < len(self.ids)})
        self._t_start = time.perf_counter()
        self._sampler = Sampler(self._params, self._processors, self.ids)
        self._decoder = self._tokenizer.incremental_decoder()

    @property
    def ready(self) -> bool:
        """Whether it can take part in the next step (its consumer keeps up)."""
        return not self.done and (self.prefilling or self.pending < AHEAD)

    def embeds_in(self, start: int, n: int) -> list[np.ndarray]:
        """The image rows positions [start, start + n) of the prompt consume, in order."""
        out = []
        for at, rows in self.embeds:
            lo, hi = max(start, at), min(start + n, at + len(rows))
            if lo < hi:
                out.append(rows[lo - at:hi - at])
        return out

    def take(self, chunk: int | None, marks: bool = True) -> list[int]:
        """The tokens it evaluates this step (a bounded prefill chunk, or its last token).

        With `marks` the prefill stops at its next prefix boundary; without, it goes past
        the boundaries (the scheduler could take no snapshot there)."""
        n = len(self.todo) if chunk is None or not self.prefilling else min(chunk, len(self.todo))
        if marks and self.prefilling and self.marks:  # stop at the next prefix boundary
            n = min(n, self.marks[0] - (len(self.ids) - len(self.todo)))
        return self.todo[:n]

    def feed(self, n: int, row: np.ndarray) -> None:
        """`n` tokens of `take` were evaluated; `row` holds the logits after the last one."""
        del self.todo[:n]
        if self.todo:
            return  # more prompt to come
        if self.prefilling:
            self.prefilling = False
            self._t_first = time.perf_counter()
        self.next_token(row)

    def next_token(self, logits: np.ndarray) -> None:
        """Samples, checks the stops and queues the token's event (or finishes)."""
        if self.should_stop is not None and self.should_stop():
            return self.finish("cancelled")
        assert self._sampler is not None
        tok, logprob = self._sampler.sample(logits, self.generated)
        if tok in self.stop_ids:
            return self.finish("stop")
        self.generated.append(tok)
        index = len(self.generated) - 1
        self.text += self._decoder.feed(tok)
        cut = _find_stop(self.text, self.stop, self._emitted)
        if cut is not None:
            self.text = self.text[:cut]
            if cut > self._emitted:
                self._put(TokenEvent(index, tok, self.text[self._emitted:cut], logprob))
                self._emitted = cut
            return self.finish("stop", flush=False)
        safe = len(self.text) - _held_prefix(self.text, self.stop, self._hold)
        piece = self.text[self._emitted:safe] if safe > self._emitted else ""
        self._emitted = max(self._emitted, safe)
        self._put(TokenEvent(index, tok, piece, logprob))
        if len(self.generated) >= self.limit:
            return self.finish("length")
        self.todo = [tok]

    def finish(self, finish: str, flush: bool = True) -> None:
        """Ends it: the decoder's tail as a last event, then the result."""
        if self.done:
            return
        if flush and self._decoder is not None:
            self.text += self._decoder.flush()
            if len(self.text) > self._emitted and self.generated:
                tail = self.text[self._emitted:]
                self._emitted = len(self.text)
                self._put(TokenEvent(len(self.generated) - 1, self.generated[-1], tail, 0.0))
        self._end(finish, None)

    def fail(self, error: BaseException) -> None:
        """Ends it with an error its consumer raises (nothing else is affected)."""
        if not self.done:
            self._end("cancelled", error)

    def _put(self, event: TokenEvent) -> None:
        with self._cond:
            self._items.append((event, len(self.generated), len(self.text)))
            self.pending += 1
            self._cond.notify()

    def _end(self, finish: str, error: BaseException | None) -> None:
        self.result = self._result(finish)
        with self._cond:
            self.done = True
            self._items.append(_Failure(error) if error is not None else _END)
            self._cond.notify()

    def _result(self, finish: str) -> GenerationResult:
        now = time.perf_counter()
        started = self._t_start or now
        first = self._t_first or now
        t_prefill, t_decode = first - started, now - first
        stats: dict[str, Any] = {k: v if k.endswith("seconds") else int(round(v))
                                 for k, v in self.share.items()}
        evaluated = len(self.ids) - self.cached
        n = len(self.generated)
        stats.update(
            queue_seconds=started - self.queued_at,
            prefill_seconds=t_prefill,
            decode_seconds=t_decode,
            prompt_tokens_evaluated=evaluated,
            cached_tokens=self.cached,
            prefill_tok_s=evaluated / t_prefill if t_prefill > 0 else 0.0,
            decode_tok_s=n / t_decode if t_decode > 0 and n else 0.0,
        )
        lookups = stats["expert_lookups"]
        stats["hit_rate"] = stats["expert_hits"] / lookups if lookups else 0.0
        return GenerationResult(text=self.text, token_ids=list(self.generated),
                                finish_reason=finish, prompt_tokens=len(self.ids),
                                cached_tokens=self.cached, stats=stats)

    # -- consumer side --------------------------------------------------------------
    def events(self, wake: Callable[[], None]) -> Iterator[TokenEvent]:
        """Its events, in the consumer's thread; `wake` tells the worker one was taken.

        Closing the iterator early cancels the request (`wake` again) and waits for the
        worker to end it; `result` then describes what this consumer read.
        """
        seen, text_len, complete = 0, 0, False
        try:
            while True:
                with self._cond:
                    while not self._items:
                        self._cond.wait()
                    item = self._items.popleft()
                    if isinstance(item, tuple):
                        self.pending -= 1
                if isinstance(item, tuple):
                    wake()
                    event, seen, text_len = item
                    yield event
                    continue
                complete = True
                if isinstance(item, _Failure):
                    raise item.error
                return
        finally:
            if not complete:
                self._close_early(wake, seen, text_len)

    def _close_early(self, wake: Callable[[], None], seen: int, text_len: int) -> None:
        with self._cond:
            self.cancelled = True
        wake()
        with self._cond:
            while not self.done:
                self._cond.wait()
            unread = any(isinstance(i, tuple) for i in self._items)
        assert self.result is not None
        res = self.result
        if unread:  # the worker ran ahead of this consumer: report what it read
            res = dataclasses.replace(res, token_ids=res.token_ids[:seen],
                                      text=res.text[:text_len], finish_reason="cancelled")
        elif res.finish_reason == "length":
            res = dataclasses.replace(res, finish_reason="cancelled")
        self.result = res


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


def _find_stop(text: str, stop: list[str], emitted: int) -> int | None:
    """Index where the earliest stop string starts, if one is complete in text."""
    best = None
    for s in stop:
        if not s:
            continue
        i = text.find(s, max(0, emitted - len(s) + 1))
        if i >= 0 and (best is None or i < best):
            best = i
    return best


def _held_prefix(text: str, stop: list[str], hold: int) -> int:
    """Length of the tail of text that could still begin a stop string."""
    for k in range(min(hold, len(text)), 0, -1):
        tail = text[-k:]
        if any(s.startswith(tail) for s in stop):
            return k
    return 0
