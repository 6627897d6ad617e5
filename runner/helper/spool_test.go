package helper

import (
	"bytes"
	"io"
	"os"
	"testing"
)

func TestSpool(t *testing.T) {
	for _, n := range []int{0, 1000, spoolMemory, spoolMemory + 1, 3*spoolMemory + 7} {
		data := bytes.Repeat([]byte("0123456789abcdef"), n/16+1)[:n]
		s := &spool{}
		// Written in uneven pieces, as io.Copy would.
		for rest := data; len(rest) > 0; {
			k := min(len(rest), 100_003)
			if _, err := s.Write(rest[:k]); err != nil {
				t.Fatal(err)
			}
			rest = rest[k:]
		}
		if s.Size() != int64(n) {
			t.Fatalf("size %d, want %d", s.Size(), n)
		}
		if onDisk := s.f != nil; onDisk != (n > spoolMemory) {
			t.Errorf("%d bytes: on disk %v", n, onDisk)
		}
		for range 2 { // an upload retried reads it again
			rc, err := s.Open()
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(rc)
			rc.Close()
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("%d bytes: read back %d (%v)", n, len(got), err)
			}
		}
		tail := make([]byte, min(5, n))
		if _, err := s.ReaderAt().ReadAt(tail, int64(n-len(tail))); err != nil && err != io.EOF || !bytes.Equal(tail, data[n-len(tail):]) {
			t.Errorf("%d bytes: ReadAt of the end %q (%v)", n, tail, err)
		}
		var name string
		if s.f != nil {
			name = s.f.Name()
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if name != "" {
			if _, err := os.Stat(name); !os.IsNotExist(err) {
				t.Errorf("%s left behind (%v)", name, err)
			}
		}
	}
}
