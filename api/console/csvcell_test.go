package console

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// TestCSVCellGuardsFormulas runs the console's csvCell (static/core.js),
// the cells of the device-logins.csv it offers after an import, in
// Node.js: a secureId or id a spreadsheet would run as a formula is
// written after a ', as the API's CSV export writes it (api/export.go
// formulaLike, whose table this follows). Node.js is a tool of the build
// already (make lint); missing, it fails the test rather than skip it.
func TestCSVCellGuardsFormulas(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node (Node.js) is needed to run the console's JavaScript: ", err)
	}
	core, err := os.ReadFile("static/core.js")
	if err != nil {
		t.Fatal(err)
	}
	fn := regexp.MustCompile(`(?s)\nfunction csvCell\(v\) \{\n.*?\n\}\n`).Find(core)
	if fn == nil {
		t.Fatal("core.js has no function csvCell(v)")
	}
	// The logins file is written with it, every cell.
	imp, err := os.ReadFile("static/import.js")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`\[d\.id, d\.secureId, d\.secureKey\]\.map\(csvCell\)`).Match(imp) {
		t.Fatal("import.js writes device-logins.csv without csvCell")
	}
	cases := map[string]string{
		"=1+1":                "'=1+1",
		`=HYPERLINK("x","y")`: `"'=HYPERLINK(""x"",""y"")"`,
		"+cmd|' /C calc'!A0":  "'+cmd|' /C calc'!A0",
		"-2+3":                "'-2+3",
		"@SUM(1)":             "'@SUM(1)",
		"\t=1":                "'\t=1",
		"\r=1":                "\"'\r=1\"",
		" =1":                 "' =1",
		"\u00a0=1":            "'\u00a0=1",
		"\u3000@x":            "'\u3000@x",
		"\u200b=1":            "'\u200b=1",
		"\ufeff+1":            "'\ufeff+1",
		"＝1+1":                "'＝1+1",
		"＋1":                  "'＋1",
		"－1":                  "'－1",
		"＠SUM(1)":             "'＠SUM(1)",
		" -3.5":               "' -3.5",
		"-Infinity":           "'-Infinity",
		"-3.5":                "-3.5",
		"+12":                 "+12",
		"1e3":                 "1e3",
		"a=b":                 "a=b",
		"meter-1":             "meter-1",
		"a,b":                 `"a,b"`,
		" plain":              `" plain"`,
		"":                    "",
		"0123abcd":            "0123abcd",
	}
	var in []string
	for k := range cases {
		in = append(in, k)
	}
	input, _ := json.Marshal(in)
	script := string(fn) + "\nconst input = JSON.parse(require('fs').readFileSync(0, 'utf8'));\n" +
		"process.stdout.write(JSON.stringify(input.map(csvCell)));\n"
	cmd := exec.Command(node, "-e", "'use strict';"+script)
	cmd.Stdin = strings.NewReader(string(input))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v: %s", err, out)
	}
	var got []string
	if err := json.Unmarshal(out, &got); err != nil || len(got) != len(in) {
		t.Fatalf("node answered %q: %v", out, err)
	}
	for i, v := range in {
		if got[i] != cases[v] {
			t.Errorf("csvCell(%q) = %q, want %q", v, got[i], cases[v])
		}
	}
}
