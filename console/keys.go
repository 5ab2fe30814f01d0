package console

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/security/auth"
)

// record is the JSON API's GET of a key (docs/api.md).
type record struct {
	State          string `json:"state"`
	Fingerprint    string `json:"fingerprint"`
	FencingToken   string `json:"fencing_token"`
	LeaseExpiresAt string `json:"lease_expires_at"`
	CompletedAt    string `json:"completed_at"`
	ExpiresAt      string `json:"expires_at"`
	ExpiredAt      string `json:"expired_at"`
	Response       *struct {
		Status  int               `json:"status"`
		Headers map[string]string `json:"headers"`
		Body    string            `json:"body"`
	} `json:"response"`
	Checkpoint *struct {
		Name           string `json:"name"`
		Data           string `json:"data"`
		FencingToken   string `json:"fencing_token"`
		CheckpointedAt string `json:"checkpointed_at"`
	} `json:"checkpoint"`
}

// keyPage is the key inspector's data.
type keyPage struct {
	Namespace, Key string
	Found          bool
	Refused        string // the API's refusal (403, 401, 503, ...), shown instead of the record
	Record         record
	Sentence       string
	WhoMayAct      string
	Location       *Location
	LeaderAddr     string
	Headers        [][2]string
	BodySize       int
	Preview        preview
	CheckpointSize int
	Admin          bool
}

// preview is a stored body made safe to show: text (escaped by the
// template) or a hex dump of binary.
type preview struct {
	Kind      string // "empty", "text" or "hex"
	Text      string
	Truncated bool
}

// previewBytes bounds the body shown (text) and hexBytes the binary dumped.
const (
	previewBytes = 4 << 10
	hexBytes     = 512
)

// makePreview shows body as text when it is valid UTF-8 without control
// characters other than tab and newlines, else as hex.
func makePreview(body []byte) preview {
	if len(body) == 0 {
		return preview{Kind: "empty"}
	}
	text := isText(body)
	if text {
		shown := body
		if len(shown) > previewBytes {
			shown = shown[:previewBytes]
			for len(shown) > 0 && !utf8.Valid(shown) { // do not cut a character in two
				shown = shown[:len(shown)-1]
			}
		}
		return preview{Kind: "text", Text: string(shown), Truncated: len(shown) < len(body)}
	}
	shown := body[:min(len(body), hexBytes)]
	return preview{Kind: "hex", Text: hex.Dump(shown), Truncated: len(shown) < len(body)}
}

func isText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if unicode.IsControl(r) && r != '\n' && r != '\r' && r != '\t' {
			return false
		}
	}
	return true
}

// nextRetry says in one sentence what the next reserve of the key gets and
// why, from its record as the API shows it, at now.
func nextRetry(rec record, found bool, now time.Time) string {
	if !found {
		return "There is no record: the next reserve gets ACQUIRED with a new fencing token and runs the work (the key was never reserved, was released or deleted, or is past retention)."
	}
	fp := "with the same fingerprint"
	other := "; another fingerprint gets FINGERPRINT_MISMATCH"
	if rec.Fingerprint == "" {
		fp, other = "without a fingerprint", "; a retry that sends a fingerprint gets FINGERPRINT_MISMATCH"
	}
	switch rec.State {
	case "COMPLETED":
		status := "the response"
		if rec.Response != nil {
			status = fmt.Sprintf("the %d", rec.Response.Status)
		}
		return fmt.Sprintf("A retry %s replays %s stored at %s (until %s)%s.", fp, status, show(rec.CompletedAt), show(rec.ExpiresAt), other)
	case "EXPIRED":
		return fmt.Sprintf("The stored response expired at %s and only a tombstone is left: a retry %s gets EXPIRED (the work is not run again unless the caller asks to acquire an expired key)%s.", show(rec.ExpiredAt), fp, other)
	case "IN_PROGRESS":
		lease, err := time.Parse(time.RFC3339Nano, rec.LeaseExpiresAt)
		if err == nil && now.Before(lease) {
			return fmt.Sprintf("A retry %s gets IN_PROGRESS, to retry in about %s: the owner holding fencing token %s has the lease until %s; after that and the store's clock-skew margin, unless it heartbeats or completes, the next reserve RECLAIMS the key with a larger fencing token%s.",
				fp, lease.Sub(now).Round(time.Second), rec.FencingToken, show(rec.LeaseExpiresAt), other)
		}
		return fmt.Sprintf("The lease ended at %s: once the store's clock-skew margin has passed too, a retry %s RECLAIMS the key with a fencing token larger than %s and runs the work again, and the previous owner's complete is refused as NOT_OWNER%s.",
			show(rec.LeaseExpiresAt), fp, rec.FencingToken, other)
	}
	return "The key is in state " + rec.State + "."
}

// show formats an API time for people: to the second, UTC.
func show(t string) string {
	p, err := time.Parse(time.RFC3339Nano, t)
	if err != nil {
		return t
	}
	return p.UTC().Format("2006-01-02 15:04:05 UTC")
}

func (c *Console) serveSearch(w http.ResponseWriter, r *http.Request) {
	ns, key := strings.TrimSpace(r.URL.Query().Get("namespace")), r.URL.Query().Get("key")
	if ns != "" || key != "" {
		var problems []string
		if v := contract.CheckNamespace(ns); v != nil {
			problems = append(problems, v.Error())
		}
		if v := contract.CheckKey(key); v != nil {
			problems = append(problems, v.Error())
		}
		if len(problems) == 0 {
			http.Redirect(w, r, "/ui/keys/"+url.PathEscape(ns)+"/"+url.PathEscape(key), http.StatusSeeOther)
			return
		}
		c.render(w, r, http.StatusBadRequest, "search", searchPage{Namespace: ns, Key: key, Problem: strings.Join(problems, "; "),
			Namespaces: c.visibleNamespaces(r, "")})
		return
	}
	c.render(w, r, http.StatusOK, "search", searchPage{Namespaces: c.visibleNamespaces(r, "")})
}

type searchPage struct {
	Namespace, Key, Problem string
	Namespaces              []string
}

func (c *Console) serveKey(w http.ResponseWriter, r *http.Request) {
	ns, key := r.PathValue("ns"), r.PathValue("key")
	kp := keyPage{Namespace: ns, Key: key}
	reply := c.call(r, http.MethodGet, keyPath(ns, key), nil, nil)
	status := http.StatusOK
	switch {
	case reply.OK():
		kp.Found = true
		if err := reply.Decode(&kp.Record); err != nil {
			kp.Refused = "the API's answer could not be read: " + err.Error()
		}
	case reply.Status == http.StatusNotFound:
		if code, msg := reply.Error(); code != "NOT_FOUND" || strings.Contains(msg, "unknown path") {
			kp.Refused = code + ": " + msg
		}
	default:
		code, msg := reply.Error()
		kp.Refused, status = code+": "+msg, reply.Status
	}
	if kp.Refused == "" {
		kp.Sentence = nextRetry(kp.Record, kp.Found, c.cfg.Now())
		kp.WhoMayAct = whoMayAct(kp.Record, kp.Found, c.cfg.Now())
		kp.Admin = isAdmin(principal(r), ns) && kp.Found && kp.Record.State == "IN_PROGRESS"
		if c.cfg.Locate != nil {
			if loc, ok := c.cfg.Locate(ns, key); ok {
				kp.Location = &loc
			}
		}
		kp.LeaderAddr = reply.Header.Get("Idem-Leader")
		if res := kp.Record.Response; res != nil {
			for k, v := range res.Headers {
				kp.Headers = append(kp.Headers, [2]string{k, v})
			}
			sort.Slice(kp.Headers, func(i, j int) bool { return kp.Headers[i][0] < kp.Headers[j][0] })
			body, _ := base64.StdEncoding.DecodeString(res.Body)
			kp.BodySize, kp.Preview = len(body), makePreview(body)
		}
		if cp := kp.Record.Checkpoint; cp != nil {
			data, _ := base64.StdEncoding.DecodeString(cp.Data)
			kp.CheckpointSize = len(data)
		}
	}
	c.render(w, r, status, "key", kp)
}

// whoMayAct says who may heartbeat, complete or release the key now,
// without the owner token.
func whoMayAct(rec record, found bool, now time.Time) string {
	switch {
	case !found:
		return "Nobody holds it: any reserve acquires it."
	case rec.State == "IN_PROGRESS":
		lease, err := time.Parse(time.RFC3339Nano, rec.LeaseExpiresAt)
		if err == nil && now.Before(lease) {
			return "Only the owner that reserved it (it holds the owner token, never shown here), with fencing token " + rec.FencingToken + ", until its lease ends."
		}
		return "The owner's lease has ended: its heartbeat or complete still succeeds until another reserve reclaims the key; an admin may force-release it."
	case rec.State == "COMPLETED":
		return "Nobody: the record is final until it expires; an admin may delete it so that the next reserve runs the work again."
	}
	return "Nobody: only a tombstone is left."
}

// serveForceRelease force-releases a key through the API (the same
// handler, log line and metric as POST ...:force-release).
func (c *Console) serveForceRelease(w http.ResponseWriter, r *http.Request, _ *auth.Principal) {
	ns, key := r.PathValue("ns"), r.PathValue("key")
	reason := strings.TrimSpace(r.PostForm.Get("reason"))
	back := r.PostForm.Get("back")
	if back != "stuck" {
		back = "key"
	}
	fail := func(status int, msg string) {
		c.render(w, r, status, "error", errorPage{Title: "Force-release refused", Message: msg})
	}
	switch {
	case reason == "":
		fail(http.StatusBadRequest, "Give a reason: it goes to the audit log with your name. Nothing was done.")
		return
	case r.PostForm.Get("confirm") != "yes":
		fail(http.StatusBadRequest, "Tick the confirmation box: a force-release lets another caller run the work again. Nothing was done.")
		return
	}
	reply := c.call(r, http.MethodPost, keyPath(ns, key)+":force-release", nil, map[string]string{"reason": reason})
	if !reply.OK() {
		code, msg := reply.Error()
		fail(reply.Status, code+": "+msg)
		return
	}
	var out struct {
		Previous string `json:"previous_fencing_token"`
	}
	_ = reply.Decode(&out)
	to := "/ui/keys/" + url.PathEscape(ns) + "/" + url.PathEscape(key)
	if back == "stuck" {
		to = "/ui/stuck"
	}
	q := url.Values{"done": {"released"}, "ns": {ns}, "key": {key}, "prev": {out.Previous}}
	http.Redirect(w, r, to+"?"+q.Encode(), http.StatusSeeOther)
}
