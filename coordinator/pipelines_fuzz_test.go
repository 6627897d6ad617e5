package coordinator

import (
	"bufio"
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

func FuzzParseProjectPath(f *testing.F) {
	for _, s := range []string{"demo", "group/sub/demo", "/a/", "a//b", "-a", "a.", "x.git", "a b", "ü", strings.Repeat("a/", 30)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseProjectPath(s)
		if err != nil {
			return
		}
		if again, err := ParseProjectPath(p); err != nil || again != p {
			t.Fatalf("%q → %q is not stable: %q, %v", s, p, again, err)
		}
		for _, seg := range strings.Split(p, "/") {
			if seg == "" || seg == "." || seg == ".." || strings.HasPrefix(seg, ".") {
				t.Fatalf("%q → %q has segment %q", s, p, seg)
			}
		}
	})
}

func FuzzParseRepoURL(f *testing.F) {
	for _, s := range []string{"/demo.git/info/refs", "/g/s/demo.git/git-upload-pack", "/a.git/git-receive-pack",
		"/a.git/objects/x", "//a.git/info/refs", "/.git/info/refs", "/a.git.git/info/refs", "a.git/info/refs"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		project, service, ok := ParseRepoURL(s)
		if !ok {
			return
		}
		if "/"+project+".git"+service != s {
			t.Fatalf("%q split into %q and %q", s, project, service)
		}
		if !gitServices[service] {
			t.Fatalf("%q: service %q", s, service)
		}
		if p, err := ParseProjectPath(project); err != nil || p != project {
			t.Fatalf("%q: project %q is not a valid path (%v)", s, project, err)
		}
	})
}

func pkt(s string) string { return strings.ToLower(hex4(len(s)+4)) + s }

func hex4(n int) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[n>>12&15], digits[n>>8&15], digits[n>>4&15], digits[n&15]})
}

func TestReadReceivePackHeader(t *testing.T) {
	z, a := strings.Repeat("0", 40), strings.Repeat("a", 40)
	tests := []struct {
		name    string
		in      string
		updates int
		options []string
		skip    bool
		err     bool
	}{
		{"one update, no options", pkt(z+" "+a+" refs/heads/main\x00report-status side-band-64k\n") + "0000PACK", 1, nil, false, false},
		{"ci.skip", pkt(z+" "+a+" refs/heads/main\x00report-status push-options\n") + "0000" + pkt("ci.skip\n") + "0000PACK", 1, []string{"ci.skip"}, true, false},
		{"other options", pkt(z+" "+a+" refs/heads/main\x00push-options\n") + pkt(a+" "+z+" refs/tags/v1\n") + "0000" + pkt("ci.variable=A=1") + "0000", 2, []string{"ci.variable=A=1"}, false, false},
		{"options without capability are pack data", pkt(z+" "+a+" refs/heads/main\x00report-status\n") + "0000" + pkt("ci.skip\n"), 1, nil, false, false},
		{"only a flush", "0000", 0, nil, false, false},
		// A push from a shallow clone (issue 9, defect 1).
		{"shallow lines first", pkt("shallow "+a+"\n") + pkt(z+" "+a+" refs/heads/main\x00report-status push-options\n") + "0000" + pkt("ci.skip\n") + "0000PACK", 1, []string{"ci.skip"}, true, false},
		{"bad shallow sha", pkt("shallow xyz\n") + pkt(z+" "+a+" refs/heads/main\n") + "0000", 0, nil, false, true},
		{"shallow after a command", pkt(z+" "+a+" refs/heads/main\n") + pkt("shallow "+a+"\n") + "0000", 0, nil, false, true},
		{"bad sha", pkt("xyz "+a+" refs/heads/main\n") + "0000", 0, nil, false, true},
		{"not a ref", pkt(z+" "+a+" main\n") + "0000", 0, nil, false, true},
		{"truncated", pkt(z + " " + a + " refs/heads/main\n"), 0, nil, false, true},
		{"bad length", "00zz", 0, nil, false, true},
		{"length too small", "0003", 0, nil, false, true},
		{"empty", "", 0, nil, false, true},
	}
	for _, tt := range tests {
		h, raw, err := ReadReceivePackHeader(bufio.NewReader(strings.NewReader(tt.in)))
		if (err != nil) != tt.err {
			t.Errorf("%s: error %v, want error %v", tt.name, err, tt.err)
			continue
		}
		if err != nil {
			continue
		}
		if len(h.Updates) != tt.updates || strings.Join(h.Options, ",") != strings.Join(tt.options, ",") || h.SkipCI() != tt.skip {
			t.Errorf("%s: %+v, want %d updates, options %v, skip %v", tt.name, h, tt.updates, tt.options, tt.skip)
		}
		if !strings.HasPrefix(tt.in, string(raw)) {
			t.Errorf("%s: consumed bytes %q are not the input's prefix", tt.name, raw)
		}
	}
}

func FuzzReadReceivePackHeader(f *testing.F) {
	z, a := strings.Repeat("0", 40), strings.Repeat("a", 40)
	f.Add([]byte(pkt(z+" "+a+" refs/heads/main\x00push-options\n") + "0000" + pkt("ci.skip\n") + "0000PACK"))
	f.Add([]byte("0000"))
	f.Add([]byte("ffff"))
	f.Add([]byte(pkt("shallow "+a+"\n") + pkt(z+" "+a+" refs/heads/main\x00report-status\n") + "0000PACK"))
	f.Fuzz(func(t *testing.T, in []byte) {
		h, raw, err := ReadReceivePackHeader(bufio.NewReader(bytes.NewReader(in)))
		if err != nil {
			return
		}
		if !bytes.HasPrefix(in, raw) {
			t.Fatalf("consumed %q is not a prefix of %q", raw, in)
		}
		for _, u := range h.Updates {
			if len(u.Old) != 40 || len(u.New) != 40 || !strings.HasPrefix(u.Ref, "refs/") {
				t.Fatalf("bad update %+v", u)
			}
		}
	})
}

// FuzzPipelineAPI sends arbitrary paths and bodies to the project,
// pipeline, job and variable endpoints: never a panic nor a 5xx.
func FuzzPipelineAPI(f *testing.F) {
	needGitF(f)
	fe := newEnv(f, Config{})
	fe.srv.cfg.ExternalURL = fe.http.URL
	if _, err := fe.srv.CreateProject(f.Context(), ProjectSpec{Path: "g/p"}); err != nil {
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
