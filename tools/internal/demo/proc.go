package demo

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Proc is an app started as its own OS process.
type Proc struct {
	Name string
	cmd  *exec.Cmd
	done chan struct{}

	mu       sync.Mutex
	waitErr  error
	exitedAt time.Time
}

// ProcSpec describes a process to start.
type ProcSpec struct {
	Name   string
	Path   string
	Args   []string
	Env    []string  // the whole environment
	Stdin  io.Reader // nil: /dev/null
	Stdout io.Writer // nil: discarded
	Stderr io.Writer // nil: discarded
}

// Start starts the process in a process group of its own, so a Ctrl-C at
// the terminal reaches only the driver, which then stops its children in
// order. On Linux a child also gets SIGTERM if the driver dies.
func Start(s ProcSpec) (*Proc, error) {
	cmd := exec.Command(s.Path, s.Args...)
	cmd.Env = s.Env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = s.Stdin, s.Stdout, s.Stderr
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", s.Name, err)
	}
	p := &Proc{Name: s.Name, cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.waitErr, p.exitedAt = err, time.Now()
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// ExitCode is the exit status once exited (-1 if killed by a signal or
// still running).
func (p *Proc) ExitCode() int {
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	default:
		return -1
	}
}

// Stopped is the result of Stop.
type Stopped struct {
	ExitCode int           `json:"exit_code"`
	Took     time.Duration `json:"-"`
	Seconds  float64       `json:"seconds"`
	Killed   bool          `json:"killed"` // did not exit in time and was killed
}

// Stop sends SIGTERM and waits up to timeout for the exit, then kills.
func (p *Proc) Stop(timeout time.Duration) Stopped {
	start := time.Now()
	select {
	case <-p.done:
		return Stopped{ExitCode: p.ExitCode()}
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		p.mu.Lock()
		took := p.exitedAt.Sub(start)
		p.mu.Unlock()
		return Stopped{ExitCode: p.ExitCode(), Took: took, Seconds: took.Seconds()}
	case <-t.C:
		p.Kill()
		return Stopped{ExitCode: -1, Took: time.Since(start), Seconds: time.Since(start).Seconds(), Killed: true}
	}
}

// Kill sends SIGKILL and waits for the exit.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Wait waits for the exit and returns the exit code.
func (p *Proc) Wait() int {
	<-p.done
	return p.ExitCode()
}

// Err is the process's wait error once it exited.
func (p *Proc) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ee *exec.ExitError
	if errors.As(p.waitErr, &ee) {
		return fmt.Errorf("%s: %s", p.Name, ee.ProcessState)
	}
	return p.waitErr
}

// Env returns os.Environ() without the given keys, plus kv ("K=V").
func Env(kv ...string) []string {
	set := map[string]bool{}
	for _, e := range kv {
		for i := range len(e) {
			if e[i] == '=' {
				set[e[:i]] = true
				break
			}
		}
	}
	var out []string
	for _, e := range os.Environ() {
		k := e
		for i := range len(e) {
			if e[i] == '=' {
				k = e[:i]
				break
			}
		}
		if !set[k] {
			out = append(out, e)
		}
	}
	return append(out, kv...)
}
