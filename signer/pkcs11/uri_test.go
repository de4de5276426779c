package pkcs11

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	pkcs11uri "github.com/stefanberger/go-pkcs11uri"

	"github.com/steward-trustd/steward-trustd/signer"
)

const mp = "module-path=/usr/lib/softhsm/libsofthsm2.so"

func slotID(n uint) *uint { return &n }

func TestParseURI(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want URI
	}{
		{
			"pkcs11:token=trustd;object=os-ca;id=%01?" + mp + "&pin-source=file:/run/secrets/hsm-pin",
			URI{Token: "trustd", Object: "os-ca", ID: []byte{1}, ModulePath: "/usr/lib/softhsm/libsofthsm2.so", PINSource: "/run/secrets/hsm-pin"},
		},
		{
			"pkcs11:token=My%20Token;id=%DE%AD%be%ef?" + mp + "&pin-source=file:///run/pin",
			URI{Token: "My Token", ID: []byte{0xde, 0xad, 0xbe, 0xef}, ModulePath: "/usr/lib/softhsm/libsofthsm2.so", PINSource: "/run/pin"},
		},
		{
			"pkcs11:serial=abc;object=a&b=c;type=private?" + mp + "&pin-value=1234&allow-extractable=true",
			URI{Serial: "abc", Object: "a&b=c", Type: "private", ModulePath: "/usr/lib/softhsm/libsofthsm2.so", PINValue: "1234", AllowExtractable: true},
		},
		{
			"pkcs11:slot-id=42;manufacturer=SoftHSM%20project;model=SoftHSM%20v2;object=k;library-version=2.6;library-manufacturer=SoftHSM;library-description=Implementation%20of%20PKCS11;slot-description=SoftHSM%20slot%20ID%200x0;slot-manufacturer=SoftHSM%20project?" + mp + "&pin-source=/run/pin&allow-extractable=false",
			URI{SlotID: slotID(42), Manufacturer: "SoftHSM project", Model: "SoftHSM v2", Object: "k", LibraryVersion: "2.6",
				LibraryManufacturer: "SoftHSM", LibraryDescription: "Implementation of PKCS11", SlotDescription: "SoftHSM slot ID 0x0",
				SlotManufacturer: "SoftHSM project", ModulePath: "/usr/lib/softhsm/libsofthsm2.so", PINSource: "/run/pin"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := ParseURI(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(*got, tt.want) {
				t.Fatalf("ParseURI =\n%+v\nwant\n%+v", *got, tt.want)
			}
			again, err := ParseURI(got.Encode())
			if err != nil {
				t.Fatalf("reparse %q: %v", got.Encode(), err)
			}
			if !reflect.DeepEqual(again, got) {
				t.Fatalf("round trip %q changed the URI", got.Encode())
			}
		})
	}
}

func TestParseURIErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, want string
	}{
		{"scheme", "file:/x", "does not start with"},
		{"no module", "pkcs11:token=t;object=k?pin-value=1", "module-path is required"},
		{"relative module", "pkcs11:token=t;object=k?module-path=lib.so&pin-value=1", "clean absolute path"},
		{"unclean module", "pkcs11:token=t;object=k?module-path=/a/../b.so&pin-value=1", "clean absolute path"},
		{"module-name", "pkcs11:token=t;object=k?module-name=softhsm2&pin-value=1", "module-name is not supported"},
		{"no pin", "pkcs11:token=t;object=k?" + mp, "PIN is required"},
		{"both pins", "pkcs11:token=t;object=k?" + mp + "&pin-value=1&pin-source=/p", "not both"},
		{"pin program", "pkcs11:token=t;object=k?" + mp + "&pin-source=|/bin/cat", "pin-source must be"},
		{"pin remote", "pkcs11:token=t;object=k?" + mp + "&pin-source=file://host/p", "must not name a host"},
		{"pin relative", "pkcs11:token=t;object=k?" + mp + "&pin-source=file:p", "pin-source must be"},
		{"no token", "pkcs11:object=k?" + mp + "&pin-value=1", "name the token"},
		{"no key", "pkcs11:token=t?" + mp + "&pin-value=1", "name the key"},
		{"dup path", "pkcs11:token=t;token=u;object=k?" + mp + "&pin-value=1", "given twice"},
		{"dup query", "pkcs11:token=t;object=k?" + mp + "&" + mp + "&pin-value=1", "given twice"},
		{"unknown path", "pkcs11:token=t;object=k;x-vendor=1?" + mp + "&pin-value=1", "unsupported path attribute"},
		{"unknown query", "pkcs11:token=t;object=k?" + mp + "&pin-value=1&max-sessions=4", "unsupported query attribute"},
		{"query in path", "pkcs11:token=t;object=k;module-path=/x?pin-value=1", "is a query attribute"},
		{"path in query", "pkcs11:object=k?token=t&" + mp + "&pin-value=1", "is a path attribute"},
		{"no equals", "pkcs11:token;object=k?" + mp + "&pin-value=1", "without '='"},
		{"empty value", "pkcs11:token=;object=k?" + mp + "&pin-value=1", "is empty"},
		{"empty query", "pkcs11:token=t;object=k?", "empty query"},
		{"bad pct", "pkcs11:token=t%zz;object=k?" + mp + "&pin-value=1", "malformed pct-encoding"},
		{"short pct", "pkcs11:token=t;object=k%4?" + mp + "&pin-value=1", "truncated"},
		{"raw space", "pkcs11:token=my token;object=k?" + mp + "&pin-value=1", "must be pct-encoded"},
		{"slash in path", "pkcs11:token=a/b;object=k?" + mp + "&pin-value=1", "must be pct-encoded"},
		{"fragment", "pkcs11:token=t;object=k?" + mp + "&pin-value=1#frag", "must be pct-encoded"},
		{"bad slot-id", "pkcs11:slot-id=0x1;object=k?" + mp + "&pin-value=1", "decimal digits"},
		{"huge slot-id", "pkcs11:slot-id=99999999999999999999999;object=k?" + mp + "&pin-value=1", "out of range"},
		{"bad version", "pkcs11:token=t;object=k;library-version=2.x?" + mp + "&pin-value=1", "N or N.M"},
		{"type public", "pkcs11:token=t;object=k;type=public?" + mp + "&pin-value=1", "private key"},
		{"type junk", "pkcs11:token=t;object=k;type=foo?" + mp + "&pin-value=1", "type must be"},
		{"allow junk", "pkcs11:token=t;object=k?" + mp + "&pin-value=1&allow-extractable=yes", "true or false"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := ParseURI(tt.in)
			if !errors.Is(err, signer.ErrInvalidURI) {
				t.Fatalf("ParseURI(%q) = %v, want ErrInvalidURI", tt.in, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q does not say %q", err, tt.want)
			}
		})
	}
}

// TestPINNeverInErrors: the PIN appears in no parse error and in no
// String() of a parsed URI.
func TestPINNeverInErrors(t *testing.T) {
	t.Parallel()
	const pin = "S3cretPin"
	bad := []string{
		"pkcs11:token=t;object=k?" + mp + "&pin-value=" + pin + "&pin-value=" + pin,
		"pkcs11:token=t;object=k?pin-value=" + pin,
		"pkcs11:token=t;object=k?" + mp + "&pin-value=" + pin + "&pin-source=/p",
		"pkcs11:token=t;object=k?" + mp + "&pin-value=" + pin + "%zz",
		"pkcs11:token=t;object=k?" + mp + "&pin-value=" + pin + "&" + pin + "=1",
		"pkcs11:token=t;object=k?" + mp + "&pin-value=12&" + pin + "=34",
	}
	for _, in := range bad {
		if _, err := ParseURI(in); err == nil || strings.Contains(err.Error(), pin) {
			t.Errorf("ParseURI(%q) = %v", in, err)
		}
	}
	u, err := ParseURI("pkcs11:token=t;object=k?" + mp + "&pin-value=" + pin)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(u.String(), pin) || strings.Contains(u.keyLocation(), pin) {
		t.Errorf("String() = %q, keyLocation() = %q", u.String(), u.keyLocation())
	}
	if !strings.Contains(u.Encode(), pin) {
		t.Errorf("Encode() = %q lost the PIN", u.Encode())
	}
}

// FuzzParseURI: no panic; an accepted URI round-trips through Encode;
// go-pkcs11uri (the other Go parser) accepts it too and reads the same
// attribute values, so the strictness only ever removes inputs.
func FuzzParseURI(f *testing.F) {
	for _, s := range []string{
		"pkcs11:token=trustd;object=os-ca;id=%01?" + mp + "&pin-source=file:/run/secrets/hsm-pin",
		"pkcs11:serial=abc;object=a&b=c;type=private?" + mp + "&pin-value=1234&allow-extractable=true",
		"pkcs11:slot-id=42;object=k;library-version=2.6?" + mp + "&pin-source=/p",
		"pkcs11:token=My%20Token;id=%DE%AD?" + mp + "&pin-source=file:///run/pin",
		p11toolTPMURI + "?" + mp + "&pin-source=/p",
		"pkcs11:model=IBM%20SoftTok%20%20%20;token=trustd%00;object=k?" + mp + "&pin-value=1",
		"pkcs11:token=%00%20%00;object=k?" + mp + "&pin-value=1",
		"pkcs11:token=t;token=u",
		"pkcs11:?",
		"pkcs11:",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		u, err := ParseURI(in)
		if err != nil {
			if !errors.Is(err, signer.ErrInvalidURI) {
				t.Fatalf("error %v does not wrap ErrInvalidURI", err)
			}
			return
		}
		again, err := ParseURI(u.Encode())
		if err != nil {
			t.Fatalf("Encode() %q does not reparse: %v", u.Encode(), err)
		}
		if !reflect.DeepEqual(u, again) {
			t.Fatalf("round trip changed %+v into %+v", u, again)
		}
		if u.PINValue != "" && strings.Contains(u.String(), "pin-value="+escape(u.PINValue, isQueryChar)) && u.PINValue != "REDACTED" {
			t.Fatalf("String() %q shows the PIN", u.String())
		}
		checkPaddedMatch(t, u)
		ref := pkcs11uri.New()
		if err := ref.Parse(in); err != nil {
			t.Fatalf("go-pkcs11uri refuses what ParseURI accepts: %q: %v", in, err)
		}
		for name, got := range map[string]string{"token": u.Token, "object": u.Object, "serial": u.Serial, "model": u.Model} {
			v, ok := ref.GetPathAttribute(name, false)
			if ok != (got != "") || v != got {
				t.Fatalf("%s: go-pkcs11uri reads %q (%v), ParseURI %q", name, v, ok, got)
			}
		}
		if v, _ := ref.GetPathAttribute("id", false); u.ID != nil && !bytes.Equal([]byte(v), u.ID) {
			t.Fatalf("id: go-pkcs11uri reads %x, ParseURI %x", v, u.ID)
		}
		if v, _ := ref.GetQueryAttribute("module-path", false); v != u.ModulePath {
			t.Fatalf("module-path: go-pkcs11uri reads %q, ParseURI %q", v, u.ModulePath)
		}
	})
}

// checkPaddedMatch: a token field padded with blanks or NULs matches the
// URI's value, whatever padding the URI itself carries.
func checkPaddedMatch(t *testing.T, u *URI) {
	for _, v := range []string{u.Token, u.Model, u.Serial, u.Manufacturer} {
		if v != "" && (!field(v, trimField(v)+"  ") || !field(v, trimField(v)+"\x00\x00")) {
			t.Fatalf("%q does not match its own padded field", v)
		}
	}
}
