package main

import (
	"fmt"
	"os"
	"runtime"
	"syscall"
	"time"
)

// hostCosts is what this machine charges for the kernel work every store in
// the run does per operation: a system call, a wake-up of another thread, a
// synced append, the first touch of a fresh page. On a virtual machine these
// cost many times what they do on bare metal, and how many times moves from
// hour to hour (the host's other tenants): the 2-core VM this benchmark was
// written on has shown a 700-byte append + fdatasync at 0.14 ms one day and
// 0.55 ms another. Every table is printed with the figures measured before
// and after its rounds, so that runs on different days can be read side by
// side, and so that a ratio idem/peer can be read against what the box made
// each extra sync or wake-up cost in that run (raftstore/DESIGN.md, "What
// this VM charges for kernel work").
type hostCosts struct {
	Syscall  time.Duration // one getppid(2), wall time of a tight loop (all CPU)
	WakeWall time.Duration // one round trip between two threads over two pipes: two writes, two reads, two wake-ups
	WakeCPU  time.Duration // the CPU time of that round trip, both threads
	SyncWall time.Duration // write(2) of 700 bytes at the end of a file, then fdatasync(2)
	SyncCPU  time.Duration // the CPU time of that
	Fault    time.Duration // writing one byte into a fresh anonymous page (a page fault and the page's zeroing)
}

func (h hostCosts) String() string {
	return fmt.Sprintf("system call %s; thread wake-up round trip %s (%s CPU); 700-byte append + fdatasync %s (%s CPU); first touch of a page %s",
		fmtFineMicros(h.Syscall), fmtFineMicros(h.WakeWall), fmtFineMicros(h.WakeCPU), fmtFineMicros(h.SyncWall), fmtFineMicros(h.SyncCPU), fmtFineMicros(h.Fault))
}

// fmtFineMicros is fmtMicros with two decimals below 10 µs.
func fmtFineMicros(d time.Duration) string {
	us := float64(d.Nanoseconds()) / 1e3
	if us < 10 {
		return fmt.Sprintf("%.2f µs", us)
	}
	return fmtMicros(d)
}

// hostLimits bound each measurement in count and in time: the whole
// measurement takes about a second on an idle box and stops by itself on a
// slow one.
type hostLimits struct {
	syscalls, wakes, syncs, pages int
	each                          time.Duration
}

var defaultHostLimits = hostLimits{syscalls: 100_000, wakes: 5_000, syncs: 1_000, pages: 4096, each: 500 * time.Millisecond}

// measureHost measures hostCosts, the synced appends in a file in dir (the
// disk the systems' data directories are on).
func measureHost(dir string, lim hostLimits) (hostCosts, error) {
	// CPU times are the process's (RUSAGE_SELF: RUSAGE_THREAD was seen to
	// read 0 for a millisecond of system calls here); nothing else of this
	// process is busy while it measures.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var h hostCosts
	var err error
	if _, err = perOp(lim.syscalls, lim.each, func() error {
		syscall.Getppid()
		return nil
	}, &h.Syscall); err != nil {
		return h, err
	}
	if h.WakeWall, h.WakeCPU, err = measureWakes(lim); err != nil {
		return h, fmt.Errorf("thread wake-ups: %w", err)
	}
	if h.SyncWall, h.SyncCPU, err = measureSyncs(dir, lim); err != nil {
		return h, fmt.Errorf("synced appends in %s: %w", dir, err)
	}
	if h.Fault, err = measureFaults(lim); err != nil {
		return h, fmt.Errorf("page faults: %w", err)
	}
	return h, nil
}

// perOp runs op up to n times or for at most limit, and returns the
// process's CPU time per op; wall, if not nil, receives the wall time per
// op.
func perOp(n int, limit time.Duration, op func() error, wall *time.Duration) (time.Duration, error) {
	c0, err := cpuTime()
	if err != nil {
		return 0, err
	}
	start := time.Now()
	done := 0
	for done < n && (done%64 != 0 || time.Since(start) < limit) {
		if err := op(); err != nil {
			return 0, err
		}
		done++
	}
	elapsed := time.Since(start)
	c1, err := cpuTime()
	if err != nil {
		return 0, err
	}
	if wall != nil {
		*wall = elapsed / time.Duration(done)
	}
	return (c1 - c0) / time.Duration(done), nil
}

func cpuTime() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// measureWakes bounces a byte between this thread and another over two
// pipes; every round trip wakes each thread once. CPU time is both
// threads'.
func measureWakes(lim hostLimits) (wall, cpu time.Duration, err error) {
	var ping, pong [2]int
	if err := syscall.Pipe(ping[:]); err != nil {
		return 0, 0, err
	}
	defer syscall.Close(ping[0])
	defer syscall.Close(ping[1])
	if err := syscall.Pipe(pong[:]); err != nil {
		return 0, 0, err
	}
	defer syscall.Close(pong[0])
	defer syscall.Close(pong[1])
	echoed := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		b := make([]byte, 1)
		for {
			n, err := syscall.Read(ping[0], b)
			if err != nil || n == 0 || b[0] == 0 { // 0: stop
				echoed <- err
				return
			}
			if _, err := syscall.Write(pong[1], b); err != nil {
				echoed <- err
				return
			}
		}
	}()
	b := []byte{1}
	cpu, err = perOp(lim.wakes, lim.each, func() error {
		if _, err := syscall.Write(ping[1], b); err != nil {
			return err
		}
		_, err := syscall.Read(pong[0], b)
		return err
	}, &wall)
	if _, werr := syscall.Write(ping[1], []byte{0}); werr != nil && err == nil {
		err = werr
	}
	if eerr := <-echoed; eerr != nil && err == nil {
		err = eerr
	}
	return wall, cpu, err
}

func measureSyncs(dir string, lim hostLimits) (wall, cpu time.Duration, err error) {
	f, err := os.CreateTemp(dir, "hostcost-*")
	if err != nil {
		return 0, 0, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	rec := make([]byte, 700)
	fd := int(f.Fd())
	cpu, err = perOp(lim.syncs, lim.each, func() error {
		if _, err := f.Write(rec); err != nil {
			return err
		}
		return syscall.Fdatasync(fd)
	}, &wall)
	return wall, cpu, err
}

// measureFaults touches lim.pages fresh pages of an anonymous mapping once
// each (wall time: the fault, the zeroing, and the few instructions of the
// loop; a second pass over the same pages costs about 1/100 of that here).
func measureFaults(lim hostLimits) (time.Duration, error) {
	size := lim.pages * os.Getpagesize()
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return 0, err
	}
	defer syscall.Munmap(mem)
	start := time.Now()
	for i := 0; i < size; i += os.Getpagesize() {
		mem[i] = 1
	}
	return time.Since(start) / time.Duration(lim.pages), nil
}
