package client

import (
	"context"
	"net/http"
	"net/http/httptest"
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
