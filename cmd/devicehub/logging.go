package main

import (
	"io"
	"log/slog"
	"net/url"
	"strings"
)

// newLogger returns the process logger, writing to w: format "json" writes
// one JSON object a line (slog.JSONHandler), anything else key=value text
// (slog.TextHandler); records below level (slog's text form: debug, info,
// warn, error, any case) are dropped. loadConfig has checked both.
func newLogger(w io.Writer, format, level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: l}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// redactURL is raw with the password of its user info, if any, replaced
// by "xxxxx", for logging a broker or database address; text that is not
// a URL is returned as it is.
func redactURL(raw string) string {
	if strings.Contains(raw, ",") { // a list (brokers, ClickHouse fallbacks)
		parts := strings.Split(raw, ",")
		for i, p := range parts {
			parts[i] = redactURL(p)
		}
		return strings.Join(parts, ",")
	}
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	return u.Redacted()
}
