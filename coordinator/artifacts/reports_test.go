package artifacts_test

import (
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/artifacts/artifactstest"
)

func TestReportFiles(t *testing.T) {
	files, err := artifacts.ReportFiles(artifactstest.GzipFiles("a", "", "bc"), "gzip", 3)
	if err != nil || len(files) != 3 || string(files[0]) != "a" || len(files[1]) != 0 || string(files[2]) != "bc" {
		t.Errorf("three members: %q, %v", files, err)
	}
	if files, err := artifacts.ReportFiles([]byte("raw text"), "raw", 8); err != nil || len(files) != 1 || string(files[0]) != "raw text" {
		t.Errorf("raw: %q, %v", files, err)
	}
	for name, tc := range map[string]struct {
		data   []byte
		format string
		want   string
	}{
		"members together too large": {artifactstest.GzipFiles("ab", "cd"), "gzip", "larger than 3 bytes decompressed"},
		"raw too large":              {[]byte("abcd"), "raw", "larger than 3 bytes"},
		"not gzip":                   {[]byte("plain"), "gzip", "not a gzip file"},
		"a second member cut short":  {append(artifactstest.GzipFiles("a"), artifactstest.GzipFiles("b")[:8]...), "gzip", "reading gzip"},
		"unknown format":             {[]byte("x"), "zip", `not "zip"`},
	} {
		if _, err := artifacts.ReportFiles(tc.data, tc.format, 3); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}
