package main

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/node"
	"github.com/idem-dev/idem/security/transport"
)

// TestFlagDefaultsAreConfigDefaults: with no flag but --dev, every setting
// a flag sets holds node.DefaultConfig()'s value (or, for the security
// flags, transport.DefaultFlags()'s): the flags' defaults are the Config's.
func TestFlagDefaultsAreConfigDefaults(t *testing.T) {
	o, err := parseFlags([]string{"--dev"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := node.DefaultConfig()
	got := o.cfg
	sec := transport.DefaultFlags()
	fs := o.flags.FlagSet()
	for _, c := range []struct {
		flag      string
		got, want any
	}{
		{"max-response-bytes", got.MaxResponseBytes, want.MaxResponseBytes},
		{"state-cache-bytes", got.StateCacheBytes, want.StateCacheBytes},
		{"max-state-bytes", got.MaxStateBytes, want.MaxStateBytes},
		{"disk-reserve-bytes", got.DiskReserveBytes, want.DiskReserveBytes},
		{"max-waiters", got.MaxWaiters, want.MaxWaiters},
		{"clock-skew-margin", got.ClockSkewMargin, want.ClockSkewMargin},
		{"max-clock-offset", got.MaxClockOffset, want.MaxClockOffset},
		{"raft-snapshot-threshold", got.Raft.SnapshotThreshold, want.Raft.SnapshotThreshold},
		{"raft-snapshot-interval", got.Raft.SnapshotInterval, want.Raft.SnapshotInterval},
		{"raft-trailing-logs", got.Raft.TrailingLogs, want.Raft.TrailingLogs},
		{"raft-max-conns", got.Raft.MaxInboundConns, want.Raft.MaxInboundConns},
		{"raft-log-store", got.Raft.LogStore, want.Raft.LogStore},
		{"raft-pack-commands", got.PackCommands, want.PackCommands},
		{"testing-clock-offset", got.Testing.ClockOffset, want.Testing.ClockOffset},
		{"testing-fail-log-commits-after", got.Testing.FailLogCommitsAfter, want.Testing.FailLogCommitsAfter},
		{"max-conns", o.sec.MaxConns, sec.MaxConns},
		{"http-read-timeout", o.sec.HTTP.ReadTimeout, sec.HTTP.ReadTimeout},
		{"http-write-timeout", o.sec.HTTP.WriteTimeout, sec.HTTP.WriteTimeout},
		{"http-idle-timeout", o.sec.HTTP.IdleTimeout, sec.HTTP.IdleTimeout},
	} {
		// The default --help prints, and the value a run without the flag
		// gets, are both the Config's.
		if d := fs.Lookup(c.flag).DefValue; d != fmt.Sprint(c.want) {
			t.Errorf("--%s: --help's default %q, Config default %v", c.flag, d, c.want)
		}
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("--%s: default %v, Config default %v", c.flag, c.got, c.want)
		}
	}
	// The node's Config built from those flags keeps the defaults (the
	// clock check is off in --dev).
	cfg, err := nodeConfig(o)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxClockOffset != -1 || cfg.StateCacheBytes != want.StateCacheBytes || cfg.Raft.SnapshotInterval != want.Raft.SnapshotInterval {
		t.Errorf("dev node config: clock check %v (want -1, off), cache %d, snapshot interval %v", cfg.MaxClockOffset, cfg.StateCacheBytes, cfg.Raft.SnapshotInterval)
	}
}

// TestRenamedFlagsKeepTheirFormerNames: a former name sets the same field
// as the new one and is warned of once, naming the new name.
func TestRenamedFlagsKeepTheirFormerNames(t *testing.T) {
	for _, c := range []struct {
		args  []string
		check func(node.Config) bool
	}{
		{[]string{"--snapshot-threshold", "40"}, func(c node.Config) bool { return c.Raft.SnapshotThreshold == 40 }},
		{[]string{"--snapshot-interval", "200ms"}, func(c node.Config) bool { return c.Raft.SnapshotInterval == 200*time.Millisecond }},
		{[]string{"--trailing-logs", "8"}, func(c node.Config) bool { return c.Raft.TrailingLogs == 8 }},
		{[]string{"--max-raft-conns", "7", "--max-raft-conns", "9"}, func(c node.Config) bool { return c.Raft.MaxInboundConns == 9 }},
	} {
		o, cfg := devConfig(t, c.args...)
		if !c.check(cfg) {
			t.Errorf("%v: not applied to the config: %+v", c.args, cfg.Raft)
		}
		var logs bytes.Buffer
		o.flags.Warn(slog.New(slog.NewTextHandler(&logs, nil)))
		o.flags.Warn(slog.New(slog.NewTextHandler(&logs, nil)))
		if n := strings.Count(logs.String(), "deprecated flag name"); n != 1 || !strings.Contains(logs.String(), "flag="+c.args[0]+" use=--raft-") {
			t.Errorf("%v: %d warnings, want 1 naming the new flag:\n%s", c.args, n, logs.String())
		}
	}
	o, err := parseFlags([]string{"--dev", "--raft-trailing-logs", "8"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if d := o.flags.Deprecated(); len(d) != 0 {
		t.Errorf("the new name is warned of: %q", d)
	}
}

// devConfig parses --dev and args and returns the options and the node
// Config they make; it fails the test on an error.
func devConfig(t *testing.T, args ...string) (*options, node.Config) {
	t.Helper()
	o, err := parseFlags(append([]string{"--dev"}, args...), io.Discard)
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	cfg, err := nodeConfig(o)
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return o, cfg
}
