package topology

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func loadTestdata(t testing.TB, name string) *Topology {
	t.Helper()
	topo, err := LoadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatalf("LoadFile(%s): %v", name, err)
	}
	return topo
}

func TestLoadSamples(t *testing.T) {
	one := loadTestdata(t, "three-node.yaml")
	if one.Cluster != "demo" || one.ShardsPerRegion != 4 || one.Replicas != 3 || one.Survival != SurvivalZone {
		t.Fatalf("three-node.yaml header = %+v", one)
	}
	if len(one.Regions) != 1 || len(one.Regions[0].Nodes) != 3 {
		t.Fatalf("three-node.yaml regions = %+v", one.Regions)
	}
	want := Node{ID: "us-east-2", RaftAddr: "127.0.0.1:7002", GRPCAddr: "127.0.0.1:7102", HTTPAddr: "127.0.0.1:8102", Region: "us-east"}
	if got := one.Regions[0].Nodes[1]; got != want {
		t.Fatalf("node 1 = %+v, want %+v (Region filled in by Parse)", got, want)
	}

	three := loadTestdata(t, "three-region.yaml")
	if three.Survival != SurvivalRegion || three.WANRTTMs != 80 || len(three.Regions) != 3 {
		t.Fatalf("three-region.yaml = %+v", three)
	}
	if got := len(three.Nodes()); got != 9 {
		t.Fatalf("three-region.yaml has %d nodes, want 9", got)
	}
}

func TestYAMLAndJSONParseEqual(t *testing.T) {
	fromYAML := loadTestdata(t, "three-region.yaml")
	fromJSON := loadTestdata(t, "three-region.json")
	if !reflect.DeepEqual(fromYAML, fromJSON) {
		t.Fatalf("YAML and JSON forms differ:\nyaml %+v\njson %+v", fromYAML, fromJSON)
	}
	// JSON on one line, as a program would write it, also parses.
	compact := `{"cluster":"demo","shards_per_region":4,"replicas":3,"regions":[{"name":"us-east","nodes":[` +
		`{"id":"us-east-1","raft_addr":"127.0.0.1:7001","grpc_addr":"127.0.0.1:7101","http_addr":"127.0.0.1:8101"},` +
		`{"id":"us-east-2","raft_addr":"127.0.0.1:7002","grpc_addr":"127.0.0.1:7102","http_addr":"127.0.0.1:8102"},` +
		`{"id":"us-east-3","raft_addr":"127.0.0.1:7003","grpc_addr":"127.0.0.1:7103","http_addr":"127.0.0.1:8103"}]}]}`
	got, err := Parse([]byte(compact))
	if err != nil {
		t.Fatalf("Parse(compact JSON): %v", err)
	}
	if want := loadTestdata(t, "three-node.yaml"); !reflect.DeepEqual(got, want) {
		t.Fatalf("compact JSON (no survival: defaults to zone) = %+v, want %+v", got, want)
	}
}

func TestParseRejectsMalformedFiles(t *testing.T) {
	base, err := os.ReadFile(filepath.Join("testdata", "three-node.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, data, wantInMessage string
	}{
		{"empty", "", "empty"},
		{"only a comment", "# nothing\n", "empty"},
		{"unknown top-level field", string(base) + "shard_count: 3\n", "shard_count"},
		{"unknown node field", strings.Replace(string(base), "      - id: us-east-1\n", "      - id: us-east-1\n        zone: a\n", 1), "zone"},
		{"unknown field in JSON", `{"cluster":"demo","bogus":1}`, "bogus"},
		{"duplicate key", "cluster: a\ncluster: b\n", "already defined"},
		{"wrong type", "cluster: demo\nreplicas: three\n", "line 2: cannot unmarshal"},
		{"two documents", string(base) + "---\ncluster: other\n", "more than one YAML document"},
		{"not a mapping", "- a\n- b\n", "cannot unmarshal"},
		{"syntax error", "cluster: [demo\n", "line"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			topo, err := Parse([]byte(tc.data))
			if err == nil {
				t.Fatalf("Parse succeeded: %+v", topo)
			}
			if !errors.Is(err, ErrInvalidTopology) {
				t.Fatalf("error %v does not wrap ErrInvalidTopology", err)
			}
			if !strings.Contains(err.Error(), tc.wantInMessage) {
				t.Fatalf("error %q does not mention %q", err, tc.wantInMessage)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q spans lines", err)
			}
		})
	}
}

func TestLoadFileErrors(t *testing.T) {
	if _, err := LoadFile(filepath.Join(t.TempDir(), "missing.yaml")); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: err = %v, want os.ErrNotExist", err)
	}
	path := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(path, []byte("cluster: demo\nshards_per_region: 0\nreplicas: 1\nregions: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadFile(path)
	var ve *ValidationError
	if !errors.As(err, &ve) || ve.Source != path {
		t.Fatalf("err = %v, want a *ValidationError naming %s", err, path)
	}
	if !strings.Contains(err.Error(), path) {
		t.Fatalf("error %q does not name the file", err)
	}
}

// validTopology is the base every validation case starts from: two regions of
// three nodes, zone survival.
func validTopology() *Topology {
	return genTopology([]string{"us-east", "eu-west"}, 3, 4, 3, SurvivalZone)
}

type wantProblem struct{ path, message string }

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(t *Topology)
		want   []wantProblem // every problem, in order; message is a substring
	}{
		{"valid", func(*Topology) {}, nil},
		{"empty survival means zone", func(t *Topology) { t.Survival = "" }, nil},
		{"cluster missing", func(t *Topology) { t.Cluster = "" }, []wantProblem{{"cluster", "required"}}},
		{"cluster grammar", func(t *Topology) { t.Cluster = "Demo" }, []wantProblem{{"cluster", `"Demo" must match`}}},
		{"shards_per_region zero", func(t *Topology) { t.ShardsPerRegion = 0 }, []wantProblem{{"shards_per_region", "0 is out of range 1..256"}}},
		{"shards_per_region too many", func(t *Topology) { t.ShardsPerRegion = 257 }, []wantProblem{{"shards_per_region", "257 is out of range"}}},
		{"too many shards in all", func(t *Topology) {
			t.ShardsPerRegion = 200
			t.Regions = append(t.Regions, genTopology([]string{"ap-south"}, 3, 1, 3, SurvivalZone).Regions[0])
			t.Regions[2].Nodes[0].RaftAddr, t.Regions[2].Nodes[0].GRPCAddr, t.Regions[2].Nodes[0].HTTPAddr = "h:1", "h:2", "h:3"
			t.Regions[2].Nodes[1].RaftAddr, t.Regions[2].Nodes[1].GRPCAddr, t.Regions[2].Nodes[1].HTTPAddr = "h:4", "h:5", "h:6"
			t.Regions[2].Nodes[2].RaftAddr, t.Regions[2].Nodes[2].GRPCAddr, t.Regions[2].Nodes[2].HTTPAddr = "h:7", "h:8", "h:9"
		}, []wantProblem{{"shards_per_region", "3 regions x 200 shards = 600 shards, more than the 512"}}},
		{"replicas zero", func(t *Topology) { t.Replicas = 0 }, []wantProblem{{"replicas", "0 is out of range 1..7"}}},
		{"replicas eight", func(t *Topology) { t.Replicas = 8 }, []wantProblem{{"replicas", "8 is out of range 1..7"}}},
		{"survival unknown", func(t *Topology) { t.Survival = "planet" }, []wantProblem{{"survival", `"planet" is not "zone" or "region"`}}},
		{"wan_rtt_ms negative", func(t *Topology) { t.WANRTTMs = -1 }, []wantProblem{{"wan_rtt_ms", "-1 is out of range 0..10000"}}},
		{"no regions", func(t *Topology) { t.Regions = nil }, []wantProblem{{"regions", "at least one region"}}},
		{"too many nodes", func(t *Topology) {
			for i := len(t.Regions[0].Nodes); i <= MaxNodes; i++ {
				t.Regions[0].Nodes = append(t.Regions[0].Nodes, Node{ID: fmt.Sprintf("x-%d", i), RaftAddr: "h:1", GRPCAddr: "h:2", HTTPAddr: "h:3"})
			}
		}, []wantProblem{{"regions", "a cluster has at most 64 regions and 1024 nodes"}}},
		{"too many regions", func(t *Topology) {
			for i := len(t.Regions); i <= MaxRegions; i++ {
				t.Regions = append(t.Regions, Region{Name: fmt.Sprintf("r%d", i)})
			}
			t.ShardsPerRegion = 1
		}, []wantProblem{{"regions", "65 regions"}}},
		{"region name missing", func(t *Topology) { t.Regions[1].Name = "" }, []wantProblem{{"regions[1].name", "required"}}},
		{"region name grammar", func(t *Topology) { t.Regions[1].Name = "eu_West" }, []wantProblem{{"regions[1].name", `"eu_West" must match [a-z0-9][a-z0-9._-]{0,62}`}}},
		{"region name too long", func(t *Topology) { t.Regions[1].Name = strings.Repeat("a", 64) }, []wantProblem{{"regions[1].name", "must match"}}},
		{"region name duplicate", func(t *Topology) { t.Regions[1].Name = "us-east" }, []wantProblem{{"regions[1].name", `duplicate region "us-east" (also regions[0])`}}},
		{"region without nodes", func(t *Topology) { t.Regions[1].Nodes = nil }, []wantProblem{{"regions[1].nodes", "at least one node"}}},
		{"node id missing", func(t *Topology) { t.Regions[0].Nodes[2].ID = "" }, []wantProblem{{"regions[0].nodes[2].id", "required"}}},
		{"node id grammar", func(t *Topology) { t.Regions[0].Nodes[2].ID = "-n" }, []wantProblem{{"regions[0].nodes[2].id", `"-n" must match`}}},
		{"node id duplicate across regions", func(t *Topology) { t.Regions[1].Nodes[0].ID = "us-east-n0" },
			[]wantProblem{{"regions[1].nodes[0].id", `duplicate id "us-east-n0" (also regions[0].nodes[0])`}}},
		{"raft_addr missing", func(t *Topology) { t.Regions[0].Nodes[1].RaftAddr = "" }, []wantProblem{{"regions[0].nodes[1].raft_addr", "required"}}},
		{"grpc_addr without port", func(t *Topology) { t.Regions[0].Nodes[1].GRPCAddr = "127.0.0.1" }, []wantProblem{{"regions[0].nodes[1].grpc_addr", `"127.0.0.1" is not HOST:PORT`}}},
		{"http_addr port out of range", func(t *Topology) { t.Regions[0].Nodes[1].HTTPAddr = "127.0.0.1:70000" }, []wantProblem{{"regions[0].nodes[1].http_addr", "not a number in 1..65535"}}},
		{"port zero", func(t *Topology) { t.Regions[0].Nodes[1].HTTPAddr = "127.0.0.1:0" }, []wantProblem{{"regions[0].nodes[1].http_addr", "not a number in 1..65535"}}},
		{"named port", func(t *Topology) { t.Regions[0].Nodes[1].HTTPAddr = "127.0.0.1:http" }, []wantProblem{{"regions[0].nodes[1].http_addr", "not a number"}}},
		{"empty host", func(t *Topology) { t.Regions[0].Nodes[1].HTTPAddr = ":8080" }, []wantProblem{{"regions[0].nodes[1].http_addr", "has no host"}}},
		{"wildcard host", func(t *Topology) { t.Regions[0].Nodes[1].HTTPAddr = "0.0.0.0:8080" }, []wantProblem{{"regions[0].nodes[1].http_addr", "wildcard"}}},
		{"bad host", func(t *Topology) { t.Regions[0].Nodes[1].HTTPAddr = "bad host!:8080" }, []wantProblem{{"regions[0].nodes[1].http_addr", "neither an IP address nor a DNS name"}}},
		{"dns and ipv6 hosts are fine", func(t *Topology) {
			t.Regions[0].Nodes[1].HTTPAddr = "node-1.us-east.example.com:8080"
			t.Regions[0].Nodes[1].GRPCAddr = "[::1]:7070"
		}, nil},
		{"address reused across kinds", func(t *Topology) { t.Regions[1].Nodes[2].HTTPAddr = t.Regions[0].Nodes[0].RaftAddr },
			[]wantProblem{{"regions[1].nodes[2].http_addr", `address "127.0.0.1:10000" already used by regions[0].nodes[0].raft_addr`}}},
		{"address reused in another spelling", func(t *Topology) {
			t.Regions[0].Nodes[0].GRPCAddr = "[::1]:9000"
			t.Regions[0].Nodes[1].GRPCAddr = "[0:0::1]:9000"
		}, []wantProblem{{"regions[0].nodes[1].grpc_addr", "already used by regions[0].nodes[0].grpc_addr"}}},
		{"zone needs replicas nodes per region", func(t *Topology) { t.Regions[1].Nodes = t.Regions[1].Nodes[:2] },
			[]wantProblem{{"regions[1].nodes", "survival zone with replicas 3 needs at least 3 nodes in every region, have 2"}}},
		{"region survival needs three regions", func(t *Topology) { t.Survival = SurvivalRegion },
			[]wantProblem{{"regions", "survival region needs at least 3 regions, have 2"}}},
		{"region survival needs three replicas", func(t *Topology) {
			*t = *genTopology(regionNames(3), 1, 2, 1, SurvivalRegion)
		}, []wantProblem{{"replicas", "survival region needs at least 3 replicas"}}},
		{"region survival, 4 replicas over 3 regions", func(t *Topology) {
			*t = *genTopology(regionNames(3), 2, 2, 4, SurvivalRegion)
		}, []wantProblem{{"replicas", "survival region with 4 replicas over 3 regions puts 2 voters of a shard in one region, and losing it leaves no majority"}}},
		{"region survival, 4 replicas over 4 regions is fine", func(t *Topology) {
			*t = *genTopology(regionNames(4), 1, 2, 4, SurvivalRegion)
		}, nil},
		{"region survival needs nodes for its voters", func(t *Topology) {
			*t = *genTopology(regionNames(3), 2, 2, 5, SurvivalRegion)
			t.Regions[2].Nodes = t.Regions[2].Nodes[:1]
		}, []wantProblem{{"regions[2].nodes", "puts up to 2 voters of a shard in each region, so it needs at least 2 nodes, have 1"}}},
		{"ring partition_count negative", func(t *Topology) { t.Ring.PartitionCount = -1 }, []wantProblem{{"ring.partition_count", "-1 is out of range"}}},
		{"ring partition_count too small", func(t *Topology) { t.Ring.PartitionCount = 100 },
			[]wantProblem{{"ring.partition_count", "100 partitions are too few for 8 shards: need at least 256"}}},
		{"ring partition_count too large", func(t *Topology) { t.Ring.PartitionCount = MaxPartitionCount + 1 }, []wantProblem{{"ring.partition_count", "out of range"}}},
		{"ring replication_factor", func(t *Topology) { t.Ring.ReplicationFactor = 1001 }, []wantProblem{{"ring.replication_factor", "1001 is out of range"}}},
		{"ring virtual nodes", func(t *Topology) { t.ShardsPerRegion = 100; t.Ring.ReplicationFactor = 300 },
			[]wantProblem{{"ring.replication_factor", "200 shards x 300 virtual nodes = 60000, more than 51200"}}},
		{"ring load below 1", func(t *Topology) { t.Ring.Load = 0.9 }, []wantProblem{{"ring.load", "0.9 is out of range 1..2"}}},
		{"ring explicit defaults", func(t *Topology) { t.Ring = RingConfig{PartitionCount: 16411, ReplicationFactor: 100, Load: 1.25} }, nil},
		{"every problem at once", func(t *Topology) {
			t.Cluster = ""
			t.Replicas = 9
			t.Regions[0].Nodes[0].ID = "us-east-n1"
			t.Regions[1].Name = "us-east"
			t.Regions[1].Nodes[1].RaftAddr = "nope"
			t.Ring.Load = 3
		}, []wantProblem{
			{"cluster", "required"},
			{"replicas", "9 is out of range"},
			{"regions[0].nodes[1].id", `duplicate id "us-east-n1" (also regions[0].nodes[0])`},
			{"regions[1].name", `duplicate region "us-east" (also regions[0])`},
			{"regions[1].nodes[1].raft_addr", `"nope" is not HOST:PORT`},
			{"ring.load", "3 is out of range"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			topo := validTopology()
			tc.mutate(topo)
			err := topo.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate accepted %+v", topo)
			}
			if !errors.Is(err, ErrInvalidTopology) {
				t.Fatalf("error does not wrap ErrInvalidTopology: %v", err)
			}
			var first *FieldError
			if !errors.As(err, &first) || first.Path != tc.want[0].path {
				t.Fatalf("errors.As found %v, want path %s", first, tc.want[0].path)
			}
			got := Problems(err)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d problems, want %d:\n%s", len(got), len(tc.want), strings.ReplaceAll(err.Error(), "; ", "\n"))
			}
			for i, w := range tc.want {
				if got[i].Path != w.path || !strings.Contains(got[i].Message, w.message) {
					t.Errorf("problem %d = %q, want path %q with %q", i, got[i].Error(), w.path, w.message)
				}
				if !strings.Contains(err.Error(), got[i].Error()) {
					t.Errorf("message %q lacks problem %q", err, got[i])
				}
			}
			if strings.Contains(err.Error(), "\n") || !strings.HasPrefix(err.Error(), "topology: invalid topology: ") {
				t.Errorf("message %q is not one line with the package prefix", err)
			}
		})
	}
}

func TestTopologyLookups(t *testing.T) {
	topo := loadTestdata(t, "three-region.yaml")
	n, ok := topo.NodeByID("eu-west-2")
	if !ok || n.Region != "eu-west" || n.RaftAddr != "127.0.0.1:7005" {
		t.Fatalf("NodeByID(eu-west-2) = %+v, %v", n, ok)
	}
	if _, ok := topo.NodeByID("eu-west-9"); ok {
		t.Fatal("NodeByID found a node that does not exist")
	}
	if r, ok := topo.RegionOf("ap-south-3"); !ok || r != "ap-south" {
		t.Fatalf("RegionOf(ap-south-3) = %q, %v", r, ok)
	}
	if _, ok := topo.RegionOf("nobody"); ok {
		t.Fatal("RegionOf found a region for an unknown node")
	}
	reg, ok := topo.RegionByName("ap-south")
	if !ok || len(reg.Nodes) != 3 {
		t.Fatalf("RegionByName(ap-south) = %+v, %v", reg, ok)
	}
	ids := make([]string, 0, 9)
	for _, n := range topo.Nodes() {
		if n.Region == "" {
			t.Fatalf("Nodes() left Region empty for %s", n.ID)
		}
		ids = append(ids, n.ID)
	}
	if !slices.Equal(ids[:3], []string{"us-east-1", "us-east-2", "us-east-3"}) {
		t.Fatalf("Nodes() not in file order: %v", ids)
	}

	clone := topo.Clone()
	clone.Regions[0].Nodes[0].ID = "changed"
	if topo.Regions[0].Nodes[0].ID == "changed" {
		t.Fatal("Clone shares node slices with the original")
	}
}
