// The Express middleware against a real idemnode --dev, with the proxy's
// semantics: replay, 409, 422, 400, 401, 413, release on 5xx and throws,
// Prefer: wait, the fencing token, heartbeats and a killed owner.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Readable } from 'node:stream';
import { request } from 'node:http';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { IdemClient, idempotency, newKey } from '../src/index.js';
import { startNode, sleep, loadExpress, spawnUntil, kill } from './helpers.js';

const express = loadExpress();
const fixtures = join(dirname(fileURLToPath(import.meta.url)), 'fixtures');
let node;
let client;
const servers = [];
before(async () => {
  node = await startNode();
  client = new IdemClient({ baseUrl: node.url });
});
after(async () => {
  for (const s of servers) s.close();
  await node?.stop();
});

/** Serves app on a free loopback port; returns its base URL. */
function serve(app) {
  app.set('env', 'test'); // Express's error handler: no stack traces on stderr
  return new Promise((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(`http://127.0.0.1:${s.address().port}`));
    servers.push(s);
  });
}

/** An app with the middleware and a payments handler that counts its runs. */
async function paymentsApp(options = {}, handler) {
  const app = express();
  const calls = [];
  app.use(idempotency(client, options));
  app.use(express.json()); // keyless requests: the middleware passed them through unread
  app.post('/payments', handler ?? ((req, res) => {
    calls.push(req);
    res.status(201).set('X-Charge', `ch_${calls.length}`).cookie('session', 'abc').json({
      charge: `ch_${calls.length}`, amount: req.body.amount, fencing_token: String(req.idempotency?.fencingToken),
    });
  }));
  return { url: await serve(app), calls, app };
}

const post = (url, key, body, headers = {}) => fetch(url, {
  method: 'POST',
  headers: { 'Content-Type': 'application/json', ...(key ? { 'Idempotency-Key': key } : {}), ...headers },
  body: typeof body === 'string' ? body : JSON.stringify(body),
});

async function problemOf(res, status, slug) {
  assert.equal(res.status, status);
  assert.equal(res.headers.get('content-type'), 'application/problem+json');
  const p = await res.json();
  assert.equal(p.status, status);
  assert.equal(p.type, `https://idem.dev/problems/${slug}`);
  assert.ok(p.title && p.detail);
  return p;
}

test('first request runs, a retry replays it exactly, another body is 422', async () => {
  const { url, calls } = await paymentsApp();
  const key = newKey();
  const first = await post(`${url}/payments?currency=eur`, key, { amount: 100 }, { 'Idempotency-Fencing-Token': '999999' });
  assert.equal(first.status, 201);
  assert.equal(first.headers.get('idempotent-replayed'), null);
  assert.match(first.headers.get('set-cookie'), /session=abc/);
  assert.ok(first.headers.get('idempotency-key-expires'));
  const firstBody = await first.json();
  assert.equal(calls.length, 1);
  const token = calls[0].headers['idempotency-fencing-token'];
  assert.notEqual(token, '999999', 'a client-sent fencing token never reaches the handler');
  assert.equal(token, String(calls[0].idempotency.fencingToken));
  assert.equal(firstBody.fencing_token, token);

  const again = await post(`${url}/payments?currency=eur`, key, { amount: 100 });
  assert.equal(again.status, 201);
  assert.equal(again.headers.get('idempotent-replayed'), 'true');
  assert.equal(again.headers.get('x-charge'), 'ch_1');
  assert.match(again.headers.get('content-type'), /application\/json/);
  assert.equal(again.headers.get('set-cookie'), null, 'cookies are not replayed');
  assert.deepEqual(await again.json(), firstBody);
  assert.equal(calls.length, 1);

  await problemOf(await post(`${url}/payments?currency=eur`, key, { amount: 200 }), 422, 'idempotency-key-reused');
  await problemOf(await post(`${url}/payments?currency=usd`, key, { amount: 100 }), 422, 'idempotency-key-reused');
  assert.equal(calls.length, 1);
});

/** POSTs with node:http, which keeps repeated header lines apart. */
function rawPost(url, key, body) {
  return new Promise((resolve, reject) => {
    const req = request(url, { method: 'POST', headers: { 'Idempotency-Key': key, 'Content-Type': 'text/plain' } }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, raw: res.rawHeaders, body: Buffer.concat(chunks).toString() }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

test('a replay leaves out per-response headers, even when the record holds them', async () => {
  const stale = 'Mon, 01 Jan 2001 00:00:00 GMT';
  const { url } = await paymentsApp({}, (req, res) => {
    res.status(201).set('Date', stale).set('X-Kept', 'kept').send('ok');
  });
  const key = newKey();
  const first = await rawPost(`${url}/payments`, key, 'x');
  assert.equal(first.status, 201);
  const rec = await client.get('default', key);
  assert.equal(rec.response.headers.Date, undefined, 'Date is not stored');
  assert.equal(rec.response.headers['X-Kept'], 'kept');
  // The same request's record, completed through the JSON API with the
  // per-response headers in it.
  await client.deleteKey('default', key, { reason: 'test' });
  const r = await client.reserve('default', key, { fingerprint: rec.fingerprint });
  await client.complete('default', key, { ownerToken: r.ownerToken, response: { status: 201, body: 'ok', headers: {
    Date: stale, 'Content-Length': '999', 'Transfer-Encoding': 'chunked', Connection: 'X-Hop', 'X-Hop': '1', 'X-Kept': 'kept',
  } } });
  const again = await rawPost(`${url}/payments`, key, 'x');
  assert.equal(again.status, 201);
  assert.equal(again.body, 'ok');
  const lines = [];
  for (let i = 0; i < again.raw.length; i += 2) lines.push([again.raw[i].toLowerCase(), again.raw[i + 1]]);
  const values = (name) => lines.filter(([n]) => n === name).map(([, v]) => v);
  assert.deepEqual(values('idempotent-replayed'), ['true']);
  assert.deepEqual(values('x-kept'), ['kept']);
  assert.equal(values('date').length, 1, 'one Date');
  assert.notEqual(values('date')[0], stale, 'the replay is dated now');
  assert.deepEqual(values('x-hop'), []);
  assert.notDeepEqual(values('content-length'), ['999']);
  assert.notDeepEqual(values('transfer-encoding'), ['chunked', 'chunked']);
});

test('concurrent duplicates: one runs, the others get 409 or, with Prefer: wait, the replay', async () => {
  let runs = 0;
  const { url } = await paymentsApp({}, async (req, res) => {
    runs++;
    await sleep(600);
    res.status(201).json({ run: runs });
  });
  const key = newKey();
  const answers = await Promise.all(Array.from({ length: 6 }, () => post(`${url}/payments`, key, { amount: 1 })));
  assert.equal(runs, 1);
  const statuses = answers.map((r) => r.status).sort();
  assert.deepEqual(statuses, [201, 409, 409, 409, 409, 409]);
  for (const r of answers.filter((a) => a.status === 409)) {
    await problemOf(r, 409, 'request-in-progress');
    assert.ok(Number(r.headers.get('retry-after')) >= 1);
  }

  const key2 = newKey();
  const waited = await Promise.all(Array.from({ length: 6 }, () => post(`${url}/payments`, key2, { amount: 1 }, { Prefer: 'wait=10' })));
  assert.equal(runs, 2);
  assert.deepEqual(waited.map((r) => r.status), [201, 201, 201, 201, 201, 201]);
  assert.equal(waited.filter((r) => r.headers.get('idempotent-replayed') === 'true').length, 5);
  const bodies = new Set(await Promise.all(waited.map((r) => r.text())));
  assert.equal(bodies.size, 1);
});

test('a handler that throws, or answers 5xx/429, releases the key for a retry', async () => {
  let n = 0;
  const { url } = await paymentsApp({}, (req, res) => {
    n++;
    if (n === 1) throw new Error('card network down');
    if (n === 2) { res.status(503).send('try later'); return; }
    if (n === 3) { res.status(429).end(); return; }
    res.status(201).json({ ok: n });
  });
  const key = newKey();
  assert.equal((await post(`${url}/payments`, key, { a: 1 })).status, 500);
  assert.equal((await post(`${url}/payments`, key, { a: 1 })).status, 503);
  assert.equal((await post(`${url}/payments`, key, { a: 1 })).status, 429);
  const ok = await post(`${url}/payments`, key, { a: 1 });
  assert.equal(ok.status, 201);
  assert.deepEqual(await ok.json(), { ok: 4 });
  const replay = await post(`${url}/payments`, key, { a: 1 });
  assert.equal(replay.headers.get('idempotent-replayed'), 'true');
  assert.equal(n, 4);
});

test('responses written with send, write+end, writeHead and a piped stream are replayed byte for byte', async () => {
  const app = express();
  app.use(idempotency(client));
  app.post('/send', (req, res) => res.type('text/plain').send(`got ${req.body.x}`));
  app.post('/write', (req, res) => {
    res.setHeader('Content-Type', 'text/csv');
    res.write('a,b\n');
    res.write(Buffer.from('1,2\n'));
    res.end('3,4\n');
  });
  app.post('/head', (req, res) => {
    res.writeHead(202, { 'Content-Type': 'application/json', Location: '/jobs/7' });
    res.end('{"job":7}');
  });
  app.post('/stream', (req, res) => {
    res.setHeader('Content-Type', 'application/octet-stream');
    Readable.from([Buffer.from([1, 2, 3]), Buffer.from([4, 5])]).pipe(res);
  });
  app.post('/empty', (req, res) => res.status(204).end());
  const url = await serve(app);
  for (const path of ['/send', '/write', '/head', '/stream', '/empty']) {
    const key = newKey();
    const a = await post(url + path, key, { x: 1 });
    const aBody = Buffer.from(await a.arrayBuffer());
    const b = await post(url + path, key, { x: 1 });
    const bBody = Buffer.from(await b.arrayBuffer());
    assert.equal(b.headers.get('idempotent-replayed'), 'true', path);
    assert.equal(b.status, a.status, path);
    assert.equal(b.headers.get('content-type'), a.headers.get('content-type'), path);
    assert.deepEqual(bBody, aBody, path);
    if (path === '/head') assert.equal(b.headers.get('location'), '/jobs/7');
    if (path === '/stream') assert.deepEqual([...bBody], [1, 2, 3, 4, 5]);
  }
});

test('keyless requests pass through; requireKey, bad keys, namespaces and size limits answer problems', async () => {
  const open = await paymentsApp();
  assert.equal((await post(`${open.url}/payments`, null, { amount: 1 })).status, 201);
  assert.equal((await post(`${open.url}/payments`, null, { amount: 1 })).status, 201);
  assert.equal(open.calls.length, 2);
  await problemOf(await post(`${open.url}/payments`, 'has space', { amount: 1 }), 400, 'invalid-idempotency-key');
  const quoted = newKey();
  assert.equal((await post(`${open.url}/payments`, `"${quoted}"`, { amount: 1 })).status, 201);
  assert.equal((await post(`${open.url}/payments`, quoted, { amount: 1 })).headers.get('idempotent-replayed'), 'true',
    'a structured-field string names the same key as the bare token');

  const strict = await paymentsApp({ requireKey: true, namespaceHeader: 'X-Tenant', maxRequestBytes: 64 });
  await problemOf(await post(`${strict.url}/payments`, null, { amount: 1 }), 400, 'missing-idempotency-key');
  const noTenant = await post(`${strict.url}/payments`, newKey(), { amount: 1 });
  await problemOf(noTenant, 401, 'missing-caller-identity');
  assert.match(noTenant.headers.get('www-authenticate'), /X-Tenant/);
  await problemOf(await post(`${strict.url}/payments`, newKey(), { amount: 1 }, { 'X-Tenant': 'Not Valid' }), 400, 'invalid-namespace');
  await problemOf(await post(`${strict.url}/payments`, newKey(), { amount: 'x'.repeat(100) }, { 'X-Tenant': 'acme' }), 413, 'request-too-large');
  assert.equal(strict.calls.length, 0);

  const key = newKey();
  const acme = await post(`${strict.url}/payments`, key, { amount: 1 }, { 'X-Tenant': 'acme' });
  const globex = await post(`${strict.url}/payments`, key, { amount: 1 }, { 'X-Tenant': 'globex' });
  assert.equal(acme.status, 201);
  assert.equal(globex.status, 201);
  assert.equal(globex.headers.get('idempotent-replayed'), null, 'two callers with one key never share a response');
  assert.equal(strict.calls.length, 2);
  assert.equal(strict.calls[1].idempotency.namespace, 'globex');
});

test('invalid JSON reaches Express as a 400 and is stored as final', async () => {
  const { url, calls } = await paymentsApp();
  const key = newKey();
  const a = await post(`${url}/payments`, key, '{"amount":');
  assert.equal(a.status, 400);
  const b = await post(`${url}/payments`, key, '{"amount":');
  assert.equal(b.status, 400);
  assert.equal(b.headers.get('idempotent-replayed'), 'true');
  assert.equal(calls.length, 0);
});

test('a body larger than maxStoredBodyBytes reaches the caller and replays are marked omitted', async () => {
  const big = 'x'.repeat(5000);
  const { url } = await paymentsApp({ maxStoredBodyBytes: 1024 }, (req, res) => { res.type('text/plain').send(big); });
  const key = newKey();
  const a = await post(`${url}/payments`, key, { a: 1 });
  assert.equal(await a.text(), big);
  // The first caller may hold the whole body before the key is completed
  // (it streamed): the retry waits for the completion.
  const b = await post(`${url}/payments`, key, { a: 1 }, { Prefer: 'wait=10' });
  assert.equal(b.status, 200);
  assert.equal(b.headers.get('idempotent-body-omitted'), 'true');
  assert.equal(await b.text(), '');
});

test('heartbeats keep a long handler\'s short lease: duplicates meanwhile get 409', async () => {
  let runs = 0;
  let signal;
  const { url } = await paymentsApp({ leaseMs: 1500 }, async (req, res) => {
    runs++;
    signal = req.idempotency.signal;
    await sleep(4000); // well over two 1.5 s leases
    res.status(201).json({ done: true });
  });
  const key = newKey();
  const first = post(`${url}/payments`, key, { a: 1 });
  for (let i = 0; i < 5; i++) {
    await sleep(700); // without heartbeats the key could be reclaimed from 1.6 s on
    assert.equal((await post(`${url}/payments`, key, { a: 1 })).status, 409, `probe ${i}`);
  }
  assert.equal((await first).status, 201);
  assert.equal(runs, 1);
  assert.equal(signal.aborted, false);
});

test('a killed owner\'s request is reclaimed: the retry runs with the previous fencing token', async () => {
  const key = newKey();
  const body = JSON.stringify({ amount: 5 });
  const { child, line } = await spawnUntil(join(fixtures, 'owner.js'), ['express', node.url, 'default', key, body], 'owner ');
  const dead = BigInt(line.split(' ')[1]);
  await kill(child);
  const { url, calls } = await paymentsApp();
  const res = await post(`${url}/payments`, key, body, { Prefer: 'wait=10' });
  assert.equal(res.status, 201);
  assert.equal(calls.length, 1);
  assert.equal(calls[0].idempotency.reclaimed, true);
  assert.equal(calls[0].idempotency.previousFencingToken, dead);
  assert.ok(calls[0].idempotency.fencingToken > dead);
});

test('an unreachable store answers 503 and the handler does not run', async () => {
  const dead = new IdemClient({ baseUrl: 'http://127.0.0.1:9', maxAttempts: 1, timeoutMs: 2000 });
  const app = express();
  let runs = 0;
  app.use(idempotency(dead));
  app.post('/payments', (req, res) => { runs++; res.end(); });
  const url = await serve(app);
  const res = await post(`${url}/payments`, newKey(), { a: 1 });
  await problemOf(res, 503, 'store-unavailable');
  assert.equal(res.headers.get('retry-after'), '1');
  assert.equal(runs, 0);
});
