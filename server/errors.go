package server

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// authError is a missing or wrong token: Unauthenticated.
type authError struct{ reason string }

func (e *authError) Error() string { return e.reason }

// limitError is a request shed under load: ResourceExhausted.
type limitError struct{ reason string }

func (e *limitError) Error() string { return e.reason }

// signError is a failure of the signing device or of issuance around it:
// Unavailable, since workers retry and the device may come back.
type signError struct{ err error }

func (e *signError) Error() string { return "sign: " + e.err.Error() }
func (e *signError) Unwrap() error { return e.err }

// toStatus is the one place where errors become gRPC statuses. The client
// gets a clean message; the cause stays in the server's log.
func toStatus(err error) error {
	var (
		reqErr    *requestError
		polErr    *policyError
		authErr   *authError
		limErr    *limitError
		signerErr *signError
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &authErr):
		return status.Error(codes.Unauthenticated, "missing or invalid token")
	case errors.As(err, &reqErr):
		return status.Error(codes.InvalidArgument, reqErr.msg)
	case errors.As(err, &polErr):
		return status.Error(codes.PermissionDenied, polErr.msg)
	case errors.As(err, &limErr):
		return status.Error(codes.ResourceExhausted, limErr.reason)
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, "deadline exceeded")
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "request canceled")
	case errors.As(err, &signerErr):
		return status.Error(codes.Unavailable, "certificate signing is temporarily unavailable; retry later")
	default:
		return status.Error(codes.Internal, "internal error")
	}
}

// outcome names a decision for the audit log and metrics.
func outcome(err error) string {
	var (
		reqErr    *requestError
		polErr    *policyError
		authErr   *authError
		limErr    *limitError
		signerErr *signError
	)
	switch {
	case err == nil:
		return "issued"
	case errors.As(err, &authErr):
		return "denied_auth"
	case errors.As(err, &reqErr):
		return "denied_bad_csr"
	case errors.As(err, &polErr):
		return "denied_policy"
	case errors.As(err, &limErr):
		return "denied_rate_limit"
	case errors.As(err, &signerErr):
		return "signer_error"
	default:
		return "error"
	}
}
