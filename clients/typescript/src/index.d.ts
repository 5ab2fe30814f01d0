// Type declarations of @idem/client.

import type { IncomingMessage, ServerResponse } from 'node:http';
import type { SecureContextOptions } from 'node:tls';

/** A stored HTTP-like response: what a key was completed with, replayed verbatim. */
export interface StoredResponse {
  /** 100..599. */
  status: number;
  /** Stored and replayed exactly as given (join multiple values yourself). */
  headers: Record<string, string>;
  body: Uint8Array;
}

/** A response to store: the body may be a string (sent as UTF-8). */
export interface ResponseInput {
  status: number;
  headers?: Record<string, string>;
  body?: string | Uint8Array;
}

/** The last checkpoint of an attempt (v1.2). */
export interface Checkpoint {
  name: string;
  data: Uint8Array;
  /** Fencing token of the attempt that wrote it. */
  fencingToken: bigint;
  checkpointedAt: Date;
}

export interface Acquired {
  outcome: 'ACQUIRED';
  ownerToken: string;
  fencingToken: bigint;
  leaseExpiresAt: Date;
}
export interface Reclaimed {
  outcome: 'RECLAIMED';
  ownerToken: string;
  fencingToken: bigint;
  leaseExpiresAt: Date;
  /** The earlier owner, whose lease ran out: it may have done part of the work. */
  previousFencingToken: bigint;
  /** That attempt's last checkpoint, when it wrote one (v1.2). */
  checkpoint?: Checkpoint;
}
export interface InProgress {
  outcome: 'IN_PROGRESS';
  /** A hint: never past the moment the key could be reclaimed. */
  retryAfterMs: number;
  leaseExpiresAt: Date;
}
export interface Completed {
  outcome: 'COMPLETED';
  response: StoredResponse;
  completedAt: Date;
  expiresAt: Date;
  fencingToken: bigint;
}
export interface FingerprintMismatch {
  outcome: 'FINGERPRINT_MISMATCH';
}
/** v1.2: the work was done and its response is gone (a tombstone remains). */
export interface Expired {
  outcome: 'EXPIRED';
  fencingToken: bigint;
  completedAt: Date;
  expiredAt: Date;
}
/** What the store decided on a reserve. */
export type Reservation = Acquired | Reclaimed | InProgress | Completed | FingerprintMismatch | Expired;

/** A key's record (GET). */
export interface KeyRecord {
  state: 'IN_PROGRESS' | 'COMPLETED' | 'EXPIRED';
  fingerprint: string;
  /** The current or completing owner's token. */
  fencingToken: bigint;
  leaseExpiresAt?: Date;
  completedAt?: Date;
  expiresAt?: Date;
  expiredAt?: Date;
  /** Always present for COMPLETED. */
  response?: StoredResponse;
  checkpoint?: Checkpoint;
}

export interface KeyListEntry {
  key: string;
  state: 'IN_PROGRESS' | 'COMPLETED';
  fencingToken: bigint;
  createdAt: Date;
  leaseExpiresAt?: Date;
  completedAt?: Date;
  expiresAt?: Date;
}

export interface Logger {
  warn(message: string, fields?: Record<string, unknown>): void;
  debug?(message: string, fields?: Record<string, unknown>): void;
}

export interface ClientOptions {
  /** The JSON API of any node or router: http://127.0.0.1:8080 for a dev node. */
  baseUrl: string;
  /** Bearer token (Authorization: Bearer TOKEN), checked against the auth file. */
  token?: string;
  /**
   * TLS client options for https (ca, cert and key for mTLS). With them the
   * client sends with node:https instead of fetch.
   */
  tls?: SecureContextOptions & { rejectUnauthorized?: boolean; servername?: string };
  /** Bound of one attempt of a call, in ms (a waiting reserve adds its wait, a request body a second per MiB). Default 10000. */
  timeoutMs?: number;
  /** Attempts per call: 503 and 429 are retried after Retry-After, transport failures after a backoff. Default 4. */
  maxAttempts?: number;
  /** Longest pause between attempts, in ms. Default 10000. */
  maxRetryAfterMs?: number;
  /** fetch to use instead of globalThis.fetch (without tls). */
  fetch?: typeof fetch;
  /** Receives lease and retry events. Default: silent. */
  logger?: Logger;
}

export interface CallOptions {
  signal?: AbortSignal;
}

export interface ReserveOptions extends CallOptions {
  /** 0-256 chars, compared exactly. */
  fingerprint?: string;
  /** 100..600000; default 30000. */
  leaseMs?: number;
  /** 16-128 chars of [A-Za-z0-9_-]; generated when absent, so retries are the same reservation. */
  ownerToken?: string;
  /** 0..30000: wait this long in the store for a running owner. */
  waitMs?: number;
  /** v1.2: "acquire" takes an expired key (tombstone) over instead of answering EXPIRED. */
  ifExpired?: 'acquire';
}

/** What run()'s fn knows about its hold on the key. */
export interface Lease {
  fencingToken: bigint;
  /** An earlier owner's lease ran out before it completed: it may have done part of the work. */
  reclaimed: boolean;
  previousFencingToken?: bigint;
  ownerToken: string;
  /** The lease's end when fn started (renewed while fn runs). */
  expiresAt: Date;
  /** The last checkpoint of the reclaimed attempt (v1.2). */
  checkpoint?: Checkpoint;
  /** Aborted (reason: LeaseLostError) when the lease is lost, or when run's signal aborts. */
  signal: AbortSignal;
  /** v1.2: record a recovery point; a later RECLAIMED attempt finds it in lease.checkpoint. */
  saveCheckpoint(name: string, data: string | Uint8Array): Promise<{ checkpointedAt: Date }>;
}

/** v1.2 namespace policy; an absent field is the built-in default. */
export interface NamespacePolicy {
  defaultLeaseMs?: number;
  maxLeaseMs?: number;
  defaultRetentionS?: number;
  maxRetentionS?: number;
  /** How long a tombstone outlives a completed record's retention (default 604800; 0 keeps none). */
  tombstoneS?: number;
}

export interface RunOptions extends CallOptions {
  fingerprint?: string;
  /** Default 30000; renewed every third while fn runs. */
  leaseMs?: number;
  /** 1..2592000; default the store's (86400). */
  retentionS?: number;
  /** How long to wait for another owner before InProgressError. Default 10000; 0 fails at once. */
  maxWaitMs?: number;
  /** v1.2: "acquire" runs fn again for an expired key instead of throwing ExpiredError. */
  ifExpired?: 'acquire';
}

export interface RunResult {
  response: StoredResponse;
  /** The key was completed before; fn did not run. */
  replayed: boolean;
  fencingToken: bigint;
  completedAt: Date;
  expiresAt: Date;
}

export declare const defaults: Readonly<{
  timeoutMs: number; maxAttempts: number; maxRetryAfterMs: number; leaseMs: number; maxWaitMs: number; storeMaxWaitMs: number;
}>;

export declare function newOwnerToken(): string;
export declare function newKey(): string;

export declare class IdemClient {
  constructor(options: ClientOptions | string);
  readonly logger: Logger;
  reserve(ns: string, key: string, options?: ReserveOptions): Promise<Reservation>;
  heartbeat(ns: string, key: string, options: CallOptions & { ownerToken: string; leaseMs?: number }): Promise<{ leaseExpiresAt: Date }>;
  complete(ns: string, key: string, options: CallOptions & { ownerToken: string; response: ResponseInput; retentionS?: number }): Promise<{ completedAt: Date; expiresAt: Date }>;
  release(ns: string, key: string, options: CallOptions & { ownerToken: string }): Promise<void>;
  /** The key's record, or null when absent or past retention. */
  get(ns: string, key: string, options?: CallOptions): Promise<KeyRecord | null>;
  listKeys(ns: string, options?: CallOptions & { state?: 'IN_PROGRESS' | 'COMPLETED'; olderThanS?: number; limit?: number; pageToken?: string }): Promise<{ keys: KeyListEntry[]; nextPageToken?: string }>;
  forceRelease(ns: string, key: string, options: CallOptions & { reason: string }): Promise<{ previousFencingToken: bigint }>;
  deleteKey(ns: string, key: string, options: CallOptions & { reason: string }): Promise<void>;
  /** v1.2: reserve up to 1000 keys in one call; per item a reservation or {error}. */
  batchReserve(ns: string, items: Array<{ key: string; fingerprint?: string; ownerToken?: string; leaseMs?: number }>, options?: CallOptions): Promise<Array<Reservation | { error: IdemError }>>;
  /** v1.2: complete up to 1000 keys in one call; per item the times or {error}. */
  batchComplete(ns: string, items: Array<{ key: string; ownerToken: string; response: ResponseInput; retentionS?: number }>, options?: CallOptions): Promise<Array<{ completedAt: Date; expiresAt: Date } | { error: IdemError }>>;
  /** v1.2: record a recovery point of the running attempt. */
  checkpoint(ns: string, key: string, options: CallOptions & { ownerToken: string; name: string; data: string | Uint8Array }): Promise<{ checkpointedAt: Date }>;
  /** v1.2: the namespace's policy in force. */
  getPolicy(ns: string, options?: CallOptions): Promise<NamespacePolicy>;
  /** v1.2: set the namespace's policy (admin). */
  setPolicy(ns: string, policy: NamespacePolicy, options?: CallOptions): Promise<NamespacePolicy>;
  /**
   * Runs fn at most once to completion for (ns, key): reserve; replay a
   * completed key; wait for a running owner (maxWaitMs); else run fn,
   * heartbeating every third of the lease and aborting lease.signal if the
   * lease is lost; complete with fn's response, or release when fn throws
   * (a PermanentError completes with its response instead).
   */
  run(ns: string, key: string, fn: (lease: Lease) => Promise<ResponseInput> | ResponseInput, options?: RunOptions): Promise<RunResult>;
  /** At most once per event id (consumer deduplication); ran is true when this call ran fn. */
  once(ns: string, eventId: string, fn: (fencingToken: bigint, lease: Lease) => Promise<void> | void, options?: RunOptions): Promise<{ ran: boolean }>;
}

export declare class IdemError extends Error {
  constructor(code: string, message: string, extra?: { status?: number; retryAfterMs?: number; cause?: unknown });
  /** The contract's error code: INVALID_ARGUMENT, NOT_OWNER, UNAVAILABLE, ... */
  readonly code: string;
  /** HTTP status of the answer (0 when none arrived). */
  readonly status: number;
  /** Retry-After of the answer, in ms (0 when none). */
  readonly retryAfterMs: number;
}
export declare class InvalidArgumentError extends IdemError {}
export declare class UnauthenticatedError extends IdemError {}
export declare class PermissionDeniedError extends IdemError {}
export declare class NotFoundError extends IdemError {}
export declare class NotOwnerError extends IdemError {}
export declare class FailedPreconditionError extends IdemError {}
export declare class PayloadTooLargeError extends IdemError {}
export declare class ResourceExhaustedError extends IdemError {}
export declare class UnavailableError extends IdemError {}
export declare class InternalError extends IdemError {}
export declare class GoneError extends IdemError {}
export declare function errorFromAnswer(status: number, body: unknown, retryAfterMs: number): IdemError;

export declare class InProgressError extends Error {
  readonly leaseExpiresAt?: Date;
}
export declare class FingerprintMismatchError extends Error {}
export declare class LeaseLostError extends Error {}
export declare class ExpiredError extends Error {
  readonly fencingToken?: bigint;
  readonly completedAt?: Date;
  readonly expiredAt?: Date;
}
/** Throw from fn to complete the key with `response` instead of releasing it. */
export declare class PermanentError extends Error {
  constructor(message: string, response?: ResponseInput, options?: { cause?: unknown });
  readonly response?: ResponseInput | StoredResponse;
}

/** What a handler behind the middleware knows of its reservation (req.idempotency). */
export interface RequestIdempotency {
  key: string;
  namespace: string;
  fencingToken: bigint;
  reclaimed: boolean;
  previousFencingToken?: bigint;
  expiresAt: Date;
  /** Aborted when the lease is lost or the handler runs past timeoutMs. */
  signal: AbortSignal;
}

export interface MiddlewareOptions {
  /** Methods made idempotent when keyed. Default ["POST", "PATCH"]. */
  methods?: string[];
  /** A keyless request of those methods gets 400. */
  requireKey?: boolean;
  /** Names the caller (its namespace); an error gives 401, an invalid namespace 400. */
  namespace?: (req: IncomingMessage) => string | Promise<string>;
  /** Header naming the caller (trust it only behind a gateway that sets it). */
  namespaceHeader?: string;
  /** HMAC key naming callers known only by their Authorization header. */
  authorizationKey?: string | Uint8Array;
  /** Namespace of anonymous callers. Default "default". */
  defaultNamespace?: string;
  /** Default 1 MiB; a larger keyed body gets 413. */
  maxRequestBytes?: number;
  /** Largest stored body (set it to the store's --max-response-bytes). Default 1 MiB. */
  maxStoredBodyBytes?: number;
  /** Default 30000. */
  leaseMs?: number;
  /** Default leaseMs / 3. */
  heartbeatMs?: number;
  /** Default the store's (86400). */
  retentionS?: number;
  /** Cap of Prefer: wait, in ms. Default 30000; negative ignores Prefer. */
  maxWaitMs?: number;
  /** When req.idempotency.signal aborts with a TimeoutError. Default 60000. */
  timeoutMs?: number;
  /** Statuses whose response is not final (the key is released). Default 5xx, 408, 425, 429. */
  releaseStatus?: (status: number) => boolean;
  /** Request headers that join the fingerprint. */
  fingerprintHeaders?: string[];
  /** Response headers never stored. */
  storedHeaderDeny?: string[];
  /** false: req.body is the raw Buffer instead of parsed JSON/text/form. */
  parseBody?: boolean;
  logger?: Logger;
}

/** Express middleware with the semantics of idem's proxy mode. Mount it before body parsers. */
export declare function idempotency(client: IdemClient, options?: MiddlewareOptions):
  (req: IncomingMessage, res: ServerResponse, next: (err?: unknown) => void) => void;

export declare const HEADER_KEY: 'Idempotency-Key';
export declare const HEADER_FENCING_TOKEN: 'Idempotency-Fencing-Token';
export declare const HEADER_REPLAYED: 'Idempotent-Replayed';
export declare const HEADER_BODY_OMITTED: 'Idempotent-Body-Omitted';
export declare const HEADER_KEY_EXPIRES: 'Idempotency-Key-Expires';
/** The proxy's request fingerprint ("sha256:" + 64 hex digits). */
export declare function fingerprint(method: string, rawPath: string, rawQuery: string, headerFields: Array<[string, string]>, body: Uint8Array): string;
export declare function parseKey(values: string[]): { present: false } | { present: true; key: string } | { present: true; error: string };
/** Prefer: wait=N in ms, or -1. */
export declare function parsePreferWait(values: string[]): number;

declare module 'node:http' {
  interface IncomingMessage {
    /** Set by the idempotency middleware on keyed requests. */
    idempotency?: RequestIdempotency;
    /** The keyed request's body as received. */
    rawBody?: Buffer;
  }
}
