package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/internal/flagdoc"
)

// keysOptions are the flags of "idemctl keys".
type keysOptions struct {
	state     string
	olderThan time.Duration
	limit     int
	pageToken string
	reason    string
}

// keysFlags are the flags of idemctl keys.
func keysFlags(o *cmdOptions) []flagdoc.Flag {
	return []flagdoc.Flag{
		{Name: "addr", Value: &o.addr, Usage: "gRPC `HOST:PORT` of the node or router to ask (default: the topology's nodes, first that answers)"},
		{Name: "state", Value: &o.keys.state, Usage: "list: only keys in state `S` (IN_PROGRESS or COMPLETED)"},
		{Name: "older-than", Value: &o.keys.olderThan, Usage: "list: only keys whose current owner reserved them at least `D` ago (e.g. 10m)"},
		{Name: "limit", Value: &o.keys.limit, Usage: "list: print at most `N` keys (following pages as needed)"},
		{Name: "page-token", Value: &o.keys.pageToken, Usage: "list: continue a listing from the `TOKEN` a previous one printed"},
		{Name: "reason", Value: &o.keys.reason, Usage: "force-release, delete: why (required; logged with the principal and the key)"},
	}
}

// keyView is one listed key as printed.
type keyView struct {
	Key            string `json:"key"`
	State          string `json:"state"`
	FencingToken   string `json:"fencing_token"`
	CreatedAt      string `json:"created_at"`
	LeaseExpiresAt string `json:"lease_expires_at,omitempty"`
	CompletedAt    string `json:"completed_at,omitempty"`
	ExpiresAt      string `json:"expires_at,omitempty"`
}

// listView is what "keys list" prints.
type listView struct {
	Keys []keyView `json:"keys"`
	// NextPageToken continues the listing past --limit ("" when done).
	NextPageToken string `json:"next_page_token,omitempty"`
}

func runKeys(ctx context.Context, e *env, args []string) error {
	sub, args := args[0], args[1:]
	switch sub {
	case "list":
		if len(args) != 1 {
			return fmt.Errorf("keys list needs NAMESPACE, got %d argument(s)", len(args))
		}
		return runKeysList(ctx, e, args[0])
	case "force-release", "delete":
		if len(args) != 2 {
			return fmt.Errorf("keys %s needs NAMESPACE KEY, got %d argument(s)", sub, len(args))
		}
		if err := checkName(args[0], args[1]); err != nil {
			return err
		}
		if strings.TrimSpace(e.o.keys.reason) == "" {
			return fmt.Errorf("keys %s needs --reason TEXT: it is logged with the key, for whoever looks at this later", sub)
		}
		return runKeysAction(ctx, e, sub, args[0], args[1])
	}
	return fmt.Errorf("unknown keys command %q: use list, force-release or delete", sub)
}

// keysAddrs are the gRPC addresses to try: --addr, or every node.
func keysAddrs(e *env) ([]string, error) {
	if e.o.addr != "" {
		return []string{e.o.addr}, nil
	}
	topo, err := e.needTopology("keys without --addr")
	if err != nil {
		return nil, err
	}
	var addrs []string
	for _, n := range topo.Nodes() {
		addrs = append(addrs, n.GRPCAddr)
	}
	return addrs, nil
}

// callAdmin runs call against the first address that answers; an answer
// the store decided (anything but UNAVAILABLE or a transport failure) ends
// the search.
func callAdmin(ctx context.Context, e *env, call func(ctx context.Context, c idemv1.AdminClient) error) error {
	addrs, err := keysAddrs(e)
	if err != nil {
		return err
	}
	return firstAnswer(ctx, e, addrs, e.g.timeout, func(ctx context.Context, conn *grpc.ClientConn) error {
		return call(ctx, idemv1.NewAdminClient(conn))
	})
}

// firstAnswer runs call against each address in turn until one answers:
// an answer the store decided (anything but UNAVAILABLE or a transport
// failure) ends the search.
func firstAnswer(ctx context.Context, e *env, addrs []string, timeout time.Duration, call func(ctx context.Context, conn *grpc.ClientConn) error) error {
	var tried []string
	for _, addr := range addrs {
		conn, err := e.dial(addr)
		if err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, timeout)
		err = call(cctx, conn)
		cancel()
		conn.Close()
		switch status.Code(err) {
		case codes.OK:
			return nil
		case codes.Unavailable, codes.DeadlineExceeded, codes.Unimplemented:
			tried = append(tried, addr+": "+reason(err))
			if ctx.Err() != nil {
				return fmt.Errorf("%w (tried: %s)", ctx.Err(), strings.Join(tried, "; "))
			}
			continue
		}
		return err
	}
	return fmt.Errorf("%w (%d address(es)): %s", errNoNodeAnswered, len(addrs), strings.Join(tried, "; "))
}

// errNoNodeAnswered: every address failed at the transport or answered
// UNAVAILABLE (firstAnswer).
var errNoNodeAnswered = errors.New("no node answered")

// apiError is the one line a decided refusal prints.
func apiError(what string, err error) error {
	code, msg, _ := idemv1.StatusToError(status.Convert(err))
	return fmt.Errorf("%s: %s: %s", what, code, msg)
}

func runKeysList(ctx context.Context, e *env, ns string) error {
	o := e.o.keys
	if !contract.ValidNamespace(ns) {
		return fmt.Errorf("namespace %q must match %s", ns, contract.NameGrammar)
	}
	var state idemv1.State
	switch strings.ToUpper(o.state) {
	case "":
	case "IN_PROGRESS":
		state = idemv1.State_STATE_IN_PROGRESS
	case "COMPLETED":
		state = idemv1.State_STATE_COMPLETED
	default:
		return fmt.Errorf("--state %q: use IN_PROGRESS or COMPLETED", o.state)
	}
	if o.olderThan < 0 || o.limit < 1 {
		return errors.New("--older-than must not be negative and --limit must be at least 1")
	}
	view := listView{Keys: []keyView{}}
	token := o.pageToken
	for {
		page := int32(min(o.limit-len(view.Keys), 1000))
		var resp *idemv1.ListKeysResponse
		err := callAdmin(ctx, e, func(ctx context.Context, c idemv1.AdminClient) error {
			var err error
			resp, err = c.ListKeys(ctx, &idemv1.ListKeysRequest{Namespace: ns, State: state,
				OlderThanS: int64(o.olderThan / time.Second), Limit: page, PageToken: token})
			return err
		})
		if err != nil {
			if _, ok := status.FromError(err); ok {
				return apiError("keys list", err)
			}
			return err
		}
		for _, k := range resp.GetKeys() {
			view.Keys = append(view.Keys, keyInfoView(k))
		}
		token = resp.GetNextPageToken()
		if token == "" || len(view.Keys) >= o.limit {
			break
		}
	}
	view.NextPageToken = token
	if e.g.json {
		return writeJSON(e.stdout, view)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tSTATE\tFENCING TOKEN\tCREATED AT\tLEASE EXPIRES AT\tEXPIRES AT")
	for _, k := range view.Keys {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", k.Key, k.State, k.FencingToken, k.CreatedAt, dash(k.LeaseExpiresAt), dash(k.ExpiresAt))
	}
	tw.Flush()
	if token != "" {
		fmt.Fprintf(e.stdout, "(more keys: add --page-token %s)\n", token)
	}
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func keyInfoView(k *idemv1.KeyInfo) keyView {
	v := keyView{Key: k.GetKey(), State: stateName(k.GetState()), FencingToken: strconv.FormatUint(k.GetFencingToken(), 10),
		CreatedAt: timeString(k.GetCreatedAt()), LeaseExpiresAt: timeString(k.GetLeaseExpiresAt()),
		CompletedAt: timeString(k.GetCompletedAt()), ExpiresAt: timeString(k.GetExpiresAt())}
	return v
}

// stateName is how idemctl prints a record state: IN_PROGRESS, COMPLETED
// or EXPIRED, and the wire name for any other value.
func stateName(s idemv1.State) string {
	switch s {
	case idemv1.State_STATE_IN_PROGRESS, idemv1.State_STATE_COMPLETED, idemv1.State_STATE_EXPIRED:
		return strings.TrimPrefix(s.String(), "STATE_")
	}
	return s.String()
}

// actionView is what force-release and delete print.
type actionView struct {
	Action               string `json:"action"`
	Namespace            string `json:"namespace"`
	Key                  string `json:"key"`
	PreviousFencingToken string `json:"previous_fencing_token,omitempty"`
}

func runKeysAction(ctx context.Context, e *env, action, ns, key string) error {
	view := actionView{Action: action, Namespace: ns, Key: key}
	err := callAdmin(ctx, e, func(ctx context.Context, c idemv1.AdminClient) error {
		if action == "delete" {
			_, err := c.DeleteKey(ctx, &idemv1.DeleteKeyRequest{Namespace: ns, Key: key, Reason: e.o.keys.reason})
			return err
		}
		resp, err := c.ForceRelease(ctx, &idemv1.ForceReleaseRequest{Namespace: ns, Key: key, Reason: e.o.keys.reason})
		if err == nil {
			view.PreviousFencingToken = strconv.FormatUint(resp.GetPreviousFencingToken(), 10)
		}
		return err
	})
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return apiError("keys "+action, err)
		}
		return err
	}
	if e.g.json {
		return writeJSON(e.stdout, view)
	}
	if action == "delete" {
		fmt.Fprintf(e.stdout, "deleted %s/%s: the next reserve gets ACQUIRED\n", ns, key)
		return nil
	}
	fmt.Fprintf(e.stdout, "force-released %s/%s (was fencing token %s): the old owner gets NOT_OWNER, the next reserve RECLAIMED\n",
		ns, key, view.PreviousFencingToken)
	return nil
}
