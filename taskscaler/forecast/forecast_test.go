package forecast

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// monday is a Monday, 00:00 UTC.
var monday = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// feed observes demand(t) every 10 s from start for d, and one arrival per
// job that demand says arrived (a new job each time demand rises).
func feed(m *Model, start time.Time, d time.Duration, demand func(t time.Time) int) {
	prev := 0
	for t := start; t.Before(start.Add(d)); t = t.Add(10 * time.Second) {
		x := demand(t)
		for range max(0, x-prev) {
			m.Arrived(t)
		}
		prev = x
		m.Observe(t, x)
	}
}

// burstAt10 is 2 slots of base demand and 30 more from 10:00 to 10:05 on
// weekdays; nothing at weekends.
func burstAt10(t time.Time) int {
	if wd := t.Weekday(); wd == time.Saturday || wd == time.Sunday {
		return 0
	}
	if t.Hour() == 10 && t.Minute() < 5 {
		return 32
	}
	return 2
}

func TestLearnsARecurringBurstAndProvisionsABootAhead(t *testing.T) {
	m := New(time.UTC)
	feed(m, monday, 24*time.Hour+9*time.Hour+59*time.Minute, burstAt10)
	// Day 2, 09:59:15 with a 45 s boot: the burst of 10:00 is in reach.
	now := monday.Add(24*time.Hour + 9*time.Hour + 59*time.Minute + 15*time.Second)
	m.Observe(now, 2)
	p := first(m.Predict(now, 2, 45*time.Second, 45*time.Second))
	if p.Peak < 32 || p.Rise < 29 || !p.At.Equal(monday.Add(34*time.Hour)) || p.Expert != "daily" {
		t.Fatalf("prediction before the second burst %+v: want a rise of 30 at 10:00 from the daily profile", p)
	}
	// The day before, nothing was known: the demand now and a spare.
	m1 := New(time.UTC)
	feed(m1, monday, 9*time.Hour+59*time.Minute+15*time.Second, burstAt10)
	if p := first(m1.Predict(monday.Add(9*time.Hour+59*time.Minute+15*time.Second), 2, 45*time.Second, 45*time.Second)); p.Rise != 0 || p.Peak > 5 {
		t.Fatalf("prediction before the first burst %+v: want no rise", p)
	}
}

// Midnight's burst is predicted at the end of the first day, when the
// profile has not seen the minute before yet: the base is that minute's
// own peak.
func TestFirstDaysMidnight(t *testing.T) {
	m := New(time.UTC)
	burst := func(t time.Time) int {
		if t.Hour() == 0 && t.Minute() < 5 {
			return 32
		}
		return 2
	}
	now := monday.Add(23*time.Hour + 59*time.Minute + 15*time.Second)
	feed(m, monday, now.Sub(monday)+time.Second, burst)
	if p := first(m.Predict(now, 2, 45*time.Second, 45*time.Second)); p.Rise < 29 || !p.At.Equal(monday.Add(24*time.Hour)) {
		t.Fatalf("prediction at the first day's 23:59: %+v, want the midnight burst", p)
	}
}

// hourlyFrom is 2 slots and, from the hour start on, 30 more in the first
// 3 minutes of every hour (a schedule that begins today).
func hourlyFrom(start int) func(time.Time) int {
	return func(t time.Time) int {
		if t.Hour() >= start && t.Minute() < 3 {
			return 32
		}
		return 2
	}
}

// A schedule the profiles never saw (the first day, nothing learned) is
// expected once it came at the same minute of each of the last two hours.
func TestHourlyScheduleOfTheDayItself(t *testing.T) {
	at := func(h, m, s int) time.Time {
		return monday.Add(time.Duration(h)*time.Hour + time.Duration(m)*time.Minute + time.Duration(s)*time.Second)
	}
	for _, c := range []struct {
		name   string
		demand func(time.Time) int
		now    time.Time
		rise   float64 // want at least this; 0: none
	}{
		{"once is no schedule", hourlyFrom(8), at(8, 59, 15), 0},
		{"twice is", hourlyFrom(8), at(9, 59, 15), 29},
		{"and goes on", hourlyFrom(8), at(14, 59, 15), 29},
		{"not before its minute is in the horizon", hourlyFrom(8), at(9, 58, 0), 0},
		{"the larger of the two hours", func(t time.Time) int {
			switch {
			case t.Hour() == 8 && t.Minute() < 3:
				return 32 // +30
			case t.Hour() == 9 && t.Minute() < 3:
				return 17 // +15
			}
			return 2
		}, at(9, 59, 15), 29},
		{"not alike, not the same schedule", func(t time.Time) int {
			switch {
			case t.Hour() == 8 && t.Minute() < 3:
				return 32 // +30
			case t.Hour() == 9 && t.Minute() < 3:
				return 7 // +5: out of the noise (2√2), under a third of 30
			}
			return 2
		}, at(9, 59, 15), 0},
		{"every 20 minutes, after two", func(t time.Time) int {
			if t.Hour() >= 8 && t.Minute()%20 >= 5 && t.Minute()%20 < 8 {
				return 32
			}
			return 2
		}, at(8, 44, 15), 29},
		{"every 15 minutes, after two", func(t time.Time) int {
			if t.Hour() >= 8 && t.Minute()%15 < 2 {
				return 32
			}
			return 2
		}, at(8, 29, 15), 29},
		{"at different minutes it is none", func(t time.Time) int {
			if (t.Hour() == 8 && t.Minute() == 0) || (t.Hour() == 9 && t.Minute() == 30) {
				return 32
			}
			return 2
		}, at(9, 59, 15), 0},
		{"within the noise it is none", func(t time.Time) int {
			if t.Hour() >= 8 && t.Minute() < 3 {
				return 44 // +4 over 40: 2√40 ≈ 12.6
			}
			return 40
		}, at(10, 59, 15), 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := New(time.UTC)
			feed(m, monday, c.now.Sub(monday), c.demand)
			m.Observe(c.now, c.demand(c.now))
			p := first(m.Predict(c.now, c.demand(c.now), 45*time.Second, 45*time.Second))
			next := c.now.Truncate(time.Minute).Add(time.Minute)
			switch {
			case c.rise == 0 && p.Rise != 0:
				t.Fatalf("%+v: want no rise", p)
			case c.rise > 0 && (p.Rise < c.rise || p.Rise > c.rise+3 || !p.At.Equal(next) || p.Expert != "hourly"):
				t.Fatalf("%+v: want a rise of about %.0f at %s from the hourly expert", p, c.rise, next.Format("15:04"))
			}
		})
	}
	// A gap in the observations (the scaler was stopped) is no evidence,
	// whatever the memory holds from before (06:52 shares 09:00's place).
	m := New(time.UTC)
	demand := func(t time.Time) int {
		if t.Hour() == 6 && t.Minute() >= 52 && t.Minute() < 55 {
			return 32
		}
		return hourlyFrom(8)(t)
	}
	feed(m, monday, 8*time.Hour+30*time.Minute, demand)
	feed(m, monday.Add(9*time.Hour+30*time.Minute), 29*time.Minute+15*time.Second, demand)
	now := at(9, 59, 15)
	if p := first(m.Predict(now, 2, 45*time.Second, 45*time.Second)); p.Rise != 0 {
		t.Fatalf("after a gap over 09:00: %+v, want no rise", p)
	}
}

// What the profiles expect stands when it is more than the last hours'.
func TestHourlyAndDailyTheLarger(t *testing.T) {
	m := New(time.UTC)
	// Yesterday a burst of 60 at 10:00; today the hourly schedule (30).
	demand := func(t time.Time) int {
		if t.Before(monday.Add(24 * time.Hour)) {
			if t.Hour() == 10 && t.Minute() < 3 {
				return 62
			}
			return 2
		}
		return hourlyFrom(8)(t)
	}
	now := monday.Add(24*time.Hour + 9*time.Hour + 59*time.Minute + 15*time.Second)
	feed(m, monday, now.Sub(monday), demand)
	m.Observe(now, 2)
	if p := first(m.Predict(now, 2, 45*time.Second, 45*time.Second)); p.Expert != "daily" || p.Rise < 59 {
		t.Fatalf("%+v: want the daily profile's 60", p)
	}
}

// A lone job at the same minute every night (a nightly pipeline of one
// job) is too small to stand out of a Poisson count's noise, but nothing
// ran before it: once three nights running have shown it, it is
// provisioned a boot ahead. A job seen twice, or on two of the last three
// nights, is not (random jobs start at the same minute two days running
// often enough); nor is one job more on a level it does not stand out of.
func TestRegularLoneJob(t *testing.T) {
	at0200 := func(days ...int) func(time.Time) int {
		return func(t time.Time) int {
			d := int(t.Sub(monday) / (24 * time.Hour))
			if t.Hour() == 2 && t.Minute() < 5 && slices.Contains(days, d) {
				return 1
			}
			return 0
		}
	}
	predict := func(demand func(time.Time) int, day int, level int) Prediction {
		m := New(time.UTC)
		base := func(t time.Time) int { return demand(t) + level }
		now := monday.Add(time.Duration(day)*24*time.Hour + time.Hour + 59*time.Minute + 15*time.Second)
		feed(m, monday, now.Sub(monday), base)
		m.Observe(now, level)
		return first(m.Predict(now, level, 45*time.Second, 45*time.Second))
	}
	for _, c := range []struct {
		name   string
		demand func(time.Time) int
		day    int
		level  int
		want   bool
	}{
		{"second night, seen once", at0200(0, 1, 2), 1, 0, false},
		{"third night, seen twice", at0200(0, 1, 2), 2, 0, false},
		{"fourth night, seen three times", at0200(0, 1, 2, 3), 3, 0, true},
		{"fifth night, seen three times since a pause", at0200(0, 2, 3, 4), 4, 0, true},
		{"fifth night, seen on two of the last three", at0200(0, 1, 3, 4), 4, 0, false},
		{"one more on a level of 3", at0200(0, 1, 2, 3, 4), 4, 3, false},
		// Weekdays only: the weekly profile tells the second Saturday, and
		// speaks for the third Monday (it saw two).
		{"weekdays, second Saturday", at0200(0, 1, 2, 3, 4, 7, 8, 9, 10, 11), 12, 0, false},
		{"weekdays, third Monday", at0200(0, 1, 2, 3, 4, 7, 8, 9, 10, 11, 14), 14, 0, true},
		// Every day: in the second week the weekly profile has seen the
		// minute once, and the daily one says so too.
		{"every day, second Monday", at0200(0, 1, 2, 3, 4, 5, 6, 7), 7, 0, true},
	} {
		p := predict(c.demand, c.day, c.level)
		if got := p.Rise > 0; got != c.want || got && (p.Peak < float64(c.level)+0.75 || p.At.Hour() != 2) {
			t.Errorf("%s: %+v, want a rise at 02:00: %t", c.name, p, c.want)
		}
	}
}

func TestCreateAndKeepHorizons(t *testing.T) {
	m := New(time.UTC)
	// A burst at 10:01 (not 10:00) every day.
	burst := func(t time.Time) int {
		if t.Hour() == 10 && t.Minute() >= 1 && t.Minute() < 5 {
			return 32
		}
		return 2
	}
	feed(m, monday, 24*time.Hour+9*time.Hour+59*time.Minute+50*time.Second, burst)
	now := monday.Add(24*time.Hour + 9*time.Hour + 59*time.Minute + 50*time.Second)
	c, k := m.Predict(now, 2, 45*time.Second, 2*time.Minute)
	// Instances asked for now are ready at 10:00:35: the burst is beyond
	// them; one removed now could be back at 10:01:50: it is not.
	if c.Rise != 0 || k.Rise < 29 || !k.At.Equal(monday.Add(34*time.Hour+time.Minute)) {
		t.Fatalf("create %+v, keep %+v: want the 10:01 burst in the keep horizon only", c, k)
	}
}

func TestARiseThatIsNotInTheHorizonIsNotProvisioned(t *testing.T) {
	m := New(time.UTC)
	feed(m, monday, 24*time.Hour+9*time.Hour+50*time.Minute, burstAt10)
	now := monday.Add(24*time.Hour + 9*time.Hour + 50*time.Minute)
	if p := first(m.Predict(now, 2, 45*time.Second, 45*time.Second)); p.Rise != 0 {
		t.Fatalf("10 minutes before the burst: %+v, want no rise", p)
	}
	// After the burst's minutes, the rise is gone again: a rise that did
	// not come holds capacity only while it is in the horizon.
	feed(m, now, 20*time.Minute, func(time.Time) int { return 2 })
	if p := first(m.Predict(now.Add(20*time.Minute), 2, 45*time.Second, 45*time.Second)); p.Rise != 0 {
		t.Fatalf("after the burst's time: %+v, want no rise", p)
	}
}

func TestWeeklyProfileTellsWeekendsFromWeekdays(t *testing.T) {
	m := New(time.UTC)
	sat := monday.Add(12 * 24 * time.Hour) // the second Saturday
	feed(m, monday, 12*24*time.Hour+9*time.Hour+59*time.Minute, func(t time.Time) int {
		if t.Weekday() == time.Saturday || t.Weekday() == time.Sunday {
			return 0
		}
		return burstAt10(t)
	})
	now := sat.Add(9*time.Hour + 59*time.Minute + 15*time.Second)
	m.Observe(now, 0)
	if p := first(m.Predict(now, 0, 45*time.Second, 45*time.Second)); p.Rise != 0 {
		t.Fatalf("second Saturday 09:59: %+v, want no rise (last Saturday had none)", p)
	}
	// The first Saturday, with only the daily profile, expected Friday's
	// burst.
	m1 := New(time.UTC)
	feed(m1, monday, 5*24*time.Hour+9*time.Hour+59*time.Minute+15*time.Second, burstAt10)
	if p := first(m1.Predict(monday.Add(5*24*time.Hour+9*time.Hour+59*time.Minute+15*time.Second), 0, 45*time.Second, 45*time.Second)); p.Rise == 0 || p.Expert != "daily" {
		t.Fatalf("first Saturday 09:59: %+v, want Friday's burst from the daily profile", p)
	}
}

func TestTodaysLevelNotYesterdays(t *testing.T) {
	m := New(time.UTC)
	feed(m, monday, 24*time.Hour+9*time.Hour+59*time.Minute, func(t time.Time) int {
		if t.Before(monday.Add(24 * time.Hour)) {
			return 2 * burstAt10(t) // yesterday twice as busy
		}
		return burstAt10(t)
	})
	now := monday.Add(24*time.Hour + 9*time.Hour + 59*time.Minute + 15*time.Second)
	m.Observe(now, 2)
	p := first(m.Predict(now, 2, 45*time.Second, 45*time.Second))
	// Yesterday rose from 4 to 64; today's level is 2: 2 + 60.
	if math.Abs(p.Peak-p.Spare-62) > 0.01 {
		t.Fatalf("prediction %+v: want today's 2 plus yesterday's rise of 60", p)
	}
}

func TestSpareFollowsTheArrivalRate(t *testing.T) {
	m := New(time.UTC)
	m.SetWindow(5 * time.Minute)
	for minute := range 60 {
		at := monday.Add(time.Duration(minute) * time.Minute)
		for range 6 {
			m.Arrived(at)
		}
		m.Observe(at, 10)
	}
	p := first(m.Predict(monday.Add(time.Hour), 10, 45*time.Second, 45*time.Second))
	want := math.Round(z * math.Sqrt(2*6*0.75)) // 4.95 → 5
	if math.Abs(m.Rate()-6) > 0.01 || math.Abs(p.Spare-want) > 0.01 || math.Abs(p.Peak-10-want) > 0.01 {
		t.Fatalf("rate %.2f, prediction %+v: want rate 6, spare %.2f", m.Rate(), p, want)
	}
	// A window without arrivals: no spare at all (not a slowly fading one
	// that would hold an instance all night).
	for minute := 60; minute <= 66; minute++ {
		m.Observe(monday.Add(time.Duration(minute)*time.Minute), 0)
	}
	if p := first(m.Predict(monday.Add(66*time.Minute), 0, 45*time.Second, 45*time.Second)); m.Rate() != 0 || p.Peak != 0 {
		t.Fatalf("after a quiet window: rate %.2f, prediction %+v, want nothing", m.Rate(), p)
	}
}

// Jobs that end on instances that take no more (max_use_count) take
// their slot with them: a level demand then needs as many new slots as
// such jobs end within the horizon, at most one per arrival; none when
// every slot comes back, nor once arrivals stop.
func TestConsumedSlots(t *testing.T) {
	feedRates := func(arrivals, consumed int) *Model {
		m := New(time.UTC)
		m.SetWindow(5 * time.Minute)
		for minute := range 60 {
			at := monday.Add(time.Duration(minute) * time.Minute)
			for range arrivals {
				m.Arrived(at)
			}
			for range consumed {
				m.Consumed()
			}
			m.Observe(at, 10)
		}
		return m
	}
	for _, c := range []struct {
		arrivals, consumed int
		want               float64
	}{
		{6, 6, 6 * 0.75}, // one job per instance: every ending
		{6, 2, 2 * 0.75}, // a third of the endings reach max_use_count
		{6, 0, 0},        // slots come back
		{2, 6, 2 * 0.75}, // more endings than arrivals: one per arrival
	} {
		m := feedRates(c.arrivals, c.consumed)
		p := first(m.Predict(monday.Add(time.Hour), 10, 45*time.Second, 45*time.Second))
		if math.Abs(p.Consumed-c.want) > 0.01 || math.Abs(p.Peak-10-p.Spare-c.want) > 0.01 {
			t.Errorf("%d arrivals, %d consumed a minute: %+v, want %.2f consumed in the peak", c.arrivals, c.consumed, p, c.want)
		}
	}
	m := feedRates(6, 6)
	for minute := 60; minute <= 66; minute++ {
		m.Observe(monday.Add(time.Duration(minute)*time.Minute), 0)
	}
	if p := first(m.Predict(monday.Add(66*time.Minute), 0, 45*time.Second, 45*time.Second)); p.Consumed != 0 || p.Peak != 0 {
		t.Errorf("after a window without arrivals: %+v, want nothing", p)
	}
}

// The spare is gone one idle_time after the last arrival, also when
// idle_time is shorter than the minutes the rate is counted in: a burst
// that ended is not provisioned for again when its minute is learned.
func TestSpareGoesOneWindowAfterTheLastArrival(t *testing.T) {
	for _, window := range []time.Duration{2 * time.Second, 5 * time.Minute} {
		m := New(time.UTC)
		m.SetWindow(window)
		last := monday.Add(10*time.Hour + 50*time.Second) // 12 jobs arrive at 10:00:50
		learned := monday.Add(10*time.Hour + time.Minute) // their minute is learned at 10:01
		for now := monday.Add(10 * time.Hour); now.Before(last.Add(window + 2*time.Minute)); now = now.Add(time.Second) {
			if now.Equal(last) {
				for range 12 {
					m.Arrived(now)
				}
			}
			m.Observe(now, 0)
			p := first(m.Predict(now, 0, time.Minute, time.Minute))
			switch {
			case !now.Before(last.Add(window)) && p.Spare != 0:
				t.Fatalf("window %s, %s after the last arrival: spare %.0f (rate %.1f), want none", window, now.Sub(last), p.Spare, m.Rate())
			case !now.Before(learned) && now.Before(last.Add(window)) && p.Spare == 0:
				t.Fatalf("window %s, %s after the last arrival: no spare, want one for the rate %.1f", window, now.Sub(last), m.Rate())
			}
		}
	}
}

// A day of arrivals is told by GapDay: how many came after a gap of the
// window or more (the spare had gone), and the shortest idle_time after
// which at most 1 % of them came; then the next day begins.
func TestGapDay(t *testing.T) {
	m := New(time.UTC)
	m.SetWindow(5 * time.Minute)
	now := monday.Add(8 * time.Hour)
	m.Requested(now) // the first request has no gap
	if _, ok := m.GapDay(now.Add(48 * time.Hour)); ok {
		t.Fatal("a diagnosis without a gap counted")
	}
	// 200 gaps of 2 minutes and 10 % of 7 minutes (and some seconds).
	for i := range 220 {
		gap := 2 * time.Minute
		if i%10 == 0 {
			gap = 7*time.Minute + 20*time.Second
		}
		now = now.Add(gap)
		m.Requested(now)
		if _, ok := m.GapDay(now); ok {
			t.Fatalf("a diagnosis %s after the first gap", now.Sub(monday.Add(8*time.Hour)))
		}
	}
	a, ok := m.GapDay(now.Add(24 * time.Hour))
	if !ok || a.Jobs != 220 || a.Missed != 22 || a.IdleTime != 8*time.Minute {
		t.Fatalf("diagnosis %+v (%v): want 220 jobs, 22 after 5 minutes or more, idle_time 8m", a, ok)
	}
	if _, ok := m.GapDay(now.Add(49 * time.Hour)); ok {
		t.Fatal("the day was not begun anew")
	}
	// Gaps of an hour or more are told apart: no idle_time holds for
	// them, and the one suggested holds for the others.
	for i := range 100 {
		gap := 3 * time.Minute
		switch {
		case i%4 == 0:
			gap = 90 * time.Minute
		case i%4 == 1:
			gap = 12*time.Minute + 30*time.Second
		}
		now = now.Add(gap)
		m.Requested(now)
	}
	if a, ok := m.GapDay(now); !ok || a.Jobs != 100 || a.Missed != 50 || a.Long != 25 || a.IdleTime != 13*time.Minute {
		t.Fatalf("gaps of 3 and 12.5 minutes and 1.5 hours: %+v (%v), want 50 after 5 minutes, 25 after an hour, idle_time 13m", a, ok)
	}
}

func TestLatencies(t *testing.T) {
	m := New(nil)
	if m.BootLatency() != DefaultBootLatency || m.DeleteLatency() != 0 {
		t.Fatal("defaults")
	}
	for i := 1; i <= 20; i++ {
		m.ObserveBoot(time.Duration(i) * time.Second)
		m.ObserveDelete(time.Second)
	}
	m.ObserveBoot(-time.Second) // ignored
	// The last 16 boots are 5..20 s; their 90th percentile is 19 s.
	if got := m.BootLatency(); got != 19*time.Second {
		t.Fatalf("boot latency %s, want 19s", got)
	}
	if m.DeleteLatency() != time.Second {
		t.Fatal("delete latency")
	}
}

func TestStateRoundTripAndDamage(t *testing.T) {
	m := New(time.UTC)
	feed(m, monday, 2*24*time.Hour, burstAt10)
	m.ObserveBoot(42 * time.Second)
	path := filepath.Join(t.TempDir(), "forecast")
	if err := m.Save(path); err != nil {
		t.Fatal(err)
	}
	m2 := New(time.UTC)
	if found, err := m2.Load(path); !found || err != nil {
		t.Fatal(found, err)
	}
	a, _ := m.MarshalBinary()
	b, _ := m2.MarshalBinary()
	if !bytes.Equal(a, b) || m2.BootLatency() != 42*time.Second {
		t.Fatal("loaded state differs from the saved one")
	}
	if found, err := New(nil).Load(filepath.Join(t.TempDir(), "none")); found || err != nil {
		t.Fatal("a missing file is not an error", found, err)
	}
	for name, damage := range map[string]func([]byte) []byte{
		"flipped byte": func(d []byte) []byte { d[100] ^= 1; return d },
		"truncated":    func(d []byte) []byte { return d[:len(d)/2] },
		"empty":        func([]byte) []byte { return nil },
	} {
		d := damage(bytes.Clone(a))
		if err := os.WriteFile(path, d, 0o600); err != nil {
			t.Fatal(err)
		}
		m3 := New(time.UTC)
		before, _ := m3.MarshalBinary()
		if _, err := m3.Load(path); err == nil {
			t.Fatalf("%s: loaded", name)
		}
		after, _ := m3.MarshalBinary()
		if !bytes.Equal(before, after) {
			t.Fatalf("%s: a failed load changed the model", name)
		}
	}
}

// The hourly expert's memory is saved too: a restart within the hour
// still expects the schedule of the hours before it.
func TestRestartKeepsTheLastHours(t *testing.T) {
	m := New(time.UTC)
	feed(m, monday, 9*time.Hour+30*time.Minute, hourlyFrom(8))
	path := filepath.Join(t.TempDir(), "forecast")
	if err := m.Save(path); err != nil {
		t.Fatal(err)
	}
	m2 := New(time.UTC)
	if _, err := m2.Load(path); err != nil {
		t.Fatal(err)
	}
	// Down from 09:30 to 09:40.
	feed(m2, monday.Add(9*time.Hour+40*time.Minute), 19*time.Minute+15*time.Second, hourlyFrom(8))
	now := monday.Add(9*time.Hour + 59*time.Minute + 15*time.Second)
	if p := first(m2.Predict(now, 2, 45*time.Second, 45*time.Second)); p.Rise < 29 || p.Expert != "hourly" {
		t.Fatalf("after a restart at 09:30: %+v, want the 10:00 burst from the hourly expert", p)
	}
}

// Files of versions 1 (no recent peaks), 2 (no recent misses) and 3 (no
// rise streaks) still load: what they hold as saved, the rest empty. A
// later version does not.
func TestLoadsOlderVersions(t *testing.T) {
	m := New(time.UTC)
	m.SetWindow(5 * time.Minute)
	clustered(m, monday, 3*time.Hour, 8, 1)
	m.ObserveBoot(40 * time.Second)
	m.streak[7] = 4
	v4, _ := m.MarshalBinary()
	if m.nMisses < minMisses || m.peakAt == [recentPeaks]int64{} {
		t.Fatal("the model recorded no misses or peaks to save")
	}
	missesSize, peaksSize, streakSize := 4+missMinutes*8, recentPeaks*12, MinutesPerDay
	older := func(v uint32, cut int) []byte {
		body := bytes.Clone(v4[:len(v4)-4-cut])
		binary.LittleEndian.PutUint32(body[len(magic):], v)
		return binary.LittleEndian.AppendUint32(body, crc32.ChecksumIEEE(body))
	}
	for _, c := range []struct {
		version   uint32
		cut       int
		peaks     bool
		misses    bool
		streak    bool
		wantLoads bool
	}{
		{1, streakSize + missesSize + peaksSize, false, false, false, true},
		{2, streakSize + missesSize, true, false, false, true},
		{3, streakSize, true, true, false, true},
		{4, 0, true, true, true, true},
		{5, 0, true, true, true, false},
	} {
		m2 := New(time.UTC)
		err := m2.UnmarshalBinary(older(c.version, c.cut))
		if !c.wantLoads {
			if err == nil {
				t.Fatalf("a version %d file loaded", c.version)
			}
			continue
		}
		if err != nil {
			t.Fatalf("version %d: %v", c.version, err)
		}
		if m2.daily != m.daily || m2.weekly != m.weekly || m2.BootLatency() != 40*time.Second ||
			(m2.peakAt == m.peakAt) != c.peaks || (m2.peakAt == [recentPeaks]int64{}) == c.peaks ||
			(m2.misses == m.misses && m2.nMisses == m.nMisses && m2.missSpare == m.missSpare) != c.misses || (m2.nMisses == 0) == c.misses ||
			(m2.streak == m.streak) != c.streak || (m2.streak == [MinutesPerDay]uint8{}) == c.streak {
			t.Fatalf("a version %d file loaded differently", c.version)
		}
	}
}

// clustered runs d of jobs arriving k at a time (within the same second)
// in a Poisson process of 6/k arrivals per minute, each lasting 6
// minutes, observing the demand every second: 6 jobs a minute whatever k.
func clustered(m *Model, start time.Time, d time.Duration, k int, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 7))
	var ends []time.Time
	next := start
	for now := start; now.Before(start.Add(d)); now = now.Add(time.Second) {
		for !next.After(now) {
			for range k {
				m.Arrived(now)
				ends = append(ends, now.Add(6*time.Minute))
			}
			next = next.Add(time.Duration(r.ExpFloat64() / (6 / float64(k)) * float64(time.Minute)))
		}
		ends = slices.DeleteFunc(ends, func(e time.Time) bool { return !e.After(now) })
		m.Observe(now, len(ends))
	}
}

// The measured spare covers jobs that arrive together, as they come: for
// 6 jobs a minute in clusters of 8 it covers a cluster, where the Poisson
// spare of the same rate does not; for jobs that arrive one by one it is
// about the Poisson spare. Whatever the spare in use, the misses are
// recorded: switching finds them.
func TestMeasuredSpareCoversArrivalsThatComeTogether(t *testing.T) {
	for _, k := range []int{1, 8} {
		for seed := range uint64(5) {
			m := New(time.UTC)
			m.SetWindow(5 * time.Minute)
			m.SetSpare(SpareMeasured)
			clustered(m, monday.Add(9*time.Hour), 4*time.Hour, k, seed)
			now := monday.Add(13 * time.Hour)
			measured := first(m.Predict(now, 36, time.Minute, time.Minute)).Spare
			longer := first(m.Predict(now, 36, 4*time.Minute, 4*time.Minute)).Spare
			m.SetSpare(SparePoisson)
			poisson := first(m.Predict(now, 36, time.Minute, time.Minute)).Spare
			atMean := math.Round(z * math.Sqrt(2*6)) // the Poisson spare at the mean rate
			t.Logf("clusters of %d, seed %d: measured %.0f, Poisson %.0f (%.1f jobs a minute)", k, seed, measured, poisson, m.Rate())
			switch {
			case poisson != math.Round(z*math.Sqrt(2*m.Rate())):
				t.Fatalf("Poisson spare %.0f, want %.0f", poisson, math.Round(z*math.Sqrt(2*m.Rate())))
			case measured < poisson:
				t.Fatalf("measured spare %.0f under the Poisson spare %.0f", measured, poisson)
			case k > 1 && (measured < float64(k) || m.missSpare < float64(k)):
				t.Fatalf("clusters of %d, seed %d: measured spare %.0f (%.1f a minute), want a cluster at least", k, seed, measured, m.missSpare)
			case k > 1 && longer != math.Round(2*m.missSpare):
				t.Fatalf("clusters of %d: over 4 minutes %.0f, want twice a minute's %.1f", k, longer, m.missSpare)
			case k == 1 && m.missSpare > 1.5*atMean:
				t.Fatalf("jobs one by one, seed %d: measured spare %.1f, want about the Poisson %.0f", seed, m.missSpare, atMean)
			}
		}
	}
	m := New(time.UTC)
	clustered(m, monday, time.Hour, 8, 1)
	now := monday.Add(time.Hour)
	off := first(m.Predict(now, 36, time.Minute, time.Minute)).Spare
	m.SetSpare(SpareMeasured)
	if m.Spare() != SpareMeasured {
		t.Fatal("the spare in use is not the one set")
	}
	if on := first(m.Predict(now, 36, time.Minute, time.Minute)).Spare; off >= 8 || on < 8 {
		t.Fatalf("spare %.0f before switching, %.0f after, want under a cluster of 8, then one at least", off, on)
	}
}

func FuzzUnmarshalBinary(f *testing.F) {
	m := New(time.UTC)
	feed(m, monday, time.Hour, burstAt10)
	good, _ := m.MarshalBinary()
	f.Add(good)
	f.Add([]byte("BFC1"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m := New(time.UTC)
		if err := m.UnmarshalBinary(data); err != nil {
			return
		}
		// Whatever loads predicts finite figures.
		p := first(m.Predict(monday.Add(10*time.Hour), 3, time.Minute, time.Minute))
		if math.IsNaN(p.Peak) || math.IsInf(p.Peak, 0) || p.Peak < 0 {
			t.Fatalf("prediction %+v from loaded state", p)
		}
	})
}

// BenchmarkPredict is a decision's share of the model, on the path that
// looks for a rise (the last minute learned is the one before now): one
// observation and a prediction over a 3-minute horizon.
func BenchmarkPredict(b *testing.B) {
	m := New(time.UTC)
	start := monday.Add(8*24*time.Hour + 9*time.Hour + 59*time.Minute)
	feed(m, monday, start.Sub(monday)-time.Minute, burstAt10)
	// Jobs arriving and ending, of many lengths: the spare's path.
	for i := range holdSamples {
		m.Arrived(start.Add(-time.Minute))
		m.Held(time.Duration(i) * 3 * time.Second)
	}
	feed(m, start.Add(-time.Minute), time.Minute+time.Second, burstAt10)
	now := start.Add(15 * time.Second)
	if c, _ := m.Predict(now, 2, 3*time.Minute, 3*time.Minute); c.Rise == 0 || c.Spare == 0 || m.heldWithin(3) == 3 {
		b.Fatalf("the benchmark does not reach the rise and the spare of the jobs' hold times: %+v", c)
	}
	for b.Loop() {
		m.Observe(now, 2)
		m.Predict(now, 2, 45*time.Second, 3*time.Minute)
	}
}

func first(p, _ Prediction) Prediction { return p }

// Bursts at random minutes leave the profiles expecting yesterday's where
// none comes today. Once most of what their rises expected did not come,
// they are not heeded (a day-one burst's minute on day two expects no rise),
// while a profile whose rises came (the same bursts every day) is.
func TestRisesThatDoNotComeAreNotHeeded(t *testing.T) {
	at := func(minutes ...int) func(time.Time) int {
		return func(t time.Time) int {
			m := t.Hour()*60 + t.Minute()
			for _, b := range minutes {
				if m >= b && m < b+3 {
					return 32
				}
			}
			return 2
		}
	}
	// Minutes of day, apart by no period of the hourly expert.
	monBursts := []int{9*60 + 7, 10*60 + 31, 11*60 + 13, 12*60 + 52, 14*60 + 21}
	tueBursts := []int{9*60 + 40, 10*60 + 5, 11*60 + 50, 13*60 + 30}
	now := monday.Add(24*time.Hour + 14*time.Hour + 20*time.Minute + 15*time.Second)
	for _, c := range []struct {
		name    string
		tuesday []int
		heeded  bool
	}{
		{"random bursts", tueBursts, false},
		{"a daily schedule", monBursts, true},
	} {
		m := New(time.UTC)
		feed(m, monday, 24*time.Hour, at(monBursts...))
		feed(m, monday.Add(24*time.Hour), now.Sub(monday.Add(24*time.Hour)), at(c.tuesday...))
		p := first(m.Predict(now, 2, 45*time.Second, 45*time.Second))
		t.Logf("%s: skill %.2f, %+v", c.name, m.RiseSkill(), p)
		if heeded := p.Rise > 10 && p.Expert == "daily"; heeded != c.heeded || (m.RiseSkill() >= minSkill) != c.heeded {
			t.Fatalf("%s: rise %.1f from %q, skill %.2f; want the 14:21 burst heeded: %v", c.name, p.Rise, p.Expert, m.RiseSkill(), c.heeded)
		}
		if c.heeded {
			continue
		}
		// The next day is judged afresh: Monday's 09:07 burst, which may
		// come again, is heeded on Wednesday morning.
		wed := monday.Add(2 * 24 * time.Hour)
		feed(m, now, wed.Sub(now)+9*time.Hour+6*time.Minute+15*time.Second, at())
		p = first(m.Predict(wed.Add(9*time.Hour+6*time.Minute+15*time.Second), 2, 45*time.Second, 45*time.Second))
		if m.RiseSkill() != 1 || p.Rise < 5 || p.Expert != "daily" {
			t.Fatalf("Wednesday 09:06: skill %.2f, %+v; want Monday's 09:07 burst heeded", m.RiseSkill(), p)
		}
	}
}

// A rise that came at its minute on each of the last three days is heeded
// even while the profiles' other rises of the day have not been coming: a
// nightly burst at 02:00 on days whose other bursts come at random minutes
// (here all before 02:00, so that the day's skill has fallen by then).
func TestARiseOnEachOfThreeDaysIsHeeded(t *testing.T) {
	m := New(time.UTC)
	for day := range 4 {
		start := monday.Add(time.Duration(day) * 24 * time.Hour)
		random := []int{10 + 11*day, 30 + 13*day, 55 + 7*day, 75 + 9*day, 95 + 5*day}
		feed(m, start, 24*time.Hour, func(t time.Time) int {
			at := t.Hour()*60 + t.Minute()
			if at >= 120 && at < 123 {
				return 32 // 02:00 every day
			}
			for _, b := range random {
				if at >= b && at < b+3 {
					return 32
				}
			}
			return 2
		})
	}
	now := monday.Add(4*24*time.Hour + time.Hour + 59*time.Minute + 15*time.Second)
	feed(m, monday.Add(4*24*time.Hour), now.Sub(monday.Add(4*24*time.Hour)), func(time.Time) int { return 2 })
	p := first(m.Predict(now, 2, 45*time.Second, 45*time.Second))
	if m.RiseSkill() >= minSkill || p.Rise < 20 || p.Expert != "daily" {
		t.Fatalf("skill %.2f (want under %v: the random bursts did not come again), %+v: want the 02:00 burst heeded", m.RiseSkill(), minSkill, p)
	}
	// Without the streak, the same model heeds nothing.
	m.streak = [MinutesPerDay]uint8{}
	if p := first(m.Predict(now, 2, 45*time.Second, 45*time.Second)); p.Rise != 0 {
		t.Fatalf("without the streak: %+v, want no rise heeded", p)
	}
}

// zMax is the 95 % quantile of the largest of k normal draws: Φ(zMax)^k
// is 0.95, found here by bisection over the normal distribution itself.
func TestZMax(t *testing.T) {
	phi := func(x float64) float64 { return 0.5 * (1 + math.Erf(x/math.Sqrt2)) }
	if zMax(1) != z || zMax(0.5) != z {
		t.Fatalf("zMax(1) = %v, zMax(0.5) = %v, want z", zMax(1), zMax(0.5))
	}
	last := z
	for _, k := range []float64{1.5, 2, 3, 4.5, 10, 100, 1e6} {
		lo, hi := 0.0, 10.0
		for range 100 {
			if mid := (lo + hi) / 2; math.Pow(phi(mid), k) < 0.95 {
				lo = mid
			} else {
				hi = mid
			}
		}
		got := zMax(k)
		if math.Abs(got-lo) > 1e-6 || got <= last || math.IsInf(got, 0) {
			t.Fatalf("zMax(%v) = %v, want %v, above zMax of fewer draws (%v)", k, got, lo, last)
		}
		last = got
	}
}

// The spare follows how long jobs hold their slots: demand within a
// horizon moves less when jobs end within it, so 60 jobs a minute of
// 15 s need a smaller spare than 60 of 10 minutes, by the M/G/∞ queue's counts
// and the largest of the horizon's renewals. Until minHolds jobs have
// ended, and for jobs that outlast the horizon, it is the spare of jobs
// that outlast it; only the last holdSamples count.
func TestSpareFollowsHowLongJobsHoldTheirSlots(t *testing.T) {
	const rate = 60.0
	horizon := 45 * time.Second
	long := math.Round(z * math.Sqrt(2*rate*horizon.Minutes())) // 15.7 → 16
	spare := func(holds ...time.Duration) float64 {
		m := New(time.UTC)
		m.SetWindow(5 * time.Minute)
		for minute := range 60 {
			at := monday.Add(time.Duration(minute) * time.Minute)
			for range int(rate) {
				m.Arrived(at)
			}
			if minute == 58 {
				for _, d := range holds {
					m.Held(d)
				}
			}
			m.Observe(at, 10)
		}
		return first(m.Predict(monday.Add(time.Hour), 10, horizon, horizon)).Spare
	}
	repeat := func(d time.Duration, n int) []time.Duration { return slices.Repeat([]time.Duration{d}, n) }
	short := math.Round(zMax(3) * math.Sqrt(2*rate*0.25)) // 15 s of a 45 s horizon: 11.6 → 12
	// Half of 15 s, half beyond the horizon: (15 + 45) ÷ 2 = 30 s held within it on average.
	mixed := math.Round(zMax(45/30.0) * math.Sqrt(2*rate*0.5)) // 14.2 → 14
	for _, c := range []struct {
		name  string
		holds []time.Duration
		want  float64
	}{
		{"no job ended yet", nil, long},
		{"fewer than minHolds", repeat(15*time.Second, minHolds-1), long},
		{"jobs that outlast the horizon", repeat(10*time.Minute, 100), long},
		{"jobs as long as the horizon", repeat(horizon, 100), long},
		{"15 s jobs", repeat(15*time.Second, 100), short},
		{"15 s and 10 min jobs", append(repeat(15*time.Second, 50), repeat(10*time.Minute, 50)...), mixed},
		{"only the last holdSamples count", append(repeat(10*time.Minute, 3*holdSamples+7), repeat(15*time.Second, holdSamples)...), short},
		{"negative holds are not recorded", append(repeat(-time.Second, 100), repeat(15*time.Second, minHolds-1)...), long},
		{"jobs that held nothing", repeat(0, 100), 0},
	} {
		if got := spare(c.holds...); got != c.want || math.IsNaN(got) {
			t.Errorf("%s: spare %v, want %v", c.name, got, c.want)
		}
	}
	if !(short < long && mixed > short && mixed <= long) {
		t.Fatalf("spares short %v, mixed %v, long %v: want short < mixed ≤ long", short, mixed, long)
	}
}
