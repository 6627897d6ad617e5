package ci

import (
	"reflect"
	"strings"
	"testing"
)

func TestReleaseKeyword(t *testing.T) {
	p := mustCompile(t, `
release:
  stage: deploy
  script: [make changelog]
  artifacts:
    paths: [notes/]
  release:
    tag_name: v$VERSION
    tag_message: Tagged by CI
    name: Release $VERSION
    description: ./notes/CHANGES.md
    ref: $CI_COMMIT_SHA
    released_at: "2026-03-15T08:00:00Z"
    milestones: m1
    assets:
      links:
        - name: linux
          url: https://example.test/app-$VERSION.tar.gz
          link_type: package
          direct_asset_path: /bin/linux
        - name: docs
          url: https://example.test/docs
          filepath: /docs
`, Env{})
	j := jobOf(t, p, "release")
	want := &Release{TagName: "v$VERSION", TagMessage: "Tagged by CI", Name: "Release $VERSION",
		Description: "./notes/CHANGES.md", Ref: "$CI_COMMIT_SHA", ReleasedAt: "2026-03-15T08:00:00Z",
		Milestones: []string{"m1"}, Links: []ReleaseLink{
			{Name: "linux", URL: "https://example.test/app-$VERSION.tar.gz", LinkType: "package", DirectAssetPath: "/bin/linux"},
			{Name: "docs", URL: "https://example.test/docs", DirectAssetPath: "/docs"},
		}}
	eq(t, "release", j.Release, want)
	// filepath is deprecated, and the description is in the artifacts:
	// one warning only.
	if len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0].String(), ".gitlab-ci.yml:23:21: jobs:release:release:assets:links:1:filepath is deprecated") {
		t.Errorf("warnings = %v", p.Warnings)
	}

	// A description that names a file outside the artifacts warns.
	p = mustCompile(t, "r:\n  script: x\n  release:\n    tag_name: v1\n    description: CHANGELOG.md\n", Env{})
	if len(p.Warnings) != 1 || p.Warnings[0].String() != `.gitlab-ci.yml:5:18: jobs:r:release:description "CHANGELOG.md" reads as a file: Berth reads it from the job's artifacts, so add it to artifacts:paths; otherwise the text itself is the description` {
		t.Errorf("warnings = %v", p.Warnings)
	}
	// Text is text.
	p = mustCompile(t, "r:\n  script: x\n  release:\n    tag_name: v1\n    description: Release of version 1.0\n    milestones: [a, b]\n", Env{})
	if len(p.Warnings) != 0 {
		t.Errorf("warnings = %v", p.Warnings)
	}
	eq(t, "milestones", jobOf(t, p, "r").Release.Milestones, []string{"a", "b"})
}

func TestDescriptionFile(t *testing.T) {
	for s, want := range map[string]bool{
		"./CHANGELOG.md": true, "notes/v1.md": true, "CHANGELOG.md": true, "release.txt": true,
		"Release notes": false, "v1": false, "": false, "/etc/passwd": false, "a\nb.md": false, ".env": false,
	} {
		if got := DescriptionFile(s); got != want {
			t.Errorf("DescriptionFile(%q) = %v, want %v", s, got, want)
		}
	}
}

func TestPagesKeyword(t *testing.T) {
	p := mustCompile(t, `
pages:
  script: [build]
  artifacts:
    paths: [public]
site:
  script: [build]
  pages: true
docs:
  script: [build]
  pages:
    publish: ./dist/site
    path_prefix: $CI_COMMIT_REF_SLUG
    expire_in: 1 week
  artifacts:
    paths: [report.txt]
    expire_in: 1 day
pages-off:
  script: [build]
  pages: false
old:
  script: [build]
  pages: true
  publish: out
`, Env{})
	eq(t, "pages", jobOf(t, p, "pages").Pages, &Pages{Publish: "public"})
	eq(t, "pages paths", jobOf(t, p, "pages").Artifacts.Paths, []string{"public"})
	eq(t, "site", jobOf(t, p, "site").Pages, &Pages{Publish: "public"})
	eq(t, "site artifacts", jobOf(t, p, "site").Artifacts, &Artifacts{Paths: []string{"public"}, When: OnSuccess})
	docs := jobOf(t, p, "docs")
	eq(t, "docs", docs.Pages, &Pages{Publish: "dist/site", PathPrefix: "$CI_COMMIT_REF_SLUG", ExpireIn: "1 week"})
	eq(t, "docs artifacts", docs.Artifacts, &Artifacts{Paths: []string{"report.txt", "dist/site"}, When: OnSuccess, ExpireIn: "1 day"})
	if j := jobOf(t, p, "pages-off"); j.Pages != nil || j.Artifacts != nil {
		t.Errorf("pages: false: %+v %+v", j.Pages, j.Artifacts)
	}
	eq(t, "old", jobOf(t, p, "old").Pages, &Pages{Publish: "out"})
	if len(p.Warnings) != 1 || p.Warnings[0].String() != ".gitlab-ci.yml:24:3: jobs:old: publish is deprecated; use pages:publish" {
		t.Errorf("warnings = %v", p.Warnings)
	}
	// A job named pages may turn itself off.
	p = mustCompile(t, "pages:\n  script: x\n  pages: false\n", Env{})
	if jobOf(t, p, "pages").Pages != nil {
		t.Error("pages: false on a job named pages is still a Pages job")
	}
	// The deprecated publish on the classic job.
	p = mustCompile(t, "pages:\n  script: x\n  publish: build\n", Env{})
	eq(t, "classic publish", jobOf(t, p, "pages").Pages, &Pages{Publish: "build"})
}

func TestReleaseAndPagesErrors(t *testing.T) {
	tests := []struct {
		name, yml string
		want      []string
	}{
		{"release not a mapping", "r:\n  script: x\n  release: v1\n",
			[]string{`.gitlab-ci.yml:3:12: jobs:r:release should be a mapping, found a string`}},
		{"release without tag_name and description", "r:\n  script: x\n  release:\n    name: n\n",
			[]string{`.gitlab-ci.yml:4:5: jobs:r:release: tag_name is required`, `.gitlab-ci.yml:4:5: jobs:r:release: description is required`}},
		{"release unknown key", "r:\n  script: x\n  release:\n    tag_name: v1\n    description: d\n    tag: v1\n",
			[]string{`.gitlab-ci.yml:6:5: jobs:r:release: unknown keyword "tag" (allowed: tag_name, tag_message, name, description, ref, released_at, milestones, assets)`}},
		{"release bad released_at", "r:\n  script: x\n  release:\n    tag_name: v1\n    description: d\n    released_at: yesterday\n",
			[]string{`.gitlab-ci.yml:6:18: jobs:r:release:released_at must be a valid datetime (ISO 8601, like 2026-03-15T08:00:00Z), found "yesterday"`}},
		{"release bad ref", "r:\n  script: x\n  release:\n    tag_name: v1\n    description: d\n    ref: a..b\n",
			[]string{`.gitlab-ci.yml:6:10: jobs:r:release:ref must be a valid ref, found "a..b"`}},
		{"release milestones", "r:\n  script: x\n  release:\n    tag_name: v1\n    description: d\n    milestones: [[a]]\n",
			[]string{`.gitlab-ci.yml:6:18: jobs:r:release:milestones should contain only strings, found a list`}},
		{"release without script", "r:\n  release:\n    tag_name: v1\n    description: d\n",
			[]string{`.gitlab-ci.yml:1:1: jobs:r config should implement the script: keyword`}},
		{"assets without links", "r:\n  script: x\n  release:\n    tag_name: v1\n    description: d\n    assets: {}\n",
			[]string{`.gitlab-ci.yml:6:13: jobs:r:release:assets: links is required`}},
		{"empty links", "r:\n  script: x\n  release:\n    tag_name: v1\n    description: d\n    assets:\n      links: []\n",
			[]string{`.gitlab-ci.yml:7:14: jobs:r:release:assets:links should be a non-empty list of mappings, found a list`}},
		{"bad link", "r:\n  script: x\n  release:\n    tag_name: v1\n    description: d\n    assets:\n      links:\n        - url: not-a-url\n          link_type: binary\n        - name: a\n          url: https://x.test/a\n          filepath: /a\n          direct_asset_path: /a\n        - name: a\n          url: https://x.test/a\n",
			[]string{
				`.gitlab-ci.yml:8:11: jobs:r:release:assets:links:0: name is required`,
				`.gitlab-ci.yml:8:16: jobs:r:release:assets:links:0:url must be a valid URL (http, https or ftp), found "not-a-url"`,
				`.gitlab-ci.yml:9:22: jobs:r:release:assets:links:0:link_type should be one of other, runbook, image, package, found "binary"`,
				`.gitlab-ci.yml:12:21: jobs:r:release:assets:links:1: filepath is the deprecated name of direct_asset_path; set only direct_asset_path`,
				`.gitlab-ci.yml:14:17: jobs:r:release:assets:links:2: duplicate link name "a" (names must be unique in a release)`,
				`.gitlab-ci.yml:15:16: jobs:r:release:assets:links:2: duplicate link url "https://x.test/a" (URLs must be unique in a release)`,
			}},
		{"pages not bool", "p:\n  script: x\n  pages: [a]\n",
			[]string{`.gitlab-ci.yml:3:10: jobs:p:pages should be a boolean or a mapping, found a list`}},
		{"pages unknown key", "p:\n  script: x\n  pages:\n    root: public\n",
			[]string{`.gitlab-ci.yml:4:5: jobs:p:pages: unknown keyword "root" (allowed: publish, path_prefix, expire_in)`}},
		{"pages expire_in", "p:\n  script: x\n  pages:\n    expire_in: $TTL\n",
			[]string{`.gitlab-ci.yml:4:16: jobs:p:pages:expire_in should be a duration or never, found "$TTL" (variables are not expanded here, as in GitLab)`}},
		{"pages publish outside", "p:\n  script: x\n  pages:\n    publish: ../site\n",
			[]string{`.gitlab-ci.yml:4:14: jobs:p:pages:publish should be a directory inside the project directory, found "../site"`}},
		{"publish outside pages job", "p:\n  script: x\n  publish: site\n",
			[]string{`.gitlab-ci.yml:3:3: jobs:p: publish can only be used in a Pages job (a job named pages, or with the pages keyword)`}},
		{"publish twice", "p:\n  script: x\n  pages:\n    publish: a\n  publish: b\n",
			[]string{`.gitlab-ci.yml:5:3: jobs:p: publish and pages:publish may not both be set; use pages:publish`}},
		{"environment still checked", "d:\n  script: x\n  environment:\n    name: prod\n    action: deploy\n",
			[]string{`.gitlab-ci.yml:5:13: jobs:d:environment:action should be one of start, prepare, stop, verify, access, found "deploy"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := compileErrors(t, tt.yml, Env{})
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("errors:\n got %q\nwant %q", got, tt.want)
			}
		})
	}
}

func TestParseISO8601(t *testing.T) {
	for _, s := range []string{"2026-03-15T08:00:00Z", "2026-03-15T08:00:00+01:00", "2026-03-15T08:00:00", "2026-03-15", "2026-03-15T08:00:00.5Z"} {
		if _, ok := ParseISO8601(s); !ok {
			t.Errorf("ParseISO8601(%q) failed", s)
		}
	}
	for _, s := range []string{"", "15/03/2026", "2026-13-01"} {
		if _, ok := ParseISO8601(s); ok {
			t.Errorf("ParseISO8601(%q) succeeded", s)
		}
	}
}

// Many links on the deprecated filepath are one warning, not one each.
func TestReleaseFilepathWarnedOnce(t *testing.T) {
	yml := "release:\n  script: x\n  release:\n    tag_name: v1\n    description: d\n    assets:\n      links:\n"
	for _, n := range []string{"a", "b", "c"} {
		yml += "        - {name: " + n + ", url: 'https://x.example/" + n + "', filepath: /" + n + "}\n"
	}
	p := mustCompile(t, yml, branch("main"))
	if len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0].String(), "jobs:release:release:assets:links: filepath is deprecated (in 3 links)") {
		t.Errorf("warnings %v", p.Warnings)
	}
}
