package docker

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"

	"github.com/distribution/reference"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/registry"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/jsonmessage"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/config"
	"github.com/berthci/berth/runnerapi"
)

// ErrImagePull is wrapped by every error of a job whose image or service
// image could not be made available under its pull policies (a failed
// pull, or an image missing locally with pull_policy never). The runner
// maps it to GitLab's image_pull_failure.
var ErrImagePull = executor.ErrImagePull

// ErrNotAllowed is wrapped by the error of a job that asks for something
// the runner's configuration refuses: an image not in allowed_images, a
// service not in allowed_services, a pull policy not in
// allowed_pull_policies, more services than services_limit.
var ErrNotAllowed = executor.ErrNotAllowed

// parseImageName checks an image reference ("alpine", "alpine:3",
// "registry:5000/group/img@sha256:…") and returns it parsed.
func parseImageName(name string) (reference.Named, error) {
	if strings.TrimSpace(name) != name || name == "" {
		return nil, fmt.Errorf("image name %q: empty or surrounded by spaces", name)
	}
	ref, err := reference.ParseNormalizedNamed(name)
	if err != nil {
		return nil, fmt.Errorf("image name %q: %w", name, err)
	}
	return ref, nil
}

// glob is one pattern of allowed_images or allowed_services, matched as
// GitLab matches them (doublestar): "*" and "?" stay within one path
// segment, "**" crosses "/", "[…]" and "{a,b}" as in shells.
type glob struct {
	pattern string
	re      *regexp.Regexp
}

func (g glob) match(s string) bool { return g.re.MatchString(s) }

// compileGlob turns a doublestar pattern into a regular expression.
func compileGlob(p string) (glob, error) {
	if p == "" {
		return glob{}, errors.New("empty pattern")
	}
	var b strings.Builder
	b.WriteString("^")
	depth := 0
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch c {
		case '*':
			if i+1 < len(p) && p[i+1] == '*' {
				b.WriteString(".*")
				i++
			} else {
				b.WriteString("[^/]*")
			}
		case '?':
			b.WriteString("[^/]")
		case '\\':
			if i+1 >= len(p) {
				return glob{}, fmt.Errorf("pattern %q ends with a backslash", p)
			}
			i++
			b.WriteString(regexp.QuoteMeta(string(p[i])))
		case '[':
			j := strings.IndexByte(p[i+1:], ']')
			if j < 0 {
				return glob{}, fmt.Errorf("pattern %q: unclosed [", p)
			}
			class := p[i+1 : i+1+j]
			if class == "" || class == "!" || class == "^" {
				return glob{}, fmt.Errorf("pattern %q: empty character class", p)
			}
			if class[0] == '!' {
				class = "^" + class[1:]
			}
			b.WriteString("[" + strings.ReplaceAll(class, `\`, `\\`) + "]")
			i += j + 1
		case '{':
			depth++
			b.WriteString("(?:")
		case '}':
			if depth == 0 {
				b.WriteString(`\}`)
				continue
			}
			depth--
			b.WriteString(")")
		case ',':
			if depth > 0 {
				b.WriteString("|")
			} else {
				b.WriteString(",")
			}
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	if depth != 0 {
		return glob{}, fmt.Errorf("pattern %q: unclosed {", p)
	}
	b.WriteString("$")
	re, err := regexp.Compile(b.String())
	if err != nil {
		return glob{}, fmt.Errorf("pattern %q: %w", p, err)
	}
	return glob{pattern: p, re: re}, nil
}

// allowed reports whether name matches one of patterns (none: all).
func allowed(patterns []glob, name string) bool {
	if len(patterns) == 0 {
		return true
	}
	for _, g := range patterns {
		if g.match(name) {
			return true
		}
	}
	return false
}

// notAllowedError is GitLab's message for an image or service outside
// its allow list.
func notAllowedError(kind, name string, patterns []glob) error {
	var b strings.Builder
	fmt.Fprintf(&b, "the %q %s is not present on the list of allowed %ss (docker.allowed_%ss):", name, kind, kind, kind)
	for _, g := range patterns {
		b.WriteString("\n- " + g.pattern)
	}
	return fmt.Errorf("%s\n%w", b.String(), ErrNotAllowed)
}

// resolvePullPolicies is the list of pull policies for an image: the
// job's when it names any, else pull_policy, each kept only when
// allowed_pull_policies (default: pull_policy) holds it, in order.
func (s *settings) resolvePullPolicies(img string, job []string) ([]string, error) {
	policies, from := s.pullPolicies, "the runner's docker.pull_policy"
	if len(job) > 0 {
		policies, from = job, "the job's pull_policy"
		for _, p := range job {
			if !validPullPolicy(p) {
				return nil, fmt.Errorf("image %q: pull_policy %q is not always, if-not-present or never", img, p)
			}
		}
	}
	var out []string
	for _, p := range policies {
		if slices.Contains(s.allowedPullPolicies, p) {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("invalid pull policy for image %q: pull_policy %v (from %s) is not one of the allowed_pull_policies %v: %w",
			img, policies, from, s.allowedPullPolicies, ErrNotAllowed)
	}
	return out, nil
}

// parsePlatform parses executor_opts.docker.platform ("linux/arm64/v8").
func parsePlatform(p string) (*ocispec.Platform, error) {
	if p == "" {
		return nil, nil
	}
	parts := strings.Split(p, "/")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return nil, fmt.Errorf("platform %q: want os/arch[/variant]", p)
	}
	pl := &ocispec.Platform{OS: parts[0], Architecture: parts[1]}
	if len(parts) == 3 {
		pl.Variant = parts[2]
	}
	return pl, nil
}

// imageRequest is one image a job needs.
type imageRequest struct {
	name     string // as the job wrote it (variables expanded)
	policies []string
	platform *ocispec.Platform
	// For the build image: the job's image:entrypoint (nil: the
	// image's) and image:docker:user.
	entrypoint []string
	user       string
}

// buildImage is the job's image: (name, entrypoint, pull_policy,
// executor_opts), else the runner's image, checked against
// allowed_images and allowed_pull_policies. The runner's image is always
// allowed.
func (s *settings) buildImage(job *runnerapi.JobResponse, expand func(string) string, out io.Writer) (imageRequest, error) {
	img := imageRequest{name: expand(s.cfg.Image)}
	var jobPolicies []string
	if job != nil && job.Image != nil && job.Image.Name != "" {
		ji := job.Image
		img.name = expand(ji.Name)
		img.entrypoint = s.entrypoint(ji.Entrypoint, out)
		jobPolicies = ji.PullPolicy
		if ji.ExecutorOpts != nil && ji.ExecutorOpts.Docker != nil {
			img.user = string(ji.ExecutorOpts.Docker.User)
			var err error
			if img.platform, err = parsePlatform(ji.ExecutorOpts.Docker.Platform); err != nil {
				return img, fmt.Errorf("image %q: executor_opts: %w", img.name, err)
			}
		}
	}
	if img.name == "" {
		return img, errors.New("no image: the job names none and [runners.docker] image is not set")
	}
	if _, err := parseImageName(img.name); err != nil {
		return img, fmt.Errorf("image: %w", err)
	}
	if img.name != expand(s.cfg.Image) && !allowed(s.allowedImages, img.name) {
		err := notAllowedError("image", img.name, s.allowedImages)
		fmt.Fprintf(out, "%sERROR: %v%s\n", ansiRed, err, ansiReset)
		return img, err
	}
	var err error
	img.policies, err = s.resolvePullPolicies(img.name, jobPolicies)
	return img, err
}

// entrypoint is the entrypoint a job or a [[runners.docker.services]]
// entry gives, or nil (the image's) with disable_entrypoint_overwrite,
// with GitLab's warning.
func (s *settings) entrypoint(ep []string, out io.Writer) []string {
	if len(ep) == 0 || !s.cfg.DisableEntrypointOverwrite {
		return ep
	}
	fmt.Fprintf(out, "%sWARNING: Entrypoint override disabled%s\n", ansiYellow, ansiReset)
	return nil
}

// ensureImage makes the image available under its pull policies, tried
// in order (a repeated policy is a retry), and returns it inspected.
// Failures wrap ErrImagePull.
func (p *Provider) ensureImage(ctx context.Context, req imageRequest, auth func(reference.Named) string, out io.Writer) (image.InspectResponse, error) {
	ref, err := parseImageName(req.name)
	if err != nil {
		return image.InspectResponse{}, err
	}
	var errs []error
	for i, policy := range req.policies {
		if i > 0 {
			fmt.Fprintf(out, "%sWARNING: %v; trying pull policy %q%s\n", ansiYellow, errs[len(errs)-1], policy, ansiReset)
		}
		if policy != config.PullAlways {
			ins, err := p.cli.ImageInspect(ctx, req.name)
			switch {
			case err == nil && platformMatches(ins, req.platform):
				fmt.Fprintf(out, "Using locally found image version due to %q pull policy\n", policy)
				fmt.Fprintf(out, "Using docker image %s for %s ...\n", ins.ID, req.name)
				return ins, nil
			case err != nil && !client.IsErrNotFound(err):
				return image.InspectResponse{}, fmt.Errorf("inspecting image %s: %w", req.name, err)
			}
			if ctx.Err() != nil {
				return image.InspectResponse{}, fmt.Errorf("inspecting image %s: %w", req.name, ctx.Err())
			}
			if policy == config.PullNever {
				errs = append(errs, fmt.Errorf("image %q is not present locally and the pull policy is %q", req.name, policy))
				continue
			}
		}
		if err := p.pull(ctx, ref, req.platform, auth(ref), out); err != nil {
			if ctx.Err() != nil {
				return image.InspectResponse{}, fmt.Errorf("pulling image %s: %w", req.name, ctx.Err())
			}
			errs = append(errs, fmt.Errorf("pulling image %q with pull policy %q: %w", req.name, policy, err))
			continue
		}
		ins, err := p.cli.ImageInspect(ctx, req.name)
		if err != nil {
			return image.InspectResponse{}, fmt.Errorf("inspecting pulled image %s: %w", req.name, err)
		}
		fmt.Fprintf(out, "Using docker image %s for %s with digest %s ...\n", ins.ID, req.name, strings.Join(ins.RepoDigests, ", "))
		return ins, nil
	}
	return image.InspectResponse{}, fmt.Errorf("%w: %w", ErrImagePull, errors.Join(errs...))
}

func platformMatches(ins image.InspectResponse, want *ocispec.Platform) bool {
	if want == nil {
		return true
	}
	return ins.Os == want.OS && ins.Architecture == want.Architecture && (want.Variant == "" || ins.Variant == want.Variant)
}

// pull pulls one image, printing GitLab's line, and reads the daemon's
// progress stream to its end (an error in it is the pull's error).
func (p *Provider) pull(ctx context.Context, ref reference.Named, platform *ocispec.Platform, auth string, out io.Writer) error {
	name := reference.FamiliarString(reference.TagNameOnly(ref))
	fmt.Fprintf(out, "Pulling docker image %s ...\n", name)
	o := image.PullOptions{RegistryAuth: auth}
	if platform != nil {
		o.Platform = strings.TrimSuffix(platform.OS+"/"+platform.Architecture+"/"+platform.Variant, "/")
	}
	rc, err := p.cli.ImagePull(ctx, name, o)
	if err != nil {
		return err
	}
	defer rc.Close()
	return jsonmessage.DisplayJSONMessagesStream(rc, io.Discard, 0, false, nil)
}

// registryAuth returns the credentials for pulls of one job: from the
// DOCKER_AUTH_CONFIG variable (a docker config.json) first, then from the
// job payload's registry credentials. It returns "" for registries it has
// no credentials for.
func registryAuth(job *runnerapi.JobResponse) func(reference.Named) string {
	type cred struct{ user, pass string }
	creds := map[string]cred{}
	if job != nil {
		for _, c := range job.Credentials {
			if c.Type == "registry" && c.URL != "" {
				creds[registryHost(c.URL)] = cred{c.Username, c.Password}
			}
		}
		if v := jobVariable(job, "DOCKER_AUTH_CONFIG"); v != "" {
			var dc struct {
				Auths map[string]struct {
					Auth     string `json:"auth"`
					Username string `json:"username"`
					Password string `json:"password"`
				} `json:"auths"`
			}
			if json.Unmarshal([]byte(v), &dc) == nil {
				for host, a := range dc.Auths {
					c := cred{a.Username, a.Password}
					if a.Auth != "" {
						if b, err := base64.StdEncoding.DecodeString(a.Auth); err == nil {
							c.user, c.pass, _ = strings.Cut(string(b), ":")
						}
					}
					if c.user != "" {
						creds[registryHost(host)] = c
					}
				}
			}
		}
	}
	return func(ref reference.Named) string {
		host := registryHost(reference.Domain(ref))
		c, ok := creds[host]
		if !ok {
			return ""
		}
		s, err := registry.EncodeAuthConfig(registry.AuthConfig{Username: c.user, Password: c.pass, ServerAddress: host})
		if err != nil {
			return ""
		}
		return s
	}
}

// registryHost normalizes a registry address: no scheme, no path, Docker
// Hub under one name.
func registryHost(u string) string {
	u = strings.TrimPrefix(strings.TrimPrefix(u, "https://"), "http://")
	if i := strings.IndexByte(u, '/'); i >= 0 {
		u = u[:i]
	}
	switch u {
	case "docker.io", "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com":
		return "docker.io"
	}
	return u
}
