package testkit

import (
	"bytes"
	"strings"
	"sync"
)

// LogBuffer is a log's output (slog.NewTextHandler(&buf, nil)), read
// while it is written: a test waits for a line only the log shows.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is what was written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Count is how many times s was written so far.
func (l *LogBuffer) Count(s string) int { return strings.Count(l.String(), s) }
