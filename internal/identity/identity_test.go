package identity

import (
	"bytes"
	"encoding/json"
	"reflect"
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

// After the join the host rewrites the disk in place: same size, no token, everything
// else kept; a pool document or a disk already forgotten is left alone.
func TestForgetJoin(t *testing.T) {
	encode := func(sized int, mod func(*Identity)) []byte {
		id := sample()
		if mod != nil {
			mod(&id)
		}
		var b bytes.Buffer
		var err error
		if sized > 0 {
			err = EncodeSized(&b, id, sized)
		} else {
			err = Encode(&b, id)
		}
		if err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	var pool bytes.Buffer
	if err := EncodePool(&pool, Pool{}); err != nil {
		t.Fatal(err)
	}
	forgotten, _, err := ForgetJoin(encode(0, nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		disk    []byte
		changed bool
		err     bool
	}{
		{"a cold node's disk", encode(0, nil), true, false},
		{"a claimed pool VM's disk", encode(PoolDiskSize, nil), true, false},
		{"an unclaimed pool VM's disk", pool.Bytes(), false, false},
		{"already forgotten", forgotten, false, false},
		{"garbage", []byte("not json\x00\x00"), false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, changed, err := ForgetJoin(tc.disk)
			if (err != nil) != tc.err || changed != tc.changed {
				t.Fatalf("changed %t, err %v; want changed %t, error %t", changed, err, tc.changed, tc.err)
			}
			if err != nil {
				return
			}
			if len(out) != len(tc.disk) {
				t.Errorf("%d bytes, want the disk's %d (it is rewritten in place under a running VM)", len(out), len(tc.disk))
			}
			if HoldsJoinSecret(out) || bytes.Contains(out, []byte(sample().BootstrapToken)) {
				t.Errorf("the token is still there: %q", bytes.TrimRight(out, "\x00"))
			}
			if tc.changed {
				var id Identity
				if err := json.Unmarshal(bytes.TrimRight(out, "\x00"), &id); err != nil {
					t.Fatal(err)
				}
				want := sample()
				want.BootstrapToken = ""
				if !reflect.DeepEqual(id, want) {
					t.Errorf("rewritten identity %+v, want %+v (only the token gone)", id, want)
				}
				if !HoldsJoinSecret(tc.disk) {
					t.Error("HoldsJoinSecret says the original disk has no token")
				}
			}
		})
	}
}
