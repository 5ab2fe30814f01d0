package auth

import (
	"testing"

	"github.com/idem-dev/idem/security/pki"
)

// FuzzParse feeds arbitrary bytes to the auth file parser (an operator's
// typo, a truncated write caught by a SIGHUP reload): it must never panic,
// and a policy it accepts must hold only what the rules allow, and
// authorize without panicking.
func FuzzParse(f *testing.F) {
	f.Add([]byte(testFile()))
	f.Add([]byte(`{"principals": [{"name": "a", "namespaces": ["*"], "role": "admin", "rate_per_s": 0.5}]}`))
	f.Add([]byte("principals:\n  - {name: a, role: reader, namespaces: ['b-*', c]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		pol, err := Parse(data)
		if err != nil {
			return
		}
		if len(pol.Principals) == 0 {
			t.Fatal("accepted a policy without principals")
		}
		m, _ := newMetrics(nil)
		a := &Authorizer{metrics: m}
		a.state.Store(newState(pol, nil))
		for _, p := range pol.Principals {
			if !pki.ValidName(p.Name) || p.Role < RoleReader || p.Role > RoleAdmin || len(p.Namespaces) == 0 || p.RatePerS < 0 {
				t.Fatalf("accepted an invalid principal %+v", p)
			}
			if got, ok := pol.Lookup(p.Name); !ok || got != p {
				t.Fatalf("principal %q not found by name", p.Name)
			}
			got, err := a.Authorize(Credentials{Peer: pki.Identity{Kind: pki.KindClient, Name: p.Name}}, Target{"billing", VerbGet})
			if p.AllowsNamespace("billing") {
				if err != nil {
					t.Fatalf("principal %+v denied a get on a namespace it lists: %v", p, err)
				}
				if got != p {
					t.Fatalf("authorized as %q, want %q", got.Name, p.Name)
				}
			} else if err == nil {
				t.Fatalf("principal %+v allowed outside its namespaces", p)
			}
		}
	})
}
