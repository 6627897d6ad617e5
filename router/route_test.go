package router

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/berthci/berth/token"
)

// routable mints a routable token of prefix for cell.
func routable(t testing.TB, prefix string, cell int64) string {
	t.Helper()
	tok, err := token.NewRoutable(prefix, token.Routing{Cell: cell, Organization: 1})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// jobJWT makes a job token JWT with the given claims (unsigned: the
// router never verifies).
func jobJWT(t testing.TB, claims map[string]any) string {
	t.Helper()
	b, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding.EncodeToString
	return token.PrefixJob + enc([]byte(`{"alg":"RS256","typ":"JWT","kid":"k"}`)) + "." + enc(b) + "." + enc([]byte("signature"))
}

// testRouter is a router of cells 1 and 2 (and 36) that is never
// started: Route needs no cell to be up.
func testRouter(t testing.TB, def int64) *Router {
	t.Helper()
	rt, err := New(Config{DefaultCell: def, Cells: []Cell{
		{ID: 1, URL: "http://cell1.invalid"}, {ID: 2, URL: "http://cell2.invalid"}, {ID: 36, URL: "http://cell36.invalid"},
	}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

func TestRouterRouteDecision(t *testing.T) {
	c1 := routable(t, "glrt-t1_", 1)
	c2 := routable(t, "glrt-t3_", 2)
	pat2 := routable(t, "glpat-", 2)
	legacyRunner2 := routable(t, "glrtr-", 2)
	reg2 := routable(t, token.PrefixRegistration, 2)
	c7 := routable(t, "glrt-t2_", 7)
	orgOnly, err := token.NewRoutable("glrt-t2_", token.Routing{Organization: 3})
	if err != nil {
		t.Fatal(err)
	}
	unroutable := token.NewRunnerAuth(token.ScopeInstance)
	job2 := jobJWT(t, map[string]any{"c": "2", "o": "1", "p": "ya", "sub": "gid://gitlab/Ci::Build/9"})
	job36 := jobJWT(t, map[string]any{"c": "10"}) // base36
	jobNoCell := jobJWT(t, map[string]any{"o": "1"})
	jobPrefixed := "acme-" + jobJWT(t, map[string]any{"c": "2"})
	jobRandom := token.NewJob()
	trig2 := routable(t, "glptt-", 2)
	form := map[string]string{"Content-Type": "application/x-www-form-urlencoded"}
	multi := map[string]string{"Content-Type": "multipart/form-data; boundary=b"}
	part := func(name, value string) string {
		return "--b\r\nContent-Disposition: form-data; name=\"" + name + "\"\r\n\r\n" + value + "\r\n"
	}
	basic := func(user, pass string) string {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	}

	type tc struct {
		name    string
		method  string
		target  string
		header  map[string]string
		body    string
		def     int64 // default cell (0: none)
		cell    int64
		by      Source
		err     error
		message string
	}
	cases := []tc{
		{name: "RUNNER-TOKEN", target: "/api/v4/jobs/request", method: "POST", header: map[string]string{"RUNNER-TOKEN": c2}, def: 1, cell: 2, by: ByRunnerToken},
		{name: "JOB-TOKEN JWT", target: "/api/v4/jobs/5/trace", method: "PATCH", header: map[string]string{"JOB-TOKEN": job2}, def: 1, cell: 2, by: ByJobToken},
		{name: "JOB-TOKEN JWT base36 cell", target: "/api/v4/jobs/5", header: map[string]string{"JOB-TOKEN": job36}, def: 1, cell: 36, by: ByJobToken},
		{name: "JOB-TOKEN JWT after an instance prefix", target: "/api/v4/jobs/5", header: map[string]string{"JOB-TOKEN": jobPrefixed}, def: 1, cell: 2, by: ByJobToken},
		{name: "PRIVATE-TOKEN", target: "/api/v4/projects", header: map[string]string{"PRIVATE-TOKEN": pat2}, def: 1, cell: 2, by: ByPrivateToken},
		{name: "Bearer", target: "/api/v4/projects", header: map[string]string{"Authorization": "Bearer " + pat2}, def: 1, cell: 2, by: ByBearer},
		{name: "bearer, any case", target: "/api/v4/projects", header: map[string]string{"Authorization": "bEaReR " + pat2}, def: 1, cell: 2, by: ByBearer},
		{name: "Bearer on a WebSocket upgrade", target: "/api/v4/runners/push", header: map[string]string{"Authorization": "Bearer " + c2, "Upgrade": "websocket", "Connection": "Upgrade"}, def: 1, cell: 2, by: ByBearer},
		{name: "git: Basic gitlab-ci-token:<job token>", target: "/g/p.git/info/refs?service=git-upload-pack", header: map[string]string{"Authorization": basic("gitlab-ci-token", job2)}, def: 1, cell: 2, by: ByBasic},
		{name: "git: Basic any user, PAT password", target: "/g/p.git/git-upload-pack", method: "POST", header: map[string]string{"Authorization": basic("alice", pat2)}, def: 1, cell: 2, by: ByBasic},
		{name: "git: Basic without password: default", target: "/g/p.git/info/refs", header: map[string]string{"Authorization": basic("alice", "")}, def: 1, cell: 1, by: ByDefault},
		{name: "query job_token", target: "/api/v4/jobs/5/artifacts?job_token=" + job2, def: 1, cell: 2, by: ByQueryJob},
		{name: "query token", target: "/api/v4/jobs/5/artifacts?token=" + c2, def: 1, cell: 2, by: ByQueryToken},
		{name: "query private_token", target: "/api/v4/projects?private_token=" + pat2, def: 1, cell: 2, by: ByQueryPrivate},
		{name: "legacy runner token glrtr-", target: "/api/v4/jobs/request", method: "POST", header: map[string]string{"RUNNER-TOKEN": legacyRunner2}, def: 1, cell: 2, by: ByRunnerToken},
		{name: "registration token in the body", target: "/api/v4/runners", method: "POST", body: `{"token":"` + reg2 + `","description":"r"}`, def: 1, cell: 2, by: ByBody},
		{name: "body: jobs/request", target: "/api/v4/jobs/request", method: "POST", body: `{"info":{"name":"gitlab-runner","features":{"trace_reset":true}},"token":"` + c2 + `","last_update":"x"}`, def: 1, cell: 2, by: ByBody},
		{name: "body: job update PUT /jobs/:id", target: "/api/v4/jobs/42", method: "PUT", body: `{"token":"` + job2 + `","state":"success"}`, def: 1, cell: 2, by: ByBody},
		{name: "body: verify", target: "/api/v4/runners/verify", method: "POST", body: `{"token":"` + c2 + `"}`, def: 1, cell: 2, by: ByBody},
		{name: "trigger: curl --data token=", target: "/api/v4/projects/acme%2Fapp/trigger/pipeline", method: "POST", header: form, body: "ref=main&token=" + trig2 + "&variables%5BA%5D=1", def: 1, cell: 2, by: ByBody},
		{name: "trigger: curl --form token=", target: "/api/v4/projects/7/trigger/pipeline", method: "POST", header: multi, body: part("ref", "main") + part("token", trig2) + "--b--\r\n", def: 1, cell: 2, by: ByBody},
		{name: "trigger: JSON", target: "/api/v4/projects/7/trigger/pipeline", method: "POST", header: map[string]string{"Content-Type": "application/json"}, body: `{"ref":"main","token":"` + trig2 + `"}`, def: 1, cell: 2, by: ByBody},
		{name: "trigger: webhook URL, query token", target: "/api/v4/projects/7/ref/main/trigger/pipeline?token=" + trig2, method: "POST", def: 1, cell: 2, by: ByQueryToken},
		{name: "trigger: a form field named like it is not it", target: "/api/v4/projects/7/trigger/pipeline", method: "POST", header: form, body: "variables%5Btoken%5D=" + trig2, def: 1, cell: 1, by: ByDefault},
		{name: "trigger: the body's token before the query's, as the cell reads them", target: "/api/v4/projects/7/trigger/pipeline?token=" + c1, method: "POST", header: form, body: "ref=main&token=" + trig2, def: 1, cell: 2, by: ByBody},
		{name: "trigger: the query's token when the body has none", target: "/api/v4/projects/7/trigger/pipeline?token=" + trig2, method: "POST", header: form, body: "ref=main", def: 1, cell: 2, by: ByQueryToken},
		{name: "form body not read elsewhere", target: "/api/v4/projects/7/pipeline", method: "POST", header: form, body: "token=" + trig2, def: 1, cell: 1, by: ByDefault},
		{name: "body: unregister", target: "/api/v4/runners", method: "DELETE", body: `{"token":"` + c2 + `"}`, def: 1, cell: 2, by: ByBody},
		{name: "body: delete manager", target: "/api/v4/runners/managers", method: "DELETE", body: `{"token":"` + c2 + `","system_id":"s_1"}`, def: 1, cell: 2, by: ByBody},
		{name: "body: reset token", target: "/api/v4/runners/reset_authentication_token", method: "POST", body: `{"token":"` + c2 + `"}`, def: 1, cell: 2, by: ByBody},
		{name: "body: key in any case, escaped, last one wins as in encoding/json", target: "/api/v4/jobs/request", method: "POST", body: `{"token":"` + c1 + `","TOK\u0045N":"` + c2 + `","token":null}`, def: 1, cell: 2, by: ByBody},
		{name: "body: nested token is not the token", target: "/api/v4/jobs/request", method: "POST", body: `{"info":{"token":"` + c2 + `"}}`, def: 1, cell: 1, by: ByDefault},
		{name: "body: not read on other endpoints", target: "/api/v4/jobs/5/trace", method: "PATCH", body: `{"token":"` + c2 + `"}`, def: 1, cell: 1, by: ByDefault},
		{name: "body: not read on PUT of a non-numeric job", target: "/api/v4/jobs/x", method: "PUT", body: `{"token":"` + c2 + `"}`, def: 1, cell: 1, by: ByDefault},
		{name: "body: not read when a header has the token", target: "/api/v4/jobs/request", method: "POST", header: map[string]string{"RUNNER-TOKEN": c1}, body: `{"token":"` + c2 + `"}`, def: 1, cell: 1, by: ByRunnerToken},
		{name: "header order: RUNNER-TOKEN before JOB-TOKEN", target: "/api/v4/jobs/5", header: map[string]string{"RUNNER-TOKEN": c1, "JOB-TOKEN": job2}, def: 2, cell: 1, by: ByRunnerToken},
		{name: "header order: PRIVATE-TOKEN before Bearer", target: "/api/v4/projects", header: map[string]string{"PRIVATE-TOKEN": c1, "Authorization": "Bearer " + pat2}, def: 2, cell: 1, by: ByPrivateToken},
		{name: "header order: headers before the query", target: "/api/v4/projects?private_token=" + pat2, header: map[string]string{"JOB-TOKEN": c1}, def: 2, cell: 1, by: ByJobToken},
		{name: "X-Berth-Cell without a token", target: "/api/v4/projects", header: map[string]string{"X-Berth-Cell": "2"}, def: 1, cell: 2, by: ByCellHeader},
		{name: "X-Berth-Cell with an unroutable token", target: "/api/v4/projects", header: map[string]string{"PRIVATE-TOKEN": token.NewPersonal(), "X-Berth-Cell": "2"}, def: 1, cell: 2, by: ByCellHeader},
		{name: "X-Berth-Cell loses to a token's cell", target: "/api/v4/projects", header: map[string]string{"PRIVATE-TOKEN": c1, "X-Berth-Cell": "2"}, def: 2, cell: 1, by: ByPrivateToken},
		{name: "X-Berth-Cell of an unknown cell", target: "/api/v4/projects", header: map[string]string{"X-Berth-Cell": "7"}, def: 1, err: ErrUnknownCell,
			message: "421 Misdirected Request - X-Berth-Cell names cell 7, which this router does not serve"},
		{name: "X-Berth-Cell not a number", target: "/api/v4/projects", header: map[string]string{"X-Berth-Cell": "two"}, def: 1, err: ErrBadCellHeader,
			message: `400 Bad Request - X-Berth-Cell "two" is not a cell id (a positive integer)`},
		{name: "token of an unknown cell", target: "/api/v4/jobs/request", method: "POST", header: map[string]string{"RUNNER-TOKEN": c7}, def: 1, err: ErrUnknownCell,
			message: "421 Misdirected Request - the token belongs to cell 7, which this router does not serve"},
		{name: "token of an unknown cell, even with X-Berth-Cell", target: "/api/v4/projects", header: map[string]string{"PRIVATE-TOKEN": c7, "X-Berth-Cell": "1"}, def: 1, err: ErrUnknownCell},
		{name: "unroutable runner token: default cell", target: "/api/v4/jobs/request", method: "POST", header: map[string]string{"RUNNER-TOKEN": unroutable}, def: 1, cell: 1, by: ByDefault},
		{name: "routable token without a cell: default cell", target: "/api/v4/jobs/request", method: "POST", header: map[string]string{"RUNNER-TOKEN": orgOnly}, def: 2, cell: 2, by: ByDefault},
		{name: "random job token: default cell", target: "/api/v4/jobs/5/trace", method: "PATCH", header: map[string]string{"JOB-TOKEN": jobRandom}, def: 2, cell: 2, by: ByDefault},
		{name: "job token JWT without c: default cell", target: "/api/v4/jobs/5", header: map[string]string{"JOB-TOKEN": jobNoCell}, def: 2, cell: 2, by: ByDefault},
		{name: "no token: default cell", target: "/g/p.git/info/refs?service=git-upload-pack", def: 2, cell: 2, by: ByDefault},
		{name: "no token, no default", target: "/api/v4/projects", err: ErrNoCell,
			message: "401 Unauthorized - the request has no token, and this router has no default cell to send it to"},
		{name: "unroutable token, no default", target: "/api/v4/jobs/request", method: "POST", header: map[string]string{"RUNNER-TOKEN": unroutable}, err: ErrNoCell,
			message: "421 Misdirected Request - the token names no cell, and this router has no default cell"},
	}
	routers := map[int64]*Router{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rt := routers[tc.def]
			if rt == nil {
				rt = testRouter(t, tc.def)
				routers[tc.def] = rt
			}
			method := tc.method
			if method == "" {
				method = "GET"
			}
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			r := httptest.NewRequest(method, tc.target, body)
			for k, v := range tc.header {
				r.Header.Set(k, v)
			}
			d, err := rt.Route(r)
			if tc.err != nil {
				var re *RouteError
				if !errors.Is(err, tc.err) || !errors.As(err, &re) {
					t.Fatalf("Route: %+v, %v; want %v", d, err, tc.err)
				}
				if tc.message != "" && re.Message() != tc.message {
					t.Errorf("message %q\nwant    %q", re.Message(), tc.message)
				}
				if strings.Contains(re.Message(), tc.header["RUNNER-TOKEN"]+"x") || (d.Token != "" && strings.Contains(re.Message(), d.Token)) {
					t.Errorf("message %q shows the token", re.Message())
				}
				return
			}
			if err != nil {
				t.Fatalf("Route: %v", err)
			}
			if d.Cell != tc.cell || d.By != tc.by {
				t.Errorf("Route: cell %d by %s, want cell %d by %s", d.Cell, d.By, tc.cell, tc.by)
			}
			// The body reaches the cell whole, whatever was read of it.
			if tc.body != "" {
				got, err := io.ReadAll(r.Body)
				if err != nil || string(got) != tc.body {
					t.Errorf("body after Route: %q, %v; want %q", got, err, tc.body)
				}
			}
		})
	}
}

// TestRouterBodyPeekBounds: the body is read up to the bound only, the
// token is found within it, and the whole body still reads back.
func TestRouterBodyPeekBounds(t *testing.T) {
	c2 := routable(t, "glrt-t1_", 2)
	pad := strings.Repeat("x", 100<<10)
	for _, tc := range []struct {
		name string
		body string
		cell int64
		by   Source
	}{
		{"token first, body larger than the bound", `{"token":"` + c2 + `","info":{"name":"` + pad + `"}}`, 2, ByBody},
		{"token past the bound", `{"info":{"name":"` + pad + `"},"token":"` + c2 + `"}`, 1, ByDefault},
		{"not JSON", "token=" + c2, 1, ByDefault},
		{"truncated JSON", `{"token":"` + c2 + `","info":{`, 2, ByBody},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := testRouter(t, 1)
			src := &countingReader{r: strings.NewReader(tc.body)}
			r := httptest.NewRequest("POST", "/api/v4/jobs/request", nil)
			r.Body = io.NopCloser(src)
			r.ContentLength = -1 // chunked: the bound alone limits the read
			d, err := rt.Route(r)
			if err != nil || d.Cell != tc.cell || d.By != tc.by {
				t.Fatalf("Route: %+v, %v; want cell %d by %s", d, err, tc.cell, tc.by)
			}
			if src.n > rt.cfg.MaxBodyPeek {
				t.Errorf("Route read %d bytes of the body, bound %d", src.n, rt.cfg.MaxBodyPeek)
			}
			got, _ := io.ReadAll(r.Body)
			if !bytes.Equal(got, []byte(tc.body)) {
				t.Errorf("body after Route: %d bytes, want %d intact", len(got), len(tc.body))
			}
		})
	}
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func TestRouterTokenRouting(t *testing.T) {
	for _, tc := range []struct {
		name string
		tok  string
		want token.Routing
		err  string // part of the error; "" for none
	}{
		{"routable runner token", "glrt-t3_AAECAwQFBgcICQoLDA0OD2M6MQpvOjEKcDp5YQp1OjE2EQ.01.1a18gz2ql", token.Routing{Cell: 1, Organization: 1, Project: 1234, User: 42}, ""},
		{"checksum off", "glrt-t3_AAECAwQFBgcICQoLDA0OD2M6MQpvOjEKcDp5YQp1OjE2EQ.01.1a18gz2qm", token.Routing{}, "not a routable token"},
		{"random token", token.NewRunnerAuth(token.ScopeGroup), token.Routing{}, "not a routable token"},
		{"job JWT", jobJWT(t, map[string]any{"c": "2", "o": "1", "g": "a", "p": "ya", "u": "16"}), token.Routing{Cell: 2, Organization: 1, Group: 10, Project: 1234, User: 42}, ""},
		{"job JWT claim a number", jobJWT(t, map[string]any{"c": 2}), token.Routing{}, `job token claim "c" is 2, want a base36 string`},
		{"job JWT claim not base36", jobJWT(t, map[string]any{"c": "-1"}), token.Routing{}, `job token claim "c" is "-1", want a positive integer in lower-case base36`},
		{"job JWT claim upper case", jobJWT(t, map[string]any{"c": "A"}), token.Routing{}, `want a positive integer in lower-case base36`},
		{"job JWT claim signed", jobJWT(t, map[string]any{"c": "+1"}), token.Routing{}, `want a positive integer in lower-case base36`},
		{"job JWT claim too large", jobJWT(t, map[string]any{"c": strings.Repeat("z", 20)}), token.Routing{}, `want a positive integer`},
		{"job JWT payload not base64", "glcbt-a.b*c.d", token.Routing{}, "job token payload is not base64url"},
		{"job JWT payload not an object", "glcbt-a." + base64.RawURLEncoding.EncodeToString([]byte(`[1]`)) + ".d", token.Routing{}, "job token payload is not a JSON object"},
		{"job JWT padded payload", "glcbt-a." + base64.URLEncoding.EncodeToString([]byte(`{"c":"1"}`)) + ".d", token.Routing{Cell: 1}, ""},
		{"too long", "glcbt-" + strings.Repeat("a", maxTokenLen), token.Routing{}, "longer than any routable one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := TokenRouting(tc.tok)
			if tc.err == "" {
				if err != nil || got != tc.want {
					t.Fatalf("TokenRouting: %+v, %v; want %+v", got, err, tc.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, token.ErrNotRoutable) {
				t.Fatalf("TokenRouting: %+v, %v; want an ErrNotRoutable saying %q", got, err, tc.err)
			}
		})
	}
}

// BenchmarkRouterRoute: the routing decision of the requests a runner
// sends most: the long poll with its token in a header, the same with
// the token in the body only, a trace PATCH with a job token JWT.
func BenchmarkRouterRoute(b *testing.B) {
	rt := testRouter(b, 1)
	runner := routable(b, "glrt-t1_", 2)
	job := jobJWT(b, map[string]any{"c": "2", "o": "1", "p": "ya", "u": "16", "sub": "gid://gitlab/Ci::Build/1234", "iss": "https://gitlab.example.com", "aud": "gitlab-authz-token", "exp": 1900000000, "version": "0.1.0"})
	info := `{"info":{"name":"gitlab-runner","version":"18.4.0","revision":"abc","platform":"linux","architecture":"amd64","executor":"docker","shell":"bash","features":{"variables":true,"image":true,"services":true,"artifacts":true,"cache":true,"shared":true,"upload_multiple_artifacts":true,"upload_raw_artifacts":true,"session":true,"terminal":true,"refspecs":true,"masking":true,"proxy":true,"raw_variables":true,"artifacts_exclude":true,"multi_build_steps":true,"trace_reset":true,"trace_checksum":true,"trace_size":true,"vault_secrets":true,"cancelable":true,"return_exit_code":true,"service_variables":true,"service_multiple_aliases":true,"image_executor_opts":true,"service_executor_opts":true,"cancel_gracefully":true,"native_steps_integration":true,"two_phase_job_commit":true,"job_inputs":true},"config":{"gpus":""}},"token":"` + runner + `","system_id":"s_0123456789ab","last_update":"1234567890"}`
	for _, bc := range []struct {
		name string
		req  func() *http.Request
	}{
		{"jobs_request/header", func() *http.Request {
			r := httptest.NewRequest("POST", "/api/v4/jobs/request", strings.NewReader(info))
			r.Header.Set("RUNNER-TOKEN", runner)
			return r
		}},
		{"jobs_request/body", func() *http.Request {
			return httptest.NewRequest("POST", "/api/v4/jobs/request", strings.NewReader(info))
		}},
		{"trace/job_jwt", func() *http.Request {
			r := httptest.NewRequest("PATCH", "/api/v4/jobs/1234/trace", strings.NewReader("log line\n"))
			r.Header.Set("JOB-TOKEN", job)
			return r
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				r := bc.req()
				b.StartTimer()
				if d, err := rt.Route(r); err != nil || d.Cell != 2 {
					b.Fatalf("%+v %v", d, err)
				}
			}
		})
	}
}

// TestRequestBodyTokenOfAPrefix: of a form read only in part, a field the
// cut may have shortened does not count.
func TestRequestBodyTokenOfAPrefix(t *testing.T) {
	const form = "application/x-www-form-urlencoded"
	for _, tc := range []struct {
		body  string
		whole bool
		want  string
	}{
		{"token=abc&ref=main", true, "abc"},
		{"token=abc&ref=ma", false, "abc"},
		{"ref=main&token=ab", false, ""},
		{"ref=main&token=abc", true, "abc"},
		{"token=a%zz&token=b", true, "b"},
	} {
		if got := requestBodyToken(form, []byte(tc.body), tc.whole); got != tc.want {
			t.Errorf("requestBodyToken(%q, whole %v) = %q, want %q", tc.body, tc.whole, got, tc.want)
		}
	}
	// A multipart field cut short is no token.
	cut := "--b\r\nContent-Disposition: form-data; name=\"token\"\r\n\r\nglptt-ab"
	if got := requestBodyToken("multipart/form-data; boundary=b", []byte(cut), false); got != "" {
		t.Errorf("a cut multipart token read as %q", got)
	}
}
