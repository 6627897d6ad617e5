package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

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

// finishJob moves a pending job to success, finished at the given time.
func finishJob(t testing.TB, s store.Store, id int64, finished time.Time) {
	t.Helper()
	_, err := s.TransitionJob(t.Context(), id, []store.Status{store.StatusPending},
		store.JobUpdate{Status: store.StatusSuccess, FinishedAt: finished, UpdatedAt: finished})
	must(t, err)
}

func appendAll(t testing.TB, s store.Store, jobID int64, data []byte) {
	t.Helper()
	ti := traceInfo(t, s, jobID)
	_, err := s.AppendTrace(t.Context(), jobID, ti.Size, data)
	must(t, err)
}

func testArchiveTrace(t *testing.T, s store.Store) {
	ctx := t.Context()
	early, late, running, silent := createJob(t, s), createJob(t, s), createJob(t, s), createJob(t, s)
	data := []byte("Running with berth\nJob succeeded\n")
	for _, j := range []*store.Job{early, late, running} {
		appendAll(t, s, j.ID, data)
	}
	finishJob(t, s, early.ID, at(time.Hour))
	finishJob(t, s, late.ID, at(3*time.Hour))
	finishJob(t, s, silent.ID, at(time.Hour))

	list := func(before time.Time, limit int) []int64 {
		t.Helper()
		ids, err := s.TracesToArchive(ctx, before, limit)
		must(t, err)
		return ids
	}
	checkIDs(t, "TracesToArchive(2h)", list(at(2*time.Hour), 0), []int64{early.ID})
	checkIDs(t, "TracesToArchive(4h)", list(at(4*time.Hour), 0), []int64{early.ID, late.ID})
	checkIDs(t, "TracesToArchive(4h, 1)", list(at(4*time.Hour), 1), []int64{early.ID})

	size := int64(len(data))
	wantRange(t, "ArchiveTrace(stale size)", s.ArchiveTrace(ctx, early.ID, size-1, "x/trace.log"), size)
	wantErr(t, "ArchiveTrace(no trace)", s.ArchiveTrace(ctx, silent.ID, 5, "x/trace.log"), store.ErrNotFound)
	wantErr(t, "ArchiveTrace(no job)", s.ArchiveTrace(ctx, 1<<40, 5, "x/trace.log"), store.ErrNotFound)
	if err := s.ArchiveTrace(ctx, early.ID, size, ""); err == nil {
		t.Error("ArchiveTrace with an empty key: no error")
	}

	key := "1/trace.33.log"
	must(t, s.ArchiveTrace(ctx, early.ID, size, key))
	want := store.TraceInfo{Size: size, CRC32: crc32.ChecksumIEEE(data), ArchiveKey: key}
	if ti := traceInfo(t, s, early.ID); ti != want {
		t.Errorf("TraceInfo of archived trace = %+v, want %+v", ti, want)
	}
	var buf bytes.Buffer
	_, err := s.ReadTrace(ctx, early.ID, 0, &buf)
	wantErr(t, "ReadTrace(archived)", err, store.ErrTraceArchived)
	if buf.Len() != 0 {
		t.Errorf("ReadTrace(archived) wrote %d bytes", buf.Len())
	}
	_, err = s.AppendTrace(ctx, early.ID, size, []byte("more\n"))
	wantErr(t, "AppendTrace(archived)", err, store.ErrTraceArchived)
	_, err = s.AppendTrace(ctx, early.ID, 0, []byte("more\n"))
	wantErr(t, "AppendTrace(archived, offset 0)", err, store.ErrTraceArchived)
	wantErr(t, "ResetTrace(archived)", s.ResetTrace(ctx, early.ID), store.ErrTraceArchived)
	wantErr(t, "ArchiveTrace(again)", s.ArchiveTrace(ctx, early.ID, size, "other"), store.ErrTraceArchived)
	checkIDs(t, "TracesToArchive after archiving", list(at(4*time.Hour), 0), []int64{late.ID})
	// The other traces are untouched.
	if got := readTrace(t, s, late.ID, 0); !bytes.Equal(got, data) {
		t.Errorf("trace of another job = %q", got)
	}

	// Back into the store: only with the key it is archived under and
	// the bytes that match it.
	wantErr(t, "UnarchiveTrace(other key)", s.UnarchiveTrace(ctx, early.ID, "other", data), store.ErrConflict)
	wantErr(t, "UnarchiveTrace(not archived)", s.UnarchiveTrace(ctx, late.ID, key, data), store.ErrConflict)
	bad := bytes.ToUpper(data)
	if err := s.UnarchiveTrace(ctx, early.ID, key, bad); err == nil || errors.Is(err, store.ErrConflict) {
		t.Errorf("UnarchiveTrace(other bytes) = %v, want a mismatch error", err)
	}
	if err := s.UnarchiveTrace(ctx, early.ID, key, data[:10]); err == nil || errors.Is(err, store.ErrConflict) {
		t.Errorf("UnarchiveTrace(short) = %v, want a mismatch error", err)
	}
	must(t, s.UnarchiveTrace(ctx, early.ID, key, data))
	wantErr(t, "UnarchiveTrace(twice)", s.UnarchiveTrace(ctx, early.ID, key, data), store.ErrConflict)
	want.ArchiveKey = ""
	if ti := traceInfo(t, s, early.ID); ti != want {
		t.Errorf("TraceInfo after UnarchiveTrace = %+v, want %+v", ti, want)
	}
	if got := readTrace(t, s, early.ID, 3); !bytes.Equal(got, data[3:]) {
		t.Errorf("ReadTrace(3) after UnarchiveTrace = %q", got)
	}
	more := []byte("a line added later\n")
	n, err := s.AppendTrace(ctx, early.ID, size, more)
	must(t, err)
	all := append(append([]byte(nil), data...), more...)
	if n != int64(len(all)) {
		t.Errorf("AppendTrace after UnarchiveTrace = %d, want %d", n, len(all))
	}
	if got := readTrace(t, s, early.ID, 0); !bytes.Equal(got, all) {
		t.Errorf("trace after UnarchiveTrace and an append = %q", got)
	}
	checkIDs(t, "TracesToArchive after bringing back", list(at(4*time.Hour), 0), []int64{early.ID, late.ID})
}

// testConcurrentArchiveTrace races appends against archiving: every
// append either lands before the archive (which then fails and is tried
// again at the new size) or finds the trace archived; no byte is in the
// store and missing from the archive, or the reverse.
func testConcurrentArchiveTrace(t *testing.T, s store.Store) {
	ctx := t.Context()
	const rounds = 20
	for r := range rounds {
		j := createJob(t, s)
		appendAll(t, s, j.ID, []byte("first\n"))
		var (
			wg       sync.WaitGroup
			appended []byte
			archived int64
		)
		wg.Go(func() {
			off := int64(6)
			for n := range 30 { // bounded, so the archiver wins in the end
				line := fmt.Appendf(nil, "line %d\n", n)
				size, err := s.AppendTrace(ctx, j.ID, off, line)
				if errors.Is(err, store.ErrTraceArchived) {
					return
				}
				if err != nil {
					t.Errorf("round %d: AppendTrace: %v", r, err)
					return
				}
				appended = append(appended, line...)
				off = size
			}
		})
		wg.Go(func() {
			for {
				ti, err := s.TraceInfo(ctx, j.ID)
				if err != nil {
					t.Errorf("round %d: TraceInfo: %v", r, err)
					return
				}
				err = s.ArchiveTrace(ctx, j.ID, ti.Size, fmt.Sprintf("%d/trace.%d.log", j.ID, ti.Size))
				var re *store.RangeError
				if errors.As(err, &re) {
					continue
				}
				if err != nil {
					t.Errorf("round %d: ArchiveTrace: %v", r, err)
				}
				archived = ti.Size
				return
			}
		})
		wg.Wait()
		ti := traceInfo(t, s, j.ID)
		if want := int64(6 + len(appended)); ti.Size != want || archived != want {
			t.Errorf("round %d: archived at %d, trace size %d, want both %d (every acknowledged append)", r, archived, ti.Size, want)
		}
		if ti.ArchiveKey == "" {
			t.Errorf("round %d: trace not archived", r)
		}
		if want := crc32.ChecksumIEEE(append([]byte("first\n"), appended...)); ti.CRC32 != want {
			t.Errorf("round %d: CRC %08x, want %08x", r, ti.CRC32, want)
		}
	}
}

func checkIDs(t testing.TB, what string, got, want []int64) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}
