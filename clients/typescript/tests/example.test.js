// examples/express runs as the README says, against a dev node: a retry
// replays, another body is 422, a keyless POST is 400.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { startNode, freePort, sleep, kill } from './helpers.js';

const example = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'examples', 'express', 'server.js');
let node;
let child;
let url;
before(async () => {
  node = await startNode();
  const port = await freePort();
  child = spawn(process.execPath, [example], {
    env: { ...process.env, PORT: String(port), IDEM_URL: node.url, NODE_PATH: [process.env.NODE_PATH, '/usr/share/nodejs'].filter(Boolean).join(':') },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout.on('data', (c) => { out += c; });
  child.stderr.on('data', (c) => { out += c; });
  for (let i = 0; i < 200 && !out.includes('payments API on'); i++) await sleep(50); // bounded: 10 s
  assert.match(out, /payments API on/, `the example did not start:\n${out}`);
  url = `http://127.0.0.1:${port}/payments`;
});
after(async () => {
  if (child) await kill(child);
  await node?.stop();
});

const pay = (key, body) => fetch(url, {
  method: 'POST', headers: { 'Content-Type': 'application/json', ...(key ? { 'Idempotency-Key': key } : {}) }, body: JSON.stringify(body),
});

test('the Express example charges once per key', async () => {
  const first = await pay('order-1001', { amount: 100 });
  assert.equal(first.status, 201);
  const body = await first.json();
  assert.equal(body.charge_id, 'ch_1');
  const again = await pay('order-1001', { amount: 100 });
  assert.equal(again.headers.get('idempotent-replayed'), 'true');
  assert.deepEqual(await again.json(), body);
  assert.equal((await pay('order-1001', { amount: 999 })).status, 422);
  assert.equal((await pay(null, { amount: 1 })).status, 400);
  const bad = await pay('order-1002', { amount: -1 });
  assert.equal(bad.status, 422);
  assert.equal((await pay('order-1002', { amount: -1 })).headers.get('idempotent-replayed'), 'true', 'a 422 from the handler is final');
});
