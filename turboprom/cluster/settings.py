"""Cluster settings of ``turboprom serve --role ...`` (flags ``--cluster.*``; docs/cluster.md)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ingest.http_client_config import HTTPClientConfig

if TYPE_CHECKING:
    from turboprom.cluster.backend_clients import BackendClients

ROLES = ("all", "distributor", "ingester", "querier")
DEFAULT_PARTITIONS = 64
DEFAULT_REPLICATION_FACTOR = 2


@dataclass
class ClusterSettings:
    role: str = "all"  # "all" = the embedded single node
    nats_urls: list[str] = field(default_factory=lambda: ["nats://127.0.0.1:4222"])
    etcd_endpoints: list[str] = field(default_factory=lambda: ["http://127.0.0.1:2379"])
    name: str = "turboprom"  # cluster name: prefixes the stream, its subjects and the etcd keys
    partitions: int = DEFAULT_PARTITIONS  # virtual partitions, fixed for the life of the stream
    replication_factor: int = DEFAULT_REPLICATION_FACTOR  # ingesters consuming each partition
    stream_replicas: int = 3  # JetStream num_replicas of the ingest stream
    node_id: str = ""  # ingester identity (default: derived from the advertised URL)
    advertise_url: str = ""  # how queriers reach this ingester (default: http://<listen>)
    publish_timeout_s: float = 5.0  # a write not acknowledged by JetStream by then is answered 503
    lease_ttl_s: int = 3  # etcd lease of an ingester's liveness key
    pushdown: bool = True  # a querier pushes mergeable aggregations down to the ingesters
    log_retention_s: float = 86400.0  # how long JetStream keeps a partition's messages (replay horizon); 0 = forever
    # how a querier calls the ingesters (--cluster.internal-client-config): credentials, TLS; None = plain
    internal_client: HTTPClientConfig | None = None
    # how every role reaches NATS and etcd (--cluster.backends-config): credentials, TLS; None = plain
    backends: BackendClients | None = None

    def validate(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"--role {self.role!r}: expected one of {', '.join(ROLES)}")
        if not 1 <= self.partitions <= 4096:
            raise ValueError(f"--cluster.partitions {self.partitions}: expected 1 to 4096")
        if not 1 <= self.replication_factor <= 5:
            raise ValueError(f"--cluster.replication-factor {self.replication_factor}: expected 1 to 5")
        if self.stream_replicas not in (1, 3, 5):
            raise ValueError(f"--cluster.stream-replicas {self.stream_replicas}: expected 1, 3 or 5")
        if not self.name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"--cluster.name {self.name!r}: letters, digits, '-' and '_' only")
        if not self.publish_timeout_s > 0:
            raise ValueError(f"--cluster.publish-timeout {self.publish_timeout_s}s: expected more than 0")
        if self.advertise_url and not self.advertise_url.startswith(("http://", "https://")):
            raise ValueError(f"--cluster.advertise-url {self.advertise_url!r}: expected http://host:port or https://host:port")
        if self.role != "all" and self.role != "querier" and not self.nats_urls:
            raise ValueError(f"--role {self.role} needs --cluster.nats-urls")
        if self.role in ("ingester", "querier") and not self.etcd_endpoints:
            raise ValueError(f"--role {self.role} needs --cluster.etcd-endpoints")

    @property
    def stream(self) -> str:
        return f"{self.name.upper().replace('-', '_')}_INGEST"

    def subject(self, partition: int) -> str:
        return f"{self.name}.ingest.p{partition:04d}"

    @property
    def etcd_prefix(self) -> str:
        return f"/turboprom/{self.name}/"
