// pulumi-resource-docker: the hybrid server. schema.json is generated at build time by
// cmd/pulumi-tfgen-docker (engine.sh build_docker) and is not committed.
package main

import (
	_ "embed"
	"encoding/json"

	provider "twinspark.local/pulumi-docker"
)

//go:embed schema.json
var schema []byte

func main() {
	// tfgen leaves the version out; GetSchema reports the one we serve
	var spec map[string]any
	if err := json.Unmarshal(schema, &spec); err == nil {
		spec["version"] = provider.Version
		if b, err := json.Marshal(spec); err == nil {
			schema = b
		}
	}
	provider.Serve(schema)
}
