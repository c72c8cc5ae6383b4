"""Shared cases of the OpenAI conformance suite (engines and request pieces)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from fake_engine import ScriptedEngine, tool_call_text

__all__ = ["TIME", "USER", "WEATHER", "CountingEngine", "tool_call_text"]


class CountingEngine(ScriptedEngine):
    """A scripted engine that counts the tokens it produced and can pace itself."""

    def __init__(self, *args: Any, gate: threading.Event | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.produced = 0
        self.saw_should_stop = False
        self.cancelled = False
        self.gate = gate

    def stream(self, prompt: Any, **kw: Any) -> Iterator[Any]:
        self.produced = 0
        self.cancelled = False
        user_stop = kw.get("should_stop")

        def should_stop() -> bool:
            stop = bool(user_stop and user_stop())
            if stop:
                self.saw_should_stop = True
            return stop

        kw["should_stop"] = should_stop
        for i, ev in enumerate(super().stream(prompt, **kw)):
            if self.gate is not None and i == 1:
                self.gate.wait(10)
            self.produced += 1
            yield ev
        if self.last_result is not None and self.last_result.finish_reason == "cancelled":
            self.cancelled = True


USER = [{"role": "user", "content": "hi"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"type": "string"}},
            "required": ["tz"],
        },
    },
}
