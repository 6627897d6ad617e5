package runnerapi

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestTagListAcceptsStringAndArray(t *testing.T) {
	cases := map[string]string{
		`"a, b ,,c"`:   "a|b|c",
		`["x","y"]`:    "x|y",
		`null`:         "",
		`""`:           "",
		`["only one"]`: "only one",
	}
	for in, want := range cases {
		var tl TagList
		if err := json.Unmarshal([]byte(in), &tl); err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if got := strings.Join(tl, "|"); got != want {
			t.Errorf("%s → %q, want %q", in, got, want)
		}
	}
	var tl TagList
	if err := json.Unmarshal([]byte(`{"a":1}`), &tl); err == nil {
		t.Error("object accepted as tag_list")
	}
}

func TestFlexStringNumberOrString(t *testing.T) {
	var o DockerOpts
	if err := json.Unmarshal([]byte(`{"user": 1000}`), &o); err != nil || o.User != "1000" {
		t.Fatalf("number: %q %v", o.User, err)
	}
	if err := json.Unmarshal([]byte(`{"user": "root"}`), &o); err != nil || o.User != "root" {
		t.Fatalf("string: %q %v", o.User, err)
	}
	b, _ := json.Marshal(DockerOpts{User: "1000"})
	if string(b) != `{"user":1000}` {
		t.Fatalf("marshal %s", b)
	}
	if err := json.Unmarshal([]byte(`{"user": true}`), &o); err == nil {
		t.Fatal("bool accepted as user")
	}
}

func FuzzJobResponse(f *testing.F) {
	f.Add([]byte(`{"id":1,"token":"glcbt-x","image":{"name":"a","executor_opts":{"docker":{"user":1}}},"variables":[{"key":"A","value":"b"}]}`))
	f.Add([]byte(`{"tag_list":"a,b"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var j JobResponse
		if json.Unmarshal(b, &j) == nil {
			if _, err := json.Marshal(j); err != nil {
				t.Fatalf("re-encoding a decoded payload: %v", err)
			}
		}
		var r RegisterRequest
		_ = json.Unmarshal(b, &r)
	})
}

func TestFlexStringKeepsLeadingZeros(t *testing.T) {
	b, err := json.Marshal(DockerOpts{User: "0123"})
	if err != nil || string(b) != `{"user":"0123"}` {
		t.Fatalf("%s %v", b, err)
	}
}
