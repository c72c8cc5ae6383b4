"""Synthetic vocabularies and reply-feeding helpers for the chat-format tests (imported by them).

Vocabularies are real: a byte-level BPE trained in-process with `tokenizers`
on a small corpus, and a `tiktoken.Encoding` built from a hand-made rank
table; every marker of every format is added as a control token. Nothing is
downloaded.
"""

# ruff: noqa: E501 - the tables quote the spec's exact strings; wrapping them hides the bytes.

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterable, Sequence

from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from warp_providers.chat.base import ChatFormat, Delta, DeltaAccumulator, ReplyParser
from warp_providers.chat.formats.chatjson import ChatJsonFormat
from warp_providers.chat.formats.glm import GlmFormat
from warp_providers.chat.formats.hf_template import HfTemplateFormat
from warp_providers.chat.formats.kimi import KimiFormat
from warp_providers.chat.formats.xtml import XtmlFormat
from warp_providers.tokenizer import Tokenizer
from warp_providers.types import AssistantMessage

XTML_MARKERS = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>")
MEDIA_MARKERS = (
    "<|media_begin|>",
    "<|media_content|>",
    "<|media_pad|>",
    "<|media_end|>",
    "<|kimi_image_placeholder|>",
)
GLM_MARKERS = (
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<tool_response>",
    "</tool_response>",
    "<|observation|>",
    "[gMASK]",
    "<sop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<think>",
    "</think>",
)
KIMI_MARKERS = (
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|im_system|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_middle|>",
    "<|im_end|>",
)
HF_MARKERS = (
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<|endoftext|>",
)
ALL_MARKERS: tuple[str, ...] = tuple(
    sorted(set(XTML_MARKERS + MEDIA_MARKERS + GLM_MARKERS + KIMI_MARKERS + HF_MARKERS))
)

CORPUS = [
    'message role="user" role="assistant" role="system" role="tool" type="tool-declare"',
    "<| |> <|im_end|> im_end im_start end_of_msg open close sep think response tools call argument",
    "tool_call tool_response arg_key arg_value observation functions.get_weather:0 section begin",
    'hello world, the quick brown fox jumps over the lazy dog. {"city": "Paris", "days": 3}',
    "Here are the available tools, described in JSONSchema. You MUST call tools in the next message.",
    "get_weather search calc Oslo Rome Paris true false null 2.5 -12 1e+21 [1, 2] Météo — ü 🦀",
]

# ChatML with Hermes tool calls and a think channel, in the usual `{{- '...' }}` style; written for these tests.
TEST_TEMPLATE = r"""
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
    {{- '# Tools\n<tools>' }}
    {%- for tool in tools %}{{- '\n' + tool | tojson }}{%- endfor %}
    {{- '\n</tools>\nCall one with <tool_call>\n{"name": <name>, "arguments": <object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' and loop.first %}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\n' }}
        {%- if message.reasoning_content %}
            {{- '<think>\n' + message.reasoning_content.strip('\n') + '\n</think>\n\n' }}
        {%- endif %}
        {{- message.content or '' }}
        {%- for call in message.tool_calls or [] %}
            {%- if not loop.first or message.content %}{{- '\n' }}{%- endif %}
            {{- '<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' }}
            {{- call.function.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- set body = message.content if message.content is string else message.content | map(attribute='text') | join %}
        {{- '<|im_start|>user\n<tool_response>\n' + body + '\n</tool_response><|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for part in message.content %}
                {%- if part.type == 'image' %}{{- '<|media_pad|>' }}{%- else %}{{- part.text }}{%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking %}
        {{- '<think>\n' }}
    {%- elif enable_thinking is defined %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"""

CHATML_JSON = {
    "system": ["<|im_start|>system\n", "<|im_end|>\n"],
    "user": ["<|im_start|>user\n", "<|im_end|>\n"],
    "assistant": ["<|im_start|>assistant\n", "<|im_end|>\n"],
    "open": "<|im_start|>assistant\n",
}


@functools.lru_cache(maxsize=1)
def _trained_bpe() -> str:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=900, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    return str(tok.to_str())


def make_hf(
    markers: Iterable[str] = ALL_MARKERS,
    *,
    non_special: Iterable[str] = (),
    eos: Sequence[str] = (),
) -> Tokenizer:
    """A real `tokenizers` BPE with `markers` as special added tokens (and `non_special` as plain added ones)."""
    tok = HFTokenizer.from_str(_trained_bpe())
    loose = set(non_special)
    tok.add_special_tokens(
        [AddedToken(m, special=True, normalized=False) for m in markers if m not in loose]
    )
    tok.add_tokens([AddedToken(m, special=False, normalized=False) for m in loose])
    eos_ids = [tok.token_to_id(e) for e in eos]
    return Tokenizer.from_tokenizer_json(tok.to_str(), eos_ids=eos_ids)


TIKTOKEN_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@functools.lru_cache(maxsize=1)
def _ranks() -> dict[bytes, int]:
    ranks = {bytes([b]): b for b in range(256)}
    words = [w for line in CORPUS for w in line.replace('"', " ").split()] + [
        "<|",
        "|>",
        " role",
        '="',
        "_end",
    ]
    for word in sorted(set(words)):
        for variant in (word, " " + word):
            data = variant.encode("utf-8")
            for end in range(2, len(data) + 1):
                ranks.setdefault(data[:end], len(ranks))
    return ranks


def make_tiktoken(markers: Iterable[str] = ALL_MARKERS, *, eos: Sequence[str] = ()) -> Tokenizer:
    """A real `tiktoken.Encoding` from a small rank table, `markers` as special tokens."""
    ranks = _ranks()
    specials = {m: len(ranks) + i for i, m in enumerate(sorted(set(markers)))}
    return Tokenizer.from_tiktoken_ranks(
        ranks, TIKTOKEN_PATTERN, specials, eos_ids=[specials[e] for e in eos]
    )


FORMAT_FACTORIES: dict[str, Callable[[], ChatFormat]] = {
    "xtml": XtmlFormat,
    "glm": GlmFormat,
    "kimi": KimiFormat,
    "chatjson": lambda: ChatJsonFormat(CHATML_JSON),
    "hf_template": lambda: HfTemplateFormat(TEST_TEMPLATE),
}


def bound(name: str, tok: Tokenizer) -> ChatFormat:
    """A format from FORMAT_FACTORIES bound to `tok`."""
    return FORMAT_FACTORIES[name]().bind(tok)


# --------------------------------------------------------------------------- feeding replies
Item = tuple[int, str]


def items_from_ids(tok: Tokenizer, ids: Sequence[int]) -> list[Item]:
    """(id, piece) pairs as the engine reports them (incremental UTF-8 decoding)."""
    dec = tok.incremental_decoder()
    out = [(i, dec.feed(i)) for i in ids]
    tail = dec.flush()
    if tail:
        out.append((text_id(tok), tail))
    return out


def text_id(tok: Tokenizer) -> int:
    """An ordinary (non-control) token id to carry synthetic text pieces."""
    return tok.encode_content("a")[0]


def one_char_items(tok: Tokenizer, items: Sequence[Item]) -> list[Item]:
    """Control tokens kept; every other piece re-cut into one-character tokens."""
    tid = text_id(tok)
    out: list[Item] = []
    for i, piece in items:
        if tok.is_control(i):
            out.append((i, piece))
        else:
            out.extend((tid, ch) for ch in piece)
    return out


def random_chunk_items(tok: Tokenizer, items: Sequence[Item], rng: random.Random) -> list[Item]:
    """Control tokens kept; the text between them re-cut at random points."""
    tid = text_id(tok)
    out: list[Item] = []
    run = ""

    def spill() -> None:
        nonlocal run
        while run:
            k = rng.randint(1, max(1, min(len(run), 7)))
            out.append((tid, run[:k]))
            run = run[k:]

    for i, piece in items:
        if tok.is_control(i):
            spill()
            out.append((i, piece))
        else:
            run += piece
    spill()
    return out


def run_parser(
    parser: ReplyParser, items: Iterable[Item], *, hit_limit: bool = False
) -> tuple[list[Delta], AssistantMessage]:
    """Feed every item, flush, finish; return the deltas and the message."""
    deltas = [parser.feed(i, p) for i, p in items]
    deltas.append(parser.flush())
    return deltas, parser.finish(hit_limit=hit_limit)


def folded(deltas: Iterable[Delta], finish_reason: str | None) -> AssistantMessage:
    """What a streaming client rebuilds from the deltas."""
    acc = DeltaAccumulator()
    for d in deltas:
        acc.add(d)
    return acc.message(finish_reason)


def assert_stream_invariant(
    make_parser: Callable[[], ReplyParser], tok: Tokenizer, items: Sequence[Item], seed: int = 0
) -> AssistantMessage:
    """Token-by-token, one-char pieces and random re-chunking all give one message, equal to the folded deltas."""
    rng = random.Random(seed)
    variants = [list(items), one_char_items(tok, items)] + [
        random_chunk_items(tok, items, rng) for _ in range(4)
    ]
    results = []
    for variant in variants:
        deltas, msg = run_parser(make_parser(), variant)
        assert folded(deltas, msg.finish_reason).model_dump(
            exclude={"tool_calls": {"__all__": {"raw"}}}
        ) == msg.model_dump(exclude={"tool_calls": {"__all__": {"raw"}}})
        results.append(msg)
    for other in results[1:]:
        assert other == results[0]
    return results[0]


def control_ids_in(tok: Tokenizer, ids: Iterable[int]) -> list[int]:
    """The control-token ids of an encoded prompt, in order."""
    return [i for i in ids if tok.is_control(i)]
