"""Continuous batching: one worker thread steps every active request of an engine together.

Owns: the sequence slots of one context (slot 0 is the context's own state, the others come
from `Context.seq_open()`), the FIFO of requests waiting for a slot, prefix reuse across
slots (an idle slot keeps its tokens; a new request takes the idle slot sharing the longest
token prefix with its prompt, the least recently used among equals, or copies the state of
a running sequence that shares more), prefix snapshots (a request's prefill stops at the
prefix boundaries it names, such as the end of a system prompt and tool list or of the
turns before its last, when a free slot could hold the copy: else it goes past them;
each boundary's state is copied into a free slot: a later request whose prompt starts
with that prefix copies it instead of prefilling it, which also serves recurrent states,
whose longest common prefix cannot be rewound; snapshots
live only in free slots, so they are inside the budget, and the least recently used goes
first when a request or a newer snapshot needs its slot), the step (every ready
request contributes its next prefill chunk or its one decode token; one `eval_batch`; each
request samples from its row), the split of the engine counters among a step's requests,
and the lock every call into the context holds.
Refuses: nothing; a request's own failure (a processor raising, a bad input the engine
refuses) fails that request alone.
A context without `eval_batch` (or with one sequence) runs the same steps on `Context.eval`
with one request at a time. Called by: `engine.py`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from warp_providers.errors import ContextOverflowError, StateMismatchError
from warp_providers.generation import COUNTERS, Request

__all__ = ["Scheduler", "Slot"]

GATHER_SECONDS = 0.002
"""How long a step waits for the consumers of the last step to take their events, so the
step batches them instead of leaving them to the next one."""
IDLE_EXIT_SECONDS = 1.0
"""The worker thread ends after this long with nothing to do (an engine nobody closes can
then be freed); the next request starts it again."""
COPY_MIN = 32
"""Prompt tokens a running sequence must share beyond the best free one for its state to
be copied (smaller gains are not worth a state copy)."""
_INPUT_ERRORS = (ValueError, ContextOverflowError, StateMismatchError)
"""What `eval_batch` raises for a bad input before anything runs (no sequence changed)."""


class Slot:
    """A sequence of the context and the tokens it holds (None: unknown, reset before use)."""

    def __init__(self, index: int, seq: Any) -> None:
        self.index, self.seq = index, seq
        self.ids: list[int] | None = []
        self.busy = False
        self.used = 0.0  # when a request last left it (LRU)
        self.snapshot = False  # holds a prefix snapshot: copied from, kept while others are free


class Scheduler:
    """Runs the requests of one context in batched steps on a worker thread."""

    def __init__(self, ctx: Any, vocab_size: int, chunk: int) -> None:
        """Opens every sequence of `ctx` (its `max_sequences`, 1 without that API).

        Args:
            ctx: the binding's Context (or a test double with the same API).
            vocab_size: logits per row.
            chunk: prompt tokens a request evaluates per step while others are active.
        """
        self._ctx = ctx
        self._vocab = vocab_size
        self.chunk = max(1, chunk)
        self.ctx_lock = threading.Lock()
        """Held around every call into the context."""
        n = int(getattr(ctx, "max_sequences", 1) or 1)
        self.batched = n > 1 and hasattr(ctx, "eval_batch")
        self.slots = [Slot(0, None)]
        # the other sequences count as older: requests take them first, leaving sequence 0
        # (no handle a copy could use) to the low-level calls while there are others
        self.slots[0].used = time.monotonic()
        if self.batched:
            self.slots += [Slot(i, ctx.seq_open()) for i in range(1, n)]
        self._cv = threading.Condition()
        self._waiting: deque[Request] = deque()
        self._active: list[Request] = []
        self._worker: threading.Thread | None = None
        self._closing = False
        self._can_truncate = True
        self._batching = {"steps": 0, "sequences": 0, "widest": 0}
        self._owner0: int | None = None  # thread holding slot 0 for a low-level call
        self._depth0 = 0
        self._wanted0 = 0

    @property
    def max_sequences(self) -> int:
        """Requests that run at once; more wait in FIFO order."""
        return len(self.slots)

    # -- requests -------------------------------------------------------------------
    def submit(self, req: Request) -> Iterator[Any]:
        """Queues a request and returns its events (iterate them in the consumer thread)."""
        with self._cv:
            if self._closing:
                raise ValueError("the engine is closed")
            self._waiting.append(req)
            if self._worker is None:
                self._worker = threading.Thread(target=self._loop, name="warp-scheduler",
                                                daemon=True)
                self._worker.start()
            self._cv.notify()
        return req.events(self.wake)

    def batching(self) -> dict[str, int]:
        """Steps run since open, the sequences they evaluated in all, and the most in one."""
        with self._cv:
            return dict(self._batching)

    def counts(self) -> tuple[int, int]:
        """(requests running, requests waiting for a sequence)."""
        with self._cv:
            return len(self._active), len(self._waiting)

    def wake(self) -> None:
        """Something changed for the worker (an event taken, a request cancelled)."""
        with self._cv:
            self._cv.notify()

    def idle(self, timeout: float | None = None) -> bool:
        """Waits until no request is active or waiting; False on timeout."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self._active or self._waiting:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def close(self) -> None:
        """Cancels every request, waits for the step in progress, then closes the sequences."""
        with self._cv:
            self._closing = True
            for r in list(self._waiting) + self._active:
                r.cancelled = True
            self._cv.notify_all()
            worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            worker.join()
        with self.ctx_lock:
            for s in self.slots[1:]:
                s.seq.close()

    # -- slot 0 for the low-level calls ---------------------------------------------
    def forget(self) -> None:
        """Drops the prefixes the idle sequences hold: the next request on one of them
        evaluates its whole prompt (running requests keep theirs)."""
        with self._cv:
            for s in self.slots[1:]:
                if not s.busy:
                    s.ids, s.snapshot = None, False

    @contextmanager
    def seq0(self) -> Iterator[Slot]:
        """Holds sequence 0 (the context's own state) for a low-level call of this thread."""
        me = threading.get_ident()
        with self._cv:
            if self._owner0 != me:
                self._wanted0 += 1
                while self.slots[0].busy:
                    self._cv.wait()
                self._wanted0 -= 1
                self.slots[0].busy = True
                self._owner0 = me
            self._depth0 += 1
        try:
            yield self.slots[0]
        finally:
            with self._cv:
                self._depth0 -= 1
                if self._depth0 == 0:
                    self._owner0 = None
                    self.slots[0].busy = False
                    self.slots[0].used = time.monotonic()
                    self._cv.notify_all()

    # -- the worker -----------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            ready: list[Request] = []
            try:
                with self._cv:
                    got = self._gather()
                if got is None:
                    return
                ready = got
                self._step(ready)
            except BaseException as exc:  # a fault of the step itself: its requests fail
                with self._cv:
                    for r in ready or list(self._waiting) + self._active:
                        if r.slot is not None:
                            r.slot.ids = None  # unknown state: reset before reuse
                        r.fail(exc)
            with self._cv:
                self._retire()

    def _gather(self) -> list[Request] | None:
        """Admits, retires and picks the requests of the next step (None: stop)."""
        waited = False
        idle_since: float | None = None
        while True:
            self._retire()
            self._admit()
            if not self._active and not self._waiting:
                now = time.monotonic()
                idle_since = now if idle_since is None else idle_since
                if self._closing or now - idle_since >= IDLE_EXIT_SECONDS:
                    self._worker = None  # the next submit starts another
                    return None
                self._cv.wait(IDLE_EXIT_SECONDS)
                continue
            idle_since = None
            ready = [r for r in self._active if r.ready]
            if ready and (waited or len(ready) == len(self._active)):
                return ready
            if ready:  # the others' consumers are taking their events: let them join
                self._cv.wait(GATHER_SECONDS)
                waited = True
            else:
                self._cv.wait(1.0)

    def _retire(self) -> None:
        for r in list(self._waiting):
            if r.cancelled or r.done:
                self._waiting.remove(r)
                r.finish("cancelled")  # nothing when it failed already
        keep = []
        for r in self._active:
            if r.cancelled and not r.done:
                r.finish("cancelled")
            if r.done:
                r.slot.busy = False
                r.slot.used = time.monotonic()
                r.slot = None
            else:
                keep.append(r)
        if len(keep) != len(self._active):
            self._active = keep
            self._cv.notify_all()

    def _admit(self) -> None:
        """Gives free slots to waiting requests, first come first served."""
        while self._waiting:
            slot, common = self._pick(self._waiting[0].key)
            if slot is None:
                return
            req = self._waiting.popleft()
            slot.busy = True
            req.slot = slot
            try:
                slot, common = self._keep_snapshot(slot, common)
                req.slot = slot
                donor, shared = self._donor(req.key, slot, common)
                if donor is not None:
                    common = self._copy(slot, donor, shared)
                else:
                    common = self._rewind(slot, common)
            except BaseException as exc:
                slot.busy = False
                slot.ids = None
                req.fail(exc)
                continue
            req.start(common)
            self._active.append(req)

    def _pick(self, ids: list[int]) -> tuple[Slot | None, int]:
        """The free slot with the longest reusable prefix of ids (LRU among equals, sequence
        0 after the others)."""
        best, best_key = None, None
        for s in self.slots:
            if s.busy or (s.index == 0 and self._wanted0):
                continue
            common = _common(s.ids, ids) if s.ids is not None else 0
            if not self._can_truncate and s.ids is not None and common < len(s.ids):
                common = 0  # a recurrent state keeps a prefix only when nothing follows it
            # among equals: one that needs no rewind first, sequence 0 last (it has no
            # handle, so it can give no snapshot), a snapshot after a sequence that only
            # holds a past request's tokens, then the least recently used
            exact = s.ids is None or common == len(s.ids)
            key = (common, exact, s.seq is not None, not s.snapshot, -s.used)
            if best_key is None or key > best_key:
                best, best_key = s, key
        return best, (best_key[0] if best_key else 0)

    def _keep_snapshot(self, slot: Slot, common: int) -> tuple[Slot, int]:
        """The slot a request runs on when `_pick` chose `slot` for its `common` tokens.

        A snapshot is kept: its state is copied into the least recently used other free
        slot, which the request takes instead (the snapshot itself only when no other slot
        is free, or when the request shares nothing with it). Called under the condition
        with `slot` already marked busy.
        """
        if not slot.snapshot:
            return slot, common
        target = self._victim(exclude=slot)
        if target is None or common == 0:
            slot.snapshot = False  # taken over: no longer a snapshot
            return slot, common
        slot.busy = False
        target.busy = True
        slot.used = time.monotonic()  # a hit makes it recent
        self._copy(target, slot, common)
        return target, common

    def _victim(self, exclude: Slot | None = None) -> Slot | None:
        """The free slot with a handle to overwrite (None when none is free): the least
        recently used of those holding a past request's tokens, else of the snapshots
        (a prefix chosen as shared outlives what one request left)."""
        free = [s for s in self.slots[1:] if not s.busy and s is not exclude]
        return min(free, key=lambda s: (s.snapshot, s.used), default=None)

    def _snapshot(self, slot: Slot) -> None:
        """Copies the state of a running request's slot into a free slot, as a snapshot of
        the prefix it holds (nothing when no slot is free or one already holds it)."""
        assert slot.ids is not None
        with self._cv:
            if any(s.snapshot and s.ids == slot.ids for s in self.slots[1:]):
                return
            target = self._victim()
            if target is None:
                return
            target.busy = True
        try:
            with self.ctx_lock:
                target.ids = None
                target.seq.copy_from(slot.seq)
                target.ids = list(slot.ids)
        finally:
            with self._cv:
                target.busy = False
                target.snapshot = target.ids is not None
                target.used = time.monotonic()
                self._cv.notify_all()

    def _snapshots_at(self, req: Request) -> bool:
        """Whether a snapshot at the next prefix boundary of a prefilling request could be
        taken now: it runs on a sequence with a handle, another sequence is free to hold
        the copy, and no snapshot holds that prefix already. Otherwise its prefill goes past
        the boundary, saving a step (and a logits row) that would buy nothing. Called under
        the condition."""
        if not (req.prefilling and req.marks) or req.slot.seq is None:
            return False
        if self._victim() is None:
            return False
        prefix = req.key[:req.marks[0]]
        return not any(s.snapshot and s.ids == prefix for s in self.slots[1:])

    def _donor(self, ids: list[int], target: Slot, have: int) -> tuple[Slot | None, int]:
        """A running sequence sharing at least `COPY_MIN` more prompt tokens than `have`.

        Its state is copied, then truncated, instead of prefilling the shared tokens again
        (requests that share a system prompt or a tool list, arriving while one runs).
        Sequence 0 has no handle to copy: it is neither donor nor target.
        """
        if target.seq is None:
            return None, have
        best, n = None, have + COPY_MIN - 1
        for s in self.slots:
            if s is target or not s.busy or s.seq is None or s.ids is None:
                continue
            c = _common(s.ids, ids)
            if c > n and (self._can_truncate or c == len(s.ids)):
                best, n = s, c
        return best, n

    def _copy(self, slot: Slot, donor: Slot, shared: int) -> int:
        """Makes the slot hold the donor's first `shared` tokens; returns the tokens kept."""
        assert donor.ids is not None
        with self.ctx_lock:
            slot.ids = None
            slot.seq.copy_from(donor.seq)
            slot.ids = list(donor.ids)
        return self._rewind(slot, shared)

    def _rewind(self, slot: Slot, common: int) -> int:
        """Makes the slot hold ids[:common]; returns the tokens kept."""
        held = slot.ids
        if held is not None and common == len(held):
            return common
        with self.ctx_lock:
            if held is not None and common > 0:
                try:
                    _call(self._ctx, slot.seq, "truncate", common)
                    slot.ids = held[:common]
                    return common
                except StateMismatchError:  # a recurrent (KDA) state cannot rewind
                    self._can_truncate = False
            _call(self._ctx, slot.seq, "reset")
            slot.ids = []
            return 0

    def _step(self, ready: list[Request]) -> None:
        chunk = self.chunk if len(ready) > 1 or self._waiting else None
        with self._cv:  # a prefill stops at its next boundary when a snapshot can be taken
            plan = [(r, r.take(chunk, self._snapshots_at(r))) for r in ready]
        starts = {r: len(r.ids) - len(r.todo) if r.prefilling else None for r in ready}
        with self.ctx_lock:
            before = self._ctx.stats()
            rows, errors = self._eval(plan, starts)
            after = self._ctx.stats()
        total = sum(len(t) for r, t in plan if r not in errors) or 1
        with self._cv:
            b = self._batching
            b["steps"] += 1
            b["sequences"] += len(plan)
            b["widest"] = max(b["widest"], len(plan))
        for r, toks in plan:
            if r in errors:
                r.fail(errors[r])
                continue
            for k in COUNTERS:
                r.share[k] += (after[k] - before[k]) * len(toks) / total
            at = starts[r]
            r.slot.ids.extend(toks if at is None else r.key[at:at + len(toks)])
            held = len(r.slot.ids)
            while r.marks and r.marks[0] <= held:
                if r.marks.pop(0) == held and r.slot.seq is not None:
                    try:
                        self._snapshot(r.slot)
                    except BaseException:  # a snapshot is only a cache: the request goes on
                        pass
            try:
                r.feed(len(toks), rows[r])
            except BaseException as exc:  # a processor or should_stop raising
                r.fail(exc)

    def _eval(self, plan: list[tuple[Request, list[int]]],
              starts: dict[Request, int | None]) -> tuple[dict, dict]:
        """Evaluates the step; returns logits rows and the requests that failed."""
        if not self.batched:
            rows, errors = {}, {}
            for r, toks in plan:
                out = np.empty(self._vocab, dtype=np.float32)
                try:
                    pushed = self._push([(r, toks)], starts)
                    try:
                        self._ctx.eval(np.asarray(toks, dtype=np.int32), out, False)
                    except BaseException:
                        self._unpush(pushed)
                        raise
                    rows[r] = out
                except _INPUT_ERRORS as exc:
                    errors[r] = exc
            return rows, errors
        try:
            return self._batch(plan, starts), {}
        except _INPUT_ERRORS as exc:
            if len(plan) == 1:
                return {}, {plan[0][0]: exc}
        rows, errors = {}, {}
        for item in plan:  # one bad input refused the step: run each alone to find it
            try:
                rows.update(self._batch([item], starts))
            except _INPUT_ERRORS as exc:
                errors[item[0]] = exc
        return rows, errors

    def _batch(self, plan: list[tuple[Request, list[int]]],
               starts: dict[Request, int | None]) -> dict[Request, np.ndarray]:
        logits = np.empty((len(plan), self._vocab), dtype=np.float32)
        pushed = self._push(plan, starts)
        try:
            self._ctx.eval_batch([r.slot.seq for r, _ in plan],
                                 [np.asarray(t, dtype=np.int32) for _, t in plan], logits)
        except BaseException:
            self._unpush(pushed)
            raise
        return {r: logits[i] for i, (r, _) in enumerate(plan)}

    def _push(self, plan: list[tuple[Request, list[int]]],
              starts: dict[Request, int | None]) -> list[Request]:
        """Queues the image rows the prompt positions of this step consume."""
        pushed: list[Request] = []
        try:
            for r, toks in plan:
                at = starts.get(r)
                if at is None or not r.embeds:
                    continue
                for rows in r.embeds_in(at, len(toks)):
                    pushed.append(r)
                    _call(self._ctx, r.slot.seq, "push_embeds", rows)
        except BaseException:
            self._unpush(pushed)
            raise
        return pushed

    def _unpush(self, pushed: list[Request]) -> None:
        """Drops rows a refused evaluation left queued (truncating in place clears them)."""
        for r in dict.fromkeys(pushed):
            seq = r.slot.seq
            pos = int((self._ctx if seq is None else seq).position)
            _call(self._ctx, seq, "truncate", pos)


def _call(ctx: Any, seq: Any, name: str, *args: Any) -> Any:
    """`name` on a sequence, or on the context for sequence 0."""
    return getattr(ctx if seq is None else seq, name)(*args)


def _common(held: list[int], ids: list[int]) -> int:
    """Tokens of held reusable for ids (at least one prompt token is left to evaluate)."""
    n = 0
    for a, b in zip(held, ids):
        if a != b:
            break
        n += 1
    return min(n, len(ids) - 1)
