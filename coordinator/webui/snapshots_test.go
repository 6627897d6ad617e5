package webui_test

import (
	"bytes"
	"fmt"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/webui"
	"github.com/berthci/berth/runnerapi"
)

// A VM snapshot, a failed job's or a snapshot point's, is no artifact of
// the UI: no user, read-only or admin, sees it listed or downloads it;
// the job's other artifacts are as they were.
func TestSnapshotNotShown(t *testing.T) {
	e := newEnv(t, webui.Config{})
	e.project("g/p", map[string]string{".gitlab-ci.yml": twoStages})
	job := e.take(e.runner("r"), "s_1")
	e.uploadArchive(job, map[string]string{"a.txt": "archive-bytes"})
	types := []string{"berth_snapshot", "berth_snapshot_end"}
	for _, typ := range types {
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		fw, _ := mw.CreateFormFile("file", "vm-snapshot.tar")
		_, _ = fw.Write([]byte(strings.Repeat("masked-secret-in-memory;", 100)))
		_ = mw.Close()
		code, b := e.api("POST", fmt.Sprintf("/api/v4/jobs/%d/artifacts?artifact_type=%s&artifact_format=raw&expire_in=1+day", job.ID, typ),
			body.Bytes(), map[string]string{runnerapi.HeaderJobToken: job.Token, "Content-Type": mw.FormDataContentType()})
		if code != http.StatusCreated {
			t.Fatalf("uploading a %s: %d %s", typ, code, b)
		}
	}
	base := "/g/p/-/jobs/" + itoa(job.ID)
	for _, who := range []struct{ name, token string }{{"admin", e.admin}, {"read-only user", e.user("viewer", "read-only")}} {
		br := e.browser()
		br.signIn(who.token)
		pg := br.get(base)
		if pg.code != http.StatusOK || !strings.Contains(pg.body, base+"/artifacts/download") {
			t.Fatalf("%s: job page %d without the archive's download link", who.name, pg.code)
		}
		if strings.Contains(pg.body, "berth_snapshot") || strings.Contains(pg.body, "vm-snapshot.tar") {
			t.Errorf("%s: the job page lists the snapshot", who.name)
		}
		for _, typ := range types {
			for _, method := range []string{"GET", "HEAD"} {
				dl := br.do(method, base+"/artifacts/download?type="+typ, nil, nil)
				if dl.code != http.StatusNotFound || strings.Contains(dl.body, "masked-secret") || dl.header.Get("Content-Disposition") != "" {
					t.Errorf("%s: %s the %s download: %d %q", who.name, method, typ, dl.code, dl.header.Get("Content-Disposition"))
				}
			}
		}
		if dl := br.get(base + "/artifacts/download"); dl.code != http.StatusOK || strings.Contains(dl.body, "masked-secret") {
			t.Errorf("%s: the archive's download: %d", who.name, dl.code)
		}
	}
}
