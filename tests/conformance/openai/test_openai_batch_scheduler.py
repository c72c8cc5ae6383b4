"""A batch job on the real engine runs on the batched scheduler beside interactive requests.

Its lines are in flight together (by default as many as the engine has sequences), so the
scheduler evaluates them in batched steps; an interactive request sent while the batch
runs is answered before the batch ends (it waits only for the next free sequence); and
every output line equals that request answered alone (greedy).
"""

from __future__ import annotations

import io
import json
import threading
import time

import httpx
import openai

LINES = 16


def _client(api) -> openai.OpenAI:
    from warp_openai import WarpTransport

    http = httpx.Client(transport=WarpTransport(api), base_url="http://warp.invalid")
    return openai.OpenAI(api_key="x", base_url="http://warp.invalid/v1", http_client=http,
                         max_retries=0)


def _body(i: int) -> dict:
    return {"model": "m", "max_tokens": 20 + i % 3,
            "messages": [{"role": "user", "content": f"Line {i}: tell me about {i * 13}."}]}


def test_batch_lines_are_batched_and_interactive_requests_are_not_starved(moe_path, tmp_path):
    from warp_openai import WarpAPI

    from warp_providers import Engine

    with Engine.open(moe_path, max_sequences=4) as eng:
        api = WarpAPI(engine=eng, jobs_dir=tmp_path / "jobs")
        assert api.batches.concurrency == 4  # the default: the engine's sequences
        client = _client(api)
        alone = [client.chat.completions.create(**_body(i)).choices[0].message.content
                 for i in range(LINES)]
        probe = {"model": "m", "max_tokens": 8,
                 "messages": [{"role": "user", "content": "An interactive question."}]}
        probe_alone = client.chat.completions.create(**probe).choices[0].message.content

        data = "".join(json.dumps({"custom_id": f"r{i}", "method": "POST",
                                   "url": "/v1/chat/completions", "body": _body(i)}) + "\n"
                       for i in range(LINES))
        f = client.files.create(file=("in.jsonl", io.BytesIO(data.encode())), purpose="batch")
        before = eng.batching()
        batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        # an interactive request once the batch is running
        deadline = time.monotonic() + 60
        while client.batches.retrieve(batch.id).request_counts.completed < 1:
            assert time.monotonic() < deadline, "the batch did not start"
            time.sleep(0.01)
        answered: dict = {}
        t = threading.Thread(target=lambda: answered.update(
            r=client.chat.completions.create(**probe), at=client.batches.retrieve(batch.id)))
        t.start()
        t.join(120)
        while (b := client.batches.retrieve(batch.id)).status not in ("completed", "failed"):
            assert time.monotonic() < deadline + 120, b.status
            time.sleep(0.02)
        after = eng.batching()
        out = [json.loads(x) for x in client.files.content(b.output_file_id).text.splitlines()]
        api.close()
        client.close()

    assert b.status == "completed" and b.request_counts.completed == LINES
    by_id = {r["custom_id"]: r["response"]["body"]["choices"][0]["message"]["content"]
             for r in out}
    assert [by_id[f"r{i}"] for i in range(LINES)] == alone
    assert answered["r"].choices[0].message.content == probe_alone
    assert answered["at"].request_counts.completed < LINES, "the interactive request waited " \
        "for the whole batch"
    steps = after["steps"] - before["steps"]
    assert (after["sequences"] - before["sequences"]) / steps > 1.5, (before, after)
    assert after["widest"] >= 3
