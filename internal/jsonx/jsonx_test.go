package jsonx

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"
)

type doc struct {
	Name  string `json:"name"`
	Count int    `json:"count"`
	Any   any    `json:"any,omitempty"`
}

// decodeCases is the table of Decode inputs, also the fuzz seed corpus.
var decodeCases = []struct {
	name string
	in   string
	want error // nil: accepted; errNotNil: any error
}{
	{"object", `{"name":"a","count":2}`, nil},
	{"white space around", " \t\r\n{\"name\":\"a\"}\n\t ", nil},
	{"empty", ``, ErrEmpty},
	{"only white space", " \n\t\r ", ErrEmpty},
	{"unknown field", `{"name":"a","extra":1}`, errUnknownField},
	{"second value", `{"name":"a"}{"name":"b"}`, ErrTrailingData},
	{"stray brace", `{"name":"a"}}`, ErrTrailingData},
	{"stray bracket", `{"name":"a"}]`, ErrTrailingData},
	{"garbage after", `{"name":"a"} x`, ErrTrailingData},
	{"second number", `{"name":"a"} 1`, ErrTrailingData},
	{"truncated", `{"name":`, io.ErrUnexpectedEOF},
	{"syntax", `{"name" "a"}`, errSyntax},
	{"wrong type", `{"count":"two"}`, errType},
	{"null", `null`, nil},
	{"non-breaking space after", "{}\u00a0", ErrTrailingData},
}

var (
	errUnknownField = errors.New("unknown field")
	errSyntax       = errors.New("syntax")
	errType         = errors.New("type")
)

// matches reports whether err is what a decodeCases row wants.
func matches(err, want error) bool {
	switch want {
	case nil:
		return err == nil
	case errUnknownField:
		return err != nil && strings.HasPrefix(err.Error(), `json: unknown field "extra"`)
	case errSyntax:
		_, ok := errors.AsType[*json.SyntaxError](err)
		return ok
	case errType:
		_, ok := errors.AsType[*json.UnmarshalTypeError](err)
		return ok
	}
	return errors.Is(err, want)
}

func TestDecode(t *testing.T) {
	for _, c := range decodeCases {
		t.Run(c.name, func(t *testing.T) {
			var d doc
			err := Decode([]byte(c.in), &d)
			if !matches(err, c.want) {
				t.Fatalf("Decode(%q) = %v, want %v", c.in, err, c.want)
			}
		})
	}
}

func TestDecodeValue(t *testing.T) {
	var d doc
	if err := Decode([]byte(`{"name":"a","count":2}`), &d); err != nil {
		t.Fatal(err)
	}
	if d.Name != "a" || d.Count != 2 {
		t.Fatalf("decoded %+v", d)
	}
}

func TestDecodeTrailingOffset(t *testing.T) {
	err := Decode([]byte(`{"count":1}  {}`), new(doc))
	if !errors.Is(err, ErrTrailingData) || !strings.HasSuffix(err.Error(), "at offset 13") {
		t.Fatalf("err %v, want ErrTrailingData at offset 13", err)
	}
}

// errUnmarshal is returned by strictValue's UnmarshalJSON.
var errUnmarshal = errors.New("test: refused by UnmarshalJSON")

type strictValue struct{}

func (*strictValue) UnmarshalJSON([]byte) error { return errUnmarshal }

func TestDecodeUnmarshalerError(t *testing.T) {
	var v struct {
		S strictValue `json:"s"`
	}
	if err := Decode([]byte(`{"s":1}`), &v); !errors.Is(err, errUnmarshal) {
		t.Fatalf("err %v, want the UnmarshalJSON error", err)
	}
}

func TestDecodeUseNumber(t *testing.T) {
	const big = "9007199254740993" // 2^53 + 1: no float64 holds it
	var d doc
	if err := Decode([]byte(`{"any":`+big+`}`), &d, UseNumber); err != nil {
		t.Fatal(err)
	}
	if n, ok := d.Any.(json.Number); !ok || n.String() != big {
		t.Fatalf("any = %#v, want json.Number %s", d.Any, big)
	}
	if err := Decode([]byte(`{"any":`+big+`}`), &d); err != nil {
		t.Fatal(err)
	}
	if f, ok := d.Any.(float64); !ok || f != math.Pow(2, 53) {
		t.Fatalf("without UseNumber any = %#v, want float64", d.Any)
	}
}

func TestReadAll(t *testing.T) {
	for _, c := range []struct {
		n, limit int
		tooLarge bool
	}{
		{0, 0, false}, {0, 10, false}, {9, 10, false}, {10, 10, false},
		{11, 10, true}, {1, 0, true}, {1 << 16, 1 << 10, true},
	} {
		in := bytes.Repeat([]byte{'x'}, c.n)
		r := &countingReader{r: bytes.NewReader(in)}
		got, err := ReadAll(r, int64(c.limit))
		if c.tooLarge {
			if !errors.Is(err, ErrTooLarge) || got != nil {
				t.Errorf("n=%d limit=%d: %q, %v; want ErrTooLarge", c.n, c.limit, got, err)
			}
			if r.n > c.limit+1 {
				t.Errorf("n=%d limit=%d: read %d bytes, want at most limit+1", c.n, c.limit, r.n)
			}
			continue
		}
		if err != nil || !bytes.Equal(got, in) {
			t.Errorf("n=%d limit=%d: %d bytes, %v; want all of it", c.n, c.limit, len(got), err)
		}
	}
	if _, err := ReadAll(strings.NewReader("x"), -1); !errors.Is(err, ErrTooLarge) {
		t.Errorf("negative limit: %v, want ErrTooLarge", err)
	}
	if _, err := ReadAll(iotest.ErrReader(io.ErrClosedPipe), 10); !errors.Is(err, io.ErrClosedPipe) {
		t.Errorf("read error: %v, want it unchanged", err)
	}
	if _, err := ReadAll(strings.NewReader("12345678901"), 10); err == nil || err.Error() != "jsonx: input over the size limit: over 10 bytes" {
		t.Errorf("too large: error text %q", err)
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func TestReadBody(t *testing.T) {
	for _, c := range []struct {
		n        int
		tooLarge bool
	}{{0, false}, {100, false}, {101, true}} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(bytes.Repeat([]byte{'x'}, c.n)))
		got, err := ReadBody(rec, req, 100)
		if !c.tooLarge {
			if err != nil || len(got) != c.n {
				t.Errorf("n=%d: %d bytes, %v", c.n, len(got), err)
			}
			continue
		}
		if _, ok := errors.AsType[*http.MaxBytesError](err); !ok || !errors.Is(err, ErrTooLarge) {
			t.Errorf("n=%d: %v, want ErrTooLarge and *http.MaxBytesError", c.n, err)
		}
	}
	req := httptest.NewRequest(http.MethodPost, "/", iotest.ErrReader(io.ErrClosedPipe))
	if _, err := ReadBody(httptest.NewRecorder(), req, 100); !errors.Is(err, io.ErrClosedPipe) || errors.Is(err, ErrTooLarge) {
		t.Errorf("read error: %v, want it unchanged", err)
	}
}

// TestWrite checks that Write, WriteIndent and WriteAs answer exactly as a
// json.Encoder (with and without SetIndent) writes.
func TestWrite(t *testing.T) {
	v := map[string]any{"b": []int{1, 2}, "a": "<&>", "c": nil}
	encode := func(indent bool) string {
		var buf bytes.Buffer
		e := json.NewEncoder(&buf)
		if indent {
			e.SetIndent("", "  ")
		}
		if err := e.Encode(v); err != nil {
			t.Fatal(err)
		}
		return buf.String()
	}
	for _, c := range []struct {
		name  string
		write func(http.ResponseWriter)
		ct    string
		body  string
	}{
		{"Write", func(w http.ResponseWriter) { Write(w, http.StatusTeapot, v) }, "application/json", encode(false)},
		{"WriteIndent", func(w http.ResponseWriter) { WriteIndent(w, http.StatusTeapot, v) }, "application/json", encode(true)},
		{"WriteAs", func(w http.ResponseWriter) { WriteAs(w, http.StatusTeapot, "application/problem+json", v) }, "application/problem+json", encode(false)},
	} {
		rec := httptest.NewRecorder()
		c.write(rec)
		if rec.Code != http.StatusTeapot || rec.Header().Get("Content-Type") != c.ct || rec.Body.String() != c.body {
			t.Errorf("%s: %d %q %q, want %d %q %q", c.name, rec.Code, rec.Header().Get("Content-Type"), rec.Body.String(), http.StatusTeapot, c.ct, c.body)
		}
	}
}

func TestWriteUnencodable(t *testing.T) {
	rec := httptest.NewRecorder()
	Write(rec, http.StatusOK, map[string]any{"f": func() {}})
	if rec.Code != http.StatusInternalServerError || rec.Body.Len() != 0 {
		t.Fatalf("got %d %q, want a 500 with no body", rec.Code, rec.Body.String())
	}
}

// FuzzDecode checks that Decode never panics, that what it accepts is one
// value that encoding/json also accepts (with unknown fields refused), and
// that whatever it refuses for trailing data has a valid value before the
// offset it names.
func FuzzDecode(f *testing.F) {
	for _, c := range decodeCases {
		f.Add([]byte(c.in))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var d doc
		err := Decode(data, &d)
		var std doc
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		stdErr := dec.Decode(&std)
		switch {
		case err == nil:
			if stdErr != nil {
				t.Fatalf("Decode accepted %q, encoding/json refused it: %v", data, stdErr)
			}
			if !json.Valid(data) {
				t.Fatalf("Decode accepted %q, which is not one valid JSON value", data)
			}
		case errors.Is(err, ErrTrailingData):
			if stdErr != nil {
				t.Fatalf("trailing data in %q, but the value before it is refused: %v", data, stdErr)
			}
			if json.Valid(data) {
				t.Fatalf("trailing data in %q, which is one valid JSON value", data)
			}
		case errors.Is(err, ErrEmpty):
			if len(bytes.TrimLeft(data, whiteSpace)) != 0 {
				t.Fatalf("ErrEmpty for %q", data)
			}
		default:
			if stdErr == nil {
				t.Fatalf("Decode refused %q (%v), encoding/json accepted it", data, err)
			}
		}
	})
}
