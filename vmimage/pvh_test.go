package vmimage

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthci/berth/internal/testenv"
)

// fakeBzImage is a bzImage header (protocol 2.15, one setup sector)
// around payload.
func fakeBzImage(payload []byte) []byte {
	b := make([]byte, 1024)
	b[0x1f1] = 1
	copy(b[0x202:], "HdrS")
	binary.LittleEndian.PutUint16(b[0x206:], 0x20f)
	binary.LittleEndian.PutUint32(b[0x248:], 16) // payload 16 bytes into the protected-mode part
	binary.LittleEndian.PutUint32(b[0x24c:], uint32(len(payload)))
	b = append(b, make([]byte, 16)...)
	return append(b, payload...)
}

func TestBzPayload(t *testing.T) {
	b := fakeBzImage([]byte("PAYLOAD"))
	p, err := bzPayload(b)
	if err != nil || string(p) != "PAYLOAD" {
		t.Fatalf("bzPayload = %q, %v", p, err)
	}
	for name, bad := range map[string][]byte{
		"short":       []byte("HdrS"),
		"no magic":    make([]byte, 2048),
		"old":         func() []byte { c := bytes.Clone(b); binary.LittleEndian.PutUint16(c[0x206:], 0x206); return c }(),
		"out of file": func() []byte { c := bytes.Clone(b); binary.LittleEndian.PutUint32(c[0x24c:], 1<<30); return c }(),
	} {
		if _, err := bzPayload(bad); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestPVHKernelOfANonPVHELF: a gzip payload that is an ELF without a PVH
// note is refused (the bzImage is booted), and so is an unknown
// compression; nothing is left in the boot directory.
func TestPVHKernelRefusals(t *testing.T) {
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Skip(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(self)
	zw.Close()
	dir := t.TempDir()
	s := &Store{Dir: dir}
	for name, c := range map[string]struct {
		payload []byte
		want    string
	}{
		"not PVH":      {gz.Bytes(), errNoPVH.Error()},
		"unknown":      {[]byte("\x99\x98compressed"), "not known"},
		"corrupt gzip": {append([]byte{0x1f, 0x8b, 0x08}, "garbage"...), ""},
	} {
		k := filepath.Join(dir, "vmlinuz-"+strings.ReplaceAll(name, " ", "-"))
		os.WriteFile(k, fakeBzImage(c.payload), 0o644)
		_, err := s.pvhKernel(context.Background(), k, "1.0", filepath.Join(dir, "boot"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, c.want)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "boot")); len(ents) != 0 {
		t.Errorf("left in boot/: %v", ents)
	}
}

// TestPVHKernelOfTheHostKernel: the host's kernel (Debian's has
// CONFIG_PVH) yields an ELF with a PVH entry, once: a second call finds
// it.
func TestPVHKernelOfTheHostKernel(t *testing.T) {
	k, err := newestKernel("/boot")
	if err != nil {
		testenv.Missing(t, "no kernel in /boot: %v", err)
	}
	if _, err := os.ReadFile(k); err != nil {
		testenv.Missing(t, "kernel %s not readable: %v", k, err)
	}
	dir := t.TempDir()
	s := &Store{Dir: dir}
	p, err := s.pvhKernel(context.Background(), k, "test", filepath.Join(dir, "boot"))
	if errors.Is(err, errNoPVH) {
		t.Skipf("%s has no PVH entry (built without CONFIG_PVH)", k)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := pvhEntry(p); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(p)
	again, err := s.pvhKernel(context.Background(), k, "test", filepath.Join(dir, "boot"))
	if err != nil || again != p {
		t.Fatalf("second call: %s %v", again, err)
	}
	fi2, _ := os.Stat(p)
	if !os.SameFile(fi, fi2) {
		t.Error("the second call made the file again")
	}
}
