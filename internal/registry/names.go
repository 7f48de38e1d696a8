package registry

import (
	"fmt"
	"net"
	"regexp"
	"strings"
)

// DockerHub is the canonical domain of Docker Hub names; index.docker.io and
// registry-1.docker.io are aliases of it.
const DockerHub = "docker.io"

var (
	// One path component of a repository name (OCI distribution spec).
	componentRE = regexp.MustCompile(`^[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*$`)
	// A registry host: DNS name or IPv4 address, or a bracketed IPv6 address, with an
	// optional port.
	domainRE = regexp.MustCompile(`^(?:(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:.]+\])(?::[0-9]+)?$`)
	tagRE    = regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}$`)
	digestRE = regexp.MustCompile(`^sha256:[a-f0-9]{64}$`)
)

const maxNameLen = 255

// names maps the names clients use to the canonical repository names the store keys
// on. See the package documentation for the rules.
type names struct {
	// self holds the extra hosts (lower case, without port) that mean "this registry".
	self map[string]bool
}

func newNames(selfHosts []string) names {
	n := names{self: map[string]bool{}}
	for _, h := range selfHosts {
		n.self[hostOnly(strings.ToLower(h))] = true
	}
	return n
}

// isSelf reports whether domain (lower case, maybe with a port) names this registry.
func (n names) isSelf(domain string) bool {
	h := hostOnly(domain)
	switch h {
	case "localhost", "127.0.0.1", "::1":
		return true
	}
	return n.self[h]
}

func hostOnly(domain string) string {
	if h, _, err := net.SplitHostPort(domain); err == nil {
		return h
	}
	return strings.Trim(domain, "[]")
}

// looksLikeDomain is Docker's rule for the first component of a reference: a registry
// host when it has a dot or a port or is "localhost".
func looksLikeDomain(s string) bool {
	return strings.ContainsAny(s, ".:") || s == "localhost" || strings.ToLower(s) != s
}

// repo returns the canonical repository name for a request path name and the ns query
// parameter containerd adds when it uses this registry as a mirror of registry ns.
func (n names) repo(ns, path string) (string, error) {
	if ns == "" {
		return n.local(path)
	}
	ns = strings.ToLower(ns)
	if !domainRE.MatchString(ns) {
		return "", errf(errNameInvalid, "invalid ns (registry host) %q", ns)
	}
	return n.qualify(ns, path)
}

// local maps a name addressed to this registry directly (no ns): a name whose first
// component is a registry host is that registry's repository (so pushing to
// localhost:5000/docker.io/library/busybox fills the docker.io mirror); anything else is
// a local repository, kept as is.
func (n names) local(path string) (string, error) {
	first, rest, ok := strings.Cut(path, "/")
	if ok && looksLikeDomain(first) {
		if !domainRE.MatchString(first) {
			return "", errf(errNameInvalid, "invalid registry host %q in name %q", first, path)
		}
		return n.qualify(strings.ToLower(first), rest)
	}
	if err := checkPath(path); err != nil {
		return "", err
	}
	return path, nil
}

// qualify names repository path of registry domain.
func (n names) qualify(domain, path string) (string, error) {
	if n.isSelf(domain) {
		return n.local(path)
	}
	if err := checkPath(path); err != nil {
		return "", err
	}
	if domain == "index.docker.io" || domain == "registry-1.docker.io" {
		domain = DockerHub
	}
	if domain == DockerHub && !strings.Contains(path, "/") {
		path = "library/" + path
	}
	name := domain + "/" + path
	if len(name) > maxNameLen {
		return "", errf(errNameInvalid, "repository name %q is longer than %d characters", name, maxNameLen)
	}
	return name, nil
}

func checkPath(path string) error {
	if path == "" {
		return errf(errNameInvalid, "empty repository name")
	}
	if len(path) > maxNameLen {
		return errf(errNameInvalid, "repository name %q is longer than %d characters", path, maxNameLen)
	}
	for _, c := range strings.Split(path, "/") {
		if !componentRE.MatchString(c) {
			return errf(errNameInvalid, "invalid repository name %q: component %q must match %s", path, c, componentRE)
		}
	}
	return nil
}

// reference is a parsed image reference with a canonical repository name.
type reference struct {
	Name   string // canonical repository name
	Tag    string // may be empty when Digest is set
	Digest string // may be empty
}

func (r reference) String() string {
	s := r.Name
	if r.Tag != "" {
		s += ":" + r.Tag
	}
	if r.Digest != "" {
		s += "@" + r.Digest
	}
	return s
}

// parseRef parses a reference the way Docker and containerd do: "busybox" is
// docker.io/library/busybox:latest, "registry.k8s.io/pause:3.10" is itself, and a name on
// this registry's own host ("localhost:5000/foo:1") is the local repository "foo".
func (n names) parseRef(ref string) (reference, error) {
	var r reference
	s := ref
	if i := strings.IndexByte(s, '@'); i >= 0 {
		r.Digest = s[i+1:]
		s = s[:i]
		if !digestRE.MatchString(r.Digest) {
			return r, fmt.Errorf("reference %q: invalid digest %q", ref, r.Digest)
		}
	}
	if i := strings.LastIndexByte(s, ':'); i >= 0 && !strings.Contains(s[i:], "/") {
		r.Tag = s[i+1:]
		s = s[:i]
		if !tagRE.MatchString(r.Tag) {
			return r, fmt.Errorf("reference %q: invalid tag %q", ref, r.Tag)
		}
	}
	if r.Tag == "" && r.Digest == "" {
		r.Tag = "latest"
	}
	var err error
	if first, rest, ok := strings.Cut(s, "/"); ok && looksLikeDomain(first) {
		if !domainRE.MatchString(first) {
			return r, fmt.Errorf("reference %q: invalid registry host %q", ref, first)
		}
		r.Name, err = n.qualify(strings.ToLower(first), rest)
	} else {
		r.Name, err = n.qualify(DockerHub, s)
	}
	if err != nil {
		return r, fmt.Errorf("reference %q: %w", ref, err)
	}
	return r, nil
}
