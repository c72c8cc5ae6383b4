"""mxfp4 containers in the engine: experts and trunk stored as mxfp4 run on every kernel
set this CPU has, close to the f32 container of the same checkpoint; a scale byte 255
(NaN) is refused naming the tensor: at open in the trunk, when the record is read in an
expert bank."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tiny import tiny_moe
from warp_providers import Engine, EngineIOError, ModelFormatError
from warp_providers._engine import isa_supported
from warp_providers.convert.writer import crc32c

PROMPT = [5, 17, 42, 99, 3, 64, 7, 120, 33, 2, 250, 11]
ISAS = {"scalar": 1, "avx2": 2, "avx512": 3, "neon": 4}


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    def logsm(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64) - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    lp, lq = logsm(p), logsm(q)
    return float((np.exp(lp) * (lp - lq)).sum(-1).mean())


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mxfp4")
    return {e: tiny_moe(root, experts=e, trunk=t)
            for e, t in (("f32", "f32"), ("q4_0", "f32"), ("mxfp4", "f32"))}


def _logits(path: Path, isa: str = "auto") -> np.ndarray:
    with Engine.open(path, threads=1, ctx=64, isa=isa) as eng:
        return np.asarray(eng.eval(PROMPT, all_logits=True))


def test_mxfp4_experts_run_on_every_kernel_set_close_to_f32(models) -> None:
    doc = json.loads((models["mxfp4"] / "manifest.json").read_text())
    assert {t["dtype"] for b in doc["experts"] for t in b["tensors"]} == {"mxfp4"}
    ref = _logits(models["f32"])
    scalar = _logits(models["mxfp4"], "scalar")
    kl_mx, kl_q4 = _kl(ref, scalar), _kl(ref, _logits(models["q4_0"]))
    # 4-bit either way: within a small factor of q4_0's distance, and clearly not noise
    assert 0 < kl_mx <= 3 * kl_q4 + 1e-4, (kl_mx, kl_q4)
    ran = []
    for name, bit in ISAS.items():
        if isa_supported() & (1 << bit) and name != "scalar":
            got = _logits(models["mxfp4"], name)
            np.testing.assert_allclose(got, scalar, rtol=0, atol=1e-4 * np.abs(scalar).max())
            ran.append(name)
    assert ran or not isa_supported() & ~0b11, "a SIMD set is supported but was not compared"


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_nan_scale_in_an_expert_record_is_refused_naming_it(models, tmp_path) -> None:
    work = _copy(models["mxfp4"], tmp_path / "w")
    doc = json.loads((work / "manifest.json").read_text())
    bank = doc["experts"][0]
    up = next(t for t in bank["tensors"] if t["name"] == "up")
    blob = bytearray((work / bank["file"]).read_bytes())
    for e in range(bank["n_experts"]):  # every expert: whichever is routed first is bad
        blob[e * bank["record_bytes"] + up["offset"] + 2 * 17] = 255
    (work / bank["file"]).write_bytes(bytes(blob))
    with Engine.open(work, threads=1, ctx=64) as eng:
        with pytest.raises(EngineIOError, match=r"layer 0 expert \d+: up block 2 has "
                                                   r"mxfp4 scale byte 255"):
            eng.eval(PROMPT)


def test_nan_scale_in_a_trunk_tensor_is_refused_at_open(tmp_path) -> None:
    path = tiny_moe(tmp_path, experts="mxfp4", trunk="mxfp4")
    doc = json.loads((path / "manifest.json").read_text())
    t = next(t for t in doc["trunk"]["tensors"] if t["name"] == "blk.1.attn_q.weight")
    assert t["dtype"] == "mxfp4"
    with Engine.open(path, threads=1, ctx=64) as eng:
        assert np.isfinite(eng.eval(PROMPT)).all()
    blob = bytearray((path / "trunk.bin").read_bytes())
    blob[t["offset"] + 5 * 17] = 255
    t["crc32c"] = crc32c(bytes(blob[t["offset"]:t["offset"] + t["bytes"]]))
    (path / "trunk.bin").write_bytes(bytes(blob))
    (path / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(ModelFormatError, match=r"'blk\.1\.attn_q\.weight': mxfp4 block 5 has "
                                               r"scale byte 255"):
        Engine.open(path, threads=1, ctx=64)
