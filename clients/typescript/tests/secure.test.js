// The client against a secure dev node (TLS with a private CA, an auth
// file): bearer tokens, client certificates (mTLS) and the auth errors.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync, rmSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { join } from 'node:path';
import { IdemClient, newKey, UnauthenticatedError, PermissionDeniedError } from '../src/index.js';
import { startNode, makeCerts } from './helpers.js';

const sha256 = (s) => createHash('sha256').update(s).digest('hex');
let node;
let certs;
before(async () => {
  certs = makeCerts('alice');
  const authFile = join(certs.dir, 'auth.yaml');
  writeFileSync(authFile, [
    'principals:',
    '  - name: billing-api',
    `    token_sha256: ${sha256('billing-token')}`,
    '    namespaces: [billing]',
    '    role: writer',
    '  - name: alice',
    '    namespaces: ["alice-*"]',
    '    role: writer',
    '',
  ].join('\n'));
  node = await startNode({ certs, authFile });
});
after(async () => {
  await node?.stop();
  if (certs) rmSync(join(certs.dir, '..'), { recursive: true, force: true });
});

test('a bearer token over TLS with a private CA', async () => {
  const c = new IdemClient({ baseUrl: node.url, token: 'billing-token', tls: { ca: certs.ca } });
  const key = newKey();
  const r = await c.run('billing', key, async () => ({ status: 201, body: 'paid' }));
  assert.equal(r.replayed, false);
  assert.equal((await c.get('billing', key)).state, 'COMPLETED');
  await assert.rejects(c.reserve('other', key), PermissionDeniedError);
  const anonymous = new IdemClient({ baseUrl: node.url, tls: { ca: certs.ca } });
  await assert.rejects(anonymous.reserve('billing', key), (err) => err instanceof UnauthenticatedError && err.status === 401);
  const wrong = new IdemClient({ baseUrl: node.url, token: 'not-the-token', tls: { ca: certs.ca } });
  await assert.rejects(wrong.get('billing', key), UnauthenticatedError);
});

test('a client certificate (mTLS) names the principal', async () => {
  const c = new IdemClient({ baseUrl: node.url, tls: { ca: certs.ca, cert: certs.cert, key: certs.key } });
  const key = newKey();
  const res = await c.reserve('alice-orders', key);
  assert.equal(res.outcome, 'ACQUIRED');
  await c.complete('alice-orders', key, { ownerToken: res.ownerToken, response: { status: 200 } });
  await assert.rejects(c.reserve('billing', key), PermissionDeniedError);
});
