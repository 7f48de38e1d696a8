package main

import (
	"math"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestAllRunning(t *testing.T) {
	running := corev1.ContainerStatus{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
	waiting := corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}
	two := corev1.PodSpec{Containers: []corev1.Container{{Name: "build"}, {Name: "helper"}}}
	for _, tc := range []struct {
		name     string
		phase    corev1.PodPhase
		statuses []corev1.ContainerStatus
		want     bool
	}{
		{"both running", corev1.PodRunning, []corev1.ContainerStatus{running, running}, true},
		{"one of two running", corev1.PodRunning, []corev1.ContainerStatus{running, waiting}, false},
		{"one status reported", corev1.PodRunning, []corev1.ContainerStatus{running}, false},
		{"pending", corev1.PodPending, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &corev1.Pod{Spec: two, Status: corev1.PodStatus{Phase: tc.phase, ContainerStatuses: tc.statuses}}
			if got := allRunning(p); got != tc.want {
				t.Errorf("allRunning = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPodShapeFill(t *testing.T) {
	var one, ci corev1.PodSpec
	podShape{image: "busybox:stable"}.fill(&one)
	podShape{image: "job", helper: "helper"}.fill(&ci)
	if len(one.InitContainers) != 0 || len(one.Containers) != 1 || one.Containers[0].Image != "busybox:stable" {
		t.Errorf("busybox shape: %+v", one)
	}
	if len(ci.InitContainers) != 1 || ci.InitContainers[0].Image != "helper" || len(ci.Containers) != 2 ||
		ci.Containers[0].Image != "job" || ci.Containers[1].Image != "helper" {
		t.Errorf("CI shape: %+v", ci)
	}
}

func TestPodTimes(t *testing.T) {
	var pt podTimes
	pt.observe(1.5, map[string]bool{"Scheduled": true})
	pt.observe(4.0, map[string]bool{"Scheduled": true, "Pulling": true})
	pt.observe(6.0, map[string]bool{"Scheduled": true, "Pulling": true, "Started": true})
	got := pt.row()
	want := map[int]float64{0: 1.5, 1: 4.0, 4: 6.0}
	for i, v := range got {
		w, ok := want[i]
		switch {
		case ok && v != w:
			t.Errorf("%s = %v, want %v (first seen)", podEventReasons[i], v, w)
		case !ok && !math.IsNaN(v):
			t.Errorf("%s = %v, want NaN (never seen)", podEventReasons[i], v)
		}
	}
}
