"""The replicated ingest log, on NATS JetStream (nats-py).

One stream (``num_replicas`` = 3 by default, file storage) holds one subject per virtual partition.
``IngestLog`` is the small interface the roles use (a Kafka backend could implement the same):

- ``publish(messages)``: every partition message of one write request is published at once with
  nats-py's async publish; the call returns only when JetStream acknowledged all of them (a stored
  message on a quorum of the stream's replicas), and raises ``LogUnavailable`` otherwise (timeout,
  no quorum, no server): the write is then not acknowledged to its sender.
- ``consumer_after(partition, durable, seq)``: a durable pull consumer of one partition starting
  after stream sequence ``seq`` (ack policy *all*: acking a message acknowledges the partition up
  to it); ``ack_floor(durable)`` is where a restarted ingester resumes.
"""
from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass
from typing import Sequence

import nats
from nats.errors import AuthorizationError, SecureConnRequiredError
from nats.errors import Error as NatsError
from nats.js import api
from nats.js.errors import Error as JetStreamError
from nats.js.errors import NotFoundError

from turboprom.cluster.settings import ClusterSettings

log = logging.getLogger("turboprom.cluster")


class LogUnavailable(Exception):
    """The log did not acknowledge a publish (or cannot be reached)."""


def _refusal(e: BaseException) -> str | None:
    """What a connection error says when NATS refused this client (credentials, certificate), else None."""
    if isinstance(e, AuthorizationError) or "authorization violation" in str(e).lower():
        return "refused this role's credentials (Authorization Violation)"
    if isinstance(e, ssl.SSLCertVerificationError):
        return f"presented a TLS certificate this role does not accept ({e.verify_message})"
    if "tls required" in str(e).lower() or isinstance(e, SecureConnRequiredError):
        return "requires TLS (set nats.tls_config)"
    return None


@dataclass
class Message:
    partition: int
    stream_seq: int
    data: bytes
    raw: object  # the nats-py message, acknowledged through ``IngestLog.ack``


class IngestLog:
    def __init__(self, settings: ClusterSettings, *, client_name: str):
        self.settings = settings
        self.client_name = client_name
        self.nc: nats.NATS | None = None
        self.js = None

    async def connect(self, *, attempts: int = 60) -> None:
        """Connect (waiting for NATS to come up); LogUnavailable at once when NATS refuses this role's
        credentials or certificate, which no retry mends."""
        last: Exception | None = None
        backends = self.settings.backends
        auth = backends.nats.connect_options() if backends is not None else {}
        urls = ", ".join(self.settings.nats_urls)
        for _ in range(attempts):
            refused: asyncio.Future = asyncio.get_running_loop().create_future()

            async def on_error(e: Exception, refused: asyncio.Future = refused) -> None:
                why = _refusal(e)
                if why is not None and not refused.done():
                    refused.set_result(why)
                log.warning("NATS (%s): %s", urls, why or f"{type(e).__name__}: {e}")

            task = asyncio.ensure_future(nats.connect(
                servers=list(self.settings.nats_urls), name=self.client_name, connect_timeout=2, reconnect_time_wait=0.5,
                max_reconnect_attempts=-1, ping_interval=5, max_outstanding_pings=2, error_cb=on_error, **auth))
            await asyncio.wait({task, refused}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():  # refused: nats-py would go on trying the same credentials forever
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                raise LogUnavailable(f"NATS at {urls} {refused.result()}: check the nats: section of --cluster.backends-config")
            try:
                self.nc = task.result()
                self.js = self.nc.jetstream(timeout=self.settings.publish_timeout_s)
                return
            except (NatsError, OSError, asyncio.TimeoutError) as e:
                why = _refusal(e)
                if why is not None:
                    raise LogUnavailable(f"NATS at {urls} {why}: check the nats: section of --cluster.backends-config") from None
                last = e
                await asyncio.sleep(0.5)
        raise LogUnavailable(f"cannot connect to NATS at {urls}: {last}")

    async def ensure_stream(self, *, attempts: int = 60) -> None:
        """Create the ingest stream if it does not exist (idempotent; a cluster's first role does it)."""
        s = self.settings
        cfg = api.StreamConfig(name=s.stream, subjects=[f"{s.name}.ingest.>"], num_replicas=s.stream_replicas,
                               storage=api.StorageType.FILE, retention=api.RetentionPolicy.LIMITS,
                               max_age=s.log_retention_s or None, duplicate_window=0)
        last: Exception | None = None
        for _ in range(attempts):
            try:
                await self.js.stream_info(s.stream)
                return
            except NotFoundError:
                pass
            except (JetStreamError, NatsError, asyncio.TimeoutError) as e:  # no JetStream leader yet
                last = e
                await asyncio.sleep(0.5)
                continue
            try:
                await self.js.add_stream(cfg)
                log.info("created JetStream stream %s (replicas %d)", s.stream, s.stream_replicas)
                return
            except (JetStreamError, NatsError, asyncio.TimeoutError) as e:
                last = e
                await asyncio.sleep(0.5)
        raise LogUnavailable(f"JetStream stream {s.stream} could not be created or found: {last}")

    async def publish(self, messages: Sequence[tuple[int, bytes]]) -> None:
        if self.js is None or self.nc is None or not self.nc.is_connected:
            raise LogUnavailable("not connected to NATS")
        timeout = self.settings.publish_timeout_s
        try:
            futs = [await self.js.publish_async(self.settings.subject(p), data, wait_stall=timeout) for p, data in messages]
            done = await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True), timeout)
        except (asyncio.TimeoutError, NatsError, JetStreamError) as e:
            raise LogUnavailable(f"JetStream did not acknowledge the write within {timeout:g}s ({type(e).__name__})") from None
        failed = [r for r in done if isinstance(r, BaseException)]
        if failed:
            raise LogUnavailable(f"JetStream refused {len(failed)} of {len(messages)} partition messages: {failed[0]!r}")

    async def consumer_after(self, partition: int, durable: str, after_seq: int):
        """The durable pull subscription of ``partition`` delivering from the message after stream
        sequence ``after_seq`` (0: from the start). Any earlier consumer of that name is replaced:
        messages it had delivered but that were never acknowledged must come again, in order,
        before anything newer (waiting out its ack_wait would let newer messages, acknowledged
        with ack policy *all*, cover them)."""
        s = self.settings
        try:
            await self.js.delete_consumer(s.stream, durable)
        except NotFoundError:
            pass
        # The consumer's own state lives on one JetStream server (num_replicas=1): its ack floor is only
        # a resume hint (the ingester's applied sequence is the truth, and a lost consumer means a replay
        # from the start, duplicates being idempotent), and replicated consumer state cost each NATS node
        # most of its CPU (one raft group per ingester and partition; docs/benchmarks.md).
        start = (dict(deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after_seq + 1) if after_seq
                 else dict(deliver_policy=api.DeliverPolicy.ALL))
        cfg = api.ConsumerConfig(durable_name=durable, ack_policy=api.AckPolicy.ALL, ack_wait=60.0,
                                 max_ack_pending=1024, filter_subject=s.subject(partition), num_replicas=1, **start)
        return await self.js.pull_subscribe(s.subject(partition), durable=durable, stream=s.stream, config=cfg)

    async def ack_floor(self, durable: str) -> int:
        """Stream sequence up to which ``durable`` has acknowledged (0 when it does not exist)."""
        try:
            info = await self.js.consumer_info(self.settings.stream, durable)
        except NotFoundError:
            return 0
        floor = int(info.ack_floor.stream_seq or 0) if info.ack_floor else 0
        # a consumer created to start after S reports floor 0 until its first ack: it is S
        return max(floor, int(info.config.opt_start_seq or 1) - 1)

    async def last_seq(self, partition: int) -> int:
        """Stream sequence of the partition's newest message (0 when it has none)."""
        try:
            m = await self.js.get_last_msg(self.settings.stream, self.settings.subject(partition))
        except NotFoundError:
            return 0
        return int(m.seq or 0)

    async def close(self) -> None:
        if self.nc is not None and not self.nc.is_closed:
            try:
                await asyncio.wait_for(self.nc.close(), 5)
            except (asyncio.TimeoutError, NatsError):
                pass
