package server

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
)

func token(t *testing.T, r reply, field string) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(str(t, r.body, field), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v (%s)", field, err, r)
	}
	return n
}

func TestHTTPForceReleaseAndDelete(t *testing.T) {
	clock := newFakeClock()
	h := newHarness(t, newMemBackend(clock), nil)
	const key = "/v1/namespaces/pay/keys/order-1"

	h.expectError(h.do("POST", key+":force-release", `{"reason":"none"}`), 404, CodeNotFound)
	first := h.do("POST", key+":reserve", `{"owner_token":"owner-aaaaaaaaaaaaaaaa"}`)
	firstToken := token(t, first, "fencing_token")

	r := h.do("POST", key+":force-release", `{"reason":"worker died in incident 42"}`)
	if r.status != 200 || token(t, r, "previous_fencing_token") != firstToken {
		t.Fatalf("force-release: %d %s", r.status, r)
	}
	h.expectError(h.do("POST", key+":heartbeat", `{"owner_token":"owner-aaaaaaaaaaaaaaaa"}`), 409, CodeNotOwner)
	h.expectError(h.do("POST", key+":complete", `{"owner_token":"owner-aaaaaaaaaaaaaaaa","response":{"status":200}}`), 409, CodeNotOwner)

	re := h.do("POST", key+":reserve", `{"owner_token":"owner-bbbbbbbbbbbbbbbb"}`)
	if re.body["outcome"] != "RECLAIMED" || token(t, re, "previous_fencing_token") != firstToken || token(t, re, "fencing_token") <= firstToken {
		t.Fatalf("reserve after force-release: %s", re)
	}
	if r := h.do("POST", key+":complete", `{"owner_token":"owner-bbbbbbbbbbbbbbbb","response":{"status":201}}`); r.status != 200 {
		t.Fatalf("complete: %s", r)
	}
	h.expectError(h.do("POST", key+":force-release", `{"reason":"x"}`), 409, CodeFailedPrecondition)

	if r := h.do("DELETE", key, `{"reason":"customer asked for a rerun"}`); r.status != 200 || len(r.body) != 0 {
		t.Fatalf("delete: %d %s", r.status, r)
	}
	h.expectError(h.do("GET", key, ""), 404, CodeNotFound)
	h.expectError(h.do("DELETE", key, `{"reason":"again"}`), 404, CodeNotFound)
	again := h.do("POST", key+":reserve", "")
	if again.body["outcome"] != "ACQUIRED" || token(t, again, "fencing_token") <= token(t, re, "fencing_token") {
		t.Fatalf("reserve after delete: %s (reclaimed with %s)", again, re)
	}

	// Bad input: unknown field, a reason with control characters; the
	// server keeps serving.
	h.expectError(h.do("DELETE", key, `{"reason":"x","force":true}`), 400, CodeInvalidArgument)
	h.expectError(h.do("DELETE", key, `{"reason":"a\nb"}`), 400, CodeInvalidArgument)
	h.expectError(h.do("PUT", key, ""), 405, CodeMethodNotAllowed)
	h.expectServing()

	logs := h.logs.String()
	for _, want := range []string{
		`msg="operator action" action=force_release principal=root namespace=pay key=order-1 reason="worker died in incident 42" outcome=OK previous_fencing_token=`,
		`msg="operator action" action=delete principal=root namespace=pay key=order-1 reason="customer asked for a rerun" outcome=OK`,
		`action=force_release principal=root namespace=pay key=order-1 reason=x outcome=FAILED_PRECONDITION`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q", want)
		}
	}
	metrics := h.do("GET", "/metrics", "").String()
	for _, want := range []string{
		`idem_operator_actions_total{action="force_release",forwarded="false",outcome="OK"} 1`,
		`idem_operator_actions_total{action="force_release",forwarded="false",outcome="NOT_FOUND"} 1`,
		`idem_operator_actions_total{action="force_release",forwarded="false",outcome="FAILED_PRECONDITION"} 1`,
		`idem_operator_actions_total{action="delete",forwarded="false",outcome="OK"} 1`,
		`idem_operator_actions_total{action="delete",forwarded="false",outcome="NOT_FOUND"} 1`,
		`idem_operator_actions_total{action="delete",forwarded="false",outcome="INVALID_ARGUMENT"} 0`,
	} {
		if want == `idem_operator_actions_total{action="delete",forwarded="false",outcome="INVALID_ARGUMENT"} 0` {
			if strings.Contains(metrics, `action="delete",outcome="INVALID_ARGUMENT"`) {
				t.Errorf("a request rejected before the backend was counted as an action")
			}
			continue
		}
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestHTTPListKeys(t *testing.T) {
	clock := newFakeClock()
	h := newHarness(t, newMemBackend(clock), nil)
	for i := range 25 {
		h.do("POST", fmt.Sprintf("/v1/namespaces/pay/keys/k%02d:reserve", i), `{"owner_token":"owner-aaaaaaaaaaaaaaaa"}`)
		if i == 9 {
			clock.Advance(20 * time.Minute) // k00..k09 are older
		}
	}
	for i := range 5 {
		h.do("POST", fmt.Sprintf("/v1/namespaces/pay/keys/k%02d:complete", i), `{"owner_token":"owner-aaaaaaaaaaaaaaaa","response":{"status":200}}`)
	}
	h.do("POST", "/v1/namespaces/other/keys/k00:reserve", "")

	var seen []string
	path := "/v1/namespaces/pay/keys?limit=10"
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatal("listing does not end")
		}
		r := h.do("GET", path, "")
		if r.status != 200 {
			t.Fatalf("list: %d %s", r.status, r)
		}
		for _, k := range r.body["keys"].([]any) {
			k := k.(map[string]any)
			seen = append(seen, k["key"].(string))
			if k["state"] == "COMPLETED" && (k["completed_at"] == nil || k["expires_at"] == nil || k["lease_expires_at"] != nil) {
				t.Fatalf("completed key fields: %v", k)
			}
			if k["state"] == "IN_PROGRESS" && (k["lease_expires_at"] == nil || k["completed_at"] != nil) {
				t.Fatalf("in-progress key fields: %v", k)
			}
			if k["created_at"] == nil || k["fencing_token"] == nil || k["owner_token"] != nil {
				t.Fatalf("key fields: %v", k)
			}
		}
		next, _ := r.body["next_page_token"].(string)
		if next == "" {
			break
		}
		path = "/v1/namespaces/pay/keys?limit=10&page_token=" + next
	}
	if len(seen) != 25 || seen[0] != "k00" || seen[24] != "k24" {
		t.Fatalf("listed %d keys: %v", len(seen), seen)
	}

	// Stuck keys: IN_PROGRESS and older than 10 minutes.
	r := h.do("GET", "/v1/namespaces/pay/keys?state=IN_PROGRESS&older_than_s=600", "")
	var stuck []string
	for _, k := range r.body["keys"].([]any) {
		stuck = append(stuck, k.(map[string]any)["key"].(string))
	}
	if fmt.Sprint(stuck) != "[k05 k06 k07 k08 k09]" || r.body["next_page_token"] != nil {
		t.Fatalf("stuck keys %v: %s", stuck, r)
	}
	if r := h.do("GET", "/v1/namespaces/empty/keys", ""); r.status != 200 || len(r.body["keys"].([]any)) != 0 {
		t.Fatalf("empty namespace: %s", r)
	}

	for _, bad := range []string{"?state=DONE", "?limit=0x10", "?limit=1001", "?older_than_s=-1", "?page_token=garbage", "?sort=key", "?limit=1&limit=2"} {
		h.expectError(h.do("GET", "/v1/namespaces/pay/keys"+bad, ""), 400, CodeInvalidArgument)
	}
	h.expectError(h.do("GET", "/v1/namespaces/Bad!/keys", ""), 400, CodeInvalidArgument)
	h.expectError(h.do("POST", "/v1/namespaces/pay/keys", ""), 405, CodeMethodNotAllowed)
	h.expectServing()
}

func TestGRPCAdminKeys(t *testing.T) {
	clock := newFakeClock()
	h := newHarness(t, newMemBackend(clock), nil)
	ctx := t.Context()
	res, err := h.grpc.Reserve(ctx, &idemv1.ReserveRequest{Namespace: "pay", Key: "k1"})
	if err != nil {
		t.Fatal(err)
	}
	fr, err := h.admin.ForceRelease(ctx, &idemv1.ForceReleaseRequest{Namespace: "pay", Key: "k1", Reason: "stuck"})
	if err != nil || fr.GetPreviousFencingToken() != res.GetFencingToken() {
		t.Fatalf("ForceRelease: %v %v", fr, err)
	}
	if _, err := h.grpc.Release(ctx, &idemv1.ReleaseRequest{Namespace: "pay", Key: "k1", OwnerToken: res.GetOwnerToken()}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("release by the old owner: %v", err)
	}
	page, err := h.admin.ListKeys(ctx, &idemv1.ListKeysRequest{Namespace: "pay", State: idemv1.State_STATE_IN_PROGRESS})
	if err != nil || len(page.GetKeys()) != 1 || page.GetKeys()[0].GetKey() != "k1" {
		t.Fatalf("ListKeys: %v %v", page, err)
	}
	if _, err := h.admin.DeleteKey(ctx, &idemv1.DeleteKeyRequest{Namespace: "pay", Key: "k1", Reason: "cleanup"}); err != nil {
		t.Fatal(err)
	}
	_, err = h.admin.DeleteKey(ctx, &idemv1.DeleteKeyRequest{Namespace: "pay", Key: "k1", Reason: "cleanup"})
	if code, _, _ := idemv1.StatusToError(status.Convert(err)); code != CodeNotFound {
		t.Fatalf("second delete: %v", err)
	}
	h.grpc.Reserve(ctx, &idemv1.ReserveRequest{Namespace: "pay", Key: "k2"})
	h.grpc.Complete(ctx, &idemv1.CompleteRequest{Namespace: "pay", Key: "k2", OwnerToken: "", Response: &idemv1.StoredResponse{Status: 200}})
	rk2, _ := h.grpc.Reserve(ctx, &idemv1.ReserveRequest{Namespace: "pay", Key: "k3"})
	h.grpc.Complete(ctx, &idemv1.CompleteRequest{Namespace: "pay", Key: "k3", OwnerToken: rk2.GetOwnerToken(), Response: &idemv1.StoredResponse{Status: 200}})
	_, err = h.admin.ForceRelease(ctx, &idemv1.ForceReleaseRequest{Namespace: "pay", Key: "k3"})
	if code, _, _ := idemv1.StatusToError(status.Convert(err)); status.Code(err) != codes.FailedPrecondition || code != CodeFailedPrecondition {
		t.Fatalf("force-release of a completed key: %v (code %s)", err, code)
	}
	if _, err := h.admin.ListKeys(ctx, &idemv1.ListKeysRequest{Namespace: "pay", Limit: 5000}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("limit 5000: %v", err)
	}
}

// TestHTTPReserveWaits: a waiting reserve is woken by the complete and
// replays it; one on a released key acquires it; one that nothing wakes
// answers IN_PROGRESS after wait_ms.
func TestHTTPReserveWaits(t *testing.T) {
	clock := newFakeClock()
	b := newMemBackend(clock)
	h := newHarness(t, b, nil)
	const owner = `{"owner_token":"owner-aaaaaaaaaaaaaaaa"}`

	waitFor := func(n int64) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); b.Waiters().Stats().Waiting != n; {
			if time.Now().After(deadline) {
				t.Fatalf("waiting reserves: %d, want %d", b.Waiters().Stats().Waiting, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	start := func(key string) chan reply {
		ch := make(chan reply, 1)
		go func() { ch <- h.do("POST", "/v1/namespaces/pay/keys/"+key+":reserve", `{"wait_ms":20000}`) }()
		return ch
	}

	h.do("POST", "/v1/namespaces/pay/keys/done:reserve", owner)
	waiter := start("done")
	waitFor(1)
	if r := h.do("POST", "/v1/namespaces/pay/keys/done:complete", `{"owner_token":"owner-aaaaaaaaaaaaaaaa","response":{"status":201,"body":"b2s="}}`); r.status != 200 {
		t.Fatalf("complete: %s", r)
	}
	if r := <-waiter; r.body["outcome"] != "COMPLETED" || r.body["response"].(map[string]any)["body"] != "b2s=" {
		t.Fatalf("waiter after complete: %s", r)
	}

	h.do("POST", "/v1/namespaces/pay/keys/freed:reserve", owner)
	waiter = start("freed")
	waitFor(1)
	h.do("POST", "/v1/namespaces/pay/keys/freed:release", owner)
	if r := <-waiter; r.body["outcome"] != "ACQUIRED" {
		t.Fatalf("waiter after release: %s", r)
	}

	h.do("POST", "/v1/namespaces/pay/keys/forced:reserve", owner)
	waiter = start("forced")
	waitFor(1)
	h.do("POST", "/v1/namespaces/pay/keys/forced:force-release", `{"reason":"test"}`)
	if r := <-waiter; r.body["outcome"] != "RECLAIMED" {
		t.Fatalf("waiter after force-release: %s", r)
	}

	h.do("POST", "/v1/namespaces/pay/keys/busy:reserve", owner)
	r := h.do("POST", "/v1/namespaces/pay/keys/busy:reserve", `{"wait_ms":50}`)
	if r.body["outcome"] != "IN_PROGRESS" || b.Waiters().Stats().Waiting != 0 {
		t.Fatalf("waiter that nothing wakes: %s", r)
	}
	h.expectError(h.do("POST", "/v1/namespaces/pay/keys/busy:reserve", `{"wait_ms":30001}`), http.StatusBadRequest, CodeInvalidArgument)
}
