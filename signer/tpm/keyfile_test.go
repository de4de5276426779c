package tpm

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
	policy, err := computeAuthPolicy([]int{7, 11}, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	blob := &keyBlob{
		public:    tpm2.New2B(keyTemplate(tpm2.TPMECCNistP256, policy, false)),
		private:   tpm2.TPM2BPrivate{Buffer: []byte{1, 2, 3, 4}},
		pcrs:      []int{7, 11},
		pcrDigest: digest[:],
	}
	data, err := blob.marshalPEM("test")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(data, []byte("-----BEGIN TSS2 PRIVATE KEY-----")) {
		t.Fatalf("not a TSS2 PRIVATE KEY PEM: %s", data)
	}
	got, err := parseKeyBlob(data)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.pcrs, blob.pcrs) || !bytes.Equal(got.pcrDigest, blob.pcrDigest) ||
		!bytes.Equal(got.private.Buffer, blob.private.Buffer) ||
		!bytes.Equal(tpm2.Marshal(got.public), tpm2.Marshal(blob.public)) {
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
			_, err := parseKeyBlob(tt.data)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("parseKeyBlob = %v, want error containing %q", err, tt.want)
			}
		})
	}
}

// pcrBoundBlob is a PCR-bound blob over pcrs, made without ParsePCRs (as
// an older version could have).
func pcrBoundBlob(t *testing.T, pcrs ...int) []byte {
	t.Helper()
	digest := sha256.Sum256([]byte("pcrs"))
	policy, err := computeAuthPolicy(pcrs, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	blob := &keyBlob{public: tpm2.New2B(keyTemplate(tpm2.TPMECCNistP256, policy, false)), private: tpm2.TPM2BPrivate{Buffer: []byte{1}}, pcrs: pcrs, pcrDigest: digest[:]}
	data, err := blob.marshalPEM("test")
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func FuzzParseKeyBlob(f *testing.F) {
	digest := sha256.Sum256(nil)
	policy, _ := computeAuthPolicy([]int{7}, digest[:])
	blob := &keyBlob{public: tpm2.New2B(keyTemplate(tpm2.TPMECCNistP256, policy, false)), private: tpm2.TPM2BPrivate{Buffer: []byte{1}}, pcrs: []int{7}, pcrDigest: digest[:]}
	data, _ := blob.marshalPEM("")
	block, _ := pem.Decode(data)
	f.Add(block.Bytes)
	f.Fuzz(func(t *testing.T, der []byte) {
		// Must not panic on any input.
		parseKeyBlob(pem.EncodeToMemory(&pem.Block{Type: pemType, Bytes: der})) //nolint:errcheck
	})
}
