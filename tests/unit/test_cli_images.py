"""`warp run --image FILE` and `/image FILE` in `warp chat`, in-process on the fake tower."""

from __future__ import annotations

import json

import numpy as np

from fake_vision import expected_logits, png, vision_engine
from warp_providers import ChatSession, cli


def _patch_open(monkeypatch, **kw):
    opened = []

    def fake_open(a, *, vision=False):
        opened.append(vision)
        eng = vision_engine(vision=kw.get("tower", True))
        opened.append(eng)
        return eng

    monkeypatch.setattr(cli, "_open", fake_open)
    return opened


def _type_lines(monkeypatch, lines):
    """input() returns each of lines in turn, then raises EOFError (the user's ctrl-D)."""
    it = iter(lines)

    def fake_input(prompt=""):
        try:
            return next(it)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", fake_input)


def test_run_with_two_images(monkeypatch, tmp_path, capsys):
    opened = _patch_open(monkeypatch)
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    a.write_bytes(png(40, 60, 1))
    b.write_bytes(png(70, 30, 2))
    rc = cli.main(["run", "m.warp", "compare", "--image", str(a), "--image", str(b),
                   "-n", "1", "--json"])
    assert rc == 0
    assert opened[0] is True  # the tower was asked for
    eng = opened[1]
    out = json.loads(capsys.readouterr().out)
    ph = eng.vision_info()["placeholder_token_id"]
    prep = ChatSession(eng).prepare([cli._user_turn("compare", [str(a), str(b)])])
    assert out["prompt_ids"] == prep.ids and out["prompt_ids"].count(ph) == sum(
        im.n_tokens for im in prep.images)
    assert out["token_ids"][0] == int(np.argmax(expected_logits(eng, prep.ids, prep.images)))


def test_run_with_an_unreadable_image_is_one_line(monkeypatch, tmp_path, capsys):
    _patch_open(monkeypatch)
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    assert cli.main(["run", "m.warp", "x", "--image", str(bad)]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warp run: error:")
    assert cli.main(["run", "m.warp", "x", "--image", str(tmp_path / "none.png")]) != 0


def test_chat_image_command(monkeypatch, tmp_path, capsys):
    opened = _patch_open(monkeypatch)
    img = tmp_path / "cat.png"
    img.write_bytes(png(50, 50, 3))
    _type_lines(monkeypatch, [f"/image {img}", "/image", "what is it?",
                              f"/save {tmp_path / 'c.json'}"])
    assert cli.main(["chat", "m.warp", "--vision", "-n", "1"]) == 0
    assert opened[0] is True
    eng = opened[1]
    err = capsys.readouterr().err
    assert "/image needs a file name" in err
    saved = json.loads((tmp_path / "c.json").read_text())
    parts = saved[0]["content"]
    assert parts[0] == {"type": "text", "text": "what is it?"}
    assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert len(eng._ctx.encoded) == 1


def test_chat_image_without_a_tower(monkeypatch, tmp_path, capsys):
    _patch_open(monkeypatch, tower=False)
    img = tmp_path / "cat.png"
    img.write_bytes(png(20, 20))
    _type_lines(monkeypatch, [f"/image {img}"])
    assert cli.main(["chat", "m.warp"]) == 0
    assert "without a vision tower" in capsys.readouterr().err
