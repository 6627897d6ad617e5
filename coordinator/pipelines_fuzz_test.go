package coordinator

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/pipelines"
)

// FuzzPipelineAPI sends arbitrary paths and bodies to the project,
// pipeline, job and variable endpoints: never a panic nor a 5xx.
func FuzzPipelineAPI(f *testing.F) {
	needGitF(f)
	fe := newEnv(f, Config{ExternalURL: ownURL})
	if _, err := fe.srv.pipelines.CreateProject(f.Context(), pipelines.ProjectSpec{Path: "g/p"}); err != nil {
		f.Fatal(err)
	}
	h := fe.srv.Handler()
	f.Add(0, "g%2Fp", []byte(`{"path":"x","namespace_path":"a/b"}`))
	f.Add(1, "1", []byte(`{"ref":"main","variables":[{"key":"A","value":"1"}]}`))
	f.Add(2, "g%2Fp", []byte(`{"key":"K","value":"12345678","masked":true}`))
	f.Add(3, "1", []byte(`key=A&value=b`))
	f.Add(4, "..%2F..", []byte(`{}`))
	f.Add(5, "1", []byte(nil))
	f.Add(11, "g%2Fp", []byte(`{"min_isolation":"vm","description":"d"}`))
	f.Add(0, "1", []byte(`{"path":"iso","min_isolation":"instance"}`))
	f.Add(1, "g%2Fp", []byte(`ref=main&variables%5B%5D%5Bkey%5D=A&variables%5B%5D%5Bvalue%5D=1`))
	f.Fuzz(func(t *testing.T, endpoint int, project string, body []byte) {
		if endpoint < 0 {
			endpoint = -endpoint
		}
		eps := []struct{ method, path string }{
			{"POST", "/api/v4/projects"}, {"POST", "/api/v4/projects/P/pipeline?ref=main"},
			{"POST", "/api/v4/projects/P/variables"}, {"PUT", "/api/v4/projects/P/variables/A"},
			{"GET", "/api/v4/projects/P"}, {"GET", "/api/v4/projects/P/pipelines?status=x&page=0"},
			{"POST", "/api/v4/projects/P/pipelines/1/retry"}, {"POST", "/api/v4/projects/P/pipelines/1/cancel"},
			{"POST", "/api/v4/projects/P/jobs/1/play"}, {"POST", "/api/v4/projects/P/jobs/1/retry"},
			{"GET", "/api/v4/projects/P/pipelines/1/jobs?scope[]=bogus"},
			{"PUT", "/api/v4/projects/P"},
		}
		ep := eps[endpoint%len(eps)]
		target := strings.Replace(ep.path, "P", url.PathEscape(project), 1)
		if _, err := url.ParseRequestURI(target); err != nil || strings.ContainsAny(project, "?#") {
			return
		}
		req := httptest.NewRequest(ep.method, target, bytes.NewReader(body))
		if bytes.HasPrefix(body, []byte("{")) {
			req.Header.Set("Content-Type", "application/json")
		} else {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		req.Header.Set("PRIVATE-TOKEN", fe.admin)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 && rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("%s %s with %q: %d %s", ep.method, target, body, rec.Code, rec.Body.String())
		}
	})
}
