package cli

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"runtime/debug"

	"github.com/idem-dev/idem/internal/gctune"
)

// PaceGC paces the process's garbage collector with internal/gctune (GOGC
// percent for a large live heap, at least headroom bytes of room between
// collections) unless GOGC is set in the environment, which then wins; it
// logs which. It also sets a soft memory limit from the container's: see
// LimitMemory. The returned func stops the pacing.
func PaceGC(logger *slog.Logger, percent int, headroom uint64) (stop func()) {
	soft := LimitMemory(logger, gctune.RootFS())
	if env := os.Getenv("GOGC"); env != "" {
		logger.Info("garbage collector left to GOGC from the environment", "gogc", env)
		return func() {}
	}
	return gctune.Start(gctune.Config{Percent: percent, Headroom: gctune.HeadroomFor(headroom, soft), Logger: logger}).Stop
}

// LimitMemory sets Go's soft memory limit to 90% of the memory limit of the
// process's cgroup (a container's limit), so that the collector works
// harder near the limit instead of the kernel killing the process over it,
// unless GOMEMLIMIT in the environment sets one (it wins). It returns the
// limit it set, or 0, and logs what it did in one line.
func LimitMemory(logger *slog.Logger, root fs.FS) int64 {
	if env := os.Getenv("GOMEMLIMIT"); env != "" {
		logger.Info("memory soft limit left to GOMEMLIMIT from the environment", "gomemlimit", env)
		return 0
	}
	limit, file, err := gctune.MemoryLimit(root)
	switch {
	case errors.Is(err, gctune.ErrNoLimit):
		return 0
	case err != nil:
		logger.Warn("memory soft limit not set: the cgroup's memory limit could not be read", "err", err)
		return 0
	}
	soft := gctune.SoftLimitFor(limit)
	debug.SetMemoryLimit(soft)
	logger.Info("memory soft limit set from the cgroup's limit (GOMEMLIMIT in the environment replaces it)",
		"cgroup_limit_bytes", limit, "from", file, "soft_limit_bytes", soft)
	return soft
}
