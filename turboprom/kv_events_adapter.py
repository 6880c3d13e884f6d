"""vLLM KV-cache events into the prefix index: ``ingest.kv_events`` decodes them,
``scheduler_metrics.congestion.prefix_index`` keeps the view, and neither stage imports the other.
Used by the server process and by the poll endpoint's own process, each with its own subscription.
"""
from __future__ import annotations

from ingest.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KVEventEndpoint
from scheduler_metrics.congestion.prefix_index import PrefixIndex


def apply_batch(index: PrefixIndex, ep: KVEventEndpoint, batch: EventBatch, missed: int) -> None:
    """One decoded event batch of one engine into the index."""
    key = ep.key
    index.seen(key, batch.ts, missed)
    for ev in batch.events:
        if isinstance(ev, BlockStored):
            index.stored(key, ev.block_hashes, ev.parent_block_hash, ev.token_ids, ev.block_size, ev.lora_id, ev.medium)
        elif isinstance(ev, BlockRemoved):
            index.removed(key, ev.block_hashes, ev.medium)
        elif isinstance(ev, AllBlocksCleared):
            index.cleared(key)
