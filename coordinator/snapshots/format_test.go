package snapshots

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"testing"
	"testing/iotest"
)

func testKey(t testing.TB) []byte {
	t.Helper()
	k := make([]byte, KeySize)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	return k
}

// plaintext is n bytes that are not all alike (a chunk moved elsewhere
// would not decrypt to the same bytes by chance).
func plaintext(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/ChunkSize)
	}
	return b
}

func seal(t testing.TB, plain, kek []byte, jobID int64) []byte {
	t.Helper()
	enc, err := Encrypt(bytes.NewReader(plain), kek, jobID)
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(enc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// open decrypts a whole object, returning what it read before an error.
func open(object, kek []byte, jobID int64) ([]byte, error) {
	dec, err := Decrypt(bytes.NewReader(object), kek, jobID)
	if err != nil {
		return nil, err
	}
	return io.ReadAll(dec)
}

func TestRoundTrip(t *testing.T) {
	kek := testKey(t)
	for _, n := range []int{0, 1, ChunkSize - 1, ChunkSize, ChunkSize + 1, 2 * ChunkSize, 5<<20 + 123} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			plain := plaintext(n)
			object := seal(t, plain, kek, 42)
			if int64(len(object)) != SealedSize(int64(n)) {
				t.Errorf("object of %d bytes, SealedSize says %d", len(object), SealedSize(int64(n)))
			}
			if n >= 16 && bytes.Contains(object, plain[:16]) {
				t.Error("the object holds plaintext")
			}
			got, err := open(object, kek, 42)
			if err != nil || !bytes.Equal(got, plain) {
				t.Fatalf("decrypted %d bytes (%v), want the %d bytes of plaintext", len(got), err, n)
			}
		})
	}
}

// Readers and writers that move a byte at a time see the same bytes.
func TestRoundTripOneByteReads(t *testing.T) {
	kek := testKey(t)
	plain := plaintext(2*ChunkSize + 5)
	enc, err := Encrypt(iotest.OneByteReader(bytes.NewReader(plain)), kek, 1)
	if err != nil {
		t.Fatal(err)
	}
	object, err := io.ReadAll(iotest.OneByteReader(enc))
	if err != nil {
		t.Fatal(err)
	}
	dec, err := Decrypt(iotest.OneByteReader(bytes.NewReader(object)), kek, 1)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(iotest.OneByteReader(dec))
	if err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("decrypted %d bytes (%v), want %d", len(got), err, len(plain))
	}
	if err := iotest.TestReader(dec, nil); err != nil {
		t.Errorf("a finished reader: %v", err)
	}
}

// Every snapshot has its own data key: the same plaintext twice gives
// two different objects.
func TestFreshDataKey(t *testing.T) {
	kek := testKey(t)
	a, b := seal(t, plaintext(100), kek, 1), seal(t, plaintext(100), kek, 1)
	if bytes.Equal(a[HeaderSize:], b[HeaderSize:]) || bytes.Equal(a[:HeaderSize], b[:HeaderSize]) {
		t.Error("two snapshots share a data key")
	}
}

func TestDecryptRefuses(t *testing.T) {
	kek := testKey(t)
	plain := plaintext(3*ChunkSize + 100) // chunks 0, 1, 2 full, 3 final
	object := seal(t, plain, kek, 42)
	chunk := func(i int) int { return HeaderSize + i*(ChunkSize+tagSize) }
	flip := func(at int) []byte {
		b := bytes.Clone(object)
		b[at] ^= 0x01
		return b
	}
	swapped := bytes.Clone(object)
	copy(swapped[chunk(0):chunk(1)], object[chunk(1):chunk(2)])
	copy(swapped[chunk(1):chunk(2)], object[chunk(0):chunk(1)])
	for _, tt := range []struct {
		name   string
		object []byte
		kek    []byte
		jobID  int64
		want   error
		// readable is how much plaintext comes out before the error:
		// the chunks that authenticate.
		readable int
	}{
		{"another key", object, testKey(t), 42, ErrKey, 0},
		{"another job", object, kek, 43, ErrKey, 0},
		{"empty", nil, kek, 42, ErrNotSnapshot, 0},
		{"header cut short", object[:HeaderSize-1], kek, 42, ErrNotSnapshot, 0},
		{"another magic", flip(0), kek, 42, ErrNotSnapshot, 0},
		{"another version", flip(len(magic)), kek, 42, ErrNotSnapshot, 0},
		{"flipped byte in the key's nonce", flip(prefixSize), kek, 42, ErrKey, 0},
		{"flipped byte in the wrapped key", flip(HeaderSize - 1), kek, 42, ErrKey, 0},
		{"flipped byte in the first chunk", flip(chunk(0) + 10), kek, 42, ErrCorrupt, 0},
		{"flipped byte in a chunk's tag", flip(chunk(2) - 1), kek, 42, ErrCorrupt, ChunkSize},
		{"flipped byte in the final chunk", flip(len(object) - 20), kek, 42, ErrCorrupt, 3 * ChunkSize},
		{"chunks swapped", swapped, kek, 42, ErrCorrupt, 0},
		{"header only", object[:HeaderSize], kek, 42, ErrTruncated, 0},
		{"cut within a chunk", object[:chunk(1)+500], kek, 42, ErrCorrupt, ChunkSize},
		{"cut within a tag", object[:chunk(3)+5], kek, 42, ErrTruncated, 3 * ChunkSize},
		{"final chunk removed", object[:chunk(3)], kek, 42, ErrTruncated, 2 * ChunkSize},
		{"bytes after the final chunk", append(bytes.Clone(object), 0), kek, 42, ErrCorrupt, 3 * ChunkSize},
		{"a final chunk after the final chunk", append(bytes.Clone(object), object[chunk(3):]...), kek, 42, ErrCorrupt, 3 * ChunkSize},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := open(tt.object, tt.kek, tt.jobID)
			if !errors.Is(err, tt.want) {
				t.Fatalf("error %v, want %v", err, tt.want)
			}
			if want := fmt.Sprintf("job %d", tt.jobID); !bytes.Contains([]byte(err.Error()), []byte(want)) {
				t.Errorf("error %q does not name the %s", err, want)
			}
			if !bytes.Equal(got, plain[:tt.readable]) {
				t.Errorf("%d bytes of plaintext before the error, want the first %d", len(got), tt.readable)
			}
		})
	}
}

// A full chunk that is the final one, followed by more bytes, is told
// apart from a full chunk that is not.
func TestBytesAfterAFullFinalChunk(t *testing.T) {
	kek := testKey(t)
	plain := plaintext(2 * ChunkSize)
	object := append(seal(t, plain, kek, 1), make([]byte, ChunkSize+tagSize)...)
	got, err := open(object, kek, 1)
	if !errors.Is(err, ErrCorrupt) || !bytes.Contains([]byte(err.Error()), []byte("follow its final chunk")) {
		t.Fatalf("error %v, want bytes after the final chunk", err)
	}
	if !bytes.Equal(got, plain[:ChunkSize]) {
		t.Errorf("%d bytes of plaintext before the error, want the first chunk's", len(got))
	}
}

func TestBadKeys(t *testing.T) {
	if _, err := Encrypt(bytes.NewReader(nil), make([]byte, 16), 1); err == nil {
		t.Error("Encrypt took a 16-byte key")
	}
	if _, err := Decrypt(bytes.NewReader(nil), nil, 1); err == nil {
		t.Error("Decrypt took no key")
	}
}

// An error reading the plaintext is the encrypting reader's error, and
// no final chunk is written for what was read before it.
func TestEncryptReadError(t *testing.T) {
	boom := errors.New("connection reset")
	kek := testKey(t)
	src := io.MultiReader(bytes.NewReader(plaintext(ChunkSize+10)), iotest.ErrReader(boom))
	enc, err := Encrypt(src, kek, 1)
	if err != nil {
		t.Fatal(err)
	}
	object, err := io.ReadAll(enc)
	if !errors.Is(err, boom) {
		t.Fatalf("error %v, want the reader's", err)
	}
	if _, err := open(object, kek, 1); !errors.Is(err, ErrTruncated) {
		t.Errorf("what was written before the error opens: %v", err)
	}
}

// An error reading the object (not its end) is the decrypting reader's
// error.
func TestDecryptReadError(t *testing.T) {
	boom := errors.New("connection reset")
	kek := testKey(t)
	object := seal(t, plaintext(2*ChunkSize), kek, 1)
	dec, err := Decrypt(io.MultiReader(bytes.NewReader(object[:HeaderSize+100]), iotest.ErrReader(boom)), kek, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(dec); !errors.Is(err, boom) {
		t.Errorf("error %v, want the reader's", err)
	}
}

func TestSealedSize(t *testing.T) {
	if prefixSize != len(magic)+1 {
		t.Fatalf("prefixSize %d, want the magic's %d bytes and the version's", prefixSize, len(magic))
	}
	for plain, want := range map[int64]int64{
		0:             HeaderSize + tagSize,
		1:             HeaderSize + 1 + tagSize,
		ChunkSize:     HeaderSize + ChunkSize + tagSize,
		ChunkSize + 1: HeaderSize + ChunkSize + 1 + 2*tagSize,
	} {
		if got := SealedSize(plain); got != want {
			t.Errorf("SealedSize(%d) = %d, want %d", plain, got, want)
		}
	}
}

// FuzzDecrypt: whatever the stored bytes, the decrypting reader neither
// panics nor gives plaintext that does not authenticate, and each
// failure is one of its errors. The seeds are objects sealed with the
// fuzzer's key, so mutations get past the header.
func FuzzDecrypt(f *testing.F) {
	kek := bytes.Repeat([]byte{7}, KeySize)
	for _, n := range []int{0, 1, 100, ChunkSize + 1} {
		f.Add(seal(f, plaintext(n), kek, 9))
	}
	f.Add([]byte(magic))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, object []byte) {
		dec, err := Decrypt(bytes.NewReader(object), kek, 9)
		if err == nil {
			_, err = io.Copy(io.Discard, dec)
			if err == nil {
				return // an object the fuzzer's key sealed
			}
		}
		if !errors.Is(err, ErrNotSnapshot) && !errors.Is(err, ErrKey) && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrTruncated) {
			t.Fatalf("unclassified error: %v", err)
		}
	})
}
