package console

import (
	"embed"
	"fmt"
	"html/template"
	"net/url"
	"strings"
	"time"
)

// assets are the pages' templates and the static files (CSS, script),
// served from the binary: the console works offline.
//
//go:embed assets
var assets embed.FS

// pageNames are the templates under assets/, each drawn inside layout.html.
var pageNames = []string{"login", "search", "key", "stuck", "cluster", "namespaces", "traffic", "error"}

func parsePages(now func() time.Time) (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"join":       strings.Join,
		"pathEscape": url.PathEscape,
		"when":       func(t string) string { return when(t, now()) },
	}
	pages := map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(funcs).ParseFS(assets, "assets/layout.html", "assets/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: page %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// when shows an API time (RFC 3339) to the second in UTC, and how far it
// is from now ("in 25s", "3m10s ago").
func when(t string, now time.Time) string {
	at, err := time.Parse(time.RFC3339Nano, t)
	if err != nil {
		return t
	}
	d := at.Sub(now).Round(time.Second)
	rel := "now"
	switch {
	case d > 0:
		rel = "in " + d.String()
	case d < 0:
		rel = (-d).String() + " ago"
	}
	return at.UTC().Format("2006-01-02 15:04:05 UTC") + " (" + rel + ")"
}
