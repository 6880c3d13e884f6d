"""Which instances hold which KV-cache blocks, from vLLM's KV events: the prefix-aware view.

An engine reports blocks by its own hashes, which a scheduler cannot recompute (they depend on the
engine's hash function and seed). ``BlockStored`` also carries each block's token ids and its
parent block, so the index keys every block by a *token-chain hash* of its own: ``H(parent chain,
block size, lora id, the block's tokens)`` with BLAKE2b (8 bytes). A scheduler then asks with the
prompt's token ids: the index chains the prompt's full blocks the same way and walks the chain,
keeping at each depth the instances that hold that block too. The answer is, per instance, how
many leading blocks (and so tokens) of the prompt it holds.

Structures (all guarded by one lock; events arrive on the subscriber thread, queries on the event
loop or a worker thread):
  holders: chain hash -> set of instances holding it (the walk intersects these)
  per instance: (engine hash, medium) -> chain hash (BlockRemoved names engine hashes), and a
  reference count per chain hash (a block kept in two media, GPU and CPU, stays until both go).

A ``BlockStored`` whose parent the index never saw (events missed, or the subscriber started after
the engine) is chained from an "orphan" root: those blocks are counted but never match a prompt from
its start, which is the honest answer (their prefix is unknown). Sequence gaps are reported per
instance (``missed_batches``): after one the view may hold blocks the engine has already evicted.
"""
from __future__ import annotations

import hashlib
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

InstanceKey = tuple[str, str, str]  # (cluster, model_name, instance)
_ROOT = b"\0" * 8


def chain_hash(parent: bytes, block_size: int, lora_id: int | None, tokens: bytes) -> bytes:
    """The index's hash of one block: its parent's chain hash, the block size, the LoRA and its tokens."""
    h = hashlib.blake2b(parent, digest_size=8)
    h.update(block_size.to_bytes(4, "little"))
    h.update((-1 if lora_id is None else lora_id).to_bytes(8, "little", signed=True))
    h.update(tokens)
    return h.digest()


def prompt_chain(token_ids: np.ndarray, block_size: int, lora_id: int | None) -> list[bytes]:
    """Chain hashes of the full blocks of a prompt (a trailing partial block is never cached)."""
    n = len(token_ids) // block_size
    raw = np.ascontiguousarray(token_ids[: n * block_size], dtype=np.int64).tobytes()
    step = block_size * 8
    out: list[bytes] = []
    parent = _ROOT
    for i in range(n):
        parent = chain_hash(parent, block_size, lora_id, raw[i * step:(i + 1) * step])
        out.append(parent)
    return out


@dataclass
class _Instance:
    by_engine: dict[tuple[int, str | None], bytes] = field(default_factory=dict)
    chain_of: dict[int, bytes] = field(default_factory=dict)  # engine hash -> chain hash (any medium)
    refs: Counter = field(default_factory=Counter)
    block_sizes: set[int] = field(default_factory=set)
    stored: int = 0
    removed: int = 0
    cleared: int = 0
    orphans: int = 0
    dropped: int = 0  # stores refused over max_blocks_per_instance
    missed_batches: int = 0
    last_event_ts: float = 0.0  # engine's batch timestamp (s)
    last_event_at: float = 0.0  # our clock when it arrived (s)


class PrefixIndex:
    def __init__(self, max_blocks_per_instance: int = 1_000_000, clock: Any = time.time) -> None:
        self.max_blocks = max_blocks_per_instance
        self.clock = clock
        self._lock = threading.Lock()
        self._holders: dict[bytes, set[InstanceKey]] = {}
        self._inst: dict[InstanceKey, _Instance] = {}

    # ------------------------------------------------------------------ events
    def _state(self, key: InstanceKey) -> _Instance:
        st = self._inst.get(key)
        if st is None:
            st = self._inst[key] = _Instance()
        return st

    def seen(self, key: InstanceKey, ts: float, missed: int = 0) -> None:
        """An event batch of ``key`` arrived (engine timestamp ``ts``), ``missed`` batches lost before it."""
        with self._lock:
            st = self._state(key)
            st.missed_batches += missed
            st.last_event_ts = ts
            st.last_event_at = self.clock()

    def stored(self, key: InstanceKey, block_hashes: Sequence[int], parent_block_hash: int | None,
               token_ids: Sequence[int], block_size: int, lora_id: int | None = None, medium: str | None = None) -> None:
        """vLLM's ``BlockStored``: consecutive full blocks, ``token_ids`` = block_size tokens per block."""
        if block_size <= 0 or len(token_ids) != block_size * len(block_hashes):
            raise ValueError(f"{len(block_hashes)} blocks of size {block_size} need {block_size * len(block_hashes)} "
                             f"token ids, got {len(token_ids)}")
        raw = np.asarray(token_ids, dtype=np.int64).tobytes()
        step = block_size * 8
        with self._lock:
            st = self._state(key)
            st.block_sizes.add(block_size)
            if parent_block_hash is None:
                parent = _ROOT
            else:
                parent = st.chain_of.get(parent_block_hash)
                if parent is None:  # prefix unknown: chained from an orphan root, never matches a prompt
                    st.orphans += len(block_hashes)
                    parent = b"orphan:" + parent_block_hash.to_bytes(8, "big")
            for i, h in enumerate(block_hashes):
                parent = chain_hash(parent, block_size, lora_id, raw[i * step:(i + 1) * step])
                ek = (h, medium)
                if ek in st.by_engine:
                    continue  # re-announced block: already counted
                if len(st.by_engine) >= self.max_blocks:
                    st.dropped += 1
                    continue
                st.by_engine[ek] = parent
                st.chain_of[h] = parent
                st.stored += 1
                if st.refs[parent] == 0:
                    self._holders.setdefault(parent, set()).add(key)
                st.refs[parent] += 1
            if len(st.chain_of) > 2 * max(len(st.by_engine), 1024):  # evicted blocks' parents: keep it bounded
                st.chain_of = {h: c for (h, _m), c in st.by_engine.items()}

    def removed(self, key: InstanceKey, block_hashes: Sequence[int], medium: str | None = None) -> None:
        """vLLM's ``BlockRemoved`` (blocks evicted from ``medium``)."""
        with self._lock:
            st = self._state(key)
            for h in block_hashes:
                self._release(key, st, st.by_engine.pop((h, medium), None))
                st.removed += 1

    def cleared(self, key: InstanceKey) -> None:
        """vLLM's ``AllBlocksCleared`` (cache reset or engine restart)."""
        with self._lock:
            self._clear(key, self._state(key))

    def _release(self, key: InstanceKey, st: _Instance, chain: bytes | None) -> None:
        if chain is None:
            return
        st.refs[chain] -= 1
        if st.refs[chain] <= 0:
            del st.refs[chain]
            s = self._holders.get(chain)
            if s is not None:
                s.discard(key)
                if not s:
                    del self._holders[chain]

    def _clear(self, key: InstanceKey, st: _Instance) -> None:
        for chain in st.refs:
            s = self._holders.get(chain)
            if s is not None:
                s.discard(key)
                if not s:
                    del self._holders[chain]
        st.refs.clear()
        st.by_engine.clear()
        st.chain_of.clear()
        st.cleared += 1

    def forget(self, key: InstanceKey) -> None:
        with self._lock:
            st = self._inst.pop(key, None)
            if st is not None:
                self._clear(key, st)

    # ------------------------------------------------------------------ queries
    def match(self, token_ids: Sequence[int] | np.ndarray, lora_id: int | None = None) -> dict[InstanceKey, dict[str, Any]]:
        """Per instance with events: leading blocks/tokens of the prompt it holds, and its KV view's state."""
        tokens = np.asarray(token_ids, dtype=np.int64)
        with self._lock:
            sizes = sorted({bs for st in self._inst.values() for bs in st.block_sizes})
            matched: dict[InstanceKey, tuple[int, int]] = {}  # key -> (blocks, block size)
            for bs in sizes:
                alive: set[InstanceKey] | None = None
                for depth, h in enumerate(prompt_chain(tokens, bs, lora_id), start=1):
                    s = self._holders.get(h)
                    alive = set(s) if alive is None and s else (alive & s if alive and s else set())
                    if not alive:
                        break
                    for k in alive:
                        matched[k] = (depth, bs)
            now = self.clock()
            out: dict[InstanceKey, dict[str, Any]] = {}
            for k, st in self._inst.items():
                blocks, bs = matched.get(k, (0, min(st.block_sizes) if st.block_sizes else 0))
                out[k] = {"matched_blocks": blocks, "matched_tokens": blocks * bs, "block_size": bs or None,
                          "cached_blocks": len(st.by_engine), "missed_event_batches": st.missed_batches,
                          "kv_events_age_seconds": round(now - st.last_event_at, 6) if st.last_event_at else None}
            return out

    def block_sizes(self) -> dict[InstanceKey, list[int]]:
        """KV block sizes (tokens) each instance's events used."""
        with self._lock:
            return {k: sorted(st.block_sizes) for k, st in self._inst.items()}

    def status(self) -> dict[InstanceKey, dict[str, Any]]:
        with self._lock:
            return {k: {"cached_blocks": len(st.by_engine), "distinct_blocks": len(st.refs), "stored": st.stored,
                        "removed": st.removed, "cleared": st.cleared, "orphan_blocks": st.orphans,
                        "dropped_blocks": st.dropped, "missed_event_batches": st.missed_batches,
                        "block_sizes": sorted(st.block_sizes), "last_event_at": st.last_event_at or None}
                    for k, st in self._inst.items()}


__all__ = ["PrefixIndex", "chain_hash", "prompt_chain"]
