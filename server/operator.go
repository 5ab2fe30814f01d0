package server

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/internal/wire"
	"github.com/idem-dev/idem/security/auth"
)

// The operator actions (docs/api.md, "Operator actions"): listing keys,
// force-release and delete, in JSON (this file's handlers) and in the gRPC
// Admin service (KeysAdmin). Each action that reaches the server first
// is logged at INFO with its principal, key and reason and counted in
// idem_operator_actions_total, on every process it passes through.

// Action names, as in logs and the metric's action label.
const (
	actionList         = "list"
	actionForceRelease = "force_release"
	actionDelete       = "delete"
	actionSetPolicy    = "set_policy"
)

// defaultPrincipal is the principal of a request that no authentication
// named (the contract: without --auth-file every caller is root).
const defaultPrincipal = "root"

// principalOf is the principal of a request, as the Authorizer's middleware
// or interceptor put it in the context (for a forwarded request, the
// principal it was forwarded for), or root without authentication.
func principalOf(ctx context.Context) string {
	if p, ok := auth.PrincipalFrom(ctx); ok && p != nil {
		return p.Name
	}
	return defaultPrincipal
}

func newOperatorMetric(reg *prometheus.Registry) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idem_operator_actions_total",
		Help: "Operator actions served, by action (list, force_release, delete), outcome (OK or an error code) and forwarded (true: another idem process forwarded it here; the actions callers sent are the sum over forwarded=\"false\").",
	}, []string{"action", "outcome", "forwarded"})
	c, err := register(reg, c)
	if err != nil {
		return nil, err
	}
	for _, a := range []string{actionList, actionForceRelease, actionDelete} {
		c.WithLabelValues(a, outcomeOK, "false")
	}
	return c, nil
}

func actionOf(op fsm.Op) string {
	if op == fsm.OpForceRelease {
		return actionForceRelease
	}
	return actionDelete
}

// operate runs a force-release or delete for principal and maps its
// outcome: OK, 404 NOT_FOUND, or 409 FAILED_PRECONDITION. Every process an
// action passes through logs it at INFO and counts it; hops > 0 (a request
// another process forwarded: in secure mode only a node or router peer's hop count is
// honoured) is counted with forwarded="true", so the actions callers sent
// are the sum over forwarded="false".
func (s *Server) operate(ctx context.Context, cmd *fsm.Command, hops int, principal string) (fsm.Result, string, *Error) {
	res, leader, err := s.backend.ApplyRouted(ctx, cmd, hops)
	var e *Error
	switch {
	case err != nil:
		leader = leaderHint(leader, err)
		e = s.backendError(ctx, err, cmd.Op.String(), cmd.Namespace, cmd.Key)
	case res.Outcome == fsm.OutcomeOK:
	case res.Outcome == fsm.OutcomeNotFound:
		e = errorf(CodeNotFound, "no record for this key in namespace %q: nothing to %s", cmd.Namespace, cmd.Op)
	case res.Outcome == fsm.OutcomeFailedPrecondition:
		e = errorf(CodeFailedPrecondition, "the key is COMPLETED: only an IN_PROGRESS key can be force-released (a completed record is final; delete it to let the next reserve run again)")
	default:
		s.log.Error("backend returned an unexpected outcome", "op", cmd.Op.String(),
			"namespace", cmd.Namespace, "key", cmd.Key, "outcome", res.Outcome.String())
		e = &Error{Code: CodeInternal, Message: internalMessage}
	}
	outcome := outcomeOK
	if e != nil {
		outcome = string(e.Code)
	}
	args := []any{"action", actionOf(cmd.Op), "principal", principal, "namespace", cmd.Namespace, "key", cmd.Key,
		"reason", cmd.Reason, "outcome", outcome}
	if e == nil && res.PreviousFencingToken != 0 {
		args = append(args, "previous_fencing_token", res.PreviousFencingToken)
	}
	forwarded := "false"
	if hops > 0 {
		args, forwarded = append(args, "hops", hops), "true"
	}
	s.log.InfoContext(ctx, "operator action", args...)
	s.operatorActions.WithLabelValues(actionOf(cmd.Op), outcome, forwarded).Inc()
	return res, leader, e
}

// listKeys answers one page of a listing for principal.
func (s *Server) listKeys(ctx context.Context, q backend.ListQuery, principal string) (backend.ListPage, *Error) {
	page, err := s.backend.List(ctx, q)
	outcome := outcomeOK
	var e *Error
	if err != nil {
		e = s.backendError(ctx, err, actionList, q.Namespace, "")
		outcome = string(e.Code)
	}
	s.log.InfoContext(ctx, "operator action", "action", actionList, "principal", principal, "namespace", q.Namespace,
		"state", stateName(q.State), "older_than", q.OlderThan, "limit", q.Limit, "keys", len(page.Keys), "outcome", outcome)
	s.operatorActions.WithLabelValues(actionList, outcome, "false").Inc()
	return page, e
}

func stateName(s fsm.State) string {
	if s == 0 {
		return "any"
	}
	return s.String()
}

// The JSON bodies of the operator actions.
type (
	listResponseJSON struct {
		Keys          []keyJSON `json:"keys"`
		NextPageToken string    `json:"next_page_token,omitempty"`
	}
	keyJSON struct {
		Key            string `json:"key"`
		State          string `json:"state"`
		FencingToken   string `json:"fencing_token"`
		CreatedAt      string `json:"created_at"`
		LeaseExpiresAt string `json:"lease_expires_at,omitempty"`
		CompletedAt    string `json:"completed_at,omitempty"`
		ExpiresAt      string `json:"expires_at,omitempty"`
	}
	forceReleaseJSON struct {
		PreviousFencingToken string `json:"previous_fencing_token"`
	}
)

func listJSON(page backend.ListPage) listResponseJSON {
	out := listResponseJSON{Keys: make([]keyJSON, 0, len(page.Keys)), NextPageToken: page.NextPageToken}
	for _, k := range page.Keys {
		j := keyJSON{Key: k.Key, State: k.Record.State.String(), FencingToken: formatToken(k.Record.FencingToken),
			CreatedAt: formatTime(k.Record.CreatedAt)}
		if k.Record.State == fsm.StateCompleted {
			j.CompletedAt, j.ExpiresAt = formatTime(k.Record.CompletedAt), formatTime(k.Record.ExpiresAt)
		} else {
			j.LeaseExpiresAt = formatTime(k.Record.LeaseExpiresAt)
		}
		out.Keys = append(out.Keys, j)
	}
	return out
}

// listQueryParams are the query parameters a listing accepts.
var listQueryParams = map[string]bool{"state": true, "older_than_s": true, "limit": true, "page_token": true}

// parseListParams reads a listing's query string; unknown or repeated
// parameters and non-integers are rejected, as unknown fields of a body are.
func parseListParams(namespace string, query url.Values) (listParams, *Error) {
	var p problems
	r := listParams{Namespace: namespace}
	for name, vals := range query {
		if !listQueryParams[name] {
			p.addf("unknown query parameter %q: use state, older_than_s, limit, page_token", truncate(name, 32))
		} else if len(vals) > 1 {
			p.addf("query parameter %q is given %d times: give it once", name, len(vals))
		}
	}
	integer := func(name string) int64 {
		v := query.Get(name)
		if v == "" {
			return 0
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			p.addf("%s %q is not an integer", name, truncate(v, 32))
		}
		return n
	}
	r.State = query.Get("state")
	r.OlderThanS = integer("older_than_s")
	r.Limit = integer("limit")
	r.PageToken = query.Get("page_token")
	return r, p.err()
}

func (h *httpAPI) serveList(w http.ResponseWriter, r *http.Request, rt route, fail func(*Error)) string {
	params, e := parseListParams(rt.namespace, r.URL.Query())
	var q backend.ListQuery
	if e == nil {
		q, e = h.s.validate.listQuery(params)
	}
	if e != nil {
		fail(e)
		return string(e.Code)
	}
	page, e := h.s.listKeys(r.Context(), q, principalOf(r.Context()))
	if e != nil {
		fail(e)
		return string(e.Code)
	}
	writeJSON(w, http.StatusOK, listJSON(page))
	return outcomeOK
}

// serveOperator answers a force-release or delete whose body is body.
func (h *httpAPI) serveOperator(w http.ResponseWriter, r *http.Request, rt route, op fsm.Op, body []byte, fail func(*Error)) string {
	params, e := decodeOperator(body)
	var cmd *fsm.Command
	if e == nil {
		params.Namespace, params.Key = rt.namespace, rt.key
		cmd, e = h.s.validate.operatorCommand(op, params)
	}
	if e != nil {
		fail(e)
		return string(e.Code)
	}
	res, _, e := h.s.operate(r.Context(), cmd, 0, principalOf(r.Context()))
	if e != nil {
		fail(e)
		return string(e.Code)
	}
	if op == fsm.OpForceRelease {
		writeJSON(w, http.StatusOK, forceReleaseJSON{PreviousFencingToken: formatToken(res.PreviousFencingToken)})
	} else {
		writeJSON(w, http.StatusOK, struct{}{})
	}
	return outcomeOK
}

// KeysAdmin is the operator part of the gRPC Admin service: ListKeys,
// ForceRelease and DeleteKey over the server's backend. It embeds
// UnimplementedAdminServer, so a router registers it as its whole Admin
// service; a node embeds it in its own, which adds the node's RPCs.
type KeysAdmin struct {
	idemv1.UnimplementedAdminServer
	s *Server
}

// KeysAdmin returns the server's operator RPCs.
func (s *Server) KeysAdmin() *KeysAdmin { return &KeysAdmin{s: s} }

// ListKeys implements idemv1.AdminServer.
func (a *KeysAdmin) ListKeys(ctx context.Context, req *idemv1.ListKeysRequest) (*idemv1.ListKeysResponse, error) {
	q, e := a.s.validate.listQuery(listParams{Namespace: req.GetNamespace(), State: stateParam(req.GetState()),
		OlderThanS: req.GetOlderThanS(), Limit: int64(req.GetLimit()), PageToken: req.GetPageToken()})
	if e != nil {
		return nil, e
	}
	page, e := a.s.listKeys(ctx, q, principalOf(ctx))
	if e != nil {
		return nil, e
	}
	return &idemv1.ListKeysResponse{Keys: wire.KeysToProto(page.Keys), NextPageToken: page.NextPageToken}, nil
}

func stateParam(s idemv1.State) string {
	if s == idemv1.State_STATE_UNSPECIFIED {
		return ""
	}
	if st := wire.StateFromProto(s); st != 0 {
		return st.String()
	}
	return s.String()
}

// ForceRelease implements idemv1.AdminServer.
func (a *KeysAdmin) ForceRelease(ctx context.Context, req *idemv1.ForceReleaseRequest) (*idemv1.ForceReleaseResponse, error) {
	res, e := a.operate(ctx, fsm.OpForceRelease, operatorParams{Namespace: req.GetNamespace(), Key: req.GetKey(), Reason: req.GetReason()})
	if e != nil {
		return nil, e
	}
	return &idemv1.ForceReleaseResponse{PreviousFencingToken: res.PreviousFencingToken}, nil
}

// DeleteKey implements idemv1.AdminServer.
func (a *KeysAdmin) DeleteKey(ctx context.Context, req *idemv1.DeleteKeyRequest) (*idemv1.DeleteKeyResponse, error) {
	if _, e := a.operate(ctx, fsm.OpDelete, operatorParams{Namespace: req.GetNamespace(), Key: req.GetKey(), Reason: req.GetReason()}); e != nil {
		return nil, e
	}
	return &idemv1.DeleteKeyResponse{}, nil
}

func (a *KeysAdmin) operate(ctx context.Context, op fsm.Op, params operatorParams) (fsm.Result, *Error) {
	cmd, e := a.s.validate.operatorCommand(op, params)
	if e != nil {
		return fsm.Result{}, e
	}
	res, leader, e := a.s.operate(ctx, cmd, incomingHops(ctx), principalOf(ctx))
	setLeaderHeader(ctx, leader)
	return res, e
}

// ShardQueryFromProto checks a ListShard request (sent by another node or
// a router) and returns its query.
func ShardQueryFromProto(req *idemv1.ListShardRequest) (backend.ShardQuery, error) {
	q, e := validator{}.listQuery(listParams{Namespace: req.GetNamespace(), State: stateParam(req.GetState()),
		OlderThanS: req.GetOlderThanS(), Limit: int64(req.GetLimit())})
	if e != nil {
		return backend.ShardQuery{}, e
	}
	if q.Limit == 0 {
		return backend.ShardQuery{}, errorf(CodeInvalidArgument, "limit is required")
	}
	return backend.ShardQuery{Namespace: q.Namespace, State: q.State, OlderThan: q.OlderThan, Limit: q.Limit, After: req.GetAfter()}, nil
}

// OperatorError is the gRPC error of a backend failure of an operator RPC
// that a node serves itself (ListShard).
func (s *Server) OperatorError(err error, what string) error {
	return s.backendError(context.Background(), err, what, "", "")
}
