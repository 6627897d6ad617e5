package router

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Config configures a Router. Load it once at the edge (berth router's
// flags and environment) and check it with Validate; New applies the
// defaults of the zero durations.
type Config struct {
	// Cells are the cells this router serves, each once.
	Cells []Cell
	// DefaultCell is the cell of requests whose token names no cell (a
	// token minted before routing, an instance runner's token) and of
	// requests without a token: GitLab's "legacy cell". 0: none, such
	// requests are refused with 421.
	DefaultCell int64
	// ExternalURL is the URL clients reach the router at: the issuer of
	// the OpenID discovery document it serves. Every cell's own external
	// URL must be this one too (docs/cells.md). Empty: the discovery
	// document is the first healthy cell's, issuer included.
	ExternalURL string
	// HealthInterval is how often each cell's /-/health is asked
	// (default 5s), HealthTimeout how long one check may take (default
	// 2s, at most the interval).
	HealthInterval, HealthTimeout time.Duration
	// UnhealthyAfter is how many checks in a row must fail before a cell
	// is marked unhealthy (default 2); one good check marks it healthy
	// again.
	UnhealthyAfter int
	// MaxBodyPeek is how much of the body of a runner endpoint that
	// carries its token in JSON (POST /api/v4/jobs/request and the
	// others listed in docs/cells.md) is read to find the token when no
	// header or query parameter has one (default 64 KiB).
	MaxBodyPeek int64
	// DialTimeout bounds connecting to a cell (default 5s). There is no
	// bound on a response's wait: jobs/request long polls are held ~50s.
	DialTimeout time.Duration
}

// Cell is one cell: a coordinator cluster (one berth server or replicas
// behind a load balancer) with its own store.
type Cell struct {
	// ID is the cell's id, as tokens carry it (decimal here, base36 in
	// tokens).
	ID int64
	// URL is where the router reaches the cell: http(s)://host[:port][/path].
	URL string
}

// Defaults are the values New uses for zero fields.
var Defaults = Config{
	HealthInterval: 5 * time.Second,
	HealthTimeout:  2 * time.Second,
	UnhealthyAfter: 2,
	MaxBodyPeek:    64 << 10,
	DialTimeout:    5 * time.Second,
}

// withDefaults is c with zero fields set from Defaults.
func (c Config) withDefaults() Config {
	if c.HealthInterval == 0 {
		c.HealthInterval = Defaults.HealthInterval
	}
	if c.HealthTimeout == 0 {
		c.HealthTimeout = min(Defaults.HealthTimeout, c.HealthInterval)
	}
	if c.UnhealthyAfter == 0 {
		c.UnhealthyAfter = Defaults.UnhealthyAfter
	}
	if c.MaxBodyPeek == 0 {
		c.MaxBodyPeek = Defaults.MaxBodyPeek
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = Defaults.DialTimeout
	}
	return c
}

// Validate says what is wrong with c, all of it (errors.Join), or nil.
// Zero durations and counts are fine: New uses the defaults.
func (c Config) Validate() error {
	var errs []error
	if len(c.Cells) == 0 {
		errs = append(errs, errors.New("no cells: give at least one (--cell ID=URL)"))
	}
	seen := map[int64]bool{}
	for i, cell := range c.Cells {
		if cell.ID <= 0 {
			errs = append(errs, fmt.Errorf("cell %d (%s): id %d: want a positive integer", i+1, cell.URL, cell.ID))
		} else if seen[cell.ID] {
			errs = append(errs, fmt.Errorf("cell %d listed twice", cell.ID))
		}
		seen[cell.ID] = true
		if _, err := cellURL(cell.URL); err != nil {
			errs = append(errs, fmt.Errorf("cell %d: %w", cell.ID, err))
		}
	}
	if c.DefaultCell < 0 {
		errs = append(errs, fmt.Errorf("default cell %d: want a cell id or 0 for none", c.DefaultCell))
	} else if c.DefaultCell > 0 && !seen[c.DefaultCell] {
		errs = append(errs, fmt.Errorf("default cell %d is not one of the cells (%s)", c.DefaultCell, cellList(c.Cells)))
	}
	if c.ExternalURL != "" {
		if _, err := cellURL(c.ExternalURL); err != nil {
			errs = append(errs, fmt.Errorf("external URL: %w", err))
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"health interval", c.HealthInterval}, {"health timeout", c.HealthTimeout}, {"dial timeout", c.DialTimeout}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s %v: want a positive duration", d.name, d.v))
		}
	}
	if d := c.withDefaults(); d.HealthTimeout > d.HealthInterval {
		errs = append(errs, fmt.Errorf("health timeout %v is longer than the health interval %v", d.HealthTimeout, d.HealthInterval))
	}
	if c.UnhealthyAfter < 0 {
		errs = append(errs, fmt.Errorf("unhealthy after %d failed checks: want at least 1", c.UnhealthyAfter))
	}
	if c.MaxBodyPeek < 0 {
		errs = append(errs, fmt.Errorf("body peek of %d bytes: want a positive size", c.MaxBodyPeek))
	}
	return errors.Join(errs...)
}

// cellURL parses an absolute http(s) URL without query or fragment.
func cellURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("URL %q: %w", s, err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("URL %q: want http:// or https://", s)
	case u.Host == "":
		return nil, fmt.Errorf("URL %q: no host", s)
	case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return nil, fmt.Errorf("URL %q: want no user, query or fragment", s)
	}
	return u, nil
}

func cellList(cells []Cell) string {
	ids := make([]string, 0, len(cells))
	for _, c := range cells {
		ids = append(ids, strconv.FormatInt(c.ID, 10))
	}
	return strings.Join(ids, ", ")
}

// ParseCell reads the ID=URL form of a cell (berth router --cell).
func ParseCell(s string) (Cell, error) {
	id, u, ok := strings.Cut(strings.TrimSpace(s), "=")
	if !ok {
		return Cell{}, fmt.Errorf("cell %q: want ID=URL, such as 1=http://127.0.0.1:8081", s)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(id), 10, 64)
	if err != nil || n <= 0 {
		return Cell{}, fmt.Errorf("cell %q: id %q is not a positive integer", s, id)
	}
	u = strings.TrimSpace(u)
	if _, err := cellURL(u); err != nil {
		return Cell{}, fmt.Errorf("cell %d: %w", n, err)
	}
	return Cell{ID: n, URL: u}, nil
}

// ParseCells reads a list of ID=URL cells separated by commas or blanks
// (the BERTH_ROUTER_CELLS form).
func ParseCells(s string) ([]Cell, error) {
	var out []Cell
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' }) {
		c, err := ParseCell(f)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// cellIDs are the ids of cells, sorted.
func cellIDs(cells []Cell) []int64 {
	ids := make([]int64, 0, len(cells))
	for _, c := range cells {
		ids = append(ids, c.ID)
	}
	slices.Sort(ids)
	return ids
}
