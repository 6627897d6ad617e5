package webui_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/webui"
)

// bigPipeline is a .gitlab-ci.yml of n jobs in 5 stages, a fifth of them
// with needs on the stage before: what a large monorepo pipeline looks
// like.
func bigPipeline(n int) string {
	var b strings.Builder
	b.WriteString("stages: [s0, s1, s2, s3, s4]\n")
	per := n / 5
	for i := range n {
		st := i / per
		fmt.Fprintf(&b, "job-%03d:\n  stage: s%d\n  script: [\"true\"]\n", i, min(st, 4))
		if st > 0 && i%5 == 0 {
			fmt.Fprintf(&b, "  needs: [job-%03d, job-%03d]\n", i-per, i-per+1)
		}
	}
	return b.String()
}

// BenchmarkPipelinePage500Jobs measures the server time of a pipeline page
// of 500 jobs, in each of its views, from the request to the last byte
// (the store is SQLite, as berth server's default). The bar is 300 ms.
func BenchmarkPipelinePage500Jobs(b *testing.B) {
	e := newEnv(b, webui.Config{})
	_, pl := e.project("big/mono", map[string]string{".gitlab-ci.yml": bigPipeline(500)})
	br := e.browser()
	br.signIn(e.admin)
	cookies := br.c.Jar.Cookies(mustURL(e.http.URL))
	h := e.srv.Handler()
	for _, view := range []string{"stages", "needs", "jobs"} {
		b.Run(view, func(b *testing.B) {
			path := fmt.Sprintf("/big/mono/-/pipelines/%d?view=%s", pl.ID, view)
			var size int
			for b.Loop() {
				req := httptest.NewRequest("GET", path, nil)
				for _, c := range cookies {
					req.AddCookie(c)
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					b.Fatalf("%d: %.500s", rec.Code, rec.Body.String())
				}
				size = rec.Body.Len()
			}
			b.ReportMetric(float64(size), "bytes/page")
		})
	}
}

// TestPipelinePage500Jobs checks the 500-job page renders them all.
func TestPipelinePage500Jobs(t *testing.T) {
	if testing.Short() {
		t.Skip("creates a pipeline of 500 jobs")
	}
	e := newEnv(t, webui.Config{})
	_, pl := e.project("big/mono", map[string]string{".gitlab-ci.yml": bigPipeline(500)})
	br := e.browser()
	br.signIn(e.admin)
	for _, view := range []string{"stages", "needs", "jobs"} {
		pg := br.get(fmt.Sprintf("/big/mono/-/pipelines/%d?view=%s", pl.ID, view))
		if pg.code != http.StatusOK || !strings.Contains(pg.body, "job-499") || !strings.Contains(pg.body, "job-000") {
			t.Errorf("view %s: %d", view, pg.code)
		}
	}
}
