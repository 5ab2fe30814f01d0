// Compiled (never run) by types.test.js with tsc --strict: the declarations
// must describe the package as the README uses it.
import {
  IdemClient, idempotency, newKey, NotOwnerError, PermanentError, LeaseLostError, type Reservation, type Lease,
} from '../../src/index.js';

async function usage(): Promise<void> {
  const client = new IdemClient({ baseUrl: 'http://127.0.0.1:8080', token: 't', timeoutMs: 5000 });
  const r: Reservation = await client.reserve('billing', newKey(), { fingerprint: 'f', leaseMs: 1000, waitMs: 0 });
  switch (r.outcome) {
    case 'ACQUIRED': {
      const t: bigint = r.fencingToken;
      await client.heartbeat('billing', 'k', { ownerToken: r.ownerToken });
      await client.complete('billing', 'k', { ownerToken: r.ownerToken, response: { status: 201, body: 'ok' }, retentionS: 60 });
      void t;
      break;
    }
    case 'RECLAIMED': { const p: bigint = r.previousFencingToken; void p; break; }
    case 'IN_PROGRESS': { const ms: number = r.retryAfterMs; void ms; break; }
    case 'COMPLETED': { const b: Uint8Array = r.response.body; void b; break; }
    case 'EXPIRED': { const d: Date = r.expiredAt; void d; break; }
    case 'FINGERPRINT_MISMATCH': break;
  }
  const rec = await client.get('billing', 'k');
  if (rec !== null && rec.state === 'COMPLETED') void rec.response?.status;
  const res = await client.run('billing', 'k', async (lease: Lease) => {
    if (lease.signal.aborted) throw new PermanentError('no', { status: 422 });
    return { status: 200, headers: { 'Content-Type': 'text/plain' }, body: `token ${lease.fencingToken}` };
  }, { maxWaitMs: 1000 });
  const replayed: boolean = res.replayed;
  const { ran } = await client.once('events', 'e1', async (token: bigint) => { void token; });
  try {
    await client.release('billing', 'k', { ownerToken: 'x' });
  } catch (err) {
    if (err instanceof NotOwnerError) void err.code;
    if (err instanceof LeaseLostError) void err.message;
  }
  const results = await client.batchReserve('billing', [{ key: 'a' }, { key: 'b', fingerprint: 'f' }]);
  for (const r2 of results) {
    if ('error' in r2) void r2.error.code;
    else if (r2.outcome === 'ACQUIRED') await client.checkpoint('billing', 'a', { ownerToken: r2.ownerToken, name: 'step-1', data: 'x' });
  }
  const done = await client.batchComplete('billing', [{ key: 'a', ownerToken: 't', response: { status: 200 } }]);
  void done;
  const policy = await client.setPolicy('billing', { tombstoneS: 60, maxLeaseMs: 60_000 });
  const t2: number | undefined = policy.tombstoneS;
  void t2; void (await client.getPolicy('billing'));
  await client.run('billing', 'k2', async (lease) => {
    if (lease.checkpoint) void lease.checkpoint.data;
    await lease.saveCheckpoint('charged', new Uint8Array([1]));
    return { status: 200 };
  }, { ifExpired: 'acquire' });
  const mw = idempotency(client, { requireKey: true, namespaceHeader: 'X-Tenant', leaseMs: 10_000 });
  void mw; void replayed; void ran;
}
void usage;
