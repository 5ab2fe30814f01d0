package console

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/idem-dev/idem/security/auth"
)

// A browser cannot send a bearer token by itself. Signing in (/ui/login)
// checks the token against the API and keeps it in a cookie that only the
// console's paths receive (Path=/ui/, HttpOnly, SameSite=Strict, Secure over
// TLS); Sessions, in front of the API's authentication, turns the cookie
// back into the Authorization header the API reads. A client certificate
// needs no sign-in.

// sessionCookie holds the signed-in principal's bearer token.
const sessionCookie = "idem_console_token"

// Sessions wraps the handler the HTTP listener serves (the API with its
// authentication): a request under /ui/ without an Authorization header
// gets one from the session cookie, and a page that the authentication
// refuses (401) sends the browser to the sign-in page. Other paths pass
// untouched: the JSON API never reads the cookie.
func Sessions(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/ui/") {
			next.ServeHTTP(w, r)
			return
		}
		if r.Header.Get("Authorization") == "" {
			if ck, err := r.Cookie(sessionCookie); err == nil && ck.Value != "" {
				r = r.Clone(r.Context())
				r.Header.Set("Authorization", "Bearer "+ck.Value)
			}
		}
		if r.Method == http.MethodGet && !strings.HasSuffix(r.URL.Path, ".json") && r.URL.Path != "/ui/login" {
			w = &toSignIn{ResponseWriter: w, r: r}
		}
		next.ServeHTTP(w, r)
	})
}

// toSignIn turns a 401 of a page into a redirect to the sign-in page.
type toSignIn struct {
	http.ResponseWriter
	r          *http.Request
	redirected bool
}

func (t *toSignIn) WriteHeader(code int) {
	if code == http.StatusUnauthorized && !t.redirected {
		t.redirected = true
		h := t.ResponseWriter.Header()
		for _, k := range []string{"Content-Type", "Content-Length", "WWW-Authenticate"} {
			h.Del(k)
		}
		securityHeaders(h)
		h.Set("Location", "/ui/login?next="+url.QueryEscape(t.r.URL.RequestURI()))
		t.ResponseWriter.WriteHeader(http.StatusSeeOther)
		return
	}
	t.ResponseWriter.WriteHeader(code)
}

func (t *toSignIn) Write(p []byte) (int, error) {
	if t.redirected {
		return len(p), nil // the refusal's JSON body is not for a browser
	}
	return t.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection.
func (t *toSignIn) Unwrap() http.ResponseWriter { return t.ResponseWriter }

type loginPage struct {
	Next    string
	Problem string
}

// safeNext is where to go after signing in: a console path of this
// origin only, never another site.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/ui/") || strings.HasPrefix(next, "//") || strings.Contains(next, "\\") {
		return "/ui/keys"
	}
	return next
}

func (c *Console) serveLogin(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "login", loginPage{Next: safeNext(r.URL.Query().Get("next"))})
}

// serveSignIn checks the token with the API (a request any known principal
// may make) and keeps it in the session cookie.
func (c *Console) serveSignIn(w http.ResponseWriter, r *http.Request) {
	fail := func(status int, msg string) {
		c.render(w, r, status, "login", loginPage{Next: safeNext(r.PostForm.Get("next")), Problem: msg})
	}
	if !sameOrigin(r) {
		fail(http.StatusForbidden, "This sign-in came from another site: it was refused.")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if err := r.ParseForm(); err != nil {
		fail(http.StatusBadRequest, "The form could not be read: "+err.Error())
		return
	}
	token := strings.TrimSpace(r.PostForm.Get("token"))
	if token == "" || strings.ContainsAny(token, " \t\r\n;,\"") {
		fail(http.StatusBadRequest, "Paste the bearer token the auth file maps to your name (no spaces).")
		return
	}
	reply := c.callAs(r, "Bearer "+token, http.MethodGet, "/v1/topology", nil, nil)
	if reply.Status == http.StatusUnauthorized || reply.Status == http.StatusTooManyRequests {
		code, msg := reply.Error()
		fail(reply.Status, code+": "+msg)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: token, Path: "/ui/", HttpOnly: true,
		Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, safeNext(r.PostForm.Get("next")), http.StatusSeeOther)
}

// serveSignOut forgets the session cookie.
func (c *Console) serveSignOut(w http.ResponseWriter, r *http.Request, _ *auth.Principal) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/ui/", MaxAge: -1, HttpOnly: true,
		Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}
