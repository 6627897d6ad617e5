package ci

import (
	"strings"

	"github.com/berthci/berth/runnerapi"
)

// IDToken is one entry of id_tokens: an OIDC ID token the coordinator
// signs for the job when it hands it out, given to the job as the masked
// variable Name.
type IDToken struct {
	Name string `json:"name"`
	// Aud is the audience as written; CI/CD variables in it are expanded
	// at hand-out, as GitLab does.
	Aud []string `json:"aud"`
	// AudList is set when aud was written as a list: the token's aud
	// claim is then a JSON array, else a string.
	AudList bool `json:"aud_list,omitempty"`
}

// Secret is one entry of secrets, given to the job as the variable Name:
// the value of a field of a Vault KV secret (the Vault fields), or of a
// secret in a cloud's secret manager (GCP, Azure or AWS set).
type Secret struct {
	Name string `json:"name"`
	// EngineName is kv-v2, kv-v1 or generic; EnginePath where the engine
	// is mounted.
	EngineName string `json:"engine_name,omitempty"`
	EnginePath string `json:"engine_path,omitempty"`
	Path       string `json:"path,omitempty"`
	Field      string `json:"field,omitempty"`
	// The cloud providers, in the payload's own types (their Server is
	// filled by the coordinator at hand-out).
	GCP   *runnerapi.GCPSecretManagerSecret  `json:"gcp_secret_manager,omitempty"`
	Azure *runnerapi.AzureKeyVaultSecret     `json:"azure_key_vault,omitempty"`
	AWS   *runnerapi.AWSSecretsManagerSecret `json:"aws_secrets_manager,omitempty"`
	// File is the file keyword; nil when not set (a file variable).
	File *bool `json:"file,omitempty"`
	// Token is the token keyword: the ID token variable to log in with,
	// like "$VAULT_ID_TOKEN"; empty means the job's first ID token.
	Token string `json:"token,omitempty"`
}

// Provider is the key of the secret's provider.
func (s Secret) Provider() string {
	switch {
	case s.GCP != nil:
		return "gcp_secret_manager"
	case s.Azure != nil:
		return "azure_key_vault"
	case s.AWS != nil:
		return "aws_secrets_manager"
	}
	return "vault"
}

// secretProviders are the providers GitLab's secrets keyword knows
// (Entry::Secret::SUPPORTED_PROVIDERS); a secret uses exactly one.
var secretProviders = []string{"vault", "azure_key_vault", "gcp_secret_manager", "akeyless",
	"gitlab_secrets_manager", "aws_secrets_manager"}

// idTokens parses id_tokens: {NAME: {aud: string | list of strings}}, as
// GitLab's Entry::IdToken validates it.
func (c *compiler) idTokens(n *node, at string) []IDToken {
	if !c.mapping(n, at) {
		return nil
	}
	out := []IDToken{}
	for _, e := range n.m {
		kat := at + ":" + e.key
		if !c.mapping(e.val, kat) {
			continue
		}
		c.checkKeys(e.val, kat, "aud")
		a := e.val.get("aud")
		if a == nil {
			c.d.errorf(e.val.pos, "%s config missing required keys: aud", kat)
			continue
		}
		aud, ok := c.strList(a, kat+":aud", true, false)
		if !ok {
			continue
		}
		out = append(out, IDToken{Name: e.key, Aud: aud, AudList: a.kind == kSeq})
	}
	return out
}

// secrets parses the secrets keyword, as GitLab's Entry::Secret and its
// providers' entries validate it. akeyless (which gitlab-runner no longer
// reads) and gitlab_secrets_manager (GitLab's own OpenBao service) are
// known and refused.
func (c *compiler) secrets(n *node, at string) []Secret {
	if !c.mapping(n, at) {
		return nil
	}
	out := []Secret{}
	for _, e := range n.m {
		kat := at + ":" + e.key
		v := e.val
		if !c.mapping(v, kat) {
			continue
		}
		c.checkKeys(v, kat, append([]string{"file", "token"}, secretProviders...)...)
		var used []string
		for _, p := range secretProviders {
			if v.get(p) != nil {
				used = append(used, p)
			}
		}
		if len(used) != 1 {
			c.d.errorf(v.pos, "%s config must use exactly one of these keys: %s", kat, strings.Join(secretProviders, ", "))
			continue
		}
		s := Secret{Name: e.key}
		var ok bool
		pat := kat + ":" + used[0]
		switch p := v.get(used[0]); used[0] {
		case "vault":
			ok = c.vaultSecret(p, pat, &s)
		case "gcp_secret_manager":
			s.GCP, ok = c.gcpSecret(p, pat)
			if t := v.get("token"); t == nil || t.isNull() || t.str == "" {
				// GitLab's Entry::Secret: gcp names its token itself.
				c.d.errorf(v.pos, "%s token is required with gcp secrets manager", kat)
				ok = false
			}
		case "azure_key_vault":
			s.Azure, ok = c.azureSecret(p, pat)
		case "aws_secrets_manager":
			s.AWS, ok = c.awsSecret(p, pat)
		default:
			c.d.errorf(v.entry(used[0]).keyPos, "%s: Berth supports vault, gcp_secret_manager, azure_key_vault and aws_secrets_manager secrets, not %s", kat, used[0])
			continue
		}
		if x := v.get("file"); !x.isNull() { // null: GitLab's default
			b, bok := c.boolean(x, kat+":file")
			s.File, ok = &b, ok && bok
		}
		if x := v.get("token"); !x.isNull() {
			var tok bool
			s.Token, tok = c.str(x, kat+":token")
			ok = ok && tok
		}
		if ok {
			out = append(out, s)
		}
	}
	return out
}

// vaultSecret reads secrets:NAME:vault, either the short form
// "path/to/secret/field@engine-path" (engine kv-v2, mounted at kv-v2
// without @) or {engine: {name, path}, path, field}.
func (c *compiler) vaultSecret(n *node, at string, s *Secret) bool {
	switch {
	case n.kind == kScalar && n.tag != "!!bool":
		if n.str == "" {
			c.d.errorf(n.pos, "%s can't be blank", at)
			return false
		}
		// GitLab's StringStrategy: the last @ ends the path and field, the
		// last / before it separates them.
		pathField, enginePath := n.str, "kv-v2"
		if i := strings.LastIndexByte(n.str, '@'); i > 0 {
			pathField, enginePath = n.str[:i], n.str[i+1:]
		}
		s.EngineName, s.EnginePath = "kv-v2", enginePath
		if i := strings.LastIndexByte(pathField, '/'); i >= 0 {
			s.Path, s.Field = pathField[:i], pathField[i+1:]
		} else {
			s.Field = pathField
		}
		return true
	case n.kind == kMap:
		c.checkKeys(n, at, "engine", "path", "field")
		var pok, fok, nok, epok bool
		s.Path, pok = c.reqStr(n, "path", at)
		s.Field, fok = c.reqStr(n, "field", at)
		eng := n.get("engine")
		switch {
		case eng.isNull():
			c.d.errorf(n.pos, "%s: engine can't be blank", at)
		case c.mapping(eng, at+":engine"):
			c.checkKeys(eng, at+":engine", "name", "path")
			s.EngineName, nok = c.reqStr(eng, "name", at+":engine")
			s.EnginePath, epok = c.reqStr(eng, "path", at+":engine")
		}
		return pok && fok && nok && epok
	}
	c.d.errorf(posOf(n), "%s should be a hash or a string, found %s", at, n.describe())
	return false
}

// optStr reads an optional string key of a mapping: nil when absent or
// null.
func (c *compiler) optStr(n *node, key, at string) (*string, bool) {
	x := n.get(key)
	if x.isNull() {
		return nil, true
	}
	v, ok := c.str(x, at+":"+key)
	return &v, ok
}

// reqStr reads a required, non-empty string key of a mapping.
func (c *compiler) reqStr(n *node, key, at string) (string, bool) {
	x := n.get(key)
	if x.isNull() {
		c.d.errorf(n.pos, "%s: %s can't be blank", at, key)
		return "", false
	}
	v, ok := c.str(x, at+":"+key)
	if ok && v == "" {
		c.d.errorf(x.pos, "%s:%s can't be blank", at, key)
		ok = false
	}
	return v, ok
}

// gcpSecret reads secrets:NAME:gcp_secret_manager: {name, version}, as
// GitLab's Entry::GcpSecretManager::Secret (a version may be a string or
// an integer; "latest" when absent).
func (c *compiler) gcpSecret(n *node, at string) (*runnerapi.GCPSecretManagerSecret, bool) {
	if !c.mapping(n, at) {
		return nil, false
	}
	c.checkKeys(n, at, "name", "version")
	name, ok := c.reqStr(n, "name", at)
	out := &runnerapi.GCPSecretManagerSecret{Name: name, Version: "latest"}
	if x := n.get("version"); !x.isNull() {
		if x.kind != kScalar || (x.tag != "!!str" && x.tag != "!!int") {
			c.d.errorf(x.pos, "%s:version should be alphanumeric, found %s", at, x.describe())
			ok = false
		}
		out.Version = x.str
	}
	return out, ok
}

// azureSecret reads secrets:NAME:azure_key_vault: {name, version}, as
// GitLab's Entry::AzureKeyVault::Secret.
func (c *compiler) azureSecret(n *node, at string) (*runnerapi.AzureKeyVaultSecret, bool) {
	if !c.mapping(n, at) {
		return nil, false
	}
	c.checkKeys(n, at, "name", "version")
	name, ok := c.reqStr(n, "name", at)
	ver, vok := c.optStr(n, "version", at)
	return &runnerapi.AzureKeyVaultSecret{Name: name, Version: ver}, ok && vok
}

// awsSecret reads secrets:NAME:aws_secrets_manager, as GitLab's
// Entry::AwsSecretsManager::Secret: "secret-id" or "secret-id#field", or
// {secret_id, version_id, version_stage, region, role_arn,
// role_session_name, field}.
func (c *compiler) awsSecret(n *node, at string) (*runnerapi.AWSSecretsManagerSecret, bool) {
	if n.kind == kScalar && n.tag != "!!bool" {
		if n.str == "" {
			c.d.errorf(n.pos, "%s can't be blank", at)
			return nil, false
		}
		id, field, hasField := strings.Cut(n.str, "#")
		if strings.Contains(field, "#") {
			c.d.errorf(n.pos, "%s must contain at most one '#'", at)
			return nil, false
		}
		s := &runnerapi.AWSSecretsManagerSecret{SecretID: id}
		if hasField && field != "" {
			// Ruby's split drops a trailing empty part: "id#" has no field.
			s.Field = &field
		}
		return s, true
	}
	if n.kind != kMap {
		c.d.errorf(posOf(n), "%s should be a hash or a string, found %s", at, n.describe())
		return nil, false
	}
	c.checkKeys(n, at, "secret_id", "region", "version_id", "version_stage", "role_arn", "role_session_name", "field")
	id, ok := c.reqStr(n, "secret_id", at)
	s := &runnerapi.AWSSecretsManagerSecret{SecretID: id}
	for _, f := range []struct {
		key string
		dst **string
	}{{"version_id", &s.VersionID}, {"version_stage", &s.VersionStage}, {"region", &s.Region},
		{"role_arn", &s.RoleARN}, {"role_session_name", &s.RoleSessionName}, {"field", &s.Field}} {
		v, vok := c.optStr(n, f.key, at)
		*f.dst, ok = v, ok && vok
	}
	return s, ok
}
