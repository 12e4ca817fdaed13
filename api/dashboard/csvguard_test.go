package dashboard

import "testing"

// TestFormulaLike is the CSV export's formula guard over what OWASP's CSV
// injection guidance names (a leading = + - @, tab or carriage return)
// and what spreadsheets also take for one: those characters after
// leading spaces (ASCII, no-break, ideographic, zero-width) and their
// fullwidth forms (＝ ＋ － ＠, which a Japanese or Chinese Excel reads as
// = + - @). Numbers as they stand stay numbers.
func TestFormulaLike(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want bool
	}{
		{"=1+1", true},
		{"+cmd|' /C calc'!A0", true},
		{"-2+3", true},
		{"@SUM(1)", true},
		{"\t=1", true},
		{"\tplain", true},
		{"\r=1", true},
		{"\rplain", true},
		{" =1", true},
		{"   +1+1", true},
		{" -3.5", true}, // not a number as it stands: a reader may trim it first
		{"\u00a0=1", true},
		{"\u00a0\u00a0@x", true},
		{"\u3000=1", true},
		{"\u200b=1", true},
		{"\ufeff=1", true},
		{"\n=1", true},
		{"＝1+1", true},
		{"＋1", true},
		{"－1", true},
		{"＠SUM(1)", true},
		{" ＝1", true},
		{"\u00a0＝1", true},
		{"-Inf", true},
		{"+NaN", true},
		{"-0x1p3", true},
		{"-1_000", true},
		{"-3.5", false},
		{"+12", false},
		{"-1e3", false},
		{"1e3", false},
		{"", false},
		{" ", false},
		{"Eco", false},
		{"a=b", false},
		{"a ＝ b", false},
		{" plain", false},
		{"\u00a0plain", false},
		{"100%", false},
	} {
		if got := formulaLike(c.in); got != c.want {
			t.Errorf("formulaLike(%q) = %v, want %v", c.in, got, c.want)
		}
	}
	// What the guard writes: the cell after a ', quoted when it must be.
	for in, want := range map[string]string{
		" =1":        "' =1",
		"\u00a0=1":   "'\u00a0=1",
		"＝1":         "'＝1",
		"=1,2":       `"'=1,2"`,
		"-3.5":       "-3.5",
		"plain":      "plain",
		"\r=cmd":     "\"'\r=cmd\"",
		`=HYPER("")`: `"'=HYPER("""")"`,
	} {
		if got := string(appendCSVField(nil, in)); got != want {
			t.Errorf("appendCSVField(%q) = %q, want %q", in, got, want)
		}
	}
}
