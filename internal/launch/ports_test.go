package launch

import (
	"bufio"
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
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), holdPortsEnv+"="+strings.Join(list, ","))
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
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	if line != "held\n" {
		t.Fatalf("the holding process said %q", line)
	}
	for _, p := range ports {
		if ok, err := reserve(p); ok || err != nil {
			t.Fatalf("reserved port %d that another process holds (err %v)", p, err)
		}
	}
	stdin.Close()
	if err := child.Wait(); err != nil {
		t.Fatal(err)
	}
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
