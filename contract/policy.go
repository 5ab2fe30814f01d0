package contract

// Namespace policies (v1.2; docs/api.md, "Namespace policies"):
// per-namespace defaults and maxima of lease and retention, and how long a
// tombstone outlives a response.
const (
	// DefaultTombstoneS is tombstone_s when a namespace's policy does not
	// set it: seven days.
	DefaultTombstoneS = 604_800
	// MaxTombstoneS bounds tombstone_s: ten years.
	MaxTombstoneS = 315_360_000
)

// EffectivePolicy is a namespace's policy in force, in the API's units,
// every field filled in.
type EffectivePolicy struct {
	DefaultLeaseMs    int64 `json:"default_lease_ms"`
	MaxLeaseMs        int64 `json:"max_lease_ms"`
	DefaultRetentionS int64 `json:"default_retention_s"`
	MaxRetentionS     int64 `json:"max_retention_s"`
	TombstoneS        int64 `json:"tombstone_s"`
}

// EffectivePolicyOf fills in a stored policy (nanoseconds, 0: not set;
// tombstoneSet: whether tombstone is set) with the built-in defaults: a
// default the policy does not set is the built-in one, capped by the
// policy's max.
func EffectivePolicyOf(defaultLease, maxLease, defaultRetention, maxRetention, tombstone int64, tombstoneSet bool) EffectivePolicy {
	e := EffectivePolicy{
		DefaultLeaseMs:    DefaultLeaseMs,
		MaxLeaseMs:        MaxLeaseMs,
		DefaultRetentionS: DefaultRetentionS,
		MaxRetentionS:     MaxRetentionS,
		TombstoneS:        DefaultTombstoneS,
	}
	if maxLease > 0 {
		e.MaxLeaseMs = maxLease / 1e6
	}
	if defaultLease > 0 {
		e.DefaultLeaseMs = defaultLease / 1e6
	}
	e.DefaultLeaseMs = min(e.DefaultLeaseMs, e.MaxLeaseMs)
	if maxRetention > 0 {
		e.MaxRetentionS = maxRetention / 1e9
	}
	if defaultRetention > 0 {
		e.DefaultRetentionS = defaultRetention / 1e9
	}
	e.DefaultRetentionS = min(e.DefaultRetentionS, e.MaxRetentionS)
	if tombstoneSet {
		e.TombstoneS = tombstone / 1e9
	}
	return e
}
