"""Remote-write and remote-read message classes built from descriptors written here (see remote.proto).

The build machine has no protoc, so instead of committing generated ``_pb2`` code we describe
the messages with ``descriptor_pb2`` and let the ``protobuf`` runtime (upb backend) create the
classes. Wire format is exactly that of the public specification.
"""
from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_T = {
    "string": _F.TYPE_STRING, "bytes": _F.TYPE_BYTES, "double": _F.TYPE_DOUBLE,
    "int64": _F.TYPE_INT64, "uint32": _F.TYPE_UINT32, "enum": _F.TYPE_ENUM, "msg": _F.TYPE_MESSAGE,
    "bool": _F.TYPE_BOOL,
}

_POOL = descriptor_pool.DescriptorPool()


def _msg(fdp: descriptor_pb2.FileDescriptorProto, name: str, fields: list[tuple], enums: dict | None = None) -> None:
    m = fdp.message_type.add(name=name)
    for enum_name, values in (enums or {}).items():
        e = m.enum_type.add(name=enum_name)
        for i, v in enumerate(values):
            e.value.add(name=v, number=i)
    for fname, num, typ, repeated, *ref in fields:
        f = m.field.add(name=fname, number=num, type=_T[typ],
                        label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
        if ref:
            f.type_name = ref[0]
        if repeated and typ == "uint32":
            f.options.packed = True


def _build_v1() -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto(name="turboprom/remote_v1.proto", package="prometheus", syntax="proto3")
    _msg(fdp, "Label", [("name", 1, "string", False), ("value", 2, "string", False)])
    _msg(fdp, "Sample", [("value", 1, "double", False), ("timestamp", 2, "int64", False)])
    _msg(fdp, "Exemplar", [("labels", 1, "msg", True, ".prometheus.Label"), ("value", 2, "double", False),
                           ("timestamp", 3, "int64", False)])
    _msg(fdp, "TimeSeries", [("labels", 1, "msg", True, ".prometheus.Label"),
                             ("samples", 2, "msg", True, ".prometheus.Sample"),
                             ("exemplars", 3, "msg", True, ".prometheus.Exemplar"),
                             ("histograms", 4, "bytes", True)])
    _msg(fdp, "MetricMetadata", [("type", 1, "enum", False, ".prometheus.MetricMetadata.MetricType"),
                                 ("metric_family_name", 2, "string", False), ("help", 4, "string", False),
                                 ("unit", 5, "string", False)],
         enums={"MetricType": ["UNKNOWN", "COUNTER", "GAUGE", "HISTOGRAM", "GAUGEHISTOGRAM", "SUMMARY", "INFO", "STATESET"]})
    _msg(fdp, "WriteRequest", [("timeseries", 1, "msg", True, ".prometheus.TimeSeries"),
                               ("metadata", 3, "msg", True, ".prometheus.MetricMetadata")])
    _msg(fdp, "RawTimeSeries", [("labels", 1, "bytes", True), ("samples", 2, "bytes", True),
                                ("exemplars", 3, "bytes", True), ("histograms", 4, "bytes", True)])
    _msg(fdp, "RawWriteRequest", [("timeseries", 1, "msg", True, ".prometheus.RawTimeSeries"),
                                  ("metadata", 3, "msg", True, ".prometheus.MetricMetadata")])
    _msg(fdp, "SplitWriteRequest", [("timeseries", 1, "bytes", True),
                                    ("metadata", 3, "msg", True, ".prometheus.MetricMetadata")])
    return fdp


def _build_v2() -> descriptor_pb2.FileDescriptorProto:
    p = ".io.prometheus.write.v2."
    fdp = descriptor_pb2.FileDescriptorProto(name="turboprom/remote_v2.proto", package="io.prometheus.write.v2", syntax="proto3")
    _msg(fdp, "Sample", [("value", 1, "double", False), ("timestamp", 2, "int64", False)])
    _msg(fdp, "Exemplar", [("labels_refs", 1, "uint32", True), ("value", 2, "double", False),
                           ("timestamp", 3, "int64", False)])
    _msg(fdp, "Metadata", [("type", 1, "enum", False, p + "Metadata.MetricType"), ("help_ref", 3, "uint32", False),
                           ("unit_ref", 4, "uint32", False)],
         enums={"MetricType": ["METRIC_TYPE_UNSPECIFIED", "METRIC_TYPE_COUNTER", "METRIC_TYPE_GAUGE",
                               "METRIC_TYPE_HISTOGRAM", "METRIC_TYPE_GAUGEHISTOGRAM", "METRIC_TYPE_SUMMARY",
                               "METRIC_TYPE_INFO", "METRIC_TYPE_STATESET"]})
    _msg(fdp, "TimeSeries", [("labels_refs", 1, "uint32", True), ("samples", 2, "msg", True, p + "Sample"),
                             ("histograms", 3, "bytes", True), ("exemplars", 4, "msg", True, p + "Exemplar"),
                             ("metadata", 5, "msg", False, p + "Metadata"), ("created_timestamp", 6, "int64", False)])
    _msg(fdp, "Request", [("symbols", 4, "string", True), ("timeseries", 5, "msg", True, p + "TimeSeries")])
    _msg(fdp, "RawTimeSeries", [("labels_refs", 1, "uint32", True), ("samples", 2, "bytes", True),
                                ("histograms", 3, "bytes", True), ("exemplars", 4, "bytes", True),
                                ("metadata", 5, "msg", False, p + "Metadata"), ("created_timestamp", 6, "int64", False)])
    _msg(fdp, "RawRequest", [("symbols", 4, "string", True), ("timeseries", 5, "msg", True, p + "RawTimeSeries")])
    return fdp


def _build_read() -> descriptor_pb2.FileDescriptorProto:
    """Remote read (prompb/remote.proto and types.proto): requests, sample and chunked responses."""
    fdp = descriptor_pb2.FileDescriptorProto(name="turboprom/remote_read.proto", package="prometheus", syntax="proto3",
                                             dependency=["turboprom/remote_v1.proto"])
    _msg(fdp, "LabelMatcher", [("type", 1, "enum", False, ".prometheus.LabelMatcher.Type"), ("name", 2, "string", False),
                               ("value", 3, "string", False)], enums={"Type": ["EQ", "NEQ", "RE", "NRE"]})
    _msg(fdp, "ReadHints", [("step_ms", 1, "int64", False), ("func", 2, "string", False), ("start_ms", 3, "int64", False),
                            ("end_ms", 4, "int64", False), ("grouping", 5, "string", True), ("by", 6, "bool", False),
                            ("range_ms", 7, "int64", False)])
    _msg(fdp, "Query", [("start_timestamp_ms", 1, "int64", False), ("end_timestamp_ms", 2, "int64", False),
                        ("matchers", 3, "msg", True, ".prometheus.LabelMatcher"), ("hints", 4, "msg", False, ".prometheus.ReadHints")])
    _msg(fdp, "ReadRequest", [("queries", 1, "msg", True, ".prometheus.Query"),
                              ("accepted_response_types", 2, "enum", True, ".prometheus.ReadRequest.ResponseType")],
         enums={"ResponseType": ["SAMPLES", "STREAMED_XOR_CHUNKS"]})
    _msg(fdp, "QueryResult", [("timeseries", 1, "msg", True, ".prometheus.TimeSeries")])
    _msg(fdp, "ReadResponse", [("results", 1, "msg", True, ".prometheus.QueryResult")])
    _msg(fdp, "Chunk", [("min_time_ms", 1, "int64", False), ("max_time_ms", 2, "int64", False),
                        ("type", 3, "enum", False, ".prometheus.Chunk.Encoding"), ("data", 4, "bytes", False)],
         enums={"Encoding": ["UNKNOWN", "XOR", "HISTOGRAM", "FLOAT_HISTOGRAM"]})
    _msg(fdp, "ChunkedSeries", [("labels", 1, "msg", True, ".prometheus.Label"), ("chunks", 2, "msg", True, ".prometheus.Chunk")])
    _msg(fdp, "ChunkedReadResponse", [("chunked_series", 1, "msg", True, ".prometheus.ChunkedSeries"),
                                      ("query_index", 2, "int64", False)])
    return fdp


_POOL.Add(_build_v1())
_POOL.Add(_build_v2())
_POOL.Add(_build_read())


def _cls(full_name: str):
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(full_name))


# remote write 1.0
WriteRequest = _cls("prometheus.WriteRequest")
TimeSeries = _cls("prometheus.TimeSeries")
Label = _cls("prometheus.Label")
Sample = _cls("prometheus.Sample")
Exemplar = _cls("prometheus.Exemplar")
MetricMetadata = _cls("prometheus.MetricMetadata")
RawWriteRequest = _cls("prometheus.RawWriteRequest")
SplitWriteRequest = _cls("prometheus.SplitWriteRequest")  # each TimeSeries as raw bytes (ingest/rw_fast.py)

# remote write 2.0
V2Request = _cls("io.prometheus.write.v2.Request")
V2TimeSeries = _cls("io.prometheus.write.v2.TimeSeries")
V2Sample = _cls("io.prometheus.write.v2.Sample")
V2Metadata = _cls("io.prometheus.write.v2.Metadata")
V2RawRequest = _cls("io.prometheus.write.v2.RawRequest")
V2Exemplar = _cls("io.prometheus.write.v2.Exemplar")
V1Exemplar = Exemplar

# remote read
ReadRequest = _cls("prometheus.ReadRequest")
ReadResponse = _cls("prometheus.ReadResponse")
ReadQuery = _cls("prometheus.Query")
LabelMatcher = _cls("prometheus.LabelMatcher")
QueryResult = _cls("prometheus.QueryResult")
ChunkedReadResponse = _cls("prometheus.ChunkedReadResponse")
ChunkedSeries = _cls("prometheus.ChunkedSeries")
Chunk = _cls("prometheus.Chunk")

V1_TYPE_NAMES = ["unknown", "counter", "gauge", "histogram", "gaugehistogram", "summary", "info", "stateset"]
V2_TYPE_NAMES = V1_TYPE_NAMES  # same order; 0 = unspecified -> unknown
