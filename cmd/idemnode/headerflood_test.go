package main

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
)

// An HTTP/2 client that sends, before any authentication, streams whose
// metadata is thousands of repeats of one large field (HPACK encodes each
// repeat in two bytes) must not make the node decode them into memory: the
// gRPC listener advertises and enforces the contract's 64 KiB limit on a
// request's metadata (contract.MaxRequestHeaderBytes). Before the limit,
// 32 such streams, ~10 KiB each on the wire, took a dev node from 32 to
// 478 MiB of RSS (gRPC-Go's default is 16 MiB of metadata per stream).
func TestMetadataFloodBeforeAuthentication(t *testing.T) {
	httpAddr, p := startDev(t, nil)
	grpcAddr := flagValue(p, "--grpc-addr")
	before := rssOf(t, p.Pid())

	const streams, repeats = 32, 5000
	conn, err := net.DialTimeout("tcp", grpcAddr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The server's frames are read and dropped, so that its writes (and so
	// its reads) never block on us.
	go func() {
		fr := http2.NewFramer(nil, bufio.NewReader(conn))
		for {
			if _, err := fr.ReadFrame(); err != nil {
				return
			}
		}
	}()
	w := bufio.NewWriter(conn)
	if _, err := w.WriteString(http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(w, nil)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	pad := strings.Repeat("A", 3000) // fits HPACK's 4 KiB table: every repeat is an index
	wire := 0
	for i := range streams {
		block.Reset()
		for _, f := range []hpack.HeaderField{
			{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
			{Name: ":path", Value: "/idem.v1.Idempotency/Reserve"}, {Name: ":authority", Value: grpcAddr},
			{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
		} {
			enc.WriteField(f)
		}
		for range repeats {
			enc.WriteField(hpack.HeaderField{Name: "x-pad-bin", Value: pad})
		}
		wire += block.Len()
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: block.Bytes(), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	// What was sent would decode to streams*repeats*3 KB: ~480 MB.
	time.Sleep(2 * time.Second)
	after := rssOf(t, p.Pid())
	t.Logf("sent %d streams, %d KiB on the wire (%d MiB decoded); node RSS %d -> %d MiB", streams, wire>>10,
		streams*repeats*len(pad)>>20, before>>20, after>>20)
	if after > before+64<<20 {
		t.Fatalf("the node's RSS grew from %d to %d MiB under %d KiB of compressed metadata: headers are decoded without a bound",
			before>>20, after>>20, wire>>10)
	}
	// The JSON listener bounds a request's header block the same way
	// (net/http's default is 1 MiB): 431.
	req, _ := http.NewRequestWithContext(t.Context(), "GET", "http://"+httpAddr+"/healthz", nil)
	req.Header.Set("X-Pad", strings.Repeat("A", 80<<10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("an 80 KiB header on the JSON listener: %d, want 431", resp.StatusCode)
	}
	// The node keeps serving.
	if r, err := cluster.NewAPI(httpAddr).Reserve(t.Context(), "flood", "k1", nil); err != nil || r.Str("outcome") != "ACQUIRED" {
		t.Fatalf("reserve after the flood: %v %v", r, err)
	}
}

// flagValue is the value p was started with for flag ("--name value").
func flagValue(p *launch.Process, flag string) string {
	i := slices.Index(p.Args, flag)
	if i < 0 || i+1 >= len(p.Args) {
		panic("flagValue: " + p.Name + " was started without " + flag)
	}
	return p.Args[i+1]
}

// rssOf is process pid's resident set in bytes.
func rssOf(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}
