package agent

import (
	"context"
	"errors"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fakeImages records the pulls the sandbox-image step asks for.
type fakeImages struct {
	have               bool
	statusErr, pullErr error
	pulls              []string
}

func (f *fakeImages) ImageStatus(_ context.Context, image *runtimeapi.ImageSpec, _ bool) (*runtimeapi.ImageStatusResponse, error) {
	if f.statusErr != nil {
		return nil, f.statusErr
	}
	if f.have {
		return &runtimeapi.ImageStatusResponse{Image: &runtimeapi.Image{Id: "sha256:1", RepoTags: []string{image.Image}}}, nil
	}
	return &runtimeapi.ImageStatusResponse{}, nil
}

func (f *fakeImages) PullImage(_ context.Context, image *runtimeapi.ImageSpec, _ *runtimeapi.AuthConfig, _ *runtimeapi.PodSandboxConfig) (string, error) {
	f.pulls = append(f.pulls, image.Image)
	return "sha256:1", f.pullErr
}

func TestEnsureImage(t *testing.T) {
	const ref = "registry.k8s.io/pause:3.10"
	for _, tc := range []struct {
		name       string
		images     fakeImages
		wantPulled bool
		wantPulls  int
		wantErr    bool
	}{
		{name: "absent: pulled", wantPulled: true, wantPulls: 1},
		{name: "present: left alone", images: fakeImages{have: true}},
		{name: "status fails: no pull", images: fakeImages{statusErr: errors.New("unavailable")}, wantErr: true},
		{name: "pull fails", images: fakeImages{pullErr: errors.New("connection refused")}, wantPulls: 1, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pulled, err := ensureImage(context.Background(), &tc.images, ref)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if pulled != tc.wantPulled || len(tc.images.pulls) != tc.wantPulls {
				t.Errorf("pulled %v with pulls %q, want pulled %v and %d pulls", pulled, tc.images.pulls, tc.wantPulled, tc.wantPulls)
			}
			for _, p := range tc.images.pulls {
				if p != ref {
					t.Errorf("pulled %q, want %q", p, ref)
				}
			}
		})
	}
}
