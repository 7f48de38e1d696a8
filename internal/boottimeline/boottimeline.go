// Package boottimeline is a node's boot timeline as its agent publishes it on its own
// Node object: the guest's uptime (seconds since its kernel started) when each boot step
// was done. The scale driver reads it for the kernel and agent phases of a node's start
// breakdown, and bench/nodeboot shows it.
//
// Uptimes, not wall-clock times: the guest's wall clock comes from an RTC with whole
// seconds, while its uptime is as fine as the console's timeline lines.
package boottimeline

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"
)

// Annotation is the Node annotation that holds the timeline, as compact JSON: step name
// to uptime in seconds, e.g. {"start":1.52,"mounts":1.6,...,"up":4.31}.
const Annotation = "socialweb.computer/boot-timeline"

// Steps every timeline of a booted node has: the agent (PID 1) started, and its boot
// steps all done.
const (
	StepStart = "start"
	StepUp    = "up"
)

// Steps of a warm-pool VM's timeline, booted before any cluster needed it: its agent
// started waiting at the identity step (StepIdentityWait) until the host claimed it, and
// the identity step was done once it read the claim (StepIdentity).
const (
	StepIdentity     = "identity"
	StepIdentityWait = "identity-wait"
)

// StepSandboxImage is when the agent had imported the sandbox image its node image
// carries (before its claim, on a warm-pool VM). Absent, the first sandbox pulls it.
const StepSandboxImage = "sandbox-image"

// maxLen bounds what Parse accepts: a timeline is a few hundred bytes, and the
// annotation is the tenant's to write.
const maxLen = 4 << 10

// Timeline maps a boot step to the guest's uptime, in seconds, when it was done.
type Timeline map[string]float64

// Set records that step was done at uptime (to the millisecond).
func (t Timeline) Set(step string, uptime time.Duration) {
	t[step] = math.Round(uptime.Seconds()*1000) / 1000
}

// Encode is the annotation's value.
func (t Timeline) Encode() (string, error) {
	b, err := json.Marshal(map[string]float64(t))
	if err != nil {
		return "", fmt.Errorf("boot timeline: %w", err)
	}
	return string(b), nil
}

// Parse reads an annotation's value. Every uptime must be a number of seconds, not
// negative.
func Parse(s string) (Timeline, error) {
	if len(s) > maxLen {
		return nil, fmt.Errorf("boot timeline: %d bytes, more than %d", len(s), maxLen)
	}
	var t Timeline
	if err := json.Unmarshal([]byte(s), &t); err != nil {
		return nil, fmt.Errorf("boot timeline: %w", err)
	}
	for step, v := range t {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("boot timeline: step %q at %v s", step, v)
		}
	}
	return t, nil
}

// Warm reports whether the timeline is a warm-pool VM's.
func (t Timeline) Warm() bool {
	_, ok := t[StepIdentityWait]
	return ok
}

// ErrIncomplete: the timeline lacks the start or up step, or up comes before start.
var ErrIncomplete = errors.New("boot timeline: no start and up steps in order")

// Phases are the kernel's time (its start to the agent's, PID 1) and the agent's (its
// start to its boot steps done).
func (t Timeline) Phases() (kernel, agent time.Duration, err error) {
	start, ok1 := t[StepStart]
	up, ok2 := t[StepUp]
	if !ok1 || !ok2 || up < start {
		return 0, 0, ErrIncomplete
	}
	return sec(start), sec(up) - sec(start), nil
}

// WarmAgent is a warm-pool VM's agent phase after its claim: the identity step done
// (the claim read) to its boot steps done. Its kernel and the steps before the claim ran
// ahead of time.
func (t Timeline) WarmAgent() (time.Duration, error) {
	claimed, ok1 := t[StepIdentity]
	up, ok2 := t[StepUp]
	if !t.Warm() || !ok1 || !ok2 || up < claimed {
		return 0, ErrIncompleteWarm
	}
	return sec(up) - sec(claimed), nil
}

// ErrIncompleteWarm: the timeline lacks the identity-wait, identity or up step, or up
// comes before identity.
var ErrIncompleteWarm = errors.New("boot timeline: no identity-wait, identity and up steps in order")

func sec(v float64) time.Duration { return time.Duration(math.Round(v * float64(time.Second))) }
