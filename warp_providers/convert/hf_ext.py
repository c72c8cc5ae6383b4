"""Hugging Face importer for ``gpt_oss`` and ``kimi_linear`` (called by :func:`load_hf`).

Owns the config quirks and tensor maps of these two families:

* ``gpt_oss``: attention sinks (``blk.{i}.attn_sinks``), q/k/v/o biases unless
  ``attention_bias`` is false, ``layer_types`` ->
  ``attn_kinds`` ("sliding"/"full") with ``sliding_window``, router bias
  (``ffn_gate_inp.bias``), experts with biases (trunk tensors ``ffn_{gate,up,down}_exps.bias``,
  ``[n_experts, width]`` f32), the fused ``gate_up_proj`` whose gate and up are
  *interleaved* (gate = even, up = odd), stored ``[E, hidden, 2*inter]`` as transformers
  holds it, or as the original MXFP4 ``*_blocks``/``*_scales`` ``[E, rows, cols/32, 16]``
  (dequantized here exactly: FP4 e2m1 nibbles, low nibble first, times 2^(scale-127)),
  ``swiglu_alpha``/``swiglu_limit``, YaRN via ``rope_parameters``.
* ``kimi_linear``: KDA layers (``layer_types`` "linear_attention" -> ``attn_kinds`` "kda",
  ``kda_heads``/``kda_head_dim``/``kda_conv`` from ``linear_attn_config``; tensors
  ``blk.{i}.kda_*``, the three depthwise convolutions concatenated q, k, v into
  ``kda_conv.weight`` ``[3D * kernel]``), MLA layers without positional encoding (the
  deepseek_v3 names and hparams; ``rope_freqs`` is all zeros, so the rope part is carried
  unrotated, exactly), sigmoid grouped routing with ``exp_probs_b.bias``, shared experts,
  dense first layers. Both the original checkpoint spelling (``block_sparse_moe.*``,
  ``experts.N.w1/w2/w3``, ``q_conv1d``...) and transformers' (``mlp.*``, fused experts,
  ``conv1d``, ``forget_gate.*``) are read.

Everything not listed is refused with a ``ConvertError`` naming the tensor.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

from . import hf
from .quant import ConvertError
from .writer import ExpertLayerSrc, Plan, SrcTensor, const_rows

EXT_MODEL_TYPES: Final[tuple[str, ...]] = ("gpt_oss", "kimi_linear", "deepseek_v4")

FP4_VALUES: Final[np.ndarray] = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=np.float32,
)


def mxfp4_to_f32(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Dequantize MXFP4 ``blocks [..., G, 16]`` (u8) with ``scales [..., G]`` (u8, e8m0).

    Returns ``[..., G * 32]`` float32: element ``2j`` of a group is the low nibble of byte
    ``j``, element ``2j + 1`` the high nibble, each times ``2 ** (scale - 127)``.
    """
    b = np.asarray(blocks, dtype=np.uint8)
    s = np.asarray(scales, dtype=np.int32) - 127
    if b.shape[:-1] != s.shape or b.shape[-1] != 16:
        raise ConvertError(f"MXFP4 blocks {list(b.shape)} do not match scales {list(s.shape)}")
    out = np.empty((*b.shape[:-1], 32), dtype=np.float32)
    out[..., 0::2] = FP4_VALUES[b & 0x0F]
    out[..., 1::2] = FP4_VALUES[b >> 4]
    out = np.ldexp(out, s[..., None]).astype(np.float32)
    return out.reshape(*b.shape[:-2], b.shape[-2] * 32)


def _num(cfg: Mapping[str, Any], key: str, default: float) -> float:
    v = cfg.get(key, default)
    if v is None:
        v = default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ConvertError(f"config.json: {key!r} must be a positive number, got {v!r}")
    return float(v)


def _base_hparams(cfg: Mapping[str, Any], gen: Mapping[str, Any], moe_inter: int,
                  inter: int, norm_topk: bool, shared: int) -> dict[str, Any]:
    """The common keys through hf's normalizer (as a qwen2_moe-shaped config)."""
    c2 = dict(cfg)
    for k in ("mlp_layer_types", "first_k_dense_replace", "mlp_only_layers",
              "decoder_sparse_step", "layer_types", "use_sliding_window", "hidden_act"):
        c2.pop(k, None)
    c2.update(moe_intermediate_size=moe_inter, intermediate_size=inter,
              norm_topk_prob=norm_topk, shared_expert_intermediate_size=shared)
    return hf._hparams("qwen2_moe", c2, gen)


class _St:
    """Name -> stored tensor access with used-name bookkeeping."""

    def __init__(self, st: hf.SafetensorsDir) -> None:
        self.st = st
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.st.entries

    def entry(self, name: str) -> Any:
        if name not in self.st.entries:
            raise ConvertError(f"tensor {name!r} is missing")
        self.used.add(name)
        return self.st.entries[name]

    def f32(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        ent = self.entry(name)
        if tuple(ent.shape) != shape:
            raise ConvertError(f"tensor {name!r}: shape {list(ent.shape)}, config implies {list(shape)}")
        if ent.dtype == "U8":
            raise ConvertError(f"tensor {name!r}: u8 is not a float type")
        return hf._to_f32(self.st.raw(name), ent.dtype)

    def u8(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        ent = self.entry(name)
        if tuple(ent.shape) != shape or ent.dtype != "U8":
            raise ConvertError(
                f"tensor {name!r}: {ent.dtype} {list(ent.shape)}, expected U8 {list(shape)}")
        return self.st.raw(name)

    def tensor(self, b: hf._Builder, name: str, cname: str, kind: str,
               shape: tuple[int, ...]) -> SrcTensor:
        self.entry(name)
        return b.tensor(name, cname, kind, shape)


def _computed(cname: str, arr_fn: Any, shape: tuple[int, ...], kind: str = "f32",
              nbytes: int = 0) -> SrcTensor:
    """A tensor computed on first use by arr_fn() (2-D view rows)."""
    memo: dict[str, np.ndarray] = {}

    def rows(r0: int, r1: int) -> np.ndarray:
        if "a" not in memo:
            a = np.asarray(arr_fn(), dtype=np.float32)
            memo["a"] = a.reshape(-1, shape[-1])
        return memo["a"][r0:r1]

    return SrcTensor(cname, shape, kind, rows, nbytes)


# --------------------------------------------------------------------------- gpt_oss

_GPTOSS_LAYER: Final[dict[str, tuple[str, str]]] = {
    "input_layernorm.weight": ("attn_norm.weight", "f32"),
    "post_attention_layernorm.weight": ("ffn_norm.weight", "f32"),
    "self_attn.q_proj.weight": ("attn_q.weight", "trunk"),
    "self_attn.q_proj.bias": ("attn_q.bias", "f32"),
    "self_attn.k_proj.weight": ("attn_k.weight", "trunk"),
    "self_attn.k_proj.bias": ("attn_k.bias", "f32"),
    "self_attn.v_proj.weight": ("attn_v.weight", "trunk"),
    "self_attn.v_proj.bias": ("attn_v.bias", "f32"),
    "self_attn.o_proj.weight": ("attn_output.weight", "trunk"),
    "self_attn.o_proj.bias": ("attn_output.bias", "f32"),
    "self_attn.sinks": ("attn_sinks", "f32"),
    "mlp.router.weight": ("ffn_gate_inp.weight", "f32"),
    "mlp.router.bias": ("ffn_gate_inp.bias", "f32"),
}


def _gpt_oss_hparams(cfg: Mapping[str, Any], gen: Mapping[str, Any]) -> dict[str, Any]:
    inter = hf._int(cfg, "intermediate_size")
    if inter == 0:
        raise ConvertError("config.json: intermediate_size must be > 0")
    hp = _base_hparams(cfg, gen, moe_inter=inter, inter=0, norm_topk=True, shared=0)
    n = hp["n_layers"]
    types = cfg.get("layer_types")
    if types is None:
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    if not isinstance(types, list) or len(types) != n:
        raise ConvertError(f"config.json: layer_types must list {n} entries")
    kinds = []
    for t in types:
        if t not in ("sliding_attention", "full_attention"):
            raise ConvertError(f"config.json: unknown layer_types entry {t!r}")
        kinds.append("sliding" if t == "sliding_attention" else "full")
    window = cfg.get("sliding_window")
    if "sliding" in kinds:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ConvertError(f"config.json: sliding_window must be a positive integer, got {window!r}")
    else:
        window = None
    hp.update(attention_bias=hf._flag(cfg, "attention_bias", True))
    hp.update(
        sliding_window=window,
        attn_kinds=kinds,
        swiglu_alpha=_num(cfg, "swiglu_alpha", 1.702),
        swiglu_limit=_num(cfg, "swiglu_limit", 7.0),
    )
    return hp


def _load_gpt_oss(src: Path, cfg: dict[str, Any], gen: Mapping[str, Any]) -> Plan:
    hp = _gpt_oss_hparams(cfg, gen)
    rope_type, rope_params = hp.pop("_rope")
    bias = hp.pop("attention_bias")
    st = hf.SafetensorsDir(src)
    s = _St(st)
    b = hf._Builder(st, cfg)
    L, H, V = hp["n_layers"], hp["hidden_size"], hp["vocab_size"]
    hd, nh, nkv = hp["head_dim"], hp["n_heads"], hp["n_kv_heads"]
    E, inter = hp["n_experts"], hp["moe_intermediate_size"]
    shapes = {
        "attn_norm.weight": (H,), "ffn_norm.weight": (H,),
        "attn_q.weight": (nh * hd, H), "attn_q.bias": (nh * hd,),
        "attn_k.weight": (nkv * hd, H), "attn_k.bias": (nkv * hd,),
        "attn_v.weight": (nkv * hd, H), "attn_v.bias": (nkv * hd,),
        "attn_output.weight": (H, nh * hd), "attn_output.bias": (H,),
        "attn_sinks": (nh,), "ffn_gate_inp.weight": (E, H), "ffn_gate_inp.bias": (E,),
    }
    trunk = _top_tensors(s, b, hp, V, H)
    inv, _ = hf.rope_inv_freq(rope_type, hp["rope_theta"], hp["rope_dim"], rope_params,
                              hp["max_position_embeddings"])
    trunk.append(SrcTensor("rope_freqs", (hp["rope_dim"] // 2,), "f32", const_rows(inv), 0))
    experts: list[ExpertLayerSrc] = []
    for i in range(L):
        pre = f"model.layers.{i}."
        for hf_name, (cname, kind) in _GPTOSS_LAYER.items():
            if hf_name.startswith("self_attn.") and hf_name.endswith(".bias") and not bias:
                continue  # attention_bias false: no q/k/v/o biases (the engine's are optional)
            trunk.append(s.tensor(b, pre + hf_name, f"blk.{i}.{cname}", kind, shapes[cname]))
        ex = pre + "mlp.experts."
        gub = s.f32(ex + "gate_up_proj_bias", (E, 2 * inter))
        trunk.append(_computed(f"blk.{i}.ffn_gate_exps.bias", lambda a=gub: a[:, 0::2], (E, inter)))
        trunk.append(_computed(f"blk.{i}.ffn_up_exps.bias", lambda a=gub: a[:, 1::2], (E, inter)))
        trunk.append(s.tensor(b, ex + "down_proj_bias", f"blk.{i}.ffn_down_exps.bias", "f32", (E, H)))
        experts.append(_gpt_oss_experts(s, i, E, H, inter))
    for layer in experts:
        for e in range(layer.n_experts):
            layer.expert(e)
    unused = sorted(set(st.entries) - s.used)
    if unused:
        more = f" and {len(unused) - 5} more" if len(unused) > 5 else ""
        raise ConvertError(f"{src}: tensors not used by gpt_oss: {', '.join(unused[:5])}{more}")
    files, tokenizer, chat = hf._tokenizer_files(src)
    return Plan(model_type="gpt_oss", source_config=cfg, hparams=hp, trunk=trunk,
                experts=experts, files=files, tokenizer=tokenizer, chat=chat, source="hf")


def _top_tensors(s: _St, b: hf._Builder, hp: Mapping[str, Any], V: int, H: int) -> list[SrcTensor]:
    out = [s.tensor(b, "model.embed_tokens.weight", "token_embd.weight", "embedding", (V, H)),
           s.tensor(b, "model.norm.weight", "output_norm.weight", "f32", (H,))]
    if not hp["tie_word_embeddings"]:
        out.append(s.tensor(b, "lm_head.weight", "output.weight", "output", (V, H)))
    return out


def _gpt_oss_experts(s: _St, i: int, E: int, H: int, inter: int) -> ExpertLayerSrc:
    ex = f"model.layers.{i}.mlp.experts."
    gshape, dshape = (inter, H), (H, inter)
    if s.has(ex + "gate_up_proj_blocks"):
        if H % 32 or inter % 32:
            raise ConvertError(f"layer {i}: MXFP4 experts need hidden and inter multiples of 32")
        gu_b = s.u8(ex + "gate_up_proj_blocks", (E, 2 * inter, H // 32, 16))
        gu_s = s.u8(ex + "gate_up_proj_scales", (E, 2 * inter, H // 32))
        dn_b = s.u8(ex + "down_proj_blocks", (E, H, inter // 32, 16))
        dn_s = s.u8(ex + "down_proj_scales", (E, H, inter // 32))
        nbytes = (gu_b.nbytes + gu_s.nbytes + dn_b.nbytes + dn_s.nbytes) // E

        def expert(e: int) -> tuple[SrcTensor, SrcTensor, SrcTensor]:
            def part(par: int) -> Any:
                def rows(r0: int, r1: int) -> np.ndarray:
                    sl = slice(2 * r0 + par, 2 * r1 + par, 2)
                    return mxfp4_to_f32(gu_b[e, sl], gu_s[e, sl])
                return rows

            def drows(r0: int, r1: int) -> np.ndarray:
                return mxfp4_to_f32(dn_b[e, r0:r1], dn_s[e, r0:r1])

            return (SrcTensor(f"blk.{i}.expert.{e}.gate", gshape, "experts", part(0), nbytes // 3),
                    SrcTensor(f"blk.{i}.expert.{e}.up", gshape, "experts", part(1), nbytes // 3),
                    SrcTensor(f"blk.{i}.expert.{e}.down", dshape, "experts", drows, nbytes // 3))

        return ExpertLayerSrc(i, E, (gshape, gshape, dshape), expert, nbytes * E)
    gu_name, dn_name = ex + "gate_up_proj", ex + "down_proj"
    gu_ent, dn_ent = s.entry(gu_name), s.entry(dn_name)
    if tuple(gu_ent.shape) != (E, H, 2 * inter):
        raise ConvertError(f"tensor {gu_name!r}: shape {list(gu_ent.shape)}, "
                           f"config implies {[E, H, 2 * inter]}")
    if tuple(dn_ent.shape) != (E, inter, H):
        raise ConvertError(f"tensor {dn_name!r}: shape {list(dn_ent.shape)}, "
                           f"config implies {[E, inter, H]}")
    gu_raw, dn_raw = s.st.raw(gu_name), s.st.raw(dn_name)
    nbytes = (gu_ent.nbytes + dn_ent.nbytes) // E

    def expert_f(e: int) -> tuple[SrcTensor, SrcTensor, SrcTensor]:
        def gu() -> np.ndarray:
            return hf._to_f32(gu_raw[e], gu_ent.dtype)  # [H, 2I], gate/up interleaved

        return (
            _computed(f"blk.{i}.expert.{e}.gate", lambda: gu()[:, 0::2].T, gshape, "experts", nbytes // 3),
            _computed(f"blk.{i}.expert.{e}.up", lambda: gu()[:, 1::2].T, gshape, "experts", nbytes // 3),
            _computed(f"blk.{i}.expert.{e}.down", lambda: hf._to_f32(dn_raw[e], dn_ent.dtype).T,
                      dshape, "experts", nbytes // 3),
        )

    return ExpertLayerSrc(i, E, (gshape, gshape, dshape), expert_f, nbytes * E)


def expert_layer(src: Path, b: hf._Builder, hp: Mapping[str, Any], i: int, pre: str,
                 names: Iterable[tuple[str, str]], used: set[str]) -> ExpertLayerSrc:
    """Return the routed experts of layer `i` (per-expert or fused tensors under `pre`).

    `names` pairs the spelling matched against the expert patterns with the stored name
    (the same unless the checkpoint's names were mapped); each one taken joins `used`.
    """
    per: dict[int, dict[str, str]] = {}
    fused: dict[str, str] = {}
    for spelled, name in names:
        if not spelled.startswith(pre):
            continue
        rest = spelled[len(pre):]
        if (em := hf._EXPERT_RE.fullmatch(rest)) is not None:
            per.setdefault(int(em.group(1)), {})[hf._EXPERT_PART[em.group(2)]] = name
            used.add(name)
        elif (fm := hf._FUSED_RE.fullmatch(rest)) is not None:
            fused[fm.group(1)] = name
            used.add(name)
    return hf._expert_layer(src, b, hp, i, per or None, fused or None)


# --------------------------------------------------------------------------- kimi_linear

_KIMI_ALIASES: Final[dict[str, str]] = {  # transformers-config spelling <- checkpoint's
    "num_experts_per_tok": "num_experts_per_token",
    "n_shared_experts": "num_shared_experts",
    "n_group": "num_expert_group",
    "norm_topk_prob": "moe_renormalize",
    "max_position_embeddings": "model_max_length",
}


def _kimi_hparams(cfg: Mapping[str, Any], gen: Mapping[str, Any]) -> dict[str, Any]:
    c2 = {k: v for k, v in cfg.items() if v is not None}
    for key, alias in _KIMI_ALIASES.items():
        if key not in c2 and alias in c2:
            c2[key] = c2[alias]
    lac = cfg.get("linear_attn_config") or {}
    if not isinstance(lac, Mapping):
        raise ConvertError("config.json: linear_attn_config must be an object")
    n = hf._int(cfg, "num_hidden_layers")
    types = cfg.get("layer_types")
    if types is None and "kda_layers" in lac and "full_attn_layers" in lac:
        types = [None] * n
        for i in lac["full_attn_layers"]:
            types[int(i) - 1] = "full_attention"
        for i in lac["kda_layers"]:
            types[int(i) - 1] = "linear_attention"
    if types is None:
        types = ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(n)]
    if not isinstance(types, list) or len(types) != n or any(
            t not in ("full_attention", "linear_attention") for t in types):
        raise ConvertError(f"config.json: layer_types must list {n} attention kinds")
    if "mlp_layer_types" not in c2:
        fk = hf._int(cfg, "first_k_dense_replace", default=1)
        c2["mlp_layer_types"] = ["dense" if i < fk else "sparse" for i in range(n)]
    for k in ("rope_parameters", "rope_scaling", "partial_rotary_factor", "layer_types"):
        c2.pop(k, None)  # NoPE: the rope part of MLA is never rotated
    c2["rope_interleave"] = False
    c2.setdefault("first_k_dense_replace", 0)
    if c2.get("scoring_func") not in (None, "sigmoid"):
        raise ConvertError("config.json: kimi_linear routes with sigmoid scores")
    hp = hf._hparams("deepseek_v3", c2, gen)
    heads = hf._int(lac, "num_heads", default=hf._int(cfg, "linear_num_heads", default=32),
                    where="config.json linear_attn_config")
    hd = hf._int(lac, "head_dim", default=hf._int(cfg, "linear_head_dim", default=128),
                 where="config.json linear_attn_config")
    conv = hf._int(lac, "short_conv_kernel_size",
                   default=hf._int(cfg, "linear_conv_kernel_dim", default=4),
                   where="config.json linear_attn_config")
    if heads == 0 or hd == 0 or conv == 0:
        raise ConvertError("config.json: KDA heads, head_dim and conv kernel must be > 0")
    hp.update(
        attn_kinds=["kda" if t == "linear_attention" else "full" for t in types],
        kda_heads=heads, kda_head_dim=hd, kda_conv=conv, rope_attn_factor=1.0,
    )
    return hp


def _first(s: _St, pre: str, names: tuple[str, ...]) -> str | None:
    for n in names:
        if s.has(pre + n):
            return pre + n
    return None


def _load_kimi_linear(src: Path, cfg: dict[str, Any], gen: Mapping[str, Any]) -> Plan:
    hp = _kimi_hparams(cfg, gen)
    hp.pop("_rope")
    st = hf.SafetensorsDir(src)
    s = _St(st)
    if hp["tie_word_embeddings"] and s.has("lm_head.weight"):
        # KimiLinearForCausalLM ties nothing (empty _tied_weights_keys): whatever
        # tie_word_embeddings says, transformers computes the logits with lm_head.weight
        hp["tie_word_embeddings"] = False
    b = hf._Builder(st, cfg)
    L, H, V = hp["n_layers"], hp["hidden_size"], hp["vocab_size"]
    nh, R, RD = hp["n_heads"], hp["kv_lora_rank"], hp["rope_dim"]
    nope, vd, QL = hp["qk_nope_head_dim"], hp["v_head_dim"], hp["q_lora_rank"]
    kh, d, K = hp["kda_heads"], hp["kda_head_dim"], hp["kda_conv"]
    D = kh * d
    E, inter, sh = hp["n_experts"], hp["intermediate_size"], hp["shared_expert_intermediate_size"]
    trunk = _top_tensors(s, b, hp, V, H)
    trunk.append(SrcTensor("rope_freqs", (RD // 2,), "f32",
                           const_rows(np.zeros(RD // 2, dtype=np.float32)), 0))
    experts: list[ExpertLayerSrc] = []

    def need(pre: str, names: tuple[str, ...], cname: str, kind: str, shape: tuple[int, ...]) -> None:
        name = _first(s, pre, names)
        if name is None:
            raise ConvertError(f"{src}: tensor {pre + names[0]!r} is missing")
        trunk.append(s.tensor(b, name, cname, kind, shape))

    for i in range(L):
        pre, blk = f"model.layers.{i}.", f"blk.{i}."
        a = pre + "self_attn."
        need(pre, ("input_layernorm.weight",), blk + "attn_norm.weight", "f32", (H,))
        if hp["attn_kinds"][i] == "kda":
            for p, shape in (("q", (D, H)), ("k", (D, H)), ("v", (D, H))):
                need(a, (f"{p}_proj.weight",), blk + f"attn_{p}.weight", "trunk", shape)
            need(a, ("o_proj.weight",), blk + "attn_output.weight", "trunk", (H, D))
            need(a, ("f_a_proj.weight", "forget_gate.f_a_proj.weight"), blk + "kda_f_a.weight", "trunk", (d, H))
            need(a, ("f_b_proj.weight", "forget_gate.f_b_proj.weight"), blk + "kda_f_b.weight", "trunk", (D, d))
            need(a, ("b_proj.weight",), blk + "kda_b.weight", "trunk", (kh, H))
            need(a, ("g_a_proj.weight",), blk + "kda_g_a.weight", "trunk", (d, H))
            need(a, ("g_b_proj.weight",), blk + "kda_g_b.weight", "trunk", (D, d))
            need(a, ("o_norm.weight",), blk + "kda_o_norm.weight", "f32", (d,))
            dt = _first(s, a, ("dt_bias", "forget_gate.dt_bias"))
            alog = _first(s, a, ("A_log", "forget_gate.A_log"))
            if dt is None or alog is None:
                raise ConvertError(f"{src}: layer {i}: KDA dt_bias / A_log is missing")
            dtv = s.f32(dt, tuple(st.entries[dt].shape))
            alv = s.f32(alog, tuple(st.entries[alog].shape))
            if dtv.size != D or alv.size != kh:
                raise ConvertError(f"{src}: layer {i}: dt_bias has {dtv.size} values (want {D}), "
                                   f"A_log {alv.size} (want {kh})")
            trunk.append(_computed(blk + "kda_dt_bias", lambda v=dtv: v.reshape(-1), (D,)))
            trunk.append(_computed(blk + "kda_a_log", lambda v=alv: v.reshape(-1), (kh,)))
            if s.has(a + "conv1d.weight"):
                cw = s.f32(a + "conv1d.weight", (3 * D, 1, K))
                trunk.append(_computed(blk + "kda_conv.weight", lambda v=cw: v.reshape(-1), (3 * D * K,)))
            else:
                parts = [s.f32(a + f"{p}_conv1d.weight", (D, 1, K)) for p in ("q", "k", "v")]
                trunk.append(_computed(blk + "kda_conv.weight",
                                       lambda ps=parts: np.concatenate([p.reshape(-1) for p in ps]),
                                       (3 * D * K,)))
        else:
            if QL:
                need(a, ("q_a_proj.weight",), blk + "attn_q_a.weight", "trunk", (QL, H))
                need(a, ("q_a_layernorm.weight",), blk + "attn_q_a_norm.weight", "f32", (QL,))
                need(a, ("q_b_proj.weight",), blk + "attn_q_b.weight", "trunk", (nh * (nope + RD), QL))
            else:
                need(a, ("q_proj.weight",), blk + "attn_q.weight", "trunk", (nh * (nope + RD), H))
            need(a, ("kv_a_proj_with_mqa.weight",), blk + "attn_kv_a_mqa.weight", "trunk", (R + RD, H))
            need(a, ("kv_a_layernorm.weight",), blk + "attn_kv_a_norm.weight", "f32", (R,))
            need(a, ("kv_b_proj.weight",), blk + "attn_kv_b.weight", "trunk", (nh * (nope + vd), R))
            need(a, ("o_proj.weight",), blk + "attn_output.weight", "trunk", (H, nh * vd))
            # attention_bias: q_a_proj (with q_lora), kv_a_proj_with_mqa and o_proj carry biases
            for p, cn, n in (("q_a_proj", "attn_q_a", QL), ("kv_a_proj_with_mqa", "attn_kv_a_mqa",
                                                            R + RD), ("o_proj", "attn_output", H)):
                if n and s.has(a + f"{p}.bias"):
                    trunk.append(s.tensor(b, a + f"{p}.bias", blk + f"{cn}.bias", "f32", (n,)))
        need(pre, ("post_attention_layernorm.weight",), blk + "ffn_norm.weight", "f32", (H,))
        if hp["layer_kinds"][i] == "dense":
            for p, cn, shape in (("gate_proj", "ffn_gate", (inter, H)), ("up_proj", "ffn_up", (inter, H)),
                                 ("down_proj", "ffn_down", (H, inter))):
                need(pre, (f"mlp.{p}.weight", f"block_sparse_moe.{p}.weight"), blk + f"{cn}.weight",
                     "trunk", shape)
            continue
        need(pre, ("block_sparse_moe.gate.weight", "mlp.gate.weight"), blk + "ffn_gate_inp.weight",
             "f32", (E, H))
        need(pre, ("block_sparse_moe.gate.e_score_correction_bias", "mlp.gate.e_score_correction_bias"),
             blk + "exp_probs_b.bias", "f32", (E,))
        if not sh:  # n_shared_experts=0: transformers still writes the MLP, 0 rows wide
            for p in ("gate_proj", "up_proj", "down_proj"):
                for n in (f"block_sparse_moe.shared_experts.{p}.weight",
                          f"mlp.shared_experts.{p}.weight"):
                    if s.has(pre + n) and 0 in st.entries[pre + n].shape:
                        s.used.add(pre + n)
        if sh:
            for p, cn, shape in (("gate_proj", "ffn_gate_shexp", (sh, H)), ("up_proj", "ffn_up_shexp", (sh, H)),
                                 ("down_proj", "ffn_down_shexp", (H, sh))):
                need(pre, (f"block_sparse_moe.shared_experts.{p}.weight", f"mlp.shared_experts.{p}.weight"),
                     blk + f"{cn}.weight", "trunk", shape)
        experts.append(expert_layer(src, b, hp, i, pre, ((n, n) for n in st.entries), s.used))
    for layer in experts:
        for e in range(layer.n_experts):
            layer.expert(e)
    unused = sorted(set(st.entries) - s.used)
    if unused:
        more = f" and {len(unused) - 5} more" if len(unused) > 5 else ""
        raise ConvertError(f"{src}: tensors not used by kimi_linear: {', '.join(unused[:5])}{more}")
    files, tokenizer, chat = hf._tokenizer_files(src)
    return Plan(model_type="kimi_linear", source_config=cfg, hparams=hp, trunk=trunk,
                experts=experts, files=files, tokenizer=tokenizer, chat=chat, source="hf")


# --------------------------------------------------------------------------- entry


def load_ext(src: Path, cfg: dict[str, Any]) -> Plan:
    """Plan of a checkpoint whose model_type is in :data:`EXT_MODEL_TYPES`."""
    gen_path = src / "generation_config.json"
    gen = hf._load_json(gen_path) if gen_path.is_file() else {}
    mt = cfg.get("model_type")
    if mt == "gpt_oss":
        return _load_gpt_oss(src, cfg, gen)
    if mt == "kimi_linear":
        return _load_kimi_linear(src, cfg, gen)
    if mt == "deepseek_v4":
        from .hf_dsv4 import _load_deepseek_v4

        return _load_deepseek_v4(src, cfg, gen)
    raise ConvertError(f"model_type {mt!r} is not handled by hf_ext")
