package ledger

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

func TestReplayAfterReopen(t *testing.T) {
	dir := t.TempDir()
	l, st, err := Open(dir, "fake/a")
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Instances) != 0 || st.Group != "fake/a" {
		t.Fatalf("fresh state %+v", st)
	}
	must(t, l.Append(Event{Op: OpRequested, N: 3, At: t0}))
	must(t, l.Append(Event{Op: OpSeen, ID: "i1", At: t0}, Event{Op: OpSeen, ID: "i2", At: t0}))
	must(t, l.Append(Event{Op: OpReady, ID: "i1"}))
	must(t, l.Append(Event{Op: OpAcquire, ID: "i1", Slot: 0, Key: "j1"}, Event{Op: OpAcquire, ID: "i1", Slot: 1, Key: "j2"}))
	must(t, l.Append(Event{Op: OpRelease, ID: "i1", Slot: 0}, Event{Op: OpAcquire, ID: "i1", Slot: 0, Key: "j3"}))
	must(t, l.Append(Event{Op: OpRelease, ID: "i1", Slot: 1}))
	must(t, l.Append(Event{Op: OpRemoving, ID: "i2"}))
	must(t, l.Close())

	for round := range 2 { // the second round reads the compacted file
		l, st, err = Open(dir, "fake/a")
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Requested) != 1 {
			t.Errorf("round %d: requested %d, want 1", round, len(st.Requested))
		}
		i1, i2 := st.Instances["i1"], st.Instances["i2"]
		if i1 == nil || i2 == nil {
			t.Fatalf("round %d: instances %v", round, st.Instances)
		}
		if !i1.Ready || i1.Uses != 3 || len(i1.Slots) != 1 || i1.Slots[0] != "j3" || i1.Removing {
			t.Errorf("round %d: i1 = %+v", round, i1)
		}
		if i2.Ready || !i2.Removing || i2.Uses != 0 {
			t.Errorf("round %d: i2 = %+v", round, i2)
		}
		if ord := st.Ordered(); len(ord) != 2 || ord[0].ID != "i1" {
			t.Errorf("round %d: order %v", round, ord)
		}
		must(t, l.Close())
	}
}

func TestGoneForgets(t *testing.T) {
	dir := t.TempDir()
	l, _, err := Open(dir, "g")
	must(t, err)
	must(t, l.Append(Event{Op: OpSeen, ID: "i1"}, Event{Op: OpAcquire, ID: "i1", Key: "k"}, Event{Op: OpGone, ID: "i1"}))
	must(t, l.Close())
	_, st, err := Open(dir, "g")
	must(t, err)
	if len(st.Instances) != 0 {
		t.Errorf("gone instance still there: %v", st.Instances)
	}
}

func TestTornLineIgnored(t *testing.T) {
	dir := t.TempDir()
	l, _, err := Open(dir, "g")
	must(t, err)
	must(t, l.Append(Event{Op: OpSeen, ID: "i1"}))
	must(t, l.Close())
	f, err := os.OpenFile(filepath.Join(dir, FileName), os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	f.WriteString(`{"op":"acquire","id":"i1","sl`)
	f.Close()
	_, st, err := Open(dir, "g")
	must(t, err)
	if in := st.Instances["i1"]; in == nil || in.Uses != 0 {
		t.Errorf("after torn line: %+v", in)
	}
}

func TestOtherGroupRefused(t *testing.T) {
	dir := t.TempDir()
	l, _, err := Open(dir, "aws/one")
	must(t, err)
	l.Close()
	if _, _, err := Open(dir, "aws/two"); !errors.Is(err, ErrOtherGroup) {
		t.Fatalf("Open for another group: %v", err)
	}
}

func TestCompactionKeepsState(t *testing.T) {
	dir := t.TempDir()
	l, _, err := Open(dir, "g")
	must(t, err)
	must(t, l.Append(Event{Op: OpSeen, ID: "i1"}))
	for i := range 3000 {
		must(t, l.Append(Event{Op: OpAcquire, ID: "i1", Slot: i % 2, Key: "k"}, Event{Op: OpRelease, ID: "i1", Slot: i % 2}))
	}
	info, err := os.Stat(filepath.Join(dir, FileName))
	must(t, err)
	if info.Size() > 200_000 {
		t.Errorf("ledger not compacted: %d bytes", info.Size())
	}
	must(t, l.Close())
	_, st, err := Open(dir, "g")
	must(t, err)
	if st.Instances["i1"].Uses != 3000 {
		t.Errorf("uses %d after compactions, want 3000", st.Instances["i1"].Uses)
	}
}

func TestLease(t *testing.T) {
	dir := t.TempDir()
	a, err := TakeLease(dir, "fake/g", "a", t0, time.Minute)
	must(t, err)
	if _, err := TakeLease(dir, "fake/g", "b", t0.Add(30*time.Second), time.Minute); !errors.Is(err, ErrLeaseHeld) {
		t.Fatalf("second owner took a live lease: %v", err)
	}
	// Another group is independent.
	if _, err := TakeLease(dir, "fake/other", "b", t0, time.Minute); err != nil {
		t.Fatal(err)
	}
	must(t, a.Renew("fake/g", t0.Add(50*time.Second)))
	if _, err := TakeLease(dir, "fake/g", "b", t0.Add(100*time.Second), time.Minute); !errors.Is(err, ErrLeaseHeld) {
		t.Fatalf("renewed lease taken: %v", err)
	}
	// a stops renewing (a crash): b takes over after expiry, and a learns it lost.
	b, err := TakeLease(dir, "fake/g", "b", t0.Add(111*time.Second), time.Minute)
	must(t, err)
	var held *HeldError
	if err := a.Renew("fake/g", t0.Add(112*time.Second)); !errors.As(err, &held) || held.Owner != "b" {
		t.Fatalf("a renewed b's lease: %v", err)
	}
	must(t, a.Release()) // not a's: no effect
	if _, err := TakeLease(dir, "fake/g", "c", t0.Add(113*time.Second), time.Minute); !errors.Is(err, ErrLeaseHeld) {
		t.Fatalf("a's release dropped b's lease: %v", err)
	}
	must(t, b.Release())
	if _, err := TakeLease(dir, "fake/g", "c", t0.Add(114*time.Second), time.Minute); err != nil {
		t.Fatalf("released lease not free: %v", err)
	}
}

func TestLeaseRace(t *testing.T) {
	dir := t.TempDir()
	var wg sync.WaitGroup
	won := make(chan string, 16)
	for _, owner := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		wg.Go(func() {
			if _, err := TakeLease(dir, "g", owner, t0, time.Minute); err == nil {
				won <- owner
			}
		})
	}
	wg.Wait()
	close(won)
	if n := len(won); n != 1 {
		t.Fatalf("%d managers took the lease at once", n)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestSecondProcessRefused(t *testing.T) {
	dir := t.TempDir()
	l, _, err := Open(dir, "g")
	must(t, err)
	if _, _, err := Open(dir, "g"); !errors.Is(err, ErrInUse) {
		t.Fatalf("second Open of a ledger in use: %v", err)
	}
	must(t, l.Close())
	l, _, err = Open(dir, "g")
	must(t, err)
	l.Close()
}
