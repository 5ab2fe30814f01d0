package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/cluster"
)

// TestTombstonesPoliciesCheckpoints runs the HTTP-visible sentences of the
// v1.2 features of docs/api.md ("Tombstones and retention", "Namespace
// policies" and "Checkpoint") against a real dev node: policies in force
// and surviving a restart, a limit named in the 400, the default lease, a checkpoint
// travelling to the RECLAIMED attempt, EXPIRED after retention (reserve and
// GET), if_expired, and the key unknown once the tombstone is gone.
func TestTombstonesPoliciesCheckpoints(t *testing.T) {
	dir := t.TempDir()
	p, api, httpAddr := devProcess(t, dir, "--clock-skew-margin", "100ms")
	startReady(t, p, httpAddr)
	ctx := t.Context()
	ok := want(t, http.StatusOK)

	pol := ok(api.Do(ctx, "PUT", "/v1/namespaces/pay/policy", map[string]any{"default_lease_ms": 500, "max_lease_ms": 5000, "tombstone_s": 2}))
	if !strings.Contains(string(pol.Raw), `"default_lease_ms":500,"max_lease_ms":5000,"default_retention_s":86400,"max_retention_s":2592000,"tombstone_s":2`) {
		t.Fatalf("PUT policy: %s", pol)
	}
	over := want(t, http.StatusBadRequest)(api.Reserve(ctx, "pay", "k", map[string]any{"lease_ms": 6000}))
	if over.ErrCode() != "INVALID_ARGUMENT" || !strings.Contains(string(over.Raw), "max_lease_ms 5000") {
		t.Fatalf("reserve over max_lease_ms: %s", over)
	}

	// Default lease from the policy; a checkpoint; the next attempt reclaims and resumes from it.
	start := time.Now()
	acq := ok(api.Reserve(ctx, "pay", "k", map[string]any{"fingerprint": "f"}))
	leaseEnd, err := time.Parse(time.RFC3339Nano, acq.Str("lease_expires_at"))
	if err != nil || leaseEnd.Sub(start) > 2*time.Second {
		t.Fatalf("lease with the policy's 500 ms default: %s (%v)", acq, err)
	}
	data := base64.StdEncoding.EncodeToString([]byte("ch_1"))
	cp := ok(api.Do(ctx, "POST", "/v1/namespaces/pay/keys/k:checkpoint", map[string]any{"owner_token": acq.Str("owner_token"), "name": "charged", "data": data}))
	if cp.Str("checkpointed_at") == "" {
		t.Fatalf("checkpoint: %s", cp)
	}
	want(t, http.StatusConflict)(api.Do(ctx, "POST", "/v1/namespaces/pay/keys/k:checkpoint", map[string]any{"owner_token": "someone-else-000000001", "name": "x"}))
	if g := ok(api.Get(ctx, "pay", "k")); fmt.Sprint(g.Body["checkpoint"]) == "<nil>" {
		t.Fatalf("GET of an IN_PROGRESS key shows no checkpoint: %s", g)
	}
	var rec cluster.Reply
	poll(t, 10*time.Second, "RECLAIMED", func() (bool, string) {
		rec = ok(api.Reserve(ctx, "pay", "k", map[string]any{"fingerprint": "f", "owner_token": "second-owner-00000001"}))
		return rec.Str("outcome") == "RECLAIMED", rec.String()
	})
	c, _ := rec.Body["checkpoint"].(map[string]any)
	if c["name"] != "charged" || c["data"] != data || c["fencing_token"] != acq.Str("fencing_token") {
		t.Fatalf("RECLAIMED checkpoint: %s", rec)
	}

	// Completed with a one-second retention: then EXPIRED, a tombstone, for two seconds.
	ok(api.Complete(ctx, "pay", "k", map[string]any{"owner_token": "second-owner-00000001", "response": map[string]any{"status": 201}, "retention_s": 1}))
	if g := ok(api.Get(ctx, "pay", "k")); g.Body["checkpoint"] != nil {
		t.Fatalf("checkpoint kept after complete: %s", g)
	}
	var exp cluster.Reply
	poll(t, 10*time.Second, "EXPIRED", func() (bool, string) {
		exp = ok(api.Reserve(ctx, "pay", "k", map[string]any{"fingerprint": "f"}))
		return exp.Str("outcome") == "EXPIRED", exp.String()
	})
	if exp.Str("fencing_token") != rec.Str("fencing_token") || exp.Str("completed_at") == "" || exp.Str("expired_at") == "" || exp.Body["response"] != nil {
		t.Fatalf("EXPIRED: %s", exp)
	}
	if g := ok(api.Get(ctx, "pay", "k")); g.Str("state") != "EXPIRED" || g.Str("expired_at") != exp.Str("expired_at") || g.Body["response"] != nil {
		t.Fatalf("GET of a tombstone: %s", g)
	}
	// Once the tombstone is gone: 404, and the next reserve ACQUIRED with a larger token.
	poll(t, 10*time.Second, "404 after the tombstone", func() (bool, string) {
		g, err := api.Get(ctx, "pay", "k")
		return err == nil && g.Status == http.StatusNotFound, g.String()
	})
	fresh := ok(api.Reserve(ctx, "pay", "k", map[string]any{"fingerprint": "g"}))
	newToken, _ := strconv.ParseUint(fresh.Str("fencing_token"), 10, 64)
	oldToken, _ := strconv.ParseUint(exp.Str("fencing_token"), 10, 64)
	if fresh.Str("outcome") != "ACQUIRED" || newToken <= oldToken {
		t.Fatalf("after the tombstone: %s (tombstone token %s)", fresh, exp.Str("fencing_token"))
	}

	// if_expired acquires a tombstoned key at once.
	a2 := ok(api.Reserve(ctx, "pay", "k2", nil))
	ok(api.Complete(ctx, "pay", "k2", map[string]any{"owner_token": a2.Str("owner_token"), "response": map[string]any{"status": 200}, "retention_s": 1}))
	poll(t, 10*time.Second, "ACQUIRED with if_expired", func() (bool, string) {
		r := ok(api.Reserve(ctx, "pay", "k2", map[string]any{"if_expired": "acquire"}))
		return r.Str("outcome") == "ACQUIRED", r.String()
	})

	// The policy survives a restart.
	if err := p.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	startReady(t, p, httpAddr)
	if g := ok(api.Do(ctx, "GET", "/v1/namespaces/pay/policy", nil)); string(g.Raw) != string(pol.Raw) {
		t.Fatalf("policy after a restart %s, set %s", g, pol)
	}
}

// poll calls check until it reports true, for at most limit; it fails the
// test with what it last saw.
func poll(t *testing.T, limit time.Duration, what string, check func() (bool, string)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	last := ""
	for {
		done, seen := check()
		if done {
			return
		}
		last = seen
		select {
		case <-ctx.Done():
			t.Fatalf("no %s within %s; last seen: %s", what, limit, last)
		case <-tick.C:
		}
	}
}
