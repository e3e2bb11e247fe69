"""How every error answers: `{"code", "message"}`, and for a body that fails validation a 422 whose message
names the first field and what to change, with all of them under "errors". The console words a form's
validation errors with the same function, so a form says what the API would."""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from astraeus.server.services import ApiError, InvalidBody


def error_json(status: int, code: str, message: str, **extra) -> JSONResponse:
    return JSONResponse({"code": code, "message": message, **extra}, status_code=status)


def _loc(loc) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (("." if out else "") + p)
    return out or "body"


def validation_errors(errors: Iterable[dict]) -> tuple[str, list[dict]]:
    """Pydantic's errors → (the one-line message, [{"field", "message"}, ...])."""
    out = []
    for e in errors:
        where = _loc(e.get("loc", ()))
        msg = e.get("msg", "invalid")
        if e.get("type") == "extra_forbidden":
            msg = "unknown field: remove it or check its spelling"
        elif e.get("type") == "missing":
            msg = "field required"
        msg = msg.removeprefix("Value error, ")
        out.append({"field": where, "message": msg})
    first = out[0] if out else {"field": "body", "message": "invalid"}
    return f"{first['field']}: {first['message']}", out


def validation_message(e: ValidationError | RequestValidationError, prefix: tuple = ()) -> tuple[str, list[dict]]:
    """As the API words `e`; `prefix` is where the validated model sits in the API's body (a form that builds
    one part of it, e.g. ("clusters", "gpu") for one workspace's access)."""
    return validation_errors({**err, "loc": (*prefix, *err.get("loc", ()))} for err in e.errors())


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return error_json(exc.status, exc.code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        message, errors = validation_errors(exc.errors())
        return error_json(422, "INVALID", message, errors=errors)

    @app.exception_handler(InvalidBody)
    async def _invalid_body(request: Request, exc: InvalidBody):  # checked below the router: the same 422
        message, errors = validation_errors(exc.errors)
        return error_json(422, "INVALID", message, errors=errors)
