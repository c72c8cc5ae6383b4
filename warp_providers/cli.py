"""The `warp` command line: a client of the public Python API with no private access.

Owns: argument parsing, progress (`progress.Progress`: a bar on a terminal, a few lines
in a log), and turning every user error into one line on stderr and a non-zero exit code
(never a traceback), usage mistakes included. Data goes
to stdout, as JSON with --json; progress goes to stderr. Commands: convert, plan, info, run,
chat, eval, tokenize, bench, demo, and those installed distributions add through the
`warp_providers.cli` entry points (`serve` and `batch`, from warp-openai).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from warp_providers.engine import Engine, parse_size, plan_memory
from warp_providers.errors import WarpError
from warp_providers.progress import Progress
from warp_providers.sampling import SamplingParams

EXIT_USAGE = 2


class _UserError(Exception):
    """A mistake of the caller, reported as one line."""


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage mistake reported as one line (not the whole usage text)."""

    def error(self, message: str) -> Any:  # argparse's hook; never returns
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(EXIT_USAGE)


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def _out(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _say(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget", help="RAM ceiling, e.g. 6G (default: the engine chooses)")
    p.add_argument("--threads", type=int, help="compute threads (default: physical cores)")
    p.add_argument("--ctx", type=int, help="context length in tokens")
    p.add_argument("--cache-policy", choices=["lfru", "lru"], help="expert cache eviction")
    p.add_argument("--no-lookahead", action="store_true", help="disable expert prefetch")
    p.add_argument("--verify", action="store_true", help="check expert record checksums")
    p.add_argument("--exact", action=argparse.BooleanOptionalAction, default=None,
                   help="--exact: float32 activations in every matmul; --no-exact: 8-bit "
                        "activations against quantized weights in every matmul; default "
                        "(auto): 8-bit for one-token steps (decode) on the weight types whose "
                        "8-bit kernels are faster on this CPU, float32 for prefill and "
                        "elsewhere")
    p.add_argument("--experts-per-token", type=int, metavar="N",
                   help="routed experts per token, 1..the model's top-k (default: as "
                        "shipped): fewer expert reads per token, at some loss of fidelity")


def _open(a: argparse.Namespace, *, vision: bool = False) -> Engine:
    opts: dict[str, Any] = {}
    if vision:
        opts["vision"] = True
    if a.cache_policy:
        opts["cache_policy"] = a.cache_policy
    if a.no_lookahead:
        opts["lookahead"] = False
    if a.verify:
        opts["verify"] = True
    if a.exact is not None:
        opts["exact"] = a.exact
    if a.experts_per_token is not None:
        opts["experts_per_token"] = a.experts_per_token
    return Engine.open(a.model, budget=a.budget, threads=a.threads, ctx=a.ctx, **opts)


def _token_bar(a: argparse.Namespace, total: int, desc: str, *, beside_text: bool = False) -> Any:
    """Return a tokens bar on stderr, drawn only when stderr is a terminal and not --json.

    `beside_text`: the command streams text to stdout, which is progress enough when
    stdout is that terminal too, so the bar is drawn only when stdout goes elsewhere.
    """
    from tqdm import tqdm

    show = sys.stderr.isatty() and not getattr(a, "json", False)
    if beside_text and sys.stdout.isatty():
        show = False
    return tqdm(total=total, unit="tok", desc=desc, disable=not show, leave=False)


def _sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--max-tokens", type=int, default=128, help="tokens to generate")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", default=[],
                   help="string that ends the reply, not printed (repeatable)")


def _sampling(a: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        temperature=a.temperature, top_p=a.top_p, top_k=a.top_k, min_p=a.min_p, seed=a.seed
    )


def _stats_line(stats: dict[str, Any]) -> str:
    return (
        f"[{stats.get('decode_tok_s', 0):.2f} tok/s decode, "
        f"{stats.get('prefill_tok_s', 0):.1f} tok/s prefill, "
        f"experts hit {100 * stats.get('hit_rate', 0):.1f}% "
        f"({stats.get('expert_hits', 0)}/{stats.get('expert_lookups', 0)}), "
        f"read {stats.get('bytes_read', 0) / 1e6:.1f} MB, "
        f"direct I/O {'on' if stats.get('direct_io') else 'off'}]"
    )


# -- commands -------------------------------------------------------------------------
def cmd_convert(a: argparse.Namespace) -> int:
    from warp_providers.convert import convert

    if not Path(a.src).exists():
        raise _UserError(f"source not found: {a.src}")
    progress = None if a.json else Progress.hook("convert")
    t0 = time.perf_counter()
    try:
        out = convert(
            a.src, a.out, experts=a.experts, trunk=a.trunk, resume=a.resume, progress=progress
        )
    finally:
        if progress is not None:
            progress.close()
    size = sum(f.stat().st_size for f in Path(out).iterdir())
    if a.json:
        _out({"out": str(out), "bytes": size, "seconds": time.perf_counter() - t0})
    else:
        _say(f"wrote {out} ({_gib(size)}) in {time.perf_counter() - t0:.1f} s\n")
    return 0


def cmd_plan(a: argparse.Namespace) -> int:
    plan = plan_memory(a.model, budget=a.budget, ctx=a.ctx, max_sequences=a.sequences,
                       vision=a.vision, experts_per_token=a.experts_per_token)
    if a.json:
        _out(plan)
        return 0
    for key in ("trunk_bytes", "kv_bytes", "scratch_bytes", "min_cache_bytes", "floor_bytes",
                "working_set_bytes", "recommended_bytes", "experts_total_bytes",
                "usable_ram_bytes", "budget_bytes", "cache_bytes"):
        _say(f"{key[:-6]:<20} {_gib(plan[key]):>12}\n")
        if key == "kv_bytes":  # the context state, by kind of layer state
            for kind, n in plan["state_bytes"].items():
                _say(f"  {kind:<18} {_gib(n):>12}\n")
    _say(f"{'sequences':<20} {plan['sequences']:>12}\n{'sequence':<20} "
         f"{_gib(plan['sequence_bytes']):>12}\n")
    if plan["vision_weight_bytes"]:  # the image tower: counted in the floor with --vision
        _say(f"{'vision':<20} {_gib(plan['vision_bytes']):>12}"
             f"{'' if a.vision else '  (not planned: --vision)'}\n"
             f"  {'weights':<18} {_gib(plan['vision_weight_bytes']):>12}\n"
             f"  {'reserve':<18} {_gib(plan['vision_reserve_bytes']):>12}\n")
    _say(f"{'ctx_tokens':<20} {plan['ctx_tokens']:>12}\n{'cache_slots':<20} "
         f"{plan['cache_slots']:>12}\n")
    k = plan["budget_multiple"]
    if k < 0:
        how = "as given"
    elif k == 0:
        how = "the floor alone: not one working set more fits in 3/4 of usable RAM"
    else:
        how = f"floor + {k} working set{'s' if k > 1 else ''}"
    _say(f"{'budget is':<20} {how}\n")
    return 0


def cmd_info(a: argparse.Namespace) -> int:
    with _open(a) as eng:
        info = eng.info()
    if a.json:
        _out(info)
    else:
        for k, v in info.items():
            if k != "plan":
                _say(f"{k:<24} {v}\n")
    return 0


def _image_part(path: str) -> dict[str, Any]:
    """An image file as an `image_url` part (a data URL: the core reads no paths itself)."""
    import base64
    import mimetypes

    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise _UserError(f"cannot read image {path}: {exc.strerror or exc}") from None
    mime = mimetypes.guess_type(path)[0] or "application/octet-stream"
    url = f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
    return {"type": "image_url", "image_url": {"url": url}}


def _user_turn(text: str, images: list[str]) -> dict[str, Any]:
    if not images:
        return {"role": "user", "content": text}
    parts = [{"type": "text", "text": text}] if text else []
    return {"role": "user", "content": [*parts, *(_image_part(p) for p in images)]}


def cmd_run(a: argparse.Namespace) -> int:
    images = list(a.image or [])
    with _open(a, vision=bool(images)) as eng:
        kw: dict[str, Any] = {}
        if a.chat or images:
            from warp_providers.session import ChatSession

            session = ChatSession(eng)
            prep = session.prepare([_user_turn(a.prompt, images)],
                                   max_tokens=a.max_tokens, constrain_output=False)
            ids, stop_ids = prep.ids, session.stop_ids
            if prep.images:
                kw["images"] = prep.images
        else:
            ids = eng.tokenizer.encode_content(a.prompt)
            stop_ids = None
        stream = eng.stream(ids, max_tokens=a.max_tokens, sampling=_sampling(a), stop=a.stop,
                            stop_ids=stop_ids, **kw)
        with _token_bar(a, a.max_tokens, "run", beside_text=True) as bar:
            for ev in stream:
                bar.update(1)
                if not a.json:
                    _say(ev.text)
        res = eng.last_result
        assert res is not None
        if a.json:
            _out({"text": res.text, "prompt_ids": ids, "token_ids": res.token_ids,
                  "finish_reason": res.finish_reason, "stats": res.stats})
        else:
            _say("\n")
            sys.stderr.write(_stats_line(res.stats) + "\n")
    return 0


def cmd_eval(a: argparse.Namespace) -> int:
    try:
        ids = [int(t) for t in a.ids.split(",") if t.strip()]
    except ValueError:
        raise _UserError(f"--ids must be comma-separated integers, got {a.ids!r}") from None
    if not ids:
        raise _UserError("--ids is empty")
    with _open(a) as eng:
        logits = eng.eval(ids)
        order = logits.argsort()[::-1][: a.top]
        top = [{"id": int(i), "logit": float(logits[i]),
                "piece": eng.tokenizer.decode([int(i)])} for i in order]
    if a.json:
        _out({"ids": ids, "top": top})
    else:
        for t in top:
            _say(f"{t['id']:>8} {t['logit']:>10.4f} {t['piece']!r}\n")
    return 0


def cmd_tokenize(a: argparse.Namespace) -> int:
    from warp_providers.tokenizer import Tokenizer

    plan_memory(a.model)  # refuses what no other command would open (format, model_type)
    tok = Tokenizer.from_dir(a.model)
    ids = tok.encode_markup(a.text) if a.markup else tok.encode_content(a.text)
    if a.json:
        _out({"ids": ids, "pieces": [tok.decode([i]) for i in ids]})
    else:
        _say(" ".join(map(str, ids)) + "\n")
    return 0


_REPL_HELP = "commands: /image FILE /reset /save [FILE] /load [FILE] /stats /exit"


def _load_history(path: Path) -> list[dict[str, Any]]:
    history = json.loads(path.read_text())
    if not isinstance(history, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) for m in history
    ):
        raise _UserError(f"{path} is not a saved chat (a JSON list of messages)")
    return history


def cmd_chat(a: argparse.Namespace) -> int:
    from warp_providers.session import ChatSession

    with _open(a, vision=a.vision) as eng:
        session = ChatSession(eng)
        system = [{"role": "system", "content": a.system}] if a.system else []
        history: list[dict[str, Any]] = list(system)
        images: list[str] = []  # attached by /image to the next user turn
        while True:
            try:
                line = input("> ")
            except EOFError:
                _say("\n")
                return 0
            cmd, _, arg = line.strip().partition(" ")
            try:  # a failed line is reported in one line; the REPL goes on
                if cmd == "/exit":
                    return 0
                if cmd == "/image":
                    if not arg:
                        raise _UserError("/image needs a file name")
                    if not session.vision:
                        raise _UserError("this model was opened without a vision tower "
                                         "(start warp chat with --vision)")
                    _image_part(arg)  # unreadable files are reported now, not with the turn
                    images.append(arg)
                elif cmd == "/reset":
                    history = list(system)
                    images = []
                    eng.reset()
                elif cmd == "/stats":
                    _out(eng.stats())
                elif cmd == "/save":
                    Path(arg or "chat.json").write_text(json.dumps(history, indent=2))
                elif cmd == "/load":
                    history = _load_history(Path(arg or "chat.json"))
                elif cmd.startswith("/"):
                    raise _UserError(f"unknown command {cmd} ({_REPL_HELP})")
                else:
                    turn = [*history, _user_turn(line, images)]
                    images = []
                    reply = session.reply(turn, max_tokens=a.max_tokens,
                                          sampling=_sampling(a), stop=a.stop, on_text=_say)
                    _say("\n")
                    sys.stderr.write(_stats_line(reply.stats) + "\n")
                    history = [*turn, {"role": "assistant", "content": reply.text}]
            except (WarpError, _UserError, ValueError, TypeError, OSError) as e:
                sys.stderr.write(f"warp chat: error: {_first_line(e)}\n")


def cmd_bench(a: argparse.Namespace) -> int:
    with _open(a) as eng:
        prompt = list(range(1, a.prompt_tokens + 1))
        eng.reset()
        with _token_bar(a, a.prompt_tokens + a.gen_tokens, "bench") as bar:
            t0 = time.perf_counter()
            eng.eval(prompt)
            prefill = a.prompt_tokens / (time.perf_counter() - t0)
            bar.update(a.prompt_tokens)
            for _ in eng.stream(prompt + [1], max_tokens=a.gen_tokens, stop_ids=[]):
                bar.update(1)
        res = eng.last_result
        assert res is not None
        row = {"prefill_tok_s": prefill, "decode_tok_s": res.stats["decode_tok_s"],
               "hit_rate": res.stats["hit_rate"], "bytes_read": res.stats["bytes_read"],
               "threads": eng.info()["n_threads"], "isa": eng.info()["isa"],
               "precision": eng.info().get("precision")}
    if a.json:
        _out(row)
    else:
        _say(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                      for k, v in row.items()) + "\n")
    return 0


# Commands that installed distributions add through the `warp_providers.cli` entry-point
# group (name -> an object with `help`, `add_arguments(parser)` and `run(args) -> int`),
# and the distribution that brings each known one.
PLUGIN_GROUP = "warp_providers.cli"
KNOWN_PLUGINS = {
    "serve": ("warp-openai", "OpenAI-compatible HTTP server over the same core"),
    "batch": ("warp-openai", "run an OpenAI batch input file through a model, resumably"),
}


def _plugins() -> dict[str, Any]:
    from importlib.metadata import entry_points

    found: dict[str, Any] = {}
    for ep in entry_points(group=PLUGIN_GROUP):
        if ep.name not in found:
            found[ep.name] = ep
    return found


def _missing_plugin(name: str, dist: str) -> Any:
    def run(a: argparse.Namespace) -> int:
        raise _UserError(f"warp {name} comes with the {dist} package: pip install {dist}")

    return run


def cmd_demo(a: argparse.Namespace) -> int:
    from warp_providers import demo

    progress = Progress.hook("convert")
    try:
        return demo.main(moe=a.moe, max_tokens=a.max_tokens, out=_say, progress=progress,
                         moe_size=parse_size(a.moe_size))
    finally:
        progress.close()


# -- parser ---------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of `warp`."""
    ap = _Parser(
        prog="warp", description="Run mixture-of-experts models with experts streamed "
        "from disk under a RAM budget.")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("convert", help="convert an HF checkpoint dir or a .gguf file")
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--experts", default=None,
                   choices=["q4_0", "q8_0", "mxfp4", "f16", "bf16", "f32"],
                   help="routed experts' dtype (default: mxfp4 experts as shipped, else q4_0)")
    p.add_argument("--trunk", default="q8_0", choices=["q4_0", "q8_0", "f16", "bf16", "f32"])
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted conversion from its last intact tensor")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_convert)

    p = sub.add_parser("plan", help="memory plan of a container (nothing is loaded)")
    p.add_argument("model")
    p.add_argument("--budget")
    p.add_argument("--ctx", type=int)
    p.add_argument("--sequences", type=int, default=1,
                   help="concurrent sequences to plan for (each state counted in the floor)")
    p.add_argument("--vision", action="store_true",
                   help="plan the image tower too (its weights and one image's work)")
    p.add_argument("--experts-per-token", type=int, metavar="N",
                   help="plan for N routed experts per token (default: the model's top-k)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_plan)

    p = sub.add_parser("info", help="model facts and the resolved plan")
    p.add_argument("model")
    _engine_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_info)

    p = sub.add_parser("run", help="generate from a prompt, then print a stats line")
    p.add_argument("model")
    p.add_argument("prompt")
    p.add_argument("--chat", action="store_true", help="wrap the prompt as a user turn")
    p.add_argument("--image", action="append", metavar="FILE",
                   help="an image for the user turn (repeatable; implies --chat and loads "
                        "the model's vision tower)")
    _engine_args(p)
    _sampling_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("chat",
                       help="interactive chat (/image /reset /save /load /stats /exit)")
    p.add_argument("model")
    p.add_argument("--system")
    p.add_argument("--vision", action="store_true",
                   help="load the model's vision tower, so /image FILE attaches an image")
    _engine_args(p)
    _sampling_args(p)
    p.set_defaults(fn=cmd_chat)

    p = sub.add_parser("eval", help="top logits of the last position")
    p.add_argument("model")
    p.add_argument("--ids", required=True, help="comma-separated token ids")
    p.add_argument("--top", type=int, default=10)
    _engine_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_eval)

    p = sub.add_parser("tokenize", help="text to token ids")
    p.add_argument("model")
    p.add_argument("text")
    p.add_argument("--markup", action="store_true", help="recognise control tokens")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_tokenize)

    p = sub.add_parser("bench", help="prefill and decode tok/s")
    p.add_argument("model")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--gen-tokens", type=int, default=32)
    _engine_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_bench)

    plugins = _plugins()
    for name in sorted(set(plugins) | set(KNOWN_PLUGINS)):
        if name in plugins:
            command = plugins[name].load()
            p = sub.add_parser(name, help=str(getattr(command, "help", "")))
            command.add_arguments(p)
            p.set_defaults(fn=command.run)
        else:
            dist, what = KNOWN_PLUGINS[name]
            p = sub.add_parser(name, help=f"{what} (needs {dist})")
            p.add_argument("args", nargs=argparse.REMAINDER)
            p.set_defaults(fn=_missing_plugin(name, dist))

    p = sub.add_parser("demo", help="run the embedded default model (no download)")
    p.add_argument("--moe", action="store_true",
                   help="also stream a generated multi-GB MoE under a small budget")
    p.add_argument("--moe-size", default="3G",
                   help="float16 size of the generated MoE's experts (default 3G; the "
                   "q8_0 container holds about half)")
    p.add_argument("-n", "--max-tokens", type=int, default=48)
    p.set_defaults(fn=cmd_demo)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `warp`; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "budget", None) is not None:
            parse_size(args.budget)
        return int(args.fn(args))
    except (WarpError, _UserError, ValueError, TypeError, OSError) as e:
        sys.stderr.write(f"warp {args.command}: error: {_first_line(e)}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
