"""Two images through every surface on real towers (tiny random kimi_k25 and glm5_next).

Each checkpoint is built as the tower oracle tests build it (test_kimi_k25.py,
test_glm5_next_vision.py), with a byte-level tokenizer that carries Kimi K2.5's media
markers and a chat template placing one `<|media_pad|>` per image part, converted to an
f32 container and opened with `Engine.open(path, vision=True)`. A user message with two
PNG images (bytes made with Pillow) is sent through:

- the OpenAI SDK over the in-process transport (data: URLs),
- ChatWarp (LangChain image blocks, base64),
- LlamaIndex's `Warp` (ImageBlock with the bytes),

and the three replies must equal each other and transformers' own greedy continuation of
the same prompt ids with the pixel_values the library's preprocessing made (the rows the
library hands `encode_image` are in the layout the model's processor returns). On the
logits: the engine's last-position logits after the prompt equal transformers' (<= 1e-4),
and swapping the second image for another changes them (in both).
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

MAX_TOKENS = 4


def _tokenizer_json() -> str:
    from fake_vision import hf_tokenizer

    return hf_tokenizer().to_str()


def _media_ids(spec: str) -> tuple[int, int, int]:
    """(placeholder, start, end): `<|media_pad|>`, `<|media_begin|>`, `<|media_end|>`."""
    from tokenizers import Tokenizer as HFTokenizer

    hf = HFTokenizer.from_str(spec)
    return tuple(hf.token_to_id(t) for t in  # type: ignore[return-value]
                 ("<|media_pad|>", "<|media_begin|>", "<|media_end|>"))


@pytest.fixture(scope="module", params=["kimi_k25", "glm5_next"])
def tower(request, oracle_env, tmp_path_factory):
    """(arch, torch model, f32 container path)."""
    from fake_vision import TEMPLATE

    arch = request.param
    d = tmp_path_factory.mktemp(f"e2e_{arch}")
    spec = _tokenizer_json()
    ids = _media_ids(spec)
    if arch == "kimi_k25":
        import test_kimi_k25 as mod

        model = mod._build("base", d / "hf", ids=ids, tokenizer=spec)
    else:
        import test_glm5_next_vision as mod

        model = mod._build(d / "hf", ids=ids, tokenizer=spec)
    (d / "hf" / "chat_template.jinja").write_text(TEMPLATE)
    path = oracle_env.convert_to(d / "hf", d / "f32", trunk="f32", experts="f32",
                                 embedding="f32", output="f32")
    return arch, model, path


def _png(h: int, w: int, seed: int) -> bytes:
    from PIL import Image

    arr = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _openai_messages(a: bytes, b: bytes) -> list[dict[str, Any]]:
    def part(data: bytes) -> dict[str, Any]:
        return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + _b64(data)}}

    return [{"role": "user", "content": [{"type": "text", "text": "Compare "}, part(a),
                                         {"type": "text", "text": " with "}, part(b)]}]


def _pixels(arch: str, model: Any, images: list[Any]) -> tuple[Any, Any]:
    """transformers' pixel_values and image_grid_thw from the library's prepared images."""
    import torch

    if arch == "kimi_k25":  # the processor's [n, C, p, p]
        p = model.config.vision_config.patch_size
        pv = torch.cat([torch.from_numpy(im.rows).reshape(-1, 3, p, p) for im in images])
    else:  # [n, C * t * p * p]
        pv = torch.cat([torch.from_numpy(im.rows) for im in images])
    return pv, torch.tensor([list(im.grid_thw) for im in images])


def _greedy(model: Any, ids: list[int], pv: Any, grid: Any, stops: set[int]) -> list[int]:
    import torch

    out: list[int] = []
    with torch.no_grad():
        for _ in range(MAX_TOKENS):
            logits = model(input_ids=torch.tensor([ids + out]), pixel_values=pv,
                           image_grid_thw=grid).logits[0, -1]
            tok = int(torch.argmax(logits))
            if tok in stops:
                break
            out.append(tok)
    return out


def _last_logits(model: Any, ids: list[int], pv: Any, grid: Any) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), pixel_values=pv,
                     image_grid_thw=grid).logits[0, -1].numpy()


@pytest.mark.oracle
def test_two_images_through_every_surface(tower):
    import openai
    from langchain_core.messages import HumanMessage
    from langchain_warp import ChatWarp
    from llama_index.core.base.llms.types import ChatMessage, ImageBlock, MessageRole, TextBlock
    from llama_index.llms.warp import Warp
    from warp_openai import warp_transport

    from warp_providers import ChatSession, Engine

    arch, model, path = tower
    a, b, c = _png(40, 28, 1), _png(24, 36, 2), _png(24, 36, 3)
    eng = Engine.open(path, vision=True, threads=2)
    try:
        info = eng.vision_info()
        assert info is not None and info["arch"] == arch
        ph = int(info["placeholder_token_id"])
        assert ph == model.config.image_token_id

        session = ChatSession(eng)
        prep = session.prepare(_openai_messages(a, b))
        assert len(prep.images) == 2 and prep.ids.count(ph) == sum(
            im.n_tokens for im in prep.images)
        pv, grid = _pixels(arch, model, prep.images)
        stops = set(eng.tokenizer.eos_ids) | {ph}
        want_ids = _greedy(model, prep.ids, pv, grid, stops)
        want = eng.tokenizer.decode(want_ids)
        assert want_ids, "the random draw stops at once: nothing to compare"

        # the engine's own call with the prepared images: the same tokens
        res = eng.generate(prep.ids, images=prep.images, max_tokens=MAX_TOKENS, stop_ids=stops)
        assert res.token_ids == want_ids

        # (a) OpenAI SDK, data: URLs
        client = openai.OpenAI(api_key="test", max_retries=0,
                               http_client=warp_transport(engine=eng))
        out = client.chat.completions.create(model="m", max_tokens=MAX_TOKENS,
                                             temperature=0, messages=_openai_messages(a, b))
        assert out.usage.prompt_tokens == len(prep.ids)
        via_openai = out.choices[0].message.content

        # (b) ChatWarp, LangChain base64 image blocks
        msg = HumanMessage([{"type": "text", "text": "Compare "},
                            {"type": "image", "base64": _b64(a), "mime_type": "image/png"},
                            {"type": "text", "text": " with "},
                            {"type": "image", "base64": _b64(b), "mime_type": "image/png"}])
        via_langchain = ChatWarp(engine=eng, max_tokens=MAX_TOKENS, temperature=0).invoke(
            [msg]).content

        # (c) LlamaIndex ImageBlock
        li = ChatMessage(role=MessageRole.USER, blocks=[
            TextBlock(text="Compare "), ImageBlock(image=a, image_mimetype="image/png"),
            TextBlock(text=" with "), ImageBlock(image=b, image_mimetype="image/png")])
        via_llamaindex = Warp(engine=eng, max_tokens=MAX_TOKENS, temperature=0).chat(
            [li]).message.content

        assert via_openai == via_langchain == via_llamaindex == want, (
            arch, via_openai, via_langchain, via_llamaindex, want)

        # logits: the engine's equal transformers'; another second image changes both
        got = _engine_last_logits(eng, prep)
        ref = _last_logits(model, prep.ids, pv, grid)
        assert float(np.abs(got - ref).max()) <= 1e-4
        other = session.prepare(_openai_messages(a, c))
        pv2, grid2 = _pixels(arch, model, other.images)
        got2 = _engine_last_logits(eng, other)
        ref2 = _last_logits(model, other.ids, pv2, grid2)
        assert float(np.abs(got2 - ref2).max()) <= 1e-4
        assert float(np.abs(ref2 - ref).max()) > 1e-3
        assert float(np.abs(got2 - got).max()) > 1e-3
    finally:
        eng.close()


def _engine_last_logits(eng: Any, prep: Any) -> np.ndarray:
    """The engine's logits after the prompt, image rows from `Engine.encode_image`."""
    from warp_providers._engine import Context

    ctx = Context(str(eng.path), {"vision": True, "n_threads": 2})
    try:
        for im in prep.images:
            ctx.push_embeds(eng.encode_image(im))
        out = np.zeros(eng.vocab_size, np.float32)
        ctx.eval(np.array(prep.ids, np.int32), out, False)
        return out
    finally:
        ctx.close()



@pytest.mark.oracle
def test_warp_plan_vision(tower, capsys):
    """`warp plan --vision` counts the tower (weights as the manifest's v.* tensors, the
    reserve) in the floor; without the flag it shows them as not planned."""
    import json

    from warp_providers import cli

    _, _, path = tower
    man = json.loads((Path(path) / "manifest.json").read_text())
    tower_bytes = sum(t["bytes"] for t in man["trunk"]["tensors"] if t["name"].startswith("v."))
    plans = {}
    for flag in ([], ["--vision"]):
        assert cli.main(["plan", str(path), "--json", *flag]) == 0
        plans[bool(flag)] = json.loads(capsys.readouterr().out)
    on, off = plans[True], plans[False]
    assert on["vision_weight_bytes"] == off["vision_weight_bytes"] == tower_bytes > 0
    assert on["vision_bytes"] == tower_bytes + on["vision_reserve_bytes"]
    assert on["vision_reserve_bytes"] > 0 and off["vision_bytes"] == 0
    assert on["floor_bytes"] - off["floor_bytes"] == on["vision_bytes"]
    texts = {}
    for flag in ([], ["--vision"]):
        assert cli.main(["plan", str(path), *flag]) == 0
        texts[bool(flag)] = capsys.readouterr().out
    for text in texts.values():
        rows = [line.split()[0] for line in text.splitlines() if line.strip()]
        assert rows.count("vision") == 1 and "weights" in rows and "reserve" in rows
    assert "not planned: --vision" in texts[False]
    assert "not planned" not in texts[True]
