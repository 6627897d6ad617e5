package docker

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/berthci/berth/internal/reap"
	"github.com/berthci/berth/runnerapi"
)

// serviceSpec is one service of a job, from [[runners.docker.services]]
// or the job's services:.
type serviceSpec struct {
	image      string   // variables expanded
	aliases    []string // the user's, then the two derived from the image name
	entrypoint []string // nil: the image's
	command    []string // nil: the image's
	env        []string // job variables, then the service's own
	user       string
	platform   *ocispec.Platform
	policies   []string
}

// serviceSpecs are a job's services: [[runners.docker.services]], then
// the job's services: (checked against allowed_services), at most
// services_limit of them.
func (s *settings) serviceSpecs(job *runnerapi.JobResponse, expand func(string) string, out io.Writer) ([]serviceSpec, error) {
	var specs []serviceSpec
	baseEnv := jobEnv(job)
	for i, cs := range s.cfg.Services {
		sp := serviceSpec{image: expand(cs.Name), entrypoint: s.entrypoint(cs.Entrypoint, out), command: cs.Command}
		if _, err := parseImageName(sp.image); err != nil {
			return nil, fmt.Errorf("docker.services[%d].name: %w", i, err)
		}
		sp.aliases = appendUnique(splitAliases(cs.Alias), derivedAliases(sp.image)...)
		sp.env = append([]string(nil), baseEnv...)
		for _, kv := range cs.Variables {
			k, v, _ := strings.Cut(kv, "=")
			sp.env = append(sp.env, k+"="+expand(v))
		}
		var err error
		if sp.policies, err = s.resolvePullPolicies(sp.image, nil); err != nil {
			return nil, err
		}
		specs = append(specs, sp)
	}
	if job != nil {
		for i, js := range job.Services {
			sp := serviceSpec{image: expand(js.Name), entrypoint: s.entrypoint(js.Entrypoint, out), command: js.Command}
			if _, err := parseImageName(sp.image); err != nil {
				return nil, fmt.Errorf("services[%d]: %w", i, err)
			}
			if !allowed(s.allowedServices, sp.image) {
				err := notAllowedError("service", sp.image, s.allowedServices)
				fmt.Fprintf(out, "%sERROR: %v%s\n", ansiRed, err, ansiReset)
				return nil, err
			}
			sp.aliases = appendUnique(splitAliases(expand(js.Alias)), derivedAliases(sp.image)...)
			sp.env = append([]string(nil), baseEnv...)
			for _, v := range js.Variables {
				sp.env = append(sp.env, v.Key+"="+expand(v.Value))
			}
			var err error
			if o := js.ExecutorOpts; o != nil && o.Docker != nil {
				sp.user = string(o.Docker.User)
				if sp.platform, err = parsePlatform(o.Docker.Platform); err != nil {
					return nil, fmt.Errorf("services[%d] %q: executor_opts: %w", i, sp.image, err)
				}
			}
			if sp.policies, err = s.resolvePullPolicies(sp.image, js.PullPolicy); err != nil {
				return nil, err
			}
			specs = append(specs, sp)
		}
	}
	if s.servicesLimit >= 0 && len(specs) > s.servicesLimit {
		return nil, fmt.Errorf("the job has %d services, more than docker.services_limit (%d): %w", len(specs), s.servicesLimit, ErrNotAllowed)
	}
	return specs, nil
}

// splitAliases splits an alias: value GitLab-style: several aliases
// separated by commas and/or spaces.
func splitAliases(a string) []string {
	return strings.Fields(strings.ReplaceAll(a, ",", " "))
}

var (
	// referencePrefix is the name part of an image reference (before
	// :tag and @digest).
	referencePrefix = regexp.MustCompile(`^(.*?)(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,})?$`)
	// registryPort strips a registry's port: GitLab's ReferenceRegexpNoPort.
	registryPort = regexp.MustCompile(`^(.*?)(|:[0-9]+)(|/.*)$`)
)

// derivedAliases are the two aliases GitLab derives from a service's
// image name: the name without tag, digest and registry port, with "/"
// as "__" and, when different, with "/" as "-" (RFC 1123).
func derivedAliases(image string) []string {
	m := referencePrefix.FindStringSubmatch(image)
	if m == nil || m[1] == "" {
		return nil
	}
	np := registryPort.FindStringSubmatch(m[1])
	service := m[1]
	if np != nil {
		service = np[1] + np[3]
	}
	if service == "" {
		return nil
	}
	out := []string{strings.ReplaceAll(service, "/", "__")}
	if alt := strings.ReplaceAll(service, "/", "-"); alt != out[0] {
		out = append(out, alt)
	}
	return out
}

// appendUnique appends the elements of add not in list yet.
func appendUnique(list []string, add ...string) []string {
	for _, a := range add {
		dup := false
		for _, l := range list {
			if l == a {
				dup = true
				break
			}
		}
		if !dup {
			list = append(list, a)
		}
	}
	return list
}

// jobEnv is the job's variables as KEY=VALUE (file variables excluded:
// their files exist only in the build container).
func jobEnv(job *runnerapi.JobResponse) []string {
	if job == nil {
		return nil
	}
	env := make([]string, 0, len(job.Variables))
	for _, v := range job.Variables {
		if v.File || v.Key == "" {
			continue
		}
		env = append(env, v.Key+"="+v.Value)
	}
	return env
}

// expander expands $VAR and ${VAR} with a job's variables (last wins).
func expander(job *runnerapi.JobResponse) func(string) string {
	return job.ExpandVariables
}

// envValue is the last value of key in env.
func envValue(env []string, key string) string {
	v := ""
	for _, e := range env {
		if k, val, ok := strings.Cut(e, "="); ok && k == key {
			v = val
		}
	}
	return v
}

// service is a started service container.
type service struct {
	spec serviceSpec
	name string
	id   string
	// host is the address the health check connects to ("" when the
	// service cannot be reached from the job).
	host  string
	ports []int
}

// healthPorts are the ports the health check waits for: the service's
// HEALTHCHECK_TCP_PORT, else its first 20 exposed TCP ports.
func healthPorts(env []string, exposed map[string]struct{}) ([]int, error) {
	if v := envValue(env, "HEALTHCHECK_TCP_PORT"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || n > 65535 {
			return nil, fmt.Errorf("HEALTHCHECK_TCP_PORT %q is not a port number", v)
		}
		return []int{n}, nil
	}
	var ports []int
	for p := range exposed {
		num, proto, _ := strings.Cut(p, "/")
		if proto != "" && proto != "tcp" {
			continue
		}
		if n, err := strconv.Atoi(num); err == nil && n > 0 && n <= 65535 {
			ports = append(ports, n)
		}
	}
	sort.Ints(ports)
	if len(ports) > 20 {
		ports = ports[:20]
	}
	return ports, nil
}

// waitForServices waits, up to the configured timeout, until every port
// of every service accepts TCP connections, checked from inside the job's
// network: a probe runs in the build container (bash's /dev/tcp, else nc)
// and connects to each service's address there. A service that does not
// come up gets GitLab's warning with its container's log in out; the job
// goes on either way.
func (e *Executor) waitForServices(ctx context.Context, j *job, out io.Writer) error {
	timeout := e.p.set.servicesTimeout
	var targets []string
	for i, s := range j.services {
		if s.host == "" {
			continue
		}
		for _, port := range s.ports {
			targets = append(targets, fmt.Sprintf("%d/%s/%d", i, s.host, port))
		}
	}
	if timeout <= 0 || len(targets) == 0 {
		return nil
	}
	fmt.Fprintf(out, "Waiting for services to be up and running (timeout %d seconds)...\n", int(timeout/time.Second))
	up := map[string]bool{}
	var mu sync.Mutex
	lines := &lineWriter{fn: func(line string) {
		if t, ok := strings.CutPrefix(line, "up "); ok {
			mu.Lock()
			up[t] = true
			mu.Unlock()
		}
		if line == "no-probe" {
			mu.Lock()
			up["no-probe"] = true
			mu.Unlock()
		}
	}}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	marker := reap.NewScopedMarker(j.scope)
	code, err := e.p.runExec(pctx, j.buildID, execSpec{
		cmd:  append([]string{j.shellPath, "-c", probeScript, "berth-probe"}, targets...),
		user: "0",
		env:  []string{reap.Env(marker)},
	}, lines, func(sctx context.Context, exited <-chan struct{}) {
		_ = e.reap(sctx, j, marker, "KILL")
	})
	lines.flush()
	if ctx.Err() != nil {
		return fmt.Errorf("waiting for services: %w", ctx.Err())
	}
	if err != nil && pctx.Err() == nil {
		return fmt.Errorf("waiting for services: %w", err)
	}
	if up["no-probe"] {
		fmt.Fprintf(out, "%sWARNING: cannot check whether services are up: the job image has neither bash nor nc%s\n", ansiYellow, ansiReset)
		return nil
	}
	reason := func(s *service, down []string) string {
		if pctx.Err() == nil {
			return fmt.Sprintf("service %q: the health check ended with exit status %d before port %s of %s accepted a TCP connection",
				s.name, code, strings.Join(down, ", "), s.host)
		}
		return fmt.Sprintf("service %q timeout: port %s of %s did not accept a TCP connection within %s",
			s.name, strings.Join(down, ", "), s.host, timeout)
	}
	for i, s := range j.services {
		var down []string
		for _, port := range s.ports {
			if !up[fmt.Sprintf("%d/%s/%d", i, s.host, port)] {
				down = append(down, strconv.Itoa(port))
			}
		}
		if s.host == "" || len(down) == 0 {
			continue
		}
		e.serviceWarning(ctx, s, reason(s, down), out)
	}
	return nil
}

// serviceWarning prints GitLab's "probably didn't start properly" warning
// with the service container's log.
func (e *Executor) serviceWarning(ctx context.Context, s *service, reason string, out io.Writer) {
	logs := &outputTail{max: 64 << 10}
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if ins, err := e.p.cli.ContainerInspect(lctx, s.id); err == nil && ins.State != nil && !ins.State.Running {
		reason += fmt.Sprintf(" (the container exited with status %d)", ins.State.ExitCode)
	}
	if rc, err := e.p.cli.ContainerLogs(lctx, s.id, container.LogsOptions{ShowStdout: true, ShowStderr: true, Timestamps: true}); err == nil {
		_, _ = stdcopy.StdCopy(logs, logs, rc)
		rc.Close()
	} else {
		fmt.Fprintf(logs, "(reading the log: %v)\n", err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%s*** WARNING:%s Service %s probably didn't start properly.\n\n", ansiYellow, ansiReset, s.name)
	fmt.Fprintf(&b, "Health check error:\n%s\n\n", reason)
	b.WriteString("Service container logs:\n")
	if logs.cut {
		b.WriteString("(earlier lines cut)\n")
	}
	l := strings.TrimRight(string(logs.buf), "\n")
	if l != "" {
		b.WriteString(l + "\n")
	}
	fmt.Fprintf(&b, "\n%s*********%s\n\n", ansiYellow, ansiReset)
	_, _ = io.WriteString(out, b.String())
}

// lineWriter calls fn for every complete line written to it (without its
// "\r\n" or "\n"); with max > 0, a line that grows to max bytes without
// ending is handed over in pieces of that size.
type lineWriter struct {
	fn  func(string)
	max int
	buf []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			if w.max > 0 && len(w.buf) >= w.max {
				w.flush()
			}
			return len(p), nil
		}
		w.fn(string(bytes.TrimSuffix(w.buf[:i], []byte("\r"))))
		w.buf = w.buf[i+1:]
	}
}

// flush hands over what is left of a line.
func (w *lineWriter) flush() {
	if len(w.buf) > 0 {
		w.fn(string(w.buf))
		w.buf = w.buf[:0]
	}
}
