"""`Tokenizer`: content vs markup entry points (§1.1), per-segment encoding and long-text cutting (§1.2), decoding."""

# ruff: noqa: E501 - the tables quote the spec's exact strings; wrapping them hides the bytes.

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from chat_helpers import ALL_MARKERS, TIKTOKEN_PATTERN, _ranks, _trained_bpe, make_hf, make_tiktoken

from warp_providers.chat.base import M, T
from warp_providers.errors import ModelFormatError
from warp_providers.tokenizer import MAX_CHUNK_CHARS, MAX_RUN_CHARS, Tokenizer, split_long_text


@pytest.mark.parametrize("marker", ALL_MARKERS)
def test_markers_are_one_control_id_in_markup_and_never_in_content(
    any_tok: Tokenizer, marker: str
) -> None:
    mid = any_tok.marker_id(marker)
    assert mid is not None and any_tok.is_control(mid) and mid in any_tok.control_ids
    assert any_tok.encode_markup(marker) == [mid]
    content = any_tok.encode_content(f"x{marker}y {marker}")
    assert not any(any_tok.is_control(i) for i in content)
    assert any_tok.decode(content) == f"x{marker}y {marker}"


def test_non_special_added_tokens_are_control_too() -> None:
    tok = make_hf(("<|im_end|>",), non_special=("<tool_call>",))
    tid = tok.marker_id("<tool_call>")
    assert tid is not None and tok.is_control(tid)
    assert (
        tid not in tok.encode_content("a<tool_call>b")
        and tok.encode_markup("a<tool_call>b").count(tid) == 1
    )


def test_add_special_tokens_false_is_not_enough() -> None:
    """The library's own switch still matches added tokens; our content path does not."""
    from tokenizers import Tokenizer as HF

    tok = make_hf()
    raw = HF.from_str(tok._backend.markup_tok.to_str())  # type: ignore[attr-defined]
    assert tok.marker_id("<|im_end|>") in raw.encode("<|im_end|>", add_special_tokens=False).ids
    assert tok.marker_id("<|im_end|>") not in tok.encode_content("<|im_end|>")


def test_wordlevel_vocabulary_holding_a_marker_spelling() -> None:
    from tokenizers import Tokenizer as HF
    from tokenizers import models, pre_tokenizers

    wl = HF(
        models.WordLevel(
            {"[UNK]": 0, "hello": 1, "<|im_end|>": 2, "<|im_": 3, "end|>": 4}, unk_token="[UNK]"
        )
    )
    wl.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = Tokenizer.from_tokenizer_json(wl.to_str(), special_tokens={"<|im_end|>": 2})
    assert tok.encode_markup("hello <|im_end|>") == [1, 2]
    ids = tok.encode_content("hello <|im_end|>")
    assert 2 not in ids and ids[0] == 1


def test_special_tokens_argument_adds_and_checks_ids() -> None:
    base = _trained_bpe()
    n = Tokenizer.from_tokenizer_json(base).vocab_size
    tok = Tokenizer.from_tokenizer_json(base, special_tokens={"<|new|>": n})
    assert tok.marker_id("<|new|>") == n and tok.is_control(n)
    with pytest.raises(ValueError, match="not 1"):
        Tokenizer.from_tokenizer_json(base, special_tokens={"<|other|>": 1})


def test_segments_encoded_separately_never_merged(any_tok: Tokenizer) -> None:
    segs = [T(" role"), T('="'), T("user"), T('"'), M("<|sep|>"), T(""), M("")]
    expected = (
        any_tok.encode_content(" role")
        + any_tok.encode_content('="')
        + any_tok.encode_content("user")
        + any_tok.encode_content('"')
        + [any_tok.marker_id("<|sep|>")]
    )
    assert any_tok.encode_segments(segs) == expected
    split = any_tok.encode_segments([T("hel"), T("lo")])
    assert split == any_tok.encode_content("hel") + any_tok.encode_content("lo")
    assert split != any_tok.encode_content("hello"), (
        "the vocabulary must merge across the cut for this test to mean anything"
    )


def test_no_bos_added(any_tok: Tokenizer) -> None:
    tok = make_hf(ALL_MARKERS)
    tok.bos_id = tok.marker_id("<|im_start|>")
    assert tok.bos_id not in tok.encode_segments([T("hi"), M("<|im_end|>")])


def test_split_long_text_rules() -> None:
    assert list(split_long_text("")) == []
    assert list(split_long_text("short text")) == ["short text"]
    word = "a" * (MAX_RUN_CHARS * 2 + 10)
    assert [len(p) for p in split_long_text(word)] == [MAX_RUN_CHARS, MAX_RUN_CHARS, 10]
    spaces = " " * (MAX_RUN_CHARS + 1)
    assert [len(p) for p in split_long_text("x" + spaces)] == [1 + MAX_RUN_CHARS, 1]
    alternating = "ab " * (MAX_CHUNK_CHARS // 3 + 5)
    pieces = list(split_long_text(alternating))
    assert "".join(pieces) == alternating and len(pieces[0]) == MAX_CHUNK_CHARS
    mixed = "x" * MAX_RUN_CHARS + " " + "y" * MAX_RUN_CHARS
    assert list(split_long_text(mixed)) == [mixed]
    for text in (word, "x" + spaces, alternating):
        assert all(p for p in split_long_text(text))


def test_encoding_goes_through_the_cut() -> None:
    calls: list[str] = []

    class Spy:
        def content(self, text: str) -> list[int]:
            calls.append(text)
            return [len(text)]

        markup = content

    tok = Tokenizer(Spy(), {})  # type: ignore[arg-type]
    assert tok.encode_content("z" * (MAX_RUN_CHARS + 3)) == [MAX_RUN_CHARS, 3]
    assert tok.encode_markup(" " * (MAX_RUN_CHARS + 1)) == [MAX_RUN_CHARS, 1]
    assert len(calls) == 4


@pytest.mark.parametrize("text", ["héllo wörld", "🦀 crab — ü", "plain", "日本語テキスト"])
def test_incremental_decoder_holds_partial_utf8(any_tok: Tokenizer, text: str) -> None:
    ids = any_tok.encode_content(text)
    dec = any_tok.incremental_decoder()
    pieces = [dec.feed(i) for i in ids] + [dec.flush()]
    assert "".join(pieces) == text == any_tok.decode(ids)
    assert all("\ufffd" not in p for p in pieces)


def test_a_character_split_over_tokens_comes_out_whole(any_tok: Tokenizer) -> None:
    ids = any_tok.encode_content("🐍")
    assert len(ids) > 1, (
        "this vocabulary must split the snake into byte tokens for the test to mean anything"
    )
    dec = any_tok.incremental_decoder()
    pieces = [dec.feed(i) for i in ids]
    assert pieces[:-1] == [""] * (len(ids) - 1) and pieces[-1] == "🐍" and dec.flush() == ""


def test_incremental_decoder_control_pieces_and_invalid_bytes(any_tok: Tokenizer) -> None:
    dec = any_tok.incremental_decoder()
    assert dec.feed(any_tok.marker_id("<|im_end|>")) == "<|im_end|>"  # type: ignore[arg-type]
    snake = any_tok.encode_content("🐍")
    assert len(snake) > 1
    assert dec.feed(snake[0]) == ""
    assert dec.flush() == "\ufffd"


def test_vocabulary_queries(any_tok: Tokenizer) -> None:
    assert any_tok.vocab_size >= 256 + len(ALL_MARKERS)
    mid = any_tok.marker_id("<|sep|>")
    assert any_tok.token_to_id("<|sep|>") == mid and any_tok.id_to_piece(mid) == "<|sep|>"  # type: ignore[arg-type]
    assert any_tok.control_tokens["<|sep|>"] == mid
    assert any_tok.marker_id("hello there") is None and any_tok.marker_id("<|nope|>") is None
    assert any_tok.token_to_id("<|nope|>") is None
    assert not any_tok.is_control(any_tok.encode_content("a")[0])


def test_from_dir_tokenizer_json(tmp_path: Path) -> None:
    tok = make_hf(("<|im_start|>", "<|im_end|>", "<s>"))
    (tmp_path / "tokenizer.json").write_text(tok._backend.markup_tok.to_str())  # type: ignore[attr-defined]
    config: dict[str, Any] = {
        "eos_token": {"content": "<|im_end|>"},
        "bos_token": "<s>",
        "chat_template": [{"name": "default", "template": "T"}],
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [7, tok.marker_id("<|im_end|>")]})
    )
    loaded = Tokenizer.from_dir(tmp_path)
    assert loaded.eos_ids == (7, tok.marker_id("<|im_end|>"))
    assert (
        loaded.bos_id == tok.marker_id("<s>")
        and loaded.chat_template == "T"
        and loaded.config["bos_token"] == "<s>"
    )
    (tmp_path / "tokenizer_config.json").write_text("{}")
    (tmp_path / "chat_template.jinja").write_text("J")
    assert Tokenizer.from_dir(tmp_path).chat_template == "J"


def test_from_dir_tiktoken(tmp_path: Path) -> None:
    import base64

    lines = [f"{base64.b64encode(k).decode()} {v}" for k, v in _ranks().items()]
    (tmp_path / "tiktoken.model").write_text("\n".join(lines) + "\n")
    n = len(_ranks())
    config = {
        "added_tokens_decoder": {str(n): {"content": "<|im_end|>", "special": True}},
        "eos_token": "<|im_end|>",
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="split pattern"):
        Tokenizer.from_dir(tmp_path)
    tok = Tokenizer.from_dir(tmp_path, pattern=TIKTOKEN_PATTERN)
    assert tok.eos_ids == (n,) and tok.marker_id("<|im_end|>") == n
    assert tok.encode_content("hello world") == make_tiktoken().encode_content("hello world")
    (tmp_path / "tiktoken.model").write_text("bad line with three\n")
    with pytest.raises(ValueError, match="expected"):
        Tokenizer.from_tiktoken(tmp_path / "tiktoken.model", TIKTOKEN_PATTERN, {})


def test_from_dir_missing(tmp_path: Path) -> None:
    with pytest.raises(ModelFormatError, match="neither tokenizer.json nor tiktoken.model"):
        Tokenizer.from_dir(tmp_path)
    with pytest.raises(ValueError, match="not JSON"):
        Tokenizer.from_tokenizer_json("{broken")
