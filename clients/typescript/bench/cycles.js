// Load command: reserve + complete cycles through @idem/client against a
// running node, printing cycles/s and latency percentiles.
//
//   node bench/cycles.js [--url http://127.0.0.1:8080] [--concurrency 16] [--seconds 10] [--mode calls|run]
//
// mode calls: reserve then complete (two API calls); mode run: client.run()
// around an empty fn (the same two calls plus run's bookkeeping).

import { parseArgs } from 'node:util';
import { IdemClient, newKey } from '../src/index.js';

const { values } = parseArgs({
  options: {
    url: { type: 'string', default: 'http://127.0.0.1:8080' },
    concurrency: { type: 'string', default: '16' },
    seconds: { type: 'string', default: '10' },
    mode: { type: 'string', default: 'calls' },
  },
});
const concurrency = Number(values.concurrency);
const seconds = Number(values.seconds);
if (!(concurrency >= 1 && concurrency <= 1024) || !(seconds > 0 && seconds <= 600) || !['calls', 'run'].includes(values.mode)) {
  console.error('bench: --concurrency 1..1024, --seconds 0..600, --mode calls|run');
  process.exit(2);
}
const client = new IdemClient({ baseUrl: values.url });
const ns = `bench-ts-${Date.now()}`;
const latencies = [];
let errors = 0;
const end = Date.now() + seconds * 1000;

async function worker() {
  while (Date.now() < end) {
    const key = newKey();
    const t0 = process.hrtime.bigint();
    try {
      if (values.mode === 'run') {
        await client.run(ns, key, async () => ({ status: 200, body: 'ok' }));
      } else {
        const r = await client.reserve(ns, key);
        await client.complete(ns, key, { ownerToken: r.ownerToken, response: { status: 200, body: 'ok' } });
      }
      latencies.push(Number(process.hrtime.bigint() - t0) / 1e6);
    } catch {
      errors++;
    }
  }
}

const started = Date.now();
await Promise.all(Array.from({ length: concurrency }, worker));
const elapsed = (Date.now() - started) / 1000;
latencies.sort((a, b) => a - b);
const pct = (p) => (latencies.length ? latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))].toFixed(2) : 'n/a');
console.log(`mode=${values.mode} concurrency=${concurrency} seconds=${elapsed.toFixed(1)} cycles=${latencies.length} errors=${errors}`);
console.log(`cycles/s=${(latencies.length / elapsed).toFixed(0)} p50=${pct(0.5)}ms p99=${pct(0.99)}ms max=${pct(1)}ms`);
