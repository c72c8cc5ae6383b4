# cython: language_level=3
"""The binding of the C engine (engine/include/wp.h) and nothing else.

Marshals arguments, releases the GIL around compute, and turns every status into an
exception through one function, _check. Argument policy lives in warp_providers.engine.
"""

from libc.stdint cimport int32_t, uint32_t, uint64_t
from libc.string cimport memset

from warp_providers._engine cimport *

from warp_providers import errors as _errors

DEF ERR_CAP = 1024

_CFG_INT_FIELDS = (
    "ctx_tokens", "n_threads", "reader_threads", "prefill_chunk", "cache_policy",
    "direct_io", "verify", "lookahead", "isa",
)


cdef object _raise(wp_status status, str detail):
    name = wp_strerror(status).decode("utf-8", "replace")
    raise _errors.from_status(int(status), name, detail)


cdef inline int _check(wp_status status, wp_ctx *ctx) except -1:
    if status != WP_OK:
        detail = wp_error_detail(ctx).decode("utf-8", "replace") if ctx != NULL else ""
        _raise(status, detail)
    return 0


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


cdef class Context:
    """One open container: wp_open in __cinit__, wp_close in __dealloc__."""

    cdef wp_ctx *ctx
    cdef readonly uint32_t vocab_size

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
        cdef bytes b = path.encode()
        cdef const char *p = b
        cdef wp_status st
        with nogil:
            st = wp_state_save(self.ctx, p)
        _check(st, self.ctx)

    def load_state(self, str path):
        self._live()
        cdef bytes b = path.encode()
        cdef const char *p = b
        cdef wp_status st
        with nogil:
            st = wp_state_load(self.ctx, p)
        _check(st, self.ctx)

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
            "bytes_read": s.bytes_read, "other_bytes_read": s.other_bytes_read,
            "read_seconds": s.read_seconds, "eval_seconds": s.eval_seconds,
            "peak_bytes": s.peak_bytes, "cache_bytes": s.cache_bytes,
            "cache_slots": s.cache_slots, "direct_io": bool(s.direct_io),
        }

    def stats_reset(self):
        self._live()
        wp_stats_reset(self.ctx)
