package firmware

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// ErrTooLarge: an upload went past the largest package size.
var ErrTooLarge = errors.New("firmware: package over the size limit")

// Files keeps package files in one directory (DEVICEHUB_FIRMWARE_DIR):
// one file per package, named by its id. An upload is streamed to a
// temporary file of its own in that directory (Stage: a unique name per
// upload, so uploads at once never share one; the same file system, so
// its rename is atomic) and renamed to the package's name only in the
// transaction that stores the package's row (Staged.Place, called by
// Store.CreatePackage before its commit), so that a file by a package's
// name is always complete and no upload holds more than a copy buffer in
// memory.
type Files struct {
	dir string
	max int64
}

// NewFiles keeps files in dir (made if missing), each at most max bytes.
func NewFiles(dir string, max int64) (*Files, error) {
	if dir == "" {
		return nil, errors.New("firmware: no package directory")
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("firmware: package directory: %w", err)
	}
	return &Files{dir: dir, max: max}, nil
}

// Max is the largest package size.
func (f *Files) Max() int64 { return f.max }

// Staged is an upload written whole under a temporary name in the
// package directory, with its size and SHA-256: Place names it after its
// package, Discard removes it (one of them, always).
type Staged struct {
	f      *Files
	tmp    string
	Size   int64
	SHA256 string
}

// Stage streams r into a new temporary file, computing its size and
// SHA-256 on the way (never holding it in memory). Past Max it stops
// reading with ErrTooLarge and leaves nothing.
func (f *Files) Stage(r io.Reader) (st *Staged, err error) {
	tmp, err := os.CreateTemp(f.dir, ".upload-*")
	if err != nil {
		return nil, fmt.Errorf("firmware: store package: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(r, f.max+1))
	if err != nil {
		return nil, fmt.Errorf("firmware: store package: %w", err)
	}
	if n > f.max {
		return nil, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, f.max)
	}
	if err = tmp.Sync(); err != nil {
		return nil, fmt.Errorf("firmware: store package: %w", err)
	}
	if err = tmp.Close(); err != nil {
		return nil, fmt.Errorf("firmware: store package: %w", err)
	}
	return &Staged{f: f, tmp: tmp.Name(), Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// FileName is the name of package id's file.
func FileName(id string) string { return id + ".bin" }

// Place renames the upload to package id's file.
func (s *Staged) Place(id string) error {
	if err := os.Rename(s.tmp, filepath.Join(s.f.dir, FileName(id))); err != nil {
		return fmt.Errorf("firmware: store package: %w", err)
	}
	s.tmp = ""
	return nil
}

// Discard removes the upload if it was not placed.
func (s *Staged) Discard() {
	if s.tmp != "" {
		os.Remove(s.tmp)
		s.tmp = ""
	}
}

// Open opens a package's file.
func (f *Files) Open(name string) (*os.File, error) {
	if name == "" || strings.ContainsAny(name, `/\`) || strings.HasPrefix(name, ".") {
		return nil, fmt.Errorf("firmware: bad file name %q", name)
	}
	return os.Open(filepath.Join(f.dir, name))
}

// Remove removes a package's file (gone already is fine).
func (f *Files) Remove(name string) error {
	if name == "" || strings.ContainsAny(name, `/\`) || strings.HasPrefix(name, ".") {
		return nil
	}
	err := os.Remove(filepath.Join(f.dir, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}
