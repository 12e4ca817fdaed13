package forward

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A spool is one rule's append-only, size-bounded buffer on disk: the
// messages taken for the rule and not yet accepted by its sink, in the
// order taken, and the cursor (the last message the sink accepted).
//
// On disk: <dir>/<first seq, 20 digits>.seg segment files of lines
// "<seq> <taken, unix ms> <message JSON>\n", and <dir>/cursor holding
// "<cursor> <dropped> <sent> <failed>\n" (written to a temporary file,
// synced and renamed over). Appends go to the last segment; sync writes
// and fsyncs them; only synced messages are read for sending, and only
// after sync are the broker's messages acknowledged (forwarder.go).
// Segments wholly at or below the cursor are deleted; at the bound
// (maxBytes) the oldest segments are deleted unsent and their unsent
// messages counted as dropped (README: what happens at the bound).
type spool struct {
	dir    string
	max    int64 // bound of the segments' total size
	segMax int64 // a segment is closed at this size

	mu     sync.Mutex
	segs   []segment // ascending; the last is the one appended to
	f      *os.File  // the last segment
	buf    []byte    // appended, not yet written
	next   uint64    // seq of the next message
	synced uint64    // every seq up to this one is written and synced
	cursor uint64    // every seq up to this one is accepted by the sink (or dropped)
	total  int64     // bytes of the segments, buf included

	dropped, sent, failed uint64
	lastErr               string

	// The reader: the sender reads after rseq, from rseg at roff.
	rseq  uint64
	rf    *os.File
	rseg  uint64 // first seq of the segment rf is
	roff  int64
	rbuf  []byte
	head  int64 // taken time (ms) of the message cursor+1 once read
	wake  chan struct{}
	dirty bool
}

type segment struct {
	first uint64
	size  int64
}

// Bounds of a segment's size: about an eighth of the bound, so that the
// bound drops about an eighth of the backlog at a time.
const (
	minSegment = 64 << 10
	maxSegment = 64 << 20
)

func (s *spool) segPath(first uint64) string {
	return filepath.Join(s.dir, fmt.Sprintf("%020d.seg", first))
}

// openSpool opens (or creates) the spool in dir. A torn last line (a
// crash in a write) is cut off: its message was never acknowledged to
// the broker, which delivers it again.
func openSpool(dir string, maxBytes int64) (*spool, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("forward: spool: %w", err)
	}
	s := &spool{dir: dir, max: maxBytes, segMax: min(max(maxBytes/8, minSegment), maxSegment), wake: make(chan struct{}, 1)}
	if b, err := os.ReadFile(filepath.Join(dir, "cursor")); err == nil {
		var c, d, se, fa uint64
		if _, err := fmt.Sscanf(string(b), "%d %d %d %d", &c, &d, &se, &fa); err == nil {
			s.cursor, s.dropped, s.sent, s.failed = c, d, se, fa
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("forward: spool: %w", err)
	}
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".seg")
		if !ok {
			continue
		}
		first, err := strconv.ParseUint(name, 10, 64)
		if err != nil {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return nil, fmt.Errorf("forward: spool: %w", err)
		}
		s.segs = append(s.segs, segment{first: first, size: info.Size()})
	}
	sort.Slice(s.segs, func(i, j int) bool { return s.segs[i].first < s.segs[j].first })
	s.next = s.cursor + 1
	if n := len(s.segs); n > 0 {
		last := &s.segs[n-1]
		end, lastSeq, err := scanTail(s.segPath(last.first))
		if err != nil {
			return nil, err
		}
		if end != last.size {
			if err := os.Truncate(s.segPath(last.first), end); err != nil {
				return nil, fmt.Errorf("forward: spool: cut a torn line: %w", err)
			}
			last.size = end
		}
		if lastSeq == 0 {
			lastSeq = last.first - 1
		}
		s.next = max(s.next, lastSeq+1)
	}
	if n := len(s.segs); n == 0 || s.segs[n-1].first > s.next {
		// No segment, or (after a cut) none that can take s.next.
		s.segs = append(s.segs, segment{first: s.next})
	}
	for _, g := range s.segs {
		s.total += g.size
	}
	last := s.segs[len(s.segs)-1]
	if s.f, err = os.OpenFile(s.segPath(last.first), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640); err != nil {
		return nil, fmt.Errorf("forward: spool: %w", err)
	}
	s.synced = s.next - 1
	s.rseq = s.cursor
	s.trimLocked()
	return s, nil
}

// scanTail returns the end of the last complete line of a segment and its
// seq (0: no line).
func scanTail(path string) (int64, uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, fmt.Errorf("forward: spool: %w", err)
	}
	end := bytes.LastIndexByte(b, '\n') + 1
	if end == 0 {
		return 0, 0, nil
	}
	start := bytes.LastIndexByte(b[:end-1], '\n') + 1
	seq, _, _, ok := parseLine(b[start : end-1])
	if !ok {
		return 0, 0, fmt.Errorf("forward: spool: %s: last line unreadable", path)
	}
	return int64(end), seq, nil
}

// parseLine reads "<seq> <taken ms> <json>".
func parseLine(l []byte) (seq uint64, at int64, msg []byte, ok bool) {
	i := bytes.IndexByte(l, ' ')
	if i <= 0 {
		return 0, 0, nil, false
	}
	j := bytes.IndexByte(l[i+1:], ' ')
	if j <= 0 {
		return 0, 0, nil, false
	}
	seq, err1 := strconv.ParseUint(string(l[:i]), 10, 64)
	at, err2 := strconv.ParseInt(string(l[i+1:i+1+j]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, nil, false
	}
	return seq, at, l[i+2+j:], true
}

// append adds a message (JSON on one line), taken at at; it is durable
// and readable after the next sync.
func (s *spool) append(msg []byte, at time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	n0 := len(s.buf)
	s.buf = strconv.AppendUint(s.buf, s.next, 10)
	s.buf = append(s.buf, ' ')
	s.buf = strconv.AppendInt(s.buf, at.UnixMilli(), 10)
	s.buf = append(s.buf, ' ')
	s.buf = append(s.buf, msg...)
	s.buf = append(s.buf, '\n')
	n := int64(len(s.buf) - n0)
	s.segs[len(s.segs)-1].size += n
	s.total += n
	s.next++
	s.dirty = true
	if s.segs[len(s.segs)-1].size >= s.segMax {
		return s.rotateLocked()
	}
	return nil
}

// rotateLocked writes and syncs the last segment and starts a new one.
func (s *spool) rotateLocked() error {
	if err := s.writeLocked(); err != nil {
		return err
	}
	if err := s.f.Close(); err != nil {
		return fmt.Errorf("forward: spool: %w", err)
	}
	f, err := os.OpenFile(s.segPath(s.next), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("forward: spool: %w", err)
	}
	s.f = f
	s.segs = append(s.segs, segment{first: s.next})
	s.trimLocked()
	return nil
}

func (s *spool) writeLocked() error {
	if len(s.buf) > 0 {
		if _, err := s.f.Write(s.buf); err != nil {
			return fmt.Errorf("forward: spool write: %w", err)
		}
		s.buf = s.buf[:0]
	}
	if err := s.f.Sync(); err != nil {
		return fmt.Errorf("forward: spool sync: %w", err)
	}
	s.synced = s.next - 1
	return nil
}

// sync makes every appended message durable and readable, then holds
// the bound. Only after it may their MQTT messages be acknowledged.
func (s *spool) sync() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.dirty {
		return nil
	}
	if err := s.writeLocked(); err != nil {
		return err
	}
	s.dirty = false
	s.trimLocked()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return nil
}

// trimLocked holds the bound: while the segments take more than max, the
// oldest closed segment is deleted, its unsent messages counted dropped.
func (s *spool) trimLocked() {
	for s.total > s.max && len(s.segs) > 1 {
		g := s.segs[0]
		last := s.segs[1].first - 1
		if last > s.cursor {
			s.dropped += last - max(s.cursor, g.first-1)
			s.cursor = last
			if s.rseq < last {
				s.closeReaderLocked()
				s.rseq, s.head = last, 0
			}
			_ = s.saveCursorLocked()
		}
		s.removeFirstLocked()
	}
}

func (s *spool) removeFirstLocked() {
	g := s.segs[0]
	if s.rf != nil && s.rseg == g.first {
		s.closeReaderLocked()
	}
	_ = os.Remove(s.segPath(g.first))
	s.total -= g.size
	s.segs = s.segs[1:]
}

func (s *spool) closeReaderLocked() {
	if s.rf != nil {
		s.rf.Close()
		s.rf = nil
	}
}

// record is a message read back for sending.
type record struct {
	seq uint64
	at  int64 // taken, unix ms
	msg []byte
}

// read returns up to n synced messages after the last one read.
func (s *spool) read(n int) ([]record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []record
	for len(out) < n && s.rseq < s.synced {
		want := s.rseq + 1
		if s.rf == nil || !s.inSegLocked(s.rseg, want) {
			s.closeReaderLocked()
			i := sort.Search(len(s.segs), func(i int) bool { return s.segs[i].first > want }) - 1
			if i < 0 {
				return out, fmt.Errorf("forward: spool: no segment holds %d", want)
			}
			f, err := os.Open(s.segPath(s.segs[i].first))
			if err != nil {
				return out, fmt.Errorf("forward: spool: %w", err)
			}
			s.rf, s.rseg, s.roff = f, s.segs[i].first, 0
		}
		if len(s.rbuf) < 256<<10 {
			s.rbuf = make([]byte, 256<<10)
		}
		k, err := s.rf.ReadAt(s.rbuf, s.roff)
		if err != nil && !errors.Is(err, io.EOF) {
			return out, fmt.Errorf("forward: spool read: %w", err)
		}
		chunk := s.rbuf[:k]
		progress := false
		for len(out) < n && s.rseq < s.synced {
			nl := bytes.IndexByte(chunk, '\n')
			if nl < 0 {
				break
			}
			line := chunk[:nl]
			chunk = chunk[nl+1:]
			s.roff += int64(nl + 1)
			progress = true
			seq, at, msg, ok := parseLine(line)
			if !ok {
				return out, fmt.Errorf("forward: spool: unreadable line at %d of segment %d", s.roff, s.rseg)
			}
			if seq <= s.rseq {
				continue // before the cursor, in the segment it is in
			}
			s.rseq = seq
			out = append(out, record{seq: seq, at: at, msg: bytes.Clone(msg)})
		}
		if !progress {
			if k == len(s.rbuf) {
				s.rbuf = make([]byte, 2*len(s.rbuf)) // a line longer than the buffer
				continue
			}
			// The end of this segment: the next one holds rseq+1.
			if !s.inSegLocked(s.rseg, s.rseq+1) {
				continue
			}
			return out, fmt.Errorf("forward: spool: segment %d ends before %d", s.rseg, s.rseq+1)
		}
	}
	if len(out) > 0 && out[0].seq == s.cursor+1 {
		s.head = out[0].at
	}
	return out, nil
}

// inSegLocked: seq belongs in the segment starting at first.
func (s *spool) inSegLocked(first, seq uint64) bool {
	i := sort.Search(len(s.segs), func(i int) bool { return s.segs[i].first > seq }) - 1
	return i >= 0 && s.segs[i].first == first
}

// rewind makes the reader start again after the cursor (a new sender:
// what the old one read and did not send is read again).
func (s *spool) rewind() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeReaderLocked()
	s.rseq, s.head = s.cursor, 0
}

// ack records that the sink accepted every message up to seq (n of them
// in this batch), deletes the segments wholly sent and saves the cursor.
func (s *spool) ack(seq uint64, n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advanceLocked(seq, uint64(n))
	return s.saveLocked()
}

// advance records that the sink accepted every message up to seq, the
// messages first..seq (an MQTT sink's acknowledged prefix), without
// saving the cursor: save does, when the sender chooses. Those the bound
// dropped meanwhile stay counted dropped, not sent.
func (s *spool) advance(first, seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq <= s.cursor {
		return
	}
	s.advanceLocked(seq, seq-max(s.cursor, first-1))
}

func (s *spool) advanceLocked(seq, n uint64) {
	s.sent += n
	s.cursor = max(s.cursor, seq)
	s.head = 0
}

// save deletes the segments wholly sent and saves the cursor. Segments
// go only once the cursor past them is saved: a reopened spool reads
// from the saved cursor.
func (s *spool) save() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.saveLocked()
}

func (s *spool) saveLocked() error {
	if err := s.saveCursorLocked(); err != nil {
		return err
	}
	for len(s.segs) > 1 && s.segs[1].first-1 <= s.cursor {
		s.removeFirstLocked()
	}
	return nil
}

// position is the cursor: every seq up to it is sent or dropped.
func (s *spool) position() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cursor
}

// failure counts a refused or failed request.
func (s *spool) failure(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failed++
	s.lastErr = clip(err.Error())
}

func (s *spool) saveCursorLocked() error {
	tmp := filepath.Join(s.dir, "cursor.tmp")
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("forward: spool cursor: %w", err)
	}
	_, err = fmt.Fprintf(f, "%d %d %d %d\n", s.cursor, s.dropped, s.sent, s.failed)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(s.dir, "cursor"))
	}
	if err != nil {
		return fmt.Errorf("forward: spool cursor: %w", err)
	}
	return nil
}

// stats is the spool's part of a rule's status.
func (s *spool) stats(now time.Time) Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Status{Pending: int64(s.next - 1 - s.cursor), SpooledBytes: s.total, Dropped: int64(s.dropped),
		Sent: int64(s.sent), Failed: int64(s.failed), LastError: s.lastErr}
	if st.Pending > 0 && s.head == 0 && s.synced > s.cursor {
		s.head = s.peekLocked(s.cursor + 1) // no sender has read it (a disabled rule)
	}
	if st.Pending > 0 && s.head > 0 {
		st.LagMs = max(0, now.UnixMilli()-s.head)
	}
	return st
}

// peekLocked returns the taken time of the synced message seq, 0 if it
// cannot be read.
func (s *spool) peekLocked(seq uint64) int64 {
	i := sort.Search(len(s.segs), func(i int) bool { return s.segs[i].first > seq }) - 1
	if i < 0 {
		return 0
	}
	f, err := os.Open(s.segPath(s.segs[i].first))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		if q, at, _, ok := parseLine(sc.Bytes()); ok && q == seq {
			return at
		}
	}
	return 0
}

// close releases the files, dropping what was appended and not synced
// (as a crash would: it was not acknowledged to the broker either).
func (s *spool) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeReaderLocked()
	if s.f != nil {
		s.f.Close()
		s.f = nil
	}
}
