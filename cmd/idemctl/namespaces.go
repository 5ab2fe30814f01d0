package main

import (
	"context"
	"fmt"
	"strconv"

	"google.golang.org/grpc/status"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/internal/flagdoc"
)

// policyOptions are the flags of "idemctl namespaces set-policy"; a nil
// field was not given and takes the built-in default.
type policyOptions struct {
	defaultLeaseMs, maxLeaseMs, defaultRetentionS, maxRetentionS, tombstoneS *int64
}

// optionalInt is an int64 flag that records whether it was given.
type optionalInt struct{ p **int64 }

func (o optionalInt) String() string {
	if o.p == nil || *o.p == nil {
		return ""
	}
	return strconv.FormatInt(**o.p, 10)
}

func (o optionalInt) Set(v string) error {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return fmt.Errorf("%q is not an integer", v)
	}
	*o.p = &n
	return nil
}

// namespacesFlags are the flags of idemctl namespaces.
func namespacesFlags(o *cmdOptions) []flagdoc.Flag {
	p := &o.policy
	return []flagdoc.Flag{
		{Name: "addr", Value: &o.addr, Usage: "gRPC `HOST:PORT` of the node or router to ask (default: the topology's nodes, first that answers)"},
		{Name: "default-lease-ms", Value: optionalInt{&p.defaultLeaseMs}, Usage: "set-policy: lease `N` ms of a reserve that names none"},
		{Name: "max-lease-ms", Value: optionalInt{&p.maxLeaseMs}, Usage: "set-policy: the longest lease `N` ms a reserve or heartbeat may ask for"},
		{Name: "default-retention-s", Value: optionalInt{&p.defaultRetentionS}, Usage: "set-policy: retention `N` s of a complete that names none"},
		{Name: "max-retention-s", Value: optionalInt{&p.maxRetentionS}, Usage: "set-policy: the longest retention `N` s a complete may ask for"},
		{Name: "tombstone-s", Value: optionalInt{&p.tombstoneS}, Usage: "set-policy: how long `N` s a tombstone outlives the response (0 keeps none)"},
	}
}

// policyView is what set-policy and get-policy print: the policy in force.
type policyView struct {
	Namespace string `json:"namespace"`
	contract.EffectivePolicy
}

func runNamespaces(ctx context.Context, e *env, args []string) error {
	sub, ns := args[0], args[1]
	if sub != "set-policy" && sub != "get-policy" {
		return fmt.Errorf("unknown namespaces command %q: use set-policy or get-policy", sub)
	}
	if !contract.ValidNamespace(ns) {
		return fmt.Errorf("namespace %q must match %s", ns, contract.NameGrammar)
	}
	p := e.o.policy
	if sub == "get-policy" && (p != policyOptions{}) {
		return fmt.Errorf("namespaces get-policy takes no policy flags (they belong to set-policy)")
	}
	var got *idemv1.NamespacePolicy
	err := callAdmin(ctx, e, func(ctx context.Context, c idemv1.AdminClient) error {
		if sub == "get-policy" {
			resp, err := c.GetPolicy(ctx, &idemv1.GetPolicyRequest{Namespace: ns})
			got = resp.GetPolicy()
			return err
		}
		resp, err := c.SetPolicy(ctx, &idemv1.SetPolicyRequest{Namespace: ns, Policy: &idemv1.NamespacePolicy{
			DefaultLeaseMs: p.defaultLeaseMs, MaxLeaseMs: p.maxLeaseMs, DefaultRetentionS: p.defaultRetentionS,
			MaxRetentionS: p.maxRetentionS, TombstoneS: p.tombstoneS}})
		got = resp.GetPolicy()
		return err
	})
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return apiError("namespaces "+sub, err)
		}
		return err
	}
	v := policyView{Namespace: ns, EffectivePolicy: contract.EffectivePolicy{
		DefaultLeaseMs: got.GetDefaultLeaseMs(), MaxLeaseMs: got.GetMaxLeaseMs(), DefaultRetentionS: got.GetDefaultRetentionS(),
		MaxRetentionS: got.GetMaxRetentionS(), TombstoneS: got.GetTombstoneS()}}
	if e.g.json {
		return writeJSON(e.stdout, v)
	}
	itoa := func(n int64) string { return strconv.FormatInt(n, 10) }
	keyValues(e.stdout, [][2]string{
		{"namespace", v.Namespace},
		{"default lease ms", itoa(v.DefaultLeaseMs)},
		{"max lease ms", itoa(v.MaxLeaseMs)},
		{"default retention s", itoa(v.DefaultRetentionS)},
		{"max retention s", itoa(v.MaxRetentionS)},
		{"tombstone s", itoa(v.TombstoneS)},
	})
	return nil
}
