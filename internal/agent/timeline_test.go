package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8sfake "k8s.io/client-go/kubernetes/fake"

	"github.com/socialweb-computer/socialweb/internal/boottimeline"
)

func TestPublishTimeline(t *testing.T) {
	tl := boottimeline.Timeline{boottimeline.StepStart: 1.5, boottimeline.StepUp: 4}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{"kept": "yes"}}}
	tests := []struct {
		name    string
		objs    []runtime.Object
		late    bool // the Node registers while publishing retries
		wantErr string
	}{
		{name: "registered", objs: []runtime.Object{node}},
		{name: "registers later", late: true},
		{name: "never registers", wantErr: "still failing after"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := k8sfake.NewClientset(tt.objs...)
			if tt.late {
				go func() {
					time.Sleep(30 * time.Millisecond)
					_, _ = client.CoreV1().Nodes().Create(context.Background(), node.DeepCopy(), metav1.CreateOptions{})
				}()
			}
			err := publishTimeline(context.Background(), client, "n1", tl, 10*time.Millisecond, 500*time.Millisecond)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("publishTimeline = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			n, err := client.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := n.Annotations[boottimeline.Annotation]; got != `{"start":1.5,"up":4}` || n.Annotations["kept"] != "yes" {
				t.Errorf("annotations %v", n.Annotations)
			}
		})
	}
}
