"""experts_per_token reaches `Engine.open` from every surface that opens a model by path:
ChatWarp and the LlamaIndex LLM (engine_options), the OpenAI transport (its engine
options), and `warp serve` / `warp batch` (--experts-per-token). The engine is the
scripted one; what is checked is the option `Engine.open` received."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from fake_engine import ScriptedEngine

from warp_providers import models


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Options of every Engine.open the shared registry made (a scripted engine each)."""
    calls: list[dict[str, Any]] = []

    class Recorder:
        @staticmethod
        def open(path: str, **options: Any) -> ScriptedEngine:
            calls.append(options)
            eng = ScriptedEngine(["Routed."])
            eng.close = lambda: None  # type: ignore[attr-defined]
            return eng

    monkeypatch.setattr(models, "Engine", Recorder)
    return calls


def test_chat_warp_passes_it(opened, tmp_path) -> None:
    from langchain_warp import ChatWarp

    llm = ChatWarp(model_path=str(tmp_path / "a.warp"), engine_options={"experts_per_token": 8})
    assert llm.invoke("x").content == "Routed."
    assert [o.get("experts_per_token") for o in opened] == [8]


def test_llamaindex_warp_passes_it(opened, tmp_path) -> None:
    from llama_index.llms.warp import Warp

    llm = Warp(model_path=str(tmp_path / "b.warp"), engine_options={"experts_per_token": 4})
    assert llm.session is not None  # opened (the metadata of no session reads a manifest)
    assert llm.complete("x").text == "Routed."
    assert [o.get("experts_per_token") for o in opened] == [4]


def test_openai_transport_passes_it(opened, tmp_path) -> None:
    from warp_openai import warp_openai_client

    client = warp_openai_client(str(tmp_path / "c.warp"), experts_per_token=12)
    reply = client.chat.completions.create(
        model="c", messages=[{"role": "user", "content": "x"}], max_tokens=16)
    assert reply.choices[0].message.content == "Routed."
    assert [o.get("experts_per_token") for o in opened] == [12]


@pytest.mark.parametrize("command", ["ServeCommand", "BatchCommand"])
def test_serve_and_batch_flags_become_the_option(command) -> None:
    from warp_openai import cli

    p = argparse.ArgumentParser()
    getattr(cli, command)().add_arguments(p)
    extra = [] if command == "ServeCommand" else ["in.jsonl", "-o", "out.jsonl"]
    a = p.parse_args(["m.warp", *extra, "--experts-per-token", "6"])
    assert cli._engine_opts(a)["experts_per_token"] == 6
    a = p.parse_args(["m.warp", *extra])
    assert "experts_per_token" not in cli._engine_opts(a)
