package console

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// apiReply is the JSON API's answer to one of the console's requests.
type apiReply struct {
	Status int
	Header http.Header
	Body   []byte
}

// OK reports a 2xx answer.
func (a apiReply) OK() bool { return a.Status >= 200 && a.Status < 300 }

// Error is the API's error message ({"error": {"code", "message"}}), or
// the status when the body is not one.
func (a apiReply) Error() (code, message string) {
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(a.Body, &e) == nil && e.Error.Code != "" {
		return e.Error.Code, e.Error.Message
	}
	return http.StatusText(a.Status), strings.TrimSpace(string(a.Body))
}

// Decode reads the body into v.
func (a apiReply) Decode(v any) error { return json.Unmarshal(a.Body, v) }

// recorder is a minimal http.ResponseWriter that keeps the answer.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(p)
}
func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}

// call sends one request to the JSON API in-process, with the credentials
// of the browser's request from (its TLS state, hence its client
// certificate, and its Authorization header): the API authenticates and
// authorizes it as if the browser had sent it. body, when not nil, is sent
// as JSON.
func (c *Console) call(from *http.Request, method, path string, query url.Values, body any) apiReply {
	return c.callAs(from, from.Header.Get("Authorization"), method, path, query, body)
}

// callAs is call with the Authorization header authorization ("" none).
func (c *Console) callAs(from *http.Request, authorization, method, path string, query url.Values, body any) apiReply {
	var rd io.Reader = http.NoBody
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return apiReply{Status: http.StatusInternalServerError, Body: []byte(err.Error())}
		}
		rd = bytes.NewReader(data)
	}
	target := path // already escaped (keyPath, nsPath)
	if q := query.Encode(); q != "" {
		target += "?" + q
	}
	req, err := http.NewRequestWithContext(from.Context(), method, target, rd)
	if err != nil {
		return apiReply{Status: http.StatusBadRequest, Body: []byte(err.Error())}
	}
	req.Host, req.RemoteAddr, req.TLS = from.Host, from.RemoteAddr, from.TLS
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	rec := &recorder{header: http.Header{}}
	c.cfg.API.ServeHTTP(rec, req)
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	return apiReply{Status: rec.status, Header: rec.header, Body: rec.body.Bytes()}
}

// keyPath is the API path of a key, each name percent-encoded.
func keyPath(ns, key string) string {
	return "/v1/namespaces/" + url.PathEscape(ns) + "/keys/" + url.PathEscape(key)
}

// nsPath joins the API path of namespace ns and rest.
func nsPath(ns, rest string) string {
	return "/v1/namespaces/" + url.PathEscape(ns) + "/" + rest
}
