package storetest

import (
	"bytes"
	"errors"
	"hash/crc32"
	"io"
	"testing"

	"github.com/berthci/berth/coordinator/store"
)

func traceInfo(t testing.TB, s store.Store, jobID int64) store.TraceInfo {
	t.Helper()
	ti, err := s.TraceInfo(t.Context(), jobID)
	must(t, err)
	return ti
}

func readTrace(t testing.TB, s store.Store, jobID, offset int64) []byte {
	t.Helper()
	var buf bytes.Buffer
	n, err := s.ReadTrace(t.Context(), jobID, offset, &buf)
	must(t, err)
	if n != int64(buf.Len()) {
		t.Errorf("ReadTrace returned %d, wrote %d bytes", n, buf.Len())
	}
	return buf.Bytes()
}

// wantRange fails t unless err is a *store.RangeError with Size size.
func wantRange(t testing.TB, what string, err error, size int64) {
	t.Helper()
	var re *store.RangeError
	if !errors.As(err, &re) {
		t.Errorf("%s: got error %v, want *store.RangeError", what, err)
		return
	}
	if re.Size != size {
		t.Errorf("%s: RangeError.Size = %d, want %d", what, re.Size, size)
	}
}

func testAppendTrace(t *testing.T, s store.Store) {
	ctx := t.Context()
	j := createJob(t, s)
	other := createJob(t, s)
	if ti := traceInfo(t, s, j.ID); ti != (store.TraceInfo{}) {
		t.Errorf("TraceInfo of job without trace = %+v, want zero", ti)
	}

	var all []byte
	chunks := [][]byte{
		[]byte("Running with berth\n"),
		{},
		[]byte("\x1b[0K\x00\xff binary-safe\r\n"),
		bytes.Repeat([]byte("0123456789abcdef"), 4096), // 64 KiB
		[]byte("Job succeeded\n"),
	}
	for i, c := range chunks {
		size, err := s.AppendTrace(ctx, j.ID, int64(len(all)), c)
		must(t, err)
		all = append(all, c...)
		if size != int64(len(all)) {
			t.Errorf("chunk %d: AppendTrace returned size %d, want %d", i, size, len(all))
		}
		want := store.TraceInfo{Size: int64(len(all)), CRC32: crc32.ChecksumIEEE(all)}
		if ti := traceInfo(t, s, j.ID); ti != want {
			t.Errorf("chunk %d: TraceInfo = %+v, want %+v", i, ti, want)
		}
	}
	if got := readTrace(t, s, j.ID, 0); !bytes.Equal(got, all) {
		t.Errorf("ReadTrace = %d bytes, differs from the %d appended", len(got), len(all))
	}
	// Traces of jobs are separate.
	if ti := traceInfo(t, s, other.ID); ti != (store.TraceInfo{}) {
		t.Errorf("TraceInfo of other job = %+v, want zero", ti)
	}
	if got := readTrace(t, s, other.ID, 0); len(got) != 0 {
		t.Errorf("ReadTrace of other job: %d bytes", len(got))
	}
}

func testAppendTraceRange(t *testing.T, s store.Store) {
	ctx := t.Context()
	j := createJob(t, s)
	_, err := s.AppendTrace(ctx, j.ID, 0, []byte("hello "))
	must(t, err)

	tests := []struct {
		name   string
		offset int64
		data   []byte
	}{
		{"behind", 0, []byte("again")},
		{"inside", 3, []byte("lo")},
		{"ahead", 7, []byte("gap")},
		{"negative", -1, []byte("x")},
		{"far ahead", 1 << 62, []byte("x")},
		{"empty data ahead", 10, nil},
	}
	for _, tt := range tests {
		n, err := s.AppendTrace(ctx, j.ID, tt.offset, tt.data)
		wantRange(t, "AppendTrace("+tt.name+")", err, 6)
		if err != nil && n != 0 && n != 6 {
			t.Errorf("AppendTrace(%s) returned size %d with error", tt.name, n)
		}
	}
	want := store.TraceInfo{Size: 6, CRC32: crc32.ChecksumIEEE([]byte("hello "))}
	if ti := traceInfo(t, s, j.ID); ti != want {
		t.Errorf("TraceInfo after refused appends = %+v, want %+v", ti, want)
	}
	// Empty data at the right offset is a no-op.
	n, err := s.AppendTrace(ctx, j.ID, 6, nil)
	must(t, err)
	if n != 6 {
		t.Errorf("AppendTrace(empty at size) = %d, want 6", n)
	}
	n, err = s.AppendTrace(ctx, j.ID, 6, []byte("world"))
	must(t, err)
	if n != 11 {
		t.Errorf("AppendTrace = %d, want 11", n)
	}
	if got := readTrace(t, s, j.ID, 0); string(got) != "hello world" {
		t.Errorf("trace = %q, want %q", got, "hello world")
	}
}

func testTraceCRC(t *testing.T, s store.Store) {
	ctx := t.Context()
	j := createJob(t, s)
	// Many small appends of every byte value: the CRC is a running one over
	// all bytes, not of the last chunk.
	var all []byte
	for i := range 300 {
		c := []byte{byte(i), byte(i * 7), byte(255 - i)}
		_, err := s.AppendTrace(ctx, j.ID, int64(len(all)), c)
		must(t, err)
		all = append(all, c...)
	}
	want := store.TraceInfo{Size: int64(len(all)), CRC32: crc32.ChecksumIEEE(all)}
	if ti := traceInfo(t, s, j.ID); ti != want {
		t.Errorf("TraceInfo = %+v, want %+v", ti, want)
	}
	if got := readTrace(t, s, j.ID, 0); !bytes.Equal(got, all) {
		t.Errorf("ReadTrace differs from appended bytes")
	}
}

func testResetTrace(t *testing.T, s store.Store) {
	ctx := t.Context()
	j := createJob(t, s)
	other := createJob(t, s)
	_, err := s.AppendTrace(ctx, j.ID, 0, []byte("first attempt\n"))
	must(t, err)
	_, err = s.AppendTrace(ctx, other.ID, 0, []byte("other"))
	must(t, err)

	must(t, s.ResetTrace(ctx, j.ID))
	if ti := traceInfo(t, s, j.ID); ti != (store.TraceInfo{}) {
		t.Errorf("TraceInfo after reset = %+v, want zero", ti)
	}
	if got := readTrace(t, s, j.ID, 0); len(got) != 0 {
		t.Errorf("ReadTrace after reset = %q", got)
	}
	must(t, s.ResetTrace(ctx, j.ID)) // reset of an empty trace is fine

	_, err = s.AppendTrace(ctx, j.ID, 14, []byte("x"))
	wantRange(t, "AppendTrace at old size after reset", err, 0)
	var all []byte
	for _, c := range []string{"second ", "attempt\n"} {
		_, err := s.AppendTrace(ctx, j.ID, int64(len(all)), []byte(c))
		must(t, err)
		all = append(all, c...)
	}
	want := store.TraceInfo{Size: int64(len(all)), CRC32: crc32.ChecksumIEEE(all)}
	if ti := traceInfo(t, s, j.ID); ti != want {
		t.Errorf("TraceInfo after reset and appends = %+v, want %+v", ti, want)
	}
	if got := readTrace(t, s, j.ID, 0); !bytes.Equal(got, all) {
		t.Errorf("trace after reset = %q, want %q", got, all)
	}
	if got := readTrace(t, s, other.ID, 0); string(got) != "other" {
		t.Errorf("reset touched another job's trace: %q", got)
	}
}

func testReadTrace(t *testing.T, s store.Store) {
	ctx := t.Context()
	j := createJob(t, s)
	var all []byte
	for _, c := range []string{"abc", "defgh", "", "i", "jklmnopqrstuvwxyz"} {
		_, err := s.AppendTrace(ctx, j.ID, int64(len(all)), []byte(c))
		must(t, err)
		all = append(all, c...)
	}
	// Every offset, including ones inside and at the edges of chunks.
	for off := int64(0); off <= int64(len(all)); off++ {
		if got := readTrace(t, s, j.ID, off); !bytes.Equal(got, all[off:]) {
			t.Errorf("ReadTrace(offset %d) = %q, want %q", off, got, all[off:])
		}
	}
	for _, off := range []int64{-1, int64(len(all)) + 1, 1 << 62} {
		var buf bytes.Buffer
		_, err := s.ReadTrace(ctx, j.ID, off, &buf)
		wantRange(t, "ReadTrace(offset outside trace)", err, int64(len(all)))
	}
	// A failing writer's error is returned.
	_, err := s.ReadTrace(ctx, j.ID, 0, failingWriter{})
	if !errors.Is(err, io.ErrShortWrite) {
		t.Errorf("ReadTrace to a failing writer: %v, want the writer's error", err)
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, io.ErrShortWrite }

func testTraceNotFound(t *testing.T, s store.Store) {
	ctx := t.Context()
	j := createJob(t, s)
	missing := j.ID + 1
	_, err := s.AppendTrace(ctx, missing, 0, []byte("x"))
	wantErr(t, "AppendTrace(missing job)", err, store.ErrNotFound)
	_, err = s.TraceInfo(ctx, missing)
	wantErr(t, "TraceInfo(missing job)", err, store.ErrNotFound)
	_, err = s.ReadTrace(ctx, missing, 0, io.Discard)
	wantErr(t, "ReadTrace(missing job)", err, store.ErrNotFound)
	wantErr(t, "ResetTrace(missing job)", s.ResetTrace(ctx, missing), store.ErrNotFound)
}
