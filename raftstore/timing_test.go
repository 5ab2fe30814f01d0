package raftstore

import (
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func TestWANTimingNeverBelowLAN(t *testing.T) {
	base := DefaultConfig()
	lan := WANTiming(base, time.Millisecond)
	if lan.HeartbeatTimeout != base.HeartbeatTimeout || lan.ElectionTimeout != base.ElectionTimeout || lan.LeaderLeaseTimeout != base.LeaderLeaseTimeout {
		t.Fatalf("a LAN round trip changed the timeouts: %+v", lan)
	}
	wan := WANTiming(base, 200*time.Millisecond)
	if wan.HeartbeatTimeout != 1600*time.Millisecond || wan.LeaderLeaseTimeout != 800*time.Millisecond {
		t.Fatalf("200ms round trip: %+v", wan)
	}
	// raft must accept the derived set (lease <= heartbeat <= election).
	rc := raft.DefaultConfig()
	rc.LocalID = "x"
	rc.HeartbeatTimeout, rc.ElectionTimeout, rc.LeaderLeaseTimeout = wan.HeartbeatTimeout, wan.ElectionTimeout, wan.LeaderLeaseTimeout
	if err := raft.ValidateConfig(rc); err != nil {
		t.Fatal(err)
	}
}

func TestPeerAddrsResolveOwnView(t *testing.T) {
	var p peerBook
	p.set("b", "127.0.0.1:9999")
	if a, err := p.ServerAddr("b"); err != nil || a != "127.0.0.1:9999" {
		t.Fatalf("got %q %v", a, err)
	}
	if _, err := p.ServerAddr("c"); err == nil {
		t.Fatal("unknown peer resolved")
	}
	p.set("c", "127.0.0.1:9998") // a node that joined later
	if a, err := p.ServerAddr("c"); err != nil || a != "127.0.0.1:9998" {
		t.Fatalf("got %q %v", a, err)
	}
}
