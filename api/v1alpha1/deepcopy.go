package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// DeepCopy returns a copy sharing no memory with c.
func (c *Cluster) DeepCopy() *Cluster {
	if c == nil {
		return nil
	}
	out := &Cluster{TypeMeta: c.TypeMeta, Spec: c.Spec, Status: c.Status}
	c.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Spec.NodeMemory = c.Spec.NodeMemory.DeepCopy()
	out.Spec.MaxNodeMemory = c.Spec.MaxNodeMemory.DeepCopy()
	out.Spec.NodeDisk = c.Spec.NodeDisk.DeepCopy()
	out.Spec.MaxNodeDisk = c.Spec.MaxNodeDisk.DeepCopy()
	out.Spec.ControlPlaneMemory = c.Spec.ControlPlaneMemory.DeepCopy()
	if c.Spec.EgressDeny != nil {
		out.Spec.EgressDeny = append([]string(nil), c.Spec.EgressDeny...)
	}
	if c.Spec.SleepAfter != nil {
		d := *c.Spec.SleepAfter
		out.Spec.SleepAfter = &d
	}
	if c.Status.AsleepSince != nil {
		t := c.Status.AsleepSince.DeepCopy()
		out.Status.AsleepSince = t
	}
	if c.Status.NextWake != nil {
		out.Status.NextWake = c.Status.NextWake.DeepCopy()
	}
	if c.Status.LastScaleDecision != nil {
		d := *c.Status.LastScaleDecision
		out.Status.LastScaleDecision = &d
	}
	if c.Status.IdleNodes != nil {
		in := *c.Status.IdleNodes
		out.Status.IdleNodes = &in
	}
	if c.Status.PodStarts != nil {
		out.Status.PodStarts = append([]PodStartPercentiles(nil), c.Status.PodStarts...)
	}
	if c.Status.Conditions != nil {
		out.Status.Conditions = make([]metav1.Condition, len(c.Status.Conditions))
		for i := range c.Status.Conditions {
			c.Status.Conditions[i].DeepCopyInto(&out.Status.Conditions[i])
		}
	}
	return out
}
