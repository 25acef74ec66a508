package provider

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	clibuild "github.com/docker/cli/cli/command/image/build"
	"github.com/docker/cli/cli/connhelper"
	buildtypes "github.com/docker/docker/api/types/build"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/jsonmessage"
	controlapi "github.com/moby/buildkit/api/services/control"
	"github.com/moby/buildkit/session"
	"github.com/moby/go-archive"
	"github.com/moby/patternmatcher/ignorefile"
	"github.com/pulumi/pulumi/pkg/v3/resource/provider"
	"github.com/pulumi/pulumi/sdk/v3/go/common/diag"
	"github.com/pulumi/pulumi/sdk/v3/go/common/resource"
	"github.com/pulumi/pulumi/sdk/v3/go/common/resource/plugin"
	rpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
	"github.com/tonistiigi/fsutil"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// native serves docker:index/image:Image: a build on the daemon of the provider's host. What the
// engine sees follows pulumi-docker 5.2.0 (provider/image.go there): the id is the image name;
// state is the outputs plus the checked inputs under "__inputs"; a change of any input (the
// context's digest among them) is an update, which builds again; previews do not build unless
// buildOnPreview; Delete leaves the image on the host; with skipPush, repoDigest is the local
// image id (sha256:…). Pushing is not implemented here (the program never pushes).
type native struct {
	host    *provider.HostClient
	dHost   string   // the daemon, e.g. ssh://user@host
	sshOpts []string // extra ssh flags for an ssh:// host
}

const inputsKey = "__inputs"

var opts = plugin.MarshalOptions{KeepUnknowns: true, SkipNulls: true}

func (n *native) configure(vars map[string]string) {
	n.dHost = vars["docker:config:host"]
	if n.dHost == "" {
		n.dHost = os.Getenv("DOCKER_HOST")
	}
	n.sshOpts = nil
	if s := vars["docker:config:sshOpts"]; s != "" {
		_ = json.Unmarshal([]byte(s), &n.sshOpts) // the SDK sends the list as JSON
	}
}

func (n *native) log(ctx context.Context, sev diag.Severity, urn, msg string) {
	if n.host != nil {
		_ = n.host.Log(ctx, sev, resource.URN(urn), msg)
	}
}

func (n *native) status(ctx context.Context, urn, msg string) {
	if n.host != nil && msg != "" {
		_ = n.host.LogStatus(ctx, diag.Info, resource.URN(urn), msg)
	}
}

// build is the DockerBuild input with defaults applied; fields are "" when unknown.
type build struct {
	context, dockerfile, platform, target, network, version string
	args                                                    map[string]*string
	hosts, cacheFrom                                        []string
}

func knownString(v resource.PropertyValue) (string, bool) {
	if v.IsString() {
		return v.StringValue(), true
	}
	return "", !v.ContainsUnknowns()
}

func readBuild(in resource.PropertyMap) (build, error) {
	b := build{context: ".", version: "2"}
	obj := resource.PropertyMap{}
	if in["build"].IsObject() {
		obj = in["build"].ObjectValue()
	}
	if s, ok := knownString(obj["context"]); ok && s != "" {
		b.context = s
	}
	b.dockerfile = filepath.Join(b.context, "Dockerfile")
	if s, ok := knownString(obj["dockerfile"]); ok && s != "" {
		b.dockerfile = s
	}
	b.platform, _ = knownString(obj["platform"])
	b.target, _ = knownString(obj["target"])
	b.network, _ = knownString(obj["network"])
	if v := obj["builderVersion"]; v.IsString() {
		switch v.StringValue() {
		case "BuilderV1":
			b.version = "1"
		case "BuilderBuildKit":
		default:
			return b, fmt.Errorf("builderVersion: %q is neither BuilderV1 nor BuilderBuildKit", v.StringValue())
		}
	}
	if obj["args"].IsObject() {
		b.args = map[string]*string{}
		for k, v := range obj["args"].ObjectValue() {
			if v.IsString() {
				s := v.StringValue()
				b.args[string(k)] = &s
			}
		}
	}
	strs := func(v resource.PropertyValue) (out []string) {
		if v.IsArray() {
			for _, e := range v.ArrayValue() {
				if e.IsString() {
					out = append(out, e.StringValue())
				}
			}
		}
		return out
	}
	b.hosts = strs(obj["addHosts"])
	if obj["cacheFrom"].IsObject() {
		b.cacheFrom = strs(obj["cacheFrom"].ObjectValue()["images"])
	}
	return b, nil
}

// ignorePatterns: Dockerfile.dockerignore beside the Dockerfile wins over the context's
// .dockerignore, as docker build reads them.
func ignorePatterns(b build) ([]string, error) {
	for _, p := range []string{b.dockerfile + ".dockerignore", filepath.Join(b.context, ".dockerignore")} {
		f, err := os.Open(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		defer f.Close()
		return ignorefile.ReadAll(f)
	}
	return nil, nil
}

// contextDigest hashes what the daemon would get, to the same value as pulumi-docker v5.1.0's
// hashContext (provider/provider.go:553-640), so that a stack moved between that provider and this
// one sees no change: one record per file, the Dockerfile first under the name "Dockerfile" with
// mode 0, then every file buildkit's fsutil.Walk keeps past .dockerignore, in its order; a record
// is the slash path, the mode as Go prints it, the raw sha256 of the content (of a symlink: its
// resolved, cleaned path) and a NUL; the digest is the hex sha256 of all records.
func contextDigest(b build) (string, error) {
	patterns, err := ignorePatterns(b)
	if err != nil {
		return "", err
	}
	var records bytes.Buffer
	add := func(path, name string, mode fs.FileMode) error {
		h := sha256.New()
		switch {
		case mode.Type() == fs.ModeSymlink:
			target, err := filepath.EvalSymlinks(path)
			if err != nil {
				return fmt.Errorf("resolving the symlink %s: %w", path, err)
			}
			io.WriteString(h, filepath.ToSlash(filepath.Clean(target)))
		case mode.IsRegular():
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := io.Copy(h, f); err != nil {
				return err
			}
		}
		records.WriteString(filepath.ToSlash(filepath.Clean(name)))
		records.WriteString(mode.String())
		records.Write(h.Sum(nil))
		records.WriteByte(0)
		return nil
	}
	if err := add(b.dockerfile, "Dockerfile", 0); err != nil {
		return "", fmt.Errorf("hashing the Dockerfile %q: %w", b.dockerfile, err)
	}
	err = fsutil.Walk(context.Background(), b.context, &fsutil.FilterOpt{ExcludePatterns: patterns},
		func(rel string, info fs.FileInfo, err error) error {
			if err != nil || info.IsDir() {
				return err
			}
			return add(filepath.Join(b.context, rel), rel, info.Mode())
		})
	if err != nil {
		return "", fmt.Errorf("hashing the build context %q: %w", b.context, err)
	}
	sum := sha256.Sum256(records.Bytes())
	return hex.EncodeToString(sum[:]), nil
}

// Check applies the defaults (context ".", its Dockerfile, the host's platform) and records the
// context's digest in build.contextDigest, which makes a changed context a diff.
func (n *native) Check(ctx context.Context, req *rpc.CheckRequest) (*rpc.CheckResponse, error) {
	in, err := plugin.UnmarshalProperties(req.GetNews(), opts)
	if err != nil {
		return nil, err
	}
	if !in["buildOnPreview"].IsBool() && !in["buildOnPreview"].ContainsUnknowns() {
		in["buildOnPreview"] = resource.NewBoolProperty(false)
	}
	if !in["build"].IsObject() && !in["build"].ContainsUnknowns() {
		in["build"] = resource.NewObjectProperty(resource.PropertyMap{})
	}
	if in["build"].IsObject() {
		obj := in["build"].ObjectValue()
		b, err := readBuild(in)
		if err != nil {
			return nil, err
		}
		ctxKnown, dfKnown := !obj["context"].ContainsUnknowns(), !obj["dockerfile"].ContainsUnknowns()
		if ctxKnown {
			obj["context"] = resource.NewStringProperty(b.context)
		}
		if ctxKnown && dfKnown {
			obj["dockerfile"] = resource.NewStringProperty(b.dockerfile)
			if _, err := os.Stat(b.dockerfile); err != nil {
				return nil, fmt.Errorf("the Dockerfile: %w", err)
			}
			digest, err := contextDigest(b)
			if err != nil {
				return nil, err
			}
			obj["contextDigest"] = resource.NewStringProperty(digest)
		}
		if obj["platform"].IsNull() {
			platform := "linux/" + runtime.GOARCH
			obj["platform"] = resource.NewStringProperty(platform)
			n.log(ctx, diag.Info, req.GetUrn(), "building for "+platform+", the provider's own platform: set build.platform to say")
		}
	}
	if !in["skipPush"].IsBool() && !in["skipPush"].ContainsUnknowns() {
		in["skipPush"] = resource.NewBoolProperty(false)
	}
	news, err := plugin.MarshalProperties(in, opts)
	if err != nil {
		return nil, err
	}
	return &rpc.CheckResponse{Inputs: news}, nil
}

// Diff compares the checked inputs with those the last build recorded; any change is an update
// (a new build under the same name), never a replacement. A registry whose credentials alone
// changed is no change.
func (n *native) Diff(_ context.Context, req *rpc.DiffRequest) (*rpc.DiffResponse, error) {
	olds, err := plugin.UnmarshalProperties(req.GetOlds(), opts)
	if err != nil {
		return nil, err
	}
	news, err := plugin.UnmarshalProperties(req.GetNews(), opts)
	if err != nil {
		return nil, err
	}
	prev := resource.PropertyMap{}
	if v, ok := olds[inputsKey]; ok {
		if v.IsSecret() {
			v = v.SecretValue().Element
		}
		if v.IsObject() {
			prev = v.ObjectValue()
		}
	}
	diffs := map[string]*rpc.PropertyDiff{}
	if d := prev.Diff(news); d != nil {
		for k := range d.Adds {
			diffs[string(k)] = &rpc.PropertyDiff{Kind: rpc.PropertyDiff_ADD}
		}
		for k := range d.Deletes {
			diffs[string(k)] = &rpc.PropertyDiff{Kind: rpc.PropertyDiff_DELETE}
		}
		for k, vd := range d.Updates {
			if k == "registry" && vd.Object != nil {
				if _, server := vd.Object.Updates["server"]; !server {
					continue
				}
			}
			diffs[string(k)] = &rpc.PropertyDiff{Kind: rpc.PropertyDiff_UPDATE}
		}
	}
	if len(diffs) == 0 {
		return &rpc.DiffResponse{Changes: rpc.DiffResponse_DIFF_NONE}, nil
	}
	changed := make([]string, 0, len(diffs))
	for k := range diffs {
		changed = append(changed, k)
	}
	return &rpc.DiffResponse{Changes: rpc.DiffResponse_DIFF_SOME, Diffs: changed, DetailedDiff: diffs, HasDetailedDiff: true}, nil
}

// willBuild: a preview builds only with buildOnPreview and every input the build needs known.
func (n *native) willBuild(ctx context.Context, urn string, in resource.PropertyMap, preview bool) bool {
	if !preview {
		return true
	}
	if !in["buildOnPreview"].IsBool() || !in["buildOnPreview"].BoolValue() {
		return false
	}
	b := in["build"]
	if in["imageName"].ContainsUnknowns() || !b.IsObject() || b.ObjectValue()["context"].ContainsUnknowns() ||
		b.ObjectValue()["dockerfile"].ContainsUnknowns() || b.ObjectValue()["args"].ContainsUnknowns() {
		n.log(ctx, diag.Warning, urn, "inputs of the build are unknown in this preview: not building")
		return false
	}
	return true
}

func (n *native) Create(ctx context.Context, req *rpc.CreateRequest) (*rpc.CreateResponse, error) {
	in, err := plugin.UnmarshalProperties(req.GetProperties(), opts)
	if err != nil {
		return nil, err
	}
	if !n.willBuild(ctx, req.GetUrn(), in, req.GetPreview()) {
		return &rpc.CreateResponse{Properties: req.GetProperties()}, nil
	}
	id, state, err := n.build(ctx, req.GetUrn(), in)
	if err != nil {
		return nil, err
	}
	return &rpc.CreateResponse{Id: id, Properties: state}, nil
}

func (n *native) Update(ctx context.Context, req *rpc.UpdateRequest) (*rpc.UpdateResponse, error) {
	in, err := plugin.UnmarshalProperties(req.GetNews(), opts)
	if err != nil {
		return nil, err
	}
	if !n.willBuild(ctx, req.GetUrn(), in, req.GetPreview()) {
		return &rpc.UpdateResponse{Properties: req.GetNews()}, nil
	}
	_, state, err := n.build(ctx, req.GetUrn(), in)
	if err != nil {
		return nil, err
	}
	return &rpc.UpdateResponse{Properties: state}, nil
}

// Read keeps what the state says (pulumi-docker does not look the image up either).
func (n *native) Read(_ context.Context, req *rpc.ReadRequest) (*rpc.ReadResponse, error) {
	return &rpc.ReadResponse{Id: req.GetId(), Inputs: req.GetInputs(), Properties: req.GetProperties()}, nil
}

// dockerClient reaches the configured daemon; ssh:// goes through `ssh … docker system
// dial-stdio`, as the bridged side (and the docker CLI) does.
func (n *native) dockerClient() (*client.Client, error) {
	clientOpts := []client.Opt{client.FromEnv, client.WithAPIVersionNegotiation()}
	if n.dHost != "" {
		helper, err := connhelper.GetConnectionHelperWithSSHOpts(n.dHost, n.sshOpts)
		if err != nil {
			return nil, err
		}
		if helper != nil {
			clientOpts = append(clientOpts, client.WithHost(helper.Host), client.WithDialContext(helper.Dialer))
		} else {
			clientOpts = append(clientOpts, client.WithHost(n.dHost))
		}
	}
	return client.NewClientWithOpts(clientOpts...)
}

// trace shows BuildKit's progress: each step as it starts, its output, its error.
func (n *native) trace(ctx context.Context, urn string, aux json.RawMessage, started map[string]bool) {
	var raw []byte // the aux is the protobuf StatusResponse, base64 in JSON
	var st controlapi.StatusResponse
	if json.Unmarshal(aux, &raw) != nil || proto.Unmarshal(raw, &st) != nil {
		return
	}
	for _, v := range st.Vertexes {
		if v.Started != nil && !started[v.Digest] {
			started[v.Digest] = true
			n.status(ctx, urn, v.Name)
		}
		if v.Error != "" {
			n.status(ctx, urn, v.Name+": "+v.Error)
		}
	}
	for _, l := range st.Logs {
		for _, line := range strings.Split(strings.TrimRight(string(l.Msg), "\n"), "\n") {
			n.status(ctx, urn, line)
		}
	}
}

func (n *native) ping(ctx context.Context) error {
	docker, err := n.dockerClient()
	if err == nil {
		defer docker.Close()
		_, err = docker.Ping(ctx)
	}
	if err != nil {
		// the real provider's words (provider/image.go configureDockerClient), then which daemon and why
		return fmt.Errorf("failed to connect to any docker daemon: %q: %w", n.dHost, err)
	}
	return nil
}

func (n *native) build(ctx context.Context, urn string, in resource.PropertyMap) (string, *structpb.Struct, error) {
	name, ok := knownString(in["imageName"])
	if !ok || name == "" {
		return "", nil, errors.New("imageName is required")
	}
	skipPush := in["skipPush"].IsBool() && in["skipPush"].BoolValue()
	if !skipPush {
		return "", nil, errors.New("pushing is not implemented by this pulumi-resource-docker: set skipPush")
	}
	b, err := readBuild(in)
	if err != nil {
		return "", nil, err
	}
	docker, err := n.dockerClient()
	if err != nil {
		return "", nil, err
	}
	defer docker.Close()

	patterns, err := ignorePatterns(b)
	if err != nil {
		return "", nil, err
	}
	contextDir, relDockerfile, err := clibuild.GetContextFromLocalDir(b.context, b.dockerfile)
	if err != nil {
		return "", nil, fmt.Errorf("the build context: %w", err)
	}
	if err := clibuild.ValidateContextDirectory(contextDir, patterns); err != nil {
		return "", nil, err
	}
	tar, err := archive.TarWithOptions(contextDir, &archive.TarOptions{
		ExcludePatterns: clibuild.TrimBuildFilesFromExcludes(patterns, relDockerfile, false),
		ChownOpts:       &archive.ChownOpts{UID: 0, GID: 0},
	})
	if err != nil {
		return "", nil, err
	}
	defer tar.Close()
	dockerfile := relDockerfile
	if strings.HasPrefix(relDockerfile, ".."+string(filepath.Separator)) {
		// a Dockerfile outside the context travels inside the tar under a random name
		f, err := os.Open(b.dockerfile)
		if err != nil {
			return "", nil, err
		}
		defer f.Close()
		if tar, dockerfile, err = clibuild.AddDockerfileToBuildContext(f, tar); err != nil {
			return "", nil, err
		}
	}

	buildOpts := buildtypes.ImageBuildOptions{
		Dockerfile: dockerfile, Tags: []string{name}, BuildArgs: b.args, Platform: b.platform,
		Target: b.target, NetworkMode: b.network, ExtraHosts: b.hosts, CacheFrom: b.cacheFrom,
		Version: buildtypes.BuilderVersion(b.version),
	}
	if b.version == "2" {
		// BuildKit talks back to the client over a session, hijacked on the same connection
		sess, err := session.NewSession(ctx, "twinspark-docker")
		if err != nil {
			return "", nil, err
		}
		dial := func(ctx context.Context, proto string, meta map[string][]string) (net.Conn, error) {
			return docker.DialHijack(ctx, "/session", proto, meta)
		}
		go func() { _ = sess.Run(ctx, dial) }()
		defer sess.Close()
		buildOpts.SessionID = sess.ID()
	}

	n.status(ctx, urn, "building "+name)
	resp, err := docker.ImageBuild(ctx, tar, buildOpts)
	if err != nil {
		return "", nil, fmt.Errorf("docker build: %w", err)
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	started := map[string]bool{}
	for {
		var m jsonmessage.JSONMessage
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return "", nil, fmt.Errorf("reading the build's output: %w", err)
		}
		if m.Error != nil {
			return "", nil, fmt.Errorf("docker build: %s", m.Error.Message)
		}
		if m.ID == "moby.buildkit.trace" && m.Aux != nil {
			n.trace(ctx, urn, *m.Aux, started)
			continue
		}
		n.status(ctx, urn, strings.TrimSpace(m.Stream+m.Status))
	}
	// the tag now names the new build (BuildKit's trace does not need decoding for that)
	img, err := docker.ImageInspect(ctx, name)
	if err != nil {
		return "", nil, fmt.Errorf("the built image %s: %w", name, err)
	}
	n.status(ctx, urn, "built "+name+": "+img.ID)

	registry := ""
	if r := in["registry"]; r.IsObject() {
		registry, _ = knownString(r.ObjectValue()["server"])
	}
	outputs := resource.PropertyMap{
		"imageName":      resource.NewStringProperty(name),
		"baseImageName":  resource.NewStringProperty(name),
		"registryServer": resource.NewStringProperty(registry),
		"dockerfile":     resource.NewStringProperty(relDockerfile),
		"context":        resource.NewStringProperty(b.context),
		"platform":       resource.NewStringProperty(b.platform),
		"repoDigest":     resource.NewStringProperty(img.ID), // skipPush: the local image id
		inputsKey:        resource.MakeSecret(resource.NewObjectProperty(in)),
	}
	state, err := plugin.MarshalProperties(outputs, plugin.MarshalOptions{KeepUnknowns: true, SkipNulls: true, KeepSecrets: true})
	return name, state, err
}
