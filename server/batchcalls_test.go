package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
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
	// Items run concurrently: of the two reserves of "a", one acquires.
	if !(outcomes[0] == "ACQUIRED" && outcomes[3] == "IN_PROGRESS" || outcomes[0] == "IN_PROGRESS" && outcomes[3] == "ACQUIRED") ||
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
	if owner.GetOutcome() != idemv1.Outcome_ACQUIRED {
		owner = rs[3].GetReserve()
	}
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
