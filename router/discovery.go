package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// ID token discovery. Every cell signs its jobs' ID tokens with keys of
// its own and publishes them at /oauth/discovery/keys; a relying party
// (Vault, a cloud's identity federation) knows one issuer, the router's
// external URL, so the router serves the discovery document with that
// issuer and the union of the healthy cells' keys.

// discoveryTimeout bounds the fetches of one discovery request.
const discoveryTimeout = 10 * time.Second

// maxDiscoveryBody bounds what is read of a cell's discovery answer.
const maxDiscoveryBody = 1 << 20

// serveOpenIDConfiguration: GET /.well-known/openid-configuration, the
// first healthy cell's document (cells run one Berth version, so they
// claim the same) with issuer and jwks_uri of the router's external URL.
func (rt *Router) serveOpenIDConfiguration(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), discoveryTimeout)
	defer cancel()
	var last error
	for _, c := range rt.order {
		if !c.healthy.Load() {
			continue
		}
		var doc map[string]json.RawMessage
		if err := rt.fetchJSON(ctx, c, "/.well-known/openid-configuration", &doc); err != nil {
			last = err
			continue
		}
		if rt.cfg.ExternalURL != "" {
			iss := strings.TrimSuffix(rt.cfg.ExternalURL, "/")
			doc["issuer"], _ = jsonMarshal(iss)
			doc["jwks_uri"], _ = jsonMarshal(iss + "/oauth/discovery/keys")
		}
		writeJSON(w, http.StatusOK, doc)
		return
	}
	rt.discoveryUnavailable(w, "OpenID configuration", last)
}

// serveJWKS: GET /oauth/discovery/keys and /-/jwks, the keys of every
// healthy cell that answers, in cell order, each kid once (keys without
// a kid are kept unless identical). Cells that do not answer are left
// out (and logged); with none, 503.
func (rt *Router) serveJWKS(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), discoveryTimeout)
	defer cancel()
	type result struct {
		keys []json.RawMessage
		err  error
	}
	results := make([]result, len(rt.order))
	var wg sync.WaitGroup
	for i, c := range rt.order {
		if !c.healthy.Load() {
			results[i].err = errUnhealthy
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var set struct {
				Keys []json.RawMessage `json:"keys"`
			}
			err := rt.fetchJSON(ctx, c, "/oauth/discovery/keys", &set)
			results[i] = result{set.Keys, err}
		}()
	}
	wg.Wait()
	var sets [][]json.RawMessage
	for _, res := range results {
		if res.err == nil {
			sets = append(sets, res.keys)
		}
	}
	var last error
	for i, c := range rt.order {
		if err := results[i].err; err != nil && err != errUnhealthy {
			last = err
			rt.log.Warn("JWKS of a cell left out", "cell", c.id, "err", err)
		}
	}
	if len(sets) == 0 {
		rt.discoveryUnavailable(w, "ID token keys", last)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"keys": mergeJWKS(sets)})
}

// errUnhealthy marks a cell left out because it is unhealthy.
var errUnhealthy = errors.New("unhealthy")

// mergeJWKS merges the key lists of cells, in order: a kid's first key
// only, keys without a kid once each, anything not a JSON object left
// out.
func mergeJWKS(sets [][]json.RawMessage) []json.RawMessage {
	out := []json.RawMessage{}
	seen := map[string]bool{}
	for _, keys := range sets {
		for _, k := range keys {
			var id struct {
				Kid *string `json:"kid"`
			}
			if t := bytes.TrimSpace(k); len(t) == 0 || t[0] != '{' || json.Unmarshal(t, &id) != nil {
				continue
			}
			dedupe := "raw:" + string(k)
			if id.Kid != nil {
				dedupe = "kid:" + *id.Kid
			}
			if seen[dedupe] {
				continue
			}
			seen[dedupe] = true
			out = append(out, k)
		}
	}
	return out
}

// discoveryUnavailable answers 503: no healthy cell answered.
func (rt *Router) discoveryUnavailable(w http.ResponseWriter, what string, err error) {
	if err != nil {
		rt.log.Warn(what+": no cell answered", "err", err)
	}
	writeError(w, http.StatusServiceUnavailable, "503 Service Unavailable - no cell answered with its "+what)
}

// fetchJSON decodes the JSON answer of GET path from a cell (200 only).
func (rt *Router) fetchJSON(ctx context.Context, c *cell, path string, v any) error {
	res, err := rt.get(ctx, c, path)
	if err != nil {
		rt.metrics.proxyErrors.WithLabelValues(c.label).Inc()
		return fmt.Errorf("cell %d: %w", c.id, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		rt.metrics.proxyErrors.WithLabelValues(c.label).Inc()
		return fmt.Errorf("cell %d: GET %s: status %d", c.id, path, res.StatusCode)
	}
	if err := json.NewDecoder(io.LimitReader(res.Body, maxDiscoveryBody)).Decode(v); err != nil {
		rt.metrics.proxyErrors.WithLabelValues(c.label).Inc()
		return fmt.Errorf("cell %d: GET %s: decoding: %w", c.id, path, err)
	}
	return nil
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "500 Internal Server Error")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}
