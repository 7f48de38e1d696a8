package scale_test

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/socialweb-computer/socialweb/internal/gitlab"
	"github.com/socialweb-computer/socialweb/internal/scale"
)

// The runner template budgets job Pods by gitlab.MemoryReserve; if the scale decision
// thought a node gave Pods less, a job sized to a whole node would never get one.
func TestDefaultReserveMatchesRunnerBudget(t *testing.T) {
	for _, mib := range []int64{512, 1024, 2048, 3072, 6144, 16384} {
		size := scale.NodeSize{CPUs: 2, MemoryMiB: mib, MaxPods: 110}
		cpu, mem, _ := scale.DefaultReserve().Allocatable(size)
		wantCPU, wantMem := gitlab.NodeSize{CPUs: 2, Memory: *resource.NewQuantity(mib<<20, resource.BinarySI), MaxPods: 110}.Schedulable()
		if cpu != wantCPU || mem != wantMem {
			t.Errorf("%d MiB node: scale gives Pods %dm, %d bytes; the runner template budgets %dm, %d bytes", mib, cpu, mem, wantCPU, wantMem)
		}
	}
}
