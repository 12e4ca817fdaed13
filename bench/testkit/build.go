package testkit

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

var built struct {
	once sync.Once
	dir  string
	bin  string
	err  error
	out  []byte
}

// Devicehub builds cmd/devicehub once per test binary and returns the
// binary's path; every test of the binary gets the same one. The go
// command must be in PATH (the test is skipped otherwise) and the test
// must run inside the module, as go test does. The binary lives in a
// temporary directory that [RemoveBuilt] removes: a package that uses
// Devicehub calls it from its TestMain.
func Devicehub(t testing.TB) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go is not in PATH")
	}
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "devicehub-testkit-"); built.err != nil {
			return
		}
		bin := filepath.Join(built.dir, "devicehub")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		built.out, built.err = exec.CommandContext(ctx, goBin, "build", "-o", bin, "devicehub/cmd/devicehub").CombinedOutput()
		built.bin = bin
	})
	if built.err != nil {
		t.Fatalf("go build devicehub/cmd/devicehub: %v\n%s", built.err, built.out)
	}
	return built.bin
}

// RemoveBuilt removes what Devicehub built; TestMain calls it after m.Run.
func RemoveBuilt() {
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
}

// RepoRoot is the repository's root: the nearest folder at or above the
// working directory holding go.mod.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		} else if !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("no go.mod at or above the working directory")
		}
		dir = up
	}
}
