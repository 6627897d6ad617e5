package ci

import (
	"net/url"
	"path"
	"strings"
	"time"
)

// Release is the release keyword: the release the coordinator creates
// when the job succeeds. Values are kept as written; variables in them
// are expanded with the job's variables when the release is created.
type Release struct {
	TagName    string `json:"tag_name"`
	TagMessage string `json:"tag_message,omitempty"`
	Name       string `json:"name,omitempty"`
	// Description is the text, or the path of a file in the job's
	// workspace (read from the job's artifacts, see DescriptionFile).
	Description string `json:"description"`
	Ref         string `json:"ref,omitempty"`
	// ReleasedAt is an ISO 8601 time as written ("" : when created).
	ReleasedAt string        `json:"released_at,omitempty"`
	Milestones []string      `json:"milestones,omitempty"`
	Links      []ReleaseLink `json:"links,omitempty"`
}

// ReleaseLink is one release:assets:links entry.
type ReleaseLink struct {
	Name string `json:"name"`
	URL  string `json:"url"`
	// LinkType is other (default), runbook, image or package.
	LinkType string `json:"link_type,omitempty"`
	// DirectAssetPath is direct_asset_path (or the deprecated filepath).
	DirectAssetPath string `json:"direct_asset_path,omitempty"`
}

// DescriptionFile reports whether a release description (after variable
// expansion) reads as the path of a file in the job's workspace, the way
// GitLab's release-cli tells a file from text: one word with no blanks
// that starts with ./, names a directory, or ends in a file extension.
func DescriptionFile(s string) bool {
	if s == "" || strings.ContainsAny(s, " \t\r\n") || strings.HasPrefix(s, "/") {
		return false
	}
	if strings.HasPrefix(s, "./") || strings.Contains(s, "/") {
		return true
	}
	ext := path.Ext(s)
	return len(ext) > 1 && len(ext) <= 9 && ext != s
}

// Pages marks a GitLab Pages job: the pages keyword (true or a mapping),
// the deprecated job-level publish, or a job named pages.
type Pages struct {
	// Publish is the directory of the job's artifacts that is published
	// (default public); it is added to artifacts:paths, as GitLab does.
	Publish string `json:"publish"`
	// PathPrefix (variables expanded by the coordinator, then slugged)
	// makes a parallel deployment under /<prefix>/.
	PathPrefix string `json:"path_prefix,omitempty"`
	// ExpireIn removes the deployment after this long ("never"; empty:
	// never for the main deployment, 24 hours with a path prefix).
	ExpireIn string `json:"expire_in,omitempty"`
}

// defaultPublish is the directory GitLab publishes when none is named.
const defaultPublish = "public"

var releaseLinkTypes = []string{"other", "runbook", "image", "package"}

// release parses the release keyword as GitLab's Entry::Release does.
func (c *compiler) release(n *node, at string) *Release {
	if !c.mapping(n, at) {
		return nil
	}
	c.checkKeys(n, at, "tag_name", "tag_message", "name", "description", "ref", "released_at", "milestones", "assets")
	r := &Release{}
	str := func(key string) (string, *node) {
		x := n.get(key)
		if x.isNull() {
			return "", nil
		}
		s, _ := c.str(x, at+":"+key)
		return s, x
	}
	var tn, dn *node
	r.TagName, tn = str("tag_name")
	if tn == nil || strings.TrimSpace(r.TagName) == "" {
		c.d.errorf(n.pos, "%s: tag_name is required", at)
	}
	r.TagMessage, _ = str("tag_message")
	r.Name, _ = str("name")
	r.Description, dn = str("description")
	if dn == nil || strings.TrimSpace(r.Description) == "" {
		c.d.errorf(n.pos, "%s: description is required", at)
	}
	var rn *node
	if r.Ref, rn = str("ref"); rn != nil && !strings.Contains(r.Ref, "$") && !validRef(r.Ref) {
		c.d.errorf(rn.pos, "%s:ref must be a valid ref, found %q", at, r.Ref)
	}
	if s, x := str("released_at"); x != nil {
		if _, ok := ParseISO8601(s); !ok {
			c.d.errorf(x.pos, "%s:released_at must be a valid datetime (ISO 8601, like 2026-03-15T08:00:00Z), found %q", at, s)
		}
		r.ReleasedAt = s
	}
	if x := n.get("milestones"); !x.isNull() {
		r.Milestones, _ = c.strList(x, at+":milestones", true, false)
	}
	if x := n.get("assets"); !x.isNull() {
		r.Links = c.releaseAssets(x, at+":assets")
	}
	return r
}

func (c *compiler) releaseAssets(n *node, at string) []ReleaseLink {
	if !c.mapping(n, at) {
		return nil
	}
	c.checkKeys(n, at, "links")
	ln := n.get("links")
	if ln.isNull() {
		c.d.errorf(n.pos, "%s: links is required", at)
		return nil
	}
	if ln.kind != kSeq || len(ln.seq) == 0 {
		c.d.errorf(ln.pos, "%s:links should be a non-empty list of mappings, found %s", at, ln.describe())
		return nil
	}
	var out []ReleaseLink
	names, urls := map[string]bool{}, map[string]bool{}
	// filepath is warned about once per release, at its first use.
	var oldPaths []string
	var oldPos Pos
	for i, x := range ln.seq {
		lat := at + ":links:" + itoa(i)
		if !c.mapping(x, lat) {
			continue
		}
		c.checkKeys(x, lat, "name", "url", "link_type", "direct_asset_path", "filepath")
		var l ReleaseLink
		if y := x.get("name"); !y.isNull() {
			l.Name, _ = c.str(y, lat+":name")
		}
		if strings.TrimSpace(l.Name) == "" {
			c.d.errorf(x.pos, "%s: name is required", lat)
		} else if names[l.Name] {
			c.d.errorf(x.get("name").pos, "%s: duplicate link name %q (names must be unique in a release)", lat, l.Name)
		}
		names[l.Name] = true
		if y := x.get("url"); !y.isNull() {
			l.URL, _ = c.str(y, lat+":url")
			if l.URL != "" && !strings.Contains(l.URL, "$") && !validLinkURL(l.URL) {
				c.d.errorf(y.pos, "%s:url must be a valid URL (http, https or ftp), found %q", lat, l.URL)
			}
			if urls[l.URL] {
				c.d.errorf(y.pos, "%s: duplicate link url %q (URLs must be unique in a release)", lat, l.URL)
			}
			urls[l.URL] = true
		}
		if l.URL == "" {
			c.d.errorf(x.pos, "%s: url is required", lat)
		}
		if y := x.get("link_type"); !y.isNull() {
			l.LinkType, _ = c.oneOf(y, lat+":link_type", releaseLinkTypes...)
		}
		dap, fp := x.get("direct_asset_path"), x.get("filepath")
		switch {
		case !dap.isNull() && !fp.isNull():
			c.d.errorf(fp.pos, "%s: filepath is the deprecated name of direct_asset_path; set only direct_asset_path", lat)
		case !dap.isNull():
			l.DirectAssetPath, _ = c.str(dap, lat+":direct_asset_path")
		case !fp.isNull():
			l.DirectAssetPath, _ = c.str(fp, lat+":filepath")
			if len(oldPaths) == 0 {
				oldPos = fp.pos
			}
			oldPaths = append(oldPaths, lat)
		}
		out = append(out, l)
	}
	switch len(oldPaths) {
	case 0:
	case 1:
		c.d.warnf(oldPos, "%s:filepath is deprecated; use direct_asset_path", oldPaths[0])
	default:
		c.d.warnf(oldPos, "%s:links: filepath is deprecated (in %d links); use direct_asset_path", at, len(oldPaths))
	}
	return out
}

// pages parses the pages job keyword: true, false or {publish,
// path_prefix, expire_in}. It returns nil for pages: false.
func (c *compiler) pages(n *node, at string) (p *Pages, off bool) {
	if n.kind == kScalar {
		b, ok := c.boolean(n, at)
		if !ok || !b {
			return nil, ok
		}
		return &Pages{Publish: defaultPublish}, false
	}
	if n.kind != kMap {
		c.d.errorf(n.pos, "%s should be a boolean or a mapping, found %s", at, n.describe())
		return nil, false
	}
	c.checkKeys(n, at, "publish", "path_prefix", "expire_in")
	p = &Pages{Publish: defaultPublish}
	if x := n.get("publish"); !x.isNull() {
		if s, ok := c.str(x, at+":publish"); ok {
			p.Publish = c.publishPath(s, x, at+":publish")
		}
	}
	if x := n.get("path_prefix"); !x.isNull() {
		p.PathPrefix, _ = c.str(x, at+":path_prefix")
	}
	if x := n.get("expire_in"); !x.isNull() {
		if s, ok := c.str(x, at+":expire_in"); ok {
			if s != "never" {
				if _, err := ParseDuration(s); err != nil {
					c.d.errorf(x.pos, "%s:expire_in should be a duration or never, found %q (variables are not expanded here, as in GitLab)", at, s)
				}
			}
			p.ExpireIn = s
		}
	}
	return p, false
}

// publishPath checks a publish directory: relative to the project
// directory, inside it.
func (c *compiler) publishPath(s string, n *node, at string) string {
	clean := path.Clean(strings.TrimPrefix(s, "./"))
	if strings.TrimSpace(s) == "" || clean == ".." || strings.HasPrefix(clean, "../") || strings.HasPrefix(s, "/") {
		c.d.errorf(n.pos, "%s should be a directory inside the project directory, found %q", at, s)
		return defaultPublish
	}
	return clean
}

// pagesJob decides whether a job is a Pages job and completes it: GitLab
// publishes public/ (or pages:publish) of a job named pages, or of a job
// with the pages keyword, and adds the directory to artifacts:paths.
func (c *compiler) pagesJob(s *jobSpec, n *node, at string) {
	j := &s.job
	pn, pubE := n.get("pages"), n.entry("publish")
	var off bool
	if !pn.isNull() {
		j.Pages, off = c.pages(pn, at+":pages")
	}
	if j.Pages == nil && !off && s.name == "pages" {
		j.Pages = &Pages{Publish: defaultPublish}
	}
	if pubE != nil && !pubE.val.isNull() {
		c.d.warnf(pubE.keyPos, "%s: publish is deprecated; use pages:publish", at)
		pub, ok := c.str(pubE.val, at+":publish")
		switch {
		case !ok:
		case j.Pages == nil:
			c.d.errorf(pubE.keyPos, "%s: publish can only be used in a Pages job (a job named pages, or with the pages keyword)", at)
		case pn != nil && pn.kind == kMap && pn.get("publish") != nil:
			c.d.errorf(pubE.keyPos, "%s: publish and pages:publish may not both be set; use pages:publish", at)
		default:
			j.Pages.Publish = c.publishPath(pub, pubE.val, at+":publish")
		}
	}
	if j.Pages == nil {
		return
	}
	if j.Artifacts == nil {
		j.Artifacts = &Artifacts{When: OnSuccess}
	}
	for _, p := range j.Artifacts.Paths {
		if path.Clean(strings.TrimPrefix(p, "./")) == j.Pages.Publish {
			return
		}
	}
	a := *j.Artifacts
	a.Paths = append(append([]string(nil), a.Paths...), j.Pages.Publish)
	j.Artifacts = &a
}

// checkReleaseDescription warns when a release description names a file
// that the job's artifacts do not hold: the coordinator reads such files
// from the artifacts (it has no access to the job's workspace), and
// without them the text itself becomes the description, as release-cli
// does when the file does not exist.
func (c *compiler) checkReleaseDescription(j *Job, n *node, at string) {
	r := j.Release
	if r == nil || !DescriptionFile(r.Description) || strings.Contains(r.Description, "$") {
		return
	}
	file := path.Clean(r.Description)
	if j.Artifacts != nil {
		for _, p := range j.Artifacts.Paths {
			p = strings.TrimSuffix(path.Clean(strings.TrimPrefix(p, "./")), "/")
			if p == file || strings.HasPrefix(file, p+"/") || MatchGlob(p, file) {
				return
			}
		}
	}
	pos := n.pos
	if d := n.get("description"); d != nil {
		pos = d.pos
	}
	c.d.warnf(pos, "%s:description %q reads as a file: Berth reads it from the job's artifacts, so add it to artifacts:paths; otherwise the text itself is the description", at, r.Description)
}

// ParseISO8601 reads the ISO 8601 times GitLab accepts for
// release:released_at: a date, or a date and time with an optional zone
// (UTC when none).
func ParseISO8601(s string) (time.Time, bool) {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04Z07:00", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), true
		}
	}
	return time.Time{}, false
}

// validRef is a light form of git's ref name rules (or a commit sha).
func validRef(s string) bool {
	if s == "" || strings.HasPrefix(s, "-") || strings.HasPrefix(s, "/") || strings.HasSuffix(s, "/") ||
		strings.HasSuffix(s, ".") || strings.Contains(s, "..") || strings.Contains(s, "@{") || strings.HasSuffix(s, ".lock") {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f || strings.ContainsRune(" ~^:?*[\\", r) {
			return false
		}
	}
	return true
}

func validLinkURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https" || u.Scheme == "ftp") && u.Host != ""
}
