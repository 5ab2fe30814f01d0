package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/client"
	"google.golang.org/grpc/status"
)

func newTarget(cfg benchConfig) (target, error) {
	body := make([]byte, cfg.BodyBytes)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	if cfg.Target == "grpc" {
		return newGRPCTarget(cfg, body)
	}
	return newJSONTarget(cfg, body), nil
}

// grpcTarget drives the gRPC API through package client.
type grpcTarget struct {
	c    *client.Client
	cfg  benchConfig
	resp client.Response
}

func newGRPCTarget(cfg benchConfig, body []byte) (*grpcTarget, error) {
	ccfg := client.DefaultConfig(cfg.Addrs...)
	ccfg.MaxAttempts = cfg.MaxAttempts
	ccfg.RequestTimeout = cfg.RequestTimeout
	ccfg.TLS = cfg.TLS
	c, err := client.New(ccfg)
	if err != nil {
		return nil, err
	}
	return &grpcTarget{c: c, cfg: cfg, resp: client.Response{Status: 200, Headers: map[string]string{"Content-Type": "application/octet-stream"}, Body: body}}, nil
}

func (g *grpcTarget) reserve(ctx context.Context, key string) (string, error) {
	res, err := g.c.Reserve(ctx, client.ReserveRequest{Namespace: g.cfg.Namespace, Key: key, Lease: g.cfg.Lease})
	if err != nil {
		return "", &stepError{kind: grpcKind(err), err: err}
	}
	if res.Outcome != client.OutcomeAcquired {
		return "", &stepError{kind: "outcome_" + strings.ToLower(res.Outcome.String()), err: fmt.Errorf("a fresh key answered %v, not ACQUIRED", res.Outcome)}
	}
	return res.OwnerToken, nil
}

func (g *grpcTarget) complete(ctx context.Context, key, owner string) error {
	_, err := g.c.Complete(ctx, client.CompleteRequest{Namespace: g.cfg.Namespace, Key: key, OwnerToken: owner, Response: g.resp})
	if err != nil {
		return &stepError{kind: grpcKind(err), err: err}
	}
	return nil
}

func (g *grpcTarget) Close() error { return g.c.Close() }

func grpcKind(err error) string {
	switch {
	case errors.Is(err, client.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, client.ErrNotOwner):
		return "not_owner"
	case errors.Is(err, client.ErrInvalidArgument):
		return "invalid_argument"
	case errors.Is(err, client.ErrPayloadTooLarge):
		return "payload_too_large"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	return strings.ToLower(status.Code(err).String())
}

// jsonTarget drives the JSON API over HTTP/1.1 keep-alive connections.
type jsonTarget struct {
	hc   *http.Client
	tr   *http.Transport
	cfg  benchConfig
	next atomic.Uint64
	// completeTail is the encoded response every complete stores, after the
	// owner token.
	completeTail []byte
	// given is the set of --addr; leaders holds the Idem-Leader of each
	// key's reserve answer, when it is one of them, until its complete.
	given   map[string]bool
	leaders sync.Map // key -> address
}

func newJSONTarget(cfg benchConfig, body []byte) *jsonTarget {
	tr := &http.Transport{
		Proxy:               nil, // load goes straight to the addresses given
		DialContext:         (&net.Dialer{Timeout: cfg.RequestTimeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        cfg.Concurrency * len(cfg.Addrs),
		MaxIdleConnsPerHost: cfg.Concurrency,
		IdleConnTimeout:     0,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
		TLSClientConfig:     cfg.TLS,
	}
	resp, _ := json.Marshal(struct {
		Status  int               `json:"status"`
		Headers map[string]string `json:"headers"`
		Body    string            `json:"body"`
	}{200, map[string]string{"Content-Type": "application/octet-stream"}, base64.StdEncoding.EncodeToString(body)})
	given := map[string]bool{}
	for _, a := range cfg.Addrs {
		given[a] = true
	}
	return &jsonTarget{
		hc:           &http.Client{Transport: tr, Timeout: cfg.RequestTimeout},
		tr:           tr,
		cfg:          cfg,
		completeTail: append(append([]byte(`,"response":`), resp...), '}'),
		given:        given,
	}
}

// url is a key's call to addr, or to the next address round-robin when
// addr is "".
func (j *jsonTarget) url(addr, key, verb string) string {
	if addr == "" {
		addr = j.cfg.Addrs[int(j.next.Add(1)%uint64(len(j.cfg.Addrs)))]
	}
	scheme := "http://"
	if j.cfg.TLS != nil {
		scheme = "https://"
	}
	return scheme + addr + "/v1/namespaces/" + url.PathEscape(j.cfg.Namespace) + "/keys/" + url.PathEscape(key) + ":" + verb
}

func (j *jsonTarget) reserve(ctx context.Context, key string) (string, error) {
	body := []byte(`{}`)
	if j.cfg.Lease > 0 {
		body = fmt.Appendf(nil, `{"lease_ms":%d}`, j.cfg.Lease.Milliseconds())
	}
	var out struct {
		Outcome    string `json:"outcome"`
		OwnerToken string `json:"owner_token"`
	}
	leader, err := j.post(ctx, j.url("", key, "reserve"), body, &out)
	if err != nil {
		return "", err
	}
	if out.Outcome != "ACQUIRED" {
		return "", &stepError{kind: "outcome_" + strings.ToLower(out.Outcome), err: fmt.Errorf("a fresh key answered %q, not ACQUIRED", out.Outcome)}
	}
	if out.OwnerToken == "" {
		return "", &stepError{kind: "bad_answer", err: errors.New("ACQUIRED without an owner_token")}
	}
	if j.given[leader] {
		j.leaders.Store(key, leader) // the complete that follows goes there
	}
	return out.OwnerToken, nil
}

func (j *jsonTarget) complete(ctx context.Context, key, owner string) error {
	tok, _ := json.Marshal(owner)
	body := make([]byte, 0, len(`{"owner_token":`)+len(tok)+len(j.completeTail))
	body = append(append(append(body, `{"owner_token":`...), tok...), j.completeTail...)
	addr := ""
	if v, ok := j.leaders.LoadAndDelete(key); ok {
		addr = v.(string)
	}
	_, err := j.post(ctx, j.url(addr, key, "complete"), body, nil)
	return err
}

// post sends body and decodes a 200 answer into out; anything else becomes a
// stepError named after the API's error code. leader is the answer's
// Idem-Leader header.
func (j *jsonTarget) post(ctx context.Context, url string, body []byte, out any) (leader string, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return "", &stepError{kind: "request", err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := j.hc.Do(req)
	if err != nil {
		kind := "transport"
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			kind = "timeout"
		}
		return "", &stepError{kind: kind, err: err}
	}
	// Read to the end so the connection goes back to the pool.
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return "", &stepError{kind: "transport", err: err}
	}
	if resp.StatusCode != http.StatusOK {
		var apiErr struct {
			Error struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(data, &apiErr) == nil && apiErr.Error.Code != "" {
			return "", &stepError{kind: strings.ToLower(apiErr.Error.Code), err: fmt.Errorf("HTTP %d %s: %s", resp.StatusCode, apiErr.Error.Code, apiErr.Error.Message)}
		}
		return "", &stepError{kind: fmt.Sprintf("http_%d", resp.StatusCode), err: fmt.Errorf("HTTP %d: %.200s", resp.StatusCode, data)}
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return "", &stepError{kind: "bad_answer", err: fmt.Errorf("decoding the answer: %w", err)}
		}
	}
	return resp.Header.Get("Idem-Leader"), nil
}

func (j *jsonTarget) Close() error {
	j.tr.CloseIdleConnections()
	return nil
}
