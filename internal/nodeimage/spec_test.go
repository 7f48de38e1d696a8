package nodeimage

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseSpec(t *testing.T) {
	aptSourcesRoot = "testdata/apt-deb822"
	t.Cleanup(func() { aptSourcesRoot = "/" })

	defaults := Spec{
		VCPU: 1, MemMiB: 1024, HeadroomMiB: 1024, KernelPackage: "linux-image-cloud-amd64",
		Suite: "bookworm", Mirror: "http://mirror.example.test/debian",
		Cmdline: "console=ttyS0 root=/dev/vda rw panic=-1", Init: "/sbin/init",
	}
	with := func(f func(*Spec)) Spec { s := defaults; f(&s); return s }

	tests := []struct {
		name    string
		json    string
		want    Spec     // checked when wantErr is empty
		wantErr []string // substrings that must all appear in the error
	}{
		{name: "empty file means defaults", json: ``, want: defaults},
		{name: "empty object means defaults", json: `{}`, want: defaults},
		{name: "zero values mean defaults", json: `{"vcpu":0,"memMiB":0,"headroomMiB":0}`, want: defaults},
		{name: "every key", json: `{"vcpu":2,"memMiB":2048,"diskMiB":4096,"headroomMiB":512,
			"kernelPackage":"linux-image-amd64","suite":"trixie","mirror":"https://m.example.test/debian/",
			"packages":["socat","curl"],"cmdline":"console=ttyS0 root=/dev/vda ro","init":"/usr/local/bin/agent"}`,
			want: Spec{VCPU: 2, MemMiB: 2048, DiskMiB: 4096, HeadroomMiB: 512, KernelPackage: "linux-image-amd64",
				Suite: "trixie", Mirror: "https://m.example.test/debian", Packages: []string{"socat", "curl"},
				Cmdline: "console=ttyS0 root=/dev/vda ro", Init: "/usr/local/bin/agent"}},
		{name: "mirror default follows the suite", json: `{"suite":"bookworm-security"}`,
			want: with(func(s *Spec) {
				s.Suite = "bookworm-security"
				s.Mirror = "http://security.example.test/debian-security"
			})},
		{name: "suite without a host source falls back to deb.debian.org", json: `{"suite":"trixie"}`,
			want: with(func(s *Spec) { s.Suite = "trixie"; s.Mirror = DefaultMirror })},
		{name: "unknown key", json: `{"memMb":512}`,
			wantErr: []string{`unknown key "memMb"`, "valid keys are: vcpu, memMiB, diskMiB, headroomMiB, kernelPackage, suite, mirror, packages, cmdline, init"}},
		{name: "mis-cased key", json: `{"memmib":512}`, wantErr: []string{`unknown key "memmib"`, `did you mean "memMiB"`}},
		{name: "wrong type", json: `{"vcpu":"two"}`, wantErr: []string{"vcpu", "string"}},
		{name: "trailing data", json: `{} {}`, wantErr: []string{"after top-level value"}},
		{name: "not an object", json: `[1]`, wantErr: []string{"nodeimage.json"}},
		{name: "negative vcpu", json: `{"vcpu":-1}`, wantErr: []string{"vcpu -1 is out of range: use 1..64"}},
		{name: "too many vcpus", json: `{"vcpu":65}`, wantErr: []string{"vcpu 65 is out of range: use 1..64"}},
		{name: "too little memory", json: `{"memMiB":128}`, wantErr: []string{"memMiB 128 is below the minimum 256: use at least 256"}},
		{name: "too much memory", json: `{"memMiB":2000000}`, wantErr: []string{"memMiB 2000000 is above the maximum"}},
		{name: "tiny headroom", json: `{"headroomMiB":10}`, wantErr: []string{"headroomMiB 10 is below the minimum 64"}},
		{name: "disk smaller than base plus headroom", json: `{"diskMiB":1000}`,
			wantErr: []string{"diskMiB 1000 cannot hold", "use diskMiB >= 1424"}},
		{name: "disk that fits base plus smaller headroom", json: `{"diskMiB":1000,"headroomMiB":256}`,
			want: with(func(s *Spec) { s.DiskMiB = 1000; s.HeadroomMiB = 256 })},
		{name: "negative disk", json: `{"diskMiB":-5}`, wantErr: []string{"diskMiB -5 is negative", "0 for tree + headroomMiB"}},
		{name: "huge disk", json: `{"diskMiB":99999999}`, wantErr: []string{"diskMiB 99999999 is above the maximum"}},
		{name: "bad package", json: `{"packages":["Foo Bar"]}`, wantErr: []string{`"Foo Bar" is not a Debian package name`}},
		{name: "bad kernel package", json: `{"kernelPackage":"linux image"}`, wantErr: []string{"kernelPackage"}},
		{name: "bad suite", json: `{"suite":"Bookworm"}`, wantErr: []string{`suite "Bookworm"`}},
		{name: "bad mirror", json: `{"mirror":"ftp://x/debian"}`, wantErr: []string{"must be an http:// or https:// URL"}},
		{name: "init in cmdline", json: `{"cmdline":"console=ttyS0 socialweb.init=/x"}`, wantErr: []string{`use the "init" key`}},
		{name: "relative init", json: `{"init":"sbin/init"}`, wantErr: []string{`init "sbin/init" must be a clean absolute path`}},
		{name: "several errors at once", json: `{"vcpu":-1,"memMiB":1}`, wantErr: []string{"vcpu -1", "memMiB 1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseSpec([]byte(tc.json))
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("ParseSpec(%s) = %+v, want an error containing %q", tc.json, got, tc.wantErr)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not contain %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseSpec(%s): %v", tc.json, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ParseSpec(%s)\n got %+v\nwant %+v", tc.json, got, tc.want)
			}
		})
	}
}

func TestSpecKeysMatchStruct(t *testing.T) {
	var tags []string
	st := reflect.TypeOf(Spec{})
	for i := 0; i < st.NumField(); i++ {
		tags = append(tags, strings.Split(st.Field(i).Tag.Get("json"), ",")[0])
	}
	if !reflect.DeepEqual(tags, SpecKeys()) {
		t.Errorf("SpecKeys() = %v, struct tags are %v", SpecKeys(), tags)
	}
}

func TestHostMirror(t *testing.T) {
	tests := []struct{ root, suite, want string }{
		{"testdata/apt-deb822", "bookworm", "http://mirror.example.test/debian"},
		{"testdata/apt-deb822", "bookworm-updates", "http://mirror.example.test/debian"},
		{"testdata/apt-deb822", "bookworm-security", "http://security.example.test/debian-security"},
		{"testdata/apt-deb822", "trixie", ""}, // only a disabled entry and a deb-src one
		{"testdata/apt-oneline", "bookworm", "http://one.example.test/debian"},
		{"testdata/apt-oneline", "trixie", "http://two.example.test/debian"},
		{"testdata/apt-oneline", "sid", ""},
		{"testdata/does-not-exist", "bookworm", ""},
	}
	for _, tc := range tests {
		if got := mirrorFromSources(tc.root, tc.suite); got != tc.want {
			t.Errorf("mirrorFromSources(%s, %s) = %q, want %q", tc.root, tc.suite, got, tc.want)
		}
	}
}

func TestFullCmdlineAndIncludes(t *testing.T) {
	s := Spec{Cmdline: " console=ttyS0 ", Init: "/x", Packages: []string{"kmod", "socat"}}
	if got, want := s.FullCmdline(), "console=ttyS0 socialweb.init=/x"; got != want {
		t.Errorf("FullCmdline = %q, want %q", got, want)
	}
	inc := s.IncludePackages()
	want := []string{"ca-certificates", "conntrack", "containerd", "containernetworking-plugins", "iproute2", "iptables", "kmod", "nftables", "runc", "socat"}
	if !reflect.DeepEqual(inc, want) {
		t.Errorf("IncludePackages = %v, want %v", inc, want)
	}
}
