package tpm

import (
	"errors"
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/signer"
)

func TestConnections(t *testing.T) {
	t.Parallel()
	tests := []struct {
		uri       string
		want      int
		canonical string // "" = the URI itself
		wantErr   string
	}{
		{uri: "tpm:path=/k;device=/dev/tpmrm0", want: 2},
		{uri: "tpm:path=/k;device=/dev/tpmrm0;connections=1", want: 1},
		{uri: "tpm:path=/k;device=/dev/tpmrm0;connections=2", want: 2, canonical: "tpm:path=/k;device=/dev/tpmrm0"},
		{uri: "tpm:path=/k", want: 1},
		{uri: "tpm:path=/k;device=/dev/tpm0", want: 1},
		{uri: "tpm:path=/k;socket=/run/relay.sock;connections=2", want: 2},
		{uri: "tpm:connections=2;path=/k;swtpm=127.0.0.1:2321", want: 2, canonical: "tpm:path=/k;swtpm=127.0.0.1:2321;connections=2"},
		{uri: "tpm:path=/k;device=/dev/tpm0;connections=2", wantErr: "serves one"},
		{uri: "tpm:path=/k;connections=2", wantErr: "serves one"},
		{uri: "tpm:path=/k;socket=/s;connections=3", wantErr: "want 1 or 2"},
		{uri: "tpm:path=/k;socket=/s;connections=0", wantErr: "want 1 or 2"},
		{uri: "tpm:path=/k;socket=/s;connections=02", wantErr: "want 1 or 2"},
		{uri: "tpm:path=/k;socket=/s;connections=2;connections=2", wantErr: "given twice"},
	}
	for _, tt := range tests {
		t.Run(tt.uri, func(t *testing.T) {
			t.Parallel()
			got, err := ParseURI(tt.uri)
			if tt.wantErr != "" {
				if !errors.Is(err, signer.ErrInvalidURI) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseURI(%q) = %v; want ErrInvalidURI containing %q", tt.uri, err, tt.wantErr)
				}
				return
			}
			if err != nil || got.Connections != tt.want {
				t.Fatalf("ParseURI(%q) = %d connections, %v; want %d", tt.uri, got.Connections, err, tt.want)
			}
			want := tt.canonical
			if want == "" {
				want = tt.uri
			}
			if got.String() != want {
				t.Errorf("canonical form %q, want %q", got.String(), want)
			}
		})
	}
}
