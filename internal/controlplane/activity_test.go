package controlplane

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/socialweb-computer/socialweb/internal/pki"
	"k8s.io/apiserver/pkg/endpoints/request"
)

func TestTrackActivity(t *testing.T) {
	tests := []struct {
		name     string
		user     string
		resource bool
		want     bool
	}{
		{"kubectl get pods", "socialweb-admin", true, true},
		{"a runner's service account", "system:serviceaccount:gitlab-runner:gitlab-runner", true, true},
		{"discovery", "socialweb-admin", false, false},
		{"the daemon's informers", DaemonUser, true, false},
		{"controller-manager", "system:kube-controller-manager", true, false},
		{"scheduler", "system:kube-scheduler", true, false},
		{"a kube-system controller", "system:serviceaccount:kube-system:node-controller", true, false},
		{"a kubelet", "system:node:ci-abc", true, false},
		{"loopback", "system:apiserver", true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			h := trackActivity(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), dir)
			r := httptest.NewRequest(http.MethodGet, "/api/v1/pods", nil)
			ctx := request.WithUser(r.Context(), &user.DefaultInfo{Name: tc.user})
			ctx = request.WithRequestInfo(ctx, &request.RequestInfo{IsResourceRequest: tc.resource})
			before := time.Now().Add(-time.Second)
			h.ServeHTTP(httptest.NewRecorder(), r.WithContext(ctx))
			got := LastRequest(dir)
			if tc.want != got.After(before) {
				t.Errorf("LastRequest = %v, want a request seen: %v", got, tc.want)
			}
		})
	}
}

// The daemon's clients authenticate as pki.Daemon; the filter must know that name.
func TestDaemonUserIsTheDaemonIdentity(t *testing.T) {
	if pki.Daemon.CommonName != DaemonUser {
		t.Fatalf("pki.Daemon is %q, the activity filter ignores %q", pki.Daemon.CommonName, DaemonUser)
	}
}
