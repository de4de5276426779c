//go:build !linux

package atomicfile

import (
	"errors"
	"os"
)

var errNoUnnamed = errors.New("unnamed files are not supported on this system")

func openUnnamed(string, os.FileMode) (*os.File, error) { return nil, errNoUnnamed }

func linkUnnamed(*os.File, string) error { return errNoUnnamed }

func linkUnnamedTemp(*os.File, string) (string, error) { return "", errNoUnnamed }
