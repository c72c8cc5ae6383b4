"""The `warp` command line on a tiny model: every command, and each one's error path."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tiny import tiny_moe

COMMANDS = ["convert", "plan", "info", "run", "chat", "eval", "tokenize", "bench", "demo",
            "serve"]


def warp(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "warp_providers.cli", *args],
                          capture_output=True, text=True, input=input, timeout=600)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return tiny_moe(tmp_path_factory.mktemp("cli"))


def _one_line_error(p: subprocess.CompletedProcess[str]) -> None:
    assert p.returncode != 0
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "error" in lines[0], p.stderr


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
    info = json.loads(warp("info", str(model), "--json").stdout)
    assert info["model_type"] == "qwen3_moe"
    ev = json.loads(warp("eval", str(model), "--ids", "10,11,12", "--json").stdout)
    assert len(ev["top"]) == 10
    assert ev["top"][0]["logit"] >= ev["top"][-1]["logit"]
    tok = json.loads(warp("tokenize", str(model), "hi <|im_end|>", "--json").stdout)
    mark = json.loads(warp("tokenize", str(model), "<|im_end|>", "--markup", "--json").stdout)
    assert len(mark["ids"]) == 1 and mark["ids"][0] not in tok["ids"]


def test_run_json_and_text(model):
    p = warp("run", str(model), "hello", "-n", "8", "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert len(r["token_ids"]) <= 8 and r["prompt_ids"]
    assert {"expert_hits", "expert_misses", "bytes_read", "decode_tok_s"} <= set(r["stats"])
    p = warp("run", str(model), "hello", "-n", "4")
    assert p.returncode == 0 and "tok/s" in p.stderr


def test_chat_repl(model, tmp_path):
    save = tmp_path / "c.json"
    p = warp("chat", str(model), "-n", "4", input=f"hi\n/stats\n/save {save}\n/reset\n/exit\n")
    assert p.returncode == 0, p.stderr
    assert json.loads(save.read_text())[0]["content"] == "hi"


def test_bench_json(model):
    r = json.loads(warp("bench", str(model), "--prompt-tokens", "8", "--gen-tokens", "4",
                        "--json").stdout)
    assert r["decode_tok_s"] > 0 and r["prefill_tok_s"] > 0


def test_convert_cli(model, tmp_path):
    from warp_providers.synth import make_moe_checkpoint

    from tiny import TINY

    src = make_moe_checkpoint(tmp_path / "hf", TINY)
    p = warp("convert", str(src), str(tmp_path / "o.warp"), "--json")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "o.warp" / "manifest.json").is_file()
    assert "%|" not in p.stderr and json.loads(p.stdout)["bytes"] > 0  # --json: no bar
    p = warp("convert", str(src), str(tmp_path / "bar.warp"))
    assert p.returncode == 0, p.stderr
    # a tqdm bar on stderr, labelled, that reaches the end
    assert re.search(r"convert: +100%\|", p.stderr), p.stderr[-500:]
    assert "wrote " in p.stdout and "%|" not in p.stdout
    _one_line_error(warp("convert", str(tmp_path / "missing"), str(tmp_path / "x.warp")))


@pytest.mark.parametrize("cmd", ["plan", "info", "run", "eval", "tokenize", "bench", "chat"])
def test_missing_model_is_one_line(cmd, tmp_path):
    extra = {"run": ["hi"], "eval": ["--ids", "1"], "tokenize": ["hi"]}.get(cmd, [])
    _one_line_error(warp(cmd, str(tmp_path / "none.warp"), *extra))


def test_bad_budget_and_unsupported_model(model, tmp_path):
    _one_line_error(warp("run", str(model), "hi", "--budget", "lots"))
    _one_line_error(warp("info", str(model), "--budget", "1K"))
    bad = tmp_path / "bad.warp"
    shutil.copytree(model, bad)
    m = json.loads((bad / "manifest.json").read_text())
    m["model_type"] = "bloom"
    (bad / "manifest.json").write_text(json.dumps(m))
    _one_line_error(warp("info", str(bad)))
