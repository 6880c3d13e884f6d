"""The HTTP layer's errors: Prometheus's error envelope and the exception types route code raises.

Every endpoint that answers an error -- API routes, the ingest and congestion fast paths, the
auth and body-timeout middleware, the cluster's partition reads -- builds it here, so every error
body has Prometheus's shape (``{"status":"error","errorType":...,"error":...}``, served as exactly
``application/json``) and the status code follows the error type the way Prometheus maps it.
"""
from __future__ import annotations

from aiohttp import web

from turboprom import api_json

JSON = "application/json"

# Prometheus's status code for each errorType.
STATUS_BY_ERROR_TYPE = {
    "bad_data": 400,
    "execution": 422,
    "canceled": 503,
    "timeout": 503,
    "internal": 500,
    "unavailable": 503,
    "not_found": 404,
}


class APIError(Exception):
    """An error answered with Prometheus's envelope: ``error_type``, ``message`` and the HTTP status
    (by default the one Prometheus uses for the type)."""

    def __init__(self, error_type: str, message: str, status: int | None = None):
        super().__init__(message)
        self.error_type = error_type
        self.message = message
        self.status = status or STATUS_BY_ERROR_TYPE.get(error_type, 500)


class ParamError(APIError):
    """A request parameter or body the caller got wrong: ``bad_data`` with HTTP 400."""

    def __init__(self, message: str):
        super().__init__("bad_data", message, 400)


def error_response(error_type: str, message: str, status: int | None = None,
                   headers: dict[str, str] | None = None) -> web.Response:
    """Prometheus's error envelope as a response (status from the error type unless given)."""
    code = status or STATUS_BY_ERROR_TYPE.get(error_type, 500)
    hdrs = {"Content-Type": JSON}
    if headers:
        hdrs.update(headers)
    return web.Response(body=api_json.error(error_type, message), status=code, headers=hdrs)
