// Package shim exports kreuzwerker's SDKv2 provider, which lives in an internal package.
// engine.sh copies this file into the module copy under ./upstream at build time.
package shim

import (
	"github.com/hashicorp/terraform-plugin-sdk/v2/helper/schema"
	"github.com/terraform-providers/terraform-provider-docker/internal/provider"
)

// NewProvider is kreuzwerker's provider as its main.go serves it ("dev": the version string it
// puts into its User-Agent).
func NewProvider() *schema.Provider { return provider.New("dev")() }
