"""A container written straight by the generator (`make_moe_container`, no checkpoint).

It opens and runs with every record's CRC checked, its expert records are well-formed
Q4_0 (header, payload CRC, finite non-zero block scales) holding the generated
distribution, and the same seed gives the same bytes.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from warp_providers import Engine
from warp_providers.convert.quant import decode
from warp_providers.convert.writer import crc32c
from warp_providers.synth import MoeShape, make_moe_container
from warp_providers.synth.__main__ import main as synth_main

SHAPE = MoeShape(hidden_size=64, num_hidden_layers=3, num_experts=8, num_experts_per_tok=2,
                 moe_intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16)
HEADER = struct.Struct("<4sIIIIIQQQQII")  # FORMAT.md section 5


@pytest.fixture(scope="module")
def container(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_moe_container(tmp_path_factory.mktemp("synth") / "m.warp", SHAPE, seed=4)


def records(path: Path):
    m = json.loads((path / "manifest.json").read_text())
    for bank in m["experts"]:
        data = (path / bank["file"]).read_bytes()
        assert len(data) == bank["n_experts"] * bank["record_bytes"]
        for e in range(bank["n_experts"]):
            yield bank, e, data[e * bank["record_bytes"]:(e + 1) * bank["record_bytes"]]


def test_opens_and_runs_with_crc_checks(container: Path) -> None:
    with Engine.open(container, verify=True, threads=2) as eng:
        info = eng.info()
        assert (info["n_experts"], info["top_k"], info["n_moe_layers"]) == (8, 2, 3)
        logits = eng.eval([1, 2, 3, 4])
        assert np.isfinite(logits).all() and logits.std() > 0
        res = eng.generate([5, 6, 7], max_tokens=4)
        assert res.finish_reason in ("length", "stop") and len(res.token_ids) <= 4
        assert eng.stats()["expert_misses"] > 0


def test_expert_records_are_valid_q4_0(container: Path) -> None:
    m = json.loads((container / "manifest.json").read_text())
    assert m["quantization"]["experts"] == "q4_0"
    stds = {"gate": [], "up": [], "down": []}
    firsts = set()
    for bank, e, rec in records(container):
        magic, _ver, layer, expert, _dt, n_t, payload, *_offs, pcrc, hcrc = HEADER.unpack(rec[:64])
        assert (magic, layer, expert, n_t) == (b"WPXR", bank["layer"], e, 3)
        assert hcrc == crc32c(rec[:60])
        assert pcrc == crc32c(rec[64:64 + payload])
        for t in bank["tensors"]:
            assert t["dtype"] == "q4_0"
            raw = np.frombuffer(rec, np.uint8, t["bytes"], t["offset"])
            scales = raw.reshape(-1, 18)[:, :2].copy().view("<f2").astype(np.float32)
            assert np.isfinite(scales).all() and (scales != 0).all()  # d = max / -8, signed
            stds[t["name"]].append(decode(raw, "q4_0", t["shape"]).std())
        firsts.add(rec[64:96])
    assert len(firsts) == 24  # every expert of every layer drawn apart
    h, inter = SHAPE.hidden_size, SHAPE.moe_intermediate_size
    for name, want in (("gate", h ** -0.5), ("up", h ** -0.5), ("down", inter ** -0.5)):
        assert abs(np.mean(stds[name]) / want - 1) < 0.1, (name, np.mean(stds[name]), want)


def test_same_seed_same_bytes(container: Path, tmp_path: Path) -> None:
    again = make_moe_container(tmp_path / "again.warp", SHAPE, seed=4)
    other = make_moe_container(tmp_path / "other.warp", SHAPE, seed=5)
    for f in ("trunk.bin", "experts-L0.bin", "experts-L2.bin"):
        assert (again / f).read_bytes() == (container / f).read_bytes()
        assert (other / f).read_bytes() != (container / f).read_bytes()


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.warp"
    assert synth_main(["qwen3_moe", "--layers", "2", "--experts", "4", "--top-k", "2",
                       "--hidden", "64", "--moe-intermediate", "64", "--head-dim", "32",
                       "--dtype", "q8_0", "-o", str(out)]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["hparams"]["n_experts"] == 4 and m["hparams"]["n_layers"] == 2
    assert m["quantization"]["experts"] == "q8_0"
    assert "GB in" in capsys.readouterr().out
    assert not list(tmp_path.glob("*.safetensors")) and not list(out.glob("*.safetensors"))


def test_random_blocks_are_written_as_they_are_and_decode_finite(tmp_path: Path) -> None:
    """The benchmark-only fast mode: every expert block is the fixed scale of its matrix
    and nibbles that are never 0, at the generated distribution's RMS, and a decode
    through them gives finite logits."""
    from warp_providers.synth._common import RandomQ4Blocks

    path = make_moe_container(tmp_path / "fast.warp", SHAPE, seed=4, random_blocks=True)
    h, inter = SHAPE.hidden_size, SHAPE.moe_intermediate_size
    want = {"gate": h ** -0.5, "up": h ** -0.5, "down": inter ** -0.5}
    for _bank, _e, rec in records(path):
        for t in _bank["tensors"]:
            assert t["dtype"] == "q4_0"
            blocks = np.frombuffer(rec, np.uint8, t["bytes"], t["offset"]).reshape(-1, 18)
            d = blocks[:, :2].copy().view("<f2").astype(np.float32)
            assert (d == d[0]).all()
            assert d[0, 0] == np.float16(want[t["name"]] / RandomQ4Blocks.RMS)
            q = blocks[:, 2:]
            assert ((q & 15) != 0).all() and ((q >> 4) != 0).all()
            std = decode(blocks.reshape(-1), "q4_0", t["shape"]).std()
            assert abs(std / want[t["name"]] - 1) < 0.1, (t["name"], std)
    with Engine.open(path, verify=True, threads=2) as eng:
        logits = eng.eval([1, 2, 3, 4])
        assert np.isfinite(logits).all() and logits.std() > 0
        assert len(eng.generate([5, 6, 7], max_tokens=4, stop_ids=[]).token_ids) == 4
    with pytest.raises(ValueError, match="q4_0"):
        make_moe_container(tmp_path / "no.warp", SHAPE, experts="q8_0", random_blocks=True)
