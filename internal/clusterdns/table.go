// Package clusterdns answers a tenant's cluster DNS (Services, headless Services'
// endpoints and StatefulSet Pods' names, Pod-address names) from the tenant API, and
// forwards every other name to an upstream resolver. Each node's agent runs one, so
// cluster DNS on a node never depends on another node.
//
// Table is built from observed state by a pure function; Server answers from the newest
// Table and is restarted by Run if it dies.
package clusterdns

import (
	"net"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Table maps fully qualified names (lower case, with the trailing dot) to IPv4 addresses.
type Table struct {
	domain string // "cluster.local."
	names  map[string][]net.IP
}

// Build makes the table for domain (e.g. cluster.local) from the cluster's Services and
// EndpointSlices:
//
//	<svc>.<ns>.svc.<domain>             the ClusterIP; for a headless Service its ready endpoints
//	<host>.<svc>.<ns>.svc.<domain>      an endpoint with a hostname (StatefulSet Pods)
//
// and answers <a-b-c-d>.<ns>.pod.<domain> from the name itself (see Lookup).
func Build(domain string, services []*corev1.Service, slices []*discoveryv1.EndpointSlice) *Table {
	t := &Table{domain: fqdn(domain), names: map[string][]net.IP{}}
	headless := map[string]bool{}
	for _, s := range services {
		name := fqdn(s.Name + "." + s.Namespace + ".svc." + domain)
		switch {
		case s.Spec.Type == corev1.ServiceTypeExternalName:
			continue // a CNAME; not served
		case s.Spec.ClusterIP == corev1.ClusterIPNone:
			headless[s.Namespace+"/"+s.Name] = true
			t.names[name] = nil // exists even without endpoints
		default:
			if ip := net.ParseIP(s.Spec.ClusterIP).To4(); ip != nil {
				t.names[name] = []net.IP{ip}
			}
		}
	}
	for _, es := range slices {
		svc := es.Labels[discoveryv1.LabelServiceName]
		if svc == "" || es.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		base := svc + "." + es.Namespace + ".svc." + domain
		for _, ep := range es.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready || len(ep.Addresses) == 0 {
				continue
			}
			ip := net.ParseIP(ep.Addresses[0]).To4()
			if ip == nil {
				continue
			}
			if headless[es.Namespace+"/"+svc] {
				t.names[fqdn(base)] = append(t.names[fqdn(base)], ip)
			}
			if ep.Hostname != nil && *ep.Hostname != "" {
				host := fqdn(*ep.Hostname + "." + base)
				t.names[host] = append(t.names[host], ip)
			}
		}
	}
	return t
}

// Lookup answers name (any case, with or without the trailing dot). inZone says whether
// the name belongs to the cluster domain (the server answers it itself, else forwards);
// exists whether it names something (NXDOMAIN if not); ips are its IPv4 addresses.
func (t *Table) Lookup(name string) (ips []net.IP, exists, inZone bool) {
	n := fqdn(strings.ToLower(name))
	if n != t.domain && !strings.HasSuffix(n, "."+t.domain) {
		return nil, false, false
	}
	if ips, ok := t.names[n]; ok {
		return ips, true, true
	}
	// <a-b-c-d>.<ns>.pod.<domain>
	labels := strings.Split(strings.TrimSuffix(n, "."+t.domain), ".")
	if len(labels) == 3 && labels[2] == "pod" {
		if ip := net.ParseIP(strings.ReplaceAll(labels[0], "-", ".")).To4(); ip != nil {
			return []net.IP{ip}, true, true
		}
	}
	return nil, false, true
}

func fqdn(s string) string {
	if strings.HasSuffix(s, ".") {
		return strings.ToLower(s)
	}
	return strings.ToLower(s) + "."
}
