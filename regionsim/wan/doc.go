// Package wan simulates the wide-area network between regions on one
// machine, without root: every cross-region address a process dials is a
// loopback TCP proxy that forwards to the real address with the link's
// latency, jitter and loss, and that can refuse connections or blackhole
// traffic per directed region pair.
//
// A proxy is made with Listen(src, dst, target): whoever dials it is taken to
// be in region src, and target lives in region dst. Bytes from the dialer
// cross the src->dst link, answers cross dst->src, so a cut of one direction
// only (SetCut) is an asymmetric partition: with dst->src blackholed, a
// request still reaches the server and is applied, but its answer never
// comes back.
//
// Cuts:
//
//   - Refuse resets open connections and every new one: callers fail fast.
//   - Blackhole accepts connections but holds every byte in the cut
//     direction until the cut heals (TCP keeps retransmitting; nothing is
//     corrupted). Callers hang until their own timeouts.
//
// Loss is modelled as TCP sees it: a "lost" chunk is delivered after an
// extra retransmission penalty, and the stream behind it waits (head-of-line
// blocking). Streams never reorder.
package wan
