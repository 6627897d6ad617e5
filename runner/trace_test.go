package runner

import (
	"fmt"
	"hash/crc32"
	"strings"
	"testing"
)

func TestTraceLimitChecksumAndMasking(t *testing.T) {
	tr := NewTrace(64, []string{"topsecret"}, nil)
	tr.Write([]byte("line with tops"))
	tr.Write([]byte("ecret\n"))
	tr.Write([]byte(strings.Repeat("x", 100)))
	tr.Write([]byte("dropped"))
	tr.Close()
	s := tr.String()
	if strings.Contains(s, "topsecret") || !strings.HasPrefix(s, "line with [MASKED]\n") {
		t.Fatalf("trace %q", s)
	}
	if !strings.Contains(s, "Job's log exceeded limit of 64 bytes") || strings.Contains(s, "dropped") {
		t.Fatalf("limit notice missing or output kept: %q", s)
	}
	if want := fmt.Sprintf("crc32:%08x", crc32.ChecksumIEEE([]byte(s))); tr.Checksum() != want || tr.Len() != int64(len(s)) {
		t.Fatalf("checksum %s len %d, want %s %d", tr.Checksum(), tr.Len(), want, len(s))
	}
	if got := string(tr.From(5, 4)); got != "with" {
		t.Fatalf("From = %q", got)
	}
}

func TestMapFailureReason(t *testing.T) {
	full := gitlabFailureReasons
	for _, tc := range []struct {
		in        string
		supported []string
		want      string
	}{
		{"", nil, "script_failure"},
		{"script_failure", nil, "script_failure"},
		{"job_execution_timeout", nil, "job_execution_timeout"},
		{"runner_system_failure", nil, "runner_system_failure"},
		{"image_pull_failure", full, "image_pull_failure"},
		{"image_pull_failure", nil, "runner_system_failure"},
		{"runner_configuration_error", nil, "script_failure"},
		{"runner_external_dependency_failure", nil, "runner_system_failure"},
		{"job_canceled", full, "unknown_failure"},
		{"job_canceled", append(full, "job_canceled"), "job_canceled"},
		{"runner_interrupted", nil, "unknown_failure"},
		{"runner_interrupted", full, "runner_interrupted"},
	} {
		if got := MapFailureReason(tc.in, tc.supported); got != tc.want {
			t.Errorf("MapFailureReason(%q, %v) = %q, want %q", tc.in, tc.supported, got, tc.want)
		}
	}
}
