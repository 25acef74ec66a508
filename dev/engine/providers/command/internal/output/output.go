// Package output captures a command's stdout and stderr the way pulumi-command v1.2.1 does:
// each stream kept on its own, both interleaved for the error message, and the streams that
// `logging` selects sent to the engine line by line as info status messages.
package output

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"

	p "github.com/pulumi/pulumi-go-provider"
)

// The variables that carry the previous run's outputs (addPreviousOutputInEnv).
const (
	PreviousStdout = "PULUMI_COMMAND_STDOUT"
	PreviousStderr = "PULUMI_COMMAND_STDERR"
)

// Capture holds one run's streams.
type Capture struct {
	stdout, stderr bytes.Buffer
	mu             sync.Mutex
	both           bytes.Buffer // stdout and stderr as they came, for the error message
	logW           *io.PipeWriter
	done           chan struct{}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// Start returns the writers for the process's stdout and stderr; logOut/logErr say which of
// them are also logged. Wait must be called once the process has ended.
func Start(ctx context.Context, logOut, logErr bool) (c *Capture, stdout, stderr io.Writer) {
	c = &Capture{done: make(chan struct{})}
	r, w := io.Pipe()
	c.logW = w
	logged := lockedWriter{&c.mu, w}
	both := lockedWriter{&c.mu, &c.both}
	outs := []io.Writer{&c.stdout, both}
	if logOut {
		outs = append(outs, logged)
	}
	errs := []io.Writer{&c.stderr, both}
	if logErr {
		errs = append(errs, logged)
	}
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			p.GetLogger(ctx).InfoStatus(sc.Text())
		}
		_, _ = io.Copy(io.Discard, r) // a line past the scanner's limit: keep the writers unblocked
	}()
	return c, io.MultiWriter(outs...), io.MultiWriter(errs...)
}

// Wait flushes the log stream. A failed run's error reads as pulumi-command's does: the
// process's error (its exit status), the command, then everything it printed.
func (c *Capture) Wait(runErr error, command string) (stdout, stderr string, err error) {
	_ = c.logW.Close()
	<-c.done
	if runErr != nil {
		return "", "", fmt.Errorf("%w: running %q:\n%s", runErr, command, c.both.String())
	}
	return strings.TrimSuffix(c.stdout.String(), "\n"), strings.TrimSuffix(c.stderr.String(), "\n"), nil
}

// LogValues are the `logging` enum's values (local.Logging and remote.Logging, one schema type
// each, as in pulumi-command); unset logs both streams.
var LogValues = [][2]string{
	{"stdout", "Log stdout only."},
	{"stderr", "Log stderr only."},
	{"stdoutAndStderr", "Log both."},
	{"none", "Log neither."},
}

// Logs says whether a stream is logged under a `logging` value (nil: unset).
func Logs(logging *string, stream string) bool {
	return logging == nil || *logging == stream || *logging == "stdoutAndStderr"
}
