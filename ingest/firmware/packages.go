package firmware

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/lib/pq"

	"devicehub/schema"
)

// Limits of a package's text fields (characters).
const (
	MaxVersionLen      = 64
	MaxNameLen         = 128
	MaxSignatureLen    = 4096
	MaxReleaseNotesLen = 16 << 10
)

// CheckPackage refuses a package's bad fields, naming them.
func CheckPackage(p Package) error {
	for _, f := range []struct {
		name, v  string
		max      int
		required bool
	}{
		{"productId", p.ProductID, 64, true},
		{"version", p.Version, MaxVersionLen, true},
		{"name", p.Name, MaxNameLen, false},
		{"signature", p.Signature, MaxSignatureLen, false},
		{"releaseNotes", p.ReleaseNotes, MaxReleaseNotesLen, false},
	} {
		switch {
		case f.required && f.v == "":
			return schema.Invalid(f.name, "is required")
		case len(f.v) > f.max:
			return schema.Invalid(f.name, "at most %d bytes", f.max)
		case !utf8.ValidString(f.v):
			return schema.Invalid(f.name, "is not UTF-8 text")
		}
	}
	for _, r := range p.Version {
		if r <= ' ' || r == '"' || r == '\\' {
			return schema.Invalid("version", "no spaces, quotes or control characters")
		}
	}
	return nil
}

// Upload stores a package: its file streamed from body to a temporary
// file (size and SHA-256 computed on the way, at most Files.Max bytes: a
// larger one is refused, field "file", without reading the rest), then
// its row, in whose transaction the file is renamed into place
// (Store.CreatePackage). Nothing is left half-written: the temporary
// file is removed on any failure, and the placed file when the commit
// fails; a crash between the rename and the commit leaves a file no row
// names (never served), rather than a row whose file is missing.
func (s *Service) Upload(ctx context.Context, p Package, body io.Reader) (Package, error) {
	if err := CheckPackage(p); err != nil {
		return Package{}, err
	}
	st, err := s.files.Stage(body)
	if errors.Is(err, ErrTooLarge) {
		return Package{}, schema.Invalid("file", "larger than the largest package, %d bytes", s.files.Max())
	}
	if err != nil {
		return Package{}, err
	}
	defer st.Discard()
	return s.UploadStaged(ctx, p, st)
}

// UploadStaged stores package p of the file st (Stage), which it places
// or leaves to the caller to Discard.
func (s *Service) UploadStaged(ctx context.Context, p Package, st *Staged) (Package, error) {
	if err := CheckPackage(p); err != nil {
		return Package{}, err
	}
	if st.Size == 0 {
		return Package{}, schema.Invalid("file", "is empty")
	}
	p.ID = NewID()
	if p.Name == "" {
		p.Name = p.Version
	}
	p.FileName, p.Size, p.SHA256 = FileName(p.ID), st.Size, st.SHA256
	out, err := s.store.CreatePackage(ctx, p, func() error { return st.Place(p.ID) })
	if errors.Is(err, errCommit) {
		_ = s.files.Remove(p.FileName)
	}
	if err != nil {
		return Package{}, err
	}
	return out, nil
}

// DeletePackage deletes a package no rollout uses, then its file.
func (s *Service) DeletePackage(ctx context.Context, id string) (Package, error) {
	p, err := s.store.DeletePackage(ctx, id)
	if err != nil {
		return Package{}, err
	}
	if err := s.files.Remove(p.FileName); err != nil {
		s.log.Warn("firmware: a deleted package's file stays", "file", p.FileName, "err", err)
	}
	return p, nil
}

// CreateRollout checks sp and creates the rollout of its package (which
// must be of a product ctx may reach: checked by the caller), then wakes
// the engine.
func (s *Service) CreateRollout(ctx context.Context, pkg Package, sp Spec, creatorID string) (Rollout, error) {
	if err := sp.Check(); err != nil {
		return Rollout{}, err
	}
	r, err := s.store.CreateRollout(ctx, pkg, sp, creatorID)
	if err == nil {
		s.Wake()
	}
	return r, err
}

// Pause, Resume and Cancel move a rollout (meta.ErrConflict from a state
// that does not allow it).
func (s *Service) Pause(ctx context.Context, id string) (Rollout, error) {
	return s.store.SetState(ctx, id, RolloutPaused, "", RolloutRunning)
}

// Resume runs a paused rollout again.
func (s *Service) Resume(ctx context.Context, id string) (Rollout, error) {
	r, err := s.store.SetState(ctx, id, RolloutRunning, "", RolloutPaused)
	if err == nil {
		s.Wake()
	}
	return r, err
}

// Cancel ends a running or paused rollout: its devices not started are
// CANCELED; those started may still finish.
func (s *Service) Cancel(ctx context.Context, id string) (Rollout, error) {
	return s.store.SetState(ctx, id, RolloutCanceled, "canceled", RolloutRunning, RolloutPaused)
}

// refTTL is how long a download's read of its package (file, size,
// SHA-256) is reused: a fleet downloading at once (and resuming) asks
// for the same package thousands of times. A deleted package's links
// answer 404 within it (its file is removed at once: Files.Open fails
// before).
const refTTL = 2 * time.Second

type cachedFile struct {
	ref PackageFile
	at  time.Time
}

// ErrBusy: the database cannot take a download's lookup now (the
// lookups allowed at once are taken past LookupWait, or PostgreSQL
// refuses or times out); the download is to be asked again shortly
// (HTTP 503 with Retry-After).
var ErrBusy = errors.New("firmware: busy, retry shortly")

// IsBusy reports whether err is a download lookup that found the
// database busy rather than an answer: ErrBusy, a deadline, or
// PostgreSQL refusing a connection (53xxx insufficient resources, e.g.
// too many clients; 57P03 cannot connect now; 08xxx connection errors).
func IsBusy(err error) bool {
	if errors.Is(err, ErrBusy) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var pqErr *pq.Error
	if errors.As(err, &pqErr) {
		c := string(pqErr.Code)
		return strings.HasPrefix(c, "53") || c == "57P03" || strings.HasPrefix(c, "08")
	}
	return false
}

// lookup runs a download's read of the database, at most Options.Lookups
// at once: a fleet starting its downloads at once would otherwise take
// every connection of the pool (32), leaving none to the reports and
// the engine, and wait on it past the store's timeout (HTTP 500 then);
// a lookup that cannot begin within LookupWait is ErrBusy.
func (s *Service) lookup(ctx context.Context, what string, read func() error) error {
	t := time.NewTimer(s.opt.LookupWait)
	select {
	case s.lookups <- struct{}{}:
		t.Stop()
	case <-t.C:
		return fmt.Errorf("download lookup of %s: %d lookups at once for %v: %w", short(what), cap(s.lookups), s.opt.LookupWait, ErrBusy)
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	}
	defer func() { <-s.lookups }()
	s.m.lookups.Inc()
	return read()
}

// PackageFile is the package a download sends (Found false when it is
// gone), read from the database at most once per refTTL and instance
// whatever the downloads asking at once (they wait for the one read),
// through lookup.
func (s *Service) PackageFile(ctx context.Context, packageID string) (PackageFile, error) {
	now := time.Now()
	s.refMu.Lock()
	c, ok := s.pkgFiles[packageID]
	s.refMu.Unlock()
	if ok && now.Sub(c.at) < refTTL {
		return c.ref, nil
	}
	_ = ctx // the read below is shared: see there
	v, err, _ := s.fileReads.Do(packageID, func() (any, error) {
		var ref PackageFile
		// The service's context, not the first asker's: the others wait
		// for this read too.
		err := s.lookup(s.ctx, "package "+packageID, func() (err error) {
			ref, err = s.store.PackageFile(s.ctx, packageID)
			return err
		})
		if err != nil {
			return ref, err
		}
		s.refMu.Lock()
		if s.pkgFiles == nil || len(s.pkgFiles) >= 10_000 {
			s.pkgFiles = map[string]cachedFile{}
		}
		s.pkgFiles[packageID] = cachedFile{ref: ref, at: now}
		s.refMu.Unlock()
		return ref, nil
	})
	return v.(PackageFile), err
}

// SecureIDOwner is Store.SecureIDOwner through lookup: the rare
// download whose credentials are not those its link was signed for
// (another device's, wrong ones, a key rotated since, or a link of the
// earlier format).
func (s *Service) SecureIDOwner(ctx context.Context, secureID string) (id, key string, err error) {
	err = s.lookup(ctx, "secureId "+secureID, func() (err error) {
		id, key, err = s.store.SecureIDOwner(ctx, secureID)
		return err
	})
	return id, key, err
}
