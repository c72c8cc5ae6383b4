"""The format registry: one lazy table, resolution order, and never a silent ChatML fallback."""

# ruff: noqa: E501 - the tables quote the spec's exact strings; wrapping them hides the bytes.

from __future__ import annotations

import sys

import pytest
from chat_helpers import (
    CHATML_JSON,
    GLM_MARKERS,
    KIMI_MARKERS,
    TEST_TEMPLATE,
    XTML_MARKERS,
    make_hf,
)

from warp_providers.chat import ChatFormatError, available, create, get, register, resolve
from warp_providers.chat.formats.chatjson import ChatJsonFormat
from warp_providers.chat.registry import FORMATS


def test_table_is_lazy_and_complete() -> None:
    assert available() == ["chatjson", "glm", "hf_template", "kimi", "xtml"]
    for name, target in FORMATS.items():
        module = target.partition(":")[0]
        assert module.startswith("warp_providers.chat.formats.")
        assert get(name).name == name


def test_formats_are_imported_on_first_use() -> None:
    import subprocess

    code = "import sys, warp_providers.chat as c; assert not any(m.startswith('warp_providers.chat.formats.') for m in sys.modules), sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": ":".join(sys.path)})


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ChatFormatError) as err:
        get("chatml")
    assert (
        "['chatjson', 'glm', 'hf_template', 'kimi', 'xtml']" in err.value.message
        and err.value.code == "unsupported_chat_format"
    )


def test_aliases_and_register(monkeypatch: pytest.MonkeyPatch) -> None:
    assert get("kimi_k3").name == "xtml" and get("glm4_moe").name == "glm"
    assert get("glm5_next").name == "glm" and get("glm5_next_text").name == "glm"
    monkeypatch.setitem(FORMATS, "mine", "warp_providers.chat.formats.chatjson:ChatJsonFormat")
    assert get("mine") is ChatJsonFormat
    with pytest.raises(ValueError):
        register("bad", "no_colon")
    register("mine2", "warp_providers.chat.formats.chatjson:ChatJsonFormat")
    FORMATS.pop("mine2")


def test_explicit_name_wins_and_must_fit() -> None:
    tok = make_hf((*XTML_MARKERS, *KIMI_MARKERS))
    assert resolve(name="kimi", metadata_format="xtml", tokenizer=tok).name == "kimi"
    assert resolve(metadata_format="kimi_k2", tokenizer=tok).name == "kimi"
    with pytest.raises(ChatFormatError, match="<|observation|>|glm"):
        resolve(name="glm", tokenizer=tok)
    with pytest.raises(ChatFormatError, match="needs the model's chat template"):
        create("hf_template")


@pytest.mark.parametrize(
    "markers,template,chat_json,expected",
    [
        (XTML_MARKERS + KIMI_MARKERS, None, None, "xtml"),
        (XTML_MARKERS, None, CHATML_JSON, "xtml"),
        (("<|im_start|>", "<|im_end|>"), None, CHATML_JSON, "chatjson"),
        (KIMI_MARKERS, None, None, "kimi"),
        (GLM_MARKERS, None, None, "glm"),
        (GLM_MARKERS + ("<|im_start|>", "<|im_end|>"), TEST_TEMPLATE, None, "glm"),
        (
            ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"),
            TEST_TEMPLATE,
            None,
            "hf_template",
        ),
    ],
)
def test_fingerprint_order(
    markers: tuple[str, ...], template: str | None, chat_json: dict | None, expected: str
) -> None:  # type: ignore[type-arg]
    fmt = resolve(chat_template=template, tokenizer=make_hf(markers), chat_json=chat_json)
    assert fmt.name == expected and fmt.stop_ids


def test_template_fingerprint_without_tokenizer() -> None:
    assert resolve(chat_template="<|open|><|close|><|sep|><|end_of_msg|>").name == "xtml"
    assert resolve(chat_template="{{ messages }}").name == "hf_template"


def test_never_falls_back_to_chatml() -> None:
    tok = make_hf(("<|im_start|>", "<|im_end|>"))
    with pytest.raises(ChatFormatError) as err:
        resolve(tokenizer=tok)
    assert "name one of ['chatjson', 'glm', 'hf_template', 'kimi', 'xtml']" in err.value.message
    assert err.value.param == "chat_format"


def test_failed_candidates_are_reported() -> None:
    tok = make_hf(("<|im_end|>",))
    glm_template = "[gMASK]<|assistant|><|observation|><arg_key><arg_value>"
    with pytest.raises(ChatFormatError) as err:
        resolve(tokenizer=tok, chat_json=CHATML_JSON, chat_template=glm_template)
    assert "; and chat.json uses <|im_start|>, which is not a single token" in err.value.message
    assert "; glm: " in err.value.message and "; hf_template: " in err.value.message


@pytest.mark.parametrize(
    "markers,chat_json,chat_reason",
    [
        (
            (),
            None,
            "the container has no chat.json describing its conversation format (examples/ has one per supported architecture)",
        ),
        (
            ("<|open|>", "<|im_end|>"),
            {"user": ["u", "v"], "open": "o"},
            'chat.json carries no control token that ends a generated turn: give it a "stop", or an "assistant" suffix that has one',
        ),
        (
            ("<|open|>", "<|close|>", "<|end_of_msg|>", "<|im_end|>"),
            CHATML_JSON,
            "chat.json uses <|im_start|>, which is not a single token in this container (got {n}): the tokenizer and the chat format disagree",
        ),
    ],
    ids=["no-chat.json", "bad-chat.json", "chat.json-marker-missing"],
)
def test_no_format_names_the_xtml_and_chat_json_reasons(
    markers: tuple[str, ...],
    chat_json: dict | None,
    chat_reason: str,  # type: ignore[type-arg]
) -> None:
    """§4.4 step 3: `<XTML reason>; and <chat.json reason>`, XTML's naming the first missing marker."""
    tok = make_hf(markers)
    first_missing = next(m for m in XTML_MARKERS if m not in markers)
    xtml_reason = (
        f"{first_missing} is not a single token in this container "
        f"(got {tok.markup_count(first_missing)}): its specials.json does not carry K3's XTML markers"
    )
    with pytest.raises(ChatFormatError) as err:
        resolve(tokenizer=tok, chat_json=chat_json)
    reason = chat_reason.format(n=tok.markup_count("<|im_start|>"))
    assert err.value.message == (
        f"{xtml_reason}; and {reason}; name one of ['chatjson', 'glm', 'hf_template', 'kimi', 'xtml']"
    )
    assert err.value.param == "chat_format" and err.value.code == "unsupported_chat_format"
