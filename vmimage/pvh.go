package vmimage

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// A bzImage boots by decompressing itself: under TCG, emulated, that is
// seconds per boot (an xz payload: ~5 s of a ~15 s boot). A kernel built
// with CONFIG_PVH (Debian's, Fedora's, Ubuntu's are) can instead be booted
// as the uncompressed ELF it carries, through its PVH entry point, which
// QEMU's microvm and q35 machines both use when given an ELF kernel.
// pvhKernel extracts that ELF once per kernel and caches it beside the
// initramfs files.

// errNoPVH says why a kernel is booted as its bzImage.
var errNoPVH = errors.New("no PVH entry")

// payloadDecompressors decompress a bzImage payload by its magic: gzip
// here, the others with the program the kernel's own
// scripts/extract-vmlinux uses (xz's x86 BCJ filter, which kernels use,
// has no Go implementation).
var payloadDecompressors = []struct {
	name  string
	magic []byte
	prog  string
}{
	{"gzip", []byte{0x1f, 0x8b, 0x08}, ""},
	{"xz", []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}, "xz"},
	{"zstd", []byte{0x28, 0xb5, 0x2f, 0xfd}, "zstd"},
	{"lz4", []byte{0x02, 0x21, 0x4c, 0x18}, "lz4"},
	{"bzip2", []byte{'B', 'Z', 'h'}, "bzip2"},
	{"lzma", []byte{0x5d, 0x00, 0x00}, "lzma"},
}

// bzPayload returns the compressed kernel inside a bzImage (boot protocol
// 2.08 and later say where it is).
func bzPayload(b []byte) ([]byte, error) {
	if len(b) < 0x250 || string(b[0x202:0x206]) != "HdrS" {
		return nil, errors.New("not a bzImage")
	}
	if v := binary.LittleEndian.Uint16(b[0x206:]); v < 0x208 {
		return nil, fmt.Errorf("boot protocol %d.%02d: older than 2.08, no payload fields", v>>8, v&0xff)
	}
	setup := int(b[0x1f1])
	if setup == 0 {
		setup = 4
	}
	off := uint64(setup+1)*512 + uint64(binary.LittleEndian.Uint32(b[0x248:]))
	n := uint64(binary.LittleEndian.Uint32(b[0x24c:]))
	if off+n > uint64(len(b)) || n == 0 {
		return nil, fmt.Errorf("payload %d+%d lies outside the %d-byte file", off, n, len(b))
	}
	return b[off : off+n], nil
}

// decompressPayload writes the uncompressed kernel to w.
func decompressPayload(ctx context.Context, payload []byte, w io.Writer) error {
	for _, d := range payloadDecompressors {
		if !bytes.HasPrefix(payload, d.magic) {
			continue
		}
		if d.prog == "" {
			zr, err := gzip.NewReader(bytes.NewReader(payload))
			if err != nil {
				return err
			}
			zr.Multistream(false) // the payload may be followed by the kernel's size
			_, err = io.Copy(w, zr)
			return err
		}
		prog, err := exec.LookPath(d.prog)
		if err != nil {
			return fmt.Errorf("a %s payload needs %s: %w", d.name, d.prog, err)
		}
		cmd := exec.CommandContext(ctx, prog, "-dc")
		cmd.Stdin, cmd.Stdout = bytes.NewReader(payload), w
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			// Trailing bytes after the stream (the kernel appends its
			// size) make some tools complain after writing everything;
			// the ELF check below decides.
			if stderr.Len() == 0 {
				return fmt.Errorf("%s -dc: %w", d.prog, err)
			}
		}
		return nil
	}
	return fmt.Errorf("payload compression %x… not known", payload[:min(6, len(payload))])
}

// pvhEntry reports whether the ELF file at p has a PVH entry point (the
// Xen ELF note XEN_ELFNOTE_PHYS32_ENTRY, 18).
func pvhEntry(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("the payload is not an ELF kernel: %w", err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 {
		return fmt.Errorf("the kernel is for %v", f.Machine)
	}
	for _, prog := range f.Progs {
		if prog.Type != elf.PT_NOTE {
			continue
		}
		notes, err := io.ReadAll(io.LimitReader(prog.Open(), 1<<20))
		if err != nil {
			continue
		}
		for len(notes) >= 12 {
			namesz := int(binary.LittleEndian.Uint32(notes))
			descsz := int(binary.LittleEndian.Uint32(notes[4:]))
			typ := binary.LittleEndian.Uint32(notes[8:])
			align := func(n int) int { return (n + 3) &^ 3 }
			end := 12 + align(namesz) + align(descsz)
			if namesz < 0 || descsz < 0 || end > len(notes) || end < 12 {
				break
			}
			if string(bytes.TrimRight(notes[12:12+namesz], "\x00")) == "Xen" && typ == 18 {
				return nil
			}
			notes = notes[end:]
		}
	}
	return errNoPVH
}

// pvhKernel returns the uncompressed PVH kernel of bzImage kernel under
// bootDir (made once, shared by every VM and process), or an error saying
// why the bzImage must be booted instead.
func (s *Store) pvhKernel(ctx context.Context, kernel, kver, bootDir string) (string, error) {
	b, err := os.ReadFile(kernel)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	out := filepath.Join(bootDir, "vmlinux-"+kver+"-"+hex.EncodeToString(sum[:8]))
	if touch(out) {
		return out, nil
	}
	payload, err := bzPayload(b)
	if err != nil {
		return "", err
	}
	unlock, err := s.lock(ctx, filepath.Base(out))
	if err != nil {
		return "", err
	}
	defer unlock()
	if touch(out) {
		return out, nil
	}
	start := time.Now()
	if err := os.MkdirAll(bootDir, 0o755); err != nil {
		return "", err
	}
	f, err := os.CreateTemp(bootDir, ".vmlinux-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	err = decompressPayload(ctx, payload, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", err
	}
	if err := pvhEntry(f.Name()); err != nil {
		return "", err
	}
	if err := os.Chmod(f.Name(), 0o444); err != nil {
		return "", err
	}
	if err := os.Rename(f.Name(), out); err != nil {
		return "", err
	}
	s.log().Info("extracted the kernel's PVH image", "kernel", kernel, "path", out, "took", time.Since(start).Round(time.Millisecond))
	return out, nil
}
