package ci

import (
	"strings"
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

// Secret is one entry of secrets: the value of a field of a Vault KV
// secret, given to the job as the variable Name.
type Secret struct {
	Name string `json:"name"`
	// EngineName is kv-v2, kv-v1 or generic; EnginePath where the engine
	// is mounted.
	EngineName string `json:"engine_name"`
	EnginePath string `json:"engine_path"`
	Path       string `json:"path"`
	Field      string `json:"field"`
	// File is the file keyword; nil when not set (a file variable).
	File *bool `json:"file,omitempty"`
	// Token is the token keyword: the ID token variable to log in with,
	// like "$VAULT_ID_TOKEN"; empty means the job's first ID token.
	Token string `json:"token,omitempty"`
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

// secrets parses the secrets keyword, as GitLab's Entry::Secret and
// Entry::Vault::Secret validate it. Providers other than vault are known
// and refused.
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
		if used[0] != "vault" {
			c.d.errorf(v.entry(used[0]).keyPos, "%s:%s: Berth supports vault secrets only", kat, used[0])
			continue
		}
		s := Secret{Name: e.key}
		ok := c.vaultSecret(v.get("vault"), kat+":vault", &s)
		if x := v.get("file"); x != nil {
			b, bok := c.boolean(x, kat+":file")
			s.File, ok = &b, ok && bok
		}
		if x := v.get("token"); x != nil {
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
		ok := true
		req := func(x *node, key, kat string) string {
			y := x.get(key)
			if y == nil || y.isNull() {
				c.d.errorf(x.pos, "%s: %s can't be blank", kat, key)
				ok = false
				return ""
			}
			v, vok := c.str(y, kat+":"+key)
			if vok && v == "" {
				c.d.errorf(y.pos, "%s:%s can't be blank", kat, key)
				vok = false
			}
			ok = ok && vok
			return v
		}
		s.Path = req(n, "path", at)
		s.Field = req(n, "field", at)
		eng := n.get("engine")
		switch {
		case eng == nil || eng.isNull():
			c.d.errorf(n.pos, "%s: engine can't be blank", at)
			ok = false
		case c.mapping(eng, at+":engine"):
			c.checkKeys(eng, at+":engine", "name", "path")
			s.EngineName = req(eng, "name", at+":engine")
			s.EnginePath = req(eng, "path", at+":engine")
		default:
			ok = false
		}
		return ok
	}
	c.d.errorf(posOf(n), "%s should be a hash or a string, found %s", at, n.describe())
	return false
}
