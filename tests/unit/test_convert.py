"""Converter unit tests: CRC32C, record layout, atomic writes, rope, quant, GGUF import, errors.

Fast and torch-free: HF checkpoints are written here with a hand-rolled safetensors
writer (numpy has no bf16/fp8), GGUF files with ``gguf.GGUFWriter``.
"""

from __future__ import annotations

import base64
import json
import math
import struct
from pathlib import Path
from typing import Any

import gguf  # a dependency of the converter: always present
import numpy as np
import pytest
from support import has_module, requires, write_wordlevel_tokenizer

from warp_providers.convert import ConvertError, convert
from warp_providers.convert import writer as W
from warp_providers.convert.gguf_src import build_tokenizer_json, unpermute_rows
from warp_providers.convert.base import fp8_e4m3_to_f32, rope_from_config, rope_inv_freq
from warp_providers.convert.quant import decode, encode, f32_to_bf16, tensor_bytes

# --------------------------------------------------------------------------- helpers


def _crc_ref(data: bytes) -> int:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        table.append(c)
    c = 0xFFFFFFFF
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def read_container(path: Path) -> dict[str, Any]:
    """Independent reader: checks every layout rule the converter promises, returns floats."""
    m = json.loads((path / "manifest.json").read_text())
    assert m["format"] == "warp" and m["format_version"] == 1
    trunk = (path / "trunk.bin").read_bytes()
    assert len(trunk) == m["trunk"]["bytes"]
    out: dict[str, Any] = {"manifest": m, "trunk": {}, "experts": {}}
    for t in m["trunk"]["tensors"]:
        assert t["offset"] % 64 == 0
        assert t["bytes"] == tensor_bytes(t["dtype"], t["shape"])
        raw = trunk[t["offset"] : t["offset"] + t["bytes"]]
        assert W.crc32c(raw) == t["crc32c"], t["name"]
        out["trunk"][t["name"]] = decode(raw, t["dtype"], t["shape"])
    for bank in m["experts"]:
        data = (path / bank["file"]).read_bytes()
        rb = bank["record_bytes"]
        assert rb % 4096 == 0 and len(data) == bank["n_experts"] * rb
        ts = bank["tensors"]
        assert [t["name"] for t in ts] == ["gate", "up", "down"] and ts[0]["offset"] == 64
        assert (
            ts[1]["offset"] == 64 + ts[0]["bytes"]
            and ts[2]["offset"] == ts[1]["offset"] + ts[1]["bytes"]
        )
        experts = []
        for e in range(bank["n_experts"]):
            rec = data[e * rb : (e + 1) * rb]
            f = struct.unpack("<4sIIIIIQQQQII", rec[:64])
            payload = sum(t["bytes"] for t in ts)
            assert f[:6] == (b"WPXR", 1, bank["layer"], e, W.DTYPE_IDS[ts[0]["dtype"]], 3)
            assert f[6:10] == (payload, ts[0]["offset"], ts[1]["offset"], ts[2]["offset"])
            assert f[10] == W.crc32c(rec[64 : 64 + payload])
            assert f[11] == W.crc32c(rec[:60])
            assert rec[64 + payload :] == bytes(rb - 64 - payload)
            experts.append(
                tuple(
                    decode(rec[t["offset"] : t["offset"] + t["bytes"]], t["dtype"], t["shape"])
                    for t in ts
                )
            )
        out["experts"][bank["layer"]] = experts
    return out


_ST_CODES = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": (None, 2), "F8_E4M3": (None, 1)}


def write_st(path: Path, tensors: dict[str, tuple[str, tuple[int, ...], bytes]]) -> None:
    """Minimal safetensors writer: {name: (dtype, shape, raw bytes)}."""
    header: dict[str, Any] = {}
    off = 0
    blobs = []
    for name, (dt, shape, raw) in tensors.items():
        assert len(raw) == math.prod(shape) * _ST_CODES[dt][1]
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    h = json.dumps(header).encode()
    h += b" " * ((-len(h)) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def _f32(a: np.ndarray) -> tuple[str, tuple[int, ...], bytes]:
    return ("F32", a.shape, a.astype("<f4").tobytes())


def _tiny_tokenizer(d: Path, n: int = 64) -> None:
    write_wordlevel_tokenizer(d, n)
    (d / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "{{ messages }}", "eos_token": "t1"})
    )


def make_qwen3_moe(
    d: Path, *, fused: bool = False, fp8: bool = False, seed: int = 0
) -> dict[str, np.ndarray]:
    """A 2-layer qwen3_moe checkpoint; returns the float weights by HF name."""
    rng = np.random.default_rng(seed)
    H, V, nh, nkv, hd, E, I = 64, 64, 4, 2, 16, 4, 32  # noqa: E741
    d.mkdir(parents=True, exist_ok=True)
    cfg = {
        "model_type": "qwen3_moe",
        "vocab_size": V,
        "hidden_size": H,
        "num_hidden_layers": 2,
        "num_attention_heads": nh,
        "num_key_value_heads": nkv,
        "head_dim": hd,
        "intermediate_size": 96,
        "moe_intermediate_size": I,
        "num_experts": E,
        "num_experts_per_tok": 2,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 128,
        "tie_word_embeddings": False,
        "eos_token_id": 1,
        "bos_token_id": 0,
    }
    if fp8:
        cfg["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [32, 32]}
    (d / "config.json").write_text(json.dumps(cfg))
    _tiny_tokenizer(d)
    w: dict[str, np.ndarray] = {}

    def mat(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32) * 0.1

    w["model.embed_tokens.weight"] = mat(V, H)
    w["model.norm.weight"] = 1 + mat(H)
    w["lm_head.weight"] = mat(V, H)
    for i in range(2):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + mat(H)
        w[p + "post_attention_layernorm.weight"] = 1 + mat(H)
        w[p + "self_attn.q_proj.weight"] = mat(nh * hd, H)
        w[p + "self_attn.k_proj.weight"] = mat(nkv * hd, H)
        w[p + "self_attn.v_proj.weight"] = mat(nkv * hd, H)
        w[p + "self_attn.o_proj.weight"] = mat(H, nh * hd)
        w[p + "self_attn.q_norm.weight"] = 1 + mat(hd)
        w[p + "self_attn.k_norm.weight"] = 1 + mat(hd)
        w[p + "mlp.gate.weight"] = mat(E, H)
        for e in range(E):
            w[p + f"mlp.experts.{e}.gate_proj.weight"] = mat(I, H)
            w[p + f"mlp.experts.{e}.up_proj.weight"] = mat(I, H)
            w[p + f"mlp.experts.{e}.down_proj.weight"] = mat(H, I)
    st: dict[str, tuple[str, tuple[int, ...], bytes]] = {}
    for name, a in w.items():
        if ".experts." in name and fused:
            continue
        if fp8 and a.ndim == 2 and "proj" in name:
            st[name], st[name + "_scale_inv"], w[name] = _fp8_encode(a)
        else:
            st[name] = _f32(a)
    if fused:
        for i in range(2):
            p = f"model.layers.{i}.mlp.experts."
            gu = np.stack(
                [
                    np.concatenate([w[p + f"{e}.gate_proj.weight"], w[p + f"{e}.up_proj.weight"]])
                    for e in range(E)
                ]
            )
            dn = np.stack([w[p + f"{e}.down_proj.weight"] for e in range(E)])
            st[p + "gate_up_proj"] = _f32(gu)
            st[p + "down_proj"] = _f32(dn)
    write_st(d / "model.safetensors", st)
    return w


def _fp8_encode(a: np.ndarray, block: int = 32) -> tuple[Any, Any, np.ndarray]:
    """Nearest-e4m3 encoding with per-block scales; returns entries and the decoded floats."""
    lut = fp8_e4m3_to_f32(np.arange(256, dtype=np.uint8))
    finite = np.where(np.isfinite(lut))[0]
    r, c = a.shape
    s = np.zeros((-(-r // block), -(-c // block)), np.float32)
    codes = np.zeros(a.shape, np.uint8)
    for bi in range(s.shape[0]):
        for bj in range(s.shape[1]):
            blk = a[bi * block : (bi + 1) * block, bj * block : (bj + 1) * block]
            s[bi, bj] = np.abs(blk).max() / 448.0 or 1.0
            x = blk / s[bi, bj]
            idx = np.abs(x[..., None] - lut[finite]).argmin(-1)
            codes[bi * block : (bi + 1) * block, bj * block : (bj + 1) * block] = finite[idx]
    dec = lut[codes] * np.repeat(np.repeat(s, block, 0), block, 1)[:r, :c]
    return ("F8_E4M3", a.shape, codes.tobytes()), _f32(s), dec.astype(np.float32)


# --------------------------------------------------------------------------- CRC32C


def test_crc32c_vectors() -> None:
    assert W.crc32c(b"123456789") == 0xE3069283
    assert W.crc32c(b"") == 0
    assert W.crc32c(bytes(32)) == 0x8A9136AA
    assert W.crc32c(b"\xff" * 32) == 0x62A8AB43
    assert W.crc32c(bytes(range(32))) == 0x46DD794E


@pytest.mark.parametrize("n", [1, 3, 4, 5, 511, 512, 513, 4099, 70001])
def test_crc32c_matches_bytewise_reference(n: int) -> None:
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
    assert W.crc32c(data) == _crc_ref(data)
    c = W.Crc32c()
    c.update(data[: n // 3])
    c.update(np.frombuffer(data[n // 3 :], np.uint8))
    assert c.value() == _crc_ref(data)


# --------------------------------------------------------------------------- record header


def test_record_header_layout() -> None:
    h = W.pack_record_header(
        layer=7,
        expert=3,
        dtype="q4_0",
        gate_bytes=1152,
        up_bytes=1152,
        down_bytes=1152,
        payload_crc=0xDEADBEEF,
    )
    assert len(h) == 64
    assert h[:4] == b"WPXR"
    assert struct.unpack_from("<IIIII", h, 4) == (1, 7, 3, 2, 3)
    assert struct.unpack_from("<QQQQ", h, 24) == (3456, 64, 64 + 1152, 64 + 2304)
    assert struct.unpack_from("<I", h, 56)[0] == 0xDEADBEEF
    assert struct.unpack_from("<I", h, 60)[0] == _crc_ref(h[:60])


def test_expert_records_in_container(tmp_path: Path) -> None:
    w = make_qwen3_moe(tmp_path / "src")
    out = convert(tmp_path / "src", tmp_path / "m.warp", experts="q4_0", trunk="f32")
    c = read_container(out)
    assert [b["layer"] for b in c["manifest"]["experts"]] == [0, 1]
    bank = c["manifest"]["experts"][1]
    assert bank["tensors"][0]["shape"] == [32, 64] and bank["tensors"][2]["shape"] == [64, 32]
    assert bank["record_bytes"] == 4096  # 64 + 3 * 1152 fits one page
    g, u, dn = c["experts"][1][2]
    ref = w["model.layers.1.mlp.experts.2.gate_proj.weight"]
    assert np.abs(g - ref).max() <= np.abs(ref).max() / 7 + 1e-6
    np.testing.assert_array_equal(
        c["trunk"]["blk.1.ffn_gate_inp.weight"], w["model.layers.1.mlp.gate.weight"]
    )


# --------------------------------------------------------------------------- writer atomicity


def test_writer_failure_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "x.warp"
    with pytest.raises(RuntimeError):
        with W.ContainerWriter(out) as w:
            w.add_trunk("a", "f32", [4], np.zeros(4, np.float32))
            raise RuntimeError("boom")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_convert_failure_midway_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_qwen3_moe(tmp_path / "src")
    calls = {"n": 0}
    real = W.ExpertBankWriter.write

    def failing(self: Any, *a: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full")
        real(self, *a)

    monkeypatch.setattr(W.ExpertBankWriter, "write", failing)
    with pytest.raises(OSError):
        convert(tmp_path / "src", tmp_path / "m.warp")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_existing_out_and_resume(tmp_path: Path) -> None:
    make_qwen3_moe(tmp_path / "src")
    (tmp_path / "m.warp").mkdir()
    with pytest.raises(ConvertError, match="already exists"):
        convert(tmp_path / "src", tmp_path / "m.warp")
    with pytest.raises(ConvertError, match="not a finished container"):
        convert(tmp_path / "src", tmp_path / "m.warp", resume=True)
    (tmp_path / "m.warp").rmdir()
    stale = tmp_path / "m.warp.partial-0123"
    stale.mkdir()
    (stale / "trunk.bin").write_bytes(b"junk")
    out = convert(tmp_path / "src", tmp_path / "m.warp", resume=True)
    assert not stale.exists()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert convert(tmp_path / "src", out, resume=True) == out  # finished: left as is
    assert before == {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ConvertError):
        convert(tmp_path / "src", out, resume=True, experts="q8_0")  # different request


def test_deterministic_output(tmp_path: Path) -> None:
    make_qwen3_moe(tmp_path / "src")
    a = convert(tmp_path / "src", tmp_path / "a.warp")
    b = convert(tmp_path / "src", tmp_path / "b.warp")
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes(), n


def test_progress_reports_all_bytes(tmp_path: Path) -> None:
    make_qwen3_moe(tmp_path / "src")
    seen: list[tuple[int, int, str]] = []
    convert(tmp_path / "src", tmp_path / "m.warp", progress=lambda d, t, s: seen.append((d, t, s)))
    assert seen and seen[-1][0] == seen[-1][1] > 0
    assert all(x[0] <= y[0] for x, y in zip(seen, seen[1:]))


# --------------------------------------------------------------------------- HF specifics


def test_sharded_checkpoint_with_index(tmp_path: Path) -> None:
    src = tmp_path / "src"
    w = make_qwen3_moe(src)
    names = sorted(w)
    halves = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    (src / "model.safetensors").unlink()
    for fn, part in halves.items():
        write_st(src / fn, {n: _f32(w[n]) for n in part})
    index = {"metadata": {}, "weight_map": {n: fn for fn, part in halves.items() for n in part}}
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    c = read_container(convert(src, tmp_path / "m.warp", experts="f32", trunk="f32"))
    np.testing.assert_array_equal(
        c["trunk"]["blk.1.attn_k.weight"], w["model.layers.1.self_attn.k_proj.weight"]
    )
    np.testing.assert_array_equal(
        c["experts"][0][1][1], w["model.layers.0.mlp.experts.1.up_proj.weight"]
    )
    index["weight_map"]["model.norm.weight"] = "model-00009-of-00002.safetensors"
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConvertError, match="model-00009-of-00002.safetensors"):
        convert(src, tmp_path / "o")


def test_fused_experts_equal_per_expert(tmp_path: Path) -> None:
    make_qwen3_moe(tmp_path / "a", fused=False, seed=3)
    make_qwen3_moe(tmp_path / "b", fused=True, seed=3)
    ca = read_container(convert(tmp_path / "a", tmp_path / "a.warp", experts="f32"))
    cb = read_container(convert(tmp_path / "b", tmp_path / "b.warp", experts="f32"))
    for layer in (0, 1):
        for ea, eb in zip(ca["experts"][layer], cb["experts"][layer]):
            for x, y in zip(ea, eb):
                np.testing.assert_array_equal(x, y)


def test_fp8_block_scales(tmp_path: Path) -> None:
    w = make_qwen3_moe(tmp_path / "src", fp8=True)
    c = read_container(convert(tmp_path / "src", tmp_path / "m.warp", experts="f32", trunk="f32"))
    np.testing.assert_allclose(
        c["trunk"]["blk.0.attn_q.weight"], w["model.layers.0.self_attn.q_proj.weight"]
    )
    np.testing.assert_allclose(
        c["experts"][1][3][2], w["model.layers.1.mlp.experts.3.down_proj.weight"]
    )


def test_fp8_e4m3_decode() -> None:
    v = fp8_e4m3_to_f32(np.array([0x00, 0x38, 0xB8, 0x7E, 0x01, 0x08, 0x40], np.uint8))
    np.testing.assert_array_equal(v, [0.0, 1.0, -1.0, 448.0, 2.0**-9, 2.0**-6, 2.0])
    assert np.isnan(fp8_e4m3_to_f32(np.array([0x7F], np.uint8)))[0]


def test_bf16_source_copied_raw(tmp_path: Path) -> None:
    w = make_qwen3_moe(tmp_path / "src")
    # rewrite as bf16
    st = {}
    for name, a in w.items():
        st[name] = ("BF16", a.shape, f32_to_bf16(a).tobytes())
    write_st(tmp_path / "src" / "model.safetensors", st)
    c = read_container(convert(tmp_path / "src", tmp_path / "m.warp", trunk="bf16", experts="bf16"))
    m = c["manifest"]
    dt = {t["name"]: t["dtype"] for t in m["trunk"]["tensors"]}
    assert dt["blk.0.attn_q.weight"] == "bf16" and dt["blk.0.attn_norm.weight"] == "f32"
    assert dt["token_embd.weight"] == "bf16"
    want = (f32_to_bf16(w["model.layers.0.self_attn.q_proj.weight"]).astype(np.uint32) << 16).view(
        np.float32
    )
    np.testing.assert_array_equal(c["trunk"]["blk.0.attn_q.weight"], want)


def test_unquantizable_rows_fall_back_to_f16(tmp_path: Path) -> None:
    d = tmp_path / "src"
    make_qwen3_moe(d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["moe_intermediate_size"] = 24  # down rows of 24 cannot be 32-blocked
    (d / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(1)
    st = {}
    w = make_qwen3_moe(tmp_path / "tmp")
    for name, a in w.items():
        if ".experts." in name:
            a = rng.standard_normal((24, 64) if "down" not in name else (64, 24)).astype(np.float32)
        st[name] = _f32(a)
    write_st(d / "model.safetensors", st)
    m = read_container(convert(d, tmp_path / "m.warp", experts="q4_0"))["manifest"]
    assert {t["dtype"] for b in m["experts"] for t in b["tensors"]} == {"f16"}


def test_tokenizer_and_template_copied(tmp_path: Path) -> None:
    make_qwen3_moe(tmp_path / "src")
    out = convert(tmp_path / "src", tmp_path / "m.warp")
    m = json.loads((out / "manifest.json").read_text())
    assert m["tokenizer"] == {
        "kind": "hf",
        "file": "tokenizer.json",
        "config": "tokenizer_config.json",
    }
    assert m["chat"]["template"] == "chat_template.jinja"
    assert (out / "chat_template.jinja").read_text() == "{{ messages }}"
    assert (out / "tokenizer.json").read_bytes() == (
        tmp_path / "src" / "tokenizer.json"
    ).read_bytes()
    hp = m["hparams"]
    assert hp["qk_norm"] == "head" and hp["norm_topk_prob"] is True and hp["eos_token_ids"] == [1]
    assert hp["layer_kinds"] == ["moe", "moe"] and hp["attn_scale"] == 0.25
    assert m["quantization"] == {
        "experts": "q4_0",
        "trunk": "q8_0",
        "embedding": "q8_0",
        "output": "q8_0",
    }


_TIKTOKEN_WORDS = (b"he", b"ll", b"llo", b"hello", b" w", b"or", b"orl", b"orld", b" world")
_TIKTOKEN_SPECIALS = {"<|im_start|>": 300, "<|im_end|>": 301}
_TIKTOKEN_PATTERN = r"""[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s+"""


def _tiktoken_checkpoint(src: Path, *, pattern_in: str) -> None:
    """Turns src into a tiktoken checkpoint: a rank file (256 bytes, then merges), the
    specials in tokenizer_config.json, and the split pattern where `pattern_in` says."""
    make_qwen3_moe(src)
    (src / "tokenizer.json").unlink()
    ranks = [bytes([b]) for b in range(256)] + list(_TIKTOKEN_WORDS)
    (src / "tiktoken.model").write_text(
        "".join(f"{base64.b64encode(t).decode()} {r}\n" for r, t in enumerate(ranks)))
    config: dict[str, Any] = {
        "added_tokens_decoder": {str(i): {"content": c, "special": True}
                                 for c, i in _TIKTOKEN_SPECIALS.items()},
        "eos_token": "<|im_end|>",
        "chat_template": "{{ messages }}",
    }
    if pattern_in == "config":
        config["pat_str"] = _TIKTOKEN_PATTERN
    (src / "tokenizer_config.json").write_text(json.dumps(config))
    if pattern_in == "code":  # as Kimi-K2's tokenization_kimi.py spells it
        halves = _TIKTOKEN_PATTERN.split("|", 1)
        (src / "tokenization_tiny.py").write_text(
            "class TinyTokenizer:\n"
            f"    pat_str = \"|\".join(\n        [\n            r\"\"\"{halves[0]}\"\"\",\n"
            f"            r\"\"\"{halves[1]}\"\"\",\n        ]\n    )\n")


@pytest.mark.parametrize("pattern_in", ["config", "code"])
def test_tiktoken_checkpoint_gives_a_self_contained_container(
    tmp_path: Path, pattern_in: str
) -> None:
    from warp_providers import Tokenizer

    src = tmp_path / "src"
    _tiktoken_checkpoint(src, pattern_in=pattern_in)
    out = convert(src, tmp_path / "m.warp")
    m = json.loads((out / "manifest.json").read_text())
    assert m["tokenizer"] == {"kind": "tiktoken", "file": "tiktoken.model",
                              "config": "tokenizer_config.json"}
    assert not list(out.glob("*.py"))  # the pattern travels as data, not code
    assert json.loads((out / "tokenizer_config.json").read_text())["pat_str"] == _TIKTOKEN_PATTERN
    tok = Tokenizer.from_dir(out)  # what Engine.open reads: nothing outside the container
    # ranks 256.. are the merges: "hello" 259, " world" 264
    assert tok.encode_content("hello world") == [259, 264]
    assert tok.encode_content("hello<|im_end|>")[0] == 259
    assert 301 not in tok.encode_content("hello<|im_end|>")  # text never makes a control
    assert tok.eos_ids == (301,) and tok.marker_id("<|im_start|>") == 300
    assert tok.decode([259, 264]) == "hello world"


def test_tiktoken_checkpoint_without_a_split_pattern_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _tiktoken_checkpoint(src, pattern_in="nowhere")
    (src / "tokenization_tiny.py").write_text("pat_str = load_pattern()\n")  # not literal
    with pytest.raises(ConvertError, match=r"tiktoken.model.*pat_str"):
        convert(src, tmp_path / "m.warp")
    assert not (tmp_path / "m.warp").exists()


# --------------------------------------------------------------------------- rope


def _base(theta: float, dim: int) -> np.ndarray:
    return np.array([theta ** (-(2 * i) / dim) for i in range(dim // 2)])


def test_rope_default_linear_dynamic() -> None:
    inv, af = rope_inv_freq("default", 10000.0, 16, {}, 128)
    np.testing.assert_allclose(inv, _base(10000.0, 16), rtol=1e-7)
    assert af == 1.0
    inv, _ = rope_inv_freq("linear", 10000.0, 16, {"factor": 4.0}, 128)
    np.testing.assert_allclose(inv, _base(10000.0, 16) / 4, rtol=1e-7)
    inv, _ = rope_inv_freq("dynamic", 10000.0, 16, {"factor": 4.0}, 128)
    np.testing.assert_allclose(inv, _base(10000.0, 16), rtol=1e-7)


def test_rope_llama3() -> None:
    p = {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    inv, _ = rope_inv_freq("llama3", 500000.0, 128, p, 131072)
    want = []
    for f in _base(500000.0, 128):
        wl = 2 * math.pi / f
        if wl < 8192 / 4:
            want.append(f)
        elif wl > 8192 / 1:
            want.append(f / 8)
        else:
            s = (8192 / wl - 1) / (4 - 1)
            want.append((1 - s) * f / 8 + s * f)
    np.testing.assert_allclose(inv, want, rtol=1e-6)
    assert inv[0] == pytest.approx(1.0) and inv[-1] < _base(500000.0, 128)[-1]


def test_rope_yarn_and_attention_factor() -> None:
    p = {"factor": 4.0, "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}
    dim, theta = 64, 10000.0
    inv, af = rope_inv_freq("yarn", theta, dim, p, 16384)
    assert af == pytest.approx(0.1 * math.log(4.0) + 1)

    def cd(rot: float) -> float:
        return dim * math.log(4096 / (rot * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = max(math.floor(cd(32)), 0), min(math.ceil(cd(1)), dim - 1)
    want = []
    for i, f in enumerate(_base(theta, dim)):
        ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)
        want.append(f / 4 * ramp + f * (1 - ramp))
    np.testing.assert_allclose(inv, want, rtol=1e-6)
    _, af2 = rope_inv_freq("yarn", theta, dim, {**p, "mscale": 1.0, "mscale_all_dim": 1.0}, 16384)
    assert af2 == pytest.approx(1.0)
    _, af3 = rope_inv_freq("yarn", theta, dim, {**p, "attention_factor": 0.5}, 16384)
    assert af3 == 0.5


def test_rope_config_spellings_and_partial_rotary() -> None:
    new = {
        "rope_parameters": {
            "rope_type": "linear",
            "rope_theta": 5e5,
            "factor": 2.0,
            "partial_rotary_factor": 0.5,
        }
    }
    assert rope_from_config(new, 64) == ("linear", 5e5, 32, {**new["rope_parameters"]})
    old = {
        "rope_theta": 1e6,
        "rope_scaling": {"type": "dynamic", "factor": 2.0},
        "partial_rotary_factor": 0.25,
    }
    rt, th, dim, params = rope_from_config(old, 128)
    assert (rt, th, dim, params["factor"]) == ("dynamic", 1e6, 32, 2.0)
    assert rope_from_config({}, 64)[:3] == ("default", 10000.0, 64)
    with pytest.raises(ConvertError, match="longrope"):
        rope_inv_freq("longrope", 1e4, 64, {}, 128)


# --------------------------------------------------------------------------- quant


# q8_0: half a step of amax/127 plus the f16 rounding of the scale; q4_0: the side
# opposite the extreme value clamps at 7/8 of it, so up to amax/8.
@pytest.mark.parametrize(
    "dtype,tol",
    [("q8_0", 1 / 254 + 1 / 1500), ("q4_0", 1 / 8 + 1e-3), ("f16", 1e-3), ("bf16", 8e-3)],
)
def test_quant_round_trip(dtype: str, tol: float) -> None:
    x = np.random.default_rng(5).standard_normal((8, 96)).astype(np.float32)
    raw = encode(x, dtype)
    assert raw.size == tensor_bytes(dtype, x.shape)
    y = decode(raw, dtype, x.shape)
    blocks = np.abs(x).reshape(8, 3, 32).max(-1).repeat(32, -1).reshape(8, 96)
    assert np.all(np.abs(x - y) <= tol * blocks + 1e-6)
    assert np.array_equal(decode(encode(y, "f32"), "f32", x.shape), y)


def test_q8_0_block_layout_matches_gguf() -> None:
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)
    raw = encode(x, "q8_0")
    assert raw.tobytes() == gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0).tobytes()
    d = np.frombuffer(raw[:2].tobytes(), "<f2")[0]
    assert d == np.float16(1 / 127) and np.frombuffer(raw[2:34].tobytes(), np.int8)[0] == -127


def test_bf16_rounds_to_nearest_even() -> None:
    x = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -2.5, np.inf], np.float32)
    np.testing.assert_array_equal(f32_to_bf16(x), [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x7F80])
    assert f32_to_bf16(np.array([np.nan], np.float32))[0] & 0x7FC0 == 0x7FC0


# --------------------------------------------------------------------------- GGUF


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's HF -> GGUF q/k row order."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _unpermute_ref(stored: np.ndarray, n_head: int) -> np.ndarray:
    """HF row order of rows stored in llama.cpp's order (the inverse of `_permute`)."""
    where = _permute(np.arange(stored.shape[0], dtype=np.float32)[:, None], n_head)[:, 0]
    out = np.empty_like(stored)
    out[where.astype(np.int64)] = stored
    return out


_K_QUANTS = (gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K)


def _k_quant_blocks(rng: np.random.Generator, qt: Any, shape: tuple[int, ...]) -> np.ndarray:
    """Random but valid K-quant bytes for a tensor of `shape`: random quants and scales,
    finite f16 super-block scales (Q4_K: d and dmin lead the block; Q6_K: d ends it)."""
    block, size = gguf.GGML_QUANT_SIZES[qt]
    n_blocks = math.prod(shape) // block
    raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    scales = (rng.uniform(0.002, 0.02, (n_blocks, 2)) * rng.choice([-1, 1], (n_blocks, 2)))
    f16 = scales.astype(np.float16).view(np.uint8)
    if qt == gguf.GGMLQuantizationType.Q4_K:
        raw[:, 0:4] = f16
    else:
        raw[:, size - 2 : size] = f16[:, :2]
    return raw.reshape(*shape[:-1], shape[-1] // block * size)


def _byte_tokens() -> tuple[list[str], list[str]]:
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), 256))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    byte_chars = [chr(c) for _, c in sorted(zip(bs, cs))]
    merges = ["h e", "l l", "he ll", "hell o", "Ġ w"]
    return byte_chars + ["he", "ll", "hell", "hello", "Ġw"], merges


SP_PIECES = ["\u2581", "h", "e", "l", "o", "w", "r", "d", ",", "ll", "\u2581h", "\u2581he",
             "llo", "\u2581hello", "\u2581w", "or", "\u2581wor", "ld", "\u2581world"]
"""SentencePiece-BPE pieces, best merge first (llama.cpp stores no merges for them)."""


def sp_vocab() -> tuple[list[str], list[int], list[float]]:
    """A Llama-2-style vocabulary: unk, BOS, EOS, 256 byte pieces, pieces, 2 chat markers."""
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *SP_PIECES,
              "<|im_start|>", "<|im_end|>"]
    # llama.cpp's token types: 2 unknown, 3 control, 6 byte, 1 normal
    types = [2, 3, 3] + [6] * 256 + [1] * len(SP_PIECES) + [3, 3]
    scores = [0.0] * 259 + [-float(i) for i in range(len(SP_PIECES))] + [0.0, 0.0]
    return tokens, types, scores


def write_tiny_gguf(
    path: Path,
    *,
    moe: bool = False,
    qtype: str = "Q8_0",
    tied: bool = True,
    arch: str = "llama",
    tok_model: str = "gpt2",
    hidden: int = 64,
) -> dict[str, np.ndarray]:
    """A 2-layer llama (or Mixtral-like) GGUF; returns the float weights in HF row order.

    A K-quant ``qtype`` stores random valid blocks (gguf can dequantize K-quants but not
    make them) in every tensor whose rows are 256 wide, and F16 in the others.
    """
    rng = np.random.default_rng(11)
    H, nh, nkv, F, E = hidden, 4, 2, 96, 4
    hd = H // nh
    tokens, merges = _byte_tokens()
    tokens = tokens + ["<|im_start|>", "<|im_end|>"]
    V = len(tokens) + 3  # padded embedding
    g = gguf.GGUFWriter(str(path), arch)
    g.add_block_count(2)
    g.add_context_length(256)
    g.add_embedding_length(H)
    g.add_feed_forward_length(F)
    g.add_head_count(nh)
    g.add_head_count_kv(nkv)
    g.add_rope_freq_base(50000.0)
    g.add_layer_norm_rms_eps(1e-5)
    g.add_rope_dimension_count(hd)
    if moe:
        g.add_expert_count(E)
        g.add_expert_used_count(2)
    g.add_tokenizer_model(tok_model)
    if tok_model == "llama":  # SentencePiece, as llama.cpp writes Llama-2/Mistral files
        tokens, types, scores = sp_vocab()
        V = len(tokens) + 3
        g.add_token_list(tokens)
        g.add_token_types(types)
        g.add_token_scores(scores)
        g.add_unk_token_id(0)
        g.add_bos_token_id(1)
        g.add_eos_token_id(2)
    else:
        g.add_tokenizer_pre("gpt2")
        g.add_token_list(tokens)
        g.add_token_types([1] * (len(tokens) - 2) + [3, 3])
        g.add_token_merges(merges)
        g.add_bos_token_id(len(tokens) - 2)
        g.add_eos_token_id(len(tokens) - 1)
    g.add_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}")
    ref: dict[str, np.ndarray] = {}
    qt = getattr(gguf.GGMLQuantizationType, qtype)

    def mat(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32) * 0.1

    def add(name: str, a: np.ndarray, *, quantize: bool = True, heads: int = 0) -> None:
        ref[name] = a
        s = _permute(a, heads) if heads else a
        if quantize and qt in _K_QUANTS:
            if s.shape[-1] % gguf.QK_K == 0:
                raw = _k_quant_blocks(rng, qt, s.shape)
                g.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qt)
                stored = gguf.quants.dequantize(raw, qt).reshape(s.shape)
            else:
                g.add_tensor(name, s.astype(np.float16))
                stored = s.astype(np.float16).astype(np.float32)
            ref[name] = _unpermute_ref(stored, heads) if heads else stored
        elif quantize and qt != gguf.GGMLQuantizationType.F32:
            q = gguf.quants.quantize(s, qt)
            # rows quantize alone, so the reference in HF order is `a` quantized
            ref[name] = gguf.quants.dequantize(gguf.quants.quantize(a, qt), qt).reshape(a.shape)
            g.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qt)
        else:
            g.add_tensor(name, s)

    add("token_embd.weight", mat(V, H))
    add("output_norm.weight", 1 + mat(H), quantize=False)
    if not tied:
        add("output.weight", mat(V, H))
    for i in range(2):
        q, k = mat(nh * hd, H), mat(nkv * hd, H)
        add(f"blk.{i}.attn_norm.weight", 1 + mat(H), quantize=False)
        add(f"blk.{i}.attn_q.weight", q, heads=nh)
        add(f"blk.{i}.attn_k.weight", k, heads=nkv)
        add(f"blk.{i}.attn_v.weight", mat(nkv * hd, H))
        add(f"blk.{i}.attn_output.weight", mat(H, nh * hd))
        add(f"blk.{i}.ffn_norm.weight", 1 + mat(H), quantize=False)
        if moe:
            add(f"blk.{i}.ffn_gate_inp.weight", mat(E, H), quantize=False)
            add(f"blk.{i}.ffn_gate_exps.weight", mat(E, F, H))
            add(f"blk.{i}.ffn_up_exps.weight", mat(E, F, H))
            add(f"blk.{i}.ffn_down_exps.weight", mat(E, H, F))
        else:
            add(f"blk.{i}.ffn_gate.weight", mat(F, H))
            add(f"blk.{i}.ffn_up.weight", mat(F, H))
            add(f"blk.{i}.ffn_down.weight", mat(H, F))
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    return ref


def test_unpermute_inverts_llama_cpp_permutation() -> None:
    w = np.arange(8 * 3 * 5, dtype=np.float32).reshape(24, 5)
    np.testing.assert_array_equal(unpermute_rows(_permute(w, 3), 3), w)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_gguf_import_dense(tmp_path: Path, qtype: str) -> None:
    ref = write_tiny_gguf(tmp_path / "t.gguf", qtype=qtype)
    out = convert(tmp_path / "t.gguf", tmp_path / "m.warp")
    c = read_container(out)
    m = c["manifest"]
    dt = {t["name"]: t["dtype"] for t in m["trunk"]["tensors"]}
    assert dt["blk.0.attn_q.weight"] == qtype.lower()  # kept, not re-quantized
    assert dt["blk.0.attn_norm.weight"] == "f32" and "output.weight" not in dt
    for name in (
        "blk.1.attn_q.weight",
        "blk.1.attn_k.weight",
        "blk.0.ffn_down.weight",
        "token_embd.weight",
    ):
        np.testing.assert_array_equal(c["trunk"][name], ref[name], err_msg=name)
    hp = m["hparams"]
    assert (
        hp["tie_word_embeddings"] is True
        and hp["rope_theta"] == 50000.0
        and hp["rms_norm_eps"] == 1e-5
    )
    assert (
        hp["n_kv_heads"] == 2 and hp["head_dim"] == 16 and hp["layer_kinds"] == ["dense", "dense"]
    )
    assert hp["eos_token_ids"] == [hp["vocab_size"] - 4] and m["model_type"] == "llama"
    np.testing.assert_allclose(c["trunk"]["rope_freqs"], _base(50000.0, 16), rtol=1e-6)
    assert m["converter"]["source"] == "gguf" and m["chat"]["template"] == "chat_template.jinja"


def test_gguf_requested_float_dequantizes(tmp_path: Path) -> None:
    ref = write_tiny_gguf(tmp_path / "t.gguf", qtype="Q4_1")
    c = read_container(convert(tmp_path / "t.gguf", tmp_path / "m.warp", trunk="f32"))
    assert {t["dtype"] for t in c["manifest"]["trunk"]["tensors"]} == {"f32"}
    np.testing.assert_allclose(
        c["trunk"]["blk.0.attn_v.weight"], ref["blk.0.attn_v.weight"], rtol=1e-6
    )


def _q8_0_round_trip(a: np.ndarray) -> np.ndarray:
    """gguf's own Q8_0 encode then decode: the reference for any re-quantization."""
    q8 = gguf.GGMLQuantizationType.Q8_0
    return gguf.quants.dequantize(gguf.quants.quantize(a, q8), q8).reshape(a.shape)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_gguf_k_quants_are_dequantized_then_requantized(tmp_path: Path, qtype: str) -> None:
    ref = write_tiny_gguf(tmp_path / "t.gguf", qtype=qtype, hidden=256)
    reader = gguf.GGUFReader(str(tmp_path / "t.gguf"))
    kinds = {t.name: t.tensor_type.name for t in reader.tensors}
    assert kinds["blk.0.attn_q.weight"] == qtype and kinds["blk.0.ffn_down.weight"] == "F16"
    c = read_container(convert(tmp_path / "t.gguf", tmp_path / "m.warp"))
    dt = {t["name"]: t["dtype"] for t in c["manifest"]["trunk"]["tensors"]}
    for name in ("blk.0.attn_q.weight", "blk.1.attn_k.weight", "blk.1.ffn_up.weight",
                 "token_embd.weight"):
        assert kinds[name] == qtype and dt[name] == "q8_0", name
        np.testing.assert_array_equal(c["trunk"][name], _q8_0_round_trip(ref[name]),
                                      err_msg=name)
    # a float container holds the dequantized K-quant values themselves
    c = read_container(convert(tmp_path / "t.gguf", tmp_path / "f.warp", trunk="f32"))
    np.testing.assert_array_equal(c["trunk"]["blk.1.attn_q.weight"], ref["blk.1.attn_q.weight"])


def test_gguf_f16_tensors(tmp_path: Path) -> None:
    ref = write_tiny_gguf(tmp_path / "t.gguf", qtype="Q6_K", hidden=256)
    names = ("blk.0.ffn_down.weight", "blk.1.ffn_down.weight")  # rows of 96: F16, not K
    reader = gguf.GGUFReader(str(tmp_path / "t.gguf"))
    assert {t.tensor_type.name for t in reader.tensors if t.name in names} == {"F16"}
    kept = read_container(convert(tmp_path / "t.gguf", tmp_path / "h.warp", trunk="f16"))
    dt = {t["name"]: t["dtype"] for t in kept["manifest"]["trunk"]["tensors"]}
    raw = (tmp_path / "h.warp" / "trunk.bin").read_bytes()
    entry = {t["name"]: t for t in kept["manifest"]["trunk"]["tensors"]}
    for name in names:
        assert dt[name] == "f16"
        np.testing.assert_array_equal(kept["trunk"][name], ref[name])
        t = entry[name]  # the GGUF's f16 bytes, copied
        assert raw[t["offset"] : t["offset"] + t["bytes"]] == ref[name].astype("<f2").tobytes()
    c = read_container(convert(tmp_path / "t.gguf", tmp_path / "q.warp"))
    for name in names:
        np.testing.assert_array_equal(c["trunk"][name], _q8_0_round_trip(ref[name]))


def test_gguf_import_moe(tmp_path: Path) -> None:
    ref = write_tiny_gguf(tmp_path / "t.gguf", moe=True, tied=False)
    c = read_container(convert(tmp_path / "t.gguf", tmp_path / "m.warp"))
    m = c["manifest"]
    assert m["model_type"] == "mixtral" and m["hparams"]["norm_topk_prob"] is True
    assert m["hparams"]["n_experts"] == 4 and m["hparams"]["moe_intermediate_size"] == 96
    assert {t["dtype"] for b in m["experts"] for t in b["tensors"]} == {"q8_0"}
    for e in range(4):
        g, u, d = c["experts"][1][e]
        np.testing.assert_array_equal(g, ref["blk.1.ffn_gate_exps.weight"][e])
        np.testing.assert_array_equal(d, ref["blk.1.ffn_down_exps.weight"][e])
    assert "output.weight" in c["trunk"]


def test_gguf_mxfp4_experts_kept_byte_for_byte(tmp_path: Path) -> None:
    """GGUF MXFP4 blocks are the container's mxfp4 layout: experts are copied unchanged by
    default, re-quantized when another experts dtype is named; MXFP4 trunk tensors become
    the requested trunk dtype (mxfp4 is kept only when named)."""
    ref = write_tiny_gguf(tmp_path / "t.gguf", moe=True, tied=False, qtype="MXFP4")
    reader = gguf.GGUFReader(str(tmp_path / "t.gguf"))
    shipped = {t.name: np.asarray(t.data) for t in reader.tensors}
    out = convert(tmp_path / "t.gguf", tmp_path / "m.warp")
    c = read_container(out)
    m = c["manifest"]
    assert m["quantization"]["experts"] == "mxfp4"
    assert {t["dtype"] for b in m["experts"] for t in b["tensors"]} == {"mxfp4"}
    dt = {t["name"]: t["dtype"] for t in m["trunk"]["tensors"]}
    assert dt["blk.0.attn_v.weight"] == "q8_0"
    bank = m["experts"][1]
    blob = (out / bank["file"]).read_bytes()
    for e in range(4):
        g, u, d = c["experts"][1][e]
        np.testing.assert_array_equal(g, ref["blk.1.ffn_gate_exps.weight"][e])
        np.testing.assert_array_equal(d, ref["blk.1.ffn_down_exps.weight"][e])
        rec = blob[e * bank["record_bytes"]:]
        for t, src in zip(bank["tensors"], ("gate", "up", "down")):
            want = shipped[f"blk.1.ffn_{src}_exps.weight"][e].tobytes()
            assert rec[t["offset"]:t["offset"] + t["bytes"]] == want, (e, src)
    q4 = read_container(convert(tmp_path / "t.gguf", tmp_path / "q4.warp", experts="q4_0"))
    assert {t["dtype"] for b in q4["manifest"]["experts"] for t in b["tensors"]} == {"q4_0"}


def test_gguf_tokenizer_rebuilt(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    write_tiny_gguf(tmp_path / "t.gguf")
    out = convert(tmp_path / "t.gguf", tmp_path / "m.warp")
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    tokens, _ = _byte_tokens()
    ids = tok.encode("hello world<|im_end|>").ids
    assert ids == [
        tokens.index("hello"),
        tokens.index("Ġw"),
        *(tokens.index(ch) for ch in "orld"),
        len(tokens) + 1,
    ]
    assert tok.decode(ids, skip_special_tokens=False) == "hello world<|im_end|>"
    tc = json.loads((out / "tokenizer_config.json").read_text())
    assert tc["eos_token"] == "<|im_end|>" and tc["bos_token"] == "<|im_start|>"
    assert "chat_template" in tc
    with pytest.raises(ConvertError, match="pre"):
        build_tokenizer_json(
            tokens=["a"], merges=[], token_types=[1], pre="mystery", bos_id=None, add_bos=False
        )


# --------------------------------------------------------------------------- refusals


def test_refusals_name_the_fault(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_qwen3_moe(src)
    cfg = json.loads((src / "config.json").read_text())

    def with_cfg(**kw: Any) -> None:
        (src / "config.json").write_text(json.dumps({**cfg, **kw}))

    with_cfg(model_type="bloom")
    supported = ("deepseek_v3, deepseek_v4, glm4_moe, glm5_next, glm5_next_text, gpt_oss, "
                 "kimi_k2, kimi_k25, kimi_k3, kimi_linear, llama, mixtral")
    with pytest.raises(ConvertError, match=f"bloom.*supported: {supported}"):
        convert(src, tmp_path / "o")
    with_cfg(hidden_size=None)
    with pytest.raises(ConvertError, match="hidden_size"):
        convert(src, tmp_path / "o")
    with_cfg(hidden_size=128)
    with pytest.raises(ConvertError, match="model.embed_tokens.weight"):
        convert(src, tmp_path / "o")
    with_cfg(rope_scaling={"rope_type": "longrope", "factor": 2.0})
    with pytest.raises(ConvertError, match="longrope"):
        convert(src, tmp_path / "o")
    with_cfg(num_experts=8)
    with pytest.raises(ConvertError, match="gate"):
        convert(src, tmp_path / "o")
    with_cfg()
    st = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(st[:100])
    with pytest.raises(ConvertError, match="model.safetensors"):
        convert(src, tmp_path / "o")
    (src / "model.safetensors").write_bytes(st)
    (src / "tokenizer.json").unlink()
    with pytest.raises(ConvertError, match="tokenizer"):
        convert(src, tmp_path / "o")
    assert not (tmp_path / "o").exists()
    with pytest.raises(ConvertError, match="experts='q3_k'"):
        convert(src, tmp_path / "o", experts="q3_k")
    with pytest.raises(ConvertError, match="no such file"):
        convert(tmp_path / "missing", tmp_path / "o")


def test_unknown_tensor_and_fp8_without_block_size(tmp_path: Path) -> None:
    src = tmp_path / "src"
    w = make_qwen3_moe(src)
    st = {k: _f32(v) for k, v in w.items()}
    st["model.layers.0.mlp.mystery.weight"] = _f32(np.zeros((2, 2), np.float32))
    write_st(src / "model.safetensors", st)
    with pytest.raises(ConvertError, match="mystery"):
        convert(src, tmp_path / "o")
    make_qwen3_moe(src, fp8=True)
    cfg = json.loads((src / "config.json").read_text())
    del cfg["quantization_config"]
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConvertError, match="weight_block_size"):
        convert(src, tmp_path / "o")


def test_gguf_refusals(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 10)
    with pytest.raises(ConvertError, match="bad.gguf"):
        convert(bad, tmp_path / "o")
    write_tiny_gguf(tmp_path / "q.gguf", arch="qwen9")
    with pytest.raises(ConvertError, match="qwen9"):
        convert(tmp_path / "q.gguf", tmp_path / "o")
    write_tiny_gguf(tmp_path / "s.gguf", tok_model="t5")
    with pytest.raises(ConvertError, match="tokenizer.ggml.model"):
        convert(tmp_path / "s.gguf", tmp_path / "o")
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- SentencePiece GGUF
SP_TEXTS = ["hello world", "Hello, w\u00f6rld!\n  two  spaces", " hello", "\U0001f642 ok",
            "world hello,hello", "tab\there"]


@pytest.mark.parametrize("moe", [False, True], ids=["llama2", "mixtral"])
def test_gguf_sentencepiece_tokenizer_matches_transformers(tmp_path: Path, moe: bool) -> None:
    requires(has_module("transformers"), "transformers (the test extra)")
    from transformers import AutoTokenizer

    from warp_providers import Tokenizer

    write_tiny_gguf(tmp_path / "sp.gguf", tok_model="llama", moe=moe)
    out = convert(tmp_path / "sp.gguf", tmp_path / "sp.warp")
    ours = Tokenizer.from_dir(out)
    # The oracle: transformers' own tokenizer of the same file.
    oracle = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="sp.gguf")
    for text in SP_TEXTS:
        ids = ours.encode_content(text)
        assert ids == oracle.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == oracle.decode(ids), text
    # SentencePiece behaviour, spelled out: a prefix space, merges by score, byte fallback.
    tokens, _, _ = sp_vocab()
    assert ours.encode_content("hello world") == [tokens.index("\u2581hello"),
                                                  tokens.index("\u2581world")]
    assert ours.encode_content("\u00e9")[-2:] == [tokens.index("<0xC3>"), tokens.index("<0xA9>")]
    assert ours.decode(ours.encode_content("hello world")) == "hello world"
    # Control tokens are markup only: caller text never becomes one.
    im_start = tokens.index("<|im_start|>")
    assert ours.encode_markup("<|im_start|>") == [im_start] and ours.is_control(im_start)
    assert im_start not in ours.encode_content("<|im_start|>user")
    assert ours.bos_id == 1 and 2 in ours.eos_ids
    m = read_container(out)["manifest"]
    assert m["tokenizer"]["kind"] == "hf" and m["model_type"] == ("mixtral" if moe else "llama")


def test_gguf_sentencepiece_without_transformers_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    write_tiny_gguf(tmp_path / "sp.gguf", tok_model="llama")
    for name in ("transformers.integrations.gguf.gguf_tokenizer_mapping",
                 "transformers.integrations.ggml"):
        monkeypatch.setitem(sys.modules, name, None)  # as if transformers were absent
    with pytest.raises(ConvertError, match=r"warp-providers\[gguf\]"):
        convert(tmp_path / "sp.gguf", tmp_path / "o.warp")
    assert not (tmp_path / "o.warp").exists()
