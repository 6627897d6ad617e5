package webui_test

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/webui"
	"github.com/berthci/berth/runnerapi"
)

// A job's log becomes a debug trace when its runner says so (PATCH
// …/trace?debug_trace=true) or its variables set CI_DEBUG_TRACE: from then
// on only the project's developers and above, and admins, read it — in the
// UI (page, raw log, stream) and through the API — as in GitLab; a
// reporter sees that it is hidden and why.
func TestDebugTraceReaders(t *testing.T) {
	e := newEnv(t, webui.Config{})
	ctx := t.Context()
	const single = "build:\n  script: [make]\n"
	said, _ := e.project("g/said", map[string]string{".gitlab-ci.yml": single})
	byVariable, _ := e.project("g/vars", map[string]string{".gitlab-ci.yml": "variables:\n  DEBUG: \"true\"\n  CI_DEBUG_TRACE: $DEBUG\n" + single})
	plain, _ := e.project("g/plain", map[string]string{".gitlab-ci.yml": single})

	tok := e.runner("r")
	jobs := map[string]*runnerapi.JobResponse{}
	for range 3 {
		j := e.take(tok, "s_debug")
		jobs[j.JobInfo.ProjectName] = j
	}
	const secret = "the-value-of-every-variable"
	for name, j := range jobs {
		off := e.appendLog(j, 0, "Running with berth\n")
		path := "/api/v4/jobs/" + strconv.FormatInt(j.ID, 10) + "/trace"
		if name == "said" {
			path += "?debug_trace=true"
		}
		data := "+ export SECRET=" + secret + "\n"
		code, b := e.api("PATCH", path, []byte(data), map[string]string{runnerapi.HeaderJobToken: j.Token, "Content-Type": "text/plain",
			runnerapi.HeaderContentRange: fmt.Sprintf("%d-%d", off, off+len(data)-1)})
		if code != http.StatusAccepted {
			t.Fatalf("%s: trace patch %d %s", name, code, b)
		}
	}
	for _, j := range jobs {
		if code := e.update(j, "success"); code != http.StatusOK {
			t.Fatalf("finishing job %d: %d", j.ID, code)
		}
	}
	for name, want := range map[string]bool{"said": true, "vars": false, "plain": false} {
		got, err := e.st.GetJob(ctx, jobs[name].ID)
		if err != nil || got.DebugTrace != want {
			t.Fatalf("%s: marked %v (%v), want %v", name, got != nil && got.DebugTrace, err, want)
		}
	}

	members := map[store.MemberAccess]string{}
	for _, l := range []store.MemberAccess{store.AccessReporter, store.AccessDeveloper} {
		name := fmt.Sprintf("level%d", l)
		members[l] = e.user(name, "read-only")
		for _, p := range []*store.Project{said, byVariable, plain} {
			if code, b := e.admin_("POST", "/api/v4/projects/"+itoa(p.ID)+"/members", restapi.MemberRequest{Username: name, AccessLevel: int(l)}); code != http.StatusCreated {
				t.Fatalf("adding %s: %d %s", name, code, b)
			}
		}
	}
	for _, p := range []*store.Project{said, byVariable, plain} {
		j := jobs[strings.TrimPrefix(p.Path, "g/")]
		debug := p != plain
		for who, tok := range map[string]string{"reporter": members[store.AccessReporter], "developer": members[store.AccessDeveloper], "admin": e.admin} {
			readable := !debug || who != "reporter"
			b := e.browser()
			b.signIn(tok)
			u := "/" + p.Path + "/-/jobs/" + itoa(j.ID)
			pg := b.get(u)
			if pg.code != http.StatusOK || strings.Contains(pg.body, secret) != readable || strings.Contains(pg.body, "is a debug trace") == readable {
				t.Errorf("%s, %s: page %d, shows the log: %v, want %v", p.Path, who, pg.code, strings.Contains(pg.body, secret), readable)
			}
			for _, sub := range []string{"/raw", "/log?from=0&offset=0"} { // (the job is finished: the stream ends)
				r := b.get(u + sub)
				if (r.code == http.StatusOK) != readable || (!readable && (r.code != http.StatusForbidden || strings.Contains(r.body, secret))) {
					t.Errorf("%s, %s: %s %d", p.Path, who, sub, r.code)
				}
			}
			code, body := e.api("GET", "/api/v4/projects/"+itoa(p.ID)+"/jobs/"+itoa(j.ID)+"/trace", nil, map[string]string{"PRIVATE-TOKEN": tok})
			if (code == http.StatusOK && strings.Contains(string(body), secret)) != readable ||
				!readable && (code != http.StatusForbidden || !strings.Contains(string(body), "developer or higher permissions")) {
				t.Errorf("%s, %s: API trace %d %s", p.Path, who, code, body)
			}
		}
	}
}
