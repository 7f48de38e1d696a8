package boottimeline

import (
	"errors"
	"testing"
	"time"
)

func TestRoundTripAndPhases(t *testing.T) {
	tl := Timeline{}
	tl.Set(StepStart, 1520*time.Millisecond)
	tl.Set("kubelet", 3900400*time.Microsecond)
	tl.Set(StepUp, 4310*time.Millisecond)
	s, err := tl.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"kubelet":3.9,"start":1.52,"up":4.31}`; s != want {
		t.Errorf("Encode = %s, want %s", s, want)
	}
	got, err := Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	kernel, agent, err := got.Phases()
	if err != nil || kernel != 1520*time.Millisecond || agent != 2790*time.Millisecond {
		t.Errorf("Phases = %s, %s, %v; want 1.52s, 2.79s", kernel, agent, err)
	}
}

func TestParseAndPhasesRefuse(t *testing.T) {
	tests := []struct {
		name, in   string
		parseErr   bool
		incomplete bool
	}{
		{name: "not JSON", in: "start=1", parseErr: true},
		{name: "not numbers", in: `{"start":"1s"}`, parseErr: true},
		{name: "negative", in: `{"start":-1,"up":2}`, parseErr: true},
		{name: "too long", in: `{"x":1` + string(make([]byte, maxLen)) + `}`, parseErr: true},
		{name: "no up", in: `{"start":1}`, incomplete: true},
		{name: "up before start", in: `{"start":3,"up":2}`, incomplete: true},
		{name: "complete", in: `{"start":1,"up":2}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tl, err := Parse(tt.in)
			if (err != nil) != tt.parseErr {
				t.Fatalf("Parse = %v, want error %t", err, tt.parseErr)
			}
			if err != nil {
				return
			}
			_, _, err = tl.Phases()
			if errors.Is(err, ErrIncomplete) != tt.incomplete {
				t.Errorf("Phases = %v, want incomplete %t", err, tt.incomplete)
			}
		})
	}
}

func TestWarmAgent(t *testing.T) {
	tests := []struct {
		name    string
		tl      Timeline
		warm    bool
		want    time.Duration
		wantErr bool
	}{
		{name: "cold", tl: Timeline{StepStart: 1, StepIdentity: 2, StepUp: 4}, wantErr: true},
		{name: "warm", tl: Timeline{StepStart: 1, StepIdentityWait: 1.8, StepIdentity: 60.25, StepUp: 61.5}, warm: true, want: 1250 * time.Millisecond},
		{name: "warm, not up", tl: Timeline{StepStart: 1, StepIdentityWait: 1.8, StepIdentity: 60}, warm: true, wantErr: true},
		{name: "warm, up before identity", tl: Timeline{StepIdentityWait: 1.8, StepIdentity: 60, StepUp: 59}, warm: true, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.tl.Warm() != tt.warm {
				t.Errorf("Warm = %t, want %t", !tt.warm, tt.warm)
			}
			got, err := tt.tl.WarmAgent()
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("WarmAgent = %s, %v; want %s (error %t)", got, err, tt.want, tt.wantErr)
			}
		})
	}
}
