"""The supervisor's errors, which the front door maps onto HTTP statuses. Each says what, the numbers, and what to do."""

from __future__ import annotations

from typing import Any


class SupervisorError(RuntimeError):
    """Base for errors the front door maps onto HTTP statuses."""

    status = 500


class LoadFailed(SupervisorError):
    status = 502


class Refused(SupervisorError):
    status = 507  # Insufficient Storage: the model does not fit the budget

    def __init__(self, plan: Any, message: str) -> None:
        super().__init__(message)
        self.plan = plan


class ModelUnreadable(SupervisorError):
    """A model's file cannot be read when its price is read for a load (truncated, gone, not a model any more),
    though it could when the request was read: answered as the front door answers an unreadable file."""

    status = 500

    def __init__(self, key: str, why: object) -> None:
        super().__init__(unreadable_message(key, why))


def unreadable_message(key: str, why: object) -> str:
    """The one wording of a model whose file cannot be read: which, why, and what to do."""
    return (f"model {key!r}: its file cannot be read ({why}); replace or remove the file, then rescan the models "
            "(POST /v1/models/rescan, or SIGHUP)")


class Busy(SupervisorError):
    """The queue for a model is full, a wait ran past its bound, or fitevict is shutting down: retry later."""

    status = 503

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RateLimited(SupervisorError):
    """A client (an API key) has as many requests waiting as its key allows: retry after the wait stated."""

    status = 429

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after
