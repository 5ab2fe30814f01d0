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
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/client"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// target is one system under load; its methods are called concurrently.
type target interface {
	// reserve claims a fresh key for owner: won is false when someone else
	// holds it (a decided answer, not an error).
	reserve(ctx context.Context, key, owner string) (won bool, err error)
	// complete stores the response if owner still holds key in progress:
	// ok is false when it does not (refused, not an error).
	complete(ctx context.Context, key, owner string) (ok bool, err error)
	close()
}

// Lease and retention every system is given, so they keep the same state:
// a reservation expires after leaseTTL, a completed record after retention.
const (
	leaseTTL  = 30 * time.Second
	retention = time.Hour
	namespace = "bench"
)

func responseBody(n int) []byte {
	body := make([]byte, n)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	return body
}

// --- idem over gRPC, with its Go client ---

type idemGRPC struct {
	c    *client.Client
	resp client.Response
}

func newIdemGRPC(addrs []string, body []byte, timeout time.Duration) (*idemGRPC, error) {
	cfg := client.DefaultConfig(addrs...)
	cfg.MaxAttempts = 1 // every failure is seen, as with the peers' clients
	cfg.RequestTimeout = timeout
	c, err := client.New(cfg)
	if err != nil {
		return nil, err
	}
	return &idemGRPC{c: c, resp: client.Response{Status: 200, Headers: map[string]string{"Content-Type": "application/octet-stream"}, Body: body}}, nil
}

func (g *idemGRPC) reserve(ctx context.Context, key, owner string) (bool, error) {
	res, err := g.c.Reserve(ctx, client.ReserveRequest{Namespace: namespace, Key: key, OwnerToken: owner, Lease: leaseTTL})
	if err != nil {
		return false, err
	}
	return res.Outcome == client.OutcomeAcquired, nil
}

func (g *idemGRPC) complete(ctx context.Context, key, owner string) (bool, error) {
	_, err := g.c.Complete(ctx, client.CompleteRequest{Namespace: namespace, Key: key, OwnerToken: owner, Response: g.resp, Retention: retention})
	if errors.Is(err, client.ErrNotOwner) {
		return false, nil
	}
	return err == nil, err
}

// close prints how the client coalesced its calls (client.Stats), then
// closes it.
func (g *idemGRPC) close() {
	if s := g.c.Stats(); s.BatchRPCs > 0 {
		fmt.Fprintf(os.Stderr, "idem client: %d calls answered by %d Batch RPCs (%.1f per RPC), %d sent alone after all\n",
			s.BatchedCalls, s.BatchRPCs, float64(s.BatchedCalls)/float64(s.BatchRPCs), s.BatchFallbacks)
	}
	g.c.Close()
}

// --- idem's JSON API over HTTP/1.1 keep-alive ---

type idemJSON struct {
	hc    *http.Client
	tr    *http.Transport
	addrs []string
	next  atomic.Uint64
	resp  json.RawMessage
	// leaders holds, with followLeader, the Idem-Leader header of each
	// key's reserve answer until its complete is sent there.
	followLeader bool
	leaders      sync.Map // key -> JSON address
}

func newIdemJSON(addrs []string, body []byte, maxConns int, timeout time.Duration, followLeader bool) *idemJSON {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        maxConns * len(addrs),
		MaxIdleConnsPerHost: maxConns,
		DisableCompression:  true,
	}
	resp, _ := json.Marshal(map[string]any{"status": 200, "headers": map[string]string{"Content-Type": "application/octet-stream"}, "body": base64.StdEncoding.EncodeToString(body)})
	return &idemJSON{hc: &http.Client{Transport: tr, Timeout: timeout}, tr: tr, addrs: addrs, resp: resp, followLeader: followLeader}
}

// url is a key's call to addr, or to the next node round-robin when addr
// is "".
func (j *idemJSON) url(addr, key, verb string) string {
	if addr == "" {
		addr = j.addrs[j.next.Add(1)%uint64(len(j.addrs))]
	}
	return "http://" + addr + "/v1/namespaces/" + namespace + "/keys/" + url.PathEscape(key) + ":" + verb
}

func (j *idemJSON) reserve(ctx context.Context, key, owner string) (bool, error) {
	body, _ := json.Marshal(map[string]any{"owner_token": owner, "lease_ms": leaseTTL.Milliseconds()})
	var out struct {
		Outcome string `json:"outcome"`
	}
	status, leader, err := j.post(ctx, j.url("", key, "reserve"), body, &out)
	if err != nil {
		return false, err
	}
	if status != http.StatusOK {
		return false, fmt.Errorf("reserve: HTTP %d", status)
	}
	if j.followLeader && leader != "" {
		j.leaders.Store(key, leader)
	}
	return out.Outcome == "ACQUIRED", nil
}

func (j *idemJSON) complete(ctx context.Context, key, owner string) (bool, error) {
	body, _ := json.Marshal(map[string]any{"owner_token": owner, "response": j.resp, "retention_s": int(retention.Seconds())})
	addr := ""
	if v, ok := j.leaders.LoadAndDelete(key); ok {
		addr = v.(string)
	}
	status, _, err := j.post(ctx, j.url(addr, key, "complete"), body, nil)
	switch {
	case err != nil:
		return false, err
	case status == http.StatusConflict: // NOT_OWNER
		return false, nil
	case status != http.StatusOK:
		return false, fmt.Errorf("complete: HTTP %d", status)
	}
	return true, nil
}

// post sends body and decodes a 200 answer into out; an error answer is
// returned as its status (with the body in the error when it is not a 409).
// leader is the answer's Idem-Leader header.
func (j *idemJSON) post(ctx context.Context, u string, body []byte, out any) (status int, leader string, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := j.hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	data, err := io.ReadAll(resp.Body) // to the end, so the connection is reused
	resp.Body.Close()
	if err != nil {
		return 0, "", err
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusConflict {
		return resp.StatusCode, "", fmt.Errorf("HTTP %d: %.200s", resp.StatusCode, data)
	}
	if out != nil && resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(data, out); err != nil {
			return 0, "", fmt.Errorf("decoding the answer: %w", err)
		}
	}
	return resp.StatusCode, resp.Header.Get("Idem-Leader"), nil
}

func (j *idemJSON) close() { j.tr.CloseIdleConnections() }

// --- Redis: two Lua scripts ---

// reserveScript creates a PROCESSING record for the caller's owner id only
// if the key is absent, with the lease as its TTL.
var reserveScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'status', 'PROCESSING', 'owner', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1`)

// completeScript stores the response only if that owner still holds the key
// in PROCESSING, and keeps the record for the retention.
var completeScript = redis.NewScript(`
local rec = redis.call('HMGET', KEYS[1], 'status', 'owner')
if rec[1] ~= 'PROCESSING' or rec[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'status', 'COMPLETED', 'response', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1`)

type redisTarget struct {
	rdb  *redis.Client
	body []byte
	// replicas > 0: every script is followed, in the same pipeline on the
	// same connection, by WAIT replicas waitTimeout, and a cycle whose
	// write fewer replicas acknowledged fails.
	replicas    int
	waitTimeout time.Duration
}

func newRedis(addr string, body []byte, maxConns int, timeout time.Duration) *redisTarget {
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: maxConns, MinIdleConns: min(maxConns, 16), ReadTimeout: timeout, WriteTimeout: timeout, Protocol: 2})
	return &redisTarget{rdb: rdb, body: body}
}

// newRedisWait is newRedis for a primary with replicas: WAIT's timeout is
// half the request's, so its answer arrives before the read deadline.
func newRedisWait(addr string, body []byte, maxConns int, timeout time.Duration, replicas int) *redisTarget {
	r := newRedis(addr, body, maxConns, timeout)
	r.replicas, r.waitTimeout = replicas, timeout/2
	return r
}

// loadScripts caches both scripts on the server, so that the pipelined
// EVALSHA of a WAIT target finds them (replicas get the scripts' effects,
// they need no copy).
func (r *redisTarget) loadScripts(ctx context.Context) error {
	for _, s := range []*redis.Script{reserveScript, completeScript} {
		if err := s.Load(ctx, r.rdb).Err(); err != nil {
			return err
		}
	}
	return nil
}

func (r *redisTarget) run(ctx context.Context, s *redis.Script, key string, args ...any) (int, error) {
	if r.replicas == 0 {
		return s.Run(ctx, r.rdb, []string{key}, args...).Int()
	}
	var ev *redis.Cmd
	var wait *redis.Cmd
	if _, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		ev = s.EvalSha(ctx, p, []string{key}, args...)
		wait = p.Do(ctx, "WAIT", r.replicas, r.waitTimeout.Milliseconds())
		return nil
	}); err != nil {
		return 0, err
	}
	n, err := ev.Int()
	if err != nil {
		return 0, err
	}
	acked, err := wait.Int64()
	if err != nil {
		return 0, err
	}
	return n, waitAcked(acked, r.replicas)
}

// waitAcked turns WAIT's answer (how many replicas acknowledged the
// connection's writes) into an error when fewer than want did.
func waitAcked(acked int64, want int) error {
	if acked < int64(want) {
		return fmt.Errorf("WAIT %d: only %d replicas acknowledged the write in time", want, acked)
	}
	return nil
}

func (r *redisTarget) reserve(ctx context.Context, key, owner string) (bool, error) {
	n, err := r.run(ctx, reserveScript, key, owner, leaseTTL.Milliseconds())
	return n == 1 && err == nil, err
}

func (r *redisTarget) complete(ctx context.Context, key, owner string) (bool, error) {
	n, err := r.run(ctx, completeScript, key, owner, r.body, retention.Milliseconds())
	return n == 1 && err == nil, err
}

func (r *redisTarget) close() { r.rdb.Close() }

// --- PostgreSQL: INSERT ... ON CONFLICT DO NOTHING, owner-checked UPDATE ---

const pgSchema = `CREATE TABLE IF NOT EXISTS idem (
	key text PRIMARY KEY,
	owner text NOT NULL,
	status text NOT NULL,
	lease_expires_at timestamptz NOT NULL,
	response bytea,
	expires_at timestamptz
)`

type pgTarget struct {
	pool *pgxpool.Pool
	body []byte
}

func newPostgres(ctx context.Context, dsn string, body []byte, maxConns int) (*pgTarget, error) {
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = int32(maxConns)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	return &pgTarget{pool: pool, body: body}, nil
}

func (p *pgTarget) reserve(ctx context.Context, key, owner string) (bool, error) {
	tag, err := p.pool.Exec(ctx, `INSERT INTO idem (key, owner, status, lease_expires_at) VALUES ($1, $2, 'in_progress', now() + $3 * interval '1 millisecond') ON CONFLICT DO NOTHING`,
		key, owner, leaseTTL.Milliseconds())
	return err == nil && tag.RowsAffected() == 1, err
}

func (p *pgTarget) complete(ctx context.Context, key, owner string) (bool, error) {
	tag, err := p.pool.Exec(ctx, `UPDATE idem SET status = 'completed', response = $3, expires_at = now() + $4 * interval '1 millisecond' WHERE key = $1 AND owner = $2 AND status = 'in_progress'`,
		key, owner, p.body, retention.Milliseconds())
	return err == nil && tag.RowsAffected() == 1, err
}

func (p *pgTarget) close() { p.pool.Close() }

// --- etcd: create-if-absent and compare-and-swap transactions ---

type etcdTarget struct {
	cli  *clientv3.Client
	body []byte
}

func newEtcd(endpoints []string, body []byte, timeout time.Duration) (*etcdTarget, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: timeout, Logger: nopZap()})
	if err != nil {
		return nil, err
	}
	return &etcdTarget{cli: cli, body: body}, nil
}

// etcdProcessing is the in-progress record of owner: complete compares the
// stored value with it, so it swaps only if owner still holds the key.
func etcdProcessing(owner string) string { return `{"status":"PROCESSING","owner":"` + owner + `"}` }

func (e *etcdTarget) reserve(ctx context.Context, key, owner string) (bool, error) {
	k := namespace + "/" + key
	resp, err := e.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).Then(clientv3.OpPut(k, etcdProcessing(owner))).Commit()
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

func (e *etcdTarget) complete(ctx context.Context, key, owner string) (bool, error) {
	k := namespace + "/" + key
	done := `{"status":"COMPLETED","owner":"` + owner + `","response":"` + base64.StdEncoding.EncodeToString(e.body) + `"}`
	resp, err := e.cli.Txn(ctx).If(clientv3.Compare(clientv3.Value(k), "=", etcdProcessing(owner))).Then(clientv3.OpPut(k, done)).Commit()
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

func (e *etcdTarget) close() { e.cli.Close() }
