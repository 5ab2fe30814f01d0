package server

import (
	"encoding/base64"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The v1.2 features of docs/api.md ("Tombstones and retention", "Namespace
// policies" and "Checkpoint"), over the JSON and gRPC APIs.

func TestTombstoneGetAndIfExpired(t *testing.T) {
	clock := newFakeClock()
	h := newHarness(t, newMemBackend(clock), nil)
	ns := "/v1/namespaces/pay/keys/"
	r := h.do("POST", ns+"k:reserve", `{"fingerprint":"fp","owner_token":"owner-token-0000000001"}`)
	fence := str(t, r.body, "fencing_token")
	h.do("POST", ns+"k:complete", `{"owner_token":"owner-token-0000000001","response":{"status":200},"retention_s":10}`)
	clock.Advance(11 * time.Second)

	r = h.do("GET", ns+"k", "")
	if got, want := keys(r.body), []string{"completed_at", "expired_at", "fencing_token", "fingerprint", "state"}; r.status != 200 || r.body["state"] != "EXPIRED" || !slices.Equal(got, want) {
		t.Fatalf("GET of a tombstone: %d %s", r.status, r)
	}
	if r.body["fencing_token"] != fence || r.body["fingerprint"] != "fp" {
		t.Fatalf("tombstone fields: %s", r)
	}
	h.expectError(h.do("POST", ns+"k:reserve", `{"fingerprint":"fp","if_expired":"yes"}`), 400, CodeInvalidArgument)
	if r = h.do("POST", ns+"k:reserve", `{"fingerprint":"other","if_expired":"acquire"}`); r.body["outcome"] != "FINGERPRINT_MISMATCH" {
		t.Fatalf("if_expired with another fingerprint: %s", r)
	}
	r = h.do("POST", ns+"k:reserve", `{"fingerprint":"fp","if_expired":"acquire"}`)
	if r.body["outcome"] != "ACQUIRED" || mustUint(t, str(t, r.body, "fencing_token")) <= mustUint(t, fence) {
		t.Fatalf("if_expired acquire: %s", r)
	}

	// gRPC: EXPIRED outcome and state.
	h.do("POST", ns+"g:reserve", `{"owner_token":"owner-token-0000000002"}`)
	h.do("POST", ns+"g:complete", `{"owner_token":"owner-token-0000000002","response":{"status":200},"retention_s":1}`)
	clock.Advance(2 * time.Second)
	res, err := h.grpc.Reserve(t.Context(), &idemv1.ReserveRequest{Namespace: "pay", Key: "g"})
	if err != nil || res.GetOutcome() != idemv1.Outcome_EXPIRED || res.GetExpiredAt() == nil || res.GetCompletedAt() == nil || res.GetFencingToken() == 0 {
		t.Fatalf("gRPC reserve of a tombstone: %v %v", res, err)
	}
	got, err := h.grpc.Get(t.Context(), &idemv1.GetRequest{Namespace: "pay", Key: "g"})
	if err != nil || got.GetState() != idemv1.State_STATE_EXPIRED || got.GetResponse() != nil {
		t.Fatalf("gRPC get of a tombstone: %v %v", got, err)
	}
}

func TestNamespacePolicy(t *testing.T) {
	clock := newFakeClock()
	b := newMemBackend(clock)
	h := newHarness(t, b, nil)
	r := h.do("GET", "/v1/namespaces/pay/policy", "")
	if r.status != 200 || r.body["default_lease_ms"].(interface{ String() string }).String() != "30000" || r.body["tombstone_s"].(interface{ String() string }).String() != "604800" {
		t.Fatalf("built-in policy: %d %s", r.status, r)
	}
	h.expectError(h.do("PUT", "/v1/namespaces/pay/policy", `{"max_lease_ms":5000,"default_lease_ms":6000}`), 400, CodeInvalidArgument)
	h.expectError(h.do("PUT", "/v1/namespaces/pay/policy", `{"tombstone_s":-1}`), 400, CodeInvalidArgument)
	h.expectError(h.do("PUT", "/v1/namespaces/pay/policy", `{"bogus":1}`), 400, CodeInvalidArgument)
	r = h.do("PUT", "/v1/namespaces/pay/policy", `{"default_lease_ms":2000,"max_lease_ms":5000,"max_retention_s":60,"tombstone_s":0}`)
	want := map[string]string{"default_lease_ms": "2000", "max_lease_ms": "5000", "default_retention_s": "60", "max_retention_s": "60", "tombstone_s": "0"}
	for k, v := range want {
		if n, _ := r.body[k].(interface{ String() string }); r.status != 200 || n == nil || n.String() != v {
			t.Fatalf("PUT policy answered %d %s, want %s=%s", r.status, r, k, v)
		}
	}
	if g := h.do("GET", "/v1/namespaces/pay/policy", ""); string(g.raw) != string(r.raw) {
		t.Fatalf("GET policy %s, PUT answered %s", g, r)
	}

	// The default lease applies; an explicit one above the max is refused naming the limit.
	ns := "/v1/namespaces/pay/keys/"
	r = h.do("POST", ns+"a:reserve", `{"owner_token":"owner-token-0000000001"}`)
	if r.body["lease_expires_at"] != rfc3339(clock.Now()+int64(2*time.Second)) {
		t.Fatalf("policy default lease: %s", r)
	}
	r = h.do("POST", ns+"b:reserve", `{"lease_ms":6000}`)
	h.expectError(r, 400, CodeInvalidArgument)
	if !strings.Contains(r.errMessage(), "max_lease_ms 5000") {
		t.Fatalf("message does not name the limit: %s", r)
	}
	r = h.do("POST", ns+"a:complete", `{"owner_token":"owner-token-0000000001","response":{"status":200},"retention_s":61}`)
	h.expectError(r, 400, CodeInvalidArgument)
	if !strings.Contains(r.errMessage(), "max_retention_s 60") {
		t.Fatalf("message does not name the limit: %s", r)
	}
	r = h.do("POST", ns+"a:complete", `{"owner_token":"owner-token-0000000001","response":{"status":200}}`)
	if r.body["expires_at"] != rfc3339(clock.Now()+int64(60*time.Second)) {
		t.Fatalf("default retention capped by max_retention_s: %s", r)
	}
	// tombstone_s 0 keeps none: past retention the key is unknown.
	clock.Advance(61 * time.Second)
	h.expectError(h.do("GET", ns+"a", ""), 404, CodeNotFound)
	if r = h.do("POST", ns+"a:reserve", ""); r.body["outcome"] != "ACQUIRED" {
		t.Fatalf("reserve after retention without tombstones: %s", r)
	}
	// Other namespaces keep the built-in policy.
	if r = h.do("POST", "/v1/namespaces/other/keys/b:reserve", `{"lease_ms":6000}`); r.body["outcome"] != "ACQUIRED" {
		t.Fatalf("another namespace: %s", r)
	}

	// gRPC SetPolicy / GetPolicy.
	ten := int64(10)
	set, err := h.admin.SetPolicy(t.Context(), &idemv1.SetPolicyRequest{Namespace: "grpc", Policy: &idemv1.NamespacePolicy{TombstoneS: &ten}})
	if err != nil || set.GetPolicy().GetTombstoneS() != 10 || set.GetPolicy().GetMaxLeaseMs() != 600000 {
		t.Fatalf("SetPolicy: %v %v", set, err)
	}
	got, err := h.admin.GetPolicy(t.Context(), &idemv1.GetPolicyRequest{Namespace: "grpc"})
	if err != nil || got.GetPolicy().GetTombstoneS() != 10 {
		t.Fatalf("GetPolicy: %v %v", got, err)
	}
	if _, err := h.grpc.Reserve(t.Context(), &idemv1.ReserveRequest{Namespace: "pay", Key: "c", LeaseMs: 9000}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("gRPC reserve over max_lease_ms: %v", err)
	}
}

func TestCheckpoints(t *testing.T) {
	clock := newFakeClock()
	h := newHarness(t, newMemBackend(clock), nil)
	ns := "/v1/namespaces/pay/keys/"
	owner1, owner2 := "owner-token-0000000001", "owner-token-0000000002"
	r := h.do("POST", ns+"k:reserve", `{"owner_token":"`+owner1+`","lease_ms":1000}`)
	fence1 := str(t, r.body, "fencing_token")
	data := base64.StdEncoding.EncodeToString([]byte("charge ch_123"))
	r = h.do("POST", ns+"k:checkpoint", `{"owner_token":"`+owner1+`","name":"charged","data":"`+data+`"}`)
	if got := keys(r.body); r.status != 200 || !slices.Equal(got, []string{"checkpointed_at"}) || r.body["checkpointed_at"] != rfc3339(clock.Now()) {
		t.Fatalf("checkpoint: %d %s", r.status, r)
	}
	h.expectError(h.do("POST", ns+"k:checkpoint", `{"owner_token":"`+owner2+`","name":"charged"}`), 409, CodeNotOwner)
	h.expectError(h.do("POST", ns+"k:checkpoint", `{"owner_token":"`+owner1+`","name":"bad name"}`), 400, CodeInvalidArgument)
	big := base64.StdEncoding.EncodeToString(make([]byte, 64<<10+1))
	h.expectError(h.do("POST", ns+"k:checkpoint", `{"owner_token":"`+owner1+`","name":"x","data":"`+big+`"}`), 400, CodeInvalidArgument)
	wantCP := map[string]any{"name": "charged", "data": data, "fencing_token": fence1, "checkpointed_at": rfc3339(clock.Now())}
	sameCP := func(v any) bool {
		m, _ := v.(map[string]any)
		for k, w := range wantCP {
			if m[k] != w {
				return false
			}
		}
		return len(m) == len(wantCP)
	}
	if r = h.do("GET", ns+"k", ""); r.body["state"] != "IN_PROGRESS" || !sameCP(r.body["checkpoint"]) {
		t.Fatalf("GET of an IN_PROGRESS key with a checkpoint: %s", r)
	}
	// The lease runs out; the next reserve RECLAIMS and gets the checkpoint.
	clock.Advance(3 * time.Second)
	r = h.do("POST", ns+"k:reserve", `{"owner_token":"`+owner2+`"}`)
	if r.body["outcome"] != "RECLAIMED" || !sameCP(r.body["checkpoint"]) {
		t.Fatalf("RECLAIMED without the checkpoint: %s", r)
	}
	// gRPC shows it too; complete drops it.
	res, err := h.grpc.Reserve(t.Context(), &idemv1.ReserveRequest{Namespace: "pay", Key: "k", OwnerToken: owner2})
	if err != nil || res.GetCheckpoint().GetName() != "charged" || string(res.GetCheckpoint().GetData()) != "charge ch_123" {
		t.Fatalf("gRPC repeat of the RECLAIMED reserve: %v %v", res, err)
	}
	if _, err := h.grpc.Checkpoint(t.Context(), &idemv1.CheckpointRequest{Namespace: "pay", Key: "k", OwnerToken: owner2, Name: "recorded"}); err != nil {
		t.Fatal(err)
	}
	if g, err := h.grpc.Get(t.Context(), &idemv1.GetRequest{Namespace: "pay", Key: "k"}); err != nil || g.GetCheckpoint().GetName() != "recorded" {
		t.Fatalf("gRPC get: %v %v", g, err)
	}
	h.do("POST", ns+"k:complete", `{"owner_token":"`+owner2+`","response":{"status":201}}`)
	if r = h.do("GET", ns+"k", ""); r.body["checkpoint"] != nil {
		t.Fatalf("checkpoint survived complete: %s", r)
	}
	if _, err := h.grpc.Checkpoint(t.Context(), &idemv1.CheckpointRequest{Namespace: "pay", Key: "k", OwnerToken: owner2, Name: "late"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("checkpoint of a completed key: %v", err)
	}

	// Bounds: a 64-char name and 64 KiB of data are accepted, one more is not.
	h.do("POST", ns+"b:reserve", `{"owner_token":"`+owner1+`","lease_ms":1000}`)
	full := base64.StdEncoding.EncodeToString(make([]byte, 64<<10))
	if r = h.do("POST", ns+"b:checkpoint", `{"owner_token":"`+owner1+`","name":"`+strings.Repeat("n", 64)+`","data":"`+full+`"}`); r.status != 200 {
		t.Fatalf("checkpoint at the bounds: %s", r)
	}
	h.expectError(h.do("POST", ns+"b:checkpoint", `{"owner_token":"`+owner1+`","name":"`+strings.Repeat("n", 65)+`"}`), 400, CodeInvalidArgument)
	// A release drops it: the next owner, even one that reclaims, gets none.
	h.do("POST", ns+"b:release", `{"owner_token":"`+owner1+`"}`)
	if r = h.do("POST", ns+"b:reserve", `{"owner_token":"`+owner2+`","lease_ms":1000}`); r.body["outcome"] != "ACQUIRED" || r.body["checkpoint"] != nil {
		t.Fatalf("reserve after a release: %s", r)
	}
	clock.Advance(3 * time.Second)
	if r = h.do("POST", ns+"b:reserve", `{"owner_token":"`+owner1+`"}`); r.body["outcome"] != "RECLAIMED" || r.body["checkpoint"] != nil {
		t.Fatalf("RECLAIMED after a released checkpoint: %s", r)
	}
	_ = http.StatusOK
}
