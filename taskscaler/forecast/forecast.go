// Package forecast is the autoscaler's model of demand: what it learns from
// the slots it was asked for, minute by minute, to provision before jobs
// arrive.
//
// The model is small and explainable. Demand is the scaler's own figure —
// slots held by jobs, plus reservations, plus the jobs it knows are waiting
// (refused reservations or the coordinator's queue insight) — and the model
// keeps the peak of each wall-clock minute. It learns two profiles of those
// peaks, each an exponentially weighted average so that recent days count
// most:
//
//	daily   1,440 bins, one per minute of the day: "as on recent days"
//	weekly 10,080 bins, one per minute of the week: "as a week ago"
//
// Of the two experts, the one whose recent absolute error is lower speaks
// (the weekly one on a tie, once it has seen that minute), so a workday
// pattern is followed after one day and weekends are told from weekdays
// after one week.
//
// A third, "hourly", watches the last two hours for the schedules of the
// day itself: a rise at the same place in each of the last two 15, 20, 30
// or 60 minutes (pipelines scheduled */15, */20, */30 or hourly, on a day
// that did not have them before) is expected at that place in the next
// one too, by the larger of the two. It speaks for a minute when it
// expects more than the profile's expert does.
//
// A prediction takes its level from now and its shape from history:
//
//	expected = max(demand now, last minute's peak + rise) + spare + consumed
//	rise     = the largest increase the profile (or the last two hours)
//	           shows from the last minute to a minute within the horizon,
//	           when it stands out of the noise (two standard deviations of
//	           a Poisson count), or is a lone job that came at that minute
//	           after a quiet one on each of the last three days
//	spare    = what arrivals and departures during the horizon can add:
//	           the jobs arriving that still hold their slot at its end
//	           and the jobs of now gone by then, two Poisson counts of
//	           λ·E[min(hold, horizon)] (the M/G/∞ queue; hold times of
//	           the last 256 jobs, the horizon until 16 have ended), and
//	           the 95 % quantile of the largest of the horizon ÷
//	           E[min(hold, horizon)] such moves, as short jobs renew
//	           demand within it (1.65 standard deviations when jobs
//	           outlast it), rounded; λ from the arrivals of the last
//	           idle_time (counted in whole minutes, at least one), and
//	           none once idle_time has passed without an arrival; with
//	           the measured spare (SetSpare), the spare that would have
//	           let 99 % of the jobs of the last 128 minutes with arrivals
//	           start at once, given the forecast's own misses, when that
//	           is more
//	consumed = the slots jobs ending within the horizon take with them
//	           (their instance takes no more jobs: max_use_count), from
//	           the rate of such endings over the same window, at most the
//	           arrival rate
//
// So a burst seen at this time before (a 02:00 schedule, the top of every
// hour on recent days or in the last two hours, a morning ramp) is
// provisioned a boot ahead, while a day busier or quieter than the profile
// is followed from its own demand, not yesterday's level. A rise that does
// not come costs the capacity made for it until it leaves the horizon: at
// most a boot, a deletion and a minute.
//
// The model also measures the fleet's own boot latency (request to ready)
// and deletion latency: prediction looks ahead by them, not by a configured
// guess. And it counts the gaps between jobs' requests over each day
// (GapDay): traffic whose jobs often come more than idle_time apart finds
// the spare gone, and the scaler says which idle_time would hold for it.
//
// Its size is fixed (96 KiB in memory, 72 KiB on disk); it is saved
// beside the scaler's ledger and loaded at start.
package forecast

import (
	"math"
	"slices"
	"time"
)

// Bins of the profiles.
const (
	MinutesPerDay  = 24 * 60
	MinutesPerWeek = 7 * MinutesPerDay
)

// DefaultBootLatency is the look-ahead before the fleet's first measured
// boot.
const DefaultBootLatency = time.Minute

// latencies kept for the boot and deletion estimates.
const latencySamples = 16

// alpha is the weight of the newest day (week) in a profile bin: yesterday
// counts half, the day before a quarter, …
const alpha = 0.5

// errorWindow is the time constant of the experts' error averages, in
// minutes.
const errorWindow = 60

// Bin is one minute of a profile: the weighted average of the peak demand
// seen in that minute, and how many days (weeks) have been seen (capped).
type Bin struct {
	Mean float32
	N    uint16
}

func (b *Bin) add(x float64) {
	if b.N == 0 {
		b.Mean = float32(x)
	} else {
		b.Mean = float32(alpha*x + (1-alpha)*float64(b.Mean))
	}
	if b.N < math.MaxUint16 {
		b.N++
	}
}

// Model is the demand model. It is not safe for concurrent use: the scaler
// calls it under its lock.
type Model struct {
	loc    *time.Location
	window time.Duration // arrival rate's averaging window

	daily  [MinutesPerDay]Bin
	weekly [MinutesPerWeek]Bin

	// The minute being observed (Unix minute), its peak demand so far and
	// the jobs that arrived in it.
	minute   int64
	peak     int
	arrivals int
	// consumed counts the jobs of the minute that ended without giving
	// their slot back (Consumed).
	consumed int
	started  bool
	// lastArrival is when the last job arrived: the rate is counted in
	// whole minutes, learned after they end, so it outlives a window
	// shorter than a minute (or ending within one); no arrival for a
	// window means no spare whatever it says.
	lastArrival time.Time

	// Mean absolute errors of the two experts over recent minutes where
	// both had an opinion.
	errDaily, errWeekly float64
	// riseSkill is how much of what the profiles' rises expected came
	// lately today (RiseSkill): 1 at the first minute learned of each day.
	riseSkill float64
	// streak counts, for each minute of the day, the days running on
	// which demand rose in it out of its noise (to 255).
	streak [MinutesPerDay]uint8
	// recent holds the arrivals of the last minutes learned (a ring of
	// maxWindow); rate is their mean over the window, computed as each
	// minute is learned (a decision reads it every second).
	recent [maxWindow]uint32
	rate   float64
	// recentConsumed and consumedRate are the same for jobs that ended
	// and took their slot with them.
	recentConsumed [maxWindow]uint32
	consumedRate   float64
	// The last minute learned: its Unix minute, its peak, and what each
	// profile held for it before it was folded in (-1: nothing).
	lastMinute                      int64
	lastPeak, lastDaily, lastWeekly float64

	// The peaks of the last minutes learned, by Unix minute modulo
	// recentPeaks (peakAt tells which minute a slot holds): the hourly
	// expert's memory.
	recentPeak [recentPeaks]float32
	peakAt     [recentPeaks]int64

	boots   []float64 // seconds, last latencySamples
	deletes []float64
	// bootP90 and deleteP90 are their 90th percentiles, computed when a
	// sample comes (a decision reads them every second).
	bootP90, deleteP90 time.Duration

	// The forecast's misses of the last minutes learned with jobs
	// arriving (a ring of missMinutes; nMisses counts them, kept under
	// twice that), whatever the spare in use: switching to the measured
	// spare finds them.
	measured bool
	misses   [missMinutes]miss
	nMisses  int
	// missSpare is the measured spare of a minute, in slots, computed as
	// each minute is learned (0 until minMisses were recorded).
	missSpare float64

	// The gaps before each request of the day since gapFrom, in whole
	// minutes (the last counts maxGapMinutes and longer), and how many
	// came after a gap of the window or more: once idle_time passed
	// without an arrival the spare is gone, and such a job waits for a
	// boot unless a floor holds capacity (GapAdvice). Not saved: a day's
	// diagnosis, begun anew after a restart.
	gaps      [maxGapMinutes + 1]uint32
	gapJobs   uint32
	gapMissed uint32
	gapFrom   time.Time
	// lastRequest is when the last job asked for a slot (Requested).
	lastRequest time.Time

	// holds are how long the last jobs held their slot (Held), in
	// seconds: a ring of holdSamples, nHolds counting them (kept under
	// twice that). Not saved: what they shape, the spare, starts afresh
	// after a restart.
	holds  [holdSamples]float32
	nHolds int
	// terms are what the spare takes from them for the create and keep
	// horizons (spareTerm), worked out again as each minute is learned
	// (a decision reads them every second).
	terms [2]spareTerm
}

// spareTerm is, for a horizon of minutes, E[min(hold, horizon)] in
// minutes (held) and the quantile the spare takes for it (z); ok once
// worked out.
type spareTerm struct {
	ok               bool
	minutes, held, z float64
}

// The hold times' memory: the spare follows the last holdSamples jobs,
// once minHolds of them have ended.
const (
	holdSamples = 256
	minHolds    = 16
)

// maxGapMinutes is the longest idle_time GapAdvice suggests.
const maxGapMinutes = 60

// miss is how far one minute's peak demand went beyond what the model
// expected of it at the end of the minute before (that minute's peak and
// the rise an expert expected: the fleet keeps about the last peak's
// capacity, as idle instances go only beyond what the horizon needs), in
// slots; negative when it stayed below.
// Arrivals are the jobs that got a slot in it: a miss counts for each job
// it concerned.
type miss struct {
	Slots    float32
	Arrivals float32
}

// The measured spare's memory, and the share of the jobs it remembers
// that it would have left waiting: 1 %, a margin under the 5 % a p95 wait
// allows, as a job beyond the spare waits a boot and so may the next
// minute's (measured with berth sim --workload pipelines, seeds 1 and 2:
// 5 % waits 15-17 s at p95, 2.5 % 7-8 s, 1 % none).
const (
	missMinutes = 128
	minMisses   = 20
	missWaiting = 0.01
)

// Spare is how the spare is sized.
type Spare int

const (
	// SparePoisson is 1.65 standard deviations of the Poisson counts of
	// the horizon's arrivals and departures (the default).
	SparePoisson Spare = iota
	// SpareMeasured is the smallest spare that would have let 99 % of the
	// jobs of the last missMinutes minutes with arrivals start at once,
	// given the forecast's own misses in those minutes (for a horizon of
	// h > 1 minutes, √h times it), when that is more than the Poisson spare:
	// jobs that arrive together (a pipeline's stage) are covered as they
	// come, at the price of a larger spare.
	SpareMeasured
)

// periods are the hourly expert's, in minutes: a rise seen at the same
// place in each of the last two of one of them is expected at that place
// in the next. They are the steps of cron schedules that divide an hour
// (*/15, */20, */30) and the hour; the others repeat hourly too, and are
// caught after two hours.
var periods = [...]int64{15, 20, 30, 60}

// recentPeaks is how many minutes' peaks are kept: two of the longest
// period back from the minute before now, with room for the horizon.
const recentPeaks = 128

// New returns an empty model whose minutes are wall-clock minutes in loc
// (nil: UTC).
func New(loc *time.Location) *Model {
	if loc == nil {
		loc = time.UTC
	}
	m := &Model{loc: loc, riseSkill: 1}
	m.SetWindow(0)
	return m
}

// maxWindow bounds the arrival rate's window, in minutes.
const maxWindow = 60

func ring(minute int64) int { return int((minute%maxWindow + maxWindow) % maxWindow) }

func (m *Model) windowMinutes() int {
	return min(maxWindow, max(1, int(m.window/time.Minute)))
}

// SetWindow sets how long the arrival rate is averaged over (the active
// policy's idle_time; ≤ 0: 5m).
func (m *Model) SetWindow(window time.Duration) {
	if window <= 0 {
		window = 5 * time.Minute
	}
	m.window = window
}

// Window is how long the arrival rate is averaged over, and how long the
// spare outlives the last arrival.
func (m *Model) Window() time.Duration { return m.window }

// bins returns the daily and weekly bin of the Unix minute u.
func (m *Model) bins(u int64) (day, week int) {
	t := time.Unix(u*60, 0).In(m.loc)
	day = t.Hour()*60 + t.Minute()
	wd := (int(t.Weekday()) + 6) % 7 // Monday 0
	return day, wd*MinutesPerDay + day
}

// Observe records the demand (slots) seen at now. Call it on every
// decision; a minute is learned when the first observation of a later
// minute arrives. Minutes without observations (the scaler was stopped)
// are not learned.
func (m *Model) Observe(now time.Time, demand int) {
	u := unixMinute(now)
	switch {
	case !m.started:
		m.started, m.minute, m.peak = true, u, demand
	case u == m.minute:
		m.peak = max(m.peak, demand)
	case u > m.minute:
		m.learn(m.minute, float64(m.peak), float64(m.arrivals), float64(m.consumed))
		m.minute, m.peak, m.arrivals, m.consumed = u, demand, 0, 0
	default:
		// The clock went back: keep the later minute.
		m.peak = max(m.peak, demand)
	}
}

// Consumed counts a job that ended without giving its slot back: its
// instance can take no more jobs (max_use_count reached, or leaving).
// The free slots the next jobs need are then not only the rise of demand
// but the slots such jobs take with them (Prediction.Consumed).
func (m *Model) Consumed() { m.consumed++ }

// Arrived counts a job that got a slot at now.
func (m *Model) Arrived(now time.Time) {
	m.arrivals++
	if now.After(m.lastArrival) {
		m.lastArrival = now
	}
}

// Held records how long a job held its slot, acquisition to release:
// demand within a horizon moves by the arrivals that are still there at
// its end and the jobs that have gone by then, and jobs shorter than the
// horizon move it less than jobs that outlast it (Prediction.Spare).
func (m *Model) Held(d time.Duration) {
	if d >= 0 {
		m.holds[m.nHolds%holdSamples] = float32(d.Seconds())
		m.nHolds++
		if m.nHolds == 2*holdSamples {
			m.nHolds = holdSamples
		}
	}
}

// spareTerm is E[min(hold, horizon)] and its zMax for horizon i, worked
// out again only when the horizon changed or a minute was learned.
func (m *Model) spareTerm(i int, minutes float64) spareTerm {
	t := &m.terms[i]
	if !t.ok || t.minutes != minutes {
		*t = spareTerm{ok: true, minutes: minutes, held: m.heldWithin(minutes)}
		if t.held > 0 {
			t.z = zMax(minutes / t.held)
		}
	}
	return *t
}

// heldWithin is how long, on average, a job holds its slot within a
// horizon of the given minutes (the mean of min(hold, horizon)), in
// minutes: the horizon itself while too few jobs have ended to tell.
func (m *Model) heldWithin(minutes float64) float64 {
	n := min(m.nHolds, holdSamples)
	if n < minHolds {
		return minutes
	}
	limit, sum := minutes*60, 0.0
	for _, v := range m.holds[:n] {
		sum += min(float64(v), limit)
	}
	return sum / float64(n) / 60
}

// Requested counts a job that asked for a slot at now (it may get one
// later): the gap since the one before is what GapDay diagnoses.
func (m *Model) Requested(now time.Time) {
	if !m.lastRequest.IsZero() && now.After(m.lastRequest) {
		if m.gapFrom.IsZero() {
			m.gapFrom = now
		}
		gap := now.Sub(m.lastRequest)
		m.gaps[min(maxGapMinutes, int(gap/time.Minute))]++
		m.gapJobs++
		if gap >= m.window {
			m.gapMissed++
		}
	}
	if now.After(m.lastRequest) {
		m.lastRequest = now
	}
}

// GapAdvice is a day's diagnosis of the gaps between requests (GapDay).
type GapAdvice struct {
	// Jobs is how many requests it counted; Missed how many came after a
	// gap of idle_time or more (the forecast's window), which the spare
	// had stopped waiting for, and Long how many after an hour or more.
	Jobs, Missed, Long int
	// IdleTime is the shortest idle_time, in whole minutes up to an
	// hour, after which at most 1 % of the day's jobs came, not counting
	// those after an hour or more (no idle_time holds for them, a floor
	// does): the measured spare's margin under the 5 % a p95 wait allows.
	IdleTime time.Duration
}

// GapDay returns the diagnosis of the day of requests that ended at now,
// and begins the next; ok is false until a day has passed since the first
// gap counted.
func (m *Model) GapDay(now time.Time) (a GapAdvice, ok bool) {
	if m.gapFrom.IsZero() || now.Sub(m.gapFrom) < 24*time.Hour {
		return GapAdvice{}, false
	}
	a.Jobs, a.Missed, a.Long = int(m.gapJobs), int(m.gapMissed), int(m.gaps[maxGapMinutes])
	longer := a.Jobs - int(m.gaps[0]) // jobs after a gap of k minutes or more
	for k := 1; k <= maxGapMinutes; k++ {
		if float64(longer-a.Long) <= missWaiting*float64(a.Jobs) {
			a.IdleTime = time.Duration(k) * time.Minute
			break
		}
		longer -= int(m.gaps[k])
	}
	m.gaps, m.gapJobs, m.gapMissed, m.gapFrom = [maxGapMinutes + 1]uint32{}, 0, 0, time.Time{}
	return a, true
}

func unixMinute(t time.Time) int64 {
	s := t.Unix()
	if s < 0 {
		return (s - 59) / 60
	}
	return s / 60
}

// learn folds the peak x, the arrivals n and the jobs that took their
// slot with them c of minute u into the model.
func (m *Model) learn(u int64, x, n, c float64) {
	next := m.lastMinute == u-1
	var profile float64 // the profiles' rise for u, heeded or not
	var expert string
	if next {
		profile, expert = m.profileRise(u)
	}
	if next && m.rate > 0 {
		rise, _ := m.heed(u, profile, expert)
		m.noteMiss(miss{Slots: float32(x - m.lastPeak - rise), Arrivals: float32(n)})
	}
	db, wb := m.bins(u)
	if m.lastMinute < u-int64(db) {
		m.riseSkill = 1 // the first minute learned of a day: judged afresh
	}
	if next {
		// Judge the profiles' rise for u, heeded or not (so that they are
		// heeded again once their rises come), and count the days running
		// that demand rose at this minute.
		if profile > 0 {
			came := min(max((x-m.lastPeak)/profile, 0), 1)
			m.riseSkill += skillWeight * (came - m.riseSkill)
		}
		if rose(x-m.lastPeak, m.lastPeak) {
			m.streak[db] = min(m.streak[db], math.MaxUint8-1) + 1
		} else {
			m.streak[db] = 0
		}
	}
	d, w := &m.daily[db], &m.weekly[wb]
	if d.N > 0 && w.N > 0 {
		a := 1 - math.Exp(-1.0/errorWindow)
		m.errDaily += a * (math.Abs(float64(d.Mean)-x) - m.errDaily)
		m.errWeekly += a * (math.Abs(float64(w.Mean)-x) - m.errWeekly)
	}
	// The rate: arrivals of the last window's minutes (a minute without
	// observations counts none), so it is 0 once a window passed without
	// a job.
	for v := m.lastMinute + 1; m.lastMinute > 0 && v < u && v <= m.lastMinute+maxWindow; v++ {
		m.recent[ring(v)], m.recentConsumed[ring(v)] = 0, 0
	}
	m.recent[ring(u)] = uint32(min(n, math.MaxUint32))
	m.recentConsumed[ring(u)] = uint32(min(c, math.MaxUint32))
	if u > 0 {
		m.recentPeak[u%recentPeaks], m.peakAt[u%recentPeaks] = float32(x), u
	}
	win := m.windowMinutes()
	sum, gone := 0.0, 0.0
	for k := range int64(win) {
		sum += float64(m.recent[ring(u-k)])
		gone += float64(m.recentConsumed[ring(u-k)])
	}
	m.rate, m.consumedRate = sum/float64(win), gone/float64(win)
	m.terms = [2]spareTerm{} // the hold times of the minute count from now
	m.lastMinute, m.lastPeak, m.lastDaily, m.lastWeekly = u, x, -1, -1
	if d.N > 0 {
		m.lastDaily = float64(d.Mean)
	}
	if w.N > 0 {
		m.lastWeekly = float64(w.Mean)
	}
	d.add(x)
	w.add(x)
}

// expert is what the profile that speaks for minute u holds for it, and
// its base: what it held for the last minute learned, or that minute's
// peak if it had not seen that minute (the first day's last minute before
// the second day's first). The weekly profile speaks when it knows u and
// has erred no more than the daily one lately; "" when neither knows u.
func (m *Model) expert(u int64) (then, base float64, name string) {
	db, wb := m.bins(u)
	orPeak := func(v float64) float64 {
		if v < 0 {
			return m.lastPeak
		}
		return v
	}
	if w := m.weekly[wb]; w.N > 0 && m.errWeekly <= m.errDaily {
		return float64(w.Mean), orPeak(m.lastWeekly), "weekly"
	}
	if d := m.daily[db]; d.N > 0 {
		return float64(d.Mean), orPeak(m.lastDaily), "daily"
	}
	return 0, 0, ""
}

// riseAt is the rise from the last minute learned to minute u that an
// expert expects and who: the profile's when it stands out of its noise,
// the last periods' when that is larger; 0 when none.
func (m *Model) riseAt(u int64) (float64, string) {
	rise, e := m.profileRise(u)
	return m.heed(u, rise, e)
}

// heed is what riseAt makes of the profiles' rise for u (from expert e):
// not heeded while the day's skill is under minSkill and the rise did not
// come at that minute on each of the last three days; the hourly expert's
// when larger.
func (m *Model) heed(u int64, rise float64, e string) (float64, string) {
	if rise > 0 && m.riseSkill < minSkill {
		if db, _ := m.bins(u); m.streak[db] < 3 {
			rise, e = 0, ""
		}
	}
	if h := m.hourlyRise(u); h > rise {
		rise, e = h, "hourly"
	}
	return rise, e
}

// profileRise is the rise from the last minute learned to minute u that
// the profile that speaks for u expects, if it stands out of its noise
// (or is a regular lone job), heeded or not; 0 and "" when none.
func (m *Model) profileRise(u int64) (float64, string) {
	then, base, e := m.expert(u)
	rise := then - base
	if e == "" || rise <= 2*math.Sqrt(max(base, 1)) && !m.regular(u, e, rise, base) {
		return 0, ""
	}
	return rise, e
}

// The profiles' rises are judged as their minutes come: each judged rise
// moves riseSkill by skillWeight towards the share of it that came (a rise
// larger than expected counts as all of it). Bursts at random minutes (a
// day of spiky traffic) leave a profile that expects yesterday's bursts
// where none comes today, and heeding it only bills their capacity for a
// boot and a deletion each (4-11 % of spiky days, docs/autoscaling.md). So
// while less than minSkill of what they expected lately came, the
// profiles' rises are not heeded, unless demand rose at that minute of the
// day on each of the last three days (a nightly burst among rises that did
// not come; three days as for a lone job, see regular). A schedule paused
// for a day among others that fire, or bursts of varying size, keep most
// of the skill. Each day is judged afresh, from 1: days differ (hourly
// bursts on one, none on the next, again on the third), and a day judged
// by the one before met its first bursts late.
const (
	skillWeight = 0.25
	minSkill    = 0.5
)

// RiseSkill is how much of what the profiles' rises expected came
// lately, between 0 and 1 (1 before any was judged); under a half their
// rises are not heeded.
func (m *Model) RiseSkill() float64 { return m.riseSkill }

// regular says whether a rise too small to stand out of a Poisson
// count's noise (a job or two, where the count's deviation is taken as at
// least one) is a job that comes at that minute after a quiet one: a
// nightly pipeline of one job at 02:00. It is when the minute before's
// own level does not hide it (the rise is over two standard deviations
// of a Poisson count of that level: any rise when nothing ran) and the
// job came on each of the last three days: the daily profile has seen
// the minute three times and expects at least regularWeight of a slot
// more. The weekly profile, when it speaks, says so with two weeks seen
// and the same weight, or with one week seen when the daily profile says
// so too. Random jobs that happen to start at the same minute three days
// running are rare; a schedule is met from its fourth day.
func (m *Model) regular(u int64, expert string, rise, base float64) bool {
	if !rose(rise, base) {
		return false
	}
	db, wb := m.bins(u)
	d := m.daily[db]
	switch expert {
	case "daily":
		return d.N >= 3
	case "weekly":
		return m.weekly[wb].N >= 2 || d.N >= 3 && m.lastDaily >= 0 && rose(float64(d.Mean)-m.lastDaily, m.lastDaily)
	}
	return false
}

// rose says whether a rise from base stands out of a Poisson count's noise
// at that level without taking the deviation as at least one: over two
// standard deviations, and any rise of a slot or so (regularWeight) when
// nothing ran. It is the test of a lone job on a schedule (regular) and of
// a minute whose demand rose (the streaks).
func rose(rise, base float64) bool {
	return rise >= regularWeight && rise > 2*math.Sqrt(max(base, 0))
}

// regularWeight is what a profile bin holds of one slot that came on
// each of the last three days (weeks) and not before: 1 − (1 − alpha)³.
const regularWeight = 1 - (1-alpha)*(1-alpha)*(1-alpha)

// noteMiss records a minute's miss and sizes the measured spare anew.
func (m *Model) noteMiss(x miss) {
	if math.IsNaN(float64(x.Slots)) || math.IsInf(float64(x.Slots), 0) {
		return
	}
	m.misses[m.nMisses%missMinutes] = x
	m.nMisses++
	if m.nMisses >= 2*missMinutes {
		m.nMisses -= missMinutes // keep the ring's place, bound the count
	}
	m.missSpare = m.measuredSpare()
}

// measuredSpare is the measured spare of a minute, in slots: the
// smallest spare that would have left at most missWaiting of the recorded
// jobs waiting, each minute's miss beyond it being jobs that wait; 0 with
// fewer than minMisses minutes or no jobs.
func (m *Model) measuredSpare() float64 {
	n := min(m.nMisses, missMinutes)
	if n < minMisses {
		return 0
	}
	var sorted [missMinutes]float64
	jobs := 0.0
	for i, x := range m.misses[:n] {
		sorted[i] = float64(x.Slots)
		jobs += float64(x.Arrivals)
	}
	// Largest first: with the spare s between the j+1th and the jth
	// largest miss, the j largest overflow by their sum minus j × s.
	slices.Sort(sorted[:n])
	slices.Reverse(sorted[:n])
	budget, sum := missWaiting*jobs, 0.0
	for j := 1; j <= n; j++ {
		sum += sorted[j-1]
		next := 0.0
		if j < n {
			next = max(0, sorted[j])
		}
		if s := (sum - budget) / float64(j); s >= next {
			return max(0, s)
		}
	}
	return 0
}

// SetSpare chooses how the spare is sized (SparePoisson unless set).
func (m *Model) SetSpare(s Spare) { m.measured = s == SpareMeasured }

// Spare is how the spare is sized.
func (m *Model) Spare() Spare {
	if m.measured {
		return SpareMeasured
	}
	return SparePoisson
}

// peakOf is the peak learned for the Unix minute u, if it is still kept.
func (m *Model) peakOf(u int64) (float64, bool) {
	if u <= 0 || u > m.lastMinute || m.peakAt[u%recentPeaks] != u {
		return 0, false
	}
	return float64(m.recentPeak[u%recentPeaks]), true
}

// hourlyRise is the rise from the last minute learned to minute u that
// each of the last two of a period showed, standing out of its noise
// there and alike (the smaller at least a third of the larger: a rise
// that barely stands out beside a burst is not that burst again): the
// larger of the two (a schedule's bursts differ in size; two are a small
// sample of them), the largest over the periods, 0 when no period's two
// did.
func (m *Model) hourlyRise(u int64) float64 {
	best := 0.0
	for _, period := range periods {
		var rises [2]float64
		for k := range rises {
			then, ok := m.peakOf(u - int64(k+1)*period)
			base, okBase := m.peakOf(m.lastMinute - int64(k+1)*period)
			if !ok || !okBase || then-base <= 2*math.Sqrt(max(base, 1)) {
				rises[k] = math.NaN()
				break
			}
			rises[k] = then - base
		}
		lo, hi := min(rises[0], rises[1]), max(rises[0], rises[1])
		if lo >= hi/3 { // false when either did not stand out (NaN)
			best = max(best, hi)
		}
	}
	return best
}

// Prediction is the model's opinion of the coming minutes.
type Prediction struct {
	// Peak is the demand to provide for, in slots: the larger of the
	// demand now and the last minute's peak + Rise, plus Spare and
	// Consumed.
	Peak float64
	// Rise is the increase the profile or the last periods show from the
	// last minute to a minute of the horizon (0 when none stands out of
	// its noise), At the start of that minute and Expert who expects it
	// ("daily", "weekly", "hourly": the last periods; "" when none).
	Rise   float64
	At     time.Time
	Expert string
	// Consumed is the slots expected to leave with the jobs that end
	// within the horizon (on instances that take no more jobs: with
	// max_use_count): the rate of such endings over the window, at most
	// the arrival rate, times the horizon; 0 once the window passed
	// without an arrival. Demand that stays level still needs that many
	// new slots.
	Consumed float64
	// Spare covers arrivals and departures within the horizon (less
	// when jobs hold their slots for less than it: Held); 0 once
	// the window passed without an arrival. It is PoissonSpare, or
	// MeasuredSpare when that spare is in use (SetSpare); both are
	// computed whichever is.
	Spare, PoissonSpare, MeasuredSpare float64
}

// z is the one-sided 95 % quantile of the normal distribution.
const z = 1.65

// zMax is the 95 % quantile of the largest of k independent standard
// normal draws (Φ⁻¹(0.95^(1/k))), z for one or fewer.
func zMax(k float64) float64 {
	if k <= 1 {
		return z
	}
	return max(z, math.Sqrt2*math.Erfcinv(-2*math.Expm1(math.Log(0.95)/k)))
}

// Predict returns, given the demand now, the demand to provide for from
// now to now+create (instances asked for now are ready by then) and from
// now to now+keep (an instance removed now could be back by then), in one
// pass over the profile.
func (m *Model) Predict(now time.Time, demand int, create, keep time.Duration) (c, k Prediction) {
	from := unixMinute(now)
	cTo, kTo := unixMinute(now.Add(create)), unixMinute(now.Add(keep))
	if m.started && m.lastMinute == from-1 {
		for u := from; u <= max(cTo, kTo); u++ {
			rise, e := m.riseAt(u)
			if rise <= 0 {
				continue
			}
			for _, x := range [...]struct {
				p  *Prediction
				to int64
			}{{&c, cTo}, {&k, kTo}} {
				if u <= x.to && rise > x.p.Rise {
					x.p.Rise, x.p.At, x.p.Expert = rise, time.Unix(u*60, 0).In(m.loc), e
				}
			}
		}
	}
	arriving := now.Sub(m.lastArrival) < m.window
	m.complete(&c, 0, demand, create, arriving)
	m.complete(&k, 1, demand, keep, arriving)
	return c, k
}

// complete adds the level and the spare to a prediction's rise; no spare
// unless jobs are arriving (one did within the window). Horizon i is 0
// (create) or 1 (keep).
func (m *Model) complete(p *Prediction, i, demand int, horizon time.Duration, arriving bool) {
	if minutes := horizon.Minutes(); minutes > 0 && m.rate > 0 && arriving {
		// Within a horizon h, demand moves by two Poisson counts: the
		// jobs arriving that still hold their slot, and the jobs of now
		// that have gone, λ·E[min(hold, h)] each (the M/G/∞ queue): λ·h
		// when jobs outlast the horizon. Jobs shorter than it renew
		// demand h ÷ E[min(hold, h)] times within it, and the spare
		// covers the largest of those moves.
		if t := m.spareTerm(i, minutes); t.held > 0 {
			p.PoissonSpare = math.Round(t.z * math.Sqrt(2*m.rate*t.held))
		}
		p.MeasuredSpare = max(p.PoissonSpare, math.Round(m.missSpare*math.Sqrt(max(1, minutes))))
		p.Spare = p.PoissonSpare
		if m.measured {
			p.Spare = p.MeasuredSpare
		}
		// Jobs that end within the horizon on an instance that takes no
		// more give no slot back to the jobs arriving then: as many more
		// free slots, at most one per arrival.
		p.Consumed = min(m.consumedRate, m.rate) * minutes
	}
	// The rise is from the last minute's peak: today's level, history's
	// shape.
	p.Peak = float64(max(0, demand))
	if p.Rise > 0 {
		p.Peak = max(p.Peak, m.lastPeak+p.Rise)
	}
	p.Peak += p.Spare + p.Consumed
}

// Rate is the arrival rate, jobs per minute, over the recent window.
func (m *Model) Rate() float64 { return m.rate }

// ObserveBoot records how long an instance took from request to ready.
func (m *Model) ObserveBoot(d time.Duration) {
	m.boots = push(m.boots, d.Seconds())
	m.bootP90 = p90(m.boots)
}

// ObserveDelete records how long an instance took from removal to gone.
func (m *Model) ObserveDelete(d time.Duration) {
	m.deletes = push(m.deletes, d.Seconds())
	m.deleteP90 = p90(m.deletes)
}

func push(s []float64, v float64) []float64 {
	if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return s
	}
	if len(s) == latencySamples {
		s = s[1:]
	}
	return append(s, v)
}

// BootLatency is the 90th percentile of the last measured boots (request to
// ready), DefaultBootLatency before the first.
func (m *Model) BootLatency() time.Duration {
	if len(m.boots) == 0 {
		return DefaultBootLatency
	}
	return m.bootP90
}

// BootsMeasured is how many boots BootLatency is measured from (at most
// the last latencySamples).
func (m *Model) BootsMeasured() int { return len(m.boots) }

// DeleteLatency is the 90th percentile of the last measured deletions, 0
// before the first.
func (m *Model) DeleteLatency() time.Duration {
	return m.deleteP90
}

// p90 is the 90th percentile of s, in seconds; 0 for none.
func p90(s []float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	c := slices.Clone(s)
	slices.Sort(c)
	i := int(math.Ceil(0.9*float64(len(c)))) - 1
	return time.Duration(c[max(0, i)] * float64(time.Second))
}
