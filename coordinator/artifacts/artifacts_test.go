package artifacts

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
)

func TestDirRoundTripLimitAndDelete(t *testing.T) {
	ctx := context.Background()
	d, err := NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	n, err := d.Put(ctx, "1/archive", strings.NewReader("hello"), 10)
	if err != nil || n != 5 {
		t.Fatalf("Put = %d, %v", n, err)
	}
	rc, size, err := d.Open(ctx, "1/archive")
	if err != nil || size != 5 {
		t.Fatalf("Open = %d, %v", size, err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "hello" {
		t.Fatalf("read %q", b)
	}
	if _, err := d.Put(ctx, "1/big", strings.NewReader("0123456789a"), 10); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized Put: %v", err)
	}
	if _, _, err := d.Open(ctx, "1/big"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("oversized upload left an object: %v", err)
	}
	entries, _ := os.ReadDir(d.root + "/1")
	if len(entries) != 1 {
		t.Fatalf("temporary files left behind: %v", entries)
	}
	if err := d.Delete(ctx, "1/archive"); err != nil {
		t.Fatal(err)
	}
	if err := d.Delete(ctx, "1/archive"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second Delete: %v", err)
	}
}

func TestDirRejectsEscapingKeys(t *testing.T) {
	d, _ := NewDir(t.TempDir())
	for _, k := range []string{"", "../x", "a/../../x", "/abs", "a\\b", "a//b", "a/./b"} {
		if _, err := d.Put(context.Background(), k, strings.NewReader("x"), 0); err == nil {
			t.Errorf("key %q accepted", k)
		}
	}
}
