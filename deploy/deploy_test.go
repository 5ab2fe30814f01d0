package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/topology"
)

// targetLabels are the labels the scrape configurations attach; they look
// like metric names but are not.
var targetLabels = map[string]bool{"idem_node": true, "idem_region": true, "idem_cluster": true}

var (
	metricLiteral = regexp.MustCompile(`"(idem_[a-z0-9_]+)"`)
	metricToken   = regexp.MustCompile(`\bidem_[a-z0-9_]+\b`)
)

// definedMetrics returns the idem_* metric names the code registers: the
// string literals of the non-test Go files outside deploy/.
func definedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case "deploy", ".git", "testdata", "idem-data", "idem-demo":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range metricLiteral.FindAllSubmatch(src, -1) {
			names[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A sanity floor, so that a broken walk cannot make every check pass.
	for _, must := range []string{"idem_api_requests_total", "idem_raft_leader", "idem_fsm_records", "idem_router_reachable_nodes", "idem_proxy_requests_total"} {
		if !names[must] {
			t.Fatalf("the code scan did not find %s (found %d names): fix definedMetrics", must, len(names))
		}
	}
	return names
}

// unknownMetrics returns the idem_* names in expr that the code does not
// define (histogram series may add _bucket, _sum or _count).
func unknownMetrics(expr string, defined map[string]bool) []string {
	var unknown []string
	for _, tok := range metricToken.FindAllString(expr, -1) {
		if targetLabels[tok] || defined[tok] {
			continue
		}
		base := tok
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			base = strings.TrimSuffix(base, suffix)
		}
		if !defined[base] {
			unknown = append(unknown, tok)
		}
	}
	return unknown
}

type dashboard struct {
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name string `json:"name"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int    `json:"id"`
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource *struct {
			Type string `json:"type"`
			UID  string `json:"uid"`
		} `json:"datasource"`
		GridPos struct{ H, W, X, Y int } `json:"gridPos"`
		Targets []struct {
			Expr  string `json:"expr"`
			RefID string `json:"refId"`
		} `json:"targets"`
	} `json:"panels"`
}

var dashboardVar = regexp.MustCompile(`\$(\w+)`)

func TestDashboardQueriesRealMetrics(t *testing.T) {
	defined := definedMetrics(t)
	data, err := os.ReadFile("grafana/idem-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("idem-dashboard.json: %v", err)
	}
	if d.UID == "" {
		t.Error("the dashboard has no uid (provisioning needs a stable one)")
	}
	vars := map[string]bool{"__rate_interval": true, "__interval": true, "__range": true}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	if !vars["datasource"] {
		t.Error("no datasource variable: the panels would be bound to one Grafana's datasource uid")
	}
	ids := map[int]string{}
	queried := map[string]bool{}
	for _, p := range d.Panels {
		if prev, dup := ids[p.ID]; dup {
			t.Errorf("panel id %d used by %q and %q", p.ID, prev, p.Title)
		}
		ids[p.ID] = p.Title
		if p.GridPos.X < 0 || p.GridPos.W < 1 || p.GridPos.X+p.GridPos.W > 24 || p.GridPos.H < 1 {
			t.Errorf("panel %q: gridPos %+v is outside the 24-column grid", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource must be ${datasource}, got %+v", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if u := unknownMetrics(tg.Expr, defined); len(u) > 0 {
				t.Errorf("panel %q queries %v, which no idem code defines: %s", p.Title, u, tg.Expr)
			}
			for _, m := range dashboardVar.FindAllStringSubmatch(tg.Expr, -1) {
				if !vars[m[1]] {
					t.Errorf("panel %q uses $%s, which is no dashboard variable", p.Title, m[1])
				}
			}
			for _, tok := range metricToken.FindAllString(tg.Expr, -1) {
				queried[tok] = true
			}
		}
	}
	// Metrics the dashboard does not show yet: reported, not failed, so
	// that a package adding a metric does not break this test.
	var notShown []string
	for name := range defined {
		if !queried[name] && !queried[name+"_bucket"] && !queried[name+"_sum"] && !queried[name+"_count"] {
			notShown = append(notShown, name)
		}
	}
	sort.Strings(notShown)
	if len(notShown) > 0 {
		t.Logf("metrics the code defines that no dashboard panel shows: %v", notShown)
	}
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func TestAlertsQueryRealMetrics(t *testing.T) {
	defined := definedMetrics(t)
	data, err := os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&rf); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	seen := map[string]bool{}
	n := 0
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			n++
			if r.Alert == "" {
				t.Errorf("group %s: a rule without an alert name", g.Name)
			}
			if seen[r.Alert] {
				t.Errorf("alert %s defined twice", r.Alert)
			}
			seen[r.Alert] = true
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("alert %s: severity %q, want warning or critical", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s: needs a summary and a description", r.Alert)
			}
			if u := unknownMetrics(r.Expr, defined); len(u) > 0 {
				t.Errorf("alert %s queries %v, which no idem code defines", r.Alert, u)
			}
		}
	}
	for _, must := range []string{"IdemNodeDown", "IdemShardWithoutLeader", "IdemHighUnavailableRate", "IdemApplyLatencyHigh"} {
		if !seen[must] {
			t.Errorf("alert %s is missing", must)
		}
	}
	if n == 0 {
		t.Fatal("alerts.yml has no rules")
	}
}

// TestPromtool runs promtool on the Prometheus files when it is installed
// (Debian: apt-get install prometheus).
func TestPromtool(t *testing.T) {
	testutil.NeedsCommand(t, "promtool", "apt-get install prometheus provides it")
	for _, args := range [][]string{
		{"check", "config", "prometheus/prometheus.yml"},
		{"check", "rules", "prometheus/alerts.yml"},
		{"test", "rules", "prometheus/alerts_test.yml"},
	} {
		out, err := exec.Command("promtool", args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

func TestComposeTopologyMatchesServices(t *testing.T) {
	topo, err := topology.LoadFile("compose/topology.yaml")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile("compose/docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var cf struct {
		Services map[string]struct {
			Command  []string `yaml:"command"`
			Ports    []string `yaml:"ports"`
			Profiles []string `yaml:"profiles"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(data, &cf); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	listen := map[string]string{"--raft-addr": "", "--grpc-addr": "", "--http-addr": ""}
	for _, n := range topo.Nodes() {
		svc, ok := cf.Services[n.ID]
		if !ok {
			t.Errorf("topology node %s has no compose service of that name", n.ID)
			continue
		}
		args := flagValues(svc.Command)
		if args["--id"] != n.ID {
			t.Errorf("service %s runs --id %q", n.ID, args["--id"])
		}
		for flag, addr := range map[string]string{"--raft-addr": n.RaftAddr, "--grpc-addr": n.GRPCAddr, "--http-addr": n.HTTPAddr} {
			host, port := splitHostPort(t, addr)
			if host != n.ID {
				t.Errorf("node %s: topology address %s must use the service name as host", n.ID, addr)
			}
			if args[flag] != "0.0.0.0:"+port {
				t.Errorf("service %s: %s %q, want 0.0.0.0:%s (the topology's port)", n.ID, flag, args[flag], port)
			}
			listen[flag] = port
		}
	}
	for name, svc := range cf.Services {
		for _, p := range svc.Ports {
			if !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("service %s publishes %q: publish on 127.0.0.1 only", name, p)
			}
		}
		if _, isNode := topo.NodeByID(name); !isNode && len(svc.Profiles) == 0 && name != "router" {
			t.Errorf("service %s is neither a topology node nor the router", name)
		}
	}
	r := flagValues(cf.Services["router"].Command)
	if _, ok := topo.RegionByName(r["--region"]); !ok {
		t.Errorf("the router runs --region %q, not a region of the topology", r["--region"])
	}
}

func TestKubernetesTopologyMatchesStatefulSets(t *testing.T) {
	docs := kubeDocs(t, "kubernetes/topology.yaml", "kubernetes/node-us-east.yaml", "kubernetes/router-us-east.yaml", "kubernetes/namespace.yaml")
	var topo *topology.Topology
	for _, d := range docs {
		if d.Kind == "ConfigMap" && d.Metadata.Name == "idem-topology" {
			if topo, _ = parseTopology(t, d.Data["topology.yaml"]); topo == nil {
				return
			}
		}
	}
	if topo == nil {
		t.Fatal("no ConfigMap idem-topology")
	}
	headless := map[string]kubeDoc{}
	for _, d := range docs {
		if d.Kind == "Service" && d.Spec.ClusterIP == "None" {
			headless[d.Metadata.Name] = d
			if !d.Spec.PublishNotReadyAddresses {
				t.Errorf("headless Service %s: publishNotReadyAddresses must be true, or the nodes cannot find each other before they are ready", d.Metadata.Name)
			}
		}
	}
	regionsSeen := map[string]bool{}
	for _, d := range docs {
		switch d.Kind {
		case "StatefulSet":
			region := d.Spec.Template.Metadata.Labels["idem.dev/region"]
			regionsSeen[region] = true
			reg, ok := topo.RegionByName(region)
			if !ok {
				t.Errorf("StatefulSet %s: region %q is not in the topology", d.Metadata.Name, region)
				continue
			}
			if d.Spec.Replicas != len(reg.Nodes) {
				t.Errorf("StatefulSet %s: %d replicas, the topology has %d nodes in %s", d.Metadata.Name, d.Spec.Replicas, len(reg.Nodes), region)
			}
			if d.Spec.PodManagementPolicy != "Parallel" {
				t.Errorf("StatefulSet %s: podManagementPolicy must be Parallel (pod 0 cannot become ready alone)", d.Metadata.Name)
			}
			if _, ok := headless[d.Spec.ServiceName]; !ok {
				t.Errorf("StatefulSet %s: serviceName %q is no headless Service", d.Metadata.Name, d.Spec.ServiceName)
			}
			for i := range d.Spec.Replicas {
				pod := fmt.Sprintf("%s-%d", d.Metadata.Name, i)
				n, ok := topo.NodeByID(pod)
				if !ok {
					t.Errorf("pod %s (the node id it runs with) is not a node of the topology", pod)
					continue
				}
				fqdn := fmt.Sprintf("%s.%s.%s.svc.cluster.local", pod, d.Spec.ServiceName, d.Metadata.Namespace)
				for _, addr := range []string{n.RaftAddr, n.GRPCAddr, n.HTTPAddr} {
					if host, _ := splitHostPort(t, addr); host != fqdn {
						t.Errorf("node %s: address %s, want host %s (the pod's stable DNS name)", pod, addr, fqdn)
					}
				}
			}
			c := d.Spec.Template.Spec.Containers[0]
			args := flagValues(c.Args)
			if args["--id"] != "$(POD_NAME)" || args["--config"] != "/etc/idem/topology.yaml" {
				t.Errorf("StatefulSet %s: runs --id %q --config %q", d.Metadata.Name, args["--id"], args["--config"])
			}
		case "Deployment":
			args := flagValues(d.Spec.Template.Spec.Containers[0].Args)
			if _, ok := topo.RegionByName(args["--region"]); !ok {
				t.Errorf("Deployment %s runs --region %q, not a region of the topology", d.Metadata.Name, args["--region"])
			}
		}
		if d.Kind != "Namespace" && d.Metadata.Namespace != "idem" {
			t.Errorf("%s %s is in namespace %q; the topology's DNS names assume idem", d.Kind, d.Metadata.Name, d.Metadata.Namespace)
		}
	}
	for _, r := range topo.Regions {
		if !regionsSeen[r.Name] {
			t.Errorf("region %s has no StatefulSet", r.Name)
		}
	}
}

type kubeDoc struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name      string `yaml:"name"`
		Namespace string `yaml:"namespace"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec struct {
		ClusterIP                string `yaml:"clusterIP"`
		PublishNotReadyAddresses bool   `yaml:"publishNotReadyAddresses"`
		ServiceName              string `yaml:"serviceName"`
		Replicas                 int    `yaml:"replicas"`
		PodManagementPolicy      string `yaml:"podManagementPolicy"`
		Template                 struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec struct {
				Containers []struct {
					Args []string `yaml:"args"`
				} `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

func kubeDocs(t *testing.T, paths ...string) []kubeDoc {
	t.Helper()
	var docs []kubeDoc
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for {
			var d kubeDoc
			err := dec.Decode(&d)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			if d.Kind != "" {
				docs = append(docs, d)
			}
		}
	}
	return docs
}

func parseTopology(t *testing.T, text string) (*topology.Topology, error) {
	t.Helper()
	topo, err := topology.Parse([]byte(text))
	if err != nil {
		t.Errorf("the ConfigMap's topology: %v", err)
	}
	return topo, err
}

// flagValues maps "--flag value" and "--flag=value" arguments.
func flagValues(args []string) map[string]string {
	m := map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "--") {
			continue
		}
		if k, v, ok := strings.Cut(a, "="); ok {
			m[k] = v
		} else if i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
			m[a] = args[i+1]
			i++
		}
	}
	return m
}

func splitHostPort(t *testing.T, addr string) (host, port string) {
	t.Helper()
	i := strings.LastIndex(addr, ":")
	if i < 0 {
		t.Errorf("%q is not HOST:PORT", addr)
		return "", ""
	}
	return addr[:i], addr[i+1:]
}
