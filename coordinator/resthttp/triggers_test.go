package resthttp

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestDecodeTriggerParams(t *testing.T) {
	for _, tc := range []struct {
		name, ctype, query, body string
		want                     triggerParams
	}{
		{"curl --form", "multipart/form-data; boundary=b", "",
			"--b\r\nContent-Disposition: form-data; name=\"token\"\r\n\r\nglptt-x\r\n--b\r\nContent-Disposition: form-data; name=\"ref\"\r\n\r\nmain\r\n" +
				"--b\r\nContent-Disposition: form-data; name=\"variables[A]\"\r\n\r\n1\r\n--b--\r\n",
			triggerParams{Token: "glptt-x", Ref: "main", Variables: map[string]string{"A": "1"}}},
		{"curl --data", "application/x-www-form-urlencoded", "", "token=t&ref=dev&variables%5BB%5D=2&inputs%5Benv%5D=prod&variables%5B%5D=x",
			triggerParams{Token: "t", Ref: "dev", Variables: map[string]string{"B": "2"}, Inputs: map[string]any{"env": "prod"}}},
		{"query", "", "token=t&ref=main&variables[C]=3", "",
			triggerParams{Token: "t", Ref: "main", Variables: map[string]string{"C": "3"}}},
		{"JSON, query token", "application/json", "token=q", `{"ref":"main","variables":{"D":"4"},"inputs":{"n":2}}`,
			triggerParams{Token: "q", Ref: "main", Variables: map[string]string{"D": "4"}, Inputs: map[string]any{"n": 2.0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/x?"+tc.query, bytes.NewReader([]byte(tc.body)))
			if tc.ctype != "" {
				r.Header.Set("Content-Type", tc.ctype)
			}
			w := httptest.NewRecorder()
			got, ok := decodeTriggerParams(w, r)
			if !ok {
				t.Fatalf("refused: %d %s", w.Code, w.Body)
			}
			g, _ := json.Marshal(got)
			want, _ := json.Marshal(tc.want)
			gv, _ := json.Marshal(got.Variables)
			wv, _ := json.Marshal(tc.want.Variables)
			if string(g) != string(want) || string(gv) != string(wv) {
				t.Errorf("got %s %s, want %s %s", g, gv, want, wv)
			}
		})
	}
	r := httptest.NewRequest("POST", "/x", bytes.NewReader([]byte("ref=main")))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	w := httptest.NewRecorder()
	if _, ok := decodeTriggerParams(w, r); ok || w.Code != http.StatusBadRequest || !bytes.Contains(w.Body.Bytes(), []byte("token is missing")) {
		t.Errorf("no token: %d %s", w.Code, w.Body)
	}
}

// FuzzDecodeTriggerParams: any body, of any of the content types the
// endpoint reads, is refused with a client error or read into a token
// and a ref, never a panic.
func FuzzDecodeTriggerParams(f *testing.F) {
	f.Add(0, "token=t&ref=main", []byte(`{"variables":{"A":"1"}}`))
	f.Add(1, "", []byte("token=t&ref=main&variables%5BA%5D=1"))
	f.Add(2, "ref=x", []byte("--b\r\nContent-Disposition: form-data; name=\"token\"\r\n\r\nglptt-x\r\n--b--\r\n"))
	f.Add(0, "", []byte(`{"token":"t","ref":"r","variables":{"A":1}}`))
	f.Fuzz(func(t *testing.T, kind int, query string, body []byte) {
		ctype := []string{"application/json", "application/x-www-form-urlencoded", "multipart/form-data; boundary=b", ""}[uint(kind)%4]
		r, err := http.NewRequest("POST", "http://x/y", bytes.NewReader(body))
		if err != nil {
			return
		}
		r.URL.RawQuery = query
		if ctype != "" {
			r.Header.Set("Content-Type", ctype)
		}
		w := httptest.NewRecorder()
		p, ok := decodeTriggerParams(w, r)
		if !ok {
			if w.Code != http.StatusBadRequest && w.Code != http.StatusRequestEntityTooLarge {
				t.Fatalf("refused with %d", w.Code)
			}
			return
		}
		if p.Token == "" || p.Ref == "" {
			t.Fatalf("accepted without token or ref: %+v", p)
		}
		_ = p.payload("1")
	})
}
