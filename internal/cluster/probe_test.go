package cluster

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/launch"
)

func TestProbeProcessGivesUpWhenTheProcessExits(t *testing.T) {
	ports, err := launch.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{}
	p := &launch.Process{Name: "quitter", Bin: "/bin/sh", Args: []string{"-c", "exit 3"}, Log: filepath.Join(t.TempDir(), "quitter.log")}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	err = c.probeProcess(ctx, p, "127.0.0.1:"+strconv.Itoa(ports[0]))
	if err == nil || !strings.Contains(err.Error(), "exited before it was ready") || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("probe of a process that exited: %v", err)
	}
	if ctx.Err() != nil {
		t.Fatalf("the probe waited out its context: %v", err)
	}
}
