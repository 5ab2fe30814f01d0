package console

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/security/auth"
)

// Errors of this package.
var (
	// ErrInvalidConfig: New was given a Config that cannot work.
	ErrInvalidConfig = errors.New("console: invalid config")
)

// Location is where a key lives, as the process serving the console
// places it.
type Location struct {
	Shard      string
	HomeRegion string
	Partition  int
	// Leader is the node id believed to lead the shard ("" unknown).
	Leader string
}

// Config configures a Console.
type Config struct {
	// API serves the JSON API with the process's authentication in front
	// (what the HTTP listener serves). Every page reads and acts through
	// it with the browser's credentials. Required.
	API http.Handler
	// Registry is gathered for the traffic charts. Nil: no traffic.
	Registry prometheus.Gatherer
	// Logger receives the console's own failures. Nil discards.
	Logger *slog.Logger
	// Process names the process in the page header ("idemnode r1-1").
	Process string
	// Locate places a key (shard, home region, partition, leader); nil or
	// ok=false shows none.
	Locate func(namespace, key string) (loc Location, ok bool)
	// Cluster returns the cluster as the serving process sees it; nil (a
	// router) shows the cluster view without nodes and shards.
	Cluster func(ctx context.Context) (*ClusterView, error)
	// SampleEvery is how often the traffic ring samples the registry; 0
	// means 5 s.
	SampleEvery time.Duration
	// Samples is how many samples the ring keeps; 0 means 72 (six minutes
	// at 5 s).
	Samples int
	// Now is the clock of the pages' sentences; nil means time.Now.
	Now func() time.Time
}

// DefaultConfig returns a Config with the defaults filled in.
func DefaultConfig() Config {
	return Config{SampleEvery: 5 * time.Second, Samples: 72}
}

// Validate reports every problem of c at once.
func (c Config) Validate() error {
	var errs []error
	if c.API == nil {
		errs = append(errs, fmt.Errorf("%w: API is required", ErrInvalidConfig))
	}
	if c.SampleEvery < 0 {
		errs = append(errs, fmt.Errorf("%w: SampleEvery %v is negative", ErrInvalidConfig, c.SampleEvery))
	}
	if c.Samples < 0 {
		errs = append(errs, fmt.Errorf("%w: Samples %d is negative", ErrInvalidConfig, c.Samples))
	}
	return errors.Join(errs...)
}

// Console serves the pages. It is safe for concurrent use.
type Console struct {
	cfg     Config
	log     *slog.Logger
	pages   map[string]*template.Template
	static  http.Handler
	csrfKey []byte
	traffic *sampler
	changes *changeLog
	mux     *http.ServeMux
}

// New validates cfg and builds the console; it starts nothing (the traffic
// sampler starts with the first request).
func New(cfg Config) (*Console, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.SampleEvery = cmp.Or(cfg.SampleEvery, 5*time.Second)
	cfg.Samples = cmp.Or(cfg.Samples, 72)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	c := &Console{cfg: cfg, log: cfg.Logger, csrfKey: make([]byte, 32), changes: &changeLog{}}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if _, err := rand.Read(c.csrfKey); err != nil {
		return nil, fmt.Errorf("console: csrf key: %w", err)
	}
	pages, err := parsePages(cfg.Now)
	if err != nil {
		return nil, err
	}
	c.pages = pages
	static, _ := fs.Sub(assets, "assets/static")
	c.static = http.StripPrefix("/ui/static/", http.FileServerFS(static))
	c.traffic = newSampler(cfg.Registry, cfg.SampleEvery, cfg.Samples, cfg.Now)
	c.mux = http.NewServeMux()
	c.routes()
	return c, nil
}

// Close stops the traffic sampler. A nil Console is closed.
func (c *Console) Close() {
	if c != nil {
		c.traffic.stop()
	}
}

// Handler serves /ui/ (mount it at "/ui/" behind the API's authentication).
func (c *Console) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		securityHeaders(w.Header())
		c.traffic.start()
		c.mux.ServeHTTP(w, r)
	})
}

// contentSecurityPolicy allows scripts, styles and fetches from this origin
// only (the console's files under /ui/static/), no inline script, no
// framing and forms posting to this origin only.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

func securityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
}

func (c *Console) routes() {
	m := c.mux
	m.Handle("GET /ui/static/", c.static)
	m.HandleFunc("GET /ui/{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/ui/keys", http.StatusSeeOther)
	})
	m.HandleFunc("GET /ui/login", c.serveLogin)
	m.HandleFunc("POST /ui/login", c.serveSignIn)
	m.HandleFunc("POST /ui/logout", c.action(c.serveSignOut))
	m.HandleFunc("GET /ui/keys", c.serveSearch)
	m.HandleFunc("GET /ui/keys/{ns}/{key}", c.serveKey)
	m.HandleFunc("POST /ui/keys/{ns}/{key}/force-release", c.action(c.serveForceRelease))
	m.HandleFunc("GET /ui/stuck", c.serveStuck)
	m.HandleFunc("GET /ui/stuck.json", c.serveStuckJSON)
	m.HandleFunc("GET /ui/cluster", c.serveCluster)
	m.HandleFunc("GET /ui/cluster/progress.json", c.serveProgressJSON)
	m.HandleFunc("GET /ui/namespaces", c.serveNamespaces)
	m.HandleFunc("POST /ui/namespaces/{ns}/policy", c.action(c.serveSetPolicy))
	m.HandleFunc("GET /ui/traffic", c.serveTraffic)
	m.HandleFunc("GET /ui/traffic.json", c.serveTrafficJSON)
	m.HandleFunc("/ui/", func(w http.ResponseWriter, r *http.Request) {
		c.render(w, r, http.StatusNotFound, "error", errorPage{Title: "Not found",
			Message: "There is no console page at " + r.URL.Path + ": use the links above."})
	})
}

// principal is the caller as the API's authentication named it (without
// an auth file, root). A request the authentication did not look at (the
// sign-in page) has none: it may read and do nothing.
func principal(r *http.Request) *auth.Principal {
	if p, ok := auth.PrincipalFrom(r.Context()); ok && p != nil {
		return p
	}
	return &auth.Principal{}
}

// isAdmin reports whether p may act (force-release, set a policy) on ns.
func isAdmin(p *auth.Principal, ns string) bool {
	return p.Role >= auth.RoleAdmin && p.AllowsNamespace(ns)
}

// csrfToken binds an action's form to the principal that was shown it.
func (c *Console) csrfToken(p *auth.Principal) string {
	m := hmac.New(sha256.New, c.csrfKey)
	m.Write([]byte("idem-console-csrf\x00" + p.Name))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// sameOrigin reports whether r comes from a page of this origin: Origin
// (else Referer) must name the scheme and host r was sent to, and
// Sec-Fetch-Site, when the browser sends it, must be same-origin.
func sameOrigin(r *http.Request) bool {
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" {
		return false
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	self := scheme + "://" + r.Host
	if o := r.Header.Get("Origin"); o != "" {
		return o == self
	}
	ref, err := url.Parse(r.Header.Get("Referer"))
	return err == nil && ref.Scheme+"://"+ref.Host == self
}

// action wraps a POST handler: same-origin and the CSRF token are checked
// before it runs.
func (c *Console) action(h func(http.ResponseWriter, *http.Request, *auth.Principal)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p := principal(r)
		if !sameOrigin(r) {
			c.render(w, r, http.StatusForbidden, "error", errorPage{Title: "Refused",
				Message: "This action came from another site (its Origin or Referer is not this console's): nothing was done."})
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		if err := r.ParseForm(); err != nil {
			c.render(w, r, http.StatusBadRequest, "error", errorPage{Title: "Bad form", Message: "The form could not be read: " + err.Error()})
			return
		}
		if !hmac.Equal([]byte(r.PostForm.Get("csrf")), []byte(c.csrfToken(p))) {
			c.render(w, r, http.StatusForbidden, "error", errorPage{Title: "Refused",
				Message: "The form's CSRF token is missing or not this principal's: reload the page and try again. Nothing was done."})
			return
		}
		h(w, r, p)
	}
}

// page is what every template gets.
type page struct {
	// SignedIn: the browser holds a session cookie (it may sign out).
	SignedIn bool
	Title    string
	Nav      string
	Process  string
	User     string
	Role     string
	CSRF     string
	Flash    string
	Data     any
}

type errorPage struct {
	Title   string
	Message string
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name string, data any) {
	t, ok := c.pages[name]
	if !ok {
		http.Error(w, "console: no page "+name, http.StatusInternalServerError)
		return
	}
	p := principal(r)
	pg := page{Title: titleOf(name, data), Nav: name, Process: c.cfg.Process, User: p.Name, Role: p.Role.String(),
		CSRF: c.csrfToken(p), Flash: flash(r.URL.Query()), Data: data}
	if ck, err := r.Cookie(sessionCookie); err == nil && ck.Value != "" {
		pg.SignedIn = true
	}
	var b strings.Builder
	if err := t.ExecuteTemplate(&b, "layout", pg); err != nil {
		c.log.Error("console page", "page", name, "error", err)
		http.Error(w, "console: the page could not be drawn", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}

// flash is the message after an action (the redirect's ?done=...), built
// here from checked names and digits: a link cannot put words of its own
// on a console page.
func flash(q url.Values) string {
	ns, key, prev := q.Get("ns"), q.Get("key"), q.Get("prev")
	if !contract.ValidNamespace(ns) {
		return ""
	}
	switch q.Get("done") {
	case "released":
		if contract.CheckKey(key) != nil || prev == "" || strings.Trim(prev, "0123456789") != "" {
			return ""
		}
		return fmt.Sprintf("%s/%s was force-released (its owner held fencing token %s): the next reserve reclaims it.", ns, key, prev)
	case "policy":
		return "The new policy of " + ns + " is in force."
	}
	return ""
}

func titleOf(name string, data any) string {
	if e, ok := data.(errorPage); ok {
		return e.Title
	}
	switch name {
	case "key":
		if k, ok := data.(keyPage); ok {
			return k.Namespace + "/" + k.Key
		}
	case "search":
		return "Keys"
	}
	return strings.ToUpper(name[:1]) + name[1:]
}
