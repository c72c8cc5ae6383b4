"""The standard decoder family: hyperparameters and tensor map of most MoE checkpoints.

Owns :class:`Decoder`, the base an ``arch/<model_type>.py`` subclasses with data (its
HF -> FORMAT.md tensor-name map, its config defaults) and a few hooks (routed experts,
attention, sliding window, q/k norm); the normalized hparams of FORMAT.md section 3 in
their manifest order; the table-driven loader of checkpoints whose layers hold only
standard tensors (``Decoder.load``: names matched against the map, then required and
allowed per layer kind); the name pieces those maps are built from; and two family
bases: :class:`Noaux` (sigmoid scores with groups and a selection bias, ``noaux_tc``,
and multi-token-prediction layers skipped) and :class:`Mla` (multi-head latent
attention, ``kv_b_proj`` kept as stored).

Refuses, naming the key or tensor: a ``hidden_act`` other than silu, head counts that do
not divide, bad rope or routing keys, unknown or missing tensors, misshapen ones.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Final

from .base import (
    EXPERT_PART,
    EXPERT_RE,
    FUSED_RE,
    SafetensorsDir,
    StEntry,
    TensorSource,
    expert_count,
    expert_layer,
    finish_plan,
    get_flag,
    get_ids,
    get_int,
    get_number,
    rope_from_config,
    rope_inv_freq,
    rope_param,
    top_tensors,
    yarn_mscale,
)
from .plan import LAYER_TENSORS, ExpertLayerSrc, Plan, SrcTensor, layer_shapes, rope_freqs
from .plan import hparams as plan_hparams
from .quant import ConvertError

__all__ = [
    "ATTENTION",
    "DENSE_MLP",
    "MLA",
    "MLP_BIAS",
    "NORMS",
    "QK_NORM",
    "ROUTER",
    "SHARED_EXPERTS",
    "Decoder",
    "Mla",
    "Moe",
    "Noaux",
    "Prepared",
    "Rope",
    "layer_kinds",
    "optional_experts",
    "routed_experts",
    "sliding_window",
    "uniform_sliding",
]

# HF layer-name suffix -> canonical name (its role is plan.LAYER_TENSORS's).
NORMS: Final[dict[str, str]] = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}
ATTENTION: Final[dict[str, str]] = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.bias": "attn_output.bias",
}
QK_NORM: Final[dict[str, str]] = {
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
}
DENSE_MLP: Final[dict[str, str]] = {
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
MLP_BIAS: Final[dict[str, str]] = {
    "mlp.gate_proj.bias": "ffn_gate.bias",
    "mlp.up_proj.bias": "ffn_up.bias",
    "mlp.down_proj.bias": "ffn_down.bias",
}
ROUTER: Final[dict[str, str]] = {
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
}
SHARED_EXPERTS: Final[dict[str, str]] = {
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
}
MLA: Final[dict[str, str]] = {
    "self_attn.q_a_proj.weight": "attn_q_a.weight",
    "self_attn.q_a_proj.bias": "attn_q_a.bias",
    "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
    "self_attn.q_b_proj.weight": "attn_q_b.weight",
    "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
    "self_attn.kv_a_proj_with_mqa.bias": "attn_kv_a_mqa.bias",
    "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight",
    "self_attn.kv_b_proj.weight": "attn_kv_b.weight",
}
_SHEXP: Final[tuple[str, ...]] = (
    "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight",
)
_TOP: Final[tuple[str, ...]] = ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")
_LAYER_RE: Final[re.Pattern[str]] = re.compile(r"model\.layers\.(\d+)\.(.+)")
_IGNORED_SUFFIXES: Final[tuple[str, ...]] = ("rotary_emb.inv_freq",)


@dataclass(frozen=True)
class Moe:
    """What a config says of its routed experts (all zero for a dense model)."""

    n_experts: int = 0
    top_k: int = 0
    moe_inter: int = 0
    shared: int = 0  # shared-expert width, 0 for none
    norm_topk: bool = False
    inter: int = 0  # dense-MLP width as the family reads it


@dataclass(frozen=True)
class Rope:
    """The rope of a config: type, base, rotated dims, variant parameters, context."""

    type: str
    theta: float
    dim: int
    params: dict[str, Any]
    max_pos: int
    attn_factor: float


def layer_kinds(cfg: Mapping[str, Any], n_layers: int, n_experts: int) -> list[str]:
    """Per-layer "dense"/"moe" from whichever of the families' spellings is present."""
    if n_experts == 0:
        return ["dense"] * n_layers
    types = cfg.get("mlp_layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != n_layers:
            raise ConvertError(f"config.json: mlp_layer_types must list {n_layers} entries")
        kinds = []
        for t in types:
            if t in ("dense", "mlp"):
                kinds.append("dense")
            elif t in ("sparse", "moe"):
                kinds.append("moe")
            else:
                raise ConvertError(f"config.json: unknown mlp_layer_types entry {t!r}")
        return kinds
    step = get_int(cfg, "decoder_sparse_step", default=1)
    if step < 1:
        raise ConvertError("config.json: decoder_sparse_step must be >= 1")
    only = cfg.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) for i in only):
        raise ConvertError("config.json: mlp_only_layers must be a list of layer indices")
    first_dense = get_int(cfg, "first_k_dense_replace", default=0)
    return [
        "moe" if (i not in only and (i + 1) % step == 0 and i >= first_dense) else "dense"
        for i in range(n_layers)
    ]


def sliding_window(cfg: Mapping[str, Any], use: bool) -> int | None:
    """``sliding_window`` when ``use`` (null or 0: none), checked."""
    window = cfg.get("sliding_window") if use else None
    if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                               or window < 0):
        raise ConvertError(
            f"config.json: sliding_window must be null or a non-negative integer, got {window!r}"
        )
    return window or None


def uniform_sliding(cfg: Mapping[str, Any], n_layers: int, use: bool) -> dict[str, Any]:
    """Return the same window on every layer when ``use`` and ``sliding_window`` is set, else {}."""
    window = sliding_window(cfg, use)
    if window is None:
        return {}
    return {"sliding_window": window, "attn_kinds": ["sliding"] * n_layers}


def routed_experts(cfg: Mapping[str, Any], inter: int, *, norm_topk: bool) -> Moe:
    """Experts on every layer, each ``intermediate_size`` wide (mixtral, olmoe): no dense MLP."""
    return Moe(n_experts=expert_count(cfg), top_k=get_int(cfg, "num_experts_per_tok"),
               moe_inter=inter, norm_topk=norm_topk)


def optional_experts(cfg: Mapping[str, Any], inter: int, shared_key: str | None = None) -> Moe:
    """Experts of ``moe_intermediate_size``, or none at all when the count is 0 (qwen)."""
    n = expert_count(cfg, allow_none=True)
    shared = get_int(cfg, shared_key, default=0) if shared_key else 0
    return Moe(
        n_experts=n,
        top_k=get_int(cfg, "num_experts_per_tok") if n else 0,
        moe_inter=get_int(cfg, "moe_intermediate_size") if n else 0,
        shared=shared if n else 0,
        norm_topk=get_flag(cfg, "norm_topk_prob", False),
        inter=inter,
    )


class Decoder:
    """One decoder-only family; a subclass per ``model_type`` supplies data and hooks."""

    model_type: ClassVar[str]
    #: HF layer-name suffix (after ``model.layers.{i}.``) -> canonical tensor name.
    tensors: ClassVar[Mapping[str, str]]
    #: transformers' defaults of the keys a config.json may omit.
    defaults: ClassVar[Mapping[str, Any]] = {}
    #: every layer is MoE whatever the layer-kind keys say (mixtral, olmoe).
    all_moe: ClassVar[bool] = False

    # -- hooks
    def config(self, cfg: Mapping[str, Any]) -> Mapping[str, Any]:
        """Return the config the hparams are read from (defaults filled in)."""
        return cfg

    def experts(self, cfg: Mapping[str, Any], inter: int) -> Moe:
        """Return the routed experts of the config; ``inter`` is its ``intermediate_size``."""
        return Moe(inter=inter)

    def attention(
        self, cfg: Mapping[str, Any], n_heads: int, n_kv: int, head_dim: int
    ) -> tuple[int, int, int, dict[str, Any]]:
        """(head_dim, n_kv_heads, rotated head dims, extra hparams) of the attention."""
        return head_dim, n_kv, head_dim, {}

    def rope(self, cfg: Mapping[str, Any], rope_head: int) -> Rope:
        """Return the rope of the config, ``rope_head`` dims per head before partial rotation."""
        rope_type, theta, rope_dim, params = rope_from_config(cfg, rope_head)
        max_pos = get_int(cfg, "max_position_embeddings", default=2048)
        _, attn_factor = rope_inv_freq(rope_type, theta, rope_dim, params, max_pos)
        return Rope(rope_type, theta, rope_dim, params, max_pos, attn_factor)

    def routing(self, cfg: Mapping[str, Any], moe: Moe) -> dict[str, Any]:
        """Extra routing hparams (none: softmax top-k)."""
        return {}

    def attn_scale(self, head_dim: int, rope: Rope) -> float:
        """Return the softmax scale."""
        return float(head_dim**-0.5)

    def sliding(self, cfg: Mapping[str, Any], n_layers: int) -> dict[str, Any]:
        """``sliding_window`` and ``attn_kinds``, or nothing when every layer is full."""
        return {}

    def qk_norm(self, cfg: Mapping[str, Any]) -> str:
        """``none``, ``head`` (per-head RMSNorm of q and k) or ``full`` (whole rows)."""
        return "none"

    def clip_qkv(self, cfg: Mapping[str, Any]) -> float:
        """Return the q/k/v clamp (0: none)."""
        return 0.0

    def skip(self, hp: Mapping[str, Any], cname: str, ent: StEntry) -> bool:
        """Whether a stored layer tensor is left out (it changes nothing)."""
        return False

    def mtp_layers(self, cfg: Mapping[str, Any]) -> int:
        """Multi-token-prediction layers stored after the decoder's (skipped)."""
        return 0

    # -- hparams
    def hparams(self, cfg: Mapping[str, Any], gen: Mapping[str, Any]) -> dict[str, Any]:
        """Return normalized hparams (FORMAT.md section 3), plus ``_rope`` (type, params) to pop."""
        cfg = self.config(cfg)
        act = cfg.get("hidden_act", "silu")
        if act not in ("silu", "swish"):  # transformers' ACT2FN: swish is silu
            raise ConvertError(
                f"config.json: hidden_act {act!r} is not supported: the engine's MLPs are "
                "SwiGLU (silu)"
            )
        hidden = get_int(cfg, "hidden_size")
        n_layers = get_int(cfg, "num_hidden_layers")
        n_heads = get_int(cfg, "num_attention_heads")
        if hidden == 0 or n_layers == 0 or n_heads == 0:
            raise ConvertError(
                "config.json: hidden_size, num_hidden_layers and num_attention_heads must be > 0"
            )
        n_kv = get_int(cfg, "num_key_value_heads", default=n_heads)
        if n_kv == 0 or n_heads % n_kv:
            raise ConvertError(
                f"config.json: num_key_value_heads={n_kv} does not divide "
                f"num_attention_heads={n_heads}"
            )
        head_dim = get_int(cfg, "head_dim", default=hidden // n_heads) or hidden // n_heads
        head_dim, n_kv, rope_head, extra = self.attention(cfg, n_heads, n_kv, head_dim)
        moe = self.experts(cfg, get_int(cfg, "intermediate_size", default=0))
        if moe.n_experts and not 0 < moe.top_k <= moe.n_experts:
            raise ConvertError(
                f"config.json: num_experts_per_tok={moe.top_k} must be in 1..{moe.n_experts}"
            )
        kinds = layer_kinds(cfg, n_layers, moe.n_experts)
        if self.all_moe:
            kinds = ["moe"] * n_layers
        inter = moe.inter
        if "dense" not in kinds:
            inter = 0
        elif inter == 0:
            raise ConvertError("config.json: intermediate_size is needed for the dense layers")
        rope = self.rope(cfg, rope_head)
        eps = get_number(cfg, "rms_norm_eps", above=0)
        clip = self.clip_qkv(cfg)
        eos: list[int] = []
        for src, where in ((gen, "generation_config.json"), (cfg, "config.json")):
            for i in get_ids(src.get("eos_token_id"), "eos_token_id", where):
                if i not in eos:
                    eos.append(i)
        bos_v = cfg.get("bos_token_id")
        bos_l = get_ids(gen.get("bos_token_id") if bos_v is None else bos_v, "bos_token_id",
                        "config.json")
        vocab = get_int(cfg, "vocab_size")
        for i in eos + bos_l:
            if i >= vocab:
                raise ConvertError(
                    f"config.json: token id {i} (bos/eos) is outside the vocabulary of {vocab}"
                )
        extra.update(self.routing(cfg, moe))
        attn_scale = self.attn_scale(head_dim, rope)
        extra.update(self.sliding(cfg, n_layers))
        common = plan_hparams(
            vocab_size=vocab, hidden_size=hidden, n_layers=n_layers, n_heads=n_heads,
            n_kv_heads=n_kv, head_dim=head_dim, intermediate_size=inter,
            moe_intermediate_size=moe.moe_inter, n_experts=moe.n_experts, top_k=moe.top_k,
            norm_topk_prob=moe.norm_topk, shared_expert_intermediate_size=moe.shared,
            shared_expert_gate=self.shared_expert_gate(moe), layer_kinds=kinds,
            rms_norm_eps=eps, rope_dim=rope.dim, rope_theta=rope.theta,
            rope_attn_factor=rope.attn_factor, qk_norm=self.qk_norm(cfg), attn_scale=attn_scale,
            max_position_embeddings=rope.max_pos,
            tie_word_embeddings=get_flag(cfg, "tie_word_embeddings", False),
            bos_token_id=bos_l[0] if bos_l else None, eos_token_ids=eos, clip_qkv=clip,
        )
        return extra | common | {"_rope": (rope.type, rope.params)}

    def shared_expert_gate(self, moe: Moe) -> bool:
        """Whether a sigmoid gate scales the shared expert (qwen2_moe)."""
        return False

    # -- tensors
    def required(self, hp: Mapping[str, Any], kind: str) -> list[str]:
        """Canonical tensors a layer of ``kind`` ("dense"/"moe") must have."""
        req = ["attn_norm.weight", "ffn_norm.weight", "attn_q.weight", "attn_k.weight",
               "attn_v.weight"]
        req.append("attn_output.weight")
        if hp["qk_norm"] != "none":
            req += ["attn_q_norm.weight", "attn_k_norm.weight"]
        if kind == "dense":
            req += ["ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"]
        else:
            req.append("ffn_gate_inp.weight")
            if hp["shared_expert_intermediate_size"]:
                req += list(_SHEXP)
            if hp["shared_expert_gate"]:
                req.append("ffn_gate_inp_shexp.weight")
        return req

    def allowed(self, hp: Mapping[str, Any], kind: str) -> set[str]:
        """Canonical tensors a layer of ``kind`` may have: the required ones, biases."""
        ok = set(self.required(hp, kind)) | {
            "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias",
        }
        if kind == "dense" and hp["n_experts"] == 0:  # llama's mlp_bias
            ok |= {"ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"}
        return ok

    def load(self, src: Path, cfg: dict[str, Any], gen: Mapping[str, Any],
             st: Any = None) -> Plan:
        """Read a checkpoint of this family into a :class:`Plan` (no tensor data yet).

        ``st``: the tensors in place of src's safetensors shards (``SafetensorsDir``'s
        reading side: ``dir``, ``entries``, ``raw``), e.g. generated ones.

        Raises:
            ConvertError: naming the file, key or tensor at fault.

        """
        mt = self.model_type
        hp = self.hparams(cfg, gen)
        rope_type, rope_params = hp.pop("_rope")
        mtp = self.mtp_layers(cfg)
        s = TensorSource(st if st is not None else SafetensorsDir(src), cfg)
        n_layers = hp["n_layers"]
        layers: dict[int, dict[str, str]] = {i: {} for i in range(n_layers)}
        experts: dict[int, dict[int, dict[str, str]]] = {}
        fused: dict[int, dict[str, str]] = {}
        unknown: list[str] = []
        for name in sorted(s.st.entries):
            if name.endswith("_scale_inv") or name.endswith(_IGNORED_SUFFIXES) or name in _TOP:
                continue
            m = _LAYER_RE.fullmatch(name)
            if m is not None and n_layers <= int(m.group(1)) < n_layers + mtp:
                continue  # multi-token-prediction layers: not part of the decoder
            if m is None or int(m.group(1)) >= n_layers:
                unknown.append(name)
                continue
            i, rest = int(m.group(1)), m.group(2)
            if rest in self.tensors:
                cname = self.tensors[rest]
                if self.skip(hp, cname, s.st.entries[name]):
                    continue
                if cname in layers[i]:
                    raise ConvertError(
                        f"tensors {layers[i][cname]!r} and {name!r} both map to blk.{i}.{cname}"
                    )
                layers[i][cname] = name
            elif (em := EXPERT_RE.fullmatch(rest)) is not None:
                experts.setdefault(i, {}).setdefault(int(em.group(1)), {})[
                    EXPERT_PART[em.group(2)]
                ] = name
            elif (fm := FUSED_RE.fullmatch(rest)) is not None:
                fused.setdefault(i, {})[fm.group(1)] = name
            else:
                unknown.append(name)
        if unknown:
            more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            raise ConvertError(f"{src}: tensors not used by {mt}: {', '.join(unknown[:5])}{more}")
        for name in _TOP:
            if name not in s.st.entries and (name != "lm_head.weight"
                                             or not hp["tie_word_embeddings"]):
                raise ConvertError(f"{src}: tensor {name!r} is missing")
        trunk = top_tensors(s, hp)
        inv, _ = rope_inv_freq(
            rope_type, hp["rope_theta"], hp["rope_dim"], rope_params, hp["max_position_embeddings"]
        )
        trunk.append(rope_freqs(inv))
        expert_layers = [
            layer for i in range(n_layers)
            if (layer := self._layer(s, hp, i, layers[i], experts.get(i), fused.get(i), trunk))
        ]
        # everything else was matched above: what is left unused can only be an fp8 scale
        s.used.update(n for n in s.st.entries if not n.endswith("_scale_inv"))
        return finish_plan(s, mt, cfg, hp, trunk, expert_layers)

    def _layer(
        self,
        s: TensorSource,
        hp: Mapping[str, Any],
        i: int,
        have: dict[str, str],
        per: dict[int, dict[str, str]] | None,
        fz: dict[str, str] | None,
        trunk: list[SrcTensor],
    ) -> ExpertLayerSrc | None:
        """Append layer ``i``'s trunk tensors to ``trunk``; return its experts if MoE."""
        src, kind = s.dir, hp["layer_kinds"][i]
        if not hp["shared_expert_intermediate_size"]:
            # n_shared_experts=0: transformers still writes the shared MLP, 0 rows wide
            for cname in _SHEXP:
                if cname in have and 0 in s.st.entries[have[cname]].shape:
                    del have[cname]
        for cname in self.required(hp, kind):
            if cname not in have:
                hf = next(k for k, v in self.tensors.items() if v == cname)
                raise ConvertError(
                    f"{src}: tensor 'model.layers.{i}.{hf}' is missing ({kind} layer)"
                )
        extra = sorted(set(have) - self.allowed(hp, kind))
        if extra:
            raise ConvertError(
                f"{src}: tensor {have[extra[0]]!r} is not used by a {kind} layer of "
                f"{self.model_type}"
            )
        if kind == "dense" and (per or fz):
            raise ConvertError(f"{src}: layer {i} is dense by the config but has expert tensors")
        shapes = layer_shapes(hp)
        for cname, role in LAYER_TENSORS.items():
            if cname in have:
                trunk.append(s.tensor(have[cname], f"blk.{i}.{cname}", role, shapes[cname]))
        return expert_layer(s, hp, i, per, fz) if kind == "moe" else None


class Prepared(Decoder):
    """The standard keys of a config its architecture module rewrote first.

    For families (gpt_oss, deepseek_v4) whose own keys decide the expert widths and layer
    schedules: :meth:`prepare` drops the keys whose meaning differs there and puts the
    widths under the standard names; the module then adds its own hparams.
    """

    dropped: ClassVar[tuple[str, ...]] = (
        "mlp_layer_types", "first_k_dense_replace", "mlp_only_layers", "decoder_sparse_step",
        "layer_types", "use_sliding_window", "hidden_act",
    )

    def prepare(self, cfg: Mapping[str, Any], *, moe_inter: int, inter: int, norm_topk: bool,
                shared: int) -> dict[str, Any]:
        """``cfg`` without :attr:`dropped`, with the given widths under the standard names."""
        c2 = {k: v for k, v in cfg.items() if k not in self.dropped}
        c2.update(moe_intermediate_size=moe_inter, intermediate_size=inter,
                  norm_topk_prob=norm_topk, shared_expert_intermediate_size=shared)
        return c2

    def experts(self, cfg: Mapping[str, Any], inter: int) -> Moe:
        """Return the widths :meth:`prepare` put under the standard names."""
        return optional_experts(cfg, inter, "shared_expert_intermediate_size")


class Noaux(Decoder):
    """Sigmoid-scored routing with expert groups and a selection bias (``noaux_tc``)."""

    def config(self, cfg: Mapping[str, Any]) -> Mapping[str, Any]:
        """Return the defaults under the config's non-null keys."""
        return {**self.defaults, **{k: v for k, v in cfg.items() if v is not None}}

    def experts(self, cfg: Mapping[str, Any], inter: int) -> Moe:
        """Routed experts of ``moe_intermediate_size``; ``n_shared_experts`` of that width."""
        moe_inter = get_int(cfg, "moe_intermediate_size")
        return Moe(
            n_experts=expert_count(cfg),
            top_k=get_int(cfg, "num_experts_per_tok"),
            moe_inter=moe_inter,
            shared=moe_inter * get_int(cfg, "n_shared_experts"),
            norm_topk=get_flag(cfg, "norm_topk_prob", True),
            inter=inter,
        )

    def routing(self, cfg: Mapping[str, Any], moe: Moe) -> dict[str, Any]:
        """``scoring_func``, ``n_group``, ``topk_group`` and ``routed_scaling_factor``."""
        mt, n_experts, top_k = self.model_type, moe.n_experts, moe.top_k
        scoring = cfg.get("scoring_func")
        if scoring not in (None, "sigmoid"):
            raise ConvertError(
                f"config.json: scoring_func {scoring!r}: {mt} routes with sigmoid scores "
                "(noaux_tc)"
            )
        method = cfg.get("topk_method")
        if method not in (None, "noaux_tc"):
            raise ConvertError(f"config.json: topk_method {method!r}: only noaux_tc is supported")
        n_group = get_int(cfg, "n_group", default=1) or 1
        topk_group = get_int(cfg, "topk_group", default=1) or 1
        if n_group > 1:
            if n_experts % n_group or n_experts // n_group < 2:
                raise ConvertError(
                    f"config.json: n_group={n_group} must split {n_experts} experts into groups "
                    "of >= 2"
                )
            if not 1 <= topk_group <= n_group or topk_group * (n_experts // n_group) < top_k:
                raise ConvertError(
                    f"config.json: topk_group={topk_group} must be in 1..{n_group} and its "
                    f"groups must hold num_experts_per_tok={top_k} experts"
                )
        return {
            "scoring_func": "sigmoid",
            "n_group": n_group,
            "topk_group": min(topk_group, n_group),
            "routed_scaling_factor": get_number(cfg, "routed_scaling_factor", above=0),
        }

    def mtp_layers(self, cfg: Mapping[str, Any]) -> int:
        """``num_nextn_predict_layers``."""
        return get_int(cfg, "num_nextn_predict_layers", default=0)

    def allowed(self, hp: Mapping[str, Any], kind: str) -> set[str]:
        """Also the selection bias of MoE layers."""
        ok = super().allowed(hp, kind)
        if kind == "moe":
            ok.add("exp_probs_b.bias")
        return ok


class Mla(Decoder):
    """Multi-head latent attention: q (optionally low-rank), a shared latent kv."""

    def attention(
        self, cfg: Mapping[str, Any], n_heads: int, n_kv: int, head_dim: int
    ) -> tuple[int, int, int, dict[str, Any]]:
        """head_dim is the q/k width; the rope runs on ``qk_rope_head_dim`` dims."""
        nope, rope_head = get_int(cfg, "qk_nope_head_dim"), get_int(cfg, "qk_rope_head_dim")
        mla = {
            "q_lora_rank": get_int(cfg, "q_lora_rank", default=0),
            "kv_lora_rank": get_int(cfg, "kv_lora_rank"),
            "qk_nope_head_dim": nope,
            "v_head_dim": get_int(cfg, "v_head_dim"),
            "rope_interleave": get_flag(cfg, "rope_interleave", True),
        }
        if mla["kv_lora_rank"] == 0 or mla["v_head_dim"] == 0 or nope + rope_head == 0:
            raise ConvertError(
                "config.json: kv_lora_rank, v_head_dim and the qk head dims must be > 0"
            )
        return nope + rope_head, n_heads, rope_head, mla

    def attn_scale(self, head_dim: int, rope: Rope) -> float:
        """Return the softmax scale, times YaRN's mscale(factor, all_dim)^2 as transformers does."""
        scale = float(head_dim**-0.5)
        msa = rope.params.get("mscale_all_dim")
        if rope.type != "default" and msa:
            m = yarn_mscale(float(rope_param(rope.params, "factor", rope.type)), float(msa))
            scale *= m * m
        return scale

    def required(self, hp: Mapping[str, Any], kind: str) -> list[str]:
        """Return the latent projections instead of q/k/v."""
        req = super().required(hp, kind)
        attn = ["attn_norm.weight", "ffn_norm.weight", "attn_kv_a_mqa.weight",
                "attn_kv_a_norm.weight", "attn_kv_b.weight"]
        attn += (["attn_q_a.weight", "attn_q_a_norm.weight", "attn_q_b.weight"]
                 if hp["q_lora_rank"] else ["attn_q.weight"])
        return attn + req[5:]

    def allowed(self, hp: Mapping[str, Any], kind: str) -> set[str]:
        """Also the latent projections' biases."""
        return super().allowed(hp, kind) | {"attn_q_a.bias", "attn_kv_a_mqa.bias"}

