package server

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/steward-trustd/steward-trustd/internal/authz"
	"github.com/steward-trustd/steward-trustd/internal/inventory"
)

// FileDecider is the built-in authorizer: the rules of internal/authz on
// a hot-reloaded inventory file, with its pins in a state file.
type FileDecider struct {
	engine *authz.Engine
	source *inventory.FileSource
}

// NewFileDecider loads the inventory at path (it must load: a daemon
// never starts without its inventory) and the state at statePath.
func NewFileDecider(path, statePath string, log *slog.Logger, onReload func(error)) (*FileDecider, error) {
	if statePath == "" {
		return nil, fmt.Errorf("authorizer file:%s needs a state file for its pins (TRUSTD_AUTHORIZER_STATE, on a persistent writable volume)", path)
	}
	st, err := authz.OpenState(statePath)
	if err != nil {
		return nil, err
	}
	e := authz.NewEngine(authz.Rules{}, st, nil)
	src := &inventory.FileSource{Path: path, Log: log, OnReload: onReload}
	if err := src.Load(inventory.Install(e, authz.Rules{})); err != nil {
		return nil, err
	}
	return &FileDecider{engine: e, source: src}, nil
}

// Run reloads the inventory until ctx ends.
func (f *FileDecider) Run(ctx context.Context) { f.source.Run(ctx) }

// Describe implements Decider.
func (f *FileDecider) Describe() string { return "file:" + f.source.Path }

// Decide implements Decider.
func (f *FileDecider) Decide(_ context.Context, req *authz.Request) (*authz.Response, error) {
	return f.engine.Decide(req)
}

// AuthorizerTarget is a parsed TRUSTD_AUTHORIZER value.
type AuthorizerTarget struct {
	// Kind is "none", "file" or "webhook".
	Kind string
	// Path is the inventory file (file) or the URL (webhook).
	Path string
}

// ParseAuthorizerTarget reads none | file:/path | https://… | unix:///….
func ParseAuthorizerTarget(s string) (AuthorizerTarget, error) {
	switch {
	case s == "" || s == "none":
		return AuthorizerTarget{Kind: "none"}, nil
	case strings.HasPrefix(s, "file:"):
		p := strings.TrimPrefix(s, "file:")
		if !strings.HasPrefix(p, "/") {
			return AuthorizerTarget{}, fmt.Errorf("authorizer %q: want file:/absolute/path/inventory.json", s)
		}
		return AuthorizerTarget{Kind: "file", Path: p}, nil
	case strings.HasPrefix(s, "https://"), strings.HasPrefix(s, "unix:///"):
		return AuthorizerTarget{Kind: "webhook", Path: s}, nil
	}
	return AuthorizerTarget{}, fmt.Errorf("authorizer %q: want none, file:/path/inventory.json, https://host/… or unix:///path.sock (plain http is refused: decisions must not be forged on the wire)", s)
}
