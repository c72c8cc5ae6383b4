"""deepseek_v4: engine vs transformers on a tiny random model (no download).

The tiny model has every layer and MLP kind: a sliding-window-only layer, two compressed
sparse attention layers (rate 4, a lightning indexer keeping 10 entries) and a heavily
compressed one (rate 8), hash-routed and top-k MoE layers (sqrtsoftplus scores, a random
selection bias), a shared expert, 4 hyper-connection streams, grouped output projection,
sinks, a clamped SwiGLU (limit lowered so the clamp fires) and a sliding window (8) much
shorter than the 48-token prompt. The oracle side asserts that compression and sparse
selection engage on that prompt: the compressors emit entries and the indexer keeps fewer
entries than a late query could see.

Checks: F32 max |dlogit| <= 1e-4 over the prompt (prefill chunks 64 and 5) and 16
incremental decode steps against transformers decoding with its cache; Q8_0 the same
16-token greedy continuation and mean KL <= 1e-3; expert streaming at the floor
bit-identical to all-resident; state save/load round-trips and continues identically;
plan_memory's kv_bytes equals a hand computation of every layer kind's state; the
release checkpoint spelling and transformers' spelling convert to the same container.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from oracle_util import check_state_replaces_other_state, check_streaming_converted
from oracle_util import convert_to as _convert
from oracle_util import mean_kl as _kl

PROMPT = [(17 * i + 5) % 250 + 3 for i in range(48)]
STD = 0.1
N_DECODE = 16
# Q8_0 perturbs every hidden state by a fraction of a percent; a random router or indexer
# has near-ties that this flips (transformers itself on the quantize->dequantize weights
# then differs by a mean KL of several 1e-3). As in a trained model the top-k layers'
# selection is decisive: a selection bias (e_score_correction_bias) much larger than the
# spread of the scores; the weights still come from the unbiased, token-dependent scores,
# and the hash layers route every token to its own random experts. The indexer keeps 10
# of the up to 12 entries of the prompt (so it drops keys on the prompt's last queries and
# on every decode step). The output head is confident as a trained one is: it adds to its
# random rows the embedding of a fixed successor of each token, so greedy steps are not
# near-ties (at random, a 16-step continuation has top-2 margins of a few 1e-3, which any
# quantization flips). SEED is a draw whose indexer boundary and greedy path have no
# near-tie; on it transformers running the quantize->dequantize weights gives the same
# mean KL (8.2e-4) and continuation as the engine's Q8_0 container.
BIAS_STD = 2.0
SEED = 1


def _config(**over: Any) -> Any:
    import transformers as tf
    from oracle_util import COMMON

    kw = dict(COMMON)
    kw.update(
        num_hidden_layers=4, num_key_value_heads=1, head_dim=32, q_lora_rank=32,
        partial_rotary_factor=0.25, moe_intermediate_size=32, n_routed_experts=8,
        num_experts_per_tok=2, n_shared_experts=1, routed_scaling_factor=1.5,
        layer_types=["sliding_attention", "compressed_sparse_attention",
                     "heavily_compressed_attention", "compressed_sparse_attention"],
        mlp_layer_types=["hash_moe", "moe", "hash_moe", "moe"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        sliding_window=8, o_groups=2, o_lora_rank=16, index_n_heads=8, index_head_dim=16,
        index_topk=10, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, swiglu_limit=1.0,
        max_position_embeddings=512,
    )
    kw.update(over)
    return tf.DeepseekV4Config(**kw)


def _build(seed: int = SEED) -> Any:
    import torch
    import transformers as tf

    cfg = _config()
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname or "layernorm" in pname:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif p.dim() == 1:  # sinks, hyper-connection bases and scales
                p.copy_(0.1 * torch.randn_like(p))
            else:  # incl. position biases and hyper-connection projections
                p.copy_(STD * torch.randn_like(p))
        for bname, buf in model.named_buffers():
            if bname.endswith("tid2eid"):
                buf.copy_(torch.randint(0, cfg.n_routed_experts, buf.shape))
            elif bname.endswith("e_score_correction_bias"):
                buf.copy_(BIAS_STD * torch.randn_like(buf))
        perm = torch.randperm(cfg.vocab_size, generator=torch.Generator().manual_seed(seed))
        model.lm_head.weight.add_(model.model.embed_tokens.weight[perm])
    return model.eval()


def _cached_decode(model: Any, prompt: list[int],
                   n: int) -> tuple[np.ndarray, list[int], np.ndarray, dict]:
    """Prompt logits, then n greedy steps decoded one at a time with transformers' cache.

    Also returns what the compressors and the indexer did on the prompt.
    """
    import torch
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as mdv4

    picks: list[Any] = []
    hooks = [mod.register_forward_hook(lambda _m, _i, out: picks.append(out.detach().clone()))
             for mod in model.modules() if isinstance(mod, mdv4.DeepseekV4Indexer)]
    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
        cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        for h in hooks:
            h.remove()
        facts = {
            "entries": {i: int(layer.compressed_kv["compressor"].shape[1])
                        for i, layer in enumerate(cache.layers)
                        if hasattr(layer, "compressed_kv")},
            "picks": picks,
        }
        all_logits = out.logits[0].float().numpy()
        last = out.logits[0, -1]
        tokens, steps = [], []
        for _ in range(n):
            tok = int(last.argmax())
            tokens.append(tok)
            o = model(torch.tensor([[tok]]), cache=cache, use_cache=True)
            last = o.logits[0, -1]
            steps.append(last.float().numpy())
    return all_logits, tokens, np.stack(steps), facts


@pytest.fixture(scope="module")
def model(oracle_env, tmp_path_factory):
    m = _build()
    d = oracle_env.save(m, tmp_path_factory.mktemp("hf-dsv4"))
    ref_all, ref_tokens, ref_steps, facts = _cached_decode(m, PROMPT, N_DECODE)
    return m, d, ref_all, ref_tokens, ref_steps, facts


def test_compression_and_selection_engage(model):
    """On the prompt the compressors emit entries, and the indexer keeps fewer of them than
    a late query could attend to, so sparse selection really drops keys."""
    m, _, _, _, _, facts = model
    cfg = m.config
    assert len(PROMPT) > cfg.sliding_window
    kinds = cfg.layer_types
    for i, k in enumerate(kinds):
        if k == "compressed_sparse_attention":
            assert facts["entries"][i] == len(PROMPT) // 4
        elif k == "heavily_compressed_attention":
            assert facts["entries"][i] == len(PROMPT) // 8
    assert facts["picks"], "the indexer did not run"
    for top in facts["picks"]:  # [1, S, k], -1 marks no entry
        last = top[0, -1]
        causal = len(PROMPT) // 4
        kept = int((last >= 0).sum())
        assert kept == cfg.index_topk < causal, (kept, causal)


def _check_f32(eng, ref_all, ref_tokens, ref_steps, tag: str) -> float:
    got_all = eng.eval(PROMPT, all_logits=True)
    worst = float(np.abs(got_all - ref_all).max())
    assert worst <= 1e-4, f"{tag}: prompt logits max |d| = {worst:.3g}"
    tok = int(got_all[-1].argmax())
    for step in range(N_DECODE):
        assert tok == ref_tokens[step], f"{tag}: step {step} token {tok} vs {ref_tokens[step]}"
        got = eng.eval([tok])
        d = float(np.abs(got - ref_steps[step]).max())
        worst = max(worst, d)
        assert d <= 1e-4, f"{tag}: decode step {step} max |d| = {d:.3g}"
        tok = int(got.argmax())
    return worst


@pytest.mark.oracle
def test_f32_matches_transformers(model, tmp_path):
    from warp_providers import Engine

    _, hf_dir, ref_all, ref_tokens, ref_steps, _ = model
    out = _convert(hf_dir, tmp_path / "m.warp", experts="f32", trunk="f32")
    for chunk, threads in ((64, 2), (5, 2), (64, 1)):
        with Engine.open(out, threads=threads, prefill_chunk=chunk) as eng:
            _check_f32(eng, ref_all, ref_tokens, ref_steps, f"chunk {chunk} threads {threads}")


@pytest.mark.oracle
def test_q8_0_same_greedy_and_small_kl(model, tmp_path):
    from warp_providers import Engine

    _, hf_dir, ref_all, ref_tokens, _, _ = model
    out = _convert(hf_dir, tmp_path / "q8.warp", experts="q8_0", trunk="q8_0")
    with Engine.open(out, threads=2) as eng:
        kl = _kl(ref_all, eng.eval(PROMPT, all_logits=True))
        assert kl <= 1e-3, f"q8_0 mean KL {kl:.3g}"
        eng.reset()
        res = eng.generate(PROMPT, max_tokens=N_DECODE, stop_ids=[])
        assert res.token_ids == ref_tokens, "q8_0 greedy continuation differs"


def _quant_dequant_q8(model: Any) -> Any:
    """A copy of model whose matrices went through Q8_0 quantize -> dequantize along their
    rows, as the converter stores them (f32 in the container: norms, routers, hyper-
    connection projections, position biases, vectors; rows not a multiple of 32)."""
    import copy

    import torch
    from gguf import GGMLQuantizationType, quants

    qt = GGMLQuantizationType.Q8_0
    m = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() < 2 or "norm" in name or name.endswith(
                    ("mlp.gate.weight", "_hc.fn", "hc_head.hc_fn", "position_bias")):
                continue
            a = p.detach().numpy()
            if a.shape[-1] % 32:
                continue
            rows = np.ascontiguousarray(a.reshape(-1, a.shape[-1]))
            q = quants.dequantize(quants.quantize(rows, qt), qt).reshape(a.shape)
            p.copy_(torch.from_numpy(np.ascontiguousarray(q)))
    return m


@pytest.mark.oracle
def test_q8_0_container_is_exact_on_its_own_weights(model, tmp_path):
    """The engine computes exactly on Q8_0 blocks: transformers running the quantize ->
    dequantize of the same weights gives the same logits (prompt and cached decode)."""
    from warp_providers import Engine

    m, hf_dir, *_ = model
    out = _convert(hf_dir, tmp_path / "q.warp", experts="q8_0", trunk="q8_0")
    ref_all, ref_tokens, ref_steps, _ = _cached_decode(_quant_dequant_q8(m), PROMPT, N_DECODE)
    with Engine.open(out, threads=2) as eng:
        _check_f32(eng, ref_all, ref_tokens, ref_steps, "q8_0 exact")


@pytest.mark.oracle
def test_streaming_at_floor_bit_identical(model, tmp_path):
    check_streaming_converted(model[1], tmp_path, N_DECODE)


@pytest.mark.oracle
def test_state_roundtrip_continues_identically(model, tmp_path):
    # 45 tokens: mid-window for both compressors, so their open windows travel too
    check_state_replaces_other_state(model[1], tmp_path, PROMPT[:45],
                                     cont=(7, 8, 9, 10, 11, 12, 13, 14), other=13)


def _hand_state_bytes(hp: dict[str, Any], ctx: int) -> dict[str, int]:
    """By kind. Every layer: the sliding window's keys (W rows of head_dim). HCA (rate m):
    the open window's projected rows c and z (m rows of head_dim each) and one entry of
    head_dim per m positions; CSA (rate m): two windows of c and z rows of 2*head_dim (the
    overlap needs the previous window), the entries, and the same again for the indexer
    at index_head_dim."""
    hd, ihd, w = hp["head_dim"], hp["index_head_dim"], hp["sliding_window"]
    out = {"window": 0, "csa": 0, "hca": 0}
    for kind in hp["compress_kinds"]:
        out["window"] += 4 * w * hd
        if kind == "hca":
            m = hp["compress_rate_hca"]
            out["hca"] += 4 * (2 * m * hd + (ctx // m) * hd)
        elif kind == "csa":
            m = hp["compress_rate_csa"]
            out["csa"] += 4 * (2 * (2 * m) * (2 * hd) + (ctx // m) * hd)
            out["csa"] += 4 * (2 * (2 * m) * (2 * ihd) + (ctx // m) * ihd)
    return out


@pytest.mark.oracle
def test_plan_state_bytes(model, tmp_path, capsys):
    from warp_providers import plan_memory
    from warp_providers.cli import main

    _, hf_dir, *_ = model
    out = _convert(hf_dir, tmp_path / "p.warp", experts="q8_0", trunk="q8_0")
    hp = json.loads((out / "manifest.json").read_text())["hparams"]
    assert hp["compress_kinds"] == ["none", "csa", "hca", "csa"]
    assert hp["hash_layers"] == [True, False, True, False]
    # by hand for ctx 64: none 8*32 = 256; hca 256 + 2*8*32 + 8*32 = 1024;
    # csa 256 + 2*8*64 + 16*32 + 2*8*32 + 16*16 = 2560
    assert _hand_state_bytes(hp, 64) == {"window": 4 * 4 * 256, "csa": 4 * 2 * (2560 - 256),
                                         "hca": 4 * (1024 - 256)}
    for ctx in (64, 300):
        plan = plan_memory(out, ctx=ctx)
        assert plan["state_bytes"] == _hand_state_bytes(hp, ctx)
        assert plan["kv_bytes"] == sum(_hand_state_bytes(hp, ctx).values())
    capsys.readouterr()
    assert main(["plan", str(out), "--ctx", "300", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state_bytes"] == _hand_state_bytes(hp, 300)


@pytest.mark.oracle
def test_transformers_spelling_converts_identically(model, tmp_path):
    """save_pretrained writes the release checkpoint's names (attn.wq_a, ffn.experts.N.w1,
    hc_attn_fn, attn_sink...); transformers' own names (self_attn.q_a_proj, fused experts,
    attn_hc.fn, sinks...) convert to the same container."""
    import torch
    from safetensors.torch import save_file

    m, hf_dir, *_ = model
    src = tmp_path / "hf-tf"
    src.mkdir()
    for f in hf_dir.iterdir():
        if f.name != "model.safetensors":
            (src / f.name).write_bytes(f.read_bytes())
    sd = {k: v.detach().contiguous() for k, v in m.state_dict().items()}
    assert any(k.endswith("experts.gate_up_proj") for k in sd)
    save_file(sd, str(src / "model.safetensors"), metadata={"format": "pt"})
    a = _convert(hf_dir, tmp_path / "a.warp", experts="f32", trunk="f32")
    b = _convert(src, tmp_path / "b.warp", experts="f32", trunk="f32")
    for f in sorted(a.iterdir()):
        if f.suffix == ".bin":
            assert f.read_bytes() == (b / f.name).read_bytes(), f.name
    del torch


@pytest.mark.oracle
def test_config_errors(model, tmp_path):
    from warp_providers.convert.quant import ConvertError

    _, hf_dir, *_ = model
    cfg = json.loads((hf_dir / "config.json").read_text())
    for key, value, msg in (
        ("scoring_func", "softmax", "sqrtsoftplus"),
        ("layer_types", ["sliding_attention"] * 3, "layer_types"),
        ("mlp_layer_types", ["moe", "dense", "moe", "moe"], "mlp_layer_types"),
        ("num_key_value_heads", 2, "key/value head"),
        ("o_groups", 3, "o_groups"),
    ):
        bad = tmp_path / f"bad-{key}"
        bad.mkdir()
        for f in hf_dir.iterdir():
            (bad / f.name).write_bytes(f.read_bytes())
        (bad / "config.json").write_text(json.dumps({**cfg, key: value}))
        with pytest.raises(ConvertError, match=msg):
            _convert(bad, tmp_path / f"bad-{key}.warp", experts="f32", trunk="f32")


@pytest.mark.oracle
def test_release_names_from_synth_match_transformers(oracle_env, tmp_path):
    """A generated checkpoint in the release's tensor names (embed, head, layers.N.attn.wq_a,
    attn.compressor.ape, ffn.experts.N.w1, hc_attn_fn...), float16, loaded by transformers
    through its own checkpoint mapping, gives the engine's logits."""
    import torch
    import transformers as tf

    from warp_providers import Engine
    from warp_providers.synth import DeepseekV4Shape, make_deepseek_v4_checkpoint

    shape = DeepseekV4Shape(
        hidden_size=64, num_hidden_layers=3, n_routed_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, num_attention_heads=4, head_dim=32, q_lora_rank=32,
        qk_rope_head_dim=8, o_groups=2, o_lora_rank=16, index_n_heads=4, index_head_dim=16,
        index_topk=3, compress_rate_csa=4, compress_rate_hca=8, sliding_window=8,
        num_hash_layers=1)
    src = make_deepseek_v4_checkpoint(tmp_path / "hf", shape, seed=3)
    out = _convert(src, tmp_path / "m.warp", experts="f32", trunk="f32")
    ids = [(7 * i + 3) % 200 + 5 for i in range(40)]
    model = tf.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    with Engine.open(out, threads=2) as eng:
        got = eng.eval(ids, all_logits=True)
    assert np.abs(got - ref).max() <= 1e-4


def _fp8_blocks(w: np.ndarray, block: int) -> tuple[Any, np.ndarray, np.ndarray]:
    """(fp8 e4m3 torch tensor, e8m0 exponent bytes [rows/b, cols/b], dequantized f32)."""
    import torch

    rows, cols = w.shape
    br, bc = (block if rows % block == 0 else rows), (block if cols % block == 0 else cols)
    g = w.reshape(rows // br, br, cols // bc, bc).astype(np.float64)
    amax = np.abs(g).max(axis=(1, 3))
    e = np.clip(np.ceil(np.log2(np.maximum(amax, 1e-30) / 448.0)), -127, 127).astype(np.int64)
    s = np.ldexp(1.0, e)
    q = torch.from_numpy((g / s[:, None, :, None]).reshape(rows, cols).astype(np.float32))
    q8 = q.to(torch.float8_e4m3fn)
    deq = (q8.float().numpy().reshape(rows // br, br, cols // bc, bc) * s[:, None, :, None])
    return q8, (e + 127).astype(np.uint8), deq.reshape(rows, cols).astype(np.float32)


@pytest.mark.oracle
def test_fp8_and_fp4_release_sources(model, oracle_env, tmp_path):
    """The release's quantized forms convert exactly: FP8 e4m3 matrices with a `.scale`
    grid of e8m0 exponents, FP4 experts packed two per byte (I8) with an e8m0 exponent per
    32 values; the engine matches transformers holding the dequantized weights, and the
    converter's dequantizer agrees with transformers' own."""
    import copy

    import torch
    from safetensors.torch import load_file, save_file
    from oracle_util import to_mxfp4 as _to_mxfp4
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    from warp_providers import Engine
    from warp_providers.convert.block_scaled import dequant_scaled

    m, hf_dir, *_ = model
    m = copy.deepcopy(m)
    src = tmp_path / "hf-q"
    src.mkdir()
    for f in hf_dir.iterdir():
        if f.name != "model.safetensors":
            (src / f.name).write_bytes(f.read_bytes())
    sd = load_file(str(hf_dir / "model.safetensors"))
    e8m0 = torch.float8_e8m0fnu
    fp8 = {"attn.wq_a": "self_attn.q_a_proj", "attn.wq_b": "self_attn.q_b_proj",
           "attn.wkv": "self_attn.kv_proj", "attn.wo_a": "self_attn.o_a_proj",
           "attn.wo_b": "self_attn.o_b_proj",
           "ffn.shared_experts.w1": "mlp.shared_experts.gate_proj",
           "ffn.shared_experts.w2": "mlp.shared_experts.down_proj",
           "ffn.shared_experts.w3": "mlp.shared_experts.up_proj"}
    deq_ref = Fp8Dequantize(None)
    with torch.no_grad():
        for i, layer in enumerate(m.model.layers):
            pre = f"model.layers.{i}."
            for rel, tfn in fp8.items():
                w = sd[pre + rel + ".weight"].numpy()
                q8, sc, deq = _fp8_blocks(w, 32)
                sct = torch.from_numpy(sc).view(e8m0)
                np.testing.assert_array_equal(
                    dequant_scaled(q8.view(torch.uint8).numpy(), "F8_E4M3", sc, "F8_E8M0"), deq)
                np.testing.assert_array_equal(
                    deq_ref._dequantize_one(q8, sct, torch.float32).numpy(), deq)
                sd[pre + rel + ".weight"], sd[pre + rel + ".scale"] = q8, sct
                layer.get_submodule(tfn).weight.copy_(torch.from_numpy(deq))
            ex = layer.mlp.experts
            inter = ex.down_proj.shape[-1]
            for e in range(ex.gate_up_proj.shape[0]):
                for part in ("w1", "w2", "w3"):
                    name = f"{pre}ffn.experts.{e}.{part}.weight"
                    w = sd[name].numpy()
                    blocks, scales, deq = _to_mxfp4(w)
                    packed = torch.from_numpy(blocks.reshape(w.shape[0], -1)).view(torch.int8)
                    sct = torch.from_numpy(scales).view(e8m0)
                    np.testing.assert_array_equal(
                        dequant_scaled(packed.numpy(), "I8", scales, "F8_E8M0"), deq)
                    np.testing.assert_array_equal(
                        deq_ref._dequantize_one(packed, sct, torch.float32).numpy(), deq)
                    sd[name], sd[name[: -len(".weight")] + ".scale"] = packed, sct
                    t = torch.from_numpy(deq)
                    if part == "w1":
                        ex.gate_up_proj[e, :inter] = t
                    elif part == "w3":
                        ex.gate_up_proj[e, inter:] = t
                    else:
                        ex.down_proj[e] = t
    save_file(sd, str(src / "model.safetensors"), metadata={"format": "pt"})
    out = _convert(src, tmp_path / "m.warp", experts="f32", trunk="f32")
    ref = oracle_env.logits(m, PROMPT).numpy()
    with Engine.open(out, threads=2) as eng:
        d = np.abs(eng.eval(PROMPT, all_logits=True) - ref).max()
    assert d <= 1e-4, f"fp8/fp4 source: max |d| = {d:.3g}"


_CHILD_EVAL = """
import sys
import numpy as np
from warp_providers import Engine
out, ids, dst = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], sys.argv[3]
rows = []
for threads, chunk in ((1, 1), (2, 1), (2, 5), (2, 64)):
    with Engine.open(out, threads=threads, prefill_chunk=chunk) as eng:
        rows.append(eng.eval(ids, all_logits=True))
np.save(dst, np.stack(rows))
"""


def _hash_model(seed: int, rows: Any) -> Any:
    """A model whose hash layers (0 and 2) route by the given tid2eid rows (12 experts,
    top-3), the other weights drawn as in _build."""
    import torch
    import transformers as tf

    cfg = _config(n_routed_experts=12, num_experts_per_tok=3)
    torch.manual_seed(seed)
    m = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for pname, p in m.named_parameters():
            if "norm" in pname:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(STD * torch.randn_like(p))
        for bname, buf in m.named_buffers():
            if bname.endswith("tid2eid"):
                buf.copy_(torch.as_tensor(rows))
            elif bname.endswith("e_score_correction_bias"):
                buf.copy_(BIAS_STD * torch.randn_like(buf))
    return m.eval()


@pytest.mark.oracle
def test_hash_rows_repeating_an_expert_match_transformers(oracle_env, tmp_path):
    """A hash table may name one expert more than once in a token's row; transformers then
    adds that expert's output once per occurrence (each with its own normalised weight).
    Such an expert has more picks than the chunk has tokens (2 or 3 picks of one token at
    prefill_chunk 1), which once overran the engine's per-expert gather buffers and killed
    the process (SIGSEGV). Run in a child process, so a crash reads as a failure here."""
    rng = np.random.default_rng(5)
    rows = rng.integers(0, 12, size=(272, 3))
    rows[:, 1] = rows[:, 0]  # every token picks its first expert twice
    rows[::3, 2] = rows[::3, 0]  # and every third one three times
    m = _hash_model(2, rows)
    hf_dir = oracle_env.save(m, tmp_path / "hf")
    out = _convert(hf_dir, tmp_path / "m.warp", experts="f32", trunk="f32")
    ref = oracle_env.logits(m, PROMPT).numpy()
    dst = tmp_path / "got.npy"
    p = subprocess.run([sys.executable, "-c", _CHILD_EVAL, str(out), ",".join(map(str, PROMPT)),
                        str(dst)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"engine exited with {p.returncode}: {p.stderr[-2000:]}"
    for got in np.load(dst):
        d = float(np.abs(got - ref).max())
        assert d <= 1e-4, f"repeated hash experts: max |d| = {d:.3g}"


def _set_tensor(out: Path, name: str, values: np.ndarray) -> None:
    """Rewrites one f32 trunk tensor of a container in place (and its checksum)."""
    from warp_providers.convert.writer import crc32c

    man = json.loads((out / "manifest.json").read_text())
    ent = next(t for t in man["trunk"]["tensors"] if t["name"] == name)
    buf = np.ascontiguousarray(values, dtype=np.float32).tobytes()
    assert len(buf) == ent["bytes"]
    with open(out / man["trunk"]["file"], "r+b") as f:
        f.seek(ent["offset"])
        f.write(buf)
    ent["crc32c"] = crc32c(buf)
    (out / "manifest.json").write_text(json.dumps(man))


@pytest.mark.oracle
def test_hash_ids_out_of_range_are_refused(model, tmp_path):
    """An expert id outside 0..n_experts-1 in a hash table is refused by name: by the
    converter in the source's tid2eid, by the engine's open in the container's
    ffn_hash_ids (never read as an index)."""
    from safetensors.torch import load_file, save_file

    from warp_providers import Engine
    from warp_providers.convert.quant import ConvertError
    from warp_providers.errors import ModelFormatError

    m, hf_dir, *_ = model
    bad = tmp_path / "hf-bad"
    bad.mkdir()
    for f in hf_dir.iterdir():
        if f.name != "model.safetensors":
            (bad / f.name).write_bytes(f.read_bytes())
    sd = load_file(str(hf_dir / "model.safetensors"))
    key = next(k for k in sd if k.endswith("tid2eid"))
    sd[key][7, 1] = m.config.n_routed_experts
    save_file(sd, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConvertError, match=r"tid2eid.*outside"):
        _convert(bad, tmp_path / "bad.warp", experts="f32", trunk="f32")

    out = _convert(hf_dir, tmp_path / "m.warp", experts="f32", trunk="f32")
    E, K = m.config.n_routed_experts, m.config.num_experts_per_tok
    for value in (E, -1, 1.5):
        table = np.asarray(m.model.layers[0].mlp.gate.tid2eid, dtype=np.float32).copy()
        table[11, K - 1] = value
        _set_tensor(out, "blk.0.ffn_hash_ids", table)
        with pytest.raises(ModelFormatError, match=r"blk\.0\.ffn_hash_ids"):
            Engine.open(out, threads=1)
