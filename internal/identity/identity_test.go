package identity

import (
	"bytes"
	"strings"
	"testing"
)

func sample() Identity {
	return Identity{
		Cluster: "ci", NodeName: "ci-abc123", ProviderID: "socialweb://ci/ci-abc123",
		APIServer: "https://10.250.3.1:7500", CACert: "-----BEGIN CERTIFICATE-----\n...", ClientCACert: "-----BEGIN CERTIFICATE-----\n...", BootstrapToken: "abcdef.0123456789abcdef",
		Address: "10.250.3.2/24", Gateway: "10.250.3.1", DNS: "10.250.3.1", ClusterDNS: "10.251.0.10",
		Registry: "http://10.250.3.1:5000", MaxPods: 110, Labels: map[string]string{"a": "b"},
	}
}

func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	in := sample()
	in.KubeletServingCert, in.KubeletServingKey = "SERVING CERT", "SERVING KEY"
	if err := Encode(&buf, in); err != nil {
		t.Fatal(err)
	}
	if buf.Len()%512 != 0 {
		t.Errorf("disk is %d bytes, not whole sectors", buf.Len())
	}
	got, err := Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if got.NodeName != "ci-abc123" || got.Labels["a"] != "b" || got.MaxPods != 110 ||
		got.KubeletServingCert != "SERVING CERT" || got.KubeletServingKey != "SERVING KEY" {
		t.Errorf("round trip lost data: %+v", got)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*Identity)
		wantErr string
	}{
		{"complete", func(*Identity) {}, ""},
		{"no token", func(i *Identity) { i.BootstrapToken = "" }, "bootstrapToken is empty"},
		{"bad address", func(i *Identity) { i.Address = "10.250.3.2" }, "not an address/prefix"},
		{"bad gateway", func(i *Identity) { i.Gateway = "gw" }, "gateway"},
		{"no max pods", func(i *Identity) { i.MaxPods = 0 }, "maxPods"},
		{"client certificate and key", func(i *Identity) { i.KubeletClientCert, i.KubeletClientKey = "CERT", "KEY" }, ""},
		{"client certificate without its key", func(i *Identity) { i.KubeletClientCert = "CERT" }, "give both or neither"},
		{"client key without its certificate", func(i *Identity) { i.KubeletClientKey = "KEY" }, "give both or neither"},
		{"serving certificate and key", func(i *Identity) { i.KubeletServingCert, i.KubeletServingKey = "CERT", "KEY" }, ""},
		{"serving certificate without its key", func(i *Identity) { i.KubeletServingCert = "CERT" }, "kubeletServingCert and kubeletServingKey go together"},
		{"serving key without its certificate", func(i *Identity) { i.KubeletServingKey = "KEY" }, "kubeletServingCert and kubeletServingKey go together"},
		{"client pair, serving key alone", func(i *Identity) {
			i.KubeletClientCert, i.KubeletClientKey, i.KubeletServingKey = "CERT", "KEY", "KEY"
		}, "kubeletServingCert and kubeletServingKey go together"},
	}
	for _, tt := range tests {
		id := sample()
		tt.mutate(&id)
		err := id.Validate()
		if tt.wantErr == "" {
			if err != nil {
				t.Errorf("%s: %v", tt.name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: err = %v, want %q", tt.name, err, tt.wantErr)
		}
	}
}

func TestDecodeRejectsGarbage(t *testing.T) {
	if _, err := Decode(strings.NewReader("\x00\x00not json")); err == nil {
		t.Error("garbage decoded")
	}
}

func TestPoolDisk(t *testing.T) {
	var pool bytes.Buffer
	if err := EncodePool(&pool, Pool{}); err != nil {
		t.Fatal(err)
	}
	if pool.Len() != PoolDiskSize {
		t.Fatalf("pool disk is %d bytes, want %d", pool.Len(), PoolDiskSize)
	}
	if _, err := Decode(bytes.NewReader(pool.Bytes())); err != ErrUnclaimed {
		t.Fatalf("Decode(pool disk) = %v, want ErrUnclaimed", err)
	}
	var claimed bytes.Buffer
	if err := EncodeSized(&claimed, sample(), PoolDiskSize); err != nil {
		t.Fatal(err)
	}
	if claimed.Len() != PoolDiskSize {
		t.Fatalf("claimed disk is %d bytes, want %d: the host rewrites it in place", claimed.Len(), PoolDiskSize)
	}
	got, err := Decode(&claimed)
	if err != nil {
		t.Fatal(err)
	}
	if got.NodeName != "ci-abc123" {
		t.Errorf("claimed disk decoded as %+v", got)
	}
	if err := EncodeSized(&claimed, sample(), 64); err == nil {
		t.Error("EncodeSized into a 64-byte disk: no error")
	}
	bad := sample()
	bad.Cluster = ""
	if err := EncodeSized(&claimed, bad, PoolDiskSize); err == nil {
		t.Error("EncodeSized of an invalid identity: no error")
	}
}

func TestDecodePool(t *testing.T) {
	for _, want := range []Pool{{}, {Prewarm: true}} {
		var disk bytes.Buffer
		if err := EncodePool(&disk, want); err != nil {
			t.Fatal(err)
		}
		got, err := DecodePool(&disk)
		if err != nil || got != want {
			t.Errorf("DecodePool(EncodePool(%+v)) = %+v, %v", want, got, err)
		}
	}
	var id bytes.Buffer
	if err := EncodeSized(&id, sample(), PoolDiskSize); err != nil {
		t.Fatal(err)
	}
	if _, err := DecodePool(&id); err == nil {
		t.Error("DecodePool read a claimed disk as a pool document")
	}
}
