// Package provider is twinspark's pulumi-resource-docker: kreuzwerker's Terraform provider
// bridged with pulumi-terraform-bridge, plus a native docker:index/image:Image, behind one gRPC
// server (hybrid.go). The mapping below reproduces pulumi-docker 5.2.0's schema, which the
// Python SDK we pin (pulumi_docker 5.2.0) was generated from: same tokens, same property names.
package provider

import (
	"context"
	"runtime"

	"github.com/pulumi/pulumi-terraform-bridge/v3/pkg/tfbridge"
	"github.com/pulumi/pulumi-terraform-bridge/v3/pkg/tfbridge/tokens"
	shimv2 "github.com/pulumi/pulumi-terraform-bridge/v3/pkg/tfshim/sdk-v2"
	"github.com/pulumi/pulumi/pkg/v3/codegen/schema"
	"github.com/terraform-providers/terraform-provider-docker/shim"
)

// Version is what GetPluginInfo reports; the engine loads plugin docker at the SDK's version.
var Version = "5.2.0"

const (
	pkgName = "docker"
	mod     = "index"
	// ImageToken is the one resource the native side serves.
	ImageToken = "docker:index/image:Image"
)

// tok is pulumi-docker's token shape: docker:index/<lowerCamel>:<Name>.
func tok(name string) string {
	return pkgName + ":" + mod + "/" + string(name[0]+('a'-'A')) + name[1:] + ":" + name
}

// Provider is the bridge's view of the provider.
func Provider() tfbridge.ProviderInfo {
	info := tfbridge.ProviderInfo{
		P:           shimv2.NewProvider(shim.NewProvider()),
		Name:        pkgName,
		Version:     Version,
		Description: "A Pulumi package for interacting with Docker in Pulumi programs",
		License:     "Apache-2.0",
		GitHubOrg:   "kreuzwerker",
		Config: map[string]*tfbridge.SchemaInfo{
			"host": {Default: &tfbridge.DefaultInfo{
				EnvVars: []string{"DOCKER_HOST"},
				ComputeDefault: func(context.Context, tfbridge.ComputeDefaultOptions) (interface{}, error) {
					if runtime.GOOS == "windows" {
						return "npipe:////./pipe/docker_engine", nil
					}
					return "unix:///var/run/docker.sock", nil
				},
			}},
			// a list in the SDK (registry_auths would be the bridge's plural; MaxItems 1 is not meant)
			"registry_auth": {Name: "registryAuth", MaxItemsOne: tfbridge.False()},
		},
		Resources: map[string]*tfbridge.ResourceInfo{
			"docker_container": {
				Tok: tfbridge.MakeResource(pkgName, mod, "Container"),
				// the container's name is usually fixed: the old one must go first
				DeleteBeforeReplace: true,
				Fields: map[string]*tfbridge.SchemaInfo{
					"command":           {Name: "command"}, // one argv, not "commands"
					"networks_advanced": {Name: "networksAdvanced"},
				},
			},
			"docker_image": {
				Tok:    tfbridge.MakeResource(pkgName, mod, "RemoteImage"),
				Fields: map[string]*tfbridge.SchemaInfo{"name": {Name: "name"}},
			},
			"docker_config":         {Tok: tfbridge.MakeResource(pkgName, mod, "ServiceConfig")},
			"docker_network":        {Tok: tfbridge.MakeResource(pkgName, mod, "Network")},
			"docker_secret":         {Tok: tfbridge.MakeResource(pkgName, mod, "Secret")},
			"docker_service":        {Tok: tfbridge.MakeResource(pkgName, mod, "Service")},
			"docker_volume":         {Tok: tfbridge.MakeResource(pkgName, mod, "Volume")},
			"docker_registry_image": {Tok: tfbridge.MakeResource(pkgName, mod, "RegistryImage")},
			"docker_plugin":         {Tok: tfbridge.MakeResource(pkgName, mod, "Plugin")},
			"docker_tag":            {Tok: tfbridge.MakeResource(pkgName, mod, "Tag")},
		},
		DataSources: map[string]*tfbridge.DataSourceInfo{
			"docker_network":        {Tok: tfbridge.MakeDataSource(pkgName, mod, "getNetwork")},
			"docker_registry_image": {Tok: tfbridge.MakeDataSource(pkgName, mod, "getRegistryImage")},
			"docker_plugin":         {Tok: tfbridge.MakeDataSource(pkgName, mod, "getPlugin")},
			"docker_image":          {Tok: tfbridge.MakeDataSource(pkgName, mod, "getRemoteImage")},
			"docker_logs":           {Tok: tfbridge.MakeDataSource(pkgName, mod, "getLogs")},
		},
		ExtraTypes:     imageTypes(),
		ExtraResources: map[string]schema.ResourceSpec{ImageToken: imageResourceSpec()},
	}
	// the rest (docker_buildx_builder, docker_registry_image_manifests, …) by the standard rule
	info.MustComputeTokens(tokens.SingleModule("docker_", mod, tokens.MakeStandard(pkgName)))
	info.SetAutonaming(255, "-")
	return info
}

func str(desc string) schema.PropertySpec {
	return schema.PropertySpec{Description: desc, TypeSpec: schema.TypeSpec{Type: "string"}}
}

func ref(name, desc string) schema.PropertySpec {
	return schema.PropertySpec{Description: desc, TypeSpec: schema.TypeSpec{Ref: "#/types/" + tok(name)}}
}

// imageTypes: the native Image's input types, as the Python SDK has them (_inputs.py).
func imageTypes() map[string]schema.ComplexTypeSpec {
	obj := func(desc string, props map[string]schema.PropertySpec) schema.ComplexTypeSpec {
		return schema.ComplexTypeSpec{ObjectTypeSpec: schema.ObjectTypeSpec{Type: "object", Description: desc, Properties: props}}
	}
	strings := schema.TypeSpec{Type: "array", Items: &schema.TypeSpec{Type: "string"}}
	return map[string]schema.ComplexTypeSpec{
		tok("Registry"): obj("A Docker registry", map[string]schema.PropertySpec{
			"server":   str("The registry's URL"),
			"username": str("The user to log in as"),
			"password": {Description: "Its password", TypeSpec: schema.TypeSpec{Type: "string"}, Secret: true},
		}),
		tok("CacheFrom"): obj("Images to use as build cache", map[string]schema.PropertySpec{
			"images": {Description: "The images", TypeSpec: strings},
		}),
		tok("BuilderVersion"): {
			ObjectTypeSpec: schema.ObjectTypeSpec{Type: "string", Description: "The Docker builder"},
			Enum: []schema.EnumValueSpec{
				{Name: "BuilderV1", Value: "BuilderV1"}, {Name: "BuilderBuildKit", Value: "BuilderBuildKit"},
			},
		},
		tok("DockerBuild"): obj("How to build the image", map[string]schema.PropertySpec{
			"context":    str("The build context's path"),
			"dockerfile": str("The Dockerfile's path"),
			"cacheFrom":  ref("CacheFrom", "Images to use as build cache"),
			"args": {Description: "Build arguments", TypeSpec: schema.TypeSpec{
				Type: "object", AdditionalProperties: &schema.TypeSpec{Type: "string"}}},
			"target":         str("The Dockerfile stage to build"),
			"builderVersion": ref("BuilderVersion", "BuilderBuildKit (the default) or BuilderV1"),
			"platform":       str("The platform to build for, e.g. linux/arm64"),
			"addHosts":       {Description: "host:ip mappings for the build", TypeSpec: strings},
			"network":        str("The network mode of RUN instructions"),
		}),
	}
}

func imageResourceSpec() schema.ResourceSpec {
	return schema.ResourceSpec{
		ObjectTypeSpec: schema.ObjectTypeSpec{
			Type:        "object",
			Description: "An image built by the Docker daemon of the provider's host (and pushed, unless skipPush).",
			Required:    []string{"dockerfile", "context", "baseImageName", "registryServer", "imageName", "repoDigest"},
			Properties: map[string]schema.PropertySpec{
				"imageName":      str("The image's name"),
				"registryServer": str("The registry the image was pushed to"),
				"baseImageName":  str("The image's name as given"),
				"dockerfile":     str("The Dockerfile, relative to the context"),
				"context":        str("The build context"),
				"repoDigest":     str("Pushed: repository@sha256:…; skipPush: the local image id, sha256:…"),
				"platform":       str("The image's platform"),
			},
		},
		InputProperties: map[string]schema.PropertySpec{
			"imageName":      str("The image's name, repository[:tag]"),
			"registry":       ref("Registry", "The registry to push to"),
			"build":          ref("DockerBuild", "How to build the image"),
			"skipPush":       {Description: "Build only", TypeSpec: schema.TypeSpec{Type: "boolean"}, Default: false},
			"buildOnPreview": {Description: "Build during preview too", TypeSpec: schema.TypeSpec{Type: "boolean"}, Default: false},
		},
		RequiredInputs: []string{"imageName"},
		Aliases:        []schema.AliasSpec{{Type: "docker:image:Image"}},
	}
}
