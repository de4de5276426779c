package doctor

import (
	"strings"

	"google.golang.org/grpc/status"

	"github.com/steward-trustd/steward-trustd/internal/authz"
)

// rpcErrHint is rpcHint, first recognizing the per-machine authorizer's
// answers: the doctor's request takes the whole path a worker's does,
// authorizer included.
func rpcErrHint(err error) string {
	msg := status.Convert(err).Message()
	switch {
	case strings.HasPrefix(msg, authz.ClientDeniedPrefix):
		return "the per-machine authorizer (TRUSTD_AUTHORIZER) refused this request: run doctor from a machine of the inventory (its own address, its own names), or read the trustd audit line (authorizer, authorizer_reason) — from any other host a refusal here is the authorizer working"
	case msg == authz.ClientUnavailable:
		return "the per-machine authorizer does not answer: check steward-trustd-authorizer (its log, /healthz, the socket's owner and mode, its Kubernetes credentials) or the webhook's URL and mTLS files; TRUSTD_AUTHORIZER_MODE=observe issues meanwhile"
	}
	return rpcHint(status.Code(err))
}
