package console

import (
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem/contract"
)

// namespaceMetric is the server's counter with a namespace label; the
// console learns from it which namespaces this process served.
const namespaceMetric = "idem_api_namespace_requests_total"

// visibleNamespaces are the namespaces the console shows the caller of r:
// those its grants name exactly, those this process served, those asked
// for with ?ns=a,b, and extra, each only if the caller's grants cover it.
func (c *Console) visibleNamespaces(r *http.Request, extra string) []string {
	p := principal(r)
	seen := map[string]bool{}
	add := func(ns string) {
		ns = strings.TrimSpace(ns)
		if contract.ValidNamespace(ns) && p.AllowsNamespace(ns) {
			seen[ns] = true
		}
	}
	for _, pat := range p.Namespaces {
		if !strings.Contains(pat, "*") {
			add(pat)
		}
	}
	for _, ns := range c.servedNamespaces() {
		add(ns)
	}
	for _, v := range r.URL.Query()["ns"] {
		for ns := range strings.SplitSeq(v, ",") {
			add(ns)
		}
	}
	add(extra)
	out := make([]string, 0, len(seen))
	for ns := range seen {
		out = append(out, ns)
	}
	slices.Sort(out)
	return out
}

// servedNamespaces reads the namespace label values of namespaceMetric.
func (c *Console) servedNamespaces() []string {
	if c.cfg.Registry == nil {
		return nil
	}
	mfs, err := c.cfg.Registry.Gather()
	if err != nil {
		return nil
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != namespaceMetric {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "namespace" {
					out = append(out, l.GetValue())
				}
			}
		}
	}
	return out
}

// policy is the JSON API's namespace policy.
type policy struct {
	DefaultLeaseMs    int64 `json:"default_lease_ms"`
	MaxLeaseMs        int64 `json:"max_lease_ms"`
	DefaultRetentionS int64 `json:"default_retention_s"`
	MaxRetentionS     int64 `json:"max_retention_s"`
	TombstoneS        int64 `json:"tombstone_s"`
}

// defaultLeaseMs is the built-in default lease (docs/api.md), used when the
// policy cannot be read.
const defaultLeaseMs = 30000

// stuckLeases is the default threshold of the stuck-work view, in leases.
const stuckLeases = 3

// listedKey is one key of the API's listing.
type listedKey struct {
	Key            string `json:"key"`
	State          string `json:"state"`
	FencingToken   string `json:"fencing_token"`
	CreatedAt      string `json:"created_at"`
	LeaseExpiresAt string `json:"lease_expires_at,omitempty"`
}

// stuckKey is a stuck key as the view and the export show it.
type stuckKey struct {
	Namespace      string `json:"namespace"`
	Key            string `json:"key"`
	FencingToken   string `json:"fencing_token"`
	CreatedAt      string `json:"created_at"`
	Age            string `json:"age"`
	LeaseExpiresAt string `json:"lease_expires_at"`
	LeaseEnded     bool   `json:"lease_ended"`
	Checkpoint     string `json:"checkpoint,omitempty"`
	// Link is the key's page. (The store keeps no reclaim count; the
	// fencing token grows with each reclaim.)
	Link string `json:"link"`
}

// stuckNamespace is one namespace's part of the view.
type stuckNamespace struct {
	Namespace  string     `json:"namespace"`
	ThresholdS int64      `json:"threshold_s"`
	Keys       []stuckKey `json:"keys"`
	More       bool       `json:"more"`
	Refused    string     `json:"refused,omitempty"`
	Admin      bool       `json:"-"`
}

type stuckPage struct {
	Namespaces []stuckNamespace
	Override   string
	Limit      int
}

// stuckLimit bounds the keys listed per namespace; checkpointLookups how
// many of them are read one by one for their checkpoint name.
const (
	stuckLimit        = 100
	checkpointLookups = 25
)

func (c *Console) stuck(r *http.Request) ([]stuckNamespace, string, *string) {
	override := r.URL.Query().Get("older_than_s")
	var fixed int64 = -1
	if override != "" {
		n, err := strconv.ParseInt(override, 10, 64)
		if err != nil || n < 0 {
			msg := "older_than_s " + strconv.Quote(override) + " is not a whole number of seconds (0 or more)"
			return nil, override, &msg
		}
		fixed = n
	}
	now := c.cfg.Now()
	var out []stuckNamespace
	for _, ns := range c.visibleNamespaces(r, "") {
		sn := stuckNamespace{Namespace: ns, Admin: isAdmin(principal(r), ns), Keys: []stuckKey{}}
		sn.ThresholdS = fixed
		if fixed < 0 {
			lease := int64(defaultLeaseMs)
			var pol policy
			if reply := c.call(r, http.MethodGet, nsPath(ns, "policy"), nil, nil); reply.OK() && reply.Decode(&pol) == nil && pol.DefaultLeaseMs > 0 {
				lease = pol.DefaultLeaseMs
			}
			sn.ThresholdS = (stuckLeases*lease + 999) / 1000
		}
		q := url.Values{"state": {"IN_PROGRESS"}, "older_than_s": {strconv.FormatInt(sn.ThresholdS, 10)}, "limit": {strconv.Itoa(stuckLimit)}}
		reply := c.call(r, http.MethodGet, nsPath(ns, "keys"), q, nil)
		if !reply.OK() {
			code, msg := reply.Error()
			sn.Refused = code + ": " + msg
			out = append(out, sn)
			continue
		}
		var page struct {
			Keys []listedKey `json:"keys"`
			Next string      `json:"next_page_token"`
		}
		_ = reply.Decode(&page)
		sn.More = page.Next != ""
		for i, k := range page.Keys {
			sk := stuckKey{Namespace: ns, Key: k.Key, FencingToken: k.FencingToken, CreatedAt: k.CreatedAt, LeaseExpiresAt: k.LeaseExpiresAt,
				Link: "/ui/keys/" + url.PathEscape(ns) + "/" + url.PathEscape(k.Key)}
			if t, err := time.Parse(time.RFC3339Nano, k.CreatedAt); err == nil {
				sk.Age = now.Sub(t).Round(time.Second).String()
			}
			if t, err := time.Parse(time.RFC3339Nano, k.LeaseExpiresAt); err == nil {
				sk.LeaseEnded = !now.Before(t)
			}
			if i < checkpointLookups {
				var rec record
				if rr := c.call(r, http.MethodGet, keyPath(ns, k.Key), nil, nil); rr.OK() && rr.Decode(&rec) == nil && rec.Checkpoint != nil {
					sk.Checkpoint = rec.Checkpoint.Name
				}
			}
			sn.Keys = append(sn.Keys, sk)
		}
		out = append(out, sn)
	}
	return out, override, nil
}

func (c *Console) serveStuck(w http.ResponseWriter, r *http.Request) {
	list, override, problem := c.stuck(r)
	if problem != nil {
		c.render(w, r, http.StatusBadRequest, "error", errorPage{Title: "Bad threshold", Message: *problem})
		return
	}
	c.render(w, r, http.StatusOK, "stuck", stuckPage{Namespaces: list, Override: override, Limit: stuckLimit})
}

// serveStuckJSON exports the view as JSON (the same keys, the same
// authorization).
func (c *Console) serveStuckJSON(w http.ResponseWriter, r *http.Request) {
	list, _, problem := c.stuck(r)
	w.Header().Set("Content-Type", "application/json")
	if problem != nil {
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(map[string]map[string]string{"error": {"code": "INVALID_ARGUMENT", "message": *problem}})
		return
	}
	w.Header().Set("Content-Disposition", `attachment; filename="stuck-work.json"`)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(map[string]any{"generated_at": c.cfg.Now().UTC().Format(time.RFC3339), "namespaces": list})
}
