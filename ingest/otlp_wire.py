"""OTLP/HTTP bodies for metrics: requests in binary protobuf or JSON, answers in the request's encoding.

Messages are the ``opentelemetry-proto`` package's generated classes (upb runtime). JSON follows the
OTLP/HTTP rules on top of protobuf's JSON mapping: trace and span ids are hex strings (not base64),
enums may be integers, unknown fields are ignored; the hex ids are turned into protobuf's base64
before ``json_format`` parses the rest. Errors are answered with a ``google.rpc.Status`` (``code``,
``message``) as the OTLP/HTTP specification asks; the JSON form also carries Prometheus's
``status``/``errorType``/``error`` fields so Prometheus-style clients read the same message.
"""
from __future__ import annotations

import base64
import binascii
import json

from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (ExportMetricsServiceRequest,
                                                                          ExportMetricsServiceResponse)

from ingest.errors import IngestError

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

# HTTP status -> google.rpc.Code
_RPC_CODE = {400: 3, 408: 4, 413: 3, 415: 3, 429: 8, 503: 14, 500: 13}


def content_kind(content_type: str) -> str | None:
    """``PROTOBUF`` or ``JSON`` from a Content-Type header; None when it is neither."""
    base = content_type.split(";", 1)[0].strip().lower()
    if base in (PROTOBUF, "application/protobuf"):
        return PROTOBUF
    if base == JSON:
        return JSON
    return None


def _hex_ids(node) -> None:
    """Turn the OTLP-JSON hex ``traceId``/``spanId`` of exemplars into protobuf-JSON base64, in place."""
    if isinstance(node, dict):
        for key in ("traceId", "spanId", "trace_id", "span_id"):
            v = node.get(key)
            if isinstance(v, str):
                try:
                    node[key] = base64.b64encode(bytes.fromhex(v)).decode()
                except ValueError:
                    raise IngestError("bad_json", f"OTLP JSON: {key} {v[:40]!r} is not a hex string") from None
        for v in node.values():
            if isinstance(v, (dict, list)):
                _hex_ids(v)
    elif isinstance(node, list):
        for v in node:
            if isinstance(v, (dict, list)):
                _hex_ids(v)


def decode_request(body: bytes, kind: str) -> ExportMetricsServiceRequest:
    req = ExportMetricsServiceRequest()
    if kind == PROTOBUF:
        try:
            req.ParseFromString(body)
        except Exception as e:  # noqa: BLE001 - google.protobuf.message.DecodeError
            raise IngestError("bad_protobuf", f"protobuf: cannot decode opentelemetry ExportMetricsServiceRequest: {e}") from None
        return req
    try:
        doc = json.loads(body)
        if not isinstance(doc, dict):
            raise IngestError("bad_json", "OTLP JSON: the body must be an ExportMetricsServiceRequest object")
        _hex_ids(doc)
        json_format.ParseDict(doc, req, ignore_unknown_fields=True)
    except RecursionError:
        raise IngestError("bad_json", "OTLP JSON: nested too deeply") from None
    except UnicodeDecodeError as e:
        raise IngestError("bad_json", f"OTLP JSON: not valid UTF-8: {e}") from None
    except json.JSONDecodeError as e:
        raise IngestError("bad_json", f"OTLP JSON: not valid JSON: {e}") from None
    except (json_format.ParseError, binascii.Error, ValueError, TypeError) as e:
        raise IngestError("bad_json", f"OTLP JSON: {e}") from None
    return req


def response_body(kind: str, rejected_points: int = 0, message: str = "") -> bytes:
    """An ExportMetricsServiceResponse; ``partial_success`` set when points were refused or there is a warning."""
    resp = ExportMetricsServiceResponse()
    if rejected_points or message:
        resp.partial_success.rejected_data_points = rejected_points
        resp.partial_success.error_message = message
    if kind == JSON:
        return json_format.MessageToJson(resp, indent=None).encode()
    return resp.SerializeToString()


def status_body(kind: str, http_status: int, message: str) -> bytes:
    code = _RPC_CODE.get(http_status, 3 if http_status < 500 else 13)
    if kind == JSON:
        return json.dumps({"code": code, "message": message, "status": "error",
                           "errorType": "unavailable" if http_status in (429, 503) else "bad_data", "error": message}).encode()
    return status_pb2.Status(code=code, message=message).SerializeToString()
