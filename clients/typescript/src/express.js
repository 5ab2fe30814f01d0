// Express middleware with the semantics of idem's proxy mode.

import {
  HEADER_KEY, HEADER_FENCING_TOKEN, HEADER_REPLAYED, HEADER_BODY_OMITTED, HEADER_KEY_EXPIRES, PROBLEM_CONTENT_TYPE,
  parseKey, parsePreferWait, fingerprint, problem, problemBody, retryAfterSeconds, storedHeaders, replayedHeaders,
  defaultReleaseStatus, bodyAllowed, validNamespace, namespaceFromCert, namespaceFromAuthorization,
} from './http.js';
import { newOwnerToken } from './client.js';
import { NotOwnerError, PayloadTooLargeError, InvalidArgumentError, LeaseLostError } from './errors.js';

const middlewareDefaults = Object.freeze({
  methods: ['POST', 'PATCH'],
  maxRequestBytes: 1 << 20,
  maxStoredBodyBytes: 1 << 20,
  leaseMs: 30_000,
  timeoutMs: 60_000,
  maxWaitMs: 30_000,
  defaultNamespace: 'default',
});

/** Every field line of a request header, as sent (Node joins repeated ones). */
function headerLines(req, name) {
  const lower = name.toLowerCase();
  const out = [];
  for (let i = 0; i < req.rawHeaders.length; i += 2) {
    if (req.rawHeaders[i].toLowerCase() === lower) out.push(req.rawHeaders[i + 1]);
  }
  return out;
}

/** Removes every header a framework could read as the fencing token ('_' folds to '-'). */
function stripFencingHeaders(req) {
  for (const name of Object.keys(req.headers)) {
    if (name.replaceAll('_', '-') === 'idempotency-fencing-token') delete req.headers[name];
  }
}

function sendProblem(res, p) {
  res.statusCode = p.status;
  for (const [name, value] of Object.entries(p.headers ?? {})) res.setHeader(name, value);
  res.setHeader('Content-Type', PROBLEM_CONTENT_TYPE);
  res.setHeader('Cache-Control', 'no-store');
  if (p.retryAfterMs > 0) res.setHeader('Retry-After', String(retryAfterSeconds(p.retryAfterMs)));
  res.end(problemBody(p));
}

/** Parses the body for the handler, as express.json/text/urlencoded would. */
function parseBody(req, raw) {
  const type = String(req.headers['content-type'] ?? '').split(';')[0].trim().toLowerCase();
  if (raw.length === 0) return {};
  if (type === 'application/json' || type.endsWith('+json')) {
    const text = raw.toString('utf8');
    try {
      return JSON.parse(text);
    } catch (err) {
      const e = new SyntaxError(`the request body is not valid JSON: ${err.message}`);
      e.status = 400;
      e.statusCode = 400;
      e.type = 'entity.parse.failed';
      e.expose = true;
      e.body = text;
      throw e;
    }
  }
  if (type === 'application/x-www-form-urlencoded') return Object.fromEntries(new URLSearchParams(raw.toString('utf8')));
  if (type.startsWith('text/')) return raw.toString('utf8');
  return raw;
}

/**
 * Holds the response the handler writes (writeHead, write, end, and pipe,
 * which uses them) until the key is completed or released. A body that
 * outgrows `limit` starts streaming to the caller and is stored without it.
 */
function captureResponse(res, limit) {
  const orig = { writeHead: res.writeHead, write: res.write, end: res.end, flushHeaders: res.flushHeaders };
  const state = { chunks: [], size: 0, overflow: false, ended: null };
  state.done = new Promise((resolve) => { state.ended = resolve; });
  const restore = () => {
    // The methods were set on the instance: deleting them uncovers the originals.
    delete res.writeHead;
    delete res.write;
    delete res.end;
    delete res.flushHeaders;
  };
  const add = (chunk, encoding) => {
    if (chunk === undefined || chunk === null) return;
    const buf = typeof chunk === 'string' ? Buffer.from(chunk, typeof encoding === 'string' ? encoding : 'utf8') : Buffer.from(chunk);
    if (buf.length === 0) return;
    if (state.overflow) {
      orig.write.call(res, buf);
      return;
    }
    state.chunks.push(buf);
    state.size += buf.length;
    if (state.size > limit) {
      // Too large to store: send what we have and stream the rest.
      state.overflow = true;
      orig.writeHead.call(res, res.statusCode);
      for (const c of state.chunks) orig.write.call(res, c);
      state.chunks = [];
    }
  };
  res.writeHead = function writeHead(status, reason, headers) {
    if (typeof reason !== 'string') { headers = reason; reason = undefined; }
    res.statusCode = status;
    if (reason) res.statusMessage = reason;
    if (Array.isArray(headers)) {
      for (let i = 0; i + 1 < headers.length; i += 2) res.setHeader(headers[i], headers[i + 1]);
    } else if (headers) {
      for (const [name, value] of Object.entries(headers)) res.setHeader(name, value);
    }
    return res;
  };
  res.write = function write(chunk, encoding, cb) {
    if (typeof encoding === 'function') { cb = encoding; encoding = undefined; }
    add(chunk, encoding);
    if (cb) process.nextTick(cb);
    return true;
  };
  res.end = function end(chunk, encoding, cb) {
    if (typeof chunk === 'function') { cb = chunk; chunk = undefined; }
    if (typeof encoding === 'function') { cb = encoding; encoding = undefined; }
    add(chunk, encoding);
    if (cb) res.once('finish', cb);
    state.ended();
    return res;
  };
  res.flushHeaders = function flushHeaders() {}; // deferred: the response is held until stored
  return {
    state,
    body: () => Buffer.concat(state.chunks),
    deliver: (extraHeaders = {}) => {
      restore();
      if (state.overflow) {
        res.end();
        return;
      }
      for (const [name, value] of Object.entries(extraHeaders)) res.setHeader(name, value);
      res.end(state.chunks.length ? Buffer.concat(state.chunks) : undefined);
    },
  };
}

/**
 * Express middleware that makes keyed POST and PATCH requests idempotent
 * over an IdemClient, with the semantics of `idemrouter --upstream`. Mount it
 * before any body parser: it reads the body itself (the fingerprint covers
 * it) and sets req.body (parsed like express.json/text/urlencoded) and
 * req.rawBody. See index.d.ts for the options.
 */
export function idempotency(client, options = {}) {
  const o = { ...middlewareDefaults, ...options };
  const methods = new Set(o.methods.map((m) => m.toUpperCase()));
  const isRelease = o.releaseStatus ?? defaultReleaseStatus;
  const fpHeaders = [...new Set((o.fingerprintHeaders ?? []).map((h) => h.toLowerCase()))].sort();
  const deny = new Set((o.storedHeaderDeny ?? []).map((h) => h.toLowerCase()));
  const log = o.logger ?? client.logger;
  if (!(o.leaseMs >= 100 && o.leaseMs <= 600_000)) throw new InvalidArgumentError('INVALID_ARGUMENT', `idem: middleware: leaseMs ${o.leaseMs} is outside 100..600000`);
  const heartbeatMs = o.heartbeatMs ?? Math.floor(o.leaseMs / 3);
  if (!(heartbeatMs > 0 && heartbeatMs < o.leaseMs)) throw new InvalidArgumentError('INVALID_ARGUMENT', `idem: middleware: heartbeatMs ${heartbeatMs} must be below leaseMs`);

  async function namespaceOf(req) {
    if (o.namespace) {
      let ns;
      try {
        ns = await o.namespace(req);
      } catch (err) {
        return { problem: problem(401, 'missing-caller-identity', `the caller could not be identified: ${err?.message ?? err}`, { headers: { 'WWW-Authenticate': 'Namespace realm="idem"' } }) };
      }
      return validNamespace(ns) ? { ns } : { problem: problem(400, 'invalid-namespace', `the caller's namespace ${JSON.stringify(String(ns))} is not valid: use [a-z0-9][a-z0-9._-]{0,62}`) };
    }
    if (o.namespaceHeader) {
      const values = headerLines(req, o.namespaceHeader);
      if (values.length === 0 || values[0] === '') {
        return { problem: problem(401, 'missing-caller-identity', `requests with an ${HEADER_KEY} must name their caller in the ${o.namespaceHeader} header`, { headers: { 'WWW-Authenticate': `Namespace realm="idem", header="${o.namespaceHeader}"` } }) };
      }
      if (values.length > 1) return { problem: problem(400, 'invalid-namespace', `send exactly one ${o.namespaceHeader} header`) };
      return validNamespace(values[0]) ? { ns: values[0] } : { problem: problem(400, 'invalid-namespace', `${o.namespaceHeader} ${JSON.stringify(values[0])} is not a valid namespace: use [a-z0-9][a-z0-9._-]{0,62}`) };
    }
    if (req.socket?.authorized && typeof req.socket.getPeerCertificate === 'function') {
      const cert = req.socket.getPeerCertificate();
      if (cert?.raw) return { ns: namespaceFromCert(cert.raw) };
    }
    if (o.authorizationKey && req.headers.authorization) {
      return { ns: namespaceFromAuthorization(o.authorizationKey, headerLines(req, 'authorization').join(', ')) };
    }
    return { ns: o.defaultNamespace };
  }

  async function readBody(req) {
    const chunks = [];
    let size = 0;
    for await (const chunk of req) {
      size += chunk.length;
      if (size > o.maxRequestBytes) return { tooLarge: true };
      chunks.push(chunk);
    }
    return { raw: Buffer.concat(chunks) };
  }

  async function serve(req, res, next) {
    stripFencingHeaders(req);
    if (!methods.has(req.method)) return next();
    const parsed = parseKey(headerLines(req, HEADER_KEY));
    if (parsed.error) return sendProblem(res, problem(400, 'invalid-idempotency-key', parsed.error));
    if (!parsed.present) {
      if (o.requireKey) {
        return sendProblem(res, problem(400, 'missing-idempotency-key',
          `${req.method} requests here need an ${HEADER_KEY} header: send a unique key (a UUID, say) and the same key with every retry of the request`));
      }
      return next();
    }
    const key = parsed.key;
    const { ns, problem: nsProblem } = await namespaceOf(req);
    if (nsProblem) return sendProblem(res, nsProblem);
    const tooLarge = () => sendProblem(res, problem(413, 'request-too-large', `a request with an ${HEADER_KEY} may carry at most ${o.maxRequestBytes} bytes of body`));
    if (Number(req.headers['content-length'] ?? 0) > o.maxRequestBytes) return tooLarge();
    if (req._body) {
      log.warn('idem: middleware: a body parser ran before idempotency(); mount it first');
      return sendProblem(res, problem(500, 'internal-error', 'the server is misconfigured: the idempotency middleware must run before any body parser'));
    }
    let body;
    try {
      body = await readBody(req);
    } catch (err) {
      return sendProblem(res, problem(400, 'unreadable-request-body', `reading the request body failed: ${err?.message ?? err}`));
    }
    if (body.tooLarge) return tooLarge();

    const url = req.originalUrl ?? req.url;
    const q = url.indexOf('?');
    const fp = fingerprint(req.method, q < 0 ? url : url.slice(0, q), q < 0 ? '' : url.slice(q + 1),
      fpHeaders.map((h) => [h.replace(/(^|-)([a-z])/g, (_, d, c) => d + c.toUpperCase()), headerLines(req, h).join(', ')]), body.raw);

    const ownerToken = newOwnerToken();
    const prefer = parsePreferWait(headerLines(req, 'prefer'));
    const waitMs = o.maxWaitMs < 0 || prefer < 0 ? 0 : Math.min(prefer, o.maxWaitMs);
    const sentAt = Date.now();
    let res0;
    try {
      res0 = await client.reserve(ns, key, { fingerprint: fp, leaseMs: o.leaseMs, ownerToken, waitMs });
    } catch (err) {
      if (err instanceof InvalidArgumentError) {
        log.warn('idem: middleware: the store refused a reserve', { ns, key, err: String(err) });
        return sendProblem(res, problem(500, 'internal-error', 'the idempotency store refused the reservation'));
      }
      log.warn('idem: middleware: reserve failed; answering 503', { ns, key, err: String(err) });
      return sendProblem(res, problem(503, 'store-unavailable',
        'the idempotency store could not decide in time, so the request was not run: retry it with the same Idempotency-Key after Retry-After', { retryAfterMs: 1000 }));
    }
    switch (res0.outcome) {
      case 'COMPLETED': {
        const r = res0.response;
        for (const [name, value] of Object.entries(replayedHeaders(r.headers))) res.setHeader(name, value);
        res.setHeader(HEADER_REPLAYED, 'true');
        if (res0.expiresAt) res.setHeader(HEADER_KEY_EXPIRES, res0.expiresAt.toUTCString());
        res.statusCode = r.status;
        res.end(r.body.length && bodyAllowed(r.status) ? r.body : undefined);
        return;
      }
      case 'IN_PROGRESS':
        return sendProblem(res, problem(409, 'request-in-progress', waitMs > 0
          ? `another request with this Idempotency-Key is still running after waiting ${waitMs / 1000}s for it: retry after Retry-After to get its response`
          : 'another request with this Idempotency-Key is running: retry after Retry-After to get its response',
        { retryAfterMs: Math.max(res0.retryAfterMs ?? 0, 1000) }));
      case 'FINGERPRINT_MISMATCH':
        return sendProblem(res, problem(422, 'idempotency-key-reused',
          'this Idempotency-Key was used for a request with another method, path, query or body: use a new key for a new request'));
      case 'EXPIRED':
        return sendProblem(res, problem(410, 'idempotency-key-expired',
          'this Idempotency-Key was used and its stored response has expired: the request was not run again; use a new key for a new request'));
      case 'ACQUIRED':
      case 'RECLAIMED':
        break;
      default:
        return sendProblem(res, problem(500, 'internal-error', 'the idempotency store answered an unknown outcome'));
    }
    if (res0.outcome === 'RECLAIMED') {
      log.warn('idem: middleware: reclaimed a key whose earlier attempt\'s lease ran out; that attempt may have done part of the work',
        { ns, key, previousFencingToken: String(res0.previousFencingToken) });
    }
    await run(req, res, next, { ns, key, ownerToken, res0, sentAt, raw: body.raw });
  }

  async function run(req, res, next, { ns, key, ownerToken, res0, sentAt, raw }) {
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(new DOMException('the handler ran past the middleware timeout', 'TimeoutError')), o.timeoutMs);
    const hb = client.keepLease(ns, key, ownerToken, o.leaseMs, sentAt + o.leaseMs, controller, heartbeatMs);
    req.idempotency = {
      key,
      namespace: ns,
      fencingToken: res0.fencingToken,
      reclaimed: res0.outcome === 'RECLAIMED',
      previousFencingToken: res0.previousFencingToken,
      expiresAt: res0.leaseExpiresAt,
      signal: controller.signal,
    };
    req.headers[HEADER_FENCING_TOKEN.toLowerCase()] = String(res0.fencingToken);
    req.rawBody = raw;
    const before = res.getHeaders();
    const cap = captureResponse(res, o.maxStoredBodyBytes);
    let parseError;
    try {
      req.body = o.parseBody === false ? raw : parseBody(req, raw);
    } catch (err) {
      parseError = err;
      req.body = raw;
    }
    req._body = true; // body-parser skips a parsed body
    try {
      next(parseError);
    } catch (err) {
      // A synchronous throw outside Express's own try (another framework): a 500.
      log.warn('idem: middleware: the handler threw', { ns, key, err: String(err) });
      if (!cap.state.overflow) {
        res.statusCode = 500;
        res.end();
      }
    }
    await cap.state.done;
    clearTimeout(timer);
    await hb.stop();
    const status = res.statusCode;
    const lost = controller.signal.aborted && controller.signal.reason instanceof LeaseLostError;
    const release = async () => {
      try {
        await client.release(ns, key, { ownerToken });
      } catch (err) {
        if (!(err instanceof NotOwnerError)) log.warn('idem: middleware: release failed; the key stays reserved until its lease runs out', { ns, key, err: String(err) });
      }
    };
    const extra = {};
    if (isRelease(status)) {
      await release();
    } else {
      if (lost) log.warn('idem: middleware: the lease was lost while the handler ran', { ns, key });
      const { stored: headers, dropped } = storedHeaders(res.getHeaders(), before, deny);
      if (dropped.length) log.warn('idem: middleware: response headers beyond the store\'s bounds are not stored; replays lack them', { ns, key, headers: dropped });
      let bodyOut = cap.state.overflow ? undefined : cap.body();
      if (cap.state.overflow) headers[HEADER_BODY_OMITTED] = 'true';
      const complete = (b) => client.complete(ns, key, { ownerToken, response: { status, headers, body: b }, retentionS: o.retentionS });
      try {
        let comp;
        try {
          comp = await complete(bodyOut);
        } catch (err) {
          if (!(err instanceof PayloadTooLargeError) || cap.state.overflow) throw err;
          log.warn('idem: middleware: the store refused the response body as too large; storing it without the body (set maxStoredBodyBytes to the store\'s --max-response-bytes)', { ns, key });
          headers[HEADER_BODY_OMITTED] = 'true';
          bodyOut = undefined;
          comp = await complete(bodyOut);
        }
        if (comp.expiresAt && !cap.state.overflow) extra[HEADER_KEY_EXPIRES] = comp.expiresAt.toUTCString();
      } catch (err) {
        if (err instanceof NotOwnerError) {
          log.warn('idem: middleware: lease lost: another request reclaimed the key while this one ran, so its response is not stored', { ns, key });
        } else if (err instanceof InvalidArgumentError || err instanceof PayloadTooLargeError) {
          log.warn('idem: middleware: the store refused the response; releasing the key so that a retry runs again', { ns, key, err: String(err) });
          await release();
        } else {
          log.warn('idem: middleware: completing failed; the key stays reserved until its lease runs out, and the next request with it reclaims it', { ns, key, err: String(err) });
        }
      }
    }
    cap.deliver(extra);
  }

  return function idempotencyMiddleware(req, res, next) {
    serve(req, res, next).catch((err) => {
      log.warn('idem: middleware failed', { err: String(err) });
      if (!res.headersSent) sendProblem(res, problem(500, 'internal-error', 'the idempotency middleware failed'));
    });
  };
}
