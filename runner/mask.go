package runner

import (
	"bytes"
	"io"
	"sort"
)

// maskText replaces secrets in the job log, as GitLab shows them.
const maskText = "[MASKED]"

// maxTokenHold bounds how much of a token-looking run the masker holds
// back waiting for its end.
const maxTokenHold = 4096

// Masker replaces masked variable values and tokens with known prefixes in
// a stream, even when a secret is split across writes: bytes that could be
// the start of a secret are held back until the next write (or Flush)
// decides. Values are replaced whole ("[MASKED]"); a token keeps its prefix
// ("glpat-[MASKED]"). Not safe for concurrent use.
type Masker struct {
	next     io.Writer
	secrets  [][]byte // longest first
	prefixes [][]byte
	pending  []byte
	out      []byte
}

// NewMasker returns a Masker writing to next.
func NewMasker(next io.Writer, secrets []string, prefixes []string) *Masker {
	m := &Masker{next: next}
	seen := map[string]bool{}
	for _, s := range secrets {
		if s != "" && !seen[s] {
			seen[s] = true
			m.secrets = append(m.secrets, []byte(s))
		}
	}
	sort.Slice(m.secrets, func(i, j int) bool { return len(m.secrets[i]) > len(m.secrets[j]) })
	for _, p := range prefixes {
		if p != "" && !seen["prefix:"+p] {
			seen["prefix:"+p] = true
			m.prefixes = append(m.prefixes, []byte(p))
		}
	}
	return m
}

// Add masks more values from now on (secrets resolved while the job
// runs). Output already written is not masked again.
func (m *Masker) Add(secrets ...string) {
	seen := map[string]bool{}
	for _, s := range m.secrets {
		seen[string(s)] = true
	}
	for _, s := range secrets {
		if s != "" && !seen[s] {
			seen[s] = true
			m.secrets = append(m.secrets, []byte(s))
		}
	}
	sort.Slice(m.secrets, func(i, j int) bool { return len(m.secrets[i]) > len(m.secrets[j]) })
}

// Write masks p and writes what is decided; it always consumes all of p.
func (m *Masker) Write(p []byte) (int, error) {
	m.pending = append(m.pending, p...)
	if err := m.process(false); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes everything held back (the stream ended).
func (m *Masker) Flush() error { return m.process(true) }

func isTokenChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.'
}

func (m *Masker) process(final bool) error {
	buf := m.pending
	out := m.out[:0]
	i := 0
scan:
	for i < len(buf) {
		rest := buf[i:]
		// Masked values, longest first.
		for _, s := range m.secrets {
			if bytes.HasPrefix(rest, s) {
				out = append(out, maskText...)
				i += len(s)
				continue scan
			}
		}
		if !final {
			for _, s := range m.secrets {
				if len(rest) < len(s) && bytes.HasPrefix(s, rest) {
					break scan // may be a secret split across writes
				}
			}
		}
		// Tokens by prefix.
		for _, pf := range m.prefixes {
			if bytes.HasPrefix(rest, pf) {
				j := len(pf)
				for j < len(rest) && isTokenChar(rest[j]) {
					j++
				}
				if j == len(rest) && !final && j < maxTokenHold {
					break scan // the token may go on in the next write
				}
				out = append(out, pf...)
				if j > len(pf) {
					out = append(out, maskText...)
				}
				i += j
				continue scan
			}
			if !final && len(rest) < len(pf) && bytes.HasPrefix(pf, rest) {
				break scan
			}
		}
		out = append(out, buf[i])
		i++
	}
	m.pending = append(m.pending[:0], buf[i:]...)
	m.out = out
	if len(out) == 0 {
		return nil
	}
	_, err := m.next.Write(out)
	return err
}
