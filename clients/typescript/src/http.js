// The proxy's HTTP rules, shared by the middleware: the Idempotency-Key
// header, the request fingerprint, Prefer: wait, problem+json answers and
// which response headers are stored.

import { createHash, createHmac, X509Certificate } from 'node:crypto';

export const HEADER_KEY = 'Idempotency-Key';
export const HEADER_FENCING_TOKEN = 'Idempotency-Fencing-Token';
export const HEADER_REPLAYED = 'Idempotent-Replayed';
export const HEADER_BODY_OMITTED = 'Idempotent-Body-Omitted';
export const HEADER_KEY_EXPIRES = 'Idempotency-Key-Expires';
export const PROBLEM_CONTENT_TYPE = 'application/problem+json';
export const PROBLEM_TYPE_BASE = 'https://idem.dev/problems/';

const MAX_KEY_BYTES = 255;
const NAMESPACE_RE = /^[a-z0-9][a-z0-9._-]{0,62}$/;

export const validNamespace = (ns) => typeof ns === 'string' && NAMESPACE_RE.test(ns);

/** The problems the middleware answers with: slug -> title (the proxy's). */
export const problems = Object.freeze({
  'invalid-idempotency-key': 'Invalid Idempotency-Key',
  'missing-idempotency-key': 'Idempotency-Key required',
  'missing-caller-identity': 'Caller identity required',
  'invalid-namespace': 'Invalid caller namespace',
  'request-too-large': 'Request body too large',
  'unreadable-request-body': 'Request body could not be read',
  'request-in-progress': 'A request with this Idempotency-Key is in progress',
  'idempotency-key-reused': 'Idempotency-Key reused for a different request',
  'idempotency-key-expired': 'Idempotency-Key expired',
  'store-unavailable': 'Idempotency store unavailable',
  'internal-error': 'Internal error',
});

/** A problem+json answer: {status, slug, detail, retryAfterMs?, headers?}. */
export function problem(status, slug, detail, extra = {}) {
  return { status, slug, detail, ...extra };
}

/** The JSON body of a problem. */
export function problemBody(p) {
  return JSON.stringify({ type: PROBLEM_TYPE_BASE + p.slug, title: problems[p.slug], status: p.status, detail: p.detail }) + '\n';
}

/** Retry-After seconds of ms: rounded up, at least 1. */
export const retryAfterSeconds = (ms) => Math.max(Math.ceil(ms / 1000), 1);

/**
 * The key of a request's Idempotency-Key field lines: {present:false}, or
 * {present:true, key} or {present:true, error}. A structured-field string
 * ("k", with \" and \\ escapes) or a bare value; 1 to 255 bytes of printable
 * ASCII; several field lines are an error.
 */
export function parseKey(values) {
  if (values.length === 0) return { present: false };
  if (values.length > 1) return { present: true, error: `${values.length} ${HEADER_KEY} fields: send exactly one` };
  let v = values[0].replace(/^[ \t]+|[ \t]+$/g, '');
  if (v === '') return { present: true, error: `${HEADER_KEY} is empty: send a key of 1 to ${MAX_KEY_BYTES} printable ASCII characters` };
  if (v[0] === '"') {
    let out = '';
    let closed = false;
    for (let i = 1; i < v.length; i++) {
      const c = v.charCodeAt(i);
      if (v[i] === '\\') {
        i++;
        if (i === v.length || (v[i] !== '"' && v[i] !== '\\')) return { present: true, error: `${HEADER_KEY} ${JSON.stringify(v)} has an invalid escape: only \\" and \\\\ are allowed in a quoted key` };
        out += v[i];
      } else if (v[i] === '"') {
        if (i !== v.length - 1) return { present: true, error: `${HEADER_KEY} ${JSON.stringify(v)} has text after the closing quote (parameters are not supported)` };
        closed = true;
        break;
      } else if (c < 0x20 || c > 0x7e) {
        return { present: true, error: `${HEADER_KEY} has byte 0x${c.toString(16).toUpperCase().padStart(2, '0')} inside the quotes: use printable ASCII` };
      } else {
        out += v[i];
      }
    }
    if (!closed) return { present: true, error: `${HEADER_KEY} ${JSON.stringify(v)} has no closing quote` };
    v = out;
  }
  if (v.length === 0) return { present: true, error: `the idempotency key is empty: use 1 to ${MAX_KEY_BYTES} printable ASCII characters` };
  if (v.length > MAX_KEY_BYTES) return { present: true, error: `the idempotency key is ${v.length} bytes long: use at most ${MAX_KEY_BYTES}` };
  for (let i = 0; i < v.length; i++) {
    const c = v.charCodeAt(i);
    if (c < 0x21 || c > 0x7e) {
      return { present: true, error: `the idempotency key has byte 0x${c.toString(16).toUpperCase().padStart(2, '0')} at position ${i}: use printable ASCII without spaces (0x21-0x7E)` };
    }
  }
  return { present: true, key: v };
}

/** Prefer: wait=N in ms, or -1 when absent or not a non-negative integer (RFC 7240). */
export function parsePreferWait(values) {
  for (const v of values) {
    for (let pref of v.split(',')) {
      pref = pref.split(';')[0];
      const eq = pref.indexOf('=');
      if (eq < 0 || pref.slice(0, eq).trim().toLowerCase() !== 'wait') continue;
      const val = pref.slice(eq + 1).trim().replace(/^"+|"+$/g, '');
      if (!/^[0-9]{1,10}$/.test(val) || Number(val) > 0xffffffff) return -1;
      return Number(val) * 1000;
    }
  }
  return -1;
}

/**
 * The proxy's fingerprint: SHA-256 over a version tag, the method, the path
 * as sent, the raw query and the named headers, each length-prefixed (8-byte
 * big-endian), then the body: "sha256:" + 64 hex digits.
 */
export function fingerprint(method, rawPath, rawQuery, headerFields, body) {
  const h = createHash('sha256');
  const field = (s) => {
    const b = Buffer.from(s, 'latin1');
    const n = Buffer.alloc(8);
    n.writeBigUInt64BE(BigInt(b.length));
    h.update(n);
    h.update(b);
  };
  field('idem-http-fingerprint-v1');
  field(method);
  field(rawPath);
  field(rawQuery);
  for (const [name, value] of headerFields) {
    field(name);
    field(value);
  }
  h.update(body);
  return 'sha256:' + h.digest('hex');
}

/** The namespace of a verified client certificate (the proxy's rule). */
export function namespaceFromCert(raw) {
  const cert = new X509Certificate(raw);
  const cn = /(?:^|\n)CN=([^\n]*)/.exec(cert.subject)?.[1] ?? '';
  if (validNamespace(cn) && !cn.startsWith('spki-')) return cn;
  const spki = cert.publicKey.export({ type: 'spki', format: 'der' });
  return 'spki-' + createHash('sha256').update(spki).digest('hex').slice(0, 40);
}

/** The namespace of a request known only by its Authorization header. */
export function namespaceFromAuthorization(key, value) {
  return 'auth-' + createHmac('sha256', key).update(value).digest('hex').slice(0, 40);
}

/** Canonical form of a header name (Content-Type). */
export function canonicalHeader(name) {
  return name.toLowerCase().replace(/(^|-)([a-z])/g, (_, dash, c) => dash + c.toUpperCase());
}

// Hop-by-hop headers, cookies, the per-response Date and Content-Length (a
// replay is a new message: the server dates it and frames its body) and the
// replay markers: never stored, and never replayed from a record that holds
// them (one completed through the JSON API, or by another producer).
const neverStored = new Set([
  'connection', 'keep-alive', 'proxy-connection', 'proxy-authenticate', 'proxy-authorization', 'te', 'trailer',
  'transfer-encoding', 'upgrade', 'set-cookie', 'set-cookie2', 'content-length', 'date', 'idempotent-replayed',
  'idempotent-body-omitted', 'idempotency-key-expires',
]);

/**
 * The stored headers a replay sends: all but those never stored (except the
 * body-omitted marker, which the middleware stores itself) and those a
 * stored Connection header names.
 */
export function replayedHeaders(stored) {
  const connection = new Set();
  for (const [name, value] of Object.entries(stored)) {
    if (name.toLowerCase() !== 'connection') continue;
    for (const n of String(value).split(',')) if (n.trim()) connection.add(n.trim().toLowerCase());
  }
  const out = {};
  for (const [name, value] of Object.entries(stored)) {
    const lower = name.toLowerCase();
    if (lower === HEADER_BODY_OMITTED.toLowerCase() || (!neverStored.has(lower) && !connection.has(lower))) out[name] = value;
  }
  return out;
}
const TOKEN_RE = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

function headerValue(v) {
  return Array.isArray(v) ? v.map(String).join(', ') : String(v);
}

/**
 * The response headers to store: those the handler set or changed (not in
 * `before` with the same value), minus hop-by-hop headers, cookies,
 * Content-Length and the replay markers, within the store's bounds (100
 * headers, 256-byte names, 8 KiB values without control characters, 64 KiB
 * in all; one entry kept free for the body-omitted marker). Returns {stored,
 * dropped}.
 */
export function storedHeaders(after, before, deny = new Set()) {
  const connection = new Set(headerValue(after.connection ?? '').split(',').map((s) => s.trim().toLowerCase()).filter(Boolean));
  const stored = {};
  const dropped = [];
  let total = 0;
  let count = 0;
  for (const name of Object.keys(after).sort()) {
    const lower = name.toLowerCase();
    const value = headerValue(after[name]);
    if (neverStored.has(lower) || connection.has(lower) || deny.has(lower)) continue;
    if (before[lower] !== undefined && headerValue(before[lower]) === value) continue;
    const canon = canonicalHeader(lower);
    // eslint-disable-next-line no-control-regex
    const ok = canon.length <= 256 && TOKEN_RE.test(canon) && value.length <= 8192 && !/[\x00-\x08\x0a-\x1f\x7f]/.test(value);
    if (!ok || count >= 99 || total + canon.length + value.length > 65536 - HEADER_BODY_OMITTED.length - 4) {
      dropped.push(canon);
      continue;
    }
    stored[canon] = value;
    total += canon.length + value.length;
    count++;
  }
  return { stored, dropped };
}

/** The statuses whose response is not final by default: 5xx, 408, 425, 429. */
export const defaultReleaseStatus = (status) => status >= 500 || status === 408 || status === 425 || status === 429;

/** Whether a status carries a body (not 1xx, 204 or 304). */
export const bodyAllowed = (status) => !(status < 200 || status === 204 || status === 304);
