"""The querier's storage: the read side of storage's interface, answered by the ingesters.

Each read covers every virtual partition with exactly one live owner, so nothing is counted twice
and nothing is missing: owners that have caught up are preferred, and the owners are chosen to cover
the partitions with as few requests as possible (greedy set cover; with RF=2 and two ingesters, one
request). An owner that fails a request (killed, unreachable) is left out for a few seconds and its
partitions are read again from their other owner within the same query. A partition with no live
owner fails the query with 503 ``unavailable`` rather than answer incompletely.

The engine calls these methods from worker threads; the requests run concurrently on the event
loop (aiohttp), the calling thread waits for them.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from typing import Any, Sequence

import aiohttp
import orjson

from ingest.http_client_config import HTTPClientConfig
from promql.errors import PromQLError
from storage.labels import Labels
from storage.matchers import Matcher
from storage.series_set import SeriesSet
from storage.status import tsdb_status
from turboprom.cluster import columns_codec
from turboprom.cluster.membership import ClusterView
from turboprom.cluster.read_api import PREFIX, matchers_json

log = logging.getLogger("turboprom.cluster")
DOWN_FOR_S = 5.0
_ALL_TIME = (-(1 << 62), 1 << 62)


ASSIGNMENT_WAIT_S = 10.0


class PartitionUnavailable(PromQLError):
    error_type = "unavailable"
    http_status = 503


class Refused(Exception):
    """An ingester refused a request as the caller's fault (HTTP 4xx: a PromQL error of a pushed-down
    aggregation, or a route it does not have): not a failure of the node."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class FanoutStorage:
    def __init__(self, view: ClusterView, *, timeout_s: float = 120.0, client: HTTPClientConfig | None = None):
        self.view = view
        self.timeout_s = timeout_s
        self.client = client  # credentials and TLS for the ingesters (--cluster.internal-client-config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._session: aiohttp.ClientSession | None = None
        self._down: dict[str, float] = {}
        self._turn = itertools.count()

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        await asyncio.wait_for(self.view.loaded.wait(), 30)
        # Ready (the server answers /-/ready once this returns) when the ingesters' assignment is known:
        # ingesters and queriers start together, and a querier that polled etcd before the first
        # ingester wrote the assignment would answer 503 "no ingester has joined" for one poll
        # interval. A querier started before any ingester still becomes ready after the wait.
        deadline = time.monotonic() + ASSIGNMENT_WAIT_S
        while self.view.state.assignment is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.view.state.assignment is None:
            log.warning("no partition assignment in etcd after %.0f s: no ingester has joined yet; queries answer 503 "
                        "until one does", ASSIGNMENT_WAIT_S)

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()

    # ----------------------------------------------------------------------------------- planning
    def plan(self, exclude: set[str] = frozenset()) -> dict[str, list[int]]:
        """url -> partitions it answers for, covering every partition once."""
        st = self.view.state
        a = st.assignment
        if a is None:
            raise PartitionUnavailable("no ingester has joined the cluster yet (no partition assignment in etcd)")
        now = time.monotonic()
        live = {n: v for n, v in st.alive.items() if n not in exclude}
        ready = {n: set(v.get("caught_up", ())) for n, v in live.items()}
        recent_failure = {n for n in live if self._down.get(n, 0) > now}
        uncovered = set(range(a.partitions))
        chosen: dict[str, set[int]] = {}
        turn = next(self._turn)
        # preference tiers: caught up and not recently failed, then not recently failed, then any live owner
        for tier in ((True, False), (False, False), (True, True), (False, True)):
            prefer_caught_up, allow_failed = tier
            cand: dict[str, set[int]] = {}
            for p in uncovered:
                for n in a.owners[p]:
                    if n in live and (allow_failed or n not in recent_failure) and (not prefer_caught_up or p in ready[n]):
                        cand.setdefault(n, set()).add(p)
            while cand:
                names = sorted(cand)
                best = max(names, key=lambda n: (len(cand[n] & uncovered), (names.index(n) + turn) % len(names)))
                got = cand.pop(best) & uncovered
                if not got:
                    break
                chosen.setdefault(best, set()).update(got)
                uncovered -= got
        if uncovered:
            sample = sorted(uncovered)[:8]
            raise PartitionUnavailable(f"{len(uncovered)} of {a.partitions} partitions have no live owner "
                                       f"(e.g. {sample}); retry when an ingester is back")
        return {st.alive[n]["url"]: sorted(ps) for n, ps in chosen.items()}

    def _node_of(self, url: str) -> str | None:
        return next((n for n, v in self.view.state.alive.items() if v.get("url") == url), None)

    # ------------------------------------------------------------------------------------ calling
    def _run(self, coro: Any) -> Any:
        if self._loop is None:
            raise PartitionUnavailable("querier not started")
        if threading.get_ident() == self._loop_thread:
            raise RuntimeError("FanoutStorage reads block: call them from a worker thread, not the event loop")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _post(self, url: str, path: str, body: dict, refusals: bool = False, timeout_s: float | None = None) -> bytes:
        headers = {"Content-Type": "application/json"}
        kw: dict[str, Any] = {} if timeout_s is None else {"timeout": aiohttp.ClientTimeout(total=timeout_s)}
        if self.client is not None:
            auth = self.client.authorization_header()
            if auth is not None:
                headers["Authorization"] = auth
            kw.update(ssl=self.client.ssl_context() or True, server_hostname=self.client.server_hostname(),
                      proxy=self.client.proxy_url)
        async with self._session.post(url + PREFIX + path, data=orjson.dumps(body), headers=headers, **kw) as r:
            data = await r.read()
            if refusals and 400 <= r.status < 500:
                raise Refused(r.status, data[:300].decode(errors="replace"))
            if r.status != 200:
                raise aiohttp.ClientResponseError(r.request_info, (), status=r.status, message=data[:300].decode(errors="replace"))
            return data

    async def _fan(self, path: str, body: dict, per_partition: bool, refusals: bool = False) -> list[bytes]:
        """One answer per chosen owner; a failed owner's partitions are asked of their other owner.
        With ``refusals``, an owner's 4xx answer raises ``Refused`` (the node is fine; the request
        is what it cannot answer)."""
        out: list[bytes] = []
        failed: set[str] = set()
        last: Exception | None = None
        missing: set[int] = set()  # the partitions the previous round could not read
        for _ in range(4):
            plan = self.plan(failed)
            plan = {u: ps for u, ps in plan.items() if u not in {self.view.state.alive.get(f, {}).get("url") for f in failed}}
            if per_partition and out:  # retry round: only partitions still missing
                plan = {u: [p for p in ps if p in missing] for u, ps in plan.items()}
                plan = {u: ps for u, ps in plan.items() if ps}
            reqs = {u: dict(body, partitions=ps) for u, ps in plan.items()}
            results = await asyncio.gather(*(self._post(u, path, b, refusals) for u, b in reqs.items()), return_exceptions=True)
            missing = set()
            for res in results:
                if isinstance(res, Refused):
                    raise res
            for (u, ps), res in zip(plan.items(), results):
                if isinstance(res, BaseException):
                    last = res
                    node = self._node_of(u)
                    if node is not None:
                        failed.add(node)
                        self._down[node] = time.monotonic() + DOWN_FOR_S
                    missing.update(ps)
                else:
                    node = self._node_of(u)
                    if node is not None:
                        self._down.pop(node, None)
                    out.append(res)
            if not missing:
                return out
            if not per_partition:
                out = []
        raise PartitionUnavailable(f"partition reads failed on every owner: {last}")

    def partials(self, body: dict) -> list[bytes]:
        """A pushed-down aggregation's partial states (``/aggregate``), one per owner chosen to
        cover every partition once (exactly one replica per partition, as for ``select``)."""
        return self._run(self._fan("/aggregate", body, per_partition=True, refusals=True))

    FRONTIER_TIMEOUT_S = 2.0

    def frontiers(self, since: dict[str, int]) -> dict[str, dict | BaseException]:
        """Every live ingester's write log after its sequence ``since[node]`` (read_api ``/frontier``;
        turboprom/cluster/cluster_frontier.py): node -> its answer, or the error asking it."""
        alive = {n: v["url"] for n, v in self.view.state.alive.items()}

        async def ask() -> dict[str, dict | BaseException]:
            nodes = sorted(alive)
            got = await asyncio.gather(*(self._post(alive[n], "/frontier", {"since": int(since.get(n, 0))},
                                                    timeout_s=self.FRONTIER_TIMEOUT_S) for n in nodes),
                                       return_exceptions=True)
            return {n: (r if isinstance(r, BaseException) else orjson.loads(r)) for n, r in zip(nodes, got)}

        return self._run(ask())

    # ------------------------------------------------------------------------- storage interface
    def select(self, matchers: Sequence[Matcher], mint: int, maxt: int) -> SeriesSet:
        body = {"matchers": matchers_json(matchers), "mint": int(mint), "maxt": int(maxt)}
        parts = self._run(self._fan("/select", body, per_partition=True))
        return columns_codec.merge_series_sets([columns_codec.decode_series_set(p) for p in parts])

    def series(self, matcher_sets: Sequence[Sequence[Matcher]], mint: int, maxt: int) -> list[Labels]:
        body = {"matcher_sets": [matchers_json(ms) for ms in matcher_sets], "mint": int(mint), "maxt": int(maxt)}
        found = {tuple(tuple(p) for p in s) for raw in self._run(self._fan("/series", body, per_partition=False))
                 for s in orjson.loads(raw)}
        return sorted(found)

    def _labels(self, name: str | None, mint: int, maxt: int, matcher_sets: Sequence[Sequence[Matcher]]) -> list[str]:
        body = {"matcher_sets": [matchers_json(ms) for ms in matcher_sets], "mint": int(mint), "maxt": int(maxt), "name": name}
        return sorted({v for raw in self._run(self._fan("/labels", body, per_partition=False)) for v in orjson.loads(raw)})

    def label_names(self, mint: int, maxt: int, matcher_sets: Sequence[Sequence[Matcher]] = ()) -> list[str]:
        return self._labels(None, mint, maxt, matcher_sets)

    def label_values(self, name: str, mint: int, maxt: int, matcher_sets: Sequence[Sequence[Matcher]] = ()) -> list[str]:
        return self._labels(name, mint, maxt, matcher_sets)

    def metadata(self, metric: str | None, limit_per_metric: int | None, tenant: str) -> dict[str, list[dict]]:
        """A tenant's metric metadata as the ingesters covering every partition hold it (merged)."""
        from turboprom.cluster.fanout_metadata import merge_metadata

        body = {"metric": metric, "limit_per_metric": limit_per_metric, "tenant": tenant}
        return merge_metadata((orjson.loads(raw) for raw in self._run(self._fan("/metadata", body, per_partition=False))),
                              limit_per_metric)

    def _head_range(self, matchers: Sequence[Matcher]) -> tuple[int, int]:
        """Min and max time of the head samples of the series matching ``matchers``, over the owners
        covering every partition (each holds its partitions' samples whole, so min/max over them is
        the cluster's; 0, 0 when no head holds such a series, as on a single node)."""
        got = [orjson.loads(raw) for raw in self._run(self._fan("/head_range", {"matchers": matchers_json(matchers)},
                                                                per_partition=False))]
        got = [g for g in got if g["numSeries"]]
        return (min(g["minTime"] for g in got), max(g["maxTime"] for g in got)) if got else (0, 0)

    def tsdb_status(self, matchers: Sequence[Matcher], limit: int = 10) -> dict:
        """Prometheus's /api/v1/status/tsdb data over the cluster's series matching ``matchers``:
        the cardinality lists and series count from every partition (each series once), the head
        time range from the owners' heads. Chunk figures are 0, as on a single node."""
        lo, hi = self._head_range(matchers)
        return tsdb_status(self.series([list(matchers)], _ALL_TIME[0], _ALL_TIME[1]), limit, min_time=lo, max_time=hi)

    def head_stats_of(self, matchers: Sequence[Matcher]) -> dict:
        """The cost report's storage figures: the series count and head time range over the
        cluster; samples and block bytes stay on the ingesters (0 here)."""
        n = len(self.series([list(matchers)], _ALL_TIME[0], _ALL_TIME[1]))
        lo, hi = self._head_range(matchers)
        return {"numSeries": n, "numSamples": 0, "chunkCount": 0, "minTime": lo, "maxTime": hi, "blockBytes": 0}

    def append(self, batch: Any) -> Any:
        raise RuntimeError("a querier stores nothing: send writes to a distributor (--role distributor)")

    def delete_series(self, matcher_sets: Sequence[Sequence[Matcher]], mint: int, maxt: int) -> int:
        raise PartitionUnavailable("deleting series is not available through a querier in cluster mode")

    def close(self) -> None:
        pass
