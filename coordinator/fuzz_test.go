package coordinator

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/runnerapi"
)

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
	f.Add(2, []byte(`{"token":"x","system_id":"s","info":{"isolation_levels":["vm","bogus",""]}}`))
	f.Add(4, []byte(`{"name":"a","project_id":1,"isolation":"vm","variables":[{"key":"BERTH_ISOLATION","value":"x"}],"steps":[{"name":"script","script":["x"]}]}`))
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

// FuzzQueueInsightLevels sends arbitrary queries to a runner's queue
// insight: never a 5xx, and never more jobs than the whole backlog.
func FuzzQueueInsightLevels(f *testing.F) {
	fe := newEnv(f, Config{})
	tok := fe.createRunner(restapi.CreateRunnerRequest{})
	for _, level := range []string{"", "container", "vm", "instance"} {
		s := simpleSpec("j")
		s.Isolation = level
		fe.enqueue(s)
	}
	h := fe.srv.Handler()
	for _, q := range []string{"isolation_levels=vm", "isolation_levels=none,container&isolation_levels=instance", "isolation_levels=", "isolation_levels=%00,,", "x=1"} {
		f.Add(q)
	}
	f.Fuzz(func(t *testing.T, query string) {
		if strings.ContainsAny(query, "# ") {
			return
		}
		req, err := http.NewRequest("GET", "/api/v4/berth/queue?"+query, nil)
		if err != nil {
			return
		}
		req.Header.Set(runnerapi.HeaderRunnerToken, tok)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Fatalf("?%s: %d %s", query, rec.Code, rec.Body.String())
		}
		var st restapi.QueueStats
		if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil || st.Queued < 1 || st.Queued > 4 {
			t.Fatalf("?%s: %s (%v)", query, rec.Body.String(), err)
		}
	})
}
