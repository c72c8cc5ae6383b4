"""The Files and Batch APIs through the real `openai` client: in-process (sync and async)
and over `warp serve`, on the scripted engine.

Each request line asks about a number and the scripted engine answers with that number, so
an output line that belongs to another request, a line answered twice or one lost fails
here. Also: cancel, expiry, list pagination as the SDK pages it, every kind of bad input
(an error-file line or a 400 in OpenAI's shape, the rest of the job still completes), and
a batch left unfinished in the jobs directory resuming when the next API starts.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from conftest import HTTP
from fake_engine import ScriptedEngine
from openai.types import Batch, FileObject
from openai.types.chat import ChatCompletion

TERMINAL = ("completed", "failed", "expired", "cancelled")


def _answer(engine: ScriptedEngine) -> Any:
    def reply(ids: list[int]) -> str:
        asks = re.findall(r"ask (\d+)", engine.tokenizer.decode(ids))
        return f"answer {asks[-1]}" if asks else "no question"

    return reply


class NumberEngine(ScriptedEngine):
    """Answers "ask N" with "answer N"; each token takes `token_s` seconds."""

    def __init__(self, token_s: float = 0.0) -> None:
        super().__init__()
        self._replies = _answer(self)
        self.token_s = token_s

    def stream(self, prompt: Any, **kw: Any) -> Any:
        for ev in super().stream(prompt, **kw):
            yield ev
            time.sleep(self.token_s)


def line(i: int, url: str = "/v1/chat/completions", **body: Any) -> str:
    if url == "/v1/completions":
        req: dict[str, Any] = {"prompt": f"ask {i}", "max_tokens": 16}
    else:
        req = {"messages": [{"role": "user", "content": f"ask {i}"}], "max_tokens": 16}
    return json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": url,
                       "body": {**req, **body}})


def jsonl(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode()


def wait_done(client: Any, batch_id: str, timeout: float = 60) -> Batch:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        b = client.batches.retrieve(batch_id)
        if b.status in TERMINAL:
            return b
        time.sleep(0.05)
    raise AssertionError(f"batch {batch_id} did not finish: {b.status}")


def records(client: Any, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    text = client.files.content(file_id).text
    return [json.loads(x) for x in text.splitlines()]


def assert_answers(outputs: list[dict[str, Any]], numbers: list[int]) -> None:
    """Each asked number answered once, by its own request, in input order."""
    assert [o["custom_id"] for o in outputs] == [f"req-{i}" for i in numbers]
    for o, i in zip(outputs, numbers):
        assert o["error"] is None and o["id"].startswith("batch_req_")
        r = o["response"]
        assert r["status_code"] == 200 and r["request_id"].startswith("req_")
        body = r["body"]
        if body["object"] == "chat.completion":
            assert ChatCompletion.model_validate(body).choices[0].message.content == \
                f"answer {i}"
        else:
            assert body["choices"][0]["text"] == f"answer {i}"


@pytest.fixture
def api_factory(tmp_path: Path):
    from warp_openai import WarpAPI

    apis: list[Any] = []

    def make(engine: Any = None, **kw: Any) -> Any:
        api = WarpAPI(engine=engine or NumberEngine(), jobs_dir=kw.pop("jobs_dir", tmp_path),
                      **kw)
        apis.append(api)
        return api

    yield make
    for a in apis:
        a.close()


@pytest.fixture
def open_client(api_factory):
    """open_client(via, **api_options) -> an `openai.OpenAI` over the transport or HTTP."""
    from warp_openai import WarpTransport
    from warp_openai.server import make_server

    closers: list[Any] = []

    def make(via: str = "inproc", engine: Any = None, **kw: Any) -> Any:
        api = api_factory(engine, **kw)
        if via == "inproc":
            import httpx

            http = httpx.Client(transport=WarpTransport(api), base_url="http://warp.invalid")
            client = openai.OpenAI(api_key="x", base_url="http://warp.invalid/v1",
                                   http_client=http, max_retries=0)
        else:
            httpd = make_server(api, "127.0.0.1", 0)
            threading.Thread(target=httpd.serve_forever, daemon=True).start()
            url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
            client = openai.OpenAI(api_key="x", base_url=url, max_retries=0)
            closers.append(lambda: (httpd.shutdown(), httpd.server_close()))
        closers.append(client.close)
        return client

    yield make
    for c in reversed(closers):
        c()


VIAS = ["inproc", HTTP]


# --------------------------------------------------------------------------- files
@pytest.mark.parametrize("via", VIAS)
def test_files_create_retrieve_content_list_delete(open_client, via):
    client = open_client(via)
    data = jsonl([line(i) for i in range(3)])
    f = client.files.create(file=("in.jsonl", data), purpose="batch")
    assert isinstance(f, FileObject)
    assert f.id.startswith("file-") and f.bytes == len(data) and f.filename == "in.jsonl"
    assert f.purpose == "batch" and f.status == "processed" and f.expires_at > f.created_at
    assert client.files.retrieve(f.id) == f
    assert client.files.content(f.id).content == data
    other = client.files.create(file=("notes.txt", b"hello"), purpose="user_data")
    assert [x.id for x in client.files.list()] == [other.id, f.id]  # newest first
    assert [x.id for x in client.files.list(purpose="batch")] == [f.id]
    assert [x.id for x in client.files.list(order="asc")] == [f.id, other.id]
    deleted = client.files.delete(f.id)
    assert deleted.id == f.id and deleted.deleted is True
    for call in (client.files.retrieve, client.files.content, client.files.delete):
        with pytest.raises(openai.NotFoundError) as e:
            call(f.id)
        assert f.id in e.value.message
    assert [x.id for x in client.files.list()] == [other.id]


@pytest.mark.parametrize("via", VIAS)
def test_list_pagination_pages_as_the_sdk_asks(open_client, via):
    client = open_client(via)
    files = [client.files.create(file=(f"{i}.jsonl", jsonl([line(i)])), purpose="batch")
             for i in range(5)]
    batches = [client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                     completion_window="24h") for f in files]
    page = client.batches.list(limit=2)
    assert len(page.data) == 2 and page.has_more is True
    assert [b.id for b in page.data] == [b.id for b in batches[::-1][:2]]
    assert [b.id for b in client.batches.list(limit=2)] == [b.id for b in batches[::-1]]
    rest = client.batches.list(limit=2, after=batches[2].id)
    assert [b.id for b in rest.data] == [batches[1].id, batches[0].id]
    assert rest.has_more is False
    assert [f.id for f in client.files.list(limit=2, purpose="batch")] == [
        f.id for f in files[::-1]]
    with pytest.raises(openai.BadRequestError) as e:
        client.batches.list(limit=101)
    assert e.value.body["param"] == "limit"
    for b in batches:
        assert wait_done(client, b.id).status == "completed"


# --------------------------------------------------------------------------- batches
@pytest.mark.parametrize("via", VIAS)
@pytest.mark.parametrize("url", ["/v1/chat/completions", "/v1/completions"])
def test_batch_runs_every_line_once_through_its_status_sequence(open_client, via, url):
    client = open_client(via)
    numbers = [7, 3, 11, 5]
    f = client.files.create(file=("in.jsonl", jsonl([line(i, url) for i in numbers])),
                            purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint=url, completion_window="24h",
                              metadata={"job": "numbers"})
    assert isinstance(b, Batch) and b.status in ("validating", "in_progress")
    assert b.input_file_id == f.id and b.endpoint == url and b.metadata == {"job": "numbers"}
    done = wait_done(client, b.id)
    assert done.status == "completed" and done.error_file_id is None
    assert done.created_at <= done.in_progress_at <= done.finalizing_at <= done.completed_at
    assert done.request_counts.total == 4 and done.request_counts.completed == 4
    assert done.request_counts.failed == 0
    outputs = records(client, done.output_file_id)
    assert_answers(outputs, numbers)
    tokens = sum(o["response"]["body"]["usage"]["completion_tokens"] for o in outputs)
    assert done.usage.output_tokens == tokens > 0
    out_file = client.files.retrieve(done.output_file_id)
    assert out_file.purpose == "batch_output"
    assert out_file.bytes == len(client.files.content(done.output_file_id).content)


def test_async_client_runs_a_batch(api_factory):
    from warp_openai import AsyncWarpTransport

    async def go() -> None:
        import httpx

        api = api_factory()
        http = httpx.AsyncClient(transport=AsyncWarpTransport(api),
                                 base_url="http://warp.invalid")
        client = openai.AsyncOpenAI(api_key="x", base_url="http://warp.invalid/v1",
                                    http_client=http, max_retries=0)
        f = await client.files.create(file=("in.jsonl", jsonl([line(i) for i in (1, 2)])),
                                      purpose="batch")
        b = await client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                        completion_window="24h")
        while b.status not in TERMINAL:
            await asyncio.sleep(0.05)
            b = await client.batches.retrieve(b.id)
        assert b.status == "completed"
        text = (await client.files.content(b.output_file_id)).text
        assert_answers([json.loads(x) for x in text.splitlines()], [1, 2])
        assert [x.id async for x in client.batches.list(limit=1)] == [b.id]
        assert [x.id async for x in client.files.list(limit=1)] == [
            b.output_file_id, f.id]
        await client.close()

    asyncio.run(go())


@pytest.mark.parametrize("via", VIAS)
def test_cancel_stops_the_batch_and_answers_the_rest_as_cancelled(open_client, via):
    client = open_client(via, NumberEngine(token_s=0.02))
    f = client.files.create(file=("in.jsonl", jsonl([line(i) for i in range(30)])),
                            purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                              completion_window="24h")
    end = time.monotonic() + 30
    while client.batches.retrieve(b.id).request_counts.completed < 1:
        assert time.monotonic() < end
        time.sleep(0.02)
    c = client.batches.cancel(b.id)
    assert c.status in ("cancelling", "cancelled") and c.cancelling_at is not None
    done = wait_done(client, b.id)
    assert done.status == "cancelled" and done.cancelled_at >= done.cancelling_at
    outputs = records(client, done.output_file_id)
    errors = records(client, done.error_file_id)
    assert 1 <= len(outputs) < 30 and len(outputs) + len(errors) == 30
    assert_answers(outputs, list(range(len(outputs))))
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    ids = [r["custom_id"] for r in outputs + errors]
    assert sorted(ids) == sorted(f"req-{i}" for i in range(30))
    assert done.request_counts.completed == len(outputs)
    assert done.request_counts.failed == len(errors)
    with pytest.raises(openai.ConflictError):  # finished: nothing left to cancel
        client.batches.cancel(_completed(client).id)


def _completed(client: Any) -> Batch:
    f = client.files.create(file=("one.jsonl", jsonl([line(1)])), purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                              completion_window="24h")
    return wait_done(client, b.id)


def test_a_batch_past_its_window_expires_with_its_answers_kept(open_client):
    client = open_client("inproc", NumberEngine(token_s=0.05))
    f = client.files.create(file=("in.jsonl", jsonl([line(i) for i in range(40)])),
                            purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                              completion_window="2s")
    done = wait_done(client, b.id)
    assert done.status == "expired" and done.expired_at >= done.expires_at
    outputs = records(client, done.output_file_id)
    errors = records(client, done.error_file_id)
    assert len(outputs) + len(errors) == 40 and errors
    assert_answers(outputs, list(range(len(outputs))))
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("via", VIAS)
def test_bad_lines_become_error_lines_and_the_rest_completes(open_client, via):
    client = open_client(via)
    lines = [
        line(1),
        "{not json",
        json.dumps(["a", "list"]),
        line(2, "/v1/embeddings"),                                   # another url
        line(1),                                                     # duplicate custom_id
        json.dumps({"custom_id": "req-bad", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"messages": "not a list"}}),             # fails validation
        json.dumps({"custom_id": "req-nobody", "method": "POST",
                    "url": "/v1/chat/completions", "body": "text"}),
        json.dumps({"method": "POST", "url": "/v1/chat/completions", "body": {}}),
        line(3, stream=True),
        "",
        line(4),
    ]
    f = client.files.create(file=("mixed.jsonl", jsonl(lines)), purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                              completion_window="24h")
    done = wait_done(client, b.id)
    assert done.status == "completed"
    assert done.request_counts.total == 10 and done.request_counts.completed == 2
    assert done.request_counts.failed == 8
    assert_answers(records(client, done.output_file_id), [1, 4])
    errors = records(client, done.error_file_id)
    codes = [(e["custom_id"], (e["error"] or {}).get("code")) for e in errors]
    assert codes == [
        (None, "invalid_json_line"), (None, "invalid_json_line"), ("req-2", "invalid_url"),
        ("req-1", "duplicate_custom_id"), ("req-bad", None), ("req-nobody", "invalid_body"),
        (None, "missing_custom_id"), ("req-3", "invalid_body"),
    ]
    refused = next(e for e in errors if e["custom_id"] == "req-bad")["response"]
    assert refused["status_code"] == 400
    assert refused["body"]["error"]["param"] == "messages"
    assert "line 2:" in errors[0]["error"]["message"]


@pytest.mark.parametrize("via", VIAS)
def test_bad_requests_are_openai_shaped_400s(open_client, via):
    client = open_client(via, max_file_bytes=1000)
    with pytest.raises(openai.BadRequestError) as e:
        client.files.create(file=("big.jsonl", b"x" * 1001), purpose="batch")
    assert e.value.code == "file_too_large" and e.value.body["param"] == "file"
    with pytest.raises(openai.BadRequestError) as e:
        client.files.create(file=("a.jsonl", b"{}"), purpose="nonsense")  # type: ignore
    assert e.value.body["param"] == "purpose"
    other = client.files.create(file=("a.jsonl", jsonl([line(1)])), purpose="assistants")
    with pytest.raises(openai.BadRequestError) as e:
        client.batches.create(input_file_id=other.id, endpoint="/v1/chat/completions",
                              completion_window="24h")
    assert e.value.code == "invalid_file_purpose" and e.value.body["param"] == "input_file_id"
    good = client.files.create(file=("b.jsonl", jsonl([line(1)])), purpose="batch")
    with pytest.raises(openai.BadRequestError) as e:
        client.batches.create(input_file_id=good.id, endpoint="/v1/embeddings",
                              completion_window="24h")
    assert e.value.body["param"] == "endpoint"
    with pytest.raises(openai.BadRequestError) as e:
        client.batches.create(input_file_id=good.id, endpoint="/v1/chat/completions",
                              completion_window="soon")  # type: ignore[arg-type]
    assert e.value.body["param"] == "completion_window"
    with pytest.raises(openai.NotFoundError) as e:
        client.batches.create(input_file_id="file-missing", endpoint="/v1/chat/completions",
                              completion_window="24h")
    assert e.value.body["param"] == "input_file_id"
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_missing")
    assert list(client.batches.list()) == []  # nothing refused left a batch behind


def test_an_input_file_with_no_request_fails_the_batch(open_client):
    client = open_client()
    f = client.files.create(file=("empty.jsonl", b"\n\n"), purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                              completion_window="24h")
    done = wait_done(client, b.id)
    assert done.status == "failed" and done.failed_at is not None
    assert done.errors.data[0].code == "empty_file"
    assert done.output_file_id is None and done.error_file_id is None


# --------------------------------------------------------------------------- durability
def test_an_unfinished_batch_resumes_when_the_next_api_starts(api_factory, tmp_path):
    from warp_openai.jobs import JobStore

    first = api_factory(NumberEngine(token_s=0.02))
    f = first.batches.store.add_file(jsonl([line(i) for i in range(12)]), "in.jsonl",
                                     "batch", None)
    first.batches.autostart = False
    b = first.batches.create_batch({"input_file_id": f["id"], "completion_window": "24h",
                                    "endpoint": "/v1/chat/completions"})
    worker = first.batches.start()
    store = first.batches.store
    end = time.monotonic() + 30
    while store.counts(b["id"])["completed"] < 3:
        assert time.monotonic() < end
        time.sleep(0.02)
    first.close()  # stops mid-job: lines in flight are dropped, not recorded
    assert not worker._thread.is_alive()
    left = JobStore(tmp_path)
    answered = left.counts(b["id"])["completed"]
    assert 3 <= answered < 12 and left.batch(b["id"])["status"] == "in_progress"
    left.close()
    second = api_factory(NumberEngine())
    assert second.batches.resume() is not None  # what `warp serve` does at start
    end = time.monotonic() + 30
    while (row := second.batches.store.batch(b["id"]))["status"] != "completed":
        assert time.monotonic() < end
        time.sleep(0.05)
    text = second.batches.store.read_file(row["output_file_id"]).decode()
    assert_answers([json.loads(x) for x in text.splitlines()], list(range(12)))


def test_resume_creates_no_jobs_directory_where_none_is(api_factory, tmp_path):
    api = api_factory(jobs_dir=tmp_path / "jobs")
    assert api.batches.resume() is None
    assert not (tmp_path / "jobs").exists()
