package webui

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
)

// fleetStale: a fleet report older than this is shown as stale and left
// out of the totals (its manager reports every 15 s).
const fleetStale = 2 * time.Minute

type fleetRow struct {
	Runner   *store.Runner
	Manager  *store.RunnerManager
	Fleet    runnerapi.Fleet
	Stale    bool
	Reported time.Time
}

type fleetTotals struct {
	Instances, SlotsInUse, SlotsIdle, Slots, Waiting int
	Boots, Deletions                                 int64
	InstanceSeconds                                  float64
}

type queueRow struct {
	Tags   []string
	Queued int
	Oldest time.Duration
}

type fleetPage struct {
	pageBase
	Rows    []fleetRow
	Totals  fleetTotals
	Queue   []queueRow
	Queued  int
	Waiting int
	Charts  []chartView
}

// fleetRows reads every runner manager's last fleet report.
func (u *UI) fleetRows(ctx context.Context) ([]fleetRow, fleetTotals, error) {
	ms, err := u.st.ListRunnerManagers(ctx, 0)
	if err != nil {
		return nil, fleetTotals{}, err
	}
	var (
		rows []fleetRow
		tot  fleetTotals
	)
	runners := map[int64]*store.Runner{}
	now := u.clock.Now()
	for _, m := range ms {
		if len(m.Fleet) == 0 {
			continue
		}
		row := fleetRow{Manager: m, Reported: m.FleetReportedAt, Stale: now.Sub(m.FleetReportedAt) > fleetStale}
		if err := json.Unmarshal(m.Fleet, &row.Fleet); err != nil {
			continue
		}
		rn, ok := runners[m.RunnerID]
		if !ok {
			if rn, err = u.st.GetRunner(ctx, m.RunnerID); err != nil {
				rn = nil
			}
			runners[m.RunnerID] = rn
		}
		row.Runner = rn
		if !row.Stale {
			f := &row.Fleet
			tot.Instances += f.Instances()
			tot.SlotsInUse += f.SlotsInUse
			tot.SlotsIdle += f.SlotsIdle
			tot.Slots += f.Ready * max(1, f.Capacity)
			tot.Waiting += f.Waiting
		}
		// Totals since start count whatever the report's age.
		tot.Boots += row.Fleet.Boots
		tot.Deletions += row.Fleet.Deletions
		tot.InstanceSeconds += row.Fleet.InstanceSeconds
		rows = append(rows, row)
	}
	return rows, tot, nil
}

func (u *UI) queueRows() ([]queueRow, int) {
	stats := u.opts.Dispatch.Queue().Stats(u.clock.Now(), nil)
	var rows []queueRow
	total := 0
	for _, s := range stats {
		rows = append(rows, queueRow{Tags: s.Tags, Queued: s.Queued, Oldest: s.OldestWait})
		total += s.Queued
	}
	return rows, total
}

func (u *UI) handleFleet(w http.ResponseWriter, r *http.Request) {
	rows, tot, err := u.fleetRows(r.Context())
	if err != nil {
		u.internal(w, r, "reading fleets", err)
		return
	}
	page := &fleetPage{pageBase: pageBase{Title: "Fleet", Nav: "fleet"}, Rows: rows, Totals: tot}
	page.Queue, page.Queued = u.queueRows()
	page.Waiting = u.opts.Dispatch.Queue().Waiting()
	page.Charts = u.charts.views(u.cfg.RefreshInterval)
	u.render(w, r, http.StatusOK, "fleet", page)
}

// sample records one point of each chart.
func (u *UI) sample(ctx context.Context) {
	_, queued := u.queueRows()
	var oldest time.Duration
	for _, s := range u.opts.Dispatch.Queue().Stats(u.clock.Now(), nil) {
		oldest = max(oldest, s.OldestWait)
	}
	_, tot, err := u.fleetRows(ctx)
	if err != nil {
		u.log.Warn("sampling the fleet for the charts", "err", err)
	}
	u.charts.add(u.clock.Now(), map[string]float64{
		"queued":       float64(queued),
		"oldest":       oldest.Seconds(),
		"instances":    float64(tot.Instances),
		"slots_in_use": float64(tot.SlotsInUse),
	})
}

// charts keep the last points of a few series, in memory: each replica
// draws what it saw since it started.
type charts struct {
	mu     sync.Mutex
	size   int
	times  []time.Time
	series map[string][]float64
}

var chartDefs = []struct{ key, title, unit string }{
	{"queued", "Jobs waiting in the queue", "jobs"},
	{"oldest", "Oldest wait in the queue", "s"},
	{"instances", "Instances in the fleets", "instances"},
	{"slots_in_use", "Job slots in use", "slots"},
}

func newCharts(size int) *charts { return &charts{size: size, series: map[string][]float64{}} }

func (c *charts) add(t time.Time, values map[string]float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.times = append(c.times, t)
	if len(c.times) > c.size {
		c.times = c.times[1:]
	}
	for _, d := range chartDefs {
		s := append(c.series[d.key], values[d.key])
		if len(s) > c.size {
			s = s[1:]
		}
		c.series[d.key] = s
	}
}

// chartView is one chart drawn as an SVG polyline, with its figures in
// words for those who do not see it.
type chartView struct {
	Title, Unit   string
	Points        string
	Area          string
	Width, Height int
	Last, Max     float64
	Span          string
	Summary       string
	HasData       bool
}

func (c *charts) views(interval time.Duration) []chartView {
	c.mu.Lock()
	defer c.mu.Unlock()
	const w, h = 300, 64
	var out []chartView
	for _, d := range chartDefs {
		s := c.series[d.key]
		v := chartView{Title: d.title, Unit: d.unit, Width: w, Height: h, HasData: len(s) > 0}
		if len(s) > 0 {
			v.Last = s[len(s)-1]
			for _, x := range s {
				v.Max = math.Max(v.Max, x)
			}
			top := math.Max(v.Max, 1)
			var pts []string
			for i, x := range s {
				px := float64(w)
				if c.size > 1 {
					px = float64(w) * float64(c.size-len(s)+i) / float64(c.size-1)
				}
				py := float64(h-2) - (x/top)*float64(h-6)
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px, py))
			}
			v.Points = strings.Join(pts, " ")
			first := strings.SplitN(pts[0], ",", 2)[0]
			v.Area = fmt.Sprintf("%s,%d %s %d,%d", first, h, v.Points, w, h)
			v.Span = formatDuration(time.Duration(len(s)) * interval)
			v.Summary = fmt.Sprintf("%s: now %s, at most %s %s over the last %s.", d.title, trimFloat(v.Last), trimFloat(v.Max), d.unit, v.Span)
		} else {
			v.Summary = d.title + ": no samples yet."
		}
		out = append(out, v)
	}
	return out
}

func trimFloat(f float64) string {
	if f == math.Trunc(f) {
		return fmt.Sprintf("%.0f", f)
	}
	return fmt.Sprintf("%.1f", f)
}
