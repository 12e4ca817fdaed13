package fwdevice

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// bufPool holds the read buffers: a fleet downloading at once holds one
// per download, not one per device.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}

// errCut is the simulated cut of a download (Faults.CutAt).
var errCut = errors.New("download cut on purpose")

// download fetches j's image into the updater's partial image, resuming
// from what it holds (a restarted job) and after a broken connection, and
// reports DOWNLOADING every Step percent. It returns the complete image.
func (u *Updater) download(j *job) (*partial, error) {
	up := j.up
	if up.Size < 0 || up.URL == "" || len(up.SHA256) != 64 {
		return nil, fmt.Errorf("bad upgrade: size %d, url %q, sha256 %q", up.Size, up.URL, up.SHA256)
	}
	u.mu.Lock()
	p := u.partial
	if p == nil || p.sha256 != up.SHA256 || p.size != up.Size {
		p = &partial{sha256: up.SHA256, size: up.Size, h: sha256.New()}
		u.partial = p
	}
	cutAt := int64(-1)
	if c := u.opts.Faults.CutAt; c > 0 && !u.cutDone {
		u.cutDone = true
		cutAt = int64(c * float64(up.Size))
	}
	u.mu.Unlock()
	if p.n == up.Size && up.Size > 0 {
		return p, nil // a restarted job whose image is all here
	}
	last := percent(p.n, up.Size) // the last DOWNLOADING report
	resumes := 0
	for {
		err := u.fetch(j, p, &cutAt, &last)
		if err == nil && p.n < up.Size {
			err = fmt.Errorf("body ended at %d of %d bytes", p.n, up.Size)
		}
		if err == nil {
			break
		}
		if j.ctx.Err() != nil {
			if errors.Is(j.ctx.Err(), context.DeadlineExceeded) {
				return nil, fmt.Errorf("timeout after %s: %d of %d bytes downloaded", u.opts.Timeout, p.n, up.Size)
			}
			return nil, j.ctx.Err()
		}
		var fatal *fatalErr
		if errors.As(err, &fatal) {
			return nil, fatal.err
		}
		if resumes++; resumes > u.opts.MaxResumes {
			return nil, fmt.Errorf("download: %w (after %d resumes)", err, u.opts.MaxResumes)
		}
		u.Resumes.Add(1)
		var se *serverErr
		if errors.As(err, &se) {
			u.ServerErrors.Add(1)
			wait := u.opts.RetryWait << min(resumes-1, 4)
			select {
			case <-time.After(wait):
			case <-j.ctx.Done():
			}
		}
	}
	if p.n != up.Size {
		return nil, fmt.Errorf("size mismatch: downloaded %d bytes, expected %d", p.n, up.Size)
	}
	return p, nil
}

// serverErr is a 5xx answer: retried after a pause, within MaxResumes.
type serverErr struct{ err error }

func (e *serverErr) Error() string { return e.err.Error() }

// fatalErr is a download error that a resume would not mend.
type fatalErr struct{ err error }

func (e *fatalErr) Error() string { return e.err.Error() }

func percent(n, size int64) int {
	if size <= 0 {
		return 100
	}
	return int(n * 100 / size)
}

// fetch makes one request for the rest of the image (a range request if
// p holds some) and reads it into p. A broken body is a plain error (the
// caller resumes); an HTTP refusal or a body that does not fit is fatal.
func (u *Updater) fetch(j *job, p *partial, cutAt *int64, last *int) error {
	up := j.up
	req, err := http.NewRequestWithContext(j.ctx, http.MethodGet, up.URL, nil)
	if err != nil {
		return &fatalErr{fmt.Errorf("bad url: %w", err)}
	}
	req.SetBasicAuth(u.opts.SecureID, u.opts.SecureKey)
	if p.n > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(p.n, 10)+"-")
	}
	resp, err := u.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		if p.n > 0 { // the server sent the whole file: start over
			p.h.Reset()
			p.n, p.buf = 0, p.buf[:0]
		}
		if resp.ContentLength >= 0 && resp.ContentLength != up.Size {
			return &fatalErr{fmt.Errorf("size mismatch: Content-Length %d, expected %d", resp.ContentLength, up.Size)}
		}
	case http.StatusPartialContent:
		start, ok := rangeStart(resp.Header.Get("Content-Range"))
		if !ok || start != p.n {
			return &fatalErr{fmt.Errorf("bad 206: Content-Range %q for offset %d", resp.Header.Get("Content-Range"), p.n)}
		}
	default:
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		err := fmt.Errorf("http %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))
		if resp.StatusCode >= 500 {
			return &serverErr{err} // transient: asked again after a pause
		}
		return &fatalErr{err}
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	for {
		want := buf
		if *cutAt >= 0 && int64(len(want)) > *cutAt-p.n {
			want = want[:max(*cutAt-p.n, 0)]
			if len(want) == 0 {
				*cutAt = -1
				return errCut // closing the body drops the connection
			}
		}
		n, err := resp.Body.Read(want)
		if n > 0 {
			if p.n+int64(n) > up.Size {
				return &fatalErr{fmt.Errorf("size mismatch: more than the %d bytes expected", up.Size)}
			}
			p.h.Write(want[:n])
			if u.opts.KeepImage {
				p.buf = append(p.buf, want[:n]...)
			}
			p.n += int64(n)
			u.Downloaded.Add(int64(n))
			if pc := percent(p.n, up.Size); pc >= *last+u.opts.Step && pc < 100 {
				*last = pc - pc%u.opts.Step
				reported := *last
				if err := u.enter(j, Downloading, &reported); err != nil {
					return &fatalErr{err}
				}
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// rangeStart is the first byte of a Content-Range "bytes N-M/T".
func rangeStart(v string) (int64, bool) {
	rest, ok := strings.CutPrefix(v, "bytes ")
	if !ok {
		return 0, false
	}
	first, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(first, 10, 64)
	return n, err == nil
}
