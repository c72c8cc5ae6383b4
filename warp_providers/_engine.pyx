# cython: language_level=3
"""The binding of the C engine (engine/include/wp.h) and nothing else.

Marshals arguments, releases the GIL around compute, and turns every status into an
exception through one function, _check. Argument policy lives in warp_providers.engine.
"""

from libc.stdint cimport int32_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

from warp_providers._engine cimport *

from warp_providers import errors as _errors

DEF ERR_CAP = 1024

_CFG_INT_FIELDS = (
    "ctx_tokens", "n_threads", "reader_threads", "prefill_chunk", "cache_policy",
    "direct_io", "verify", "lookahead", "isa", "max_sequences", "exact", "vision",
    "experts_per_token",
)


cdef object _raise(wp_status status, str detail):
    name = wp_strerror(status).decode("utf-8", "replace")
    raise _errors.from_status(int(status), name, detail)


cdef inline int _check(wp_status status, wp_ctx *ctx) except -1:
    if status != WP_OK:
        detail = wp_error_detail(ctx).decode("utf-8", "replace") if ctx != NULL else ""
        _raise(status, detail)
    return 0


ctypedef wp_status (*_ctx_path_fn)(wp_ctx *, const char *) noexcept nogil
ctypedef wp_status (*_seq_path_fn)(wp_seq *, const char *) noexcept nogil


cdef int _path_call(_ctx_path_fn on_ctx, wp_ctx *ctx, _seq_path_fn on_seq, wp_seq *seq,
                    str path) except -1:
    """A state file call on the context's own state (on_ctx) or on a sequence (on_seq),
    without the GIL; errors raised with ctx's detail."""
    cdef bytes b = path.encode()
    cdef const char *p = b
    cdef wp_status st
    with nogil:
        st = on_ctx(ctx, p) if on_ctx != NULL else on_seq(seq, p)
    return _check(st, ctx)


cdef class _Cfg:
    """Owns a wp_cfg and the bytes its string fields point to."""

    cdef wp_cfg cfg
    cdef bytes _hotlist, _cgroup, _proc, _trace

    def __cinit__(self, dict options):
        wp_cfg_init(&self.cfg)
        for key, value in options.items():
            if value is None:
                continue
            if key == "budget_bytes":
                self.cfg.budget_bytes = <uint64_t>value
            elif key == "usable_ram_bytes":
                self.cfg.usable_ram_bytes = <uint64_t>value
            elif key == "hotlist_path":
                self._hotlist = str(value).encode()
                self.cfg.hotlist_path = self._hotlist
            elif key == "route_trace_path":
                self._trace = str(value).encode()
                self.cfg.route_trace_path = self._trace
            elif key == "route_trace_offset":
                self.cfg.route_trace_offset = <uint64_t>value
            elif key == "route_trace_stride":
                self.cfg.route_trace_stride = <uint64_t>value
            elif key == "cgroup_root":
                self._cgroup = str(value).encode()
                self.cfg.cgroup_root = self._cgroup
            elif key == "proc_root":
                self._proc = str(value).encode()
                self.cfg.proc_root = self._proc
            elif key == "ctx_tokens":
                self.cfg.ctx_tokens = <uint32_t>value
            elif key == "n_threads":
                self.cfg.n_threads = <uint32_t>value
            elif key == "reader_threads":
                self.cfg.reader_threads = <uint32_t>value
            elif key == "prefill_chunk":
                self.cfg.prefill_chunk = <uint32_t>value
            elif key == "cache_policy":
                self.cfg.cache_policy = <int32_t>value
            elif key == "direct_io":
                self.cfg.direct_io = <int32_t>value
            elif key == "verify":
                self.cfg.verify = <int32_t>value
            elif key == "lookahead":
                self.cfg.lookahead = <int32_t>value
            elif key == "isa":
                self.cfg.isa = <int32_t>value
            elif key == "max_sequences":
                self.cfg.max_sequences = <uint32_t>value
            elif key == "exact":
                self.cfg.exact = <int32_t>value
            elif key == "vision":
                self.cfg.vision = <int32_t>(1 if value else 0)
            elif key == "experts_per_token":
                self.cfg.experts_per_token = <uint32_t>value
            else:
                raise TypeError(f"unknown engine option {key!r}")


STATE_KINDS = ("kv", "mla_latent", "recurrent", "indexer", "window", "csa", "hca")
"""Names of the WP_STATE_* kinds, in their order (a plan's "state_bytes" keys)."""


cdef dict _plan_dict(const wp_plan *p):
    assert len(STATE_KINDS) < WP_STATE_KINDS
    return {
        "trunk_bytes": p.trunk_bytes, "kv_bytes": p.kv_bytes,
        "scratch_bytes": p.scratch_bytes, "min_cache_bytes": p.min_cache_bytes,
        "floor_bytes": p.floor_bytes, "working_set_bytes": p.working_set_bytes,
        "recommended_bytes": p.recommended_bytes,
        "experts_total_bytes": p.experts_total_bytes, "record_bytes": p.record_bytes,
        "usable_ram_bytes": p.usable_ram_bytes, "budget_bytes": p.budget_bytes,
        "cache_bytes": p.cache_bytes, "ctx_tokens": p.ctx_tokens,
        "cache_slots": p.cache_slots, "budget_multiple": p.budget_multiple,
        "sequences": p.sequences, "sequence_bytes": p.sequence_bytes,
        # the image tower: weights, work for one image at its patch limit, and what the
        # floor counts (both when opened with the vision option, else 0)
        "vision_weight_bytes": p.vision_weight_bytes,
        "vision_reserve_bytes": p.vision_reserve_bytes, "vision_bytes": p.vision_bytes,
        # kv_bytes by kind of state; only the kinds this model has
        "state_bytes": {name: p.state_bytes[k] for k, name in enumerate(STATE_KINDS)
                        if p.state_bytes[k]},
    }


def plan_memory(str path, dict options):
    """Returns the memory plan dict; raises on error (a budget below the floor included)."""
    cdef _Cfg c = _Cfg(options)
    cdef wp_plan plan
    cdef char err[ERR_CAP]
    cdef bytes bpath = path.encode()
    cdef const char *cpath = bpath
    cdef wp_status st
    memset(&plan, 0, sizeof(plan))
    err[0] = 0
    with nogil:
        st = wp_plan_memory(cpath, &c.cfg, &plan, err, ERR_CAP)
    if st != WP_OK:
        _raise(st, err.decode("utf-8", "replace"))
    return _plan_dict(&plan)


def version():
    """The engine version string."""
    return wp_version().decode()


def isa_supported():
    """Bit mask of runnable kernel sets (1 << wp_isa)."""
    return wp_isa_supported()


cdef extern from "util.h" nogil:
    uint32_t wpi_crc32c(uint32_t crc, const void *data, size_t n)
    size_t wpi_mxfp4_interleave(const unsigned char *packed, const unsigned char *scales,
                                size_t blocks, unsigned char *out)


def crc32c(const unsigned char[::1] data not None, uint32_t crc=0):
    """CRC32C of ``data`` continuing from ``crc`` (the CRC of the bytes before it), the
    engine's own (the SSE4.2 / ARMv8 instruction where the CPU has it); the GIL is
    released while it runs."""
    cdef size_t n = data.shape[0]
    cdef uint32_t out
    if n == 0:
        return crc
    with nogil:
        out = wpi_crc32c(crc, &data[0], n)
    return out


def mxfp4_interleave(const unsigned char[::1] packed not None,
                     const unsigned char[::1] scales not None, unsigned char[::1] out not None):
    """Container mxfp4 blocks of MXFP4 codes and E8M0 scales into ``out`` (17 bytes a
    block; ``packed`` 16 bytes a block); returns how many scales are 255 (NaN)."""
    cdef size_t blocks = scales.shape[0]
    cdef size_t nan
    if <size_t>packed.shape[0] != blocks * 16 or <size_t>out.shape[0] != blocks * 17:
        raise ValueError("mxfp4_interleave: sizes of packed, scales and out disagree")
    if blocks == 0:
        return 0
    with nogil:
        nan = wpi_mxfp4_interleave(&packed[0], &scales[0], blocks, &out[0])
    return nan


cdef class Context:
    """One open container: wp_open in __cinit__, wp_close in __dealloc__."""

    cdef wp_ctx *ctx
    cdef readonly uint32_t vocab_size
    cdef readonly uint32_t max_sequences
    cdef readonly uint32_t hidden_size
    cdef readonly str path
    cdef object _vision  # the manifest's vision object, read once (False: not yet)

    def __cinit__(self, str path, dict options):
        cdef _Cfg c = _Cfg(options)
        cdef char err[ERR_CAP]
        cdef bytes bpath = path.encode()
        cdef const char *cpath = bpath
        cdef wp_status st
        cdef wp_info info
        err[0] = 0
        self.ctx = NULL
        with nogil:
            st = wp_open(cpath, &c.cfg, &self.ctx, err, ERR_CAP)
        if st != WP_OK:
            _raise(st, err.decode("utf-8", "replace"))
        _check(wp_get_info(self.ctx, &info), self.ctx)
        self.vocab_size = info.vocab_size
        self.max_sequences = info.plan.sequences
        self.hidden_size = info.hidden_size
        self.path = path
        self._vision = False

    def __dealloc__(self):
        if self.ctx != NULL:
            wp_close(self.ctx)
            self.ctx = NULL

    cdef inline int _live(self) except -1:
        if self.ctx == NULL:
            raise ValueError("the engine is closed")
        return 0

    @property
    def closed(self):
        """Whether `close` has freed the context."""
        return self.ctx == NULL

    def close(self):
        """Frees the context now (idempotent)."""
        if self.ctx != NULL:
            wp_close(self.ctx)
            self.ctx = NULL

    def eval(self, const int32_t[::1] tokens, float[::1] logits, bint all_logits):
        """Evaluates tokens; writes logits (len 0 for prefill only)."""
        self._live()
        cdef uint32_t n = <uint32_t>tokens.shape[0]
        cdef size_t cap = <size_t>logits.shape[0]
        cdef float *out = &logits[0] if cap > 0 else NULL
        cdef const int32_t *tok = &tokens[0] if n > 0 else NULL
        cdef wp_status st
        with nogil:
            st = wp_eval(self.ctx, tok, n, all_logits, out, cap)
        _check(st, self.ctx)

    @property
    def position(self):
        self._live()
        return wp_position(self.ctx)

    def reset(self):
        self._live()
        _check(wp_state_reset(self.ctx), self.ctx)

    def truncate(self, uint32_t pos):
        self._live()
        _check(wp_state_truncate(self.ctx, pos), self.ctx)

    def save_state(self, str path):
        self._live()
        _path_call(wp_state_save, self.ctx, NULL, NULL, path)

    def load_state(self, str path):
        self._live()
        _path_call(wp_state_load, self.ctx, NULL, NULL, path)

    def vision_info(self):
        """The container's image tower facts (manifest "vision", with tower_bytes and
        reserve_bytes from the plan), or None when it has no tower."""
        self._live()
        import json
        import os
        if self._vision is False:
            with open(os.path.join(self.path, "manifest.json"), encoding="utf-8") as f:
                self._vision = json.load(f).get("vision")
        v = self._vision
        if v is None:
            return None
        cdef wp_info info
        _check(wp_get_info(self.ctx, &info), self.ctx)
        out = {k: val for k, val in v.items() if k != "hparams"}
        out["tower_bytes"] = info.plan.vision_weight_bytes
        out["reserve_bytes"] = info.plan.vision_reserve_bytes
        return out

    @property
    def placeholder_token_id(self):
        """The image placeholder token id, or None."""
        self._live()
        cdef int32_t t = wp_placeholder_token(self.ctx)
        return None if t < 0 else t

    def encode_image(self, const float[:, ::1] pixel_values, grid_thw):
        """Runs the image tower on one image's pixel_values [n_patches, patch_dim] of grid
        (t, h, w); returns float32 rows [n_tokens, hidden_size]."""
        self._live()
        import numpy as np
        cdef uint32_t g[3]
        t, h, w = (int(x) for x in grid_thw)
        if min(t, h, w) <= 0:
            raise ValueError(f"grid_thw {tuple(grid_thw)} must be positive")
        g[0] = <uint32_t>t
        g[1] = <uint32_t>h
        g[2] = <uint32_t>w
        m = 1
        info = self.vision_info()
        if info is not None:
            m = int(info.get("merge_size", 1))
        rows = max(1, t * h * w // (m * m))
        out = np.zeros((rows, self.hidden_size), dtype=np.float32)
        cdef float[:, ::1] o = out
        cdef uint32_t n = <uint32_t>pixel_values.shape[0]
        cdef uint32_t dim = <uint32_t>pixel_values.shape[1]
        cdef const float *px = &pixel_values[0, 0] if n > 0 and dim > 0 else NULL
        cdef uint32_t got = 0
        cdef wp_status st
        with nogil:
            st = wp_encode_image(self.ctx, px, n, dim, g, &o[0, 0], <size_t>o.shape[0] * o.shape[1], &got)
        _check(st, self.ctx)
        return out[:got]

    def push_embeds(self, const float[:, ::1] rows):
        """Queues rows [n, hidden_size] for sequence 0's next placeholder tokens."""
        self._live()
        cdef uint32_t n = <uint32_t>rows.shape[0]
        cdef uint32_t w = <uint32_t>rows.shape[1]
        cdef const float *p = &rows[0, 0] if n > 0 and w > 0 else NULL
        _check(wp_push_embeds(self.ctx, p, n, w), self.ctx)

    @property
    def pending_embeds(self):
        """Rows queued on sequence 0 and not yet taken."""
        self._live()
        return wp_pending_embeds(self.ctx)

    def seq_open(self):
        """Takes a free sequence (BudgetError when all max_sequences are in use)."""
        self._live()
        cdef wp_seq *s = NULL
        _check(wp_seq_open(self.ctx, &s), self.ctx)
        cdef Sequence seq = Sequence.__new__(Sequence)
        seq.owner = self
        seq.seq = s
        return seq

    def eval_batch(self, list seqs, list tokens, float[:, ::1] logits):
        """Evaluates sequence i (None: the context's own) on tokens[i] (int32 arrays, at
        least one token each); row i of logits [len(seqs), vocab] gets its last token's
        logits. A bad input raises before any sequence changes."""
        self._live()
        cdef Py_ssize_t n = len(seqs), i
        if len(tokens) != n:
            raise ValueError(f"{len(tokens)} token arrays for {n} sequences")
        if logits.shape[0] != n or logits.shape[1] != self.vocab_size:
            raise ValueError(f"logits must be [{n}, {self.vocab_size}], got "
                             f"[{logits.shape[0]}, {logits.shape[1]}]")
        if n == 0:
            return
        cdef Sequence sq
        cdef const int32_t[::1] row
        cdef wp_seq **cs = <wp_seq **>malloc(n * sizeof(wp_seq *))
        cdef const int32_t **ct = <const int32_t **>malloc(n * sizeof(int32_t *))
        cdef uint32_t *cn = <uint32_t *>malloc(n * sizeof(uint32_t))
        cdef wp_status st
        try:
            if cs == NULL or ct == NULL or cn == NULL:
                raise MemoryError("eval_batch tables")
            for i in range(n):
                if seqs[i] is None:
                    cs[i] = NULL
                else:
                    sq = <Sequence?>seqs[i]
                    if sq.owner is not self:
                        raise ValueError(f"sequence {i} belongs to another context")
                    sq._live()
                    cs[i] = sq.seq
                row = tokens[i]
                cn[i] = <uint32_t>row.shape[0]
                ct[i] = &row[0] if row.shape[0] > 0 else NULL
            with nogil:
                st = wp_eval_batch(self.ctx, cs, ct, cn, <uint32_t>n, &logits[0, 0],
                                   <size_t>(n * logits.shape[1]))
            _check(st, self.ctx)
        finally:
            free(cs)
            free(<void *>ct)
            free(cn)

    def hotlist_save(self, str path):
        self._live()
        cdef bytes b = path.encode()
        _check(wp_hotlist_save(self.ctx, b), self.ctx)

    def info(self):
        self._live()
        cdef wp_info i
        _check(wp_get_info(self.ctx, &i), self.ctx)
        return {
            "model_type": i.model_type.decode(), "isa": i.isa.decode(),
            "x8_isa": i.x8_isa.decode(), "x8_max_tokens": i.x8_max_tokens,
            "x8_dtypes": i.x8_dtypes.decode(),
            "vocab_size": i.vocab_size, "hidden_size": i.hidden_size,
            "n_layers": i.n_layers, "n_heads": i.n_heads, "n_kv_heads": i.n_kv_heads,
            "head_dim": i.head_dim, "n_experts": i.n_experts, "top_k": i.top_k,
            "n_moe_layers": i.n_moe_layers, "ctx_tokens": i.ctx_tokens,
            "max_position_embeddings": i.max_position_embeddings,
            "n_threads": i.n_threads, "total_params": i.total_params,
            "active_params": i.active_params, "plan": _plan_dict(&i.plan),
        }

    def stats(self):
        self._live()
        cdef wp_stats s
        _check(wp_get_stats(self.ctx, &s), self.ctx)
        return {
            "tokens": s.tokens, "expert_lookups": s.expert_lookups,
            "expert_hits": s.expert_hits, "expert_misses": s.expert_misses,
            "prefetch_issued": s.prefetch_issued, "prefetch_hits": s.prefetch_hits,
            "prefetch_cancelled": s.prefetch_cancelled,
            "bytes_read": s.bytes_read, "other_bytes_read": s.other_bytes_read,
            "read_seconds": s.read_seconds, "eval_seconds": s.eval_seconds,
            "peak_bytes": s.peak_bytes, "cache_bytes": s.cache_bytes,
            "cache_slots": s.cache_slots, "direct_io": bool(s.direct_io),
        }

    def stats_reset(self):
        self._live()
        wp_stats_reset(self.ctx)


cdef class Sequence:
    """One of a Context's sequences (Context.seq_open): its own state and position, the
    model shared. close() gives it back (idempotent); the Context's close frees all."""

    cdef Context owner
    cdef wp_seq *seq

    def __cinit__(self):
        self.seq = NULL

    def __dealloc__(self):
        if self.seq != NULL and self.owner is not None and self.owner.ctx != NULL:
            wp_seq_close(self.seq)
        self.seq = NULL

    cdef inline int _live(self) except -1:
        if self.seq == NULL:
            raise ValueError("the sequence is closed")
        if self.owner.ctx == NULL:
            raise ValueError("the engine is closed")
        return 0

    @property
    def closed(self):
        """Whether close (or the Context's close) gave the sequence back."""
        return self.seq == NULL or self.owner.ctx == NULL

    def close(self):
        if self.seq != NULL and self.owner.ctx != NULL:
            wp_seq_close(self.seq)
        self.seq = NULL

    @property
    def position(self):
        self._live()
        return wp_seq_position(self.seq)

    def push_embeds(self, const float[:, ::1] rows):
        """Queues rows [n, hidden_size] for this sequence's next placeholder tokens."""
        self._live()
        cdef uint32_t n = <uint32_t>rows.shape[0]
        cdef uint32_t w = <uint32_t>rows.shape[1]
        cdef const float *p = &rows[0, 0] if n > 0 and w > 0 else NULL
        _check(wp_seq_push_embeds(self.seq, p, n, w), self.owner.ctx)

    @property
    def pending_embeds(self):
        """Rows queued and not yet taken."""
        self._live()
        return wp_seq_pending_embeds(self.seq)

    def reset(self):
        self._live()
        _check(wp_seq_reset(self.seq), self.owner.ctx)

    def truncate(self, uint32_t pos):
        self._live()
        _check(wp_seq_truncate(self.seq, pos), self.owner.ctx)

    def copy_from(self, Sequence other not None):
        """This sequence's state and position become other's (same Context)."""
        self._live()
        other._live()
        if other.owner is not self.owner:
            raise ValueError("the sequences belong to different contexts")
        cdef wp_status st
        with nogil:
            st = wp_seq_copy(self.seq, other.seq)
        _check(st, self.owner.ctx)

    def save_state(self, str path):
        self._live()
        _path_call(NULL, self.owner.ctx, wp_seq_save, self.seq, path)

    def load_state(self, str path):
        self._live()
        _path_call(NULL, self.owner.ctx, wp_seq_load, self.seq, path)
