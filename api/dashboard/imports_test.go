package dashboard

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImports: the package imports neither HTTP (api serves it) nor api
// nor ingest (doc.go).
func TestImports(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range file.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			switch {
			case strings.Contains(path, "fiber"), strings.Contains(path, "fasthttp"), path == "net/http",
				path == "devicehub/api", path == "devicehub/ingest", strings.HasPrefix(path, "devicehub/ingest/"):
				t.Errorf("%s imports %s", f, path)
			}
		}
	}
}
