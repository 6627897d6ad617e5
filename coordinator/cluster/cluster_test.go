package cluster

import (
	"reflect"
	"strings"
	"testing"
)

func TestEncodeDecode(t *testing.T) {
	var events []Event
	for i := range 2000 {
		events = append(events, Event{Kind: []Kind{JobQueued, JobTaken, JobChanged, PipelineChanged, RunnerChanged, ProjectChanged}[i%6], ID: int64(i + 1)})
	}
	payloads := encode("abc", events)
	if len(payloads) < 2 {
		t.Fatalf("2000 events in %d payload(s), want several", len(payloads))
	}
	var got []Event
	for _, p := range payloads {
		if len(p) > maxPayload {
			t.Errorf("payload of %d bytes, limit %d", len(p), maxPayload)
		}
		replica, es, err := decode(p)
		if err != nil || replica != "abc" {
			t.Fatalf("decode: %q, %v", replica, err)
		}
		got = append(got, es...)
	}
	if !reflect.DeepEqual(got, events) {
		t.Errorf("round trip lost or reordered events")
	}
	if encode("abc", nil) != nil {
		t.Error("no events gave a payload")
	}
}

func TestDecodeRejects(t *testing.T) {
	for _, p := range []string{"", "   ", "r x", "r q", "r q0", "r q-1", "r qz", "r s5", "r q99999999999999999999"} {
		if _, _, err := decode(p); err == nil {
			t.Errorf("decode(%q) accepted", p)
		}
	}
	// A malformed event is reported and skipped; the events around it
	// count.
	_, es, err := decode("r q1 ?3 p0 t2")
	if err == nil || !reflect.DeepEqual(es, []Event{{JobQueued, 1}, {JobTaken, 2}}) {
		t.Errorf("decode with bad events in the middle: %v, %v", es, err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add("abc q1 t2 j3")
	f.Add("x")
	f.Add(strings.Repeat("q1 ", 100))
	f.Fuzz(func(t *testing.T, payload string) {
		replica, es, err := decode(payload)
		if err != nil {
			return
		}
		for _, e := range es {
			if e.ID <= 0 {
				t.Fatalf("decoded id %d", e.ID)
			}
		}
		again := encode(replica, es)
		if len(es) > 0 {
			r2, es2, err := decode(again[0])
			if err != nil || r2 != replica || len(again) == 1 && !reflect.DeepEqual(es, es2) {
				t.Fatalf("re-encoding %q: %q %v %v", payload, again, es2, err)
			}
		}
	})
}
