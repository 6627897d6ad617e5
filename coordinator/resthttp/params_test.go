package resthttp

import (
	"bytes"
	"encoding/json"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/berthci/berth/runnerapi"
)

// paramsTarget has a field of each kind decodeParams coerces to.
type paramsTarget struct {
	Name     string            `json:"name"`
	Count    int               `json:"count,omitempty"`
	ID       int64             `json:"id"`
	Flag     bool              `json:"flag"`
	MaybeB   *bool             `json:"maybe"`
	MaybeS   *string           `json:"maybe_s"`
	MaybeN   *int              `json:"maybe_n"`
	Ratio    float64           `json:"ratio"`
	Tags     []string          `json:"tags"`
	TagsP    *[]string         `json:"tags_p"`
	TagList  runnerapi.TagList `json:"tag_list"`
	Number   json.Number       `json:"number"`
	Nested   map[string]any    `json:"nested"`
	Items    []paramsItem      `json:"items"`
	Ignored  string            `json:"-"`
	unexport string
}

type paramsItem struct {
	Name    string `json:"name"`
	Value   any    `json:"value"`
	Destroy string `json:"destroy"`
}

func ptr[T any](v T) *T { return &v }

func multipartBody(t *testing.T, fields ...string) (string, *bytes.Buffer) {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	for i := 0; i < len(fields); i += 2 {
		if err := mw.WriteField(fields[i], fields[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	mw.Close()
	return mw.FormDataContentType(), &b
}

func TestDecodeParams(t *testing.T) {
	form := "application/x-www-form-urlencoded"
	mct, mbody := multipartBody(t, "name", "m", "flag", "yes", "tags[]", "a", "tags[]", "b")
	mct2, mbody2 := multipartBody(t, "inputs[][name]", "deploy_strategy", "items[][name]", "deploy_strategy", "items[][value]", "rolling",
		"items[][name]", "existing_input", "items[][destroy]", "true")
	for _, tc := range []struct {
		name  string
		query string
		ctype string
		body  string
		want  paramsTarget
	}{
		{name: "JSON as typed", ctype: "application/json",
			body: `{"name":"n","count":3,"id":9,"flag":true,"maybe":false,"maybe_s":"s","ratio":0.5,"tags":["a","b"],"tag_list":["x"],"number":12,"nested":{"k":1},"unknown":[1]}`,
			want: paramsTarget{Name: "n", Count: 3, ID: 9, Flag: true, MaybeB: ptr(false), MaybeS: ptr("s"), Ratio: 0.5, Tags: []string{"a", "b"}, TagList: runnerapi.TagList{"x"}, Number: "12", Nested: map[string]any{"k": float64(1)}}},
		{name: "JSON scalars written as strings (GitLab's documented calls)", ctype: "application/json",
			body: `{"count":"3","id":" 9","flag":"true","maybe":"0","maybe_n":"7","ratio":"0.25","tags":"a, b,,c","tags_p":"x","tag_list":"p, q"}`,
			want: paramsTarget{Count: 3, ID: 9, Flag: true, MaybeB: ptr(false), MaybeN: ptr(7), Ratio: 0.25, Tags: []string{"a", "b", "c"}, TagsP: &[]string{"x"}, TagList: runnerapi.TagList{"p", "q"}}},
		{name: "JSON numbers and booleans for strings", ctype: "application/json",
			body: `{"name":42,"maybe_s":true,"number":"5"}`,
			want: paramsTarget{Name: "42", MaybeS: ptr("true"), Number: "5"}},
		{name: "JSON null leaves a pointer nil", ctype: "application/json", body: `{"maybe":null,"name":null}`},
		{name: "no content type is JSON", body: `{"name":"n"}`, want: paramsTarget{Name: "n"}},
		{name: "empty body", ctype: "application/json", body: "  \n"},
		{name: "URL-encoded form", ctype: form,
			body: "name=f&count=4&flag=on&maybe=f&tags=a&tags=b&tag_list=x,y&number=3&ratio=1e2",
			want: paramsTarget{Name: "f", Count: 4, Flag: true, MaybeB: ptr(false), Tags: []string{"a", "b"}, TagList: runnerapi.TagList{"x", "y"}, Number: "3", Ratio: 100}},
		{name: "multipart form", ctype: mct, body: mbody.String(),
			want: paramsTarget{Name: "m", Flag: true, Tags: []string{"a", "b"}}},
		{name: "nested form fields, as Rack nests them", ctype: form,
			body: "items[][name]=a&items[][value]=1&items[][name]=b&items[][destroy]=true&nested[x]=1&nested[y]=two&name=n",
			want: paramsTarget{Name: "n", Items: []paramsItem{{Name: "a", Value: "1"}, {Name: "b", Destroy: "true"}}, Nested: map[string]any{"x": "1", "y": "two"}}},
		{name: "nested fields of a multipart form", ctype: mct2, body: mbody2.String(),
			want: paramsTarget{Items: []paramsItem{{Name: "deploy_strategy", Value: "rolling"}, {Name: "existing_input", Destroy: "true"}}}},
		{name: "query only", query: "name=q&id=5&tags[]=one", want: paramsTarget{Name: "q", ID: 5, Tags: []string{"one"}}},
		{name: "the body wins over the query", query: "name=q&id=5", ctype: form, body: "name=b",
			want: paramsTarget{Name: "b", ID: 5}},
		{name: "JSON body over the query", query: "name=q", ctype: "application/json", body: `{"name":"j"}`,
			want: paramsTarget{Name: "j"}},
		{name: "a scalar given twice: the last", query: "name=1&name=2", want: paramsTarget{Name: "2"}},
		{name: "ignored fields stay", query: "Ignored=x&unexport=y&-=z"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/x?"+tc.query, strings.NewReader(tc.body))
			if tc.body == "" {
				r.Body = http.NoBody
			}
			if tc.ctype != "" {
				r.Header.Set("Content-Type", tc.ctype)
			}
			w := httptest.NewRecorder()
			var got paramsTarget
			if !decodeParams(w, r, &got) {
				t.Fatalf("refused: %d %s", w.Code, w.Body)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestDecodeParamsErrors(t *testing.T) {
	for _, tc := range []struct {
		name, query, ctype, body, want string
	}{
		{name: "not a number", query: "count=many", want: `400 Bad request - count is invalid: "many" is not an integer`},
		{name: "not a boolean", ctype: "application/json", body: `{"flag":"perhaps"}`, want: `flag is invalid: "perhaps" is not a boolean`},
		{name: "overflow", query: "count=99999999999999999999", want: "count is invalid"},
		{name: "an object for a string", ctype: "application/json", body: `{"name":{"a":1}}`, want: "name is invalid: wrong type"},
		{name: "a map from a form", query: "nested=x", want: "nested is invalid: give it in a JSON body"},
		{name: "not JSON", ctype: "application/json", body: `{"name":`, want: "400 Bad request - invalid JSON body"},
		{name: "not an object", ctype: "application/json", body: `["name"]`, want: "invalid JSON body"},
		{name: "trailing garbage", ctype: "application/json", body: `{"name":"x"}y`, want: "invalid JSON body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/x?"+tc.query, strings.NewReader(tc.body))
			if tc.ctype != "" {
				r.Header.Set("Content-Type", tc.ctype)
			}
			w := httptest.NewRecorder()
			var got paramsTarget
			if decodeParams(w, r, &got) {
				t.Fatalf("accepted: %+v", got)
			}
			var msg struct{ Message string }
			_ = json.Unmarshal(w.Body.Bytes(), &msg)
			if w.Code != http.StatusBadRequest || !strings.Contains(msg.Message, tc.want) {
				t.Errorf("answered %d %s, want 400 with %q", w.Code, w.Body, tc.want)
			}
		})
	}
	r := httptest.NewRequest("POST", "/x", strings.NewReader(`{"name":"`+strings.Repeat("x", 2<<20)+`"}`))
	w := httptest.NewRecorder()
	var got paramsTarget
	if decodeParams(w, r, &got) || w.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("a body over the limit answered %d", w.Code)
	}
}

// FuzzDecodeParams: whatever the body, decodeParams answers (true, or
// false with a 4xx written) and never panics.
func FuzzDecodeParams(f *testing.F) {
	for _, s := range []struct{ q, ct, body string }{
		{"name=x", "", ""},
		{"", "application/json", `{"count":"3","flag":"yes","tags":"a,b","tag_list":["x"],"nested":{"a":[1]}}`},
		{"tags[]=a&tags[]=b", "application/x-www-form-urlencoded", "name=a&maybe_n=-4&ratio=NaN"},
		{"", "application/json", `{"maybe":null,"number":1e400}`},
		{"", "multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; name=\"name\"\r\n\r\nv\r\n--b--\r\n"},
	} {
		f.Add(s.q, s.ct, s.body)
	}
	f.Fuzz(func(t *testing.T, query, ctype, body string) {
		r := httptest.NewRequest("POST", "/x", strings.NewReader(body))
		r.URL.RawQuery = query
		r.Header.Set("Content-Type", ctype)
		w := httptest.NewRecorder()
		var got paramsTarget
		if !decodeParams(w, r, &got) && (w.Code < 400 || w.Code > 499) {
			t.Fatalf("refused with %d", w.Code)
		}
	})
}
