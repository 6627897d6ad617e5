package runners_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/cluster"
	"github.com/berthci/berth/coordinator/queue"
	"github.com/berthci/berth/coordinator/runners"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/store/sqlite"
	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/internal/fakeclock"
	"github.com/berthci/berth/runnerapi"
	"github.com/berthci/berth/token"
)

// counting is a store that counts its runner reads and manager writes.
type counting struct {
	store.Store
	mu             sync.Mutex
	reads, upserts int
}

func (c *counting) RunnerByTokenDigest(ctx context.Context, digest string) (*store.Runner, error) {
	c.mu.Lock()
	c.reads++
	c.mu.Unlock()
	return c.Store.RunnerByTokenDigest(ctx, digest)
}

func (c *counting) UpsertRunnerManager(ctx context.Context, m *store.RunnerManager) error {
	c.mu.Lock()
	c.upserts++
	c.mu.Unlock()
	return c.Store.UpsertRunnerManager(ctx, m)
}

type recorder struct {
	cluster.Local
	mu     sync.Mutex
	events []cluster.Event
}

func (r *recorder) Publish(e cluster.Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

type fixture struct {
	st    *counting
	reg   *runners.Registry
	clock *fakeclock.Clock
	cl    *recorder
}

func newFixture(t *testing.T, expiresIn time.Duration) *fixture {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	f := &fixture{st: &counting{Store: st}, clock: fakeclock.New(time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)), cl: &recorder{}}
	q := queue.New()
	t.Cleanup(q.Close)
	f.reg = runners.New(runners.Options{Store: f.st, Queue: q, Cluster: f.cl, Clock: f.clock, TokenExpiresIn: expiresIn})
	return f
}

// create stores a runner and returns its token.
func (f *fixture) create(t *testing.T, rn *store.Runner) string {
	t.Helper()
	tok, err := f.reg.MintToken(rn)
	if err != nil {
		t.Fatal(err)
	}
	rn.TokenDigest = token.Digest(tok)
	rn.CreatedAt = f.clock.Now()
	rn.TokenExpiresAt = f.reg.TokenExpiry(f.clock.Now())
	if err := f.st.CreateRunner(context.Background(), rn); err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestAuthenticate(t *testing.T) {
	f := newFixture(t, time.Hour)
	ctx := context.Background()
	tok := f.create(t, &store.Runner{Type: store.InstanceType, RunUntagged: true})
	for _, bad := range []string{"", "glrt-unknown", tok + "x"} {
		if _, err := f.reg.Authenticate(ctx, bad); !errors.Is(err, runners.ErrForbidden) {
			t.Errorf("token %q: %v, want ErrForbidden", bad, err)
		}
	}
	f.st.reads = 0
	rn, err := f.reg.Authenticate(ctx, tok)
	if err != nil || rn.Type != store.InstanceType {
		t.Fatalf("good token: %+v %v", rn, err)
	}
	// The hot path reads the store once, then its cache.
	for range 5 {
		if _, err := f.reg.Authenticate(ctx, tok); err != nil {
			t.Fatal(err)
		}
	}
	if f.st.reads != 1 || !f.reg.Cached(tok) {
		t.Fatalf("%d store reads for 6 authentications (cached %v)", f.st.reads, f.reg.Cached(tok))
	}
	// Changed: read again here, and the other replicas told.
	f.reg.Changed(rn)
	if f.reg.Cached(tok) || !slices.Contains(f.cl.events, cluster.Event{Kind: cluster.RunnerChanged, ID: rn.ID}) {
		t.Fatalf("after Changed: cached %v, published %v", f.reg.Cached(tok), f.cl.events)
	}
	f.clock.Advance(time.Hour)
	if _, err := f.reg.Authenticate(ctx, tok); !errors.Is(err, runners.ErrForbidden) {
		t.Fatalf("expired token: %v", err)
	}
}

// TestForget: another replica's change drops this replica's copy.
func TestForget(t *testing.T) {
	f := newFixture(t, 0)
	tok := f.create(t, &store.Runner{Type: store.InstanceType, RunUntagged: true})
	rn, err := f.reg.Authenticate(context.Background(), tok)
	if err != nil {
		t.Fatal(err)
	}
	f.reg.Forget(rn.ID + 1)
	if !f.reg.Cached(tok) {
		t.Fatal("forgetting another runner dropped this one")
	}
	f.reg.Forget(rn.ID)
	if f.reg.Cached(tok) {
		t.Fatal("still cached after Forget")
	}
	if len(f.cl.events) != 0 {
		t.Fatalf("Forget published %v: it applies another replica's change", f.cl.events)
	}
}

// TestTouchManager: contacted_at is written at most once a minute unless
// the info changes.
func TestTouchManager(t *testing.T) {
	f := newFixture(t, 0)
	ctx := context.Background()
	tok := f.create(t, &store.Runner{Type: store.InstanceType, RunUntagged: true})
	rn, _ := f.reg.Authenticate(ctx, tok)
	info := &runnerapi.Info{Name: "m", Version: "1"}
	id, err := f.reg.TouchManager(ctx, rn, "s_a", info)
	if err != nil || id == 0 {
		t.Fatal(id, err)
	}
	for range 3 {
		if again, err := f.reg.TouchManager(ctx, rn, "s_a", info); err != nil || again != id {
			t.Fatal(again, err)
		}
	}
	if f.st.upserts != 1 {
		t.Fatalf("%d writes for 4 polls within a minute", f.st.upserts)
	}
	if _, err := f.reg.TouchManager(ctx, rn, "s_a", &runnerapi.Info{Name: "m", Version: "2"}); err != nil || f.st.upserts != 2 {
		t.Fatalf("changed info: %d writes, %v", f.st.upserts, err)
	}
	f.clock.Advance(time.Minute)
	if _, err := f.reg.TouchManager(ctx, rn, "s_a", nil); err != nil || f.st.upserts != 3 {
		t.Fatalf("a minute later: %d writes, %v", f.st.upserts, err)
	}
	ms, err := f.st.ListRunnerManagers(ctx, rn.ID)
	if err != nil || len(ms) != 1 || !strings.Contains(string(ms[0].Info), `"version":"2"`) {
		t.Fatalf("managers %+v %v: a poll without info keeps the last one", ms, err)
	}
	if id2, _ := f.reg.TouchManager(ctx, rn, "", nil); id2 == id {
		t.Fatal("a request without system_id shares a manager with s_a")
	}
}

// TestOffers: what each manager offers, a paused runner's offer dropped,
// the strongest per runner, and forgetting a manager.
func TestOffers(t *testing.T) {
	f := newFixture(t, 0)
	ctx := context.Background()
	tok := f.create(t, &store.Runner{Type: store.InstanceType, RunUntagged: true})
	rn, _ := f.reg.Authenticate(ctx, tok)
	view := f.reg.NoteOffer(rn, "s_a", &runnerapi.Info{IsolationLevels: []string{"vm", "none", "bogus", "vm"}})
	if view.Isolation != executor.IsolationVM.Rank() {
		t.Fatalf("view at rank %d, want vm's", view.Isolation)
	}
	f.reg.NoteOffer(rn, "s_b", nil)
	offers := f.reg.Offers(f.clock.Now().Add(-time.Minute))
	if len(offers) != 2 {
		t.Fatalf("%d offers", len(offers))
	}
	for _, o := range offers {
		if !slices.Equal(o.Levels, []executor.Isolation{executor.IsolationNone, executor.IsolationVM}) &&
			!slices.Equal(o.Levels, []executor.Isolation{executor.IsolationNone}) {
			t.Errorf("levels %v", o.Levels)
		}
	}
	if l, ok := f.reg.StrongestOffer(rn.ID, f.clock.Now().Add(-time.Minute)); !ok || l != executor.IsolationVM {
		t.Fatalf("strongest %s %v", l, ok)
	}
	f.clock.Advance(2 * time.Minute)
	if _, ok := f.reg.StrongestOffer(rn.ID, f.clock.Now().Add(-time.Minute)); ok {
		t.Fatal("an offer older than the window counts")
	}
	f.reg.ForgetManager(rn.ID, "s_a")
	if got := f.reg.Offers(time.Time{}); len(got) != 1 {
		t.Fatalf("after forgetting s_a: %d offers", len(got))
	}
	paused := *rn
	paused.Paused = true
	f.reg.NoteOffer(&paused, "s_b", nil)
	if got := f.reg.Offers(time.Time{}); len(got) != 0 {
		t.Fatalf("a paused runner still offers: %+v", got)
	}
}

// TestLoadOffers: after a restart the offers of managers that asked within
// the online window come from their stored info.
func TestLoadOffers(t *testing.T) {
	f := newFixture(t, 0)
	ctx := context.Background()
	tok := f.create(t, &store.Runner{Type: store.InstanceType, RunUntagged: true})
	rn, _ := f.reg.Authenticate(ctx, tok)
	if _, err := f.reg.TouchManager(ctx, rn, "s_recent", &runnerapi.Info{IsolationLevels: []string{"container"}}); err != nil {
		t.Fatal(err)
	}
	old := &store.RunnerManager{RunnerID: rn.ID, SystemID: "s_old", Info: []byte(`{"isolation_levels":["vm"]}`),
		ContactedAt: f.clock.Now().Add(-runners.OnlineWindow - time.Minute)}
	if err := f.st.UpsertRunnerManager(ctx, old); err != nil {
		t.Fatal(err)
	}
	restarted := runners.New(runners.Options{Store: f.st, Queue: queue.New(), Cluster: f.cl, Clock: f.clock})
	if err := restarted.LoadOffers(ctx); err != nil {
		t.Fatal(err)
	}
	if l, ok := restarted.StrongestOffer(rn.ID, f.clock.Now().Add(-runners.OnlineWindow)); !ok || l != executor.IsolationContainer {
		t.Fatalf("loaded strongest offer %s %v, want container (vm's manager went offline)", l, ok)
	}
}

func TestMintTokenAndAccessLevel(t *testing.T) {
	plain, cell := newFixture(t, 0), newFixture(t, 0)
	cell.reg = runners.New(runners.Options{Store: cell.st, Queue: queue.New(), Cluster: cell.cl, Clock: cell.clock, Cell: 5})
	for _, tt := range []struct {
		rn      store.Runner
		prefix  string
		routing token.Routing
	}{
		{store.Runner{Type: store.InstanceType}, "glrt-t1_", token.Routing{Cell: 5, Organization: 1}},
		{store.Runner{Type: store.GroupType, GroupID: 7}, "glrt-t2_", token.Routing{Cell: 5, Organization: 1, Group: 7}},
		{store.Runner{Type: store.ProjectType, ProjectIDs: []int64{9, 10}}, "glrt-t3_", token.Routing{Cell: 5, Organization: 1, Project: 9}},
		{store.Runner{Type: store.InstanceType, Legacy: true}, "glrtr-", token.Routing{Cell: 5, Organization: 1}},
	} {
		tok, err := plain.reg.MintToken(&tt.rn)
		if err != nil || !strings.HasPrefix(tok, tt.prefix) {
			t.Errorf("%s runner: token %q %v, want prefix %s", tt.rn.Type, tok, err, tt.prefix)
		}
		if _, err := token.ParseRoutable(tok); err == nil {
			t.Errorf("outside a cell the token %q is routable", tok)
		}
		tok, err = cell.reg.MintToken(&tt.rn)
		if err != nil || !strings.HasPrefix(tok, tt.prefix) {
			t.Errorf("%s runner in a cell: token %q %v, want prefix %s", tt.rn.Type, tok, err, tt.prefix)
		}
		if r, err := token.ParseRoutable(tok); err != nil || r != tt.routing {
			t.Errorf("%s runner in a cell routes to %+v (%v), want %+v", tt.rn.Type, r, err, tt.routing)
		}
	}
	if tok, err := cell.reg.MintRegistrationToken(); err != nil || !strings.HasPrefix(tok, "GR1348941") {
		t.Errorf("registration token %q %v", tok, err)
	} else if r, err := token.ParseRoutable(tok); err != nil || r.Cell != 5 {
		t.Errorf("registration token routes to %+v (%v)", r, err)
	}
	if tok, err := cell.reg.MintTriggerToken(); err != nil || !strings.HasPrefix(tok, "glptt-") {
		t.Errorf("trigger token %q %v", tok, err)
	} else if r, err := token.ParseRoutable(tok); err != nil || r.Cell != 5 {
		t.Errorf("trigger token routes to %+v (%v)", r, err)
	}
	for in, want := range map[string]store.AccessLevel{"": store.NotProtected, "not_protected": store.NotProtected, "ref_protected": store.RefProtected} {
		if got, ok := runners.ParseAccessLevel(in); !ok || got != want {
			t.Errorf("%q: %s %v", in, got, ok)
		}
	}
	if _, ok := runners.ParseAccessLevel("admin"); ok {
		t.Error("a bad access level was accepted")
	}
}
