package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// API is a small JSON API client for tests: it returns the raw status and
// decoded body so tests can assert exactly what a user sees.
type API struct {
	Base   string // "http://127.0.0.1:8080"
	Client *http.Client
	// Token, when set, is sent as Authorization: Bearer TOKEN.
	Token string
	// RetryUnavailable, when positive, makes Do send a request again while
	// the answer is 503 UNAVAILABLE, for at most this long: what the contract
	// tells clients to do (with the same owner token, which tests fix), for
	// tests whose subject is not the 503 itself (a cluster that just started
	// or restarted hands leadership around). Zero returns every answer.
	RetryUnavailable time.Duration
}

// NewAPI returns an API client for the JSON API at addr (HOST:PORT).
func NewAPI(addr string) *API {
	return &API{Base: "http://" + addr, Client: &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
}

// Reply is one answer of the JSON API.
type Reply struct {
	Status int
	Header http.Header
	Body   map[string]any
	Raw    []byte
}

// Str returns the string field name of the body ("" if absent).
func (r Reply) Str(name string) string { s, _ := r.Body[name].(string); return s }

// ErrCode returns error.code of an error body.
func (r Reply) ErrCode() string {
	e, _ := r.Body["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

func (r Reply) String() string { return fmt.Sprintf("%d %s", r.Status, bytes.TrimSpace(r.Raw)) }

// KeyPath returns the API path of a key, percent-encoding the key.
func KeyPath(namespace, key string) string {
	return "/v1/namespaces/" + url.PathEscape(namespace) + "/keys/" + url.PathEscape(key)
}

// Do sends method path with body (a string sent as is, or a value encoded as
// JSON; nil sends nothing), again while the answer is 503 if
// RetryUnavailable says so.
func (a *API) Do(ctx context.Context, method, path string, body any) (Reply, error) {
	var data []byte
	switch b := body.(type) {
	case nil:
	case string:
		data = []byte(b)
	case []byte:
		data = b
	default:
		var err error
		if data, err = json.Marshal(b); err != nil {
			return Reply{}, err
		}
	}
	deadline := time.Now().Add(a.RetryUnavailable)
	for {
		r, err := a.do(ctx, method, path, body != nil, data)
		if err != nil || r.Status != http.StatusServiceUnavailable || !time.Now().Before(deadline) || ctx.Err() != nil {
			return r, err
		}
		time.Sleep(50 * time.Millisecond) // backoff between retries, as a client would
	}
}

func (a *API) do(ctx context.Context, method, path string, hasBody bool, data []byte) (Reply, error) {
	var rd io.Reader
	if hasBody {
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.Base+path, rd)
	if err != nil {
		return Reply{}, err
	}
	// Keep the caller's percent-encoding exactly as written.
	req.URL.RawPath = path
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if a.Token != "" {
		req.Header.Set("Authorization", "Bearer "+a.Token)
	}
	resp, err := a.Client.Do(req)
	if err != nil {
		return Reply{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return Reply{}, err
	}
	r := Reply{Status: resp.StatusCode, Header: resp.Header, Raw: raw}
	if len(raw) > 0 {
		_ = json.Unmarshal(raw, &r.Body)
	}
	return r, nil
}

// Reserve posts :reserve for (namespace, key) with body.
func (a *API) Reserve(ctx context.Context, namespace, key string, body any) (Reply, error) {
	return a.Do(ctx, http.MethodPost, KeyPath(namespace, key)+":reserve", body)
}

// Complete posts :complete.
func (a *API) Complete(ctx context.Context, namespace, key string, body any) (Reply, error) {
	return a.Do(ctx, http.MethodPost, KeyPath(namespace, key)+":complete", body)
}

// Heartbeat posts :heartbeat.
func (a *API) Heartbeat(ctx context.Context, namespace, key string, body any) (Reply, error) {
	return a.Do(ctx, http.MethodPost, KeyPath(namespace, key)+":heartbeat", body)
}

// Release posts :release.
func (a *API) Release(ctx context.Context, namespace, key string, body any) (Reply, error) {
	return a.Do(ctx, http.MethodPost, KeyPath(namespace, key)+":release", body)
}

// Get reads a key.
func (a *API) Get(ctx context.Context, namespace, key string) (Reply, error) {
	return a.Do(ctx, http.MethodGet, KeyPath(namespace, key), nil)
}

// Decided repeats call while it answers 503 UNAVAILABLE, until ctx ends,
// and returns the last answer. Under load a shard may not decide in time
// (an election, an outcome unknown); the contract's answer is to retry with
// the same owner token, which gives the same owner ACQUIRED again (or
// COMPLETED), never a second owner.
func Decided(ctx context.Context, call func() (Reply, error)) (Reply, error) {
	for {
		r, err := call()
		if err != nil || r.Status != http.StatusServiceUnavailable {
			return r, err
		}
		select {
		case <-ctx.Done():
			return r, err
		case <-time.After(50 * time.Millisecond):
		}
	}
}
