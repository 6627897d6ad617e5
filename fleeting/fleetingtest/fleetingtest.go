// Package fleetingtest is the conformance suite of the fleeting contract:
// the behaviour every instance group must show, whether called in-process or
// through the plugin host over gRPC. Every plugin in this repository runs it
// both ways; a third-party plugin can run it through fleeting/host.
package fleetingtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/berthci/berth/fleeting"
)

// Settings are the connector settings the suite passes to Init.
var Settings = fleeting.Settings{ConnectorConfig: fleeting.ConnectorConfig{
	OS:        "linux",
	Arch:      "amd64",
	Protocol:  fleeting.ProtocolSSH,
	Username:  "berth",
	Keepalive: 30 * time.Second,
	Timeout:   10 * time.Second,
}}

// WaitTimeout bounds every wait for an instance to reach a state. It is a
// safety net against hanging, not a performance requirement.
var WaitTimeout = 2 * time.Minute

// Run runs the suite. newGroup returns a new, configured but not yet
// initialised group with no instances; it is called once per subtest. The
// group should hold at least 2 instances (MaxSize 0 or ≥ 2), and instances
// should become running within WaitTimeout. The suite deletes every instance
// it created and calls Shutdown at the end of each subtest.
func Run(t *testing.T, newGroup func(t *testing.T) fleeting.InstanceGroup) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s *subject)
	}{
		{"InitDescribesGroup", testInit},
		{"CallsBeforeInitFail", testBeforeInit},
		{"StartsEmpty", testStartsEmpty},
		{"IncreaseZero", testIncreaseZero},
		{"IncreaseCreatesRunningInstances", testIncrease},
		{"UpdateListsEachInstanceOnce", testUpdateOnce},
		{"ConnectInfo", testConnectInfo},
		{"Heartbeat", testHeartbeat},
		{"DecreaseDeletes", testDecrease},
		{"DecreaseIsIdempotent", testDecreaseIdempotent},
		{"QuotaIsRespected", testQuota},
		{"CancelledContext", testCancelled},
		{"ConcurrentUse", testConcurrent},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := newGroup(t)
			s := &subject{g: g, t: t}
			t.Cleanup(s.cleanup)
			tc.fn(t, s)
		})
	}
}

type subject struct {
	g      fleeting.InstanceGroup
	t      *testing.T
	info   fleeting.ProviderInfo
	inited bool
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), WaitTimeout)
	t.Cleanup(cancel)
	return c
}

func (s *subject) init() fleeting.ProviderInfo {
	s.t.Helper()
	info, err := s.g.Init(ctx(s.t), TestLogger(s.t), Settings)
	if err != nil {
		s.t.Fatalf("Init: %v", err)
	}
	s.info, s.inited = info, true
	return info
}

// list returns the instances one Update reports, failing on duplicates or
// invalid states.
func (s *subject) list() map[string]fleeting.State {
	s.t.Helper()
	got := map[string]fleeting.State{}
	var dup []string
	err := s.g.Update(ctx(s.t), func(id string, st fleeting.State) {
		if _, ok := got[id]; ok {
			dup = append(dup, id)
		}
		got[id] = st
	})
	if err != nil {
		s.t.Fatalf("Update: %v", err)
	}
	if len(dup) > 0 {
		s.t.Fatalf("Update reported %v more than once", dup)
	}
	for id, st := range got {
		if id == "" {
			s.t.Fatalf("Update reported an empty instance ID")
		}
		if !st.Valid() {
			s.t.Fatalf("Update reported instance %s in invalid state %q", id, st)
		}
	}
	return got
}

// live returns the instances not in a terminal state.
func (s *subject) live() map[string]fleeting.State {
	out := s.list()
	for id, st := range out {
		if st.Terminal() {
			delete(out, id)
		}
	}
	return out
}

// waitFor polls Update until cond holds.
func (s *subject) waitFor(what string, cond func(map[string]fleeting.State) bool) map[string]fleeting.State {
	s.t.Helper()
	deadline := time.Now().Add(WaitTimeout)
	for {
		l := s.list()
		if cond(l) {
			return l
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("waiting for %s: gave up after %s; last Update: %v", what, WaitTimeout, l)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// increase asks for n instances and waits until that many are running.
func (s *subject) increase(n int) []string {
	s.t.Helper()
	before := s.live()
	got, err := s.g.Increase(ctx(s.t), n)
	if err != nil {
		s.t.Fatalf("Increase(%d): %v", n, err)
	}
	if got < 1 || got > n {
		s.t.Fatalf("Increase(%d) = %d, want 1..%d", n, got, n)
	}
	var ids []string
	s.waitFor(fmt.Sprintf("%d new running instances", got), func(l map[string]fleeting.State) bool {
		ids = ids[:0]
		for id, st := range l {
			if _, old := before[id]; old {
				continue
			}
			if st != fleeting.StateRunning {
				return false
			}
			ids = append(ids, id)
		}
		return len(ids) == got
	})
	slices.Sort(ids)
	return ids
}

func (s *subject) cleanup() {
	if !s.inited {
		return
	}
	t := s.t
	c, cancel := context.WithTimeout(context.Background(), WaitTimeout)
	defer cancel()
	deadline := time.Now().Add(WaitTimeout)
	for time.Now().Before(deadline) {
		var ids []string
		if err := s.g.Update(c, func(id string, st fleeting.State) {
			if !st.Terminal() {
				ids = append(ids, id)
			}
		}); err != nil {
			t.Errorf("cleanup: Update: %v", err)
			break
		}
		if len(ids) == 0 {
			break
		}
		if _, err := s.g.Decrease(c, ids); err != nil {
			t.Errorf("cleanup: Decrease(%v): %v", ids, err)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := s.g.Shutdown(c); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

func testInit(t *testing.T, s *subject) {
	info := s.init()
	if info.ID == "" {
		t.Errorf("ProviderInfo.ID is empty")
	}
	if info.MaxSize < 0 {
		t.Errorf("ProviderInfo.MaxSize = %d, want ≥ 0", info.MaxSize)
	}
	if info.MaxSize == 1 {
		t.Fatalf("the suite needs a group of at least 2 instances, MaxSize is 1")
	}
}

func testBeforeInit(t *testing.T, s *subject) {
	c := ctx(t)
	if err := s.g.Update(c, func(string, fleeting.State) {}); err == nil {
		t.Errorf("Update before Init succeeded, want an error")
	}
	if n, err := s.g.Increase(c, 1); err == nil || n != 0 {
		t.Errorf("Increase before Init = %d, %v; want 0 and an error", n, err)
	}
}

func testStartsEmpty(t *testing.T, s *subject) {
	s.init()
	if l := s.list(); len(l) != 0 {
		t.Fatalf("a new group lists %v, want nothing (newGroup must return an empty group)", l)
	}
}

func testIncreaseZero(t *testing.T, s *subject) {
	s.init()
	n, err := s.g.Increase(ctx(t), 0)
	if n != 0 || err != nil {
		t.Fatalf("Increase(0) = %d, %v; want 0, nil", n, err)
	}
	if l := s.list(); len(l) != 0 {
		t.Fatalf("after Increase(0) Update lists %v, want nothing", l)
	}
}

func testIncrease(t *testing.T, s *subject) {
	s.init()
	ids := s.increase(2)
	// IDs are stable: a second Update lists the same instances.
	l := s.live()
	for _, id := range ids {
		if l[id] != fleeting.StateRunning {
			t.Errorf("instance %s: second Update says %q, want running", id, l[id])
		}
	}
	if len(l) != len(ids) {
		t.Errorf("second Update lists %v, want exactly %v", l, ids)
	}
}

func testUpdateOnce(t *testing.T, s *subject) {
	s.init()
	s.increase(2)
	for range 3 {
		s.list() // fails on duplicates
	}
}

func testConnectInfo(t *testing.T, s *subject) {
	s.init()
	ids := s.increase(1)
	c := ctx(t)
	info, err := s.g.ConnectInfo(c, ids[0])
	if err != nil {
		t.Fatalf("ConnectInfo(%s): %v", ids[0], err)
	}
	if info.ID != ids[0] {
		t.Errorf("ConnectInfo(%s).ID = %q", ids[0], info.ID)
	}
	if info.InternalAddr == "" && info.ExternalAddr == "" {
		t.Errorf("ConnectInfo(%s) has neither internal nor external address", ids[0])
	}
	if info.Protocol == "" {
		t.Errorf("ConnectInfo(%s).Protocol is empty", ids[0])
	}
	if !info.Expires.IsZero() && info.Expires.Before(time.Now()) {
		t.Errorf("ConnectInfo(%s) expired already at %v", ids[0], info.Expires)
	}
	_, err = s.g.ConnectInfo(c, "no-such-instance-4711")
	if !errors.Is(err, fleeting.ErrInstanceNotFound) {
		t.Errorf("ConnectInfo(unknown) error = %v, want one wrapping ErrInstanceNotFound", err)
	}
}

func testHeartbeat(t *testing.T, s *subject) {
	s.init()
	ids := s.increase(1)
	c := ctx(t)
	if err := s.g.Heartbeat(c, ids[0]); err != nil {
		t.Errorf("Heartbeat(%s) of a running instance: %v", ids[0], err)
	}
	if err := s.g.Heartbeat(c, "no-such-instance-4711"); err == nil {
		t.Errorf("Heartbeat(unknown) succeeded, want an error")
	}
}

func gone(id string) func(map[string]fleeting.State) bool {
	return func(l map[string]fleeting.State) bool {
		st, ok := l[id]
		return !ok || st.Terminal()
	}
}

func testDecrease(t *testing.T, s *subject) {
	s.init()
	ids := s.increase(2)
	c := ctx(t)
	got, err := s.g.Decrease(c, ids[:1])
	if err != nil {
		t.Fatalf("Decrease(%v): %v", ids[:1], err)
	}
	if !slices.Equal(got, ids[:1]) {
		t.Fatalf("Decrease(%v) = %v, want all accepted", ids[:1], got)
	}
	l := s.list()
	if st, ok := l[ids[0]]; ok && st != fleeting.StateDeleting && st != fleeting.StateDeleted {
		t.Errorf("right after Decrease instance %s is %q, want deleting, deleted or not listed", ids[0], st)
	}
	s.waitFor("instance "+ids[0]+" to be gone", gone(ids[0]))
	if st := s.list()[ids[1]]; st != fleeting.StateRunning {
		t.Errorf("the instance not decreased, %s, is %q, want running", ids[1], st)
	}
}

func testDecreaseIdempotent(t *testing.T, s *subject) {
	s.init()
	ids := s.increase(1)
	c := ctx(t)
	if got, err := s.g.Decrease(c, ids); err != nil || len(got) != 1 {
		t.Fatalf("Decrease(%v) = %v, %v", ids, got, err)
	}
	got, err := s.g.Decrease(c, append(ids, "no-such-instance-4711"))
	if err != nil {
		t.Fatalf("second Decrease(%v + unknown): %v", ids, err)
	}
	if len(got) != 0 {
		t.Errorf("second Decrease accepted %v again, want nothing", got)
	}
	s.waitFor("instance "+ids[0]+" to be gone", gone(ids[0]))
	if got, err := s.g.Decrease(c, ids); err != nil || len(got) != 0 {
		t.Errorf("Decrease of a deleted instance = %v, %v; want nothing, nil", got, err)
	}
}

func testQuota(t *testing.T, s *subject) {
	info := s.init()
	if info.MaxSize == 0 || info.MaxSize > 8 {
		t.Skipf("MaxSize %d: no small quota to exhaust", info.MaxSize)
	}
	c := ctx(t)
	got, err := s.g.Increase(c, info.MaxSize+1)
	if err != nil {
		t.Fatalf("Increase(%d) with MaxSize %d: %v (want the ones that fit)", info.MaxSize+1, info.MaxSize, err)
	}
	if got != info.MaxSize {
		t.Fatalf("Increase(%d) with MaxSize %d on an empty group = %d, want %d", info.MaxSize+1, info.MaxSize, got, info.MaxSize)
	}
	n, err := s.g.Increase(c, 1)
	if n != 0 || !errors.Is(err, fleeting.ErrQuotaExceeded) {
		t.Fatalf("Increase(1) on a full group = %d, %v; want 0 and an error wrapping ErrQuotaExceeded", n, err)
	}
	if l := s.live(); len(l) > info.MaxSize {
		t.Fatalf("the group lists %d instances, more than MaxSize %d", len(l), info.MaxSize)
	}
}

func testCancelled(t *testing.T, s *subject) {
	s.init()
	ids := s.increase(1)
	c, cancel := context.WithCancel(context.Background())
	cancel()
	check := func(name string, err error) {
		t.Helper()
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a cancelled context: error %v, want one wrapping context.Canceled", name, err)
		}
	}
	check("Update", s.g.Update(c, func(string, fleeting.State) {}))
	_, err := s.g.Increase(c, 1)
	check("Increase", err)
	_, err = s.g.Decrease(c, ids)
	check("Decrease", err)
	_, err = s.g.ConnectInfo(c, ids[0])
	check("ConnectInfo", err)
	check("Heartbeat", s.g.Heartbeat(c, ids[0]))
	// Nothing changed.
	if l := s.live(); len(l) != 1 || l[ids[0]] != fleeting.StateRunning {
		t.Errorf("after calls with a cancelled context the group lists %v, want only %s running", l, ids[0])
	}
}

func testConcurrent(t *testing.T, s *subject) {
	s.init()
	c := ctx(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	for range 2 {
		wg.Go(func() {
			n, err := s.g.Increase(c, 1)
			if err != nil {
				t.Errorf("concurrent Increase(1): %v", err)
				return
			}
			mu.Lock()
			total += n
			mu.Unlock()
		})
		wg.Go(func() {
			if err := s.g.Update(c, func(string, fleeting.State) {}); err != nil {
				t.Errorf("concurrent Update: %v", err)
			}
		})
	}
	wg.Wait()
	l := s.waitFor(fmt.Sprintf("%d running instances", total), func(l map[string]fleeting.State) bool {
		running := 0
		for _, st := range l {
			if st == fleeting.StateRunning {
				running++
			}
		}
		return running == total
	})
	var ids []string
	for id := range l {
		ids = append(ids, id)
	}
	for _, id := range ids {
		wg.Go(func() {
			if _, err := s.g.ConnectInfo(c, id); err != nil {
				t.Errorf("concurrent ConnectInfo(%s): %v", id, err)
			}
		})
	}
	wg.Wait()
	for _, id := range ids {
		wg.Go(func() {
			if _, err := s.g.Decrease(c, []string{id}); err != nil {
				t.Errorf("concurrent Decrease(%s): %v", id, err)
			}
		})
		wg.Go(func() {
			if err := s.g.Update(c, func(string, fleeting.State) {}); err != nil {
				t.Errorf("concurrent Update: %v", err)
			}
		})
	}
	wg.Wait()
	for _, id := range ids {
		s.waitFor("instance "+id+" to be gone", gone(id))
	}
}
