// pulumi-resource-command: a stand-in for pulumi-command v1.2.1, whose module the Go proxy
// here refuses. Built on the same pulumi-go-provider (infer) and sdk/v3 versions, with the
// same tokens, properties, secrets, defaults and diff rules (scripts/engine.sh builds it).
// Only what twinspark uses is here: command:local:Command and command:remote:Command
// (not CopyToRemote, CopyFile or the local:run invoke).
package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/pulumi/pulumi-go-provider/infer"
	"github.com/pulumi/pulumi-go-provider/middleware/schema"

	"twinspark.local/engine-providers/command/local"
	"twinspark.local/engine-providers/command/remote"
)

// set by the build: -X main.version=v1.2.1
var version = "v0.0.0-dev"

func main() {
	provider := infer.Provider(infer.Options{
		Metadata: schema.Metadata{
			DisplayName: "Command",
			Description: "Stand-in for the Pulumi Command provider: commands run locally or over SSH.",
			License:     "Apache-2.0",
			Publisher:   "twinspark (stand-in)",
		},
		Resources: []infer.InferredResource{
			infer.Resource(&local.Command{}),
			infer.Resource(&remote.Command{}),
		},
	})
	if err := provider.Run(context.Background(), "command", strings.TrimPrefix(version, "v")); err != nil {
		fmt.Fprintf(os.Stderr, "Error: %s", err.Error())
		os.Exit(1)
	}
}
