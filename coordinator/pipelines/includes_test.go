package pipelines

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/ci"
	"github.com/berthci/berth/coordinator/internal/includetest"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/internal/fakeclock"
)

func TestIncludeAccessRule(t *testing.T) {
	p := func(id int64, path, vis string) *store.Project {
		return &store.Project{ID: id, Path: path, Visibility: vis}
	}
	app := p(1, "group/app", "private")
	for _, tc := range []struct {
		to   *store.Project
		want bool
	}{
		{app, true},
		{p(2, "group/sub/shared", "private"), true},
		{p(3, "Group/other", "private"), true},
		{p(4, "other/x", "private"), false},
		{p(5, "other/x", "public"), true},
		{p(6, "group", "private"), false}, // a top-level project is in no group
	} {
		if got := mayInclude(app, tc.to); got != tc.want {
			t.Errorf("%s → %s: %v, want %v", app.Path, tc.to.Path, got, tc.want)
		}
	}
	if mayInclude(p(7, "solo", "private"), p(8, "solo2", "private")) {
		t.Error("top-level projects share no group")
	}
}

func TestRemoteFetchPolicy(t *testing.T) {
	rs := includetest.NewServer(t)
	clock := fakeclock.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	newF := func(cfg IncludeConfig) *remoteFetcher {
		t.Helper()
		cfg.RemoteCAFile = rs.CAFile
		f, err := newRemoteFetcher(cfg.WithDefaults(), clock)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	ctx := context.Background()
	u := rs.URL + "/ci/remote.yml"
	host := rs.Listener.Addr().String()
	hostname := strings.Split(host, ":")[0]
	refused := func(f *remoteFetcher, url, want string) {
		t.Helper()
		_, err := f.fetch(ctx, url, ci.RemoteOptions{})
		var ie *ci.IncludeError
		if !errors.As(err, &ie) || !strings.Contains(ie.Msg, want) {
			t.Errorf("fetch %s: %v, want an include error with %q", url, err, want)
		}
	}

	// loopback is refused unless allowed (the check is on the address
	// dialled, so names resolving to it are refused too)
	refused(newF(IncludeConfig{}), u, "non-public address 127.0.0.1")
	refused(newF(IncludeConfig{}), strings.Replace(u, "127.0.0.1", "localhost", 1), "non-public address")
	refused(newF(IncludeConfig{RemoteAllowPrivate: true, RemoteDenyHosts: []string{hostname}}), u, "is denied by this server")
	refused(newF(IncludeConfig{RemoteAllowPrivate: true, RemoteAllowHosts: []string{"*.example.com"}}), u, "not in this server's allowed hosts")
	refused(newF(IncludeConfig{RemoteAllowPrivate: true, RemoteTimeout: 200 * time.Millisecond}), rs.URL+"/slow.yml", "timeout error")

	f := newF(IncludeConfig{RemoteAllowPrivate: true, RemoteAllowHosts: []string{hostname}})
	if b, err := f.fetch(ctx, u, ci.RemoteOptions{}); err != nil || !strings.Contains(string(b), "remote-job") {
		t.Fatalf("fetch: %q %v", b, err)
	}
	// without cache: every include fetches
	f.fetch(ctx, u, ci.RemoteOptions{})
	if rs.Hits.Load() != 2 {
		t.Fatalf("hits %d, want 2 (no caching unless asked)", rs.Hits.Load())
	}

	// the cache: by URL, within the TTL, verified by digest and integrity
	rs.Hits.Store(0)
	hour := ci.RemoteOptions{CacheTTL: time.Hour}
	f.fetch(ctx, u, hour)
	rs.Body.Store("changed:\n  script: [x]\n")
	b, _ := f.fetch(ctx, u, hour)
	if rs.Hits.Load() != 1 || !strings.Contains(string(b), "remote-job") {
		t.Fatalf("hits %d body %q: want the cached body", rs.Hits.Load(), b)
	}
	sum := sha256.Sum256([]byte("changed:\n  script: [x]\n"))
	b, _ = f.fetch(ctx, u, ci.RemoteOptions{CacheTTL: time.Hour, Integrity: "sha256-" + base64.StdEncoding.EncodeToString(sum[:])})
	if rs.Hits.Load() != 2 || !strings.Contains(string(b), "changed") {
		t.Fatalf("hits %d body %q: a cached body failing the integrity is fetched again", rs.Hits.Load(), b)
	}
	clock.Advance(2 * time.Hour)
	f.fetch(ctx, u, hour)
	if rs.Hits.Load() != 3 {
		t.Fatalf("hits %d: an expired entry is fetched again", rs.Hits.Load())
	}
	// a corrupted entry is not served
	f.mu.Lock()
	f.byURL[u].Value.(*cached).data[0] ^= 1
	f.mu.Unlock()
	if b, _ := f.fetch(ctx, u, hour); rs.Hits.Load() != 4 || !strings.HasPrefix(string(b), "changed") {
		t.Fatalf("hits %d body %q: a corrupted entry is fetched again", rs.Hits.Load(), b)
	}

	// the size bound evicts the least recently used entries
	small := newF(IncludeConfig{RemoteAllowPrivate: true, RemoteCacheBytes: 40})
	small.store("a", []byte(strings.Repeat("a", 20)))
	small.store("b", []byte(strings.Repeat("b", 20)))
	small.cachedBody("a", time.Hour, "")
	small.store("c", []byte(strings.Repeat("c", 20)))
	if _, ok := small.byURL["b"]; ok || small.bytes > 40 {
		t.Fatalf("cache holds %d bytes, b kept: %v", small.bytes, ok)
	}
	if _, ok := small.byURL["a"]; !ok {
		t.Fatal("the recently used entry was evicted")
	}
}
