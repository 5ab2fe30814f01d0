// The JSON API client, run() and once(). No runtime dependencies: Node's
// fetch, or node:https when TLS client options (mTLS, a private CA) are given.

import { randomBytes } from 'node:crypto';
import * as https from 'node:https';
import * as http from 'node:http';
import {
  IdemError, UnavailableError, NotOwnerError, InvalidArgumentError, PayloadTooLargeError,
  InProgressError, FingerprintMismatchError, LeaseLostError, PermanentError, ExpiredError,
  errorFromAnswer,
} from './errors.js';

/** Defaults of the client and of run(). */
export const defaults = Object.freeze({
  timeoutMs: 10_000,
  maxAttempts: 4,
  maxRetryAfterMs: 10_000,
  leaseMs: 30_000,
  maxWaitMs: 10_000,
  storeMaxWaitMs: 30_000,
});

/** A fresh owner token: 22 characters of base64url (128 random bits). */
export function newOwnerToken() {
  return randomBytes(16).toString('base64url');
}

/** A fresh idempotency key (a random UUID). */
export function newKey() {
  return globalThis.crypto.randomUUID();
}

const sleep = (ms, signal) => new Promise((resolve, reject) => {
  if (signal?.aborted) { reject(signal.reason); return; }
  const t = setTimeout(() => { signal?.removeEventListener('abort', onAbort); resolve(); }, ms);
  const onAbort = () => { clearTimeout(t); reject(signal.reason); };
  signal?.addEventListener('abort', onAbort, { once: true });
});

const toDate = (s) => (typeof s === 'string' ? new Date(s) : undefined);
const toToken = (s) => (typeof s === 'string' && s !== '' ? BigInt(s) : undefined);

function encodeBody(body) {
  if (body === undefined || body === null) return '';
  if (typeof body === 'string') return Buffer.from(body, 'utf8').toString('base64');
  if (body instanceof Uint8Array) return Buffer.from(body.buffer, body.byteOffset, body.byteLength).toString('base64');
  throw new InvalidArgumentError('INVALID_ARGUMENT', 'idem: a response body must be a string or a Uint8Array');
}

function decodeResponse(r) {
  if (!r) return undefined;
  return { status: r.status, headers: r.headers ?? {}, body: Buffer.from(r.body ?? '', 'base64') };
}

function encodeResponse(r) {
  if (!r || typeof r.status !== 'number') {
    throw new InvalidArgumentError('INVALID_ARGUMENT', 'idem: a response needs a numeric status (100..599)');
  }
  return { status: r.status, headers: r.headers ?? {}, body: encodeBody(r.body) };
}

function decodeCheckpoint(c) {
  if (!c) return undefined;
  return {
    name: c.name,
    data: Buffer.from(c.data ?? '', 'base64'),
    fencingToken: toToken(c.fencing_token),
    checkpointedAt: toDate(c.checkpointed_at),
  };
}

/** Decodes a reserve answer (also a batch-reserve item). */
function decodeReservation(a) {
  const out = { outcome: a.outcome };
  if (a.owner_token !== undefined) out.ownerToken = a.owner_token;
  if (a.fencing_token !== undefined) out.fencingToken = toToken(a.fencing_token);
  if (a.previous_fencing_token !== undefined) out.previousFencingToken = toToken(a.previous_fencing_token);
  if (a.lease_expires_at !== undefined) out.leaseExpiresAt = toDate(a.lease_expires_at);
  if (a.retry_after_ms !== undefined) out.retryAfterMs = a.retry_after_ms;
  if (a.response !== undefined) out.response = decodeResponse(a.response);
  if (a.completed_at !== undefined) out.completedAt = toDate(a.completed_at);
  if (a.expires_at !== undefined) out.expiresAt = toDate(a.expires_at);
  if (a.expired_at !== undefined) out.expiredAt = toDate(a.expired_at);
  if (a.checkpoint !== undefined) out.checkpoint = decodeCheckpoint(a.checkpoint);
  return out;
}

function decodeRecord(a) {
  const out = { state: a.state, fingerprint: a.fingerprint ?? '', fencingToken: toToken(a.fencing_token) };
  if (a.lease_expires_at !== undefined) out.leaseExpiresAt = toDate(a.lease_expires_at);
  if (a.completed_at !== undefined) out.completedAt = toDate(a.completed_at);
  if (a.expires_at !== undefined) out.expiresAt = toDate(a.expires_at);
  if (a.expired_at !== undefined) out.expiredAt = toDate(a.expired_at);
  if (a.response !== undefined) out.response = decodeResponse(a.response);
  if (a.checkpoint !== undefined) out.checkpoint = decodeCheckpoint(a.checkpoint);
  return out;
}

const policyFields = [
  ['default_lease_ms', 'defaultLeaseMs'], ['max_lease_ms', 'maxLeaseMs'], ['default_retention_s', 'defaultRetentionS'],
  ['max_retention_s', 'maxRetentionS'], ['tombstone_s', 'tombstoneS'],
];

function decodePolicy(answer) {
  // The contract answers the policy's fields; accept them wrapped in
  // {"policy": ...} as well, the shape of the gRPC answer.
  const a = answer.policy && typeof answer.policy === 'object' ? answer.policy : answer;
  const out = {};
  for (const [field, name] of policyFields) if (a[field] !== undefined) out[name] = a[field];
  return out;
}

function parseRetryAfter(v) {
  if (!v) return 0;
  const secs = Number(v);
  if (Number.isFinite(secs) && secs >= 0) return secs * 1000;
  const at = Date.parse(v);
  return Number.isFinite(at) ? Math.max(0, at - Date.now()) : 0;
}

/** Sends requests with node:http(s), for TLS client options fetch lacks. */
function nodeTransport(baseUrl, tls) {
  const url = new URL(baseUrl);
  const mod = url.protocol === 'https:' ? https : http;
  const agent = new mod.Agent({ keepAlive: true, ...(url.protocol === 'https:' ? tls : {}) });
  return (method, path, headers, body, signal) => new Promise((resolve, reject) => {
    const req = mod.request(new URL(path, url), { method, headers, agent, signal }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({
        status: res.statusCode,
        header: (name) => res.headers[name.toLowerCase()] ?? null,
        text: Buffer.concat(chunks).toString('utf8'),
      }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

/**
 * The OpenTelemetry API when the application has it installed (an optional
 * peer: the client does not depend on it); null when it has not. Looked up
 * once, on the first call.
 */
let otelApi;
async function loadOtel() {
  if (otelApi === undefined) {
    try {
      otelApi = await import('@opentelemetry/api');
    } catch {
      otelApi = null;
    }
  }
  return otelApi;
}

/** The W3C trace context fields a call carries. */
const traceFields = ['traceparent', 'tracestate'];

/**
 * Adds the W3C trace context (traceparent, tracestate) of the caller's
 * active OpenTelemetry span to headers, so that idem's spans join the
 * application's trace. Nothing without the API, an active span or a
 * registered propagator.
 */
async function addTraceContext(headers) {
  const api = otelApi === undefined ? await loadOtel() : otelApi;
  if (!api) return;
  const carrier = {};
  api.propagation.inject(api.context.active(), carrier);
  for (const k of traceFields) if (carrier[k]) headers[k] = carrier[k];
}

function fetchTransport(baseUrl, fetchImpl) {
  return async (method, path, headers, body, signal) => {
    const res = await fetchImpl(new URL(path, baseUrl), { method, headers, body, signal });
    return { status: res.status, header: (name) => res.headers.get(name), text: await res.text() };
  };
}

/** A client of idem's JSON API (any node or router). */
export class IdemClient {
  /**
   * @param {object} options see index.d.ts (ClientOptions)
   */
  constructor(options) {
    const o = typeof options === 'string' ? { baseUrl: options } : { ...options };
    if (!o.baseUrl) throw new InvalidArgumentError('INVALID_ARGUMENT', 'idem: baseUrl is required (http://127.0.0.1:8080 for a dev node)');
    this.baseUrl = o.baseUrl.endsWith('/') ? o.baseUrl : o.baseUrl + '/';
    this.token = o.token;
    this.timeoutMs = o.timeoutMs ?? defaults.timeoutMs;
    this.maxAttempts = o.maxAttempts ?? defaults.maxAttempts;
    this.maxRetryAfterMs = o.maxRetryAfterMs ?? defaults.maxRetryAfterMs;
    this.logger = o.logger ?? { warn() {}, debug() {} };
    this.transport = o.tls ? nodeTransport(this.baseUrl, o.tls) : fetchTransport(this.baseUrl, o.fetch ?? globalThis.fetch);
  }

  keyPath(ns, key) {
    return `v1/namespaces/${encodeURIComponent(ns)}/keys/${encodeURIComponent(key)}`;
  }

  /**
   * One API call. Answers 503 (and 429, which says the same: not applied, ask
   * later) are retried after Retry-After, and so are transport failures: every
   * call the client makes is safe to repeat (reserve, complete and release
   * carry the same owner token each time).
   */
  async call(method, path, body, opts = {}) {
    const headers = { accept: 'application/json' };
    if (body !== undefined) headers['content-type'] = 'application/json';
    if (this.token) headers.authorization = `Bearer ${this.token}`;
    await addTraceContext(headers);
    const payload = body === undefined ? undefined : JSON.stringify(body);
    const attempts = opts.retry === false ? 1 : this.maxAttempts;
    // A request carrying megabytes (a completion's response, a batch) gets a
    // second per MiB more, as nodes and routers give it: the store writes it
    // to a majority of its replicas before it answers. ~1 ms for 1 KB.
    const payloadMs = payload === undefined ? 0 : Math.ceil(Buffer.byteLength(payload) / 1048.576);
    let last;
    for (let attempt = 1; attempt <= attempts; attempt++) {
      const timeout = AbortSignal.timeout(this.timeoutMs + (opts.extraTimeoutMs ?? 0) + payloadMs);
      const signal = opts.signal ? AbortSignal.any([opts.signal, timeout]) : timeout;
      let res;
      try {
        res = await this.transport(method, path, headers, payload, signal);
      } catch (err) {
        if (opts.signal?.aborted) throw opts.signal.reason;
        last = new UnavailableError('UNAVAILABLE', `idem: ${method} /${path}: ${err?.message ?? err}`, { cause: err });
        if (attempt < attempts) {
          const wait = Math.min(100 * 2 ** (attempt - 1), this.maxRetryAfterMs);
          this.logger.debug?.('idem: retrying after a transport failure', { path, attempt, wait, err: String(err) });
          await sleep(wait, opts.signal);
        }
        continue;
      }
      let parsed;
      try {
        parsed = res.text === '' ? {} : JSON.parse(res.text);
      } catch {
        parsed = undefined;
      }
      if (res.status >= 200 && res.status < 300) {
        if (parsed === undefined) throw new IdemError('INTERNAL', `idem: ${method} /${path}: the answer is not JSON`, { status: res.status });
        return parsed;
      }
      const retryAfterMs = parseRetryAfter(res.header('retry-after'));
      last = errorFromAnswer(res.status, parsed, retryAfterMs);
      if ((res.status === 503 || res.status === 429) && attempt < attempts) {
        const wait = Math.min(Math.max(retryAfterMs, 50), this.maxRetryAfterMs);
        this.logger.debug?.('idem: retrying after Retry-After', { path, attempt, wait, code: last.code });
        await sleep(wait, opts.signal);
        continue;
      }
      throw last;
    }
    throw last;
  }

  /**
   * Reserves a key. The owner token is chosen here when not given, so a retried
   * reserve is the same reservation.
   */
  async reserve(ns, key, opts = {}) {
    const body = { owner_token: opts.ownerToken || newOwnerToken() };
    if (opts.fingerprint !== undefined) body.fingerprint = opts.fingerprint;
    if (opts.leaseMs) body.lease_ms = opts.leaseMs;
    if (opts.waitMs) body.wait_ms = opts.waitMs;
    if (opts.ifExpired) body.if_expired = opts.ifExpired;
    const a = await this.call('POST', `${this.keyPath(ns, key)}:reserve`, body, { signal: opts.signal, extraTimeoutMs: opts.waitMs ?? 0 });
    return decodeReservation(a);
  }

  async heartbeat(ns, key, opts) {
    const body = { owner_token: opts.ownerToken };
    if (opts.leaseMs) body.lease_ms = opts.leaseMs;
    const a = await this.call('POST', `${this.keyPath(ns, key)}:heartbeat`, body, { signal: opts.signal });
    return { leaseExpiresAt: toDate(a.lease_expires_at) };
  }

  async complete(ns, key, opts) {
    const body = { owner_token: opts.ownerToken, response: encodeResponse(opts.response) };
    if (opts.retentionS) body.retention_s = opts.retentionS;
    const a = await this.call('POST', `${this.keyPath(ns, key)}:complete`, body, { signal: opts.signal });
    return { completedAt: toDate(a.completed_at), expiresAt: toDate(a.expires_at) };
  }

  async release(ns, key, opts) {
    await this.call('POST', `${this.keyPath(ns, key)}:release`, { owner_token: opts.ownerToken }, { signal: opts.signal });
  }

  /** The record of a key, or null when the store has none. */
  async get(ns, key, opts = {}) {
    try {
      return decodeRecord(await this.call('GET', this.keyPath(ns, key), undefined, { signal: opts.signal }));
    } catch (err) {
      if (err.code === 'NOT_FOUND') return null;
      throw err;
    }
  }

  /** One page of a namespace's keys (operator action; reader role). */
  async listKeys(ns, opts = {}) {
    const q = new URLSearchParams();
    if (opts.state) q.set('state', opts.state);
    if (opts.olderThanS) q.set('older_than_s', String(opts.olderThanS));
    if (opts.limit) q.set('limit', String(opts.limit));
    if (opts.pageToken) q.set('page_token', opts.pageToken);
    const qs = q.toString();
    const a = await this.call('GET', `v1/namespaces/${encodeURIComponent(ns)}/keys${qs ? '?' + qs : ''}`, undefined, { signal: opts.signal });
    return {
      keys: (a.keys ?? []).map((k) => {
        const out = { key: k.key, state: k.state, fencingToken: toToken(k.fencing_token), createdAt: toDate(k.created_at) };
        if (k.lease_expires_at !== undefined) out.leaseExpiresAt = toDate(k.lease_expires_at);
        if (k.completed_at !== undefined) out.completedAt = toDate(k.completed_at);
        if (k.expires_at !== undefined) out.expiresAt = toDate(k.expires_at);
        return out;
      }),
      nextPageToken: a.next_page_token,
    };
  }

  /** Frees a stuck IN_PROGRESS key (operator action; admin role). */
  async forceRelease(ns, key, opts) {
    const a = await this.call('POST', `${this.keyPath(ns, key)}:force-release`, { reason: opts.reason }, { signal: opts.signal });
    return { previousFencingToken: toToken(a.previous_fencing_token) };
  }

  /** Deletes a key's record (operator action; admin role). */
  async deleteKey(ns, key, opts) {
    await this.call('DELETE', this.keyPath(ns, key), { reason: opts.reason }, { signal: opts.signal });
  }

  // -- v1.2 --------------------------------------------------------------

  /**
   * Reserves up to 1000 keys of one namespace in one call (v1.2). Each result
   * is what the single reserve would have answered, in item order: a
   * reservation, or {error} (an IdemError) for that item alone.
   */
  async batchReserve(ns, items, opts = {}) {
    const body = {
      items: items.map((it) => {
        const out = { key: it.key, owner_token: it.ownerToken || newOwnerToken() };
        if (it.fingerprint !== undefined) out.fingerprint = it.fingerprint;
        if (it.leaseMs) out.lease_ms = it.leaseMs;
        return out;
      }),
    };
    const a = await this.call('POST', `v1/namespaces/${encodeURIComponent(ns)}/keys:batch-reserve`, body, { signal: opts.signal });
    return (a.results ?? []).map((r) => (r.error ? { error: errorFromAnswer(0, r, 0) } : decodeReservation(r)));
  }

  /** Completes up to 1000 keys of one namespace in one call (v1.2); results as batchReserve's. */
  async batchComplete(ns, items, opts = {}) {
    const body = {
      items: items.map((it) => {
        const out = { key: it.key, owner_token: it.ownerToken, response: encodeResponse(it.response) };
        if (it.retentionS) out.retention_s = it.retentionS;
        return out;
      }),
    };
    const a = await this.call('POST', `v1/namespaces/${encodeURIComponent(ns)}/keys:batch-complete`, body, { signal: opts.signal });
    return (a.results ?? []).map((r) => (r.error ? { error: errorFromAnswer(0, r, 0) } : { completedAt: toDate(r.completed_at), expiresAt: toDate(r.expires_at) }));
  }

  /**
   * Records a recovery point of the running attempt (v1.2): name 1-64 chars
   * of [A-Za-z0-9_.-], data at most 64 KiB. A RECLAIMED answer carries the
   * last one, so a retry resumes instead of starting over.
   */
  async checkpoint(ns, key, opts) {
    const body = { owner_token: opts.ownerToken, name: opts.name, data: encodeBody(opts.data) };
    const a = await this.call('POST', `${this.keyPath(ns, key)}:checkpoint`, body, { signal: opts.signal });
    return { checkpointedAt: toDate(a.checkpointed_at) };
  }

  /** The namespace's policy in force (v1.2; reader role). */
  async getPolicy(ns, opts = {}) {
    return decodePolicy(await this.call('GET', `v1/namespaces/${encodeURIComponent(ns)}/policy`, undefined, { signal: opts.signal }));
  }

  /** Sets the namespace's policy (v1.2; admin); absent fields keep the built-in defaults. */
  async setPolicy(ns, policy, opts = {}) {
    const body = {};
    for (const [field, name] of policyFields) if (policy[name] !== undefined) body[field] = policy[name];
    return decodePolicy(await this.call('PUT', `v1/namespaces/${encodeURIComponent(ns)}/policy`, body, { signal: opts.signal }));
  }

  /**
   * Runs fn at most once to completion for (ns, key), across every process and
   * retry using the key (the Go client's Do). See index.d.ts.
   */
  async run(ns, key, fn, opts = {}) {
    if (typeof fn !== 'function') throw new InvalidArgumentError('INVALID_ARGUMENT', `idem: run ${ns}/${key}: fn is not a function`);
    const leaseMs = opts.leaseMs || defaults.leaseMs;
    const maxWaitMs = opts.maxWaitMs ?? defaults.maxWaitMs;
    const ownerToken = newOwnerToken();
    const waitUntil = Date.now() + maxWaitMs;
    let poll = 20;
    let storeWait = 0;
    for (let round = 0; ; round++) {
      const sentAt = Date.now();
      const res = await this.reserve(ns, key, {
        fingerprint: opts.fingerprint, leaseMs, ownerToken, waitMs: storeWait, signal: opts.signal, ifExpired: opts.ifExpired,
      });
      switch (res.outcome) {
        case 'COMPLETED':
          return { response: res.response, replayed: true, fencingToken: res.fencingToken, completedAt: res.completedAt, expiresAt: res.expiresAt };
        case 'FINGERPRINT_MISMATCH':
          throw new FingerprintMismatchError(`idem: ${ns}/${key} is in use for another request (fingerprint mismatch)`);
        case 'EXPIRED':
          throw new ExpiredError(`idem: ${ns}/${key} was completed and its response has expired`, {
            fencingToken: res.fencingToken, completedAt: res.completedAt, expiredAt: res.expiredAt,
          });
        case 'ACQUIRED':
        case 'RECLAIMED':
          return this.#runOwned(ns, key, res, sentAt, fn, { ...opts, leaseMs });
        case 'IN_PROGRESS': {
          const remaining = waitUntil - Date.now();
          if (remaining < 1) {
            throw new InProgressError(`idem: ${ns}/${key} is held by another owner whose lease ends at ${res.leaseExpiresAt?.toISOString()}; waited ${maxWaitMs} ms`, res.leaseExpiresAt);
          }
          const asked = storeWait;
          storeWait = Math.min(Math.floor(remaining), defaults.storeMaxWaitMs);
          if (asked === 0 || Date.now() - sentAt >= asked / 2) continue; // the store waited: ask it to wait again
          // The store answered well before the wait it was asked for: pause
          // as a poller would, so this never becomes a tight loop.
          let wait = Math.min(poll, remaining);
          if (res.retryAfterMs > 0) wait = Math.min(wait, res.retryAfterMs);
          poll = Math.min(2 * poll, 1000);
          await sleep(wait / 2 + Math.random() * (wait / 2), opts.signal);
          continue;
        }
        default:
          throw new IdemError('INTERNAL', `idem: run ${ns}/${key}: unexpected outcome ${res.outcome}`);
      }
    }
  }

  async #runOwned(ns, key, res, sentAt, fn, opts) {
    const controller = new AbortController();
    const onOuterAbort = () => controller.abort(opts.signal.reason);
    opts.signal?.addEventListener('abort', onOuterAbort, { once: true });
    const hb = this.keepLease(ns, key, res.ownerToken, opts.leaseMs, sentAt + opts.leaseMs, controller);
    const lease = {
      fencingToken: res.fencingToken,
      reclaimed: res.outcome === 'RECLAIMED',
      previousFencingToken: res.previousFencingToken,
      ownerToken: res.ownerToken,
      expiresAt: res.leaseExpiresAt,
      checkpoint: res.checkpoint,
      signal: controller.signal,
      saveCheckpoint: (name, data) => this.checkpoint(ns, key, { ownerToken: res.ownerToken, name, data }),
    };
    let response;
    let fnErr;
    let failed = false;
    try {
      response = await fn(lease);
    } catch (err) {
      failed = true;
      fnErr = err;
    } finally {
      await hb.stop();
      opts.signal?.removeEventListener('abort', onOuterAbort);
    }
    const lost = controller.signal.aborted && controller.signal.reason instanceof LeaseLostError;
    const release = async () => {
      try {
        await this.release(ns, key, { ownerToken: res.ownerToken });
      } catch (err) {
        if (!(err instanceof NotOwnerError)) this.logger.warn('idem: release failed; the key stays reserved until its lease runs out', { ns, key, err: String(err) });
      }
    };
    if (failed && !(fnErr instanceof PermanentError)) {
      await release();
      if (lost) throw new LeaseLostError(`idem: ${ns}/${key}: the lease was lost while fn ran: ${fnErr?.message ?? fnErr}`, { cause: fnErr });
      throw fnErr;
    }
    if (failed) response = fnErr.response;
    let comp;
    try {
      comp = await this.complete(ns, key, { ownerToken: res.ownerToken, response, retentionS: opts.retentionS });
    } catch (err) {
      if (err instanceof NotOwnerError) {
        throw new LeaseLostError(`idem: ${ns}/${key}: another owner took the key while fn ran; its work may be repeated`, { cause: err });
      }
      if (err instanceof InvalidArgumentError || err instanceof PayloadTooLargeError) {
        await release();
        throw new IdemError(err.code, `idem: ${ns}/${key}: fn's response cannot be stored, so the key was released: ${err.message}`, { status: err.status, cause: failed ? fnErr : err });
      }
      throw new IdemError(err.code ?? 'UNAVAILABLE', `idem: ${ns}/${key}: fn finished but completing failed; the key stays reserved until its lease runs out and the next owner reclaims it: ${err.message}`, { status: err.status, cause: err });
    }
    if (failed) throw fnErr;
    return { response: decodeResponse(encodeResponse(response)), replayed: false, fencingToken: res.fencingToken, completedAt: comp.completedAt, expiresAt: comp.expiresAt };
  }

  /**
   * Renews the lease every third of it until stop(); aborts controller with a
   * LeaseLostError when a renewal answers NOT_OWNER, or when renewals keep
   * failing until localEnd (the lease's end by this clock, counted from
   * before the reserve was sent: early, never late). Used by run() and the
   * middleware; not part of the typed API.
   */
  keepLease(ns, key, ownerToken, leaseMs, localEnd, controller, intervalMs) {
    const interval = Math.max(Math.floor(intervalMs || leaseMs / 3), 1);
    const stopper = new AbortController();
    let timer;
    let inflight = Promise.resolve();
    const schedule = (ms) => { timer = setTimeout(tick, Math.max(ms, 1)); };
    const tick = () => {
      inflight = (async () => {
        const sent = Date.now();
        const deadline = AbortSignal.timeout(Math.max(localEnd - sent, 1));
        try {
          await this.call('POST', `${this.keyPath(ns, key)}:heartbeat`, { owner_token: ownerToken, lease_ms: leaseMs },
            { signal: AbortSignal.any([stopper.signal, deadline]), retry: false });
          localEnd = sent + leaseMs;
          if (!stopper.signal.aborted) schedule(interval);
        } catch (err) {
          if (stopper.signal.aborted) return;
          if (err instanceof NotOwnerError) {
            this.logger.warn('idem: lease lost: another owner holds the key', { ns, key });
            controller.abort(new LeaseLostError(`idem: ${ns}/${key}: lease lost: ${err.message}`, { cause: err }));
            return;
          }
          if (Date.now() >= localEnd) {
            this.logger.warn('idem: lease lost: heartbeats failed until the lease ran out', { ns, key, err: String(err) });
            controller.abort(new LeaseLostError(`idem: ${ns}/${key}: heartbeats failed until the lease ran out`, { cause: err }));
            return;
          }
          this.logger.warn('idem: heartbeat failed; retrying', { ns, key, err: String(err) });
          schedule(Math.min(interval / 4, localEnd - Date.now()));
        }
      })();
    };
    schedule(interval);
    return {
      stop: async () => {
        stopper.abort();
        clearTimeout(timer);
        await inflight;
      },
    };
  }

  /**
   * Runs fn at most once to completion per (ns, eventId): consumer-side
   * deduplication of at-least-once delivery (the Go client's Once). Returns
   * {ran}: true when this call ran fn.
   */
  async once(ns, eventId, fn, opts = {}) {
    let ran = false;
    const res = await this.run(ns, eventId, async (lease) => {
      ran = true;
      try {
        await fn(lease.fencingToken, lease);
      } catch (err) {
        if (err instanceof PermanentError) {
          throw new PermanentError(err.message, { status: 422, body: String(err.message).slice(0, 4096) }, { cause: err });
        }
        throw err;
      }
      return { status: 200 };
    }, opts);
    if (!ran && res.response.status === 422) {
      throw new PermanentError(`idem: event ${ns}/${eventId} failed permanently before: ${res.response.body.toString('utf8')}`, res.response);
    }
    return { ran };
  }
}
