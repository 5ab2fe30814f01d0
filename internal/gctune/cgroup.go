package gctune

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
)

// A process in a container with a memory limit is killed by the kernel
// when it goes over it; Go's collector knows nothing of that limit unless
// GOMEMLIMIT says it. MemoryLimit reads the limit of the cgroup the process
// runs in (and of every cgroup above it: the smallest applies), so that the
// servers can set a soft limit below it (SoftLimitFor) and the collector
// works harder as the heap nears it instead of the process being killed.

// noLimit is the least value cgroup v1 reports for "no limit" (the kernel
// writes PAGE_COUNTER_MAX rounded to pages, 9223372036854771712 on 4 KiB
// pages); anything at or above it means unlimited.
const noLimit = 1 << 62

// ErrNoLimit says that the process's cgroups set no memory limit (or that
// there are none to read, as outside Linux).
var ErrNoLimit = errors.New("gctune: no cgroup memory limit")

// MemoryLimit is the memory limit in bytes that the cgroups of the calling
// process impose, and the file it came from; ErrNoLimit when none does.
// root is the file system holding /proc and /sys (os.DirFS("/") in
// production, a fake tree in tests).
func MemoryLimit(root fs.FS) (uint64, string, error) {
	data, err := fs.ReadFile(root, "proc/self/cgroup")
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, "", ErrNoLimit
		}
		return 0, "", fmt.Errorf("gctune: reading the process's cgroups: %w", err)
	}
	var v2, v1 string
	v2Found, v1Found := false, false
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2, v2Found = parts[2], true
		case hasController(parts[1], "memory"):
			v1, v1Found = parts[2], true
		}
	}
	if v1Found {
		if limit, file, err := smallestLimit(root, "sys/fs/cgroup/memory", v1, "memory.limit_in_bytes"); !errors.Is(err, ErrNoLimit) {
			return limit, file, err
		}
	}
	if v2Found {
		return smallestLimit(root, "sys/fs/cgroup", v2, "memory.max")
	}
	return 0, "", ErrNoLimit
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// smallestLimit reads file in the cgroup at cgroupPath under mount and in
// every cgroup above it up to the mount's root, and returns the smallest
// limit set. A cgroup namespace (as in a container) shows the container's
// own cgroup as "/", so the walk then reads the mount's root alone.
func smallestLimit(root fs.FS, mount, cgroupPath, file string) (uint64, string, error) {
	best, bestFile := uint64(0), ""
	dir := path.Clean("/" + cgroupPath)
	for {
		name := path.Join(mount, dir, file)
		data, err := fs.ReadFile(root, name)
		switch {
		case err == nil:
			s := strings.TrimSpace(string(data))
			if s != "max" {
				n, err := strconv.ParseUint(s, 10, 64)
				if err != nil {
					return 0, "", fmt.Errorf("gctune: /%s: %q is not a byte count", name, s)
				}
				if n < noLimit && (best == 0 || n < best) {
					best, bestFile = n, "/"+name
				}
			}
		case !errors.Is(err, fs.ErrNotExist):
			return 0, "", fmt.Errorf("gctune: reading /%s: %w", name, err)
		}
		if dir == "/" {
			break
		}
		dir = path.Dir(dir)
	}
	if best == 0 {
		return 0, "", ErrNoLimit
	}
	return best, bestFile, nil
}

// SoftLimitFor is the Go memory limit (debug.SetMemoryLimit) for a process
// whose cgroup allows limit bytes: 90% of it, leaving the rest for what the
// Go runtime does not count (C allocations of a cgo build, the kernel's
// page tables and socket buffers charged to the cgroup, thread stacks).
func SoftLimitFor(limit uint64) int64 {
	soft := limit / 10 * 9
	if soft > 1<<62 {
		soft = 1 << 62
	}
	return int64(soft)
}

// HeadroomFor caps the least room between collections at a quarter of the
// soft limit, so that a small container's heap is collected well before the
// limit instead of the collector running flat out at it. 0 (no limit) keeps
// headroom.
func HeadroomFor(headroom uint64, softLimit int64) uint64 {
	if softLimit <= 0 {
		return headroom
	}
	return min(headroom, uint64(softLimit)/4)
}

// RootFS is the file system MemoryLimit reads in production.
func RootFS() fs.FS { return os.DirFS("/") }
