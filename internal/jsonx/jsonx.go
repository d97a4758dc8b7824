// Package jsonx reads JSON that comes from outside the process (files,
// request bodies) strictly and within a size limit, and writes the JSON
// answers of HTTP handlers. vipkit's packages and daemons do both through
// it; docs/errors.md says what a strict read refuses.
//
// Reading is two steps, so that each caller keeps its own error texts and
// HTTP status codes: ReadAll (or ReadBody for a server's request body)
// reads at most a limit and reports more as ErrTooLarge; Decode then
// accepts exactly one JSON value and refuses object fields that the
// destination does not have.
//
//	data, err := jsonx.ReadAll(f, MaxFileSize)
//	if errors.Is(err, jsonx.ErrTooLarge) {
//		return fmt.Errorf("%w: over %d bytes", ErrTooLarge, MaxFileSize)
//	}
//	...
//	if err := jsonx.Decode(data, &doc); err != nil {
//		return fmt.Errorf("%w: %v", ErrBadFile, err)
//	}
//
// Decode passes encoding/json's own errors (a *json.SyntaxError, a
// *json.UnmarshalTypeError, `json: unknown field "x"`) and the errors of
// a destination's UnmarshalJSON through unchanged, so callers can match
// and print them as before; it adds ErrEmpty and ErrTrailingData.
package jsonx

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// Errors of ReadAll, ReadBody and Decode. Match them with errors.Is.
var (
	// ErrTooLarge means the input is longer than the caller's limit; the
	// error names the limit. Nothing past limit+1 bytes was read.
	ErrTooLarge = errors.New("jsonx: input over the size limit")
	// ErrEmpty means the input holds no JSON value: it is empty or only
	// white space.
	ErrEmpty = errors.New("jsonx: no JSON value")
	// ErrTrailingData means something other than white space follows the
	// one JSON value: a second value or stray bytes. The error names the
	// offset of the first such byte.
	ErrTrailingData = errors.New("jsonx: trailing data after the value")
)

// ReadAll reads r to its end and returns what it read, at most limit
// bytes. Longer input is an error that wraps ErrTooLarge; a read error is
// returned as it is. A negative limit is read as 0.
func ReadAll(r io.Reader, limit int64) ([]byte, error) {
	limit = max(limit, 0)
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, tooLarge(limit)
	}
	return data, nil
}

// ReadBody reads a server's request body, at most limit bytes, through
// http.MaxBytesReader, so that the server closes the connection after
// answering an oversized request instead of reading the rest of it.
// Longer input is an error that wraps both ErrTooLarge and the
// *http.MaxBytesError; a read error is returned as it is.
func ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	limit = max(limit, 0)
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		if mbe, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, fmt.Errorf("%w: %w", tooLarge(limit), mbe)
		}
		return nil, err
	}
	return data, nil
}

func tooLarge(limit int64) error {
	return fmt.Errorf("%w: over %d bytes", ErrTooLarge, limit)
}

// An Option changes how Decode decodes.
type Option func(*json.Decoder)

// UseNumber makes Decode store a number in an interface{} (or a
// json.Number) as a json.Number instead of a float64, so that an integer
// too large for a float64 keeps its digits.
func UseNumber(d *json.Decoder) { d.UseNumber() }

// Decode decodes data into v. data must hold exactly one JSON value, with
// only white space around it; an object field that v's type does not have
// is refused. Errors are ErrEmpty, ErrTrailingData (wrapped, with the
// offset), encoding/json's errors and v's UnmarshalJSON errors, unchanged.
// Decode never panics on its input; what v holds after an error is
// unspecified.
func Decode(data []byte, v any, opts ...Option) error {
	if len(bytes.TrimLeft(data, whiteSpace)) == 0 {
		return ErrEmpty
	}
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	for _, o := range opts {
		o(d)
	}
	if err := d.Decode(v); err != nil {
		return err
	}
	off := d.InputOffset()
	rest := data[off:]
	if trimmed := bytes.TrimLeft(rest, whiteSpace); len(trimmed) > 0 {
		return fmt.Errorf("%w at offset %d", ErrTrailingData, off+int64(len(rest)-len(trimmed)))
	}
	return nil
}

// whiteSpace is JSON's insignificant white space (RFC 8259, section 2).
const whiteSpace = " \t\r\n"

// ContentType is the media type Write and WriteIndent answer with.
const ContentType = "application/json"

// Write answers with status and v as JSON (Content-Type
// application/json): v's encoding as json.Marshal makes it, then a
// newline, as a json.Encoder writes it. A v that cannot be encoded is a
// bug of the caller: the answer is then a 500 with no body.
func Write(w http.ResponseWriter, status int, v any) {
	WriteAs(w, status, ContentType, v)
}

// WriteIndent is Write with v indented by two spaces, for answers that
// people read.
func WriteIndent(w http.ResponseWriter, status int, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	write(w, status, ContentType, b, err)
}

// WriteAs is Write with another Content-Type, such as a JSON-based media
// type (application/problem+json, application/hal+json).
func WriteAs(w http.ResponseWriter, status int, contentType string, v any) {
	b, err := json.Marshal(v)
	write(w, status, contentType, b, err)
}

func write(w http.ResponseWriter, status int, contentType string, b []byte, err error) {
	if err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
