// Package client is the Go client of idem, the idempotency-key store, over
// its gRPC API.
//
// # Running an operation once
//
// Do is the way most programs use idem: it runs a function at most once to
// completion per idempotency key, across processes and retries, and replays
// the stored response to every later caller with the key.
//
//	c, err := client.New(client.DefaultConfig("127.0.0.1:7070"))
//	if err != nil {
//		return err
//	}
//	defer c.Close()
//
//	res, err := c.Do(ctx, "payments", req.IdempotencyKey,
//		func(ctx context.Context, l client.Lease) (client.Response, error) {
//			// ctx is cancelled if the lease is lost. Hand l.FencingToken to
//			// the systems written to, so a replaced owner's late write is refused.
//			id, err := charge(ctx, req, l.FencingToken)
//			if errors.Is(err, errCardDeclined) {
//				// Final: remember the answer instead of running again.
//				return client.Response{Status: 402}, client.Permanent(err)
//			}
//			if err != nil {
//				return client.Response{}, err // released: a retry runs again
//			}
//			return client.Response{Status: 201, Body: []byte(id)}, nil
//		},
//		client.WithFingerprint(hashOf(req)))
//	// res.Replayed says whether this call ran fn or replayed an earlier run.
//
// # The building blocks
//
// Reserve, Heartbeat, Complete, Release and Get map one to one onto the
// store's RPCs, for callers that keep the lease themselves (a message
// consumer, a proxy). Reserve generates the owner token when the caller gives
// none, and every retry of a call reuses it, so a retried reserve is the same
// reservation: ACQUIRED again with the same fencing token, never a second
// owner.
//
// # Failures and retries
//
// Each call is tried up to Config.MaxAttempts times, with jittered
// exponential backoff, when the store could not decide (gRPC UNAVAILABLE,
// ABORTED, or a DEADLINE_EXCEEDED while the caller's context is still live),
// moving to the next endpoint each time; first attempts are otherwise sent
// to their shard's leader (see below) or spread over the endpoints
// round-robin. Decided failures are not retried and come back as the
// sentinel errors ErrNotOwner, ErrNotFound, ErrInvalidArgument and
// ErrPayloadTooLarge; when the retries run out the error is ErrUnavailable.
// Each wraps the gRPC status (status.Code works on it); test them with
// errors.Is.
//
// # Routing to the leader
//
// By default the client sends each call to the leader of its key's shard,
// which spares the nodes a forwarded RPC. In the background it asks an
// endpoint for the nodes' routing (the Idempotency service's Routing RPC:
// the ring, every node's gRPC address as the topology file gives it, and
// the leaders the node knows), rebuilds the ring and refuses it unless its
// fingerprint is the nodes', and asks again every Config.RoutingRefresh.
// Leaders are also learned from the idem-leader header of every answer. A
// leader's node is dialled lazily, once per address, with the same TLS,
// token and DialOptions as the endpoints; Close closes those connections
// and stops the refresher. Routing never delays a call: until it is
// learned, while the leader is unknown or its connection not up, for 5 s
// after an attempt at a leader failed undecided, and on every retry, calls
// go to the endpoints round-robin. Routers do not serve
// Routing, so behind routers calls stay round-robin. Config.DisableRouting
// turns it off (use it when only the endpoints, not the nodes' topology
// addresses, can be reached). Stats tells where attempts went.
//
// # Batching
//
// Calls that go to the same connection (a leader's, or an endpoint's) while
// two RPCs are already in flight there queue, and the first of those RPCs
// to end sends the whole queue as one Batch RPC (up to 256 calls and 4
// MiB); a call with nothing ahead of it goes at once as its own unary RPC,
// so batching adds no latency to a lone call. Under load this cuts the RPCs
// per call by the concurrency per connection (64 callers on a three-node
// region: ~11 calls per RPC), and the calls of one batch reach the leader
// together, which is what its proposal buffer packs into one Raft entry.
// Each call keeps its own context, errors and retries: a call whose context
// ends while it is queued is withdrawn (never sent); one whose context ends
// while its batch is in flight returns the context's error at once, and its
// operation may still be applied (undecided, as with a unary RPC cut
// short). Each result carries its own leader hint, since the calls of one
// batch may belong to different shards. A node that answers Batch
// UNIMPLEMENTED (older than v1.2) gets unary RPCs on that connection from
// then on. Waiting reserves (which would hold their batch's answer back),
// completes larger than 64 KiB and calls whose context carries outgoing
// gRPC metadata always go alone. Config.DisableBatching turns it off; Stats
// counts Batch RPCs and the calls they answered.
//
// # Batch calls
//
// ReserveMany and CompleteMany send the keys of one namespace in few
// BatchReserve / BatchComplete RPCs (up to MaxBatchItems items each). A
// batch goes to any endpoint, not to a leader: the node fans its items out
// to their shards' leaders, so one batch carries keys of every shard. Each
// item is answered as its single call, in order, and fails alone.
// OnceBatch builds Once on them for consumers that receive events in
// batches.
//
// # Keys
//
// NewKey makes a key (a UUIDv7, so keys sort by creation time). Make it
// once per logical operation, before the first attempt, and send the same
// key with every retry of that operation.
//
// # Traces
//
// When a call's context holds an active OpenTelemetry span (the
// application's SDK and instrumentation put it there), every RPC of the
// call carries its W3C traceparent and tracestate, so that the router's,
// the nodes' and Raft's spans join the application's trace (docs/operations.md,
// "Traces"). Middleware and Do pass their request's context down. Nothing is
// sent without a span; the client depends on the OpenTelemetry API only.
package client
