package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/berthci/berth/taskscaler"
)

// Warning is a key of the file Berth does not act on. It is never silent:
// the runner logs every warning at start.
type Warning struct {
	File string
	Line int
	Key  string // full name: runners.docker.privileged
	Msg  string
}

func (w Warning) String() string {
	loc := w.File
	if w.Line > 0 {
		loc = fmt.Sprintf("%s:%d", w.File, w.Line)
	}
	return fmt.Sprintf("%s: %s: %s", loc, w.Key, w.Msg)
}

// gitlabSections are sub-tables GitLab Runner knows; Berth warns that they
// are not supported yet (they belong to later executors or features).
var gitlabSections = map[string]string{
	"session_server":             "interactive web terminal",
	"runners.cache.gcs":          "the gcs distributed cache (Berth has s3)",
	"runners.cache.azure":        "the azure distributed cache (Berth has s3)",
	"runners.artifact":           "artifact signing",
	"runners.instance":           "the instance executor",
	"runners.kubernetes":         "the kubernetes executor",
	"runners.machine":            "the docker+machine executor",
	"runners.parallels":          "the parallels executor",
	"runners.virtualbox":         "the virtualbox executor",
	"runners.referees":           "referees",
	"runners.step_runner":        "step-runner",
	"runners.monitoring":         "monitoring",
	"runners.kubernetes.volumes": "the kubernetes executor",
}

// gitlabKeys are plain keys GitLab Runner knows that Berth does not act on
// yet.
var gitlabKeys = map[string]bool{
	"sentry_dsn": true, "shutdown_timeout_seconds": true,
	"runners.pre_clone_script": true, "runners.post_clone_script": true, "runners.environment_variables": true,
	"runners.unhealthy_requests_limit_window": true,
	"runners.max_builds":                      true, "runners.request_timeout": true,
	// [runners.cache.s3] keys of AWS features Berth does not use.
	"runners.cache.s3.DualStack": true, "runners.cache.s3.Accelerate": true,
	"runners.cache.s3.RoleARN": true, "runners.cache.s3.UploadRoleARN": true,
}

// decodeErrRE matches the type errors of the TOML decoder, which are not
// ParseErrors: toml: line 3 (last key "concurrent"): incompatible types…
var decodeErrRE = regexp.MustCompile(`^toml: (?:line (\d+) )?\(last key "([^"]*)"\): (.*)$`)

// Load reads, decodes and validates path. Warnings name every key Berth
// does not act on. Errors name the file, the line and the key.
func Load(path string) (*Config, []Warning, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("reading config: %w", err)
	}
	c, warns, err := Parse(path, data)
	if err != nil {
		return nil, warns, err
	}
	// [runners.autoscaler.state_storage] dir is beside config.toml, as in
	// GitLab Runner, unless absolute.
	for _, r := range c.Runners {
		if r == nil {
			continue
		}
		// TLS files named relatively are beside config.toml too, and so
		// is the certificate directory.
		r.CertsDir = filepath.Join(filepath.Dir(path), CertsDirName)
		for _, f := range []*string{&r.TLSCAFile, &r.TLSCertFile, &r.TLSKeyFile} {
			if *f != "" && !filepath.IsAbs(*f) {
				*f = filepath.Join(filepath.Dir(path), *f)
			}
		}
		if r.Autoscaler == nil {
			continue
		}
		d := r.Autoscaler.StateStorage.Dir
		if d == "" {
			d = taskscaler.DefaultStateStorageDir
		}
		if !filepath.IsAbs(d) {
			abs, err := filepath.Abs(filepath.Join(filepath.Dir(path), d))
			if err != nil {
				return nil, warns, err
			}
			r.Autoscaler.StateStorage.Dir = abs
		}
	}
	return c, warns, nil
}

// Parse is Load for data already read; name is used in messages.
func Parse(name string, data []byte) (*Config, []Warning, error) {
	var c Config
	md, err := toml.Decode(string(data), &c)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			key := pe.LastKey
			if key == "" {
				key = "(syntax)"
			}
			return nil, nil, &FieldError{File: name, Line: pe.Position.Line, Key: key, Msg: pe.Message}
		}
		if m := decodeErrRE.FindStringSubmatch(err.Error()); m != nil {
			line, _ := strconv.Atoi(m[1])
			return nil, nil, &FieldError{File: name, Line: line, Key: m[2], Msg: m[3]}
		}
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	var raw map[string]any
	if _, err := toml.Decode(string(data), &raw); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	c.raw = raw
	if rr, ok := raw["runners"].([]map[string]any); ok {
		for i, r := range c.Runners {
			if r != nil && i < len(rr) {
				r.raw = rr[i]
			}
		}
	}
	loc := locate(data)
	if !md.IsDefined("concurrent") {
		c.Concurrent = DefaultConcurrent
	}
	for _, r := range c.Runners {
		if r != nil {
			r.URL = expandEnv(r.URL)
			r.Token = expandEnv(r.Token)
		}
	}

	var warns []Warning
	seen := map[string]int{}
	for _, k := range md.Undecoded() {
		full := k.String()
		if strings.HasPrefix(full, "runners.plugin.config.") || strings.HasPrefix(full, "runners.autoscaler.plugin_config.") ||
			strings.HasPrefix(full, "runners.autoscaler.vm_isolation.") {
			continue // handed to the plugin as it is; the plugin checks it
		}
		n := seen[full]
		seen[full]++
		w := Warning{File: name, Line: loc.line(full, n), Key: full}
		switch {
		case md.Type(k...) == "Hash" || md.Type(k...) == "ArrayHash":
			if what, ok := gitlabSections[full]; ok {
				w.Msg = "section not supported by Berth yet (" + what + "); ignored"
			} else {
				w.Msg = "unknown section; ignored"
			}
		case gitlabKeys[full]:
			w.Msg = "not supported by Berth yet; ignored"
		case supportedSectionOf(full) != "":
			w.Msg = "not supported by Berth's " + supportedSectionOf(full) + " executor; ignored"
		case knownSectionOf(full) != "":
			w.Msg = "not supported by Berth yet (" + gitlabSections[knownSectionOf(full)] + "); ignored"
		default:
			w.Msg = "unknown key; ignored"
		}
		warns = append(warns, w)
	}
	if err := c.Validate(); err != nil {
		return nil, warns, locateErrors(name, loc, err)
	}
	for i, r := range c.Runners {
		if r != nil && r.Docker != nil && (r.Docker.HelperImage != "" || r.Docker.HelperImageFlavor != "") {
			key := fmt.Sprintf("runners[%d].docker.helper_image", i)
			warns = append(warns, Warning{File: name, Line: loc.indexedLine(key), Key: key,
				Msg: "ignored: Berth runs every stage in the job's container with the berth binary mounted, so it needs no helper image"})
		}
	}
	for i, r := range c.Runners {
		if r == nil {
			continue
		}
		if r.CloneURL != "" && !r.UsesCloneURL() {
			key := fmt.Sprintf("runners[%d].clone_url", i)
			warns = append(warns, Warning{File: name, Line: loc.indexedLine(key), Key: key,
				Msg: fmt.Sprintf("%q has no scheme (want e.g. https://host); ignored, as gitlab-runner ignores it: jobs fetch from the repository URL GitLab gives", r.CloneURL)})
		}
		if msg := cacheTypeWarning(r.Cache); msg != "" {
			key := fmt.Sprintf("runners[%d].cache.Type", i)
			warns = append(warns, Warning{File: name, Line: loc.indexedLine(key), Key: key, Msg: msg})
		}
	}
	for i, r := range c.Runners {
		if r != nil && !Supported(r.Executor) {
			key := fmt.Sprintf("runners[%d].executor", i)
			warns = append(warns, Warning{File: name, Line: loc.indexedLine(key), Key: key,
				Msg: fmt.Sprintf("executor %q is not supported by Berth yet (supported: %s); this runner will not run jobs", r.Executor, strings.Join(SupportedExecutors, ", "))})
		}
	}
	return &c, warns, nil
}

// supportedSections are executor sections Berth decodes; a key in them
// that Berth does not know is named with its executor.
var supportedSections = map[string]string{"runners.docker": "docker", "runners.ssh": "ssh", "runners.custom": "custom", "runners.plugin": "plugin", "runners.microvm": "microvm", "runners.autoscaler": "autoscaled"}

func supportedSectionOf(key string) string {
	for s, name := range supportedSections {
		if strings.HasPrefix(key, s+".") {
			return name
		}
	}
	return ""
}

func knownSectionOf(key string) string {
	best := ""
	for s := range gitlabSections {
		if strings.HasPrefix(key, s+".") && len(s) > len(best) {
			best = s
		}
	}
	return best
}

// locateErrors adds file and line to the field errors of Validate.
func locateErrors(name string, loc *locator, err error) error {
	var errs []error
	var list []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	} else {
		list = []error{err}
	}
	for _, e := range list {
		var fe *FieldError
		if errors.As(e, &fe) {
			fe.File = name
			fe.Line = loc.indexedLine(fe.Key)
		}
		errs = append(errs, e)
	}
	return errors.Join(errs...)
}

// locator knows on which line each key of a TOML document is. BurntSushi's
// metadata has no public positions, so the document is scanned: table
// headers, [[runners]] entries and key = value lines, skipping multi-line
// strings.
type locator struct {
	lines   map[string][]int // full dotted name → lines of its occurrences
	indexed map[string]int   // runners[N].key → line
}

func (l *locator) line(full string, occurrence int) int {
	ls := l.lines[full]
	if occurrence < len(ls) {
		return ls[occurrence]
	}
	if len(ls) > 0 {
		return ls[0]
	}
	return 0
}

// indexedLine finds runners[N].key; for a key that is absent it falls back
// to the line of the [[runners]] header of entry N.
func (l *locator) indexedLine(key string) int {
	if n, ok := l.indexed[key]; ok {
		return n
	}
	// An element of an array value is on its key's line.
	if i := strings.LastIndexByte(key, '['); i > strings.LastIndexByte(key, '.') && strings.HasSuffix(key, "]") {
		if n, ok := l.indexed[key[:i]]; ok {
			return n
		}
	}
	// A key that is absent from its section points at the section.
	for k := key; strings.Count(k, ".") > 1; {
		k = k[:strings.LastIndexByte(k, '.')]
		if n, ok := l.indexed[k]; ok {
			return n
		}
	}
	if i := strings.Index(key, "]."); i > 0 {
		if n, ok := l.indexed[key[:i+1]]; ok {
			return n
		}
	}
	if i := strings.Index(key, "["); i > 0 {
		if n, ok := l.indexed[key[:i]]; ok {
			return n
		}
	}
	return l.line(key, 0)
}

func locate(data []byte) *locator {
	l := &locator{lines: map[string][]int{}, indexed: map[string]int{}}
	table := ""
	runnerIdx := -1
	inMulti := ""
	add := func(full string, n int) {
		l.lines[full] = append(l.lines[full], n)
		if runnerIdx >= 0 && (full == "runners" || strings.HasPrefix(full, "runners.")) {
			ix := fmt.Sprintf("runners[%d]%s", runnerIdx, strings.TrimPrefix(full, "runners"))
			if _, ok := l.indexed[ix]; !ok {
				l.indexed[ix] = n
			}
		} else if _, ok := l.indexed[full]; !ok {
			l.indexed[full] = n
		}
	}
	for i, ln := range strings.Split(string(data), "\n") {
		n := i + 1
		s := strings.TrimSpace(ln)
		if inMulti != "" {
			if strings.Count(s, inMulti)%2 == 1 {
				inMulti = ""
			}
			continue
		}
		if s == "" || s[0] == '#' {
			continue
		}
		if strings.HasPrefix(s, "[[") {
			name := cleanKey(strings.TrimSuffix(strings.TrimSpace(strings.TrimPrefix(strings.SplitN(s, "]]", 2)[0], "[[")), "]"))
			table = name
			if name == "runners" {
				runnerIdx++
			}
			add(name, n)
			continue
		}
		if s[0] == '[' {
			name := cleanKey(strings.TrimPrefix(strings.SplitN(s, "]", 2)[0], "["))
			table = name
			if name != "runners" && !strings.HasPrefix(name, "runners.") {
				runnerIdx = -1
			}
			add(name, n)
			continue
		}
		k, v, ok := strings.Cut(s, "=")
		if !ok {
			continue
		}
		full := cleanKey(k)
		if table != "" {
			full = table + "." + full
		}
		add(full, n)
		for _, q := range []string{`"""`, `'''`} {
			if strings.Count(v, q)%2 == 1 {
				inMulti = q
			}
		}
	}
	// Sort nothing; keep document order. (Occurrences are appended in order.)
	for k := range l.lines {
		sort.Ints(l.lines[k])
	}
	return l
}

// cleanKey normalises a dotted key: trims blanks around parts and quotes.
func cleanKey(k string) string {
	parts := strings.Split(k, ".")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if len(p) >= 2 && (p[0] == '"' || p[0] == '\'') && p[len(p)-1] == p[0] {
			p = p[1 : len(p)-1]
		}
		parts[i] = p
	}
	return strings.Join(parts, ".")
}

// Path of .runner_system_id for a config file.
func systemIDPath(configPath string) string {
	return filepath.Join(filepath.Dir(configPath), ".runner_system_id")
}
