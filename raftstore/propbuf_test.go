package raftstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// With a Packer, concurrent proposals share entries, every proposer gets
// the result of its own command, and every replica applies every command.
func TestProposalBufferPacks(t *testing.T) {
	c := newTestCluster(t, 3, []string{"s1"}, func(cfg *Config) { cfg.Packer = testPacker{} })
	const proposers, rounds = 64, 5
	want := proposeConcurrently(t, c, "k", proposers, rounds)
	li := c.leader("s1")
	c.waitReplicated("s1", want, c.upNodes())
	sm := c.nodes[li].sms["s1"]
	sm.mu.Lock()
	packed, applies := sm.packed, sm.applies
	sm.mu.Unlock()
	// 64 proposers at once: the buffer must have packed some of them.
	if packed == 0 {
		t.Errorf("%d commands applied without a single packed entry", applies)
	}
	// Over every node that led (one unless the leader stepped down): every
	// command proposed at least once, in fewer entries than commands.
	var st GroupStats
	for _, i := range c.upNodes() {
		s := c.group(i, "s1").Stats()
		st.ProposedCommands += s.ProposedCommands
		st.ProposedEntries += s.ProposedEntries
	}
	if st.ProposedCommands < proposers*rounds || st.ProposedEntries >= st.ProposedCommands {
		t.Errorf("stats: %d commands in %d entries, want at least %d commands in fewer entries", st.ProposedCommands, st.ProposedEntries, proposers*rounds)
	}
	t.Logf("%d commands, %d packed entries; %d commands proposed in %d entries", applies, packed, st.ProposedCommands, st.ProposedEntries)
}

// proposeConcurrently has proposers goroutines set rounds keys each on s1's
// leader (following leader changes) and checks that each gets its own
// result; it returns what was acknowledged.
func proposeConcurrently(t *testing.T, c *testCluster, prefix string, proposers, rounds int) map[string]string {
	t.Helper()
	g := c.group(c.leader("s1"), "s1")
	want := map[string]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, proposers*rounds)
	for p := range proposers {
		wg.Go(func() {
			g := g // this proposer's view of the leader
			for r := range rounds {
				key, val := fmt.Sprintf("%s%d-%d", prefix, p, r), fmt.Sprintf("v%d", r)
				// A set is idempotent: follow a leader change (a loaded box
				// can make the leader step down) as a client would.
				var res any
				var err error
				for deadline := time.Now().Add(30 * time.Second); ; {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					res, err = g.Apply(ctx, []byte(key+"="+val))
					cancel()
					if err == nil || !(errors.Is(err, ErrNotLeader) || errors.Is(err, ErrUnknownOutcome)) || time.Now().After(deadline) {
						break
					}
					g = c.group(c.leader("s1"), "s1")
				}
				if err != nil {
					errs <- fmt.Errorf("%s: %w", key, err)
					continue
				}
				kr, ok := res.(kvResult)
				if !ok || kr.Key != key {
					errs <- fmt.Errorf("%s: got the result %#v, not its own", key, res)
					continue
				}
				mu.Lock()
				want[key] = val
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(want) != proposers*rounds {
		t.Fatalf("%d of %d commands acknowledged", len(want), proposers*rounds)
	}
	return want
}

// With Config.PackingGated a group proposes one entry per command (the
// buffer bypassed) until Group.EnablePacking, and packs from then on; the
// switch is one-way, and single entries before it and packed ones after it
// replicate alike.
func TestProposalBufferGated(t *testing.T) {
	c := newTestCluster(t, 3, []string{"s1"}, func(cfg *Config) { cfg.Packer = testPacker{}; cfg.PackingGated = true })
	const proposers, rounds = 64, 3
	before := proposeConcurrently(t, c, "off", proposers, rounds)
	c.waitReplicated("s1", before, c.upNodes())
	for _, i := range c.upNodes() {
		g := c.group(i, "s1")
		sm := c.nodes[i].sms["s1"]
		sm.mu.Lock()
		packed := sm.packed
		sm.mu.Unlock()
		if st := g.Stats(); packed != 0 || st.Packing || g.Packing() || st.ProposedEntries != 0 {
			t.Fatalf("node %d before EnablePacking: %d packed entries applied, Packing %v, %d entries through the buffer; want none", i, packed, st.Packing, st.ProposedEntries)
		}
	}
	for _, i := range c.upNodes() {
		g := c.group(i, "s1")
		if !g.EnablePacking() {
			t.Fatalf("node %d: first EnablePacking did not switch packing on", i)
		}
		if g.EnablePacking() || !g.Packing() || !g.Stats().Packing {
			t.Fatalf("node %d: packing not latched on after EnablePacking", i)
		}
	}
	after := proposeConcurrently(t, c, "on", proposers, rounds)
	all := map[string]string{}
	for k, v := range before {
		all[k] = v
	}
	for k, v := range after {
		all[k] = v
	}
	c.waitReplicated("s1", all, c.upNodes())
	sm := c.nodes[c.leader("s1")].sms["s1"]
	sm.mu.Lock()
	packed := sm.packed
	sm.mu.Unlock()
	if packed == 0 {
		t.Errorf("no packed entry after EnablePacking under %d concurrent proposers", proposers)
	}
}

// A proposer whose context ends while its command is still queued gets a
// not-applied error, and the command is never applied.
func TestProposalBufferWithdraws(t *testing.T) {
	c := newTestCluster(t, 1, []string{"s1"}, func(cfg *Config) { cfg.Packer = testPacker{} })
	g := c.group(c.leader("s1"), "s1")
	b := g.buf
	// Hold the dispatcher so the next proposal must queue.
	b.mu.Lock()
	b.held = true
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := g.Apply(ctx, []byte("withdrawn=1"))
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("queued proposal past its deadline: %v, want a not-applied deadline error", err)
	}
	b.mu.Lock()
	queued := len(b.queue)
	b.held = false
	b.mu.Unlock()
	if queued != 0 {
		t.Fatalf("%d proposals left in the queue after withdrawal", queued)
	}
	c.put("s1", "after", "1")
	if _, ok := c.nodes[0].sms["s1"].get("withdrawn"); ok {
		t.Fatal("a withdrawn proposal was applied")
	}
}

// Shutdown fails queued proposals with ErrShutdown (never proposed).
func TestProposalBufferShutdown(t *testing.T) {
	c := newTestCluster(t, 1, []string{"s1"}, func(cfg *Config) { cfg.Packer = testPacker{} })
	g := c.group(c.leader("s1"), "s1")
	g.buf.mu.Lock()
	g.buf.held = true
	g.buf.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		_, err := g.Apply(context.Background(), []byte("late=1"))
		done <- err
	}()
	// Wait until it is queued, then shut down.
	deadline := time.Now().Add(10 * time.Second)
	for {
		g.buf.mu.Lock()
		n := len(g.buf.queue)
		g.buf.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("proposal never queued")
		}
		time.Sleep(5 * time.Millisecond)
	}
	c.crash(0)
	err := <-done
	if !errors.Is(err, ErrShutdown) || errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("queued proposal at shutdown: %v, want ErrShutdown without unknown outcome", err)
	}
}

// A group has one packed entry in flight: while it is being applied, every
// command proposed meanwhile waits in the buffer, and all of them go into
// the next entry together.
func TestProposalBufferOneEntryInFlight(t *testing.T) {
	c := newTestCluster(t, 1, []string{"s1"}, func(cfg *Config) { cfg.Packer = testPacker{} })
	g := c.group(c.leader("s1"), "s1")
	sm := c.nodes[0].sms["s1"]
	sm.mu.Lock() // the state machine blocks: the first entry stays in flight
	locked := true
	defer func() {
		if locked {
			sm.mu.Unlock()
		}
	}()
	errs := make(chan error, 21)
	propose := func(cmd string) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := g.Apply(ctx, []byte(cmd))
		errs <- err
	}
	go propose("first=1")
	waitFor(t, "the first entry proposed", func() bool { return g.Stats().ProposedEntries == 1 })
	const later = 20
	for i := range later {
		go propose(fmt.Sprintf("later%d=1", i))
	}
	waitFor(t, "the later commands queued", func() bool {
		g.buf.mu.Lock()
		defer g.buf.mu.Unlock()
		return len(g.buf.queue) == later
	})
	if st := g.Stats(); st.ProposedEntries != 1 {
		t.Fatalf("%d entries proposed while the first was in flight, want 1", st.ProposedEntries)
	}
	sm.mu.Unlock()
	locked = false
	for range later + 1 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if st := g.Stats(); st.ProposedEntries != 2 || st.ProposedCommands != later+1 {
		t.Fatalf("%d commands in %d entries, want %d in 2: the queued ones packed into one", st.ProposedCommands, st.ProposedEntries, later+1)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
