// A stand-in for Pulumi's Python language host (pulumi-language-python), written for twinspark.
//
// Pulumi's own host lives in the module github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3,
// which is never tagged and which the Go module proxy reachable here does not serve at any
// version or commit (docs/measurements/engine-build-*.md). This host stands in at exactly that
// seam and nothing more: the engine starts it as it starts the real one (the engine's address as
// the last argument, the port printed on stdout), and it runs the program the way the real one
// does, through sdk/v3's own pieces: python/toolchain resolves the project's virtualenv (pip,
// uv or poetry, as runtime.options says) and sdk/v3's python/cmd/pulumi-language-python-exec,
// beside this binary, runs the program with the Python SDK. The Python SDK then talks to the
// engine's resource monitor itself; that part is all Pulumi's.
//
// Where the real host's behaviour shows to the engine or the user, this one does the same (the real
// source: pulumi v3.259.0, sdk/python/cmd/pulumi-language-python/main.go, cited per method):
// GetRequiredPackages makes the virtualenv if it is missing and names the Pulumi packages installed
// in it, so the engine loads their providers before the program runs; a typechecker (mypy or
// pyright) checks the program first; About names the toolchain and typechecker.
//
// What it leaves out, and the engine copes with: a package version that is a PEP 440 pre-release
// without a version in its pulumi-plugin.json (the real host translates it; the SDKs twinspark
// installs all carry theirs), parameterized packages, debugger attach, code generation, packing or
// linking, Python plugins (RunPlugin).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pulumi/pulumi/sdk/v3/go/common/resource/plugin"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/logging"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/rpcutil"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
	"github.com/pulumi/pulumi/sdk/v3/python/toolchain"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// version is set by the linker to the sdk/v3 version it was built against.
var version = "v0.0.0-dev"

// The exit code with which pulumi-language-python-exec says it has already shown the user an
// error: the engine is told to bail without another message.
const execShowedUserError = 32

type host struct {
	pulumirpc.UnimplementedLanguageRuntimeServer

	exec          string // pulumi-language-python-exec
	engineAddress string
	tracing       string

	mu      sync.Mutex
	running map[*exec.Cmd]struct{}
}

func main() {
	var tracing, root, useExecutor string
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.StringVar(&tracing, "tracing", "", "Zipkin-compatible tracing endpoint, passed to the program")
	flag.StringVar(&root, "root", "", "ignored (the engine sends the root in each request)")
	flag.StringVar(&useExecutor, "use-executor", "", "path of pulumi-language-python-exec")
	flag.Parse()
	if *showVersion {
		fmt.Println(version)
		return
	}
	logging.InitLogging(false, 0, false)

	execPath := useExecutor
	if execPath == "" {
		self, err := os.Executable()
		if err == nil {
			self, err = filepath.EvalSymlinks(self)
		}
		if err != nil {
			fatalf("cannot find my own binary: %v", err)
		}
		execPath = filepath.Join(filepath.Dir(self), "pulumi-language-python-exec")
	}
	if _, err := os.Stat(execPath); err != nil {
		fatalf("pulumi-language-python-exec is not beside the language host: %v", err)
	}

	h := &host{exec: execPath, tracing: tracing, running: map[*exec.Cmd]struct{}{}}
	if args := flag.Args(); len(args) > 0 {
		h.engineAddress = args[len(args)-1]
	}

	handle, err := rpcutil.ServeWithOptions(rpcutil.ServeOptions{
		Init: func(srv *grpc.Server) error {
			pulumirpc.RegisterLanguageRuntimeServer(srv, h)
			return nil
		},
		Options: rpcutil.OpenTracingServerInterceptorOptions(nil),
	})
	if err != nil {
		fatalf("could not start the language host's gRPC server: %v", err)
	}
	fmt.Printf("%d\n", handle.Port)
	if err := <-handle.Done; err != nil {
		fatalf("language host stopped: %v", err)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "pulumi-language-python (twinspark stand-in): "+format+"\n", args...)
	os.Exit(1)
}

// pythonOptions reads runtime.options from Pulumi.yaml as the engine forwards them.
// programToolchain: the program's Python options and the toolchain (pip, uv, poetry) they name.
func programToolchain(info *pulumirpc.ProgramInfo) (toolchain.PythonOptions, toolchain.Toolchain, error) {
	opts, err := pythonOptions(info)
	if err != nil {
		return opts, nil, err
	}
	tc, err := toolchain.ResolveToolchain(opts)
	return opts, tc, err
}

func pythonOptions(info *pulumirpc.ProgramInfo) (toolchain.PythonOptions, error) {
	opts := toolchain.PythonOptions{Root: info.GetRootDirectory(), ProgramDir: info.GetProgramDirectory()}
	raw := info.GetOptions().AsMap()
	if v, ok := raw["virtualenv"]; ok {
		s, ok := v.(string)
		if !ok {
			return opts, errors.New("runtime.options.virtualenv must be a string")
		}
		opts.Virtualenv = s
	}
	switch v := raw["toolchain"]; v {
	case nil, "":
		opts.Toolchain = toolchain.Auto
	case "pip":
		opts.Toolchain = toolchain.Pip
	case "uv":
		opts.Toolchain = toolchain.Uv
	case "poetry":
		opts.Toolchain = toolchain.Poetry
	default:
		return opts, fmt.Errorf("unsupported runtime.options.toolchain %v", v)
	}
	// as the real host's parseOptions (main.go:249-261)
	switch v := raw["typechecker"]; v {
	case nil, "", "none":
		opts.Typechecker = toolchain.TypeCheckerNone
	case "mypy":
		opts.Typechecker = toolchain.TypeCheckerMypy
	case "pyright":
		opts.Typechecker = toolchain.TypeCheckerPyright
	default:
		return opts, fmt.Errorf("unsupported typechecker option: %v", v)
	}
	return opts, nil
}

func (h *host) Handshake(ctx context.Context,
	req *pulumirpc.LanguageHandshakeRequest,
) (*pulumirpc.LanguageHandshakeResponse, error) {
	if req.GetEngineAddress() != "" {
		h.engineAddress = req.GetEngineAddress()
	}
	return &pulumirpc.LanguageHandshakeResponse{}, nil
}

func (h *host) GetPluginInfo(ctx context.Context, _ *emptypb.Empty) (*pulumirpc.PluginInfo, error) {
	return &pulumirpc.PluginInfo{Version: version}, nil
}

// GetRequiredPlugins is superseded by GetRequiredPackages; the real host leaves it unimplemented
// too (main.go:371-375).
func (h *host) GetRequiredPlugins(ctx context.Context,
	req *pulumirpc.GetRequiredPluginsRequest,
) (*pulumirpc.GetRequiredPluginsResponse, error) {
	return nil, status.Errorf(codes.Unimplemented, "method GetRequiredPlugins not implemented")
}

// GetRequiredPackages, as the real host's (main.go:326-369): the virtualenv made if it is missing,
// then one resource package per installed Pulumi package (pulumi-plugin.json with resource: true,
// or a name starting pulumi- without one), named and versioned by its pulumi-plugin.json, else by
// the package's own name and version. pulumi-policy and pulumi-esc-sdk have no plugin (main.go:549).
func (h *host) GetRequiredPackages(ctx context.Context,
	req *pulumirpc.GetRequiredPackagesRequest,
) (*pulumirpc.GetRequiredPackagesResponse, error) {
	opts, tc, err := programToolchain(req.GetInfo())
	if err != nil {
		return nil, err
	}
	if err := tc.EnsureVenv(ctx, opts.ProgramDir, false, true, os.Stdout, os.Stderr); err != nil {
		return nil, err
	}
	installed, err := tc.ListPackages(ctx, true)
	if err != nil {
		return nil, err
	}
	pluginFiles, err := pulumiPluginFiles(ctx, tc, installed)
	if err != nil {
		return nil, err
	}
	packages := []*pulumirpc.PackageDependency{}
	for _, pkg := range installed {
		if dep := packageDependency(pkg, pluginFiles[pkg.Name]); dep != nil {
			packages = append(packages, dep)
		}
	}
	return &pulumirpc.GetRequiredPackagesResponse{Packages: packages}, nil
}

// findPluginFiles prints, as JSON, each named distribution's pulumi-plugin.json (its top-level
// package's folder) read as an object, or null where it has none.
const findPluginFiles = `import importlib.metadata, importlib.util, json, os, sys
found = {}
for name in sys.argv[1:]:
    found[name] = None
    try:
        top = importlib.metadata.distribution(name).metadata["Name"].replace("-", "_")
        spec = importlib.util.find_spec(top)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            path = os.path.join(folder, "pulumi-plugin.json")
            if os.path.isfile(path):
                found[name] = json.load(open(path))
                break
    except Exception:
        pass
print(json.dumps(found))`

// pulumiPluginFiles: each installed package's pulumi-plugin.json, nil where it has none.
func pulumiPluginFiles(ctx context.Context, tc toolchain.Toolchain,
	installed []plugin.DependencyInfo,
) (map[string]*plugin.PulumiPluginJSON, error) {
	found := map[string]*plugin.PulumiPluginJSON{}
	if len(installed) == 0 {
		return found, nil
	}
	args := []string{"-c", findPluginFiles}
	for _, pkg := range installed {
		args = append(args, pkg.Name)
	}
	cmd, err := tc.Command(ctx, args...)
	if err != nil {
		return nil, err
	}
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("reading the installed packages' pulumi-plugin.json: %w", err)
	}
	if err := json.Unmarshal(out, &found); err != nil {
		return nil, fmt.Errorf("reading the installed packages' pulumi-plugin.json: %w", err)
	}
	return found, nil
}

var packagesWithoutPlugins = map[string]bool{"pulumi-policy": true, "pulumi-esc-sdk": true}

var plainVersion = regexp.MustCompile(`^v?[0-9]+\.[0-9]+\.[0-9]+$`)

// packageDependency: the resource package an installed Python package brings, or nil.
func packageDependency(pkg plugin.DependencyInfo, file *plugin.PulumiPluginJSON) *pulumirpc.PackageDependency {
	if packagesWithoutPlugins[pkg.Name] || (file == nil && !strings.HasPrefix(pkg.Name, "pulumi-")) {
		return nil
	}
	if file != nil && !file.Resource {
		return nil
	}
	dep := &pulumirpc.PackageDependency{Kind: "resource", Name: strings.TrimPrefix(pkg.Name, "pulumi-")}
	version := pkg.Version
	if file != nil {
		dep.Server = file.Server
		if file.Name != "" {
			dep.Name = file.Name
		}
		if file.Version != "" {
			version = file.Version
		}
	}
	if !plainVersion.MatchString(version) {
		return nil // a pre-release the real host would translate (main.go:751): loaded when first used
	}
	dep.Version = "v" + strings.TrimPrefix(version, "v")
	return dep
}

func (h *host) RuntimeOptionsPrompts(ctx context.Context,
	req *pulumirpc.RuntimeOptionsRequest,
) (*pulumirpc.RuntimeOptionsResponse, error) {
	return &pulumirpc.RuntimeOptionsResponse{}, nil
}

// programArgs are pulumi-language-python-exec's arguments, those it declares with argparse.
func (h *host) programArgs(req *pulumirpc.RunRequest) []string {
	args := []string{h.exec}
	add := func(name, value string) {
		if value != "" {
			args = append(args, "--"+name, value)
		}
	}
	add("monitor", req.GetMonitorAddress())
	add("engine", h.engineAddress)
	add("project", req.GetProject())
	add("root_directory", req.GetInfo().GetRootDirectory())
	add("stack", req.GetStack())
	add("pwd", req.GetPwd())
	add("dry_run", strconv.FormatBool(req.GetDryRun()))
	add("parallel", strconv.Itoa(int(req.GetParallel())))
	add("tracing", h.tracing)
	add("organization", req.GetOrganization())
	entry := req.GetInfo().GetEntryPoint()
	if entry == "" {
		entry = "."
	}
	args = append(args, entry)
	return append(args, req.GetArgs()...)
}

func (h *host) Run(ctx context.Context, req *pulumirpc.RunRequest) (*pulumirpc.RunResponse, error) {
	if req.GetAttachDebugger() {
		return &pulumirpc.RunResponse{Error: "this stand-in language host cannot attach a debugger"}, nil
	}
	opts, tc, err := programToolchain(req.GetInfo())
	if err != nil {
		return nil, err
	}
	if err := tc.ValidateVenv(ctx); err != nil {
		return nil, err
	}
	if err := typecheck(ctx, tc, opts); err != nil {
		return nil, err
	}
	cmd, err := tc.Command(ctx, h.programArgs(req)...)
	if err != nil {
		return nil, err
	}
	env := cmd.Env
	if env == nil {
		env = os.Environ()
	}
	if cfg := req.GetConfig(); cfg != nil {
		b, err := json.Marshal(cfg)
		if err != nil {
			return nil, fmt.Errorf("serializing the configuration: %w", err)
		}
		env = append(env, "PULUMI_CONFIG="+string(b))
	}
	secretKeys := req.GetConfigSecretKeys()
	if secretKeys == nil {
		secretKeys = []string{}
	}
	b, err := json.Marshal(secretKeys)
	if err != nil {
		return nil, fmt.Errorf("serializing the secret configuration keys: %w", err)
	}
	cmd.Env = append(env, "PULUMI_CONFIG_SECRET_KEYS="+string(b))
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	// When the engine gives up on the run (the request's context ends), the program gets SIGINT
	// first, as from a terminal, and is killed 5 s later.
	cmd.Cancel = func() error {
		if err := cmd.Process.Signal(os.Interrupt); err != nil {
			return cmd.Process.Kill()
		}
		return nil
	}
	cmd.WaitDelay = 5 * time.Second

	if err := cmd.Start(); err != nil {
		return &pulumirpc.RunResponse{
			Error: fmt.Sprintf("problem executing program (could not run language executor): %v", err),
		}, nil
	}
	h.track(cmd, true)
	err = cmd.Wait()
	h.track(cmd, false)
	// Python may die without flushing; make sure what it wrote reaches the engine.
	_ = os.Stdout.Sync()
	_ = os.Stderr.Sync()
	if err == nil {
		return &pulumirpc.RunResponse{}, nil
	}
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		switch code := exitErr.ExitCode(); code {
		case execShowedUserError:
			return &pulumirpc.RunResponse{Bail: true}, nil
		case -1:
			return &pulumirpc.RunResponse{Error: fmt.Sprintf("program exited unexpectedly: %v", err)}, nil
		default:
			return &pulumirpc.RunResponse{Error: fmt.Sprintf("program exited with non-zero exit code: %d", code)}, nil
		}
	}
	return &pulumirpc.RunResponse{Error: fmt.Sprintf("program exited unexpectedly: %v", err)}, nil
}

// typecheck runs the project's typechecker on the program's folder before the program, its output
// shown, as the real host does (main.go:1096-1146; mypy leaves the virtualenv out): one that is
// not installed in the program's environment is named with how to install it (main.go:969-993).
func typecheck(ctx context.Context, tc toolchain.Toolchain, opts toolchain.PythonOptions) error {
	var name string
	switch opts.Typechecker {
	case toolchain.TypeCheckerMypy:
		name = "mypy"
	case toolchain.TypeCheckerPyright:
		name = "pyright"
	default:
		return nil
	}
	installed, err := tc.ListPackages(ctx, true)
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(installed, func(p plugin.DependencyInfo) bool { return p.Name == name }) {
		how := fmt.Sprintf("Please install it using `poetry add %s`.", name)
		if opts.Toolchain != toolchain.Poetry {
			how = fmt.Sprintf("Please add an entry for %s to requirements.txt and run `%s/bin/pip install -r requirements.txt`",
				name, opts.Virtualenv)
		}
		return fmt.Errorf("The typechecker option is set to %s, but %s is not installed. %s", name, name, how)
	}
	args := []string{"-m", name}
	if name == "mypy" {
		if venv, err := tc.VirtualEnvPath(ctx); err == nil && venv != "" {
			if rel, err := filepath.Rel(opts.ProgramDir, venv); err == nil {
				args = append(args, "--exclude", rel)
			}
		}
	}
	args = append(args, opts.ProgramDir)
	cmd, err := tc.Command(ctx, args...)
	if err != nil {
		return err
	}
	var shown bytes.Buffer
	cmd.Dir = opts.ProgramDir
	cmd.Stdout = io.MultiWriter(os.Stdout, &shown)
	cmd.Stderr = io.MultiWriter(os.Stderr, &shown)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s failed: %w\n%s", name, err, shown.String())
	}
	return nil
}

func (h *host) track(cmd *exec.Cmd, add bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if add {
		h.running[cmd] = struct{}{}
	} else {
		delete(h.running, cmd)
	}
}

// Cancel: the engine is shutting down; interrupt any program still running.
func (h *host) Cancel(ctx context.Context, _ *emptypb.Empty) (*emptypb.Empty, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for cmd := range h.running {
		if cmd.Process != nil {
			_ = cmd.Process.Signal(os.Interrupt)
		}
	}
	return &emptypb.Empty{}, nil
}

// streamWriter sends what the toolchain prints back over InstallDependencies' stream.
type streamWriter struct {
	send   func(*pulumirpc.InstallDependenciesResponse) error
	stderr bool
}

func (w streamWriter) Write(p []byte) (int, error) {
	msg := &pulumirpc.InstallDependenciesResponse{}
	data := append([]byte(nil), p...)
	if w.stderr {
		msg.Stderr = data
	} else {
		msg.Stdout = data
	}
	if err := w.send(msg); err != nil {
		return 0, err
	}
	return len(p), nil
}

var _ io.Writer = streamWriter{}

func (h *host) InstallDependencies(req *pulumirpc.InstallDependenciesRequest,
	server grpc.ServerStreamingServer[pulumirpc.InstallDependenciesResponse],
) error {
	opts, tc, err := programToolchain(req.GetInfo())
	if err != nil {
		return err
	}
	stdout := streamWriter{send: server.Send}
	stderr := streamWriter{send: server.Send, stderr: true}
	return tc.InstallDependencies(server.Context(), opts.ProgramDir, req.GetUseLanguageVersionTools(),
		true, stdout, stderr)
}

func (h *host) About(ctx context.Context, req *pulumirpc.AboutRequest) (*pulumirpc.AboutResponse, error) {
	opts, tc, err := programToolchain(req.GetInfo())
	if err != nil {
		return nil, err
	}
	info, err := tc.About(ctx)
	if err != nil {
		return nil, err
	}
	// the real host's metadata (main.go:1478-1483)
	return &pulumirpc.AboutResponse{
		Executable: info.PythonExecutable,
		Version:    info.PythonVersion.String(),
		Metadata: map[string]string{
			"toolchain":        toolchain.Name(opts.Toolchain),
			"toolchainVersion": info.ToolchainVersion.String(),
			"typechecker":      toolchain.TypeCheckerName(opts.Typechecker),
		},
	}, nil
}

func (h *host) GetProgramDependencies(ctx context.Context,
	req *pulumirpc.GetProgramDependenciesRequest,
) (*pulumirpc.GetProgramDependenciesResponse, error) {
	_, tc, err := programToolchain(req.GetInfo())
	if err != nil {
		return nil, err
	}
	deps, err := tc.ListPackages(ctx, req.GetTransitiveDependencies())
	if err != nil {
		return nil, status.Errorf(codes.Internal, "listing the program's packages: %v", err)
	}
	out := make([]*pulumirpc.DependencyInfo, 0, len(deps))
	for _, d := range deps {
		out = append(out, &pulumirpc.DependencyInfo{Name: d.Name, Version: d.Version})
	}
	return &pulumirpc.GetProgramDependenciesResponse{Dependencies: out}, nil
}
