package topology

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/idem-dev/idem/contract"
)

// Limits enforced by Validate.
const (
	// MaxShardsPerRegion bounds shards_per_region: each shard is a Raft
	// group with its own log, heartbeats and snapshots on every voter, and
	// with zone survival every node of a small region votes in most of them.
	MaxShardsPerRegion = 256
	// MaxShards bounds the cluster's total shard count (shards_per_region x
	// regions), which bounds the ring's build time (see MaxVirtualNodes).
	MaxShards = 512
	// MaxReplicas bounds replicas: more voters than 7 only slow commits.
	MaxReplicas = 7
	// MaxWANRTTMs bounds wan_rtt_ms (ten seconds is no longer a WAN).
	MaxWANRTTMs = 10000
	// MaxRegions bounds the regions: each homes at least one shard, and
	// MaxShards bounds those.
	MaxRegions = 64
	// MaxNodes bounds the nodes of a topology: MaxShards shards of
	// MaxReplicas voters seat no more than a few thousand, and every node
	// is a member of the meta group. A larger document is refused before
	// anything is computed from it (placing and planning cost grows with
	// the nodes).
	MaxNodes = 1024
)

// Survival says which failure every shard must survive while staying
// writable.
type Survival string

const (
	// SurvivalZone keeps all voters of a shard in its home region, on
	// distinct nodes: a shard survives the loss of a minority of its nodes,
	// and writes commit at LAN latency. This is the default when the file
	// does not say.
	SurvivalZone Survival = "zone"
	// SurvivalRegion spreads a shard's voters over at least three regions
	// so that no region holds a majority: a shard survives the loss of any
	// one whole region, and writes pay one WAN round trip.
	SurvivalRegion Survival = "region"
)

// Topology is the cluster topology file: every node and router reads the same
// file and derives from it alone the same key -> shard -> home region mapping
// and the same voter sets. Parse and LoadFile return a validated Topology;
// treat it as read-only once shared.
type Topology struct {
	// Cluster names the cluster; it must match the name grammar
	// [a-z0-9][a-z0-9._-]{0,62} and is part of the ring fingerprint, so two
	// clusters never mistake each other's data dirs.
	Cluster string `yaml:"cluster" json:"cluster"`
	// Version numbers the file's successive shapes: 1 (or absent) for a
	// new cluster, the active version + 1 for a change applied online
	// (idemctl topology apply). 0 reads as 1.
	Version int `yaml:"version,omitempty" json:"version,omitempty"`
	// ShardsPerRegion is the number of Raft groups homed in each region,
	// 1..MaxShardsPerRegion.
	ShardsPerRegion int `yaml:"shards_per_region" json:"shards_per_region"`
	// Replicas is the number of voters per shard, 1..MaxReplicas (1 means no
	// replication: tests only).
	Replicas int `yaml:"replicas" json:"replicas"`
	// Survival is zone or region; empty means zone.
	Survival Survival `yaml:"survival,omitempty" json:"survival,omitempty"`
	// WANRTTMs is the measured round trip between regions in milliseconds,
	// used to size Raft timeouts for shards whose voters span regions;
	// 0 means all regions are on one LAN.
	WANRTTMs int `yaml:"wan_rtt_ms,omitempty" json:"wan_rtt_ms,omitempty"`
	// Ring tunes the consistent-hash ring; zero fields take the defaults.
	// Changing it moves keys between shards: set it once, before data.
	Ring RingConfig `yaml:"ring,omitempty" json:"ring,omitempty"`
	// Regions lists the regions and their nodes. Placement depends on the
	// set of regions and nodes, not on their order in the file.
	Regions []Region `yaml:"regions" json:"regions"`
}

// RingConfig tunes the consistent-hash ring (see doc.go for why the defaults
// are what they are). A zero field takes its default.
type RingConfig struct {
	// PartitionCount is the number of fixed hash partitions keys fall into;
	// partitions, not keys, are assigned to shards. Default
	// DefaultPartitionCount; at least MinPartitionsPerShard per shard, at
	// most MaxPartitionCount.
	PartitionCount int `yaml:"partition_count,omitempty" json:"partition_count,omitempty"`
	// ReplicationFactor is the number of virtual nodes per shard on the
	// hash circle, 1..MaxReplicationFactor. Default
	// DefaultReplicationFactor.
	ReplicationFactor int `yaml:"replication_factor,omitempty" json:"replication_factor,omitempty"`
	// Load is the bounded-load factor: no shard owns more than
	// ceil(Load * partitions / shards) partitions. MinLoad..MaxLoad,
	// default DefaultLoad (1.25, as the contract states).
	Load float64 `yaml:"load,omitempty" json:"load,omitempty"`
}

// Region is one region and its storage nodes.
type Region struct {
	// Name matches [a-z0-9][a-z0-9._-]{0,62}; it prefixes the ids of the
	// shards homed here.
	Name string `yaml:"name" json:"name"`
	// Nodes lists the region's storage nodes.
	Nodes []Node `yaml:"nodes" json:"nodes"`
}

// Node is one storage node (one idemnode process).
type Node struct {
	// ID names the node, unique in the cluster, grammar as Region.Name.
	ID string `yaml:"id" json:"id"`
	// RaftAddr is HOST:PORT for Raft traffic of all this node's shards.
	RaftAddr string `yaml:"raft_addr" json:"raft_addr"`
	// GRPCAddr is HOST:PORT of the gRPC API.
	GRPCAddr string `yaml:"grpc_addr" json:"grpc_addr"`
	// HTTPAddr is HOST:PORT of the JSON API, probes and metrics.
	HTTPAddr string `yaml:"http_addr" json:"http_addr"`
	// Region is the name of the enclosing region; not in the file, filled in
	// by Parse and by NodeByID.
	Region string `yaml:"-" json:"-"`
}

// NameGrammar is the grammar of namespaces, cluster, region and node names.
const NameGrammar = contract.NameGrammar

// ValidName reports whether s matches the name grammar shared by
// namespaces, regions, nodes and clusters: [a-z0-9][a-z0-9._-]{0,62}.
func ValidName(s string) bool { return contract.ValidName(s) }

// Parse decodes a topology from YAML or JSON (JSON is YAML), rejecting
// unknown fields, duplicate keys and multiple documents, fills in defaults
// (survival zone, Node.Region) and validates it. Errors wrap
// ErrInvalidTopology; validation errors are a *ValidationError.
func Parse(data []byte) (*Topology, error) {
	return parse(data, "")
}

// LoadFile reads and parses the topology file at path (see Parse).
func LoadFile(path string) (*Topology, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("topology: %w", err)
	}
	return parse(data, path)
}

func parse(data []byte, source string) (*Topology, error) {
	where := ""
	if source != "" {
		where = " " + source
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var t Topology
	if err := dec.Decode(&t); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w%s: the file is empty", ErrInvalidTopology, where)
		}
		return nil, fmt.Errorf("%w%s: %s", ErrInvalidTopology, where, flattenYAMLError(err))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w%s: more than one YAML document (a second one follows a \"---\" line): keep one", ErrInvalidTopology, where)
	}
	if t.Survival == "" {
		t.Survival = SurvivalZone
	}
	for i := range t.Regions {
		for j := range t.Regions[i].Nodes {
			t.Regions[i].Nodes[j].Region = t.Regions[i].Name
		}
	}
	if err := t.Validate(); err != nil {
		var ve *ValidationError
		if errors.As(err, &ve) {
			ve.Source = source
		}
		return nil, err
	}
	return &t, nil
}

// flattenYAMLError puts yaml.v3's multi-line "unmarshal errors" on one line.
func flattenYAMLError(err error) string {
	lines := strings.Split(err.Error(), "\n")
	for i := range lines {
		lines[i] = strings.TrimSpace(lines[i])
	}
	msg := strings.Join(lines, " ")
	return strings.Replace(msg, "unmarshal errors: ", "", 1)
}

// effectiveSurvival maps the empty value to the default.
func (t *Topology) effectiveSurvival() Survival {
	if t.Survival == "" {
		return SurvivalZone
	}
	return t.Survival
}

// regionSpread is how many regions hold voters of one shard.
func (t *Topology) regionSpread() int {
	if t.effectiveSurvival() == SurvivalRegion {
		return min(len(t.Regions), t.Replicas)
	}
	return 1
}

// maxVotersPerRegion is how many voters of one shard the most loaded region
// holds (its home region): ceil(replicas / spread).
func (t *Topology) maxVotersPerRegion() int {
	k := t.regionSpread()
	if k < 1 {
		return t.Replicas
	}
	return (t.Replicas + k - 1) / k
}

type collector struct{ list []*FieldError }

func (c *collector) add(path, format string, args ...any) {
	c.list = append(c.list, &FieldError{Path: path, Message: fmt.Sprintf(format, args...)})
}

// Validate checks every rule of the topology file and reports every problem
// at once as a *ValidationError (nil when the topology is valid), each with
// the path of the offending field:
//
//   - cluster is required and a valid name (NameGrammar);
//   - shards_per_region is 1..MaxShardsPerRegion and the cluster has at most
//     MaxShards shards; replicas is 1..MaxReplicas; survival is zone or
//     region (empty counts as zone); wan_rtt_ms is 0..MaxWANRTTMs;
//   - at least one region; region names valid and unique; every region has
//     a node; node ids valid and unique across the cluster;
//   - every raft_addr, grpc_addr and http_addr is a dialable HOST:PORT (IP or
//     DNS name, port 1..65535, no wildcard host), and no address appears
//     twice, whatever its kind;
//   - zone survival: every region has at least replicas nodes;
//   - region survival: at least 3 regions and 3 replicas, losing the region
//     with the most voters of a shard leaves a majority, and every region
//     has a node for each voter it holds;
//   - ring: partition_count 0 or up to MaxPartitionCount and, in effect, at
//     least MinPartitionsPerShard per shard; replication_factor 0 or up to
//     MaxReplicationFactor with shards x replication_factor at most
//     MaxVirtualNodes; load 0 or MinLoad..MaxLoad.
//
// Node.Region is ignored (it is derived from the enclosing region).
func (t *Topology) Validate() error {
	var c collector
	if t.Cluster == "" {
		c.add("cluster", "required: name the cluster")
	} else if !ValidName(t.Cluster) {
		c.add("cluster", "%q must match %s", t.Cluster, NameGrammar)
	}
	spOK := t.ShardsPerRegion >= 1 && t.ShardsPerRegion <= MaxShardsPerRegion
	if !spOK {
		c.add("shards_per_region", "%d is out of range 1..%d", t.ShardsPerRegion, MaxShardsPerRegion)
	}
	repOK := t.Replicas >= 1 && t.Replicas <= MaxReplicas
	if !repOK {
		c.add("replicas", "%d is out of range 1..%d", t.Replicas, MaxReplicas)
	}
	survival := t.effectiveSurvival()
	survivalOK := survival == SurvivalZone || survival == SurvivalRegion
	if !survivalOK {
		c.add("survival", "%q is not %q or %q", t.Survival, SurvivalZone, SurvivalRegion)
	}
	if t.Version < 0 {
		c.add("version", "%d is negative: versions count from 1 (absent means 1)", t.Version)
	}
	if t.WANRTTMs < 0 || t.WANRTTMs > MaxWANRTTMs {
		c.add("wan_rtt_ms", "%d is out of range 0..%d (0 means one LAN)", t.WANRTTMs, MaxWANRTTMs)
	}

	t.validateRegions(&c)

	if repOK && survivalOK {
		t.validateSurvival(&c)
	}
	shards := 0
	if spOK {
		shards = t.ShardsPerRegion * len(t.Regions)
		if shards > MaxShards {
			c.add("shards_per_region", "%d regions x %d shards = %d shards, more than the %d a cluster may have", len(t.Regions), t.ShardsPerRegion, shards, MaxShards)
			shards = 0
		}
	}
	t.validateRing(&c, shards)
	if len(c.list) == 0 {
		return nil
	}
	return &ValidationError{Problems: c.list}
}

func (t *Topology) validateRegions(c *collector) {
	if len(t.Regions) == 0 {
		c.add("regions", "at least one region is required")
		return
	}
	nodes := 0
	for _, r := range t.Regions {
		nodes += len(r.Nodes)
	}
	if len(t.Regions) > MaxRegions || nodes > MaxNodes {
		c.add("regions", "%d regions of %d nodes in all: a cluster has at most %d regions and %d nodes", len(t.Regions), nodes, MaxRegions, MaxNodes)
		return
	}
	regionAt := make(map[string]string)
	nodeAt := make(map[string]string)
	addrAt := make(map[string]string)
	for i, r := range t.Regions {
		rp := fmt.Sprintf("regions[%d]", i)
		switch {
		case r.Name == "":
			c.add(rp+".name", "required")
		case !ValidName(r.Name):
			c.add(rp+".name", "%q must match %s", r.Name, NameGrammar)
		default:
			if prev, dup := regionAt[r.Name]; dup {
				c.add(rp+".name", "duplicate region %q (also %s)", r.Name, prev)
			} else {
				regionAt[r.Name] = rp
			}
		}
		if len(r.Nodes) == 0 {
			c.add(rp+".nodes", "at least one node is required")
		}
		for j, n := range r.Nodes {
			np := fmt.Sprintf("%s.nodes[%d]", rp, j)
			switch {
			case n.ID == "":
				c.add(np+".id", "required")
			case !ValidName(n.ID):
				c.add(np+".id", "%q must match %s", n.ID, NameGrammar)
			default:
				if prev, dup := nodeAt[n.ID]; dup {
					c.add(np+".id", "duplicate id %q (also %s)", n.ID, prev)
				} else {
					nodeAt[n.ID] = np
				}
			}
			for _, a := range []struct{ field, value string }{
				{"raft_addr", n.RaftAddr}, {"grpc_addr", n.GRPCAddr}, {"http_addr", n.HTTPAddr},
			} {
				ap := np + "." + a.field
				canon, err := canonicalAddr(a.value)
				if err != nil {
					c.add(ap, "%v", err)
					continue
				}
				if prev, dup := addrAt[canon]; dup {
					c.add(ap, "address %q already used by %s", a.value, prev)
				} else {
					addrAt[canon] = ap
				}
			}
		}
	}
}

// canonicalAddr checks that addr is a HOST:PORT another process can dial and
// returns a canonical form for duplicate detection.
func canonicalAddr(addr string) (string, error) {
	if addr == "" {
		return "", errors.New("required: HOST:PORT that other processes dial")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("%q is not HOST:PORT (%v)", addr, strings.TrimPrefix(err.Error(), "address "+addr+": "))
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 || port != strconv.Itoa(p) {
		return "", fmt.Errorf("%q: port %q is not a number in 1..65535", addr, port)
	}
	if host == "" {
		return "", fmt.Errorf("%q has no host: other processes dial this address, name a host or IP", addr)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.IsUnspecified() {
			return "", fmt.Errorf("%q is a wildcard address other processes cannot dial: put the node's reachable address here (it can still listen on %s with its --raft-addr, --grpc-addr or --http-addr flag)", addr, host)
		}
		if ip.Zone() != "" {
			return "", fmt.Errorf("%q: IPv6 zones are not supported", addr)
		}
		return net.JoinHostPort(ip.Unmap().String(), port), nil
	}
	if !validHostname(host) {
		return "", fmt.Errorf("%q: host %q is neither an IP address nor a DNS name", addr, host)
	}
	return net.JoinHostPort(strings.ToLower(strings.TrimSuffix(host, ".")), port), nil
}

func validHostname(h string) bool {
	h = strings.TrimSuffix(h, ".")
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			ch := label[i]
			if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '-' || ch == '_') {
				return false
			}
		}
	}
	return true
}

func (t *Topology) validateSurvival(c *collector) {
	r := t.Replicas
	switch t.effectiveSurvival() {
	case SurvivalZone:
		for i, reg := range t.Regions {
			if len(reg.Nodes) > 0 && len(reg.Nodes) < r {
				c.add(fmt.Sprintf("regions[%d].nodes", i),
					"survival zone with replicas %d needs at least %d nodes in every region, have %d", r, r, len(reg.Nodes))
			}
		}
	case SurvivalRegion:
		ok := true
		if len(t.Regions) < 3 {
			c.add("regions", "survival region needs at least 3 regions, have %d", len(t.Regions))
			ok = false
		}
		if r < 3 {
			c.add("replicas", "survival region needs at least 3 replicas so that losing a region leaves a majority, have %d", r)
			ok = false
		}
		if !ok {
			return
		}
		k := t.regionSpread()
		most := t.maxVotersPerRegion()
		majority := r/2 + 1
		if r-most < majority {
			c.add("replicas", "survival region with %d replicas over %d regions puts %d voters of a shard in one region, and losing it leaves no majority: use 3, 5, 6 or 7 replicas, or more regions", r, k, most)
			return
		}
		for i, reg := range t.Regions {
			if len(reg.Nodes) > 0 && len(reg.Nodes) < most {
				c.add(fmt.Sprintf("regions[%d].nodes", i),
					"survival region with %d replicas over %d regions puts up to %d voters of a shard in each region, so it needs at least %d nodes, have %d", r, k, most, most, len(reg.Nodes))
			}
		}
	}
}

func (t *Topology) validateRing(c *collector, shards int) { validateRingConfig(c, t.Ring, shards) }

// validateRingConfig checks ring parameters for a ring of shards shards.
func validateRingConfig(c *collector, rc RingConfig, shards int) {
	pcOK := true
	if rc.PartitionCount < 0 || rc.PartitionCount > MaxPartitionCount {
		c.add("ring.partition_count", "%d is out of range (0 for the default %d, at most %d)", rc.PartitionCount, DefaultPartitionCount, MaxPartitionCount)
		pcOK = false
	}
	rfOK := true
	if rc.ReplicationFactor < 0 || rc.ReplicationFactor > MaxReplicationFactor {
		c.add("ring.replication_factor", "%d is out of range (0 for the default %d, at most %d)", rc.ReplicationFactor, DefaultReplicationFactor, MaxReplicationFactor)
		rfOK = false
	}
	if math.IsNaN(rc.Load) || rc.Load != 0 && (rc.Load < MinLoad || rc.Load > MaxLoad) {
		c.add("ring.load", "%v is out of range %v..%v (0 for the default %v)", rc.Load, MinLoad, MaxLoad, DefaultLoad)
	}
	eff := rc.effective()
	if rfOK && shards > 0 && shards*eff.ReplicationFactor > MaxVirtualNodes {
		c.add("ring.replication_factor", "%d shards x %d virtual nodes = %d, more than %d: lower ring.replication_factor", shards, eff.ReplicationFactor, shards*eff.ReplicationFactor, MaxVirtualNodes)
	}
	if pcOK && shards > 0 {
		pc := eff.PartitionCount
		if need := shards * MinPartitionsPerShard; pc < need {
			c.add("ring.partition_count", "%d partitions are too few for %d shards: need at least %d (%d per shard); set ring.partition_count before storing data (changing it later moves most keys)", pc, shards, need, MinPartitionsPerShard)
		}
	}
}

// NodeByID returns the node with the given id, with Region filled in.
func (t *Topology) NodeByID(id string) (Node, bool) {
	for _, r := range t.Regions {
		for _, n := range r.Nodes {
			if n.ID == id {
				n.Region = r.Name
				return n, true
			}
		}
	}
	return Node{}, false
}

// RegionOf returns the name of the region that holds node nodeID.
func (t *Topology) RegionOf(nodeID string) (string, bool) {
	n, ok := t.NodeByID(nodeID)
	return n.Region, ok
}

// RegionByName returns the region with the given name.
func (t *Topology) RegionByName(name string) (Region, bool) {
	for _, r := range t.Regions {
		if r.Name == name {
			return r, true
		}
	}
	return Region{}, false
}

// Nodes returns every node of the cluster in file order, with Region filled
// in.
func (t *Topology) Nodes() []Node {
	var out []Node
	for _, r := range t.Regions {
		for _, n := range r.Nodes {
			n.Region = r.Name
			out = append(out, n)
		}
	}
	return out
}

// EffectiveVersion is t.Version, with 0 (absent) read as 1.
func (t *Topology) EffectiveVersion() int { return max(t.Version, 1) }

// Clone returns a deep copy of t.
func (t *Topology) Clone() *Topology {
	c := *t
	c.Regions = make([]Region, len(t.Regions))
	for i, r := range t.Regions {
		c.Regions[i] = Region{Name: r.Name, Nodes: append([]Node(nil), r.Nodes...)}
	}
	return &c
}
