package launch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Ports handed out by FreePorts stay reserved for the life of the process
// that asked, in two ways:
//
//   - within the process, a port is never handed out twice, so a router laid
//     out after a node was killed cannot be given that node's port (the node
//     binds it again when it restarts);
//   - across processes (go test runs packages in parallel, each starting its
//     own clusters), a port is reserved by an exclusive flock on a file named
//     after it in one shared directory. The kernel drops the lock when the
//     process exits, however it exits, so nothing goes stale.
//
// A listen probe alone (what FreePorts did before) says only that the port
// was free at that instant: two test processes could pick the same port and
// the slower one's router found another cluster's gRPC server on its HTTP
// port (a CI failure of TestMultiRegionZone).
var reserved struct {
	sync.Mutex
	locks map[int]*os.File // held open: closing would release the flock
	dir   string
}

// portLockDir is shared by every process of this user on the machine.
func portLockDir() string {
	return filepath.Join(os.TempDir(), "idem-test-ports-"+strconv.Itoa(os.Getuid()))
}

// reserve claims port p for this process, or reports false if this process
// or another one already holds it.
func reserve(p int) (bool, error) {
	reserved.Lock()
	defer reserved.Unlock()
	if reserved.locks == nil {
		reserved.dir = portLockDir()
		if err := os.MkdirAll(reserved.dir, 0o700); err != nil {
			return false, fmt.Errorf("cluster: port lock dir: %w", err)
		}
		reserved.locks = map[int]*os.File{}
	}
	if _, mine := reserved.locks[p]; mine {
		return false, nil
	}
	f, err := os.OpenFile(filepath.Join(reserved.dir, strconv.Itoa(p)), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return false, fmt.Errorf("cluster: port lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return false, nil // another process holds it
		}
		return false, fmt.Errorf("cluster: port lock %d: %w", p, err)
	}
	reserved.locks[p] = f
	return true, nil
}

// release gives back a port reserve claimed but FreePorts did not hand out.
func release(p int) {
	reserved.Lock()
	defer reserved.Unlock()
	if f, ok := reserved.locks[p]; ok {
		f.Close()
		delete(reserved.locks, p)
	}
}

func releaseAll(ports []int) {
	for _, p := range ports {
		release(p)
	}
}

// ephemeralPorts is FreePorts for a machine whose ephemeral range leaves
// too little room below it: ports the kernel hands out for :0, all held at
// once (so none repeats) and reserved like the others.
func ephemeralPorts(n int) ([]int, error) {
	var out []int
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for tries := 0; len(out) < n && tries < 20*n; tries++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			break
		}
		lns = append(lns, ln)
		p := ln.Addr().(*net.TCPAddr).Port
		ok, err := reserve(p)
		if err != nil {
			releaseAll(out)
			return nil, err
		}
		if ok {
			out = append(out, p)
		}
	}
	if len(out) < n {
		releaseAll(out)
		return nil, fmt.Errorf("cluster: found only %d of %d free ports", len(out), n)
	}
	return out, nil
}

// FreePorts returns n distinct TCP ports on 127.0.0.1 that were free when
// it looked, reserved for this process (see reserved) so no other caller of
// FreePorts, here or in another process, gets them. It picks them at random
// below the kernel's ephemeral range: listeners on :0 and outgoing
// connections draw from that range, so a port picked there could be taken
// by another process (or this one) before the idem process that is meant to
// bind it starts. It falls back to ephemeral ports when the range leaves no
// room below it.
func FreePorts(n int) ([]int, error) {
	low := 32768
	if data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var lo, hi int
		if _, err := fmt.Sscan(string(data), &lo, &hi); err == nil {
			low = lo
		}
	}
	const base = 10000
	if low-base < 20*n {
		return ephemeralPorts(n)
	}
	var out []int
	for tries := 0; len(out) < n && tries < 200*n; tries++ {
		p := base + rand.IntN(low-base)
		ok, err := reserve(p)
		if err != nil {
			releaseAll(out)
			return nil, err
		}
		if !ok {
			continue
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			release(p) // bound by something that is not ours
			continue
		}
		ln.Close()
		out = append(out, p)
	}
	if len(out) < n {
		releaseAll(out)
		return nil, fmt.Errorf("cluster: found only %d of %d free ports", len(out), n)
	}
	return out, nil
}

// HoldPorts reserves fixed ports (the 127.0.0.1:8080 of a documented example)
// for this process, as FreePorts reserves its own, waiting while another
// process holds any of them, until ctx ends. Tests that start the
// repository's examples on their fixed ports (the documentation's
// transcripts, deploy's example scripts) call it first, so that two packages
// of one go test run take turns instead of failing each other. It reserves
// all of the ports or none; release gives them back.
func HoldPorts(ctx context.Context, ports ...int) (release func(), err error) {
	wait := 20 * time.Millisecond
	for {
		var held []int
		ok := true
		for _, p := range ports {
			got, err := reserve(p)
			if err != nil {
				releaseAll(held)
				return nil, err
			}
			if !got {
				ok = false
				break
			}
			held = append(held, p)
		}
		if ok {
			return func() { releaseAll(held) }, nil
		}
		releaseAll(held)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("launch: ports %v: another test process held one of them until %w", ports, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}
