"""Images through the OpenAI surface (§7.8) on the fake vision tower, with the real SDK."""

from __future__ import annotations

import base64
import json
import os

import numpy as np
import openai
import pytest

from fake_vision import expected_logits, png, vision_engine
from warp_providers import ChatSession


def _url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def _body(*parts):
    return {"model": "m", "messages": [{"role": "user", "content": list(parts)}],
            "max_tokens": 2}


def _img(url, detail=None):
    ref = {"url": url, **({"detail": detail} if detail else {})}
    return {"type": "image_url", "image_url": ref}


def _post(api, body):
    return api.handle("POST", "/v1/chat/completions", json.dumps(body).encode())


@pytest.fixture
def api():
    from warp_openai import WarpAPI

    return WarpAPI(engine=vision_engine())


def test_sdk_data_url_image_is_read(make_client):
    eng = vision_engine()
    client = make_client(eng)
    a = png(60, 90, 1)
    out = client.chat.completions.create(
        model="m", max_tokens=1,
        messages=[{"role": "user", "content": [{"type": "text", "text": "what is it?"},
                                               _img(_url(a))]}])
    prep = ChatSession(eng).prepare([{"role": "user", "content": [
        {"type": "text", "text": "what is it?"}, _img(_url(a))]}])
    assert out.usage.prompt_tokens == len(prep.ids) > prep.images[0].n_tokens
    want = int(np.argmax(expected_logits(eng, prep.ids, prep.images)))
    assert out.choices[0].message.content == eng.tokenizer.decode([want])


def test_detail_is_a_patch_budget(api):
    big = _url(png(900, 1200, 2))
    low = _post(api, _body(_img(big, "low")))
    high = _post(api, _body(_img(big, "high")))
    assert low[0] == high[0] == 200
    assert low[1]["usage"]["prompt_tokens"] < high[1]["usage"]["prompt_tokens"]
    status, body = _post(api, _body(_img(big, "medium")))
    assert status == 400 and "detail" in body["error"]["message"]


@pytest.mark.parametrize("url,message", [
    ("https://example.com/cat.png", "image URLs over http(s) are not fetched"),
    ("http://127.0.0.1/cat.png", "image URLs over http(s) are not fetched"),
])
def test_remote_urls_are_a_clear_400(api, url, message):
    status, body = _post(api, _body(_img(url)))
    assert status == 400
    err = body["error"]
    assert message in err["message"] and err["param"] == "messages[0].content[0]"
    assert err["code"] == "invalid_image_url" and err["type"] == "invalid_request_error"


@pytest.mark.parametrize("url,message", [
    ("data:image/png;base64,@@@not base64@@@", "base64 payload does not decode"),
    (_url(png(40, 40)[:60]), "cannot"),
    (_url(b"GIF87a-not-really"), "unsupported or unrecognised"),
    (_url(b"BM" + bytes(60), "image/bmp"), "unsupported"),
    ("/etc/passwd", "local image paths are refused"),
])
def test_bad_images_are_400s(api, url, message):
    status, body = _post(api, _body(_img(url)))
    assert status == 400, body
    assert message in body["error"]["message"]
    assert body["error"]["code"] == "invalid_image"


def test_local_paths_only_inside_the_allowed_dir(tmp_path):
    from warp_openai import WarpAPI

    root = tmp_path / "imgs"
    root.mkdir()
    (root / "cat.png").write_bytes(png(30, 50, 3))
    (tmp_path / "secret.png").write_bytes(png(30, 50, 4))
    os.symlink(tmp_path / "secret.png", root / "link.png")
    api = WarpAPI(engine=vision_engine(), allow_local_images=root)
    for ref in ("cat.png", f"file://{root / 'cat.png'}", str(root / "cat.png")):
        status, body = _post(api, _body(_img(ref)))
        assert status == 200, body
    for ref in ("../secret.png", str(tmp_path / "secret.png"), "link.png",
                f"file://{tmp_path / 'secret.png'}"):
        status, body = _post(api, _body(_img(ref)))
        assert status == 400 and "outside the allowed" in body["error"]["message"], ref


def test_too_many_images_for_the_context():
    from warp_openai import WarpAPI

    api = WarpAPI(engine=vision_engine(ctx_kw={"ctx_tokens": 300}))
    big = _url(png(400, 400, 5))
    status, body = _post(api, _body(*[_img(big)] * 4))
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"


def test_models_without_a_tower_still_refuse(make_client):
    client = make_client(vision_engine(vision=False))
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**_body(_img(_url(png(20, 20)))))
    assert info.value.code == "vision_disabled"


def test_responses_input_image(make_client):
    eng = vision_engine()
    client = make_client(eng)
    a = png(44, 66, 6)
    out = client.responses.create(model="m", max_output_tokens=1, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "what is it?"},
                                     {"type": "input_image", "image_url": _url(a)}]}])
    prep = ChatSession(eng).prepare([{"role": "user", "content": [
        {"type": "text", "text": "what is it?"}, _img(_url(a))]}])
    assert out.usage.input_tokens == len(prep.ids)
    want = int(np.argmax(expected_logits(eng, prep.ids, prep.images)))
    assert out.output_text == eng.tokenizer.decode([want])
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="m", input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "https://example.com/a.png"}]}])
    assert err.value.body["code"] == "invalid_image_url"
