package regionsim

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/regionsim/check"
	"github.com/idem-dev/idem/regionsim/history"
	"github.com/idem-dev/idem/regionsim/ledger"
	"github.com/idem-dev/idem/regionsim/naive"
)

// namespace is the idem namespace the workload uses.
const namespace = "payments"

// Names of the systems compared.
const (
	sysIdem        = "idem"
	sysIdemNoGuard = "idem, ledger guard off"
	sysNaive       = "naive SET NX PX lock"
)

// behaviour is how one API-server instance handling an attempt behaves.
type behaviour int

const (
	normal behaviour = iota
	crashAfterReserve
	crashAfterCharge
	stall
	slow
	decline
)

func (b behaviour) String() string {
	return [...]string{"normal", "crash-after-reserve", "crash-after-charge", "stall", "slow", "decline"}[b]
}

// Attempt failures as the client sees them.
var (
	errVanished  = errors.New("the instance died; the client sees its timeout")
	errDeclined  = errors.New("the provider declined transiently; released for a retry")
	errFenced    = errors.New("the ledger refused a stale fencing token")
	errLostLease = errors.New("another owner took the key over")
	errBusy      = errors.New("the key stayed in progress past the attempt's deadline")
	errMismatch  = errors.New("fingerprint mismatch")
	errTimeout   = errors.New("attempt timed out")
)

// payment is one logical request: a key and what it asks for.
type payment struct {
	key    string
	amount int64
	fp     string
}

// instance is one API-server instance handling one attempt of a payment.
type instance struct {
	id       int
	name     string
	owner    string
	region   string // where the instance runs
	via      string // whose router it calls
	p        *payment
	behave   behaviour
	deadline time.Time // the client gives up on this attempt then
	stall    time.Duration
}

// system is one thing the workload runs against.
type system interface {
	name() string
	serve(ctx context.Context, in *instance) (resp string, replayed bool, err error)
	readBack(ctx context.Context, in *instance)
	finalRead(ctx context.Context, key string) check.FinalRead
}

// attemptRec is one client attempt, for availability and latency.
type attemptRec struct {
	System, Region, Via string
	Start, End          int64 // ns since the scenario started
	OK                  bool
	Err                 string
	// Injected: the instance misbehaved on purpose (died, paused, ran
	// slowly, declined); such attempts say nothing about the store's
	// availability or latency and are left out of those figures.
	Injected bool
}

// systemResults is what one system delivered in one scenario.
type systemResults struct {
	mu         sync.Mutex
	deliveries []check.Delivery
	acks       []check.Completion
	payments   int
	completed  int
	abandoned  int
	vanished   int
	fenced     int
	resumed    int // attempts that resumed from an earlier attempt's checkpoint
	ok, failed atomic.Int64
}

func (s *systemResults) ack(c check.Completion) {
	s.mu.Lock()
	s.acks = append(s.acks, c)
	s.mu.Unlock()
}

// scenarioRun is one scenario in progress.
type scenarioRun struct {
	cfg   Config
	sc    *Scenario
	c     *simCluster
	start time.Time

	rec           *history.Recorder
	guard, shadow *ledger.Ledger
	naiveLedger   *ledger.Ledger

	// The load ends at start+plannedLoad, or, when faults overran their
	// planned windows (a topology change takes as long as it takes), tail
	// after the last fault event; payments may retry until DrainTimeout
	// after that. Read them with loadEnd and drainEnd.
	plannedLoad, tail time.Duration
	loadEndNs         atomic.Int64 // from start; set when the fault schedule is done
	faultsDone        atomic.Bool
	instCtx           context.Context
	instances         sync.WaitGroup
	clients           sync.WaitGroup
	seq               atomic.Int64

	mixMu  sync.Mutex
	cur    mix
	active []string

	mu       sync.Mutex
	attempts []attemptRec
	results  map[string]*systemResults
}

func (r *scenarioRun) now() int64 { return int64(time.Since(r.start)) }

// loadEnd is when clients stop starting payments: never before tail past
// now while the fault schedule still runs.
func (r *scenarioRun) loadEnd() time.Time {
	if r.faultsDone.Load() {
		return r.start.Add(time.Duration(r.loadEndNs.Load()))
	}
	return later(r.start.Add(r.plannedLoad), time.Now().Add(r.tail))
}

// drainEnd is when in-flight payments stop retrying.
func (r *scenarioRun) drainEnd() time.Time { return r.loadEnd().Add(r.cfg.DrainTimeout) }

// scheduleDone fixes the load's end once every fault event ran: as
// planned, or tail from now if the faults ran late.
func (r *scenarioRun) scheduleDone() {
	r.loadEndNs.Store(int64(max(r.plannedLoad, time.Since(r.start)+r.tail)))
	r.faultsDone.Store(true)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (r *scenarioRun) mix() mix {
	r.mixMu.Lock()
	defer r.mixMu.Unlock()
	return r.cur
}

func (r *scenarioRun) result(sys string) *systemResults {
	r.mu.Lock()
	defer r.mu.Unlock()
	res, ok := r.results[sys]
	if !ok {
		res = &systemResults{}
		r.results[sys] = res
	}
	return res
}

// streamSeed derives a seed for one stream of choices, the same for every
// system so that they see the same workload.
func streamSeed(seed uint64, parts ...string) uint64 {
	h := fnv.New64a()
	fmt.Fprint(h, seed)
	for _, p := range parts {
		h.Write([]byte{0})
		h.Write([]byte(p))
	}
	return h.Sum64()
}

// clientLoop is one payment client: it starts payments at its share of the
// region's rate until the load ends.
func (r *scenarioRun) clientLoop(sys system, region string, worker int) {
	defer r.clients.Done()
	seed := streamSeed(r.cfg.Seed, r.sc.Name, region, fmt.Sprint(worker))
	rng := rand.New(rand.NewPCG(seed, 1))
	attemptRNG := rand.New(rand.NewPCG(seed, 2))
	interval := time.Duration(float64(time.Second) * float64(r.cfg.WorkersPerRegion) / r.cfg.RatePerRegion)
	next := time.Now().Add(time.Duration(rng.Int64N(int64(interval) + 1)))
	for {
		if !sleepUntil(r.instCtx, next) || !time.Now().Before(r.loadEnd()) {
			return
		}
		next = next.Add(interval)
		if time.Now().After(next) {
			next = time.Now()
		}
		m := r.mix()
		p := &payment{key: client.NewKey(), amount: 100 + rng.Int64N(99900)}
		p.fp = fmt.Sprintf("charge:%d", p.amount)
		res := r.result(sys.name())
		res.mu.Lock()
		res.payments++
		res.mu.Unlock()
		if rng.Float64() < m.Burst {
			r.burst(sys, p, region, 4+rng.IntN(5), rng.Uint64())
		} else if r.pay(sys, p, region, region, attemptRNG) {
			r.after(sys, p, region, m, rng)
		}
	}
}

// after does what follows a successful payment: a read-back, a redelivery.
func (r *scenarioRun) after(sys system, p *payment, region string, m mix, rng *rand.Rand) {
	if rng.Float64() < m.Get {
		sys.readBack(r.instCtx, &instance{id: int(r.seq.Add(1)), region: region, via: region, p: p})
	}
	if rng.Float64() < m.Redeliver {
		regions := r.c.regions
		consumer := regions[rng.IntN(len(regions))]
		delay := time.Duration(300+rng.IntN(1700)) * time.Millisecond
		seed := rng.Uint64()
		r.clients.Add(1)
		go func() {
			defer r.clients.Done()
			if sleepUntil(r.instCtx, time.Now().Add(delay)) {
				r.pay(sys, p, consumer, consumer, rand.New(rand.NewPCG(seed, 3)))
			}
		}()
	}
}

// burst sends n identical requests at once, the first attempt of each
// through a different region's router.
func (r *scenarioRun) burst(sys system, p *payment, region string, n int, seed uint64) {
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		via := r.c.regions[i%len(r.c.regions)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.pay(sys, p, region, via, rand.New(rand.NewPCG(seed, uint64(i))))
		}()
	}
	wg.Wait()
}

// pay runs attempts of p until one succeeds, the payment's budget runs out
// or the drain ends. The first attempt goes through firstVia.
func (r *scenarioRun) pay(sys system, p *payment, region, firstVia string, rng *rand.Rand) bool {
	res := r.result(sys.name())
	deadline := time.Now().Add(30 * time.Second)
	if drainEnd := r.drainEnd(); deadline.After(drainEnd) {
		deadline = drainEnd
	}
	wait := 100 * time.Millisecond
	for attempt := 0; attempt < 12 && time.Now().Before(deadline); attempt++ {
		m := r.mix()
		via := firstVia
		if attempt > 0 && len(r.c.regions) > 1 && rng.Float64() < m.CrossRetry {
			others := slices.DeleteFunc(slices.Clone(r.c.regions), func(s string) bool { return s == region })
			via = others[rng.IntN(len(others))]
		} else if attempt > 0 {
			via = region
		}
		resp, replayed, err := r.attempt(sys, p, region, via, m, rng)
		if err == nil {
			res.mu.Lock()
			res.deliveries = append(res.deliveries, check.Delivery{Key: p.key, Response: resp, Replayed: replayed, At: r.now()})
			res.completed++
			res.mu.Unlock()
			return true
		}
		j := time.Duration(rng.Int64N(int64(wait)/2 + 1))
		if !sleepUntil(r.instCtx, time.Now().Add(wait/2+j)) {
			break
		}
		wait = min(2*wait, time.Second)
	}
	res.mu.Lock()
	res.abandoned++
	res.mu.Unlock()
	return false
}

func pickBehaviour(m mix, rng *rand.Rand) behaviour {
	x := rng.Float64()
	for _, c := range []struct {
		p float64
		b behaviour
	}{{m.CrashAfterReserve, crashAfterReserve}, {m.CrashAfterCharge, crashAfterCharge}, {m.Stall, stall}, {m.Slow, slow}, {m.Decline, decline}} {
		if x < c.p {
			return c.b
		}
		x -= c.p
	}
	return normal
}

// attempt hands p to a fresh instance and waits for its answer up to the
// attempt timeout. The instance lives on after the client gives up (its
// answer is then lost), as a real server's request handler does.
func (r *scenarioRun) attempt(sys system, p *payment, region, via string, m mix, rng *rand.Rand) (string, bool, error) {
	id := int(r.seq.Add(1))
	behave := pickBehaviour(m, rng)
	in := &instance{
		id: id, name: fmt.Sprintf("%s/i%d/%s", region, id, behave), owner: client.NewOwnerToken(),
		region: region, via: via, p: p, behave: behave,
		deadline: time.Now().Add(m.AttemptTimeout),
		stall:    r.cfg.Lease + r.cfg.ClockSkewMargin + 1500*time.Millisecond,
	}
	type answer struct {
		resp     string
		replayed bool
		err      error
	}
	done := make(chan answer, 1)
	r.instances.Add(1)
	go func() {
		defer r.instances.Done()
		resp, replayed, err := sys.serve(r.instCtx, in)
		done <- answer{resp, replayed, err}
	}()
	start := r.now()
	timer := time.NewTimer(m.AttemptTimeout)
	defer timer.Stop()
	var a answer
	select {
	case a = <-done:
		if errors.Is(a.err, errVanished) {
			select {
			case <-timer.C:
			case <-r.instCtx.Done():
			}
			a.err = errTimeout
		}
	case <-timer.C:
		a.err = errTimeout
	case <-r.instCtx.Done():
		a.err = errTimeout
	}
	rec := attemptRec{System: sys.name(), Region: region, Via: via, Start: start, End: r.now(), OK: a.err == nil, Injected: in.behave != normal}
	res := r.result(sys.name())
	if a.err != nil {
		rec.Err = errKind(a.err)
		res.failed.Add(1)
	} else {
		res.ok.Add(1)
	}
	switch in.behave {
	case crashAfterReserve, crashAfterCharge:
		res.mu.Lock()
		res.vanished++
		res.mu.Unlock()
	}
	r.mu.Lock()
	r.attempts = append(r.attempts, rec)
	r.mu.Unlock()
	return a.resp, a.replayed, a.err
}

func errKind(err error) string {
	for _, e := range []error{errTimeout, errDeclined, errFenced, errLostLease, errBusy, errMismatch, client.ErrUnavailable, naive.ErrUnavailable} {
		if errors.Is(err, e) {
			return strings.TrimPrefix(strings.TrimPrefix(e.Error(), "client: "), "naive: ")
		}
	}
	return "error"
}

// sleepUntil sleeps until t; false when ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// response renders the API response of a payment charged by ch.
func response(key string, ch ledger.Charge) client.Response {
	return client.Response{
		Status:  201,
		Headers: map[string]string{"Content-Type": "application/json", "X-Charge-Id": ch.ID},
		Body:    fmt.Appendf(nil, `{"charge_id":%q,"amount":%d,"key":%q}`, ch.ID, ch.Amount, key),
	}
}

// canonical is a response's comparable form.
func canonical(r client.Response) string {
	keys := slices.Sorted(maps.Keys(r.Headers))
	var b strings.Builder
	fmt.Fprintf(&b, "%d ", r.Status)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s;", k, r.Headers[k])
	}
	b.WriteString(" ")
	b.Write(r.Body)
	return b.String()
}

// slowCharge is how long a slow charge takes: most of a lease, but well
// inside it.
func slowCharge(cfg Config) time.Duration { return cfg.Lease * 7 / 10 }

// providerLatency is the simulated payment provider's answer time.
func providerLatency(rng *rand.Rand) time.Duration {
	return time.Duration(5+rng.IntN(15)) * time.Millisecond
}

// --- idem ---

// idemSystem runs payments through idem's routers.
type idemSystem struct {
	r       *scenarioRun
	clients map[string]map[string]*client.Client // [instance region][router region]
	final   *client.Client
	rngMu   sync.Mutex
	rng     *rand.Rand
}

// newIdemClients makes one client per (region, router) with retries off:
// the workload makes its own retries so the history records every call.
func newIdemClients(c *simCluster, cfg Config) (map[string]map[string]*client.Client, *client.Client, error) {
	opts := []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
		MinConnectTimeout: time.Second,
	})}
	out := map[string]map[string]*client.Client{}
	for _, from := range c.regions {
		out[from] = map[string]*client.Client{}
		for _, to := range c.regions {
			cl, err := client.New(client.Config{Endpoints: []string{c.via[from][to]}, MaxAttempts: 1,
				RequestTimeout: cfg.AttemptTimeout, DialOptions: opts})
			if err != nil {
				return nil, nil, err
			}
			out[from][to] = cl
		}
	}
	var local []string
	for _, r := range c.regions {
		local = append(local, c.via[r][r])
	}
	final, err := client.New(client.Config{Endpoints: local, MaxAttempts: 5, RequestTimeout: 5 * time.Second, DialOptions: opts})
	return out, final, err
}

func (s *idemSystem) name() string { return sysIdem }

func (s *idemSystem) draw() *rand.Rand {
	s.rngMu.Lock()
	defer s.rngMu.Unlock()
	return rand.New(rand.NewPCG(s.rng.Uint64(), 0))
}

// classify maps a client error to a history result.
func classify(err error) history.Result {
	switch {
	case err == nil:
		return history.OK
	case errors.Is(err, client.ErrNotOwner):
		return history.NotOwner
	case errors.Is(err, client.ErrNotFound):
		return history.NotFound
	case errors.Is(err, client.ErrInvalidArgument), errors.Is(err, client.ErrPayloadTooLarge):
		return history.Failed
	}
	return history.Unknown
}

func (s *idemSystem) op(in *instance, kind history.Kind) history.Op {
	return history.Op{Client: in.id, Key: in.p.key, Kind: kind, Region: in.region, Via: in.via, Owner: in.owner, Call: s.r.rec.Now()}
}

func (s *idemSystem) finish(op history.Op, err error) {
	op.Return = s.r.rec.Now()
	op.Result = classify(err)
	if err != nil {
		op.Err = err.Error()
	}
	s.r.rec.Add(op)
}

func (s *idemSystem) reserve(ctx context.Context, cl *client.Client, in *instance) (client.Reservation, error) {
	op := s.op(in, history.Reserve)
	op.Fingerprint, op.LeaseMs = in.p.fp, s.r.cfg.Lease.Milliseconds()
	res, err := cl.Reserve(ctx, client.ReserveRequest{Namespace: namespace, Key: in.p.key, Fingerprint: in.p.fp,
		Lease: s.r.cfg.Lease, OwnerToken: in.owner})
	if err == nil {
		op.Outcome = res.Outcome.String()
		op.Fencing, op.PrevFencing = res.FencingToken, res.PreviousFencingToken
		op.LeaseExpires = unixNano(res.LeaseExpiresAt)
		op.CompletedAt = unixNano(res.CompletedAt)
		if res.Response != nil {
			op.Replay = canonical(*res.Response)
		}
	}
	s.finish(op, err)
	return res, err
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func (s *idemSystem) heartbeat(ctx context.Context, cl *client.Client, in *instance) error {
	op := s.op(in, history.Heartbeat)
	op.LeaseMs = s.r.cfg.Lease.Milliseconds()
	end, err := cl.Heartbeat(ctx, client.HeartbeatRequest{Namespace: namespace, Key: in.p.key, OwnerToken: in.owner, Lease: s.r.cfg.Lease})
	op.LeaseExpires = unixNano(end)
	s.finish(op, err)
	return err
}

func (s *idemSystem) complete(ctx context.Context, cl *client.Client, in *instance, resp client.Response) error {
	op := s.op(in, history.Complete)
	op.Response = canonical(resp)
	c, err := cl.Complete(ctx, client.CompleteRequest{Namespace: namespace, Key: in.p.key, OwnerToken: in.owner, Response: resp})
	op.CompletedAt = unixNano(c.CompletedAt)
	s.finish(op, err)
	return err
}

func (s *idemSystem) checkpoint(ctx context.Context, cl *client.Client, in *instance, name string, data []byte) error {
	op := s.op(in, history.Checkpoint)
	_, err := cl.Checkpoint(ctx, client.CheckpointRequest{Namespace: namespace, Key: in.p.key, OwnerToken: in.owner, Name: name, Data: data})
	s.finish(op, err)
	return err
}

func (s *idemSystem) release(ctx context.Context, cl *client.Client, in *instance) error {
	op := s.op(in, history.Release)
	err := cl.Release(ctx, client.ReleaseRequest{Namespace: namespace, Key: in.p.key, OwnerToken: in.owner})
	s.finish(op, err)
	return err
}

func (s *idemSystem) get(ctx context.Context, cl *client.Client, in *instance) (client.Record, error) {
	op := s.op(in, history.Get)
	op.Owner = ""
	rec, err := cl.Get(ctx, namespace, in.p.key)
	if err == nil {
		op.Outcome = rec.State.String()
		op.Fingerprint = rec.Fingerprint
		op.Fencing = rec.FencingToken
		op.LeaseExpires = unixNano(rec.LeaseExpiresAt)
		op.CompletedAt = unixNano(rec.CompletedAt)
		if rec.Response != nil {
			op.Replay = canonical(*rec.Response)
		}
	}
	s.finish(op, err)
	return rec, err
}

func (s *idemSystem) serve(ctx context.Context, in *instance) (string, bool, error) {
	cl := s.clients[in.region][in.via]
	for {
		res, err := s.reserve(ctx, cl, in)
		if err != nil {
			return "", false, err
		}
		switch res.Outcome {
		case client.OutcomeCompleted:
			return canonical(*res.Response), true, nil
		case client.OutcomeFingerprintMismatch:
			return "", false, errMismatch
		case client.OutcomeAcquired, client.OutcomeReclaimed:
			return s.owned(ctx, cl, in, res)
		}
		wait := min(max(res.RetryAfter, 50*time.Millisecond), 500*time.Millisecond)
		if time.Now().Add(wait).After(in.deadline) {
			return "", false, errBusy
		}
		if !sleepUntil(ctx, time.Now().Add(wait)) {
			return "", false, ctx.Err()
		}
	}
}

// checkpointCharged names the checkpoint written after the charge: the
// payment's first step is done, and Data (chargeData) says which charge.
const checkpointCharged = "charged"

func chargeData(ch ledger.Charge) []byte { return fmt.Appendf(nil, "%s %d", ch.ID, ch.Amount) }

func parseChargeData(data []byte) (ledger.Charge, bool) {
	var ch ledger.Charge
	n, err := fmt.Sscanf(string(data), "%s %d", &ch.ID, &ch.Amount)
	return ch, err == nil && n == 2 && ch.ID != ""
}

// owned is the work of an instance that holds the key, in two steps: charge,
// then record (complete with the response). An attempt that RECLAIMED the
// key with the "charged" checkpoint of an earlier one resumes at the record
// step; otherwise it finds out what an earlier attempt did (a fenced read of
// the ledger), charges if nothing was, and checkpoints the charge.
//
// Resuming skips the fenced read, which is safe: the checkpoint was written
// after a charge the guard accepted, which raised the key's highest token
// to that attempt's, so every older owner's late charge is refused; and an
// owner newer than that attempt either saw the checkpoint (and resumes) or
// reclaimed before it was written, made its own fenced read and found the
// charge (or fenced it out).
func (s *idemSystem) owned(ctx context.Context, cl *client.Client, in *instance, res client.Reservation) (string, bool, error) {
	r := s.r
	rng := s.draw()
	if in.behave == crashAfterReserve {
		return "", false, errVanished
	}
	if cp := res.Checkpoint; res.Outcome == client.OutcomeReclaimed && cp != nil && cp.Name == checkpointCharged {
		if ch, ok := parseChargeData(cp.Data); ok {
			sres := r.result(sysIdem)
			sres.mu.Lock()
			sres.resumed++
			sres.mu.Unlock()
			return s.record(ctx, cl, in, ch)
		}
	}
	token := res.FencingToken
	prior, err := r.guard.Lookup(in.p.key, token)
	if err != nil {
		return "", false, errFenced
	}
	var ch ledger.Charge
	if len(prior) > 0 {
		ch = prior[0] // an earlier attempt charged: reuse it
	} else {
		if in.behave == decline {
			_ = s.release(ctx, cl, in)
			return "", false, errDeclined
		}
		if in.behave == stall {
			sleepUntil(ctx, time.Now().Add(in.stall)) // a GC pause past the lease
		}
		if in.behave == slow {
			// A careful slow worker: it renews its lease and gives up unless
			// the store confirms it, then makes a slow charge (a 3-D Secure
			// style call) that lands well inside the renewed lease. Only a
			// store whose leases end early (clock skew) can be reclaimed
			// under it.
			if err := s.heartbeat(ctx, cl, in); err != nil {
				return "", false, errLostLease
			}
			sleepUntil(ctx, time.Now().Add(slowCharge(r.cfg)))
		}
		sleepUntil(ctx, time.Now().Add(providerLatency(rng)))
		// The same write reaches a ledger without the guard: what idem
		// without fencing at the ledger would have let through.
		r.shadow.Charge(in.p.key, token, in.p.amount, in.name)
		if ch, err = r.guard.Charge(in.p.key, token, in.p.amount, in.name); err != nil {
			res := r.result(sysIdem)
			res.mu.Lock()
			res.fenced++
			res.mu.Unlock()
			return "", false, errFenced
		}
	}
	if err := s.checkpoint(ctx, cl, in, checkpointCharged, chargeData(ch)); errors.Is(err, client.ErrNotOwner) {
		return "", false, errLostLease
	} // an undecided checkpoint only costs the next attempt a ledger read
	if in.behave == crashAfterCharge {
		return "", false, errVanished
	}
	return s.record(ctx, cl, in, ch)
}

// record is the payment's last step: complete with the response of ch.
func (s *idemSystem) record(ctx context.Context, cl *client.Client, in *instance, ch ledger.Charge) (string, bool, error) {
	r := s.r
	resp := response(in.p.key, ch)
	for try := 0; ; try++ {
		err := s.complete(ctx, cl, in, resp)
		switch {
		case err == nil:
			r.result(sysIdem).ack(check.Completion{Key: in.p.key, Response: canonical(resp), ChargeID: ch.ID})
			return canonical(resp), false, nil
		case errors.Is(err, client.ErrNotOwner):
			return "", false, errLostLease
		case try == 2 || ctx.Err() != nil:
			return "", false, err
		}
		// The answer was lost: the same complete again (same owner, same
		// response) is safe.
		if !sleepUntil(ctx, time.Now().Add(100*time.Millisecond)) {
			return "", false, err
		}
	}
}

func (s *idemSystem) readBack(ctx context.Context, in *instance) {
	cctx, cancel := context.WithTimeout(ctx, s.r.cfg.AttemptTimeout)
	defer cancel()
	_, _ = s.get(cctx, s.clients[in.region][in.via], in)
}

func (s *idemSystem) finalRead(ctx context.Context, key string) check.FinalRead {
	in := &instance{id: int(s.r.seq.Add(1)), region: "harness", via: "harness", p: &payment{key: key}}
	op := s.op(in, history.Get)
	op.Owner = ""
	rec, err := s.final.Get(ctx, namespace, key)
	if err == nil {
		op.Outcome, op.Fingerprint, op.Fencing = rec.State.String(), rec.Fingerprint, rec.FencingToken
		op.LeaseExpires, op.CompletedAt = unixNano(rec.LeaseExpiresAt), unixNano(rec.CompletedAt)
		if rec.Response != nil {
			op.Replay = canonical(*rec.Response)
		}
	}
	s.finish(op, err)
	switch {
	case errors.Is(err, client.ErrNotFound):
		return check.FinalRead{}
	case err != nil:
		return check.FinalRead{Err: err.Error()}
	case rec.State != client.StateCompleted || rec.Response == nil:
		return check.FinalRead{Found: true, Response: "state " + rec.State.String()}
	}
	return check.FinalRead{Found: true, Response: canonical(*rec.Response)}
}

// --- the naive lock ---

// naiveSystem runs the same payments with a SET NX PX lock: check the
// result, take the lock, check the ledger, charge, store the result, unlock.
type naiveSystem struct {
	r       *scenarioRun
	clients map[string]*naive.Client // by instance region
	direct  *naive.Client
	rngMu   sync.Mutex
	rng     *rand.Rand
}

func (s *naiveSystem) name() string { return sysNaive }

func (s *naiveSystem) draw() *rand.Rand {
	s.rngMu.Lock()
	defer s.rngMu.Unlock()
	return rand.New(rand.NewPCG(s.rng.Uint64(), 0))
}

func (s *naiveSystem) serve(ctx context.Context, in *instance) (string, bool, error) {
	r := s.r
	rng := s.draw()
	cl := s.clients[in.region]
	lockKey, resKey := "lock:"+in.p.key, "res:"+in.p.key
	for {
		if v, ok, err := cl.Get(ctx, resKey); err != nil {
			return "", false, err
		} else if ok {
			return v, true, nil
		}
		got, err := cl.SetNX(ctx, lockKey, in.owner, r.cfg.Lease)
		if err != nil {
			return "", false, err
		}
		if got {
			break
		}
		wait := 150 * time.Millisecond
		if time.Now().Add(wait).After(in.deadline) {
			return "", false, errBusy
		}
		if !sleepUntil(ctx, time.Now().Add(wait)) {
			return "", false, ctx.Err()
		}
	}
	if in.behave == crashAfterReserve {
		return "", false, errVanished
	}
	prior, _ := r.naiveLedger.Lookup(in.p.key, 0)
	var ch ledger.Charge
	if len(prior) > 0 {
		ch = prior[0]
	} else {
		if in.behave == decline {
			_, _ = cl.DelIf(ctx, lockKey, in.owner)
			return "", false, errDeclined
		}
		if in.behave == stall {
			sleepUntil(ctx, time.Now().Add(in.stall))
		}
		if in.behave == slow {
			// The same slow charge, well inside the lock's TTL.
			sleepUntil(ctx, time.Now().Add(slowCharge(r.cfg)))
		}
		sleepUntil(ctx, time.Now().Add(providerLatency(rng)))
		ch, _ = r.naiveLedger.Charge(in.p.key, 0, in.p.amount, in.name)
	}
	if in.behave == crashAfterCharge {
		return "", false, errVanished
	}
	resp := canonical(response(in.p.key, ch))
	if err := cl.Set(ctx, resKey, resp); err != nil {
		return "", false, err
	}
	r.result(sysNaive).ack(check.Completion{Key: in.p.key, Response: resp, ChargeID: ch.ID})
	_, _ = cl.DelIf(ctx, lockKey, in.owner)
	return resp, false, nil
}

func (s *naiveSystem) readBack(ctx context.Context, in *instance) {
	_, _, _ = s.clients[in.region].Get(ctx, "res:"+in.p.key)
}

func (s *naiveSystem) finalRead(ctx context.Context, key string) check.FinalRead {
	v, ok, err := s.direct.Get(ctx, "res:"+key)
	if err != nil {
		return check.FinalRead{Err: err.Error()}
	}
	return check.FinalRead{Found: ok, Response: v}
}

// sortedAttempts returns the attempts ordered by start.
func (r *scenarioRun) sortedAttempts() []attemptRec {
	r.mu.Lock()
	out := slices.Clone(r.attempts)
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Start < out[j].Start })
	return out
}
