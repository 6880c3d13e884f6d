"""Cluster membership in etcd: who the ingesters are, which are alive, who owns which partition.

Keys under ``/turboprom/<cluster>/``:

- ``members/<node>``: an ingester that joined (persistent; removing the key is leaving the ring);
- ``alive/<node>``: ``{"url": ..., "caught_up": [partitions]}`` under the ingester's lease (TTL
  ``lease_ttl_s``): gone within a TTL of the ingester dying; ``caught_up`` lists the owned partitions
  it has replayed up to the log's end as of when it took them;
- ``assignment``: the versioned ``assignment.Assignment``, rewritten by compare-and-swap by any
  ingester that sees it disagree with the member set.

``ClusterView`` polls these keys (queriers, distributors); ``Membership`` is an ingester's side.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Callable

import orjson

from storage.etcd_gateway import EtcdAuthFailed, EtcdGateway, EtcdUnavailable
from turboprom.cluster.assignment import Assignment
from turboprom.cluster.settings import ClusterSettings

log = logging.getLogger("turboprom.cluster")
POLL_S = 0.25


@dataclass
class ClusterState:
    members: dict[str, dict] = field(default_factory=dict)
    alive: dict[str, dict] = field(default_factory=dict)
    assignment: Assignment | None = None
    assignment_revision: int = 0


def _with_hint(e: EtcdAuthFailed) -> EtcdAuthFailed:
    return EtcdAuthFailed(f"{e}: see the etcd: section of --cluster.backends-config")


class ClusterView:
    def __init__(self, settings: ClusterSettings):
        self.settings = settings
        self.etcd = EtcdGateway(settings.etcd_endpoints,
                                client=settings.backends.etcd if settings.backends is not None else None)
        self.state = ClusterState()
        self.loaded = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.on_change: list[Callable[[ClusterState], None]] = []

    async def refresh(self) -> ClusterState:
        P = self.settings.etcd_prefix
        kv = await self.etcd.range_prefix(P)
        st = ClusterState()
        for key, (val, rev) in kv.items():
            rest = key[len(P):]
            if rest.startswith("members/"):
                st.members[rest[8:]] = orjson.loads(val)
            elif rest.startswith("alive/"):
                st.alive[rest[6:]] = orjson.loads(val)
            elif rest == "assignment":
                st.assignment, st.assignment_revision = Assignment.from_json(val), rev
        self.state = st
        self.loaded.set()
        for cb in self.on_change:
            cb(st)
        return st

    async def _poll(self) -> None:
        while True:
            try:
                await self.refresh()
                await self.after_refresh()
            except EtcdUnavailable as e:  # keep the last state; reads go on with it
                log.warning("cluster state not refreshed: %s", e)
            except Exception:  # noqa: BLE001 - the poll must survive anything
                log.exception("cluster state poll failed")
            await asyncio.sleep(POLL_S)

    async def after_refresh(self) -> None:
        pass

    async def start(self) -> None:
        try:  # credentials etcd refuses stop the start (one line naming them), not a warning a second
            await self.refresh()
        except EtcdAuthFailed as e:
            await self.etcd.close()
            raise _with_hint(e) from None
        except EtcdUnavailable as e:  # etcd not up yet: the poll goes on trying
            log.warning("cluster state not loaded yet: %s", e)
        self._task = asyncio.get_running_loop().create_task(self._poll(), name="cluster state poll")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.etcd.close()


class Membership(ClusterView):
    """An ingester's registration, liveness lease and assignment upkeep."""

    def __init__(self, settings: ClusterSettings, node_id: str, url: str):
        super().__init__(settings)
        self.node_id = node_id
        self.url = url
        self.caught_up: set[int] = set()
        self._lease: str | None = None
        self._keep: asyncio.Task | None = None
        self._published: tuple | None = None

    def _alive_value(self) -> bytes:
        return orjson.dumps({"url": self.url, "caught_up": sorted(self.caught_up)})

    async def _register(self) -> None:
        P = self.settings.etcd_prefix
        await self.etcd.put(P + f"members/{self.node_id}", orjson.dumps({"url": self.url}))
        self._lease = await self.etcd.grant(self.settings.lease_ttl_s)
        await self.etcd.put(P + f"alive/{self.node_id}", self._alive_value(), self._lease)
        self._published = tuple(sorted(self.caught_up))

    async def _keepalive(self) -> None:
        while True:
            await asyncio.sleep(max(self.settings.lease_ttl_s / 3, 0.2))
            try:
                if self._lease is None or not await self.etcd.keepalive(self._lease):
                    await self._register()
                elif self._published != tuple(sorted(self.caught_up)):
                    await self.etcd.put(self.settings.etcd_prefix + f"alive/{self.node_id}", self._alive_value(), self._lease)
                    self._published = tuple(sorted(self.caught_up))
            except EtcdUnavailable as e:
                log.warning("etcd lease not refreshed: %s", e)

    async def after_refresh(self) -> None:
        st, s = self.state, self.settings
        members = sorted(st.members)
        a = st.assignment
        if a is not None and a.partitions != s.partitions:
            log.error("cluster %s has %d partitions in etcd, this ingester is configured with %d: keeping etcd's",
                      s.name, a.partitions, s.partitions)
            return
        if a is None or a.members != members or a.rf != s.replication_factor:
            new = (a or Assignment()).successor(members, s.partitions, s.replication_factor)
            if await self.etcd.put_if_revision(s.etcd_prefix + "assignment", new.to_json(), st.assignment_revision):
                log.info("partition assignment v%d: %d members, RF %d", new.version, len(members), new.rf)
                await self.refresh()

    async def start(self) -> None:
        for attempt in range(60):
            try:
                await self._register()
                break
            except EtcdUnavailable as e:
                if attempt == 59 or isinstance(e, EtcdAuthFailed):
                    await self.etcd.close()
                    raise _with_hint(e) if isinstance(e, EtcdAuthFailed) else e from None
                await asyncio.sleep(0.5)
        await super().start()
        self._keep = asyncio.get_running_loop().create_task(self._keepalive(), name="etcd lease keep-alive")

    async def stop(self) -> None:
        if self._keep is not None:
            self._keep.cancel()
            await asyncio.gather(self._keep, return_exceptions=True)
        if self._lease is not None:  # a clean stop: gone from the live set at once (still a member)
            try:
                await self.etcd.revoke(self._lease)
            except EtcdUnavailable:
                pass
        await super().stop()
