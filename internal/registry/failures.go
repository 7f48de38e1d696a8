package registry

import (
	"strings"
	"sync"
	"time"
)

// PullFailure is why the registry last refused a cluster's node an image: what a Pod
// stuck in ErrImagePull is told in an Event (internal/pullevents).
type PullFailure struct {
	Reason  string // ImageNotAllowed, RegistryNotAllowed, ImageNotFound, UpstreamUnreachable, ...
	Message string
	At      time.Time
}

// failureTTL is how long a refusal explains a Pod's failed pull.
const failureTTL = 10 * time.Minute

type failures struct {
	mu   sync.Mutex
	last map[string]PullFailure // tenant + "\x00" + canonical name
}

// reasons maps the OCI code a node was refused with to an Event reason.
var reasons = map[string]string{
	errUnauthorized:        "ImageNotAllowed",
	errDenied:              "RegistryNotAllowed",
	errManifestUnknown:     "ImageNotFound",
	errBlobUnknown:         "ImageNotFound",
	errNameUnknown:         "ImageNotFound",
	errUnavailable:         "UpstreamUnreachable",
	errTooManyRequests:     "UpstreamRateLimited",
	errSizeInvalid:         "ImageTooLarge",
	errDigestInvalid:       "UpstreamSentBadContent",
	errManifestInvalid:     "ImageNotUsable",
	errManifestBlobUnknown: "ImageNotUsable",
	errOverQuota:           "OverQuota",
}

func (f *failures) note(tenant, name, code, msg string) {
	reason, ok := reasons[code]
	if !ok {
		reason = "ImagePullRefused"
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.last == nil {
		f.last = map[string]PullFailure{}
	}
	now := time.Now()
	for k, v := range f.last {
		if now.Sub(v.At) > failureTTL {
			delete(f.last, k)
		}
	}
	f.last[tenant+"\x00"+name] = PullFailure{Reason: reason, Message: msg, At: now}
}

func (f *failures) forget(tenant, name string) {
	f.mu.Lock()
	delete(f.last, tenant+"\x00"+name)
	f.mu.Unlock()
}

// LastFailure says why cluster's nodes were last refused image (a reference as a Pod
// names it: busybox, ghcr.io/org/app:1, ...), if that was within the last minutes and
// nothing of it was served since.
func (s *Server) LastFailure(cluster, image string) (PullFailure, bool) {
	if s.init() != nil {
		return PullFailure{}, false
	}
	ref, err := s.names.parseRef(image)
	if err != nil {
		return PullFailure{}, false
	}
	s.failures.mu.Lock()
	defer s.failures.mu.Unlock()
	f, ok := s.failures.last[cluster+"\x00"+ref.Name]
	if !ok || time.Since(f.At) > failureTTL {
		return PullFailure{}, false
	}
	return f, true
}

// codeOf splits "CODE: message" as fail records it.
func codeOf(errMsg string) (string, string) {
	code, msg, ok := strings.Cut(errMsg, ": ")
	if !ok || code != strings.ToUpper(code) || strings.ContainsAny(code, " ") {
		return "", errMsg
	}
	return code, msg
}
