package artifacts

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
)

// The behaviour every Storage shares is in artifactstest (run by
// conformance_test.go); this is what is particular to Dir.
func TestDirLeavesNoTemporaryFiles(t *testing.T) {
	ctx := context.Background()
	d, err := NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Put(ctx, "1/archive", strings.NewReader("hello"), 10); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Put(ctx, "1/big", strings.NewReader("0123456789a"), 10); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized Put: %v", err)
	}
	entries, _ := os.ReadDir(d.root + "/1")
	if len(entries) != 1 {
		t.Fatalf("temporary files left behind: %v", entries)
	}
}
