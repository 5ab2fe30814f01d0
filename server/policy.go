package server

import (
	"context"
	"net/http"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/internal/wire"
)

// Namespace policies (API v1.2): PUT and GET /v1/namespaces/{ns}/policy, the
// Admin RPCs SetPolicy and GetPolicy. The backend stores them
// (backend.Policies): a node applies them to every shard group.

func (s *Server) policies() (backend.Policies, *Error) {
	if s.policyStore == nil {
		return nil, &Error{Code: CodeMethodNotAllowed, Message: "this process does not store namespace policies"}
	}
	return s.policyStore, nil
}

// setPolicy stores the policy of cmd for principal, logged and counted like
// the other operator actions.
func (s *Server) setPolicy(ctx context.Context, cmd *fsm.Command, principal string) (fsm.Policy, *Error) {
	ps, e := s.policies()
	if e != nil {
		return fsm.Policy{}, e
	}
	pol, err := ps.SetPolicy(ctx, cmd)
	outcome := outcomeOK
	if err != nil {
		e = s.backendError(ctx, err, cmd.Op.String(), cmd.Namespace, "")
		outcome = string(e.Code)
	}
	s.log.InfoContext(ctx, "operator action", "action", actionSetPolicy, "principal", principal, "namespace", cmd.Namespace,
		"policy", contract.EffectivePolicyOf(cmd.Policy.DefaultLease, cmd.Policy.MaxLease, cmd.Policy.DefaultRetention,
			cmd.Policy.MaxRetention, cmd.Policy.Tombstone, cmd.Policy.TombstoneSet), "outcome", outcome)
	s.operatorActions.WithLabelValues(actionSetPolicy, outcome, "false").Inc()
	return pol, e
}

func (s *Server) getPolicy(ctx context.Context, namespace string) (fsm.Policy, *Error) {
	ps, e := s.policies()
	if e != nil {
		return fsm.Policy{}, e
	}
	pol, _, err := ps.GetPolicy(ctx, namespace)
	if err != nil {
		return fsm.Policy{}, s.backendError(ctx, err, "get-policy", namespace, "")
	}
	return pol, nil
}

func effective(p fsm.Policy) contract.EffectivePolicy {
	return contract.EffectivePolicyOf(p.DefaultLease, p.MaxLease, p.DefaultRetention, p.MaxRetention, p.Tombstone, p.TombstoneSet)
}

func (h *httpAPI) serveGetPolicy(w http.ResponseWriter, r *http.Request, rt route, fail func(*Error)) string {
	var p problems
	checkNamespace(&p, rt.namespace)
	if e := p.err(); e != nil {
		fail(e)
		return string(e.Code)
	}
	pol, e := h.s.getPolicy(r.Context(), rt.namespace)
	if e != nil {
		fail(e)
		return string(e.Code)
	}
	writeJSON(w, http.StatusOK, effective(pol))
	return outcomeOK
}

func (h *httpAPI) serveSetPolicy(w http.ResponseWriter, r *http.Request, rt route, body []byte, fail func(*Error)) string {
	params, e := decodePolicy(body)
	var cmd *fsm.Command
	if e == nil {
		params.Namespace = rt.namespace
		cmd, e = h.s.validate.policyCommand(params)
	}
	if e != nil {
		fail(e)
		return string(e.Code)
	}
	pol, e := h.s.setPolicy(r.Context(), cmd, principalOf(r.Context()))
	if e != nil {
		fail(e)
		return string(e.Code)
	}
	writeJSON(w, http.StatusOK, effective(pol))
	return outcomeOK
}

// SetPolicy implements idemv1.AdminServer.
func (a *KeysAdmin) SetPolicy(ctx context.Context, req *idemv1.SetPolicyRequest) (*idemv1.SetPolicyResponse, error) {
	cmd, e := a.s.validate.policyCommand(policyParamsFromProto(req.GetNamespace(), req.GetPolicy()))
	if e != nil {
		return nil, e
	}
	pol, e := a.s.setPolicy(ctx, cmd, principalOf(ctx))
	if e != nil {
		return nil, e
	}
	return &idemv1.SetPolicyResponse{Policy: wire.PolicyToProto(pol)}, nil
}

// GetPolicy implements idemv1.AdminServer.
func (a *KeysAdmin) GetPolicy(ctx context.Context, req *idemv1.GetPolicyRequest) (*idemv1.GetPolicyResponse, error) {
	var p problems
	checkNamespace(&p, req.GetNamespace())
	if e := p.err(); e != nil {
		return nil, e
	}
	pol, e := a.s.getPolicy(ctx, req.GetNamespace())
	if e != nil {
		return nil, e
	}
	return &idemv1.GetPolicyResponse{Policy: wire.PolicyToProto(pol)}, nil
}

func policyParamsFromProto(ns string, p *idemv1.NamespacePolicy) policyParams {
	return policyParams{Namespace: ns, DefaultLeaseMs: p.DefaultLeaseMs, MaxLeaseMs: p.MaxLeaseMs,
		DefaultRetentionS: p.DefaultRetentionS, MaxRetentionS: p.MaxRetentionS, TombstoneS: p.TombstoneS}
}

// PolicyCommandFromProto checks a SetShardPolicy request (sent by another
// node or a router) and returns its command.
func (s *Server) PolicyCommandFromProto(req *idemv1.SetShardPolicyRequest) (*fsm.Command, error) {
	cmd, e := s.validate.policyCommand(policyParamsFromProto(req.GetNamespace(), req.GetPolicy()))
	if e != nil {
		return nil, e
	}
	return cmd, nil
}

// Checkpoint implements idemv1.IdempotencyServer (v1.2).
func (g *grpcService) Checkpoint(ctx context.Context, req *idemv1.CheckpointRequest) (_ *idemv1.CheckpointResponse, err error) {
	defer g.recoverRPC("Checkpoint", &err)
	cmd, e := g.s.validate.checkpointCommand(checkpointParams{
		Namespace:  req.GetNamespace(),
		Key:        req.GetKey(),
		OwnerToken: req.GetOwnerToken(),
		Name:       req.GetName(),
		Data:       req.GetData(),
	})
	if e != nil {
		return nil, e
	}
	res, e := g.apply(ctx, cmd)
	if e != nil {
		return nil, e
	}
	return &idemv1.CheckpointResponse{CheckpointedAt: idemv1.TimeToProto(res.Checkpoint.At)}, nil
}
