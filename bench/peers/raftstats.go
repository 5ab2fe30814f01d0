package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// raftCounters are the idem nodes' Raft figures a cell reports per cycle,
// summed over nodes and shards: counters and histogram sums and counts
// read from /metrics before and after the measured window.
var raftCounters = []string{
	"idem_raft_log_append_entries_count",      // log writes (StoreLogs), leaders' and followers'
	"idem_raft_log_append_entries_sum",        // entries in them
	"idem_raft_pebble_log_wal_syncs_total",    // WAL fdatasyncs of the pebble log
	"idem_raft_apply_batch_commands_count",    // state machine batches (ApplyBatch), every replica
	"idem_raft_proposal_entry_commands_count", // entries through the proposal buffer
	"idem_raft_proposal_entry_commands_sum",   // commands in them
}

// scrapeRaft returns raftCounters summed over the nodes at addrs; nil if a
// node does not answer (the figures are then left out, not guessed).
func scrapeRaft(ctx context.Context, addrs []string) map[string]float64 {
	if len(addrs) == 0 {
		return nil
	}
	out := map[string]float64{}
	for _, addr := range addrs {
		text, err := fetchMetrics(ctx, addr)
		if err != nil {
			return nil
		}
		m, err := sumMetrics(text, raftCounters)
		if err != nil {
			return nil
		}
		for k, v := range m {
			out[k] += v
		}
	}
	return out
}

func fetchMetrics(ctx context.Context, addr string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("/metrics of %s: %s", addr, resp.Status)
	}
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

// sumMetrics sums, per name in names, the values of every series of that
// name (with or without labels) in a Prometheus text exposition.
func sumMetrics(text string, names []string) (map[string]float64, error) {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{}
	for _, line := range strings.Split(text, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		series, value, ok := cutLast(line)
		if !ok {
			continue
		}
		name, _, _ := strings.Cut(series, "{")
		if !want[name] {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(value, &v); err != nil {
			return nil, fmt.Errorf("metric line %q: %w", line, err)
		}
		out[name] += v
	}
	return out, nil
}

// metaGroup is the shard label of a node's metadata Raft group
// (node.MetaGroupID), which every region runs beside its data shards.
const metaGroup = "meta"

// shardsLed counts the data shards a node's /metrics text says it leads:
// the idem_raft_leader series of every group but the metadata group, which
// is not one of the region's shards (counted, a four-shard region never
// looked balanced: five leaders for four shards).
func shardsLed(text string) (int, error) {
	led := 0
	for _, line := range strings.Split(text, "\n") {
		series, value, ok := cutLast(line)
		if !ok || !strings.HasPrefix(series, "idem_raft_leader{") || strings.Contains(series, `shard="`+metaGroup+`"`) {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(value, &v); err != nil {
			return 0, fmt.Errorf("metric line %q: %w", line, err)
		}
		led += int(v)
	}
	return led, nil
}

// cutLast splits a sample line at its last space: series, value.
func cutLast(line string) (string, string, bool) {
	i := strings.LastIndexByte(line, ' ')
	if i <= 0 {
		return "", "", false
	}
	return line[:i], line[i+1:], true
}

// raftPerCycle is what the table's footnote prints for an idem cell: log
// writes, WAL syncs and state-machine batches per cycle on all nodes,
// entries per log write, and commands per proposed entry.
func raftPerCycle(d map[string]float64, cycles int) string {
	if d == nil || cycles == 0 {
		return ""
	}
	n := float64(cycles)
	s := fmt.Sprintf("log writes %.2f/cycle (%.1f entries each), WAL syncs %.2f/cycle, apply batches %.2f/cycle",
		d["idem_raft_log_append_entries_count"]/n, ratioOf(d["idem_raft_log_append_entries_sum"], d["idem_raft_log_append_entries_count"]),
		d["idem_raft_pebble_log_wal_syncs_total"]/n, d["idem_raft_apply_batch_commands_count"]/n)
	if e := d["idem_raft_proposal_entry_commands_count"]; e > 0 {
		s += fmt.Sprintf(", %.1f commands per proposed entry", d["idem_raft_proposal_entry_commands_sum"]/e)
	}
	return s
}

func ratioOf(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// delta is after - before, per name; nil unless both are known.
func delta(before, after map[string]float64) map[string]float64 {
	if before == nil || after == nil {
		return nil
	}
	d := map[string]float64{}
	for k, v := range after {
		d[k] = v - before[k]
	}
	return d
}
