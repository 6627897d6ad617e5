package jobtoken

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

// claimsSeeds are claims as Mint writes them and near misses of each
// kind the direct path hands to encoding/json.
func claimsSeeds(t testing.TB) []string {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	k := &Keys{issuer: "https://ci.example.test", cell: 7}
	var seeds []string
	for _, c := range []Claims{
		{JobID: 42, ProjectID: 1234, Organization: 1, Scopes: ScriptScopes, Dependencies: []int64{40, 41},
			IssuedAt: now, Expires: now.Add(time.Hour), HandOut: "h1"},
		{JobID: 1, Scopes: RunnerScopes, Expires: now.Add(time.Minute), HandOut: "h2"},
		{JobID: 9, Expires: now, HandOut: "h3"},                   // scp null, no dep
		{JobID: 9, Scopes: []Scope{}, Expires: now, HandOut: "h"}, // scp []
	} {
		seeds = append(seeds, string(k.appendClaims(nil, c)))
	}
	seeds = append(seeds,
		`{}`, `{"sub":"x"} `, ` {"sub":"x"}`, `{"sub":"x","sub":"y"}`, `{"SUB":"x"}`, `{"sub":null}`,
		`{"exp":1.5}`, `{"exp":1e9}`, `{"exp":-0}`, `{"exp":01}`, `{"exp":"1"}`, `{"exp":1234567890123456}`,
		`{"aud":["a","b"]}`, `{"aud":"a"}`, `{"scp":["a",1]}`, `{"scp":[]}`, `{"scp":null,"scp":["x"]}`,
		`{"dep":[1,-2,3]}`, `{"dep":null}`, `{"dep":[1.0]}`, `{"jti":"a\"b"}`, `{"jti":"é"}`, `{"jti":"a\u0041"}`,
		`{"version":"0.1.0","c":"7","o":"1","p":"ya"}`, `{"sub":"x"`, `{"sub":"x",}`, `{"unknown":1}`, `[]`, ``,
	)
	return seeds
}

// FuzzDecodeClaims: where the direct path answers, encoding/json gives the
// same claims; decodeClaims fails exactly where encoding/json does.
func FuzzDecodeClaims(f *testing.F) {
	for _, s := range claimsSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var want wire
		wantErr := json.Unmarshal([]byte(s), &want)
		var fast wire
		if fastClaims([]byte(s), &fast) {
			if wantErr != nil {
				t.Fatalf("%q: the direct path read %+v where encoding/json fails: %v", s, fast, wantErr)
			}
			if !reflect.DeepEqual(fast, want) {
				t.Fatalf("%q: direct path %+v, encoding/json %+v", s, fast, want)
			}
		}
		var got wire
		err := decodeClaims([]byte(s), &got)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("%q: decodeClaims error %v, encoding/json's %v", s, err, wantErr)
		}
		if err == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: decodeClaims %+v, encoding/json %+v", s, got, want)
		}
	})
}

// Mint's claims take the direct path, every one of them.
func TestMintedClaimsTakeTheDirectPath(t *testing.T) {
	for _, s := range claimsSeeds(t)[:4] {
		var w wire
		if !fastClaims([]byte(s), &w) {
			t.Errorf("%s: not read by the direct path", s)
		}
	}
}
