// pulumi-tfgen-docker: the bridge's generator over our ProviderInfo; engine.sh runs its
// `schema` command to produce the schema the provider embeds.
package main

import (
	"github.com/pulumi/pulumi-terraform-bridge/v3/pkg/tfgen"

	provider "twinspark.local/pulumi-docker"
)

func main() { tfgen.Main("docker", provider.Version, provider.Provider()) }
