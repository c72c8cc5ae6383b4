"""`warp batch --ray`: a batch's lines answered by a Ray Data pipeline over an actor pool.

Owns: `ray_runner`, the runner `batchfile.run_file` takes instead of the in-process
worker. The driver validates the input and keeps the job in the same jobs directory
(so `--resume` and the exactly-once rule hold as for a local run); the lines not yet
answered become a Ray dataset, `map_batches` sends them to a pool of `LineAnswerer`
actors (each opens one engine on its node's copy of the container, at the same path,
and answers through the API's own handlers), and the driver records each answer as it
streams back, then writes the output and error files in input order. Ray restarts an
actor that dies and retries its lines; a line answered twice by a retry is recorded
once.
Refuses: nothing of its own; needs `ray[data]` (the `ray` extra of warp-openai).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

__all__ = ["LineAnswerer", "ray_runner"]


class LineAnswerer:
    """A Ray Data actor: one engine, answering batches of request lines."""

    def __init__(self, model: str, model_id: str, endpoint: str,
                 engine_options: dict[str, Any]) -> None:
        """Open the engine on this node's container at `model`."""
        from warp_openai.api import WarpAPI
        from warp_providers import shared_engine

        self.endpoint = endpoint
        self.api = WarpAPI(engine=shared_engine(model, **engine_options), model_id=model_id)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        """Answers each line of a batch: columns line, status, body (JSON text)."""
        from warp_openai.jobs import crash_point

        lines: list[int] = []
        statuses: list[int] = []
        bodies: list[str] = []
        for line, body in zip(batch["line"], batch["body"]):
            crash_point("ray_line")
            status, out = self.api.call(self.endpoint, json.loads(str(body)))
            assert isinstance(out, dict)
            lines.append(int(line))
            statuses.append(status)
            bodies.append(json.dumps(out, ensure_ascii=False))
        return {"line": lines, "status": statuses, "body": bodies}


def ray_runner(model: str, *, address: str | None, actors: int,
               engine_options: dict[str, Any]
               ) -> Callable[[Any, str, Callable[[dict[str, Any]], None]], str | None]:
    """A `run_file` runner that answers the lines on Ray.

    Args:
        model: the container path (the same on every node).
        address: the Ray cluster to join ("auto", "ray://host:10001", ...); None starts
            a local instance (or joins the one `RAY_ADDRESS` names).
        actors: engines in the pool (one per actor).
        engine_options: passed to `Engine.open` in each actor; on a local instance the
            engine threads default to the cores divided among the actors.

    """

    def run(api: Any, batch_id: str, on_result: Callable[[dict[str, Any]], None]
            ) -> str | None:
        import ray

        from warp_openai.batches import Worker, answer_result

        store = api.batches.store
        worker = Worker(api, store)
        with store.running(batch_id) as mine:
            if not mine:
                return None
            row = store.batch(batch_id)
            assert row is not None
            if row["status"] == "validating":
                worker.validate(row)
                row = store.batch(batch_id)
                assert row is not None
            pending = store.pending(batch_id) if row["status"] == "in_progress" else []
            if pending:
                opts = dict(engine_options)
                if not ray.is_initialized():
                    if address is None:
                        cores = os.cpu_count() or 1
                        opts.setdefault("threads", max(1, cores // actors))
                        ray.init(num_cpus=max(cores, actors + 1), include_dashboard=False,
                                 log_to_driver=False)
                    else:
                        ray.init(address=address, log_to_driver=False)
                # our own progress goes to stderr; Ray Data's would interleave with it
                ray.data.DataContext.get_current().enable_progress_bars = False
                items = [{"line": n, "body": json.dumps(body)} for n, _, body in pending]
                ids = {n: cid for n, cid, _ in pending}
                ds = ray.data.from_items(items).map_batches(
                    LineAnswerer, batch_size=1, num_cpus=1,
                    compute=ray.data.ActorPoolStrategy(size=actors),
                    fn_constructor_kwargs={"model": model, "model_id": api.model_id,
                                           "endpoint": row["endpoint"],
                                           "engine_options": opts})
                done: set[int] = set()
                for r in ds.iter_rows():
                    n = int(r["line"])
                    if n in done:
                        continue
                    done.add(n)
                    store.record(batch_id, answer_result(n, ids[n], int(r["status"]),
                                                         json.loads(r["body"])))
                    on_result({"total": row["total"], **store.counts(batch_id)})
            worker.finish(batch_id)
            final = store.batch(batch_id)
            return final["status"] if final else None

    return run
