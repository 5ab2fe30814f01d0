package main

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-dev/idem/security/pki"
)

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCert runs "idemctl cert" through run as a user would: a CA, a node and
// a client certificate, the refusals and the argument errors, in order.
func TestCert(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	keyDir := t.TempDir()
	node2 := t.TempDir()
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
		wantOut string
	}{
		{name: "help", args: []string{"cert", "--help"}, wantOut: "idemctl cert create-node --certs-dir DIR --id ID HOST..."},
		{name: "global help lists cert", args: []string{"--help"}, wantOut: "cert create-ca|create-node|create-router|create-client"},
		{name: "no subcommand", args: []string{"cert", "--certs-dir", dir}, wantErr: "cert needs a subcommand"},
		{name: "unknown subcommand", args: []string{"cert", "create-root", "--certs-dir", dir}, wantErr: `unknown subcommand "create-root"`},
		{name: "ca without dir", args: []string{"cert", "create-ca"}, wantErr: "--certs-dir DIR is required"},
		{name: "node before the CA", args: []string{"cert", "create-node", "--certs-dir", dir, "--id", "n1", "127.0.0.1"}, wantErr: "no usable CA"},
		{name: "create-ca", args: []string{"cert", "create-ca", "--certs-dir", dir}, wantOut: "wrote " + filepath.Join(dir, "ca.key")},
		{name: "create-ca again", args: []string{"cert", "create-ca", "--certs-dir", dir}, wantErr: "already exists"},
		{name: "ca takes no args", args: []string{"cert", "create-ca", "--certs-dir", t.TempDir(), "extra"}, wantErr: "takes no arguments"},
		{name: "node without id", args: []string{"cert", "create-node", "--certs-dir", dir, "127.0.0.1"}, wantErr: "--id ID is required"},
		{name: "node without hosts", args: []string{"cert", "create-node", "--certs-dir", dir, "--id", "n1"}, wantErr: "needs HOST..., got 0"},
		{name: "node bad host", args: []string{"cert", "create-node", "--certs-dir", dir, "--id", "n1", "bad host"}, wantErr: "neither an IP address nor a DNS name"},
		{name: "create-node", args: []string{"cert", "create-node", "--certs-dir", dir, "--id", "us-east-1", "127.0.0.1", "::1", "node1.internal"}, wantOut: "wrote " + filepath.Join(dir, "node.crt")},
		{name: "create-node again", args: []string{"cert", "create-node", "--certs-dir", dir, "--id", "us-east-2", "127.0.0.1"}, wantErr: "move it away"},
		{name: "router without id", args: []string{"cert", "create-router", "--certs-dir", dir, "127.0.0.1"}, wantErr: "--id ID is required"},
		{name: "create-router", args: []string{"cert", "create-router", "--certs-dir", dir, "--id", "edge-1", "127.0.0.1", "router1.internal"}, wantOut: "wrote " + filepath.Join(dir, "router.crt")},
		{name: "create-router again", args: []string{"cert", "create-router", "--certs-dir", dir, "--id", "edge-2", "127.0.0.1"}, wantErr: "move it away"},
		{name: "create-client", args: []string{"cert", "create-client", "root", "--certs-dir", dir}, wantOut: "client.root.crt"},
		{name: "create-client --json", args: []string{"cert", "create-client", "--json", "--certs-dir", dir, "ci"}, wantOut: `{"files":["` + filepath.Join(dir, "client.ci.crt")},
		{name: "client with --id", args: []string{"cert", "create-client", "--certs-dir", dir, "--id", "x", "bob"}, wantErr: "--id applies to create-node and create-router only"},
		{name: "client bad name", args: []string{"cert", "create-client", "--certs-dir", dir, "a/b"}, wantErr: "principal name"},
		{name: "client arity", args: []string{"cert", "create-client", "--certs-dir", dir, "a", "b"}, wantErr: "needs NAME, got 2"},
		{name: "CA key elsewhere, missing", args: []string{"cert", "create-node", "--certs-dir", node2, "--id", "n2", "127.0.0.1"}, wantErr: "no usable CA"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(t.Context(), tc.args, &stdout, &stderr)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
			} else if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want it to mention %q", err, tc.wantErr)
			}
			if !strings.Contains(stdout.String(), tc.wantOut) {
				t.Fatalf("stdout %q lacks %q", stdout.String(), tc.wantOut)
			}
		})
	}
	for _, f := range []string{"ca.key", "node.key", "router.key", "client.root.key"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: mode %v, %v; want 0600", f, fi.Mode(), err)
		}
	}
	if id, err := pki.IdentifyNode(readCert(t, filepath.Join(dir, "node.crt"))); err != nil || id.Name != "us-east-1" {
		t.Fatalf("node.crt identity %v, %v", id, err)
	}
	router := readCert(t, filepath.Join(dir, "router.crt"))
	if id, err := pki.Identify(router); err != nil || id != (pki.Identity{Kind: pki.KindRouter, Name: "edge-1"}) {
		t.Fatalf("router.crt identity %v, %v", id, err)
	}
	if _, err := pki.IdentifyNode(router); err == nil {
		t.Fatal("router.crt passes as a node certificate")
	}
	if id, err := pki.Identify(readCert(t, filepath.Join(dir, "client.root.crt"))); err != nil || id != (pki.Identity{Kind: pki.KindClient, Name: "root"}) {
		t.Fatalf("client.root.crt identity %v, %v", id, err)
	}

	// The CA key kept elsewhere: --ca-key FILE, with only ca.crt in the dir.
	os.Rename(filepath.Join(dir, "ca.key"), filepath.Join(keyDir, "ca.key"))
	b, _ := os.ReadFile(filepath.Join(dir, "ca.crt"))
	os.WriteFile(filepath.Join(node2, "ca.crt"), b, 0o644)
	var out bytes.Buffer
	if err := run(t.Context(), []string{"cert", "create-node", "--certs-dir", node2, "--id", "n2", "--ca-key", filepath.Join(keyDir, "ca.key"), "127.0.0.2"}, &out, &out); err != nil {
		t.Fatalf("create-node with --ca-key: %v", err)
	}
	if _, err := pki.NewReloader(pki.ReloaderConfig{Dir: node2, NodeID: "n2"}); err != nil {
		t.Fatalf("the node dir made with --ca-key does not load: %v", err)
	}
}
