package nodeservice

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// bootRecorder records NodeBoot reports; fail makes the next one fail.
type bootRecorder struct {
	reports []string
	fail    bool
}

func (r *bootRecorder) RecordNodeBoot(_ context.Context, cluster string, ok bool, reason, message string) error {
	if r.fail {
		r.fail = false
		return errors.New("apiserver away")
	}
	if ok || reason != "NoNodeImage" || !strings.Contains(message, "socialweb image build") {
		return errors.New("unexpected report")
	}
	r.reports = append(r.reports, cluster)
	return nil
}

func TestNoNodeImageTellsEachClusterOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(n *noNodeImage, r *bootRecorder) error
		want []string
	}{
		{"once per cluster", func(n *noNodeImage, _ *bootRecorder) error {
			return errors.Join(n.Start(context.Background(), Cluster{Name: "a"}), n.Start(context.Background(), Cluster{Name: "a"}),
				n.Start(context.Background(), Cluster{Name: "b"}))
		}, []string{"a", "b"}},
		{"again after Stop", func(n *noNodeImage, _ *bootRecorder) error {
			err := n.Start(context.Background(), Cluster{Name: "a"})
			n.Stop("a")
			return errors.Join(err, n.Start(context.Background(), Cluster{Name: "a"}))
		}, []string{"a", "a"}},
		{"retried after a failed report", func(n *noNodeImage, r *bootRecorder) error {
			r.fail = true
			if err := n.Start(context.Background(), Cluster{Name: "a"}); err == nil || !strings.Contains(err.Error(), "cluster a gets no nodes") {
				return errors.New("a failed report is not an error that names the cluster")
			}
			return n.Start(context.Background(), Cluster{Name: "a"})
		}, []string{"a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &bootRecorder{}
			n := newNoNodeImage(r)
			if err := tc.run(n, r); err != nil {
				t.Fatal(err)
			}
			if strings.Join(r.reports, ",") != strings.Join(tc.want, ",") {
				t.Errorf("reported %v, want %v", r.reports, tc.want)
			}
			if err := n.DeleteAll(context.Background(), "a"); err != nil {
				t.Errorf("DeleteAll: %v", err)
			}
		})
	}
}
