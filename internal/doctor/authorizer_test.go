package doctor

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/steward-trustd/steward-trustd/internal/authz"
)

func TestRPCErrHint(t *testing.T) {
	cases := []struct {
		err  error
		want string
	}{
		{status.Error(codes.PermissionDenied, authz.ClientDeniedPrefix+" (denied_unknown_machine); the trustd audit log says why"), "per-machine authorizer (TRUSTD_AUTHORIZER) refused"},
		{status.Error(codes.Unavailable, authz.ClientUnavailable), "authorizer does not answer"},
		{status.Error(codes.PermissionDenied, "IP SAN 10.0.0.1 is outside the allowed ranges"), "TRUSTD_ALLOWED_SAN_CIDRS"},
		{status.Error(codes.Unavailable, "certificate signing is temporarily unavailable; retry later"), "signing device"},
	}
	for _, c := range cases {
		if got := rpcErrHint(c.err); !strings.Contains(got, c.want) {
			t.Errorf("%v: hint %q, want it to mention %q", c.err, got, c.want)
		}
	}
}
