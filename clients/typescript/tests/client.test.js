// The client against a real idemnode --dev: every v1 call, run(), once(),
// retries of 503, lease loss and a killed owner.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  IdemClient, newKey, NotOwnerError, InvalidArgumentError, NotFoundError, FailedPreconditionError,
  FingerprintMismatchError, InProgressError, LeaseLostError, PermanentError, UnavailableError,
} from '../src/index.js';
import { startNode, sleep, spawnUntil, kill } from './helpers.js';

const fixtures = join(dirname(fileURLToPath(import.meta.url)), 'fixtures');
let node;
let client;
before(async () => {
  node = await startNode();
  client = new IdemClient({ baseUrl: node.url });
});
after(async () => { await node?.stop(); });

const ns = 'ts-client';

test('reserve, heartbeat, get, complete, replay and the error codes', async () => {
  const key = `order:${newKey()}/a%b?c#d`; // ':' '/' '%' '?' '#' travel encoded
  const first = await client.reserve(ns, key, { fingerprint: 'fp-1', leaseMs: 5000 });
  assert.equal(first.outcome, 'ACQUIRED');
  assert.equal(typeof first.fencingToken, 'bigint');
  assert.ok(first.ownerToken.length >= 16);
  assert.ok(first.leaseExpiresAt instanceof Date);

  const again = await client.reserve(ns, key, { fingerprint: 'fp-1', ownerToken: first.ownerToken });
  assert.equal(again.outcome, 'ACQUIRED', 'a repeat with the same owner token is the same reservation');
  assert.equal(again.fencingToken, first.fencingToken);

  const other = await client.reserve(ns, key, { fingerprint: 'fp-1' });
  assert.equal(other.outcome, 'IN_PROGRESS');
  assert.ok(other.retryAfterMs > 0);
  assert.equal((await client.reserve(ns, key, { fingerprint: 'fp-2' })).outcome, 'FINGERPRINT_MISMATCH');

  const hb = await client.heartbeat(ns, key, { ownerToken: first.ownerToken, leaseMs: 20_000 });
  assert.ok(hb.leaseExpiresAt > first.leaseExpiresAt);
  await assert.rejects(client.heartbeat(ns, key, { ownerToken: 'x'.repeat(22) }), NotOwnerError);

  const rec = await client.get(ns, key);
  assert.equal(rec.state, 'IN_PROGRESS');
  assert.equal(rec.fingerprint, 'fp-1');
  assert.equal(rec.fencingToken, first.fencingToken);

  const body = Buffer.from([0, 1, 2, 255, 10]);
  const done = await client.complete(ns, key, {
    ownerToken: first.ownerToken, response: { status: 201, headers: { 'Content-Type': 'application/octet-stream' }, body }, retentionS: 600,
  });
  assert.ok(done.expiresAt > done.completedAt);
  const replay = await client.reserve(ns, key, { fingerprint: 'fp-1' });
  assert.equal(replay.outcome, 'COMPLETED');
  assert.equal(replay.response.status, 201);
  assert.deepEqual(replay.response.headers, { 'Content-Type': 'application/octet-stream' });
  assert.deepEqual(Buffer.from(replay.response.body), body);
  assert.equal(replay.fencingToken, first.fencingToken);
  const got = await client.get(ns, key);
  assert.equal(got.state, 'COMPLETED');
  assert.deepEqual(Buffer.from(got.response.body), body);

  await assert.rejects(client.release(ns, key, { ownerToken: first.ownerToken }), NotOwnerError, 'a completed key is final');
  assert.equal(await client.get(ns, `absent-${newKey()}`), null);
  await assert.rejects(client.reserve('Bad Namespace', 'k'), (err) => err instanceof InvalidArgumentError && err.status === 400);
  await assert.rejects(client.release(ns, key, { ownerToken: 'bad token!' }), InvalidArgumentError);
});

test('release frees the key for a larger fencing token', async () => {
  const key = newKey();
  const a = await client.reserve(ns, key);
  await client.release(ns, key, { ownerToken: a.ownerToken });
  const b = await client.reserve(ns, key);
  assert.equal(b.outcome, 'ACQUIRED');
  assert.ok(b.fencingToken > a.fencingToken);
  await assert.rejects(client.release(ns, key, { ownerToken: a.ownerToken }), NotOwnerError);
});

test('operator actions: list, force-release, delete', async () => {
  const opNs = `ts-ops-${Date.now()}`;
  const a = await client.reserve(opNs, 'stuck');
  const b = await client.reserve(opNs, 'done');
  await client.complete(opNs, 'done', { ownerToken: b.ownerToken, response: { status: 200 } });
  const page = await client.listKeys(opNs, { limit: 10 });
  assert.deepEqual(page.keys.map((k) => `${k.key}=${k.state}`).sort(), ['done=COMPLETED', 'stuck=IN_PROGRESS']);
  const inProgress = await client.listKeys(opNs, { state: 'IN_PROGRESS' });
  assert.deepEqual(inProgress.keys.map((k) => k.key), ['stuck']);

  const fr = await client.forceRelease(opNs, 'stuck', { reason: 'test' });
  assert.equal(fr.previousFencingToken, a.fencingToken);
  await assert.rejects(client.heartbeat(opNs, 'stuck', { ownerToken: a.ownerToken }), NotOwnerError);
  const next = await client.reserve(opNs, 'stuck');
  assert.equal(next.outcome, 'RECLAIMED');
  assert.equal(next.previousFencingToken, a.fencingToken);
  await assert.rejects(client.forceRelease(opNs, 'done', { reason: 'test' }), FailedPreconditionError);

  await client.deleteKey(opNs, 'done', { reason: 'test' });
  assert.equal(await client.get(opNs, 'done'), null);
  const fresh = await client.reserve(opNs, 'done');
  assert.equal(fresh.outcome, 'ACQUIRED');
  assert.ok(fresh.fencingToken > b.fencingToken);
  await assert.rejects(client.deleteKey(opNs, 'never', { reason: 'test' }), NotFoundError);
});

test('503 is retried after Retry-After with the same owner token', async () => {
  // A fault-injecting hop in front of the node: the first request of each
  // path gets 503 Retry-After: 1 (the store could not decide), the rest go
  // through.
  const seen = [];
  const failed = new Set();
  const hop = createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const body = Buffer.concat(chunks).toString();
    seen.push({ path: req.url, body, at: Date.now() });
    if (!failed.has(req.url)) {
      failed.add(req.url);
      res.writeHead(503, { 'Content-Type': 'application/json', 'Retry-After': '1' });
      res.end(JSON.stringify({ error: { code: 'UNAVAILABLE', message: 'no leader reachable' } }));
      return;
    }
    const r = await fetch(node.url + req.url, { method: req.method, body: req.method === 'GET' ? undefined : body, headers: { 'content-type': 'application/json' } });
    res.writeHead(r.status, { 'Content-Type': 'application/json' });
    res.end(await r.text());
  });
  await new Promise((r) => hop.listen(0, '127.0.0.1', r));
  try {
    const c = new IdemClient({ baseUrl: `http://127.0.0.1:${hop.address().port}` });
    const key = newKey();
    const res = await c.reserve(ns, key);
    assert.equal(res.outcome, 'ACQUIRED');
    const reserves = seen.filter((s) => s.path.endsWith(':reserve'));
    assert.equal(reserves.length, 2);
    assert.equal(JSON.parse(reserves[0].body).owner_token, JSON.parse(reserves[1].body).owner_token);
    assert.equal(JSON.parse(reserves[1].body).owner_token, res.ownerToken);
    assert.ok(reserves[1].at - reserves[0].at >= 900, 'the retry waited for Retry-After');

    const once = new IdemClient({ baseUrl: `http://127.0.0.1:${hop.address().port}`, maxAttempts: 1 });
    await assert.rejects(once.get(ns, key), (err) => err instanceof UnavailableError && err.retryAfterMs === 1000);
  } finally {
    hop.close();
  }
});

test('an attempt carrying megabytes gets a second per MiB more than timeoutMs', async () => {
  // A store that takes 800 ms to answer any request: longer than the 200 ms
  // timeoutMs, shorter than what a 3 MiB completion gets on top of it.
  const store = createServer(async (req, res) => {
    for await (const _ of req);
    await sleep(800);
    res.writeHead(200, { 'Content-Type': 'application/json' });
    res.end(JSON.stringify({ completed_at: '2026-12-05T00:00:00Z', expires_at: '2026-12-06T00:00:00Z' }));
  });
  await new Promise((r) => store.listen(0, '127.0.0.1', r));
  try {
    const c = new IdemClient({ baseUrl: `http://127.0.0.1:${store.address().port}`, timeoutMs: 200, maxAttempts: 1 });
    const ownerToken = 'owner-token-0123456789';
    const large = await c.complete(ns, newKey(), { ownerToken, response: { status: 200, body: 'x'.repeat(3 << 20) } });
    assert.equal(large.completedAt.toISOString(), '2026-12-05T00:00:00.000Z');
    await assert.rejects(c.complete(ns, newKey(), { ownerToken, response: { status: 200, body: 'small' } }), UnavailableError,
      'a small completion is still cut off at timeoutMs');
  } finally {
    store.closeAllConnections();
    store.close();
  }
});

test('run: concurrent duplicates run fn once and all see its response', async () => {
  const key = newKey();
  let runs = 0;
  const results = await Promise.all(Array.from({ length: 8 }, (_, i) => client.run(ns, key, async (lease) => {
    runs++;
    await sleep(300);
    return { status: 201, headers: { 'X-Caller': String(i) }, body: `charged by ${i} with ${lease.fencingToken}` };
  }, { fingerprint: 'same', maxWaitMs: 20_000 })));
  assert.equal(runs, 1);
  assert.equal(results.filter((r) => !r.replayed).length, 1);
  const bodies = new Set(results.map((r) => Buffer.from(r.response.body).toString()));
  assert.equal(bodies.size, 1);
  assert.ok(results.every((r) => r.response.status === 201));
});

test('run: fn that throws releases the key and the next run runs again', async () => {
  const key = newKey();
  let tokens = [];
  await assert.rejects(client.run(ns, key, async (lease) => { tokens.push(lease.fencingToken); throw new Error('card declined by a flaky network'); }),
    /flaky network/);
  const ok = await client.run(ns, key, async (lease) => { tokens.push(lease.fencingToken); return { status: 200, body: 'ok' }; });
  assert.equal(ok.replayed, false);
  assert.equal(tokens.length, 2);
  assert.ok(tokens[1] > tokens[0]);
  const replay = await client.run(ns, key, async () => { throw new Error('must not run'); });
  assert.equal(replay.replayed, true);
  assert.equal(Buffer.from(replay.response.body).toString(), 'ok');
});

test('run: a Permanent failure is stored and replayed', async () => {
  const key = newKey();
  await assert.rejects(client.run(ns, key, async () => { throw new PermanentError('amount is negative', { status: 422, body: 'bad amount' }); }), PermanentError);
  const replay = await client.run(ns, key, async () => { throw new Error('must not run'); });
  assert.equal(replay.replayed, true);
  assert.equal(replay.response.status, 422);
});

test('run: slow owner, a caller that does not wait and a retry that waits', async () => {
  const key = newKey();
  const slow = client.run(ns, key, async () => { await sleep(1500); return { status: 200, body: 'slow result' }; });
  await sleep(200);
  await assert.rejects(client.run(ns, key, async () => ({ status: 500 }), { maxWaitMs: 0 }), InProgressError);
  const waited = await client.run(ns, key, async () => { throw new Error('must not run'); }, { maxWaitMs: 15_000 });
  assert.equal(waited.replayed, true);
  assert.equal(Buffer.from(waited.response.body).toString(), 'slow result');
  assert.equal((await slow).replayed, false);
});

test('run: heartbeats keep a long fn\'s short lease', async () => {
  const key = newKey();
  let signal;
  const long = client.run(ns, key, async (lease) => {
    signal = lease.signal;
    await sleep(4000); // well over two 1.5 s leases
    return { status: 200, body: 'long' };
  }, { leaseMs: 1500 });
  for (let i = 0; i < 5; i++) {
    await sleep(700); // without heartbeats the key could be reclaimed from 1.6 s on
    const probe = await client.reserve(ns, key);
    assert.equal(probe.outcome, 'IN_PROGRESS', `probe ${i}: the lease must still be held`);
  }
  const res = await long;
  assert.equal(res.replayed, false);
  assert.equal(signal.aborted, false);
});

test('run: a lost lease aborts fn\'s signal and run rejects with LeaseLostError', async () => {
  const key = newKey();
  let abortedWith;
  const running = client.run(ns, key, (lease) => new Promise((resolve, reject) => {
    lease.signal.addEventListener('abort', () => { abortedWith = lease.signal.reason; reject(new Error('aborted')); });
    setTimeout(() => resolve({ status: 200 }), 20_000);
  }), { leaseMs: 600 });
  await sleep(300);
  await client.forceRelease(ns, key, { reason: 'test: take the key away' });
  await assert.rejects(running, LeaseLostError);
  assert.ok(abortedWith instanceof LeaseLostError);
});

test('run: a killed owner\'s key is reclaimed after its lease', async () => {
  const key = newKey();
  const { child, line } = await spawnUntil(join(fixtures, 'owner.js'), ['client', node.url, ns, key], 'owner ');
  const dead = BigInt(line.split(' ')[1]);
  await kill(child);
  let seen;
  const res = await client.run(ns, key, async (lease) => { seen = lease; return { status: 200, body: 'redone' }; }, { maxWaitMs: 15_000 });
  assert.equal(res.replayed, false);
  assert.equal(seen.reclaimed, true);
  assert.equal(seen.previousFencingToken, dead);
  assert.ok(seen.fencingToken > dead);
});

test('once: an event runs once; a permanent failure is remembered', async () => {
  const id = `evt-${newKey()}`;
  let n = 0;
  assert.deepEqual(await client.once(ns, id, async (token) => { assert.equal(typeof token, 'bigint'); n++; }), { ran: true });
  assert.deepEqual(await client.once(ns, id, async () => { n++; }), { ran: false });
  assert.equal(n, 1);

  const bad = `evt-${newKey()}`;
  await assert.rejects(client.once(ns, bad, async () => { throw new PermanentError('malformed event'); }), PermanentError);
  await assert.rejects(client.once(ns, bad, async () => { n++; }), /malformed event/);
  assert.equal(n, 1);

  const flaky = `evt-${newKey()}`;
  await assert.rejects(client.once(ns, flaky, async () => { throw new Error('db down'); }), /db down/);
  assert.deepEqual(await client.once(ns, flaky, async () => { n++; }), { ran: true });
  assert.equal(n, 2);
});

test('run with a fingerprint refuses another request with the key', async () => {
  const key = newKey();
  await client.run(ns, key, async () => ({ status: 200 }), { fingerprint: 'a' });
  await assert.rejects(client.run(ns, key, async () => ({ status: 200 }), { fingerprint: 'b' }), FingerprintMismatchError);
});
