"""An Engine over the fake multi-sequence context with a fake vision tower (Kimi K2.5 markup
in a ChatML template), PNG bytes, and the logits the fake gives a prompt with images."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from PIL import Image
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from fake_context import VISION, FakeBatchContext, FakeSingleContext, row_mark
from fake_engine import MARKERS
from warp_providers import Engine, Tokenizer

MEDIA = ["<|media_begin|>", "<|media_content|>", "<|media_pad|>", "<|media_end|>"]

# ChatML turns; an image part is Kimi K2.5's media block around one pad
TEMPLATE = (
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n"
    "{%- if message.content is string %}{{ message.content }}{%- else %}"
    "{%- for part in message.content %}"
    "{%- if part.type == 'image' %}<|media_begin|>image<|media_content|><|media_pad|><|media_end|>"
    "{%- else %}{{ part.text }}{%- endif %}{%- endfor %}{%- endif %}<|im_end|>\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def hf_tokenizer() -> HFTokenizer:
    """The byte-level tokenizer with the ChatML markers and the media markup as special
    tokens."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    hf = HFTokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(sorted(alphabet))},
                                merges=[]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(MARKERS + MEDIA)
    return hf


def tokenizer() -> Tokenizer:
    hf = hf_tokenizer()
    return Tokenizer.from_tokenizer_json(hf.to_str(), eos_ids=[hf.token_to_id("<|im_end|>")],
                                         chat_template=TEMPLATE)


def vision_engine(*, single: bool = False, vision: bool = True, **kw: Any) -> Engine:
    tok = tokenizer()
    info = {**VISION, "placeholder_token_id": tok.marker_id("<|media_pad|>")}
    cls = FakeSingleContext if single else FakeBatchContext
    ctx = cls(tok.vocab_size, vision=info if vision else None, **kw.pop("ctx_kw", {}))
    eng = Engine(ctx, "fake.warp", tok, **kw)
    eng.chat_metadata = lambda: {"format": None, "template": TEMPLATE}  # type: ignore
    return eng


def png(h: int, w: int, seed: int = 0) -> bytes:
    arr = np.random.RandomState(seed).randint(0, 256, (h, w, 3)).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def expected_logits(eng: Engine, ids: list[int], images: list[Any]) -> np.ndarray:
    """The fake's logits after a prompt whose placeholders consumed the images' rows in order."""
    from fake_context import MOD, fake_tower_rows, logits_after

    ph = eng.vision_info()["placeholder_token_id"]
    rows = [r for im in images for r in fake_tower_rows(im.rows, im.grid_thw, 2, 8)]
    hist, k = [], 0
    for t in ids:
        if t == ph:
            hist.append((t + row_mark(rows[k])) % MOD)
            k += 1
        else:
            hist.append(t)
    assert k == len(rows)
    return logits_after(hist, eng.vocab_size)


def _content(var: str) -> str:
    """Template text rendering `var` (a string, or text and image parts) with one media
    block per image part."""
    return (
        f"{{%- if {var} is string %}}{{{{ {var} }}}}{{%- else %}}"
        f"{{%- for part in {var} %}}"
        "{%- if part.type == 'image' %}<|media_begin|>image<|media_content|><|media_pad|>"
        "<|media_end|>{%- else %}{{ part.text }}{%- endif %}{%- endfor %}{%- endif %}"
    )


# ChatML with Hermes tool calls (fake_engine.CHATML_TEMPLATE) whose user and tool turns may
# carry images, each as TEMPLATE's media block
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "You may call functions. Signatures within <tools></tools>:\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n"
    "Calls go within <tool_call></tool_call> as {\"name\": ..., \"arguments\": ...}<|im_end|>\n"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or message.role == 'system' %}"
    "<|im_start|>{{ message.role }}\n" + _content("message.content") + "<|im_end|>\n"
    "{%- elif message.role == 'assistant' %}<|im_start|>assistant\n"
    "{%- if message.content %}{{ message.content }}{%- endif %}"
    "{%- for tc in message.tool_calls or [] %}\n<tool_call>\n{\"name\": \"{{ tc.function.name }}\""
    ", \"arguments\": {{ tc.function.arguments | tojson if tc.function.arguments is not string "
    "else tc.function.arguments }}}\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n"
    + _content("message.content") + "\n</tool_response><|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
