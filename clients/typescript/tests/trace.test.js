// Trace context: with the OpenTelemetry API present and a span active, the
// client and the Express middleware send its traceparent on every call to
// idem; without a span, nothing. The API is an optional peer of the client,
// so '@opentelemetry/api' resolves to a stand-in here (fixtures/).

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { register } from 'node:module';
import { startNode, loadExpress } from './helpers.js';

register('./fixtures/otel-hooks.js', import.meta.url);
const { withSpan } = await import('./fixtures/otel-api-standin.js');
const { IdemClient, idempotency, newKey } = await import('../src/index.js');

const TRACEPARENT = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
let node;
let client;
const seen = []; // [path, traceparent, baggage] of every call
before(async () => {
  node = await startNode();
  const recording = (url, init) => {
    seen.push([String(url), init.headers.traceparent, init.headers.baggage]);
    return globalThis.fetch(url, init);
  };
  client = new IdemClient({ baseUrl: node.url, fetch: recording });
});
after(async () => {
  await node?.stop();
});

const callsTo = (verb) => seen.filter(([url]) => url.endsWith(`:${verb}`));

test('the client sends the active span\'s traceparent, and nothing without one', async () => {
  seen.length = 0;
  await withSpan(TRACEPARENT, () => client.reserve('payments', newKey()));
  await client.reserve('payments', newKey());
  const [traced, untraced] = callsTo('reserve');
  assert.equal(traced[1], TRACEPARENT);
  assert.equal(traced[2], undefined, 'baggage is not idem\'s to send');
  assert.equal(untraced[1], undefined);
});

test('the Express middleware continues the request\'s trace', async () => {
  seen.length = 0;
  const express = loadExpress();
  const app = express();
  app.use((req, res, next) => withSpan(TRACEPARENT, next)); // as OpenTelemetry's HTTP instrumentation would
  app.use(idempotency(client));
  app.post('/payments', (req, res) => res.status(201).send('paid'));
  const server = await new Promise((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  try {
    const res = await fetch(`http://127.0.0.1:${server.address().port}/payments`, {
      method: 'POST', headers: { 'Idempotency-Key': newKey(), 'content-type': 'application/json' }, body: '{}',
    });
    assert.equal(res.status, 201);
  } finally {
    server.close();
  }
  for (const verb of ['reserve', 'complete']) {
    const calls = callsTo(verb);
    assert.ok(calls.length > 0 && calls.every(([, tp]) => tp === TRACEPARENT), `${verb}: ${JSON.stringify(seen)}`);
  }
});
