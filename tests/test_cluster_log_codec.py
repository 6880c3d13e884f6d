"""The ingest log's wire contract without peers: log messages (columns_codec), series keys on the
distributor and the series dictionary on the ingester (series_dictionary.py), storage resolving
the dictionary's references, and the earlier message format still replaying."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from storage.batch import SampleBatch, SeriesRefColumn
from storage.matchers import Matcher
from storage.tsdb import TSDB
from turboprom.cluster import columns_codec, partitions, series_dictionary
from turboprom.cluster.log_publisher import LogPublisher, _Group
from turboprom.cluster.series_dictionary import SeriesDictionary, SeriesKeys, log_refs
from turboprom.cluster.settings import ClusterSettings

STALE = np.frombuffer(struct.pack("<Q", 0x7FF0000000000002), np.float64)[0]


def labels(i: int, tenant: str | None = None) -> tuple:
    lbl = [("__name__", f"m{i % 3}"), ("instance", f"h{i}")]
    if tenant:
        lbl.append(("__tenant__", tenant))
    return tuple(sorted(lbl))


class Space:
    """A stand-in for an ingest path's reference space (any weakly referenceable object is one)."""


def batch_of(ids: list[int], t: int, space: Space | None = None, tenant: str = "default") -> SampleBatch:
    series = [labels(i, None if tenant == "default" else tenant) for i in ids]
    b = SampleBatch(series, np.arange(len(ids)), np.full(len(ids), t), np.arange(len(ids), dtype=np.float64) + t, tenant=tenant)
    if space is not None:
        b.series_refs = SeriesRefColumn(space, np.asarray(ids, np.int64))
    return b


def messages_of(keys: SeriesKeys, batch: SampleBatch, acknowledge: bool = True) -> list[bytes]:
    """What the publisher puts on the log for one write (one message per partition)."""
    pub = LogPublisher(ClusterSettings(partitions=keys.partitions))
    pub.keys = keys
    group = _Group()
    bk = keys.lookup(batch)
    group.writes.append((batch, bk, partitions.split(batch, bk.part)))
    msgs, defined = pub._messages(group)
    if acknowledge:
        for k, positions in defined:
            keys.acknowledged(k, positions)
    return [m for _, m in msgs]


def test_log_message_round_trip_keeps_values_bit_exact():
    h1, h2 = log_refs([b"a", b"b"])
    vs = np.array([1.5, STALE, np.nan, -0.0])
    data = columns_codec.encode_log_message(h1[[0, 1, 1, 0]], h2[[0, 1, 1, 0]], [b'[["__name__","a"]]', None, None, None],
                                            np.array([1, 2, 3, 4]), vs, tenant="team-a")
    part = columns_codec.decode_log_message(data)
    assert part.tenant == "team-a" and part.keys == [b'[["__name__","a"]]', None, None, None]
    assert (part.h1 == h1[[0, 1, 1, 0]]).all() and (part.h2 == h2[[0, 1, 1, 0]]).all()
    assert part.timestamps.tolist() == [1, 2, 3, 4]
    assert part.values.view(np.uint64).tolist() == vs.view(np.uint64).tolist()


def test_label_keys_travel_once_per_series_and_period():
    keys = SeriesKeys(4)
    sp = Space()
    first = [columns_codec.decode_log_message(m) for m in messages_of(keys, batch_of(list(range(50)), 1000, sp))]
    assert sum(k is not None for p in first for k in p.keys) == 50
    second_parts = [columns_codec.decode_log_message(m) for m in messages_of(keys, batch_of(list(range(50)), 2000, sp))]
    assert all(k is None for p in second_parts for k in p.keys)  # known series: references only
    assert sum(len(p.h1) for p in second_parts) == 50
    # a definition that was not acknowledged is sent again
    unacked = [columns_codec.decode_log_message(m) for m in messages_of(keys, batch_of([60, 61], 3000, sp), acknowledge=False)]
    again = [columns_codec.decode_log_message(m) for m in messages_of(keys, batch_of([60, 61], 4000, sp))]
    assert sum(k is not None for p in unacked for k in p.keys) == 2 and sum(k is not None for p in again for k in p.keys) == 2
    # the partition is CRC-32 of the label key, as on the read side
    bk = keys.lookup(batch_of([5], 5000, sp))
    assert int(bk.part[0]) == int(partitions.partitions_of(columns_codec.label_keys([labels(5)]), 4)[0])


def test_writes_published_together_share_one_message_per_partition():
    keys = SeriesKeys(4)
    pub = LogPublisher(ClusterSettings(partitions=4))
    pub.keys = keys
    group = _Group()
    sp = Space()
    for b in (batch_of(list(range(40)), 1000, sp), batch_of(list(range(40, 80)), 1000, sp), batch_of(list(range(10)), 2000, sp)):
        bk = keys.lookup(b)
        group.writes.append((b, bk, partitions.split(b, bk.part)))
    msgs, _ = pub._messages(group)
    assert sorted(p for p, _ in msgs) == [0, 1, 2, 3]  # 3 writes, one message per partition
    parts = [columns_codec.decode_log_message(m) for _, m in msgs]
    assert sum(len(p.timestamps) for p in parts) == 90
    # each write defines the series new to it (series 0..9 twice: redundant, never missing)
    assert sum(k is not None for p in parts for k in p.keys) == 90
    # a write whose series repeats in it defines it at its first sample only
    b = SampleBatch([labels(1)], np.zeros(3, np.int64), np.array([1, 2, 3]), np.zeros(3))
    keys2 = SeriesKeys(4)
    (part,) = [columns_codec.decode_log_message(m) for m in messages_of(keys2, b)]
    assert part.keys[0] is not None and part.keys[1:] == [None, None]


def test_redefinition_period_is_staggered_by_reference():
    h1, _ = log_refs([str(i).encode() for i in range(1000)])
    now = 1_760_000_000
    a, b = series_dictionary.period_of(h1, now), series_dictionary.period_of(h1, now + 1)
    changed = (a != b).mean()
    assert 0 < changed < 0.05  # about 1/REDEFINE_S of the series become due each second, not all at once
    later = series_dictionary.period_of(h1, now + series_dictionary.REDEFINE_S)
    assert (later == a + 1).all()


def test_batches_without_a_reference_space_get_one():
    keys = SeriesKeys(8)
    m1 = messages_of(keys, batch_of([1, 2, 3], 1000))
    m2 = [columns_codec.decode_log_message(m) for m in messages_of(keys, batch_of([3, 2, 1], 2000))]
    assert all(k is None for p in m2 for k in p.keys) and len(m1) == len(m2)


def test_dictionary_resolves_defines_and_rebuilds_from_storage(tmp_path):
    keys = SeriesKeys(2)
    sp = Space()
    with TSDB(str(tmp_path / "db"), background=False) as db:
        d = SeriesDictionary(lambda: db.series([[Matcher("__name__", "=~", ".*")]], -(1 << 62), 1 << 62))

        def apply(msgs: list[bytes]) -> SampleBatch:
            parts = [columns_codec.decode_log_message(m) for m in msgs]
            local = d.define(np.concatenate([p.h1 for p in parts]), np.concatenate([p.h2 for p in parts]),
                             [k for p in parts for k in p.keys])
            assert (local >= 0).all()
            uniq, si = np.unique(local, return_inverse=True)
            b = SampleBatch(d.labels_of(uniq), si, np.concatenate([p.timestamps for p in parts]),
                            np.concatenate([p.values for p in parts]), series_refs=SeriesRefColumn(d.space, uniq))
            db.append(b)
            return b

        b1 = apply(messages_of(keys, batch_of(list(range(20)), 1000, sp)))
        assert sorted(b1.series) == sorted(labels(i) for i in range(20)) and len(d) == 20
        apply(messages_of(keys, batch_of(list(range(20)), 2000, sp)))  # references only
        assert len(d) == 20
        got = db.select([Matcher("__name__", "=", "m1")], 0, 10_000)
        assert len(got.labels) == 7 and got.num_samples == 14
        # a restarted ingester: an empty dictionary, storage has the series, the log only references them
        d2 = SeriesDictionary(lambda: db.series([[Matcher("__name__", "=~", ".*")]], -(1 << 62), 1 << 62))
        parts = [columns_codec.decode_log_message(m) for m in messages_of(keys, batch_of(list(range(20)), 3000, sp))]
        h1 = np.concatenate([p.h1 for p in parts])
        local = d2.define(h1, np.concatenate([p.h2 for p in parts]), [k for p in parts for k in p.keys])
        assert (local >= 0).all() and d2.rebuilt
        assert sorted(d2.labels_of(local)) == sorted(labels(i) for i in range(20))
        # a series defined nowhere stays unknown (-1), and the rebuild is not repeated for it
        h1x, h2x = log_refs([b'[["__name__","never"]]'])
        assert d2.define(h1x, h2x, [None]).tolist() == [-1]


def test_dictionary_resolves_a_reference_defined_earlier_in_the_same_call():
    d = SeriesDictionary(lambda: pytest.fail("nothing is missing: no rebuild from storage"))
    h1, h2 = log_refs([b'[["a","1"]]', b'[["a","2"]]'])
    # two messages drained together: the first defines both series, the second only references them
    refs = d.define(np.r_[h1, h1[::-1]], np.r_[h2, h2[::-1]], [b'[["a","1"]]', b'[["a","2"]]', None, None])
    assert refs.tolist() == [0, 1, 1, 0] and not d.rebuilt


def test_dictionary_tells_series_apart_whose_first_halves_collide():
    d = SeriesDictionary(lambda: [])
    h1 = np.array([7, 7], np.uint64)
    h2 = np.array([1, 2], np.uint64)
    refs = d.define(h1, h2, [b'[["a","1"]]', b'[["a","2"]]'])
    assert refs[0] != refs[1] and d.collisions == 1
    assert d.labels_of(d.define(h1[::-1], h2[::-1], [None, None])) == [(("a", "2"),), (("a", "1"),)]


def test_earlier_log_format_replays_as_defined_series():
    keys = columns_codec.label_keys([labels(1), labels(2)])
    old = columns_codec.encode(keys, np.array([0, 1, 1]), np.array([10, 20, 30]), np.array([1.0, 2.0, 3.0]), tenant="team-b")
    part = columns_codec.decode_log_message(old)
    assert part.keys == [keys[0], keys[1], keys[1]] and part.tenant == "team-b" and part.timestamps.tolist() == [10, 20, 30]
    h1, h2 = log_refs(keys)
    assert part.h1.tolist() == h1[[0, 1, 1]].tolist() and part.h2.tolist() == h2[[0, 1, 1]].tolist()


def test_dictionary_lookup_stays_exact_across_sorted_refreshes():
    d = SeriesDictionary(lambda: [])
    keys = [f'[["i","{i}"]]'.encode() for i in range(3000)]
    h1, h2 = log_refs(keys)
    for lo in range(0, 3000, 500):  # grows in steps: sorted columns refreshed in between
        d.define(h1[lo:lo + 500], h2[lo:lo + 500], keys[lo:lo + 500])
    order = np.random.default_rng(1).permutation(3000)
    refs = d.define(h1[order], h2[order], [None] * 3000)
    assert [d.labels[r] for r in refs.tolist()] == [(("i", str(i)),) for i in order.tolist()]


@pytest.mark.parametrize("tenant", ["default", "team-a"])
def test_tenants_label_sets_have_their_own_references(tenant):
    keys = SeriesKeys(16)
    a = keys.lookup(batch_of([1], 1000, Space()))
    b = keys.lookup(batch_of([1], 1000, Space(), tenant=tenant))
    assert (a.h1[0] == b.h1[0]) == (tenant == "default")
