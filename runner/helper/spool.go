package helper

import (
	"bytes"
	"io"
	"os"
)

// spoolMemory is how much of an archive a spool keeps in memory before it
// moves it to a temporary file.
const spoolMemory = 8 << 20

// spool holds an archive being made or downloaded: in memory while it is
// small (most artifacts), else in a temporary file. Small archives then
// cost no file made and removed.
type spool struct {
	buf  bytes.Buffer
	f    *os.File
	size int64
}

func (s *spool) Write(p []byte) (int, error) {
	if s.f == nil && s.buf.Len()+len(p) > spoolMemory {
		f, err := os.CreateTemp("", "berth-archive-*")
		if err != nil {
			return 0, err
		}
		s.f = f
		if _, err := f.Write(s.buf.Bytes()); err != nil {
			return 0, err
		}
		s.buf = bytes.Buffer{}
	}
	var n int
	var err error
	if s.f != nil {
		n, err = s.f.Write(p)
	} else {
		n, err = s.buf.Write(p)
	}
	s.size += int64(n)
	return n, err
}

// Size is how many bytes were written.
func (s *spool) Size() int64 { return s.size }

// Open reads the archive from its start (again at each call).
func (s *spool) Open() (io.ReadCloser, error) {
	if s.f == nil {
		return io.NopCloser(bytes.NewReader(s.buf.Bytes())), nil
	}
	return os.Open(s.f.Name())
}

// ReaderAt reads the archive at offsets.
func (s *spool) ReaderAt() io.ReaderAt {
	if s.f == nil {
		return bytes.NewReader(s.buf.Bytes())
	}
	return s.f
}

// Close removes the temporary file, if any.
func (s *spool) Close() error {
	if s.f == nil {
		return nil
	}
	name := s.f.Name()
	s.f.Close()
	return os.Remove(name)
}
