package provider

import (
	"context"
	"fmt"
	"strings"

	"github.com/pulumi/pulumi-terraform-bridge/v3/pkg/tfbridge"
	"github.com/pulumi/pulumi/pkg/v3/resource/provider"
	"github.com/pulumi/pulumi/sdk/v3/go/common/resource"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/cmdutil"
	rpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// hybrid is the one server the engine talks to: resource calls for Image go to the native side,
// everything else (config included) to the bridge.
type hybrid struct {
	rpc.UnimplementedResourceProviderServer
	schema  []byte
	bridged rpc.ResourceProviderServer
	native  *native
}

// Serve runs the provider's gRPC server as the engine starts plugins.
func Serve(schema []byte) {
	err := provider.Main(pkgName, func(host *provider.HostClient) (rpc.ResourceProviderServer, error) {
		info := Provider()
		return &hybrid{
			schema:  schema,
			bridged: tfbridge.NewProvider(context.Background(), host, pkgName, Version, info.P, info, schema),
			native:  &native{host: host},
		}, nil
	})
	if err != nil {
		cmdutil.ExitError(err.Error())
	}
}

func isImage(urn string) bool { return resource.URN(urn).Type().String() == ImageToken }

func (h *hybrid) GetPluginInfo(context.Context, *emptypb.Empty) (*rpc.PluginInfo, error) {
	return &rpc.PluginInfo{Version: Version}, nil
}

func (h *hybrid) GetSchema(_ context.Context, req *rpc.GetSchemaRequest) (*rpc.GetSchemaResponse, error) {
	if v := req.GetVersion(); v != 0 {
		return nil, fmt.Errorf("unsupported schema version %d", v)
	}
	return &rpc.GetSchemaResponse{Schema: string(h.schema)}, nil
}

func (h *hybrid) Attach(ctx context.Context, req *rpc.PluginAttach) (*emptypb.Empty, error) {
	if _, err := h.bridged.Attach(ctx, req); err != nil {
		return nil, err
	}
	host, err := provider.NewHostClient(req.GetAddress())
	if err != nil {
		return nil, err
	}
	h.native.host = host
	return &emptypb.Empty{}, nil
}

func (h *hybrid) Cancel(ctx context.Context, e *emptypb.Empty) (*emptypb.Empty, error) {
	return h.bridged.Cancel(ctx, e)
}

func (h *hybrid) CheckConfig(ctx context.Context, req *rpc.CheckRequest) (*rpc.CheckResponse, error) {
	return h.bridged.CheckConfig(ctx, req)
}

func (h *hybrid) DiffConfig(ctx context.Context, req *rpc.DiffRequest) (*rpc.DiffResponse, error) {
	return h.bridged.DiffConfig(ctx, req)
}

// Configure: both sides read the config; the engine is told previews are supported (the bridge
// says so; the native side answers previews without building, as pulumi-docker does). As in
// pulumi-docker v5.1.0 (provider/image.go configureDockerClient, 946-953): an ssh:// daemon is not
// asked at all here (a preview of an unreachable node passes; the first build fails), any other
// daemon that does not answer fails Configure, previews included.
func (h *hybrid) Configure(ctx context.Context, req *rpc.ConfigureRequest) (*rpc.ConfigureResponse, error) {
	h.native.configure(req.GetVariables()) //nolint:staticcheck // the flat map: what the native side needs
	if !strings.HasPrefix(h.native.dHost, "ssh://") {
		if err := h.native.ping(ctx); err != nil {
			return nil, err
		}
	}
	resp, err := h.bridged.Configure(ctx, req)
	if err != nil {
		return nil, err
	}
	resp.SupportsPreview = true
	return resp, nil
}

func (h *hybrid) Invoke(ctx context.Context, req *rpc.InvokeRequest) (*rpc.InvokeResponse, error) {
	return h.bridged.Invoke(ctx, req)
}

func (h *hybrid) Check(ctx context.Context, req *rpc.CheckRequest) (*rpc.CheckResponse, error) {
	if isImage(req.GetUrn()) {
		return h.native.Check(ctx, req)
	}
	return h.bridged.Check(ctx, req)
}

func (h *hybrid) Diff(ctx context.Context, req *rpc.DiffRequest) (*rpc.DiffResponse, error) {
	if isImage(req.GetUrn()) {
		return h.native.Diff(ctx, req)
	}
	return h.bridged.Diff(ctx, req)
}

func (h *hybrid) Create(ctx context.Context, req *rpc.CreateRequest) (*rpc.CreateResponse, error) {
	if isImage(req.GetUrn()) {
		return h.native.Create(ctx, req)
	}
	return h.bridged.Create(ctx, req)
}

func (h *hybrid) Read(ctx context.Context, req *rpc.ReadRequest) (*rpc.ReadResponse, error) {
	if isImage(req.GetUrn()) {
		return h.native.Read(ctx, req)
	}
	return h.bridged.Read(ctx, req)
}

func (h *hybrid) Update(ctx context.Context, req *rpc.UpdateRequest) (*rpc.UpdateResponse, error) {
	if isImage(req.GetUrn()) {
		return h.native.Update(ctx, req)
	}
	return h.bridged.Update(ctx, req)
}

func (h *hybrid) Delete(ctx context.Context, req *rpc.DeleteRequest) (*emptypb.Empty, error) {
	if isImage(req.GetUrn()) {
		return &emptypb.Empty{}, nil // images stay on the host, as with pulumi-docker
	}
	return h.bridged.Delete(ctx, req)
}

func (h *hybrid) Construct(context.Context, *rpc.ConstructRequest) (*rpc.ConstructResponse, error) {
	return nil, status.Error(codes.Unimplemented, "Construct is not implemented")
}

func (h *hybrid) Call(context.Context, *rpc.CallRequest) (*rpc.CallResponse, error) {
	return nil, status.Error(codes.Unimplemented, "Call is not implemented")
}
