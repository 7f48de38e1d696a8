package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
)

// ---- 4. Where a sleeping tenant wakes

// wakeRound is one cycle: the tenant asleep on h1 (which runs another tenant) wakes
// on h2 (away); asleep on h2 it wakes there (home); asleep again, h2 is drained and
// it moves asleep to h1.
type wakeRound struct {
	away, home, drain time.Duration
	awayOn, homeOn    string
}

// wakeRounds runs -wake-rounds cycles on a new service of two hosts with front doors
// (h1's is the service address, so every request enters through h1's door) and no
// tenant cap. hb-w sleeps after 30 s; hb-x and hb-y stay awake on h1, so h1 has two
// tenants more than h2: 768 MiB of reserve against a margin of 192, where the two
// hosts' reports of the one machine's free memory differ by what changed between them.
func (b *bench) wakeRounds() []wakeRound {
	b.stopService()
	b.dropDatabases()
	b.doors = true
	defer func() { b.doors = false }()
	b.startService(b.o.lease, 1)
	w, x, y := prefix+"w", prefix+"x", prefix+"y"
	if out, err := b.cli(b.hosts[0], "cluster", "create", w, "--sleep-after", "30s", "--wait", "--timeout", "5m"); err != nil {
		fail("cluster create %s: %v\n%s", w, err, out)
	}
	for _, n := range []string{x, y} {
		if on := b.create(n); on != "h1" {
			fail("%s, created with h1 alone, is on %q", n, on)
		}
	}
	b.startHost(1, b.o.lease)
	b.waitLive(b.hosts[0], "h1", "h2")
	var rounds []wakeRound
	for i := range b.o.wakeRounds {
		var r wakeRound
		b.asleepOn(w, "h1")
		r.away, r.awayOn = b.wakeThroughDoor(w), b.placedOn(w)
		b.asleepOn(w, "h2")
		r.home, r.homeOn = b.wakeThroughDoor(w), b.placedOn(w)
		log.Printf("wake round %d: away %s (on %s), home %s (on %s)", i+1, secs(r.away), r.awayOn, secs(r.home), r.homeOn)
		if r.awayOn != "h2" || r.homeOn != "h2" {
			fail("round %d: %s woke on %s, then on %s; want h2 both times (h1 runs %s and %s too)", i+1, w, r.awayOn, r.homeOn, x, y)
		}
		b.asleepOn(w, "h2")
		t0 := time.Now()
		if out, err := b.cli(b.hosts[0], "host", "drain", "h2", "--timeout", "2m"); err != nil {
			fail("host drain h2: %v\n%s", err, out)
		}
		r.drain = b.asleepOn(w, "h1").Sub(t0)
		if out, err := b.cli(b.hosts[0], "host", "resume", "h2"); err != nil {
			fail("host resume h2: %v\n%s", err, out)
		}
		rounds = append(rounds, r)
	}
	return rounds
}

// asleepOn waits until the Cluster is Asleep on host, not moving, and returns
// when it saw that (before it lets both hosts report their free memory again).
func (b *bench) asleepOn(name, host string) time.Time {
	_, dyn := b.clients(b.hosts[0])
	var last string
	for end := time.Now().Add(3 * time.Minute); time.Now().Before(end); b.sleep(500 * time.Millisecond) {
		u, err := dyn.Resource(v1.ClusterResource).Get(b.ctx, name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			continue
		}
		phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
		on, _, _ := unstructured.NestedString(u.Object, "status", "host")
		moving, _, _ := unstructured.NestedString(u.Object, "status", "movingTo")
		if phase == string(v1.PhaseAsleep) && on == host && moving == "" {
			seen := time.Now()
			b.sleep(b.lease*2/3 + time.Second) // both hosts report free memory again: its sleep freed some
			return seen
		}
		last = fmt.Sprintf("phase %s on %q, movingTo %q", phase, on, moving)
	}
	fail("%s not asleep on %s within 3m: %s", name, host, last)
	return time.Time{}
}

// wakeThroughDoor asks the sleeping tenant for namespace default with its
// kubeconfig (h1's door), once, and returns how long the answer took.
func (b *bench) wakeThroughDoor(name string) time.Duration {
	cfg := b.tenantConfig(name)
	cfg.Timeout = 90 * time.Second
	// From an address no host has: every host's address is 127.0.0.1, and a door
	// takes a connection from a host's address for a peer's, which it neither
	// places nor passes on.
	cfg.Dial = (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 9)}}).DialContext
	k, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fail("a client of %s: %v", name, err)
	}
	ctx, cancel := context.WithTimeout(b.ctx, 90*time.Second)
	defer cancel()
	t0 := time.Now()
	if _, err := k.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
		fail("the request that woke %s: %v", name, err)
	}
	return time.Since(t0)
}

func printWake(rs []wakeRound) {
	fmt.Println("| round | away: asleep on h1 (3 tenants) -> answered from h2 | home: asleep on h2 -> answered from h2 | away/home | drain of h2 -> asleep on h1 |")
	fmt.Println("|---|---|---|---|---|")
	var away, home, drain []float64
	for i, r := range rs {
		fmt.Printf("| %d | %s | %s | %.1fx | %s |\n", i+1, secs(r.away), secs(r.home), r.away.Seconds()/r.home.Seconds(), secs(r.drain))
		away, home, drain = append(away, r.away.Seconds()), append(home, r.home.Seconds()), append(drain, r.drain.Seconds())
	}
	fmt.Printf("| median | %s | %s | %.1fx | %s |\n", medianCell(away), medianCell(home), median(away)/median(home), medianCell(drain))
	fmt.Println(strings.TrimSpace(`
away: the door asks placement (placement.Rewake), writes status.movingTo and holds the
connection; h1 hands the tenant over asleep; h2 gates its port and says it arrived; the
door passes the connection on to h2's door, whose gate wakes it. home: the gate of its
own host wakes it.`))
}
