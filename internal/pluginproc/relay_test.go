package pluginproc_test

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/berthci/berth/internal/pluginproc"
)

func TestParseLogLine(t *testing.T) {
	for _, tc := range []struct {
		line  string
		level slog.Level
		msg   string
		attrs map[string]string
	}{
		{`{"@level":"error","@message":"boom","@timestamp":"2026-01-01T00:00:00.000000Z","instance":"i-1","@module":"aws"}`,
			slog.LevelError, "boom", map[string]string{"instance": "i-1", "module": "aws"}},
		{`{"@level":"debug","@message":"tick"}`, slog.LevelDebug, "tick", nil},
		{`{"@message":"no level"}`, slog.LevelInfo, "no level", nil},
		{`{"@message": 5, "@level":"error"}`, slog.LevelInfo, `{"@message": 5, "@level":"error"}`, nil},
		{`[WARN] disk almost full`, slog.LevelWarn, "disk almost full", nil},
		{`panic: runtime error`, slog.LevelError, "runtime error", nil},
		{`plain text`, slog.LevelInfo, "plain text", nil},
		{`{not json`, slog.LevelInfo, "{not json", nil},
	} {
		level, msg, attrs := pluginproc.ParseLogLine([]byte(tc.line), slog.LevelInfo)
		if level != tc.level || msg != tc.msg {
			t.Errorf("ParseLogLine(%s) = %v %q, want %v %q", tc.line, level, msg, tc.level, tc.msg)
		}
		got := map[string]string{}
		for _, a := range attrs {
			got[a.Key] = a.Value.String()
		}
		for k, v := range tc.attrs {
			if got[k] != v {
				t.Errorf("ParseLogLine(%s) attrs %v, want %s=%s", tc.line, got, k, v)
			}
		}
	}
}

func FuzzParseLogLine(f *testing.F) {
	f.Add([]byte(`{"@level":"warn","@message":"x","k":[1,{"a":null}]}`))
	f.Add([]byte(`[ERROR] y`))
	f.Add([]byte(`{"@message":{"nested":true}}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		level, msg, _ := pluginproc.ParseLogLine(line, slog.LevelInfo)
		// Lines that are neither JSON nor prefixed come back verbatim.
		if len(line) > 0 && !bytes.HasPrefix(line, []byte("{")) && !bytes.HasPrefix(line, []byte("[")) &&
			!bytes.HasPrefix(line, []byte("panic: ")) && !bytes.HasPrefix(line, []byte("fatal error: ")) &&
			(msg != string(line) || level != slog.LevelInfo) {
			t.Fatalf("ParseLogLine(%q) = %v %q, want the line verbatim at info", line, level, msg)
		}
	})
}
