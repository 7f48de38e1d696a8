package registry

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/socialweb-computer/socialweb/internal/publicaddr"
)

// Upstream is where the registry fetches an image it does not hold: the image's own
// registry (or the operator's mirror of it). A Server with no Upstream is offline and
// serves only what was pushed.
//
// go-containerregistry's transport speaks the upstream side (ping, Basic and Bearer
// token auth, token refresh); this package keeps the names, the store and what a
// tenant may see.
type Upstream struct {
	// Mirrors maps a registry (docker.io, ghcr.io, registry.example:5000) to the base
	// URL it is fetched from instead (https://mirror.example, http://10.0.0.5:5000).
	// The operator chose these, so they may be on private addresses.
	Mirrors map[string]string
	// RootCAs verify upstream TLS; nil is the host's roots.
	RootCAs *x509.CertPool
	// Allow, if not empty, lists the only registries fetched from; Deny lists
	// registries never fetched from and wins. An entry is a registry host
	// (docker.io, registry.example:5000) or a suffix pattern (*.example.com).
	Allow, Deny []string
	// TagTTL is how long a tag fetched from upstream is served before upstream is
	// asked again whether it moved. A digest never is. Zero is DefaultTagTTL.
	TagTTL time.Duration
	// Timeout bounds connecting and each upstream response's headers; a blob body
	// may take as long as it keeps moving. Zero is 30s.
	Timeout time.Duration

	// DialContext replaces the guarded dialer (tests).
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)

	once   sync.Once
	direct http.RoundTripper // tenant-named registries: public addresses only
	mirror http.RoundTripper // operator-named mirrors: any address
	mu     sync.Mutex
	auth   map[string]cachedTransport
}

// DefaultTagTTL is how long a pulled tag is trusted before upstream is asked again.
const DefaultTagTTL = 5 * time.Minute

type cachedTransport struct {
	rt      http.RoundTripper
	expires time.Time
}

// ValidateUpstream checks an operator's upstream settings, naming what is wrong.
func (u *Upstream) Validate() error {
	for reg, base := range u.Mirrors {
		if !domainRE.MatchString(reg) || !looksLikeDomain(reg) {
			return fmt.Errorf("mirror %s=%s: %q is not a registry host (docker.io, registry.example:5000)", reg, base, reg)
		}
		if _, err := parseMirrorURL(base); err != nil {
			return fmt.Errorf("mirror %s=%s: %w", reg, base, err)
		}
	}
	for _, p := range append(append([]string{}, u.Allow...), u.Deny...) {
		if !domainRE.MatchString(strings.TrimPrefix(p, "*.")) {
			return fmt.Errorf("registry pattern %q: want a registry host (quay.io, registry.example:5000) or *.suffix (*.example.com)", p)
		}
	}
	if u.TagTTL < 0 {
		return fmt.Errorf("tag TTL %s is negative", u.TagTTL)
	}
	return nil
}

func parseMirrorURL(base string) (*url.URL, error) {
	m, err := url.Parse(base)
	if err != nil || (m.Scheme != "http" && m.Scheme != "https") || m.Host == "" || (m.Path != "" && m.Path != "/") || m.RawQuery != "" || m.User != nil {
		return nil, fmt.Errorf("%q is not an http(s)://host[:port] URL (no path, query or user)", base)
	}
	return m, nil
}

// ParseMirrors reads REGISTRY=URL entries (docker.io=https://mirror.example).
func ParseMirrors(entries []string) (map[string]string, error) {
	out := map[string]string{}
	for _, e := range entries {
		reg, base, ok := strings.Cut(strings.TrimSpace(e), "=")
		if !ok || reg == "" || base == "" {
			return nil, fmt.Errorf("mirror %q: want REGISTRY=URL, e.g. docker.io=https://mirror.example", e)
		}
		reg = strings.ToLower(reg)
		if reg == "index.docker.io" || reg == "registry-1.docker.io" {
			reg = DockerHub
		}
		if _, dup := out[reg]; dup {
			return nil, fmt.Errorf("mirror %q: %s has a mirror already", e, reg)
		}
		out[reg] = base
	}
	return out, nil
}

func (u *Upstream) init() {
	u.once.Do(func() {
		if u.Timeout == 0 {
			u.Timeout = 30 * time.Second
		}
		if u.TagTTL == 0 {
			u.TagTTL = DefaultTagTTL
		}
		u.auth = map[string]cachedTransport{}
		mk := func(guard bool) http.RoundTripper {
			d := &net.Dialer{Timeout: u.Timeout, KeepAlive: 30 * time.Second}
			if guard {
				d.Control = refuseNonPublic
			}
			dial := d.DialContext
			if u.DialContext != nil {
				dial = u.DialContext
			}
			return &http.Transport{
				DialContext:           dial,
				TLSClientConfig:       &tls.Config{RootCAs: u.RootCAs, MinVersion: tls.VersionTLS12},
				TLSHandshakeTimeout:   u.Timeout,
				ResponseHeaderTimeout: u.Timeout,
				MaxIdleConnsPerHost:   8,
				IdleConnTimeout:       90 * time.Second,
				ForceAttemptHTTP2:     true,
			}
		}
		u.direct, u.mirror = mk(true), mk(false)
	})
}

// refuseNonPublic stops the host from dialing, for a tenant, anything but a public
// address: a node names the registry (?ns=), so without this a tenant could make the
// host fetch from its LAN, its metadata service, loopback (another tenant's apiserver),
// or another tenant's gateway. Token realms are dialed through it too.
func refuseNonPublic(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("upstream address %q: %w", address, err)
	}
	if !publicAddr(ap.Addr()) {
		return &notPublicError{ap.Addr()}
	}
	return nil
}

type notPublicError struct{ addr netip.Addr }

func (e *notPublicError) Error() string {
	return fmt.Sprintf("%s is not a public address; the host fetches only public registries for nodes (an operator can add a mirror for a private one)", e.addr)
}

// publicAddr: the host fetches for a node only from public addresses not its own.
func publicAddr(a netip.Addr) bool { return publicaddr.Elsewhere(a) }

// allowed says why the host may not fetch from registry reg for a node, or "".
func (u *Upstream) allowed(reg string) string {
	match := func(p string) bool {
		if s, ok := strings.CutPrefix(p, "*."); ok {
			return strings.HasSuffix(reg, "."+s)
		}
		return reg == p
	}
	for _, p := range u.Deny {
		if match(p) {
			return fmt.Sprintf("registry %s is denied by this host's operator (registry deny list: %s)", reg, p)
		}
	}
	if len(u.Allow) == 0 {
		return ""
	}
	for _, p := range u.Allow {
		if match(p) {
			return ""
		}
	}
	return fmt.Sprintf("registry %s is not in this host's allow list (%s)", reg, strings.Join(u.Allow, ", "))
}

// endpoint is where a repository of registry reg is fetched from.
type endpoint struct {
	reg    name.Registry
	base   string // scheme://host
	mirror bool
}

func (u *Upstream) endpoint(reg string) (endpoint, error) {
	if base, ok := u.Mirrors[reg]; ok {
		m, err := parseMirrorURL(base)
		if err != nil {
			return endpoint{}, err
		}
		var opts []name.Option
		if m.Scheme == "http" {
			opts = append(opts, name.Insecure)
		}
		r, err := name.NewRegistry(m.Host, opts...)
		if err != nil {
			return endpoint{}, fmt.Errorf("mirror %s: %w", base, err)
		}
		return endpoint{reg: r, base: m.Scheme + "://" + m.Host, mirror: true}, nil
	}
	host := reg
	if reg == DockerHub {
		host = "registry-1.docker.io"
	}
	r, err := name.NewRegistry(host, name.StrictValidation)
	if err != nil {
		return endpoint{}, fmt.Errorf("registry %s: %w", reg, err)
	}
	return endpoint{reg: r, base: "https://" + host}, nil
}

// transport returns an authenticating transport for pulls of repo from ep, kept for
// a while so a token is fetched once per image, not once per blob.
func (u *Upstream) transport(ctx context.Context, ep endpoint, repo string, auth authn.Authenticator, authKey string) (http.RoundTripper, error) {
	key := ep.base + "/" + repo + "\x00" + authKey
	u.mu.Lock()
	c, ok := u.auth[key]
	if ok && time.Now().Before(c.expires) {
		u.mu.Unlock()
		return c.rt, nil
	}
	u.mu.Unlock()
	inner := u.direct
	if ep.mirror {
		inner = u.mirror
	}
	if strings.HasPrefix(ep.base, "https://") {
		// go-containerregistry also pings over plain http for a loopback or RFC 1918
		// host; an https endpoint is never spoken to in the clear.
		inner = httpsOnly{inner}
	}
	rt, err := transport.NewWithContext(ctx, ep.reg, auth, inner, []string{ep.reg.Repo(repo).Scope(transport.PullScope)})
	if err != nil {
		return nil, upstreamErr(ep, err)
	}
	u.mu.Lock()
	for k, v := range u.auth {
		if time.Now().After(v.expires) {
			delete(u.auth, k)
		}
	}
	u.auth[key] = cachedTransport{rt, time.Now().Add(10 * time.Minute)}
	u.mu.Unlock()
	return rt, nil
}

type httpsOnly struct{ rt http.RoundTripper }

func (h httpsOnly) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Scheme != "https" {
		return nil, fmt.Errorf("refusing plain http to %s: the endpoint is https", r.URL.Host)
	}
	return h.rt.RoundTrip(r)
}

// upstreamRef is one repository at its registry, as the store names it
// (docker.io/library/busybox) and as upstream does (library/busybox).
type upstreamRef struct {
	canonical string
	registry  string
	repo      string
}

func splitCanonical(canonical string) (upstreamRef, bool) {
	reg, repo, ok := strings.Cut(canonical, "/")
	if !ok || !looksLikeDomain(reg) {
		return upstreamRef{}, false // a local repository: nothing upstream
	}
	return upstreamRef{canonical, reg, repo}, true
}

// UpstreamError is a fetch from upstream that failed; Status is upstream's HTTP status,
// or 0 when it could not be reached.
type UpstreamError struct {
	Registry string
	Status   int
	Err      error
}

func (e *UpstreamError) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("upstream %s could not be reached: %v", e.Registry, e.Err)
	}
	return fmt.Sprintf("upstream %s answered %d: %v", e.Registry, e.Status, e.Err)
}

func (e *UpstreamError) Unwrap() error { return e.Err }

func upstreamErr(ep endpoint, err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		return &UpstreamError{Registry: ep.reg.RegistryStr(), Status: te.StatusCode, Err: err}
	}
	return &UpstreamError{Registry: ep.reg.RegistryStr(), Err: err}
}

// asRegistryError turns an upstream failure into what the node is told.
func asRegistryError(ref upstreamRef, what string, err error) error {
	var ue *UpstreamError
	if !errors.As(err, &ue) {
		return err
	}
	switch ue.Status {
	case 0:
		return &Error{errUnavailable, fmt.Sprintf("%s of %s is not cached and upstream %s could not be reached: %s", what, ref.canonical, ref.registry, reachCause(ue.Err)), nil}
	case http.StatusNotFound:
		return errf(errManifestUnknown, "%s of %s: upstream %s has no such image", what, ref.canonical, ref.registry)
	case http.StatusUnauthorized, http.StatusForbidden:
		return errf(errUnauthorized, "%s of %s: upstream %s refused the credentials given (the Pod's imagePullSecret for %s, or none): not allowed", what, ref.canonical, ref.registry, ref.registry)
	case http.StatusTooManyRequests:
		return errf(errTooManyRequests, "%s of %s: upstream %s is rate-limiting this host; try again later", what, ref.canonical, ref.registry)
	}
	return &Error{errUnavailable, fmt.Sprintf("%s of %s: upstream %s answered %d", what, ref.canonical, ref.registry, ue.Status), nil}
}

// reachCause is why upstream could not be reached, without the plain-http attempt
// go-containerregistry's ping adds for a private address (refused by httpsOnly).
func reachCause(err error) string {
	var keep []string
	for _, p := range strings.Split(err.Error(), "; ") {
		if !strings.Contains(p, "refusing plain http") {
			keep = append(keep, p)
		}
	}
	if len(keep) == 0 {
		return err.Error()
	}
	return strings.Join(keep, "; ")
}

var manifestAccept = strings.Join([]string{MediaTypeOCIIndex, MediaTypeDockerList, MediaTypeOCIManifest, MediaTypeDockerManifest}, ", ")

// fetchManifest GETs (or, head, HEADs) manifest ref of r upstream. It returns the body
// (nil for HEAD), media type and digest upstream gives.
func (u *Upstream) fetchManifest(ctx context.Context, r upstreamRef, ref string, head bool, auth authn.Authenticator) ([]byte, string, string, error) {
	u.init()
	ep, rt, err := u.open(ctx, r, auth)
	if err != nil {
		return nil, "", "", err
	}
	method := http.MethodGet
	if head {
		method = http.MethodHead
	}
	req, err := http.NewRequestWithContext(ctx, method, ep.base+"/v2/"+r.repo+"/manifests/"+ref, nil)
	if err != nil {
		return nil, "", "", err
	}
	req.Header.Set("Accept", manifestAccept)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return nil, "", "", upstreamErr(ep, err)
	}
	defer resp.Body.Close()
	if err := transport.CheckError(resp, http.StatusOK); err != nil {
		return nil, "", "", upstreamErr(ep, err)
	}
	mt := strings.TrimSpace(strings.Split(resp.Header.Get("Content-Type"), ";")[0])
	digest := resp.Header.Get("Docker-Content-Digest")
	if head {
		return nil, mt, digest, nil
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxManifestSize+1))
	if err != nil {
		return nil, "", "", upstreamErr(ep, err)
	}
	if len(b) > maxManifestSize {
		return nil, "", "", errf(errSizeInvalid, "upstream manifest %s:%s is over %d bytes", r.canonical, ref, maxManifestSize)
	}
	return b, mt, digest, nil
}

// openBlob starts a GET of blob digest of r upstream; the caller reads and closes the
// body. size is upstream's Content-Length (-1 unknown).
func (u *Upstream) openBlob(ctx context.Context, r upstreamRef, digest string, auth authn.Authenticator) (io.ReadCloser, int64, error) {
	return u.blobRequest(ctx, http.MethodGet, r, digest, auth)
}

func (u *Upstream) blobRequest(ctx context.Context, method string, r upstreamRef, digest string, auth authn.Authenticator) (io.ReadCloser, int64, error) {
	u.init()
	ep, rt, err := u.open(ctx, r, auth)
	if err != nil {
		return nil, 0, err
	}
	req, err := http.NewRequestWithContext(ctx, method, ep.base+"/v2/"+r.repo+"/blobs/"+digest, nil)
	if err != nil {
		return nil, 0, err
	}
	// The blob may redirect to storage elsewhere (S3, a CDN); http.Client follows it
	// through the same guarded dialer and drops the registry's Authorization.
	client := &http.Client{Transport: rt}
	resp, err := client.Do(req)
	if err != nil {
		return nil, 0, upstreamErr(ep, err)
	}
	if err := transport.CheckError(resp, http.StatusOK); err != nil {
		resp.Body.Close()
		return nil, 0, upstreamErr(ep, err)
	}
	return resp.Body, resp.ContentLength, nil
}

func (u *Upstream) open(ctx context.Context, r upstreamRef, auth authn.Authenticator) (endpoint, http.RoundTripper, error) {
	if why := u.allowed(r.registry); why != "" {
		return endpoint{}, nil, errf(errDenied, "%s", why)
	}
	ep, err := u.endpoint(r.registry)
	if err != nil {
		return endpoint{}, nil, err
	}
	if auth == nil {
		auth = authn.Anonymous
	}
	key := ""
	if ac, err := auth.Authorization(); err == nil && (ac.Username != "" || ac.Password != "" || ac.Auth != "" || ac.IdentityToken != "" || ac.RegistryToken != "") {
		// Keyed by a hash: the transport cache never holds a tenant's password as a key.
		sum := sha256.Sum256([]byte(ac.Username + "\x00" + ac.Password + "\x00" + ac.Auth + "\x00" + ac.IdentityToken + "\x00" + ac.RegistryToken))
		key = hex.EncodeToString(sum[:])
	}
	rt, err := u.transport(ctx, ep, r.repo, auth, key)
	return ep, rt, err
}

// MirrorList renders Mirrors sorted, for logs.
func (u *Upstream) MirrorList() []string {
	var out []string
	for k, v := range u.Mirrors {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}
