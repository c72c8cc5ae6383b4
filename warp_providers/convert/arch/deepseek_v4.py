"""``deepseek_v4`` (DeepSeek V4 / V4.1 Flash): compressed attention, hyper-connections.

Config: ``layer_types`` (``sliding_attention`` / ``compressed_sparse_attention`` /
``heavily_compressed_attention``, or the older per-layer ``compress_ratios`` 0/4/128) ->
``compress_kinds`` ("none"/"csa"/"hca") with ``compress_rate_csa``/``compress_rate_hca``;
``mlp_layer_types`` (``hash_moe``/``moe``, or the older ``num_hash_layers``) ->
``hash_layers``; the nested ``rope_parameters`` {``main``, ``compress``}: ``rope_freqs``
from the main one, ``rope_freqs_compress`` from the compressed branches' (YaRN allowed,
its attention factor fixed at 1 as transformers does); ``partial_rotary_factor`` (or
``qk_rope_head_dim``); ``hc_mult``, ``hc_sinkhorn_iters``, ``hc_eps``,
``o_groups``/``o_lora_rank``, the indexer (``index_n_heads``, ``index_head_dim``,
``index_topk``), ``swiglu_limit``, ``sliding_window``, ``scoring_func`` ``sqrtsoftplus``.
Quantized sources as released (FP8 matrices, FP4 experts, ``.scale`` grids) go through
``block_scaled.py``; transformers' ``*_scale_inv`` form as every fp8 source.
Tensors in transformers' names or the release's (``embed``, ``head``,
``layers.N.attn.wq_a``, ``attn.compressor.ape``, ``ffn.experts.N.w1``, ``hc_attn_fn``...):
``blk.{i}.hc_{attn,ffn}.{fn,base,scale}``, ``attn_q_a``/``attn_q_a_norm``/``attn_q_b``,
``attn_kv``/``attn_kv_norm``, ``attn_output_a`` (groups stacked by rows)/``attn_output_b``,
``attn_sinks``, compressor ``attn_cmp_{kv,gate,bias,norm}``, indexer
``attn_idx_{kv,gate,q,w,bias,norm}``, the router with ``exp_probs_b.bias`` or, for hash
layers, ``ffn_hash_ids`` (``tid2eid`` as f32 ``[vocab, top_k]``), the shared expert; at
the top ``hc_head.{fn,base,scale}``. Multi-token-prediction tensors (``mtp.*``) are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

from ..base import (
    SafetensorsDir,
    collect_experts,
    computed,
    finish_plan,
    get_int,
    get_number,
    rope_inv_freq,
    top_tensors,
)
from ..block_scaled import ScaledSource
from ..decoder import Prepared
from ..plan import ExpertLayerSrc, Plan, rope_freqs
from ..quant import ConvertError

MODEL_TYPE: Final[str] = "deepseek_v4"

KINDS: Final[dict[str, str]] = {
    "sliding_attention": "none",
    "compressed_sparse_attention": "csa",
    "heavily_compressed_attention": "hca",
}
RATIO_KIND: Final[dict[int, str]] = {0: "sliding_attention", 4: "compressed_sparse_attention",
                                       128: "heavily_compressed_attention"}


# The release checkpoint's names -> transformers' (applied in order to a name without its
# "model." prefix; transformers' own names pass through unchanged).
RENAMES: Final[tuple[tuple[str, str], ...]] = (
    (r"\.attn\.", ".self_attn."),
    (r"\.ffn\.", ".mlp."),
    (r"\.indexer\.compressor\.", ".compressor.indexer."),
    (r"^embed\.weight$", "embed_tokens.weight"),
    (r"^head\.weight$", "lm_head.weight"),
    (r"^hc_head_(fn|base|scale)$", r"hc_head.hc_\1"),
    (r"\.attn_norm\.", ".input_layernorm."),
    (r"\.ffn_norm\.", ".post_attention_layernorm."),
    (r"\.hc_(attn|ffn)_(fn|base|scale)$", r".\1_hc.\2"),
    (r"\.attn_sink$", ".sinks"),
    (r"\.indexer\.weights_proj\.", ".compressor.indexer.scorer.weights_proj."),
    (r"\.indexer\.wq_b\.", ".compressor.indexer.q_b_proj."),
    (r"\.norm\.", ".kv_norm."),
    (r"\.ape$", ".position_bias"),
    (r"\.wq_a\.", ".q_a_proj."),
    (r"\.self_attn\.wq_b\.", ".self_attn.q_b_proj."),
    (r"\.wkv\.", ".kv_proj."),
    (r"\.wgate\.", ".gate_proj."),
    (r"\.wo_a\.", ".o_a_proj."),
    (r"\.wo_b\.", ".o_b_proj."),
    (r"\.q_norm\.", ".q_a_norm."),
    (r"\.gate\.bias$", ".gate.e_score_correction_bias"),
    (r"\.shared_experts\.w1\.", ".shared_experts.gate_proj."),
    (r"\.shared_experts\.w2\.", ".shared_experts.down_proj."),
    (r"\.shared_experts\.w3\.", ".shared_experts.up_proj."),
)


def hf_name(stored: str) -> str:
    """Return transformers' name of a stored tensor (release or transformers spelling)."""
    if stored.startswith("mtp.") or stored.startswith("model.mtp."):
        return stored
    name = stored[len("model."):] if stored.startswith("model.") else stored
    if name.startswith("lm_head."):
        return name
    for pat, rep in RENAMES:
        name = re.sub(pat, rep, name)
    return name if name.startswith("lm_head.") else "model." + name


class DeepseekV4(Prepared):
    """One shared kv head, grouped output projection, every layer MoE."""

    model_type = MODEL_TYPE

    def hparams(self, cfg: Mapping[str, Any], gen: Mapping[str, Any]) -> dict[str, Any]:
        """Return the normalized hparams (see :meth:`hparams_and_compress_rope`)."""
        return self.hparams_and_compress_rope(cfg, gen)[0]

    def hparams_and_compress_rope(
        self, cfg: Mapping[str, Any], gen: Mapping[str, Any]
    ) -> tuple[dict[str, Any], np.ndarray]:
        """Return the hparams and the compressed branches' inverse frequencies."""
        n = get_int(cfg, "num_hidden_layers")
        types = cfg.get("layer_types")
        if types is None and cfg.get("compress_ratios") is not None:
            try:
                types = [RATIO_KIND[int(r)] for r in cfg["compress_ratios"]]
            except (KeyError, TypeError, ValueError) as exc:
                raise ConvertError(
                    "config.json: compress_ratios entries must be 0, 4 or 128") from exc
        if types is None:
            types = (["heavily_compressed_attention"] * min(n, 2)
                     + ["compressed_sparse_attention" if i % 2 else "heavily_compressed_attention"
                        for i in range(max(n - 2, 0))])
        if not isinstance(types, list) or len(types) < n or any(t not in KINDS for t in types[:n]):
            raise ConvertError(f"config.json: layer_types must list {n} of {', '.join(KINDS)}")
        types = types[:n]
        rates = dict(cfg.get("compress_rates") or {})
        rates.setdefault("compressed_sparse_attention", cfg.get("compress_rate_csa") or 4)
        rates.setdefault("heavily_compressed_attention", cfg.get("compress_rate_hca") or 128)
        csa = get_int(rates, "compressed_sparse_attention", minimum=1)
        hca = get_int(rates, "heavily_compressed_attention", minimum=1)
        mlp = cfg.get("mlp_layer_types")
        if mlp is None:
            nh = cfg.get("num_hash_layers")
            nh = 3 if nh is None else int(nh)
            mlp = ["hash_moe"] * min(n, nh) + ["moe"] * max(0, n - nh)
        if not isinstance(mlp, list) or len(mlp) < n or any(
                t not in ("hash_moe", "moe") for t in mlp[:n]):
            raise ConvertError(f"config.json: mlp_layer_types must list {n} of hash_moe, moe")
        mlp = mlp[:n]
        scoring = cfg.get("scoring_func", "sqrtsoftplus")
        if scoring != "sqrtsoftplus":
            raise ConvertError(f"config.json: scoring_func {scoring!r}: deepseek_v4 is supported "
                               "with \"sqrtsoftplus\" only")
        head_dim = get_int(cfg, "head_dim", default=512, minimum=1)
        prf = cfg.get("partial_rotary_factor")
        if prf is None:
            qr = cfg.get("qk_rope_head_dim")
            prf = qr / head_dim if qr is not None else 64 / 512
        rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        if not isinstance(rp, Mapping):
            raise ConvertError("config.json: rope_parameters must be an object")
        if isinstance(rp.get("main"), Mapping) and isinstance(rp.get("compress"), Mapping):
            main, comp = dict(rp["main"]), dict(rp["compress"])
        else:
            yarn = {k: v for k, v in rp.items() if k not in ("main", "compress")}
            main = {"rope_type": "default", "rope_theta": cfg.get("rope_theta", 10000.0)}
            comp = {**yarn, "rope_theta": cfg.get("compress_rope_theta", 160000.0)}
        main.setdefault("partial_rotary_factor", prf)
        comp.setdefault("partial_rotary_factor", prf)
        # transformers builds one shared expert of moe_intermediate_size whatever
        # n_shared_experts says (DeepseekV4MLP reads intermediate_size, mapped to it)
        moe_inter = get_int(cfg, "moe_intermediate_size")
        c2 = {k: v for k, v in cfg.items() if k not in (
            "rope_parameters", "rope_scaling", "partial_rotary_factor", "compress_rates",
            "layer_types", "mlp_layer_types")}
        c2["rope_parameters"] = {**main, "rope_type": main.get("rope_type", "default")}
        c2["head_dim"] = head_dim
        c2.setdefault("num_key_value_heads", 1)
        hp = super().hparams(
            self.prepare(c2, moe_inter=moe_inter, inter=0, norm_topk=True, shared=moe_inter), gen
        )
        rope_type, _ = hp.pop("_rope")
        if rope_type != "default":
            raise ConvertError("config.json: the main rope of deepseek_v4 is the default one")
        if hp["n_kv_heads"] != 1:
            raise ConvertError("config.json: deepseek_v4 shares one key/value head "
                               f"(num_key_value_heads={hp['n_kv_heads']})")
        hc = get_int(cfg, "hc_mult", default=4, minimum=1)
        if hc > 16:
            raise ConvertError(f"config.json: hc_mult {hc} is above 16")
        hp.update(
            layer_kinds=["moe"] * n,
            shared_expert_gate=False,
            rope_attn_factor=1.0,
            scoring_func="sqrtsoftplus",
            routed_scaling_factor=get_number(cfg, "routed_scaling_factor", default=1.5,
                                             at_least=1e-30),
            q_lora_rank=get_int(cfg, "q_lora_rank", default=1024, minimum=1),
            sliding_window=get_int(cfg, "sliding_window", default=128, minimum=1),
            swiglu_limit=get_number(cfg, "swiglu_limit", default=10.0, at_least=0.0),
            hc_mult=hc,
            hc_sinkhorn_iters=get_int(cfg, "hc_sinkhorn_iters", default=20, minimum=1),
            hc_eps=get_number(cfg, "hc_eps", default=1e-6, at_least=0.0),
            o_groups=get_int(cfg, "o_groups", default=8, minimum=1),
            o_lora_rank=get_int(cfg, "o_lora_rank", default=1024, minimum=1),
            index_heads=get_int(cfg, "index_n_heads", default=64, minimum=1),
            index_head_dim=get_int(cfg, "index_head_dim", default=128, minimum=1),
            index_topk=get_int(cfg, "index_topk", default=512, minimum=1),
            compress_rate_csa=csa,
            compress_rate_hca=hca,
            compress_kinds=[KINDS[t] for t in types],
            hash_layers=[t == "hash_moe" for t in mlp],
        )
        if hp["rope_dim"] > hp["index_head_dim"] and "csa" in hp["compress_kinds"]:
            raise ConvertError("config.json: index_head_dim must be >= the rope dims")
        if (hp["n_heads"] * head_dim) % hp["o_groups"]:
            raise ConvertError("config.json: o_groups must divide num_attention_heads * head_dim")
        ctype = str(comp.get("rope_type") or comp.get("type") or "default")
        if ctype == "yarn":
            comp.setdefault("attention_factor", 1.0)
        inv_c, _ = rope_inv_freq(ctype, float(comp.get("rope_theta", 160000.0)), hp["rope_dim"],
                                    comp, hp["max_position_embeddings"])
        return hp, inv_c


    def load(self, src: Path, cfg: dict[str, Any], gen: Mapping[str, Any]) -> Plan:
        """Plan of a ``deepseek_v4`` checkpoint directory."""
        hp, inv_c = self.hparams_and_compress_rope(cfg, gen)
        st = SafetensorsDir(src)
        alias: dict[str, str] = {}
        for stored in st.entries:
            if stored.endswith("_scale_inv") or (
                    stored.endswith(".scale")
                    and stored[: -len(".scale")] + ".weight" in st.entries):
                continue
            tn = hf_name(stored)
            if tn in alias:
                raise ConvertError(
                    f"{src}: tensors {alias[tn]!r} and {stored!r} are the same tensor")
            alias[tn] = stored
        s = ScaledSource(st, cfg, alias)
        L, H, V = hp["n_layers"], hp["hidden_size"], hp["vocab_size"]
        nh, hd, QL, RD = hp["n_heads"], hp["head_dim"], hp["q_lora_rank"], hp["rope_dim"]
        hc, G, OR = hp["hc_mult"], hp["o_groups"], hp["o_lora_rank"]
        ih, ihd = hp["index_heads"], hp["index_head_dim"]
        E, K, sh = hp["n_experts"], hp["top_k"], hp["shared_expert_intermediate_size"]
        R = (2 + hc) * hc
        trunk = top_tensors(s, hp)
        inv, _ = rope_inv_freq("default", hp["rope_theta"], RD, {}, hp["max_position_embeddings"])
        trunk.append(rope_freqs(inv))
        if any(k != "none" for k in hp["compress_kinds"]):
            trunk.append(rope_freqs(inv_c, "rope_freqs_compress"))
        for hn, cn, shape in (("hc_fn", "fn", (hc, hc * H)), ("hc_base", "base", (hc,)),
                              ("hc_scale", "scale", (1,))):
            trunk.append(s.tensor(f"model.hc_head.{hn}", f"hc_head.{cn}", "f32", shape))

        experts: list[ExpertLayerSrc] = []
        for i in range(L):
            pre, blk = f"model.layers.{i}.", f"blk.{i}."
            a = pre + "self_attn."

            def t(name: str, cname: str, kind: str, shape: tuple[int, ...]) -> None:
                trunk.append(s.tensor(name, blk + cname, kind, shape))

            t(pre + "input_layernorm.weight", "attn_norm.weight", "f32", (H,))
            t(pre + "post_attention_layernorm.weight", "ffn_norm.weight", "f32", (H,))
            for part in ("attn", "ffn"):
                t(pre + f"{part}_hc.fn", f"hc_{part}.fn", "f32", (R, hc * H))
                t(pre + f"{part}_hc.base", f"hc_{part}.base", "f32", (R,))
                t(pre + f"{part}_hc.scale", f"hc_{part}.scale", "f32", (3,))
            t(a + "q_a_proj.weight", "attn_q_a.weight", "trunk", (QL, H))
            t(a + "q_a_norm.weight", "attn_q_a_norm.weight", "f32", (QL,))
            t(a + "q_b_proj.weight", "attn_q_b.weight", "trunk", (nh * hd, QL))
            t(a + "kv_proj.weight", "attn_kv.weight", "trunk", (hd, H))
            t(a + "kv_norm.weight", "attn_kv_norm.weight", "f32", (hd,))
            t(a + "o_a_proj.weight", "attn_output_a.weight", "trunk", (G * OR, nh * hd // G))
            t(a + "o_b_proj.weight", "attn_output_b.weight", "trunk", (H, G * OR))
            t(a + "sinks", "attn_sinks", "f32", (nh,))
            kind = hp["compress_kinds"][i]
            if kind != "none":
                m = hp["compress_rate_csa"] if kind == "csa" else hp["compress_rate_hca"]
                w = 2 * hd if kind == "csa" else hd
                c = a + "compressor."
                t(c + "kv_proj.weight", "attn_cmp_kv.weight", "trunk", (w, H))
                t(c + "gate_proj.weight", "attn_cmp_gate.weight", "trunk", (w, H))
                pb = s.f32(c + "position_bias", (m, w))
                trunk.append(computed(blk + "attn_cmp_bias", lambda v=pb: v.reshape(-1), (m * w,)))
                t(c + "kv_norm.weight", "attn_cmp_norm.weight", "f32", (hd,))
                if kind == "csa":
                    x = c + "indexer."
                    t(x + "kv_proj.weight", "attn_idx_kv.weight", "trunk", (2 * ihd, H))
                    t(x + "gate_proj.weight", "attn_idx_gate.weight", "trunk", (2 * ihd, H))
                    ib = s.f32(x + "position_bias", (m, 2 * ihd))
                    trunk.append(computed(blk + "attn_idx_bias", lambda v=ib: v.reshape(-1),
                                           (m * 2 * ihd,)))
                    t(x + "kv_norm.weight", "attn_idx_norm.weight", "f32", (ihd,))
                    t(x + "q_b_proj.weight", "attn_idx_q.weight", "trunk", (ih * ihd, QL))
                    t(x + "scorer.weights_proj.weight", "attn_idx_w.weight", "trunk", (ih, H))
            g = pre + "mlp."
            t(g + "gate.weight", "ffn_gate_inp.weight", "f32", (E, H))
            if hp["hash_layers"][i]:
                ent = s.entry(g + "gate.tid2eid")
                if tuple(ent.shape) != (V, K) or ent.dtype not in ("I64", "I32"):
                    raise ConvertError(f"tensor {g + 'gate.tid2eid'!r}: {ent.dtype} "
                                       f"{list(ent.shape)}, expected I64 {[V, K]}")
                ids = np.asarray(s.raw(g + "gate.tid2eid")).astype(np.int64)
                if ids.size and (ids.min() < 0 or ids.max() >= E):
                    raise ConvertError(
                        f"tensor {g + 'gate.tid2eid'!r}: expert ids outside 0..{E - 1}")
                trunk.append(computed(blk + "ffn_hash_ids", lambda v=ids: v.astype(np.float32),
                                       (V, K)))
            elif s.has(g + "gate.e_score_correction_bias"):
                t(g + "gate.e_score_correction_bias", "exp_probs_b.bias", "f32", (E,))
            if sh:
                for p, cn, shape in (("gate_proj", "ffn_gate_shexp", (sh, H)),
                                     ("up_proj", "ffn_up_shexp", (sh, H)),
                                     ("down_proj", "ffn_down_shexp", (H, sh))):
                    t(g + f"shared_experts.{p}.weight", f"{cn}.weight", "trunk", shape)
            experts.append(collect_experts(s, hp, i, pre))
        return finish_plan(s, MODEL_TYPE, cfg, hp, trunk, experts,
                           skipped=lambda n: n.startswith(("mtp.", "model.mtp.")))


ARCH: Final[DeepseekV4] = DeepseekV4()


def load(src: Path, cfg: dict[str, Any], gen: Mapping[str, Any]) -> Plan:
    """Plan of a ``deepseek_v4`` checkpoint directory."""
    return ARCH.load(src, cfg, gen)
