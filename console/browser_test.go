package console_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/internal/testutil"
)

var (
	binaries cluster.Binaries
	update   = flag.Bool("update", false, "rewrite the console's screenshots under docs/console/")
)

func TestMain(m *testing.M) { cluster.RunTests(m, &binaries, "idemnode") }

// browser is one headless Chromium tab.
type browser struct {
	ctx  context.Context
	base string
}

func newBrowser(t *testing.T, parent context.Context, exe, base string) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe),
		chromedp.NoSandbox, // the suite runs as root in CI
		chromedp.IgnoreCertErrors,
		chromedp.DisableGPU,
		chromedp.WindowSize(1280, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(parent, opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser on the long-lived context
		t.Fatalf("starting Chromium: %v", err)
	}
	return &browser{ctx: ctx, base: base}
}

// signIn opens a page, is sent to the sign-in page, and signs in with
// token as a person would.
func (b *browser) signIn(t *testing.T, token, want, shot string) {
	t.Helper()
	b.open(t, "/ui/stuck")
	if s := b.body(t); !strings.Contains(s, "Sign in") || !strings.Contains(s, "not signed in") {
		t.Fatalf("a page before signing in:\n%s", s)
	}
	if shot != "" {
		b.shot(t, shot)
	}
	b.run(t, "sign in",
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), token),
		chromedp.Click(chromedp.CSS(`main form button`)),
		chromedp.WaitVisible(chromedp.CSS(`form.signout`)))
	if s := b.text(t, ".who"); !strings.HasPrefix(s, want) {
		t.Fatalf("signed in as %q, want %q", s, want)
	}
}

// step bounds one interaction with the page.
const step = 30 * time.Second

func (b *browser) run(t *testing.T, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, step)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// get runs one action that returns a value.
func get[T any](t *testing.T, b *browser, what string, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, step)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

func (b *browser) open(t *testing.T, path string) {
	t.Helper()
	b.run(t, "open "+path, chromedp.Navigate(b.base+path), chromedp.WaitReady(chromedp.CSS("main")))
}

func (b *browser) text(t *testing.T, sel string) string {
	t.Helper()
	return get(t, b, "read "+sel, chromedp.Text(chromedp.CSS(sel)))
}

// body is the page's visible text.
func (b *browser) body(t *testing.T) string {
	t.Helper()
	return get(t, b, "read the page", chromedp.Evaluate[string](`document.body.innerText`))
}

// shot writes the page as docs/console/name.png when -update is given.
func (b *browser) shot(t *testing.T, name string) {
	t.Helper()
	if !*update {
		return
	}
	png := get(t, b, "screenshot "+name, chromedp.FullScreenshot(100))
	path := filepath.Join("..", "docs", "console", name+".png")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", path)
}

func sha(tok string) string {
	s := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(s[:])
}

func must(t *testing.T, want int) func(cluster.Reply, error) cluster.Reply {
	return func(r cluster.Reply, err error) cluster.Reply {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != want {
			t.Fatalf("got %s, want status %d", r, want)
		}
		return r
	}
}

// A secure three-node region and headless Chromium: the key inspector shows
// a reserved, then completed key with its fencing token and the right
// sentence, and a stored <script> body does not run; a stuck key shows
// under Stuck work and an admin's force-release from the console makes the
// next reserve RECLAIMED; a reader of another namespace sees neither; a
// policy the API refuses shows the API's message; the traffic charts draw;
// and during a topology change the cluster page's progress advances to
// done without a reload. With -update it rewrites docs/console/*.png.
func TestConsoleInBrowser(t *testing.T) {
	idemnode := binaries.Path(t, "idemnode")
	testutil.NeedsCommand(t, "chromium", "apt-get install chromium")
	exe, _ := exec.LookPath("chromium")

	topo, err := launch.Topology(launch.Spec{Cluster: "console", NodesPerRegion: 3, ShardsPerRegion: 1, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c, err := cluster.NewNodes(topo, dir, idemnode)
	if err != nil {
		t.Fatal(err)
	}
	authFile := filepath.Join(dir, "auth.yaml")
	if err := os.WriteFile(authFile, []byte(`principals:
  - {name: root, namespaces: ["*"], role: admin}
  - {name: ops, token_sha256: `+sha("ops-token")+`, namespaces: ["*"], role: admin}
  - {name: ledger-reader, token_sha256: `+sha("reader-token")+`, namespaces: [ledger], role: reader}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.Secure(authFile, "root"); err != nil {
		t.Fatal(err)
	}
	c.StopOnCleanup(t)
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		c.LogTails(t)
		t.Fatal(err)
	}
	addr := c.HTTPAddr("r1-1")
	api, err := c.API(addr, "root")
	if err != nil {
		t.Fatal(err)
	}
	api.RetryUnavailable = 20 * time.Second
	base := "https://" + addr
	admin := newBrowser(t, ctx, exe, base)
	admin.signIn(t, "ops-token", "ops · admin", "login")
	go load(ctx, api)

	// The key inspector: reserved, then completed with a markup body.
	r := must(t, 200)(api.Reserve(ctx, "payments", "order-42", map[string]any{"owner_token": "owner-token-order-42", "fingerprint": "sha256:9f2c"}))
	token := r.Str("fencing_token")
	admin.open(t, "/ui/keys/payments/order-42")
	if st, ft := admin.text(t, "#state"), admin.text(t, "#fencing-token"); st != "IN_PROGRESS" || ft != token {
		t.Fatalf("reserved key: state %q, fencing token %q; want IN_PROGRESS, %s", st, ft, token)
	}
	if s := admin.text(t, "#sentence"); !strings.Contains(s, "gets IN_PROGRESS") || !strings.Contains(s, "fencing token "+token) {
		t.Fatalf("reserved key's sentence: %q", s)
	}
	if s := admin.text(t, "#shard"); s != "r1-0" {
		t.Fatalf("shard %q, want r1-0", s)
	}
	admin.shot(t, "key-reserved")
	markup := `<script>window.__pwned = 1</script><img src="x" onerror="window.__pwned = 2">{"paid": true}`
	must(t, 200)(api.Complete(ctx, "payments", "order-42", map[string]any{"owner_token": "owner-token-order-42",
		"response": map[string]any{"status": 201, "headers": map[string]string{"Content-Type": "text/html"}, "body": base64.StdEncoding.EncodeToString([]byte(markup))}}))
	admin.open(t, "/ui/keys/payments/order-42")
	if st, ft := admin.text(t, "#state"), admin.text(t, "#fencing-token"); st != "COMPLETED" || ft != token {
		t.Fatalf("completed key: state %q, fencing token %q; want COMPLETED, %s", st, ft, token)
	}
	if s := admin.text(t, "#sentence"); !strings.Contains(s, "A retry with the same fingerprint replays the 201 stored at") ||
		!strings.Contains(s, "another fingerprint gets FINGERPRINT_MISMATCH") {
		t.Fatalf("completed key's sentence: %q", s)
	}
	if p := admin.text(t, "#preview"); !strings.Contains(p, "<script>window.__pwned = 1</script>") {
		t.Fatalf("the stored body is not shown as text: %q", p)
	}
	if get(t, admin, "look for the markup", chromedp.Evaluate[bool](`window.__pwned !== undefined || document.querySelectorAll("main script, main img").length > 0`)) {
		t.Fatal("the stored body's markup became part of the page")
	}
	admin.shot(t, "key")

	// Stuck work, force-released from the console.
	for _, k := range []string{"charge-7", "refund-3"} {
		must(t, 200)(api.Reserve(ctx, "payments", k, map[string]any{"owner_token": "owner-token-" + k, "lease_ms": 600000}))
	}
	must(t, 200)(api.Do(ctx, "POST", cluster.KeyPath("payments", "refund-3")+":checkpoint",
		map[string]any{"owner_token": "owner-token-refund-3", "name": "refund-sent", "data": ""}))
	testutil.Eventually(t, 20*time.Second, "the stuck keys listed", func() (bool, string) {
		admin.open(t, "/ui/stuck?older_than_s=1")
		s := admin.body(t)
		return strings.Contains(s, "charge-7") && strings.Contains(s, "refund-sent"), s
	})
	admin.shot(t, "stuck")
	form := `form[action="/ui/keys/payments/charge-7/force-release"]`
	admin.run(t, "force-release charge-7",
		chromedp.SendKeys(chromedp.CSS(form+` input[name="reason"]`), "payment provider timed out"),
		chromedp.Click(chromedp.CSS(form+` input[name="confirm"]`)),
		chromedp.Click(chromedp.CSS(form+` button`)),
		chromedp.WaitVisible(chromedp.CSS("#flash")))
	if s := admin.text(t, "#flash"); !strings.Contains(s, "payments/charge-7 was force-released") {
		t.Fatalf("after the force-release: %q", s)
	}
	if r := must(t, 200)(api.Reserve(ctx, "payments", "charge-7", map[string]any{"owner_token": "owner-token-retry-1"})); r.Str("outcome") != "RECLAIMED" {
		t.Fatalf("reserve after the console's force-release: %s", r)
	}

	// A reader of another namespace sees neither the key nor the stuck work.
	must(t, 200)(api.Reserve(ctx, "ledger", "entry-1", map[string]any{"owner_token": "owner-token-ledger-1"}))
	reader := newBrowser(t, ctx, exe, base)
	reader.signIn(t, "reader-token", "ledger-reader · reader", "")
	reader.open(t, "/ui/stuck?older_than_s=0")
	if s := reader.body(t); strings.Contains(s, "payments") || strings.Contains(s, "refund-3") || !strings.Contains(s, "ledger") {
		t.Fatalf("the ledger reader's stuck work:\n%s", s)
	}
	if forms := get(t, reader, "count the actions", chromedp.Evaluate[int](`document.querySelectorAll("main form[method=post]").length`)); forms != 0 {
		t.Fatalf("the reader is offered %d actions", forms)
	}
	reader.shot(t, "stuck-reader")
	reader.open(t, "/ui/keys/payments/order-42")
	if s := reader.body(t); !strings.Contains(s, "PERMISSION_DENIED") || strings.Contains(s, "Fencing token") || strings.Contains(s, "COMPLETED") || strings.Contains(s, "sha256:9f2c") {
		t.Fatalf("the ledger reader's view of a payments key:\n%s", s)
	}

	// A policy the API refuses shows the API's message.
	refused := must(t, 400)(api.Do(ctx, "PUT", "/v1/namespaces/payments/policy", map[string]any{"default_lease_ms": 5000, "max_lease_ms": 1000}))
	apiMsg := refused.Body["error"].(map[string]any)["message"].(string)
	admin.open(t, "/ui/namespaces")
	pform := `form[action="/ui/namespaces/payments/policy"]`
	admin.run(t, "edit the policy",
		chromedp.SetValue(chromedp.CSS(pform+` input[name="default_lease_ms"]`), "5000"),
		chromedp.SetValue(chromedp.CSS(pform+` input[name="max_lease_ms"]`), "1000"),
		chromedp.Click(chromedp.CSS(pform+` button`)),
		chromedp.WaitVisible(chromedp.CSS("#policy-problem")))
	if s := admin.text(t, "#policy-problem"); !strings.Contains(s, apiMsg) {
		t.Fatalf("refused policy: the page says %q, the API %q", s, apiMsg)
	}
	admin.shot(t, "namespaces")

	// Traffic: the load's outcomes, one point per sample interval.
	admin.open(t, "/ui/traffic")
	testutil.Eventually(t, 30*time.Second, "the orders chart drawn", func() (bool, string) {
		n := get(t, admin, "count the points", chromedp.Evaluate[int](`document.querySelectorAll("#chart-orders circle").length`))
		return n >= 12, fmt.Sprint(n, " points")
	})
	if s := admin.body(t); !strings.Contains(s, "ACQUIRED") || !strings.Contains(s, "FINGERPRINT_MISMATCH") || !strings.Contains(s, "p99") {
		t.Fatalf("the traffic page:\n%s", s)
	}
	admin.shot(t, "traffic")

	// A topology change: one shard per region to two, watched live.
	admin.open(t, "/ui/cluster")
	if s := admin.text(t, "#progress-state"); s != "done" {
		t.Fatalf("progress before the change: %q", s)
	}
	admin.shot(t, "cluster")
	get(t, admin, "mark the page", chromedp.Evaluate[string](`window.__loadedOnce = "yes"`))
	grown := topo.Clone()
	grown.ShardsPerRegion, grown.Version = 2, 2
	next := filepath.Join(dir, "topology-v2.yaml")
	if err := launch.WriteTopology(grown, next); err != nil {
		t.Fatal(err)
	}
	yaml, err := os.ReadFile(next)
	if err != nil {
		t.Fatal(err)
	}
	must(t, 200)(api.Do(ctx, "PUT", "/v1/topology", map[string]any{"topology": string(yaml)}))
	// The page shows the change running (a screenshot once partitions are
	// moving, else of the first running state seen), then done.
	var sawRunning, shotMoving bool
	testutil.Eventually(t, 90*time.Second, "the change shown done, version 2", func() (bool, string) {
		state, versions, parts := admin.text(t, "#progress-state"), admin.text(t, "#progress-versions"), admin.text(t, "#progress-partitions")
		if state == "running" {
			moving := !strings.HasPrefix(parts, "0 of") && parts != "–"
			if !sawRunning || moving && !shotMoving {
				admin.shot(t, "cluster-change")
				shotMoving = moving
			}
			sawRunning = true
		}
		return state == "done" && versions == "2", state + " " + versions + ", " + parts
	})
	if !sawRunning {
		t.Fatal("the page never showed the change running")
	}
	if get(t, admin, "read the mark", chromedp.Evaluate[string](`window.__loadedOnce || "reloaded"`)) != "yes" {
		t.Fatal("the cluster page was reloaded")
	}
	if s := admin.text(t, "#progress-recent"); !strings.Contains(s, "1 → 2") {
		t.Fatalf("last changes: %q", s)
	}
	admin.shot(t, "cluster-done")
}

// load runs until ctx ends: in namespace orders, a few calls a second
// through the node whose console the test reads, each key reserved,
// completed, replayed and once retried with another fingerprint, so that
// the traffic charts have several outcomes and nothing stays IN_PROGRESS.
func load(ctx context.Context, api *cluster.API) {
	for i := 0; ctx.Err() == nil; i++ {
		key, owner := fmt.Sprintf("order-%d", i), fmt.Sprintf("owner-token-load-%06d", i)
		if r, err := api.Reserve(ctx, "orders", key, map[string]any{"owner_token": owner, "fingerprint": "fp"}); err != nil || r.Status != 200 {
			continue
		}
		_, _ = api.Complete(ctx, "orders", key, map[string]any{"owner_token": owner, "response": map[string]any{"status": 200}})
		_, _ = api.Reserve(ctx, "orders", key, map[string]any{"fingerprint": "fp"})
		if i%3 == 0 {
			_, _ = api.Reserve(ctx, "orders", key, map[string]any{"fingerprint": "other"})
		}
		select {
		case <-ctx.Done():
		case <-time.After(150 * time.Millisecond):
		}
	}
}
