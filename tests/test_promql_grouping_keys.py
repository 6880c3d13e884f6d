"""Aggregation grouping keys: remembered per label set across evaluations (a dashboard aggregates the
same series at every refresh), equal to the keys built from scratch, and bounded in memory."""
from __future__ import annotations

import numpy as np

import promql.eval_labels as el
from promql.eval_labels import dense_ids, grouping_keys, grouping_labels
from storage.labels import make_labels


def _fleet(n: int) -> list:
    return [make_labels({"__name__": "vllm:time_to_first_token_seconds_bucket", "instance": f"10.0.0.{i % 63}:8000",
                         "model_name": f"m{i % 7}", "le": str(i % 23), "pod": f"p{i}"}) for i in range(n)]


def test_grouping_keys_equal_the_labels_built_from_scratch_on_every_call():
    labels = _fleet(500)
    for names, without in ((["le", "model_name"], False), (["pod"], True), ([], True), (["__name__"], False),
                           (["nothing"], False)):
        want = [grouping_labels(l, names, without) for l in labels]
        assert grouping_keys(labels, names, without) == want
        assert grouping_keys(labels, names, without) == want  # from the memo
        # the same label sets in another order and with new ones among them
        mixed = labels[::-1][:200] + _fleet(700)[500:]
        assert grouping_keys(mixed, names, without) == [grouping_labels(l, names, without) for l in mixed]
    assert grouping_keys(labels, [], False) == [()] * len(labels)


def test_the_memo_is_bounded_over_all_groupings(monkeypatch):
    monkeypatch.setattr(el, "_GROUPING_CAPACITY", 1_000)
    monkeypatch.setattr(el, "_grouping_memo", {})
    monkeypatch.setattr(el, "_grouping_size", [0])
    labels = _fleet(600)
    for names in (["le"], ["pod"], ["instance"], ["model_name"]):
        keys = grouping_keys(labels, names, False)
        assert keys == [grouping_labels(l, names, False) for l in labels]
        assert el._grouping_size[0] <= 1_000
        assert sum(len(m) for m in el._grouping_memo.values()) <= 1_000


def test_dense_ids_number_keys_in_order_of_first_appearance():
    ids, uniq = dense_ids(["b", "a", "b", "c", "a", "b"])
    assert ids.tolist() == [0, 1, 0, 2, 1, 0] and uniq == ["b", "a", "c"]
    ids, uniq = dense_ids([])
    assert ids.dtype == np.int64 and len(ids) == 0 and uniq == []
