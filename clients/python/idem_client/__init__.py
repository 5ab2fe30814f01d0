"""idem-client: a client of idem's JSON API with run/once helpers
(synchronous: Client; asyncio: AsyncClient) and ASGI middleware
(idem_client.asgi.IdempotencyMiddleware). Standard library only."""

from ._core import BatchError, Checkpoint, KeyEntry, KeyPage, Policy, Record, Reservation, Response, RunResult, new_owner_token
from .aio import AsyncClient
from .client import Client, Lease
from .errors import (ExpiredError, FailedPreconditionError, FingerprintMismatchError, GoneError, IdemError,
                     InProgressError, InternalError, InvalidArgumentError, LeaseLostError, NotFoundError, NotOwnerError,
                     PayloadTooLargeError, PermanentError, PermissionDeniedError, ResourceExhaustedError,
                     UnauthenticatedError, UnavailableError)

__all__ = [
    "AsyncClient", "BatchError", "Checkpoint", "Client", "ExpiredError", "FailedPreconditionError", "FingerprintMismatchError",
    "GoneError", "IdemError", "InProgressError", "InternalError", "InvalidArgumentError", "KeyEntry", "KeyPage", "Lease",
    "LeaseLostError", "NotFoundError", "NotOwnerError", "PayloadTooLargeError", "PermanentError", "PermissionDeniedError", "Policy",
    "Record", "Reservation", "ResourceExhaustedError", "Response", "RunResult", "UnauthenticatedError",
    "UnavailableError", "new_owner_token",
]
