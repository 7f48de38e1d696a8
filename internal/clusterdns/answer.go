package clusterdns

import (
	"context"
	"math/rand/v2"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/socialweb-computer/socialweb/internal/dnswire"
)

const (
	// ttl of the answers and, as the SOA minimum, of negative answers (RFC 2308): short,
	// because Services and endpoints change.
	ttl = 5
	// minUDPSize is what a client without EDNS0 takes over UDP (RFC 1035 4.2.1);
	// maxUDPSize is the most we send over UDP whatever the client advertises, and what we
	// advertise ourselves.
	minUDPSize = 512
	maxUDPSize = 4096
	// maxChase bounds the CNAME hops (ExternalName to ExternalName) resolved in the zone.
	maxChase = 8
	// forwardTimeout bounds a relayed query; chaseTimeout a lookup of an ExternalName
	// target, which the client waits for on top of our own answer.
	forwardTimeout = 5 * time.Second
	chaseTimeout   = 2 * time.Second
)

// Answer returns the response to one query message that came over UDP, or nil to drop it.
func (s *Server) Answer(ctx context.Context, query []byte) []byte {
	return s.answer(ctx, "udp", query)
}

// answer returns the response to query, which came over network ("udp" or "tcp"), or
// nil when query is not a DNS query at all (no header, or a response: answering those
// could loop).
func (s *Server) answer(ctx context.Context, network string, query []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil
	}
	resp := dnsmessage.Message{Header: dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode,
		RecursionDesired: h.RecursionDesired, RecursionAvailable: true}}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 {
		resp.Header.RCode = dnsmessage.RCodeFormatError
		return pack(resp, minUDPSize)
	}
	resp.Questions = qs
	if h.OpCode != 0 { // only QUERY; no NOTIFY, UPDATE, IQUERY
		resp.Header.RCode = dnsmessage.RCodeNotImplemented
		return pack(resp, minUDPSize)
	}
	limit := 0xffff
	if clientSize, ok := edns0Size(&p); ok {
		resp.Additionals = []dnsmessage.Resource{optRecord()} // RFC 6891 7: answer EDNS0 with EDNS0
		if network == "udp" {
			limit = min(max(clientSize, minUDPSize), maxUDPSize)
		}
	} else if network == "udp" {
		limit = minUDPSize
	}

	q := qs[0]
	name := strings.ToLower(q.Name.String())
	t := s.table.Load()
	switch {
	case t == nil && s.Domain != "" && (name == fqdn(s.Domain) || strings.HasSuffix(name, "."+fqdn(s.Domain))):
		// Not synced yet: "try again", never a wrong NXDOMAIN from upstream.
		resp.Header.RCode = dnsmessage.RCodeServerFailure
		return pack(resp, limit)
	case t == nil || !t.inZone(name):
		return s.forward(ctx, network, query, resp, limit)
	case q.Class != dnsmessage.ClassINET && q.Class != dnsmessage.ClassANY,
		q.Type == dnsmessage.TypeAXFR || q.Type == 251 /* IXFR */ || q.Type == 253 || q.Type == 254 /* MAILB, MAILA */ :
		resp.Header.RCode = dnsmessage.RCodeNotImplemented
		return pack(resp, limit)
	}
	rep := s.resolve(ctx, t, q.Name, q.Type, 0)
	resp.Header.Authoritative = true
	resp.Header.RCode = rep.rcode
	resp.Answers = rep.answers
	resp.Authorities = rep.authorities
	resp.Additionals = append(rep.additionals, resp.Additionals...)
	return pack(resp, limit)
}

// reply is the zone's answer for one name and type.
type reply struct {
	rcode                             dnsmessage.RCode
	answers, authorities, additionals []dnsmessage.Resource
}

// resolve answers qname (inZone) for qtype from t: the records of that type, the CNAME of
// an ExternalName Service followed by its target's records, NODATA (NOERROR, nothing,
// the SOA) when the name has no record of that type, NXDOMAIN when it does not exist.
func (s *Server) resolve(ctx context.Context, t *Table, qname dnsmessage.Name, qtype dnsmessage.Type, depth int) reply {
	name := strings.ToLower(qname.String())
	r, ok := t.lookup(name)
	if !ok {
		return reply{rcode: dnsmessage.RCodeNameError, authorities: t.negative(name)}
	}
	var rep reply
	if r.cname != "" {
		target, ok := newName(r.cname)
		if !ok {
			return reply{rcode: dnsmessage.RCodeServerFailure}
		}
		rep.answers = append(rep.answers, resource(qname, &dnsmessage.CNAMEResource{CNAME: target}))
		if qtype != dnsmessage.TypeCNAME && qtype != dnsmessage.TypeALL {
			rep.answers = append(rep.answers, s.chase(ctx, t, target, qtype, depth)...)
		}
		return rep
	}
	all := qtype == dnsmessage.TypeALL
	for _, a := range r.addrs {
		switch {
		case a.Is4() && (qtype == dnsmessage.TypeA || all):
			rep.answers = append(rep.answers, resource(qname, &dnsmessage.AResource{A: a.As4()}))
		case a.Is6() && (qtype == dnsmessage.TypeAAAA || all):
			rep.answers = append(rep.answers, resource(qname, &dnsmessage.AAAAResource{AAAA: a.As16()}))
		}
	}
	if qtype == dnsmessage.TypeSRV || all {
		for _, srv := range r.srv {
			target, ok := newName(srv.target)
			if !ok {
				continue
			}
			// RFC 2782 leaves priority and weight to us: all equal, as CoreDNS does.
			rep.answers = append(rep.answers, resource(qname, &dnsmessage.SRVResource{Priority: 0, Weight: 100, Port: srv.port, Target: target}))
			if tr, ok := t.names[srv.target]; ok && qtype == dnsmessage.TypeSRV {
				rep.additionals = append(rep.additionals, addresses(target, tr)...)
			}
		}
	}
	if qtype == dnsmessage.TypePTR || all {
		for _, p := range r.ptr {
			if target, ok := newName(p); ok {
				rep.answers = append(rep.answers, resource(qname, &dnsmessage.PTRResource{PTR: target}))
			}
		}
	}
	if qtype == dnsmessage.TypeTXT || all {
		for _, txt := range r.txt {
			rep.answers = append(rep.answers, resource(qname, &dnsmessage.TXTResource{TXT: []string{txt}}))
		}
	}
	if name == t.domain && (qtype == dnsmessage.TypeSOA || all) {
		rep.answers = append(rep.answers, t.soa()...)
	}
	if len(rep.answers) == 0 {
		rep.authorities = t.negative(name)
	}
	return rep
}

// chase resolves the target of a CNAME for qtype: in the zone itself, else through the
// upstream. Nothing when it does not resolve: the client still has the CNAME.
func (s *Server) chase(ctx context.Context, t *Table, target dnsmessage.Name, qtype dnsmessage.Type, depth int) []dnsmessage.Resource {
	name := strings.ToLower(target.String())
	if t.inZone(name) {
		if depth >= maxChase {
			return nil
		}
		return s.resolve(ctx, t, target, qtype, depth+1).answers
	}
	if s.Upstream == "" {
		return nil
	}
	m := dnsmessage.Message{Header: dnsmessage.Header{ID: uint16(rand.Uint32()), RecursionDesired: true},
		Questions:   []dnsmessage.Question{{Name: target, Type: qtype, Class: dnsmessage.ClassINET}},
		Additionals: []dnsmessage.Resource{optRecord()}}
	query, err := m.Pack()
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, chaseTimeout)
	defer cancel()
	var resp dnsmessage.Message
	for _, network := range []string{"udp", "tcp"} {
		b, err := dnswire.Exchange(ctx, network, s.Upstream, query, chaseTimeout)
		if err != nil || resp.Unpack(b) != nil {
			return nil
		}
		if !resp.Header.Truncated {
			break
		}
	}
	if resp.Header.RCode != dnsmessage.RCodeSuccess || len(resp.Questions) != 1 ||
		!strings.EqualFold(resp.Questions[0].Name.String(), target.String()) {
		return nil
	}
	return resp.Answers
}

// forward relays query to the upstream resolver over network and returns its answer;
// SERVFAIL (resp, an answer with the question) when there is none, so the client does
// not wait out its timeout.
func (s *Server) forward(ctx context.Context, network string, query []byte, resp dnsmessage.Message, limit int) []byte {
	if s.Upstream != "" {
		if b, err := dnswire.Exchange(ctx, network, s.Upstream, query, forwardTimeout); err == nil {
			return b
		}
	}
	resp.Header.RCode = dnsmessage.RCodeServerFailure
	return pack(resp, limit)
}

// pack encodes m in at most limit bytes. A larger answer loses its additional records,
// then as many trailing answers as it must, and says TC, so the client asks again over
// TCP (RFC 2181 9, RFC 7766); the answers that fit still serve a client that does not.
func pack(m dnsmessage.Message, limit int) []byte {
	if b, err := m.Pack(); err == nil && len(b) <= limit {
		return b
	}
	m.Header.Truncated = true
	var opt []dnsmessage.Resource
	for _, r := range m.Additionals {
		if r.Header.Type == dnsmessage.TypeOPT {
			opt = append(opt, r)
		}
	}
	m.Additionals = opt
	answers := m.Answers
	fits := func(n int) []byte {
		m.Answers = answers[:n]
		if b, err := m.Pack(); err == nil && len(b) <= limit {
			return b
		}
		return nil
	}
	// The largest prefix of the answers that fits: fits(n) is monotone in n.
	lo, hi := 0, len(answers)
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if fits(mid) != nil {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	if b := fits(lo); b != nil {
		return b
	}
	m.Answers, m.Authorities = nil, nil
	if b, err := m.Pack(); err == nil && len(b) <= limit {
		return b
	}
	// Not even the question fits (a 255-byte name with EDNS0 cannot get here): just the
	// header, so the client still hears TC.
	m.Questions, m.Additionals = nil, nil
	b, _ := m.Pack()
	return b
}

// edns0Size returns the UDP payload size the query's OPT record advertises (RFC 6891),
// if it has one; p has just read the questions.
func edns0Size(p *dnsmessage.Parser) (int, bool) {
	if p.SkipAllAnswers() != nil || p.SkipAllAuthorities() != nil {
		return 0, false
	}
	for {
		h, err := p.AdditionalHeader()
		if err != nil {
			return 0, false
		}
		if h.Type == dnsmessage.TypeOPT {
			return int(h.Class), true
		}
		if p.SkipAdditional() != nil {
			return 0, false
		}
	}
}

func optRecord() dnsmessage.Resource {
	var h dnsmessage.ResourceHeader
	_ = h.SetEDNS0(maxUDPSize, dnsmessage.RCodeSuccess, false) // never fails
	return dnsmessage.Resource{Header: h, Body: &dnsmessage.OPTResource{}}
}

// negative is the authority section of a negative answer for name: the zone's SOA, whose
// minimum is the TTL to cache the absence for (RFC 2308). Reverse names are not ours to
// speak for beyond the addresses we know: no SOA there.
func (t *Table) negative(name string) []dnsmessage.Resource {
	if name != t.domain && !strings.HasSuffix(name, "."+t.domain) {
		return nil
	}
	return t.soa()
}

func (t *Table) soa() []dnsmessage.Resource {
	zone, ok1 := newName(t.domain)
	ns, ok2 := newName("ns.dns." + t.domain)
	mbox, ok3 := newName("hostmaster." + t.domain)
	if !ok1 || !ok2 || !ok3 {
		return nil
	}
	return []dnsmessage.Resource{resource(zone, &dnsmessage.SOAResource{NS: ns, MBox: mbox, Serial: t.serial,
		Refresh: 7200, Retry: 1800, Expire: 86400, MinTTL: ttl})}
}

// addresses are the A and AAAA records of r under name.
func addresses(name dnsmessage.Name, r *records) []dnsmessage.Resource {
	var out []dnsmessage.Resource
	for _, a := range r.addrs {
		if a.Is4() {
			out = append(out, resource(name, &dnsmessage.AResource{A: a.As4()}))
		} else {
			out = append(out, resource(name, &dnsmessage.AAAAResource{AAAA: a.As16()}))
		}
	}
	return out
}

func resource(name dnsmessage.Name, body dnsmessage.ResourceBody) dnsmessage.Resource {
	return dnsmessage.Resource{Header: dnsmessage.ResourceHeader{Name: name, Class: dnsmessage.ClassINET, TTL: ttl}, Body: body}
}

// newName is a wire name for a fully qualified name; false if it is too long to be one.
func newName(s string) (dnsmessage.Name, bool) {
	n, err := dnsmessage.NewName(s)
	return n, err == nil
}
