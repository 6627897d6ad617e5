package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/router"
	"github.com/berthci/berth/token"
)

func TestRouterConfigFromFlagsAndEnv(t *testing.T) {
	env := func(kv map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := kv[k]; return v, ok }
	}
	given := func(names ...string) func(string) bool {
		return func(n string) bool {
			for _, x := range names {
				if x == n {
					return true
				}
			}
			return false
		}
	}
	for _, tc := range []struct {
		name    string
		flags   routerFlags
		changed []string
		env     map[string]string
		want    router.Config
		err     string
	}{
		{name: "flags", flags: routerFlags{listen: "127.0.0.1:9000", cells: []string{"1=http://127.0.0.1:8081", "2=http://127.0.0.1:8082"}, defaultCell: 1},
			changed: []string{"cell", "default-cell"},
			want:    router.Config{Cells: []router.Cell{{ID: 1, URL: "http://127.0.0.1:8081"}, {ID: 2, URL: "http://127.0.0.1:8082"}}, DefaultCell: 1, ExternalURL: "http://127.0.0.1:9000"}},
		{name: "environment", flags: routerFlags{listen: ":8080"},
			env:  map[string]string{"BERTH_ROUTER_CELLS": "1=http://c1:8080, 2=http://c2:8080", "BERTH_ROUTER_DEFAULT_CELL": "2", "BERTH_ROUTER_EXTERNAL_URL": "https://gitlab.example.com"},
			want: router.Config{Cells: []router.Cell{{ID: 1, URL: "http://c1:8080"}, {ID: 2, URL: "http://c2:8080"}}, DefaultCell: 2, ExternalURL: "https://gitlab.example.com"}},
		{name: "flags win over the environment", flags: routerFlags{listen: ":8080", cells: []string{"3=http://c3"}, defaultCell: 3, externalURL: "https://r"},
			changed: []string{"cell", "default-cell", "external-url"},
			env:     map[string]string{"BERTH_ROUTER_CELLS": "1=http://c1", "BERTH_ROUTER_DEFAULT_CELL": "1", "BERTH_ROUTER_EXTERNAL_URL": "https://other"},
			want:    router.Config{Cells: []router.Cell{{ID: 3, URL: "http://c3"}}, DefaultCell: 3, ExternalURL: "https://r"}},
		{name: "any address: localhost", flags: routerFlags{listen: ":8080", cells: []string{"1=http://c1"}},
			want: router.Config{Cells: []router.Cell{{ID: 1, URL: "http://c1"}}, ExternalURL: "http://localhost:8080"}},
		{name: "no cells", flags: routerFlags{listen: ":8080"}, err: "no cells: give at least one (--cell ID=URL)"},
		{name: "bad --cell", flags: routerFlags{listen: ":8080", cells: []string{"http://c1"}}, err: `--cell: cell "http://c1": want ID=URL`},
		{name: "bad BERTH_ROUTER_CELLS", flags: routerFlags{listen: ":8080"}, env: map[string]string{"BERTH_ROUTER_CELLS": "1=c1"}, err: `BERTH_ROUTER_CELLS: cell 1: URL "c1": want http:// or https://`},
		{name: "bad BERTH_ROUTER_DEFAULT_CELL", flags: routerFlags{listen: ":8080", cells: []string{"1=http://c1"}}, env: map[string]string{"BERTH_ROUTER_DEFAULT_CELL": "one"}, err: `BERTH_ROUTER_DEFAULT_CELL "one": want a cell id`},
		{name: "duplicate and unlisted default", flags: routerFlags{listen: ":8080", cells: []string{"1=http://a", "1=http://b"}, defaultCell: 2}, changed: []string{"default-cell"},
			err: "cell 1 listed twice\ndefault cell 2 is not one of the cells (1, 1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.flags.config(given(tc.changed...), env(tc.env))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("config: %v, want an error saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.DefaultCell != tc.want.DefaultCell || got.ExternalURL != tc.want.ExternalURL || len(got.Cells) != len(tc.want.Cells) {
				t.Fatalf("config %+v\nwant   %+v", got, tc.want)
			}
			for i := range got.Cells {
				if got.Cells[i] != tc.want.Cells[i] {
					t.Fatalf("cells %v, want %v", got.Cells, tc.want.Cells)
				}
			}
		})
	}
}

// TestRouterCommandRefusesBadConfig: berth router says what is wrong
// before listening.
func TestRouterCommandRefusesBadConfig(t *testing.T) {
	t.Setenv("BERTH_ROUTER_CELLS", "")
	_, err := runCLI(t, "router", "--listen", "127.0.0.1:0", "--cell", "1=http://127.0.0.1:1", "--cell", "1=http://127.0.0.1:2", "--default-cell", "2")
	if err == nil || !strings.Contains(err.Error(), "cell 1 listed twice") || !strings.Contains(err.Error(), "default cell 2 is not one of the cells") {
		t.Fatalf("berth router: %v", err)
	}
}

// TestRouterCommandServesAndDrains: serveRouter routes to its cell,
// answers its own health, and on shutdown lets a request in flight
// finish.
func TestRouterCommandServesAndDrains(t *testing.T) {
	held, release := make(chan struct{}), make(chan struct{})
	cell := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/v4/jobs/request" {
			io.ReadAll(r.Body)
			close(held)
			<-release
		}
		io.WriteString(w, "cell 4 "+r.URL.Path)
	}))
	defer cell.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- serveRouter(ctx, slog.New(slog.DiscardHandler), ln,
			router.Config{Cells: []router.Cell{{ID: 4, URL: cell.URL}}, DefaultCell: 4, HealthInterval: time.Second}, 10*time.Second)
	}()
	base := "http://" + ln.Addr().String()
	get := func(path string) (int, string) {
		res, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if code, body := get("/-/health"); code != 200 || body != "GitLab OK" {
		t.Fatalf("health: %d %q", code, body)
	}
	if code, body := get("/api/v4/projects"); code != 200 || body != "cell 4 /api/v4/projects" {
		t.Fatalf("proxied: %d %q", code, body)
	}
	tok, _ := token.NewRoutable("glrt-t1_", token.Routing{Cell: 4, Organization: 1})
	polled := make(chan string, 1)
	go func() {
		res, err := http.Post(base+"/api/v4/jobs/request", "application/json", strings.NewReader(`{"token":"`+tok+`"}`))
		if err != nil {
			polled <- err.Error()
			return
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		polled <- string(b)
	}()
	<-held
	stop()
	// Shutting down: the router takes no new connections, the held
	// poll goes on.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("still accepting connections 10 s after the stop")
		}
	}
	close(release)
	if got := <-polled; got != "cell 4 /api/v4/jobs/request" {
		t.Fatalf("the poll in flight at shutdown got %q", got)
	}
	if err := <-done; err != nil {
		t.Fatalf("serveRouter: %v", err)
	}
}
