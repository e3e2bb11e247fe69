"""The refusals the services raise: ApiError (a status, a code, a message the routers answer as JSON) and InvalidBody
(a body that fails the API's validation below the routers)."""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class InvalidBody(Exception):
    """A body that fails the API's validation, raised below the routers (a template's fields merged into a run's):
    `errors` are pydantic's, `prefix` where the checked part sits in the body. Routers answer it as FastAPI's own
    validation errors are: a 422 naming the first field."""

    def __init__(self, errors: list[dict], prefix: tuple = ()):
        super().__init__(f"invalid body: {errors[:1]}")
        self.errors = [{**e, "loc": (*prefix, *e.get("loc", ()))} for e in errors]
