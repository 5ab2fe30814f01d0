// Package naive is the comparison regionsim runs idem against: the lock most
// teams write first, "SET key NX PX ttl" on a single Redis-like server, then
// do the work, then store the result and delete the lock. The server here is
// a small in-process TCP server with Redis's semantics for these commands,
// a wall clock for expiry (which a clock step moves), and Redis's common
// persistence setting (a write-ahead file fsynced every second): a crash
// loses up to the last second of writes.
//
// It has no fencing tokens, so a worker that stalls past its TTL and wakes
// up writes downstream unopposed, and no replication, so it is one region's
// single point of failure. regionsim shows what that lets through next to
// idem under the same workload and faults.
package naive
