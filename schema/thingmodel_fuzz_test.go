package schema

import (
	"errors"
	"testing"
)

func FuzzParseThingModel(f *testing.F) {
	f.Add(fullThingModel)
	f.Add(`{}`)
	f.Add(`{"properties":[{"id":"p","name":"<&>\u2028\ud800","valueType":{"type":"int"},"x":"\xff"}]}`)
	for _, c := range invalidCases {
		f.Add(c.input)
	}
	f.Fuzz(func(t *testing.T, input string) {
		m, err := ParseThingModelString(input)
		if err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) || !errors.Is(err, ErrInvalidThingModel) {
				t.Fatalf("unexpected error type %T: %s", err, err)
			}
			return
		}
		out := m.String()
		m2, err := ParseThingModelString(out)
		if err != nil {
			t.Fatalf("re-parse of %q failed: %s\ninput: %q", out, err, input)
		}
		if out2 := m2.String(); out2 != out {
			t.Fatalf("not byte-identical\nfirst:  %q\nsecond: %q\ninput: %q", out, out2, input)
		}
	})
}
