package transport

import (
	"strings"
	"testing"
)

func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:80": true, "127.1.2.3:80": true, "[::1]:80": true, "localhost:80": true,
		"0.0.0.0:80": false, ":80": false, "[::]:80": false, "10.0.0.1:80": false, "idem-1:7000": false, "garbage": false,
	} {
		if got := Loopback(addr); got != want {
			t.Errorf("Loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

func TestCheckExposure(t *testing.T) {
	exposed := map[string]string{"--http-addr": "0.0.0.0:8080", "--grpc-addr": "127.0.0.1:7070", "--raft-addr": "10.1.1.1:7000"}
	err := CheckExposure(exposed, "", false)
	if err == nil || !strings.Contains(err.Error(), "--http-addr 0.0.0.0:8080, --raft-addr 10.1.1.1:7000") || strings.Contains(err.Error(), "7070") {
		t.Fatalf("exposed without certs: %v", err)
	}
	if err := CheckExposure(exposed, "/certs", false); err != nil {
		t.Fatalf("with a certs dir: %v", err)
	}
	if err := CheckExposure(exposed, "", true); err != nil {
		t.Fatalf("with --insecure: %v", err)
	}
	if err := CheckExposure(map[string]string{"--http-addr": "127.0.0.1:1", "--grpc-addr": "[::1]:2"}, "", false); err != nil {
		t.Fatalf("loopback only: %v", err)
	}
}

func TestCheckLoopback(t *testing.T) {
	for _, tc := range []struct {
		addr, wantErr string
	}{
		{"127.0.0.1:6060", ""},
		{"127.1.2.3:6060", ""},
		{"[::1]:6060", ""},
		{"localhost:6060", ""},
		{"0.0.0.0:6060", "only a loopback address"},
		{":6060", "only a loopback address"},
		{"10.0.0.1:6060", "only a loopback address"},
		{"example.com:6060", "only a loopback address"},
		{"6060", "is not HOST:PORT"},
	} {
		err := CheckLoopback("--pprof-addr", tc.addr)
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("CheckLoopback(%q) = %v, want %q", tc.addr, err, tc.wantErr)
		}
	}
}
