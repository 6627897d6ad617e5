package githost

import (
	"bufio"
	"bytes"
	"strings"
	"testing"
)

func FuzzParseRepoURL(f *testing.F) {
	for _, s := range []string{"/demo.git/info/refs", "/g/s/demo.git/git-upload-pack", "/a.git/git-receive-pack",
		"/a.git/objects/x", "//a.git/info/refs", "/.git/info/refs", "/a.git.git/info/refs", "a.git/info/refs"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		project, service, ok := parseRepoURL(s)
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
		h, raw, err := readReceivePackHeader(bufio.NewReader(strings.NewReader(tt.in)))
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
		h, raw, err := readReceivePackHeader(bufio.NewReader(bytes.NewReader(in)))
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

// FuzzLFSRequest: Git LFS's request paths and batch bodies are outside
// input; what is accepted names a clean project, a well-formed oid and a
// known operation.
func FuzzLFSRequest(f *testing.F) {
	oid := strings.Repeat("ab", 32)
	f.Add("POST", "/g/p.git/info/lfs/objects/batch", []byte(`{"operation":"download","objects":[{"oid":"`+oid+`","size":3}]}`))
	f.Add("PUT", "/g/p.git/gitlab-lfs/objects/"+oid+"/12", []byte(`{"operation":"upload","transfers":["basic"]}`))
	f.Add("GET", "/../x.git/gitlab-lfs/objects/"+oid, []byte(`{`))
	f.Add("PUT", "/g/p.git/gitlab-lfs/objects/"+oid+"/99999999999999999999", []byte(`{"operation":"verify"}`))
	f.Fuzz(func(t *testing.T, method, path string, body []byte) {
		req, code := parseLFSRequest(method, path)
		if code == 0 {
			if clean, err := ParseProjectPath(req.project); err != nil || clean != req.project {
				t.Fatalf("%s %q: project %q accepted", method, path, req.project)
			}
			if req.oid != "" && !lfsOIDRe.MatchString(req.oid) || req.size < 0 || req.upload != (method == "PUT") {
				t.Fatalf("%s %q: %+v accepted", method, path, req)
			}
		}
		if b, err := decodeLFSBatch(bytes.NewReader(body)); err == nil && b.Operation != "download" && b.Operation != "upload" {
			t.Fatalf("%q: operation %q accepted", body, b.Operation)
		}
	})
}
