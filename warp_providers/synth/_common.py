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


class LazyNormal:
    """A [rows, cols] matrix of N(0, scale^2) entries drawn only when rows are sliced.

    What a generated container streams into the converter instead of a float16 shard:
    never held whole, so memory stays bounded by the slice being encoded. Rows r0..r1
    come from the seed (seed, tensor number, r0), so the same slicing gives the same bytes.
    """

    def __init__(self, shape: tuple[int, ...], scale: float, key: tuple[int, int]) -> None:
        self.shape = tuple(int(d) for d in shape)
        self.scale = scale
        self.key = key

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def reshape(self, *shape: int) -> LazyNormal:
        """The 2-D view ``[-1, cols]`` (the only view the converter takes)."""
        cols = self.shape[-1]
        rows = int(np.prod(self.shape)) // cols
        if tuple(shape) not in ((-1, cols), (rows, cols)):
            raise ValueError(f"a generated tensor offers only its [-1, {cols}] view")
        return LazyNormal((rows, cols), self.scale, self.key)

    def __getitem__(self, rows: slice) -> np.ndarray:
        r0, r1, _ = rows.indices(self.shape[0])
        rng = np.random.default_rng((*self.key, r0))
        return rng.standard_normal((max(r1 - r0, 0), *self.shape[1:]), dtype=np.float32) * \
            np.float32(self.scale)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self[0:self.shape[0]]
        return a if dtype is None else a.astype(dtype)


class RandomQ4Blocks(LazyNormal):
    """A [rows, cols] matrix that exists as random Q4_0 blocks (benchmark only).

    Each 32-value block is one fixed float16 scale and 16 random bytes of nibbles, no
    nibble 0 (a nibble n means (n - 8) x scale, so the values are -7..7 with 0 twice as
    likely: mean 0, RMS 4.18 x scale); the scale makes the RMS that of N(0, scale^2). The
    converter copies these bytes as they are (`encoded_as`), so a container of tens of GB
    is written at the speed of the random bytes instead of drawing and quantizing floats.
    Nothing about such weights is realistic beyond their sizes and finite activations.
    """

    encoded_as = "q4_0"
    RMS = float(np.sqrt((2 * sum(v * v for v in range(1, 8))) / 16))

    def __init__(self, shape: tuple[int, ...], scale: float, key: tuple[int, int]) -> None:
        super().__init__(shape, scale, key)
        if self.shape[-1] % 32:
            raise ValueError(f"Q4_0 rows need a multiple of 32 columns, got {self.shape[-1]}")

    def reshape(self, *shape: int) -> RandomQ4Blocks:
        view = super().reshape(*shape)
        return RandomQ4Blocks(view.shape, self.scale, self.key)

    def raw_bytes(self) -> np.ndarray:
        """The container bytes of the whole matrix (18 per block of 32 values)."""
        n_blocks = int(np.prod(self.shape)) // 32
        rng = np.random.default_rng(self.key)
        out = np.empty((n_blocks, 18), dtype=np.uint8)
        d = np.float16(self.scale / self.RMS)
        out[:, :2] = np.frombuffer(d.tobytes(), np.uint8)
        out[:, 2:] = _NO_ZERO_NIBBLE[
            np.frombuffer(rng.bytes(n_blocks * 16), np.uint8).reshape(n_blocks, 16)]
        return out.reshape(-1)

    def __getitem__(self, rows: slice) -> np.ndarray:
        """Rows as float32: the blocks decoded (what the bytes mean)."""
        r0, r1, _ = rows.indices(self.shape[0])
        cols = self.shape[-1]
        per_row = cols // 32 * 18
        raw = self.raw_bytes().reshape(self.shape[0], per_row)[r0:r1]
        blocks = raw.reshape(-1, 18)
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        q = blocks[:, 2:]
        vals = np.concatenate([q & 15, q >> 4], axis=1).astype(np.float32) - 8.0
        return (vals * d).reshape(r1 - r0, cols)


def _no_zero_nibble() -> np.ndarray:
    b = np.arange(256, dtype=np.uint8)
    lo, hi = b & 15, b >> 4
    lo = np.where(lo == 0, 8, lo)
    hi = np.where(hi == 0, 8, hi)
    return (lo | (hi << 4)).astype(np.uint8)


_NO_ZERO_NIBBLE = _no_zero_nibble()


class GeneratedTensors:
    """Generated tensors by name, read by the converter in place of a checkpoint's shards
    (the reading side of ``SafetensorsDir``: ``dir``, ``entries``, ``raw``)."""

    def __init__(self, out: Path, tensors: dict[str, np.ndarray | LazyNormal]) -> None:
        from warp_providers.convert.base import StEntry

        self.dir = out
        self._tensors = tensors
        self.entries = {
            n: StEntry(out / "generated", "F16", tuple(a.shape), 0, 2 * int(np.prod(a.shape)))
            for n, a in tensors.items()
        }

    def raw(self, name: str) -> np.ndarray | LazyNormal:
        return self._tensors[name]


class Writer:
    """Writes config, tokenizer and float16 safetensors shards from one seeded RNG.

    ``virtual``: no shard is written; the tensors are kept by name in ``tensors``, the
    matrices as `LazyNormal` (drawn when read), for `GeneratedTensors`. ``prefix`` is put
    before every tensor name (``language_model.``: the text model of a multimodal
    checkpoint).
    """

    def __init__(self, out: Path, cfg: dict[str, Any], tok_json: str,
                 tok_cfg: dict[str, Any], seed: int, *, virtual: bool = False,
                 prefix: str = "") -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(cfg, indent=2))
        (out / "tokenizer.json").write_text(tok_json)
        (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
        self.out = out
        self.seed = seed
        self.prefix = prefix
        self.rng = np.random.default_rng(seed)
        self.weight_map: dict[str, str] = {}
        self.tensors: dict[str, np.ndarray | LazyNormal] | None = {} if virtual else None
        self._drawn = 0
        self.random_blocks = False
        """Expert matrices as `RandomQ4Blocks` (virtual writers only; benchmark only)."""

    def w(self, *dims: int, scale: float, dtype: type = np.float16) -> Any:
        """Return a matrix of N(0, scale^2) entries (float16 unless `dtype` says)."""
        if self.tensors is not None:
            self._drawn += 1
            return LazyNormal(dims, scale, (self.seed, self._drawn))
        return (self.rng.standard_normal(dims, dtype=np.float32) * scale).astype(dtype)

    def expert(self, *dims: int, scale: float) -> Any:
        """An expert matrix: as `w`, or random Q4_0 blocks when `random_blocks` is set."""
        if self.random_blocks and self.tensors is not None:
            self._drawn += 1
            return RandomQ4Blocks(dims, scale, (self.seed, self._drawn))
        return self.w(*dims, scale=scale)

    def shard(self, name: str, tensors: dict[str, Any]) -> None:
        if self.prefix:
            tensors = {self.prefix + k: v for k, v in tensors.items()}
        self.weight_map.update({k: name for k in tensors})
        if self.tensors is not None:
            self.tensors.update(tensors)
            return
        from safetensors.numpy import save_file

        save_file(tensors, str(self.out / name))

    def finish(self) -> Path:
        (self.out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": self.weight_map}, indent=1))
        return self.out
