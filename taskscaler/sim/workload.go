package sim

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Job is one CI job of a workload.
type Job struct {
	// Arrival is when the job is queued, from the start of the run.
	Arrival time.Duration
	// Duration is how long it runs once it has a slot.
	Duration time.Duration
	// Tags are a trace's, comma-separated; `berth sim --tag-list` keeps
	// the jobs a runner with those tags would take.
	Tags string
}

// Workloads lists the built-in workloads.
var Workloads = []string{"steady", "workday", "hourly-burst", "spiky", "varied", "scheduled", "pipelines", "random"}

// Thin keeps each job with probability share (0 < share <= 1), drawn from
// seed: a smaller team's traffic of the same shape (a Poisson stream
// thinned is a Poisson stream of that share of the rate; bursts and stages
// keep that share of their jobs on average). It panics on a share outside
// (0, 1].
func Thin(jobs []Job, share float64, seed uint64) []Job {
	if !(share > 0 && share <= 1) {
		panic(fmt.Sprintf("sim: job share %v outside (0, 1]", share))
	}
	if share == 1 {
		return jobs
	}
	r := rand.New(rand.NewPCG(seed, seed^0x2545f4914f6cdd1d))
	return slices.DeleteFunc(jobs, func(Job) bool { return r.Float64() >= share })
}

// Generate returns a built-in workload over horizon, from seed. The run
// starts on a Monday at 00:00 UTC.
//
//	steady        3 jobs/min all day
//	workday       business-hours waves: near nothing at night, a morning
//	              ramp, 8 jobs/min late morning, a lunch dip, 8 jobs/min
//	              in the afternoon, a fade by 19:00; quiet weekends
//	hourly-burst  0.5 jobs/min plus 30 jobs within a minute at the top of
//	              every hour (scheduled pipelines)
//	spiky         1 job/min plus bursts of 10-60 jobs in 2 minutes, about
//	              every 45 minutes at random
//	varied        days that differ (for multi-day runs, --days): each
//	              weekday's business waves are the workday's scaled by a
//	              factor of its own (lognormal, ±30 %), and its hours
//	              shift by up to an hour; a nightly cron burst of 20-80
//	              jobs at 02:00; on a day in three, bursts of 10-30 jobs
//	              at the top of every business hour; one weekday in
//	              five a release spike (triple the rate for 2-4 hours in
//	              the afternoon); weekends near silent but for the cron
//	              burst
//	scheduled     a team's scheduled pipelines over half the workday's
//	              waves: 2-5 schedules drawn from the seed, each every 15,
//	              20, 30 or 60 minutes at an offset of its own (:07, :37,
//	              …) in business hours or all day, or once a day at a
//	              time of its own (weekends too); each fires 5-30 jobs
//	              within a minute (±30 % from one firing to the next) and
//	              is paused on one day in seven; no waves at weekends
//	pipelines     the workday's jobs as CI pipelines: pipelines arrive
//	              at the workday's rate over the mean jobs per pipeline;
//	              each has a build stage of 1-3 jobs (3 minutes), a test
//	              stage of 3-10 (6 minutes) and a deploy stage of 0-2 (2
//	              minutes), and a stage's jobs arrive together (within
//	              2 s) when the last job of the stage before ends
//	random        a team's traffic of its own for each seed, to try the
//	              scaler on many shapes: a peak rate of 0.05-16 jobs/min
//	              (log-uniform) over a day that is flat, business hours,
//	              two peaks, nights or a ramp; job lengths lognormal
//	              with a median of 10 s to 16 minutes (log-uniform) and
//	              a spread of its own (σ 0.3-1.4), one in fifty ten
//	              times longer on a third of seeds, between 1 s and 4 h;
//	              jobs one by one or, on two seeds in five, as
//	              pipelines of three stages; 0-4 schedules (hourly,
//	              every 15 minutes or daily) of 3-40 jobs; and on half
//	              the seeds 2 or 6 bursts a day of 5-40 jobs at random
//	              (`berth sim --workload random --seed N` prints what
//	              the seed drew)
//
// Durations are lognormal around 6 minutes (4 for hourly bursts), between
// 30 s and 1 h, but for random's.
func Generate(name string, horizon time.Duration, seed uint64) ([]Job, error) {
	g := newGen(horizon, seed)
	constant := func(v float64) func(time.Duration) float64 { return func(time.Duration) float64 { return v } }
	switch name {
	case "steady":
		g.poisson(0, horizon, constant(3), 3, 6*time.Minute)
	case "workday":
		g.poisson(0, horizon, workdayRate, workdayPeak, 6*time.Minute)
	case "hourly-burst":
		g.poisson(0, horizon, constant(0.5), 0.5, 6*time.Minute)
		for h := time.Duration(0); h < horizon; h += time.Hour {
			g.burst(h, 30, time.Minute, 4*time.Minute)
		}
	case "spiky":
		g.poisson(0, horizon, constant(1), 1, 6*time.Minute)
		for t := time.Duration(0); ; {
			t += time.Duration(g.r.ExpFloat64() * float64(45*time.Minute))
			if t >= horizon {
				break
			}
			g.burst(t, 10+g.r.IntN(51), 2*time.Minute, 6*time.Minute)
		}
	case "varied":
		g.varied()
	case "scheduled":
		g.scheduled()
	case "pipelines":
		g.pipelines()
	case "random":
		g.random()
	default:
		return nil, fmt.Errorf("unknown workload %q (want %s, or a trace)", name, strings.Join(Workloads, ", "))
	}
	sort.SliceStable(g.jobs, func(i, j int) bool { return g.jobs[i].Arrival < g.jobs[j].Arrival })
	return g.jobs, nil
}

// gen draws a workload's jobs, all before horizon, from r.
type gen struct {
	r       *rand.Rand
	horizon time.Duration
	jobs    []Job
}

func newGen(horizon time.Duration, seed uint64) *gen {
	return &gen{r: rand.New(rand.NewPCG(seed, seed^0x5851f42d4c957f2d)), horizon: horizon}
}

// dur draws a job's duration: lognormal around mean (standard deviation
// two thirds of it), between 30 s and 1 h.
func (g *gen) dur(mean time.Duration) time.Duration {
	m, s := mean.Seconds(), mean.Seconds()*2/3
	sigma2 := math.Log(1 + s*s/(m*m))
	v := math.Exp(math.Log(m) - sigma2/2 + g.r.NormFloat64()*math.Sqrt(sigma2))
	return time.Duration(math.Min(math.Max(v, 30), 3600) * float64(time.Second))
}

// poisson adds a job lasting dur(mean) at each event of events.
func (g *gen) poisson(from, to time.Duration, rate func(time.Duration) float64, peak float64, mean time.Duration) {
	g.poissonOf(from, to, rate, peak, g.around(mean))
}

// poissonOf adds a job lasting dur() at each event of events.
func (g *gen) poissonOf(from, to time.Duration, rate func(time.Duration) float64, peak float64, dur func() time.Duration) {
	g.events(from, to, rate, peak, func(t time.Duration) {
		g.jobs = append(g.jobs, Job{Arrival: t, Duration: dur()})
	})
}

// around is dur(mean) as a draw.
func (g *gen) around(mean time.Duration) func() time.Duration {
	return func() time.Duration { return g.dur(mean) }
}

// events calls add at the events of a Poisson process of rate(t) per
// minute (at most peak) from from to to, by thinning: candidates at the
// peak rate, kept with rate/peak.
func (g *gen) events(from, to time.Duration, rate func(time.Duration) float64, peak float64, add func(time.Duration)) {
	for t := from; ; {
		t += time.Duration(g.r.ExpFloat64() / peak * float64(time.Minute))
		if t >= to || t >= g.horizon {
			return
		}
		if g.r.Float64() < rate(t)/peak {
			add(t)
		}
	}
}

// burst adds n jobs arriving within spread after at, lasting dur(mean).
func (g *gen) burst(at time.Duration, n int, spread, mean time.Duration) {
	g.burstOf(at, n, spread, g.around(mean))
}

// burstOf adds n jobs arriving within spread after at, lasting dur().
func (g *gen) burstOf(at time.Duration, n int, spread time.Duration, dur func() time.Duration) {
	for range n {
		if t := at + time.Duration(g.r.Float64()*float64(spread)); t < g.horizon {
			g.jobs = append(g.jobs, Job{Arrival: t, Duration: dur()})
		}
	}
}

// stage adds a pipeline stage of n jobs arriving at at (within jitter
// after it, when jitter is not 0) and says when its last job ends; false
// once a job would arrive past the horizon (the pipeline ends there).
func (g *gen) stage(at time.Duration, n int, jitter time.Duration, dur func() time.Duration) (time.Duration, bool) {
	end := at
	for range n {
		a := at
		if jitter > 0 {
			a += time.Duration(g.r.Float64() * float64(jitter))
		}
		j := Job{Arrival: a, Duration: dur()}
		if j.Arrival >= g.horizon {
			return end, false
		}
		g.jobs = append(g.jobs, j)
		end = max(end, j.Arrival+j.Duration)
	}
	return end, true
}

// varied is the "varied" workload: days drawn one by one (see Generate).
func (g *gen) varied() {
	r := g.r
	for d := time.Duration(0); d < g.horizon; d += 24 * time.Hour {
		weekend := int(d/(24*time.Hour))%7 >= 5
		// The nightly schedule runs every day.
		g.burst(d+2*time.Hour, 20+r.IntN(61), 2*time.Minute, 5*time.Minute)
		if weekend {
			continue
		}
		scale := math.Exp(r.NormFloat64() * 0.3)
		shift := time.Duration((r.Float64()*2 - 1) * float64(time.Hour))
		release := r.IntN(5) == 0
		relStart := 13*time.Hour + time.Duration(r.IntN(3))*time.Hour
		relLen := 2*time.Hour + time.Duration(r.IntN(3))*time.Hour
		rate := func(t time.Duration) float64 {
			v := workdayRate(d+(t-d-shift)) * scale
			if release && t-d >= relStart && t-d < relStart+relLen {
				v *= 3
			}
			return v
		}
		g.poisson(d, d+24*time.Hour, rate, workdayPeak*scale*3, 6*time.Minute)
		if r.IntN(3) == 0 {
			for h := 8 * time.Hour; h <= 17*time.Hour; h += time.Hour {
				g.burst(d+h, 10+r.IntN(21), time.Minute, 4*time.Minute)
			}
		}
	}
}

// scheduled is the "scheduled" workload (see Generate).
func (g *gen) scheduled() {
	r := g.r
	type schedule struct {
		period, offset time.Duration // period 24h: once a day at offset
		allDay         bool
		size           int
		mean           time.Duration
	}
	var schedules []schedule
	for range 2 + r.IntN(4) {
		periods := [...]time.Duration{15 * time.Minute, 20 * time.Minute, 30 * time.Minute, time.Hour, 24 * time.Hour}
		s := schedule{period: periods[r.IntN(len(periods))], allDay: r.IntN(2) == 0,
			size: 5 + r.IntN(26), mean: time.Duration(3+r.IntN(6)) * time.Minute}
		s.offset = time.Duration(r.Int64N(int64(s.period/time.Minute))) * time.Minute
		s.allDay = s.allDay || s.period == 24*time.Hour // a daily one fires at its time
		schedules = append(schedules, s)
	}
	half := func(t time.Duration) float64 { return workdayRate(t) / 2 }
	for d := time.Duration(0); d < g.horizon; d += 24 * time.Hour {
		weekend := int(d/(24*time.Hour))%7 >= 5
		for _, s := range schedules {
			if r.IntN(7) == 0 {
				continue // paused today
			}
			for at := d + s.offset; at < d+24*time.Hour && at < g.horizon; at += s.period {
				if in := at - d; !s.allDay && (weekend || in < 8*time.Hour || in >= 18*time.Hour) {
					continue
				}
				g.burst(at, int(math.Round(float64(s.size)*(0.7+0.6*r.Float64()))), time.Minute, s.mean)
			}
		}
		if !weekend {
			g.poisson(d, d+24*time.Hour, half, workdayPeak/2, 6*time.Minute)
		}
	}
}

// pipelines is the "pipelines" workload (see Generate).
func (g *gen) pipelines() {
	stages := [...]struct {
		min, max int
		mean     time.Duration
	}{{1, 3, 3 * time.Minute}, {3, 10, 6 * time.Minute}, {0, 2, 2 * time.Minute}}
	perPipeline := 0.0
	for _, st := range stages {
		perPipeline += float64(st.min+st.max) / 2
	}
	rate := func(t time.Duration) float64 { return workdayRate(t) / perPipeline }
	g.events(0, g.horizon, rate, workdayPeak/perPipeline, func(at time.Duration) {
		for _, st := range stages {
			var ok bool
			if at, ok = g.stage(at, st.min+g.r.IntN(st.max-st.min+1), 2*time.Second, g.around(st.mean)); !ok {
				return
			}
		}
	})
}

// Describe says what the seed drew for a workload drawn from it ("" for
// the others): for random, the team's traffic.
func Describe(name string, seed uint64) string {
	if name != "random" {
		return ""
	}
	return drawTeam(newGen(0, seed).r).String()
}

// random is the "random" workload (see Generate); Describe says what a
// seed drew.
func (g *gen) random() {
	t := drawTeam(g.r)
	dur := func() time.Duration {
		d := t.median * math.Exp(g.r.NormFloat64()*t.sigma)
		if t.tail && g.r.IntN(50) == 0 {
			d *= 10
		}
		return time.Duration(min(max(d, 1), 4*3600) * float64(time.Second))
	}
	rate := func(at time.Duration) float64 { return t.base * t.shape(at) }
	if t.pipelines {
		// Stages of 1-3, 2-8 and 0-2 jobs: 8 a pipeline on average.
		const perPipeline = 8.0
		g.events(0, g.horizon, func(at time.Duration) float64 { return rate(at) / perPipeline }, t.base/perPipeline, func(at time.Duration) {
			for _, n := range [...]int{1 + g.r.IntN(3), 2 + g.r.IntN(7), g.r.IntN(3)} {
				var ok bool
				if at, ok = g.stage(at, n, 0, dur); !ok {
					return
				}
			}
		})
	} else {
		g.poissonOf(0, g.horizon, rate, t.base, dur)
	}
	for d := time.Duration(0); d < g.horizon; d += 24 * time.Hour {
		for _, c := range t.schedules {
			for at := d + c.offset; at < d+24*time.Hour; at += c.period {
				g.burstOf(at, c.size, 20*time.Second, dur)
			}
		}
		for range t.bursts {
			g.burstOf(d+time.Duration(g.r.Int64N(int64(24*time.Hour))), 5+g.r.IntN(36), 30*time.Second, dur)
		}
	}
}

// team is what a seed of the random workload drew.
type team struct {
	base          float64 // jobs per minute at the day's peak
	day           int     // index into teamDays
	median, sigma float64 // job length: seconds, lognormal σ
	tail          bool
	pipelines     bool
	schedules     []teamSchedule
	bursts        int // at random, a day
}

type teamSchedule struct {
	period, offset time.Duration
	size           int
}

var teamDays = [...]string{"flat", "business hours", "two peaks", "nights", "ramp"}

func drawTeam(r *rand.Rand) team {
	t := team{base: math.Pow(10, -1.3+2.5*r.Float64()), day: r.IntN(len(teamDays)),
		median: math.Pow(10, 1+2*r.Float64()), sigma: 0.3 + 1.1*r.Float64(),
		tail: r.IntN(3) == 0, pipelines: r.IntN(5) < 2, bursts: [...]int{0, 0, 2, 6}[r.IntN(4)]}
	for range [...]int{0, 0, 1, 2, 4}[r.IntN(5)] {
		c := teamSchedule{size: 3 + r.IntN(38)}
		switch r.IntN(3) {
		case 0:
			c.period, c.offset = time.Hour, time.Duration(r.IntN(60))*time.Minute
		case 1:
			c.period, c.offset = 15*time.Minute, time.Duration(r.IntN(15))*time.Minute
		default:
			c.period, c.offset = 24*time.Hour, time.Duration(r.IntN(24*60))*time.Minute
		}
		t.schedules = append(t.schedules, c)
	}
	return t
}

// shape is the share of the peak rate at t from Monday 00:00.
func (t team) shape(at time.Duration) float64 {
	h := (at % (24 * time.Hour)).Hours()
	switch teamDays[t.day] {
	case "business hours":
		if h >= 8 && h < 18 {
			return 1
		}
		return 0.08
	case "two peaks":
		return min(1, 0.1+math.Exp(-math.Pow((h-10)/1.5, 2))+math.Exp(-math.Pow((h-15)/1.5, 2)))
	case "nights":
		if h < 6 || h >= 22 {
			return 1
		}
		return 0.2
	case "ramp":
		return 0.1 + 0.9*h/24
	}
	return 1
}

func (t team) String() string {
	s := fmt.Sprintf("%.2f jobs/min at peak, %s; jobs %s median, σ %.1f", t.base, teamDays[t.day], time.Duration(t.median*float64(time.Second)).Round(time.Second), t.sigma)
	if t.tail {
		s += ", 2 % ten times longer"
	}
	if t.pipelines {
		s += ", as pipelines"
	}
	for _, c := range t.schedules {
		switch m := int(c.offset / time.Minute); c.period {
		case 24 * time.Hour:
			s += fmt.Sprintf("; %d jobs daily at %02d:%02d", c.size, m/60, m%60)
		case time.Hour:
			s += fmt.Sprintf("; %d jobs hourly at :%02d", c.size, m)
		default:
			s += fmt.Sprintf("; %d jobs every %d minutes from :%02d", c.size, int(c.period/time.Minute), m)
		}
	}
	if t.bursts > 0 {
		s += fmt.Sprintf("; %d bursts a day at random", t.bursts)
	}
	return s
}

// workdayPeak is the most jobs per minute workdayRate gives.
const workdayPeak = 8

// workdayRate is jobs per minute at t from Monday 00:00: hourly levels
// interpolated linearly, weekends at the night level.
func workdayRate(t time.Duration) float64 {
	levels := [24]float64{
		0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.1, 1, // 00-07
		4, 7, 8, 8, 5, 7, 8, 8, // 08-15
		7, 4, 1.5, 0.5, 0.2, 0.1, 0.05, 0.05, // 16-23
	}
	day := int(t / (24 * time.Hour))
	if day%7 >= 5 {
		return 0.05
	}
	h := math.Mod(t.Hours(), 24)
	i := int(h)
	f := h - float64(i)
	return levels[i]*(1-f) + levels[(i+1)%24]*f
}

// ErrTrace is wrapped by every trace parse error.
var ErrTrace = errors.New("trace")

// Trace is a trace's jobs, and how many of its records were left out
// (jobs of GitLab's jobs API that never started or have not finished).
type Trace struct {
	Jobs    []Job
	LeftOut int
}

// ReadTrace reads a trace of jobs, returned sorted by arrival. A trace
// whose first character (after white space) is [ or { is JSON from
// GitLab's jobs API (parseAPITrace). Else it is CSV: one job per line,
// "arrival_seconds,duration_seconds[,tags]" with decimal seconds. A first
// line that does not start with a number is a header; empty lines and
// lines starting with # are skipped. Arrivals need not be sorted. Tags
// may contain commas (the rest of the line).
func ReadTrace(r io.Reader) (Trace, error) {
	br := bufio.NewReader(r)
	if bom, _ := br.Peek(3); string(bom) == "\ufeff" {
		_, _ = br.Discard(3) // a byte order mark, as spreadsheets write
	}
	firstLine := 1 // the number of the first line the CSV reader sees
	for {
		b, err := br.ReadByte()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return Trace{}, fmt.Errorf("%w: %v", ErrTrace, err)
		}
		if b == ' ' || b == '\t' || b == '\r' || b == '\n' {
			if b == '\n' {
				firstLine++
			}
			continue
		}
		if err := br.UnreadByte(); err != nil {
			return Trace{}, fmt.Errorf("%w: %v", ErrTrace, err)
		}
		if b == '[' || b == '{' {
			return parseAPITrace(br, b)
		}
		break
	}
	sc := bufio.NewScanner(br)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	var jobs []Job
	for n, first := firstLine, true; sc.Scan(); n, first = n+1, false {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.SplitN(line, ",", 3)
		if first {
			if _, err := strconv.ParseFloat(strings.TrimSpace(fields[0]), 64); err != nil {
				continue // header
			}
		}
		if len(fields) < 2 {
			return Trace{}, fmt.Errorf("%w: line %d: want arrival_seconds,duration_seconds[,tags]", ErrTrace, n)
		}
		arr, err := seconds(fields[0])
		if err != nil {
			return Trace{}, fmt.Errorf("%w: line %d: arrival: %v", ErrTrace, n, err)
		}
		d, err := seconds(fields[1])
		if err != nil {
			return Trace{}, fmt.Errorf("%w: line %d: duration: %v", ErrTrace, n, err)
		}
		j := Job{Arrival: arr, Duration: d}
		if len(fields) == 3 {
			j.Tags = strings.TrimSpace(fields[2])
		}
		jobs = append(jobs, j)
	}
	if err := sc.Err(); err != nil {
		return Trace{}, fmt.Errorf("%w: %v", ErrTrace, err)
	}
	sort.SliceStable(jobs, func(i, j int) bool { return jobs[i].Arrival < jobs[j].Arrival })
	return Trace{Jobs: jobs}, nil
}

// maxSeconds bounds trace times to 10 years, far from overflow.
const maxSeconds = 10 * 365 * 24 * 3600

func seconds(s string) (time.Duration, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a number of seconds", s)
	}
	if !(v >= 0 && v <= maxSeconds) {
		return 0, fmt.Errorf("%q is outside 0 to %d seconds", s, maxSeconds)
	}
	return time.Duration(v * float64(time.Second)), nil
}
