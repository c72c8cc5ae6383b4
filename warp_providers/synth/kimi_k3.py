"""Random Kimi K3 checkpoints in the released layout (the text model of the multimodal release).

The outer ``config.json`` names ``KimiK3ForConditionalGeneration`` and nests the text model
in ``text_config`` (``model_type`` ``kimi_linear`` plus the K3-only keys); text tensors carry
the ``language_model.`` prefix; routed experts are compressed-tensors MXFP4
(``weight_packed`` U8 ``[out, in/2]``, low nibble first, ``weight_scale`` U8 ``[out, in/32]``
E8M0), everything else bf16 (``A_log``, ``dt_bias`` and the selection bias f32, ``A_log``
padded to the KDA head dim). The tokenizer is a tiktoken rank file (256 bytes, then a few
merges) with its special tokens, XTML's markers among them, in ``tokenizer_config.json``.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: Ranks after the 256 single bytes.
_MERGES = (b"he", b"ll", b"llo", b"hello", b" w", b"or", b"orl", b"orld", b" world", b"  ")
#: Special tokens (XTML's markers, the chat roles' ends, the media markers).
_SPECIALS = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>", "<|im_end|>",
             "<|media_begin|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>")
PAT_STR = r"""[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s+"""


@dataclass(frozen=True)
class KimiK3Shape:
    """The shape of a generated K3 checkpoint: every key of the K3 text config.

    ``layer_pattern`` spells each layer's attention, repeated to ``num_hidden_layers``:
    "K" a KDA layer, "M" an MLA layer. The first ``first_k_dense_replace`` layers have a
    dense MLP, the others latent MoE (routed experts on ``routed_expert_hidden_size``)
    plus ``num_shared_experts`` shared experts on the full hidden state.
    ``attn_res_block_size`` 0 leaves Attention Residuals out (plain residuals);
    ``activation_situ_linear_beta`` 0 leaves the up projection unbounded;
    ``routed_expert_hidden_size`` 0 runs the experts on the hidden state (no latent MoE).
    ``vocab_size`` 0 sizes the embedding and LM head to the generated tokenizer (padded to
    32); a larger value pads them to that many rows, as the release's 163840 does.
    """

    hidden_size: int = 64
    num_hidden_layers: int = 6
    layer_pattern: str = "KKKM"
    first_k_dense_replace: int = 1
    intermediate_size: int = 96
    moe_intermediate_size: int = 32
    num_experts: int = 16
    num_experts_per_token: int = 4
    num_shared_experts: int = 2
    routed_expert_hidden_size: int = 32
    latent_moe_use_norm: bool = True
    routed_scaling_factor: float = 1.0
    num_attention_heads: int = 4
    q_lora_rank: int = 32
    kv_lora_rank: int = 32
    qk_nope_head_dim: int = 16
    qk_rope_head_dim: int = 8
    v_head_dim: int = 16
    mla_use_output_gate: bool = True
    kda_num_heads: int = 2
    kda_head_dim: int = 32
    short_conv_kernel_size: int = 4
    use_full_rank_gate: bool = True
    gate_lower_bound: float = -5.0
    attn_res_block_size: int = 2
    activation_situ_beta: float = 4.0
    activation_situ_linear_beta: float = 25.0
    rms_norm_eps: float = 1e-5
    vocab_size: int = 0

    def kinds(self) -> str:
        """One of "K", "M" per layer (the pattern repeated and cut)."""
        p = self.layer_pattern
        if not p or any(c not in "KM" for c in p):
            raise ValueError(f"layer_pattern {p!r}: only K and M")
        return (p * (self.num_hidden_layers // len(p) + 1))[: self.num_hidden_layers]


@dataclass(frozen=True)
class KimiK3VisionShape:
    """The image tower of a generated K3 checkpoint (the release's ``vision_config`` keys)
    and its ``preprocessor_config.json`` (``media_proc_cfg``, mean = std = 0.5 as K3's).

    ``qkv_hidden_size`` is the attention's width (heads * head dim), which K3's tower sets
    wider than ``vt_hidden_size``."""

    vt_hidden_size: int = 32
    vt_num_attention_heads: int = 2
    qkv_hidden_size: int = 48
    vt_intermediate_size: int = 48
    vt_num_hidden_layers: int = 2
    init_pos_emb_height: int = 8
    init_pos_emb_width: int = 8
    patch_size: int = 14
    merge_kernel_size: int = 2
    in_patch_limit: int = 64
    patch_limit_on_one_side: int = 16
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    def config(self, text_hidden: int) -> dict[str, Any]:
        """The outer ``vision_config``."""
        return {"model_type": "moonvit", "vt_hidden_size": self.vt_hidden_size,
                "vt_num_attention_heads": self.vt_num_attention_heads,
                "qkv_hidden_size": self.qkv_hidden_size,
                "vt_intermediate_size": self.vt_intermediate_size,
                "vt_num_hidden_layers": self.vt_num_hidden_layers,
                "init_pos_emb_height": self.init_pos_emb_height,
                "init_pos_emb_width": self.init_pos_emb_width, "patch_size": self.patch_size,
                "merge_kernel_size": [self.merge_kernel_size] * 2,
                "text_hidden_size": text_hidden}

    def preprocessor(self) -> dict[str, Any]:
        """``preprocessor_config.json``."""
        return {"media_proc_cfg": {
            "patch_size": self.patch_size, "merge_kernel_size": self.merge_kernel_size,
            "in_patch_limit": self.in_patch_limit,
            "patch_limit_on_one_side": self.patch_limit_on_one_side,
            "image_mean": list(self.image_mean), "image_std": list(self.image_std)}}


def _bf16(a: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (round to nearest even), as uint16."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """Write ``name -> (safetensors dtype, array)`` (bf16 given as its uint16 bits)."""
    header: dict[str, Any] = {}
    off = 0
    for name, (dt, a) in tensors.items():
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h)
        for _, a in tensors.values():
            f.write(np.ascontiguousarray(a).tobytes())


def _tokenizer(out: Path) -> tuple[int, int]:
    """Write the rank file and tokenizer_config.json; return (vocab size, eos id)."""
    ranks = [bytes([b]) for b in range(256)] + list(_MERGES)
    (out / "tiktoken.model").write_text(
        "".join(f"{base64.b64encode(t).decode()} {r}\n" for r, t in enumerate(ranks)))
    first = len(ranks)
    specials = {first + i: s for i, s in enumerate(_SPECIALS)}
    eos = first + _SPECIALS.index("<|end_of_msg|>")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "added_tokens_decoder": {str(i): {"content": s, "special": True}
                                 for i, s in specials.items()},
        "eos_token": "<|end_of_msg|>", "pat_str": PAT_STR,
    }))
    return (first + len(_SPECIALS) + 31) // 32 * 32, eos


def text_config(sh: KimiK3Shape, vocab: int, eos: int) -> dict[str, Any]:
    """The ``text_config`` of the release, for shape ``sh``."""
    kinds = sh.kinds()
    n = sh.num_hidden_layers
    return {
        "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear",
        "vocab_size": vocab, "hidden_size": sh.hidden_size, "num_hidden_layers": n,
        "intermediate_size": sh.intermediate_size,
        "moe_intermediate_size": sh.moe_intermediate_size, "num_experts": sh.num_experts,
        "num_experts_per_token": sh.num_experts_per_token,
        "num_shared_experts": sh.num_shared_experts, "first_k_dense_replace":
            sh.first_k_dense_replace, "moe_layer_freq": 1, "moe_renormalize": True,
        "moe_router_activation_func": "sigmoid", "routed_scaling_factor":
            sh.routed_scaling_factor, "num_expert_group": 1, "topk_group": 1,
        "use_grouped_topk": True, "num_attention_heads": sh.num_attention_heads,
        "num_key_value_heads": sh.num_attention_heads, "q_lora_rank": sh.q_lora_rank,
        "kv_lora_rank": sh.kv_lora_rank, "qk_nope_head_dim": sh.qk_nope_head_dim,
        "qk_rope_head_dim": sh.qk_rope_head_dim, "v_head_dim": sh.v_head_dim,
        "mla_use_nope": True, "mla_use_output_gate": sh.mla_use_output_gate,
        "linear_attn_config": {
            "kda_layers": [i + 1 for i in range(n) if kinds[i] == "K"],
            "full_attn_layers": [i + 1 for i in range(n) if kinds[i] == "M"],
            "num_heads": sh.kda_num_heads, "head_dim": sh.kda_head_dim,
            "short_conv_kernel_size": sh.short_conv_kernel_size,
            "use_full_rank_gate": sh.use_full_rank_gate,
            "gate_lower_bound": sh.gate_lower_bound,
        },
        "hidden_act": "situ", "activation_situ_beta": sh.activation_situ_beta,
        "activation_situ_linear_beta": sh.activation_situ_linear_beta or None,
        "routed_expert_hidden_size": sh.routed_expert_hidden_size or None,
        "latent_moe_use_norm": sh.latent_moe_use_norm,
        "attn_res_block_size": sh.attn_res_block_size or None,
        "num_nextn_predict_layers": 0, "rms_norm_eps": sh.rms_norm_eps,
        "model_max_length": 4096, "tie_word_embeddings": False, "bos_token_id": None,
        "eos_token_id": eos, "pad_token_id": None, "torch_dtype": "bfloat16",
    }


def _mxfp4(rng: np.random.Generator, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Random MXFP4 codes and E8M0 scales whose values have std about 1/sqrt(cols)."""
    packed = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
    e = int(np.round(np.log2(1.0 / (2.93 * np.sqrt(cols)))))
    scale = (127 + e + rng.integers(-1, 2, (rows, cols // 32))).astype(np.uint8)
    return packed, scale


def make_kimi_k3_checkpoint(out: str | Path, shape: KimiK3Shape | None = None,
                            seed: int = 0, outer_model_type: str = "kimi_k3",
                            vision: KimiK3VisionShape | None = None) -> Path:
    """Write a random K3 checkpoint in the released layout, one shard per layer.

    Args:
        out: the directory to create.
        shape: sizes and knobs (default: a tiny model, 6 layers, 16 experts, top-4).
        seed: the RNG seed; the same seed gives the same bytes.
        outer_model_type: the outer config's ``model_type`` (the public sources do not
            name it; detection goes by ``architectures`` and the K3-only keys).
        vision: also write an image tower of this shape (``vision_tower.*``,
            ``mm_projector.*``, its own shard, drawn after the text model so the text
            weights are those of the same seed without it) and ``preprocessor_config.json``;
            None: the tower config only, no tensors (a text-only checkpoint).

    Returns:
        The directory, ready for ``warp convert``.

    """
    sh = shape or KimiK3Shape()
    kinds = sh.kinds()
    o = Path(out)
    o.mkdir(parents=True, exist_ok=True)
    vocab, eos = _tokenizer(o)
    if sh.vocab_size:
        if sh.vocab_size < vocab:
            raise ValueError(f"vocab_size {sh.vocab_size}: the tokenizer has {vocab} ids")
        vocab = sh.vocab_size
    vocab_ids = {t: 256 + len(_MERGES) + i for i, t in enumerate(_SPECIALS)}
    cfg = {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": outer_model_type,
           "text_config": text_config(sh, vocab, eos),
           "vision_config": vision.config(sh.hidden_size) if vision else
           {"model_type": "moonvit", "patch_size": 14, "depth": 1},
           "quantization_config": {"quant_method": "compressed-tensors",
                                   "format": "mxfp4-pack-quantized"},
           "tie_word_embeddings": False}
    if vision:
        cfg["media_placeholder_token_id"] = vocab_ids["<|media_pad|>"]
    (o / "config.json").write_text(json.dumps(cfg, indent=1))
    rng = np.random.default_rng(seed)
    h, lat = sh.hidden_size, sh.routed_expert_hidden_size or sh.hidden_size
    weight_map: dict[str, str] = {}

    def mat(rows: int, cols: int) -> tuple[str, np.ndarray]:
        return "BF16", _bf16(rng.standard_normal((rows, cols), np.float32) / np.sqrt(cols))

    def norm(k: int, spread: float = 0.2) -> tuple[str, np.ndarray]:
        return "BF16", _bf16(1.0 + spread * rng.standard_normal(k, np.float32))

    def f32(a: np.ndarray) -> tuple[str, np.ndarray]:
        return "F32", a.astype(np.float32)

    def shard(name: str, t: dict[str, tuple[str, np.ndarray]]) -> None:
        write_safetensors(o / name, t)
        weight_map.update({k: name for k in t})

    def mlp(p: str, inter: int, width: int) -> dict[str, tuple[str, np.ndarray]]:
        return {p + "gate_proj.weight": mat(inter, width), p + "up_proj.weight": mat(inter, width),
                p + "down_proj.weight": mat(width, inter)}

    def res(p: str) -> dict[str, tuple[str, np.ndarray]]:
        # proj is a Linear(hidden, 1): one row; the scores are sums over hidden
        return {p + "_norm.weight": norm(h), p + "_proj.weight": mat(1, h)}

    m = "language_model.model."
    top = {m + "embed_tokens.weight": ("BF16", _bf16(rng.standard_normal((vocab, h), np.float32))),
           m + "norm.weight": norm(h), "language_model.lm_head.weight": mat(vocab, h)}
    if sh.attn_res_block_size:
        top.update(res(m + "output_attn_res"))
    shard("model-embed.safetensors", top)
    nh, ql, kvr = sh.num_attention_heads, sh.q_lora_rank, sh.kv_lora_rank
    nope, rd, vd = sh.qk_nope_head_dim, sh.qk_rope_head_dim, sh.v_head_dim
    kh, kd, kk = sh.kda_num_heads, sh.kda_head_dim, sh.short_conv_kernel_size
    dd = kh * kd
    for i, kind in enumerate(kinds):
        p = f"{m}layers.{i}."
        a = p + "self_attn."
        t = {p + "input_layernorm.weight": norm(h), p + "post_attention_layernorm.weight": norm(h)}
        if sh.attn_res_block_size:
            t.update(res(p + "self_attention_res"))
            t.update(res(p + "mlp_res"))
        if kind == "K":
            dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), dd))
            a_log = np.zeros(max(kd, kh), np.float32)  # per head, padded to head_dim
            a_log[:kh] = rng.uniform(-1.0, 1.0, kh)
            t.update({
                a + "q_proj.weight": mat(dd, h), a + "k_proj.weight": mat(dd, h),
                a + "v_proj.weight": mat(dd, h), a + "o_proj.weight": mat(h, dd),
                a + "f_a_proj.weight": mat(kd, h), a + "f_b_proj.weight": mat(dd, kd),
                a + "b_proj.weight": mat(kh, h), a + "o_norm.weight": norm(kd),
                a + "dt_bias": f32(dt + np.log(-np.expm1(-dt))),
                a + "A_log": f32(a_log.reshape(1, 1, -1, 1)),
            })
            if sh.use_full_rank_gate:
                t[a + "g_proj.weight"] = mat(dd, h)
            else:
                t.update({a + "g_a_proj.weight": mat(kd, h), a + "g_b_proj.weight": mat(dd, kd)})
            for q in "qkv":
                t[f"{a}{q}_conv1d.weight"] = f32(
                    rng.standard_normal((dd, 1, kk), np.float32) / np.sqrt(kk))
        else:
            if ql:
                t.update({a + "q_a_proj.weight": mat(ql, h), a + "q_a_layernorm.weight": norm(ql),
                          a + "q_b_proj.weight": mat(nh * (nope + rd), ql)})
            else:
                t[a + "q_proj.weight"] = mat(nh * (nope + rd), h)
            t.update({
                a + "kv_a_proj_with_mqa.weight": mat(kvr + rd, h),
                a + "kv_a_layernorm.weight": norm(kvr),
                a + "kv_b_proj.weight": mat(nh * (nope + vd), kvr),
                a + "o_proj.weight": mat(h, nh * vd),
            })
            if sh.mla_use_output_gate:
                t[a + "g_proj.weight"] = mat(nh * vd, h)
        if i < sh.first_k_dense_replace:
            t.update(mlp(p + "mlp.", sh.intermediate_size, h))
        else:
            b = p + "block_sparse_moe."
            # router logits ~ N(0, 1): sigmoid scores spread over (0, 1)
            t[b + "gate.weight"] = mat(sh.num_experts, h)
            t[b + "gate.e_score_correction_bias"] = f32(0.5 * rng.standard_normal(sh.num_experts))
            shared = sh.moe_intermediate_size * sh.num_shared_experts
            t.update(mlp(b + "shared_experts.", shared, h))
            if sh.routed_expert_hidden_size:
                t[b + "routed_expert_down_proj.weight"] = mat(lat, h)
                t[b + "routed_expert_up_proj.weight"] = mat(h, lat)
            if sh.routed_expert_hidden_size and sh.latent_moe_use_norm:
                t[b + "routed_expert_norm.weight"] = norm(lat)
            inter = sh.moe_intermediate_size
            for e in range(sh.num_experts):
                for w, (rows, cols) in (("w1", (inter, lat)), ("w3", (inter, lat)),
                                        ("w2", (lat, inter))):
                    packed, scale = _mxfp4(rng, rows, cols)
                    t[f"{b}experts.{e}.{w}.weight_packed"] = ("U8", packed)
                    t[f"{b}experts.{e}.{w}.weight_scale"] = ("U8", scale)
        shard(f"model-layer-{i:03d}.safetensors", t)
    if vision:
        shard("model-vision.safetensors", _tower(vision, h, mat, norm))
        (o / "preprocessor_config.json").write_text(json.dumps(vision.preprocessor(), indent=1))
    (o / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    return o


def _tower(v: KimiK3VisionShape, text_hidden: int, mat: Any, norm: Any
           ) -> dict[str, tuple[str, np.ndarray]]:
    """The tower's and projector's tensors as K3 stores them (bf16, no biases)."""
    D, A, F, p = v.vt_hidden_size, v.qkv_hidden_size, v.vt_intermediate_size, v.patch_size
    M = v.merge_kernel_size ** 2 * D
    pe = "vision_tower.patch_embed."
    kind, w = mat(D, 3 * p * p)
    gh, gw = v.init_pos_emb_height, v.init_pos_emb_width
    pos_kind, pos = mat(gh * gw, D)
    t = {pe + "proj.weight": (kind, w.reshape(D, 3, p, p)),
         pe + "pos_emb.weight": (pos_kind, pos.reshape(gh, gw, D))}
    for i in range(v.vt_num_hidden_layers):
        b = f"vision_tower.encoder.blocks.{i}."
        t.update({b + "norm0.weight": norm(D), b + "wqkv.weight": mat(3 * A, D),
                  b + "wo.weight": mat(D, A), b + "norm1.weight": norm(D),
                  b + "mlp.fc0.weight": mat(F, D), b + "mlp.fc1.weight": mat(D, F)})
    t.update({"vision_tower.encoder.final_layernorm.weight": norm(D),
              "mm_projector.proj.0.weight": mat(M, M),
              "mm_projector.proj.2.weight": mat(text_hidden, M),
              "mm_projector.post_norm.weight": norm(text_hidden)})
    return t
