package server

import (
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/fsm"
)

// The request parameters of each endpoint, as both the JSON and the gRPC API
// deliver them. validator turns them into fsm.Commands: the one place where a
// request is checked.
type (
	reserveParams struct {
		Namespace, Key, Fingerprint, OwnerToken string
		LeaseMs, WaitMs                         int64
		// IfExpired is "" or "acquire" (v1.2).
		IfExpired string
	}
	// checkpointParams are a checkpoint's (v1.2).
	checkpointParams struct {
		Namespace, Key, OwnerToken, Name string
		Data                             []byte
	}
	// policyParams are a set-policy's (v1.2); nil fields keep the
	// built-in default.
	policyParams struct {
		Namespace                                                                string
		DefaultLeaseMs, MaxLeaseMs, DefaultRetentionS, MaxRetentionS, TombstoneS *int64
	}
	// operatorParams are a force-release's or delete's.
	operatorParams struct {
		Namespace, Key, Reason string
	}
	// listParams are a key listing's; State is "" or a state name.
	listParams struct {
		Namespace, State, PageToken string
		OlderThanS, Limit           int64
	}
	heartbeatParams struct {
		Namespace, Key, OwnerToken string
		LeaseMs                    int64
	}
	completeParams struct {
		Namespace, Key, OwnerToken string
		// Response is nil when the request carried none.
		Response   *responseParams
		RetentionS int64
	}
	responseParams struct {
		Status  int64
		Headers map[string]string
		Body    []byte
	}
	releaseParams struct {
		Namespace, Key, OwnerToken string
	}
)

// validator checks requests against the contract's rules and the configured
// response size.
type validator struct {
	maxResponseBytes int64
}

// problems collects what is wrong with one request, so that the client
// learns all of it at once.
type problems []string

func (p *problems) addf(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

// err is the INVALID_ARGUMENT for the problems, or nil.
func (p problems) err() *Error {
	if len(p) == 0 {
		return nil
	}
	return &Error{Code: CodeInvalidArgument, Message: strings.Join(p, "; ")}
}

// ValidateNamespace checks a namespace against [a-z0-9][a-z0-9._-]{0,62}.
func ValidateNamespace(ns string) error {
	var p problems
	checkNamespace(&p, ns)
	if e := p.err(); e != nil {
		return e
	}
	return nil
}

// ValidateKey checks a (decoded) key: 1 to 255 bytes of printable ASCII.
func ValidateKey(key string) error {
	var p problems
	checkKey(&p, key)
	if e := p.err(); e != nil {
		return e
	}
	return nil
}

const namespaceRule = contract.NamespaceRule

func checkNamespace(p *problems, ns string) {
	v := contract.CheckNamespace(ns)
	if v == nil {
		return
	}
	switch v.Fault {
	case contract.FaultEmpty:
		p.addf("namespace is empty: %s", namespaceRule)
	case contract.FaultLength:
		p.addf("namespace is %d bytes long: %s", v.Len, namespaceRule)
	default:
		p.addf("namespace %q has %s at position %d: %s", ns, describeByte(v.Byte), v.Pos, namespaceRule)
	}
}

const keyRule = contract.KeyRule + ", percent-encoded in the path"

func checkKey(p *problems, key string) {
	v := contract.CheckKey(key)
	if v == nil {
		return
	}
	switch v.Fault {
	case contract.FaultEmpty:
		p.addf("key is empty: %s", keyRule)
	case contract.FaultLength:
		p.addf("key is %d bytes long: %s", v.Len, keyRule)
	default:
		p.addf("key has %s at byte %d: %s", describeByte(v.Byte), v.Pos, keyRule)
	}
}

func describeByte(c byte) string { return contract.DescribeByte(c) }

const ownerTokenRule = contract.OwnerTokenRule

// checkOwnerToken checks a token the caller must send (heartbeat, complete,
// release) or chose to send (reserve). It never echoes the token: it is a
// credential of sorts.
func checkOwnerToken(p *problems, token string, required bool) {
	v := contract.CheckOwnerToken(token)
	if v == nil {
		return
	}
	switch v.Fault {
	case contract.FaultEmpty:
		if required {
			p.addf("owner_token is required: send the owner_token that reserve returned")
		}
	case contract.FaultLength:
		p.addf("owner_token is %d characters long: %s", v.Len, ownerTokenRule)
	default:
		p.addf("owner_token has %s at position %d: %s", describeByte(v.Byte), v.Pos, ownerTokenRule)
	}
}

// leaseNanos checks lease_ms and returns the lease in nanoseconds (0: default).
func leaseNanos(p *problems, leaseMs int64) int64 {
	if leaseMs == 0 {
		leaseMs = contract.DefaultLeaseMs
	}
	if leaseMs < contract.MinLeaseMs || leaseMs > contract.MaxLeaseMs {
		p.addf("lease_ms %d is out of range: use %d..%d milliseconds, or 0 or leave it out for the default %d",
			leaseMs, contract.MinLeaseMs, contract.MaxLeaseMs, contract.DefaultLeaseMs)
		return 0
	}
	return leaseMs * int64(time.Millisecond)
}

func (v validator) reserveCommand(r reserveParams) (*fsm.Command, *Error) {
	var p problems
	checkNamespace(&p, r.Namespace)
	checkKey(&p, r.Key)
	if n := utf8.RuneCountInString(r.Fingerprint); n > contract.MaxFingerprintChars {
		p.addf("fingerprint is %d characters long: use at most %d (a hash of the request, for example)", n, contract.MaxFingerprintChars)
	}
	checkOwnerToken(&p, r.OwnerToken, false)
	lease := leaseNanos(&p, r.LeaseMs)
	if r.WaitMs < 0 || r.WaitMs > backend.MaxWait.Milliseconds() {
		p.addf("wait_ms %d is out of range: use 0..%d milliseconds (0 or leave it out: answer IN_PROGRESS at once)", r.WaitMs, backend.MaxWait.Milliseconds())
	}
	if r.IfExpired != "" && r.IfExpired != IfExpiredAcquire {
		p.addf("if_expired %q is not a choice: use %q (acquire a key whose response expired) or leave it out (answer EXPIRED)", truncate(r.IfExpired, 32), IfExpiredAcquire)
	}
	if e := p.err(); e != nil {
		return nil, e
	}
	token := r.OwnerToken
	if token == "" {
		token = contract.NewOwnerToken()
	}
	return &fsm.Command{
		Op:          fsm.OpReserve,
		Namespace:   r.Namespace,
		Key:         r.Key,
		Fingerprint: r.Fingerprint,
		OwnerToken:  token,
		Lease:       lease,
		Wait:        r.WaitMs * int64(time.Millisecond),
		// A lease left to the default takes the namespace's policy.
		LeaseIsDefault:   r.LeaseMs == 0,
		IfExpiredAcquire: r.IfExpired == IfExpiredAcquire,
	}, nil
}

// IfExpiredAcquire is the reserve's if_expired value that acquires a key
// whose response expired instead of answering EXPIRED.
const IfExpiredAcquire = "acquire"

// checkpointNameRule is the rule of a checkpoint's name.
const checkpointNameRule = "a checkpoint name is 1 to 64 characters of A-Z, a-z, 0-9, '_', '.' and '-'"

func (v validator) checkpointCommand(r checkpointParams) (*fsm.Command, *Error) {
	var p problems
	checkNamespace(&p, r.Namespace)
	checkKey(&p, r.Key)
	checkOwnerToken(&p, r.OwnerToken, true)
	if len(r.Name) == 0 || len(r.Name) > 64 {
		p.addf("name is %d characters long: %s", len(r.Name), checkpointNameRule)
	} else if i := strings.IndexFunc(r.Name, func(c rune) bool {
		return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-')
	}); i >= 0 {
		p.addf("name has %s at position %d: %s", describeByte(r.Name[i]), i, checkpointNameRule)
	}
	if len(r.Data) > fsm.MaxCheckpointBytes {
		p.addf("data is %d bytes (decoded): a checkpoint holds at most %d; store a reference to larger state", len(r.Data), fsm.MaxCheckpointBytes)
	}
	if e := p.err(); e != nil {
		return nil, e
	}
	return &fsm.Command{Op: fsm.OpCheckpoint, Namespace: r.Namespace, Key: r.Key, OwnerToken: r.OwnerToken,
		Checkpoint: &fsm.Checkpoint{Name: r.Name, Data: r.Data}}, nil
}

// policyCommand checks a set-policy: every value within the contract's
// range, each default within its max (the max given, or the built-in one).
func (v validator) policyCommand(r policyParams) (*fsm.Command, *Error) {
	var p problems
	checkNamespace(&p, r.Namespace)
	var pol fsm.Policy
	field := func(name string, val *int64, lo, hi, unit int64, out *int64) {
		if val == nil {
			return
		}
		if *val < lo || *val > hi {
			p.addf("%s %d is out of range: use %d..%d, or leave it out for the built-in default", name, *val, lo, hi)
			return
		}
		*out = *val * unit
	}
	ms, s := int64(time.Millisecond), int64(time.Second)
	field("default_lease_ms", r.DefaultLeaseMs, contract.MinLeaseMs, contract.MaxLeaseMs, ms, &pol.DefaultLease)
	field("max_lease_ms", r.MaxLeaseMs, contract.MinLeaseMs, contract.MaxLeaseMs, ms, &pol.MaxLease)
	field("default_retention_s", r.DefaultRetentionS, contract.MinRetentionS, contract.MaxRetentionS, s, &pol.DefaultRetention)
	field("max_retention_s", r.MaxRetentionS, contract.MinRetentionS, contract.MaxRetentionS, s, &pol.MaxRetention)
	field("tombstone_s", r.TombstoneS, 0, contract.MaxTombstoneS, s, &pol.Tombstone)
	pol.TombstoneSet = r.TombstoneS != nil
	if pol.MaxLease > 0 && pol.DefaultLease > pol.MaxLease {
		p.addf("default_lease_ms %d exceeds max_lease_ms %d", pol.DefaultLease/ms, pol.MaxLease/ms)
	}
	if pol.MaxRetention > 0 && pol.DefaultRetention > pol.MaxRetention {
		p.addf("default_retention_s %d exceeds max_retention_s %d", pol.DefaultRetention/s, pol.MaxRetention/s)
	}
	if e := p.err(); e != nil {
		return nil, e
	}
	return &fsm.Command{Op: fsm.OpSetPolicy, Namespace: r.Namespace, Policy: &pol}, nil
}

// MaxReasonChars bounds an operator action's reason, in Unicode code points
// (as the OpenAPI document's maxLength counts).
const MaxReasonChars = 1024

// operatorCommand is the force-release (op fsm.OpForceRelease) or delete
// (fsm.OpDelete) of r. The reason is optional for the API (idemctl asks for
// one): it goes to the logs, never to the state.
func (v validator) operatorCommand(op fsm.Op, r operatorParams) (*fsm.Command, *Error) {
	var p problems
	checkNamespace(&p, r.Namespace)
	checkKey(&p, r.Key)
	switch {
	case !utf8.ValidString(r.Reason) || strings.ContainsFunc(r.Reason, unicode.IsControl):
		p.addf("reason must be UTF-8 text without control characters (it is written to the logs)")
	case utf8.RuneCountInString(r.Reason) > MaxReasonChars:
		p.addf("reason is %d characters long: use at most %d", utf8.RuneCountInString(r.Reason), MaxReasonChars)
	}
	if e := p.err(); e != nil {
		return nil, e
	}
	return &fsm.Command{Op: op, Namespace: r.Namespace, Key: r.Key, Reason: r.Reason}, nil
}

// listQuery checks a listing's parameters.
func (v validator) listQuery(r listParams) (backend.ListQuery, *Error) {
	var p problems
	checkNamespace(&p, r.Namespace)
	q := backend.ListQuery{Namespace: r.Namespace, PageToken: r.PageToken}
	switch r.State {
	case "":
	case fsm.StateInProgress.String():
		q.State = fsm.StateInProgress
	case fsm.StateCompleted.String():
		q.State = fsm.StateCompleted
	default:
		p.addf("state %q is not a state: use IN_PROGRESS or COMPLETED, or leave it out for both", truncate(r.State, 32))
	}
	if r.OlderThanS < 0 || r.OlderThanS > contract.MaxRetentionS {
		p.addf("older_than_s %d is out of range: use 0..%d seconds", r.OlderThanS, contract.MaxRetentionS)
	} else {
		q.OlderThan = time.Duration(r.OlderThanS) * time.Second
	}
	if r.Limit < 0 || r.Limit > backend.MaxListLimit {
		p.addf("limit %d is out of range: use 1..%d, or 0 or leave it out for %d", r.Limit, backend.MaxListLimit, backend.DefaultListLimit)
	} else {
		q.Limit = int(r.Limit)
	}
	if len(r.PageToken) > 4096 {
		p.addf("page_token is %d bytes long: pass the next_page_token of the previous page unchanged", len(r.PageToken))
	}
	return q, p.err()
}

func (v validator) heartbeatCommand(r heartbeatParams) (*fsm.Command, *Error) {
	var p problems
	checkNamespace(&p, r.Namespace)
	checkKey(&p, r.Key)
	checkOwnerToken(&p, r.OwnerToken, true)
	lease := leaseNanos(&p, r.LeaseMs)
	if e := p.err(); e != nil {
		return nil, e
	}
	return &fsm.Command{
		Op:             fsm.OpHeartbeat,
		Namespace:      r.Namespace,
		Key:            r.Key,
		OwnerToken:     r.OwnerToken,
		Lease:          lease,
		LeaseIsDefault: r.LeaseMs == 0,
	}, nil
}

func (v validator) completeCommand(r completeParams) (*fsm.Command, *Error) {
	var p problems
	checkNamespace(&p, r.Namespace)
	checkKey(&p, r.Key)
	checkOwnerToken(&p, r.OwnerToken, true)
	retentionS := r.RetentionS
	if retentionS == 0 {
		retentionS = contract.DefaultRetentionS
	}
	if retentionS < contract.MinRetentionS || retentionS > contract.MaxRetentionS {
		p.addf("retention_s %d is out of range: use %d..%d seconds (30 days), or 0 or leave it out for the default %d",
			retentionS, contract.MinRetentionS, contract.MaxRetentionS, contract.DefaultRetentionS)
	}
	if r.Response == nil {
		p.addf("response is required: send {\"status\": ..., \"headers\": {...}, \"body\": \"<base64>\"}")
	} else {
		if s := r.Response.Status; s < contract.MinStatus || s > contract.MaxStatus {
			p.addf("response.status %d is out of range: use an HTTP status code %d..%d", s, contract.MinStatus, contract.MaxStatus)
		}
		checkHeaders(&p, r.Response.Headers)
	}
	if e := p.err(); e != nil {
		return nil, e
	}
	if n := int64(len(r.Response.Body)); n > v.maxResponseBytes {
		return nil, errorf(CodePayloadTooLarge,
			"payload too large: response.body is %d bytes (decoded) and this store keeps at most %d; store a smaller response or raise --max-response-bytes",
			n, v.maxResponseBytes)
	}
	return &fsm.Command{
		Op:         fsm.OpComplete,
		Namespace:  r.Namespace,
		Key:        r.Key,
		OwnerToken: r.OwnerToken,
		Response: &fsm.Response{
			Status:  int32(r.Response.Status),
			Headers: r.Response.Headers,
			Body:    r.Response.Body,
		},
		Retention:          retentionS * int64(time.Second),
		RetentionIsDefault: r.RetentionS == 0,
	}, nil
}

func (v validator) releaseCommand(r releaseParams) (*fsm.Command, *Error) {
	var p problems
	checkNamespace(&p, r.Namespace)
	checkKey(&p, r.Key)
	checkOwnerToken(&p, r.OwnerToken, true)
	if e := p.err(); e != nil {
		return nil, e
	}
	return &fsm.Command{
		Op:         fsm.OpRelease,
		Namespace:  r.Namespace,
		Key:        r.Key,
		OwnerToken: r.OwnerToken,
	}, nil
}

func (v validator) getParams(namespace, key string) *Error {
	var p problems
	checkNamespace(&p, namespace)
	checkKey(&p, key)
	return p.err()
}

// checkHeaders bounds the stored headers. Names are HTTP tokens (RFC 9110
// tchar); values may hold any byte but control characters other than tab, so
// that a replay can always be written back as an HTTP header.
func checkHeaders(p *problems, headers map[string]string) {
	if len(headers) > contract.MaxHeaders {
		p.addf("response.headers has %d entries: store at most %d (join multiple values of one header with \", \")", len(headers), contract.MaxHeaders)
		return
	}
	total := 0
	for name, value := range headers {
		total += len(name) + len(value)
		if name == "" || len(name) > contract.MaxHeaderNameBytes {
			p.addf("response.headers has a name of %d bytes: a header name is 1-%d bytes", len(name), contract.MaxHeaderNameBytes)
			continue
		}
		if i := strings.IndexFunc(name, func(r rune) bool { return !isTokenChar(r) }); i >= 0 {
			p.addf("response.headers name %q has %s at position %d: a header name is made of letters, digits and !#$%%&'*+-.^_`|~",
				truncate(name, 64), describeByte(name[i]), i)
			continue
		}
		if len(value) > contract.MaxHeaderValueBytes {
			p.addf("response.headers[%q] is %d bytes long: a header value is at most %d bytes", name, len(value), contract.MaxHeaderValueBytes)
			continue
		}
		for i := 0; i < len(value); i++ {
			if c := value[i]; c < 0x20 && c != '\t' || c == 0x7f {
				p.addf("response.headers[%q] has control %s at byte %d: header values cannot hold CR, LF or other control characters",
					name, describeByte(c), i)
				break
			}
		}
	}
	if total > contract.MaxHeadersTotalBytes {
		p.addf("response.headers total %d bytes (names plus values): store at most %d", total, contract.MaxHeadersTotalBytes)
	}
}

func isTokenChar(r rune) bool {
	switch {
	case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		return true
	}
	return strings.ContainsRune("!#$%&'*+-.^_`|~", r)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
