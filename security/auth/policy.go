package auth

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/idem-dev/idem/security/pki"
)

// Role is what a principal may do on its namespaces.
type Role int

// The roles, each including the one before.
const (
	// RoleReader: GET a key, list keys.
	RoleReader Role = iota + 1
	// RoleWriter: reader + reserve, heartbeat, complete, release.
	RoleWriter
	// RoleAdmin: writer + the operator actions (force-release, delete) on its
	// namespaces; with namespace "*" also the cluster-wide Admin RPCs.
	RoleAdmin
)

func (r Role) String() string {
	switch r {
	case RoleReader:
		return "reader"
	case RoleWriter:
		return "writer"
	case RoleAdmin:
		return "admin"
	}
	return fmt.Sprintf("Role(%d)", int(r))
}

func parseRole(s string) (Role, bool) {
	switch s {
	case "reader":
		return RoleReader, true
	case "writer":
		return RoleWriter, true
	case "admin":
		return RoleAdmin, true
	}
	return 0, false
}

// Principal is one entry of the auth file: who, where, how much.
type Principal struct {
	// Name is the client certificate NAME or the name a token maps to.
	Name string
	// Role is the highest verb class it may use.
	Role Role
	// Namespaces are the patterns as written: exact names, prefixes ending
	// in '*', or "*" for all.
	Namespaces []string
	// RatePerS is how many requests per second it may send to one process
	// (burst: one second's worth); 0 means unlimited.
	RatePerS float64

	// Internal marks a principal auth made up rather than read from the
	// file: root without an auth file, and a node peer's own identity.
	Internal bool
	// Router marks a router peer's own identity (or that of a node
	// certificate outside the committed topology): a writer on every
	// namespace (routing, and the records a router's proxy mode reads and
	// writes for callers that are no idem principals) that may also read
	// the cluster's status (VerbStatus, its ring check), and nothing that
	// needs role admin.
	Router bool

	tokenHash [32]byte
	hasToken  bool
}

// AllowsNamespace reports whether ns is among p's namespaces.
func (p *Principal) AllowsNamespace(ns string) bool {
	for _, pat := range p.Namespaces {
		if pat == "*" || pat == ns || (strings.HasSuffix(pat, "*") && strings.HasPrefix(ns, pat[:len(pat)-1])) {
			return true
		}
	}
	return false
}

// allNamespaces reports whether p has the "*" pattern (needed for the
// cluster-wide verbs).
func (p *Principal) allNamespaces() bool {
	for _, pat := range p.Namespaces {
		if pat == "*" {
			return true
		}
	}
	return false
}

// Policy is a parsed auth file.
type Policy struct {
	Principals []*Principal
	byName     map[string]*Principal
}

// Lookup returns the principal called name.
func (p *Policy) Lookup(name string) (*Principal, bool) {
	pr, ok := p.byName[name]
	return pr, ok
}

type fileFormat struct {
	Principals []filePrincipal `yaml:"principals"`
}

type filePrincipal struct {
	Name        string   `yaml:"name"`
	TokenSHA256 string   `yaml:"token_sha256"`
	Namespaces  []string `yaml:"namespaces"`
	Role        string   `yaml:"role"`
	RatePerS    *float64 `yaml:"rate_per_s"`
}

// namespacePattern is the contract's namespace grammar (docs/api.md,
// "Conventions"); prefixPattern is what may precede the '*' of a prefix.
var (
	namespacePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	prefixPattern    = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,61}$`)
)

// validNamespace reports whether ns is a namespace of the contract.
func validNamespace(ns string) bool { return namespacePattern.MatchString(ns) }

// maxFileBytes bounds what Parse reads: an auth file is small.
const maxFileBytes = 4 << 20

// Parse parses an auth file (YAML, or JSON, whatever its name) and checks
// every rule at once: unknown fields, names (pki.ValidName), unique names
// and tokens, token_sha256 as 64 hex digits, a role, at least one namespace
// pattern each valid, rate_per_s >= 0.
func Parse(data []byte) (*Policy, error) {
	if len(data) > maxFileBytes {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidFile, len(data), maxFileBytes)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f fileFormat
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: the file is empty", ErrInvalidFile)
		}
		return nil, fmt.Errorf("%w: %s", ErrInvalidFile, strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: more than one YAML document: keep one", ErrInvalidFile)
	}
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidFile}, args...)...))
	}
	if len(f.Principals) == 0 {
		bad("no principals: list at least one under principals:")
	}
	pol := &Policy{byName: map[string]*Principal{}}
	tokens := map[[32]byte]string{}
	for i, fp := range f.Principals {
		where := fmt.Sprintf("principal %d (%q)", i+1, fp.Name)
		p := &Principal{Name: fp.Name}
		if !pki.ValidName(fp.Name) {
			bad("%s: name must be 1-128 bytes of [A-Za-z0-9._@-], starting with a letter or digit", where)
		} else if pol.byName[fp.Name] != nil {
			bad("%s: name listed twice", where)
		}
		if fp.TokenSHA256 != "" {
			h, err := hex.DecodeString(fp.TokenSHA256)
			if err != nil || len(h) != 32 {
				bad("%s: token_sha256 must be 64 hex digits (the SHA-256 of the token, e.g. printf %%s TOKEN | sha256sum)", where)
			} else {
				copy(p.tokenHash[:], h)
				p.hasToken = true
				if other, dup := tokens[p.tokenHash]; dup {
					bad("%s: the same token_sha256 as principal %q: a token must name one principal", where, other)
				}
				tokens[p.tokenHash] = fp.Name
			}
		}
		role, ok := parseRole(fp.Role)
		if !ok {
			bad("%s: role %q must be reader, writer or admin", where, fp.Role)
		}
		p.Role = role
		if len(fp.Namespaces) == 0 {
			bad("%s: namespaces is empty: list exact names, prefixes ending in '*', or \"*\"", where)
		}
		for _, pat := range fp.Namespaces {
			switch {
			case pat == "*":
			case strings.HasSuffix(pat, "*"):
				if !prefixPattern.MatchString(pat[:len(pat)-1]) {
					bad("%s: namespace prefix %q: the part before '*' must be a namespace prefix ([a-z0-9][a-z0-9._-]*)", where, pat)
				}
			case !validNamespace(pat):
				bad("%s: namespace %q must match [a-z0-9][a-z0-9._-]{0,62}, or be a prefix ending in '*', or \"*\"", where, pat)
			}
		}
		p.Namespaces = append([]string(nil), fp.Namespaces...)
		if fp.RatePerS != nil {
			r := *fp.RatePerS
			if r < 0 || math.IsNaN(r) || math.IsInf(r, 0) {
				bad("%s: rate_per_s %v must be >= 0 (0 or absent: unlimited)", where, r)
			} else {
				p.RatePerS = r
			}
		}
		if pol.byName[fp.Name] == nil {
			pol.byName[fp.Name] = p
		}
		pol.Principals = append(pol.Principals, p)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return pol, nil
}
