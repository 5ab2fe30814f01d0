"""Errors of the client: one class per error code of the contract."""

from __future__ import annotations

from typing import Any, Optional


class IdemError(Exception):
    """An error answered by the store (or its transport), with the contract's code."""

    def __init__(self, code: str, message: str, status: int = 0, retry_after: float = 0.0):
        super().__init__(message)
        self.code = code
        self.status = status
        #: Retry-After of the answer in seconds (0 when none).
        self.retry_after = retry_after


class InvalidArgumentError(IdemError):
    pass


class UnauthenticatedError(IdemError):
    pass


class PermissionDeniedError(IdemError):
    pass


class NotFoundError(IdemError):
    pass


class NotOwnerError(IdemError):
    pass


class FailedPreconditionError(IdemError):
    pass


class PayloadTooLargeError(IdemError):
    pass


class ResourceExhaustedError(IdemError):
    pass


class UnavailableError(IdemError):
    pass


class InternalError(IdemError):
    pass


class GoneError(IdemError):
    pass


_BY_CODE = {
    "INVALID_ARGUMENT": InvalidArgumentError,
    "UNAUTHENTICATED": UnauthenticatedError,
    "PERMISSION_DENIED": PermissionDeniedError,
    "NOT_FOUND": NotFoundError,
    "NOT_OWNER": NotOwnerError,
    "FAILED_PRECONDITION": FailedPreconditionError,
    "PAYLOAD_TOO_LARGE": PayloadTooLargeError,
    "RESOURCE_EXHAUSTED": ResourceExhaustedError,
    "UNAVAILABLE": UnavailableError,
    "INTERNAL": InternalError,
    "GONE": GoneError,
}

_BY_STATUS = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
    409: "NOT_OWNER", 410: "GONE", 413: "PAYLOAD_TOO_LARGE", 429: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE",
}


def error_from_answer(status: int, body: Any, retry_after: float) -> IdemError:
    """The error for a non-2xx answer of the API."""
    err = body.get("error") if isinstance(body, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    message = err.get("message") if isinstance(err, dict) else None
    if not isinstance(code, str):
        code = _BY_STATUS.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT")
    if not isinstance(message, str):
        message = f"HTTP {status}"
    cls = _BY_CODE.get(code, IdemError)
    if not status:  # a batch item's error: the code's status
        status = next((s for s, c in _BY_STATUS.items() if c == code), 409 if code == "FAILED_PRECONDITION" else 500)
    return cls(code, f"idem: {code}: {message}", status=status, retry_after=retry_after)


class InProgressError(Exception):
    """Another owner holds the key and did not finish within the wait."""

    def __init__(self, message: str, lease_expires_at: Any = None):
        super().__init__(message)
        self.lease_expires_at = lease_expires_at


class FingerprintMismatchError(Exception):
    """The key is in use (or was used) for a request with another fingerprint."""


class LeaseLostError(Exception):
    """The lease was lost while fn ran: another owner may take (or took) the key."""


class ExpiredError(Exception):
    """The key was completed and its response has expired; only a tombstone remains (v1.2)."""

    def __init__(self, message: str, fencing_token: Optional[int] = None, completed_at: Any = None, expired_at: Any = None):
        super().__init__(message)
        self.fencing_token = fencing_token
        self.completed_at = completed_at
        self.expired_at = expired_at


class PermanentError(Exception):
    """Raised by fn to mark its failure as final: run() completes the key with
    ``response`` (a 422, say) instead of releasing it, so later runs replay it."""

    def __init__(self, message: str, response: Any = None):
        super().__init__(message)
        self.response = response
