// A payments API on Express whose POST /payments runs once per
// Idempotency-Key, with @idem/client's middleware and a dev node
// (go run ./cmd/idemnode --dev). Run from the repository root:
//
//   NODE_PATH=/usr/share/nodejs node examples/express/server.js
//
// (NODE_PATH finds Debian's node-express; with `npm install express` it is
// not needed.) Then see the README's "Use idem from Node.js and Python".

import { createRequire } from 'node:module';
import { IdemClient, idempotency } from '../../clients/typescript/src/index.js';

const express = createRequire(import.meta.url)('express');
const client = new IdemClient({ baseUrl: process.env.IDEM_URL ?? 'http://127.0.0.1:8080' });
const app = express();
let charges = 0;

// Mount the middleware before any body parser: it reads the body itself.
app.use(idempotency(client, { requireKey: true }));
app.use(express.json()); // for requests the middleware passes through (GET, ...)

app.post('/payments', async (req, res) => {
  if (req.query.slow) await new Promise((r) => setTimeout(r, 5000)); // a slow card network
  if (!(req.body.amount > 0)) {
    res.status(422).json({ error: 'amount must be positive' }); // final: stored and replayed
    return;
  }
  charges++;
  // Hand the fencing token to your own storage, so a replaced attempt's late writes are refused.
  res.status(201).json({
    charge_id: `ch_${charges}`,
    amount: req.body.amount,
    charges_so_far: charges,
    fencing_token: String(req.idempotency.fencingToken),
  });
});

const port = Number(process.env.PORT ?? 9100);
app.listen(port, '127.0.0.1', () => console.log(`payments API on http://127.0.0.1:${port} (idem at ${client.baseUrl})`));
