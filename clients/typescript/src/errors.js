// Errors of the client. IdemError carries a code of the contract's error
// table; the subclasses let callers test with instanceof.

/** An error answered by the store (or its transport), with the contract's code. */
export class IdemError extends Error {
  /**
   * @param {string} code contract error code (INVALID_ARGUMENT, NOT_OWNER, UNAVAILABLE, ...)
   * @param {string} message
   * @param {{status?: number, retryAfterMs?: number, cause?: unknown}} [extra]
   */
  constructor(code, message, extra = {}) {
    super(message, extra.cause === undefined ? undefined : { cause: extra.cause });
    this.name = 'IdemError';
    this.code = code;
    this.status = extra.status ?? 0;
    this.retryAfterMs = extra.retryAfterMs ?? 0;
  }
}

export class InvalidArgumentError extends IdemError {}
export class UnauthenticatedError extends IdemError {}
export class PermissionDeniedError extends IdemError {}
export class NotFoundError extends IdemError {}
export class NotOwnerError extends IdemError {}
export class FailedPreconditionError extends IdemError {}
export class PayloadTooLargeError extends IdemError {}
export class ResourceExhaustedError extends IdemError {}
export class UnavailableError extends IdemError {}
export class InternalError extends IdemError {}
export class GoneError extends IdemError {}

const byCode = {
  INVALID_ARGUMENT: InvalidArgumentError,
  UNAUTHENTICATED: UnauthenticatedError,
  PERMISSION_DENIED: PermissionDeniedError,
  NOT_FOUND: NotFoundError,
  NOT_OWNER: NotOwnerError,
  FAILED_PRECONDITION: FailedPreconditionError,
  PAYLOAD_TOO_LARGE: PayloadTooLargeError,
  RESOURCE_EXHAUSTED: ResourceExhaustedError,
  UNAVAILABLE: UnavailableError,
  INTERNAL: InternalError,
};

const byStatus = {
  400: 'INVALID_ARGUMENT', 401: 'UNAUTHENTICATED', 403: 'PERMISSION_DENIED', 404: 'NOT_FOUND',
  409: 'NOT_OWNER', 410: 'GONE', 413: 'PAYLOAD_TOO_LARGE', 429: 'RESOURCE_EXHAUSTED', 503: 'UNAVAILABLE',
};

/** The error for an HTTP answer of the API that is not 2xx. */
export function errorFromAnswer(status, body, retryAfterMs) {
  let code = body?.error?.code;
  let message = body?.error?.message;
  if (typeof code !== 'string') code = byStatus[status] ?? (status >= 500 ? 'INTERNAL' : 'INVALID_ARGUMENT');
  if (typeof message !== 'string') message = `HTTP ${status}`;
  const Cls = byCode[code] ?? (code === 'GONE' ? GoneError : IdemError);
  // A batch item's error has no HTTP status of its own: the code's.
  const st = status || Number(Object.entries(byStatus).find(([, c]) => c === code)?.[0] ?? (code === 'FAILED_PRECONDITION' ? 409 : 500));
  const err = new Cls(code, `idem: ${code}: ${message}`, { status: st, retryAfterMs });
  err.name = Cls.name;
  return err;
}

/** Another owner holds the key and did not finish within the wait. */
export class InProgressError extends Error {
  constructor(message, leaseExpiresAt) {
    super(message);
    this.name = 'InProgressError';
    this.leaseExpiresAt = leaseExpiresAt;
  }
}

/** The key is in use (or was used) for a request with another fingerprint. */
export class FingerprintMismatchError extends Error {
  constructor(message) {
    super(message);
    this.name = 'FingerprintMismatchError';
  }
}

/** The lease was lost while fn ran: another owner may take (or took) the key. */
export class LeaseLostError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = 'LeaseLostError';
  }
}

/** The key's response expired; only a tombstone remains (v1.2 EXPIRED). */
export class ExpiredError extends Error {
  constructor(message, details) {
    super(message);
    this.name = 'ExpiredError';
    Object.assign(this, details);
  }
}

/**
 * Thrown by fn to mark its failure as final: run() completes the key with
 * `response` (say a 422 for a request that will never succeed) instead of
 * releasing it, so later runs replay that response.
 */
export class PermanentError extends Error {
  constructor(message, response, options) {
    super(message, options);
    this.name = 'PermanentError';
    this.response = response;
  }
}
