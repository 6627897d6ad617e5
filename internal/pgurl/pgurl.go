// Package pgurl edits PostgreSQL connection URLs.
package pgurl

import (
	"errors"
	"net/url"
)

// InSchema returns the postgres:// URL dsn with schema as its search_path,
// the schema a store then works in (tests and benchmarks give each run
// one of its own). The parameter is appended, not the query re-encoded:
// Go writes a space as "+", which libpq does not read so.
func InSchema(dsn, schema string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", errors.New("want a postgres:// URL")
	}
	if u.RawQuery != "" {
		u.RawQuery += "&"
	}
	u.RawQuery += "search_path=" + url.QueryEscape(schema)
	return u.String(), nil
}
