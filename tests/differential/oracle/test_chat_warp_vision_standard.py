"""langchain-tests' own image tests for ChatWarp on a real multimodal container.

The container is a tiny random Kimi K2.5 (DeepSeek-V3 text + MoonViT tower, built as
test_kimi_k25.py builds it) with the byte-level test vocabulary, its media markers, and
a ChatML template with Hermes tool calls whose user and tool turns carry images
(`fake_vision.TOOLS_TEMPLATE`). `ChatWarp(model_path=..., engine_options={"vision": True})`
opens it as a user would.

The suite's `test_image_inputs` and `test_image_tool_message` run as langchain-tests
wrote them: OpenAI-style `image_url` data URLs and standard v1 `image` blocks, in a human
message and in a tool result. They download their picture with `httpx.get`; this
process opens no sockets, so that one call is answered with a PNG drawn here (the
suite's code is otherwise unchanged). The rest of the suite needs a model that follows
instructions and runs on SmolLM2 and the scripted engine
(tests/conformance/langchain); here only the image tests are collected, and each also
checks (below) that the image reached the tower: the prompt holds its positions.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from langchain_tests.integration_tests import ChatModelIntegrationTests

_IMAGE_TESTS = ("test_image_inputs", "test_image_tool_message")
_SUITE_URL = "https://raw.githubusercontent.com/"



def _picture() -> bytes:
    from PIL import Image

    arr = np.random.RandomState(7).randint(0, 256, (44, 60, 3)).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def k25_tools_path(oracle_env, tmp_path_factory) -> str:
    import test_kimi_k25 as k25
    from fake_vision import TOOLS_TEMPLATE, hf_tokenizer

    d = tmp_path_factory.mktemp("k25_tools")
    hf = hf_tokenizer()
    ids = tuple(hf.token_to_id(t) for t in ("<|media_pad|>", "<|media_begin|>", "<|media_end|>"))
    k25._build("base", d / "hf", ids=ids, tokenizer=hf.to_str())
    (d / "hf" / "chat_template.jinja").write_text(TOOLS_TEMPLATE)
    return str(oracle_env.convert_to(d / "hf", d / "f32", trunk="f32", experts="f32",
                                     embedding="f32", output="f32"))


class _Picture:
    content = _picture()


@pytest.mark.asyncio
@pytest.mark.filterwarnings("ignore:The test <Function .* is marked with '@pytest.mark.asyncio'")
class TestChatWarpVisionStandard(ChatModelIntegrationTests):
    @pytest.fixture(autouse=True)
    def _model_and_picture(self, k25_tools_path: str, monkeypatch: pytest.MonkeyPatch) -> Any:
        import httpx

        self._path = k25_tools_path
        fetched: list[str] = []

        def get(url: str, **_: Any) -> _Picture:
            assert url.startswith(_SUITE_URL), url  # only the suite's picture is answered
            fetched.append(url)
            return _Picture()

        monkeypatch.setattr(httpx, "get", get)
        yield
        assert fetched, "the suite's image test did not ask for its picture"

    @property
    def chat_model_class(self) -> type:
        from langchain_warp import ChatWarp

        return ChatWarp

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model_path": self._path, "engine_options": {"vision": True}, "max_tokens": 4}

    @property
    def standard_chat_model_params(self) -> dict[str, Any]:
        params = super().standard_chat_model_params
        return {k: v for k, v in params.items() if k not in ("api_key", "max_retries")}

    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def supports_image_inputs(self) -> bool:
        return True

    @property
    def supports_image_urls(self) -> bool:
        return False  # http(s) URLs are refused: this library opens no sockets

    @property
    def supports_image_tool_message(self) -> bool:
        return True


# Only the image tests run on this random-weight model (see the module docstring).
for _name in dir(ChatModelIntegrationTests):
    if _name.startswith("test_") and _name not in _IMAGE_TESTS:
        setattr(TestChatWarpVisionStandard, _name, None)


def test_the_suite_image_reaches_the_tower(k25_tools_path: str) -> None:
    """What the suite's tests send is read as an image: the prompt holds the picture's
    positions, and a different picture changes the logits the model answers from."""
    import base64

    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_warp import ChatWarp

    chat = ChatWarp(model_path=k25_tools_path, engine_options={"vision": True}, max_tokens=4)
    data = base64.b64encode(_picture()).decode()
    human = HumanMessage([{"type": "text", "text": "Describe."},
                          {"type": "image", "base64": data, "mime_type": "image/png"}])
    tool = [HumanMessage("get a diagram"),
            AIMessage([], tool_calls=[{"type": "tool_call", "id": "1", "name": "img",
                                       "args": {}}]),
            ToolMessage([{"type": "image_url",
                          "image_url": {"url": f"data:image/png;base64,{data}"}}],
                        tool_call_id="1")]
    from langchain_warp.chat_models import _message_dicts

    session = chat._open_session()
    ph = int(session.engine.vision_info()["placeholder_token_id"])
    for messages in ([human], tool):
        prep = session.prepare(_message_dicts(messages))
        assert len(prep.images) == 1
        assert prep.ids.count(ph) == prep.images[0].n_tokens > 0
    assert chat.invoke([human]).content is not None
