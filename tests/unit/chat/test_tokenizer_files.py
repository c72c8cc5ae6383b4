"""Damaged tokenizer side files are refused before a tokenizer library sees them.

One case per class a container fuzz found: an id the tokenizers library cannot survive
(2^31 - 1 never returns), ids outside the model's vocabulary, files that are not JSON,
not UTF-8, of the wrong JSON shape, missing or unreadable, rank files with bad lines,
templates that do not parse. Each must be a `ModelFormatError` naming the file; none may
escape as a bare ValueError / KeyError / TypeError / JSONDecodeError or kill the process.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from chat_helpers import TIKTOKEN_PATTERN, _ranks

from warp_providers.errors import ModelFormatError
from warp_providers.synth._common import byte_tokenizer_json
from warp_providers.tokenizer import Tokenizer


def _hf_dir(tmp_path: Path, edit=None, config: Any = None) -> Path:
    text, _ = byte_tokenizer_json()
    spec = json.loads(text)
    if edit:
        edit(spec)
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    if config is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def _refused(directory: Path, file: str, **kw: Any) -> str:
    with pytest.raises(ModelFormatError) as exc:
        Tokenizer.from_dir(directory, **kw)
    assert file in str(exc.value), str(exc.value)
    return str(exc.value)


def _first_vocab(value: Any):
    def edit(spec):
        piece = next(iter(spec["model"]["vocab"]))
        spec["model"]["vocab"][piece] = value
    return edit


def test_the_pristine_files_load(tmp_path):
    tok = Tokenizer.from_dir(_hf_dir(tmp_path), vocab_size=258)
    assert tok.decode(tok.encode_content("hi")) == "hi"


def test_huge_vocab_id_is_refused_in_a_process_that_survives(tmp_path):
    """2^31 - 1 as a vocab id hangs or aborts the tokenizers library: it must never get
    there. Run in a child so a regression is a failed test, not a dead runner."""
    d = _hf_dir(tmp_path, _first_vocab(2**31 - 1))
    code = ("import sys\nfrom warp_providers import Tokenizer, ModelFormatError\n"
            "try:\n    Tokenizer.from_dir(sys.argv[1])\nexcept ModelFormatError as e:\n"
            "    print('refused:', e)\n")
    r = subprocess.run([sys.executable, "-c", code, str(d)], capture_output=True, text=True,
                       timeout=60, env=os.environ.copy())
    assert r.returncode == 0 and "refused: tokenizer.json" in r.stdout, (r.returncode, r.stderr)


@pytest.mark.parametrize("value", [-1, 258, 2**31 - 1, 2**63, 1.5, "7", True, None])
def test_vocab_ids_outside_the_vocabulary(tmp_path, value):
    _refused(_hf_dir(tmp_path, _first_vocab(value)), "tokenizer.json: model.vocab",
             vocab_size=258)


@pytest.mark.parametrize("value", [-1, 258, 2**31 - 1, "x", None])
def test_added_token_ids_outside_the_vocabulary(tmp_path, value):
    def edit(spec):
        spec["added_tokens"][0]["id"] = value
    _refused(_hf_dir(tmp_path, edit), "tokenizer.json: added_tokens[0]", vocab_size=258)


@pytest.mark.parametrize("edit", [
    lambda s: s.update(model=[]),
    lambda s: s["model"].update(type="Sentencepiece"),
    lambda s: s["model"].update(vocab=[1, 2]),
    lambda s: s["model"].update(merges={"a": "b"}),
    lambda s: s["model"]["merges"].append(7),
    lambda s: s.update(added_tokens={}),
    lambda s: s["added_tokens"].append("<x>"),
    lambda s: s["added_tokens"][0].update(content=""),
    lambda s: s["added_tokens"][0].update(special="yes"),
    lambda s: s.update(normalizer=[1]),
    lambda s: s.update(pre_tokenizer="bytes"),
])
def test_wrong_json_shapes(tmp_path, edit):
    _refused(_hf_dir(tmp_path, edit), "tokenizer.json")


def test_library_rejections_are_typed(tmp_path):
    """Shapes the library itself refuses (an unknown pre-tokenizer) surface as ours."""
    d = _hf_dir(tmp_path, lambda s: s.update(pre_tokenizer={"type": "NoSuchThing"}))
    _refused(d, "tokenizer.json")


@pytest.mark.parametrize("data", [b"", b"{", b"[1, 2]", b"\xff\xfe{}", b"[" * 100000,
                                  b'{"model": 1e999}'])
def test_not_json_or_not_an_object(tmp_path, data):
    (tmp_path / "tokenizer.json").write_bytes(data)
    _refused(tmp_path, "tokenizer.json")


@pytest.mark.parametrize("config", [
    [1], "x",
    {"added_tokens_decoder": []},
    {"added_tokens_decoder": {"abc": {"content": "<x>"}}},
    {"added_tokens_decoder": {"999999": {"content": "<x>"}}},
    {"added_tokens_decoder": {"5": "<x>"}},
    {"eos_token": 7},
    {"eos_token": "\udcff"},
    {"added_tokens_decoder": {"5": {"content": "\ud800"}}},
    {"chat_template": 7},
    {"chat_template": [{"name": "default"}]},
    {"chat_template": "{% for %}"},
    {"chat_template": "<|im_start|>\udcff{{ m }}"},  # a lone surrogate, via a JSON escape
    {"pat_str": 3},
])
def test_tokenizer_config(tmp_path, config):
    _refused(_hf_dir(tmp_path, config=config), "tokenizer_config.json", vocab_size=258)


@pytest.mark.parametrize("gen", [{"eos_token_id": "2"}, {"eos_token_id": [1, 999]},
                                 {"eos_token_id": -1}, [1]])
def test_generation_config(tmp_path, gen):
    d = _hf_dir(tmp_path)
    (d / "generation_config.json").write_text(json.dumps(gen))
    _refused(d, "generation_config.json", vocab_size=258)


@pytest.mark.parametrize("data", [b"{% if %}", b"\xff\xfe", b"{{ x "])
def test_chat_template_file(tmp_path, data):
    d = _hf_dir(tmp_path)
    (d / "chat_template.jinja").write_bytes(data)
    _refused(d, "chat_template.jinja")


def test_unreadable_files(tmp_path):
    d = _hf_dir(tmp_path)
    (d / "tokenizer.json").unlink()
    (d / "tokenizer.json").mkdir()  # a directory where a file should be
    (d / "tiktoken.model").mkdir()
    _refused(d, "neither tokenizer.json nor tiktoken.model")
    (d / "tokenizer.json").rmdir()
    _hf_dir(d)
    (d / "tokenizer_config.json").mkdir()
    _refused(d, "tokenizer_config.json")


def _tiktoken_dir(tmp_path: Path, lines: list[str], specials: dict[str, int] | None = None,
                  pat: Any = TIKTOKEN_PATTERN) -> Path:
    (tmp_path / "tiktoken.model").write_text("\n".join(lines) + "\n")
    n = len(_ranks())
    decoder = {str(v): {"content": k} for k, v in (specials or {"<|end|>": n}).items()}
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"added_tokens_decoder": decoder, "pat_str": pat}))
    return tmp_path


def _rank_lines() -> list[str]:
    return [f"{base64.b64encode(k).decode()} {v}" for k, v in _ranks().items()]


def test_tiktoken_pristine(tmp_path):
    tok = Tokenizer.from_dir(_tiktoken_dir(tmp_path, _rank_lines()))
    assert tok.decode(tok.encode_content("hello")) == "hello"


@pytest.mark.parametrize("bad", ["!!!notbase64 3", "aGk= x", "aGk= -1", "aGk= 99999999999",
                                 "aGk= 1 2", "\u00e9 1"])
def test_tiktoken_bad_lines(tmp_path, bad):
    _refused(_tiktoken_dir(tmp_path, [*_rank_lines(), bad]), "tiktoken.model")


def test_tiktoken_duplicates_and_clashes(tmp_path):
    lines = _rank_lines()
    dup = lines[0].split()[0] + " " + str(len(lines) + 5)
    _refused(_tiktoken_dir(tmp_path, [*lines, dup]), "tiktoken.model")
    _refused(_tiktoken_dir(tmp_path, lines, {"<|end|>": 0}), "tokenizer_config.json")
    _refused(_tiktoken_dir(tmp_path, lines, pat="(unclosed"), "tiktoken.model")
    _refused(_tiktoken_dir(tmp_path, lines, pat=None), "tokenizer_config.json")
