//go:build !unix

package pgserver

import (
	"context"
	"errors"
)

func startCluster(context.Context, string) (*Server, error) {
	return nil, errors.New("throw-away clusters need a Unix system")
}
