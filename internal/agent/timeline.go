package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/socialweb-computer/socialweb/internal/boottimeline"
)

// stepTimeline puts the boot timeline on the node's Node object
// (boottimeline.Annotation) once the boot steps are done and the kubelet has its
// credentials, for the host's start breakdown. It does not wait, and a failure is only
// logged: the console has the same lines.
func stepTimeline(ctx context.Context, a *Agent) error {
	name := a.Identity.NodeName
	if name == "" {
		return errors.New("the identity step must run before " + StepTimeline)
	}
	go func() {
		var tl boottimeline.Timeline
		select {
		case tl = <-a.booted:
		case <-a.bg.Done():
			return
		}
		a.waitKubeletCredentials()
		client, err := a.kubeletClient()
		if err == nil {
			err = publishTimeline(a.bg, client, name, tl, time.Second, 2*time.Minute)
		}
		if err != nil {
			a.Log.Warn("publishing the boot timeline on the node", "err", err)
		}
	}()
	return nil
}

// publishTimeline merges tl into the annotations of Node name, trying every retry until
// within: the Node may not be registered yet when the kubelet gets its credentials. A
// node may patch its own Node's annotations (NodeRestriction guards its taints and some
// labels only).
func publishTimeline(ctx context.Context, client kubernetes.Interface, name string, tl boottimeline.Timeline, retry, within time.Duration) error {
	v, err := tl.Encode()
	if err != nil {
		return err
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{boottimeline.Annotation: v}}})
	if err != nil {
		return fmt.Errorf("boot timeline patch: %w", err)
	}
	deadline := time.Now().Add(within)
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = client.CoreV1().Nodes().Patch(cctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
		cancel()
		switch {
		case err == nil:
			return nil
		case apierrors.IsForbidden(err) || apierrors.IsInvalid(err):
			return fmt.Errorf("annotate node %s: %w", name, err)
		case time.Now().Add(retry).After(deadline):
			return fmt.Errorf("annotate node %s: still failing after %s: %w", name, within, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("annotate node %s: %w", name, ctx.Err())
		case <-time.After(retry):
		}
	}
}
