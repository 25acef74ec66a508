// Package remote is command:remote:Command, with pulumi-command v1.2.1's inputs, outputs and
// behaviour: the command runs in one SSH session (`session.Run`, so the server's shell runs
// it); `environment` is sent with SSH "env" requests, which the server may refuse (sshd's
// AcceptEnv) and a refusal fails the run; PULUMI_COMMAND_STDOUT/STDERR go the same way but a
// refusal only warns. Nothing runs in a preview; an update runs `update`, else `create`; a
// delete runs `delete` with the connection and inputs stored in state.
package remote

import (
	"context"
	"fmt"
	"strings"

	p "github.com/pulumi/pulumi-go-provider"
	"github.com/pulumi/pulumi-go-provider/infer"
	"github.com/pulumi/pulumi/sdk/v3/go/common/resource"

	"twinspark.local/engine-providers/command/common"
	"twinspark.local/engine-providers/command/internal/output"
)

type Command struct{}

func (c *Command) Annotate(a infer.Annotator) {
	a.Describe(&c, "A command run on a host over SSH (a stand-in for pulumi-command v1.2.1's).")
}

type CommandInputs struct {
	common.ResourceInputs
	Stdin                  *string           `pulumi:"stdin,optional"`
	Logging                *Logging          `pulumi:"logging,optional"`
	Connection             *Connection       `pulumi:"connection"                      provider:"secret"`
	Environment            map[string]string `pulumi:"environment,optional"`
	AddPreviousOutputInEnv *bool             `pulumi:"addPreviousOutputInEnv,optional"`
}

func (c *CommandInputs) Annotate(a infer.Annotator) {
	a.Describe(&c.Stdin, "Written to the command's standard input.")
	a.Describe(&c.Logging, "Which of stdout and stderr are logged; both when unset.")
	a.Describe(&c.Connection, "How to reach the host.")
	a.Describe(&c.Environment, "Variables sent as SSH env requests: the server must AcceptEnv them.")
	a.Describe(&c.AddPreviousOutputInEnv, "Send PULUMI_COMMAND_STDOUT/STDERR from the previous run; default true.")
}

type BaseOutputs struct {
	Stdout string `pulumi:"stdout"`
	Stderr string `pulumi:"stderr"`
}

func (c *BaseOutputs) Annotate(a infer.Annotator) {
	a.Describe(&c.Stdout, "The command's standard output, less one trailing newline.")
	a.Describe(&c.Stderr, "The command's standard error, less one trailing newline.")
}

type CommandOutputs struct {
	CommandInputs
	BaseOutputs
}

var (
	_ = (infer.CustomResource[CommandInputs, CommandOutputs])((*Command)(nil))
	_ = (infer.CustomUpdate[CommandInputs, CommandOutputs])((*Command)(nil))
	_ = (infer.CustomDelete[CommandOutputs])((*Command)(nil))
)

func (*Command) Create(ctx context.Context, req infer.CreateRequest[CommandInputs]) (infer.CreateResponse[CommandOutputs], error) {
	state := CommandOutputs{CommandInputs: req.Inputs}
	id, err := resource.NewUniqueHex(req.Name, 8, 0)
	if err != nil || req.DryRun || req.Inputs.Create == nil {
		return infer.CreateResponse[CommandOutputs]{ID: id, Output: state}, err
	}
	err = state.run(ctx, *req.Inputs.Create)
	return infer.CreateResponse[CommandOutputs]{ID: id, Output: state}, err
}

func (*Command) Update(ctx context.Context, req infer.UpdateRequest[CommandInputs, CommandOutputs]) (infer.UpdateResponse[CommandOutputs], error) {
	state := CommandOutputs{CommandInputs: req.Inputs, BaseOutputs: req.State.BaseOutputs}
	cmd := req.Inputs.Update
	if cmd == nil {
		cmd = req.Inputs.Create
	}
	if req.DryRun || cmd == nil {
		return infer.UpdateResponse[CommandOutputs]{Output: state}, nil
	}
	err := state.run(ctx, *cmd)
	return infer.UpdateResponse[CommandOutputs]{Output: state}, err
}

func (*Command) Delete(ctx context.Context, req infer.DeleteRequest[CommandOutputs]) (infer.DeleteResponse, error) {
	s := req.State
	if s.Delete == nil {
		return infer.DeleteResponse{}, nil
	}
	return infer.DeleteResponse{}, s.run(ctx, *s.Delete)
}

// run runs one command in a new SSH session; on success the outputs replace c's.
func (c *CommandOutputs) run(ctx context.Context, command string) error {
	client, err := c.Connection.Dial(ctx)
	if err != nil {
		return err
	}
	// Left open to the process's end, as the real provider leaves it (pulumi-command v1.2.1,
	// provider/pkg/provider/remote/commandOutputs.go:31-40): a node's sshd sees one connection per
	// command of an `up` at once, and the simulator's stock sshd must take it.
	session, err := client.NewSession()
	if err != nil {
		return err
	}
	defer session.Close()

	for k, v := range c.Environment {
		if err := session.Setenv(k, v); err != nil {
			p.GetLogger(ctx).Error(setenvHint(k))
			return fmt.Errorf("could not set environment variable %q: %w", k, err)
		}
	}
	if c.AddPreviousOutputInEnv == nil || *c.AddPreviousOutputInEnv {
		for _, kv := range [][2]string{{output.PreviousStdout, c.Stdout}, {output.PreviousStderr, c.Stderr}} {
			if kv[1] != "" && session.Setenv(kv[0], kv[1]) != nil {
				p.GetLogger(ctx).Warning(setenvHint(kv[0]))
			}
		}
	}
	if c.Stdin != nil && *c.Stdin != "" {
		session.Stdin = strings.NewReader(*c.Stdin)
	}
	logOut, logErr := c.Logging.streams()
	capture, stdout, stderr := output.Start(ctx, logOut, logErr)
	session.Stdout, session.Stderr = stdout, stderr
	stdoutText, stderrText, err := capture.Wait(session.Run(command), command)
	if err != nil {
		return err
	}
	c.BaseOutputs = BaseOutputs{Stdout: stdoutText, Stderr: stderrText}
	return nil
}

func setenvHint(key string) string {
	return fmt.Sprintf("Unable to set '%s'. This only works if your SSH server is configured to accept "+
		"these variables via AcceptEnv. Alternatively, if a Bash-like shell runs the command on the remote "+
		"host, you could prefix the command itself with the variables in the form 'VAR=value command'", key)
}
