package controlplane

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"k8s.io/apiserver/pkg/endpoints/request"
)

// activityMark is a file in the control plane's WorkDir whose modification
// time is the last API request from outside socialweb (to within
// activityResolution): the daemon reads it to decide when the cluster is idle
// enough to sleep, without asking the apiserver (which would count).
const activityMark = "last-request"

// activityResolution bounds how often the mark is touched: one stat-sized
// write a second at most, whatever the request rate.
const activityResolution = time.Second

// DaemonUser is the tenant user of the daemon's own clients (informers, the
// scale driver, the CCM): its requests keep no cluster awake.
const DaemonUser = "socialweb-daemon" // pki.Daemon's CommonName

// internalUser reports whether a request comes from the cluster's own
// machinery: the daemon, the control plane's components and its nodes. Their
// requests go on while nobody uses the cluster, so they are not activity.
func internalUser(name string) bool {
	switch name {
	case DaemonUser, "system:apiserver", "system:kube-controller-manager", "system:kube-scheduler":
		return true
	}
	return strings.HasPrefix(name, "system:serviceaccount:kube-system:") ||
		strings.HasPrefix(name, "system:node:") || strings.HasPrefix(name, "system:bootstrap:")
}

// External reports whether a request counts as use of the cluster: a resource
// request (not a health check or discovery) by a user other than internal ones.
func external(info *request.RequestInfo, user string) bool {
	return info != nil && info.IsResourceRequest && !internalUser(user)
}

// trackActivity wraps the apiserver's API handler (inside authentication, so
// the user is known) and touches the activity mark on external requests.
func trackActivity(next http.Handler, dir string) http.Handler {
	path := filepath.Join(dir, activityMark)
	var last atomic.Int64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, _ := request.RequestInfoFrom(r.Context())
		name := ""
		if u, ok := request.UserFrom(r.Context()); ok {
			name = u.GetName()
		}
		if external(info, name) {
			now := time.Now()
			if prev := last.Load(); now.UnixNano()-prev >= int64(activityResolution) && last.CompareAndSwap(prev, now.UnixNano()) {
				touch(path, now)
			}
		}
		next.ServeHTTP(w, r)
	})
}

// touch sets path's modification time, creating it if needed. A failure only
// makes the cluster look idle sooner; the next request tries again.
func touch(path string, t time.Time) {
	if err := os.Chtimes(path, t, t); err != nil {
		_ = os.WriteFile(path, nil, 0o600)
	}
}

// LastRequest is when the control plane whose WorkDir is dir last served a
// request from outside socialweb; zero if none since the mark was made. Lstat:
// the tenant may have put a symlink or a FIFO there (it then only misstates its
// own idleness).
func LastRequest(dir string) time.Time {
	fi, err := os.Lstat(filepath.Join(dir, activityMark))
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}
