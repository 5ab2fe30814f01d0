package topology

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"

	"github.com/idem-dev/idem/keyspace"
)

// Ring parameters: defaults and the ranges Validate accepts. doc.go explains
// the choice.
const (
	// DefaultPartitionCount is the number of hash partitions (a prime, as
	// the library suggests). It is fixed, not derived from the shard count,
	// so that adding a region moves only about the new shards' share of
	// keys; it gives every shard of the largest allowed cluster (MaxShards)
	// at least MinPartitionsPerShard partitions.
	DefaultPartitionCount = 16411
	// MinPartitionsPerShard is the fewest partitions per shard Validate
	// accepts: one partition is then at most 1/32 of a shard's mean share,
	// so rounding partitions to whole ones adds at most that to the load
	// bound.
	MinPartitionsPerShard = 32
	// MaxPartitionCount bounds ring.partition_count (the partition table
	// costs 4 bytes per partition in every process).
	MaxPartitionCount = 1 << 20
	// DefaultReplicationFactor is the number of virtual nodes per shard on
	// the hash circle: enough that most shards own close to their mean
	// share before the load bound intervenes, which keeps key movement on
	// a topology change close to the ideal.
	DefaultReplicationFactor = 100
	// MaxReplicationFactor bounds ring.replication_factor.
	MaxReplicationFactor = 1000
	// MaxVirtualNodes bounds shards x replication_factor: the library
	// re-sorts the whole circle once per member while building it, so build
	// time grows with shards x virtual nodes (about 3 s at the bound on a
	// small machine).
	MaxVirtualNodes = MaxShards * DefaultReplicationFactor
	// DefaultLoad is the bounded-load factor of the contract: no shard owns
	// more than ceil(1.25 x the mean number of partitions).
	DefaultLoad = 1.25
	// MinLoad and MaxLoad bound ring.load. Below 1 the partitions do not
	// fit; above 2 the bound promises little.
	MinLoad = 1.0
	MaxLoad = 2.0
)

// effective returns the configuration with defaults filled in.
func (rc RingConfig) effective() RingConfig {
	if rc.PartitionCount == 0 {
		rc.PartitionCount = DefaultPartitionCount
	}
	if rc.ReplicationFactor == 0 {
		rc.ReplicationFactor = DefaultReplicationFactor
	}
	if rc.Load == 0 {
		rc.Load = DefaultLoad
	}
	return rc
}

// ringFormat names the hashing scheme; it is part of the fingerprint, so a
// future change of key encoding or hash function changes every fingerprint.
const ringFormat = "idem-ring-v1 consistent-v1.0.0 xxhash64 ns\\x00key"

// Ring maps keys to shards. It is built once from a topology, never changes,
// and is safe for concurrent use without locks.
type Ring struct {
	cluster     string
	config      RingConfig // effective
	shards      []Shard    // in Topology.Shards order
	byID        map[string]int
	partitions  []uint32 // partition -> index into shards
	fingerprint string
	layout      string // LayoutFingerprint
}

// shardMember is a consistent.Member named by the shard id.
type shardMember string

func (m shardMember) String() string { return string(m) }

// xxHasher is the consistent.Hasher: 64-bit xxHash.
type xxHasher struct{}

func (xxHasher) Sum64(b []byte) uint64 { return xxhash.Sum64(b) }

// NewRing validates t and builds its ring: the shards of t are the members
// of a github.com/buraksezer/consistent bounded-load ring with the
// parameters of t.Ring (defaults filled in), and the resulting partition
// owners are copied into a table so that Locate needs no lock. t is not
// retained.
func NewRing(t *Topology) (*Ring, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return buildRing(t.Cluster, t.Ring.effective(), place(t))
}

// NewRingFromShards rebuilds the ring a node built with NewRing from what
// the node reports of it (the Routing RPC): the cluster name, the ring
// parameters and every shard in ring order (Ring.Shards; the order is part
// of the fingerprint). It checks what it is given (names, shard ids, voters,
// parameter ranges) and, when fingerprint is not empty, refuses with
// ErrFingerprintMismatch a ring whose Fingerprint differs: a client must
// never place keys with another ring than the nodes. shards is not retained.
func NewRingFromShards(cluster string, cfg RingConfig, shards []Shard, fingerprint string) (*Ring, error) {
	var c collector
	if !ValidName(cluster) {
		c.add("cluster", "%q is not a valid name (%s)", cluster, NameGrammar)
	}
	if len(shards) == 0 || len(shards) > MaxShards {
		c.add("shards", "%d shards: want 1..%d", len(shards), MaxShards)
	}
	own := make([]Shard, 0, len(shards))
	seen := make(map[string]bool, len(shards))
	for i, s := range shards {
		path := fmt.Sprintf("shards[%d]", i)
		region, index, ok := ParseShardID(s.ID)
		switch {
		case !ok:
			c.add(path+".id", "%q is not a shard id (<region>-<index>)", s.ID)
		case region != s.HomeRegion:
			c.add(path+".home_region", "%q, but shard id %q names region %q", s.HomeRegion, s.ID, region)
		case seen[s.ID]:
			c.add(path+".id", "shard %q appears twice", s.ID)
		}
		seen[s.ID] = true
		if len(s.Voters) == 0 || len(s.Voters) > MaxReplicas {
			c.add(path+".voters", "%d voters: want 1..%d", len(s.Voters), MaxReplicas)
		}
		for j, v := range s.Voters {
			if !ValidName(v) || slices.Contains(s.Voters[:j], v) {
				c.add(fmt.Sprintf("%s.voters[%d]", path, j), "%q is not a valid node id or appears twice", v)
			}
		}
		own = append(own, Shard{ID: s.ID, HomeRegion: s.HomeRegion, Index: index, Voters: slices.Clone(s.Voters)})
	}
	validateRingConfig(&c, cfg, len(shards))
	if len(c.list) > 0 {
		return nil, &ValidationError{Problems: c.list}
	}
	r, err := buildRing(cluster, cfg.effective(), own)
	if err != nil {
		return nil, err
	}
	if fingerprint != "" && r.fingerprint != fingerprint {
		return nil, fmt.Errorf("%w: rebuilt %s, want %s", ErrFingerprintMismatch, r.fingerprint, fingerprint)
	}
	return r, nil
}

// buildRing builds the ring of shards (in ring order) with cfg (defaults
// filled in).
func buildRing(cluster string, cfg RingConfig, shards []Shard) (*Ring, error) {
	c, err := newConsistent(shards, cfg)
	if err != nil {
		return nil, err
	}
	r := &Ring{
		cluster:    cluster,
		config:     cfg,
		shards:     shards,
		byID:       make(map[string]int, len(shards)),
		partitions: make([]uint32, cfg.PartitionCount),
	}
	for i, s := range shards {
		r.byID[s.ID] = i
	}
	for p := range cfg.PartitionCount {
		owner := c.GetPartitionOwner(p)
		if owner == nil {
			return nil, fmt.Errorf("%w: partition %d has no owner", ErrRing, p)
		}
		idx, ok := r.byID[owner.String()]
		if !ok {
			return nil, fmt.Errorf("%w: partition %d owned by unknown member %q", ErrRing, p, owner.String())
		}
		r.partitions[p] = uint32(idx)
	}
	r.fingerprint = fingerprintOf(cluster, cfg, shards)
	r.layout = layoutFingerprintOf(cluster, cfg)
	return r, nil
}

// WithVoters returns a ring that places keys exactly as r does (same
// partitions, same shards) but whose shards carry the voters voters gives
// for each shard id (r's voters where voters has none). It shares r's
// partition table, so it costs a copy of the shard list, not a rebuild: a
// membership change alters who votes in a shard, never where a key lives.
func (r *Ring) WithVoters(voters map[string][]string) *Ring {
	c := *r
	c.shards = make([]Shard, len(r.shards))
	for i, s := range r.shards {
		if v, ok := voters[s.ID]; ok && len(v) > 0 {
			s.Voters = slices.Clone(v)
		}
		c.shards[i] = s
	}
	c.fingerprint = fingerprintOf(c.cluster, c.config, c.shards)
	return &c
}

// newConsistent builds the library's ring, turning its panics (a nil hasher,
// or "not enough room to distribute partitions" for a load factor below 1)
// into an error.
func newConsistent(shards []Shard, cfg RingConfig) (c *consistent.Consistent, err error) {
	if len(shards) == 0 {
		return nil, fmt.Errorf("%w: no shards", ErrRing)
	}
	members := make([]consistent.Member, len(shards))
	for i, s := range shards {
		members[i] = shardMember(s.ID)
	}
	defer func() {
		if p := recover(); p != nil {
			c, err = nil, fmt.Errorf("%w: %v (partitions %d, replication factor %d, load %v, %d shards)",
				ErrRing, p, cfg.PartitionCount, cfg.ReplicationFactor, cfg.Load, len(shards))
		}
	}()
	c = consistent.New(members, consistent.Config{
		Hasher:            xxHasher{},
		PartitionCount:    cfg.PartitionCount,
		ReplicationFactor: cfg.ReplicationFactor,
		Load:              cfg.Load,
	})
	return c, nil
}

// partition returns the partition of (namespace, key): xxHash64 of
// namespace + "\x00" + key, modulo the partition count, exactly as the
// library's FindPartitionID computes it for those bytes (keyspace.Partition;
// the state machine checks commands with the same function).
func (r *Ring) partition(namespace, key string) int {
	return int(keyspace.Partition(namespace, key, uint32(len(r.partitions))))
}

// Partition returns the ring partition of (namespace, key): the unit in
// which keys change shard when the shard set changes.
func (r *Ring) Partition(namespace, key string) uint32 { return uint32(r.partition(namespace, key)) }

// Locate returns the shard that holds key in namespace. Every process with
// the same topology file gets the same answer. The returned Voters slice is
// shared: do not modify it.
func (r *Ring) Locate(namespace, key string) Shard {
	return r.shards[r.partitions[r.partition(namespace, key)]]
}

// Shards returns every shard in Topology.Shards order (a fresh slice; the
// Voters slices are shared and read-only).
func (r *Ring) Shards() []Shard { return append([]Shard(nil), r.shards...) }

// ShardByID returns the shard with the given id.
func (r *Ring) ShardByID(id string) (Shard, bool) {
	i, ok := r.byID[id]
	if !ok {
		return Shard{}, false
	}
	return r.shards[i], true
}

// Cluster returns the cluster name the ring was built for.
func (r *Ring) Cluster() string { return r.cluster }

// Config returns the ring parameters in force, defaults filled in.
func (r *Ring) Config() RingConfig { return r.config }

// PartitionCounts returns how many hash partitions each shard owns, by shard
// id; a shard's share of keys is its count divided by the partition count.
func (r *Ring) PartitionCounts() map[string]int {
	out := make(map[string]int, len(r.shards))
	for _, s := range r.shards {
		out[s.ID] = 0
	}
	for _, idx := range r.partitions {
		out[r.shards[idx].ID]++
	}
	return out
}

// Fingerprint returns a stable hex SHA-256 of everything that decides where
// a key lives and which nodes serve it: the hashing scheme, the cluster
// name, the ring parameters, and every shard with its home region and
// voters. Node addresses and wan_rtt_ms are left out: changing them moves
// no data. A data dir or router that recorded a fingerprint can refuse to
// serve under a different one.
func (r *Ring) Fingerprint() string { return r.fingerprint }

// LayoutFingerprint is what never changes for a cluster's life: a stable
// hex SHA-256 of the hashing scheme, the cluster name and the ring
// parameters (partition count, virtual nodes, load), which decide the
// partition of every key. Membership and shard-set changes keep it (keys
// change shard as whole partitions, online); a changed cluster name or
// ring section changes it. Data dirs pin it, and routers compare it with
// the nodes'.
func (r *Ring) LayoutFingerprint() string { return r.layout }

// ShardLayoutFingerprint is the key layout fingerprint of releases that
// could not move keys between shards: LayoutFingerprint with every shard id
// and home region, in ring order. A data dir that pinned it is rewritten
// to LayoutFingerprint once it matches the node's file.
func (r *Ring) ShardLayoutFingerprint() string {
	return ringHash(" layout", r.cluster, r.config, r.shards, false)
}

func layoutFingerprintOf(cluster string, cfg RingConfig) string {
	return ringHash(" partitions", cluster, cfg, nil, false)
}

func fingerprintOf(cluster string, cfg RingConfig, shards []Shard) string {
	return ringHash("", cluster, cfg, shards, true)
}

// ringHash hashes the ring's description, with or without the voters.
func ringHash(kind, cluster string, cfg RingConfig, shards []Shard, voters bool) string {
	var b strings.Builder
	b.WriteString(ringFormat + kind + "\n")
	b.WriteString("cluster " + cluster + "\n")
	b.WriteString("partitions " + strconv.Itoa(cfg.PartitionCount) + "\n")
	b.WriteString("vnodes " + strconv.Itoa(cfg.ReplicationFactor) + "\n")
	b.WriteString("load " + strconv.FormatFloat(cfg.Load, 'g', -1, 64) + "\n")
	for _, s := range shards {
		b.WriteString("shard " + s.ID + " home " + s.HomeRegion)
		if voters {
			b.WriteString(" voters " + strings.Join(s.Voters, ","))
		}
		b.WriteString("\n")
	}
	sum := sha256.Sum256([]byte(b.String()))
	return hex.EncodeToString(sum[:])
}
