export { IdemClient, newOwnerToken, newKey, defaults } from './client.js';
export { idempotency } from './express.js';
export * from './errors.js';
export { fingerprint, parseKey, parsePreferWait, HEADER_KEY, HEADER_FENCING_TOKEN, HEADER_REPLAYED, HEADER_BODY_OMITTED, HEADER_KEY_EXPIRES } from './http.js';
