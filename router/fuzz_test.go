package router

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/berthci/berth/token"
)

// FuzzRouterRequestToken: finding a request's token from its headers,
// Basic auth, query and body never panics, reads no more of the body
// than the bound, and leaves the body whole for the cell.
func FuzzRouterRequestToken(f *testing.F) {
	c2 := "glrt-t3_AAECAwQFBgcICQoLDA0OD2M6MQpvOjEKcDp5YQp1OjE2EQ.01.1a18gz2ql"
	f.Add("POST", "/api/v4/jobs/request", "", "", "", "", []byte(`{"token":"`+c2+`","info":{}}`))
	f.Add("PUT", "/api/v4/jobs/12", "", "", "", "", []byte(`{"token":"glcbt-a.eyJjIjoiMiJ9.c","state":"running"}`))
	f.Add("GET", "/g/p.git/info/refs", "", "", "Basic "+base64.StdEncoding.EncodeToString([]byte("gitlab-ci-token:"+c2)), "service=git-upload-pack", []byte(nil))
	f.Add("GET", "/api/v4/projects", "", "", "Bearer "+c2, "", []byte(nil))
	f.Add("PATCH", "/api/v4/jobs/1/trace", "", c2, "", "", []byte("log"))
	f.Add("GET", "/api/v4/jobs/1/artifacts", "", "", "", "job_token="+c2+"&token=x", []byte(nil))
	f.Add("POST", "/api/v4/runners", c2, "", "Basic !!", "private_token=%zz", []byte(`{"TOKEN":"a","token":1}`))
	f.Add("DELETE", "/api/v4/runners/managers", "", "", "", "", []byte(`{"a":[{"token":"x"}],"token":"\ud800"}`))
	f.Fuzz(func(t *testing.T, method, path, runnerTok, jobTok, auth, query string, body []byte) {
		const peek = 64
		r := &http.Request{
			Method: method, URL: &url.URL{Path: path, RawQuery: query}, Header: http.Header{},
			Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)),
		}
		for k, v := range map[string]string{"RUNNER-TOKEN": runnerTok, "JOB-TOKEN": jobTok, "Authorization": auth} {
			if v != "" {
				r.Header.Set(k, v)
			}
		}
		src := &countingReader{r: bytes.NewReader(body)}
		r.Body = io.NopCloser(src)
		endpoint := bodyTokenEndpoint(r)
		tok, by := requestToken(r, peek)
		if (tok == "") != (by == "") {
			t.Fatalf("token %q found by %q", tok, by)
		}
		if src.n > peek {
			t.Fatalf("read %d bytes of the body, bound %d", src.n, peek)
		}
		if src.n > 0 && (!endpoint || (by != ByBody && by != "")) {
			t.Fatalf("read the body of %s %s, but the token came from %q", method, path, by)
		}
		got, err := io.ReadAll(r.Body)
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("body after: %q %v, want %q", got, err, body)
		}
		if _, err := TokenRouting(tok); err != nil && !errors.Is(err, token.ErrNotRoutable) {
			t.Fatalf("TokenRouting: %v is not ErrNotRoutable", err)
		}
	})
}

// FuzzRouterBodyToken: the body's token is the one encoding/json gives
// the coordinator's request structs, whenever the body is one they take,
// also when it is read token by token (a prefix of a long body).
func FuzzRouterBodyToken(f *testing.F) {
	for _, s := range []string{
		`{"token":"a"}`, `{"token":"a","token":"b"}`, `{"Token":"a","token":null}`, `{"tok\u0065n":"x"}`,
		`{"info":{"token":"n","x":[1,{"token":"m"}]},"token":"t"}`, `{"ToKen":"k"}`, `{"toKen":"a","TOKEN":"b"}`,
		`{"token":"\u00e9\ud83d\ude00"}`, `[]`, `null`, `{"token":"a"}x`, `{"token":"a" ,  "b":true}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got := bodyToken(b)
		var v struct {
			Token string `json:"token"`
		}
		if json.Unmarshal(b, &v) != nil || !bytes.HasPrefix(bytes.TrimLeft(b, " \t\r\n"), []byte("{")) {
			prefixToken(b) // any input: no panic
			return
		}
		if got != v.Token {
			t.Fatalf("bodyToken(%q) = %q, encoding/json reads %q", b, got, v.Token)
		}
		// The scan of a prefix (a body longer than the bound) reads a
		// whole body the same way.
		if p := prefixToken(b); p != v.Token {
			t.Fatalf("prefixToken(%q) = %q, encoding/json reads %q", b, p, v.Token)
		}
	})
}

// FuzzRouterJobTokenRouting: decoding a job token's routing claims never
// panics, fails only with ErrNotRoutable, and reads back the claims a
// payload was made of.
func FuzzRouterJobTokenRouting(f *testing.F) {
	f.Add(`{"c":"2","o":"1","p":"ya","u":"16"}`, int64(0))
	f.Add(`{"c":2}`, int64(7))
	f.Add(`{"c":"zzzzzzzzzzzzzz"}`, int64(1<<40))
	f.Add(`{"c":"1","c":"2"}`, int64(36))
	f.Add(`not json`, int64(-1))
	f.Fuzz(func(t *testing.T, payload string, cell int64) {
		enc := base64.RawURLEncoding.EncodeToString
		for _, tok := range []string{
			"glcbt-h." + enc([]byte(payload)) + ".s",
			"glcbt-" + payload,
			"x-glcbt-h." + payload + ".s",
		} {
			r, err := TokenRouting(tok)
			if err != nil && !errors.Is(err, token.ErrNotRoutable) {
				t.Fatalf("TokenRouting(%q): %v is not ErrNotRoutable", tok, err)
			}
			if err == nil && (r.Cell < 0 || r.Organization < 0 || r.Group < 0 || r.Project < 0 || r.User < 0) {
				t.Fatalf("TokenRouting(%q) = %+v", tok, r)
			}
		}
		if cell > 0 {
			claims, _ := json.Marshal(map[string]string{"c": strings.ToLower(big36(cell)), "sub": payload})
			r, err := TokenRouting("glcbt-h." + enc(claims) + ".s")
			if err != nil || r.Cell != cell {
				t.Fatalf("cell %d: %+v, %v", cell, r, err)
			}
		}
	})
}

func big36(v int64) string {
	const digits = "0123456789abcdefghijklmnopqrstuvwxyz"
	var b []byte
	for ; v > 0; v /= 36 {
		b = append([]byte{digits[v%36]}, b...)
	}
	return string(b)
}
