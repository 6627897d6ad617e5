package coordinator

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
)

func FuzzParseContentRange(f *testing.F) {
	for _, s := range []string{"0-0", "0-1023", "5-4", "bytes 0-9", "-1-2", "a-b", "", "1", "9223372036854775807-9223372036854775807"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		start, end, err := ParseContentRange(s)
		if err == nil && (start < 0 || end < start) {
			t.Fatalf("%q parsed to %d-%d", s, start, end)
		}
	})
}

// FuzzRequestBodies sends arbitrary bodies to every endpoint that decodes
// one: the coordinator must never panic nor answer 5xx.
func FuzzRequestBodies(f *testing.F) {
	fe := newEnv(f, Config{})
	h := fe.srv.Handler()
	f.Add(0, []byte(`{"token":"x"}`))
	f.Add(1, []byte(`{"token":"GR1348941x","tag_list":"a,b","run_untagged":true}`))
	f.Add(2, []byte(`{"token":"x","system_id":"s","last_update":"1"}`))
	f.Add(3, []byte(`{"token":"x","state":"success","output":{"checksum":"crc32:0","bytesize":3}}`))
	f.Add(4, []byte(`{"name":"a","project_id":1,"steps":[{"name":"script","script":["x"]}]}`))
	f.Add(5, []byte(`{"runner_type":"instance_type","tag_list":["a"]}`))
	f.Add(6, []byte(`{"token":"x","system_id":""}`))
	f.Fuzz(func(t *testing.T, endpoint int, body []byte) {
		type ep struct{ method, path string }
		eps := []ep{
			{"POST", "/api/v4/runners/verify"}, {"POST", "/api/v4/runners"}, {"POST", "/api/v4/jobs/request"},
			{"PUT", "/api/v4/jobs/1"}, {"POST", "/api/v4/berth/jobs"}, {"POST", "/api/v4/user/runners"},
			{"DELETE", "/api/v4/runners/managers"}, {"DELETE", "/api/v4/runners"},
			{"POST", "/api/v4/runners/reset_authentication_token"}, {"PATCH", "/api/v4/jobs/1/trace"},
			{"POST", "/api/v4/jobs/1/artifacts"},
		}
		if endpoint < 0 {
			endpoint = -endpoint
		}
		p := eps[endpoint%len(eps)]
		req := httptest.NewRequest(p.method, p.path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("PRIVATE-TOKEN", fe.admin)
		req.Header.Set("Content-Range", "0-3")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%s %s with %q: %d %s", p.method, p.path, body, rec.Code, rec.Body.String())
		}
		if rec.Code == http.StatusCreated && p.path == "/api/v4/berth/jobs" && len(body) == 0 {
			t.Fatal("empty body created a job")
		}
	})
}
