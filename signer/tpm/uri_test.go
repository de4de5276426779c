package tpm

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/signer"
)

func TestParseURI(t *testing.T) {
	t.Parallel()
	tests := []struct {
		uri     string
		want    KeyURI
		wantErr string
	}{
		{uri: "tpm:path=/etc/steward-trustd/os-ca.tpmkey;device=/dev/tpmrm0",
			want: KeyURI{Path: "/etc/steward-trustd/os-ca.tpmkey", Device: Device{DeviceChar, "/dev/tpmrm0"}, PCRs: []int{7}, Timeout: DefaultTimeout}},
		{uri: "tpm:handle=0x81000100",
			want: KeyURI{Handle: 0x81000100, PCRs: []int{7}, Timeout: DefaultTimeout}},
		{uri: "tpm:handle=0x817fffff;pcrs=11,7,0;swtpm=127.0.0.1:2321;timeout=2s",
			want: KeyURI{Handle: 0x817fffff, PCRs: []int{0, 7, 11}, PCRsSet: true, Device: Device{DeviceTCP, "127.0.0.1:2321"}, Timeout: 2 * time.Second}},
		{uri: "tpm:socket=/run/swtpm.sock;path=/k",
			want: KeyURI{Path: "/k", Device: Device{DeviceUnix, "/run/swtpm.sock"}, PCRs: []int{7}, Timeout: DefaultTimeout}},
		{uri: "tpm:swtpm=[::1]:2321;path=/k",
			want: KeyURI{Path: "/k", Device: Device{DeviceTCP, "[::1]:2321"}, PCRs: []int{7}, Timeout: DefaultTimeout}},
		{uri: "file:/k", wantErr: "must start with"},
		{uri: "tpm:", wantErr: "names no key"},
		{uri: "tpm:pcrs=7", wantErr: "names no key"},
		{uri: "tpm:path=/a;handle=0x81000000", wantErr: "not both"},
		{uri: "tpm:path=/a;path=/b", wantErr: "given twice"},
		{uri: "tpm:path=", wantErr: "empty value"},
		{uri: "tpm:path", wantErr: "not key=value"},
		{uri: "tpm:path=/a;", wantErr: "not key=value"},
		{uri: "tpm:path=relative", wantErr: "not an absolute path"},
		{uri: "tpm:path=/a/../b", wantErr: "not clean"},
		{uri: "tpm:path=/a;colour=blue", wantErr: "unknown attribute"},
		{uri: "tpm:PATH=/a", wantErr: "unknown attribute"},
		{uri: "tpm:handle=0x80000001", wantErr: "persistent range"},
		{uri: "tpm:handle=0x81800000", wantErr: "persistent range"},
		{uri: "tpm:handle=81000100", wantErr: "8 hex digits"},
		{uri: "tpm:handle=0x8100010", wantErr: "8 hex digits"},
		{uri: "tpm:handle=0x8100010g", wantErr: "8 hex digits"},
		{uri: "tpm:path=/a;device=/dev/tpm0;swtpm=h:1", wantErr: "at most one"},
		{uri: "tpm:path=/a;socket=/s;device=/dev/tpm0", wantErr: "at most one"},
		{uri: "tpm:path=/a;swtpm=host", wantErr: "host:port"},
		{uri: "tpm:path=/a;swtpm=:2321", wantErr: "host:port"},
		{uri: "tpm:path=/a;swtpm=h:0", wantErr: "invalid port"},
		{uri: "tpm:path=/a;swtpm=h:65536", wantErr: "invalid port"},
		{uri: "tpm:path=/a;swtpm=h:02321", wantErr: "invalid port"},
		{uri: "tpm:path=/a;approvals=/d;systemd=true",
			want: KeyURI{Path: "/a", PCRs: []int{11}, Timeout: DefaultTimeout, Approvals: "/d", Systemd: true}},
		{uri: "tpm:path=/a;pcrs=17,18,19",
			want: KeyURI{Path: "/a", PCRs: []int{17, 18, 19}, PCRsSet: true, Timeout: DefaultTimeout}},
		{uri: "tpm:path=/a;pcrs=24", wantErr: "PCR index"},
		{uri: "tpm:path=/a;pcrs=16", wantErr: "PCR 16 is the debug PCR, which any process with TPM access can reset"},
		{uri: "tpm:path=/a;pcrs=7,23", wantErr: "PCR 23 is the application PCR"},
		{uri: "tpm:path=/a;pcrs=20", wantErr: "PCR 20 can be reset by the dynamically launched OS"},
		{uri: "tpm:path=/a;pcrs=21", wantErr: "locality 2"},
		{uri: "tpm:path=/a;pcrs=22", wantErr: "locality 2"},
		{uri: "tpm:path=/a;systemd=true", wantErr: "approvals"},
		{uri: "tpm:path=/a;approvals=/d;systemd=true;pcrs=7", wantErr: "binds PCR 11"},
		{uri: "tpm:path=/a;approvals=/d;systemd=yes", wantErr: "only value"},
		{uri: "tpm:path=/a;pcrs=7,7", wantErr: "twice"},
		{uri: "tpm:path=/a;pcrs=7,", wantErr: "PCR index"},
		{uri: "tpm:path=/a;pcrs=+7", wantErr: "PCR index"},
		{uri: "tpm:path=/a;pcrs=07", wantErr: "PCR index"},
		{uri: "tpm:path=/a;timeout=1ms", wantErr: "out of range"},
		{uri: "tpm:path=/a;timeout=soon", wantErr: "timeout"},
		{uri: "tpm:path=/a\x00b", wantErr: "control character"},
		{uri: "tpm:path=/a\nb", wantErr: "control character"},
		{uri: "tpm:path=/a;approvals=rel", wantErr: "not an absolute path"},
		{uri: "tpm:path=/a;authority=!!", wantErr: "authority"},
		{uri: "tpm:path=/a;authority=AAAA", wantErr: "authority"},
		{uri: "tpm:path=/a;approvals=/d;authority=MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE", wantErr: "authority"},
	}
	for _, tt := range tests {
		t.Run(tt.uri, func(t *testing.T) {
			t.Parallel()
			got, err := ParseURI(tt.uri)
			if tt.wantErr != "" {
				if err == nil || !errors.Is(err, signer.ErrInvalidURI) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseURI(%q) = %+v, %v; want ErrInvalidURI containing %q", tt.uri, got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Path != tt.want.Path || got.Handle != tt.want.Handle || got.Device != tt.want.Device ||
				!slices.Equal(got.PCRs, tt.want.PCRs) || got.PCRsSet != tt.want.PCRsSet || got.Timeout != tt.want.Timeout ||
				got.Approvals != tt.want.Approvals || got.Systemd != tt.want.Systemd {
				t.Fatalf("ParseURI(%q) = %+v, want %+v", tt.uri, got, tt.want)
			}
			again, err := ParseURI(got.String())
			if err != nil || again.String() != got.String() {
				t.Fatalf("String() %q does not round-trip: %+v, %v", got.String(), again, err)
			}
		})
	}
}

func FuzzParseURI(f *testing.F) {
	for _, s := range []string{
		"tpm:path=/etc/steward-trustd/os-ca.tpmkey;device=/dev/tpmrm0",
		"tpm:handle=0x81000100;pcrs=7,11;timeout=5s",
		"tpm:path=/k;swtpm=127.0.0.1:2321",
		"tpm:path=/k;socket=/s",
		"tpm:;;==",
		"tpm:path=/k;approvals=/etc/steward-trustd/approvals",
		"tpm:path=/k;approvals=/d;authority=AAAA,BBBB",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := ParseURI(s)
		if err != nil {
			if !errors.Is(err, signer.ErrInvalidURI) {
				t.Fatalf("error %v does not wrap ErrInvalidURI", err)
			}
			return
		}
		if (u.Path == "") == (u.Handle == 0) {
			t.Fatalf("%q parsed with path %q and handle %#x", s, u.Path, u.Handle)
		}
		again, err := ParseURI(u.String())
		if err != nil || again.String() != u.String() {
			t.Fatalf("%q: canonical form %q does not round-trip: %v", s, u.String(), err)
		}
		// WithPCRs of the URI's own selection agrees with the parser.
		with, err := WithPCRs(s, u.PCRs)
		if err != nil {
			if u.PCRsSet {
				t.Fatalf("WithPCRs(%q, its own PCRs %v): %v", s, u.PCRs, err)
			}
			return
		}
		w, err := ParseURI(with)
		if err != nil || !slices.Equal(w.PCRs, u.PCRs) || !w.PCRsSet {
			t.Fatalf("WithPCRs(%q) = %q: %+v, %v", s, with, w, err)
		}
	})
}

func TestWithPCRs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		uri     string
		pcrs    []int
		want    string
		wantErr string
	}{
		{"tpm:path=/k.tpmkey", []int{7, 11}, "tpm:path=/k.tpmkey;pcrs=7,11", ""},
		{"tpm:path=/k.tpmkey", []int{11, 7}, "tpm:path=/k.tpmkey;pcrs=7,11", ""},
		{"tpm:path=/k.tpmkey;pcrs=7,11", []int{11, 7}, "tpm:path=/k.tpmkey;pcrs=7,11", ""},
		{"tpm:path=/k.tpmkey", nil, "tpm:path=/k.tpmkey", ""},
		{"tpm:path=/k.tpmkey;pcrs=7", []int{7, 11}, "", "already selects PCRs 7"},
		{"tpm:path=/k.tpmkey", []int{7, 7}, "", "twice"}, // the one rule: a duplicate is a typo
		{"tpm:path=/k.tpmkey", []int{24}, "", "PCR index"},
		{"tpm:path=relative", []int{7}, "", "absolute"},
		{"file:/k.key", []int{7}, "", "only applies to tpm: key URIs, not \"file:\""},
		{"pkcs11:token=t?pin-value=1234", []int{7}, "", "not \"pkcs11:\""},
	}
	for _, tt := range tests {
		got, err := WithPCRs(tt.uri, tt.pcrs)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, signer.ErrInvalidURI) {
				t.Errorf("WithPCRs(%q, %v) err = %v, want ErrInvalidURI containing %q", tt.uri, tt.pcrs, err, tt.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), "1234") {
				t.Errorf("WithPCRs error shows the URI's PIN: %v", err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("WithPCRs(%q, %v) = %q, %v; want %q", tt.uri, tt.pcrs, got, err, tt.want)
		}
	}
}

func TestIsKeyURI(t *testing.T) {
	t.Parallel()
	for uri, want := range map[string]bool{"tpm:handle=0x81000100": true, "tpm:": true, "TPM:x": false, "file:/k": false, "": false} {
		if got := IsKeyURI(uri); got != want {
			t.Errorf("IsKeyURI(%q) = %v", uri, got)
		}
	}
}
