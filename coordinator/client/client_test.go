package client

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/berthci/berth/runnerapi"
)

// TestCellHeader: a client given a cell names it on every request, for a
// berth router; without one it sends no such header.
func TestCellHeader(t *testing.T) {
	var got []string
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get(HeaderCell)+"|"+r.Header.Get(runnerapi.HeaderPrivateToken))
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`[]`))
	}))
	defer hs.Close()
	c := New(hs.URL, "glpat-x")
	if _, err := c.ListRunners(context.Background()); err != nil {
		t.Fatal(err)
	}
	c.Cell = 7
	if _, err := c.ListRunners(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != "|glpat-x" || got[1] != "7|glpat-x" {
		t.Fatalf("requests carried %q", got)
	}
}

// TestSnapshotCutShort: a snapshot whose body ends before its
// Content-Length (the coordinator found a chunk altered) is an error
// that says how much came, not a short bundle taken for whole.
func TestSnapshotCutShort(t *testing.T) {
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v4/jobs/5/snapshot" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Length", "10")
		w.Write([]byte("abcd"))
	}))
	defer hs.Close()
	var got bytes.Buffer
	n, err := New(hs.URL, "glpat-x").Snapshot(context.Background(), 5, &got)
	if err == nil || n != 4 || got.String() != "abcd" || !strings.Contains(err.Error(), "after 4 bytes") {
		t.Fatalf("Snapshot: %d bytes %q, %v; want an error after the 4 that came", n, got.String(), err)
	}
}

// TestSnapshotsQuery: the list asks for one project's snapshots when
// given one, and decodes a snapshot that never expires.
func TestSnapshotsQuery(t *testing.T) {
	var queries []string
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		queries = append(queries, r.URL.RequestURI())
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`[{"job_id":3,"job_name":"t","project_id":2,"project_path":"g/p","pipeline_id":9,"size":5,"created_at":"2026-11-22T10:00:00Z"}]`))
	}))
	defer hs.Close()
	c := New(hs.URL, "glpat-x")
	for _, project := range []int64{0, 2} {
		list, err := c.Snapshots(context.Background(), project)
		if err != nil || len(list) != 1 || list[0].JobID != 3 || list[0].ProjectPath != "g/p" || !list[0].ExpireAt.IsZero() ||
			list[0].CreatedAt.IsZero() {
			t.Fatalf("Snapshots(%d) = %+v, %v", project, list, err)
		}
	}
	if len(queries) != 2 || queries[0] != "/api/v4/snapshots" || queries[1] != "/api/v4/snapshots?project_id=2" {
		t.Errorf("requests %q", queries)
	}
}
