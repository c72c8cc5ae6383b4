"""LlamaIndex's ImageBlock through Warp, on the fake vision tower."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from llama_index.core.base.llms.types import ChatMessage, ImageBlock, MessageRole, TextBlock

from fake_vision import expected_logits, png, vision_engine
from llama_index.llms.warp import Warp
from warp_providers import ChatFormatError, ChatSession


def test_chat_with_an_image_block():
    eng = vision_engine()
    data = png(64, 48, 3)
    msg = ChatMessage(role=MessageRole.USER, blocks=[
        TextBlock(text="What is in it?"), ImageBlock(image=data, image_mimetype="image/png")])
    out = Warp(engine=eng, max_tokens=1).chat([msg])
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    prep = ChatSession(eng).prepare([{"role": "user", "content": [
        {"type": "text", "text": "What is in it?"},
        {"type": "image_url", "image_url": {"url": url}}]}])
    want = eng.tokenizer.decode([int(np.argmax(expected_logits(eng, prep.ids, prep.images)))])
    assert out.message.content == want
    assert eng._ctx.encoded == [prep.images[0].grid_thw]


def test_image_block_detail_is_honoured():
    eng = vision_engine()
    data = png(900, 1200, 4)
    llm = Warp(engine=eng, max_tokens=1)
    usage = []
    for detail in ("low", "high"):
        msg = ChatMessage(role=MessageRole.USER, blocks=[
            ImageBlock(image=data, image_mimetype="image/png", detail=detail)])
        usage.append(llm.chat([msg]).raw["usage"]["prompt_tokens"])
    assert usage[0] < usage[1]


def test_without_a_tower_an_image_block_is_refused():
    msg = ChatMessage(role=MessageRole.USER, blocks=[
        ImageBlock(image=png(20, 20), image_mimetype="image/png")])
    with pytest.raises(ChatFormatError, match="vision tower"):
        Warp(engine=vision_engine(vision=False), max_tokens=1).chat([msg])
