// Package artifactstest is the conformance suite of artifacts.Storage:
// every implementation (the directory, the S3 object store) runs it, so
// the coordinator sees the same behaviour whichever holds its artifacts.
package artifactstest

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/artifacts"
)

// Large is the size of the suite's large objects: more than one part of
// a store that uploads in parts of 8 MiB.
const Large = 12 << 20

// Run runs the suite. open returns an empty store; it is called once per
// subtest.
func Run(t *testing.T, open func(t *testing.T) artifacts.Storage) {
	t.Run("RoundTrip", func(t *testing.T) {
		s := open(t)
		mustPut(t, s, "1/archive", []byte("hello"), 10)
		want(t, s, "1/archive", []byte("hello"))
		mustPut(t, s, "1/nested/deeper/file.zip", []byte("x"), 0)
		want(t, s, "1/nested/deeper/file.zip", []byte("x"))
		mustPut(t, s, "empty", nil, 10)
		want(t, s, "empty", nil)
	})
	t.Run("Overwrite", func(t *testing.T) {
		s := open(t)
		mustPut(t, s, "k", []byte("first"), 0)
		mustPut(t, s, "k", []byte("second, longer"), 0)
		want(t, s, "k", []byte("second, longer"))
	})
	t.Run("ExactlyMax", func(t *testing.T) {
		s := open(t)
		mustPut(t, s, "k", []byte("0123456789"), 10)
		want(t, s, "k", []byte("0123456789"))
	})
	t.Run("TooLargeLeavesNothing", func(t *testing.T) {
		s := open(t)
		if _, err := s.Put(context.Background(), "1/big", strings.NewReader("0123456789a"), 10); !errors.Is(err, artifacts.ErrTooLarge) {
			t.Fatalf("oversized Put: %v, want ErrTooLarge", err)
		}
		wantMissing(t, s, "1/big")
	})
	t.Run("TooLargeKeepsTheOldObject", func(t *testing.T) {
		s := open(t)
		mustPut(t, s, "k", []byte("old"), 0)
		if _, err := s.Put(context.Background(), "k", strings.NewReader("0123456789a"), 10); !errors.Is(err, artifacts.ErrTooLarge) {
			t.Fatalf("oversized Put: %v, want ErrTooLarge", err)
		}
		want(t, s, "k", []byte("old"))
	})
	t.Run("Large", func(t *testing.T) {
		s := open(t)
		big := random(t, Large)
		mustPut(t, s, "big", big, 0)
		want(t, s, "big", big)
		mustPut(t, s, "big-at-max", big, Large)
		want(t, s, "big-at-max", big)
		if _, err := s.Put(context.Background(), "big-over", bytes.NewReader(big), Large-1); !errors.Is(err, artifacts.ErrTooLarge) {
			t.Fatalf("Put of %d bytes with max %d: %v, want ErrTooLarge", Large, Large-1, err)
		}
		wantMissing(t, s, "big-over")
		// Over the limit only past its first part: the old object stays.
		mustPut(t, s, "big", []byte("small now"), 0)
		if _, err := s.Put(context.Background(), "big", bytes.NewReader(big), 9<<20); !errors.Is(err, artifacts.ErrTooLarge) {
			t.Fatalf("Put of %d bytes with max %d: %v, want ErrTooLarge", Large, 9<<20, err)
		}
		want(t, s, "big", []byte("small now"))
	})
	t.Run("ReaderErrorLeavesNothing", func(t *testing.T) {
		s := open(t)
		boom := errors.New("client went away")
		for _, n := range []int{5, Large - 1} {
			key := fmt.Sprintf("broken-%d", n)
			_, err := s.Put(context.Background(), key, io.MultiReader(bytes.NewReader(random(t, n)), errReader{boom}), 0)
			if !errors.Is(err, boom) {
				t.Fatalf("Put from a reader failing after %d bytes: %v, want the reader's error", n, err)
			}
			wantMissing(t, s, key)
		}
	})
	t.Run("CanceledContextLeavesNothing", func(t *testing.T) {
		s := open(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := s.Put(ctx, "canceled", strings.NewReader("data"), 0); err == nil {
			t.Fatal("Put with a canceled context succeeded")
		}
		wantMissing(t, s, "canceled")
		// Canceled in the middle of a large body.
		ctx, cancel = context.WithCancel(context.Background())
		r := &cancelAfter{r: bytes.NewReader(random(t, Large)), n: 9 << 20, cancel: cancel}
		if _, err := s.Put(ctx, "canceled-large", r, 0); err == nil {
			t.Fatal("Put whose context ended mid-body succeeded")
		}
		wantMissing(t, s, "canceled-large")
	})
	t.Run("MissingKeys", func(t *testing.T) {
		s := open(t)
		wantMissing(t, s, "nothing/here")
		if err := s.Delete(context.Background(), "nothing/here"); !errors.Is(err, artifacts.ErrNotFound) {
			t.Fatalf("Delete of a missing key: %v, want ErrNotFound", err)
		}
	})
	t.Run("Delete", func(t *testing.T) {
		s := open(t)
		mustPut(t, s, "1/archive", []byte("x"), 0)
		mustPut(t, s, "1/other", []byte("y"), 0)
		if err := s.Delete(context.Background(), "1/archive"); err != nil {
			t.Fatal(err)
		}
		wantMissing(t, s, "1/archive")
		want(t, s, "1/other", []byte("y"))
		if err := s.Delete(context.Background(), "1/archive"); !errors.Is(err, artifacts.ErrNotFound) {
			t.Fatalf("second Delete: %v, want ErrNotFound", err)
		}
	})
	t.Run("RejectsInvalidKeys", func(t *testing.T) {
		s := open(t)
		ctx := context.Background()
		for _, k := range []string{"", ".", "..", "../x", "a/../../x", "a/..", "/abs", "a/", "a\\b", "a//b", "a/./b"} {
			if _, err := s.Put(ctx, k, strings.NewReader("x"), 0); err == nil {
				t.Errorf("Put with key %q accepted", k)
			}
			if rc, _, err := s.Open(ctx, k); err == nil {
				rc.Close()
				t.Errorf("Open with key %q accepted", k)
			} else if errors.Is(err, artifacts.ErrNotFound) {
				t.Errorf("Open with key %q: %v; an invalid key is not a missing one", k, err)
			}
			if err := s.Delete(ctx, k); err == nil {
				t.Errorf("Delete with key %q accepted", k)
			}
		}
	})
	t.Run("ReadersSeeWholeObjects", func(t *testing.T) {
		s := open(t)
		a, b := bytes.Repeat([]byte("a"), 64<<10), bytes.Repeat([]byte("b"), 96<<10)
		mustPut(t, s, "k", a, 0)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		stop := make(chan struct{})
		errs := make(chan error, 8)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				body := a
				if i%2 == 0 {
					body = b
				}
				if _, err := s.Put(ctx, "k", bytes.NewReader(body), 0); err != nil {
					errs <- err
					break
				}
			}
			close(stop)
		}()
		for r := 0; r < 3; r++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					rc, size, err := s.Open(ctx, "k")
					if err != nil {
						errs <- fmt.Errorf("Open during overwrites: %w", err)
						return
					}
					got, err := io.ReadAll(rc)
					rc.Close()
					if err != nil {
						errs <- fmt.Errorf("reading during overwrites: %w", err)
						return
					}
					if int64(len(got)) != size || !(bytes.Equal(got, a) || bytes.Equal(got, b)) {
						errs <- fmt.Errorf("a reader saw %d bytes (size %d) that are neither object whole", len(got), size)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}

func mustPut(t *testing.T, s artifacts.Storage, key string, body []byte, max int64) {
	t.Helper()
	n, err := s.Put(context.Background(), key, bytes.NewReader(body), max)
	if err != nil {
		t.Fatalf("Put %s (%d bytes, max %d): %v", key, len(body), max, err)
	}
	if n != int64(len(body)) {
		t.Fatalf("Put %s = %d, want %d", key, n, len(body))
	}
}

func want(t *testing.T, s artifacts.Storage, key string, body []byte) {
	t.Helper()
	rc, size, err := s.Open(context.Background(), key)
	if err != nil {
		t.Fatalf("Open %s: %v", key, err)
	}
	defer rc.Close()
	got, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("reading %s: %v", key, err)
	}
	if size != int64(len(body)) || !bytes.Equal(got, body) {
		t.Fatalf("Open %s: size %d, %d bytes read; want %d bytes as stored", key, size, len(got), len(body))
	}
}

func wantMissing(t *testing.T, s artifacts.Storage, key string) {
	t.Helper()
	rc, _, err := s.Open(context.Background(), key)
	if err == nil {
		rc.Close()
		t.Fatalf("Open %s: found, want ErrNotFound (a failed Put must leave nothing)", key)
	}
	if !errors.Is(err, artifacts.ErrNotFound) {
		t.Fatalf("Open %s: %v, want ErrNotFound", key, err)
	}
}

func random(t *testing.T, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// cancelAfter reads r and cancels after n bytes.
type cancelAfter struct {
	r      io.Reader
	n      int
	read   int
	cancel context.CancelFunc
}

func (c *cancelAfter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.read += n
	if c.read >= c.n {
		c.cancel()
	}
	return n, err
}

// GzipFiles is the gzip of files, one member each, as the runner uploads
// a report (artifacts.ReportFiles reads it back).
func GzipFiles(files ...string) []byte {
	var b bytes.Buffer
	for _, f := range files {
		zw := gzip.NewWriter(&b)
		_, _ = zw.Write([]byte(f))
		_ = zw.Close()
	}
	return b.Bytes()
}
