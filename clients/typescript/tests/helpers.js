// Starts a real idemnode --dev for the tests: IDEM_NODE_BIN names the binary
// (the Go test builds it); without it the binary is built from this
// repository with `go build`.

import { spawn, execFileSync } from 'node:child_process';
import { createServer } from 'node:net';
import { mkdtempSync, rmSync, readFileSync } from 'node:fs';
import { get as httpsGet } from 'node:https';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import Module, { createRequire } from 'node:module';

const repoRoot = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

/**
 * Express, from node_modules or from Debian's node-express: Debian installs
 * it and its dependencies under /usr/share/nodejs, which a Node.js built
 * elsewhere does not search, so that directory joins NODE_PATH.
 */
export function loadExpress() {
  const require = createRequire(import.meta.url);
  try {
    return require('express');
  } catch { /* try Debian's */ }
  const debian = '/usr/share/nodejs';
  process.env.NODE_PATH = [process.env.NODE_PATH, debian].filter(Boolean).join(':');
  Module._initPaths();
  try {
    return require('express');
  } catch (err) {
    throw new Error(`express is not installed (apt-get install node-express, or npm install express): ${err.message}`);
  }
}

export function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function binary(dir, env, pkg, name) {
  if (process.env[env]) return process.env[env];
  const out = join(dir, name);
  execFileSync('go', ['build', '-o', out, pkg], { cwd: repoRoot, stdio: 'inherit' });
  return out;
}

/** GET url with the given TLS options (a private CA): {status, text}. */
function getTLS(url, tls) {
  return new Promise((resolve, reject) => {
    const req = httpsGet(url, { ...tls, timeout: 2000 }, (res) => {
      let text = '';
      res.on('data', (c) => { text += c; });
      res.on('end', () => resolve({ status: res.statusCode, text }));
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', reject);
  });
}

/**
 * Makes a CA, a node certificate for 127.0.0.1 and a client certificate
 * for `client` with idemctl (IDEM_CTL_BIN, else built), in a new dir.
 * Returns {dir, ca, cert, key} (file contents for the client's tls option).
 */
export function makeCerts(client) {
  const dir = mkdtempSync(join(tmpdir(), 'idem-ts-certs-'));
  const ctl = binary(dir, 'IDEM_CTL_BIN', './cmd/idemctl', 'idemctl');
  const certs = join(dir, 'certs');
  execFileSync(ctl, ['cert', 'create-ca', '--certs-dir', certs]);
  execFileSync(ctl, ['cert', 'create-node', '--certs-dir', certs, '--id', 'dev', '127.0.0.1']);
  execFileSync(ctl, ['cert', 'create-client', '--certs-dir', certs, client]);
  return {
    dir: certs,
    ca: readFileSync(join(certs, 'ca.crt')),
    cert: readFileSync(join(certs, `client.${client}.crt`)),
    key: readFileSync(join(certs, `client.${client}.key`)),
  };
}

/**
 * Starts `idemnode --dev` on free loopback ports with a 100 ms clock-skew
 * margin (a lease can be reclaimed 100 ms after it ends) and waits up to 60 s
 * for /readyz 200. options.certs (makeCerts) serves TLS with that CA;
 * options.authFile names an auth file. Returns {url, stop, log}.
 */
export async function startNode(options = {}) {
  const dir = mkdtempSync(join(tmpdir(), 'idem-ts-'));
  const bin = binary(dir, 'IDEM_NODE_BIN', './cmd/idemnode', 'idemnode');
  const [http, grpc, raft] = [await freePort(), await freePort(), await freePort()];
  const args = ['--dev', '--http-addr', `127.0.0.1:${http}`, '--grpc-addr', `127.0.0.1:${grpc}`,
    '--raft-addr', `127.0.0.1:${raft}`, '--data-dir', join(dir, 'data'), '--clock-skew-margin', '100ms', '--log-level', 'warn'];
  if (options.certs) args.push('--certs-dir', options.certs.dir);
  if (options.authFile) args.push('--auth-file', options.authFile);
  const child = spawn(bin, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  child.stdout.on('data', (c) => { log += c; });
  child.stderr.on('data', (c) => { log += c; });
  let exited = null;
  const exit = new Promise((resolve) => child.on('exit', (code, signal) => { exited = { code, signal }; resolve(); }));
  const url = `${options.certs ? 'https' : 'http'}://127.0.0.1:${http}`;
  const deadline = Date.now() + 60_000;
  let last = 'no answer yet';
  for (;;) {
    if (exited) throw new Error(`idemnode exited (${JSON.stringify(exited)}) before it was ready:\n${log}`);
    try {
      const r = options.certs
        ? await getTLS(`${url}/readyz`, { ca: options.certs.ca })
        : await fetch(`${url}/readyz`, { signal: AbortSignal.timeout(2000) }).then(async (x) => ({ status: x.status, text: await x.text() }));
      if (r.status === 200) break;
      last = `readyz ${r.status}: ${r.text}`;
    } catch (err) {
      last = String(err);
    }
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`idemnode not ready within 60 s (last: ${last}):\n${log}`);
    }
    await sleep(100);
  }
  return {
    url,
    log: () => log,
    /** Stops the node; fails when it reported a data race (a -race build). */
    async stop() {
      if (!exited) {
        child.kill('SIGTERM');
        const t = setTimeout(() => child.kill('SIGKILL'), 10_000);
        await exit;
        clearTimeout(t);
      }
      rmSync(dir, { recursive: true, force: true });
      const race = log.indexOf('WARNING: DATA RACE');
      if (race >= 0) throw new Error(`idemnode reported a data race:\n${log.slice(race, race + 4000)}`);
    },
  };
}

/**
 * Spawns `node script args...` and resolves with {child, line} once the
 * child prints a line starting with `prefix` (within 30 s).
 */
export function spawnUntil(script, args, prefix) {
  const child = spawn(process.execPath, [script, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => { child.kill('SIGKILL'); reject(new Error(`child did not print ${prefix} within 30 s:\n${out}\n${err}`)); }, 30_000);
    child.stderr.on('data', (c) => { err += c; });
    child.stdout.on('data', (c) => {
      out += c;
      const line = out.split('\n').find((l) => l.startsWith(prefix));
      if (line) {
        clearTimeout(t);
        resolve({ child, line });
      }
    });
    child.on('exit', (code) => { clearTimeout(t); reject(new Error(`child exited ${code} before printing ${prefix}:\n${out}\n${err}`)); });
  });
}

/** Kills a child with SIGKILL and waits for it to be gone. */
export function kill(child) {
  return new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) { resolve(); return; }
    child.removeAllListeners('exit');
    child.on('exit', () => resolve());
    child.kill('SIGKILL');
  });
}
