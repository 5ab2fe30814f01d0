package cli

import (
	"log/slog"
	"os"

	"github.com/idem-dev/idem/internal/gctune"
)

// PaceGC paces the process's garbage collector with internal/gctune (GOGC
// percent for a large live heap, at least headroom bytes of room between
// collections) unless GOGC is set in the environment, which then wins; it
// logs which. The returned func stops the pacing.
func PaceGC(logger *slog.Logger, percent int, headroom uint64) (stop func()) {
	if env := os.Getenv("GOGC"); env != "" {
		logger.Info("garbage collector left to GOGC from the environment", "gogc", env)
		return func() {}
	}
	return gctune.Start(gctune.Config{Percent: percent, Headroom: headroom, Logger: logger}).Stop
}
