// The node's OpenAPI document (v1.2, GET /openapi.json) against the client:
// every operation of the JSON API it lists has a method here. Skipped,
// saying so, against a node that serves no document yet.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { IdemClient } from '../src/index.js';
import { startNode } from './helpers.js';

// Each operation of the contract and the client method that makes it.
// Path parameters are written {}.
export const operations = {
  'POST /v1/namespaces/{}/keys/{}:reserve': 'reserve',
  'POST /v1/namespaces/{}/keys/{}:heartbeat': 'heartbeat',
  'POST /v1/namespaces/{}/keys/{}:complete': 'complete',
  'POST /v1/namespaces/{}/keys/{}:release': 'release',
  'POST /v1/namespaces/{}/keys/{}:checkpoint': 'checkpoint',
  'POST /v1/namespaces/{}/keys/{}:force-release': 'forceRelease',
  'GET /v1/namespaces/{}/keys/{}': 'get',
  'DELETE /v1/namespaces/{}/keys/{}': 'deleteKey',
  'GET /v1/namespaces/{}/keys': 'listKeys',
  'POST /v1/namespaces/{}/keys:batch-reserve': 'batchReserve',
  'POST /v1/namespaces/{}/keys:batch-complete': 'batchComplete',
  'GET /v1/namespaces/{}/policy': 'getPolicy',
  'PUT /v1/namespaces/{}/policy': 'setPolicy',
};
// Operations of the document that are not this client's: operator and
// topology tooling (idemctl), probes.
const notClient = [/^(GET|PUT) \/v1\/topology/, /^(GET|POST|PUT|DELETE) \/v1\/admin/, /^GET \/(healthz|readyz|metrics|openapi\.json)$/];

let node;
before(async () => { node = await startNode(); });
after(async () => { await node?.stop(); });

test('every API operation of the node\'s OpenAPI document has a client method', async (t) => {
  const r = await fetch(`${node.url}/openapi.json`);
  if (r.status === 404) {
    t.skip('this idemnode serves no /openapi.json (v1.2)');
    return;
  }
  assert.equal(r.status, 200);
  const doc = await r.json();
  const client = new IdemClient({ baseUrl: node.url });
  const missing = [];
  for (const [path, item] of Object.entries(doc.paths ?? {})) {
    for (const method of Object.keys(item)) {
      if (!['get', 'post', 'put', 'delete', 'patch'].includes(method)) continue;
      const op = `${method.toUpperCase()} ${path.replace(/\{[^}]*\}/g, '{}')}`;
      if (notClient.some((re) => re.test(op))) continue;
      const name = operations[op];
      if (!name || typeof client[name] !== 'function') missing.push(op);
    }
  }
  assert.deepEqual(missing, [], 'operations of the API without a client method');
});
