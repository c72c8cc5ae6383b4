"""A scripted engine for testing every layer above the binding without weights.

`ScriptedEngine` implements `EngineLike`: it "generates" replies taken from a script,
one token per character (the hardest case for streaming parsers), with chat markers
emitted as their control-token ids. Its tokenizer is a real `tokenizers` byte-level
model with no merges (one token per byte) plus ChatML/Hermes control tokens, and its
chat template is a ChatML template with tools and <think> reasoning.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from warp_providers import GenerationResult, Tokenizer, TokenEvent

MARKERS = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>",
           "<tool_response>", "</tool_response>", "<|endoftext|>"]

CHATML_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{%- endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}"
    "<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{%- elif message.role == 'assistant' %}<|im_start|>assistant\n"
    "{%- if message.reasoning_content %}<think>\n{{ message.reasoning_content }}\n</think>\n\n"
    "{%- endif %}{%- if message.content %}{{ message.content }}{%- endif %}"
    "{%- for tc in message.tool_calls or [] %}\n<tool_call>\n{\"name\": \"{{ tc.function.name }}\""
    ", \"arguments\": {{ tc.function.arguments | tojson if tc.function.arguments is not string "
    "else tc.function.arguments }}}\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}"
    "\n</tool_response><|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def tokenizer_json() -> str:
    """tokenizer.json text of the byte-level test vocabulary (265 ids)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(MARKERS)
    return hf.to_str()


def make_tokenizer() -> Tokenizer:
    """A byte-level tokenizer (one id per byte) with the chat markers as control tokens."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(MARKERS)
    spec = hf.to_str()
    im_end = hf.token_to_id("<|im_end|>")
    return Tokenizer.from_tokenizer_json(spec, eos_ids=[im_end], chat_template=CHATML_TEMPLATE)


Script = Callable[[list[int]], str] | Sequence[str]


class ScriptedEngine:
    """Replies from a script; marker spellings in a reply become control tokens.

    Args:
        replies: a list of reply texts used in turn (the last one repeats), or a
            function of the prompt ids returning the reply text.
        ctx_tokens: the context size reported by `info()`.
    """

    def __init__(self, replies: Script = ("Hello!",), ctx_tokens: int = 8192) -> None:
        self.tokenizer = make_tokenizer()
        self._replies = replies
        self._turn = 0
        self.prompts: list[list[int]] = []
        self.calls: list[dict[str, Any]] = []
        self.last_result: GenerationResult | None = None
        self._ctx = ctx_tokens
        self._lock = threading.Lock()
        self._held: list[int] = []  # the ids "in the context", as a prompt cache would keep

    def info(self) -> dict[str, Any]:
        return {"name": "scripted", "model_type": "scripted", "ctx_tokens": self._ctx,
                "vocab_size": self.tokenizer.vocab_size}

    def chat_metadata(self) -> dict[str, str | None]:
        return {"format": None, "template": CHATML_TEMPLATE}

    def stats(self) -> dict[str, Any]:
        return {"expert_hits": 0, "expert_misses": 0}

    def _reply_ids(self, prompt: list[int]) -> list[int]:
        if callable(self._replies):
            text = self._replies(prompt)
        else:
            text = self._replies[min(self._turn, len(self._replies) - 1)]
        self._turn += 1
        ids: list[int] = []
        i = 0
        while i < len(text):
            for m in MARKERS:
                if text.startswith(m, i):
                    ids.append(self.tokenizer.encode_markup(m)[0])
                    i += len(m)
                    break
            else:
                ids.extend(self.tokenizer.encode_content(text[i]))
                i += 1
        return ids

    def stream(self, prompt: str | Sequence[int], **kw: Any) -> Iterator[TokenEvent]:
        ids = self.tokenizer.encode_content(prompt) if isinstance(prompt, str) else list(prompt)
        with self._lock:
            self.prompts.append(ids)
            self.calls.append(dict(kw))
            reply = self._reply_ids(ids) + list(self.tokenizer.eos_ids[:1])
            # like the engine: reuse the longest common prefix, re-run the last prompt token
            limit = min(len(ids) - 1, len(self._held))
            cached = 0
            while cached < limit and ids[cached] == self._held[cached]:
                cached += 1
        max_tokens = kw.get("max_tokens") or 1 << 30
        stop_ids = set(kw.get("stop_ids") or self.tokenizer.eos_ids)
        should_stop = kw.get("should_stop")
        dec = self.tokenizer.incremental_decoder()
        out: list[int] = []
        finish = "length"
        text = ""
        ended = False
        try:
            for i, tok in enumerate(reply):
                if i >= max_tokens:
                    break
                if should_stop is not None and should_stop():
                    finish = "cancelled"
                    break
                if tok in stop_ids:
                    finish = "stop"
                    break
                out.append(tok)
                piece = dec.feed(tok)
                text += piece
                yield TokenEvent(i, tok, piece, -0.5)
            ended = True
        finally:
            self._held = ids + out
            # Like `Engine`: recorded however the generation ends (a consumer's close too).
            # The counters depend on this generation (bytes per token generated, prefill
            # speed from the prompt length), so a reply carrying another's stats shows it.
            self.last_result = GenerationResult(
                text=text, token_ids=out, finish_reason=finish if ended else "cancelled",
                prompt_tokens=len(ids), cached_tokens=cached,
                stats={"expert_hits": 3, "expert_misses": 1, "expert_lookups": 4,
                       "bytes_read": BYTES_PER_TOKEN * len(out), "decode_tok_s": 100.0,
                       "hit_rate": 0.75, "prompt_tokens_evaluated": len(ids),
                       "prefill_seconds": len(ids) / PREFILL_TOK_S,
                       "prefill_tok_s": PREFILL_TOK_S},
            )


BYTES_PER_TOKEN = 4096
"""`bytes_read` the scripted engine reports per generated token."""
PREFILL_TOK_S = 250.0
"""The prefill speed the scripted engine reports."""


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """A Hermes-style tool call as the scripted model writes it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"
