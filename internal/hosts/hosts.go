// Package hosts is the service's membership: each daemon registers a Host
// object in the shared management API, keeps its Lease fresh, and holds the
// Lease of every tenant it runs. Ownership is those Leases, written with the
// apiserver's compare-and-swap (resourceVersion), as Kubernetes components
// elect owners; there is no consensus of our own.
//
// A tenant's Lease is written when it is claimed and when it changes hands,
// not renewed: it is valid while its holder's host Lease is, so renewals cost
// one write per host, not one per tenant.
package hosts

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/placement"
)

// LeaseLabel tells host Leases from tenant Leases, so each is listed alone.
const LeaseLabel = v1.Group + "/lease"

const (
	DefaultLeaseDuration = 30 * time.Second
	DefaultRenewEvery    = 10 * time.Second
)

// Resources is what a host has: CPUs, and memory in bytes (total, available).
type Resources struct {
	CPUs               int
	Memory, FreeMemory int64
}

// Config says who this host is.
type Config struct {
	Name       string
	Address    string
	FrontDoor  string
	Registry   string // host:port of its registry's peer listener (HostStatus.Registry)
	Version    string
	MaxTenants int
	// Shared: other hosts share the management API and may take this host's
	// tenants when it goes silent. Alone (sqlite), a host is never fenced: no
	// one else could run its tenants.
	Shared bool
	// LeaseDuration is how long a host that stopped renewing keeps its Lease
	// (and its tenants) in others' eyes; RenewEvery how often it renews.
	LeaseDuration, RenewEvery time.Duration
	// Resources reads the host's; Tenants counts the tenants it owns and runs.
	Resources func() (Resources, error)
	Tenants   func() (owned, awake int)
	// OnHostLost is called when another host's Lease lapses (its tenants may be
	// taken over now); OnFenced when this host's own did (it must run nothing).
	OnHostLost func(host string)
	OnFenced   func()
	Now        func() time.Time
}

// Membership is this host's place in the service. Join it, then Run it.
type Membership struct {
	cfg  Config
	kube kubernetes.Interface
	dyn  dynamic.Interface
	log  *slog.Logger

	mu sync.Mutex
	// renewed is when this host last renewed its Lease.
	renewed time.Time
	// seen is, per other host, its Lease's renewTime and when this host first saw
	// that value: a host is live while its renewTime changed within the Lease
	// duration of this host's clock, so hosts' clocks need not agree.
	seen map[string]observation
	// alive is every host's liveness at the last poll; fenced this host's.
	alive  map[string]bool
	fenced bool
	// doors are the other hosts' front doors (host:port), and peers their
	// addresses, at the last poll.
	doors map[string]string
	peers map[netip.Addr]bool
	// draining is this host's Host spec.draining at the last report.
	draining bool
	metrics  metrics
}

type observation struct {
	renew metav1.MicroTime
	at    time.Time
}

// New makes a Membership; nothing is written until Join.
func New(cfg Config, kube kubernetes.Interface, dyn dynamic.Interface, log *slog.Logger) *Membership {
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = DefaultLeaseDuration
	}
	if cfg.RenewEvery == 0 {
		cfg.RenewEvery = DefaultRenewEvery
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Tenants == nil {
		cfg.Tenants = func() (int, int) { return 0, 0 }
	}
	return &Membership{cfg: cfg, kube: kube, dyn: dyn, log: log, seen: map[string]observation{}, alive: map[string]bool{}}
}

// Name is this host's.
func (m *Membership) Name() string { return m.cfg.Name }

// LeaseDuration is how long a silent host keeps its tenants.
func (m *Membership) LeaseDuration() time.Duration { return m.cfg.LeaseDuration }

// Join renews this host's Lease and writes its Host object. It returns how
// long the host must wait before it runs any tenant: a host whose Lease had
// lapsed may have lost tenants to others by a decision still in flight, and
// after one Lease duration every such decision has landed in the tenants'
// Leases, which the provider reads before it starts anything.
func (m *Membership) Join(ctx context.Context) (wait time.Duration, err error) {
	lapsed, err := m.renew(ctx)
	if err != nil {
		return 0, err
	}
	if err := m.report(ctx); err != nil {
		return 0, err
	}
	m.poll(ctx)
	if lapsed && m.cfg.Shared { // alone, no one could have taken a tenant
		return m.cfg.LeaseDuration, nil
	}
	return 0, nil
}

// Run renews the Lease and reports the Host until ctx ends.
func (m *Membership) Run(ctx context.Context) {
	t := time.NewTicker(m.cfg.RenewEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := m.renew(ctx); err != nil {
			m.log.Warn("renewing this host's Lease", "err", err, "leaseDuration", m.cfg.LeaseDuration)
		} else if err := m.report(ctx); err != nil {
			m.log.Warn("reporting this host", "err", err)
		}
		m.poll(ctx)
	}
}

// poll reads the hosts' Leases and tells of each host whose Lease lapsed since
// the last poll, and of this host being fenced.
func (m *Membership) poll(ctx context.Context) {
	if fenced := m.Fenced(); fenced != m.fenced {
		m.fenced = fenced
		if fenced {
			m.log.Error("this host could not renew its Lease for a Lease duration: stopping its tenants, which other hosts may run now", "leaseDuration", m.cfg.LeaseDuration)
			if m.cfg.OnFenced != nil {
				m.cfg.OnFenced()
			}
		}
	}
	m.pollDoors(ctx)
	hl, err := m.leases().List(ctx, metav1.ListOptions{LabelSelector: LeaseLabel + "=host"})
	if err != nil {
		m.log.Warn("reading the hosts' Leases", "err", err)
		return
	}
	var lost []string
	alive := map[string]bool{}
	for _, l := range hl.Items {
		holder := ptr.Deref(l.Spec.HolderIdentity, "")
		alive[holder] = m.live(holder, l.Spec.RenewTime)
	}
	m.mu.Lock()
	for h, was := range m.alive {
		if was && !alive[h] && h != m.cfg.Name {
			lost = append(lost, h)
		}
	}
	m.alive = alive
	m.mu.Unlock()
	for _, h := range lost {
		m.log.Warn("a host's Lease lapsed: its tenants go to the hosts left", "host", h, "leaseDuration", m.cfg.LeaseDuration)
		if m.cfg.OnHostLost != nil {
			m.cfg.OnHostLost(h)
		}
	}
}

// pollDoors reads where the other hosts' front doors are.
func (m *Membership) pollDoors(ctx context.Context) {
	list, err := m.dyn.Resource(v1.HostGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		m.log.Warn("reading the Hosts", "err", err)
		return
	}
	doors, peers := map[string]string{}, map[netip.Addr]bool{}
	for i := range list.Items {
		h, err := v1.HostFromUnstructured(&list.Items[i])
		if err != nil || h.Name == m.cfg.Name {
			continue
		}
		if a, err := netip.ParseAddr(h.Status.Address); err == nil {
			peers[a.Unmap()] = true
		}
		if door, ok := DoorAddress(h.Status); ok {
			doors[h.Name] = door
			if ap, err := netip.ParseAddrPort(door); err == nil {
				peers[ap.Addr().Unmap()] = true
			}
		}
	}
	m.mu.Lock()
	m.doors, m.peers = doors, peers
	m.mu.Unlock()
}

// DoorAddress is where other hosts reach a host's front door: its --front-door,
// with its --host-address for a door on every interface.
func DoorAddress(st v1.HostStatus) (string, bool) {
	host, port, err := net.SplitHostPort(st.FrontDoor)
	if err != nil || port == "" {
		return "", false
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		if st.Address == "" {
			return "", false
		}
		host = st.Address
	}
	return net.JoinHostPort(host, port), true
}

// DoorOf is the front door of another host, at the last poll.
func (m *Membership) DoorOf(host string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.doors[host]
	return d, ok
}

// IsPeer says whether addr is another host's, at the last poll.
func (m *Membership) IsPeer(addr netip.Addr) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.peers[addr.Unmap()]
}

// HostLive says whether host was live at the last poll; known is false for a
// host the poll has not seen (or before the first).
func (m *Membership) HostLive(host string) (live, known bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	live, known = m.alive[host]
	return live, known
}

// Fenced says whether this host went a Lease duration without renewing: others
// may run its tenants now, so it must run none until it renews and rejoins.
func (m *Membership) Fenced() bool {
	if !m.cfg.Shared {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cfg.Now().Sub(m.renewed) >= m.cfg.LeaseDuration
}

func (m *Membership) leases() interface {
	Get(context.Context, string, metav1.GetOptions) (*coordinationv1.Lease, error)
	Create(context.Context, *coordinationv1.Lease, metav1.CreateOptions) (*coordinationv1.Lease, error)
	Update(context.Context, *coordinationv1.Lease, metav1.UpdateOptions) (*coordinationv1.Lease, error)
	Delete(context.Context, string, metav1.DeleteOptions) error
	List(context.Context, metav1.ListOptions) (*coordinationv1.LeaseList, error)
} {
	return m.kube.CoordinationV1().Leases(v1.SystemNamespace)
}

// renew writes this host's Lease; lapsed says it had run out before.
func (m *Membership) renew(ctx context.Context) (lapsed bool, err error) {
	now := m.cfg.Now()
	name := v1.HostLeaseName(m.cfg.Name)
	l, err := m.leases().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: v1.SystemNamespace, Labels: map[string]string{LeaseLabel: "host"}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(m.cfg.Name), LeaseDurationSeconds: ptr.To(int32(m.cfg.LeaseDuration / time.Second)),
				AcquireTime: ptr.To(metav1.NewMicroTime(now)), RenewTime: ptr.To(metav1.NewMicroTime(now))}}
		if _, err = m.leases().Create(ctx, l, metav1.CreateOptions{}); err != nil {
			return false, fmt.Errorf("creating this host's Lease %s: %w", name, err)
		}
	case err != nil:
		return false, fmt.Errorf("reading this host's Lease %s: %w", name, err)
	default:
		m.mu.Lock()
		// By this host's own clock: it lapsed if this process renewed it over a
		// duration ago, or never did and it is older than that.
		if m.renewed.IsZero() {
			lapsed = l.Spec.RenewTime == nil || now.Sub(l.Spec.RenewTime.Time) >= m.cfg.LeaseDuration
		} else {
			lapsed = now.Sub(m.renewed) >= m.cfg.LeaseDuration
		}
		m.mu.Unlock()
		l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(now))
		l.Spec.LeaseDurationSeconds = ptr.To(int32(m.cfg.LeaseDuration / time.Second))
		if lapsed {
			l.Spec.AcquireTime = ptr.To(metav1.NewMicroTime(now))
			l.Spec.LeaseTransitions = ptr.To(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
		}
		if _, err = m.leases().Update(ctx, l, metav1.UpdateOptions{}); err != nil {
			return false, fmt.Errorf("renewing this host's Lease %s: %w", name, err)
		}
	}
	m.mu.Lock()
	m.renewed = now
	m.mu.Unlock()
	return lapsed, nil
}

// report writes this host's Host object.
func (m *Membership) report(ctx context.Context) error {
	st := v1.HostStatus{Address: m.cfg.Address, FrontDoor: m.cfg.FrontDoor, Registry: m.cfg.Registry, Version: m.cfg.Version,
		MaxTenants: int32(m.cfg.MaxTenants), Reported: metav1.NewTime(m.cfg.Now())}
	if m.cfg.Resources != nil {
		r, err := m.cfg.Resources()
		if err != nil {
			return fmt.Errorf("reading this host's resources: %w", err)
		}
		st.CPUs = int32(r.CPUs)
		st.Memory = *resource.NewQuantity(r.Memory, resource.BinarySI)
		st.FreeMemory = *resource.NewQuantity(r.FreeMemory, resource.BinarySI)
	}
	owned, awake := m.cfg.Tenants()
	st.Tenants, st.Awake = int32(owned), int32(awake)
	res := m.dyn.Resource(v1.HostGVR)
	u, err := res.Get(ctx, m.cfg.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		h := &v1.Host{ObjectMeta: metav1.ObjectMeta{Name: m.cfg.Name}}
		if u, err = h.ToUnstructured(); err != nil {
			return err
		}
		if u, err = res.Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("registering Host %s: %w", m.cfg.Name, err)
		}
		if err != nil {
			return nil // a race with this host's own last report: the next one writes it
		}
	} else if err != nil {
		return fmt.Errorf("reading Host %s: %w", m.cfg.Name, err)
	}
	h, err := v1.HostFromUnstructured(u)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.draining = h.Spec.Draining
	m.mu.Unlock()
	h.Status = st
	if u, err = h.ToUnstructured(); err != nil {
		return err
	}
	if _, err := res.UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("reporting Host %s: %w", m.cfg.Name, err)
	}
	return nil
}

// View is the service as one host sees it: every Host, whether it is live, and
// who holds each tenant.
type View struct {
	Hosts []v1.Host
	Live  map[string]bool
	// Holders maps a tenant to the host holding its Lease.
	Holders map[string]string
}

// Observe lists the Hosts, their Leases and the tenant Leases.
func (m *Membership) Observe(ctx context.Context) (View, error) {
	v := View{Live: map[string]bool{}, Holders: map[string]string{}}
	list, err := m.dyn.Resource(v1.HostGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return v, fmt.Errorf("listing Hosts: %w", err)
	}
	for i := range list.Items {
		h, err := v1.HostFromUnstructured(&list.Items[i])
		if err != nil {
			return v, err
		}
		v.Hosts = append(v.Hosts, *h)
	}
	hl, err := m.leases().List(ctx, metav1.ListOptions{LabelSelector: LeaseLabel + "=host"})
	if err != nil {
		return v, fmt.Errorf("listing host Leases: %w", err)
	}
	for _, l := range hl.Items {
		holder := ptr.Deref(l.Spec.HolderIdentity, "")
		v.Live[holder] = m.live(holder, l.Spec.RenewTime)
	}
	tl, err := m.leases().List(ctx, metav1.ListOptions{LabelSelector: LeaseLabel + "=tenant"})
	if err != nil {
		return v, fmt.Errorf("listing tenant Leases: %w", err)
	}
	for _, l := range tl.Items {
		if tenant, ok := strings.CutPrefix(l.Name, "tenant-"); ok {
			v.Holders[tenant] = ptr.Deref(l.Spec.HolderIdentity, "")
		}
	}
	return v, nil
}

// live says whether host renewed within a Lease duration, as this host saw it.
func (m *Membership) live(host string, renew *metav1.MicroTime) bool {
	if host == m.cfg.Name {
		return !m.Fenced()
	}
	now := m.cfg.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	var r metav1.MicroTime
	if renew != nil {
		r = *renew
	}
	o, ok := m.seen[host]
	if !ok || !o.renew.Equal(&r) {
		o = observation{renew: r, at: now}
		m.seen[host] = o
	}
	return now.Sub(o.at) < m.cfg.LeaseDuration
}

// Candidates are the view's hosts as placement sees them.
func (v View) Candidates() []placement.Host {
	tenants := map[string]int{}
	for _, h := range v.Holders {
		tenants[h]++
	}
	out := make([]placement.Host, 0, len(v.Hosts))
	for _, h := range v.Hosts {
		out = append(out, placement.Host{Name: h.Name, Live: v.Live[h.Name], Draining: h.Spec.Draining,
			FreeMemory: h.Status.FreeMemory.Value(), Tenants: tenants[h.Name], MaxTenants: int(h.Status.MaxTenants)})
	}
	return out
}

// ErrHeldElsewhere: another host holds the tenant's Lease.
var ErrHeldElsewhere = errors.New("another host holds the tenant")

// Holder reads who holds a tenant's Lease ("" when none does).
func (m *Membership) Holder(ctx context.Context, cluster string) (string, error) {
	l, err := m.leases().Get(ctx, v1.TenantLeaseName(cluster), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading the Lease of %s: %w", cluster, err)
	}
	return ptr.Deref(l.Spec.HolderIdentity, ""), nil
}

// Claim takes a tenant's Lease for this host. It succeeds when no host holds
// it (the create is the arbiter: of two hosts at once, one gets AlreadyExists)
// or this one does; otherwise it returns ErrHeldElsewhere naming the holder.
func (m *Membership) Claim(ctx context.Context, cluster string) error {
	now := metav1.NewMicroTime(m.cfg.Now())
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: v1.TenantLeaseName(cluster), Namespace: v1.SystemNamespace,
		Labels: map[string]string{LeaseLabel: "tenant"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(m.cfg.Name), LeaseDurationSeconds: ptr.To(int32(m.cfg.LeaseDuration / time.Second)),
			AcquireTime: &now, RenewTime: &now}}
	_, err := m.leases().Create(ctx, l, metav1.CreateOptions{})
	if err == nil {
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("claiming %s: %w", cluster, err)
	}
	holder, err := m.Holder(ctx, cluster)
	if err != nil {
		return err
	}
	if holder != m.cfg.Name {
		return fmt.Errorf("%w: %s holds %s", ErrHeldElsewhere, holder, cluster)
	}
	return nil
}

// Takeover moves a tenant's Lease from a host whose own Lease lapsed to this
// one. The update carries the resourceVersion read, so of hosts taking over at
// once one wins; the others, and a takeover from a holder that is no longer
// from, get ErrHeldElsewhere.
func (m *Membership) Takeover(ctx context.Context, cluster, from string) error {
	l, err := m.leases().Get(ctx, v1.TenantLeaseName(cluster), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading the Lease of %s: %w", cluster, err)
	}
	if holder := ptr.Deref(l.Spec.HolderIdentity, ""); holder != from {
		return fmt.Errorf("%w: %s holds %s now", ErrHeldElsewhere, holder, cluster)
	}
	now := metav1.NewMicroTime(m.cfg.Now())
	l.Spec.HolderIdentity = ptr.To(m.cfg.Name)
	l.Spec.AcquireTime, l.Spec.RenewTime = &now, &now
	l.Spec.LeaseTransitions = ptr.To(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
	if _, err := m.leases().Update(ctx, l, metav1.UpdateOptions{}); apierrors.IsConflict(err) {
		return fmt.Errorf("%w: another host took %s first", ErrHeldElsewhere, cluster)
	} else if err != nil {
		return fmt.Errorf("taking over %s: %w", cluster, err)
	}
	m.metrics.takeovers.Add(1)
	return nil
}

// Draining says whether `host drain` asked this host to give its tenants away
// (its Host's spec, as last read).
func (m *Membership) Draining() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.draining
}

// Handover gives a tenant this host holds to host to: the Lease's holder
// changes with a compare-and-swap, so no other change is lost.
func (m *Membership) Handover(ctx context.Context, cluster, to string) error {
	l, err := m.leases().Get(ctx, v1.TenantLeaseName(cluster), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading the Lease of %s: %w", cluster, err)
	}
	if holder := ptr.Deref(l.Spec.HolderIdentity, ""); holder != m.cfg.Name {
		return fmt.Errorf("%w: %s holds %s, not this host", ErrHeldElsewhere, holder, cluster)
	}
	now := metav1.NewMicroTime(m.cfg.Now())
	l.Spec.HolderIdentity = ptr.To(to)
	l.Spec.AcquireTime, l.Spec.RenewTime = &now, &now
	l.Spec.LeaseTransitions = ptr.To(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
	if _, err := m.leases().Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("handing %s to %s: %w", cluster, to, err)
	}
	m.metrics.handovers.Add(1)
	return nil
}

// Release gives up a tenant's Lease, if this host holds it (the tenant is gone).
func (m *Membership) Release(ctx context.Context, cluster string) error {
	l, err := m.leases().Get(ctx, v1.TenantLeaseName(cluster), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the Lease of %s: %w", cluster, err)
	}
	if ptr.Deref(l.Spec.HolderIdentity, "") != m.cfg.Name {
		return nil
	}
	err = m.leases().Delete(ctx, l.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &l.ResourceVersion}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("releasing the Lease of %s: %w", cluster, err)
	}
	return nil
}
