package provider

import (
	"context"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/scale"
)

// ScaleStatus writes scale decisions into Cluster status; it is the
// scaledriver.StatusRecorder of the management API.
type ScaleStatus struct {
	Client dynamic.Interface
	Clock  func() time.Time
}

// RecordDecision sets status.lastScaleDecision and status.nodes.
func (s ScaleStatus) RecordDecision(ctx context.Context, cluster string, d scale.Decision, nodes int) error {
	now := time.Now
	if s.Clock != nil {
		now = s.Clock
	}
	return s.update(ctx, cluster, func(c *v1.Cluster) {
		c.Status.Nodes = int32(nodes)
		c.Status.LastScaleDecision = &v1.ScaleDecision{
			Action: string(d.Action), Target: int32(d.Target), Reason: d.Reason, Time: metav1.NewTime(now()),
		}
	})
}

// update reads the Cluster, changes its status with f and writes it, retrying on conflicts.
func (s ScaleStatus) update(ctx context.Context, cluster string, f func(*v1.Cluster)) error {
	return s.updateIf(ctx, cluster, func(c *v1.Cluster) bool { f(c); return true })
}

// updateIf is update where f may say there is nothing to write.
func (s ScaleStatus) updateIf(ctx context.Context, cluster string, f func(*v1.Cluster) bool) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		u, err := s.Client.Resource(v1.ClusterResource).Get(ctx, cluster, metav1.GetOptions{})
		if err != nil {
			return err
		}
		c, err := v1.FromUnstructured(u)
		if err != nil {
			return err
		}
		if !f(c) {
			return nil
		}
		out, err := c.ToUnstructured()
		if err != nil {
			return err
		}
		_, err = s.Client.Resource(v1.ClusterResource).UpdateStatus(ctx, out, metav1.UpdateOptions{})
		return err
	})
}

// maxConditionMessage keeps a condition (console lines included) well under the
// apiserver's 32 KiB limit on a condition message.
const maxConditionMessage = 4096

// RecordNodeBoot sets the NodeBoot condition.
func (s ScaleStatus) RecordNodeBoot(ctx context.Context, cluster string, ok bool, reason, message string) error {
	return s.setCondition(ctx, cluster, v1.ConditionNodeBoot, ok, reason, message)
}

// RecordNodeNetwork sets the NodeNetwork condition.
func (s ScaleStatus) RecordNodeNetwork(ctx context.Context, cluster string, ok bool, reason, message string) error {
	return s.setCondition(ctx, cluster, v1.ConditionNodeNetwork, ok, reason, message)
}

// RecordNodeAccelerator sets the NodeAccelerator condition: True, with the accelerator
// (KVM or TCG) as its reason and why as its message.
func (s ScaleStatus) RecordNodeAccelerator(ctx context.Context, cluster, accel, why string) error {
	return s.setCondition(ctx, cluster, v1.ConditionNodeAccelerator, true, strings.ToUpper(accel), why)
}

// RecordWarmStart sets the WarmStart condition.
func (s ScaleStatus) RecordWarmStart(ctx context.Context, cluster string, ok bool, reason, message string) error {
	return s.setCondition(ctx, cluster, v1.ConditionWarmStart, ok, reason, message)
}

// RecordIdleNodes sets status.idleNodes.
func (s ScaleStatus) RecordIdleNodes(ctx context.Context, cluster string, idle v1.IdleNodesStatus) error {
	return s.update(ctx, cluster, func(c *v1.Cluster) { c.Status.IdleNodes = &idle })
}

// RecordIdleSchedule sets the IdleSchedule condition, except that a schedule that parses
// writes nothing on a Cluster without one: every scale driver reports at its start, and
// only a cluster that was told its schedule was bad needs to hear it is good now.
func (s ScaleStatus) RecordIdleSchedule(ctx context.Context, cluster string, ok bool, reason, message string) error {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	return s.updateIf(ctx, cluster, func(c *v1.Cluster) bool {
		if ok && meta.FindStatusCondition(c.Status.Conditions, v1.ConditionIdleSchedule) == nil {
			return false
		}
		return meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{Type: v1.ConditionIdleSchedule, Status: status,
			Reason: reason, Message: truncate(message), ObservedGeneration: c.Generation})
	})
}

// RecordPodStarts sets status.podStarts.
func (s ScaleStatus) RecordPodStarts(ctx context.Context, cluster string, starts []v1.PodStartPercentiles) error {
	return s.update(ctx, cluster, func(c *v1.Cluster) { c.Status.PodStarts = starts })
}

// RecordPodsProvisionable sets the PodsProvisionable condition.
func (s ScaleStatus) RecordPodsProvisionable(ctx context.Context, cluster string, ok bool, reason, message string) error {
	return s.setCondition(ctx, cluster, v1.ConditionPodsProvisionable, ok, reason, message)
}

// truncate keeps a condition message's end (the last console lines) within
// maxConditionMessage.
func truncate(message string) string {
	if len(message) > maxConditionMessage {
		message = "..." + message[len(message)-maxConditionMessage+3:]
	}
	return message
}

func (s ScaleStatus) setCondition(ctx context.Context, cluster, conditionType string, ok bool, reason, message string) error {
	message = truncate(message)
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	return s.update(ctx, cluster, func(c *v1.Cluster) {
		meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{Type: conditionType, Status: status,
			Reason: reason, Message: message, ObservedGeneration: c.Generation})
	})
}
