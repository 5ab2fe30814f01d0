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
	li := c.leader("s1")
	g := c.group(li, "s1")

	const proposers, rounds = 64, 5
	want := map[string]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, proposers*rounds)
	for p := range proposers {
		wg.Go(func() {
			g := g // this proposer's view of the leader
			for r := range rounds {
				key, val := fmt.Sprintf("k%d-%d", p, r), fmt.Sprintf("v%d", r)
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

// A proposer whose context ends while its command is still queued gets a
// not-applied error, and the command is never applied.
func TestProposalBufferWithdraws(t *testing.T) {
	c := newTestCluster(t, 1, []string{"s1"}, func(cfg *Config) { cfg.Packer = testPacker{} })
	g := c.group(c.leader("s1"), "s1")
	b := g.buf
	// Fill the in-flight slots by hand so the next proposal must queue.
	b.mu.Lock()
	b.inflight = maxInflightEntries
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := g.Apply(ctx, []byte("withdrawn=1"))
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("queued proposal past its deadline: %v, want a not-applied deadline error", err)
	}
	b.mu.Lock()
	queued := len(b.queue)
	b.inflight = 0
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
	g.buf.inflight = maxInflightEntries
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
