// The proxy's HTTP rules as the middleware applies them, without a node:
// the fingerprint equals the Go engine's (httpidem) for the same
// request, so a proxy and this middleware in front of one namespace agree;
// key and Prefer parsing follow the proxy's.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fingerprint, parseKey, parsePreferWait } from '../src/index.js';

test('fingerprints match the Go engine\'s known answers', () => {
  // POST /payments/a%2Fb?currency=eur&x=1, X-Tenant: acme, body {"amount":100},
  // as httpidem computes it (with and without X-Tenant and body).
  assert.equal(fingerprint('POST', '/payments/a%2Fb', 'currency=eur&x=1', [['X-Tenant', 'acme']], Buffer.from('{"amount":100}')),
    'sha256:3d24864d1308813c3d43e24ee216d861e8cff5248cd63a6c3f7ab8bec62c14d6');
  assert.equal(fingerprint('POST', '/payments/a%2Fb', 'currency=eur&x=1', [], Buffer.alloc(0)),
    'sha256:7bd28fdd79091af49c38d1cf5ffb6dd3dcb36bc9f23305bd1b55819acaa77c8b');
});

test('Idempotency-Key parsing', () => {
  const cases = [
    [[], { present: false }],
    [['abc'], { present: true, key: 'abc' }],
    [['  "a\\"b\\\\c"  '], { present: true, key: 'a"b\\c' }],
    [['"k";p=1'], 'after the closing quote'],
    [['"open'], 'no closing quote'],
    [['"a\\x"'], 'invalid escape'],
    [['a b'], 'position 1'],
    [[''], 'empty'],
    [['""'], 'empty'],
    [['a', 'b'], '2 Idempotency-Key fields'],
    [['x'.repeat(256)], '256 bytes'],
  ];
  for (const [values, want] of cases) {
    const got = parseKey(values);
    if (typeof want === 'string') assert.match(got.error ?? '', new RegExp(want.replace(/[\\^$.*+?()[\]{}|]/g, '\\$&')), JSON.stringify(values));
    else assert.deepEqual(got, want, JSON.stringify(values));
  }
});

test('Prefer: wait parsing', () => {
  assert.equal(parsePreferWait([]), -1);
  assert.equal(parsePreferWait(['wait=10']), 10_000);
  assert.equal(parsePreferWait(['respond-async, WAIT = "5" ; x=1']), 5000);
  assert.equal(parsePreferWait(['return=minimal', 'wait=3']), 3000);
  assert.equal(parsePreferWait(['wait=-1']), -1);
  assert.equal(parsePreferWait(['wait=soon']), -1);
});
