package resthttp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"

	"github.com/berthci/berth/coordinator/internal/httpapi"
)

// param is one request parameter: a JSON body's value, or the strings of
// a query's or form's field (list: named k[] or given more than once).
type param struct {
	raw  json.RawMessage
	strs []string
	list bool
}

// decodeParams reads a request's parameters into the struct *v the way
// GitLab's API (Grape) reads them, so that a call that works against
// GitLab works here: the query's fields, then the body's — a form
// (URL-encoded or multipart: curl --data, --form) or else JSON — the
// body's winning. Each field of v takes the parameter of its json name,
// coerced to the field's type as Grape coerces declared parameters:
//
//	bool      JSON true and false; the strings true/false, 1/0, yes/no,
//	          on/off, t/f, y/n (any case)
//	integers  JSON numbers, and decimal strings ("namespace_id": "42")
//	string    strings, and JSON numbers and booleans as written
//	[]string  a JSON array of strings; a form's repeated k or k[]; one
//	          string split at its commas
//	nested    a form's k[sub] is a hash and k[][sub] a list of hashes, as
//	          Rack nests them (GitLab's --form "inputs[][name]=…"): read
//	          as the JSON object or array they make
//	others    types that read JSON themselves, structs and maps: the JSON
//	          value as is, or a form's string as a JSON string
//
// A pointer field is set when its parameter is given (JSON null leaves
// it nil). Parameters that are no field are ignored, as JSON's unknown
// keys are. On failure it answers 400 naming the parameter ("access_level
// is invalid"), or 413, itself and returns false.
func decodeParams(w http.ResponseWriter, r *http.Request, v any) bool {
	params, ok := readParams(w, r)
	if !ok {
		return false
	}
	if err := assignParams(v, params); err != nil {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - "+err.Error())
		return false
	}
	return true
}

// readParams collects the query's and the body's parameters, answering
// 400 or 413 itself on failure.
func readParams(w http.ResponseWriter, r *http.Request) (map[string]param, bool) {
	query, err := queryPairs(r.URL.RawQuery)
	if err != nil {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - the query: "+err.Error())
		return nil, false
	}
	params := pairParams(query)
	if r.Body == nil || r.Body == http.NoBody {
		return params, true
	}
	body := http.MaxBytesReader(w, r.Body, httpapi.MaxJSONBody)
	fail := func(what string, err error) (map[string]param, bool) {
		if !httpapi.TooLarge(w, err) {
			httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - "+what+": "+err.Error())
		}
		return nil, false
	}
	var form [][2]string
	switch mt, mp, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt {
	case "application/x-www-form-urlencoded":
		b, err := io.ReadAll(body)
		if err != nil {
			return fail("reading the body", err)
		}
		if form, err = queryPairs(string(b)); err != nil {
			return fail("the form", err)
		}
	case "multipart/form-data":
		if form, err = multipartPairs(body, mp["boundary"]); err != nil {
			return fail("the form", err)
		}
	default:
		var buf bytes.Buffer
		if _, err := buf.ReadFrom(body); err != nil {
			return fail("reading the body", err)
		}
		if len(bytes.TrimSpace(buf.Bytes())) == 0 {
			return params, true
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(buf.Bytes(), &obj); err != nil {
			httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - invalid JSON body: "+err.Error())
			return nil, false
		}
		for k, raw := range obj {
			params[k] = param{raw: raw}
		}
		return params, true
	}
	for k, p := range pairParams(form) {
		params[k] = p
	}
	return params, true
}

// queryPairs splits a query or URL-encoded form into its fields, in
// order (which nested fields need: Rack's inputs[][name] starts a new
// entry when the last one has the name already).
func queryPairs(q string) ([][2]string, error) {
	var out [][2]string
	for part := range strings.SplitSeq(q, "&") {
		if part == "" {
			continue
		}
		k, v, _ := strings.Cut(part, "=")
		key, err := url.QueryUnescape(k)
		if err != nil {
			return nil, err
		}
		val, err := url.QueryUnescape(v)
		if err != nil {
			return nil, err
		}
		out = append(out, [2]string{key, val})
	}
	return out, nil
}

// multipartPairs reads a multipart form's fields in order; files are
// skipped (no endpoint that reads parameters takes one).
func multipartPairs(body io.Reader, boundary string) ([][2]string, error) {
	if boundary == "" {
		return nil, errors.New("multipart/form-data without a boundary")
	}
	mr := multipart.NewReader(body, boundary)
	var out [][2]string
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		b, err := io.ReadAll(part)
		if err != nil {
			return nil, err
		}
		if name := part.FormName(); name != "" && part.FileName() == "" {
			out = append(out, [2]string{name, string(b)})
		}
	}
}

// pairParams turns fields into parameters as Rack nests them: k and k[]
// are a value or a list; k[sub] a hash; k[][sub] a list of hashes, a new
// one begun when the last has sub already. A nested parameter becomes
// JSON, for the field's type to read.
func pairParams(pairs [][2]string) map[string]param {
	params := map[string]param{}
	hashes := map[string]map[string]string{}
	lists := map[string][]map[string]string{}
	for _, kv := range pairs {
		k, v := kv[0], kv[1]
		name, rest, nested := strings.Cut(k, "[")
		switch {
		case !nested || rest == "]":
			p := params[name]
			p.strs = append(p.strs, v)
			p.list = p.list || nested || len(p.strs) > 1
			params[name] = p
		case strings.HasPrefix(rest, "][") && strings.HasSuffix(rest, "]"):
			sub := rest[2 : len(rest)-1]
			l := lists[name]
			if len(l) == 0 {
				l = append(l, map[string]string{})
			}
			if _, taken := l[len(l)-1][sub]; taken {
				l = append(l, map[string]string{})
			}
			l[len(l)-1][sub] = v
			lists[name] = l
		case strings.HasSuffix(rest, "]") && !strings.Contains(rest[:len(rest)-1], "["):
			h := hashes[name]
			if h == nil {
				h = map[string]string{}
				hashes[name] = h
			}
			h[rest[:len(rest)-1]] = v
		}
	}
	for name, h := range hashes {
		raw, _ := json.Marshal(h)
		params[name] = param{raw: raw}
	}
	for name, l := range lists {
		raw, _ := json.Marshal(l)
		params[name] = param{raw: raw}
	}
	return params
}

// assignParams sets the fields of the struct *v that params name.
func assignParams(v any, params map[string]param) error {
	rv := reflect.ValueOf(v).Elem()
	rt := rv.Type()
	for i := range rt.NumField() {
		f := rt.Field(i)
		if !f.IsExported() || f.Anonymous {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		p, ok := params[name]
		if !ok {
			continue
		}
		if err := setParam(rv.Field(i), p); err != nil {
			return fmt.Errorf("%s is invalid: %w", name, err)
		}
	}
	return nil
}

// setParam sets a field from its parameter.
func setParam(fv reflect.Value, p param) error {
	if p.raw == nil {
		return setStrings(fv, p.strs, p.list)
	}
	raw := bytes.TrimSpace(p.raw)
	if string(raw) == "null" {
		if fv.Kind() == reflect.Pointer {
			fv.SetZero()
		}
		return nil
	}
	// As JSON first: the field's type decides what it accepts.
	err := json.Unmarshal(raw, fv.Addr().Interface())
	if err == nil {
		return nil
	}
	// Then a scalar written as another: "42" for a number, 42 or true
	// for a string, "true" for a boolean.
	var s string
	switch {
	case raw[0] == '"':
		if json.Unmarshal(raw, &s) != nil {
			return err
		}
	case string(raw) == "true" || string(raw) == "false" || json.Valid(raw) && (raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9'):
		s = string(raw)
	default:
		return errors.New("wrong type")
	}
	return setStrings(fv, []string{s}, false)
}

// setStrings sets a field from a query's or form's values.
func setStrings(fv reflect.Value, strs []string, list bool) error {
	if fv.Kind() == reflect.Pointer {
		n := reflect.New(fv.Type().Elem())
		if err := setStrings(n.Elem(), strs, list); err != nil {
			return err
		}
		fv.Set(n)
		return nil
	}
	s := strs[len(strs)-1] // a scalar given twice: the last, as Rack
	if u, ok := fv.Addr().Interface().(json.Unmarshaler); ok {
		var b []byte
		if list {
			b, _ = json.Marshal(strs)
		} else {
			b, _ = json.Marshal(s)
		}
		return u.UnmarshalJSON(b)
	}
	switch k := fv.Kind(); k {
	case reflect.String:
		fv.SetString(s)
	case reflect.Bool:
		b, err := parseGrapeBool(s)
		if err != nil {
			return err
		}
		fv.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, fv.Type().Bits())
		if err != nil {
			return fmt.Errorf("%q is not an integer", s)
		}
		fv.SetInt(n)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n, err := strconv.ParseUint(strings.TrimSpace(s), 10, fv.Type().Bits())
		if err != nil {
			return fmt.Errorf("%q is not a non-negative integer", s)
		}
		fv.SetUint(n)
	case reflect.Float32, reflect.Float64:
		x, err := strconv.ParseFloat(strings.TrimSpace(s), fv.Type().Bits())
		if err != nil {
			return fmt.Errorf("%q is not a number", s)
		}
		fv.SetFloat(x)
	case reflect.Slice:
		if fv.Type().Elem().Kind() != reflect.String {
			return errors.New("give it in a JSON body")
		}
		items := strs
		if !list {
			items = nil
			for _, it := range strings.Split(s, ",") {
				if it = strings.TrimSpace(it); it != "" {
					items = append(items, it)
				}
			}
		}
		out := reflect.MakeSlice(fv.Type(), len(items), len(items))
		for i, it := range items {
			out.Index(i).SetString(it)
		}
		fv.Set(out)
	default:
		return errors.New("give it in a JSON body")
	}
	return nil
}

// parseGrapeBool reads a boolean as Grape's parameter coercion does.
func parseGrapeBool(s string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "true", "1", "yes", "on", "t", "y":
		return true, nil
	case "false", "0", "no", "off", "f", "n":
		return false, nil
	}
	return false, fmt.Errorf("%q is not a boolean (true or false)", s)
}
