// The v1.2 calls (batch reserve/complete, checkpoints, namespace policies,
// tombstones and 410) against a real idemnode --dev. Each test first asks
// the node whether it serves that call (a v1.1 node answers its path 404
// NOT_FOUND, "unknown path") and is skipped, saying so, when it does not.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { IdemClient, idempotency, newKey, NotOwnerError, ExpiredError, InvalidArgumentError } from '../src/index.js';
import { startNode, sleep, loadExpress } from './helpers.js';

let node;
let client;
const has = {};
before(async () => {
  node = await startNode();
  client = new IdemClient({ baseUrl: node.url });
  const probe = async (method, path, body) => {
    const r = await fetch(`${node.url}${path}`, { method, body: body && JSON.stringify(body), headers: { 'content-type': 'application/json' } });
    const text = await r.text();
    return !(r.status === 404 && /unknown (path|verb)/.test(text));
  };
  has.batch = await probe('POST', '/v1/namespaces/probe/keys:batch-reserve', { items: [] });
  has.checkpoint = await probe('POST', '/v1/namespaces/probe/keys/probe:checkpoint', { owner_token: 'x'.repeat(22), name: 'n', data: '' });
  has.policy = await probe('GET', '/v1/namespaces/probe/policy');
});
after(async () => { await node?.stop(); });

const skipUnless = (feature) => (t) => {
  if (!has[feature]) t.skip(`this idemnode does not serve the v1.2 ${feature} calls`);
  return !has[feature];
};

const ns = 'ts-v12';

test('batchReserve and batchComplete: per-item outcomes and errors, in item order', async (t) => {
  if (skipUnless('batch')(t)) return;
  const [a, b] = [newKey(), newKey()];
  const held = await client.reserve(ns, b);
  const res = await client.batchReserve(ns, [{ key: a, fingerprint: 'f' }, { key: b }, { key: '' }]);
  assert.equal(res.length, 3);
  assert.equal(res[0].outcome, 'ACQUIRED');
  assert.equal(res[1].outcome, 'IN_PROGRESS');
  assert.ok(res[2].error instanceof Error, 'an empty key fails alone');
  const done = await client.batchComplete(ns, [
    { key: a, ownerToken: res[0].ownerToken, response: { status: 201, body: 'a' } },
    { key: b, ownerToken: 'y'.repeat(22), response: { status: 200 } },
    { key: b, ownerToken: held.ownerToken, response: { status: 202, body: 'b' } },
  ]);
  assert.ok(done[0].expiresAt instanceof Date);
  assert.ok(done[1].error instanceof NotOwnerError);
  assert.ok(done[2].completedAt instanceof Date);
  const replay = await client.batchReserve(ns, [{ key: a, fingerprint: 'f' }, { key: b }]);
  assert.deepEqual(replay.map((r) => r.outcome), ['COMPLETED', 'COMPLETED']);
  assert.equal(Buffer.from(replay[1].response.body).toString(), 'b');
  await assert.rejects(client.batchReserve(ns, []), InvalidArgumentError);
});

test('checkpoint: a reclaimed attempt resumes from the last recovery point', async (t) => {
  if (skipUnless('checkpoint')(t)) return;
  const key = newKey();
  const first = await client.reserve(ns, key, { leaseMs: 300 });
  const cp = await client.checkpoint(ns, key, { ownerToken: first.ownerToken, name: 'charged', data: 'ch_1' });
  assert.ok(cp.checkpointedAt instanceof Date);
  assert.equal((await client.get(ns, key)).checkpoint.name, 'charged');
  await assert.rejects(client.checkpoint(ns, key, { ownerToken: 'z'.repeat(22), name: 'x', data: '' }), NotOwnerError);
  await sleep(600); // the lease (300 ms) and the dev node's skew margin (100 ms) pass
  let seen;
  await client.run(ns, key, async (lease) => { seen = lease; return { status: 200 }; }, { maxWaitMs: 5000 });
  assert.equal(seen.reclaimed, true);
  assert.equal(seen.checkpoint.name, 'charged');
  assert.equal(Buffer.from(seen.checkpoint.data).toString(), 'ch_1');
  assert.equal(seen.checkpoint.fencingToken, first.fencingToken);
});

test('policies, tombstones (EXPIRED, if_expired) and the middleware\'s 410', async (t) => {
  if (skipUnless('policy')(t)) return;
  const pns = `ts-policy-${Date.now()}`;
  const set = await client.setPolicy(pns, { tombstoneS: 60, maxRetentionS: 3600 });
  assert.equal(set.tombstoneS, 60);
  assert.equal((await client.getPolicy(pns)).maxRetentionS, 3600);
  const over = newKey();
  const held = await client.reserve(pns, over);
  await assert.rejects(client.complete(pns, over, { ownerToken: held.ownerToken, response: { status: 200 }, retentionS: 7200 }),
    InvalidArgumentError, 'a retention above the policy\'s max is refused');

  const key = newKey();
  await client.run(pns, key, async () => ({ status: 200, body: 'once' }), { retentionS: 1 });
  let expired;
  for (let i = 0; i < 100 && !expired; i++) { // bounded: 10 s for the sweep
    const r = await client.reserve(pns, key);
    if (r.outcome === 'EXPIRED') expired = r;
    else await sleep(100);
  }
  assert.ok(expired, 'the key expired into a tombstone');
  assert.ok(expired.expiredAt instanceof Date);
  assert.equal((await client.get(pns, key)).state, 'EXPIRED');
  await assert.rejects(client.run(pns, key, async () => ({ status: 200 })), ExpiredError);
  const again = await client.run(pns, key, async () => ({ status: 200, body: 'twice' }), { ifExpired: 'acquire' });
  assert.equal(again.replayed, false);
  assert.ok(again.fencingToken > expired.fencingToken);

  // The middleware answers a keyed request for an expired key 410.
  const express = loadExpress();
  const app = express();
  let runs = 0;
  app.use(idempotency(client, { namespace: () => pns, retentionS: 1 }));
  app.post('/p', (req, res) => { runs++; res.status(201).end('ok'); });
  const server = await new Promise((resolve) => { const s = app.listen(0, '127.0.0.1', () => resolve(s)); });
  try {
    const url = `http://127.0.0.1:${server.address().port}/p`;
    const k = newKey();
    assert.equal((await fetch(url, { method: 'POST', headers: { 'Idempotency-Key': k }, body: 'x' })).status, 201);
    let gone;
    for (let i = 0; i < 100 && !gone; i++) {
      const r = await fetch(url, { method: 'POST', headers: { 'Idempotency-Key': k }, body: 'x' });
      if (r.status === 410) gone = r;
      else await sleep(100);
    }
    assert.ok(gone, 'an expired key answers 410');
    assert.equal(gone.headers.get('content-type'), 'application/problem+json');
    assert.equal(runs, 1);
  } finally {
    server.close();
  }
});
