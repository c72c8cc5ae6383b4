"""kimi_k3: engine vs a PyTorch reference of the K3 text model, on tiny random checkpoints in
the released layout (MXFP4 experts, bf16 trunk; warp_providers.synth.kimi_k3).

The reference (kimi_k3_ref.py) reads the checkpoint itself and dequantizes the experts
exactly; its K3 pieces are first checked on their own against the formulas written out
element by element here, so the reference is not only checked against itself.
"""

from __future__ import annotations

import math

import numpy as np
import pytest


@pytest.fixture(scope="module")
def ref(oracle_env):
    import kimi_k3_ref
    import torch

    torch.manual_seed(0)  # the piece tests' random inputs
    return kimi_k3_ref


def test_situ_glu_elementwise(ref) -> None:
    import torch

    g, u = torch.randn(257) * 6, torch.randn(257) * 40
    for b2 in (25.0, None):
        got = ref.situ_glu(g, u, 4.0, b2).double().numpy()
        for i in range(257):
            gi, ui = float(g[i]), float(u[i])
            a = 4.0 * math.tanh(gi / 4.0) / (1.0 + math.exp(-gi))
            want = a * (b2 * math.tanh(ui / b2) if b2 else ui)
            assert abs(got[i] - want) <= 1e-5 * max(1.0, abs(want)), (i, b2)


def test_bounded_gate_elementwise_and_not_a_clamp(ref) -> None:
    import torch

    f, dt, a_log = torch.randn(5, 3, 4) * 3, torch.randn(3, 4), torch.randn(3)
    got = ref.bounded_gate(f, dt, a_log, -5.0).numpy()
    for t, h, i in np.ndindex(5, 3, 4):
        y = math.exp(float(a_log[h])) * (float(f[t, h, i]) + float(dt[h, i]))
        want = -5.0 / (1.0 + math.exp(-y))
        assert abs(got[t, h, i] - want) <= 1e-5
    assert (got >= -5.0).all() and (got <= 0).all()  # float32 saturates at the bounds
    unbounded = -a_log.exp()[:, None] * torch.nn.functional.softplus(f + dt)
    assert not np.allclose(np.maximum(unbounded.numpy(), -5.0), got, atol=1e-2)


def test_attn_res_elementwise(ref) -> None:
    import torch

    eps = 1e-5
    blocks = [torch.randn(3, 8) for _ in range(2)]
    prefix, nw, pw = torch.randn(3, 8), torch.randn(8), torch.randn(1, 8)
    got = ref.attn_res(prefix, blocks, nw, pw, eps).numpy()
    for t in range(3):
        vals = [b[t].tolist() for b in blocks] + [prefix[t].tolist()]
        scores = []
        for v in vals:
            r = 1.0 / math.sqrt(sum(a * a for a in v) / 8 + eps)
            scores.append(sum(v[i] * r * float(nw[i]) * float(pw[0, i]) for i in range(8)))
        m = max(scores)
        p = [math.exp(s - m) for s in scores]
        want = [sum(p[j] * vals[j][i] for j in range(3)) / sum(p) for i in range(8)]
        assert np.abs(got[t] - np.array(want)).max() <= 1e-5


def test_mxfp4_low_nibble_first_and_e8m0(ref) -> None:
    import torch

    packed = torch.tensor([[0x21] * 16 + [0xF7] * 16], dtype=torch.uint8)  # [1, 32] bytes
    scale = torch.tensor([[127, 125]], dtype=torch.uint8)
    w = ref.mxfp4(packed, scale)[0].numpy()
    assert w.shape == (64,)
    assert w[0] == 0.5 and w[1] == 1.0           # 0x21: low nibble 1 -> 0.5, high 2 -> 1.0
    assert w[32] == 6.0 / 4 and w[33] == -6.0 / 4  # 0xF7 at 2^-2: 7 -> 6, 15 -> -6


# --------------------------------------------------------------------------- engine vs reference

PROMPT = [(17 * i + 5) % 250 + 3 for i in range(48)]
STEPS = 16


def _shapes():
    from warp_providers.synth.kimi_k3 import KimiK3Shape

    # every config: >= 2 KDA and >= 2 MLA layers, 16 experts, top-4, 2 shared experts
    return {
        # 3:1 KDA:MLA as released, blocks of 2 dividing the 8 layers, every K3 piece on
        "kkkm_block2": KimiK3Shape(num_hidden_layers=8, layer_pattern="KKKM",
                                   attn_res_block_size=2),
        # MLA first, blocks of 3 not dividing 7 layers, no latent norm, no MLA output gate
        "mkkm_block3": KimiK3Shape(num_hidden_layers=7, layer_pattern="MKKM",
                                   attn_res_block_size=3, latent_moe_use_norm=False,
                                   mla_use_output_gate=False),
        # alternating, blocks of 5 not dividing 6, two dense layers, low-rank KDA gate,
        # unbounded SiTU up projection
        "km_block5": KimiK3Shape(num_hidden_layers=6, layer_pattern="KM",
                                 attn_res_block_size=5, first_k_dense_replace=2,
                                 use_full_rank_gate=False, activation_situ_linear_beta=0.0),
        # plain residuals (no Attention Residuals), experts on the hidden state (no latent)
        "kkm_plain": KimiK3Shape(num_hidden_layers=6, layer_pattern="KKM",
                                 attn_res_block_size=0, routed_expert_hidden_size=0,
                                 moe_intermediate_size=64),
    }


@pytest.fixture(scope="module")
def models(ref, tmp_path_factory):
    """name -> (checkpoint, F32 container, prompt logits, greedy tokens, step logits)."""
    from warp_providers.convert import convert
    from warp_providers.synth.kimi_k3 import make_kimi_k3_checkpoint

    built = {}
    for seed, (name, shape) in enumerate(_shapes().items()):
        src = make_kimi_k3_checkpoint(tmp_path_factory.mktemp(f"k3-{name}") / "hf", shape, seed)
        out = convert(src, src.parent / "m.warp", experts="f32", trunk="f32")
        r = ref.KimiK3Reference(src)
        ids, steps = list(PROMPT), []
        for _ in range(STEPS):
            last = r.logits(ids)[-1]
            steps.append(last)
            ids.append(int(last.argmax()))
        built[name] = (src, out, r.logits(PROMPT), ids[len(PROMPT):], np.stack(steps))
    return built


@pytest.mark.parametrize("name", list(_shapes()))
@pytest.mark.parametrize("chunk", [None, 5])
def test_f32_matches_reference_prompt_and_decode(oracle_env, models, name, chunk) -> None:
    from warp_providers import Engine

    _, out, ref_all, ref_tokens, ref_steps = models[name]
    assert len(set(ref_tokens)) > 1, f"{name}: a degenerate draw (one token repeated)"
    opts = {} if chunk is None else {"prefill_chunk": chunk}
    with Engine.open(out, threads=2, **opts) as eng:
        oracle_env.assert_matches_reference(eng, PROMPT, ref_all, ref_tokens, ref_steps,
                                            f"{name} chunk {chunk}")


def test_reference_depends_on_each_k3_piece(ref, models) -> None:
    """The oracle would catch a piece left out: the AttnRes key eps alone moves the logits."""
    src, _, ref_all, _, _ = models["kkkm_block2"]
    other = ref.KimiK3Reference(src, res_eps=1e-6).logits(PROMPT)
    assert np.abs(other - ref_all).max() > 1e-4


def test_streaming_at_floor_is_bit_identical(oracle_env, models) -> None:
    _, out, _, _, _ = models["mkkm_block3"]
    oracle_env.assert_streaming_bit_identical(out, PROMPT, 8)


def test_engine_refuses_a_missing_attn_res_tensor_naming_it(models, tmp_path) -> None:
    import json
    import shutil

    from warp_providers import Engine
    from warp_providers.errors import WarpError

    _, out, _, _, _ = models["kkkm_block2"]
    bad = tmp_path / "bad.warp"
    shutil.copytree(out, bad)
    m = json.loads((bad / "manifest.json").read_text())
    for t in m["trunk"]["tensors"]:
        if t["name"] == "blk.3.ffn_res_proj.weight":
            t["name"] = "blk.3.ffn_res_proj.unused"
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(WarpError, match=r"blk\.3\.ffn_res_proj\.weight"):
        Engine.open(bad, threads=1)


def test_state_roundtrip_continues_identically(oracle_env, models, tmp_path) -> None:
    _, out, _, _, _ = models["km_block5"]
    oracle_env.check_state_resumes_decode(out, tmp_path)


def test_q8_0_experts_are_exact_on_their_own_weights(oracle_env, ref, models, tmp_path) -> None:
    """Q8_0 experts (re-quantized from the dequantized MXFP4): the engine computes what the
    reference computes on the Q8_0 round trip of those experts, within 1e-4, and greedy
    decoding picks the same tokens."""
    import torch
    from gguf import GGMLQuantizationType, quants

    from warp_providers import Engine
    from warp_providers.convert import convert

    def q8(w: torch.Tensor) -> torch.Tensor:
        qt = GGMLQuantizationType.Q8_0
        return torch.from_numpy(quants.dequantize(quants.quantize(w.numpy(), qt), qt))

    src = models["kkkm_block2"][0]
    out = convert(src, tmp_path / "q8.warp", experts="q8_0", trunk="f32")
    r = ref.KimiK3Reference(src, experts=q8)
    ids = list(PROMPT)
    for _ in range(8):
        ids.append(int(r.logits(ids)[-1].argmax()))
    with Engine.open(out, threads=2) as eng:
        d = np.abs(eng.eval(PROMPT, all_logits=True) - r.logits(PROMPT)).max()
        assert d <= 1e-4, f"q8_0 experts: max |d| = {d:.3g}"
        eng.reset()
        assert eng.generate(PROMPT, max_tokens=8, stop_ids=[]).token_ids == ids[len(PROMPT):]


@pytest.mark.parametrize("name", ["kkkm_block2", "kkm_plain"])
def test_mxfp4_experts_stored_as_shipped(oracle_env, models, name, tmp_path) -> None:
    """By default the experts are stored as shipped: every record's codes and scales,
    decoded from the container's blocks, equal the checkpoint's weight_packed and
    weight_scale, and the engine on them matches the reference (which dequantizes MXFP4
    exactly) within 1e-4, prompt and decode, as with f32 experts."""
    import json

    from oracle_util import manifest, record_tensors
    from safetensors import safe_open

    from warp_providers import Engine
    from warp_providers.convert import convert
    from warp_providers.convert.quant import mxfp4_unpack

    src, _, ref_all, ref_tokens, ref_steps = models[name]
    out = convert(src, tmp_path / "mx.warp", trunk="f32")
    m = manifest(out)
    assert m["quantization"]["experts"] == "mxfp4"
    where = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]

    def shipped(key: str) -> np.ndarray:
        with safe_open(str(src / where[key]), framework="numpy") as f:
            return f.get_tensor(key)

    for bank in m["experts"]:
        shapes = {t["name"]: t["shape"] for t in bank["tensors"]}
        assert {t["dtype"] for t in bank["tensors"]} == {"mxfp4"}
        pre = f"language_model.model.layers.{bank['layer']}.block_sparse_moe.experts."
        for e in range(bank["n_experts"]):
            rec = record_tensors(out, bank, e)
            for part, w in (("gate", "w1"), ("up", "w3"), ("down", "w2")):
                r, c = shapes[part]
                packed, scales = mxfp4_unpack(np.frombuffer(rec[part], np.uint8), r, c)
                np.testing.assert_array_equal(packed, shipped(f"{pre}{e}.{w}.weight_packed"))
                np.testing.assert_array_equal(scales, shipped(f"{pre}{e}.{w}.weight_scale"))
    with Engine.open(out, threads=2) as eng:
        oracle_env.assert_matches_reference(eng, PROMPT, ref_all, ref_tokens, ref_steps,
                                            f"{name} mxfp4 experts")


@pytest.mark.parametrize("edit, key", [
    ({"expert_hidden_size": None}, "latent_moe_norm"),      # a latent norm, no latent
    ({"attn_res_block_size": 0}, "attn_res_block_size"),    # out of its bounds
    ({"situ_beta": None}, "situ_linear_beta"),              # a bound without SiTU
])
def test_engine_refuses_inconsistent_k3_hparams_naming_the_key(models, tmp_path, edit,
                                                               key) -> None:
    import json
    import shutil

    from warp_providers import Engine
    from warp_providers.errors import WarpError

    bad = tmp_path / "bad.warp"
    shutil.copytree(models["kkkm_block2"][1], bad)
    m = json.loads((bad / "manifest.json").read_text())
    m["hparams"].update(edit)
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(WarpError, match=key):
        Engine.open(bad, threads=1)


def test_xtml_forced_tool_call_on_a_k3_container(models) -> None:
    """The container's chat format is XTML (from its vocabulary's markers): a forced tool
    call on the random model renders, decodes under the grammar and parses back."""
    import json

    from warp_providers import Engine
    from warp_providers.session import ChatSession

    tools = [{"type": "function", "function": {"name": "move", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}]
    with Engine.open(models["kkkm_block2"][1], threads=2) as eng:
        session = ChatSession(eng)
        assert session.capabilities["format"] == "xtml"
        res = session.complete({"messages": [{"role": "user", "content": "go"}], "tools": tools,
                                "tool_choice": "required", "max_tokens": 64,
                                "reasoning_effort": "none"})
    calls = res.message.tool_calls
    assert calls and res.message.finish_reason == "tool_calls"
    for c in calls:
        assert c.name == "move" and not c.malformed
        assert isinstance(json.loads(c.arguments)["x"], int)
