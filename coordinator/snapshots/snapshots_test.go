package snapshots

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/store/sealed"
)

func newVault(t *testing.T) (*Vault, *artifacts.Dir, *sealed.Key) {
	t.Helper()
	dir, err := artifacts.NewDir(filepath.Join(t.TempDir(), "artifacts"))
	if err != nil {
		t.Fatal(err)
	}
	key, err := sealed.LoadOrCreateKey(filepath.Join(t.TempDir(), "variables.key"))
	if err != nil {
		t.Fatal(err)
	}
	return NewVault(key, dir), dir, key
}

func TestVaultRoundTrip(t *testing.T) {
	ctx := context.Background()
	v, dir, key := newVault(t)
	plain := plaintext(3*ChunkSize + 7)
	n, err := v.Put(ctx, "5/berth_snapshot-x", 5, bytes.NewReader(plain), 0)
	if err != nil || n != int64(len(plain)) {
		t.Fatalf("Put: %d %v, want the snapshot's %d bytes", n, err, len(plain))
	}
	stored, err := os.ReadFile(filepath.Join(dir.Root(), "5", "berth_snapshot-x"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(stored, plain[:64]) || int64(len(stored)) != SealedSize(n) {
		t.Fatalf("stored %d bytes, holding plaintext: %v", len(stored), bytes.Contains(stored, plain[:64]))
	}
	a := &store.Artifact{ID: 1, JobID: 5, Type: ArtifactType, Size: n, StorageKey: "5/berth_snapshot-x"}
	rc, err := v.Open(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("Open read %d bytes (%v), want the %d put", len(got), err, len(plain))
	}
	// The key-encrypting key is the vault's subkey, not the secrets key.
	if _, err := open(stored, key.Subkey("another purpose"), 5); !errors.Is(err, ErrKey) {
		t.Errorf("another subkey: %v, want ErrKey", err)
	}
	if got, err := open(stored, v.kek, 5); err != nil || !bytes.Equal(got, plain) {
		t.Errorf("the object does not open with the vault's key: %v", err)
	}
}

func TestVaultSizeLimit(t *testing.T) {
	ctx := context.Background()
	v, dir, _ := newVault(t)
	// (A limit of 0 is none.)
	for _, n := range []int{1, ChunkSize - 1, ChunkSize, ChunkSize + 1} {
		if _, err := v.Put(ctx, "1/at-limit", 1, bytes.NewReader(plaintext(n)), int64(n)); err != nil {
			t.Errorf("a snapshot of %d bytes, at its limit: %v", n, err)
		}
		if _, err := v.Put(ctx, "1/over", 1, bytes.NewReader(plaintext(n+1)), int64(n)); !errors.Is(err, artifacts.ErrTooLarge) {
			t.Errorf("a snapshot of %d bytes, one past its limit: %v, want ErrTooLarge", n+1, err)
		}
	}
	if _, _, err := dir.Open(ctx, "1/over"); !errors.Is(err, artifacts.ErrNotFound) {
		t.Errorf("a snapshot over its limit was stored: %v", err)
	}
}

func TestVaultOpenRefuses(t *testing.T) {
	ctx := context.Background()
	v, dir, _ := newVault(t)
	n, err := v.Put(ctx, "7/s", 7, bytes.NewReader(plaintext(1000)), 0)
	if err != nil {
		t.Fatal(err)
	}
	good := store.Artifact{ID: 1, JobID: 7, Type: ArtifactType, Size: n, StorageKey: "7/s"}
	for _, tt := range []struct {
		name string
		edit func(a *store.Artifact)
		want error
	}{
		{"another job's record", func(a *store.Artifact) { a.JobID = 8 }, ErrKey},
		{"a smaller recorded size", func(a *store.Artifact) { a.Size-- }, ErrCorrupt},
		{"a larger recorded size", func(a *store.Artifact) { a.Size++ }, ErrTruncated},
		{"bytes gone", func(a *store.Artifact) { a.StorageKey = "7/gone" }, artifacts.ErrNotFound},
	} {
		a := good
		tt.edit(&a)
		if rc, err := v.Open(ctx, &a); !errors.Is(err, tt.want) {
			if rc != nil {
				rc.Close()
			}
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
	a := good
	a.Type = "archive"
	if _, err := v.Open(ctx, &a); err == nil {
		t.Error("Open read an archive as a snapshot")
	}
	// A copy of the storage opens with another coordinator's key no more.
	other, _, _ := newVault(t)
	other.arts = dir
	if _, err := other.Open(ctx, &good); !errors.Is(err, ErrKey) {
		t.Errorf("another coordinator's key: %v, want ErrKey", err)
	}
}

func TestAvailable(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tt := range []struct {
		a    store.Artifact
		want bool
	}{
		{store.Artifact{Type: ArtifactType}, true},
		{store.Artifact{Type: ArtifactType, ExpireAt: now.Add(time.Second)}, true},
		{store.Artifact{Type: ArtifactType, ExpireAt: now}, false},
		{store.Artifact{Type: "archive"}, false},
	} {
		if got := Available(&tt.a, now); got != tt.want {
			t.Errorf("Available(%s expiring %v) = %v, want %v", tt.a.Type, tt.a.ExpireAt, got, tt.want)
		}
	}
}
