package archrules

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
)

const module = "github.com/idem-dev/idem"

// pkg is one package of the build as `go list -json` reports it.
type pkg struct {
	ImportPath string
	Standard   bool
	Imports    []string // direct, without test files
	Deps       []string // transitive, without test files
}

// graph is the import graph of the module's packages and of every package
// they link.
type graph map[string]*pkg

var loaded struct {
	once sync.Once
	g    graph
	err  error
}

// loadGraph runs `go list` once for all the tests.
func loadGraph(t *testing.T) graph {
	t.Helper()
	loaded.once.Do(func() { loaded.g, loaded.err = listGraph() })
	if loaded.err != nil {
		t.Fatal(loaded.err)
	}
	for _, must := range []string{"contract", "fsm", "client", "server", "node", "raftstore"} {
		if loaded.g[module+"/"+must] == nil {
			t.Fatalf("go list did not report package %s: the rules would check nothing", must)
		}
	}
	return loaded.g
}

func listGraph() (graph, error) {
	cmd := exec.Command("go", "list", "-e", "-deps", "-json=ImportPath,Standard,Imports,Deps", module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %v\n%s", err, stderr.Bytes())
	}
	g := graph{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("go list output: %v", err)
		}
		g[p.ImportPath] = &p
	}
	return g, nil
}

// own is the module-relative name of an idem package ("" for others).
func own(path string) (string, bool) {
	if rest, ok := strings.CutPrefix(path, module+"/"); ok {
		return rest, true
	}
	return "", false
}

// chain is the shortest import chain from one package to another, for the
// failure message.
func (g graph) chain(from, to string) string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p == to {
			var path []string
			for ; p != ""; p = prev[p] {
				path = append(path, short(p))
			}
			slices.Reverse(path)
			return strings.Join(path, " -> ")
		}
		if g[p] == nil {
			continue
		}
		for _, q := range g[p].Imports {
			if _, seen := prev[q]; !seen {
				prev[q] = p
				queue = append(queue, q)
			}
		}
	}
	return short(from) + " -> ... -> " + short(to)
}

func short(path string) string {
	if rel, ok := own(path); ok {
		return rel
	}
	return path
}

// linksOnly fails for every package that name links and allowed refuses.
func (g graph) linksOnly(t *testing.T, name, rule string, allowed func(dep *pkg) bool) {
	t.Helper()
	p := g[module+"/"+name]
	if p == nil {
		t.Errorf("%s: no such package (rule: %s)", name, rule)
		return
	}
	for _, d := range p.Deps {
		dep := g[d]
		if dep == nil || !allowed(dep) {
			t.Errorf("%s links %s, but %s\n\timport chain: %s", name, short(d), rule, g.chain(p.ImportPath, d))
		}
	}
}

func ownIn(names ...string) func(*pkg) bool {
	return func(p *pkg) bool {
		rel, ok := own(p.ImportPath)
		return !ok || slices.Contains(names, rel)
	}
}

func TestPurePackages(t *testing.T) {
	g := loadGraph(t)
	const xxhash = "github.com/cespare/xxhash/v2"
	g.linksOnly(t, "contract", "contract imports only the standard library", func(p *pkg) bool { return p.Standard })
	g.linksOnly(t, "keyspace", "keyspace imports only the standard library and xxhash", func(p *pkg) bool {
		return p.Standard || p.ImportPath == xxhash
	})
	g.linksOnly(t, "fsm", "fsm imports only the standard library and keyspace", func(p *pkg) bool {
		return p.Standard || p.ImportPath == xxhash || p.ImportPath == module+"/keyspace"
	})
	g.linksOnly(t, "topology", "topology imports of idem only contract and keyspace", ownIn("contract", "keyspace"))
}

// The console reads and acts through the JSON API handler it is given, so
// it needs none of the serving or storage code: only the contract's rules
// and the principal of a request (security/auth, with what that links:
// backend and fsm for the error set).
func TestConsoleReadsThroughTheAPI(t *testing.T) {
	g := loadGraph(t)
	forbidden := []string{"server", "node", "raftstore", "statedb", "router", "proxy", "forward", "internal/wire"}
	g.linksOnly(t, "console", "console reads through the JSON API and links no serving or storage code", func(p *pkg) bool {
		rel, ok := own(p.ImportPath)
		return !ok || !slices.Contains(forbidden, rel)
	})
}

func TestRaftstoreImportsOnlyLeaves(t *testing.T) {
	g := loadGraph(t)
	leaves := []string{"internal/durable", "security/pki", "internal/tracing"}
	g.linksOnly(t, "raftstore", "raftstore imports of idem only the leaves "+strings.Join(leaves, " and "), ownIn(leaves...))
	for _, leaf := range leaves {
		g.linksOnly(t, leaf, leaf+" is a leaf raftstore may import: it imports nothing of idem", ownIn())
	}
}

func TestClientLinksNoServer(t *testing.T) {
	g := loadGraph(t)
	forbidden := []string{"server", "node", "fsm", "backend", "raftstore", "statedb", "router", "proxy", "forward", "internal/wire"}
	for _, name := range []string{"client", "cmd/idemctl"} {
		g.linksOnly(t, name, name+" links no serving or storage code and no Prometheus", func(p *pkg) bool {
			if rel, ok := own(p.ImportPath); ok {
				return !slices.Contains(forbidden, rel)
			}
			return !strings.HasPrefix(p.ImportPath, "github.com/prometheus/")
		})
	}
}

func TestNodeLinksNoProxy(t *testing.T) {
	g := loadGraph(t)
	g.linksOnly(t, "node", "a storage node forwards with package forward and links no router, proxy or httpidem", func(p *pkg) bool {
		rel, _ := own(p.ImportPath)
		return !slices.Contains([]string{"router", "proxy", "httpidem"}, rel)
	})
}

// importers checks the direct imports of every idem package: which of them
// may import target.
func (g graph) importers(t *testing.T, rule string, target func(rel string) bool, mayImport func(rel string) bool) {
	t.Helper()
	var names []string
	for path := range g {
		if _, ok := own(path); ok {
			names = append(names, path)
		}
	}
	slices.Sort(names)
	for _, path := range names {
		rel, _ := own(path)
		for _, imp := range g[path].Imports {
			if irel, ok := own(imp); ok && target(irel) && !mayImport(rel) {
				t.Errorf("%s imports %s, but %s", rel, irel, rule)
			}
		}
	}
}

func under(rel, dir string) bool { return rel == dir || strings.HasPrefix(rel, dir+"/") }

func TestImporters(t *testing.T) {
	g := loadGraph(t)
	g.importers(t, "nothing imports cmd/*",
		func(rel string) bool { return under(rel, "cmd") },
		func(string) bool { return false })
	g.importers(t, "only cmd/regionsim and regionsim's packages import regionsim",
		func(rel string) bool { return under(rel, "regionsim") },
		func(rel string) bool { return rel == "cmd/regionsim" || under(rel, "regionsim") })
	g.importers(t, "only the serving packages (node, router, client/idemtest, cmd/idemnode, cmd/idemrouter) import server",
		func(rel string) bool { return rel == "server" },
		func(rel string) bool {
			return slices.Contains([]string{"node", "router", "client/idemtest", "cmd/idemnode", "cmd/idemrouter"}, rel)
		})
	harness := []string{"internal/cluster", "internal/testutil", "api/openapi/openapitest"}
	g.importers(t, "test harnesses are imported by tests only",
		func(rel string) bool { return slices.Contains(harness, rel) },
		func(rel string) bool { return slices.Contains(harness, rel) })
	g.importers(t, "only the processes that serve the JSON API (node, router) import console",
		func(rel string) bool { return rel == "console" },
		func(rel string) bool { return rel == "node" || rel == "router" })
	g.importers(t, "internal/cli is the commands' kit: only cmd/* import it",
		func(rel string) bool { return rel == "internal/cli" },
		func(rel string) bool { return under(rel, "cmd") })
}
