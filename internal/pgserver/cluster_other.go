//go:build !unix

package pgserver

import (
	"context"
	"errors"
)

func startCluster(context.Context, string) (*Server, error) {
	return nil, errors.New("throw-away clusters need a Unix system")
}

// StartStandby needs a Unix system.
func StartStandby(context.Context) (*Server, error) {
	return nil, errors.New("throw-away clusters need a Unix system")
}
