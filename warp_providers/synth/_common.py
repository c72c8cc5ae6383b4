"""What every generated checkpoint shares: its tokenizer and a seeded float16 shard writer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def byte_tokenizer_json() -> tuple[str, int]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    hf = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    return hf.to_str(), hf.get_vocab_size()


CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
           "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tokenizer_files(tokenizer: str | Path | None) -> tuple[str, dict[str, Any], int]:
    """tokenizer.json text, tokenizer_config and vocabulary size (generated or copied)."""
    tok_cfg: dict[str, Any] = {"chat_template": CHATML, "eos_token": "<|im_end|>"}
    if tokenizer is None:
        tok_json, vocab = byte_tokenizer_json()
        return tok_json, tok_cfg, vocab
    from tokenizers import Tokenizer

    tdir = Path(tokenizer)
    tok_json = (tdir / "tokenizer.json").read_text()
    if (tdir / "tokenizer_config.json").exists():
        tok_cfg = json.loads((tdir / "tokenizer_config.json").read_text())
    return tok_json, tok_cfg, Tokenizer.from_str(tok_json).get_vocab_size()


class Writer:
    """Writes config, tokenizer and float16 safetensors shards from one seeded RNG."""

    def __init__(self, out: Path, cfg: dict[str, Any], tok_json: str,
                 tok_cfg: dict[str, Any], seed: int) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(cfg, indent=2))
        (out / "tokenizer.json").write_text(tok_json)
        (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
        self.out = out
        self.rng = np.random.default_rng(seed)
        self.weight_map: dict[str, str] = {}

    def w(self, *dims: int, scale: float, dtype: type = np.float16) -> np.ndarray:
        """Return a matrix of N(0, scale^2) entries (float16 unless `dtype` says)."""
        return (self.rng.standard_normal(dims, dtype=np.float32) * scale).astype(dtype)

    def shard(self, name: str, tensors: dict[str, np.ndarray]) -> None:
        from safetensors.numpy import save_file

        save_file(tensors, str(self.out / name))
        self.weight_map.update({k: name for k in tensors})

    def finish(self) -> Path:
        (self.out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": self.weight_map}, indent=1))
        return self.out
