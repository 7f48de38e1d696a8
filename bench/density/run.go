package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"sort"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// report is one mode's figures; MiB for memory.
type report struct {
	mode        string
	held        int    // tenants registered when memory was read
	stopReason  string // why creating stopped before -tenants, if it did
	awake       int    // of held, not Asleep when memory was read
	asleep      int
	baseline    float64 // daemon and descendants before any tenant
	total       float64 // daemon and descendants with held tenants
	alone, with parts   // the baseline and the total by part
	awakeEach   float64 // mean PSS of one kept-awake tenant's processes (sleep mode)
	awakeSum    float64 // PSS of the processes of every tenant not Asleep (sleep mode)
	asleepProcs int     // processes of Asleep tenants: none, if sleep stops them all
	asleepPss   float64 // their PSS
	perSleeping float64 // (total - baseline - awakeSum) / asleep
	perTenant   float64 // (total - baseline) / held
	latencies   []time.Duration
	latencyErrs int
	creates     []time.Duration // create -> Ready while filling
	next        time.Duration   // create -> Ready of the tenant after the fill (sleep mode)
	nextName    string
}

func tenantName(i int) string { return fmt.Sprintf("t%04d", i) }

// run measures one mode on its own daemon.
func run(ctx context.Context, o options, mode string, log *slog.Logger) (report, error) {
	sleep := mode == "sleep"
	r := report{mode: mode}
	d, err := startDaemon(ctx, o, sleep, log)
	if err != nil {
		return r, err
	}
	defer d.close(o.keepLogs)
	// The daemon alone: its management control plane and nothing else, after
	// the same settle as the measurement (a management API just started still
	// holds tens of MiB of start-up garbage, which made the figure below
	// negative when read 10 s after serving).
	time.Sleep(o.settle)
	if r.alone, err = d.parts(); err != nil {
		return r, fmt.Errorf("baseline PSS: %w", err)
	}
	r.baseline = r.alone.total()
	log.Info("daemon alone", "pssMiB", fmt.Sprintf("%.0f", r.baseline), "daemonMiB", fmt.Sprintf("%.0f", r.alone.daemon), "managementMiB", fmt.Sprintf("%.0f", r.alone.mgmt))

	touchCtx, stopTouching := context.WithCancel(ctx)
	var touchers sync.WaitGroup
	// Stop the touchers before the daemon (deferred earlier, so it runs later).
	defer func() { stopTouching(); touchers.Wait() }()
	keepAwake := func(name string) {
		cfg, err := d.restConfig(ctx, name)
		if err != nil {
			log.Warn("cannot keep awake", "cluster", name, "err", err)
			return
		}
		touchers.Add(1)
		go func() {
			defer touchers.Done()
			touch(touchCtx, cfg, name, log)
		}()
	}
	if !sleep {
		keepAwake = nil
	}
	names, stop, creates, err := fill(ctx, o, d, keepAwake, sleep, log)
	if err != nil {
		return r, err
	}
	held := len(names)
	r.held, r.stopReason, r.creates = held, stop, creates
	if held == 0 {
		return r, fmt.Errorf("no tenant was created: %s", stop)
	}
	var samples []string
	if sleep {
		kept := min(o.awake, held)
		if err := waitAsleep(ctx, d, held-kept, o.sleepTimeout, log); err != nil {
			log.Warn("not all tenants sleep; measuring as they are", "err", err)
		}
		time.Sleep(o.settle)
		ph, err := d.phases(ctx)
		if err != nil {
			return r, err
		}
		for _, n := range names {
			if ph[n] == "Asleep" {
				r.asleep++
			}
		}
		r.awake = held - r.asleep
		if r.with, err = d.parts(); err != nil {
			return r, fmt.Errorf("PSS: %w", err)
		}
		r.total = r.with.total()
		// Awake tenants are subtracted as measured, each its own processes;
		// what is left over the baseline is what the sleeping ones cost.
		var m int
		for _, n := range names {
			if ph[n] == "Asleep" {
				r.asleepProcs += r.with.procs[n]
				r.asleepPss += r.with.tenants[n]
				continue
			}
			r.awakeSum += r.with.tenants[n]
		}
		for _, n := range names[:kept] { // fill keeps the first K awake, in name order
			if ph[n] != "Asleep" && r.with.procs[n] > 0 {
				r.awakeEach += r.with.tenants[n]
				m++
			}
		}
		if m > 0 {
			r.awakeEach /= float64(m)
		}
		if r.asleep > 0 {
			r.perSleeping = (r.total - r.baseline - r.awakeSum) / float64(r.asleep)
		}
		for _, n := range names[kept:] {
			if ph[n] == "Asleep" && len(samples) < o.wakeSamples {
				samples = append(samples, n)
			}
		}
	} else {
		time.Sleep(o.settle)
		if r.with, err = d.parts(); err != nil {
			return r, fmt.Errorf("PSS: %w", err)
		}
		r.total = r.with.total()
		r.awake = held
		samples = names[:min(held, o.wakeSamples)]
	}
	r.perTenant = (r.total - r.baseline) / float64(held)
	log.Info("memory", "tenants", held, "awake", r.awake, "asleep", r.asleep, "pssMiB", fmt.Sprintf("%.0f", r.total),
		"daemonMiB", fmt.Sprintf("%.0f", r.with.daemon), "managementMiB", fmt.Sprintf("%.0f", r.with.mgmt),
		"awakeTenantsMiB", fmt.Sprintf("%.0f", r.awakeSum), "asleepProcesses", r.asleepProcs, "perSleepingMiB", fmt.Sprintf("%.2f", r.perSleeping))

	// One request at a time, each on a new connection, so each wake is timed alone.
	for _, n := range samples {
		cfg, err := d.restConfig(ctx, n)
		if err != nil {
			return r, err
		}
		lat, err := firstByte(ctx, cfg)
		if err != nil {
			log.Warn("first request failed", "cluster", n, "err", err)
			r.latencyErrs++
			continue
		}
		r.latencies = append(r.latencies, lat)
		log.Info("first request", "cluster", n, "latency", lat.Round(time.Millisecond))
	}

	if sleep && r.stopReason == "" {
		// Tenant N+1 on a host holding N.
		r.nextName = tenantName(o.tenants)
		start := time.Now()
		if _, err := d.cli(ctx, "cluster", "create", r.nextName, "--wait"); err != nil {
			return r, fmt.Errorf("creating tenant %d: %w", held+1, err)
		}
		r.next = time.Since(start)
		log.Info("tenant N+1 ready", "cluster", r.nextName, "took", r.next.Round(time.Millisecond))
	} else if len(creates) > 0 {
		// Awake mode cannot safely add one past the host's limit: the last one it held.
		r.next = creates[len(creates)-1]
		r.nextName = names[held-1]
	}
	return r, nil
}

// fill creates tenants t0000.. with limited concurrency until o.tenants exist,
// a create fails, or MemAvailable falls below the reserve, and returns the
// created names in order. keepAwake, if set, is called for each of the first
// o.awake tenants once it is Ready. With sleep, MemAvailable under the
// reserve pauses the creates instead, for as long as tenants take to fall
// asleep (each create starts its tenant awake); only if it stays under does
// creating stop.
func fill(ctx context.Context, o options, d *daemon, keepAwake func(string), sleep bool, log *slog.Logger) (names []string, stopReason string, creates []time.Duration, err error) {
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		ok      = make([]bool, o.tenants)
		done    int
		stopped string
	)
	start := time.Now()
	sem := make(chan struct{}, o.concurrency)
	for i := 0; i < o.tenants; i++ {
		mu.Lock()
		s := stopped
		mu.Unlock()
		if s != "" || ctx.Err() != nil {
			break
		}
		avail, err := memAvailableMiB()
		if err != nil {
			return nil, "", nil, err
		}
		if sleep && avail < o.reserveMiB {
			avail, err = waitForMemory(ctx, o.reserveMiB, 2*o.sleepAfter+time.Minute, log)
			if err != nil {
				return nil, "", nil, err
			}
		}
		if avail < o.reserveMiB {
			mu.Lock()
			stopped = fmt.Sprintf("MemAvailable %.0f MiB < reserve %.0f MiB", avail, o.reserveMiB)
			mu.Unlock()
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			name := tenantName(i)
			t0 := time.Now()
			_, err := d.cli(ctx, "cluster", "create", name, "--wait")
			took := time.Since(t0)
			if err == nil && keepAwake != nil && i < o.awake {
				keepAwake(name) // before wg.Done, so its toucher is counted before anyone waits
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if stopped == "" {
					stopped = fmt.Sprintf("create %s failed: %v", name, err)
				}
				log.Warn("create failed; stopping", "cluster", name, "err", err)
				return
			}
			ok[i] = true
			creates = append(creates, took)
			done++
			if done%25 == 0 || done == o.tenants {
				pss, perr := d.pssMiB()
				avail, _ := memAvailableMiB()
				log.Info("progress", "created", done, "elapsed", time.Since(start).Round(time.Second),
					"pssMiB", fmt.Sprintf("%.0f", pss), "pssErr", perr, "memAvailableMiB", fmt.Sprintf("%.0f", avail))
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, "", nil, err
	}
	// A failed create may leave a gap; the tenants after it still count.
	for i, created := range ok {
		if created {
			names = append(names, tenantName(i))
		}
	}
	return names, stopped, creates, nil
}

// waitForMemory waits up to timeout for MemAvailable to rise over reserve
// and returns the last reading.
func waitForMemory(ctx context.Context, reserve float64, timeout time.Duration, log *slog.Logger) (float64, error) {
	log.Info("MemAvailable under the reserve: waiting for tenants to fall asleep", "reserveMiB", reserve, "upTo", timeout)
	deadline := time.Now().Add(timeout)
	for {
		avail, err := memAvailableMiB()
		if err != nil || avail >= reserve || time.Now().After(deadline) {
			return avail, err
		}
		select {
		case <-ctx.Done():
			return avail, ctx.Err()
		case <-time.After(5 * time.Second):
		}
	}
}

// touch lists namespaces every 10 s with the tenant's own credentials: a
// request from outside socialweb, which keeps the tenant awake.
func touch(ctx context.Context, cfg *rest.Config, name string, log *slog.Logger) {
	c := rest.CopyConfig(cfg)
	c.Timeout = 2 * time.Minute // a touch of a tenant that fell asleep waits for its wake
	k, err := kubernetes.NewForConfig(c)
	if err != nil {
		log.Warn("cannot keep awake", "cluster", name, "err", err)
		return
	}
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		if _, err := k.CoreV1().Namespaces().List(ctx, metav1.ListOptions{Limit: 1}); err != nil && ctx.Err() == nil {
			log.Warn("keep-awake request failed", "cluster", name, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// waitAsleep polls `cluster list` until at least want clusters are Asleep.
func waitAsleep(ctx context.Context, d *daemon, want int, timeout time.Duration, log *slog.Logger) error {
	deadline := time.Now().Add(timeout)
	last := -1
	for {
		ph, err := d.phases(ctx)
		if err != nil {
			return err
		}
		n := 0
		for _, p := range ph {
			if p == "Asleep" {
				n++
			}
		}
		if n != last {
			log.Info("waiting for tenants to sleep", "asleep", n, "want", want)
			last = n
		}
		if n >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d wanted Asleep after %s", n, want, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Second):
		}
	}
}

// firstByte times one pod list (`kubectl get pods`) on a new connection: from
// the start of the TCP connect (the client's first byte) to the first byte of
// the response. A sleeping tenant's wake happens inside that span: the daemon
// holds the connection, and the TLS handshake waits, until the apiserver is Ready.
func firstByte(ctx context.Context, cfg *rest.Config) (time.Duration, error) {
	tlsCfg, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return 0, fmt.Errorf("TLS config: %w", err)
	}
	// HTTP/1.1, as net/http speaks over a custom TLS config; one request, so no difference.
	tlsCfg.NextProtos = []string{"http/1.1"}
	// A longer handshake timeout than kubectl's 10 s, so a slow wake is timed, not lost.
	tr := &http.Transport{TLSClientConfig: tlsCfg, TLSHandshakeTimeout: 2 * time.Minute, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	rt, err := rest.HTTPWrappersForConfig(cfg, tr) // bearer token or basic auth, if the kubeconfig uses one
	if err != nil {
		return 0, fmt.Errorf("auth wrappers: %w", err)
	}
	var connStart, first time.Time
	var mu sync.Mutex
	trace := &httptrace.ClientTrace{
		ConnectStart: func(string, string) {
			mu.Lock()
			if connStart.IsZero() {
				connStart = time.Now()
			}
			mu.Unlock()
		},
		GotFirstResponseByte: func() { mu.Lock(); first = time.Now(); mu.Unlock() },
	}
	rctx, cancel := context.WithTimeout(httptrace.WithClientTrace(ctx, trace), 3*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, cfg.Host+"/api/v1/namespaces/default/pods?limit=500", nil)
	if err != nil {
		return 0, fmt.Errorf("request: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := (&http.Client{Transport: rt}).Do(req)
	if err != nil {
		return 0, fmt.Errorf("pod list: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("pod list: HTTP %d", resp.StatusCode)
	}
	mu.Lock()
	defer mu.Unlock()
	if connStart.IsZero() || first.IsZero() {
		return 0, fmt.Errorf("pod list: no connection timing")
	}
	return first.Sub(connStart), nil
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
