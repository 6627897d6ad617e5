package webui

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/berthci/berth/coordinator/runners"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
)

type managerView struct {
	*store.RunnerManager
	Info      runnerapi.Info
	Online    bool
	Isolation []string
}

type runnerView struct {
	*store.Runner
	Status    string
	Contacted time.Time
	Managers  []managerView
	Jobs      []jobLink
}

type jobLink struct {
	ID      int64
	Name    string
	Status  store.Status
	URL     string
	Project string
}

type runnersPage struct {
	pageBase
	Runners []runnerView
	Online  int
	Running int
}

// managersByRunner reads every runner manager once.
func (u *UI) managersByRunner(r *http.Request) (map[int64][]*store.RunnerManager, error) {
	ms, err := u.st.ListRunnerManagers(r.Context(), 0)
	if err != nil {
		return nil, err
	}
	out := map[int64][]*store.RunnerManager{}
	for _, m := range ms {
		out[m.RunnerID] = append(out[m.RunnerID], m)
	}
	return out, nil
}

func (u *UI) handleRunners(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	list, err := u.st.ListRunners(ctx)
	if err != nil {
		u.internal(w, r, "listing runners", err)
		return
	}
	managers, err := u.managersByRunner(r)
	if err != nil {
		u.internal(w, r, "listing runner managers", err)
		return
	}
	running, err := u.st.ListJobs(ctx, store.JobFilter{Statuses: []store.Status{store.StatusRunning, store.StatusCanceling}})
	if err != nil {
		u.internal(w, r, "listing running jobs", err)
		return
	}
	paths := map[int64]string{}
	jobsOf := map[int64][]jobLink{}
	for _, j := range running {
		if j.RunnerID == 0 {
			continue
		}
		p, ok := paths[j.ProjectID]
		if !ok {
			if pr, err := u.st.GetProject(ctx, j.ProjectID); err == nil {
				p = pr.Path
			}
			paths[j.ProjectID] = p
		}
		l := jobLink{ID: j.ID, Name: j.Name, Status: j.Status, Project: p}
		if p != "" {
			l.URL = fmt.Sprintf("/%s/-/jobs/%d", p, j.ID)
		}
		jobsOf[j.RunnerID] = append(jobsOf[j.RunnerID], l)
	}
	now := u.clock.Now()
	page := &runnersPage{pageBase: pageBase{Title: "Runners", Nav: "runners"}, Running: len(running)}
	for _, rn := range list {
		st := runners.StatusOf(rn, managers[rn.ID], now)
		v := runnerView{Runner: rn, Status: st.Status, Contacted: st.ContactedAt, Jobs: jobsOf[rn.ID]}
		if st.Status == runners.StatusOnline {
			page.Online++
		}
		for _, m := range managers[rn.ID] {
			mv := managerView{RunnerManager: m, Online: !m.ContactedAt.IsZero() && now.Sub(m.ContactedAt) < runners.OnlineWindow}
			if len(m.Info) > 0 {
				_ = json.Unmarshal(m.Info, &mv.Info)
			}
			for _, l := range runners.OfferedLevels(&mv.Info) {
				mv.Isolation = append(mv.Isolation, string(l))
			}
			v.Managers = append(v.Managers, mv)
		}
		page.Runners = append(page.Runners, v)
	}
	u.render(w, r, http.StatusOK, "runners", page)
}
