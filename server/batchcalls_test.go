package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/fsm"
)

// A batch answers each item exactly as its single call would, in item order,
// and a bad item fails only itself.
func TestBatchReserveCompleteJSON(t *testing.T) {
	h := newHarness(t, newMemBackend(newFakeClock()), nil)
	single := h.do(http.MethodPost, "/v1/namespaces/ns/keys/taken:reserve", `{"fingerprint":"f"}`)
	if single.status != http.StatusOK {
		t.Fatalf("reserve: %v", single)
	}
	body := `{"items":[{"key":"a","fingerprint":"f","owner_token":"owner-aaaaaaaaaaaa"},{"key":""},{"key":"taken","fingerprint":"g"},{"key":"b","lease_ms":5},{"key":"taken","fingerprint":"f"},7,{"key":"c","bogus":1}]}`
	r := h.do(http.MethodPost, "/v1/namespaces/ns/keys:batch-reserve", body)
	if r.status != http.StatusOK {
		t.Fatalf("batch-reserve: %v", r)
	}
	var out struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal(r.raw, &out); err != nil || len(out.Results) != 7 {
		t.Fatalf("batch-reserve answer %s (%v)", r.raw, err)
	}
	want := []string{"ACQUIRED", "INVALID_ARGUMENT", "FINGERPRINT_MISMATCH", "INVALID_ARGUMENT", "IN_PROGRESS", "INVALID_ARGUMENT", "INVALID_ARGUMENT"}
	for i, res := range out.Results {
		got, _ := res["outcome"].(string)
		if e, ok := res["error"].(map[string]any); ok {
			got, _ = e["code"].(string)
		}
		if got != want[i] {
			t.Errorf("item %d: %s, want %s (%v)", i, got, want[i], res)
		}
	}
	if out.Results[0]["owner_token"] != "owner-aaaaaaaaaaaa" || out.Results[0]["fencing_token"] == "" {
		t.Errorf("item 0 lacks its tokens: %v", out.Results[0])
	}
	// The single call answers the same for the item that would conflict.
	if again := h.do(http.MethodPost, "/v1/namespaces/ns/keys/taken:reserve", `{"fingerprint":"g"}`); again.body["outcome"] != "FINGERPRINT_MISMATCH" {
		t.Errorf("single reserve differs from the batch's item: %v", again)
	}

	c := h.do(http.MethodPost, "/v1/namespaces/ns/keys:batch-complete",
		`{"items":[{"key":"a","owner_token":"owner-aaaaaaaaaaaa","response":{"status":201,"headers":{"x":"y"},"body":"aGk="}},{"key":"a","owner_token":"owner-bbbbbbbbbbbb","response":{"status":200}}]}`)
	if c.status != http.StatusOK {
		t.Fatalf("batch-complete: %v", c)
	}
	var cout struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal(c.raw, &cout); err != nil || len(cout.Results) != 2 {
		t.Fatalf("batch-complete answer %s (%v)", c.raw, err)
	}
	if cout.Results[0]["completed_at"] == nil || cout.Results[0]["expires_at"] == nil {
		t.Errorf("complete item 0: %v", cout.Results[0])
	}
	if e, _ := cout.Results[1]["error"].(map[string]any); e["code"] != "NOT_OWNER" {
		t.Errorf("complete item 1: %v, want NOT_OWNER", cout.Results[1])
	}
	if g := h.do(http.MethodGet, "/v1/namespaces/ns/keys/a", ""); g.body["state"] != "COMPLETED" {
		t.Errorf("a after batch-complete: %v", g)
	}
}

func TestBatchMalformedJSON(t *testing.T) {
	h := newHarness(t, newMemBackend(newFakeClock()), nil)
	items := make([]string, MaxBatchItems+1)
	for i := range items {
		items[i] = fmt.Sprintf(`{"key":"k%d"}`, i)
	}
	for name, body := range map[string]string{
		"empty list":    `{"items":[]}`,
		"no items":      `{}`,
		"empty body":    ``,
		"not json":      `{"items":`,
		"not a list":    `{"items":{"key":"a"}}`,
		"unknown field": `{"items":[{"key":"a"}],"x":1}`,
		"too many":      `{"items":[` + strings.Join(items, ",") + `]}`,
	} {
		for _, verb := range []string{"batch-reserve", "batch-complete"} {
			r := h.do(http.MethodPost, "/v1/namespaces/ns/keys:"+verb, body)
			if r.status != http.StatusBadRequest || r.errCode() != "INVALID_ARGUMENT" {
				t.Errorf("%s %s: %d %s, want 400 INVALID_ARGUMENT", verb, name, r.status, r.raw)
			}
		}
	}
	// Exactly the maximum is one call.
	if r := h.do(http.MethodPost, "/v1/namespaces/ns/keys:batch-reserve", `{"items":[`+strings.Join(items[:MaxBatchItems], ",")+`]}`); r.status != http.StatusOK ||
		len(r.body["results"].([]any)) != MaxBatchItems {
		t.Errorf("batch-reserve of %d items: %d", MaxBatchItems, r.status)
	}
	if r := h.do(http.MethodPost, "/v1/namespaces/ns/keys:batch-nothing", `{"items":[{"key":"a"}]}`); r.status != http.StatusNotFound {
		t.Errorf("unknown batch verb: %v", r)
	}
	if r := h.do(http.MethodGet, "/v1/namespaces/ns/keys:batch-reserve", ""); r.status != http.StatusMethodNotAllowed {
		t.Errorf("GET of a batch call: %v", r)
	}
	if r := h.do(http.MethodPost, "/v1/namespaces/NS!/keys:batch-reserve", `{"items":[{"key":"a"}]}`); r.status != http.StatusBadRequest {
		t.Errorf("bad namespace: %v", r)
	}
	h.expectServing()
}

func TestBatchReserveCompleteGRPC(t *testing.T) {
	h := newHarness(t, newMemBackend(newFakeClock()), nil)
	ctx := t.Context()
	res, err := h.grpc.BatchReserve(ctx, &idemv1.BatchReserveRequest{Namespace: "ns", Items: []*idemv1.ReserveRequest{
		{Key: "a"}, {Key: ""}, {Key: "b", Namespace: "other"}, {Key: "a"}, {Key: "c", WaitMs: 100},
	}})
	if err != nil {
		t.Fatal(err)
	}
	rs := res.GetResults()
	if len(rs) != 5 {
		t.Fatalf("%d results", len(rs))
	}
	outcomes := []string{}
	for _, r := range rs {
		if e := r.GetError(); e != nil {
			code, _, _ := idemv1.StatusToError(idemv1.BatchErrorStatus(e))
			outcomes = append(outcomes, string(code))
		} else {
			outcomes = append(outcomes, r.GetReserve().GetOutcome().String())
		}
	}
	// The two reserves of "a" run in item order: the first acquires.
	if outcomes[0] != "ACQUIRED" || outcomes[3] != "IN_PROGRESS" ||
		outcomes[1] != "INVALID_ARGUMENT" || outcomes[2] != "INVALID_ARGUMENT" || outcomes[4] != "INVALID_ARGUMENT" {
		t.Fatalf("outcomes %v", outcomes)
	}
	// An item that asks to wait is refused, not run without its wait: the
	// key stays free.
	if msg := rs[4].GetError().GetMessage(); !strings.Contains(msg, "wait_ms") {
		t.Errorf("wait_ms item's error %q does not name the field", msg)
	}
	if r, err := h.grpc.Get(ctx, &idemv1.GetRequest{Namespace: "ns", Key: "c"}); err == nil {
		t.Errorf("the refused item reserved its key: %v", r)
	}
	owner := rs[0].GetReserve()
	cres, err := h.grpc.BatchComplete(ctx, &idemv1.BatchCompleteRequest{Namespace: "ns", Items: []*idemv1.CompleteRequest{
		{Key: "a", OwnerToken: owner.GetOwnerToken(), Response: &idemv1.StoredResponse{Status: 200}},
		{Key: "b", OwnerToken: owner.GetOwnerToken(), Response: &idemv1.StoredResponse{Status: 200}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if cres.GetResults()[0].GetComplete() == nil || cres.GetResults()[1].GetError() == nil {
		t.Fatalf("complete results %v", cres.GetResults())
	}
	if _, err := h.grpc.BatchReserve(ctx, &idemv1.BatchReserveRequest{Namespace: "ns"}); err == nil {
		t.Fatal("an empty BatchReserve succeeded")
	}
}

// overlapBackend holds every Apply for a moment, long enough for a concurrent
// call to arrive, and records how many Applies were in flight at once: of
// one key, and in all.
type overlapBackend struct {
	*backend.Mem
	mu       sync.Mutex
	inFlight map[string]int
	all      int
	mostKey  int
	mostAll  int
}

func (b *overlapBackend) Apply(ctx context.Context, cmd *fsm.Command) (fsm.Result, error) {
	k := cmd.Namespace + "/" + cmd.Key
	b.mu.Lock()
	b.inFlight[k]++
	b.all++
	b.mostKey, b.mostAll = max(b.mostKey, b.inFlight[k]), max(b.mostAll, b.all)
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.inFlight[k]--
		b.all--
		b.mu.Unlock()
	}()
	time.Sleep(2 * time.Millisecond)
	return b.Mem.Apply(ctx, cmd)
}

// A batch that names a key more than once is answered as the single calls
// sent one after the other in item order would be (the first reserve
// acquires, the first complete decides the stored response), while items
// of different keys still run concurrently.
func TestBatchAppliesItemsOfOneKeyInItemOrder(t *testing.T) {
	b := &overlapBackend{Mem: newMemBackend(newFakeClock()), inFlight: map[string]int{}}
	h := newHarness(t, b, nil)
	const keys = 8
	ownerA, ownerB := "owner-aaaaaaaaaaaa", "owner-bbbbbbbbbbbb"
	// Interleaved: every key's first reserve (owner A), then every key's
	// second (owner B), then A's again.
	var items []string
	for _, owner := range []string{ownerA, ownerB, ownerA} {
		for k := range keys {
			items = append(items, fmt.Sprintf(`{"key":"k%d","owner_token":%q}`, k, owner))
		}
	}
	var out struct {
		Results []map[string]any `json:"results"`
	}
	r := h.do(http.MethodPost, "/v1/namespaces/ns/keys:batch-reserve", `{"items":[`+strings.Join(items, ",")+`]}`)
	if err := json.Unmarshal(r.raw, &out); r.status != http.StatusOK || err != nil || len(out.Results) != 3*keys {
		t.Fatalf("batch-reserve: %d %s (%v)", r.status, r.raw, err)
	}
	for k := range keys {
		first, second, third := out.Results[k], out.Results[keys+k], out.Results[2*keys+k]
		if first["outcome"] != "ACQUIRED" || first["owner_token"] != ownerA || second["outcome"] != "IN_PROGRESS" ||
			third["outcome"] != "ACQUIRED" || third["fencing_token"] != first["fencing_token"] {
			t.Errorf("k%d: %v, %v, %v; want ACQUIRED by A, IN_PROGRESS, ACQUIRED again with A's fencing token", k, first, second, third)
		}
	}

	// Completes of one key: the first decides; a different response is
	// NOT_OWNER; the first's repeat replays its answer.
	items = items[:0]
	for _, status := range []int{201, 200, 201} {
		for k := range keys {
			items = append(items, fmt.Sprintf(`{"key":"k%d","owner_token":%q,"response":{"status":%d}}`, k, ownerA, status))
		}
	}
	r = h.do(http.MethodPost, "/v1/namespaces/ns/keys:batch-complete", `{"items":[`+strings.Join(items, ",")+`]}`)
	if err := json.Unmarshal(r.raw, &out); r.status != http.StatusOK || err != nil || len(out.Results) != 3*keys {
		t.Fatalf("batch-complete: %d %s (%v)", r.status, r.raw, err)
	}
	for k := range keys {
		first, second, third := out.Results[k], out.Results[keys+k], out.Results[2*keys+k]
		e, _ := second["error"].(map[string]any)
		if first["completed_at"] == nil || e["code"] != "NOT_OWNER" || third["completed_at"] != first["completed_at"] {
			t.Errorf("k%d: %v, %v, %v; want completed, NOT_OWNER, the same completion", k, first, second, third)
		}
		g := h.do(http.MethodGet, fmt.Sprintf("/v1/namespaces/ns/keys/k%d", k), "")
		if stored, _ := g.body["response"].(map[string]any); fmt.Sprint(stored["status"]) != "201" {
			t.Errorf("k%d: %s, want the first complete's 201 stored", k, g.raw)
		}
	}

	// The same over gRPC.
	var reqs []*idemv1.ReserveRequest
	for _, owner := range []string{ownerA, ownerB} {
		for k := range keys {
			reqs = append(reqs, &idemv1.ReserveRequest{Key: fmt.Sprintf("g%d", k), OwnerToken: owner})
		}
	}
	res, err := h.grpc.BatchReserve(t.Context(), &idemv1.BatchReserveRequest{Namespace: "ns", Items: reqs})
	if err != nil {
		t.Fatal(err)
	}
	for k := range keys {
		first, second := res.GetResults()[k].GetReserve(), res.GetResults()[keys+k].GetReserve()
		if first.GetOutcome() != idemv1.Outcome_ACQUIRED || first.GetOwnerToken() != ownerA || second.GetOutcome() != idemv1.Outcome_IN_PROGRESS {
			t.Errorf("g%d over gRPC: %v, %v; want ACQUIRED by A, then IN_PROGRESS", k, first, second)
		}
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mostKey != 1 {
		t.Errorf("%d items of one key were applied at once, want 1", b.mostKey)
	}
	if b.mostAll < 2 {
		t.Errorf("at most %d items were applied at once: items of different keys should run concurrently", b.mostAll)
	}
}
