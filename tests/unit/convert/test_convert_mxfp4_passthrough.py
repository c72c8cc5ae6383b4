"""The fast path of MXFP4 experts kept as shipped: the engine's C repacking and CRC32C,
and shard reads instead of per-tensor mappings, give the bytes the numpy code gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from warp_providers.convert import ConvertError, convert, quant, writer
from warp_providers.convert.base import SafetensorsDir
from warp_providers.convert.quant import mxfp4_pack, mxfp4_unpack
from warp_providers.convert.writer import Crc32c, crc32c
from warp_providers.synth.kimi_k3 import KimiK3Shape, make_kimi_k3_checkpoint


def _element_order(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Container mxfp4 bytes written from FORMAT.md's description, element by element."""
    rows, groups = scales.shape
    out = bytearray()
    for r in range(rows):
        for g in range(groups):
            codes = [(int(packed[r, g * 16 + k // 2]) >> (4 * (k % 2))) & 15 for k in range(32)]
            out.append(int(scales[r, g]))
            out += bytes(codes[j] | codes[16 + j] << 4 for j in range(16))
    return np.frombuffer(bytes(out), np.uint8)


@pytest.mark.parametrize("fast", [True, False])
def test_mxfp4_pack_puts_every_element_where_the_format_says(fast: bool) -> None:
    rng = np.random.default_rng(1)
    packed = rng.integers(0, 256, (5, 48), dtype=np.uint8)  # 3 blocks a row
    scales = rng.integers(0, 255, (5, 3), dtype=np.uint8)
    got = mxfp4_pack(packed, scales, "t", fast=fast)
    assert np.array_equal(got, _element_order(packed, scales))
    back = mxfp4_unpack(got, 5, 96)
    assert np.array_equal(back[0], packed) and np.array_equal(back[1], scales)


def test_mxfp4_pack_fast_and_numpy_agree_on_every_byte_value() -> None:
    assert quant._engine_interleave() is not None, "the engine extension is not built"
    packed = np.arange(256 * 64, dtype=np.uint32).astype(np.uint8).reshape(64, 256)
    scales = np.arange(64 * 16, dtype=np.uint32).reshape(64, 16) % 255
    scales = scales.astype(np.uint8)
    assert np.array_equal(mxfp4_pack(packed, scales, "t", fast=True),
                          mxfp4_pack(packed, scales, "t", fast=False))


@pytest.mark.parametrize("fast", [True, False])
def test_mxfp4_pack_refuses_a_nan_scale_naming_row_and_block(fast: bool) -> None:
    packed = np.zeros((4, 32), np.uint8)
    scales = np.full((4, 2), 127, np.uint8)
    scales[2, 1] = 255
    with pytest.raises(ConvertError, match=r"'w\.scale'.*NaN.*row 2, block 1"):
        mxfp4_pack(packed, scales, "w.scale", fast=fast)


def test_crc32c_fast_and_numpy_agree_incrementally() -> None:
    assert writer._FAST_CRC is not None, "the engine extension is not built"
    rng = np.random.default_rng(2)
    data = rng.integers(0, 256, 3 << 20, dtype=np.uint8)
    assert crc32c(b"123456789", fast=True) == crc32c(b"123456789", fast=False) == 0xE3069283
    for n in (0, 1, 7, 4097, 1 << 20):
        assert crc32c(data[:n], fast=True) == crc32c(data[:n], fast=False)
    c = Crc32c(fast=True)
    for a, b in ((0, 5), (5, 70001), (70001, data.size)):
        c.update(data[a:b])
    assert c.value() == crc32c(data, fast=False)


def test_read_gives_the_bytes_the_mapping_gives(tmp_path: Path) -> None:
    src = make_kimi_k3_checkpoint(tmp_path / "k3", KimiK3Shape(num_hidden_layers=2))
    st = SafetensorsDir(src)
    for name in st.entries:
        assert np.array_equal(st.read(name), st.raw(name).reshape(-1).view(np.uint8)), name
    st.close()


def test_conversion_is_byte_identical_to_the_numpy_paths(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole container (manifest, trunk, every expert bank with its CRCs) is the same
    through the engine's C code as through numpy only."""
    src = make_kimi_k3_checkpoint(tmp_path / "k3", KimiK3Shape(num_hidden_layers=4,
                                                                num_experts=24))
    fast = convert(src, tmp_path / "fast.warp", trunk="f32")
    monkeypatch.setattr(writer, "_FAST_CRC", None)
    monkeypatch.setattr(quant, "_engine_interleave", lambda: None)
    slow = convert(src, tmp_path / "slow.warp", trunk="f32")
    names = sorted(p.name for p in fast.iterdir())
    assert names == sorted(p.name for p in slow.iterdir())
    assert any(n.startswith("experts-L") for n in names)
    for n in names:
        assert (fast / n).read_bytes() == (slow / n).read_bytes(), n
