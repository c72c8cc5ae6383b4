"""quant.py's mxfp4: its encoder against gguf-py's, the exact floor(log2) rule where
gguf-py's float32 log2 rounds up, the repacking of shipped MXFP4 code for code, the NaN
scale refused by name, and the writer's policy (kept as shipped unless another dtype is
named)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gq

from warp_providers.convert import ConvertError
from warp_providers.convert import quant as q
from warp_providers.convert.arch.gpt_oss import mxfp4_to_f32
from warp_providers.convert.plan import ExpertLayerSrc, Plan, SrcTensor
from warp_providers.convert.writer import _expert_dtype, encode_tensor, shipped_experts


def _rows(seed: int, n: int = 48, cols: int = 256) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scale = np.exp2(rng.integers(-20, 20, (n, 1)))
    return (rng.standard_normal((n, cols)) * scale).astype(np.float32)


def test_encode_and_decode_equal_gguf_py() -> None:
    x = _rows(3)
    x[0, :32] = 0.0  # an all-zero block: scale byte 0
    raw = q.encode(x, "mxfp4")
    ref = np.asarray(gq.quantize(x, GGMLQuantizationType.MXFP4)).reshape(-1)
    np.testing.assert_array_equal(raw, ref)
    assert raw.size == q.tensor_bytes("mxfp4", x.shape) == x.size // 32 * 17
    np.testing.assert_array_equal(
        q.decode(raw, "mxfp4", x.shape),
        np.asarray(gq.dequantize(ref.reshape(x.shape[0], -1), GGMLQuantizationType.MXFP4)))


def test_scale_exponent_is_the_exact_floor_of_log2() -> None:
    below8 = np.nextafter(np.float32(8), np.float32(0))  # float32 log2 rounds this to 3.0
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = below8
    assert q.encode(x, "mxfp4")[0] == 2 - 2 + 127  # floor(log2(8 - ulp)) = 2
    x[0, 0] = 8.0
    assert q.encode(x, "mxfp4")[0] == 3 - 2 + 127
    x[0, 0] = 1e-40  # below 2^-127 * 4: clamped to byte 0, not wrapped around
    assert q.encode(x, "mxfp4")[0] == 0
    x[0, 0] = 3e38  # floor(log2) = 127: the largest floats need byte 252, not more
    assert q.encode(x, "mxfp4")[0] == 252


def test_every_code_and_scale_decodes_exactly() -> None:
    codes = np.arange(256, dtype=np.uint8).reshape(16, 16)  # every nibble pair
    for e in (0, 1, 2, 127, 200, 252):
        blocks = np.concatenate([np.full((16, 1), e, np.uint8), codes], axis=1)
        got = q.decode(blocks.reshape(-1), "mxfp4", (16, 32)).astype(np.float64)
        lo, hi = codes & 15, codes >> 4
        vals = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, 0, -.5, -1, -1.5, -2, -3, -4, -6])
        want = np.ldexp(np.concatenate([vals[lo], vals[hi]], axis=1), e - 127)
        np.testing.assert_array_equal(got, want)


def test_pack_keeps_every_code_and_scale() -> None:
    rng = np.random.default_rng(7)
    rows, cols = 6, 128
    packed = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
    scales = rng.integers(100, 150, (rows, cols // 32), dtype=np.uint8)
    raw = q.mxfp4_pack(packed, scales, "w")
    assert raw.size == q.tensor_bytes("mxfp4", (rows, cols))
    p2, s2 = q.mxfp4_unpack(raw, rows, cols)
    np.testing.assert_array_equal(p2, packed)
    np.testing.assert_array_equal(s2, scales)
    # decoded, the container bytes are the checkpoint's values (an independent decoder)
    ref = mxfp4_to_f32(packed.reshape(rows, cols // 32, 16), scales)
    np.testing.assert_array_equal(q.decode(raw, "mxfp4", (rows, cols)), ref)
    # the gpt-oss layout [rows, groups, 16] packs the same
    np.testing.assert_array_equal(q.mxfp4_pack(packed.reshape(rows, -1, 16), scales, "w"), raw)


def test_pack_refuses_a_nan_scale_and_bad_shapes_by_name() -> None:
    packed = np.zeros((2, 32), np.uint8)
    scales = np.full((2, 2), 127, np.uint8)
    scales[1, 1] = 255
    with pytest.raises(ConvertError, match=r"'blk\.w'.*scale byte 255.*row 1, block 1"):
        q.mxfp4_pack(packed, scales, "blk.w")
    with pytest.raises(ConvertError, match="'blk.w'.*do not match"):
        q.mxfp4_pack(packed[:, :16], scales, "blk.w")
    raw = q.encode(np.ones((1, 64), np.float32), "mxfp4")
    raw[17] = 255
    with pytest.raises(ConvertError, match="'t'.*block 1"):
        q.check_blocks(raw, "mxfp4", "t")
    q.check_blocks(raw, "q4_0", "t")  # other dtypes have no scale byte to refuse
    with pytest.raises(ConvertError, match="multiple of 32"):
        q.row_bytes("mxfp4", 48)


def _mxfp4_src(name: str, rows: int, cols: int, seed: int) -> SrcTensor:
    rng = np.random.default_rng(seed)
    packed = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
    scales = rng.integers(120, 130, (rows, cols // 32), dtype=np.uint8)
    deq = mxfp4_to_f32(packed.reshape(rows, -1, 16), scales)
    return SrcTensor(name, (rows, cols), "experts", lambda r0, r1: deq[r0:r1],
                     rows * cols // 2, lambda: q.mxfp4_pack(packed, scales, name), "mxfp4")


def test_writer_keeps_shipped_mxfp4_unless_another_dtype_is_named() -> None:
    ts = (_mxfp4_src("g", 32, 64, 1), _mxfp4_src("u", 32, 64, 2), _mxfp4_src("d", 64, 32, 3))
    layer = ExpertLayerSrc(0, 1, ((32, 64), (32, 64), (64, 32)), lambda e: ts, 0)
    plan = Plan("x", {}, {}, [], [layer], [], {}, {}, "hf")
    assert shipped_experts(plan) == "mxfp4"
    assert _expert_dtype(ts, "mxfp4") == ("mxfp4", True)
    assert _expert_dtype(ts, "q4_0") == ("q4_0", False)  # re-quantized on request
    kept = encode_tensor(ts[0], "mxfp4", True)
    np.testing.assert_array_equal(kept, ts[0].raw())
    requant = encode_tensor(ts[0], "q4_0", False)
    assert requant.size == q.tensor_bytes("q4_0", (32, 64))
    floats = SrcTensor("f", (32, 64), "experts", ts[0].rows, 0)
    no_mx = ExpertLayerSrc(0, 1, layer.shapes, lambda e: (floats, floats, floats), 0)
    assert shipped_experts(Plan("x", {}, {}, [], [no_mx], [], {}, {}, "hf")) == "q4_0"
