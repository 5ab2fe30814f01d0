package httpidem

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// ProblemContentType is the media type of every error the engine (and the
// proxy) generates: RFC 9457 problem details.
const ProblemContentType = "application/problem+json"

// ProblemTypeBase prefixes the type URI of each problem.
const ProblemTypeBase = "https://idem.dev/problems/"

// Problem is an RFC 9457 problem detail.
type Problem struct {
	// Type is a URI naming the kind of problem (ProblemTypeBase + a slug).
	Type string `json:"type"`
	// Title is a short summary of the kind, the same for every occurrence.
	Title string `json:"title"`
	// Status is the HTTP status code.
	Status int `json:"status"`
	// Detail explains this occurrence and what to do about it.
	Detail string `json:"detail,omitempty"`

	// RetryAfter, when positive, is sent as Retry-After (whole seconds,
	// rounded up, at least 1).
	RetryAfter time.Duration `json:"-"`
	// Header holds further response headers (WWW-Authenticate, say).
	Header http.Header `json:"-"`
}

// The problems of the engine and the proxy. Slugs are part of the type URI.
const (
	ProblemInvalidKey          = "invalid-idempotency-key"
	ProblemMissingKey          = "missing-idempotency-key"
	ProblemMissingIdentity     = "missing-caller-identity"
	ProblemInvalidNamespace    = "invalid-namespace"
	ProblemRequestTooLarge     = "request-too-large"
	ProblemUnreadableBody      = "unreadable-request-body"
	ProblemInProgress          = "request-in-progress"
	ProblemFingerprintMismatch = "idempotency-key-reused"
	ProblemExpired             = "idempotency-key-expired"
	ProblemStoreUnavailable    = "store-unavailable"
	ProblemUpstreamUnreachable = "upstream-unreachable"
	ProblemUpstreamTimeout     = "upstream-timeout"
	ProblemLeaseLost           = "reservation-lost"
	ProblemInternal            = "internal-error"
)

// NewProblem returns the problem of kind slug with its standard title.
func NewProblem(status int, slug, detail string) Problem {
	return Problem{Type: ProblemTypeBase + slug, Title: problemTitles[slug], Status: status, Detail: detail}
}

var problemTitles = map[string]string{
	ProblemInvalidKey:          "Invalid Idempotency-Key",
	ProblemMissingKey:          "Idempotency-Key required",
	ProblemMissingIdentity:     "Caller identity required",
	ProblemInvalidNamespace:    "Invalid caller namespace",
	ProblemRequestTooLarge:     "Request body too large",
	ProblemUnreadableBody:      "Request body could not be read",
	ProblemInProgress:          "A request with this Idempotency-Key is in progress",
	ProblemFingerprintMismatch: "Idempotency-Key reused for a different request",
	ProblemExpired:             "Idempotency-Key expired",
	ProblemStoreUnavailable:    "Idempotency store unavailable",
	ProblemUpstreamUnreachable: "Upstream unreachable",
	ProblemUpstreamTimeout:     "Upstream timed out",
	ProblemLeaseLost:           "Reservation lost",
	ProblemInternal:            "Internal error",
}

// WriteProblem writes p as application/problem+json.
func WriteProblem(w http.ResponseWriter, p Problem) {
	h := w.Header()
	for name, values := range p.Header {
		h[name] = values
	}
	h.Set("Content-Type", ProblemContentType)
	h.Set("Cache-Control", "no-store")
	h.Del("Content-Length")
	if p.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(retryAfterSeconds(p.RetryAfter), 10))
	}
	body, _ := json.Marshal(p) // strings and an int: cannot fail
	w.WriteHeader(p.Status)
	_, _ = w.Write(append(body, '\n'))
}

// retryAfterSeconds is d in whole seconds, rounded up, at least 1.
func retryAfterSeconds(d time.Duration) int64 {
	return max(int64((d+time.Second-1)/time.Second), 1)
}
