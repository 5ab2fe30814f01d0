package console

import (
	"embed"
	"fmt"
	"html/template"
	"strings"
)

// assets are the pages' templates and the static files (CSS, script),
// served from the binary: the console works offline.
//
//go:embed assets
var assets embed.FS

// pageNames are the templates under assets/, each drawn inside layout.html.
var pageNames = []string{"search", "key", "stuck", "cluster", "namespaces", "traffic", "error"}

func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"join": strings.Join,
		"pct":  func(n int) string { return fmt.Sprintf("%d%%", n) },
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
