package tsng

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
)

// fieldError is a config decoding error at a field path, such as
// `networks[0] (home).node.wireguard_key: wg: bad key: …`.
type fieldError struct {
	path string
	err  error
}

func (e *fieldError) Error() string { return e.path + ": " + e.err.Error() }
func (e *fieldError) Unwrap() error { return e.err }

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// locateDecodeError decodes b into a fresh value of type t field by field,
// as encoding/json with unknown fields refused would, and returns the
// first error (in the file's order) with the path of its field; nil if
// it finds none. A struct field tagged tsng:"secret" holds a private key:
// its value is never quoted in the error.
func locateDecodeError(b []byte, t reflect.Type) error {
	return walkJSON(b, t, "", false)
}

func walkJSON(raw []byte, t reflect.Type, path string, secret bool) error {
	raw = bytes.TrimSpace(raw)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if string(raw) == "null" {
		return nil // encoding/json leaves the value as it is
	}
	pt := reflect.PointerTo(t)
	leaf := pt.Implements(jsonUnmarshaler) || pt.Implements(textUnmarshaler)
	switch {
	case !leaf && t.Kind() == reflect.Struct:
		if len(raw) == 0 || raw[0] != '{' {
			return &fieldError{nonEmpty(path, "the file"), errors.New("want an object")}
		}
		return walkObject(raw, t, path)
	case !leaf && t.Kind() == reflect.Slice && t.Elem().Kind() != reflect.Uint8:
		if len(raw) == 0 || raw[0] != '[' {
			return &fieldError{path, errors.New("want an array")}
		}
		var elems []json.RawMessage
		if err := json.Unmarshal(raw, &elems); err != nil {
			return &fieldError{path, err}
		}
		for i, e := range elems {
			label := fmt.Sprintf("%s[%d]", path, i)
			var named struct {
				Name *string `json:"name"`
			}
			if bytes.HasPrefix(bytes.TrimSpace(e), []byte("{")) && json.Unmarshal(e, &named) == nil && named.Name != nil {
				label += " (" + *named.Name + ")"
			}
			if err := walkJSON(e, t.Elem(), label, secret); err != nil {
				return err
			}
		}
		return nil
	}
	v := reflect.New(t)
	err := json.Unmarshal(raw, v.Interface())
	if err == nil {
		return nil
	}
	return &fieldError{path, leafError(raw, t, leaf, secret, err)}
}

// walkObject walks the members of the JSON object raw, in order, against
// the fields of the struct type t.
func walkObject(raw []byte, t reflect.Type, path string) error {
	d := json.NewDecoder(bytes.NewReader(raw))
	if _, err := d.Token(); err != nil { // {
		return &fieldError{path, err}
	}
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			return &fieldError{path, err}
		}
		key, _ := tok.(string)
		var val json.RawMessage
		if err := d.Decode(&val); err != nil {
			return &fieldError{path, err}
		}
		sub := key
		if path != "" {
			sub = path + "." + key
		}
		f, ok := jsonField(t, key)
		if !ok {
			msg := "unknown field"
			if s := closestField(t, key); s != "" {
				msg += " (did you mean " + s + "?)"
			}
			return &fieldError{sub, errors.New(msg)}
		}
		if err := walkJSON(val, f.Type, sub, f.Tag.Get("tsng") == "secret"); err != nil {
			return err
		}
	}
	return nil
}

// jsonFields are the names encoding/json decodes into t's fields.
func jsonFields(t reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		out[nonEmpty(name, f.Name)] = f
	}
	return out
}

// jsonField is the field of t that key decodes into: the exact name, else
// one equal under case folding (as encoding/json matches).
func jsonField(t reflect.Type, key string) (reflect.StructField, bool) {
	fields := jsonFields(t)
	if f, ok := fields[key]; ok {
		return f, true
	}
	for name, f := range fields {
		if strings.EqualFold(name, key) {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// closestField is the field name of t within two edits of key, if one is.
func closestField(t reflect.Type, key string) string {
	best, bestD := "", 3
	for name := range jsonFields(t) {
		if d := editDistance(strings.ToLower(name), strings.ToLower(key)); d < bestD || d == bestD && name < best {
			best, bestD = name, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b (short names only).
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 1 << 10
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// leafError says what is wrong with a value of type t: the expected JSON
// type for a type error, else the value's own decoding error, with a
// secret value replaced.
func leafError(raw []byte, t reflect.Type, text, secret bool, err error) error {
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		switch {
		case text || t.Kind() == reflect.String:
			return errors.New("want a string")
		case t.Kind() == reflect.Bool:
			return errors.New("want true or false")
		case t.Kind() >= reflect.Int && t.Kind() <= reflect.Float64:
			if n, ok := strings.CutPrefix(te.Value, "number "); ok {
				return fmt.Errorf("%s is out of range (%s)", n, numRange(t))
			}
			return errors.New("want a number")
		}
		return fmt.Errorf("want a JSON value of Go type %v, not a %s", t, te.Value)
	}
	if !secret {
		return err
	}
	var s string
	msg := err.Error()
	if json.Unmarshal(raw, &s) == nil && s != "" {
		msg = strings.ReplaceAll(msg, strconv.Quote(s), "the value")
		msg = strings.ReplaceAll(msg, s, "the value")
	}
	return errors.New(msg)
}

// numRange is the range of the integer type t, as "0-65535".
func numRange(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		hi := int64(1)<<(t.Bits()-1) - 1
		return fmt.Sprintf("%d-%d", -hi-1, hi)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return fmt.Sprintf("0-%d", uint64(1)<<(t.Bits()-1)*2-1)
	}
	return t.String()
}
