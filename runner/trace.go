package runner

import (
	"fmt"
	"hash/crc32"
	"sync"
)

// Trace is a job's log as the coordinator will store it: masked, cut at
// output_limit (with GitLab's notice), with a running CRC-32 and size for
// the final update. Writes are serialized; readers take copies of what was
// accepted.
type Trace struct {
	mu      sync.Mutex
	masker  *Masker
	buf     []byte
	crc     uint32
	limit   int
	limited bool
	closed  bool
	changed chan struct{} // closed and replaced on every append
}

// NewTrace returns a trace that masks secrets and token prefixes and keeps
// at most limit bytes of job output.
func NewTrace(limit int, secrets, prefixes []string) *Trace {
	t := &Trace{limit: limit, changed: make(chan struct{})}
	t.masker = NewMasker(traceSink{t}, secrets, prefixes)
	return t
}

type traceSink struct{ t *Trace }

// Write is called by the masker with the trace lock held.
func (s traceSink) Write(p []byte) (int, error) {
	s.t.appendLocked(p)
	return len(p), nil
}

func (t *Trace) appendLocked(p []byte) {
	if t.limited {
		return
	}
	if t.limit > 0 && len(t.buf)+len(p) > t.limit {
		p = p[:t.limit-len(t.buf)]
		t.limited = true
	}
	t.add(p)
	if t.limited {
		t.add([]byte(fmt.Sprintf("\n\x1b[31;1mJob's log exceeded limit of %d bytes.\nJob execution will continue but no more output will be collected.\x1b[0;m\n", t.limit)))
	}
}

func (t *Trace) add(p []byte) {
	if len(p) == 0 {
		return
	}
	t.buf = append(t.buf, p...)
	t.crc = crc32.Update(t.crc, crc32.IEEETable, p)
	close(t.changed)
	t.changed = make(chan struct{})
}

// Write adds job output. It never fails: output beyond the limit is
// dropped.
func (t *Trace) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return len(p), nil
	}
	_, _ = t.masker.Write(p)
	return len(p), nil
}

// Mask masks more values in what is written from now on.
func (t *Trace) Mask(secrets ...string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.masker.Add(secrets...)
}

// Printf writes a formatted line of the runner's own.
func (t *Trace) Printf(format string, args ...any) {
	_, _ = t.Write([]byte(fmt.Sprintf(format, args...)))
}

// Close flushes what the masker holds back; later writes are dropped.
func (t *Trace) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.closed {
		_ = t.masker.Flush()
		t.closed = true
	}
}

// Len is the number of bytes accepted.
func (t *Trace) Len() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return int64(len(t.buf))
}

// From returns a copy of at most max bytes starting at offset.
func (t *Trace) From(offset int64, max int) []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	if offset < 0 || offset >= int64(len(t.buf)) {
		return nil
	}
	end := offset + int64(max)
	if end > int64(len(t.buf)) {
		end = int64(len(t.buf))
	}
	return append([]byte(nil), t.buf[offset:end]...)
}

// Checksum is "crc32:" and 8 lowercase hex digits over all accepted bytes.
func (t *Trace) Checksum() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return fmt.Sprintf("crc32:%08x", t.crc)
}

// Changed returns a channel closed at the next append.
func (t *Trace) Changed() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.changed
}

// String returns the whole trace (for tests and logs).
func (t *Trace) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
