package forecast

// The model's state on disk: fixed size, checksummed, written atomically.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"
)

// magic and version head the state file. Version 2 added the recent
// peaks (the hourly expert's memory) after the profiles, version 3 the
// forecast's recent misses (the measured spare's memory) after those,
// version 4 the days running that demand rose at each minute of the day
// after those; older files still load, without them. The day's rise skill
// is not saved: the first minute learned after a start is judged afresh,
// as the first of a day is.
const (
	magic   = "BFC1"
	version = 4
)

// ErrState is wrapped by every error reading a state file.
var ErrState = errors.New("forecast state")

type header struct {
	Version               uint32
	ErrDaily, ErrWeekly   float64
	NBoots, NDeletes      uint8
	Boots, Deletes        [latencySamples]float64
	DailyBins, WeeklyBins uint32
}

// recent is the hourly expert's memory as saved: the peaks of the last
// minutes learned and which minute each is (Unix minutes: a restart
// within two hours finds the ones before it; a longer one finds none that
// still count).
type recent struct {
	At   [recentPeaks]int64
	Peak [recentPeaks]float32
}

// misses is the measured spare's memory as saved: the ring and how many
// minutes it has recorded (a count past its size keeps the ring's place).
type misses struct {
	N      uint32
	Misses [missMinutes]miss
}

// MarshalBinary encodes the learned state: the profiles, the experts'
// errors, the latencies, the recent peaks and misses. Not the minute being
// observed nor the recent arrivals (the spare starts afresh), nor the
// time zone and the window (configuration).
func (m *Model) MarshalBinary() ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(magic)
	h := header{Version: version, ErrDaily: m.errDaily, ErrWeekly: m.errWeekly,
		NBoots: uint8(len(m.boots)), NDeletes: uint8(len(m.deletes)), DailyBins: MinutesPerDay, WeeklyBins: MinutesPerWeek}
	copy(h.Boots[:], m.boots)
	copy(h.Deletes[:], m.deletes)
	binary.Write(&b, binary.LittleEndian, &h)
	binary.Write(&b, binary.LittleEndian, &m.daily)
	binary.Write(&b, binary.LittleEndian, &m.weekly)
	binary.Write(&b, binary.LittleEndian, &recent{At: m.peakAt, Peak: m.recentPeak})
	binary.Write(&b, binary.LittleEndian, &misses{N: uint32(m.nMisses), Misses: m.misses})
	binary.Write(&b, binary.LittleEndian, &m.streak)
	binary.Write(&b, binary.LittleEndian, crc32.ChecksumIEEE(b.Bytes()))
	return b.Bytes(), nil
}

// UnmarshalBinary replaces the learned state with data's. On error the
// model is unchanged.
func (m *Model) UnmarshalBinary(data []byte) error {
	if len(data) < len(magic)+4 || string(data[:len(magic)]) != magic {
		return fmt.Errorf("%w: not a forecast state file", ErrState)
	}
	body, sum := data[:len(data)-4], binary.LittleEndian.Uint32(data[len(data)-4:])
	if crc32.ChecksumIEEE(body) != sum {
		return fmt.Errorf("%w: checksum mismatch (truncated or corrupt)", ErrState)
	}
	r := bytes.NewReader(body[len(magic):])
	var h header
	if err := binary.Read(r, binary.LittleEndian, &h); err != nil {
		return fmt.Errorf("%w: header: %v", ErrState, err)
	}
	switch {
	case h.Version < 1 || h.Version > version:
		return fmt.Errorf("%w: version %d, want 1 to %d", ErrState, h.Version, version)
	case h.DailyBins != MinutesPerDay || h.WeeklyBins != MinutesPerWeek:
		return fmt.Errorf("%w: %d daily and %d weekly bins, want %d and %d", ErrState, h.DailyBins, h.WeeklyBins, MinutesPerDay, MinutesPerWeek)
	case h.NBoots > latencySamples || h.NDeletes > latencySamples:
		return fmt.Errorf("%w: more than %d latency samples", ErrState, latencySamples)
	}
	var daily [MinutesPerDay]Bin
	var weekly [MinutesPerWeek]Bin
	if err := binary.Read(r, binary.LittleEndian, &daily); err != nil {
		return fmt.Errorf("%w: daily profile: %v", ErrState, err)
	}
	if err := binary.Read(r, binary.LittleEndian, &weekly); err != nil {
		return fmt.Errorf("%w: weekly profile: %v", ErrState, err)
	}
	var rp recent
	if h.Version >= 2 {
		if err := binary.Read(r, binary.LittleEndian, &rp); err != nil {
			return fmt.Errorf("%w: recent peaks: %v", ErrState, err)
		}
	}
	var ms misses
	if h.Version >= 3 {
		if err := binary.Read(r, binary.LittleEndian, &ms); err != nil {
			return fmt.Errorf("%w: recent misses: %v", ErrState, err)
		}
	}
	var streak [MinutesPerDay]uint8
	if h.Version >= 4 {
		if err := binary.Read(r, binary.LittleEndian, &streak); err != nil {
			return fmt.Errorf("%w: rise streaks: %v", ErrState, err)
		}
	}
	if r.Len() != 0 {
		return fmt.Errorf("%w: %d bytes of trailing data", ErrState, r.Len())
	}
	finite := func(vs ...float64) bool {
		for _, v := range vs {
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				return false
			}
		}
		return true
	}
	if !finite(h.ErrDaily, h.ErrWeekly) || !finite(h.Boots[:h.NBoots]...) || !finite(h.Deletes[:h.NDeletes]...) {
		return fmt.Errorf("%w: a figure is negative or not finite", ErrState)
	}
	for _, bins := range [][]Bin{daily[:], weekly[:]} {
		for i, b := range bins {
			if !finite(float64(b.Mean)) {
				return fmt.Errorf("%w: bin %d is negative or not finite", ErrState, i)
			}
		}
	}
	for i, p := range rp.Peak {
		if !finite(float64(p)) {
			return fmt.Errorf("%w: recent peak %d is negative or not finite", ErrState, i)
		}
		if rp.At[i] != 0 && rp.At[i]%recentPeaks != int64(i) {
			return fmt.Errorf("%w: recent peak %d is of minute %d, not in its place", ErrState, i, rp.At[i])
		}
	}
	if ms.N >= 2*missMinutes {
		return fmt.Errorf("%w: %d recent misses counted, want under %d", ErrState, ms.N, 2*missMinutes)
	}
	for i, x := range ms.Misses {
		if v := float64(x.Slots); math.IsNaN(v) || math.IsInf(v, 0) || !finite(float64(x.Arrivals)) {
			return fmt.Errorf("%w: recent miss %d is not finite or has negative arrivals", ErrState, i)
		}
	}
	m.errDaily, m.errWeekly = h.ErrDaily, h.ErrWeekly
	m.boots = append([]float64(nil), h.Boots[:h.NBoots]...)
	m.deletes = append([]float64(nil), h.Deletes[:h.NDeletes]...)
	m.bootP90, m.deleteP90 = p90(m.boots), p90(m.deletes)
	m.daily, m.weekly = daily, weekly
	m.peakAt, m.recentPeak = rp.At, rp.Peak
	m.misses, m.nMisses = ms.Misses, int(ms.N)
	m.missSpare = m.measuredSpare()
	m.streak = streak
	return nil
}

// Save writes the model to path atomically.
func (m *Model) Save(path string) error {
	data, _ := m.MarshalBinary()
	return WriteFile(path, data)
}

// WriteFile writes encoded state (MarshalBinary's) to path atomically: a
// synced temporary file renamed over it, so a crash leaves the old state
// or the new, never a mix.
func WriteFile(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".forecast-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// Load reads a model saved at path. A missing file is not an error (found
// false); a damaged one is, and leaves the model as it was.
func (m *Model) Load(path string) (found bool, err error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		return false, err
	}
	if err := m.UnmarshalBinary(data); err != nil {
		return true, fmt.Errorf("%s: %w", path, err)
	}
	return true, nil
}
