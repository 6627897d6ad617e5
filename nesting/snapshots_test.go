package nesting_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/berthci/berth/nesting"
	"github.com/berthci/berth/nesting/nestingtest"
)

// snapshotter is a fake hypervisor that can snapshot: its bundle is the
// job it was given, as JSON, then bytes enough for several messages.
type snapshotter struct{ *nestingtest.Fake }

func bundleOf(id string, job nesting.SnapshotJob) []byte {
	b, _ := json.Marshal(job)
	b = append(b, id...)
	for i := range 3<<20 + 12345 {
		b = append(b, byte(i*7))
	}
	return b
}

func (s snapshotter) SnapshotVM(ctx context.Context, id string, job nesting.SnapshotJob, w io.Writer) error {
	if id != "nesting-known001" {
		return fmt.Errorf("snapshot of %q: %w", id, nesting.ErrNotFound)
	}
	b := bundleOf(id, job)
	for len(b) > 0 { // in uneven writes, as a compressor does
		k := min(len(b), 70000)
		if _, err := w.Write(b[:k]); err != nil {
			return err
		}
		b = b[k:]
	}
	return nil
}

// TestSnapshotOverTheWire: Berth's Snapshots service streams a
// hypervisor's bundle whole to a client elsewhere, with the job it was
// given; an unknown VM is ErrNotFound; a daemon whose hypervisor cannot
// snapshot says so with ErrNoSnapshots.
func TestSnapshotOverTheWire(t *testing.T) {
	d := serve(t, snapshotter{&nestingtest.Fake{}})
	job := nesting.SnapshotJob{ID: 7, Name: "test", Point: "on_failure", Dir: "/builds/x", Env: []string{"A=1"}}
	var got bytes.Buffer
	if err := d.client.SnapshotVM(tctx(t), "nesting-known001", job, &got); err != nil {
		t.Fatal(err)
	}
	if want := bundleOf("nesting-known001", job); !bytes.Equal(got.Bytes(), want) {
		t.Errorf("received %d bytes, want the bundle's %d", got.Len(), len(want))
	}
	if err := d.client.SnapshotVM(tctx(t), "nesting-unknown1", job, io.Discard); !errors.Is(err, nesting.ErrNotFound) {
		t.Errorf("unknown VM: %v, want ErrNotFound", err)
	}
	plain := serve(t, &nestingtest.Fake{})
	if err := plain.client.SnapshotVM(tctx(t), "nesting-known001", job, io.Discard); !errors.Is(err, nesting.ErrNoSnapshots) {
		t.Errorf("a hypervisor that cannot snapshot: %v, want ErrNoSnapshots", err)
	}
}
