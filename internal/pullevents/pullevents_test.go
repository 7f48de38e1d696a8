package pullevents

import (
	"context"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/socialweb-computer/socialweb/internal/registry"
)

func pod(name, image, waiting string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ci", UID: types.UID("uid-" + name)},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "build", Image: image}}},
	}
	if waiting != "" {
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "build", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: waiting}}}}
	}
	return p
}

func TestCheck(t *testing.T) {
	refused := map[string]registry.PullFailure{
		"ghcr.io/a/private:1": {Reason: "ImageNotAllowed", Message: "upstream ghcr.io wants credentials"},
		"golang:1.23":         {Reason: "UpstreamUnreachable", Message: "upstream docker.io could not be reached"},
	}
	for _, tc := range []struct {
		name   string
		pods   []*corev1.Pod
		events []string // reasons, in order
	}{
		{"pull refused", []*corev1.Pod{pod("p", "ghcr.io/a/private:1", "ErrImagePull")}, []string{"ImageNotAllowed"}},
		{"in back-off", []*corev1.Pod{pod("p", "golang:1.23", "ImagePullBackOff")}, []string{"UpstreamUnreachable"}},
		{"reported once per reason", []*corev1.Pod{pod("p", "golang:1.23", "ErrImagePull"), pod("p", "golang:1.23", "ImagePullBackOff")}, []string{"UpstreamUnreachable"}},
		{"the registry knows nothing", []*corev1.Pod{pod("p", "busybox", "ErrImagePull")}, nil},
		{"not a pull", []*corev1.Pod{pod("p", "golang:1.23", "ContainerCreating")}, nil},
		{"running", []*corev1.Pod{pod("p", "golang:1.23", "")}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			r := &reporter{client: client, log: slog.New(slog.DiscardHandler), sent: map[string]string{},
				lookup: func(image string) (registry.PullFailure, bool) { f, ok := refused[image]; return f, ok }}
			for _, p := range tc.pods {
				r.check(context.Background(), p)
			}
			evs, err := client.CoreV1().Events("ci").List(context.Background(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(evs.Items) != len(tc.events) {
				t.Fatalf("%d events %+v, want reasons %v", len(evs.Items), evs.Items, tc.events)
			}
			for i, ev := range evs.Items {
				if ev.Reason != tc.events[i] || ev.Type != corev1.EventTypeWarning || ev.InvolvedObject.Name != "p" || ev.InvolvedObject.FieldPath != "spec.containers{build}" || ev.Source.Component != Component {
					t.Errorf("event %+v, want a Warning %s on pod p's container build", ev, tc.events[i])
				}
			}
		})
	}
}

// Run reports a Pod's failed pull within seconds of its status saying so.
func TestRunReportsWithinSeconds(t *testing.T) {
	client := fake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go Run(ctx, client, func(image string) (registry.PullFailure, bool) {
		return registry.PullFailure{Reason: "RegistryNotAllowed", Message: "registry quay.io is denied"}, image == "quay.io/x/y:1"
	}, slog.New(slog.DiscardHandler))
	p := pod("job", "quay.io/x/y:1", "")
	if _, err := client.CoreV1().Pods("ci").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "build", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull"}}}}
	if _, err := client.CoreV1().Pods("ci").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		evs, _ := client.CoreV1().Events("ci").List(ctx, metav1.ListOptions{})
		if len(evs.Items) == 1 && evs.Items[0].Reason == "RegistryNotAllowed" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no RegistryNotAllowed event 10s after the pod's pull failed: %+v", evs.Items)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
