package server

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// authError is a missing or wrong token: Unauthenticated.
type authError struct{ reason string }

func (e *authError) Error() string { return e.reason }

// limitError is a request shed under load: ResourceExhausted.
type limitError struct{ reason string }

func (e *limitError) Error() string { return e.reason }

// oversizeError is a request gRPC refused before the handler because its
// message exceeded the size limit: ResourceExhausted (gRPC's own answer).
type oversizeError struct {
	limit int
	also  string // what else was wrong (a wrong token), for the audit line
}

func (e *oversizeError) Error() string {
	msg := fmt.Sprintf("request message larger than the %d-byte limit", e.limit)
	if e.also != "" {
		msg += "; also: " + e.also
	}
	return msg
}

// signError is a failure of the signing device or of issuance around it:
// Unavailable, since workers retry and the device may come back.
type signError struct{ err error }

func (e *signError) Error() string { return "sign: " + e.err.Error() }
func (e *signError) Unwrap() error { return e.err }

// class is how the server treats an error: the gRPC code, the message
// the client gets, and the outcome recorded in the audit log and metrics.
type class struct {
	code    codes.Code
	message string
	outcome string
}

// classify is the one place where errors become gRPC statuses. The client
// gets a clean message; the cause stays in the server's log.
func classify(err error) class {
	var (
		reqErr    *requestError
		polErr    *policyError
		authErr   *authError
		limErr    *limitError
		satErr    *saturatedError
		signerErr *signError
		sizeErr   *oversizeError
		lintErr   *lintError
		logErr    *logError
	)
	if c, ok := classifyAuthz(err); ok {
		return c
	}
	switch {
	case err == nil:
		return class{codes.OK, "", "issued"}
	case errors.As(err, &authErr):
		return class{codes.Unauthenticated, "missing or invalid token", "denied_auth"}
	case errors.As(err, &reqErr):
		return class{codes.InvalidArgument, reqErr.msg, "denied_bad_csr"}
	case errors.As(err, &lintErr):
		return class{codes.PermissionDenied, "the certificate this request asks for fails the pre-issuance lint(s) " + strings.Join(lintErr.err.Names(), ",") + "; the CA did not sign it: ask the cluster operator to check the request's names and addresses against the CA's name constraints", "denied_lint"}
	case errors.As(err, &polErr):
		return class{codes.PermissionDenied, polErr.msg, "denied_policy"}
	case errors.As(err, &sizeErr):
		return class{codes.ResourceExhausted, "request too large", "denied_oversized"}
	case errors.As(err, &limErr):
		return class{codes.ResourceExhausted, limErr.reason, "denied_rate_limit"}
	case errors.As(err, &satErr):
		return class{codes.ResourceExhausted, "certificate signer saturated: it cannot serve this request before its deadline; your place in line is kept, retry", "denied_saturated"}
	case errors.Is(err, context.DeadlineExceeded):
		return class{codes.DeadlineExceeded, "deadline exceeded", "error"}
	case errors.Is(err, context.Canceled):
		return class{codes.Canceled, "request canceled", "error"}
	case errors.As(err, &logErr):
		return class{codes.Unavailable, "the issuance log cannot record certificates, so none is issued; retry later", "log_error"}
	case errors.As(err, &signerErr):
		return class{codes.Unavailable, "certificate signing is temporarily unavailable; retry later", "signer_error"}
	default:
		return class{codes.Internal, "internal error", "error"}
	}
}

// toStatus turns err into the status the client sees.
func toStatus(err error) error {
	c := classify(err)
	if c.code == codes.OK {
		return nil
	}
	return status.Error(c.code, c.message)
}

// outcome names a decision for the audit log and metrics.
func outcome(err error) string { return classify(err).outcome }
