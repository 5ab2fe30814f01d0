// Package cli holds what idem's commands (cmd/*) share, and only they
// import it:
//
//   - errors on one line (OneLine), and Main, the body of every command's
//     main (signals cancel its context; an error exits 1); flags and their
//     help are internal/flagdoc's;
//   - logging: the slog logger set up from --log-level and --log-format
//     (NewLogger);
//   - memory: the garbage collector's pacing (PaceGC, over internal/gctune)
//     and a soft memory limit from the container's (LimitMemory);
//   - profiling: Go's pprof endpoints on a loopback address (ServePprof;
//     idemnode checks the address with transport.CheckLoopback first);
//   - Go's system monitor: whether GODEBUG keeps it out of its deep sleep
//     (ReadSysmon, LogSysmon, SysmonSetting, SysmonUsage).
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// OneLine joins errors into one line, as the contract asks of a bad flag or
// config.
func OneLine(errs ...error) error {
	var parts []string
	for _, e := range errs {
		if e != nil {
			parts = append(parts, strings.ReplaceAll(e.Error(), "\n", "; "))
		}
	}
	if len(parts) == 0 {
		return nil
	}
	return errors.New(strings.Join(parts, "; "))
}

// NewLogger returns a slog logger writing to w at level ("debug", "info",
// "warn", "error") in format ("text" or "json").
func NewLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: use debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: use text or json", format)
}

// Main is the body of every idem command's main: it runs run with the
// process's arguments and standard streams under a context that SIGINT and
// SIGTERM cancel (the command then drains), and exits 1 after printing the
// error as "name: error" on one line (newlines inside it folded).
func Main(name string, run func(ctx context.Context, args []string, stdout, stderr io.Writer) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, name+":", OneLine(err))
		stop()
		os.Exit(1)
	}
}
