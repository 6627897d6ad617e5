package docker

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/runnerapi"
)

// Labels Berth puts on every container, network and volume it creates.
// Sweep finds a crashed predecessor's leftovers by the first three.
const (
	LabelManaged    = "com.berth.managed"             // "true"
	LabelShortToken = "com.berth.runner.short_token"  // runner's short token
	LabelSystemID   = "com.berth.runner.system_id"    // runner manager's system id
	LabelJobID      = "com.berth.job.id"              // job id
	LabelInstance   = "com.berth.job.instance"        // random per executor: what Cleanup removes
	LabelSlot       = "com.berth.job.concurrency_id"  // CI_CONCURRENT_ID
	LabelProjectID  = "com.berth.project.id"          // project id
	LabelProject    = "com.berth.project.path"        // project full path
	LabelType       = "com.berth.type"                // build, service, network, builds, cache, tmp
	LabelService    = "com.berth.service.image"       // a service's image
	LabelHost       = "com.berth.host"                // the autoscaled instance (docker-autoscaler)
	labelGitLab     = "com.gitlab.gitlab-runner."     // prefix of GitLab's labels
	labelGitLabType = labelGitLab + "type"            // GitLab's type label
	labelGitLabMgd  = labelGitLab + "managed"         // GitLab's managed label
	labelGitLabSvc  = labelGitLab + "service"         // GitLab's service label
	labelGitLabSvcV = labelGitLab + "service.version" // GitLab's service version label
)

// Types of resources (LabelType).
const (
	typeBuild   = "build"
	typeService = "service"
	typeNetwork = "network"
	typeBuilds  = "builds"
	typeCache   = "cache"
	typeTmp     = "tmp"
)

// naming is what a job's names and labels are made of.
type naming struct {
	short     string // sanitized short token
	rawShort  string
	systemID  string
	jobID     int64
	projectID int64
	project   string // project path
	slot      int
	instance  string // 8 random hex digits
	job       *runnerapi.JobResponse
	extra     map[string]string // container_labels, expanded
	host      string            // Options.Host: the instance an engine belongs to
}

// prefix is GitLab's container name prefix:
// runner-<short>-project-<id>-concurrent-<slot>-<random>.
func (n naming) prefix() string {
	return fmt.Sprintf("runner-%s-project-%d-concurrent-%d-%s", n.short, n.projectID, n.slot, n.instance)
}

// buildName is the build container's name.
func (n naming) buildName() string { return n.prefix() + "-build" }

// serviceName is the name of the i-th service container.
func (n naming) serviceName(image string, i int) string {
	return n.prefix() + "-" + serviceSlug(image) + "-" + strconv.Itoa(i)
}

// networkName is GitLab's per-job network name:
// runner-<short>-<project id>-<concurrency id>-<job id>.
func (n naming) networkName() string {
	return fmt.Sprintf("runner-%s-%d-%d-%d", n.short, n.projectID, n.slot, n.jobID)
}

// buildsVolume is the persistent volume holding the builds directory of
// one (runner, slot, project): GIT_STRATEGY=fetch finds the previous
// job's checkout in it.
func (n naming) buildsVolume(buildsDir string) string {
	if n.host != "" {
		// Instances sharing one engine (the local plugin) must not share
		// a slot's checkout.
		return fmt.Sprintf("runner-%s-project-%d-concurrent-%d-builds-%s", n.short, n.projectID, n.slot, digest(n.project, buildsDir, n.host))
	}
	return fmt.Sprintf("runner-%s-project-%d-concurrent-%d-builds-%s", n.short, n.projectID, n.slot, digest(n.project, buildsDir))
}

// cacheVolume is the persistent per-project volume for a container path
// (a "/path" entry of volumes, or the cache directory).
func (n naming) cacheVolume(path string) string {
	return fmt.Sprintf("runner-%s-project-%d-cache-%s", n.short, n.projectID, digest(n.project, path))
}

// hostCacheDir is the per-project host directory under cache_dir for a
// container path, when cache_dir is set.
func (n naming) hostCacheDir(cacheDir, path string) string {
	return strings.TrimRight(cacheDir, "/") + "/" + fmt.Sprintf("runner-%s-project-%d-%s", n.short, n.projectID, digest(n.project)) + "/" + digest(path)
}

// hostname is the build container's host name (at most 63 characters).
func (n naming) hostname() string {
	h := n.buildName()
	if len(h) > 63 {
		h = h[:63]
	}
	return strings.TrimRight(h, "-._")
}

// labels are the labels of one resource of the job.
func (n naming) labels(typ string) map[string]string {
	l := make(map[string]string, 24)
	if typ == typeBuild || typ == typeService {
		for k, v := range n.extra {
			l[k] = v
		}
	}
	l[LabelManaged] = "true"
	l[LabelShortToken] = n.rawShort
	l[LabelSystemID] = n.systemID
	l[LabelType] = typ
	l[LabelProject] = n.project
	l[LabelProjectID] = strconv.FormatInt(n.projectID, 10)
	l[LabelSlot] = strconv.Itoa(n.slot)
	if n.host != "" {
		l[LabelHost] = n.host
	}
	l[labelGitLabMgd] = "true"
	l[labelGitLab+"runner.system_id"] = n.systemID
	l[labelGitLab+"runner.id"] = n.rawShort
	l[labelGitLab+"project.id"] = strconv.FormatInt(n.projectID, 10)
	gitlabType := map[string]string{typeBuild: "build", typeService: "service", typeBuilds: "cache", typeCache: "cache", typeTmp: "cache", typeNetwork: "network"}[typ]
	l[labelGitLabType] = gitlabType
	if typ == typeBuilds || typ == typeCache {
		// Persistent volumes outlive the job: they carry no job labels.
		return l
	}
	l[LabelJobID] = strconv.FormatInt(n.jobID, 10)
	l[LabelInstance] = n.instance
	l[labelGitLab+"job.id"] = strconv.FormatInt(n.jobID, 10)
	if j := n.job; j != nil {
		l[labelGitLab+"job.sha"] = j.GitInfo.Sha
		l[labelGitLab+"job.before_sha"] = j.GitInfo.BeforeSha
		l[labelGitLab+"job.ref"] = j.GitInfo.Ref
		l[labelGitLab+"pipeline.id"] = strconv.FormatInt(j.JobInfo.PipelineID, 10)
		if j.RunnerInfo.Timeout > 0 {
			l[labelGitLab+"job.timeout"] = (time.Duration(j.RunnerInfo.Timeout) * time.Second).String()
		}
		if u := jobVariable(j, "CI_JOB_URL"); u != "" {
			l[labelGitLab+"job.url"] = u
		}
		if id := jobVariable(j, "CI_RUNNER_ID"); id != "" {
			l[labelGitLab+"project.runner_id"] = id
		}
		if id := jobVariable(j, "CI_CONCURRENT_PROJECT_ID"); id != "" {
			l[labelGitLab+"runner.local_id"] = id
		}
	}
	return l
}

// jobVariable is the last value of a job variable ("" if unset).
func jobVariable(j *runnerapi.JobResponse, key string) string {
	v := ""
	if j == nil {
		return v
	}
	for _, x := range j.Variables {
		if x.Key == key {
			v = x.Value
		}
	}
	return v
}

// digest is a short stable hash of parts.
func digest(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// sanitizeName keeps the characters Docker allows in container, network
// and volume names ([a-zA-Z0-9_.-]) and replaces the others with '-'.
func sanitizeName(s string) string {
	s = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-' {
			return r
		}
		return '-'
	}, s)
	s = strings.TrimLeft(s, "_.-")
	if s == "" {
		s = "x"
	}
	return s
}

// serviceSlug is GitLab's service part of a container name: the image
// name without tag or digest, "/" as "__".
func serviceSlug(image string) string {
	name := image
	if i := strings.IndexByte(name, '@'); i >= 0 {
		name = name[:i]
	}
	if i := strings.LastIndexByte(name, ':'); i > strings.LastIndexByte(name, '/') {
		name = name[:i]
	}
	return sanitizeName(strings.ReplaceAll(name, "/", "__"))
}

// markerScope is the scope of a runner's stage markers (package reap).
func markerScope(o executor.PrepareOptions) string {
	return sanitizeName(o.SystemID) + "." + sanitizeName(o.ShortToken)
}
