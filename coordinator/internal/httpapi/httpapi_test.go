package httpapi

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestDecodeJSON(t *testing.T) {
	type body struct {
		Token string `json:"token"`
		N     int    `json:"n"`
	}
	for _, c := range []struct {
		name, in string
		code     int // 0: decoded
		want     body
	}{
		{"a body", `{"token":"t","n":3}`, 0, body{"t", 3}},
		{"blanks after it", "{\"token\":\"t\"}\n \t", 0, body{Token: "t"}},
		{"data after the value", `{"token":"x"}garbage`, http.StatusBadRequest, body{}},
		{"two values", `{"token":"x"}{"token":"y"}`, http.StatusBadRequest, body{}},
		{"empty", ``, http.StatusBadRequest, body{}},
		{"wrong type", `{"n":"3"}`, http.StatusBadRequest, body{}},
		{"over the limit", `{"token":"` + strings.Repeat("a", MaxJSONBody) + `"}`, http.StatusRequestEntityTooLarge, body{}},
	} {
		// Twice: the second reuses the first's buffer.
		for range 2 {
			w := httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(c.in))
			var got body
			ok := DecodeJSON(w, r, &got)
			switch {
			case c.code == 0 && (!ok || got != c.want):
				t.Errorf("%s: ok %v, %+v (answer %d %s); want %+v", c.name, ok, got, w.Code, w.Body, c.want)
			case c.code != 0 && (ok || w.Code != c.code):
				t.Errorf("%s: ok %v, answer %d; want %d", c.name, ok, w.Code, c.code)
			case c.code == http.StatusBadRequest && !strings.Contains(w.Body.String(), "invalid JSON body"):
				t.Errorf("%s: body %s", c.name, w.Body)
			}
		}
	}
}

func TestWriteJSON(t *testing.T) {
	big := map[string]string{"payload": strings.Repeat("x", 5000)} // past net/http's 2 KiB buffer
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/bad" {
			WriteJSON(w, http.StatusCreated, map[string]float64{"n": math.NaN()})
			return
		}
		WriteJSON(w, http.StatusCreated, big)
	}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got map[string]string
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != http.StatusCreated || got["payload"] != big["payload"] {
		t.Fatalf("%d %v", resp.StatusCode, err)
	}
	if resp.ContentLength <= 5000 || len(resp.TransferEncoding) != 0 || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("Content-Length %d, Transfer-Encoding %v, Content-Type %q", resp.ContentLength, resp.TransferEncoding, resp.Header.Get("Content-Type"))
	}
	bad, err := http.Get(srv.URL + "/bad")
	if err != nil {
		t.Fatal(err)
	}
	bad.Body.Close()
	if bad.StatusCode != http.StatusInternalServerError {
		t.Errorf("a value that does not encode: %d", bad.StatusCode)
	}
}
