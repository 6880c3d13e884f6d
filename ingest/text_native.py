"""A target's scrape bodies through the compiled text walk (``RefTable.walk_text`` in
ingest/csrc/rw_native.c), with its series texts kept in the same kind of reference table remote
write uses.

Why: the column-wise parser (text_format.parse_text) still splits the body into one Python string
per line and builds Arrow arrays of them on every scrape; a target's series texts are the same
from one scrape to the next, so the compiled walk hashes each sample line's series text and looks
it up, and only texts never seen from this target become Python strings. The comment lines
(HELP/TYPE/UNIT) come back as one bytes object: when they equal the last scrape's, its metadata is
reused; otherwise the body goes through parse_text once (which validates them and names any bad
line) and its metadata is kept.

``TextRefs.parse`` returns the ``ParsedText`` parse_text would return for the same body, or None
for anything outside the plain shape the walk takes (OpenMetrics, exemplars, quoted metric names,
odd spellings, errors): the caller then uses parse_text itself. tests/test_ingest_text_native.py
checks the two agree on a fuzz corpus.
"""
from __future__ import annotations

from operator import itemgetter

import numpy as np

from ingest.remote_write import _first_occurrence
from ingest.series_refs import NativeRefTable, native_default
from ingest.text_format import ParsedText, parse_text
from storage.batch import MetricMetadata


class TextRefs:
    """One target's series texts -> references (compiled table), the texts by reference, and the
    metadata of the last comment block seen."""

    def __init__(self) -> None:
        if NativeRefTable is None:
            raise RuntimeError("the compiled walk (ingest._rw_native) is not built: run `make install`")
        self.table = NativeRefTable()
        self.keys: list[str] = []  # by reference
        self._comments: bytes | None = None
        self._meta: list[MetricMetadata] = []

    def __len__(self) -> int:
        return len(self.keys)

    def parse(self, body: bytes, openmetrics: bool = False) -> ParsedText | None:
        if openmetrics:
            return None
        got = self.table.walk_text(body)
        if got is None:
            return None
        refs_b, off_b, len_b, val_b, ts_b, has_b, line_b, comments = got
        if comments != self._comments:  # first scrape or changed HELP/TYPE: the parser checks them
            full = parse_text(body, openmetrics=None)
            # one list per comment block, shared by the scrapes that repeat it (the metadata store
            # skips a list it has just recorded); nobody mutates a batch's metadata
            self._comments, self._meta = comments, full.metadata
        refs = np.frombuffer(refs_b, np.int64)
        new = np.flatnonzero(refs < 0)
        if len(new):
            off, ln = np.frombuffer(off_b, np.int64), np.frombuffer(len_b, np.int64)
            insert, keys = self.table.insert, self.keys
            for i in new.tolist():
                key = body[int(off[i]):int(off[i]) + int(ln[i])]
                ref = insert(key)
                if ref == len(keys):
                    keys.append(key.decode("utf-8"))
                refs[i] = ref
        uniq, sidx = _first_occurrence(refs)
        n = len(uniq)
        keys_now = [self.keys[int(uniq[0])]] if n == 1 else list(itemgetter(*uniq.tolist())(self.keys)) if n else []
        return ParsedText(keys_now, sidx, np.frombuffer(val_b, np.float64), np.frombuffer(ts_b, np.int64),
                          np.frombuffer(has_b, np.int64).astype(bool), np.frombuffer(line_b, np.int64),
                          self._meta, [], refs=uniq)


def text_refs_default() -> TextRefs | None:
    """A table for a new target when the compiled walk is built and not switched off
    (``TURBOPROM_RW_NATIVE=0``), else None (parse_text alone)."""
    return TextRefs() if native_default() else None
