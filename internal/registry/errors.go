package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// Error codes of the OCI distribution spec, with the HTTP status each is sent with.
const (
	errBlobUnknown         = "BLOB_UNKNOWN"
	errBlobUploadInvalid   = "BLOB_UPLOAD_INVALID"
	errBlobUploadUnknown   = "BLOB_UPLOAD_UNKNOWN"
	errDigestInvalid       = "DIGEST_INVALID"
	errManifestBlobUnknown = "MANIFEST_BLOB_UNKNOWN"
	errManifestInvalid     = "MANIFEST_INVALID"
	errManifestUnknown     = "MANIFEST_UNKNOWN"
	errNameInvalid         = "NAME_INVALID"
	errNameUnknown         = "NAME_UNKNOWN"
	errSizeInvalid         = "SIZE_INVALID"
	errUnsupported         = "UNSUPPORTED"
	errTagInvalid          = "TAG_INVALID"
	errRangeInvalid        = "RANGE_INVALID" // not in the spec's table; what distribution sends with 416
	errPaginationInvalid   = "PAGINATION_NUMBER_INVALID"
	errDenied              = "DENIED"
	errUnauthorized        = "UNAUTHORIZED"
	errTooManyRequests     = "TOOMANYREQUESTS"
	errUnavailable         = "UNAVAILABLE" // distribution's code for a 503
	errOverQuota           = "QUOTA_EXCEEDED"
)

var errStatus = map[string]int{
	errBlobUnknown:         http.StatusNotFound,
	errBlobUploadInvalid:   http.StatusBadRequest,
	errBlobUploadUnknown:   http.StatusNotFound,
	errDigestInvalid:       http.StatusBadRequest,
	errManifestBlobUnknown: http.StatusBadRequest,
	errManifestInvalid:     http.StatusBadRequest,
	errManifestUnknown:     http.StatusNotFound,
	errNameInvalid:         http.StatusBadRequest,
	errNameUnknown:         http.StatusNotFound,
	errSizeInvalid:         http.StatusBadRequest,
	errUnsupported:         http.StatusMethodNotAllowed,
	errTagInvalid:          http.StatusBadRequest,
	errRangeInvalid:        http.StatusRequestedRangeNotSatisfiable,
	errPaginationInvalid:   http.StatusBadRequest,
	errDenied:              http.StatusForbidden,
	errUnauthorized:        http.StatusUnauthorized,
	errTooManyRequests:     http.StatusTooManyRequests,
	errUnavailable:         http.StatusServiceUnavailable,
	errOverQuota:           http.StatusForbidden,
}

// Error is a registry error with its OCI error code (MANIFEST_UNKNOWN, BLOB_UNKNOWN, ...).
// Import and List return it where a code applies; errors.As finds it.
type Error struct {
	Code    string
	Message string
	Detail  any
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

func errf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// IsCode reports whether err is (or wraps) a registry Error with code.
func IsCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

type errorBody struct {
	Errors []errorEntry `json:"errors"`
}

type errorEntry struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Detail  any    `json:"detail,omitempty"`
}

// writeError sends err as an OCI error document; errors without a code are 500s.
func writeError(w http.ResponseWriter, err error) int {
	var e *Error
	status := http.StatusInternalServerError
	body := errorBody{}
	if errors.As(err, &e) {
		if s, ok := errStatus[e.Code]; ok {
			status = s
		}
		body.Errors = append(body.Errors, errorEntry{e.Code, e.Message, e.Detail})
	} else {
		body.Errors = append(body.Errors, errorEntry{Code: "UNKNOWN", Message: err.Error()})
	}
	b, _ := json.Marshal(body)
	if status == http.StatusUnauthorized {
		// containerd answers a Basic challenge with the Pod's imagePullSecret.
		w.Header().Set("WWW-Authenticate", `Basic realm="socialweb registry"`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", fmt.Sprint(len(b)+1))
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
	return status
}
