package gctune

import (
	"errors"
	"testing"
	"testing/fstest"
)

func file(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }

func TestMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fs        fstest.MapFS
		want      uint64
		wantFile  string
		wantNoLim bool
		wantErr   bool
	}{
		{name: "v2, the process's own cgroup", fs: fstest.MapFS{
			"proc/self/cgroup": file("0::/system.slice/idem.service\n"),
			"sys/fs/cgroup/system.slice/idem.service/memory.max": file("536870912\n"),
			"sys/fs/cgroup/system.slice/memory.max":              file("max\n"),
		}, want: 512 << 20, wantFile: "/sys/fs/cgroup/system.slice/idem.service/memory.max"},
		{name: "v2, a parent's limit is smaller", fs: fstest.MapFS{
			"proc/self/cgroup":                    file("0::/pods/p1/c1\n"),
			"sys/fs/cgroup/pods/p1/c1/memory.max": file("max\n"),
			"sys/fs/cgroup/pods/p1/memory.max":    file("268435456\n"),
			"sys/fs/cgroup/pods/memory.max":       file("1073741824\n"),
		}, want: 256 << 20, wantFile: "/sys/fs/cgroup/pods/p1/memory.max"},
		{name: "v2 in a cgroup namespace (a container): the mount's root", fs: fstest.MapFS{
			"proc/self/cgroup":         file("0::/\n"),
			"sys/fs/cgroup/memory.max": file("134217728\n"),
		}, want: 128 << 20, wantFile: "/sys/fs/cgroup/memory.max"},
		{name: "v2, no limit anywhere", fs: fstest.MapFS{
			"proc/self/cgroup":                    file("0::/user.slice\n"),
			"sys/fs/cgroup/user.slice/memory.max": file("max\n"),
		}, wantNoLim: true},
		{name: "v1 memory controller", fs: fstest.MapFS{
			"proc/self/cgroup": file("12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc\n"),
			"sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": file("209715200\n"),
		}, want: 200 << 20, wantFile: "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes"},
		{name: "v1 unlimited is PAGE_COUNTER_MAX", fs: fstest.MapFS{
			"proc/self/cgroup":                           file("11:memory:/\n"),
			"sys/fs/cgroup/memory/memory.limit_in_bytes": file("9223372036854771712\n"),
		}, wantNoLim: true},
		{name: "hybrid: v1's memory controller answers", fs: fstest.MapFS{
			"proc/self/cgroup": file("11:memory:/a\n0::/a\n"),
			"sys/fs/cgroup/memory/a/memory.limit_in_bytes": file("104857600\n"),
			"sys/fs/cgroup/a/memory.max":                   file("max\n"),
		}, want: 100 << 20, wantFile: "/sys/fs/cgroup/memory/a/memory.limit_in_bytes"},
		{name: "no /proc (not Linux)", fs: fstest.MapFS{}, wantNoLim: true},
		{name: "an unreadable value is an error, not a guess", fs: fstest.MapFS{
			"proc/self/cgroup":         file("0::/\n"),
			"sys/fs/cgroup/memory.max": file("lots\n"),
		}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, from, err := MemoryLimit(tc.fs)
			switch {
			case tc.wantNoLim:
				if !errors.Is(err, ErrNoLimit) {
					t.Fatalf("MemoryLimit = %d, %q, %v; want ErrNoLimit", got, from, err)
				}
			case tc.wantErr:
				if err == nil || errors.Is(err, ErrNoLimit) {
					t.Fatalf("MemoryLimit = %d, %q, %v; want a read error", got, from, err)
				}
			default:
				if err != nil || got != tc.want || from != tc.wantFile {
					t.Fatalf("MemoryLimit = %d, %q, %v; want %d from %q", got, from, err, tc.want, tc.wantFile)
				}
			}
		})
	}
}

func TestSoftLimitAndHeadroom(t *testing.T) {
	if got := SoftLimitFor(1000 << 20); got != 900<<20 {
		t.Fatalf("SoftLimitFor(1000 MiB) = %d, want 900 MiB", got)
	}
	if got := HeadroomFor(128<<20, 256<<20); got != 64<<20 {
		t.Fatalf("HeadroomFor(128 MiB, 256 MiB soft limit) = %d, want a quarter of the limit, 64 MiB", got)
	}
	if got := HeadroomFor(128<<20, 4<<30); got != 128<<20 {
		t.Fatalf("HeadroomFor(128 MiB, 4 GiB) = %d, want the headroom unchanged", got)
	}
	if got := HeadroomFor(128<<20, 0); got != 128<<20 {
		t.Fatalf("HeadroomFor without a limit = %d, want the headroom unchanged", got)
	}
}
