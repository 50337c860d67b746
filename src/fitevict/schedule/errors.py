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


class Busy(SupervisorError):
    """The queue for a model is full, a wait ran past its bound, or fitevict is shutting down: retry later."""

    status = 503

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after
