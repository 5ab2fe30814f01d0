package launch

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

func TestFreePortsNeverRepeatInAProcess(t *testing.T) {
	seen := map[int]bool{}
	for range 20 {
		ports, err := FreePorts(10)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ports {
			if seen[p] {
				t.Fatalf("port %d handed out twice", p)
			}
			seen[p] = true
		}
	}
}

// holdPortsEnv makes the test binary, re-executed, reserve the ports it
// lists and hold them until its stdin closes: another test process.
const holdPortsEnv = "IDEM_TEST_HOLD_PORTS"

func TestMain(m *testing.M) {
	if list := os.Getenv(holdPortsEnv); list != "" {
		for _, f := range strings.Split(list, ",") {
			p, _ := strconv.Atoi(f)
			if ok, err := reserve(p); !ok || err != nil {
				os.Stdout.WriteString("refused " + f + "\n")
				os.Exit(1)
			}
		}
		os.Stdout.WriteString("held\n")
		bufio.NewReader(os.Stdin).ReadString('\n') // until the parent closes stdin
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// holdElsewhere re-executes the test binary to reserve ports, another test
// process, and returns once it holds them. letGo closes its stdin and waits
// for it to exit, which drops its locks.
func holdElsewhere(t *testing.T, ports ...string) (letGo func()) {
	t.Helper()
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), holdPortsEnv+"="+strings.Join(ports, ","))
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	if line, _ := bufio.NewReader(stdout).ReadString('\n'); line != "held\n" {
		t.Fatalf("the holding process said %q", line)
	}
	return func() {
		t.Helper()
		stdin.Close()
		if err := child.Wait(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestFreePortsSkipPortsAnotherProcessHolds(t *testing.T) {
	// Ports this process has not reserved yet, found by asking for them and
	// giving them back.
	ports, err := FreePorts(5)
	if err != nil {
		t.Fatal(err)
	}
	var list []string
	for _, p := range ports {
		release(p)
		list = append(list, strconv.Itoa(p))
	}
	letGo := holdElsewhere(t, list...)
	for _, p := range ports {
		if ok, err := reserve(p); ok || err != nil {
			t.Fatalf("reserved port %d that another process holds (err %v)", p, err)
		}
	}
	letGo()
	// The kernel dropped the child's locks when it exited.
	for _, p := range ports {
		if ok, err := reserve(p); !ok || err != nil {
			t.Fatalf("port %d still held after its holder exited (err %v)", p, err)
		}
	}
}

func TestEphemeralPortsAreReservedToo(t *testing.T) {
	ports, err := ephemeralPorts(5)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ports {
		if ok, err := reserve(p); ok || err != nil {
			t.Fatalf("ephemeral port %d was not reserved (ok %v, err %v)", p, ok, err)
		}
	}
	more, err := ephemeralPorts(5)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range more {
		for _, q := range ports {
			if p == q {
				t.Fatalf("ephemeral port %d handed out twice", p)
			}
		}
	}
}

// TestHoldPortsWaitsForAnotherProcess: fixed ports another test process
// holds are taken once it lets go, all of them or none before.
func TestHoldPortsWaitsForAnotherProcess(t *testing.T) {
	ports, err := FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ports {
		release(p)
	}
	letGo := holdElsewhere(t, strconv.Itoa(ports[2]))
	ctx, cancel := context.WithCancel(t.Context())
	cancel() // one attempt only
	if _, err := HoldPorts(ctx, ports...); err == nil || !strings.Contains(err.Error(), "another test process") {
		t.Fatalf("HoldPorts while port %d is held elsewhere: %v", ports[2], err)
	}
	for _, p := range ports[:2] {
		if ok, err := reserve(p); !ok || err != nil {
			t.Fatalf("port %d stayed reserved after HoldPorts gave up (err %v)", p, err)
		}
		release(p)
	}
	held := make(chan error, 1)
	var releaseHeld func()
	go func() {
		var err error
		releaseHeld, err = HoldPorts(t.Context(), ports...)
		held <- err
	}()
	letGo() // the other process exits and its lock goes
	if err := <-held; err != nil {
		t.Fatalf("HoldPorts after the other process exited: %v", err)
	}
	releaseHeld()
	for _, p := range ports {
		if ok, err := reserve(p); !ok || err != nil {
			t.Fatalf("port %d still held after release (err %v)", p, err)
		}
	}
}
