// Package local is command:local:Command, with pulumi-command v1.2.1's inputs, outputs and
// behaviour: the command runs under /bin/sh -c (or `interpreter`) in `dir` (else the provider's
// working directory) with the provider's environment plus `environment`; nothing runs in a
// preview; an update runs `update`, else `create`; a delete runs `delete` with the state's inputs.
package local

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"strings"

	"github.com/gobwas/glob"
	"github.com/pulumi/pulumi-go-provider/infer"
	"github.com/pulumi/pulumi-go-provider/infer/types"
	"github.com/pulumi/pulumi/sdk/v3/go/common/resource"

	"twinspark.local/engine-providers/command/common"
	"twinspark.local/engine-providers/command/internal/output"
)

type Command struct{}

func (c *Command) Annotate(a infer.Annotator) {
	a.Describe(&c, "A command run on the machine that runs Pulumi (a stand-in for pulumi-command v1.2.1's).")
}

type BaseInputs struct {
	Stdin                  *string            `pulumi:"stdin,optional"`
	Logging                *Logging           `pulumi:"logging,optional"`
	Interpreter            *[]string          `pulumi:"interpreter,optional"`
	Dir                    *string            `pulumi:"dir,optional"`
	Environment            *map[string]string `pulumi:"environment,optional"`
	AssetPaths             *[]string          `pulumi:"assetPaths,optional"`
	ArchivePaths           *[]string          `pulumi:"archivePaths,optional"`
	AddPreviousOutputInEnv *bool              `pulumi:"addPreviousOutputInEnv,optional"`
}

func (c *BaseInputs) Annotate(a infer.Annotator) {
	a.Describe(&c.Stdin, "Written to the command's standard input.")
	a.Describe(&c.Logging, "Which of stdout and stderr are logged; both when unset.")
	a.Describe(&c.Interpreter, "The program and arguments that run the command; [\"/bin/sh\", \"-c\"] when unset.")
	a.Describe(&c.Dir, "The directory to run in.")
	a.Describe(&c.Environment, "Variables added to the command's environment.")
	a.Describe(&c.AssetPaths, "Globs of files returned as `assets` after the command.")
	a.Describe(&c.ArchivePaths, "Globs of files returned as one `archive` after the command.")
	a.Describe(&c.AddPreviousOutputInEnv, "Set PULUMI_COMMAND_STDOUT/STDERR to the previous run's outputs; default true.")
}

type BaseOutputs struct {
	Stdout  string                            `pulumi:"stdout"`
	Stderr  string                            `pulumi:"stderr"`
	Assets  *map[string]*types.AssetOrArchive `pulumi:"assets,optional"`
	Archive *resource.Archive                 `pulumi:"archive,optional"`
}

func (c *BaseOutputs) Annotate(a infer.Annotator) {
	a.Describe(&c.Stdout, "The command's standard output, less one trailing newline.")
	a.Describe(&c.Stderr, "The command's standard error, less one trailing newline.")
	a.Describe(&c.Assets, "The files `assetPaths` matched, by path relative to `dir`.")
	a.Describe(&c.Archive, "The files `archivePaths` matched, as one archive.")
}

type CommandInputs struct {
	common.ResourceInputs
	BaseInputs
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
	err = run(ctx, *req.Inputs.Create, state.BaseInputs, &state.BaseOutputs)
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
	err := run(ctx, *cmd, state.BaseInputs, &state.BaseOutputs)
	return infer.UpdateResponse[CommandOutputs]{Output: state}, err
}

func (*Command) Delete(ctx context.Context, req infer.DeleteRequest[CommandOutputs]) (infer.DeleteResponse, error) {
	s := req.State
	if s.Delete == nil {
		return infer.DeleteResponse{}, nil
	}
	return infer.DeleteResponse{}, run(ctx, *s.Delete, s.BaseInputs, &s.BaseOutputs)
}

// run runs one command; out carries the previous outputs in and the new ones back.
func run(ctx context.Context, command string, in BaseInputs, out *BaseOutputs) error {
	argv := []string{"/bin/sh", "-c"}
	if in.Interpreter != nil && len(*in.Interpreter) > 0 {
		argv = append([]string{}, *in.Interpreter...)
	}
	argv = append(argv, command)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...) //nolint:gosec // running commands is the point
	if in.Dir != nil {
		cmd.Dir = *in.Dir
	} else {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		cmd.Dir = wd
	}
	cmd.Env = os.Environ()
	if in.Environment != nil {
		for k, v := range *in.Environment {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	if in.AddPreviousOutputInEnv == nil || *in.AddPreviousOutputInEnv {
		if out.Stdout != "" {
			cmd.Env = append(cmd.Env, output.PreviousStdout+"="+out.Stdout)
		}
		if out.Stderr != "" {
			cmd.Env = append(cmd.Env, output.PreviousStderr+"="+out.Stderr)
		}
	}
	if in.Stdin != nil && *in.Stdin != "" {
		cmd.Stdin = strings.NewReader(*in.Stdin)
	}
	logOut, logErr := in.Logging.streams()
	capture, stdout, stderr := output.Start(ctx, logOut, logErr)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	stdoutText, stderrText, err := capture.Wait(cmd.Run(), command)
	if err != nil {
		return err
	}
	if in.AssetPaths != nil {
		assets, err := globAssets(cmd.Dir, *in.AssetPaths)
		if err != nil {
			return err
		}
		out.Assets = &assets
	}
	if in.ArchivePaths != nil {
		assets, err := globAssets(cmd.Dir, *in.ArchivePaths)
		if err != nil {
			return err
		}
		members := map[string]any{}
		for p, a := range assets {
			members[p] = a.Asset
		}
		if out.Archive, err = resource.NewAssetArchive(members); err != nil {
			return err
		}
	}
	out.Stdout, out.Stderr = stdoutText, stderrText
	return nil
}

// globAssets: files (not directories) under dir matched by the globs in order, "!" excluding.
func globAssets(dir string, globs []string) (map[string]*types.AssetOrArchive, error) {
	type rule struct {
		g       glob.Glob
		exclude bool
	}
	rules := make([]rule, 0, len(globs))
	for _, g := range globs {
		compiled, err := glob.Compile(strings.TrimPrefix(g, "!"), '/')
		if err != nil {
			return nil, err
		}
		rules = append(rules, rule{compiled, strings.HasPrefix(g, "!")})
	}
	found := map[string]*types.AssetOrArchive{}
	err := fs.WalkDir(os.DirFS(dir), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		for _, r := range rules {
			if !r.g.Match(p) {
				continue
			}
			if r.exclude {
				delete(found, p)
				continue
			}
			asset, err := resource.NewPathAsset(path.Join(dir, p))
			if err != nil {
				return err
			}
			found[p] = &types.AssetOrArchive{Asset: asset}
		}
		return nil
	})
	return found, err
}
