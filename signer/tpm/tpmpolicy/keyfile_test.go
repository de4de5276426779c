package tpmpolicy

import (
	"bytes"
	"crypto/sha256"
	"encoding/pem"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-tpm/tpm2"
)

func TestKeyBlobRoundTrip(t *testing.T) {
	digest := sha256.Sum256([]byte("pcrs"))
	policy, err := PCRAuthPolicy([]int{7, 11}, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	blob := &KeyBlob{
		Public:    tpm2.New2B(KeyTemplate(tpm2.TPMECCNistP256, policy, false)),
		Private:   tpm2.TPM2BPrivate{Buffer: []byte{1, 2, 3, 4}},
		PCRs:      []int{7, 11},
		PCRDigest: digest[:],
	}
	data, err := blob.MarshalPEM("test")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(data, []byte("-----BEGIN TSS2 PRIVATE KEY-----")) {
		t.Fatalf("not a TSS2 PRIVATE KEY PEM: %s", data)
	}
	got, err := ParseKeyBlob(data)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.PCRs, blob.PCRs) || !bytes.Equal(got.PCRDigest, blob.PCRDigest) ||
		!bytes.Equal(got.Private.Buffer, blob.Private.Buffer) ||
		!bytes.Equal(tpm2.Marshal(got.Public), tpm2.Marshal(blob.Public)) {
		t.Fatalf("round trip changed the blob: %+v", got)
	}
}

func TestParseKeyBlobRejects(t *testing.T) {
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"no pem", []byte("hello"), "PEM block"},
		{"other pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{0x30, 0}}), "PEM block"},
		{"bad der", pem.EncodeToMemory(&pem.Block{Type: pemType, Bytes: []byte{0x30, 0x03, 1}}), "decode key blob"},
		{"bound to PCR 16", pcrBoundBlob(t, 7, 16), "PCR 16 is the debug PCR"},
		{"bound to PCR 21", pcrBoundBlob(t, 21), "locality 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseKeyBlob(tt.data)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ParseKeyBlob = %v, want error containing %q", err, tt.want)
			}
		})
	}
}

// pcrBoundBlob is a PCR-bound blob over pcrs, made without ParsePCRs (as
// an older version could have).
func pcrBoundBlob(t *testing.T, pcrs ...int) []byte {
	t.Helper()
	digest := sha256.Sum256([]byte("pcrs"))
	policy, err := PCRAuthPolicy(pcrs, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	blob := &KeyBlob{Public: tpm2.New2B(KeyTemplate(tpm2.TPMECCNistP256, policy, false)), Private: tpm2.TPM2BPrivate{Buffer: []byte{1}}, PCRs: pcrs, PCRDigest: digest[:]}
	data, err := blob.MarshalPEM("test")
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func FuzzParseKeyBlob(f *testing.F) {
	digest := sha256.Sum256(nil)
	policy, _ := PCRAuthPolicy([]int{7}, digest[:])
	blob := &KeyBlob{Public: tpm2.New2B(KeyTemplate(tpm2.TPMECCNistP256, policy, false)), Private: tpm2.TPM2BPrivate{Buffer: []byte{1}}, PCRs: []int{7}, PCRDigest: digest[:]}
	data, _ := blob.MarshalPEM("")
	block, _ := pem.Decode(data)
	f.Add(block.Bytes)
	f.Fuzz(func(t *testing.T, der []byte) {
		// Must not panic on any input.
		ParseKeyBlob(pem.EncodeToMemory(&pem.Block{Type: pemType, Bytes: der})) //nolint:errcheck
	})
}
