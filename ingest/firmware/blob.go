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
// one file per package, named by its id, written whole under a temporary
// name and renamed into place, so that a file by a package's name is
// always complete.
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

// Write streams r into the file of package id, computing its size and
// SHA-256 on the way (never holding it in memory), and returns the file's
// name. Past Max it stops with ErrTooLarge and leaves nothing.
func (f *Files) Write(id string, r io.Reader) (name string, size int64, sum string, err error) {
	tmp, err := os.CreateTemp(f.dir, ".upload-*")
	if err != nil {
		return "", 0, "", fmt.Errorf("firmware: store package: %w", err)
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
		return "", 0, "", fmt.Errorf("firmware: store package: %w", err)
	}
	if n > f.max {
		return "", 0, "", fmt.Errorf("%w: more than %d bytes", ErrTooLarge, f.max)
	}
	if err = tmp.Sync(); err != nil {
		return "", 0, "", fmt.Errorf("firmware: store package: %w", err)
	}
	if err = tmp.Close(); err != nil {
		return "", 0, "", fmt.Errorf("firmware: store package: %w", err)
	}
	name = id + ".bin"
	if err = os.Rename(tmp.Name(), filepath.Join(f.dir, name)); err != nil {
		return "", 0, "", fmt.Errorf("firmware: store package: %w", err)
	}
	return name, n, hex.EncodeToString(h.Sum(nil)), nil
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
