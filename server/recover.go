package server

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"

	"google.golang.org/grpc"
)

// recoverUnary turns a panic in a handler into Internal and one log line:
// a bug met by one request must not take the daemon, and every worker's
// next request, down with it.
func recoverUnary(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if p := recover(); p != nil {
				resp, err = nil, panicked(ctx, log, info.FullMethod, p)
			}
		}()
		return handler(ctx, req)
	}
}

// recoverStream is recoverUnary for streaming RPCs (gRPC health Watch).
func recoverStream(log *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = panicked(ss.Context(), log, info.FullMethod, p)
			}
		}()
		return handler(srv, ss)
	}
}

func panicked(ctx context.Context, log *slog.Logger, method string, p any) error {
	log.ErrorContext(ctx, "panic in request handler; the request got Internal, the daemon keeps serving (please report this)",
		"method", method, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	return toStatus(fmt.Errorf("panic in %s", method))
}
