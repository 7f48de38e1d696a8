package daemon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	v1 "github.com/socialweb-computer/socialweb/api/v1alpha1"
	"github.com/socialweb-computer/socialweb/internal/pki"
	"github.com/socialweb-computer/socialweb/internal/registry"
)

func TestRegistryPeerAddress(t *testing.T) {
	for _, tc := range []struct {
		name              string
		flag, hostAddress string
		listen, reported  string
		explicit          bool
		wantErr           string
	}{
		{name: "off: no flag, no host address"},
		{name: "defaulted from --host-address", hostAddress: "10.0.0.2", listen: "10.0.0.2:7444", reported: "10.0.0.2:7444"},
		{name: "defaulted from an IPv6 --host-address", hostAddress: "fd00::2", listen: "[fd00::2]:7444", reported: "[fd00::2]:7444"},
		{name: "one address", flag: "10.0.0.2:9000", listen: "10.0.0.2:9000", reported: "10.0.0.2:9000", explicit: true},
		{name: "a DNS name", flag: "host-a.example:9000", listen: "host-a.example:9000", reported: "host-a.example:9000", explicit: true},
		{name: "every interface, reported with --host-address", flag: "0.0.0.0:9000", hostAddress: "10.0.0.2", listen: "0.0.0.0:9000", reported: "10.0.0.2:9000", explicit: true},
		{name: "every interface, no port host", flag: ":9000", hostAddress: "10.0.0.2", listen: ":9000", reported: "10.0.0.2:9000", explicit: true},
		{name: "every interface without --host-address", flag: "0.0.0.0:9000", explicit: true, wantErr: "pass --host-address"},
		{name: "no port", flag: "10.0.0.2", explicit: true, wantErr: "want HOST:PORT"},
		{name: "bad port", flag: "10.0.0.2:70000", explicit: true, wantErr: "port"},
		{name: "the management API's port", flag: "127.0.0.1:7443", explicit: true, wantErr: "--api-port"},
		{name: "a bad host", flag: "bad_host!:9000", explicit: true, wantErr: "neither an IP address nor a DNS name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			listen, reported, explicit, err := registryPeerAddress(Options{RegistryPeerAddress: tc.flag, HostAddress: tc.hostAddress, APIPort: 7443})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || listen != tc.listen || reported != tc.reported || explicit != tc.explicit {
				t.Fatalf("= %q, %q, %v, %v; want %q, %q, %v", listen, reported, explicit, err, tc.listen, tc.reported, tc.explicit)
			}
		})
	}
}

// service is the management API's PKI that every host of one service shares, and a
// fake management API holding the Hosts.
type peerService struct {
	pki string
	dyn *dynamicfake.FakeDynamicClient
}

func newPeerService(t *testing.T) peerService {
	dir := filepath.Join(t.TempDir(), "pki")
	if _, err := pki.Ensure(dir, pki.Options{Clients: []pki.Identity{pki.Admin}}); err != nil {
		t.Fatal(err)
	}
	return peerService{pki: dir, dyn: dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{v1.HostGVR: v1.HostKind + "List"})}
}

// stateDir is a host's state dir holding the service's CAs, as joining writes them.
func (s peerService) stateDir(t *testing.T) string {
	state := t.TempDir()
	dst := filepath.Join(state, "mgmt", "pki")
	if err := os.MkdirAll(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"server-ca.crt", "server-ca.key", "client-ca.crt", "client-ca.key"} {
		b, err := os.ReadFile(filepath.Join(s.pki, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return state
}

func (s peerService) host(t *testing.T, name, registryAddr string) {
	h := &v1.Host{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1.HostStatus{Registry: registryAddr}}
	u, err := h.ToUnstructured()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.dyn.Resource(v1.HostGVR).Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

type liveness map[string]bool

func (l liveness) HostLive(h string) (bool, bool) { live, known := l[h]; return live, known }

func digestOf(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// pushImage pushes a one-layer image as name:tag into the registry under state.
func pushImage(t *testing.T, state, name, tag string) (manifest, layer []byte) {
	rs := &registry.Server{Dir: filepath.Join(state, "registry"), Logger: slog.New(slog.DiscardHandler)}
	ts := httptest.NewServer(rs.Handler())
	defer ts.Close()
	layer, config := []byte("a layer pushed on host a"), []byte(`{"architecture":"amd64","os":"linux"}`)
	for _, b := range [][]byte{layer, config} {
		res, err := http.Post(ts.URL+"/v2/"+name+"/blobs/uploads/?digest="+digestOf(b), "application/octet-stream", bytes.NewReader(b))
		if err != nil || res.StatusCode != http.StatusCreated {
			t.Fatalf("pushing a blob: %v %v", res, err)
		}
		res.Body.Close()
	}
	manifest, _ = json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": registry.MediaTypeOCIManifest,
		"config": map[string]any{"mediaType": registry.MediaTypeOCIConfig, "digest": digestOf(config), "size": len(config)},
		"layers": []map[string]any{{"mediaType": registry.MediaTypeOCILayer, "digest": digestOf(layer), "size": len(layer)}}})
	req, _ := http.NewRequest("PUT", ts.URL+"/v2/"+name+"/manifests/"+tag, bytes.NewReader(manifest))
	req.Header.Set("Content-Type", registry.MediaTypeOCIManifest)
	res, err := http.DefaultClient.Do(req)
	if err != nil || res.StatusCode != http.StatusCreated {
		t.Fatalf("pushing the manifest: %v %v", res, err)
	}
	res.Body.Close()
	return manifest, layer
}

// Two hosts of one service: B's node pulls what was pushed on A, through A's peer
// listener, over mutual TLS; nothing without a host's client certificate gets an
// answer from it.
func TestRegistryPeersOverMutualTLS(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	svc := newPeerService(t)
	stateA, stateB := svc.stateDir(t), svc.stateDir(t)
	manifest, layer := pushImage(t, stateA, "team/app", "1")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addrA := ln.Addr().String()
	svc.host(t, "a", addrA)
	svc.host(t, "b", "")
	svc.host(t, "gone", "127.0.0.1:1") // its Lease lapsed
	svc.host(t, "new", "127.0.0.1:2")  // not yet seen by membership: asked
	live := liveness{"a": true, "b": true, "gone": false}
	vA := validated{Options: Options{StateDir: stateA}, hostName: "a", registryPeer: addrA}
	if _, err := startRegistryPeers(ctx, vA, ln, live, svc.dyn, log); err != nil {
		t.Fatal(err)
	}
	vB := validated{Options: Options{StateDir: stateB}, hostName: "b"}
	peersB, err := startRegistryPeers(ctx, vB, nil, live, svc.dyn, log)
	if err != nil {
		t.Fatal(err)
	}
	var list []registry.Peer
	for deadline := time.Now().Add(10 * time.Second); len(list) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		list = peersB.List()
	}
	if len(list) != 2 || list[0].Name != "a" || list[0].BaseURL != "https://"+addrA || list[1].Name != "new" {
		t.Fatalf("B's peers: %+v; want a at https://%s and new (not itself, nor a host whose Lease lapsed)", list, addrA)
	}

	// B's node pulls the image pushed on A.
	rsB := &registry.Server{Dir: filepath.Join(stateB, "registry"), Logger: log, Peers: peersB.List}
	node := httptest.NewServer(rsB.NodeHandlerFor("x"))
	defer node.Close()
	for _, step := range []struct {
		path string
		want []byte
	}{{"/v2/team/app/manifests/1", manifest}, {"/v2/team/app/blobs/" + digestOf(layer), layer}} {
		path, want := step.path, step.want
		res, err := http.Get(node.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || !bytes.Equal(body, want) {
			t.Fatalf("B's node: GET %s: %d %s", path, res.StatusCode, body)
		}
	}

	// Straight at A's listener.
	get := func(c *http.Client) (int, error) {
		res, err := c.Get("https://" + addrA + "/v2/team/app/manifests/1")
		if err != nil {
			return 0, err
		}
		res.Body.Close()
		return res.StatusCode, nil
	}
	if code, err := get(peersB.client); code != http.StatusOK {
		t.Errorf("B's client: %d %v; want 200", code, err)
	}
	withCert := func(cert *tls.Certificate) *http.Client {
		tr := peersB.client.Transport.(*http.Transport).Clone()
		tr.TLSClientConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if cert == nil {
				return &tls.Certificate{}, nil
			}
			return cert, nil
		}
		return &http.Client{Transport: tr}
	}
	if code, err := get(withCert(nil)); err == nil {
		t.Errorf("a client without a certificate (a node): %d; want the handshake refused", code)
	}
	p := pki.PathsFor(svc.pki)
	adminCert, adminKey := p.Cert(pki.Admin)
	admin, err := tls.LoadX509KeyPair(adminCert, adminKey)
	if err != nil {
		t.Fatal(err)
	}
	if code, err := get(withCert(&admin)); code != http.StatusForbidden {
		t.Errorf("the management API's admin certificate: %d %v; want 403 (hosts only)", code, err)
	}
	other := newPeerService(t)
	po := pki.PathsFor(other.pki)
	oc, ok := po.Cert(pki.Admin)
	stranger, err := tls.LoadX509KeyPair(oc, ok)
	if err != nil {
		t.Fatal(err)
	}
	if code, err := get(withCert(&stranger)); err == nil {
		t.Errorf("a certificate of another service's client CA: %d; want the handshake refused", code)
	}
	if res, err := http.Get("http://" + addrA + "/v2/"); err == nil && res.StatusCode == http.StatusOK {
		t.Errorf("plain HTTP was served")
	}
	// Writes are refused even to a host.
	req, _ := http.NewRequest("DELETE", "https://"+addrA+"/v2/team/app/manifests/1", nil)
	if res, err := peersB.client.Do(req); err != nil || res.StatusCode != http.StatusForbidden {
		t.Errorf("DELETE from a host: %v %v; want 403", res, err)
	}
}
