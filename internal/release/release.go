// Package release gives tests the files of an earlier release of this
// module, from the git history of the checkout they run in, so that they
// can migrate a database as that release did and run its processes beside
// this release's.
package release

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Previous is the commit of the release before tokenguard's objects were
// named tokenguard_* (migration 000012): its tables are connections,
// tokens, api_keys, providers...
const Previous = "e4544f7782c49a6bf18ea64c757c7bf6e8e3c33d"

// Extract writes the files under paths (all of them without paths) as
// they are at commit into dir. It needs the checkout's git history (a
// shallow clone lacks it).
func Extract(commit, dir string, paths ...string) error {
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return fmt.Errorf("git rev-parse --show-toplevel: %w", err)
	}
	cmd := exec.Command("git", append([]string{"archive", "--format=tar", commit}, paths...)...)
	cmd.Dir = strings.TrimSpace(string(top))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("git archive %s: %w: %s", commit, err, strings.TrimSpace(stderr.String()))
	}
	tr := tar.NewReader(bytes.NewReader(out))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("git archive %s: %w", commit, err)
		}
		name := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(name, filepath.Clean(dir)+string(os.PathSeparator)) {
			return fmt.Errorf("git archive %s: %q is outside the directory", commit, h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(name, 0o755)
		case tar.TypeReg:
			err = writeFile(name, tr, os.FileMode(h.Mode)&0o777)
		}
		if err != nil {
			return err
		}
	}
}

func writeFile(name string, r io.Reader, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
