package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/topology"
)

// TestIdemctlKeys runs the operator actions against real processes: one
// region of three nodes, four shards, three replicas, and a router. Listing
// pages (JSON, through a node and through the router) cover every shard
// exactly once; force-release and delete through idemctl change what the old
// owner and the next reserve get, with fencing tokens still increasing.
func TestIdemctlKeys(t *testing.T) {
	topo, err := launch.Topology(launch.Spec{Cluster: "keys", Regions: []string{"east"}, NodesPerRegion: 3, ShardsPerRegion: 4, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.NewNodes(topo, t.TempDir(), binaries.Path(t, "idemnode"))
	if err != nil {
		t.Fatal(err)
	}
	rt := startWithRouter(t, c, "east")
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	ring, err := topology.NewRing(topo)
	if err != nil {
		t.Fatal(err)
	}
	api := rt.API()
	const ns = "billing"
	const keys = 60
	tokens := map[string]string{}
	shardsUsed := map[string]int{}
	for i := range keys {
		key := fmt.Sprintf("inv:%03d", i)
		r, err := api.Reserve(ctx, ns, key, map[string]any{"owner_token": fmt.Sprintf("owner-token-%06d", i)})
		if err != nil || r.Str("outcome") != "ACQUIRED" {
			t.Fatalf("reserve %s: %v %v", key, r, err)
		}
		tokens[key] = r.Str("fencing_token")
		shardsUsed[ring.Locate(ns, key).ID]++
		if i%3 == 0 {
			if r, err := api.Complete(ctx, ns, key, map[string]any{"owner_token": fmt.Sprintf("owner-token-%06d", i), "response": map[string]any{"status": 200}}); err != nil || r.Status != 200 {
				t.Fatalf("complete %s: %v %v", key, r, err)
			}
		}
	}
	if len(shardsUsed) != 4 {
		t.Fatalf("keys fell on %d shards, want all 4: %v", len(shardsUsed), shardsUsed)
	}
	if r, err := api.Reserve(ctx, "other", "inv:000", nil); err != nil || r.Status != 200 {
		t.Fatalf("reserve in another namespace: %v %v", r, err)
	}

	t.Run("pages cover every shard once", func(t *testing.T) {
		nodeAPI := cluster.NewAPI(c.HTTPAddr(topo.Nodes()[1].ID))
		for name, a := range map[string]*cluster.API{"router": api, "node": nodeAPI} {
			seen := map[string]int{}
			token := ""
			for pages := 0; ; pages++ {
				if pages > keys {
					t.Fatalf("%s: listing does not end", name)
				}
				path := "/v1/namespaces/" + ns + "/keys?limit=7"
				if token != "" {
					path += "&page_token=" + url.QueryEscape(token)
				}
				r, err := a.Do(ctx, "GET", path, nil)
				if err != nil || r.Status != 200 {
					t.Fatalf("%s: list: %v %v", name, r, err)
				}
				page := r.Body["keys"].([]any)
				if len(page) > 7 {
					t.Fatalf("%s: page of %d keys, limit 7", name, len(page))
				}
				for _, k := range page {
					k := k.(map[string]any)
					key := k["key"].(string)
					seen[key]++
					if k["fencing_token"] != tokens[key] {
						t.Fatalf("%s: %s listed with token %v, reserved with %s", name, key, k["fencing_token"], tokens[key])
					}
				}
				if token = r.Str("next_page_token"); token == "" {
					break
				}
			}
			if len(seen) != keys {
				t.Fatalf("%s: listed %d distinct keys, want %d", name, len(seen), keys)
			}
			for key, n := range seen {
				if n != 1 {
					t.Fatalf("%s: %s listed %d times", name, key, n)
				}
			}
		}
		v := decode[listView](t, mustCtl(t, "--config", c.TopologyPath, "keys", "list", ns, "--state", "IN_PROGRESS", "--limit", "1000", "--json"))
		if len(v.Keys) != 40 || v.NextPageToken != "" {
			t.Fatalf("idemctl keys list --state IN_PROGRESS: %d keys (token %q), want 40", len(v.Keys), v.NextPageToken)
		}
		v = decode[listView](t, mustCtl(t, "--config", c.TopologyPath, "keys", "list", ns, "--limit", "25", "--json"))
		if len(v.Keys) != 25 || v.NextPageToken == "" {
			t.Fatalf("idemctl keys list --limit 25: %d keys (token %q)", len(v.Keys), v.NextPageToken)
		}
		rest := decode[listView](t, mustCtl(t, "--config", c.TopologyPath, "keys", "list", ns, "--limit", "1000", "--page-token", v.NextPageToken, "--json"))
		if len(rest.Keys) != keys-25 {
			t.Fatalf("continued listing: %d keys, want %d", len(rest.Keys), keys-25)
		}
		if v := decode[listView](t, mustCtl(t, "keys", "list", ns, "--addr", rt.GRPCAddr, "--older-than", "1h", "--json")); len(v.Keys) != 0 {
			t.Fatalf("--older-than 1h: %d keys", len(v.Keys))
		}
	})

	t.Run("force-release", func(t *testing.T) {
		const key = "inv:001" // in progress, owner-token-000001
		if _, err := ctl(t, "--config", c.TopologyPath, "keys", "force-release", ns, key); err == nil || !strings.Contains(err.Error(), "--reason") {
			t.Fatalf("force-release without --reason: %v", err)
		}
		v := decode[actionView](t, mustCtl(t, "keys", "force-release", ns, key, "--addr", rt.GRPCAddr, "--reason", "worker lost in incident 7", "--json"))
		if v.PreviousFencingToken != tokens[key] {
			t.Fatalf("force-release: %+v, want previous token %s", v, tokens[key])
		}
		if r, _ := api.Complete(ctx, ns, key, map[string]any{"owner_token": "owner-token-000001", "response": map[string]any{"status": 200}}); r.Status != 409 || r.ErrCode() != "NOT_OWNER" {
			t.Fatalf("old owner's complete: %v", r)
		}
		r, err := api.Reserve(ctx, ns, key, map[string]any{"owner_token": "owner-token-retry1"})
		if err != nil || r.Str("outcome") != "RECLAIMED" || r.Str("previous_fencing_token") != tokens[key] || !greater(r.Str("fencing_token"), tokens[key]) {
			t.Fatalf("retry after force-release: %v %v", r, err)
		}
		_, err = ctl(t, "--config", c.TopologyPath, "keys", "force-release", ns, "inv:000", "--reason", "completed")
		if err == nil || !strings.Contains(err.Error(), "FAILED_PRECONDITION") {
			t.Fatalf("force-release of a completed key: %v", err)
		}
	})

	t.Run("delete", func(t *testing.T) {
		const key = "inv:003" // completed
		out := mustCtl(t, "--config", c.TopologyPath, "keys", "delete", ns, key, "--reason", "customer asked for a rerun")
		if !strings.Contains(out, "deleted") {
			t.Fatalf("delete printed %q", out)
		}
		if r, _ := api.Get(ctx, ns, key); r.Status != 404 {
			t.Fatalf("get after delete: %v", r)
		}
		r, err := api.Reserve(ctx, ns, key, nil)
		if err != nil || r.Str("outcome") != "ACQUIRED" || !greater(r.Str("fencing_token"), tokens[key]) {
			t.Fatalf("reserve after delete: %v %v", r, err)
		}
		if _, err := ctl(t, "--config", c.TopologyPath, "keys", "delete", ns, "never-reserved", "--reason", "x"); err == nil || !strings.Contains(err.Error(), "NOT_FOUND") {
			t.Fatalf("delete of an absent key: %v", err)
		}
	})

	t.Run("waiting", func(t *testing.T) {
		leaders, err := c.ShardLeaders(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// waiting reports how many reserves wait on the nodes now.
		waiting := func() (int, string) {
			total := 0
			for _, n := range topo.Nodes() {
				r, err := cluster.NewAPI(n.HTTPAddr).Do(ctx, "GET", "/metrics", nil)
				if err != nil {
					return -1, err.Error()
				}
				for _, line := range strings.Split(string(r.Raw), "\n") {
					if strings.HasPrefix(line, "idem_keys_waiting_reserves{") {
						f := strings.Fields(line)
						v, _ := strconv.ParseFloat(f[len(f)-1], 64)
						total += int(v)
					}
				}
			}
			return total, fmt.Sprintf("%d waiting", total)
		}
		waitFor := func(n int) {
			t.Helper()
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				got, last := waiting()
				if got == n {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("waiting reserves: %s, want %d", last, n)
				}
			}
		}
		type answer struct {
			r   cluster.Reply
			err error
			at  time.Time
		}
		start := func(a *cluster.API, key string, waitMs int) chan answer {
			ch := make(chan answer, 1)
			go func() {
				r, err := a.Reserve(ctx, ns, key, map[string]any{"wait_ms": waitMs})
				ch <- answer{r, err, time.Now()}
			}()
			return ch
		}
		// A node that does not lead the key's shard: its waiter is forwarded
		// and waits on the leader.
		const key = "wait:1"
		var follower *cluster.API
		for _, n := range topo.Nodes() {
			if n.ID != leaders[ring.Locate(ns, key).ID] {
				follower = cluster.NewAPI(n.HTTPAddr)
				break
			}
		}
		if r, err := api.Reserve(ctx, ns, key, map[string]any{"owner_token": "owner-token-waited"}); err != nil || r.Str("outcome") != "ACQUIRED" {
			t.Fatalf("reserve: %v %v", r, err)
		}
		viaRouter, viaNode := start(api, key, 20000), start(follower, key, 20000)
		waitFor(2)
		r, err := follower.Complete(ctx, ns, key, map[string]any{"owner_token": "owner-token-waited", "response": map[string]any{"status": 201, "body": "ZG9uZQ=="}})
		completed := time.Now()
		if err != nil || r.Status != 200 {
			t.Fatalf("complete: %v %v", r, err)
		}
		for name, ch := range map[string]chan answer{"router": viaRouter, "follower": viaNode} {
			a := <-ch
			resp, _ := a.r.Body["response"].(map[string]any)
			if a.err != nil || a.r.Str("outcome") != "COMPLETED" || resp["body"] != "ZG9uZQ==" {
				t.Fatalf("waiter via %s: %v %v, want the completed response", name, a.r, a.err)
			}
			t.Logf("waiter via %s answered %v after the complete returned (noisy shared box)", name, a.at.Sub(completed))
		}

		// Released while a waiter waits: it acquires.
		const freed = "wait:2"
		api.Reserve(ctx, ns, freed, map[string]any{"owner_token": "owner-token-freed1"})
		waiter := start(api, freed, 20000)
		waitFor(1)
		if r, err := api.Release(ctx, ns, freed, map[string]any{"owner_token": "owner-token-freed1"}); err != nil || r.Status != 200 {
			t.Fatalf("release: %v %v", r, err)
		}
		if a := <-waiter; a.err != nil || a.r.Str("outcome") != "ACQUIRED" {
			t.Fatalf("waiter after release: %v %v", a.r, a.err)
		}

		// Nothing ends it: IN_PROGRESS after wait_ms, and nobody waits on.
		const busy = "wait:3"
		api.Reserve(ctx, ns, busy, map[string]any{"owner_token": "owner-token-busy01"})
		if a := <-start(api, busy, 300); a.err != nil || a.r.Str("outcome") != "IN_PROGRESS" {
			t.Fatalf("waiter that nothing wakes: %v %v", a.r, a.err)
		}
		waitFor(0)
	})

	// Each action is logged with principal, key and reason by the process
	// it reached first (the router for --addr, a node otherwise).
	logs := ""
	for _, p := range append([]*launch.Process{c.Routers["router-east"]}, nodeProcesses(c)...) {
		data, _ := os.ReadFile(p.Log)
		logs += string(data)
	}
	for _, want := range []string{`principal=root namespace=billing key=inv:001 reason="worker lost in incident 7" outcome=OK`,
		`action=delete principal=root namespace=billing key=inv:003 reason="customer asked for a rerun" outcome=OK`} {
		if !strings.Contains(logs, want) {
			t.Errorf("no log line with %q", want)
		}
	}
}

func nodeProcesses(c *cluster.Cluster) []*launch.Process {
	var ps []*launch.Process
	for _, p := range c.Nodes {
		ps = append(ps, p)
	}
	return ps
}

func greater(a, b string) bool {
	x, err1 := strconv.ParseUint(a, 10, 64)
	y, err2 := strconv.ParseUint(b, 10, 64)
	return err1 == nil && err2 == nil && x > y
}
