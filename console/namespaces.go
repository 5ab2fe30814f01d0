package console

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/idem-dev/idem/security/auth"
)

// countCap bounds the keys counted per state and namespace: one listing page.
const countCap = 1000

// namespaceRow is one namespace of the namespaces view.
type namespaceRow struct {
	Namespace  string
	Policy     policy
	HasPolicy  bool
	InProgress string
	Completed  string
	Refused    string
	Admin      bool
	// Form is what the edit form shows: the policy in force, or what the
	// admin sent when the API refused it.
	Form    policy
	Problem string
}

type namespacesPage struct {
	Rows []namespaceRow
}

// count is how many keys of ns are in state, "1000+" past one page.
func (c *Console) count(r *http.Request, ns, state string) string {
	q := url.Values{"state": {state}, "limit": {strconv.Itoa(countCap)}}
	reply := c.call(r, http.MethodGet, nsPath(ns, "keys"), q, nil)
	if !reply.OK() {
		code, _ := reply.Error()
		return code
	}
	var page struct {
		Keys []listedKey `json:"keys"`
		Next string      `json:"next_page_token"`
	}
	if err := reply.Decode(&page); err != nil {
		return "?"
	}
	if page.Next != "" {
		return fmt.Sprintf("%d+", len(page.Keys))
	}
	return strconv.Itoa(len(page.Keys))
}

func (c *Console) namespaceRows(r *http.Request, extra string) []namespaceRow {
	var rows []namespaceRow
	for _, ns := range c.visibleNamespaces(r, extra) {
		row := namespaceRow{Namespace: ns, Admin: isAdmin(principal(r), ns)}
		reply := c.call(r, http.MethodGet, nsPath(ns, "policy"), nil, nil)
		if !reply.OK() {
			code, msg := reply.Error()
			row.Refused = code + ": " + msg
			rows = append(rows, row)
			continue
		}
		row.HasPolicy = reply.Decode(&row.Policy) == nil
		row.Form = row.Policy
		row.InProgress, row.Completed = c.count(r, ns, "IN_PROGRESS"), c.count(r, ns, "COMPLETED")
		rows = append(rows, row)
	}
	return rows
}

func (c *Console) serveNamespaces(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "namespaces", namespacesPage{Rows: c.namespaceRows(r, r.URL.Query().Get("show"))})
}

// policyFields are the form's fields, as the API names them.
var policyFields = []string{"default_lease_ms", "max_lease_ms", "default_retention_s", "max_retention_s", "tombstone_s"}

// serveSetPolicy sends the form to the API's PUT of the policy: the API
// validates it; a refusal is shown with the API's message next to the form.
func (c *Console) serveSetPolicy(w http.ResponseWriter, r *http.Request, _ *auth.Principal) {
	ns := r.PathValue("ns")
	body := map[string]any{}
	var sent policy
	var problems []string
	for _, f := range policyFields {
		v := strings.TrimSpace(r.PostForm.Get(f))
		if v == "" {
			continue // left out: the API's built-in default
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s %q is not a whole number", f, v))
			continue
		}
		body[f] = n
		switch f {
		case "default_lease_ms":
			sent.DefaultLeaseMs = n
		case "max_lease_ms":
			sent.MaxLeaseMs = n
		case "default_retention_s":
			sent.DefaultRetentionS = n
		case "max_retention_s":
			sent.MaxRetentionS = n
		case "tombstone_s":
			sent.TombstoneS = n
		}
	}
	problem, status := "", http.StatusOK
	if len(problems) > 0 {
		problem, status = "INVALID_ARGUMENT: "+strings.Join(problems, "; "), http.StatusBadRequest
	} else {
		reply := c.call(r, http.MethodPut, nsPath(ns, "policy"), nil, body)
		if reply.OK() {
			q := url.Values{"done": {"policy"}, "ns": {ns}, "show": {ns}}
			http.Redirect(w, r, "/ui/namespaces?"+q.Encode(), http.StatusSeeOther)
			return
		}
		code, msg := reply.Error()
		problem, status = code+": "+msg, reply.Status
	}
	rows := c.namespaceRows(r, ns)
	for i := range rows {
		if rows[i].Namespace == ns {
			rows[i].Form, rows[i].Problem = sent, problem
		}
	}
	c.render(w, r, status, "namespaces", namespacesPage{Rows: rows})
}
