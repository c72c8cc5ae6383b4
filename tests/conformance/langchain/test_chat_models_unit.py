"""langchain-tests' ChatModelUnitTests for ChatWarp: construction, binding, tracing params, serdes.

Nothing here generates, so the model is given a container path that is never opened:
the weights load lazily on the first call.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.load import dumpd, load
from langchain_tests.unit_tests import ChatModelUnitTests
from langchain_warp import ChatWarp

MODEL_PATH = "/models/never-opened.warp"


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

    @pytest.mark.xfail(
        strict=True,
        reason="langchain-core's load(allowed_objects='all') admits only classes in its own "
        "serialization mapping, so no package outside it can pass this round trip; "
        "test_serdes_allowlist runs it with the explicit allowlist core asks for",
    )
    def test_serdes(self, model: ChatWarp, snapshot: Any) -> None:
        super().test_serdes(model, snapshot)

    def test_serdes_allowlist(self, model: ChatWarp) -> None:
        ser = dumpd(model)
        assert ser["id"] == ["langchain_warp", "chat_models", "ChatWarp"]
        assert "engine" not in ser["kwargs"]
        loaded = load(ser, allowed_objects=[ChatWarp], valid_namespaces=["langchain_warp"])
        assert isinstance(loaded, ChatWarp)
        assert loaded.dict() == model.dict()
