// The type declarations compile against a usage file with tsc --strict
// (Debian's node-typescript). Without tsc the test fails under CI=true and
// is skipped elsewhere.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const have = spawnSync('tsc', ['--version']).status === 0;

test('index.d.ts describes the package as it is used', { skip: !have && process.env.CI !== 'true' && 'tsc not installed (apt-get install node-typescript)' }, () => {
  assert.ok(have, 'tsc is required under CI=true: apt-get install node-typescript');
  const r = spawnSync('tsc', ['--noEmit', '--strict', '--skipLibCheck', '--target', 'es2022', '--module', 'nodenext',
    '--moduleResolution', 'nodenext', '--lib', 'es2022,dom', join('tests', 'types', 'usage.ts')], { cwd: root, encoding: 'utf8' });
  assert.equal(r.status, 0, `tsc:\n${r.stdout}${r.stderr}`);
});
