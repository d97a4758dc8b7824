package keelvip

import (
	"encoding/base64"
	"errors"
)

func errorsIsStd(err, target error) bool { return errors.Is(err, target) }

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
