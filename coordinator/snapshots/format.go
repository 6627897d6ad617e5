package snapshots

import (
	"bufio"
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The format, version 1. An object is a header and one or more chunks:
//
//	header  magic "BERTHSNP" (8) ‖ version 1 (1) ‖ nonce (12) ‖
//	        wrapped data key (32 + 16-byte tag)
//	chunk   AES-256-GCM(data key, nonce = 0⁴ ‖ counter (8, big endian),
//	        plaintext, additional data = magic ‖ version ‖ job id (8) ‖ final (1))
//
// The data key is random, one per object, sealed with the key-encrypting
// key (nonce random, additional data magic ‖ version ‖ job id). Every
// chunk but the last holds ChunkSize bytes of plaintext; the last holds 1
// to ChunkSize (0 for an empty snapshot) and is marked final. So a
// chunk that is altered, moved, or missing, the final chunk dropped or
// bytes after it, and an object copied to another job, all fail to open.
const (
	magic = "BERTHSNP"
	// version of the format this package writes and reads.
	version = 1
	// ChunkSize is the plaintext of every chunk but the last.
	ChunkSize = 64 << 10
	// KeySize is the size of the key-encrypting key and of data keys.
	KeySize = 32

	tagSize    = 16
	nonceSize  = 12
	prefixSize = 8 + 1 // magic, version
	// HeaderSize is the size of an object's header.
	HeaderSize = prefixSize + nonceSize + KeySize + tagSize
)

// Errors of Decrypt, wrapped with the job and the chunk.
var (
	// ErrNotSnapshot: the object is not one of this format (another
	// magic, another version, a header cut short).
	ErrNotSnapshot = errors.New("not a Berth snapshot of a known version")
	// ErrKey: the data key does not open with the key given, for this
	// job: another coordinator's key, another job's object, or an
	// altered header.
	ErrKey = errors.New("the snapshot's data key does not open with this coordinator's key for this job")
	// ErrCorrupt: a chunk does not authenticate (altered, reordered or
	// followed by other bytes).
	ErrCorrupt = errors.New("the snapshot is corrupted or was altered")
	// ErrTruncated: the object ends before its final chunk.
	ErrTruncated = errors.New("the snapshot is truncated")
)

// SealedSize is the size of the object that holds plain bytes of
// plaintext.
func SealedSize(plain int64) int64 {
	chunks := max(1, (plain+ChunkSize-1)/ChunkSize)
	return HeaderSize + plain + chunks*tagSize
}

func newAEAD(key []byte) (cipher.AEAD, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("snapshot key: want %d bytes, got %d", KeySize, len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// prefix is magic ‖ version ‖ job id: the additional data of the wrapped
// key, and of each chunk before its final flag.
func prefix(jobID int64) []byte {
	b := append([]byte(magic), version)
	return binary.BigEndian.AppendUint64(b, uint64(jobID))
}

func chunkNonce(dst []byte, counter uint64) []byte {
	clear(dst[:4])
	binary.BigEndian.PutUint64(dst[4:], counter)
	return dst
}

func chunkAD(dst, prefix []byte, final bool) []byte {
	dst = append(dst[:0], prefix...)
	if final {
		return append(dst, 1)
	}
	return append(dst, 0)
}

// Encrypt returns a reader of the object that holds what it reads from
// plain, sealed for job jobID with kek, the key-encrypting key. It reads
// plain one chunk ahead (ChunkSize+1 bytes) and holds no more; an error
// reading plain is its error.
func Encrypt(plain io.Reader, kek []byte, jobID int64) (io.Reader, error) {
	wrap, err := newAEAD(kek)
	if err != nil {
		return nil, err
	}
	dataKey := make([]byte, KeySize)
	if _, err := rand.Read(dataKey); err != nil {
		return nil, fmt.Errorf("snapshot data key: %w", err)
	}
	aead, err := newAEAD(dataKey)
	if err != nil {
		return nil, err
	}
	p := prefix(jobID)
	header := make([]byte, HeaderSize-KeySize-tagSize, HeaderSize)
	copy(header, p[:prefixSize])
	nonce := header[prefixSize:]
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("snapshot key nonce: %w", err)
	}
	header = wrap.Seal(header, nonce, dataKey, p)
	return &encrypter{src: plain, aead: aead, prefix: p, pending: header,
		in: make([]byte, 0, ChunkSize+1), out: make([]byte, 0, ChunkSize+tagSize),
		nonce: make([]byte, nonceSize)}, nil
}

type encrypter struct {
	src     io.Reader
	aead    cipher.AEAD
	prefix  []byte
	counter uint64
	// in is the next chunk's plaintext read so far: at most ChunkSize+1
	// bytes, the one past a chunk telling that it is not the last.
	in []byte
	// out holds the last sealed chunk; pending is what of it (or of the
	// header) is still to be read.
	out, pending []byte
	nonce, ad    []byte
	done         bool // the final chunk is sealed
	err          error
}

func (e *encrypter) Read(p []byte) (int, error) {
	for len(e.pending) == 0 {
		if e.err != nil {
			return 0, e.err
		}
		if e.done {
			return 0, io.EOF
		}
		e.err = e.sealNext()
	}
	n := copy(p, e.pending)
	e.pending = e.pending[n:]
	return n, nil
}

// sealNext reads and seals the next chunk.
func (e *encrypter) sealNext() error {
	n, err := io.ReadFull(e.src, e.in[len(e.in):cap(e.in)])
	e.in = e.in[:len(e.in)+n]
	final := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
	if err != nil && !final {
		return err
	}
	plain := e.in
	if !final {
		plain = e.in[:ChunkSize]
	}
	e.ad = chunkAD(e.ad, e.prefix, final)
	e.out = e.aead.Seal(e.out[:0], chunkNonce(e.nonce, e.counter), plain, e.ad)
	e.pending = e.out
	e.counter++
	if final {
		e.done = true
		e.in = e.in[:0]
	} else {
		e.in = append(e.in[:0], e.in[ChunkSize])
	}
	return nil
}

// Decrypt reads an object's header from sealed and returns a reader of
// its plaintext; kek and jobID must be those it was encrypted with, else
// ErrKey. The reader gives each chunk's plaintext once the chunk
// authenticates, and ends with io.EOF after the final chunk; otherwise
// with ErrCorrupt or ErrTruncated (or the error reading sealed), after
// the plaintext of the chunks before that.
func Decrypt(sealed io.Reader, kek []byte, jobID int64) (io.Reader, error) {
	wrap, err := newAEAD(kek)
	if err != nil {
		return nil, err
	}
	header := make([]byte, HeaderSize)
	if _, err := io.ReadFull(sealed, header); errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, fmt.Errorf("snapshot of job %d: header cut short: %w", jobID, ErrNotSnapshot)
	} else if err != nil {
		return nil, fmt.Errorf("snapshot of job %d: reading its header: %w", jobID, err)
	}
	if !bytes.Equal(header[:len(magic)], []byte(magic)) || header[len(magic)] != version {
		return nil, fmt.Errorf("snapshot of job %d: %w", jobID, ErrNotSnapshot)
	}
	p := prefix(jobID)
	dataKey, err := wrap.Open(nil, header[prefixSize:prefixSize+nonceSize], header[prefixSize+nonceSize:], p)
	if err != nil {
		return nil, fmt.Errorf("snapshot of job %d: %w", jobID, ErrKey)
	}
	aead, err := newAEAD(dataKey)
	if err != nil {
		return nil, err
	}
	return &decrypter{src: bufio.NewReaderSize(sealed, ChunkSize+tagSize+1), aead: aead, jobID: jobID, prefix: p,
		in: make([]byte, ChunkSize+tagSize), out: make([]byte, 0, ChunkSize), nonce: make([]byte, nonceSize)}, nil
}

type decrypter struct {
	src     *bufio.Reader
	aead    cipher.AEAD
	jobID   int64
	prefix  []byte
	counter uint64
	in      []byte // a sealed chunk
	out     []byte // its plaintext
	// plain is what of out is still to be read.
	plain     []byte
	nonce, ad []byte
	done      bool // the final chunk is open
	err       error
}

func (d *decrypter) Read(p []byte) (int, error) {
	for len(d.plain) == 0 {
		if d.err != nil {
			return 0, d.err
		}
		if d.done {
			return 0, io.EOF
		}
		d.err = d.openNext()
	}
	n := copy(p, d.plain)
	d.plain = d.plain[n:]
	return n, nil
}

// openNext reads and opens the next chunk. A chunk is the last when the
// object ends with it: short, or full and followed by nothing.
func (d *decrypter) openNext() error {
	n, err := io.ReadFull(d.src, d.in)
	final := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
	if err != nil && !final {
		return fmt.Errorf("snapshot of job %d: reading chunk %d: %w", d.jobID, d.counter, err)
	}
	if !final {
		if _, err := d.src.Peek(1); errors.Is(err, io.EOF) {
			final = true
		} else if err != nil {
			return fmt.Errorf("snapshot of job %d: reading chunk %d: %w", d.jobID, d.counter, err)
		}
	}
	if n < tagSize {
		return fmt.Errorf("snapshot of job %d: it ends at chunk %d, before its final chunk: %w", d.jobID, d.counter, ErrTruncated)
	}
	plain, err := d.open(d.in[:n], final)
	if err == nil {
		d.plain, d.done = plain, final
		d.counter++
		return nil
	}
	// Why not: a chunk that opens with the other final flag tells.
	if _, err := d.open(d.in[:n], !final); err == nil {
		if final {
			return fmt.Errorf("snapshot of job %d: it ends after chunk %d, which is not its final chunk: %w", d.jobID, d.counter, ErrTruncated)
		}
		return fmt.Errorf("snapshot of job %d: bytes follow its final chunk %d: %w", d.jobID, d.counter, ErrCorrupt)
	}
	if n < len(d.in) {
		return fmt.Errorf("snapshot of job %d: its last chunk, %d, does not authenticate (altered, or the snapshot is cut short within it): %w", d.jobID, d.counter, ErrCorrupt)
	}
	return fmt.Errorf("snapshot of job %d: chunk %d does not authenticate: %w", d.jobID, d.counter, ErrCorrupt)
}

func (d *decrypter) open(chunk []byte, final bool) ([]byte, error) {
	d.ad = chunkAD(d.ad, d.prefix, final)
	// Not in place: a failed Open clears its output, and the chunk is
	// tried again with the other flag.
	return d.aead.Open(d.out[:0], chunkNonce(d.nonce, d.counter), chunk, d.ad)
}
