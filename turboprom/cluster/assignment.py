"""Partition ownership: which ingesters (RF of them) own each virtual partition.

The assignment is a pure function of the registered ingesters (not of which are alive: an
ingester that restarts keeps its partitions, and reads move to the other owner meanwhile), by
rendezvous hashing: each partition ranks every member by a hash of (member, partition) and takes
the first RF. A member joining or leaving moves only the ownerships it gains or loses (about RF/n of
them). The result is stored in etcd, versioned, and replaced by compare-and-swap when the member
set changes (``membership``).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import orjson


def _score(member: str, partition: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"{member}\x00{partition}".encode(), digest_size=8).digest(), "big")


def owners_by_rendezvous(members: list[str], partitions: int, rf: int) -> list[list[str]]:
    ms = sorted(set(members))
    return [sorted(ms, key=lambda m: _score(m, p), reverse=True)[:rf] for p in range(partitions)]


@dataclass
class Assignment:
    version: int = 0
    partitions: int = 0
    rf: int = 0
    members: list[str] = field(default_factory=list)
    owners: list[list[str]] = field(default_factory=list)  # per partition, in preference order

    def owned_by(self, member: str) -> set[int]:
        return {p for p, os in enumerate(self.owners) if member in os}

    def to_json(self) -> bytes:
        return orjson.dumps({"version": self.version, "partitions": self.partitions, "rf": self.rf,
                             "members": self.members, "owners": self.owners})

    @classmethod
    def from_json(cls, data: bytes) -> "Assignment":
        d = orjson.loads(data)
        return cls(int(d["version"]), int(d["partitions"]), int(d["rf"]), list(d["members"]), [list(o) for o in d["owners"]])

    def successor(self, members: list[str], partitions: int, rf: int) -> "Assignment":
        ms = sorted(set(members))
        return Assignment(self.version + 1, partitions, rf, ms, owners_by_rendezvous(ms, partitions, rf))
