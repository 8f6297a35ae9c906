"""Errors of the REST API: always ``{"error": {"code", "message", "details"?}}``, whatever went wrong.

Routes raise ``ApiError``; the handlers installed by ``install_error_handlers`` turn it, FastAPI's request
validation errors and Starlette's HTTP errors into that one shape. ``ERRORS`` documents them in OpenAPI.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from weightstream.jobs.api.views import ErrorBody, ErrorDetail

__all__ = ["ERRORS", "ApiError", "error_doc", "error_response", "install_error_handlers"]


class ApiError(Exception):
    def __init__(
        self, status: int, code: str, message: str, details: list[dict[str, Any]] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.details = status, code, message, details


def error_response(
    status: int,
    code: str,
    message: str,
    details: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = ErrorBody(error=ErrorDetail(code=code, message=message, details=details))
    return JSONResponse(body.model_dump(exclude_none=True), status_code=status, headers=headers)


def error_doc(description: str) -> dict[str, Any]:
    # content given explicitly: otherwise FastAPI documents an error under the route's own media type
    # (text/plain, a file, an event stream), but errors are always JSON
    return {"model": ErrorBody, "description": description, "content": {"application/json": {}}}


ERRORS: dict[int | str, dict[str, Any]] = {
    401: error_doc("missing or wrong bearer token"),
    404: error_doc("no such job"),
    413: error_doc("request body too large"),
    422: error_doc("the request does not match the schema"),
}


async def _api_error(request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, ApiError)
    headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
    return error_response(e.status, e.code, e.message, e.details, headers)


async def _invalid(request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, RequestValidationError)
    details = [{"path": ".".join(str(p) for p in err["loc"]), "message": err["msg"]} for err in e.errors()]
    return error_response(422, "invalid_request", "the request does not match the API's schema", details)


async def _http(request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, StarletteHTTPException)
    return error_response(e.status_code, "http_error", str(e.detail))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http)
