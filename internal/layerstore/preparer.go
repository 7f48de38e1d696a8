package layerstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Blobs opens a blob of the host registry by digest.
type Blobs interface {
	OpenBlob(digest string) (io.ReadCloser, error)
}

// DefaultWorkers is how many layers a Preparer unpacks at once: unpacking is mostly
// gunzip, one core each, and node VMs need the others.
const DefaultWorkers = 2

// Preparer fills a Store from the registry's blobs: Enqueue queues layers and returns at
// once, workers unpack them (Workers at a time), each digest once however often it is
// queued, and layers already in the store are skipped. Failures are logged and counted;
// the layer stays absent (nodes pull it) and a later Enqueue tries again.
type Preparer struct {
	store   *Store
	blobs   Blobs
	log     *slog.Logger
	m       *metrics
	workers int

	mu      sync.Mutex
	queue   []Layer
	pending map[string]bool // queued or being unpacked, by digest
	busy    int             // layers being unpacked
	wake    chan struct{}   // a layer was queued
	idle    chan struct{}   // closed and replaced whenever queue and busy reach zero
	started bool
}

// PreparerConfig configures a Preparer; zero values are defaults.
type PreparerConfig struct {
	Workers int // DefaultWorkers when 0
	Log     *slog.Logger
	// Metrics, if set, gets the socialweb_layer_* metrics.
	Metrics prometheus.Registerer
}

// NewPreparer returns a Preparer; Start runs its workers.
func NewPreparer(store *Store, blobs Blobs, cfg PreparerConfig) (*Preparer, error) {
	if store == nil || blobs == nil {
		return nil, errors.New("layer preparer: a store and a blob source are required")
	}
	if cfg.Workers < 0 {
		return nil, fmt.Errorf("layer preparer: %d workers: want 1 or more (0 for %d)", cfg.Workers, DefaultWorkers)
	}
	if cfg.Workers == 0 {
		cfg.Workers = DefaultWorkers
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	p := &Preparer{store: store, blobs: blobs, log: log, m: newMetrics(store), workers: cfg.Workers,
		pending: map[string]bool{}, wake: make(chan struct{}, 1), idle: make(chan struct{})}
	close(p.idle) // nothing queued yet
	if cfg.Metrics != nil {
		if err := p.m.register(cfg.Metrics); err != nil {
			return nil, fmt.Errorf("layer preparer metrics: %w", err)
		}
	}
	return p, nil
}

// Start runs the workers until ctx ends. Call it once.
func (p *Preparer) Start(ctx context.Context) {
	p.mu.Lock()
	if p.started {
		p.mu.Unlock()
		return
	}
	p.started = true
	p.mu.Unlock()
	for range p.workers {
		go p.work(ctx)
	}
}

// Enqueue queues the layers not yet in the store, nor queued, nor being unpacked, and
// returns how many it queued. Layers that cannot be unpacked here (Validate) are skipped
// with a debug line.
func (p *Preparer) Enqueue(layers ...Layer) int {
	n := 0
	p.mu.Lock()
	for _, l := range layers {
		if p.pending[l.Digest] {
			continue
		}
		if err := l.Validate(); err != nil {
			p.log.Debug("layer not prepared: it cannot be unpacked here", "digest", l.Digest, "err", err)
			continue
		}
		if p.store.Has(l.Digest) {
			continue
		}
		if len(p.queue) == 0 && p.busy == 0 {
			p.idle = make(chan struct{})
		}
		p.pending[l.Digest] = true
		p.queue = append(p.queue, l)
		n++
	}
	p.mu.Unlock()
	if n > 0 {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
	return n
}

// Wait returns once nothing is queued or being unpacked, or when ctx ends.
func (p *Preparer) Wait(ctx context.Context) error {
	p.mu.Lock()
	idle := p.idle
	p.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *Preparer) work(ctx context.Context) {
	for {
		p.mu.Lock()
		if len(p.queue) == 0 {
			p.mu.Unlock()
			select {
			case <-p.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		l := p.queue[0]
		p.queue = p.queue[1:]
		p.busy++
		more := len(p.queue) > 0
		p.mu.Unlock()
		if more {
			// Pass the wake-up on: another worker may take the next one.
			select {
			case p.wake <- struct{}{}:
			default:
			}
		}
		_, _ = p.Prepare(ctx, l)
		p.mu.Lock()
		p.busy--
		delete(p.pending, l.Digest)
		if len(p.queue) == 0 && p.busy == 0 {
			close(p.idle)
		}
		p.mu.Unlock()
	}
}

// Prepare unpacks one layer now (skipping one already present), logging and counting
// the outcome. The CLI calls it directly; the workers call it for what is queued.
func (p *Preparer) Prepare(ctx context.Context, l Layer) (Ready, error) {
	if r, err := p.store.Get(l.Digest); err == nil {
		return r, nil
	}
	t0 := time.Now()
	r, err := p.prepare(ctx, l)
	took := time.Since(t0)
	if err != nil {
		if ctx.Err() != nil {
			return r, err // shutting down, not a bad layer
		}
		p.m.failed.Inc()
		p.log.Error("layer not prepared; nodes will pull it", "digest", l.Digest, "size", l.Size, "err", err)
		return r, err
	}
	p.m.prepared.Inc()
	p.m.bytes.Add(float64(r.UnpackedBytes))
	p.m.seconds.Observe(took.Seconds())
	p.log.Info("layer prepared", "digest", l.Digest, "size", r.Size, "unpackedBytes", r.UnpackedBytes, "files", r.Files,
		"took", took.Round(time.Millisecond))
	return r, nil
}

func (p *Preparer) prepare(ctx context.Context, l Layer) (Ready, error) {
	blob, err := p.blobs.OpenBlob(l.Digest)
	if err != nil {
		return Ready{}, fmt.Errorf("opening layer %s: %w", l.Digest, err)
	}
	defer blob.Close()
	return p.store.Prepare(ctx, l, blob)
}

type metrics struct {
	prepared prometheus.Counter
	failed   prometheus.Counter
	bytes    prometheus.Counter
	seconds  prometheus.Histogram
	store    *storeCollector
}

func newMetrics(s *Store) *metrics {
	return &metrics{
		prepared: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "socialweb_layers_prepared_total",
			Help: "Image layers unpacked into the host layer store.",
		}),
		failed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "socialweb_layer_prepare_failures_total",
			Help: "Image layers that failed to unpack (corrupt blob, diffID mismatch, disk full); nodes pull those.",
		}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "socialweb_layer_unpacked_bytes_total",
			Help: "Bytes of regular files written by layer unpacking.",
		}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "socialweb_layer_prepare_seconds",
			Help:    "Time to unpack one layer into the host layer store (read, decompress, verify, write, sync).",
			Buckets: prometheus.ExponentialBucketsRange(0.01, 300, 14),
		}),
		store: &storeCollector{s: s,
			bytes: prometheus.NewDesc("socialweb_layer_store_bytes", "Unpacked bytes of the layers in the host layer store (regular files).", nil, nil),
			count: prometheus.NewDesc("socialweb_layer_store_layers", "Layers in the host layer store.", nil, nil)},
	}
}

func (m *metrics) register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.prepared, m.failed, m.bytes, m.seconds, m.store} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// storeCollector reports the store's size at scrape time: another process (a CLI push)
// may have added layers since.
type storeCollector struct {
	s            *Store
	bytes, count *prometheus.Desc
}

func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.bytes; ch <- c.count }

func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	rs, err := c.s.List()
	if err != nil {
		return
	}
	var total int64
	for _, r := range rs {
		total += r.UnpackedBytes
	}
	ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(total))
	ch <- prometheus.MustNewConstMetric(c.count, prometheus.GaugeValue, float64(len(rs)))
}
