// Package vault is the part of HashiCorp Vault's HTTP API (and OpenBao's,
// which keeps it) a runner needs to resolve a job's secrets: log in with
// the JWT auth method and read a field of a KV secret (engine kv-v2, or
// kv-v1/generic), as gitlab-runner's helpers/vault does.
package vault

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"
)

// ErrNotFound: the secret or its field does not exist (Vault answers 404
// to a read of a missing path, or the field is absent).
var ErrNotFound = errors.New("secret not found")

// APIError is an error answer of Vault, with the status code the runner
// classifies failures by.
type APIError struct {
	StatusCode int
	Errors     []string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("api error: status code %d: %s", e.StatusCode, strings.Join(e.Errors, ", "))
}

// maxResponse bounds a Vault response body.
const maxResponse = 4 << 20

// Client talks to one Vault server.
type Client struct {
	// URL is the server's address, like https://vault.example.com:8200.
	URL string
	// Namespace is sent as X-Vault-Namespace when not empty (Vault
	// Enterprise, OpenBao namespaces).
	Namespace string
	// HTTP is the HTTP client (nil: one with a 60 s timeout, as Vault's
	// own client).
	HTTP *http.Client
}

// Login logs in with the JWT auth method mounted at authPath (POST
// /v1/auth/<authPath>/login with {jwt, role}) and returns the client
// token. An empty role is left out: Vault then uses the method's
// default_role.
func (c *Client) Login(ctx context.Context, authPath, jwt, role string) (string, error) {
	if jwt == "" {
		return "", errors.New("logging in to Vault: the JWT is empty (is the job's ID token variable set?)")
	}
	body := map[string]string{"jwt": jwt}
	if role != "" {
		body["role"] = role
	}
	var out struct {
		Auth *struct {
			ClientToken string `json:"client_token"`
		} `json:"auth"`
	}
	_, err := c.do(ctx, http.MethodPost, path.Join("auth", authPath, "login"), "", body, &out)
	if err != nil {
		return "", fmt.Errorf("logging in to Vault at auth/%s: %w", authPath, err)
	}
	if out.Auth == nil || out.Auth.ClientToken == "" {
		return "", fmt.Errorf("logging in to Vault at auth/%s: no token in the answer", authPath)
	}
	return out.Auth.ClientToken, nil
}

// Engines are the secrets engine names Read knows, as gitlab-runner.
var Engines = []string{"kv-v2", "kv-v1", "generic"}

// Read returns field of the secret at secretPath in the engine mounted at
// enginePath: GET /v1/<engine>/data/<path> and .data.data for kv-v2,
// GET /v1/<engine>/<path> and .data for kv-v1 and generic.
func (c *Client) Read(ctx context.Context, token, engine, enginePath, secretPath, field string) (string, error) {
	var p string
	switch engine {
	case "kv-v2":
		p = path.Join(enginePath, "data", secretPath)
	case "kv-v1", "generic":
		p = path.Join(enginePath, secretPath)
	default:
		return "", fmt.Errorf("secrets engine %q: %w", engine, ErrUnknownEngine)
	}
	var out struct {
		Data map[string]any `json:"data"`
	}
	status, err := c.do(ctx, http.MethodGet, p, token, nil, &out)
	if err != nil {
		return "", fmt.Errorf("reading %s from Vault: %w", p, err)
	}
	data := out.Data
	if engine == "kv-v2" {
		inner, _ := data["data"].(map[string]any)
		data = inner
	}
	v, ok := data[field]
	if status == http.StatusNotFound || !ok || v == nil {
		return "", fmt.Errorf("field %q of %s: %w", field, p, ErrNotFound)
	}
	if s, ok := v.(string); ok {
		return s, nil
	}
	// gitlab-runner prints other JSON values with %v; JSON is the
	// faithful text of a number, list or object.
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// ErrUnknownEngine: a secrets engine name other than those in Engines.
var ErrUnknownEngine = errors.New("unknown secrets engine (want kv-v2, kv-v1 or generic)")

// do sends one request to /v1/<p> and decodes a JSON answer into out. A
// 404 is returned as its status with no error (Vault's own client treats
// a read of a missing path so); other non-2xx answers are *APIError.
func (c *Client) do(ctx context.Context, method, p, token string, body, out any) (int, error) {
	base, err := url.Parse(strings.TrimSuffix(c.URL, "/"))
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return 0, fmt.Errorf("Vault server URL %q: want http(s)://host[:port] (is VAULT_SERVER_URL set?)", c.URL)
	}
	u := base.JoinPath("v1", p)
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-Vault-Request", "true")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("X-Vault-Token", token)
	}
	if c.Namespace != "" {
		req.Header.Set("X-Vault-Namespace", c.Namespace)
	}
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 60 * time.Second}
	}
	res, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, maxResponse+1))
	if err != nil {
		return res.StatusCode, err
	}
	if len(raw) > maxResponse {
		return res.StatusCode, fmt.Errorf("answer larger than %d bytes", maxResponse)
	}
	if res.StatusCode == http.StatusNotFound && method == http.MethodGet {
		_ = json.Unmarshal(raw, out) // KV v2 answers 404 with metadata for deleted versions
		return res.StatusCode, nil
	}
	if res.StatusCode < 200 || res.StatusCode > 299 {
		var e struct {
			Errors []string `json:"errors"`
		}
		_ = json.Unmarshal(raw, &e)
		return res.StatusCode, &APIError{StatusCode: res.StatusCode, Errors: e.Errors}
	}
	if res.StatusCode == http.StatusNoContent || len(bytes.TrimSpace(raw)) == 0 {
		return res.StatusCode, nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return res.StatusCode, fmt.Errorf("decoding Vault's answer: %w", err)
	}
	return res.StatusCode, nil
}
