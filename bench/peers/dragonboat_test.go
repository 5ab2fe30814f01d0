package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"
)

// apply runs one command through kv as entry index and returns its answer.
func apply(t *testing.T, kv sm.IStateMachine, index uint64, op byte, now time.Time, key, owner string, body []byte) bool {
	t.Helper()
	res, err := kv.Update(sm.Entry{Index: index, Cmd: dbCommand(op, now.UnixNano(), key, owner, body)})
	if err != nil {
		t.Fatal(err)
	}
	return res.Value == uint64(dbYes)
}

func TestDBKVReserveComplete(t *testing.T) {
	kv := newDBKV(1, 1).(*dbKV)
	now := time.Unix(1_700_000_000, 0)
	steps := []struct {
		op    byte
		at    time.Duration
		owner string
		want  bool
	}{
		{dbOpReserve, 0, "a", true},                        // a fresh key is won
		{dbOpReserve, 0, "b", false},                       // held by a
		{dbOpComplete, 0, "b", false},                      // not b's
		{dbOpReserve, leaseTTL + time.Second, "b", true},   // a's lease ran out: b wins
		{dbOpComplete, leaseTTL + time.Second, "a", false}, // a no longer holds it
		{dbOpComplete, leaseTTL + 2*time.Second, "b", true},
		{dbOpComplete, leaseTTL + 2*time.Second, "b", false}, // done already
		{dbOpReserve, leaseTTL + 3*time.Second, "c", false},  // done and kept for retention
		{dbOpReserve, leaseTTL + 3*time.Second + retention, "c", true},
	}
	for i, s := range steps {
		if got := apply(t, kv, uint64(i+1), s.op, now.Add(s.at), "k", s.owner, []byte("body")); got != s.want {
			t.Fatalf("step %d (%c by %s at +%v) = %v, want %v", i, s.op, s.owner, s.at, got, s.want)
		}
	}
	if r := kv.recs["k"]; r.owner != "c" || r.token != uint64(len(steps)) || r.done {
		t.Errorf("record after the steps: %+v", r)
	}
	if _, err := kv.Update(sm.Entry{Index: 99, Cmd: []byte{dbOpReserve, 1}}); err == nil {
		t.Error("a short command was applied")
	}
	if _, err := kv.Update(sm.Entry{Index: 99, Cmd: dbCommand('X', now.UnixNano(), "k", "o", nil)}); err == nil {
		t.Error("an unknown operation was applied")
	}
}

func TestDBKVSnapshotRoundTrip(t *testing.T) {
	kv := newDBKV(1, 1).(*dbKV)
	now := time.Now()
	for i := range 50 {
		key := fmt.Sprintf("key-%d", i)
		apply(t, kv, uint64(2*i+1), dbOpReserve, now, key, "owner-"+key, nil)
		if i%2 == 0 {
			apply(t, kv, uint64(2*i+2), dbOpComplete, now, key, "owner-"+key, []byte(strings.Repeat("x", i)))
		}
	}
	var buf bytes.Buffer
	if err := kv.SaveSnapshot(&buf, nil, nil); err != nil {
		t.Fatal(err)
	}
	snap := bytes.Clone(buf.Bytes())
	got := newDBKV(1, 2).(*dbKV)
	if err := got.RecoverFromSnapshot(&buf, nil, nil); err != nil {
		t.Fatal(err)
	}
	if len(got.recs) != len(kv.recs) {
		t.Fatalf("%d records recovered, want %d", len(got.recs), len(kv.recs))
	}
	for k, r := range kv.recs {
		g := got.recs[k]
		if g == nil || g.owner != r.owner || g.done != r.done || g.token != r.token || g.expires != r.expires || !bytes.Equal(g.body, r.body) {
			t.Errorf("%s: recovered %+v, want %+v", k, g, r)
		}
	}
	for _, n := range []int{4, 20, len(snap) - 1} {
		if err := newDBKV(1, 3).RecoverFromSnapshot(bytes.NewReader(snap[:n]), nil, nil); err == nil {
			t.Errorf("a snapshot cut at %d of %d bytes was recovered", n, len(snap))
		}
	}
}

func TestDBFramesAndBadRequests(t *testing.T) {
	var buf bytes.Buffer
	w := bufio.NewWriter(&buf)
	req := dbRequest(dbOpComplete, 3, "key", "owner", []byte("body"))
	if err := writeDBFrame(w, 42, req); err != nil || w.Flush() != nil {
		t.Fatal(err)
	}
	id, payload, err := readDBFrame(bufio.NewReader(&buf))
	if err != nil || id != 42 || !bytes.Equal(payload, req) {
		t.Fatalf("frame read back as %d %q %v", id, payload, err)
	}
	huge := []byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 1}
	if _, _, err := readDBFrame(bufio.NewReader(bytes.NewReader(huge))); err == nil {
		t.Error("a 4 GiB frame was accepted")
	}
	// Requests the server refuses before anything is proposed.
	s := &dbServer{shards: 4}
	for name, req := range map[string][]byte{
		"short":             {dbOpReserve},
		"unknown operation": dbRequest('X', 1, "k", "o", nil),
		"group 0":           dbRequest(dbOpReserve, 0, "k", "o", nil),
		"group 5 of 4":      dbRequest(dbOpReserve, 5, "k", "o", nil),
		"truncated key":     dbRequest(dbOpReserve, 1, "k", "o", nil)[:6],
	} {
		if ans := s.handle(t.Context(), req); len(ans) == 0 || ans[0] != dbErr {
			t.Errorf("%s: answered %q, want an error", name, ans)
		}
	}
}

// Three members in this process, on loopback: every key has exactly one
// winner among concurrent reserves, only the winner completes, and the
// leaders end up spread.
func TestDragonboatRegion(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three dragonboat members")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	raftAddrs, clientAddrs, err := dbAddrs()
	if err != nil {
		t.Fatal(err)
	}
	const shards = 4
	dir := t.TempDir()
	nctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	for i := range 3 {
		wg.Go(func() {
			err := runDBNode(nctx, []string{"--id", fmt.Sprint(i + 1), "--raft-addrs", strings.Join(raftAddrs, ","),
				"--listen", clientAddrs[i], "--dir", filepath.Join(dir, fmt.Sprint(i+1)), "--shards", fmt.Sprint(shards)})
			if err != nil {
				t.Errorf("member %d: %v", i+1, err)
			}
		})
	}
	var tgt *dbTarget
	for tgt == nil {
		if tgt, err = newDBTarget(clientAddrs, shards, []byte("response"), 5*time.Second); err != nil {
			select {
			case <-ctx.Done():
				t.Fatalf("dialing the members: %v", err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	defer tgt.close()
	for err := tgt.spread(ctx); err != nil; err = tgt.spread(ctx) {
		select {
		case <-ctx.Done():
			t.Fatalf("leaders not spread: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	for k := range 12 {
		key := fmt.Sprintf("race-%d", k)
		var mu sync.Mutex
		var winners []string
		var rg sync.WaitGroup
		for c := range 8 {
			rg.Go(func() {
				owner := fmt.Sprintf("owner-%d", c)
				won, err := tgt.reserve(ctx, key, owner)
				if err != nil {
					t.Errorf("reserve %s: %v", key, err)
					return
				}
				if won {
					mu.Lock()
					winners = append(winners, owner)
					mu.Unlock()
				} else if ok, err := tgt.complete(ctx, key, owner); err != nil || ok {
					t.Errorf("a loser's complete of %s: ok=%v, %v", key, ok, err)
				}
			})
		}
		rg.Wait()
		if len(winners) != 1 {
			t.Fatalf("%s: winners %v, want exactly one", key, winners)
		}
		if ok, err := tgt.complete(ctx, key, winners[0]); err != nil || !ok {
			t.Fatalf("the winner's complete of %s: ok=%v, %v", key, ok, err)
		}
	}
}
